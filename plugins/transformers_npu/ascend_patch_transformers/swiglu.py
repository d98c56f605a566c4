"""TransformersSwiGLU: SwiGLU MLPs of transformers -> ``torch_npu.npu_swiglu`` on the NPU.

``npu_swiglu(x, dim=-1)`` computes ``silu(a) * b`` for ``a, b = x.chunk(2, dim)``: the
gate and the up projection side by side in one tensor. Found by a pattern hook over
``transformers.models.*.modeling_*``: classes whose ``forward`` is, by source
(:mod:`ascend_patch_transformers.source_shapes`), one of

* separate projections (Llama, Qwen2, Qwen3, Qwen3-MoE's experts in 4.x, Mistral,
  Gemma; Mixtral's and PhiMoE's 4.x experts name them ``w1``, ``w3``, ``w2``)::

      down_proj(act_fn(gate_proj(x)) * up_proj(x))

  served as ``down_proj(npu_swiglu(cat((gate_proj(x), up_proj(x)), -1)))``: the two
  projections run as before (so LoRA or quantized layers in their place still work)
  and one copy puts them side by side;
* one fused projection (Phi-3)::

      gate, up = gate_up_proj(x).chunk(2, dim=-1); down_proj(up * activation_fn(gate))

  served as ``down_proj(npu_swiglu(gate_up_proj(x)))``, no copy (but see below for a
  strided projection);
* stacked experts multiplied by ``bmm`` (Llama-4's ``Llama4TextExperts``, 4.51-5.x)::

      gate_up = bmm(x.view(E, -1, H), gate_up_proj); gate, up = gate_up.chunk(2, -1)
      bmm(up * act_fn(gate), down_proj).view(-1, H)

  served as ``bmm(npu_swiglu(gate_up), down_proj)``, no copy (likewise).

transformers 5.x also holds the experts of most MoE families (Qwen3-MoE, Qwen2-MoE,
Mixtral, OLMoE, DeepSeek-V2/V3, ...) as one module of stacked weights decorated with
``@use_experts_implementation``. That decorator makes ``forward`` a dispatcher over
``config._experts_implementation``: ``grouped_mm`` (what a model gets unless it asks for
another, on any device), ``batched_mm`` and the CUDA-only ``deepgemm`` gate through
the class's ``_apply_gate(gate_up)`` -- transformers' ``_default_apply_gate`` unless the
class writes its own (the CUDA-only ``sonicmoe`` fuses its own); ``eager`` (asked for, or an
experts module used outside a model) runs the class's own loop, whose gate is inline.
So the target is ``<Class>._apply_gate`` of every class whose ``_apply_gate`` (its own
or the one the decorator put there) is, by source::

      gate, up = gate_up.chunk(2, dim=-1); return act_fn(gate) * up

served as ``npu_swiglu(gate_up)``: the gate is the first half, as the op wants, so one
call on the projection's output, no copy. Clamped gates (GPT-OSS, DeepSeek-V4, ...)
are other formulas and take no patch; the eager loop is not served; nor are experts
declared ``has_gate=False`` (NemotronH's), which never call ``_apply_gate``.

``npu_swiglu`` takes contiguous inputs only. ``cat``'s result is contiguous; the fused
and stacked forwards hand the op their projection's output through ``.contiguous()``,
free when it already is (a Linear's, bmm's) and a copy only when a LoRA or quantized
layer returned a strided one, which the runtime check cannot see before it is computed;
``_apply_gate``'s runtime check sees its argument, so a strided one runs the original.

The runtime check wants an NPU float16/bfloat16/float32 input of 1-7 dims (1-8 for the
experts; ``_apply_gate``'s input also contiguous with an even last dim) and an
activation that is SiLU (``torch.nn.SiLU`` or transformers' ``SiLUActivation``, what
``hidden_act="silu"`` builds); a GeGLU MLP (Gemma's ``gelu_pytorch_tanh``) has the same
source and runs the original, counted as a fallback.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import with_imports

from .source_shapes import Definitions
from .source_shapes import defined_class
from .source_shapes import module_definitions
from .source_shapes import shape_of_source


if TYPE_CHECKING:  # at run time, with_imports binds it on the replacement's first call
    from torch_npu import npu_swiglu


__all__ = ["is_silu", "swiglu_hook"]

SEPARATE = "separate gate/up projections"
SEPARATE_W = "separate gate/up projections w1/w3"
FUSED = "fused gate_up projection"
STACKED = "stacked experts (bmm)"
STACKED_BY_COUNT = "stacked experts (bmm, counted by num_experts)"
EXPERTS_GATE = "fused experts' _apply_gate"

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
    shape_of_source(  # 4.x Mixtral/PhiMoE experts: w1 the gate, w3 the up, w2 the down projection
        """
        def forward(self, hidden_states):
            current_hidden_states = self.act_fn(self.w1(hidden_states)) * self.w3(hidden_states)
            current_hidden_states = self.w2(current_hidden_states)
            return current_hidden_states
        """
    ): SEPARATE_W,
    shape_of_source(
        """
        def forward(self, hidden_states):
            up_states = self.gate_up_proj(hidden_states)
            gate, up_states = up_states.chunk(2, dim=-1)
            up_states = up_states * self.activation_fn(gate)
            return self.down_proj(up_states)
        """
    ): FUSED,
    shape_of_source(
        """
        def forward(self, hidden_states):
            hidden_states = hidden_states.view(self.gate_up_proj.shape[0], -1, self.hidden_size)
            gate_up = torch.bmm(hidden_states, self.gate_up_proj)
            gate, up = gate_up.chunk(2, dim=-1)
            next_states = torch.bmm((up * self.act_fn(gate)), self.down_proj)
            next_states = next_states.view(-1, self.hidden_size)
            return next_states
        """
    ): STACKED,
    shape_of_source(  # 4.51: the experts counted by num_experts
        """
        def forward(self, hidden_states):
            hidden_states = hidden_states.view(self.num_experts, -1, self.hidden_size)
            gate_up = torch.bmm(hidden_states, self.gate_up_proj)
            gate, up = gate_up.chunk(2, dim=-1)
            next_states = torch.bmm((up * self.act_fn(gate)), self.down_proj)
            next_states = next_states.view(-1, self.hidden_size)
            return next_states
        """
    ): STACKED_BY_COUNT,
}

#: ``_apply_gate`` of transformers 5.x's fused experts (``integrations.moe``).
_GATE_SHAPES = {
    shape_of_source(
        """
        def _apply_gate(self, gate_up_out):
            gate, up = gate_up_out.chunk(2, dim=-1)
            return self.act_fn(gate) * up
        """
    ): EXPERTS_GATE,
}

_NPU_DTYPES = ("float16", "bfloat16", "float32")


def is_silu(activation: Any) -> bool:
    """Whether ``activation`` (a module) computes ``silu``: ``nn.SiLU`` or transformers' ``SiLUActivation``."""
    torch = sys.modules["torch"]
    kind = type(activation)
    return kind is torch.nn.SiLU or (
        kind.__name__ == "SiLUActivation" and kind.__module__ == "transformers.activations"
    )


