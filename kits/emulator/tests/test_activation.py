"""The emulator's runtime: activation, the torch_npu package, npu devices, torch.npu, undo."""

from __future__ import annotations

import importlib
import importlib.util
import io
import subprocess
import sys
import threading
import warnings

import ascend_patch_emulator as emulator
import pytest
import torch
from ascend_patch_emulator import EmulatorInactiveError
from ascend_patch_emulator import EmulatorVersionError
from ascend_patch_emulator import KernelNotImplementedError

from ascend_patch_core import Patcher
from ascend_patch_core.imports._hub import hub


def test_importing_the_emulator_and_the_pytest_plugin_imports_no_torch():
    code = (
        "import sys, ascend_patch_emulator, ascend_patch_emulator.pytest_plugin;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_torch_npu_imports_like_the_real_package(npu_emulator):
    import torch_npu
    import torch_npu.npu.utils

    assert torch_npu.__version__ == npu_emulator.version
    assert torch_npu.__emulated__ is True
    assert torch.npu is torch_npu.npu
    assert sys.modules["torch.npu"] is torch_npu.npu
    assert torch_npu.npu.utils.get_cann_version() == "emulated"
    # mmengine asks for the SoC (is_npu_support_full_precision: >= 220, a 910B or later).
    assert torch_npu.npu.utils.get_soc_version() == 220
    # transformers' Trainer saves the NPU RNG through torch.npu.random.
    assert torch.npu.random.get_rng_state_all()[0].dtype == torch.uint8
    # transformers and accelerate probe with find_spec before importing.
    assert importlib.util.find_spec("torch_npu") is not None
    # The ops are torch.ops.npu's op packets, as in torch_npu itself.
    assert torch_npu.npu_rms_norm is torch.ops.npu.npu_rms_norm
    assert "npu_fusion_attention" in torch_npu.__all__
    assert torch.get_device_module("npu") is torch.npu
    assert "emulated" in npu_emulator.label and "not a performance model" in npu_emulator.label


def test_mmengine_style_probe_works(npu_emulator):
    import torch_npu  # noqa: F401
    import torch_npu.npu.utils as npu_utils

    torch.npu.set_compile_mode(jit_compile=False)
    assert npu_utils.is_jit_compile_false()
    assert hasattr(torch, "npu") and torch.npu.is_available()
    torch.npu.config.allow_internal_format = False


def test_transfer_to_npu_refuses_with_an_explanation(npu_emulator):
    with pytest.raises(ImportError, match="not emulated"):
        importlib.import_module("torch_npu.contrib.transfer_to_npu")


def test_unknown_torch_npu_attribute_says_it_is_emulated(npu_emulator):
    import torch_npu

    with pytest.raises(AttributeError, match="emulated on CPU"):
        torch_npu.npu_not_an_op  # noqa: B018


@pytest.mark.parametrize("spec", ["npu", "npu:1", ("npu", 0)], ids=str)
def test_npu_device_strings_give_cpu_tensors(spec):
    with emulator.activate(device_count=2):
        device = torch.device(*spec) if isinstance(spec, tuple) else spec
        factories = {
            "zeros": lambda: torch.zeros(2, 3, device=device),
            "ones": lambda: torch.ones(4, device=device, dtype=torch.float16),
            "arange": lambda: torch.arange(5, device=device),
            "full": lambda: torch.full((2,), 7.0, device=device),
            "tensor": lambda: torch.tensor([1.0, 2.0], device=device),
            "eye": lambda: torch.eye(3, device=device),
            "empty_like": lambda: torch.empty_like(torch.ones(2), device=device).fill_(1),
        }
        for name, make in factories.items():
            made = make()
            assert made.device.type == "cpu", name
            assert made.is_npu, name
        with torch.device(device):
            assert torch.ones(2).device.type == "cpu"
        torch.manual_seed(3)
        on_npu = torch.randn(3, device=device)
        torch.manual_seed(3)
        assert torch.equal(on_npu, torch.randn(3))
        x = torch.arange(6.0, requires_grad=True)
        moved = x.to(device)
        assert torch.equal(moved, x.detach())
        moved.sum().backward()
        assert torch.equal(x.grad, torch.ones(6))


def test_modules_tensors_and_storages_move_to_npu(npu_emulator):
    layer = torch.nn.Linear(3, 2)
    expected = layer(torch.ones(1, 3))
    assert layer.npu() is layer
    assert torch.equal(layer.to("npu")(torch.ones(1, 3, device="npu")), expected)
    assert torch.equal(torch.arange(3).npu(), torch.arange(3))
    assert torch.equal(torch.arange(3).npu("npu:0"), torch.arange(3))
    storage = torch.UntypedStorage(8, device="npu")
    assert storage.device.type == "cpu" and storage.nbytes() == 8
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buffer)
    for location in ("npu", "npu:0", torch.device("npu")):
        buffer.seek(0)
        assert torch.equal(torch.load(buffer, map_location=location)["w"], torch.arange(4.0))


