"""The emulated ``torch_npu`` package, served to ``import`` by a meta-path finder.

The modules are built at activation but reach ``sys.modules`` only through a real
import, so the core's import hub sees ``import torch_npu`` happen and runs the
patches waiting for it. The finder sits right after the hub on ``sys.meta_path``
(ahead of the path finder, so an installed torch_npu wheel is never loaded
instead).

What exists: ``torch_npu`` (every op of the version as ``torch_npu.<op>``, which
is ``torch.ops.npu.<op>`` as in the real package; ``__version__``; ``Format``),
``torch_npu.npu`` (= ``torch.npu``) with ``torch_npu.npu.amp``,
``torch_npu.npu.memory`` and ``torch_npu.npu.utils`` (importable as ``torch.npu.amp``
& co. too, as with torch_npu), ``torch_npu.utils``,
``torch_npu.version``, ``torch_npu._C`` (only ``_weak_ref_tensor``) and an empty
``torch_npu.contrib``. ``torch_npu.get_npu_format`` returns a ``Format``, as torch_npu's
Python wrapper of the op does. ``torch_npu.contrib.transfer_to_npu`` refuses to import with
an explanation: it rewrites torch globally with no undo.
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from . import _runtime
from ._kernels.layout import weak_ref_tensor


__all__ = [
    "ORIGIN",
    "EmulatedPackage",
    "Format",
    "build",
    "clear",
    "install_finder",
    "remove_finder",
]

ORIGIN = "emulated by ascend_patch_emulator"
_ROOT = "torch_npu"
_TORCH_NPU_ALIAS = "torch.npu."

_REFUSED = {
    "torch_npu.contrib.transfer_to_npu": (
        "torch_npu.contrib.transfer_to_npu is not emulated: it rewrites torch globally with "
        "no way back. Under ascend-patch, CUDA-to-NPU redirection comes from the plugins' "
        "reversible patches (see docs/emulator.md)."
    ),
}


class Format(enum.IntEnum):
    """``torch_npu.Format``: the ACL storage format ids (torch_npu's ``IntEnum``)."""

    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47
    FRACTAL_NZ_C0_16 = 50
    FRACTAL_NZ_C0_32 = 51
    FRACTAL_NZ_C0_2 = 52
    FRACTAL_NZ_C0_4 = 53
    FRACTAL_NZ_C0_8 = 54

    def __str__(self) -> str:
        return self.name


def _format_getter(op: Any) -> Any:
    """``torch_npu.get_npu_format``: torch_npu wraps the op so it returns a :class:`Format`."""

    def get_npu_format(tensor: Any) -> Format:
        """get the Format type of tensor"""
        return Format(op(tensor))

    return get_npu_format


class EmulatedPackage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finder and loader of the emulated ``torch_npu`` modules."""

    def __init__(
        self, modules: dict[str, types.ModuleType], eager: Mapping[str, Sequence[str]]
    ) -> None:
        self.modules = modules
        self._eager = eager

    def _module_for(self, fullname: str) -> types.ModuleType | None:
        module = self.modules.get(fullname)
        if module is None and fullname.startswith(_TORCH_NPU_ALIAS):
            # torch.npu is torch_npu.npu: its submodules import under both names
            # (mmengine: ``from torch.npu.amp import GradScaler``).
            module = self.modules.get(f"{_ROOT}.npu.{fullname[len(_TORCH_NPU_ALIAS) :]}")
        return module

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in _REFUSED:
            return importlib.machinery.ModuleSpec(fullname, self, origin=ORIGIN)
        module = self._module_for(fullname)
        if module is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, origin=ORIGIN, is_package=hasattr(module, "__path__")
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        refused = _REFUSED.get(spec.name)
        if refused is not None:
            raise ImportError(refused, name=spec.name)
        module = self._module_for(spec.name)
        assert module is not None  # find_spec found it
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        spec = module.__spec__
        name = spec.name if spec is not None else module.__name__
        for child in self._eager.get(name, ()):
            importlib.import_module(child)

    def forget(self) -> None:
        """Take the emulated modules out of ``sys.modules`` (only those that are ours)."""
        for name, module in self.modules.items():
            aliases = [name]
            if name.startswith(f"{_ROOT}.npu."):
                aliases.append(_TORCH_NPU_ALIAS + name[len(f"{_ROOT}.npu.") :])
            for alias in aliases:
                if sys.modules.get(alias) is module:
                    del sys.modules[alias]


def _module(name: str, doc: str, *, package: bool = False) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    if package:
        module.__path__ = []
    return module


def clear(module: types.ModuleType) -> None:
    """Remove every attribute of ``module`` but the import system's dunders."""
    for name in list(vars(module)):
        if not (name.startswith("__") and name.endswith("__")) or name in (
            "__getattr__",
            "__all__",
        ):
            delattr(module, name)


def _fill(module: types.ModuleType, names: Sequence[str]) -> None:
    clear(module)
    for name in names:
        setattr(module, name, _runtime.export(name))
    module.__all__ = [n for n in names if not n.startswith("_")]  # type: ignore[attr-defined]


def build(
    version: str,
    namespace: Any,
    op_names: Sequence[str],
    exposed: Sequence[str],
    npu: types.ModuleType,
) -> EmulatedPackage:
    """The emulated modules of torch_npu ``version``, with ``op_names`` from ``namespace``.

    ``namespace`` is the real ``torch.ops.npu``: torch_npu's ops are its op packets.
    ``npu`` is the process's one ``torch.npu`` module object; it is filled here.
    """
    label = f"torch_npu {version}, emulated on CPU by ascend-patch"
    root = _module(_ROOT, f"{label}: real op schemas, CPU reference kernels.", package=True)
    root.__version__ = version  # type: ignore[attr-defined]
    root.__emulated__ = True  # type: ignore[attr-defined]
    root.Format = Format  # type: ignore[attr-defined]
    for name in op_names:
        setattr(root, name, getattr(namespace, name))
    if "get_npu_format" in op_names:
        root.get_npu_format = _format_getter(namespace.get_npu_format)  # type: ignore[attr-defined]
    root.__all__ = list(exposed)  # type: ignore[attr-defined]

    def missing(name: str) -> Any:
        raise AttributeError(
            f"module 'torch_npu' has no attribute {name!r} ({label}: neither an op of this "
            f"version nor a part of torch_npu the emulator provides)"
        )

    root.__getattr__ = missing  # type: ignore[method-assign]

    _fill(npu, _runtime.NPU_EXPORTS)
    npu.__doc__ = f"torch.npu / torch_npu.npu ({label})."
    amp = _module(f"{_ROOT}.npu.amp", f"torch.npu.amp ({label}): CPU autocast.")
    _fill(amp, _runtime.AMP_EXPORTS)
    memory = _module(f"{_ROOT}.npu.memory", f"torch.npu.memory ({label}): nothing tracked.")
    _fill(memory, _runtime.MEMORY_EXPORTS)
    random = _module(f"{_ROOT}.npu.random", f"torch.npu.random ({label}): the CPU generator.")
    _fill(random, _runtime.RANDOM_EXPORTS)
    npu_utils = _module(f"{_ROOT}.npu.utils", f"torch_npu.npu.utils ({label}).")
    _fill(npu_utils, _runtime.UTILS_EXPORTS)
    utils = _module(f"{_ROOT}.utils", f"torch_npu.utils ({label}).", package=True)
    _fill(utils, _runtime.UTILS_EXPORTS)
    version_module = _module(f"{_ROOT}.version", f"torch_npu.version ({label}).")
    version_module.__version__ = version  # type: ignore[attr-defined]
    version_module.git_version = "emulated"  # type: ignore[attr-defined]
    version_module.emulated = True  # type: ignore[attr-defined]
    contrib = _module(f"{_ROOT}.contrib", f"torch_npu.contrib ({label}): empty.", package=True)
    extension = _module(f"{_ROOT}._C", f"torch_npu._C ({label}): the parts the emulator has.")
    extension._weak_ref_tensor = weak_ref_tensor  # type: ignore[attr-defined]

    modules = {
        m.__name__: m
        for m in (
            root,
            npu,
            amp,
            memory,
            random,
            npu_utils,
            utils,
            version_module,
            contrib,
            extension,
        )
    }
    eager = {
        _ROOT: (f"{_ROOT}.npu", f"{_ROOT}.utils", f"{_ROOT}.version", f"{_ROOT}._C"),
        f"{_ROOT}.npu": (
            f"{_ROOT}.npu.amp",
            f"{_ROOT}.npu.memory",
            f"{_ROOT}.npu.random",
            f"{_ROOT}.npu.utils",
        ),
    }
    return EmulatedPackage(modules, eager)


def install_finder(finder: EmulatedPackage) -> None:
    """Put ``finder`` right behind the engine's import hub, so its watches see torch_npu."""
    from ascend_patch_core.imports import add_finder

    add_finder(finder)


def remove_finder(finder: EmulatedPackage) -> None:
    """Off ``sys.meta_path`` without making concurrent imports skip a finder (see the hub's)."""
    from ascend_patch_core.imports import remove_finder as remove_safely

    remove_safely(finder)
