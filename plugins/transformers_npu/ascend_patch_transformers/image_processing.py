"""VisionPatchify: the vision processors' wide patchify permute, done in passes of at most 8 dims.

The Qwen2-VL family of image and video processors cuts a frame batch into patches
with a view to 10 dimensions (9 in transformers 4.51) and one ``permute`` of all of
them. On an Ascend NPU (a processor runs there when it is given ``device="npu"``), a
transpose of more than 8 dimensions is the problem the DrivingSDK patcher reported;
it is not measured here. Where the call sits differs by version and class:

* 4.51.3: ``Qwen2VLImageProcessorFast._preprocess`` (9 dims);
* 4.57.6: ``_preprocess`` of ``Qwen2VLImageProcessorFast``, ``Glm4vImageProcessorFast``
  and the video processors of Qwen2-VL, Qwen3-VL and GLM-4V (10 dims);
* 5.24.0: the image processors' ``patchify`` permutes 8 dims already (nothing to do);
  the video processors still permute 10, in ``patchify`` (Qwen2-VL, Qwen3-VL, GLM-4V,
  GLM-4.6V, ...) or ``_preprocess`` (MiniMax-M3-VL, ERNIE-4.5-VL: 9).

So the target is found, not listed: a pattern hook visits each
``transformers.models.*.image_processing_*`` and ``*.video_processing_*`` module and
takes every method whose source has a ``.permute(...)`` of more than 8 literal
dimensions. The method is recompiled from its own source with only that call changed
to :func:`~ascend_patch_transformers.narrow_permute.permute_narrow` (same values and
shape, contiguous, at most 8 dims per pass): nothing else of the method is copied or
restated, so the patch follows the installed version. The recompiling is
:mod:`~ascend_patch_transformers.method_rewrite`'s: before the change, the unchanged
source compiled the same way must give the loaded method's bytecode exactly (the
fingerprint); a method whose file was edited after import, that uses ``super()`` or a
closure, or whose source is unavailable is reported as skipped, with the reason.

The runtime check sends a call to the rewritten method only when an argument is an
NPU tensor (or a list of them) or a ``device`` naming the NPU; CPU preprocessing (a
DataLoader worker) runs the original.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import SkipPatch

from .method_rewrite import rewritten_function
from .narrow_permute import MAX_DIMS
from .narrow_permute import permute_narrow


__all__ = [
    "PROCESSOR_MODULES",
    "narrow_permute_rewrite",
    "on_npu",
    "vision_patchify_hook",
    "wide_permute_methods",
]

#: The modules the hook visits (``fnmatch``).
PROCESSOR_MODULES = (
    "transformers.models.*.image_processing_*",
    "transformers.models.*.video_processing_*",
)

#: The free variable the rewritten method calls instead of ``.permute``.
_HELPER = "ascend_patch_permute_narrow"

_WIDE = re.compile(rf"\.permute\(\s*(?:\d+\s*,\s*){{{MAX_DIMS},}}")


def _wide_dims(node: ast.AST) -> tuple[int, ...] | None:
    """The dims of ``<x>.permute(<int>, ...)`` (or of one literal tuple) if more than 8."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "permute"
        and not node.keywords
    ):
        return None
    args = node.args
    if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
        args = args[0].elts
    if len(args) <= MAX_DIMS:
        return None
    dims = [a.value for a in args if isinstance(a, ast.Constant) and type(a.value) is int]
    return tuple(dims) if len(dims) == len(args) else None


class _NarrowPermutes(ast.NodeTransformer):
    """``x.permute(0, 1, ..., 9)`` -> ``ascend_patch_permute_narrow(x, (0, 1, ..., 9))``."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        dims = _wide_dims(node)
        if dims is None:
            return node
        assert isinstance(node.func, ast.Attribute)
        dims_node = ast.Tuple([ast.Constant(d) for d in dims], ast.Load())
        call = ast.Call(ast.Name(_HELPER, ast.Load()), [node.func.value, dims_node], [])
        return ast.fix_missing_locations(ast.copy_location(call, node))


_rewritten: dict[types.FunctionType, types.FunctionType] = {}


def narrow_permute_rewrite(function: Any) -> types.FunctionType:
    """``function`` recompiled from its source with its wide permutes made narrow.

    Raises :class:`SkipPatch` (the patch is reported skipped, with the reason) when the
    source cannot be trusted to be the loaded code, or has no wide permute.
    """
    done = _rewritten.get(function) if isinstance(function, types.FunctionType) else None
    if done is not None:
        return done
    rewritten = rewritten_function(
        function,
        _NarrowPermutes(),
        {_HELPER: permute_narrow},
        unchanged=f"it has no permute of more than {MAX_DIMS} dims: not needed",
    )
    if isinstance(rewritten, str):
        raise SkipPatch(f"{getattr(function, '__qualname__', function)!s}: {rewritten}")
    _rewritten[function] = rewritten
    return rewritten


def _precheck(original: Any) -> bool:
    narrow_permute_rewrite(original)
    return True


def _is_npu(value: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    if isinstance(value, torch.Tensor):
        return getattr(value, "is_npu", False) is True
    if isinstance(value, (str, torch.device)):
        return str(value).startswith("npu")
    return False


def on_npu(*args: Any, **kwargs: Any) -> bool:
    """The runtime check: an argument is an NPU tensor, a list of them, or names the NPU."""
    return any(_is_npu(v) for v in args) or any(_is_npu(v) for v in kwargs.values())


def wide_permute_methods(module: types.ModuleType) -> Iterator[tuple[str, str]]:
    """``(class name, method name)`` of ``module``'s methods with a permute of more than 8 dims."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return
    if not _WIDE.search(source):
        return
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and any(
                    _wide_dims(n) is not None for n in ast.walk(item)
                ):
                    yield node.name, item.name


def vision_patchify_hook(module: types.ModuleType) -> Iterator[AtomicPatch]:
    """The ``ModuleHook`` callback: a patch per method of ``module`` with a wide permute."""
    for class_name, method in wide_permute_methods(module):
        owner = module.__dict__.get(class_name)
        if not isinstance(owner, type) or owner.__module__ != module.__name__:
            continue  # rebound to a class this source does not show
        if not isinstance(owner.__dict__.get(method), types.FunctionType):
            continue
        yield AtomicPatch(
            f"{module.__name__}:{class_name}.{method}",
            target_wrapper=narrow_permute_rewrite,
            precheck=_precheck,
            runtime_check=on_npu,
            note=f"permute of more than {MAX_DIMS} dims -> passes of at most {MAX_DIMS} "
            "(the method recompiled from its own source, fingerprint-checked)",
        )
