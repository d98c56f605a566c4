"""TransformersSwiGLU: SwiGLU MLPs of transformers -> ``torch_npu.npu_swiglu`` on the NPU.

``npu_swiglu(x, dim=-1)`` computes ``silu(a) * b`` for ``a, b = x.chunk(2, dim)``: the
gate and the up projection side by side in one tensor. Found by a pattern hook over
``transformers.models.*.modeling_*``: classes whose ``forward`` is, by source
(:mod:`ascend_patch_transformers.source_shapes`), one of

* separate projections (Llama, Qwen2, Qwen3, Qwen3-MoE's experts in 4.x, Mistral,
  Gemma)::

      down_proj(act_fn(gate_proj(x)) * up_proj(x))

  served as ``down_proj(npu_swiglu(cat((gate_proj(x), up_proj(x)), -1)))``: the two
  projections run as before (so LoRA or quantized layers in their place still work)
  and one copy puts them side by side;
* one fused projection (Phi-3)::

      gate, up = gate_up_proj(x).chunk(2, dim=-1); down_proj(up * activation_fn(gate))

  served as ``down_proj(npu_swiglu(gate_up_proj(x)))``, no copy.

The runtime check wants an NPU float16/bfloat16/float32 input of 1-7 dims and an
activation that is SiLU (``torch.nn.SiLU`` or transformers' ``SiLUActivation``, what
``hidden_act="silu"`` builds); a GeGLU MLP (Gemma's ``gelu_pytorch_tanh``) has the same
source and runs the original, counted as a fallback.
"""

from __future__ import annotations

import sys
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
    from torch_npu import npu_swiglu


__all__ = ["is_silu", "swiglu_hook"]

SEPARATE = "separate gate/up projections"
FUSED = "fused gate_up projection"

_FORWARD_SHAPES = {
    shape_of_source(
        """
        def forward(self, x):
            down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
            return down_proj
        """
    ): SEPARATE,
    shape_of_source(
        """
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        """
    ): SEPARATE,
    shape_of_source(
        """
        def forward(self, hidden_states):
            up_states = self.gate_up_proj(hidden_states)
            gate, up_states = up_states.chunk(2, dim=-1)
            up_states = up_states * self.activation_fn(gate)
            return self.down_proj(up_states)
        """
    ): FUSED,
}

_NPU_DTYPES = ("float16", "bfloat16", "float32")


def is_silu(activation: Any) -> bool:
    """Whether ``activation`` (a module) computes ``silu``: ``nn.SiLU`` or transformers' ``SiLUActivation``."""
    torch = sys.modules["torch"]
    kind = type(activation)
    return kind is torch.nn.SiLU or (
        kind.__name__ == "SiLUActivation" and kind.__module__ == "transformers.activations"
    )


def _input_ok(x: Any) -> bool:
    torch = sys.modules["torch"]
    return (
        type(x) is torch.Tensor
        and bool(getattr(x, "is_npu", False))
        and str(x.dtype).rpartition(".")[2] in _NPU_DTYPES
        and 1 <= x.dim() <= 7  # the gate/up tensor has the same rank, at most 8 for the op
    )


def _separate_check(self: Any, x: Any) -> bool:
    return _input_ok(x) and is_silu(getattr(self, "act_fn", None))


def _fused_check(self: Any, hidden_states: Any) -> bool:
    return _input_ok(hidden_states) and is_silu(getattr(self, "activation_fn", None))


@with_imports(("torch_npu", "npu_swiglu"))
def _separate_forward(self: Any, x: Any) -> Any:
    torch = sys.modules["torch"]
    gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), -1)
    return self.down_proj(npu_swiglu(gate_up, dim=-1))


@with_imports(("torch_npu", "npu_swiglu"))
def _fused_forward(self: Any, hidden_states: Any) -> Any:
    # npu_swiglu wants a contiguous input: a Linear's output is.
    return self.down_proj(npu_swiglu(self.gate_up_proj(hidden_states), dim=-1))


def swiglu_hook(module: ModuleType) -> Iterator[AtomicPatch]:
    """The ``ModuleHook`` callback: a patch for each MLP class of a known SwiGLU layout in ``module``."""
    for name, kind in module_definitions(module).classes_with("forward", _FORWARD_SHAPES):
        if defined_class(module, name) is None:
            continue
        replacement, check = (
            (_separate_forward, _separate_check)
            if kind == SEPARATE
            else (_fused_forward, _fused_check)
        )
        yield AtomicPatch(
            f"{module.__name__}:{name}.forward",
            replacement,
            runtime_check=check,
            note=f"npu_swiglu, {kind} (recognised by source)",
        )
