"""CUDA-written calls run on the (emulated) NPU, one test per redirect item, with counts.

Without the patches every call below raises "Torch not compiled with CUDA enabled"
on this CPU build of torch; with them it runs on the NPU, which the emulator backs
with the CPU. Each test also checks that the report counted the redirect.
"""

from __future__ import annotations

import io

import pytest
import torch
from ascend_patch_torch.devices import NPU


def on_npu(tensor):
    return tensor.is_npu  # the emulator's NPU tensors are CPU tensors with is_npu set


def test_without_the_patches_cuda_calls_fail_here(npu_emulator):
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(2, device="cuda")
    with pytest.raises((AssertionError, RuntimeError)):
        torch.ones(2).cuda()


# --------------------------------------------------------------------------- factories


@pytest.mark.parametrize(
    ("factory", "args"),
    [
        (torch.zeros, (2, 3)),
        (torch.ones, (2,)),
        (torch.empty, (4,)),
        (torch.full, ((2,), 7.0)),
        (torch.arange, (5,)),
        (torch.linspace, (0, 1, 5)),
        (torch.eye, (3,)),
        (torch.rand, (2,)),
        (torch.randn, (2,)),
        (torch.randint, (0, 9, (3,))),
        (torch.randperm, (4,)),
        (torch.tensor, ([1.0, 2.0],)),
        (torch.hann_window, (4,)),
    ],
)
@pytest.mark.parametrize(
    "device", ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0), 0]
)
def test_factories_with_a_cuda_device_build_npu_tensors(redirect, calls, factory, args, device):
    name = factory.__name__
    reference = (
        factory(*args) if name not in ("rand", "randn", "randint", "randperm", "empty") else None
    )
    before = calls(f"torch.{name}")
    result = getattr(torch, name)(*args, device=device)
    assert on_npu(result)
    if reference is not None:
        torch.testing.assert_close(result, reference)
    after = calls(f"torch.{name}")
    assert after[0] == before[0] + 1


def test_like_factories_and_as_tensor(redirect, calls):
    base = torch.arange(4.0)
    for name in ("zeros_like", "ones_like", "full_like", "empty_like", "rand_like"):
        args = (base, 3.0) if name == "full_like" else (base,)
        assert on_npu(getattr(torch, name)(*args, device="cuda"))
        assert calls(f"torch.{name}")[0] == 1
    assert on_npu(torch.as_tensor([1, 2], dtype=torch.int64, device="cuda:0"))
    assert calls("torch.as_tensor") == (1, 0)


def test_cpu_and_npu_calls_are_untouched_and_counted_as_such(redirect, calls):
    torch.zeros(2)
    torch.zeros(2, device="cpu")
    torch.zeros(2, device="npu")
    assert calls("torch.zeros") == (0, 3)


def test_sizes_are_never_taken_for_device_indexes(redirect):
    # transfer_to_npu rewrote ints only in device=; so do we: a positional 0 is a size.
    assert torch.zeros(0).shape == (0,)
    assert torch.ones(0, 2).shape == (0, 2)


def test_load_maps_cuda_locations_and_leaves_file_paths_alone(redirect, calls, tmp_path):
    path = tmp_path / "cuda_model.pt"  # transfer_to_npu opened .../npu_model.pt
    torch.save({"w": torch.arange(3.0)}, path)
    assert torch.load(path, map_location="cuda")["w"].tolist() == [0.0, 1.0, 2.0]
    assert torch.load(str(path), map_location=torch.device("cuda", 0))["w"].is_npu
    assert torch.load(path, map_location={"cpu": "cuda:0"})["w"].sum() == 3
    assert torch.load(path)["w"].sum() == 3  # no map_location: CUDA storages would go to the NPU
    assert torch.load(path, map_location="cpu")["w"].sum() == 3
    assert calls("torch.serialization.load") == (4, 1)


def _as_if_saved_on_cuda(checkpoint: bytes) -> bytes:
    """The same torch.save archive, with its storages tagged "cuda:0" as on a GPU machine."""
    import zipfile

    # torch.save pickles with protocol 2: a string is "X", a 4-byte length, the text.
    cpu, cuda = b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0"
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(checkpoint)) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("data.pkl"):
                assert cpu in data
                data = data.replace(cpu, cuda)
            dst.writestr(item, data)
    return out.getvalue()


def test_load_without_map_location_restores_cuda_tagged_storages_on_the_npu(npu_emulator):
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(3.0)}, buffer)
    from_gpu = _as_if_saved_on_cuda(buffer.getvalue())
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(io.BytesIO(from_gpu))
    from ascend_patch_torch.groups import Serialization

    from ascend_patch_core import Patcher

    with Patcher(autoload=False, strict=True).add(Serialization):
        loaded = torch.load(io.BytesIO(from_gpu))
    assert loaded["w"].tolist() == [0.0, 1.0, 2.0]
    assert on_npu(loaded["w"])


