"""TransformersRMSNorm: transformers' RMSNorm classes -> ``torch_npu.npu_rms_norm`` on the NPU.

Found by a pattern hook (:data:`~ascend_patch_transformers.source_shapes.MODELING_MODULES`):
each ``transformers.models.*.modeling_*`` module, when imported, is searched for classes
whose ``forward`` is one of two formulas, recognised by source
(:mod:`ascend_patch_transformers.source_shapes`), whatever the class is called:

* the standard one (Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral and the many models generated
  from them)::

      x32 = x.float(); y = x32 * rsqrt(mean(x32², -1) + variance_epsilon)
      return weight * y.to(x.dtype)

  served as ``npu_rms_norm(x, weight, epsilon=variance_epsilon)[0]`` when ``x`` and
  ``weight`` have the same dtype (else ``weight * y`` would promote the result, which
  the kernel does not do: the original runs);
* Gemma's, which scales by ``1 + weight`` and rounds once, at the end, in float32::

      y = x.float() * rsqrt(mean(x.float()², -1) + eps) * (1 + weight.float())
      return y.type_as(x)

  served exactly as written: ``npu_rms_norm(x.float(), 1 + weight.float(), eps)[0]
  .type_as(x)``. torch_npu's ``npu_gemma_rms_norm`` is not used: its documentation does
  not state its formula.

A class named ``*RMSNorm`` with any other forward (another epsilon attribute, an offset
other than 1, a norm with extra arguments) takes no patch; :func:`excluded_rms_norms`
lists those met so far, with why. ``npu_rms_norm`` takes inputs of 2 to 8 dims in
float16, bfloat16 or float32; anything else runs the original and counts as a fallback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import with_imports

from .source_shapes import defined_class
from .source_shapes import module_definitions
from .source_shapes import shape_of_source


if TYPE_CHECKING:  # at run time, with_imports binds it on the replacement's first call
    from torch_npu import npu_rms_norm


__all__ = ["excluded_rms_norms", "rms_norm_hook", "rms_norm_patched_classes"]

STANDARD = "standard"
GEMMA = "gemma (1 + weight)"

_FORWARD_SHAPES = {
    shape_of_source(
        """
        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)
        """
    ): STANDARD,
    shape_of_source(
        """
        def forward(self, x):
            output = self._norm(x.float())
            output = output * (1.0 + self.weight.float())
            return output.type_as(x)
        """
    ): GEMMA,
}
# Gemma's forward calls self._norm: the class's _norm must be this one too.
_GEMMA_NORM = shape_of_source(
    """
    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    """
)

_NPU_DTYPES = ("float16", "bfloat16", "float32")

#: "module.Class" -> why it takes no patch (classes named *RMSNorm only).
_excluded: dict[str, str] = {}
#: "module.Class" -> which formula it was patched for.
_patched: dict[str, str] = {}


def excluded_rms_norms() -> dict[str, str]:
    """``{"module.Class": reason}`` for every ``*RMSNorm`` class seen so far that takes no patch."""
    return dict(_excluded)


def rms_norm_patched_classes() -> dict[str, str]:
    """``{"module.Class": formula}`` for every class the hook declared a patch for so far."""
    return dict(_patched)


def _input_ok(x: Any, weight: Any) -> bool:
    torch = sys.modules["torch"]
    return (
        type(x) is torch.Tensor
        and isinstance(weight, torch.Tensor)
        and bool(getattr(x, "is_npu", False))
        and str(x.dtype).rpartition(".")[2] in _NPU_DTYPES
        and 2 <= x.dim() <= 8
        and weight.dim() == 1
        and weight.shape[0] == x.shape[-1]
    )


def _standard_check(self: Any, hidden_states: Any) -> bool:
    """``runtime_check``: an NPU input of the weight's dtype, 2-8 dims, a float epsilon."""
    weight: Any = getattr(self, "weight", None)
    return (
        _input_ok(hidden_states, weight)
        and weight.dtype == hidden_states.dtype
        and isinstance(getattr(self, "variance_epsilon", None), (float, int))
    )


@with_imports(("torch_npu", "npu_rms_norm"))
def _standard_forward(self: Any, hidden_states: Any) -> Any:
    return npu_rms_norm(hidden_states, self.weight, epsilon=float(self.variance_epsilon))[0]


def _gemma_check(norm: Any) -> Callable[..., bool]:
    def check(self: Any, x: Any) -> bool:
        # A subclass with its own _norm computes something else.
        return (
            type(self)._norm is norm
            and _input_ok(x, getattr(self, "weight", None))
            and isinstance(getattr(self, "eps", None), (float, int))
        )

    return check


@with_imports(("torch_npu", "npu_rms_norm"))
def _gemma_forward(self: Any, x: Any) -> Any:
    gamma = 1.0 + self.weight.float()
    return npu_rms_norm(x.float(), gamma, epsilon=float(self.eps))[0].type_as(x)


def rms_norm_hook(module: ModuleType) -> Iterator[AtomicPatch]:
    """The ``ModuleHook`` callback: a patch for each RMSNorm class of a known formula in ``module``."""
    definitions = module_definitions(module)
    matched = dict(definitions.classes_with("forward", _FORWARD_SHAPES))
    for name, methods in definitions.classes.items():
        where = f"{module.__name__}.{name}"
        cls = defined_class(module, name)
        kind = matched.get(name)
        if kind == GEMMA and methods.get("_norm") != _GEMMA_NORM:
            kind = None
        if cls is None or kind is None:
            if name.endswith("RMSNorm"):
                _excluded[where] = (
                    "not the class this module's source defines"
                    if cls is None
                    else "its forward is neither the standard RMSNorm nor Gemma's (1 + weight)"
                    if "forward" in methods
                    else "it defines no forward of its own"
                )
            continue
        _patched[where] = kind
        replacement: Callable[..., Any]
        check: Callable[..., bool]
        if kind == STANDARD:
            replacement, check = _standard_forward, _standard_check
        else:
            replacement, check = _gemma_forward, _gemma_check(cls._norm)
        yield AtomicPatch(
            f"{module.__name__}:{name}.forward",
            replacement,
            runtime_check=check,
            note=f"npu_rms_norm, {kind} formula (recognised by source)",
        )
