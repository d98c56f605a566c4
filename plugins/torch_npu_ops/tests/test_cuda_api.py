"""torch.cuda calls that name a device the CUDA way, nvtx markers, and the items transfer_to_npu had
that the plugin lacked (use_mem_pool, change_current_allocator, export_memory_timeline's device,
torch._cudnn_init_dropout_state), under the NPU emulator.
"""

from __future__ import annotations

import importlib
import json
import types

import ascend_patch_emulator
import pytest
import torch


CUDA_ZERO = ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0), 0, None]


@pytest.fixture
def two_npus(emulated_torch_npu_version):
    """The emulator with two devices (the default fixture has one), with the plugin applied."""
    from ascend_patch_torch import plugin

    from ascend_patch_core import Patcher

    was_active = ascend_patch_emulator.is_active()
    if was_active:  # pragma: no cover - only when a conftest keeps one active
        pytest.fail("the emulator is already active with its own device count")
    handle = ascend_patch_emulator.activate(emulated_torch_npu_version, device_count=2)
    patcher = Patcher(autoload=False, strict=True)
    try:
        for group in plugin.register_patches():
            if not group.opt_in:
                patcher.add(group)
        patcher.apply()
        yield patcher
    finally:
        patcher.revert()
        handle.deactivate()


# --------------------------------------------------------------------------- device, Stream


@pytest.mark.parametrize("spec", CUDA_ZERO)
def test_cuda_device_takes_cuda_devices(redirect, calls, spec):
    with torch.cuda.device(spec) as entered:
        assert torch.cuda.current_device() == 0
    assert entered is None or isinstance(entered, torch.npu.device)
    assert isinstance(torch.cuda.device(spec), torch.npu.device)
    assert isinstance(torch.npu.device(0), torch.cuda.device)


def test_cuda_device_selects_the_named_npu(two_npus):
    for spec in ("cuda:1", torch.device("cuda", 1), 1):
        with torch.cuda.device(spec):
            assert torch.cuda.current_device() == 1 == torch.npu.current_device()
            assert torch.ones(1, device="cuda").is_npu
        assert torch.cuda.current_device() == 0
    with pytest.raises(RuntimeError, match="ordinal 2"):
        torch.cuda.set_device("cuda:2")


@pytest.mark.parametrize("spec", CUDA_ZERO)
def test_cuda_stream_takes_cuda_devices(redirect, spec):
    stream = torch.cuda.Stream(spec) if spec is not None else torch.cuda.Stream()
    keyword = torch.cuda.Stream(device=spec, priority=0)
    for made in (stream, keyword):
        assert type(made) is torch.npu.Stream  # what torch.npu's own functions take
        assert isinstance(made, torch.cuda.Stream)
        assert made.device == torch.device("npu", 0)
    with torch.cuda.stream(stream):
        assert torch.cuda.current_stream() is stream
    assert isinstance(torch.npu.current_stream(), torch.cuda.Stream)
    assert issubclass(torch.npu.Stream, torch.cuda.Stream)
    assert torch.cuda.streams.Stream is torch.cuda.Stream


def test_cuda_stream_on_the_second_npu_and_subclasses(two_npus):
    assert torch.cuda.Stream(device="cuda:1").device == torch.device("npu", 1)
    assert torch.cuda.Stream(torch.device("cuda", 1)).device == torch.device("npu", 1)

    class Tagged(torch.cuda.Stream):
        tag = "mine"

    tagged = Tagged(device="cuda:1")
    assert isinstance(tagged, Tagged) and isinstance(tagged, torch.npu.Stream)
    assert tagged.device == torch.device("npu", 1) and tagged.tag == "mine"


def test_revert_gives_torch_cuda_its_classes_back(npu_emulator, isolated_patcher):
    from ascend_patch_torch.groups import CudaApi

    before = (torch.cuda.device, torch.cuda.Stream, torch.cuda.streams.Stream)
    isolated_patcher.add(CudaApi).apply()
    assert torch.cuda.device is not before[0]
    isolated_patcher.revert()
    assert (torch.cuda.device, torch.cuda.Stream, torch.cuda.streams.Stream) == before


# --------------------------------------------------------------------------- nvtx


def test_nvtx_fails_on_this_cpu_build_without_the_plugin(npu_emulator):
    with pytest.raises(RuntimeError, match="NVTX"):
        torch.cuda.nvtx.range_push("step")


