"""TensorIndex (opt-in): x[bool_mask] through masked_select equals x[bool_mask], 0-d masks included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ascend_patch_torch.groups import TensorIndex
from ascend_patch_torch.tensor_index import is_bool_mask
from ascend_patch_torch.tensor_index import masked_index
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


ORIGINAL_GETITEM = torch.Tensor.__getitem__


@st.composite
def tensor_and_mask(draw):
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=4))
    k = draw(st.integers(0, len(shape)))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    mask = torch.rand(shape[:k], generator=generator) > 0.5
    return x, mask


@settings(max_examples=150, deadline=None)
@given(tensor_and_mask())
def test_masked_index_equals_indexing(case):
    x, mask = case
    assert is_bool_mask(x, mask)
    expected = ORIGINAL_GETITEM(x, mask)
    result = masked_index(x, mask)
    assert result.shape == expected.shape
    torch.testing.assert_close(result, expected)


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_zero_dim_masks(value, shape):
    # The DrivingSDK patcher broadcast a 0-d mask over the tensor and returned the wrong shape.
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    mask = torch.tensor(value)
    expected = ORIGINAL_GETITEM(x, mask)
    assert masked_index(x, mask).shape == expected.shape
    torch.testing.assert_close(masked_index(x, mask), expected)


def test_gradients_match(assert_parity):
    x = torch.randn(5, 3)
    mask = torch.tensor([True, False, True, True, False])
    assert_parity(ORIGINAL_GETITEM, masked_index, x, mask)


@pytest.mark.parametrize(
    "index",
    [
        0,
        slice(1, 2),
        (0, 1),
        torch.tensor([0, 2]),
        torch.tensor([1, 0, 1], dtype=torch.uint8),
        torch.tensor([[True, False]]),  # wrong shape: torch raises, so must the patch
        [True, False, True],
        None,
        Ellipsis,
    ],
)
def test_other_indexes_go_to_torch(index):
    x = torch.randn(3, 2)
    assert not is_bool_mask(x, index)


def test_patched_indexing_is_counted_and_exact(npu_emulator, isolated_patcher):
    isolated_patcher.add(TensorIndex).apply()
    x = torch.arange(12.0, device="npu").reshape(4, 3)
    mask = torch.tensor([True, False, False, True])
    assert x[mask].tolist() == [[0.0, 1.0, 2.0], [9.0, 10.0, 11.0]]
    assert x[1].tolist() == [3.0, 4.0, 5.0]
    assert x[:, 0].tolist() == [0.0, 3.0, 6.0, 9.0]
    counters = isolated_patcher.report.get("torch.Tensor.__getitem__").counters
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 2)
    isolated_patcher.revert()
    assert torch.Tensor.__getitem__ is ORIGINAL_GETITEM


# --------------------------------------------------------------------------- tensors stay tensors

PROBE = Path(__file__).with_name("tensor_index_probe.py")


def _probe(mode, tmp_path):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    environment["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    if mode == "run":
        cli = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
        assert cli is not None, "the ascend-patch command is not installed in this environment"
        command = [cli, "run", "--emulate-npu", str(PROBE), mode]
        environment["ASCEND_PATCH_ENABLE"] = "TensorIndex"
    else:
        command = [sys.executable, str(PROBE), mode]
    done = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tensors_stay_non_sequences_applied_and_after_revert(tmp_path):
    """Issue #22: with TensorIndex, torch.tensor([torch.tensor(1), torch.tensor(2)]) raised
    "len() of a 0-d tensor", even after revert(): a Python __getitem__ on torch.Tensor made
    every tensor class a C-level sequence, and deleting it left them so (Qwen2-VL builds
    grid sizes that way). Everything torch.tensor() and CPython see must be plain torch's."""
    plain = _probe("plain", tmp_path)["patched"]
    assert plain["0-d tensors"] == "[1, 2]"
    found = _probe("run", tmp_path)
    assert found["applied"] == ["torch.Tensor.__getitem__", "torch.Tensor.__init_subclass__"]
    assert found["masks_redirected"] == 1
    assert found["patched"] == plain
    assert found["reverted"] == plain


def test_revert_is_exact_in_process(npu_emulator, isolated_patcher):
    import ctypes

    is_sequence = ctypes.pythonapi.PySequence_Check
    is_sequence.argtypes = (ctypes.py_object,)
    isolated_patcher.add(TensorIndex).apply()

    class Made(torch.Tensor):
        pass

    for sample in (torch.ones(1), torch.nn.Parameter(torch.ones(1)), Made()):
        assert not is_sequence(sample)
    assert torch.tensor([torch.tensor(1), torch.tensor(2)]).tolist() == [1, 2]
    isolated_patcher.revert()
    assert "__init_subclass__" not in vars(torch.Tensor)
    assert torch.Tensor.__getitem__ is ORIGINAL_GETITEM
    for sample in (torch.ones(1), torch.nn.Parameter(torch.ones(1)), Made()):
        assert not is_sequence(sample)
    assert torch.tensor([torch.tensor(1), torch.tensor(2)]).tolist() == [1, 2]


def test_skipped_with_its_reason_where_the_slot_cannot_be_restored(
    npu_emulator, isolated_patcher, monkeypatch
):
    from ascend_patch_torch import _sequence_slot

    # Another type layout: the check against PyType_GetSlot fails, nothing is written.
    monkeypatch.setattr(_sequence_slot, "_AS_SEQUENCE", _sequence_slot._AS_SEQUENCE + 8)
    report = isolated_patcher.add(TensorIndex).apply()
    getitem = report.get("torch.Tensor.__getitem__")
    assert getitem.status.value == "skipped"
    assert "would make every tensor a sequence" in getitem.reason
    assert "type layout does not match" in getitem.reason
    assert report.get("torch.Tensor.__init_subclass__").status.value != "applied"
    assert torch.Tensor.__getitem__ is ORIGINAL_GETITEM
    assert "__init_subclass__" not in vars(torch.Tensor)
