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
    # checked before anything else: also when a rotate matrix is given
    with pytest.raises(RuntimeError, match=expected):
        torch_npu.npu_rotary_mul(x, r, r, "quarter", rotate=torch.eye(128))


def test_format_cast_refuses_ids_outside_torch_npus_format_table(emulated):
    import torch_npu

    for unknown in (-1, 12, 16, 35, 47, 5):
        with pytest.raises(RuntimeError, match=f"unknown format type:{unknown}"):
            torch_npu.npu_format_cast(torch.rand(2, 3), unknown)
