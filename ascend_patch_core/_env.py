"""Environment settings plugins recommend through the ``configure_env`` hook."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping

from ._errors import PatchDefinitionError
from ._value import Value


__all__ = ["EnvSetting", "normalize_env"]


class EnvSetting(Value):
    """A recommended environment variable: written only if the user has not set it."""

    __module__ = "ascend_patch_core"
    __slots__ = ("name", "value", "why")
    _fields = ("name", "value", "why")

    def __init__(self, name: str, value: str, why: str = "") -> None:
        if not isinstance(name, str) or not name or "=" in name:
            raise PatchDefinitionError(f"EnvSetting: invalid variable name {name!r}")
        if not isinstance(value, str):
            raise PatchDefinitionError(
                f"EnvSetting({name!r}): value must be a string, got {value!r}"
            )
        self.name = name
        self.value = value
        self.why = why

    def __repr__(self) -> str:
        return f"EnvSetting({self.name!r}, {self.value!r}, why={self.why!r})"


def normalize_env(result: object) -> list[EnvSetting]:
    """Accept what a ``configure_env`` hook may return; raise TypeError otherwise."""
    if result is None:
        return []
    if isinstance(result, Mapping):
        return [EnvSetting(str(k), v) for k, v in result.items()]
    if isinstance(result, Iterable) and not isinstance(result, (str, bytes)):
        items = list(result)
        bad = [x for x in items if not isinstance(x, EnvSetting)]
        if bad:
            raise TypeError(f"expected EnvSetting objects, got {bad[0]!r}")
        return items
    raise TypeError(f"expected a mapping or EnvSetting objects, got {type(result).__name__}")
