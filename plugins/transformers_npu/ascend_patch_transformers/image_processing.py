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
restated, so the patch follows the installed version. Before that, the unchanged
source is compiled the same way and must give the loaded method's bytecode exactly
(the fingerprint): a method whose file was edited after import, that uses ``super()``
or a closure, or whose source is unavailable is reported as skipped, with the reason.

The runtime check sends a call to the rewritten method only when an argument is an
NPU tensor (or a list of them) or a ``device`` naming the NPU; CPU preprocessing (a
DataLoader worker) runs the original.
"""

from __future__ import annotations
import __future__

import ast
import inspect
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import SkipPatch

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
_FACTORY = "ascend_patch_method_factory"
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag

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

    def __init__(self) -> None:
        self.count = 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        dims = _wide_dims(node)
        if dims is None:
            return node
        assert isinstance(node.func, ast.Attribute)
        self.count += 1
        dims_node = ast.Tuple([ast.Constant(d) for d in dims], ast.Load())
        call = ast.Call(ast.Name(_HELPER, ast.Load()), [node.func.value, dims_node], [])
        return ast.fix_missing_locations(ast.copy_location(call, node))


def _method_code(function: types.FunctionType, rewrite: bool) -> tuple[types.CodeType, int]:
    """``function``'s code compiled from its module's source (rewritten or not), in context.

    The definition is taken from the parsed module (its real line numbers, its
    docstring as written) and compiled in a class of the same name (private names
    mangle the same) inside a factory whose parameter is the helper the rewrite calls.
    """
    module = sys.modules.get(function.__module__)
    if module is None:
        raise SkipPatch(f"{function.__qualname__}: its module is not loaded")
    tree = ast.parse(inspect.getsource(module))
    owner, _, _ = function.__qualname__.rpartition(".")
    scope: list[ast.stmt] = tree.body
    if owner:
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
        scope = classes[-1].body if classes else []
    definitions = [
        node
        for node in scope
        if isinstance(node, ast.FunctionDef)
        and node.name == function.__name__
        and min([node.lineno] + [d.lineno for d in node.decorator_list])
        == function.__code__.co_firstlineno
    ]
    if not definitions:
        raise SkipPatch(f"{function.__qualname__}: no definition at its line in the module source")
    definition = definitions[0]
    count = 0
    if rewrite:
        transformer = _NarrowPermutes()
        definition = transformer.visit(definition)
        count = transformer.count
    body: list[ast.stmt] = [definition]
    if owner:  # declared global, so a reference to the class stays a global, as in the module
        body = [ast.Global([owner]), ast.ClassDef(owner, [], [], [definition], [])]
    factory = ast.FunctionDef(
        _FACTORY,
        ast.arguments([], [ast.arg(_HELPER)], None, [], [], None, []),
        [*body, ast.Return(ast.Constant(None))],
        [],
    )
    # The module's other top-level statements (never run: only code objects are taken)
    # give the compiler the same symbols: Python 3.11 compiles ``torch.cat(...)``
    # differently when ``torch`` was imported in the module.
    skipped = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    statements = [node for node in tree.body if not isinstance(node, skipped)]
    compiled = ast.fix_missing_locations(ast.Module([*statements, factory], []))
    flags = function.__code__.co_flags & _FUTURE_FLAGS
    code = compile(compiled, function.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    found = _find_code(code, function.__name__, function.__code__.co_firstlineno)
    if found is None:
        raise SkipPatch(f"{function.__qualname__}: its recompiled code was not found")
    return found, count


def _find_code(code: types.CodeType, name: str, first_line: int) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name and const.co_firstlineno == first_line:
                return const
            inner = _find_code(const, name, first_line)
            if inner is not None:
                return inner
    return None


def _fingerprint(code: types.CodeType) -> tuple[Any, ...]:
    consts = tuple(
        _fingerprint(c) if isinstance(c, types.CodeType) else (type(c), c) for c in code.co_consts
    )
    return (
        code.co_code,
        code.co_names,
        code.co_varnames,
        code.co_cellvars,
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        consts,
    )


_rewritten: dict[types.FunctionType, types.FunctionType] = {}


def narrow_permute_rewrite(function: Any) -> types.FunctionType:
    """``function`` recompiled from its source with its wide permutes made narrow.

    Raises :class:`SkipPatch` (the patch is reported skipped, with the reason) when the
    source cannot be trusted to be the loaded code, or has no wide permute.
    """
    if not isinstance(function, types.FunctionType):
        raise SkipPatch(f"{function!r} is not a plain function")
    done = _rewritten.get(function)
    if done is not None:
        return done
    name = function.__qualname__
    if "<locals>" in name or function.__code__.co_freevars:
        raise SkipPatch(f"{name} uses a closure (super() or a nested scope): not rewritten")
    if _HELPER in function.__code__.co_names + function.__code__.co_varnames:
        raise SkipPatch(f"{name} already uses the name {_HELPER}")
    try:
        plain, _ = _method_code(function, rewrite=False)
    except (OSError, TypeError, SyntaxError) as error:
        raise SkipPatch(f"{name}: its source is not available ({error})") from error
    if _fingerprint(plain) != _fingerprint(function.__code__):
        raise SkipPatch(
            f"{name}: its source file does not match the loaded code (edited after import?)"
        )
    code, count = _method_code(function, rewrite=True)
    if count == 0:
        raise SkipPatch(f"{name} has no permute of more than {MAX_DIMS} dims: not needed")
    if sys.version_info >= (3, 11):  # tracebacks and profilers name the method as before
        code = code.replace(co_qualname=function.__code__.co_qualname)
    if code.co_freevars != (_HELPER,):
        raise SkipPatch(f"{name}: the rewritten code has free variables {code.co_freevars}")
    rewritten = types.FunctionType(
        code,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        (types.CellType(permute_narrow),),
    )
    rewritten.__kwdefaults__ = function.__kwdefaults__
    rewritten.__annotations__ = function.__annotations__
    rewritten.__doc__ = function.__doc__
    rewritten.__qualname__ = function.__qualname__
    rewritten.__module__ = function.__module__
    rewritten.__dict__.update(function.__dict__)
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
