"""diffusers' ``AttnProcessor2_0`` on the NPU: ``npu_fusion_attention`` instead of SDPA.

``AttnProcessor2_0`` is the processor diffusers gives every ``Attention`` by default
(UNet2DConditionModel, Transformer2DModel, ...). Its ``__call__`` is the same in diffusers
0.35.1 to 0.42.1; the replacement below follows it line by line and differs in one
call: the BNSD ``scaled_dot_product_attention`` becomes ``torch_npu.npu_fusion_attention``
(scale 1/sqrt(head_dim), SDPA's default, which ``AttnProcessor2_0`` uses; a boolean
SDPA mask, True = attend, becomes the op's mask, True = masked out).

diffusers' own ``AttnProcessorNPU`` (set by ``enable_npu_flash_attention()``) is not
used: it is opt-in per model, takes the fused op only in fp16/bf16, and skips
``norm_q``/``norm_k`` (models with qk-norm would compute something else).

Runtime check (per call; else the original runs): NPU hidden states, no mask or a
boolean one (an additive float mask may carry any bias, which the op cannot take),
float16/bfloat16/float32 hidden states, heads <= 256 and head_dim <= 512 (the op's
limits as torch_npu's own SDPA kernel uses them), and no ``scale`` argument (deprecated; the original warns about it).

Importing this module imports neither torch nor diffusers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = ["attention_processor_patches", "fused_attention", "fused_call", "fused_call_check"]

TARGET = "diffusers.models.attention_processor.AttnProcessor2_0.__call__"
_MAX_HEADS = 256
_MAX_HEAD_DIM = 512
_OP_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32")


def fused_attention(query: Any, key: Any, value: Any, heads: int, sdpa_mask: Any) -> Any:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask)`` for BNSD tensors, fused."""
    import torch_npu

    mask = None
    if sdpa_mask is not None:
        batch, _, q_len, _ = query.shape
        mask = (~sdpa_mask).expand(batch, heads, q_len, key.shape[2]).contiguous()
    return torch_npu.npu_fusion_attention(
        query,
        key,
        value,
        heads,
        "BNSD",
        atten_mask=mask,
        scale=1.0 / math.sqrt(query.shape[-1]),
        keep_prob=1.0,
    )[0]


def fused_call_check(
    self: Any,
    attn: Any,
    hidden_states: Any,
    encoder_hidden_states: Any = None,
    attention_mask: Any = None,
    temb: Any = None,
    *args: Any,
    **kwargs: Any,
) -> bool:
    if args or kwargs.get("scale") is not None or not getattr(hidden_states, "is_npu", False):
        return False
    # The op takes float16, bfloat16 and float32 only: a float64 model runs the original.
    if str(hidden_states.dtype) not in _OP_DTYPES:
        return False
    if attention_mask is not None and attention_mask.dtype.is_floating_point:
        return False
    heads = attn.heads
    head_dim = attn.to_k.out_features // heads
    return bool(heads <= _MAX_HEADS and head_dim <= _MAX_HEAD_DIM)


def fused_call(
    self: Any,
    attn: Any,
    hidden_states: Any,
    encoder_hidden_states: Any = None,
    attention_mask: Any = None,
    temb: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``AttnProcessor2_0.__call__`` with the attention fused (see the module documentation)."""
    residual = hidden_states
    if attn.spatial_norm is not None:
        hidden_states = attn.spatial_norm(hidden_states, temb)

    input_ndim = hidden_states.ndim
    if input_ndim == 4:
        batch_size, channel, height, width = hidden_states.shape
        hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)

    batch_size, sequence_length, _ = (
        hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
    )
    if attention_mask is not None:
        attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

    if attn.group_norm is not None:
        hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

    query = attn.to_q(hidden_states)
    if encoder_hidden_states is None:
        encoder_hidden_states = hidden_states
    elif attn.norm_cross:
        encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
    key = attn.to_k(encoder_hidden_states)
    value = attn.to_v(encoder_hidden_states)

    inner_dim = key.shape[-1]
    head_dim = inner_dim // attn.heads
    query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    if attn.norm_q is not None:
        query = attn.norm_q(query)
    if attn.norm_k is not None:
        key = attn.norm_k(key)

    hidden_states = fused_attention(query, key, value, attn.heads, attention_mask)

    hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
    hidden_states = hidden_states.to(query.dtype)
    hidden_states = attn.to_out[0](hidden_states)
    hidden_states = attn.to_out[1](hidden_states)
    if input_ndim == 4:
        hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)
    if attn.residual_connection:
        hidden_states = hidden_states + residual
    return hidden_states / attn.rescale_output_factor


def attention_processor_patches(options: Any = None) -> Iterator[AtomicPatch]:
    yield AtomicPatch(
        TARGET,
        fused_call,
        runtime_check=fused_call_check,
        note="torch_npu.npu_fusion_attention (BNSD)",
    )