def test_npu_tensors_from_another_thread(npu_emulator):
    made = []
    thread = threading.Thread(target=lambda: made.append(torch.ones(2, device="npu")))
    thread.start()
    thread.join()
    assert torch.equal(made[0], torch.ones(2))


def test_dataloader_pin_memory_and_optimizer_work(npu_emulator):
    from torch.utils.data import DataLoader
    from torch.utils.data import TensorDataset

    batches = list(DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2, pin_memory=True))
    assert [b[0].tolist() for b in batches] == [[0.0, 1.0], [2.0, 3.0]]
    layer = torch.nn.Linear(2, 1).to("npu")
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.1)
    before = layer.weight.detach().clone()
    layer(torch.ones(3, 2, device="npu")).sum().backward()
    optimizer.step()
    assert not torch.equal(before, layer.weight)


def test_torch_npu_runtime(npu_emulator):
    npu = torch.npu
    assert npu.is_available() and npu.device_count() == 1 and npu.current_device() == 0
    npu.set_device("npu:0")
    with pytest.raises(RuntimeError, match="invalid NPU device ordinal 3"):
        npu.set_device(3)
    with pytest.raises(RuntimeError, match="invalid NPU device ordinal 2"):
        torch.zeros(1, device="npu:2")
    npu.synchronize()
    assert "emulated" in npu.get_device_name()
    assert npu.get_device_capability() is None
    stream = npu.Stream()
    with npu.stream(stream):
        assert npu.current_stream() is stream
    assert npu.current_stream() is npu.default_stream()
    start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
    start.record()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0 and stream.query()
    assert npu.memory_allocated() == npu.max_memory_reserved() == 0
    assert npu.memory_stats() == {}
    npu.empty_cache()
    npu.manual_seed(7)
    first = torch.rand(3, device="npu")
    npu.manual_seed(7)
    assert torch.equal(first, torch.rand(3, device="npu"))
    assert npu.is_bf16_supported()


#: The names torch_npu binds on ``_NPUDeviceProperties`` (``torch_npu/csrc/npu/Module.cpp``,
#: 2.1 to 2.14; the 2.13.0 wheel's libtorch_npu.so carries each of them).
NPU_PROPERTY_NAMES = [
    "name",
    "total_memory",
    "cube_core_num",
    "vector_core_num",
    "L2_cache_size",
    "major",
    "minor",
    "is_multi_gpu_board",
    "is_integrated",
    "multi_processor_count",
    "max_threads_per_multi_processor",
    "warp_size",
    "regs_per_multiprocessor",
    "gcnArchName",
    "uuid",
]