def test_set_default_device_and_get_device_module(redirect, calls):
    try:
        torch.set_default_device("cuda")
        assert on_npu(torch.zeros(1))
    finally:
        torch.set_default_device(None)
    # (get_device_module is lru-cached, and the emulator replaces torch.npu per activation.)
    assert torch.get_device_module("cuda") is torch.get_device_module("npu")
    assert calls("torch.set_default_device")[0] == 1


# --------------------------------------------------------------------------- Tensor, Module


def test_tensor_cuda_to_and_is_cuda(redirect, calls):
    x = torch.arange(3.0)
    for moved in (x.cuda(), x.cuda(0), x.cuda("cuda:0"), x.cuda(device=torch.device("cuda", 0))):
        assert on_npu(moved)
        assert moved.is_cuda
        torch.testing.assert_close(moved, x)
    assert calls("torch.Tensor.cuda") == (4, 0)
    for moved in (x.to("cuda"), x.to(0), x.to("cuda", torch.float16), x.to(device="cuda:0")):
        assert on_npu(moved)
    assert x.to("cuda", torch.float16).dtype is torch.float16
    assert x.to(torch.float64).dtype is torch.float64  # a dtype is not a device
    redirected, untouched = calls("torch.Tensor.to")
    assert redirected == 5
    assert untouched >= 1


def test_new_tensor_methods_and_pin_memory(redirect, calls):
    x = torch.ones(2)
    for name, args in (
        ("new_zeros", ((2,),)),
        ("new_ones", ((2,),)),
        ("new_empty", ((2,),)),
        ("new_full", ((2,), 1.0)),
        ("new_tensor", ([1.0],)),
        ("new_empty_strided", ((2,), (1,))),
    ):
        assert on_npu(getattr(x, name)(*args, device="cuda"))
        assert calls(f"torch.Tensor.{name}")[0] == 1
    pinned = x.pin_memory("cuda")
    torch.testing.assert_close(pinned, x)


def test_module_cuda_to_and_to_empty(redirect, calls):
    model = torch.nn.Linear(3, 2)
    weights = model.weight.detach().clone()
    assert model.cuda() is model
    assert all(on_npu(p) for p in model.parameters())
    torch.testing.assert_close(model.weight.detach(), weights)
    model.to("cuda:0")
    model.to(torch.device("cuda"), torch.float64)
    assert model.weight.dtype is torch.float64
    empty = torch.nn.Linear(2, 2, device="meta").to_empty(device="cuda")
    assert on_npu(empty.weight)
    assert calls("torch.nn.modules.module.Module.cuda") == (1, 0)
    assert calls("torch.nn.modules.module.Module.to")[0] == 2
    assert calls("torch.nn.modules.module.Module.to_empty") == (1, 0)


def test_with_torch_device_cuda(redirect, calls):
    with torch.device("cuda"):
        made = torch.zeros(2)
    assert on_npu(made)
    with torch.device("cuda:0"):
        assert on_npu(torch.nn.Linear(2, 2).weight)
    assert calls("torch.utils._device.DeviceContext.__init__")[0] == 2


def test_device_objects_keep_their_type(redirect):
    # Deliberately different from a rewrite of torch.device itself (see redirect.py).
    assert torch.device("cuda").type == "cuda"
    assert torch.device("cuda", 1).index == 1


# --------------------------------------------------------------------------- torch.cuda API


def test_device_management_and_rng(redirect, calls):
    assert torch.cuda.is_available()
    assert torch.cuda.device_count() == torch.npu.device_count() == 1
    assert torch.cuda.current_device() == 0
    torch.cuda.set_device("cuda:0")
    torch.cuda.set_device(0)
    assert "emulated" in torch.cuda.get_device_name()
    assert "emulated" in torch.cuda.get_device_name("cuda:0")
    torch.cuda.synchronize()
    torch.cuda.synchronize(torch.device("cuda", 0))
    torch.cuda.manual_seed(1)
    torch.cuda.manual_seed_all(1)
    state = torch.cuda.get_rng_state("cuda")
    torch.cuda.set_rng_state(state, "cuda:0")
    assert torch.cuda.memory_allocated() >= 0
    assert torch.cuda.max_memory_allocated("cuda:0") >= 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    assert calls("torch.cuda.is_available") == (1, 0)
    assert calls("torch.cuda.set_device") == (2, 0)
    assert calls("torch.cuda.synchronize") == (2, 0)


