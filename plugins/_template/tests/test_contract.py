"""The contract: each torch_npu op the package calls exists, and each call binds, in every
torch_npu version with schema data (no NPU needed: the schemas are committed data)."""

from __future__ import annotations

from pathlib import Path

from ascend_patch_emulator import check_plugin
from ascend_patch_emulator import format_mismatches


def test_torch_npu_calls_bind_in_every_supported_version():
    # Installed, check_plugins(["<entry-point name>"]) does the same and also reads the
    # torch-npu versions the distribution declares (its `torch-npu` extra).
    result = check_plugin(Path(__file__).resolve().parents[1] / "ascend_patch_template")
    assert {call.op for call in result.calls} == {"npu_rms_norm"}
    assert not result.mismatches, format_mismatches(result.mismatches)
