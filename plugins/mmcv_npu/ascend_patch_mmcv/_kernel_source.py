"""Where a replacement's kernel comes from: DrivingSDK's ``mx_driving``, torch_npu, or PyTorch.

Each op group asks :func:`choose` once, when the core builds the group (at ``apply()``
or in ``doctor``), and builds its patches for the answer; the answer goes into each
patch's ``note`` (``kernel: mx_driving``), so the report and ``doctor`` show it.

The order is the one of the issue that asked for it: ``mx_driving`` when it can be
imported, else the torch_npu op when torch_npu can be imported and the op has one,
else a portable PyTorch implementation. "Can be imported" is decided with
``importlib.util.find_spec`` -- nothing is imported here: ``import mx_driving``
imports torch_npu and loads its whole op library, which ``apply()`` must not pay for.
A module already in ``sys.modules`` (the NPU emulator serves ``torch_npu`` and
``mx_driving`` that way) counts as importable -- except that an op whose
``mx_driving`` names are stand-ins there (the emulator's names without a kernel carry
``__ascend_patch_stand_in__``) does not count as having an mx_driving kernel.

``ASCEND_PATCH_MMCV_KERNELS`` overrides the choice: one source for every op
(``portable``), or ``op=source`` pairs separated by commas
(``multi_scale_deformable_attn=portable,deform_conv2d=torch_npu``) -- to work around a
faulty kernel, or to compare two sources. Naming a source that is not available, or
that the op does not have, is an error naming the op, the variable and the choices.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ascend_patch_core import PatchDefinitionError


__all__ = [
    "MX_DRIVING",
    "PORTABLE",
    "SOURCES",
    "TORCH_NPU",
    "VARIABLE",
    "choose",
    "forget_choices",
    "importable",
    "mx_driving",
    "note",
]

MX_DRIVING = "mx_driving"
TORCH_NPU = "torch_npu"
PORTABLE = "portable"
#: Every source, in the order they are preferred.
SOURCES = (MX_DRIVING, TORCH_NPU, PORTABLE)
VARIABLE = "ASCEND_PATCH_MMCV_KERNELS"

_lock = threading.Lock()
_chosen: dict[str, str] = {}


_STAND_IN = "__ascend_patch_stand_in__"


def _mx_driving_has(names: Sequence[str]) -> bool:
    """False when an already-imported mx_driving marks one of ``names`` as a stand-in."""
    module = sys.modules.get(MX_DRIVING)
    return module is None or not any(
        getattr(getattr(module, name, None), _STAND_IN, False) for name in names
    )


def importable(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (module docstring)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _overrides(text: str) -> tuple[str | None, dict[str, str]]:
    """``(source for every op, {op: source})`` from the variable's text."""
    everything: str | None = None
    per_op: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        op, sep, source = (s.strip() for s in item.partition("="))
        if not sep:
            op, source = "", op
        if source not in SOURCES:
            raise PatchDefinitionError(
                f"{VARIABLE}={text!r}: unknown kernel source {source!r}; "
                f"use one of {', '.join(SOURCES)}, alone or as op=source"
            )
        if op:
            per_op[op] = source
        else:
            everything = source
    return everything, per_op


def choose(op: str, sources: Sequence[str] = SOURCES, mx_names: Sequence[str] = ()) -> str:
    """The kernel source of ``op`` in this process: the first of ``sources`` available.

    ``sources`` lists what the op has, in preference order (an op with no torch_npu
    kernel passes ``(MX_DRIVING, PORTABLE)``); ``PORTABLE`` is always available.
    ``mx_names`` are the ``mx_driving`` names the op's kernel uses (default: ``op``).
    The answer is kept: later calls (a second ``apply()``, ``doctor`` after
    ``apply()``) get the same one until :func:`forget_choices`.
    """
    names = tuple(mx_names) or (op,)

    def available(source: str) -> bool:
        if source == PORTABLE:
            return True
        return importable(source) and (source != MX_DRIVING or _mx_driving_has(names))

    with _lock:
        if op in _chosen:
            return _chosen[op]
        everything, per_op = _overrides(os.environ.get(VARIABLE, ""))
        forced = per_op.get(op, everything)
        if forced is not None:
            if forced not in sources or not available(forced):
                have = [s for s in (*sources, PORTABLE) if available(s)]
                raise PatchDefinitionError(
                    f"{VARIABLE} asks for the {forced} kernel of {op}, which "
                    + ("this op does not have" if forced not in sources else "is not available")
                    + f"; available here: {', '.join(dict.fromkeys(have))}"
                )
            source = forced
        else:
            source = next(s for s in (*sources, PORTABLE) if available(s))
        _chosen[op] = source
        return source


def forget_choices() -> None:
    """Choose again on the next :func:`choose` (tests; after installing mx_driving)."""
    with _lock:
        _chosen.clear()


def note(source: str) -> str:
    """The patch note that says where the kernel comes from."""
    return f"kernel: {source}"


def mx_driving() -> Any:
    """The ``mx_driving`` module, imported on first use (at the first call of a kernel)."""
    module = sys.modules.get("mx_driving")
    return module if module is not None else importlib.import_module("mx_driving")
