"""The DrivingSDK patcher's ways of saying what ``replace_import`` serves.

``replace_import(name, replacement, *, base_module=, exports=, **attrs)`` and
``replace_with.module(base, **exports)`` all come down to one pair: what the served
module falls back to (``replacement``: None, a module, a factory or a dotted name) and
the attributes it holds (``exports``). Contradictory arguments raise
:class:`PatchDefinitionError` (a ``ValueError``, as in the DrivingSDK patcher) at the
line that gave them: a keyword silently becoming an attribute named ``base_module``
would be a wrong module without an error.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from .._model.errors import PatchDefinitionError


__all__ = ["ImportReplacementSpec", "merge_replacement", "replace_with"]


class ImportReplacementSpec:
    """What ``replace_with.module(base, **exports)`` returns: a base module and exports."""

    __module__ = "ascend_patch_core"
    __slots__ = ("base_module", "exports")

    def __init__(
        self, base_module: str | types.ModuleType | None, exports: Mapping[str, Any]
    ) -> None:
        self.base_module = base_module
        self.exports = dict(exports)

    def __repr__(self) -> str:
        return f"replace_with.module({self.base_module!r}, **{self.exports!r})"


class replace_with:  # lower case: the DrivingSDK patcher's spelling
    """``replace_import(name, replace_with.module("pkg.impl", X=obj))``."""

    __module__ = "ascend_patch_core"

    @staticmethod
    def module(base: str | types.ModuleType | None = None, **exports: Any) -> ImportReplacementSpec:
        """Serve a module falling back to ``base`` (a dotted name or module) holding ``exports``."""
        return ImportReplacementSpec(base, exports)


def merge_replacement(
    module: str,
    replacement: Any,
    base_module: str | types.ModuleType | None,
    exports: Mapping[str, Any] | None,
    attrs: Mapping[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """``(replacement, exports)`` for ReplaceImport from every accepted spelling."""
    where = f"replace_import({module!r})"
    sources: list[tuple[str, Mapping[str, Any]]] = []
    if isinstance(replacement, ImportReplacementSpec):
        if base_module is not None:
            raise PatchDefinitionError(
                f"{where}: give the base module once, in replace_with.module() or as base_module="
            )
        base_module, spec = replacement.base_module, replacement
        replacement = None
        sources.append(("replace_with.module()", spec.exports))
    if base_module is not None:
        if replacement is not None:
            raise PatchDefinitionError(
                f"{where}: replacement and base_module are exclusive; give one of them"
            )
        if isinstance(base_module, str) and ":" in base_module:
            raise PatchDefinitionError(
                f"{where}: base_module names a module, got {base_module!r}; "
                "a factory is given as the replacement"
            )
        if not isinstance(base_module, (str, types.ModuleType)):
            raise PatchDefinitionError(
                f"{where}: base_module must be a dotted module name or a module, got {base_module!r}"
            )
        replacement = base_module
    if exports is not None:
        if not isinstance(exports, Mapping):
            raise PatchDefinitionError(
                f"{where}: exports must be a mapping of attribute names, got {exports!r}"
            )
        sources.append(("exports=", exports))
    sources.append(("keyword arguments", attrs))
    merged: dict[str, Any] = {}
    given_by: dict[str, str] = {}
    for source, values in sources:
        for key, value in values.items():
            if not isinstance(key, str) or not key:
                raise PatchDefinitionError(f"{where}: export names are strings, got {key!r}")
            if key in merged:
                raise PatchDefinitionError(
                    f"{where}: {key!r} is given twice ({given_by[key]} and {source})"
                )
            merged[key] = value
            given_by[key] = source
    return replacement, merged
