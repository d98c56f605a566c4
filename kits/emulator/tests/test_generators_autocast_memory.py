"""The emulated runtime's generators, autocast state queries and memory history."""

from __future__ import annotations

import pickle

import torch


def test_npu_generators_are_cpu_generators_that_torch_accepts(npu_emulator):
    for spec in ("npu", "npu:0", torch.device("npu", 0)):
        generator = torch.Generator(spec)
        assert type(generator) is torch._C.Generator  # the only type generator= accepts
        assert isinstance(generator, torch.Generator)
    first = torch.Generator(device="npu").manual_seed(7)
    second = torch.Generator(device="npu").manual_seed(7)
    drawn = torch.randn(4, generator=first, device="npu")
    torch.testing.assert_close(drawn, torch.randn(4, generator=second, device="npu"))
    torch.testing.assert_close(drawn, torch.randn(4, generator=torch.Generator().manual_seed(7)))
    assert torch.Generator("cpu").device.type == "cpu"


def test_generator_subclasses_construct_normally(npu_emulator):
    class Seeded(torch.Generator):
        pass

    seeded = Seeded("npu").manual_seed(3)
    assert isinstance(seeded, Seeded) and isinstance(seeded, torch.Generator)
    assert seeded.initial_seed() == 3


def test_default_generators_one_per_device(npu_emulator):
    generators = torch.npu.default_generators
    assert len(generators) == torch.npu.device_count()
    torch.npu.manual_seed(11)
    assert generators[0].initial_seed() == 11


def test_autocast_queries_naming_the_npu_see_the_emulated_autocast(npu_emulator):
    assert not torch.is_autocast_enabled("npu")
    with torch.autocast("npu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("npu")
        assert torch.is_autocast_enabled(device_type="npu")
        assert torch.get_autocast_dtype("npu") is torch.bfloat16
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype is torch.bfloat16
    assert not torch.is_autocast_enabled("npu")
    previous = torch.get_autocast_dtype("npu")
    try:
        torch.set_autocast_dtype("npu", torch.float16)
        with torch.autocast("npu"):
            assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype is torch.float16
    finally:
        torch.set_autocast_dtype("npu", previous)


def test_custom_fwd_on_the_npu_casts_under_autocast(npu_emulator):
    seen = []

    class Record(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="npu", cast_inputs=torch.float32)
        def forward(ctx, x):
            seen.append(x.dtype)
            return x

        @staticmethod
        @torch.amp.custom_bwd(device_type="npu")
        def backward(ctx, grad):
            return grad

    def forward(ctx, x):
        seen.append(x.dtype)
        return x

    decorated = torch.amp.custom_fwd(forward, device_type="npu", cast_inputs=torch.float32)

    class Positional(torch.autograd.Function):
        forward = staticmethod(decorated)
        backward = staticmethod(lambda ctx, grad: grad)

    with torch.autocast("npu", dtype=torch.bfloat16):
        Record.apply(torch.ones(2, dtype=torch.bfloat16))
        Positional.apply(torch.ones(2, dtype=torch.bfloat16))
    Record.apply(torch.ones(2, dtype=torch.bfloat16))  # outside autocast: no cast
    assert seen == [torch.float32, torch.float32, torch.bfloat16]


def test_autocast_queries_and_generator_are_restored_on_deactivate():
    from ascend_patch_emulator import activate

    originals = (torch.Generator, torch.is_autocast_enabled, torch.get_autocast_dtype)
    with activate():
        assert torch.Generator is not originals[0]
    assert (torch.Generator, torch.is_autocast_enabled, torch.get_autocast_dtype) == originals
    assert torch.Generator is torch._C.Generator


def test_memory_history_and_snapshot(npu_emulator, tmp_path):
    import torch_npu.npu.memory as memory

    assert torch.npu.memory is memory
    memory._record_memory_history(max_entries=100)
    snapshot = memory._snapshot()
    assert snapshot["segments"] == [] and len(snapshot["device_traces"]) == 1
    path = tmp_path / "snapshot.pickle"
    memory._dump_snapshot(str(path))
    with open(path, "rb") as file:
        assert pickle.load(file) == snapshot
    memory._record_memory_history(enabled=None)
    assert memory.memory_allocated() == 0
