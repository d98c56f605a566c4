"""The emulated torch.npu's streams, graphs, memory pools, allocator API, mstx and device odds.

Graphs are tested the way a user meets them: capture a training step and replay it
against the same step run eagerly, and make_graphed_callables against the module it
wraps, comparing numbers and gradients.
"""

from __future__ import annotations

import threading
import warnings

import ascend_patch_emulator as emulator
import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def two_devices():
    was_active = emulator.is_active()
    if was_active:
        pytest.skip("needs its own activation with two devices")
    with emulator.activate(device_count=2) as handle:
        yield handle


# --------------------------------------------------------------------------- streams


def test_stream_context_makes_the_stream_and_its_device_current(two_devices):
    """As torch_npu's setStream: the stream's device becomes current; the block's end restores both."""
    main = torch.npu.current_stream()
    side = torch.npu.Stream()
    other_device = torch.npu.Stream(device=1)
    assert main == torch.npu.default_stream() and side != main
    with torch.npu.StreamContext(side):
        assert torch.npu.current_stream() == side
        with torch.npu.stream(other_device):
            assert torch.npu.current_device() == 1
            assert torch.npu.current_stream() == other_device
            assert torch.npu.current_stream(0) == side
        assert torch.npu.current_device() == 0
        assert torch.npu.current_stream() == side
        assert torch.npu.current_stream(1) == torch.npu.default_stream(1)
    assert torch.npu.current_stream() == main
    torch.npu.set_stream(other_device)
    assert torch.npu.current_device() == 1 and torch.npu.current_stream() == other_device
    torch.npu.set_stream(main)
    assert torch.npu.current_device() == 0 and torch.npu.current_stream() == main
    with torch.npu.stream(None):  # a no-op, as in torch_npu
        assert torch.npu.current_stream() == main
    torch.npu.set_stream(None)
    assert torch.npu.current_stream() == main


def test_current_stream_is_per_thread(npu_emulator):
    side = torch.npu.Stream()
    seen = []
    with torch.npu.stream(side):
        worker = threading.Thread(target=lambda: seen.append(torch.npu.current_stream()))
        worker.start()
        worker.join()
    assert seen == [torch.npu.default_stream()]


def test_streams_and_events(npu_emulator):
    stream = torch.npu.Stream(priority=-1)
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record(stream)
    stream.wait_stream(torch.npu.current_stream())
    end.record()
    assert stream.query() and end.query()
    assert start.elapsed_time(end) >= 0
    assert stream.record_event().query()
    assert len({stream, torch.npu.current_stream(), torch.npu.default_stream()}) == 2
    assert stream.device == torch.device("npu", 0)


def test_external_stream_is_usable_but_not_synchronizable(npu_emulator):
    external = torch.npu.ExternalStream(0xABC0)
    assert external.npu_stream == 0xABC0
    assert external == torch.npu.ExternalStream(0xABC0)
    with torch.npu.stream(external):
        assert torch.npu.current_stream() == external
        torch.ones(2, device="npu").sum()
    with pytest.raises(RuntimeError, match="caller is responsible for synchronization"):
        external.synchronize()
    with pytest.raises(RuntimeError, match="Cannot query external NPU stream"):
        external.query()
    with pytest.raises(RuntimeError, match="not supported by task queue"):
        external.record_event()
    with pytest.raises(RuntimeError, match="not supported by task queue"):
        torch.npu.Stream().wait_stream(external)
    with pytest.raises(RuntimeError, match="Priority was explicitly set"):
        torch.npu.ExternalStream(1, priority=-1)


# --------------------------------------------------------------------------- graphs


def _model_and_copy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    eager = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    eager.load_state_dict(model.state_dict())
    return model.npu(), eager