def test_device_properties_are_torch_npus_object(npu_emulator):
    """Every name torch_npu's object has, with its values: the CUDA/ROCm ones are None there.

    inductor's cache key reads ``gcnArchName`` once ``torch.cuda`` answers for the NPU; the
    emulated object lacked it and every ``torch.compile`` failed (issue #22).
    """
    props = torch.npu.get_device_properties(0)
    for name in NPU_PROPERTY_NAMES:
        assert hasattr(props, name), name
    for name in ("major", "minor", "gcnArchName", "warp_size", "regs_per_multiprocessor"):
        assert getattr(props, name) is None, name
    assert props.name == torch.npu.get_device_name(0)
    assert props.total_memory > 0 and props.emulated
    assert props.cube_core_num >= 1 and props.vector_core_num >= 1
    assert len(props.uuid.bytes) == 16 and len(str(props.uuid)) == 36
    assert repr(props).startswith(f"_NPUDeviceProperties(name='{props.name}', total_memory=")
    with pytest.raises(AttributeError):
        props.name = "read-only, as torch_npu's binding"
    assert torch.npu.get_device_properties("npu:0") == props
    with pytest.raises(RuntimeError, match="invalid NPU device ordinal 3"):
        torch.npu.get_device_properties(3)


def test_several_devices_and_the_device_context(npu_emulator):
    npu_emulator.deactivate()
    with emulator.activate(device_count=4):
        assert torch.npu.device_count() == 4
        with torch.npu.device(2):
            assert torch.npu.current_device() == 2
        assert torch.npu.current_device() == 0
        torch.npu.set_device(torch.device("npu", 3))
        assert torch.npu.current_device() == 3


