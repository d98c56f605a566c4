"""The options of ``with_precision_check``: parsed and checked before anything runs.

A wrong option is a ``PatchDefinitionError`` at ``with_precision_check(...)``, naming
the fix, rather than a surprise at the first checked call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

from ascend_patch_core import PatchDefinitionError


__all__ = ["DEFAULT_TOLERANCES", "PrecisionOptions"]

#: (atol, rtol) per dtype name. Fused kernels reorder reductions, so these follow
#: what a correct fused kernel reaches rather than bit-exactness: about one unit in
#: the last place for bfloat16 and float16, 1e-4 relative for float32. Integer and
#: bool results must match exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-8, 1e-7),
    "float32": (1e-5, 1e-4),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1.6e-2),
    "float8_e4m3fn": (1.25e-1, 1.25e-1),
    "float8_e5m2": (2.5e-1, 2.5e-1),
    "complex128": (1e-8, 1e-7),
    "complex64": (1e-5, 1e-4),
}
_OPTION_KEYS = ("patches", "first", "every", "gradients", "thresholds", "output", "msprobe")
_MSPROBE_KEYS = ("config_path", "task", "dump_path", "level", "step")


class PrecisionOptions(NamedTuple):
    """The validated options of ``Patcher.with_precision_check``."""

    patches: tuple[str, ...] | None
    first: int
    every: int
    gradients: bool
    thresholds: dict[str, tuple[float, float]]
    output: str | None
    msprobe: dict[str, Any] | None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> PrecisionOptions:
        """Check ``with_precision_check(**options)``; raise PatchDefinitionError naming the fix."""
        where = "with_precision_check"
        unknown = sorted(set(options) - set(_OPTION_KEYS))
        if unknown:
            raise PatchDefinitionError(
                f"{where}: unknown option(s) {', '.join(unknown)}; the options are {', '.join(_OPTION_KEYS)}"
            )
        patches = options.get("patches")
        if patches is not None:
            if isinstance(patches, str):
                patches = (patches,)
            if not isinstance(patches, (list, tuple, set, frozenset)) or not all(
                isinstance(p, str) and p for p in patches
            ):
                raise PatchDefinitionError(
                    f"{where}: patches must be a patch, group or target name, or a list of them; got {patches!r}"
                )
            patches = tuple(patches)
        first = _count(options.get("first", 3), "first", where)
        every = _count(options.get("every", 0), "every", where)
        if first == 0 and every == 0 and patches != ():
            raise PatchDefinitionError(
                f"{where}: first=0 and every=0 would check no call; give first=N and/or every=K"
            )
        gradients = options.get("gradients", True)
        if not isinstance(gradients, bool):
            raise PatchDefinitionError(
                f"{where}: gradients must be True or False, got {gradients!r}"
            )
        thresholds = _thresholds(options.get("thresholds"), where)
        output = options.get("output")
        if output is not None and not isinstance(output, (str, os.PathLike)):
            raise PatchDefinitionError(f"{where}: output must be a file path, got {output!r}")
        return cls(
            patches,
            first,
            every,
            gradients,
            thresholds,
            None if output is None else os.fspath(output),
            _msprobe(options.get("msprobe", False), where),
        )

    def wants(self, call: int) -> bool:
        """Whether the ``call``-th call (1-based) of a patch is checked."""
        return call <= self.first or (self.every > 0 and call % self.every == 0)

    @property
    def finite(self) -> bool:
        return self.every == 0


def _count(value: object, name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PatchDefinitionError(f"{where}: {name} must be a non-negative int, got {value!r}")
    return value


def _thresholds(value: object, where: str) -> dict[str, tuple[float, float]]:
    merged = dict(DEFAULT_TOLERANCES)
    if value is None:
        return merged
    if not isinstance(value, Mapping):
        raise PatchDefinitionError(
            f"{where}: thresholds must map dtype names to (atol, rtol), e.g. {{'float32': (1e-5, 1e-4)}}"
        )
    for dtype, pair in value.items():
        name = str(dtype).removeprefix("torch.")
        ok = (
            isinstance(pair, (tuple, list))
            and len(pair) == 2
            and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in pair
            )
        )
        if not ok:
            raise PatchDefinitionError(
                f"{where}: thresholds[{dtype!r}] must be (atol, rtol), two non-negative numbers; got {pair!r}"
            )
        merged[name] = (float(pair[0]), float(pair[1]))
    return merged


def _msprobe(value: object, where: str) -> dict[str, Any] | None:
    if value is False or value is None:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_MSPROBE_KEYS))
        if unknown:
            raise PatchDefinitionError(
                f"{where}: unknown msprobe option(s) {', '.join(map(str, unknown))}; "
                f"PrecisionDebugger takes {', '.join(_MSPROBE_KEYS)}"
            )
        return dict(value)
    raise PatchDefinitionError(
        f"{where}: msprobe must be True or a dict of PrecisionDebugger arguments, got {value!r}"
    )