def test_whole_training_step_captured_and_replayed_matches_eager(npu_emulator):
    model, eager = _model_and_copy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    static_x = torch.randn(16, 4, device="npu")
    static_y = torch.randn(16, 1, device="npu")

    def eager_step(x, y):
        eager_optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(eager(x), y)
        loss.backward()
        eager_optimizer.step()
        return loss.detach()

    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):  # warm-up, as the CUDA graphs recipe does
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            F.mse_loss(model(static_x), static_y).backward()
            optimizer.step()
            eager_step(static_x, static_y)
    torch.npu.current_stream().wait_stream(side)

    graph = torch.npu.NPUGraph()
    optimizer.zero_grad(set_to_none=True)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    with torch.npu.graph(graph):
        assert torch.npu.is_current_stream_capturing()
        static_loss = F.mse_loss(model(static_x), static_y)
        static_loss.backward()
        optimizer.step()
    assert not torch.npu.is_current_stream_capturing()
    # As on the device, capturing does not run the step: parameters and BN statistics hold.
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=0, msg=name)

    for _ in range(4):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        torch.testing.assert_close(static_loss, eager_step(x, y))
    for (name, ours), theirs in zip(
        model.state_dict().items(), eager.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(ours, theirs, msg=name)
    assert isinstance(graph.pool(), tuple)


def test_graph_rules_of_torch_npu(npu_emulator):
    graph = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        graph.capture_begin()
    with pytest.raises(RuntimeError, match="replay without a preceding successful capture"):
        graph.replay()
    with pytest.raises(RuntimeError, match="pool\\(\\) without a preceding successful capture"):
        graph.pool()
    with pytest.raises(RuntimeError, match="capture_end\\(\\) called before capture_begin"):
        graph.capture_end()
    with pytest.raises(RuntimeError, match="does not support update"):
        graph.update([{}])
    x = torch.ones(3, device="npu")
    for host_read in (lambda: x.sum().item(), lambda: bool(x.any()), torch.npu.synchronize):
        with (
            pytest.raises(RuntimeError, match="during NPU graph capture"),
            torch.npu.graph(torch.npu.NPUGraph()),
        ):
            host_read()
    assert not torch.npu.is_current_stream_capturing()
    assert torch.npu.current_stream() == torch.npu.default_stream()


def test_graph_shares_a_pool_and_replays_random_ops_freshly(npu_emulator):
    first, second = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    pool = torch.npu.graph_pool_handle()
    static = torch.zeros(1000, device="npu")
    with torch.npu.graph(first, pool=pool):
        noise = torch.rand_like(static)
    with torch.npu.graph(second, pool=first.pool()):
        doubled = noise * 2
    assert first.pool() == second.pool() == pool
    first.replay()
    draw = noise.clone()
    first.replay()
    assert not torch.equal(draw, noise)  # new numbers each replay, as the device draws
    second.replay()
    torch.testing.assert_close(doubled, noise * 2)
    first.reset()
    with pytest.raises(RuntimeError, match="replay without"):
        first.replay()


def test_make_graphed_callables_matches_the_module(npu_emulator):
    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    reference.load_state_dict(module.state_dict())

    def head(x):
        return x.softmax(-1)

    graphed, graphed_head = torch.npu.make_graphed_callables(
        (module, head),
        ((torch.randn(4, 3, requires_grad=True),), (torch.randn(4, 2, requires_grad=True),)),
    )
    assert graphed is module
    for _ in range(3):
        module.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        x = torch.randn(4, 3, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out = graphed_head(graphed(x))
        expected = head(reference(x_ref))
        torch.testing.assert_close(out, expected)
        (out * torch.arange(2.0)).sum().backward()
        (expected * torch.arange(2.0)).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        for ours, theirs in zip(module.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(ours.grad, theirs.grad)
    # In eval mode the module runs its own forward (it was captured in training mode).
    module.eval()
    x = torch.randn(7, 3)
    torch.testing.assert_close(module(x), reference(x))


def test_make_graphed_callables_checks_what_torch_checks(npu_emulator):
    with pytest.raises(AssertionError, match="only Tensors"):
        torch.npu.make_graphed_callables(lambda x, n: x * n, (torch.ones(2), 3))
    hooked = torch.nn.Linear(2, 2)
    hooked.register_forward_hook(lambda *a: None)
    with pytest.raises(AssertionError, match="must not have hooks"):
        torch.npu.make_graphed_callables(hooked, (torch.ones(1, 2),))
    with torch.autocast("npu"), pytest.raises(RuntimeError, match="autocast caching"):
        torch.npu.make_graphed_callables(torch.nn.Linear(2, 2), (torch.ones(1, 2),))


# --------------------------------------------------------------------------- memory


def test_mem_pool_and_use_mem_pool(npu_emulator):
    pool = torch.npu.MemPool()
    other = torch.npu.MemPool(use_on_oom=True)
    assert pool.id != other.id and pool.id[0] == 0
    assert pool.use_count() == 1 and pool.allocator is None
    with torch.npu.use_mem_pool(pool):
        assert pool.use_count() == 2
        torch.zeros(10, device="npu")
    assert pool.use_count() == 1
    assert pool.snapshot() == [] and torch.npu.memory_snapshot() == []
    with pytest.raises(TypeError, match="MemPool"), torch.npu.use_mem_pool(pool.id):
        pass
    assert torch.npu.memory.MemPool is torch.npu.MemPool


def test_allocator_api(npu_emulator):
    address = torch.npu.caching_allocator_alloc(64, stream=torch.npu.current_stream())
    assert isinstance(address, int) and address != 0
    torch.npu.caching_allocator_delete(address)
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.npu.caching_allocator_delete(address)
    with pytest.raises(TypeError, match="Invalid type for stream"):
        torch.npu.caching_allocator_alloc(8, stream="s")
    assert torch.npu.get_allocator_backend() == "native"
    with pytest.raises(OSError):
        torch.npu.NPUPluggableAllocator("/nonexistent/alloc.so", "my_malloc", "my_free")
    allocator = torch.npu.memory._NPUAllocator("custom")
    torch.npu.change_current_allocator(allocator)
    assert torch.npu.memory._get_current_allocator() is allocator
    with pytest.raises(TypeError):
        torch.npu.change_current_allocator("native")


def test_memory_fraction_and_stats(npu_emulator):
    assert torch.npu.get_per_process_memory_fraction() == 1.0
    torch.npu.set_per_process_memory_fraction(0.5, 0)
    assert torch.npu.get_per_process_memory_fraction("npu:0") == 0.5
    with pytest.raises(TypeError, match="must be `float`"):
        torch.npu.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match="Allowed range"):
        torch.npu.set_per_process_memory_fraction(1.5)
    assert torch.npu.memory_stats_as_nested_dict() == {} == torch.npu.host_memory_stats()
    assert torch.npu.host_memory_stats_as_nested_dict() == {}
    torch.npu.reset_peak_host_memory_stats()
    torch.npu.reset_accumulated_host_memory_stats()
    torch.npu.host_empty_cache()
    torch.npu.empty_virt_addr_cache()


def test_fraction_is_forgotten_with_the_activation():
    with emulator.activate():
        torch.npu.set_per_process_memory_fraction(0.25)
    with emulator.activate():
        assert torch.npu.get_per_process_memory_fraction() == 1.0


# --------------------------------------------------------------------------- device odds, mstx


def test_device_functions(two_devices):
    assert torch.npu.can_device_access_peer(0, 1)
    assert not torch.npu.can_device_access_peer(1, "npu:1")
    torch.npu.set_sync_debug_mode("warn")
    assert torch.npu.get_sync_debug_mode() == 1
    torch.npu.set_sync_debug_mode(0)
    assert torch.npu.get_sync_debug_mode() == 0
    with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
        torch.npu.set_sync_debug_mode("loud")
    assert torch.npu.current_blas_handle() == 0
    torch.npu.ipc_collect()


def test_mstx_marks_and_ranges(npu_emulator):
    mstx = torch.npu.mstx
    mstx.mark("step")
    assert mstx.marks[-1] == "step"
    assert mstx.range_push("outer") == 0
    depth_elsewhere = []
    worker = threading.Thread(target=lambda: depth_elsewhere.append(mstx.range_push("w")))
    worker.start()
    worker.join()
    assert depth_elsewhere == [0]  # ranges nest per thread, as NVTX's
    assert mstx.range_push("inner") == 1
    assert mstx.range_pop() == 1 and mstx.range_pop() == 0 and mstx.range_pop() == -1
    range_id = mstx.range_start("io")
    assert range_id > 0
    mstx.range_end(range_id)

    @mstx.mstx_range("wrapped")
    def work():
        return 3

    assert work() == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert mstx.range_push("") == -1
    assert "Invalid message" in str(caught[0].message)
