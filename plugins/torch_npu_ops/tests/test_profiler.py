"""The profiler activity mapping: CUDA -> the NPU (torch_npu.profiler), or the CPU under the emulator."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch.profiler import ProfilerActivity


def test_emulated_npu_is_profiled_by_the_cpu_activity(redirect, calls):
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        (torch.ones(4, device="cuda") * 2).sum()
    assert prof.activities == {ProfilerActivity.CPU}
    assert any(event.name == "aten::mul" for event in prof.events())
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.ones(2, device="cuda").sum()
    assert prof.activities == {ProfilerActivity.CPU}
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]):
        pass
    assert calls("torch.profiler.profile: CUDA activity on the emulated NPU") == (2, 1)


@pytest.fixture
def fake_npu_profiler(npu_emulator, monkeypatch):
    """A torch_npu.profiler with the real one's names, recording what its profile receives."""
    module = types.ModuleType("torch_npu.profiler")

    class Activity:
        CPU, NPU = "npu-profiler CPU", "npu-profiler NPU"

    class ExperimentalConfig:
        pass

    class Profile:
        def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, **kwargs):
            self.activities, self.kwargs = activities, kwargs

    module.ProfilerActivity = Activity
    module._ExperimentalConfig = ExperimentalConfig
    module.profile = Profile
    module.schedule = lambda *args, **kwargs: ("npu schedule", args, kwargs)
    module.tensorboard_trace_handler = lambda *args, **kwargs: ("npu handler", args)
    module.ProfilerAction = types.SimpleNamespace(RECORD="npu RECORD")
    monkeypatch.setitem(sys.modules, "torch_npu.profiler", module)
    monkeypatch.delitem(sys.modules, "ascend_patch_torch._npu_profiler", raising=False)
    return module


def test_a_real_torch_npu_profiler_takes_torch_s_names(fake_npu_profiler, isolated_patcher):
    from ascend_patch_torch.groups import Profiler

    isolated_patcher.add(Profiler).apply()
    prof = torch.profiler.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA, ProfilerActivity.PrivateUse1],
        record_shapes=True,
    )
    assert isinstance(prof, fake_npu_profiler.profile)
    assert prof.activities == ["npu-profiler CPU", "npu-profiler NPU"]
    assert prof.kwargs == {"record_shapes": True}
    assert torch.profiler.schedule(wait=1, active=2)[0] == "npu schedule"
    assert torch.profiler.tensorboard_trace_handler("./log")[0] == "npu handler"
    assert torch.profiler.ProfilerAction.RECORD == "npu RECORD"
    with pytest.warns(UserWarning, match="experimental_config"):
        prof = torch.profiler.profile(experimental_config=torch._C._profiler._ExperimentalConfig())
    assert "experimental_config" not in prof.kwargs
    isolated_patcher.revert()
    assert torch.profiler.profile.__module__ == "torch.profiler.profiler"