def test_cuda_random_and_memory_submodules_are_aliases(redirect, calls):
    import torch.cuda.memory
    import torch.cuda.random

    torch.cuda.random.manual_seed(3)
    torch.cuda.memory.empty_cache()
    assert calls("torch.cuda.manual_seed") == (1, 0)
    assert calls("torch.cuda.empty_cache") == (1, 0)


def test_streams_and_events_are_npu_streams_and_events(redirect):
    stream = torch.cuda.Stream()
    assert isinstance(stream, torch.npu.Stream)
    assert isinstance(stream, torch.cuda.Stream)
    with torch.cuda.stream(stream):
        x = torch.ones(2, device="cuda") * 2
    torch.cuda.current_stream().wait_stream(stream)
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    event.synchronize()
    assert x.tolist() == [2.0, 2.0]
    assert type(stream) is torch.npu.Stream  # torch.cuda.Stream builds the NPU class
    assert torch.cuda.streams.Stream is torch.cuda.Stream
    assert torch.cuda.Event is torch.cuda.streams.Event is torch.npu.Event
    with torch.cuda.device(0):
        assert torch.cuda.current_device() == 0


def test_legacy_tensor_types_keep_their_dtype(redirect):
    # transfer_to_npu made torch.cuda.DoubleTensor a float32 type.
    for name, dtype in (
        ("DoubleTensor", torch.float64),
        ("FloatTensor", torch.float32),
        ("HalfTensor", torch.float16),
        ("LongTensor", torch.int64),
    ):
        assert redirect.report.get(f"torch.cuda.{name}").status.value == "applied"
        assert getattr(torch.cuda, name) is getattr(torch.npu, name)
        made = getattr(torch.cuda, name)([1, 2])
        assert made.dtype is dtype and made.is_npu
        assert isinstance(torch.zeros(2, dtype=dtype, device="cuda"), getattr(torch.cuda, name))
    assert torch.ones(2, device="cuda").type(torch.cuda.DoubleTensor).dtype is torch.float64


def test_bf16_support_query(redirect):
    assert torch.cuda.is_bf16_supported() == torch.npu.is_bf16_supported()
    assert torch.cuda.is_bf16_supported(including_emulation=False) == torch.npu.is_bf16_supported()


# --------------------------------------------------------------------------- amp


