"""Stream: mmcv 1.x's ``Scatter.forward`` moves DataContainer data onto (emulated) NPUs.

mmcv 1.7.2's scatter asks torch for a copy stream by device index, which torch 2.13
rejects, and copies with ``torch.cuda``. With the group, the data reaches the NPUs
through ``torch.npu`` side streams, and equals what mmcv's CPU path (``[-1]``)
returns for the same input. Under the NPU emulator, NPU tensors are CPU tensors and
streams complete at once: this shows the path runs and the values agree (emulated),
not anything about copy overlap on a real device.

Runs in the nox session ``openmmlab1_emulated`` (mmcv 1.7.2); skipped where mmcv 1.x
is missing, a failure there (ASCEND_PATCH_TEST_REQUIRE=mmcv1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack

from ascend_patch_core import Patcher


require_stack("mmcv1")
torch = require_module("torch", "mmcv1")
require_module("mmcv.parallel", "mmcv1")

from ascend_patch_mmcv.groups import Stream  # noqa: E402
from mmcv.parallel import DataContainer  # noqa: E402
from mmcv.parallel import scatter_kwargs  # noqa: E402
from mmcv.parallel._functions import Scatter  # noqa: E402


TARGET = "mmcv.parallel._functions:Scatter.forward"


@pytest.fixture
def two_npus(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    """The NPU emulator with two devices (mmcv spreads a list over the target devices)."""
    monkeypatch.setenv("ASCEND_PATCH_EMULATED_DEVICES", "2")
    return request.getfixturevalue("npu_emulator")


@pytest.fixture
def stream_streams(monkeypatch: pytest.MonkeyPatch, two_npus: Any) -> list[Any]:
    """Every stream made current with ``torch.npu.stream(...)`` during the test."""
    seen: list[Any] = []
    original = torch.npu.stream

    def recording_stream(stream: Any) -> Any:
        seen.append(stream)
        return original(stream)

    monkeypatch.setattr(torch.npu, "stream", recording_stream)
    return seen


def cpu_path(input: Any) -> tuple[Any, ...]:
    """mmcv's own result for the host target ``[-1]`` (the original, unpatched)."""
    return Scatter.forward([-1], input)


def assert_same_tensors(got: Any, want: Any) -> None:
    assert type(got) is type(want) and len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, (list, tuple)):
            assert_same_tensors(g, w)
        else:
            assert g.is_contiguous()
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_unpatched_scatter_fails_on_this_torch(two_npus: Any) -> None:
    """The bug the group fixes is real with mmcv 1.7.2 and the torch installed here."""
    with pytest.raises(AttributeError, match="'int' object has no attribute 'type'"):
        Scatter.forward([0], [torch.randn(2)])


INPUTS = {
    "tensor": lambda: torch.randn(2, 3),
    "non-contiguous tensor": lambda: torch.randn(3, 4).t(),
    "list on one device": lambda: [torch.randn(2), torch.randn(2, 2)],
    "empty tensor in a list": lambda: [torch.randn(0), torch.randn(1)],
    "half precision": lambda: torch.randn(4).half(),
}


@pytest.mark.parametrize("name", list(INPUTS))
def test_scatter_to_an_npu_matches_the_cpu_path(
    name: str, stream_streams: list[Any], isolated_patcher: Patcher
) -> None:
    torch.manual_seed(0)
    input = INPUTS[name]()
    want = cpu_path(input)
    isolated_patcher.add(Stream).apply()

    got = Scatter.forward([0], input)

    assert_same_tensors(got, want)
    counters = isolated_patcher.report.get(TARGET).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)
    # Host data went through one side stream of npu:0 (an empty tensor needs none),
    # and the device's current stream is its default one again afterwards.
    side = [s for s in stream_streams if s is not None]
    assert side and {s.device_index for s in side} == {0}
    assert all(s != torch.npu.default_stream(0) for s in side)
    assert torch.npu.current_stream(0) == torch.npu.default_stream(0)


def test_a_list_is_spread_over_two_npus_in_chunks(
    stream_streams: list[Any], isolated_patcher: Patcher
) -> None:
    """mmcv's split: 3 items over 2 devices -> the first 2 on npu:0, the last on npu:1."""
    items = [torch.randn(2), torch.randn(3), torch.randn(4)]
    want = cpu_path(items)
    isolated_patcher.add(Stream).apply()

    got = Scatter.forward([0, 1], items)

    assert_same_tensors(got, want)
    assert [s.device_index for s in stream_streams] == [0, 0, 1]
    # One side stream per device, reused from one call to the next.
    Scatter.forward([0, 1], items)
    assert len(set(stream_streams)) == 2


def test_scatter_kwargs_of_data_containers(
    stream_streams: list[Any], isolated_patcher: Patcher
) -> None:
    """The path of MMDataParallel.scatter and MMDistributedDataParallel.scatter/to_kwargs."""
    torch.manual_seed(0)
    inputs = (DataContainer(torch.randn(2, 3, 4, 4), stack=True),)
    kwargs = {
        "gt_bboxes": DataContainer([torch.randn(3, 4), torch.randn(1, 4)]),
        "img_metas": DataContainer([{"filename": "a.jpg"}], cpu_only=True),
    }
    want_inputs, want_kwargs = scatter_kwargs(inputs, kwargs, [-1])
    isolated_patcher.add(Stream).apply()

    got_inputs, got_kwargs = scatter_kwargs(inputs, kwargs, [0])

    torch.testing.assert_close(got_inputs[0][0], want_inputs[0][0], rtol=0, atol=0)
    for got, want in zip(got_kwargs[0]["gt_bboxes"], want_kwargs[0]["gt_bboxes"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got_kwargs[0]["img_metas"] == want_kwargs[0]["img_metas"] == {"filename": "a.jpg"}
    assert isolated_patcher.report.get(TARGET).counters.replacement_calls == 2


def test_the_host_target_and_a_machine_without_npu_keep_the_original(
    isolated_patcher: Patcher,
) -> None:
    """Without an NPU (no emulator here) and for ``[-1]``, mmcv's original runs."""
    original = Scatter.__dict__["forward"]
    isolated_patcher.add(Stream).apply()
    x = torch.randn(3)
    torch.testing.assert_close(Scatter.forward([-1], x)[0], x)
    # A device target without an NPU: mmcv's original, with its error on this torch.
    with pytest.raises(AttributeError, match="'int' object has no attribute 'type'"):
        Scatter.forward([0], x)
    counters = isolated_patcher.report.get(TARGET).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 2)
    isolated_patcher.revert()
    assert Scatter.__dict__["forward"] is original


def test_default_group_under_ascend_patch_run(tmp_path: Path) -> None:
    """The user's way: ``ascend-patch run --emulate-npu`` a script that scatters to device 0."""
    script = tmp_path / "scatter.py"
    script.write_text(
        "import torch\n"
        "from mmcv.parallel import DataContainer, scatter_kwargs\n"
        "x = torch.arange(6.0).reshape(2, 3)\n"
        "inputs, _ = scatter_kwargs((DataContainer([x]),), {}, [0])\n"
        "print('scattered', inputs[0][0].tolist())\n"
    )
    report_path = tmp_path / "report.json"
    cli = Path(sys.executable).parent / "ascend-patch"
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run(
        [str(cli), "run", "--emulate-npu", "--report", str(report_path), str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "scattered [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]" in done.stdout
    report = json.loads(report_path.read_text())["processes"][0]["report"]
    (record,) = [r for r in report["records"] if r["target"] == TARGET]
    assert record["status"] == "applied"
    assert record["counters"] == {"replacement_calls": 1, "fallback_calls": 0}
