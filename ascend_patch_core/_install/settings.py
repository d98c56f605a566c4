"""Settings: what ``with_profiling``, ``brake_at``, ``allow_internal_format`` & co. ask for.

The engine does not implement them. It records the request and hands it, at
``apply()``, to the *provider* of the setting: an object published by an installed
distribution in the entry-point group ``ascend_patch.settings``, under the setting's
name. The training utilities (ascend-patch-training) provide ``profiling``,
``brake`` and ``precision_check``; the torch plugin provides
``allow_internal_format``. A provider implements::

    check(name, value) -> None               # raise PatchDefinitionError for a bad value
    start(patcher, settings) -> session      # settings: {name: value} of this provider

and the session it returns::

    records: list[Record]                    # shown in the patcher's report
    undo() -> None                           # what revert() calls

A setting without an installed provider fails where it is asked for, naming the
distribution to install. So the engine never imports the training utilities or the
plugin that serve its settings, and they reach the engine only through its public API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

from .._discovery.metadata import metadata
from .._model.errors import PatchDefinitionError
from .._model.report import FAILED
from .._model.report import Record
from .entries import Ledger


if TYPE_CHECKING:
    from typing import Protocol

    class Session(Protocol):
        """What a provider's ``start()`` returns; what ``Patcher.add_session()`` takes."""

        @property
        def records(self) -> Sequence[Record]: ...

        def undo(self) -> None: ...

    class SettingProvider(Protocol):
        def check(self, name: str, value: Any) -> None: ...

        def start(self, patcher: Any, settings: dict[str, Any]) -> Session: ...


__all__ = ["GROUP", "provider_for", "start_settings"]

#: The entry-point group of setting providers.
GROUP = "ascend_patch.settings"

#: Where the settings of the DrivingSDK patcher's API come from, for the error that names what to install.
_DISTRIBUTIONS = {
    "profiling": ("ascend-patch-training", "ascend-patch-core[training]"),
    "brake": ("ascend-patch-training", "ascend-patch-core[training]"),
    "precision_check": ("ascend-patch-training", "ascend-patch-core[training]"),
    "allow_internal_format": ("ascend-patch-torch", "ascend-patch-torch"),
}


def provider_for(name: str, asked_by: str) -> SettingProvider:
    """The installed provider of setting ``name``; PatchDefinitionError naming the fix if none."""
    info = metadata.entry_point(GROUP, name)
    if info is None:
        distribution, requirement = _DISTRIBUTIONS.get(name, ("a distribution", "its provider"))
        raise PatchDefinitionError(
            f"{asked_by} needs {distribution}, which provides the setting {name!r} "
            f"(entry-point group {GROUP!r}) and is not installed: pip install '{requirement}'"
        )
    try:
        provider = info.load()
    except Exception as exc:
        raise PatchDefinitionError(
            f"{asked_by}: the provider of setting {name!r} ({info.value} from {info.distribution}"
            f" {info.version}) cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if not (
        callable(getattr(provider, "check", None)) and callable(getattr(provider, "start", None))
    ):
        raise PatchDefinitionError(
            f"{asked_by}: {info.value} from {info.distribution} is not a setting provider "
            "(it needs check(name, value) and start(patcher, settings))"
        )
    return cast("SettingProvider", provider)


def start_settings(
    patcher: Any, settings: dict[str, Any], strict: bool, ledger: Ledger
) -> list[Session]:
    """Start each provider once with its settings; return the sessions to attach.

    A provider that raises is a FAILED record (strict mode, or a bad value: raised).
    """
    by_provider: dict[int, tuple[SettingProvider, dict[str, Any]]] = {}
    for name, value in settings.items():
        provider = provider_for(name, "apply()")
        by_provider.setdefault(id(provider), (provider, {}))[1][name] = value
    sessions: list[Session] = []
    for provider, chosen in by_provider.values():
        try:
            sessions.append(provider.start(patcher, chosen))
        except Exception as exc:
            if strict or isinstance(exc, PatchDefinitionError):
                raise
            names = ", ".join(chosen)
            record = Record("setting", names, names, FAILED, f"{type(exc).__name__}: {exc}")
            with ledger.lock:
                ledger.records.append(record)
    return sessions
