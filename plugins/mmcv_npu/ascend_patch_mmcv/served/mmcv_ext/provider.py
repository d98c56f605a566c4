"""Builds the ``mmcv._ext`` the mmcv plugin serves where mmcv has no compiled ops.

The plugin declares ``ReplaceImport("mmcv._ext",
"ascend_patch_mmcv.served.mmcv_ext.provider:build_module", when_missing=True)`` (in
:func:`ascend_patch_mmcv.groups.import_rules`): the core calls :func:`build_module` on the first
``import mmcv._ext`` (``import mmcv.ops``), and only where the import system finds no
real ``mmcv._ext`` -- a compiled mmcv keeps its own.

The module holds every name the installed mmcv asks ``load_ext('_ext', [...])`` for
(the committed table of its release, :mod:`.provider_sources` for a release the table
does not cover): the implementation registered for it (:func:`.registry.load_all`) or
a stand-in with mmcv's argument names that raises :class:`ExtOpNotImplementedError`
when called, naming the op, the mmcv modules that ask for it and how to get it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import inspect
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .provider_sources import ext_table
from .registry import load_all


__all__ = [
    "DISTRIBUTIONS",
    "ExtOpNotImplementedError",
    "ReleaseTable",
    "build_module",
    "known_releases",
    "release_table",
    "stand_in",
]

#: The distributions that install the package ``mmcv``, in the order they are asked.
DISTRIBUTIONS = ("mmcv", "mmcv-lite", "mmcv-full")
_STAND_IN = "__ascend_patch_stand_in__"
_DOCS = "docs/mmcv-plugin.md, section 'mmcv._ext provider'"


class ExtOpNotImplementedError(NotImplementedError):
    """An ``mmcv._ext`` function the provider has no implementation of, called."""

    def __init__(self, op: str, asked_by: list[str], release: str) -> None:
        self.op = op
        self.asked_by = list(asked_by)
        who = ", ".join(self.asked_by) or "mmcv"
        super().__init__(
            f"mmcv._ext.{op} is not implemented by ascend-patch-mmcv (its mmcv._ext provider "
            f"stands in for the compiled ops that mmcv {release} lacks here; {who} asks for "
            f"it). To run it: install an mmcv built with its compiled ops for this device "
            f"(MMCV_WITH_OPS=1, built against torch_npu for the NPU), or contribute a kernel "
            f"to ascend_patch_mmcv.served.mmcv_ext (an mx_driving kernel on the NPU, portable "
            f"PyTorch elsewhere; {_DOCS})."
        )


class ReleaseTable:
    """What ``mmcv._ext`` must hold for one mmcv release, and where that was read."""

    def __init__(self, release: str, names: dict[str, Any], source: str) -> None:
        self.release = release
        #: name -> {"args": [...] or None, "returns": ..., "asked_by": [...]}
        self.names = names
        self.source = source


_lock = threading.Lock()
_data: dict[str, Any] | None = None


def _committed() -> dict[str, Any]:
    global _data
    with _lock:
        if _data is None:
            text = importlib.resources.files(__package__).joinpath("data/ext_mmcv.json")
            _data = json.loads(text.read_text(encoding="utf-8"))["versions"]
        return _data


def known_releases() -> list[str]:
    """The mmcv releases whose ``_ext`` table is committed."""
    return sorted(_committed())


def installed_release() -> str | None:
    """The installed mmcv's version, from distribution metadata (else ``mmcv.__version__``)."""
    for dist in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    version = getattr(sys.modules.get("mmcv"), "__version__", None)
    return version if isinstance(version, str) else None


def _key(release: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in release.split("."):
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def release_table(release: str | None, package_dir: Path | None = None) -> ReleaseTable:
    """The table for ``release``: committed, else read from the installed sources, else nearest.

    A release the committed data does not cover is read from the mmcv in
    ``package_dir`` (its Python modules and, where the wheel ships it, pybind.cpp);
    where that finds nothing, the nearest committed release of the same major version
    is used.
    """
    data = _committed()
    if release in data:
        return ReleaseTable(release, data[release]["names"], f"committed table of mmcv {release}")
    if package_dir is not None and package_dir.is_dir():
        names = ext_table(package_dir)["names"]
        if names:
            return ReleaseTable(release or "?", names, f"read from {package_dir}")
    known = sorted(data, key=_key)
    major = _key(release)[:1] if release else ()
    same = [r for r in known if _key(r)[:1] == major] or known
    below = [r for r in same if release is not None and _key(r) <= _key(release)]
    nearest = (below or same)[-1]
    return ReleaseTable(
        release or "?",
        data[nearest]["names"],
        f"committed table of mmcv {nearest} (nearest to {release or 'an unknown release'})",
    )


def stand_in(name: str, entry: dict[str, Any], release: str) -> Callable[..., Any]:
    """A function with mmcv's argument names for ``name`` that raises when called."""
    args = entry.get("args")
    asked_by = list(entry.get("asked_by") or ())
    signature = (
        inspect.Signature(
            [inspect.Parameter(a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in args]
        )
        if args is not None
        else None
    )

    def function(*call_args: Any, **call_kwargs: Any) -> Any:
        if signature is not None:
            signature.bind(*call_args, **call_kwargs)  # TypeError, as the compiled one's
        raise ExtOpNotImplementedError(name, asked_by, release)

    function.__name__ = function.__qualname__ = name
    function.__module__ = "mmcv._ext"
    function.__doc__ = (
        f"Stand-in for mmcv._ext.{name} (not implemented by ascend-patch-mmcv): raises "
        f"ExtOpNotImplementedError when called. Asked for by {', '.join(asked_by) or 'mmcv'}."
    )
    if signature is not None:
        function.__signature__ = signature  # type: ignore[attr-defined]
    setattr(function, _STAND_IN, True)
    return function


def build_module(fullname: str) -> dict[str, Any]:
    """The attributes of the served ``mmcv._ext`` (the ReplaceImport factory)."""
    init = getattr(sys.modules.get(fullname.rpartition(".")[0]), "__file__", None)
    package_dir = Path(init).parent if isinstance(init, str) else None
    table = release_table(installed_release(), package_dir)
    implementations = load_all()
    attributes: dict[str, Any] = {}
    implemented: list[str] = []
    for name, entry in table.names.items():
        function = implementations.get(name)
        if function is None:
            attributes[name] = stand_in(name, entry, table.release)
        else:
            attributes[name] = function
            implemented.append(name)
    for name, function in implementations.items():
        attributes.setdefault(name, function)  # a name this release does not ask for
    attributes["__doc__"] = (
        f"mmcv._ext served by ascend-patch-mmcv: no compiled mmcv._ext is installed. "
        f"{len(implemented)} of the {len(table.names)} names mmcv {table.release} asks for "
        f"are implemented; the others raise ExtOpNotImplementedError when called "
        f"({table.source})."
    )
    attributes["__ascend_patch_provider__"] = {
        "release": table.release,
        "table": table.source,
        "implemented": sorted(implemented),
        "stand_ins": sorted(set(table.names) - set(implemented)),
    }
    return attributes
