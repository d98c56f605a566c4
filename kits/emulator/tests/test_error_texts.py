"""Argument errors in torch_npu's own words, where callers and torch_npu's tests match them.

Texts from op-plugin's ``TORCH_CHECK``s (``RotaryMulKernelNpuOpApi.cpp``) and torch_npu's
``FormatHelper.cpp``; op-plugin's ``test_npu_rotary_mul.py`` matches the first.
"""

from __future__ import annotations

import pytest
import torch


def test_rotary_mul_refuses_an_unknown_mode_first(emulated):
    import torch_npu

    x = torch.rand(2, 2, 5, 128)
    r = torch.rand(1, 2, 1, 128)
    expected = "The rotary_mode of npu_rotary_mul should be half or interleave, but got quarter"
    with pytest.raises(RuntimeError, match=expected):
        torch_npu.npu_rotary_mul(x, r, r, "quarter")
    # checked before anything else: also when a rotate matrix is given (versions with one)
    if "rotate" not in str(torch.ops.npu.npu_rotary_mul.default._schema):
        return
    with pytest.raises(RuntimeError, match=expected):
        torch_npu.npu_rotary_mul(x, r, r, "quarter", rotate=torch.eye(128))


def test_format_cast_refuses_ids_outside_torch_npus_format_table(emulated):
    import torch_npu

    for unknown in (-1, 12, 16, 35, 47, 5):
        with pytest.raises(RuntimeError, match=f"unknown format type:{unknown}"):
            torch_npu.npu_format_cast(torch.rand(2, 3), unknown)


def test_grouped_matmul_argument_checks_in_op_plugins_words(emulated):
    import torch_npu

    xs = [torch.rand(2, 3), torch.rand(4, 3)]
    ws = [torch.rand(3, 5), torch.rand(3, 6)]
    # op-plugin's test_npu_grouped_matmul_group_list_none: the Tensor group_list overload
    # wants group_type given (no default since op-plugin 7.1)
    with pytest.raises(
        RuntimeError, match=r"Requires manual passing group_type, current is None\."
    ):
        torch_npu.npu_grouped_matmul(xs, ws, group_list=None, split_item=0)
    with pytest.raises(RuntimeError, match="Requires manual passing group_type"):
        torch_npu.npu_grouped_matmul([torch.rand(6, 3)], ws, group_list=torch.tensor([2, 6]))
    # the int-list overload has no such check
    (out,) = torch.ops.npu.npu_grouped_matmul.List([xs[0]], [ws[0]])
    assert out.shape == (2, 5)
    # test_npu_grouped_matmul_invalid_group_type (eager) and the meta check's words
    for invalid in (1, 3, 100):
        with pytest.raises(RuntimeError, match="The group type must be") as raised:
            torch_npu.npu_grouped_matmul(xs, ws, group_type=invalid)
        assert f"but now is [{invalid}]" in str(raised.value)
        assert f"group_type only supports -1, 0 and 2, but got {invalid}" in str(raised.value)
    with pytest.raises(RuntimeError, match="neither x nor weight could be empty"):
        torch_npu.npu_grouped_matmul([], [], group_type=-1)
    with pytest.raises(RuntimeError, match=r"Invalid value of split_item \[4\]"):
        torch_npu.npu_grouped_matmul(xs, ws, group_type=-1, split_item=4)
    outputs = torch_npu.npu_grouped_matmul(xs, ws, group_type=-1)
    assert [tuple(o.shape) for o in outputs] == [(2, 5), (4, 6)]
