"""Explicit backward ops: the gradients torch_npu's autograd (and user code) call by name.

``npu_rotary_mul_backward``, ``npu_roi_alignbk``, ``npu_deformable_conv2dbk``,
``npu_fusion_attention_grad``, ``npu_linear_backward`` and ``npu_silu_backward``.
Each is the vector-Jacobian product of the emulator's forward kernel, by autograd
through it, so an explicit backward call and ``torch.autograd.grad`` through the
forward op agree exactly. Saved forward results the real ops take as inputs
(``softmax_max``/``softmax_sum``/``attention_in``, ``offset_out``, ``x1`` of silu)
are not read: the forward is recomputed, which gives the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import kernel
from . import recording
from .activations import silu
from .attention import fusion_attention
from .deform_conv import deformable_conv2d
from .detection import roi_align
from .rotary import rotary_mul


def _leaves(*tensors: Any) -> list[Any]:
    return [t.detach().requires_grad_(True) if t is not None else None for t in tensors]


def _vjp(outputs: Any, grads: Any, inputs: Sequence[Any]) -> list[Any]:
    """Gradients of ``outputs`` for ``inputs`` (zeros where unused), in the inputs' dtypes."""
    if not isinstance(outputs, (tuple, list)):
        outputs, grads = [outputs], [grads]
    pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None]
    found = torch.autograd.grad(
        [o for o, _ in pairs],
        list(inputs),
        [g.to(o.dtype).reshape(o.shape) for o, g in pairs],
        allow_unused=True,
    )
    return [
        torch.zeros_like(x) if g is None else g.to(x.dtype)
        for x, g in zip(inputs, found, strict=True)
    ]


@kernel("npu_rotary_mul_backward")
def rotary_mul_backward(
    grad: Any, self: Any, r1: Any, r2: Any, rotary_mode: str = "half"
) -> tuple[Any, Any, Any]:
    """Returns ``(dx, dr1, dr2)``; ``dr1``/``dr2`` are summed to ``r1``/``r2``'s shapes."""
    with recording():
        x, c, s = _leaves(self, r1, r2)
        dx, dc, ds = _vjp(rotary_mul(x, c, s, rotary_mode), grad, (x, c, s))
    return dx, dc, ds


@kernel("npu_roi_alignbk")
def roi_alignbk(
    self: Any,
    rois: Any,
    xdiff_shape: Sequence[int],
    pooled_width: int,
    pooled_height: int,
    spatial_scale: float,
    sample_num: int,
    roi_end_mode: int | None = None,
) -> Any:
    """The gradient for the features, ``xdiff_shape`` (NCHW), of ``npu_roi_align``.

    ``self`` is the output's gradient, ``[K, C, pooled_h, pooled_w]``; its own trailing
    dims decide the bins (torch_npu's contrib module passes ``output_size`` (h, w) into
    ``pooled_width, pooled_height``, so the names cannot be trusted, only the pair).
    ``roi_end_mode`` None means 1, op-plugin's default, which is not emulated.
    """
    shape = [int(v) for v in xdiff_shape]
    if len(shape) != 4:
        raise RuntimeError(f"npu_roi_alignbk: xdiff_shape must be NCHW, got {shape}")
    if self.numel() == 0:
        return torch.zeros(shape, dtype=self.dtype)
    if self.dim() != 4 or sorted(self.shape[2:]) != sorted((pooled_height, pooled_width)):
        raise RuntimeError(
            f"npu_roi_alignbk: the gradient {tuple(self.shape)} must be [K, C, "
            f"{pooled_height}, {pooled_width}]"
        )
    mode = 1 if roi_end_mode is None else roi_end_mode
    height, width = int(self.shape[2]), int(self.shape[3])
    with recording():
        features = torch.zeros(shape, dtype=self.dtype, requires_grad=True)
        out = roi_align(features, rois, spatial_scale, height, width, sample_num, mode)
        (found,) = _vjp(out, self, (features,))
    return found


