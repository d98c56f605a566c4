"""Exercises of the torch.* items for test_every_item_runs.py (see exercise_kit.py).

Factories, Tensor, Module, storages, generators, autocast, torch internals.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from exercise_kit import C0
from exercise_kit import T0
from exercise_kit import Ctx
from exercise_kit import Exercise
from exercise_kit import check
from exercise_kit import exercise
from exercise_kit import npu


# --------------------------------------------------------------------------- torch.* factories

_X = torch.arange(4.0)
_SPARSE = (torch.tensor([0, 1]), torch.tensor([0]))
# name -> (arguments, keyword arguments, the CPU result to compare with or None)
_FACTORIES: dict[str, tuple[tuple[Any, ...], dict[str, Any], bool]] = {
    "arange": ((4,), {}, True), "as_tensor": (([1, 2],), {}, True),
    "asarray": (([1, 2],), {}, True), "bartlett_window": ((4,), {}, True),
    "blackman_window": ((4,), {}, True), "empty": ((2,), {}, False),
    "empty_like": ((_X,), {}, False), "empty_permuted": (((2, 3), (1, 0)), {}, False),
    "empty_strided": (((2,), (1,)), {}, False), "eye": ((3,), {}, True),
    "full": (((2,), 3.0), {}, True), "full_like": ((_X, 2.0), {}, True),
    "hamming_window": ((4,), {}, True), "hann_window": ((4,), {}, True),
    "kaiser_window": ((4,), {}, True), "linspace": ((0, 1, 5), {}, True),
    "logspace": ((0, 1, 5), {}, True), "normal": ((0.0, 1.0, (3,)), {}, False),
    "ones": ((2,), {}, True), "ones_like": ((_X,), {}, True), "rand": ((2,), {}, False),
    "rand_like": ((_X,), {}, False), "randint": ((0, 5, (3,)), {}, False),
    "randint_like": ((_X, 5), {}, False), "randn": ((2,), {}, False),
    "randn_like": ((_X,), {}, False), "randperm": ((4,), {}, False),
    "scalar_tensor": ((2.0,), {}, True), "tensor": (([1.0],), {}, True),
    "zeros": ((2,), {}, True), "zeros_like": ((_X,), {}, True),
    "sparse_coo_tensor": ((torch.tensor([[0, 1], [1, 0]]), torch.ones(2), (2, 2)), {}, False),
    "sparse_compressed_tensor": ((*_SPARSE, torch.ones(1), (1, 1)), {"layout": torch.sparse_csr}, False),
    **{name: ((*_SPARSE, torch.ones(1), (1, 1)), {}, False)
       for name in ("sparse_csr_tensor", "sparse_csc_tensor")},
    **{name: ((*_SPARSE, torch.ones(1, 1, 1), (1, 1)), {}, False)
       for name in ("sparse_bsr_tensor", "sparse_bsc_tensor")},
}  # fmt: skip
# Factories the emulator has no NPU kernel for (its NPU allocates only strided CPU
# tensors): the call must reach the NPU's dispatch, which is what the patch does.
_NO_EMULATED_KERNEL: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "tril_indices": ((3, 3), {}), "triu_indices": ((3, 3), {}),
    "_cudnn_init_dropout_state": ((0.5, True, 1), {"dtype": torch.uint8}),
    "_empty_affine_quantized": (([2],), {"scale": 0.1, "zero_point": 0, "dtype": torch.quint8}),
    "_empty_per_channel_affine_quantized": (([2],), {
        "scales": torch.ones(2, dtype=torch.double), "zero_points": torch.zeros(2, dtype=torch.long),
        "axis": 0, "dtype": torch.quint8}),
    "empty_quantized": (([2],), {}),
}  # fmt: skip


def _factory(name: str) -> Exercise:
    args, kwargs, compare = _FACTORIES[name]

    def run(fn: Any, ctx: Ctx) -> None:
        for spec in (C0, T0, 0):
            made = npu(fn(*args, device=spec, **kwargs))
            if compare:
                torch.testing.assert_close(made, getattr(torch, name)(*args, **kwargs))

    return run


def _no_emulated_kernel(name: str) -> Exercise:
    args, kwargs = _NO_EMULATED_KERNEL[name]

    def run(fn: Any, ctx: Ctx) -> None:
        if name == "empty_quantized":
            args_ = (*args, torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8))
        else:
            args_ = args
        with pytest.raises(NotImplementedError, match=r"'(Quantized)?npu' backend"):
            fn(*args_, device=C0, **kwargs)

    return run


for _name in _FACTORIES:
    exercise(f"torch.{_name}")(_factory(_name))
for _name in _NO_EMULATED_KERNEL:
    exercise(f"torch.{_name}")(_no_emulated_kernel(_name))


@exercise("torch.range")
def _range(fn: Any, ctx: Ctx) -> None:
    with pytest.warns(UserWarning, match="deprecated"):
        torch.testing.assert_close(npu(fn(0, 3, device=C0)), torch.arange(0.0, 4.0))


@exercise("torch.from_file")
def _from_file(fn: Any, ctx: Ctx) -> None:
    path = ctx.tmp_path / "floats.bin"
    path.write_bytes(bytes(16))
    with pytest.raises(NotImplementedError, match="'npu' backend"):  # no emulated kernel
        fn(str(path), False, 4, dtype=torch.float32, device=C0)


@exercise("torch._pin_memory", "torch.Tensor.pin_memory")
def _pin(fn: Any, ctx: Ctx) -> None:
    torch.testing.assert_close(fn(_X, "cuda"), _X)


@exercise("torch.set_default_device")
def _default_device(fn: Any, ctx: Ctx) -> None:
    try:
        fn("cuda")
        npu(torch.zeros(1))
    finally:
        torch.set_default_device(None)


@exercise("torch.get_device_module")
def _device_module(fn: Any, ctx: Ctx) -> None:
    assert fn(T0) is torch.get_device_module("npu")


@exercise("torch.fft.fftfreq", "torch.fft.rfftfreq")
def _fftfreq(fn: Any, ctx: Ctx) -> None:
    torch.testing.assert_close(npu(fn(4, device=C0)), fn(4))


@exercise("torch.load")
def _load(fn: Any, ctx: Ctx) -> None:
    path = ctx.tmp_path / "cuda_model.pt"  # transfer_to_npu opened .../npu_model.pt
    torch.save({"w": torch.arange(3.0)}, path)
    for location in ("cuda", T0, {"cpu": C0}):
        assert npu(fn(path, map_location=location)["w"]).tolist() == [0.0, 1.0, 2.0]


# --------------------------------------------------------------------------- Tensor, Module, ...


@exercise("torch.Tensor.cuda")
def _tensor_cuda(fn: Any, ctx: Ctx) -> None:
    for args in ((), (0,), (C0,), (T0,)):
        torch.testing.assert_close(npu(_X.cuda(*args)), _X)


@exercise("torch.Tensor.to")
def _tensor_to(fn: Any, ctx: Ctx) -> None:
    for args in (("cuda",), (0,), (T0, torch.float16)):
        npu(_X.to(*args))
    assert _X.to(device=C0, dtype=torch.float64).dtype is torch.float64


@exercise("torch.Tensor.is_cuda")
def _is_cuda(fn: Any, ctx: Ctx) -> None:
    assert torch.ones(1, device="cuda").is_cuda and not torch.ones(1, device="meta").is_cuda


for _name, _args in (("new_empty", ((2,),)), ("new_empty_strided", ((2,), (1,))),
                     ("new_full", ((2,), 1.0)), ("new_ones", ((2,),)), ("new_tensor", ([1.0],)),
                     ("new_zeros", ((2,),))):  # fmt: skip
    exercise(f"torch.Tensor.{_name}")(
        lambda fn, ctx, n=_name, a=_args: check(npu(getattr(_X, n)(*a, device=T0)).shape[0] >= 1)
    )


@exercise("torch.nn.modules.module.Module.cuda", "torch.nn.modules.module.Module.to")
def _module_to(fn: Any, ctx: Ctx) -> None:
    model = torch.nn.Linear(3, 2)
    weight = model.weight.detach().clone()
    assert model.cuda(0) is model and model.to(C0, torch.float64) is model
    assert npu(model.weight).dtype is torch.float64
    torch.testing.assert_close(model.weight.detach().float(), weight)


@exercise("torch.nn.modules.module.Module.to_empty")
def _to_empty(fn: Any, ctx: Ctx) -> None:
    npu(torch.nn.Linear(2, 2, device="meta").to_empty(device=0).weight)


@exercise("torch.storage.UntypedStorage.__new__")
def _untyped_storage(fn: Any, ctx: Ctx) -> None:
    for spec in ("cuda", C0, T0, 0):
        assert torch.UntypedStorage(8, device=spec).is_npu


@exercise("torch.storage.TypedStorage.is_cuda")
def _typed_is_cuda(fn: Any, ctx: Ctx) -> None:
    assert torch.ones(2, device="cuda").untyped_storage() is not None
    assert torch.ones(2, device="cuda").storage().is_cuda


@exercise("torch.Generator", "torch.Event")
def _generator_event(fn: Any, ctx: Ctx) -> None:
    made = torch.Generator(T0) if fn is torch.Generator else torch.Event(C0)
    assert isinstance(made, fn)
    if fn is torch.Event:
        assert made.device.type == "npu"
    else:
        x = torch.randn(3, device="cuda", generator=made.manual_seed(5))
        torch.testing.assert_close(x, torch.randn(3, generator=torch.Generator().manual_seed(5)))


@exercise("torch.utils._device._device_constructors")
def _device_constructors(fn: Any, ctx: Ctx) -> None:
    # torch's DeviceContext adds its device only to the functions in this list: the
    # builtins themselves, never the wrappers now standing at torch.zeros & co.
    listed = fn()
    assert torch.zeros is not torch._C._VariableFunctions.zeros
    assert torch._C._VariableFunctions.zeros in listed
    assert torch.zeros not in listed
    with torch.device("meta"):
        assert torch.zeros(2).device.type == "meta"


@exercise("torch.utils._device.DeviceContext.__init__")
def _device_context(fn: Any, ctx: Ctx) -> None:
    with torch.device(C0):
        npu(torch.zeros(2))
        npu(torch.nn.Linear(2, 2).weight)


# --------------------------------------------------------------------------- autocast


def _mm_dtype() -> Any:
    a = torch.randn(2, 2, device="cuda")
    return torch.mm(a, a).dtype


@exercise("torch.amp.autocast_mode.autocast.__init__", "torch.cuda.amp.autocast",
          "torch.cuda.amp.autocast_mode.autocast", "torch.cuda.amp.autocast_mode")  # fmt: skip
def _autocast(fn: Any, ctx: Ctx) -> None:
    for block in (
        torch.autocast("cuda", dtype=torch.bfloat16),
        torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16),
        torch.cuda.amp.autocast(dtype=torch.bfloat16),
        torch.cuda.amp.autocast_mode.autocast(dtype=torch.bfloat16),
    ):
        with block:
            assert _mm_dtype() is torch.bfloat16 and torch.is_autocast_enabled("npu")
    assert _mm_dtype() is torch.float32


@exercise("torch.amp.grad_scaler.GradScaler.__init__", "torch.cuda.amp.GradScaler",
          "torch.cuda.amp.grad_scaler")  # fmt: skip
def _grad_scaler(fn: Any, ctx: Ctx) -> None:
    model = torch.nn.Linear(2, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for scaler in (torch.amp.GradScaler(), torch.amp.GradScaler("cuda"), torch.cuda.amp.GradScaler(),
                   torch.cuda.amp.grad_scaler.GradScaler()):  # fmt: skip
        assert scaler._device == "npu"
        scaler.scale(model(torch.ones(1, 2, device="cuda")).sum()).backward()
        scaler.step(optimizer)
        scaler.update()


def _double(fwd: Any, bwd: Any) -> Any:
    class Double(torch.autograd.Function):
        forward = staticmethod(fwd(lambda ctx, x: x * 2))
        backward = staticmethod(bwd(lambda ctx, grad: grad * 2))

    x = torch.ones(2, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        Double.apply(x).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [2.0, 2.0]


@exercise("torch.amp.autocast_mode.custom_fwd", "torch.amp.autocast_mode.custom_bwd",
          "torch.amp.custom_fwd", "torch.amp.custom_bwd", "torch.cuda.amp.custom_fwd",
          "torch.cuda.amp.custom_bwd", "torch.cuda.amp.autocast_mode.custom_fwd",
          "torch.cuda.amp.autocast_mode.custom_bwd")  # fmt: skip
def _custom_fwd_bwd(fn: Any, ctx: Ctx) -> None:
    _double(lambda f: torch.amp.custom_fwd(f, device_type="cuda"),
            lambda f: torch.amp.custom_bwd(f, device_type="cuda"))  # fmt: skip
    _double(torch.cuda.amp.custom_fwd, torch.cuda.amp.custom_bwd)
    _double(torch.cuda.amp.autocast_mode.custom_fwd, torch.cuda.amp.autocast_mode.custom_bwd)


@exercise("torch.is_autocast_enabled", "torch.set_autocast_enabled", "torch.get_autocast_dtype",
          "torch.set_autocast_dtype", "torch.get_autocast_gpu_dtype",
          "torch.set_autocast_gpu_dtype", "torch.cuda.amp.common")  # fmt: skip
def _autocast_state(fn: Any, ctx: Ctx) -> None:
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    assert torch.get_autocast_dtype("cuda") is torch.bfloat16 is torch.get_autocast_gpu_dtype()
    torch.set_autocast_gpu_dtype(torch.float16)
    assert torch.get_autocast_dtype("npu") is torch.float16
    torch.set_autocast_enabled(True)  # the legacy one-argument form meant CUDA
    assert torch.is_autocast_enabled() and torch.is_autocast_enabled("cuda")
    torch.set_autocast_enabled("cuda", False)
    assert not torch.is_autocast_enabled(device_type="cuda")
    assert not torch.cuda.amp.common.amp_definitely_not_available()


# --------------------------------------------------------------------------- torch internals


@exercise("torch._utils._get_available_device_type",
          "torch.distributed.checkpoint.filesystem._OverlappingCpuLoader.__init__")  # fmt: skip
def _device_type(fn: Any, ctx: Ctx) -> None:
    from torch.distributed.checkpoint.filesystem import _OverlappingCpuLoader

    assert torch._utils._get_available_device_type() == "npu"
    loader = _OverlappingCpuLoader(lambda item: torch.ones(2))
    assert loader.device_type == "npu" and loader.device_module is torch.npu


@exercise("torch.nn.parameter.UninitializedTensorMixin._allowed_methods")
def _lazy(fn: Any, ctx: Ctx) -> None:
    model = torch.nn.LazyLinear(3).to(C0)
    assert npu(model(torch.ones(2, 4, device="cuda"))).shape == (2, 3)


@exercise("torch.utils.cpp_extension.include_paths")
def _include_paths(fn: Any, ctx: Ctx) -> None:
    from torch.utils import cpp_extension

    assert cpp_extension.include_paths("cuda") == cpp_extension.include_paths("cpu")


@exercise("torch.jit._builtins._find_builtin")
def _script(fn: Any, ctx: Ctx) -> None:
    @torch.jit.script
    def scripted(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(2) + torch.ones_like(x) + x.to(torch.float32)

    assert scripted(torch.ones(2)).tolist() == [2.0, 2.0]