def test_nvtx_goes_to_the_emulated_mstx(redirect, calls, monkeypatch):
    mstx = torch.npu.mstx  # the emulator keeps marks in memory
    ended = []
    end = mstx.range_end

    def range_end(range_id, *args, **kwargs):
        ended.append(range_id)
        return end(range_id, *args, **kwargs)

    monkeypatch.setattr(mstx, "range_end", range_end)
    with torch.cuda.nvtx.range("forward {}", 1):
        assert torch.cuda.nvtx.range_push("inner") == 1
        torch.cuda.nvtx.mark("loss")
        assert torch.cuda.nvtx.range_pop() == 1
    assert torch.cuda.nvtx.range_pop() == -1  # nothing open
    assert mstx.marks[-1] == "loss"
    handle = torch.cuda.nvtx.range_start("io")
    torch.cuda.nvtx.range_end(handle)
    assert ended == [handle] and isinstance(handle, int)
    assert calls("torch.cuda.nvtx.range_push") == (2, 0)


def test_nvtx_without_mstx_keeps_the_depth_and_runs(redirect, calls, monkeypatch):
    monkeypatch.delattr(torch.npu, "mstx", raising=False)  # a torch_npu older than mstx
    assert torch.cuda.nvtx.range_push("outer") == 0
    assert torch.cuda.nvtx.range_push("inner") == 1
    assert torch.cuda.nvtx.range_pop() == 1
    assert torch.cuda.nvtx.range_pop() == 0
    assert torch.cuda.nvtx.range_pop() == -1  # nothing open
    torch.cuda.nvtx.mark("here")
    handle = torch.cuda.nvtx.range_start("span")
    torch.cuda.nvtx.range_end(handle)
    with torch.cuda.nvtx.range("epoch {}", 3):
        assert torch.cuda.nvtx.range_push("nested") == 1
        torch.cuda.nvtx.range_pop()

    @torch.cuda.nvtx.range("decorated")
    def step():
        return torch.cuda.nvtx.range_push("x")

    assert step() == 1
    torch.cuda.nvtx.range_pop()
    assert torch.cuda.nvtx.range_pop() == -1
    assert calls("torch.cuda.nvtx.range_push") == (6, 0)  # range() pushes too
    assert calls("torch.cuda.nvtx.mark") == (1, 0)


class _Mstx:
    """torch_npu's ``mstx`` surface (Ascend/pytorch torch_npu/npu/mstx.py), recording calls."""

    def __init__(self, *, with_push: bool) -> None:
        self.log: list[tuple[str, object]] = []
        self._depth = 0
        self._next = 100
        if with_push:
            self.range_push = self._range_push
            self.range_pop = self._range_pop

    def mark(self, message, stream=None, domain="default"):
        self.log.append(("mark", message))

    def range_start(self, message, stream=None, domain="default"):
        self._next += 1
        self.log.append(("start", message))
        return self._next

    def range_end(self, range_id, domain="default"):
        self.log.append(("end", range_id))

    def _range_push(self, message, stream=None, domain="default"):
        self.log.append(("push", message))
        self._depth += 1
        return self._depth - 1

    def _range_pop(self, domain="default"):
        self.log.append(("pop", None))
        self._depth -= 1
        return self._depth


@pytest.mark.parametrize("with_push", [True, False], ids=["mstx-push-pop", "mstx-start-end"])
def test_nvtx_goes_to_the_mstx_functions_torch_npu_has(redirect, monkeypatch, with_push):
    mstx = _Mstx(with_push=with_push)
    monkeypatch.setattr(torch.npu, "mstx", mstx, raising=False)
    with torch.cuda.nvtx.range("forward"):
        torch.cuda.nvtx.mark("loss")
    handle = torch.cuda.nvtx.range_start("io")
    torch.cuda.nvtx.range_end(handle)
    if with_push:
        expected = [("push", "forward"), ("mark", "loss"), ("pop", None)]
    else:  # an older mstx: push/pop built from range_start/range_end
        expected = [("start", "forward"), ("mark", "loss"), ("end", 101)]
    assert mstx.log[:3] == expected
    assert mstx.log[3:] == [("start", "io"), ("end", handle)]


# --------------------------------------------------------------------------- allocator


