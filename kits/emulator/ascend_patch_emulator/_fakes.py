"""Shape-only (fake/meta) kernels for every emulated op, with torch_npu's shape rules.

``FakeTensorMode``, ``make_fx(tracing_mode="fake")``, ``torch.compile`` and
``torch.export`` call these instead of the reference kernels: they read only shapes,
dtypes and Python values, never tensor data, and return new empty tensors. The rules
follow torch_npu's own meta registrations (``torch_npu/meta/_meta_registrations.py``):
``npu_rotary_mul`` is ``empty_like(self)`` (so a last dim of 125 is accepted, as
upstream's fake tests do, although the reference kernel needs an even one in
``half`` mode), ``npu_fusion_attention`` returns empty tensors shaped as its
outputs and 0 for ``seed``/``offset``/``numels``, and ``npu_grouped_matmul`` sizes
its outputs from ``split_item``/``group_type`` (including ``group_type=2``, split K).

A rule is a function of the op's arguments by schema name (``args["input"]`` is the
registered name of torch_npu's ``self``; the yaml's ``self`` is also accepted, so a
rule does not depend on which one the data uses). Output sizes that depend on data
(``npu_nms_v4`` without padding, row splits given as a tensor) are unbacked symbolic
sizes from ``torch.library.get_ctx().new_dynamic_size()``.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import torch


__all__ = ["RULES"]

Rule = Callable[[Mapping[str, Any]], Any]
RULES: dict[str, Rule] = {}


def _rule(*ops: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn

    return register


def _self(args: Mapping[str, Any]) -> Any:
    return args["input"] if "input" in args else args["self"]


def _like(t: Any, dtype: Any = None) -> Any:
    return torch.empty_like(t, dtype=dtype or t.dtype, memory_format=torch.contiguous_format)


def _empty(t: Any, shape: Sequence[Any], dtype: Any = None) -> Any:
    return t.new_empty(tuple(shape), dtype=dtype or t.dtype)


def _dynamic() -> Any:
    return torch.library.get_ctx().new_dynamic_size()


# --- elementwise ------------------------------------------------------------------------


@_rule(
    "fast_gelu",
    "npu_fast_gelu",
    "npu_gelu",
    "npu_silu",
    "npu_mish",
    "npu_rotary_mul",
    "npu_scatter_nd_update",
    "npu_format_cast",
    "npu_format_cast.Tensor",
)
def _same_as_input(args: Mapping[str, Any]) -> Any:
    return _like(_self(args))


@_rule("npu_silu_", "npu_scatter_nd_update_", "npu_format_cast_", "npu_format_cast_.acl_format")
def _in_place(args: Mapping[str, Any]) -> Any:
    return _self(args)


@_rule("get_npu_format")
def _format(args: Mapping[str, Any]) -> Any:
    from ._kernels.layout import get_npu_format

    return get_npu_format(_self(args))


@_rule("npu_silu_backward")
def _silu_backward(args: Mapping[str, Any]) -> Any:
    return _like(args["grad_output"])


def _halved(x: Any, dim: int) -> list[Any]:
    shape = list(x.shape)
    torch._check(x.dim() > 0, lambda: "the input must have at least one dim")
    shape[dim] = shape[dim] // 2
    return shape


@_rule("npu_swiglu")
def _swiglu(args: Mapping[str, Any]) -> Any:
    x = _self(args)
    return _empty(x, _halved(x, args.get("dim", -1)))


@_rule("npu_geglu")
def _geglu(args: Mapping[str, Any]) -> Any:
    x = _self(args)
    shape = _halved(x, args.get("dim", -1))
    return _empty(x, shape), _empty(x, shape)


@_rule("npu_rotary_mul_backward")
def _rotary_backward(args: Mapping[str, Any]) -> Any:
    return _like(_self(args)), _like(args["r1"]), _like(args["r2"])


# --- norms ------------------------------------------------------------------------------


def _rstd(x: Any, gamma: Any) -> Any:
    kept = x.dim() - gamma.dim()
    return _empty(x, [*x.shape[:kept], *([1] * gamma.dim())], torch.float32)


@_rule("npu_rms_norm")
def _rms_norm(args: Mapping[str, Any]) -> Any:
    x = _self(args)
    return _like(x), _rstd(x, args["gamma"])


@_rule("npu_add_rms_norm")
def _add_rms_norm(args: Mapping[str, Any]) -> Any:
    x1 = args["x1"]
    return _like(x1), _rstd(x1, args["gamma"]), _like(x1)


# --- matrix products --------------------------------------------------------------------


@_rule("npu_bmmV2")
def _bmm(args: Mapping[str, Any]) -> Any:
    a, b = _self(args), args["mat2"]
    batch = torch.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    return _empty(a, [*batch, a.shape[-2], b.shape[-1]])


@_rule("npu_linear")
def _linear(args: Mapping[str, Any]) -> Any:
    x, w = _self(args), args["weight"]
    return _empty(x, [*x.shape[:-1], w.shape[0]])


@_rule("npu_linear_backward")
def _linear_backward(args: Mapping[str, Any]) -> Any:
    return _like(_self(args)), _like(args["weight"])


def _group_sizes(group_list: Any, group_list_type: int | None) -> list[Any]:
    """Per-group row counts: exact for an int list, unbacked sizes for a tensor."""
    if isinstance(group_list, torch.Tensor):
        return [_dynamic() for _ in range(group_list.shape[0])]
    values = [int(v) for v in group_list]
    if group_list_type == 1:
        return values
    return [end - start for start, end in zip([0, *values[:-1]], values, strict=True)]


@_rule("npu_grouped_matmul", "npu_grouped_matmul.List")
def _grouped_matmul(args: Mapping[str, Any]) -> Any:
    group_type = args.get("group_type")
    group_type = -1 if group_type is None else group_type
    torch._check(
        group_type in (-1, 0, 2),
        lambda: f"group_type only supports -1, 0 and 2, but got {group_type}",
    )
    x, weight = list(args["x"]), list(args["weight"])
    split_item = args.get("split_item") or 0
    dtype = args.get("output_dtype") or x[0].dtype
    single = len(weight) == 1 and weight[0].dim() == 3

    def columns(i: int) -> Any:
        return weight[0].shape[2] if single else weight[min(i, len(weight) - 1)].shape[-1]

    if group_type == 2:
        group_list: Any = args.get("group_list")
        torch._check(group_list is not None, lambda: "group_type 2 needs group_list")
        groups = group_list.shape[0] if isinstance(group_list, torch.Tensor) else len(group_list)
        return [_empty(x[0], [groups, x[0].shape[0], columns(0)], dtype)]
    # Several x with no group_list are one group each, as under group_type -1 (op-plugin's meta
    # sums their rows for split_item 2/3); one x with a group_list is split on M by it under
    # group_type -1 too (op-plugin's meta reads group_list whatever group_type).
    if group_type == -1 and len(x) == 1 and args.get("group_list") is not None:
        group_type = 0
    if group_type == 0 and not (len(x) > 1 and args.get("group_list") is None):
        rows = _group_sizes(args.get("group_list"), args.get("group_list_type"))
        if split_item in (2, 3):
            return [_empty(x[0], [x[0].shape[0], columns(0)], dtype)]
        return [_empty(x[0], [r, columns(i)], dtype) for i, r in enumerate(rows)]
    if split_item in (2, 3):
        total = sum(xi.shape[0] for xi in x)
        return [_empty(x[0], [total, columns(0)], dtype)]
    return [_empty(xi, [*xi.shape[:-1], columns(i)], dtype) for i, xi in enumerate(x)]


@_rule("npu_confusion_transpose")
def _confusion_transpose(args: Mapping[str, Any]) -> Any:
    x, perm, shape = _self(args), list(args["perm"]), list(args["shape"])
    if args["transpose_first"]:
        return _empty(x, shape)
    return _empty(x, [shape[p] for p in perm])


# --- attention --------------------------------------------------------------------------


def _attention_sizes(q: Any, k: Any, v: Any, heads: int, layout: str) -> tuple[Any, Any, list[Any]]:
    """(batch, query length, output shape) for a non-TND layout."""
    if layout in ("BSH", "SBH"):
        batch, length = (q.shape[0], q.shape[1]) if layout == "BSH" else (q.shape[1], q.shape[0])
        dim = q.shape[-1] // heads
        kv_heads = k.shape[-1] // dim
        return batch, length, [*q.shape[:-1], heads * (v.shape[-1] // kv_heads)]
    if layout == "BSND":
        return q.shape[0], q.shape[1], [*q.shape[:-1], v.shape[-1]]
    return q.shape[0], q.shape[2], [*q.shape[:-1], v.shape[-1]]


@_rule("npu_fusion_attention")
def _fusion_attention(args: Mapping[str, Any]) -> Any:
    q, k, v = args["query"], args["key"], args["value"]
    heads, layout = args["head_num"], args["input_layout"]
    if layout == "TND":
        out = [*q.shape[:-1], v.shape[-1]]
        stats = (
            [q.shape[0], heads, 8]
            if args.get("softmax_layout") == "TND"
            else [heads, q.shape[0], 8]
        )
    else:
        batch, length, out = _attention_sizes(q, k, v, heads, layout)
        stats = [batch, heads, length, 8]
    return (
        _empty(q, out),
        _empty(q, stats, torch.float32),
        _empty(q, stats, torch.float32),
        _empty(q, [0]),
        0,
        0,
        0,
    )


@_rule("npu_fusion_attention_grad")
def _fusion_attention_grad(args: Mapping[str, Any]) -> Any:
    q, k, v = args["query"], args["key"], args["value"]
    pse = args.get("pse")
    grads = (_like(q), _like(k), _like(v), _like(pse) if pse is not None else _empty(q, [0]))
    if "sink" not in args:
        return grads
    sink = args.get("sink")
    return (*grads, _like(sink) if sink is not None else _empty(q, [0], torch.float32))


# --- detection and vision ---------------------------------------------------------------


@_rule("npu_iou", "npu_ptiou")
def _iou(args: Mapping[str, Any]) -> Any:
    boxes, gt = args["bboxes"], args["gtboxes"]
    return _empty(boxes, [gt.shape[0], boxes.shape[0]])


@_rule("npu_giou")
def _giou(args: Mapping[str, Any]) -> Any:
    boxes = _self(args)
    dtype = torch.float16 if torch.float16 in (boxes.dtype, args["gtboxes"].dtype) else None
    return _empty(boxes, [boxes.shape[1], 1], dtype)


@_rule("npu_ciou")
def _ciou(args: Mapping[str, Any]) -> Any:
    boxes, gt = _self(args), args["gtboxes"]
    dtype = torch.float16 if torch.float16 in (boxes.dtype, gt.dtype) else None
    rows = gt.shape[1] if args.get("is_cross", True) else 1
    return _empty(boxes, [rows, boxes.shape[1]], dtype)


@_rule("npu_giou_backward", "npu_ciou_backward")
def _box_backward(args: Mapping[str, Any]) -> Any:
    return _like(args["bboxes"]), _like(args["gtboxes"])


@_rule("npu_nms_v4")
def _nms_v4(args: Mapping[str, Any]) -> Any:
    boxes, limit = _self(args), args["max_output_size"]
    if args.get("pad_to_max_output_size") and not isinstance(limit, torch.Tensor):
        count: Any = int(limit)
    else:
        count = _dynamic()
    return _empty(boxes, [count], torch.int32), _empty(boxes, [], torch.int32)


@_rule("npu_roi_align")
def _roi_align(args: Mapping[str, Any]) -> Any:
    x, rois = _self(args), args["rois"]
    return _empty(x, [rois.shape[0], x.shape[1], args["pooled_height"], args["pooled_width"]])


@_rule("npu_roi_alignbk")
def _roi_alignbk(args: Mapping[str, Any]) -> Any:
    return _empty(_self(args), list(args["xdiff_shape"]))


def _deform_sizes(args: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    x, w = args["input"], args["weight"]
    kh, kw = w.shape[2], w.shape[3]
    _, _, sh, sw = list(args["stride"])
    top, bottom, left, right = list(args["padding"])
    _, _, dh, dw = list(args.get("dilation") or (1, 1, 1, 1))
    out_h = (x.shape[2] + top + bottom - ((kh - 1) * dh + 1)) // sh + 1
    out_w = (x.shape[3] + left + right - ((kw - 1) * dw + 1)) // sw + 1
    return kh, kw, out_h, out_w


@_rule("npu_deformable_conv2d")
def _deformable_conv2d(args: Mapping[str, Any]) -> Any:
    x, w = args["input"], args["weight"]
    kh, kw, out_h, out_w = _deform_sizes(args)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (
        _empty(x, [x.shape[0], w.shape[0], out_h, out_w], dtype),
        _empty(x, [x.shape[0], x.shape[1], out_h * kh, out_w * kw], dtype),
    )


@_rule("npu_deformable_conv2dbk")
def _deformable_conv2dbk(args: Mapping[str, Any]) -> Any:
    x, w, offset = args["input"], args["weight"], args["offset"]
    return _like(x), _like(w), _like(offset), _empty(w, [w.shape[0]])


@_rule("npu_moe_gating_top_k_softmax")
def _moe_gating(args: Mapping[str, Any]) -> Any:
    x, k = args["x"], args.get("k", 1)
    shape = [*x.shape[:-1], k]
    return _empty(x, shape), _empty(x, shape, torch.int32), _empty(x, shape, torch.int32)