@kernel("npu_deformable_conv2dbk")
def deformable_conv2dbk(
    input: Any,
    grad_output: Any,
    offset_out: Any,
    weight: Any,
    offset: Any,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int] = (1, 1, 1, 1),
    groups: int = 1,
    deformable_groups: int = 1,
    modulated: bool = True,
) -> tuple[Any, Any, Any, Any]:
    """Returns ``(grad_input, grad_weight, grad_offset, grad_bias)`` of ``npu_deformable_conv2d``."""
    with recording():
        x, w, o = _leaves(input, weight, offset)
        bias = torch.zeros(weight.shape[0], dtype=w.dtype, requires_grad=True)
        out, _ = deformable_conv2d(
            x,
            w,
            o,
            bias,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            deformable_groups,
            modulated,
        )
        dx, dw, do, db = _vjp(out, grad_output, (x, w, o, bias))
    return dx, dw, do, db


_ABSENT: Any = object()


@kernel("npu_fusion_attention_grad")
def fusion_attention_grad(
    query: Any,
    key: Any,
    value: Any,
    dy: Any,
    head_num: int,
    input_layout: str,
    pse: Any = None,
    padding_mask: Any = None,
    atten_mask: Any = None,
    softmax_max: Any = None,
    softmax_sum: Any = None,
    softmax_in: Any = None,
    attention_in: Any = None,
    scale_value: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    seed: int = 0,
    offset: int = 0,
    numels: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: Any = _ABSENT,
) -> tuple[Any, ...]:
    """Returns ``(dq, dk, dv, dpse)`` and, where the schema has ``sink`` (2.6 on), ``dsink``.

    ``dpse`` (``dsink``) is an empty tensor when no ``pse`` (``sink``) was given. With
    ``keep_prob < 1`` the dropout mask is the forward's: ``seed`` is the value the
    forward returned fifth.
    """
    has_sink_output = sink is not _ABSENT
    sink_in = None if sink is _ABSENT else sink
    with recording():
        q, k, v, p, s = _leaves(query, key, value, pse, sink_in)
        outputs = fusion_attention(
            q,
            k,
            v,
            head_num,
            input_layout,
            pse=p,
            padding_mask=padding_mask,
            atten_mask=atten_mask,
            scale=scale_value,
            keep_prob=keep_prob,
            pre_tockens=pre_tockens,
            next_tockens=next_tockens,
            inner_precise=inner_precise,
            prefix=prefix,
            actual_seq_qlen=actual_seq_qlen,
            actual_seq_kvlen=actual_seq_kvlen,
            sparse_mode=sparse_mode,
            softmax_layout=softmax_layout,
            sink=s,
            _dropout_seed=seed if keep_prob < 1.0 else None,
        )
        wanted = [t for t in (q, k, v, p, s) if t is not None]
        found = iter(_vjp(outputs[0], dy, wanted))
    dq, dk, dv = next(found), next(found), next(found)
    dpse = next(found) if p is not None else torch.empty(0, dtype=query.dtype)
    if not has_sink_output:
        return dq, dk, dv, dpse
    dsink = next(found) if s is not None else torch.empty(0, dtype=torch.float32)
    return dq, dk, dv, dpse, dsink


@kernel("npu_linear_backward")
def linear_backward(grad: Any, input: Any, weight: Any) -> tuple[Any, Any]:
    """``(grad @ weight, grad.T @ input)`` for ``npu_linear``'s ``input`` and ``weight``."""
    wide = torch.float64 if input.dtype == torch.float64 else torch.float32
    g = grad.to(wide)
    return (g @ weight.to(wide)).to(input.dtype), (g.T @ input.to(wide)).to(weight.dtype)


@kernel("npu_silu_backward")
def silu_backward(grad_output: Any, x0: Any, x1: Any) -> Any:
    """``x0`` is silu's input, ``x1`` its result (not read: recomputed from ``x0``)."""
    with recording():
        (x,) = _leaves(x0)
        (found,) = _vjp(silu(x), grad_output, (x,))
    return found
