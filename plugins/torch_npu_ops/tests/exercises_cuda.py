"""Exercises of the torch.cuda items for test_every_item_runs.py (see exercise_kit.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from exercise_kit import C0
from exercise_kit import T0
from exercise_kit import Ctx
from exercise_kit import Exercise
from exercise_kit import check
from exercise_kit import equal
from exercise_kit import exercise
from exercise_kit import npu


# --------------------------------------------------------------------------- torch.cuda


# name -> (CUDA-style arguments, the torch.npu arguments giving the same answer)
_SAME_AS_NPU: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    "is_available": ((), ()), "is_initialized": ((), ()), "device_count": ((), ()),
    "current_device": ((), ()), "get_device_name": ((C0,), (0,)),
    "get_device_properties": ((T0,), (0,)), "get_device_capability": (("cuda",), (0,)),
    "can_device_access_peer": ((C0, T0), (0, 0)), "utilization": (("cuda",), (0,)),
    "get_sync_debug_mode": ((), ()), "current_blas_handle": ((), ()),
    "current_stream": ((C0,), (0,)), "default_stream": ((T0,), (0,)),
    "memory_snapshot": ((), ()), "get_per_process_memory_fraction": ((C0,), (0,)),
    "get_allocator_backend": ((), ()), "host_memory_stats": ((), ()),
    "host_memory_stats_as_nested_dict": ((), ()), "initial_seed": ((), ()),
    "get_rng_state": ((C0,), (0,)), "get_rng_state_all": ((), ()),
    "is_current_stream_capturing": ((), ()), "is_bf16_supported": ((), ()),
    **{name: ((C0,), (0,)) for name in (
        "memory_stats", "memory_stats_as_nested_dict", "memory_allocated",
        "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
        "max_memory_cached", "memory_summary")},
}  # fmt: skip
# name -> CUDA-style arguments of a call whose effect torch does not show (returns None).
_RETURNS_NONE: dict[str, tuple[Any, ...]] = {
    "init": (), "synchronize": (T0,), "ipc_collect": (), "empty_cache": (), "seed": (),
    "seed_all": (), "reset_accumulated_host_memory_stats": (),
    "reset_peak_host_memory_stats": (),
    **{name: (C0,) for name in (
        "reset_accumulated_memory_stats", "reset_peak_memory_stats",
        "reset_max_memory_allocated", "reset_max_memory_cached")},
}  # fmt: skip


def _same_as_npu(name: str) -> Exercise:
    cuda_args, npu_args = _SAME_AS_NPU[name]
    return lambda fn, ctx: check(equal(fn(*cuda_args), getattr(torch.npu, name)(*npu_args)))


for _name in _SAME_AS_NPU:
    exercise(f"torch.cuda.{_name}")(_same_as_npu(_name))
for _name, _args in _RETURNS_NONE.items():
    exercise(f"torch.cuda.{_name}")(lambda fn, ctx, a=_args: check(fn(*a) is None))


@exercise("torch.cuda.set_device")
def _set_device(fn: Any, ctx: Ctx) -> None:
    for spec in (C0, T0, 0, "cuda"):
        fn(spec)
        assert torch.npu.current_device() == 0


@exercise("torch.cuda.set_sync_debug_mode")
def _sync_debug(fn: Any, ctx: Ctx) -> None:
    fn("warn")
    assert torch.npu.get_sync_debug_mode() == 1
    fn(0)


@exercise("torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.StreamContext")
def _streams(fn: Any, ctx: Ctx) -> None:
    stream = torch.cuda.Stream(device=C0)
    if fn is torch.cuda.set_stream:
        fn(stream)
        assert torch.npu.current_stream() is stream
        fn(torch.npu.default_stream())
        return
    with fn(stream):
        assert torch.npu.current_stream() is stream
    assert torch.npu.current_stream() is torch.npu.default_stream()


@exercise("torch.cuda.mem_get_info")
def _mem_get_info(fn: Any, ctx: Ctx) -> None:
    assert fn(C0)[1] == torch.npu.mem_get_info(0)[1] > 0  # the total; what is free moves


@exercise("torch.cuda.caching_allocator_alloc", "torch.cuda.caching_allocator_delete")
def _allocator(fn: Any, ctx: Ctx) -> None:
    address = torch.cuda.caching_allocator_alloc(64, C0, torch.cuda.current_stream(T0))
    torch.cuda.caching_allocator_delete(address)
    with pytest.raises(RuntimeError, match="invalid device pointer"):  # freed once already
        torch.npu.caching_allocator_delete(address)


@exercise("torch.cuda.set_per_process_memory_fraction")
def _fraction(fn: Any, ctx: Ctx) -> None:
    fn(0.5, C0)
    assert torch.npu.get_per_process_memory_fraction(0) == 0.5
    fn(1.0, T0)


@exercise("torch.cuda.use_mem_pool", "torch.cuda.MemPool")
def _mem_pool(fn: Any, ctx: Ctx) -> None:
    pool = torch.cuda.MemPool()
    assert isinstance(pool, torch.npu.MemPool)
    with torch.cuda.use_mem_pool(pool, device=C0):
        assert pool.use_count() == 2
    assert pool.use_count() == 1


@exercise("torch.cuda.change_current_allocator")
def _change_allocator(fn: Any, ctx: Ctx) -> None:
    before = torch.npu.memory._get_current_allocator()
    mine = torch.npu.memory._NPUAllocator("mine")
    fn(mine)
    assert torch.npu.memory._get_current_allocator() is mine
    torch.npu.change_current_allocator(before)


@exercise("torch.cuda.manual_seed", "torch.cuda.manual_seed_all")
def _manual_seed(fn: Any, ctx: Ctx) -> None:
    fn(7)
    first = torch.randn(3, device="cuda")
    fn(7)
    assert torch.equal(first, torch.randn(3, device="cuda"))


@exercise("torch.cuda.set_rng_state", "torch.cuda.set_rng_state_all")
def _set_rng_state(fn: Any, ctx: Ctx) -> None:
    state = torch.npu.get_rng_state(0)
    first = torch.randn(3, device="cuda")
    fn(state, C0) if fn is torch.cuda.set_rng_state else fn([state])
    assert torch.equal(first, torch.randn(3, device="cuda"))


@exercise("torch.cuda.graph_pool_handle")
def _pool_handle(fn: Any, ctx: Ctx) -> None:
    assert type(fn()) is type(torch.npu.graph_pool_handle())


@exercise("torch.cuda.make_graphed_callables")
def _graphed(fn: Any, ctx: Ctx) -> None:
    model = torch.nn.Linear(3, 2).cuda()
    x = torch.randn(4, 3, device="cuda")
    expected = model(x)
    torch.testing.assert_close(npu(fn(model, (x,))(x)), expected)


@exercise("torch.cuda.graph", "torch.cuda.CUDAGraph")
def _graph(fn: Any, ctx: Ctx) -> None:
    graph = torch.cuda.CUDAGraph()
    assert isinstance(graph, torch.npu.NPUGraph)
    x = torch.ones(2, device="cuda")
    with torch.cuda.graph(graph):
        y = x * 2
    x.fill_(3)
    graph.replay()
    assert y.tolist() == [6.0, 6.0]


@exercise("torch.cuda.memory._record_memory_history", "torch.cuda.memory._snapshot",
          "torch.cuda.memory._dump_snapshot")  # fmt: skip
def _memory_history(fn: Any, ctx: Ctx) -> None:
    torch.cuda.memory._record_memory_history(max_entries=10, device=C0)
    snapshot = torch.cuda.memory._snapshot(T0)
    assert snapshot == torch.npu.memory._snapshot(0)
    path = ctx.tmp_path / "snapshot.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    assert path.stat().st_size > 0
    torch.cuda.memory._record_memory_history(enabled=None)


@exercise("torch.cuda.device")
def _device(fn: Any, ctx: Ctx) -> None:
    for spec in (C0, T0, 0, "cuda", None):
        with fn(spec):
            assert torch.cuda.current_device() == 0
        assert isinstance(fn(spec), torch.npu.device)


@exercise("torch.cuda.device_of")
def _device_of(fn: Any, ctx: Ctx) -> None:
    with fn(torch.ones(1, device="cuda")):
        assert torch.npu.current_device() == 0


@exercise("torch.cuda.Stream", "torch.cuda.ExternalStream", "torch.cuda.Event")
def _stream_classes(fn: Any, ctx: Ctx) -> None:
    if fn is torch.cuda.Event:
        event = fn(enable_timing=True)
        event.record(torch.cuda.Stream(C0))
        event.synchronize()
        assert type(event) is torch.npu.Event
        return
    made = fn(1234, device=T0) if fn is torch.cuda.ExternalStream else fn(device=C0)
    assert type(made) is getattr(torch.npu, fn.__name__) and isinstance(made, fn)
    assert made.device == torch.device("npu", 0)


for _dtype in ("Bool", "Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double",
               "BFloat16"):  # fmt: skip
    exercise(f"torch.cuda.{_dtype}Tensor")(
        lambda fn, ctx, d=_dtype: check(
            npu(fn([1, 0])).dtype is getattr(torch.npu, f"{d}Tensor").dtype
            and isinstance(torch.zeros(1, dtype=fn.dtype, device="cuda"), fn)
        )
    )
    exercise(f"torch.cuda.{_dtype}Storage")(
        lambda fn, ctx, d=_dtype: check(
            fn(3).size() == 3 and fn is getattr(torch.npu, f"{d}Storage")
        )
    )


def _double_stays_double(fn: Any, ctx: Ctx) -> None:
    # transfer_to_npu made torch.cuda.DoubleTensor torch.npu.FloatTensor (float32).
    assert fn is torch.npu.DoubleTensor and npu(fn([1.5])).dtype is torch.float64


exercise("`torch.cuda.DoubleTensor = torch.npu.FloatTensor`")(_double_stays_double)


@exercise("torch.cuda.nvtx.range_push", "torch.cuda.nvtx.range_pop", "torch.cuda.nvtx.mark",
          "torch.cuda.nvtx.range_start", "torch.cuda.nvtx.range_end")  # fmt: skip
def _nvtx(fn: Any, ctx: Ctx) -> None:
    with torch.cuda.nvtx.range("step"):
        torch.cuda.nvtx.mark("loss")
    torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start("io"))
    assert torch.npu.mstx.marks[-1] == "loss"


@exercise("torch.cuda.default_generators")
def _default_generators(fn: Any, ctx: Ctx) -> None:
    assert torch.cuda.default_generators is torch.npu.default_generators
    torch.cuda.default_generators[0].manual_seed(11)
    assert torch.npu.default_generators[0].initial_seed() == 11
