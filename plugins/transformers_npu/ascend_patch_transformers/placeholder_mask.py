"""PlaceholderMaskCount: ``get_placeholder_mask`` counts the placeholder mask, gathers nothing.

transformers' multimodal models (``*Model.get_placeholder_mask``: Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, GLM-4V, LLaVA and many more in 4.57) check that the number of image (video,
audio) placeholder tokens matches the features with::

    special_image_mask = special_image_mask.unsqueeze(-1).expand_as(inputs_embeds)
    if inputs_embeds[special_image_mask].numel() != image_features.numel(): raise ValueError(...)

``inputs_embeds[mask]`` is a boolean-index gather: it copies every selected embedding
(placeholders x hidden) into a new tensor only to take its size, and its ``nonzero``
waits for the device. The number it wants is the count of True in the mask. transformers
5.x counts (``n_image_tokens * inputs_embeds.shape[-1]``) in the vision-language models;
some of its audio models still gather.

How the gap is found: from the method's own source, whatever the model, the modality or
the error text. A class's ``get_placeholder_mask`` is rewritten when its source holds
``<parameter>[<name>].numel()``: each such expression becomes ``_selected_numel(
<parameter>, <name>)``, and the rest of the method -- its masks, its return values, its
``ValueError`` texts and conditions -- is the original's own code, compiled from its
source (tracebacks point at the library's file and lines) by
:mod:`~ascend_patch_transformers.method_rewrite`, which first checks that the unchanged
source compiles to the loaded method's bytecode (the fingerprint). ``_selected_numel`` returns
exactly ``values[mask].numel()``: for a boolean mask of the values' shape, the number
of True (an expanded mask, as here, is counted on one column and multiplied by the
width); for anything else it runs the gather itself. So the results are the original's,
with one small reduction instead of a copy of the embeddings, and still one wait for
the device (the ``if`` needs the count on the host, as the original's does).

A method without the gather (5.x's vision-language models, models that check nothing)
gets a record ``skipped`` with the reason; so does one the rewrite cannot serve (its
source file not the loaded code, a wrapper a decorator returned, or using ``super()``,
which a recompiled function has no class cell for).
The 4.51 models do their check inside ``forward`` (no ``get_placeholder_mask``): not
rewritten. The runtime check sends calls whose gathered parameter is an NPU tensor to
the rewrite, others to the original.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Callable
from collections.abc import Iterator
from types import FunctionType
from types import ModuleType
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import SkipPatch

from .method_rewrite import rewritten_function
from .source_shapes import defined_class
from .source_shapes import module_definitions


__all__ = ["counting_twin", "placeholder_mask_hook", "selected_numel"]

METHOD = "get_placeholder_mask"
#: The name the rewritten source calls the counter by (a closure variable of the twin).
_COUNTER = "_ascend_patch_selected_numel"


def selected_numel(values: Any, mask: Any) -> int:
    """``values[mask].numel()`` -- without the gather when ``mask`` is a boolean mask of ``values``' shape."""
    torch = sys.modules["torch"]
    if (
        isinstance(values, torch.Tensor)
        and isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and mask.shape == values.shape
    ):
        if mask.dim() and mask.shape[-1] and mask.stride(-1) == 0:
            # Expanded along the last dim (mask.unsqueeze(-1).expand_as(values)): every
            # column is the same, so count one and scale.
            return int(mask[..., 0].sum()) * int(mask.shape[-1])
        return int(mask.sum())
    return int(values[mask].numel())


class _CountNotGather(ast.NodeTransformer):
    """``<parameter>[<name>].numel()`` -> ``_COUNTER(<parameter>, <name>)``."""

    def __init__(self, parameters: set[str]) -> None:
        self.parameters = parameters
        self.gathered: list[str] = []

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "numel"
            and not node.args
            and not node.keywords
            and isinstance(func.value, ast.Subscript)
            and isinstance(func.value.value, ast.Name)
            and func.value.value.id in self.parameters
            and isinstance(func.value.slice, ast.Name)
        ):
            self.gathered.append(func.value.value.id)
            call = ast.Call(
                ast.Name(_COUNTER, ast.Load()), [func.value.value, func.value.slice], []
            )
            return ast.copy_location(call, node)
        return node


def counting_twin(function: FunctionType) -> tuple[FunctionType, str] | str:
    """``(twin, gathered parameter)``: ``function`` recompiled with its gathers counted; else why not."""
    code = function.__code__
    # The parameters by name (posonly, positional, keyword-only; not *args, **kwargs).
    parameters = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    rewrite = _CountNotGather(parameters)
    twin = rewritten_function(
        function,
        rewrite,
        {_COUNTER: selected_numel},
        unchanged="no boolean-index gather (<parameter>[<mask>].numel()) in its source: "
        "it counts already",
    )
    if isinstance(twin, str):
        return twin
    if len(set(rewrite.gathered)) > 1:
        return "it gathers from more than one parameter"
    return twin, rewrite.gathered[0]


def _npu_check(function: FunctionType, parameter: str) -> Callable[..., bool]:
    """``runtime_check``: the gathered parameter (by keyword or position) is an NPU tensor."""
    position = list(inspect.signature(function).parameters).index(parameter)

    def check(*args: Any, **kwargs: Any) -> bool:
        value = (
            kwargs[parameter]
            if parameter in kwargs
            else args[position]
            if len(args) > position
            else None
        )
        return getattr(value, "is_npu", False) is True

    return check


def _skip(reason: str) -> Callable[[], bool]:
    def precheck() -> bool:
        raise SkipPatch(reason)

    return precheck


def placeholder_mask_hook(module: ModuleType) -> Iterator[AtomicPatch]:
    """The ``ModuleHook`` callback: per class defining ``get_placeholder_mask``, its patch or why not."""
    for name, methods in module_definitions(module).classes.items():
        if METHOD not in methods:
            continue
        target = f"{module.__name__}:{name}.{METHOD}"
        cls = defined_class(module, name)
        function = None if cls is None else cls.__dict__.get(METHOD)
        if not isinstance(function, FunctionType):
            found: tuple[FunctionType, str] | str = "not the method this module's source defines"
        else:
            found = counting_twin(function)
        if isinstance(found, str):
            yield AtomicPatch(target, target_wrapper=_same, precheck=_skip(found))
            continue
        twin, parameter = found
        assert function is not None
        yield AtomicPatch(
            target,
            twin,
            runtime_check=_npu_check(function, parameter),
            note=f"counts the placeholder mask instead of gathering {parameter} (same results)",
        )


def _same(original: Any) -> Any:
    return original