def _input_ok(x: Any, max_dims: int = 7) -> bool:
    torch = sys.modules["torch"]
    return (
        type(x) is torch.Tensor
        and bool(getattr(x, "is_npu", False))
        and str(x.dtype).rpartition(".")[2] in _NPU_DTYPES
        and 1 <= x.dim() <= max_dims  # the op takes 1-8 dims
    )


def _separate_check(self: Any, x: Any) -> bool:
    # The gate/up tensor has the input's rank.
    return _input_ok(x) and is_silu(getattr(self, "act_fn", None))


def _fused_check(self: Any, hidden_states: Any) -> bool:
    return _input_ok(hidden_states) and is_silu(getattr(self, "activation_fn", None))


def _stacked_check(self: Any, hidden_states: Any) -> bool:
    # The gate/up tensor is 3-D (experts, tokens, 2I) whatever the input's rank.
    return _input_ok(hidden_states, max_dims=8) and is_silu(getattr(self, "act_fn", None))


def _gate_check(self: Any, gate_up_out: Any) -> bool:
    # The op takes contiguous inputs only, with an even last dim. Here, unlike the fused
    # and stacked forwards, the tensor is an argument the check sees before anything is
    # computed: grouped_mm's and batched_mm's outputs are contiguous, and anything else
    # runs the original, which needs no copy (chunk gives views), counted as a fallback.
    return (
        _input_ok(gate_up_out, max_dims=8)
        and gate_up_out.shape[-1] % 2 == 0
        and gate_up_out.is_contiguous()
        and is_silu(getattr(self, "act_fn", None))
    )


@with_imports(("torch_npu", "npu_swiglu"))
def _separate_forward(self: Any, x: Any) -> Any:
    torch = sys.modules["torch"]
    gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), -1)  # cat's result: contiguous
    return self.down_proj(npu_swiglu(gate_up, dim=-1))


@with_imports(("torch_npu", "npu_swiglu"))
def _separate_w_forward(self: Any, hidden_states: Any) -> Any:
    torch = sys.modules["torch"]
    gate_up = torch.cat((self.w1(hidden_states), self.w3(hidden_states)), -1)
    return self.w2(npu_swiglu(gate_up, dim=-1))


