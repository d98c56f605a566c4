"""The single decision of what is a CUDA device spec, and its NPU equivalent."""

from __future__ import annotations

import pytest
import torch
from ascend_patch_torch.devices import is_cuda_spec
from ascend_patch_torch.devices import to_npu_spec
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(autouse=True, scope="module")
def _npu_backend_name():
    # torch.device("npu") parses once PrivateUse1 is named npu, as torch_npu and the emulator do.
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "npu"):
        pytest.skip(f"PrivateUse1 is already named {name!r} in this process")
    if name != "npu":
        torch.utils.rename_privateuse1_backend("npu")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("cuda", "npu"),
        ("cuda:0", "npu:0"),
        ("cuda:12", "npu:12"),
    ],
)
def test_cuda_strings_become_npu_strings(spec, expected):
    assert is_cuda_spec(spec)
    assert to_npu_spec(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "cpu",
        "npu:0",
        "/ckpt/cuda_model.pt",  # transfer_to_npu opened /ckpt/npu_model.pt
        "cuda_model.pt",
        "cud\u0430",  # a Cyrillic a
        "cuda:",
        "cuda:x",
        "cuda:٣",  # a non-ASCII digit torch.device rejects
        "cuda:0,cpu:gloo",
        " cuda",
        "CUDA",
        "nccl",
        "",
    ],
)
def test_other_strings_are_left_alone(spec):
    assert not is_cuda_spec(spec)
    assert to_npu_spec(spec) is spec


def test_cuda_device_objects_become_npu_devices_keeping_the_index():
    assert to_npu_spec(torch.device("cuda")) == torch.device("npu")
    assert to_npu_spec(torch.device("cuda", 3)) == torch.device("npu", 3)
    assert to_npu_spec(torch.device("cuda:1")) == torch.device("npu:1")
    cpu = torch.device("cpu")
    assert to_npu_spec(cpu) is cpu


def test_ints_are_device_indexes_only_where_the_caller_says_so():
    assert not is_cuda_spec(1)
    assert to_npu_spec(1) == 1
    assert is_cuda_spec(1, ints=True)
    assert to_npu_spec(1, ints=True) == "npu:1"


@pytest.mark.parametrize("flag", [True, False])
def test_bools_are_never_device_indexes(flag):
    assert not is_cuda_spec(flag, ints=True)
    assert to_npu_spec(flag, ints=True) is flag


def test_map_location_mappings_are_rewritten_key_by_key():
    mapping = {"cuda:0": "cuda:1", "cpu": "cpu", "/data/cuda": "x"}
    assert is_cuda_spec(mapping)
    assert to_npu_spec(mapping) == {"npu:0": "npu:1", "cpu": "cpu", "/data/cuda": "x"}
    unrelated = {"cpu": "cpu"}
    assert to_npu_spec(unrelated) is unrelated


@pytest.mark.parametrize("value", [None, 1.0, b"cuda", ["cuda"], ("cuda",), object()])
def test_other_values_are_left_alone(value):
    assert not is_cuda_spec(value, ints=True)
    assert to_npu_spec(value, ints=True) is value


@given(st.text(max_size=12))
def test_a_string_is_rewritten_exactly_when_torch_parses_it_as_a_cuda_device(text):
    try:
        parsed = torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        parsed = None
    torch_says_cuda = parsed is not None and parsed.type == "cuda" and text.strip() == text
    assert is_cuda_spec(text) == torch_says_cuda
    if torch_says_cuda:
        assert torch.device(to_npu_spec(text)) == torch.device("npu", parsed.index)
    else:
        assert to_npu_spec(text) is text


@given(st.integers(min_value=0, max_value=127))  # torch keeps device indexes in an int8
def test_indexes_survive_the_round_trip(index):
    for spec in (f"cuda:{index}", torch.device("cuda", index)):
        assert torch.device(to_npu_spec(spec)) == torch.device("npu", index)