def test_change_current_allocator_and_use_mem_pool_go_to_torch_npu(redirect, calls):
    before = torch.npu.memory._get_current_allocator()
    allocator = torch.npu.memory._NPUAllocator("mine")
    try:
        torch.cuda.change_current_allocator(allocator)
        assert torch.npu.memory._get_current_allocator() is allocator
        torch.cuda.memory.change_current_allocator(before)
        assert torch.npu.memory._get_current_allocator() is before
    finally:
        torch.npu.change_current_allocator(before)
    assert calls("torch.cuda.change_current_allocator") == (2, 0)
    pool = torch.cuda.MemPool()
    for device in ("cuda:0", torch.device("cuda", 0), 0, None):
        with torch.cuda.use_mem_pool(pool, device=device):
            assert pool.use_count() == 2
    assert pool.use_count() == 1
    assert calls("torch.cuda.use_mem_pool") == (4, 0)


def test_a_torch_npu_without_the_function_says_what_to_do(redirect, monkeypatch):
    monkeypatch.delattr(torch.npu, "change_current_allocator", raising=False)
    with pytest.raises(AttributeError, match="disable the patch 'CudaApi'"):
        torch.cuda.change_current_allocator(object())


# --------------------------------------------------------------------------- profiler, factories


def _profiled():
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CUDA],
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    ) as prof:
        x = torch.randn(32, 32, device="cuda", requires_grad=True)
        (x @ x).sum().backward()
    return prof


def test_memory_timeline_of_a_cuda_device_is_the_emulated_npu_s(redirect, calls, tmp_path):
    prof = _profiled()
    written = {}
    for label, kwargs in (
        ("cpu", {"device": "cpu"}),
        ("cuda", {"device": "cuda:0"}),
        ("device", {"device": torch.device("cuda", 0)}),
        ("none", {}),
    ):
        path = tmp_path / f"{label}.json"
        prof.export_memory_timeline(str(path), **kwargs)
        written[label] = json.loads(path.read_text())
    assert written["cpu"][0], "the host timeline has points"
    assert written["cuda"] == written["device"] == written["none"] == written["cpu"]
    assert calls("torch.profiler export_memory_timeline: CUDA device on the emulated NPU") == (3, 1)


def test_memory_timeline_device_with_a_real_torch_npu_profiler(npu_emulator, monkeypatch):
    """torch_npu's profile (faked here with its real signature) receives the NPU device."""
    import sys

    received = []

    class Profile:
        def __init__(self, *args, **kwargs):
            pass

        def export_memory_timeline(self, output_path, device=None):
            received.append((output_path, device))

    fake = types.ModuleType("torch_npu.profiler")
    fake.profile, fake._ExperimentalConfig = Profile, type("Config", (), {})
    fake.schedule = fake.tensorboard_trace_handler = fake.ProfilerAction = None
    fake.ProfilerActivity = types.SimpleNamespace(CPU="cpu", NPU="npu")
    monkeypatch.setitem(sys.modules, "torch_npu.profiler", fake)
    monkeypatch.delitem(sys.modules, "ascend_patch_torch._npu_profiler", raising=False)
    # Imported afresh against the stand-in (an earlier import may have bound another one).
    _npu_profiler = importlib.import_module("ascend_patch_torch._npu_profiler")
    prof = _npu_profiler.profile()
    prof.export_memory_timeline("a.json", device="cuda:0")
    prof.export_memory_timeline("b.json", torch.device("cuda", 1))
    prof.export_memory_timeline("c.json")
    assert received == [("a.json", "npu:0"), ("b.json", "npu:1"), ("c.json", None)]
    monkeypatch.delitem(sys.modules, "ascend_patch_torch._npu_profiler")


def test_cudnn_dropout_state_is_asked_of_the_npu(redirect, calls):
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        torch._cudnn_init_dropout_state.__ascend_patch_original__(
            0.5, True, 1, dtype=torch.uint8, device="cuda"
        )
    # The call reaches the NPU's dispatch, as with transfer_to_npu; the emulator (like
    # torch_npu's own op list) has no kernel for this cuDNN-only op.
    with pytest.raises(NotImplementedError, match="'npu' backend"):
        torch._cudnn_init_dropout_state(0.5, True, 1, dtype=torch.uint8, device="cuda")
    assert calls("torch._cudnn_init_dropout_state") == (1, 0)