def test_autocast_on_npu_is_cpu_autocast(npu_emulator):
    a = torch.randn(4, 4, device="npu")
    with torch.autocast("npu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    with torch.npu.amp.autocast(dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32
    scaler = torch.npu.amp.GradScaler()
    assert scaler.scale(torch.ones(1)).item() == scaler.get_scale()


def test_activate_is_idempotent_and_one_version_per_process(npu_emulator):
    assert emulator.activate() is npu_emulator
    assert emulator.activate(npu_emulator.version) is npu_emulator
    assert emulator.is_active() and emulator.active_version() == npu_emulator.version
    others = [v for v in emulator.available_versions() if v != npu_emulator.version]
    if others:
        with pytest.raises(EmulatorVersionError, match="deactivate"):
            emulator.activate(others[0])
        npu_emulator.deactivate()
        with pytest.raises(EmulatorVersionError, match="its own process"):
            emulator.activate(others[0])
    with pytest.raises(LookupError, match="available"):
        emulator.activate("0.0.1")
    with pytest.raises(ValueError, match="device_count"):
        emulator.activate(device_count=0)


def test_default_version_falls_back_to_the_newest_with_a_warning(monkeypatch):
    from ascend_patch_emulator import _activate

    monkeypatch.setattr(_activate, "available_versions", lambda: ["2.1.0.post17", "2.14.0"])
    monkeypatch.setattr(_activate, "DEFAULT_VERSION", "2.13.0")
    with pytest.warns(emulator.EmulatorWarning, match="default torch_npu 2.13.0.*2.14.0"):
        assert _activate.resolve_version() == "2.14.0"
    monkeypatch.setattr(_activate, "available_versions", lambda: ["2.13.0", "2.14.0"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _activate.resolve_version() == "2.13.0"


def test_deactivate_restores_the_process():
    from torch._subclasses.fake_tensor import FakeTensor

    normalize_fake_device = FakeTensor.__dict__["_normalize_fake_device"]
    meta_path = list(sys.meta_path)
    hidden_before = {name for name in sys.modules if name.startswith("torch_npu")}
    handle = emulator.activate()
    import torch_npu

    rms_norm = torch_npu.npu_rms_norm
    x = torch.ones(2, 4, device="npu")
    handle.deactivate()
    assert not emulator.is_active() and emulator.active_version() is None
    assert sys.meta_path == meta_path
    assert {name for name in sys.modules if name.startswith("torch_npu")} == hidden_before
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("torch_npu")
    assert not hasattr(torch.Tensor, "npu") and not hasattr(torch.Tensor, "is_npu")
    assert not hasattr(torch.nn.Module, "npu") and "to" not in torch.UntypedStorage.__dict__
    assert FakeTensor.__dict__["_normalize_fake_device"] is normalize_fake_device
    # What torch cannot undo stays, inert: the backend name and a device module with no device.
    assert not torch.npu.is_available() and torch.npu.device_count() == 0
    assert not torch.accelerator.is_available()
    with pytest.raises(AttributeError, match="not active"):
        torch.npu.Stream  # noqa: B018
    # torch.manual_seed seeds the npu device module too: quietly, with no device to seed.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.manual_seed(0)
    with pytest.raises(AttributeError, match="only while active"):
        torch.ops.npu.npu_rms_norm  # noqa: B018
    # Op objects kept from the active time fail cleanly instead of crashing.
    with pytest.raises(EmulatorInactiveError, match="not active"):
        rms_norm(x, torch.ones(4))
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.zeros(1, device="npu")
    handle.deactivate()  # a second undo is a no-op
    emulator.deactivate()
    # One torch.npu object per process: torch.get_device_module caches what it finds.
    inactive_npu = torch.get_device_module("npu")
    assert inactive_npu is torch.npu and not inactive_npu.is_available()
    with emulator.activate() as again:
        assert torch.get_device_module("npu") is inactive_npu is torch.npu
        assert inactive_npu.is_available() and inactive_npu.Stream is not None
        assert torch.allclose(torch.ops.npu.npu_rms_norm(x, torch.ones(4))[0], x)
        assert again.active
    assert not again.active


def test_import_hub_sees_the_import_so_pending_settings_apply():
    patcher = Patcher().allow_internal_format(True)
    patcher.apply()
    try:
        with emulator.activate():
            assert torch.npu.config.allow_internal_format is True
            record = next(r for r in patcher.report if r.kind == "setting")
            assert record.status.value == "applied"
    finally:
        patcher.revert()
    assert not hub.installed or "torch_npu" not in hub._watches


def test_a_skipped_torch_npu_import_is_refused_clearly():
    patcher = Patcher().skip_import("torch_npu")
    try:
        with pytest.raises(RuntimeError, match="import rule"):
            emulator.activate()
        assert not emulator.is_active()
        assert sys.modules.get("torch_npu") is None or "emulated" not in repr(
            sys.modules.get("torch_npu")
        )
    finally:
        patcher.revert()
        sys.modules.pop("torch_npu", None)


def test_op_without_kernel_names_op_and_version(npu_emulator):
    import torch_npu

    with pytest.raises(KernelNotImplementedError) as caught:
        torch_npu.npu_dynamic_quant(torch.ones(2, 4))
    message = str(caught.value)
    assert "torch_npu.npu_dynamic_quant" in message
    assert f"torch_npu {npu_emulator.version}" in message
    assert "no reference kernel" in message


def test_forward_only_op_gives_no_gradient_like_on_the_npu(npu_emulator):
    import torch_npu

    x1 = torch.randn(2, 8, requires_grad=True)
    y, _, _ = torch_npu.npu_add_rms_norm(x1, torch.randn(2, 8), torch.ones(8))
    with pytest.warns(UserWarning, match="autograd kernel was not registered"):
        (y.sum() + x1.sum()).backward()
    assert torch.equal(x1.grad, torch.ones(2, 8))  # only x1.sum() contributed


def test_differentiable_op_marks_non_differentiable_outputs(npu_emulator):
    import torch_npu

    x = torch.randn(3, 8, requires_grad=True)
    y, rstd = torch_npu.npu_rms_norm(x, torch.ones(8))
    assert y.requires_grad and not rstd.requires_grad
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_torch_npu_submodules_import_under_torch_npu_too():
    # mmengine 0.10.7: ``from torch.npu.amp import GradScaler`` (optim/amp_optimizer_wrapper.py).
    with emulator.activate():
        import torch_npu
        from torch.npu.amp import GradScaler
        from torch.npu.memory import memory_allocated

        assert GradScaler is torch_npu.npu.amp.GradScaler
        assert memory_allocated() == 0
        assert sys.modules["torch.npu.amp"] is sys.modules["torch_npu.npu.amp"]
        assert importlib.import_module("torch.npu.utils") is torch_npu.npu.utils
    assert "torch.npu.amp" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("torch.npu.amp")
