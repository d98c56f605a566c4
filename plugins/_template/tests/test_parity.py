"""Parity: the patched ``torch.nn.functional.rms_norm`` computes what the original did.

Under the NPU emulator (the ``npu_emulator`` fixture of the ascend-patch-emulator
pytest plugin), ``torch_npu.npu_rms_norm`` has its real schema and a CPU reference
kernel, so this runs anywhere; on an Ascend machine the same test runs the real
kernel. Results obtained under the emulator are emulated: they show that the code
path is taken and that the numbers agree, not how fast it is.
"""

from __future__ import annotations

import pytest
import torch
from ascend_patch_template.groups import FusedRMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rms_norm_matches_the_original(npu_emulator, isolated_patcher, assert_parity, dtype):
    original = torch.nn.functional.rms_norm
    isolated_patcher.add(FusedRMSNorm).apply()
    patched = torch.nn.functional.rms_norm
    assert patched is not original

    x = torch.randn(4, 3, 64, dtype=dtype, device="npu")
    weight = torch.rand(64, dtype=dtype, device="npu")
    # Values, and gradients of x and weight (the same cotangents through both).
    assert_parity(original, patched, x, [64], weight)
    # The NPU kernel served the patched call; none fell back to the original.
    counters = isolated_patcher.report.get("torch.nn.functional.rms_norm").counters
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)
    # Outside its domain (here: no weight) the original runs.
    patched(x, [64])
    assert counters.fallback_calls == 1