@with_imports(("torch_npu", "npu_swiglu"))
def _fused_forward(self: Any, hidden_states: Any) -> Any:
    # npu_swiglu takes contiguous inputs only. A Linear's output is; a LoRA or quantized
    # layer in gate_up_proj's place may return a strided one, known only once computed
    # (the runtime check cannot see it): .contiguous() copies then and costs nothing
    # otherwise. Chosen over computing the eager gate there: the gate rounds the same way
    # whatever layer produced gate_up, the copy writes no more than the eager gate's two
    # intermediates would, and the counters stay true (the op ran).
    return self.down_proj(npu_swiglu(self.gate_up_proj(hidden_states).contiguous(), dim=-1))


def _stacked(experts: Any) -> int:
    return int(experts.gate_up_proj.shape[0])


def _counted(experts: Any) -> int:
    return int(experts.num_experts)


def _stacked_forward(count: Any) -> Any:
    """Llama-4's stacked-experts forward, the experts counted as the original counts them."""

    @with_imports(("torch_npu", "npu_swiglu"))
    def forward(self: Any, hidden_states: Any) -> Any:
        torch = sys.modules["torch"]
        hidden_states = hidden_states.view(count(self), -1, self.hidden_size)
        # bmm's result is contiguous as torch computes it; .contiguous() (free then) keeps
        # npu_swiglu's contiguous-only rule should a quantized weight's bmm return a
        # strided one (see _fused_forward for why a copy rather than the eager gate).
        gate_up = torch.bmm(hidden_states, self.gate_up_proj).contiguous()
        return torch.bmm(npu_swiglu(gate_up, dim=-1), self.down_proj).view(-1, self.hidden_size)

    return forward


@with_imports(("torch_npu", "npu_swiglu"))
def _experts_gate(self: Any, gate_up_out: Any) -> Any:
    return npu_swiglu(gate_up_out, dim=-1)


_FORWARDS = {
    SEPARATE: (_separate_forward, _separate_check),
    SEPARATE_W: (_separate_w_forward, _separate_check),
    FUSED: (_fused_forward, _fused_check),
    STACKED: (_stacked_forward(_stacked), _stacked_check),
    STACKED_BY_COUNT: (_stacked_forward(_counted), _stacked_check),
}

_function_shapes: dict[Any, str] = {}


def _function_shape(function: Any) -> str:
    """The shape of a function written elsewhere (``integrations.moe._default_apply_gate``)."""
    found = _function_shapes.get(function)
    if found is None:
        try:
            found = shape_of_source(inspect.getsource(function))
        except (OSError, TypeError, SyntaxError):
            found = ""  # no source, or not one plain function: unknown formula
        _function_shapes[function] = found
    return found


def _gate_shape(definitions: Definitions, name: str, cls: type) -> str:
    """The shape of ``cls._apply_gate`` when the class holds one: its own, or a decorator's."""
    own = definitions.classes[name].get("_apply_gate")
    if own is not None:
        return own
    gate = cls.__dict__.get("_apply_gate")  # put there by @use_experts_implementation
    return _function_shape(gate) if inspect.isfunction(gate) else ""


def _named(node: ast.expr, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def _declared_without_gate(cls: type) -> bool:
    """Whether ``cls`` is decorated ``@use_experts_implementation(has_gate=False)``.

    Such experts (NemotronH's: up and down projections only) never call ``_apply_gate``:
    the decorator still puts the default one on the class, but patching it would report
    a target that no path runs.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return False
    node = tree.body[0] if tree.body else None
    for decorator in getattr(node, "decorator_list", ()):
        if isinstance(decorator, ast.Call) and _named(decorator.func, "use_experts_implementation"):
            for keyword in decorator.keywords:
                value = keyword.value
                if keyword.arg == "has_gate" and isinstance(value, ast.Constant):
                    return value.value is False
    return False


def swiglu_hook(module: ModuleType) -> Iterator[AtomicPatch]:
    """The ``ModuleHook`` callback: a patch for each SwiGLU MLP or experts gate in ``module``."""
    definitions = module_definitions(module)
    for name, kind in definitions.classes_with("forward", _FORWARD_SHAPES):
        if defined_class(module, name) is None:
            continue
        replacement, check = _FORWARDS[kind]
        yield AtomicPatch(
            f"{module.__name__}:{name}.forward",
            replacement,
            runtime_check=check,
            note=f"npu_swiglu, {kind} (recognised by source)",
        )
    for name in definitions.classes:
        cls = defined_class(module, name)
        if cls is None or _GATE_SHAPES.get(_gate_shape(definitions, name, cls)) is None:
            continue
        if _declared_without_gate(cls):
            continue
        yield AtomicPatch(
            f"{module.__name__}:{name}._apply_gate",
            _experts_gate,
            runtime_check=_gate_check,
            note=f"npu_swiglu, {EXPERTS_GATE} (recognised by source)",
        )
