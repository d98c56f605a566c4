"""Matrix products: ``npu_bmmV2``, ``npu_linear`` and ``npu_grouped_matmul`` (non-quantized).

``npu_linear(input, weight, bias)`` is ``input @ weight.T + bias`` (``F.linear``).

``npu_bmmV2(a, b, output_sizes)`` is ``a @ b``; ``output_sizes`` is required by the
schema but does not change the result.

``npu_grouped_matmul`` computes ``y_i = act(x_i @ w_i + bias_i)`` per group:

* ``group_type`` None or -1: ``x``, ``weight`` (and ``bias``) are lists of equal length;
  one ``x`` with a ``group_list`` is split on M as under ``group_type`` 0 (op-plugin sizes
  those outputs from ``group_list`` whatever ``group_type``);
* ``group_type`` 0 (split M): ``x`` is one ``[M, K]`` tensor whose rows are split by
  ``group_list`` (cumulative ends with ``group_list_type`` 0, counts with 1);
  ``weight`` is a list of ``[K, N]`` or one ``[E, K, N]`` tensor;
* ``split_item`` 0/1 returns one tensor per group, 2/3 one tensor of all rows;
* ``act_type`` 0 none, 1 relu, 2 gelu (tanh), 4 fast_gelu, 5 silu.

* ``group_type`` 2 (split K, the weight-gradient form): ``x`` one ``[M, K]`` tensor,
  ``weight`` one ``[K, N]`` tensor, K split by ``group_list``; one ``[E, M, N]`` result.

Quantization arguments (``scale``, ``offset``, ``antiquant_*``, ``per_token_scale``,
``activation_*``) are not emulated and raise.
Forward only, like the real op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from . import compute_dtype
from . import kernel


@kernel("npu_bmmV2", differentiable=True)
def bmm_v2(self: Any, mat2: Any, output_sizes: Sequence[int]) -> Any:
    wide = compute_dtype(self)
    return torch.matmul(self.to(wide), mat2.to(wide)).to(self.dtype)


@kernel("npu_linear", differentiable=True)
def linear(input: Any, weight: Any, bias: Any = None) -> Any:
    wide = compute_dtype(input)
    b = bias.to(wide) if bias is not None else None
    return F.linear(input.to(wide), weight.to(wide), b).to(input.dtype)


def _fail(message: str) -> RuntimeError:
    return RuntimeError(f"npu_grouped_matmul: {message}")


def _activation(y: Any, act_type: int | None) -> Any:
    if not act_type:
        return y
    if act_type == 1:
        return F.relu(y)
    if act_type == 2:
        return F.gelu(y, approximate="tanh")
    if act_type == 4:
        return y * torch.sigmoid(1.702 * y)
    if act_type == 5:
        return F.silu(y)
    raise _fail(f"act_type {act_type} is not emulated (0, 1, 2, 4, 5 are)")


def _per_group(tensors: Sequence[Any] | None, count: int, name: str, dims: int) -> list[Any]:
    """One tensor per group: a list of ``dims``-D tensors, or one stacked ``dims + 1``-D tensor."""
    if tensors is None:
        return [None] * count
    if len(tensors) == 1 and tensors[0].dim() == dims + 1:
        tensors = list(tensors[0].unbind(0))
    if len(tensors) != count:
        raise _fail(f"{name} has {len(tensors)} tensors for {count} groups")
    return list(tensors)


def _row_spans(group_list: Any, group_list_type: int | None, rows: int) -> list[tuple[int, int]]:
    if group_list is None:
        raise _fail("group_type 0 needs group_list")
    values = group_list.tolist() if isinstance(group_list, torch.Tensor) else list(group_list)
    if group_list_type == 1:
        ends, total = [], 0
        for count in values:
            total += int(count)
            ends.append(total)
    elif not group_list_type:
        ends = [int(v) for v in values]
    else:
        raise _fail(f"group_list_type {group_list_type} is not emulated (0 and 1 are)")
    spans, start = [], 0
    for end in ends:
        if end < start or end > rows:
            raise _fail(f"group_list {values} does not split {rows} rows")
        spans.append((start, end))
        start = end
    return spans


def _split_k(
    x: Sequence[Any],
    weight: Sequence[Any],
    bias: Sequence[Any] | None,
    group_list: Any,
    group_list_type: int | None,
    act_type: int | None,
) -> Any:
    """group_type 2: ``x [M, K]`` and ``weight [K, N]`` split along K -> ``[E, M, N]``.

    The weight-gradient form (``x = inp.T``, ``weight = grad_out``): group ``e`` is
    ``x[:, k_e] @ weight[k_e, :]`` for the K span ``k_e`` that ``group_list`` gives.
    """
    if len(x) != 1 or len(weight) != 1 or x[0].dim() != 2 or weight[0].dim() != 2:
        raise _fail("group_type 2 takes x as one [M, K] and weight as one [K, N] tensor")
    if bias is not None:
        raise _fail("group_type 2 takes no bias")
    wide = compute_dtype(x[0])
    a, b = x[0].to(wide), weight[0].to(wide)
    spans = _row_spans(group_list, group_list_type, a.shape[1])
    pieces = [_activation(a[:, s:e] @ b[s:e], act_type) for s, e in spans]
    return torch.stack(pieces).to(x[0].dtype)


def _grouped_matmul(
    x: Sequence[Any],
    weight: Sequence[Any],
    bias: Sequence[Any] | None,
    quantized: dict[str, Any],
    group_list: Any,
    split_item: int | None,
    group_type: int | None,
    group_list_type: int | None,
    act_type: int | None,
) -> list[Any]:
    used = sorted(name for name, value in quantized.items() if value is not None)
    if used:
        raise _fail(f"quantized grouped matmul is not emulated (got {', '.join(used)})")
    if not x or not weight:
        raise _fail("Invalid inputs: neither x nor weight could be empty.")
    if split_item not in (None, 0, 1, 2, 3):
        raise _fail(
            f"Invalid value of split_item [{split_item}], which should only be one of 0/1/2/3."
        )
    dtype = x[0].dtype
    wide = compute_dtype(x[0])
    # Several x with no group_list are already split on M, one group each, under group_type 0
    # too (op-plugin's test_npu_grouped_matmul_2: three x, split_item 2, group_type 0). One x
    # with a group_list is split on M by it under group_type -1/None too: op-plugin sizes
    # those outputs from group_list whatever group_type (its eager op and meta kernel).
    one_x_split_by_list = len(x) == 1 and group_list is not None
    if group_type in (None, -1) and one_x_split_by_list:
        group_type = 0
    if (
        group_type is None
        or group_type == -1
        or (group_type == 0 and len(x) > 1 and group_list is None)
    ):
        weights = _per_group(weight, len(x), "weight", 2)
        biases = _per_group(bias, len(x), "bias", 1)
        pieces = [xi.to(wide) @ wi.to(wide) for xi, wi in zip(x, weights, strict=True)]
    elif group_type == 0:
        if len(x) != 1:
            raise _fail("group_type 0 takes x as one [M, K] tensor")
        spans = _row_spans(group_list, group_list_type, x[0].shape[0])
        weights = _per_group(weight, len(spans), "weight", 2)
        biases = _per_group(bias, len(spans), "bias", 1)
        rows = x[0].to(wide)
        pieces = [rows[s:e] @ w.to(wide) for (s, e), w in zip(spans, weights, strict=True)]
    elif group_type == 2:
        return [_split_k(x, weight, bias, group_list, group_list_type, act_type)]
    else:
        # op-plugin's eager check, then its meta check's words (torch.compile, fake tensors).
        raise _fail(
            f"Use Tensor input with current cann version, The group type must be -1, 0 or 2, "
            f"but now is [{group_type}] (group_type only supports -1, 0 and 2, but got {group_type})"
        )
    outputs = []
    for piece, b in zip(pieces, biases, strict=True):
        if b is not None:
            piece = piece + b.to(wide)
        outputs.append(_activation(piece, act_type).to(dtype))
    if split_item in (2, 3):
        return [torch.cat(outputs)]
    return outputs


@kernel("npu_grouped_matmul")
def grouped_matmul_tensor_group_list(**named: Any) -> list[Any]:
    """The overload with a ``Tensor? group_list``: op-plugin wants ``group_type`` given."""
    if named.get("group_type") is None:
        raise _fail("Requires manual passing group_type, current is None.")
    return grouped_matmul(**named)


@kernel("npu_grouped_matmul.List")
def grouped_matmul(
    x: Sequence[Any],
    weight: Sequence[Any],
    bias: Sequence[Any] | None = None,
    scale: Sequence[Any] | None = None,
    offset: Sequence[Any] | None = None,
    antiquant_scale: Sequence[Any] | None = None,
    antiquant_offset: Sequence[Any] | None = None,
    per_token_scale: Sequence[Any] | None = None,
    group_list: Any = None,
    activation_input: Sequence[Any] | None = None,
    activation_quant_scale: Sequence[Any] | None = None,
    activation_quant_offset: Sequence[Any] | None = None,
    split_item: int | None = 0,
    group_type: int | None = None,
    group_list_type: int | None = 0,
    act_type: int | None = 0,
    tuning_config: Sequence[int] | None = None,
    output_dtype: Any = None,
    x_dtype: int | None = None,
    weight_dtype: int | None = None,
    scale_dtype: int | None = None,
    per_token_scale_dtype: int | None = None,
) -> list[Any]:
    quantized = {
        "scale": scale,
        "offset": offset,
        "antiquant_scale": antiquant_scale,
        "antiquant_offset": antiquant_offset,
        "per_token_scale": per_token_scale,
        "activation_input": activation_input,
        "activation_quant_scale": activation_quant_scale,
        "activation_quant_offset": activation_quant_offset,
    }
    return _grouped_matmul(
        x, weight, bias, quantized, group_list, split_item, group_type, group_list_type, act_type
    )