def test_autocast_cuda_and_cuda_amp(redirect, calls):
    a, b = torch.randn(2, 2, device="cuda"), torch.randn(2, 2, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype is torch.bfloat16
        # No argument meant CUDA; both now ask the NPU.
        assert torch.is_autocast_enabled()
        assert torch.is_autocast_enabled("cuda")
        assert torch.is_autocast_enabled(device_type="cuda")
        assert torch.get_autocast_dtype("cuda") is torch.bfloat16
        assert torch.get_autocast_gpu_dtype() is torch.bfloat16
    assert not torch.is_autocast_enabled()
    assert not torch.is_autocast_enabled("cuda")
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype is torch.bfloat16
    with torch.cuda.amp.autocast(dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype is torch.bfloat16
        assert torch.is_autocast_enabled("cuda")
    with torch.amp.autocast("cuda", enabled=False):
        assert torch.mm(a, b).dtype is torch.float32
    assert calls("torch.amp.autocast_mode.autocast.__init__")[0] == 4


def test_autocast_dtype_queries(redirect):
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    assert torch.get_autocast_dtype("cuda") is torch.bfloat16
    assert torch.get_autocast_gpu_dtype() is torch.bfloat16
    torch.set_autocast_gpu_dtype(torch.float16)
    assert torch.get_autocast_dtype("npu") is torch.float16
    torch.set_autocast_enabled(False)  # the legacy one-argument form meant CUDA
    assert not torch.is_autocast_enabled("npu")


def test_grad_scaler_defaults_to_the_npu(redirect, calls):
    for scaler in (
        torch.amp.GradScaler(),
        torch.amp.GradScaler("cuda"),
        torch.cuda.amp.GradScaler(),
    ):
        assert scaler._device == NPU
    model = torch.nn.Linear(2, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    loss = model(torch.ones(1, 2, device="cuda")).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert calls("torch.amp.grad_scaler.GradScaler.__init__")[0] == 4


def test_custom_fwd_and_bwd(redirect, calls):
    class Double(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda")
        def forward(ctx, x):
            return x * 2

        @staticmethod
        @torch.cuda.amp.custom_bwd
        def backward(ctx, grad):
            return grad * 2

    x = torch.ones(2, device="cuda", requires_grad=True)
    Double.apply(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]

    seen = []

    class InFloat32(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            seen.append((x.dtype, torch.is_autocast_enabled("cuda")))
            return x.clone()

        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, grad):
            return grad

    with torch.autocast("cuda", dtype=torch.bfloat16):
        InFloat32.apply(torch.ones(2, device="cuda", dtype=torch.bfloat16))
    assert seen == [(torch.float32, False)]  # cast, and run with autocast off
    assert calls("torch.amp.autocast_mode.custom_fwd")[0] == 2
    assert calls("torch.amp.autocast_mode.custom_bwd")[0] == 2


# --------------------------------------------------------------------------- generator, jit, revert


def test_generator_and_event_proxies_keep_isinstance(redirect):
    base = torch._C.Generator()
    assert isinstance(base, torch.Generator)
    assert isinstance(torch.Generator(), torch.Generator)
    assert issubclass(torch._C.Generator, torch.Generator)
    assert torch.Generator("cpu").device.type == "cpu"
    assert isinstance(torch.Event(), torch.Event)


def test_generator_and_event_with_a_cuda_device_are_built_on_the_npu(npu_emulator):
    with pytest.raises(RuntimeError):
        torch.Generator("cuda")  # this CPU build of torch has no CUDA generator
    from ascend_patch_torch.groups import GeneratorAndEvent

    from ascend_patch_core import Patcher

    before = (torch.Generator, torch.Event, torch.cuda.default_generators)
    with Patcher(autoload=False, strict=True).add(GeneratorAndEvent):
        for spec in ("cuda", "cuda:0", torch.device("cuda", 0)):
            generator = torch.Generator(spec)
            assert type(generator) is torch._C.Generator  # what generator= accepts
            # The emulator's NPU generators are CPU generators (its NPU tensors are CPU tensors).
            assert generator.device.type == ("cpu" if npu_emulator else NPU)
        first = torch.randn(
            3, device="npu", generator=torch.Generator(device="cuda").manual_seed(5)
        )
        again = torch.randn(3, device="npu", generator=torch.Generator(device=0).manual_seed(5))
        torch.testing.assert_close(first, again)
        event = torch.Event("cuda")
        assert event.device.type == NPU
        assert isinstance(event, torch.Event)
        assert torch.cuda.default_generators is torch.npu.default_generators
        torch.cuda.default_generators[0].manual_seed(9)
        assert torch.npu.default_generators[0].initial_seed() == 9
    assert (torch.Generator, torch.Event, torch.cuda.default_generators) == before


def test_torch_jit_script_keeps_working(redirect):
    @torch.jit.script
    def scripted(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(2) + torch.ones_like(x) + x.to(torch.float32)

    assert scripted(torch.ones(2)).tolist() == [2.0, 2.0]


def test_revert_restores_plain_torch(npu_emulator, isolated_patcher):
    from ascend_patch_torch import plugin

    originals = (
        torch.zeros,
        torch.Tensor.to,
        torch.Tensor.cuda,
        torch.cuda.is_available,
        torch.Generator,
    )
    for group in plugin.register_patches():
        if not group.opt_in:
            isolated_patcher.add(group)
    isolated_patcher.apply()
    assert torch.zeros is not originals[0]
    isolated_patcher.revert()
    assert (
        torch.zeros,
        torch.Tensor.to,
        torch.Tensor.cuda,
        torch.cuda.is_available,
        torch.Generator,
    ) == originals
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


# --------------------------------------------------------------------------- storages


def test_untyped_storage_on_cuda_and_typed_storage_is_cuda(redirect, calls):
    for spec in ("cuda", "cuda:0", torch.device("cuda", 0), 0):
        storage = torch.UntypedStorage(8, device=spec)
        assert storage.nbytes() == 8
        assert storage.is_npu
    assert torch.UntypedStorage(4).nbytes() == 4  # no device: untouched
    assert calls("torch.storage.UntypedStorage.__new__") == (4, 1)
    typed = torch.ones(3, device="cuda").storage()
    assert typed.is_cuda and typed.is_npu
    assert not torch.ones(3, device="meta").storage().is_cuda


def test_memory_history_and_snapshots_come_from_the_npu(redirect, calls, tmp_path):
    import pickle

    import torch.cuda.memory

    torch.cuda.memory._record_memory_history(max_entries=1000, device="cuda:0")
    snapshot = torch.cuda.memory._snapshot()
    assert snapshot == torch.npu.memory._snapshot()
    path = tmp_path / "snapshot.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    with open(path, "rb") as file:
        assert pickle.load(file)["segments"] == snapshot["segments"]
    torch.cuda.memory._record_memory_history(enabled=None)
    assert calls("torch.cuda.memory._record_memory_history") == (2, 0)
    assert calls("torch.cuda.memory._dump_snapshot") == (1, 0)
