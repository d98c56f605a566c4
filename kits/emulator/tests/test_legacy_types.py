"""The emulated torch.npu's legacy tensor and storage types (torch.npu.FloatTensor & co.)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from typing import Union

import ascend_patch_emulator as emulator
import pytest
import torch


# torch_npu 2.13's torch.npu.__all__: every *Tensor / *Storage, with the dtype torch_npu gives it.
DTYPES = {
    "Bool": torch.bool,
    "Byte": torch.uint8,
    "Char": torch.int8,
    "Short": torch.int16,
    "Int": torch.int32,
    "Long": torch.int64,
    "Half": torch.float16,
    "Float": torch.float32,
    "Double": torch.float64,
    "BFloat16": torch.bfloat16,
}


@pytest.mark.parametrize("prefix", DTYPES)
def test_tensor_type_constructs_like_torchs_legacy_constructor(npu_emulator, prefix):
    npu_type = getattr(torch.npu, f"{prefix}Tensor")
    cpu_type = getattr(torch, f"{prefix}Tensor")
    dtype = DTYPES[prefix]
    assert npu_type.dtype == dtype
    assert npu_type.layout == torch.strided
    assert npu_type.is_npu is True and npu_type.is_sparse is False
    assert repr(npu_type) == f"<class 'torch.npu.{prefix}Tensor'>"
    # From sizes, from nested lists, empty: what torch's legacy constructor gives.
    assert npu_type(2, 3).shape == (2, 3) and npu_type(2, 3).dtype == dtype
    data = [[1, 0, 1], [0, 1, 1]]
    torch.testing.assert_close(npu_type(data), cpu_type(data))
    assert npu_type().shape == (0,)
    # device= picks an emulated device; a tensor of the type passes through.
    made = npu_type([1, 1], device="npu:0")
    assert made.is_npu and made.dtype == dtype
    assert npu_type(made).data_ptr() == made.data_ptr()


@pytest.mark.parametrize("prefix", DTYPES)
def test_isinstance_matches_dtype_only(npu_emulator, prefix):
    npu_type = getattr(torch.npu, f"{prefix}Tensor")
    tensor = torch.zeros(2, dtype=DTYPES[prefix], device="npu")
    assert isinstance(tensor, npu_type)
    assert isinstance(torch.nn.Parameter(tensor, requires_grad=False), npu_type)
    others = [p for p in DTYPES if p != prefix]
    assert not any(isinstance(tensor, getattr(torch.npu, f"{p}Tensor")) for p in others)
    assert not isinstance(tensor.to_sparse(), npu_type)
    assert not isinstance([tensor], npu_type)
    assert not issubclass(torch.Tensor, npu_type)


def test_types_cannot_be_subclassed_and_carry_tensor_methods(npu_emulator):
    with pytest.raises(TypeError, match="not an acceptable base type"):

        class Sub(torch.npu.FloatTensor):
            pass

    assert torch.npu.FloatTensor.add is torch.Tensor.add


def test_device_checks_like_an_npu(npu_emulator):
    with pytest.raises(RuntimeError, match="invalid NPU device ordinal 3"):
        torch.npu.FloatTensor(2, device="npu:3")
    with pytest.raises(ValueError, match="expected an NPU device"):
        torch.npu.FloatTensor(2, device="cuda:0")


def test_tensor_type_converts_to_npu_types_by_object_and_name(npu_emulator):
    x = torch.arange(4, dtype=torch.float32)
    assert x.type(torch.npu.HalfTensor).dtype == torch.float16
    assert x.type("torch.npu.LongTensor").dtype == torch.int64
    assert x.type("torch_npu.npu.DoubleTensor").dtype == torch.float64
    torch.testing.assert_close(x.type(torch.npu.LongTensor), x.long())
    # Everything else is torch's own Tensor.type.
    assert x.type() == "torch.FloatTensor"
    assert x.type(torch.float64).dtype == torch.float64
    assert x.type("torch.IntTensor").dtype == torch.int32


@pytest.mark.parametrize("prefix", DTYPES)
def test_storage_types(npu_emulator, prefix):
    storage_type = getattr(torch.npu, f"{prefix}Storage")
    dtype = DTYPES[prefix]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TypedStorage deprecation warning
        assert storage_type.dtype == dtype
        sized = storage_type(5)
        assert len(sized) == 5 and sized.dtype == dtype
        assert isinstance(sized, storage_type)
        assert not isinstance(torch.zeros(1, dtype=torch.int8).storage(), torch.npu.ShortStorage)
        assert storage_type([1, 0, 1]).tolist() == torch.tensor([1, 0, 1], dtype=dtype).tolist()
        wrapped = storage_type(wrap_storage=torch.zeros(3, dtype=dtype).untyped_storage())
        assert len(wrapped) == 3
    assert storage_type in torch._storage_classes
    assert storage_type.__module__ == "torch.npu"


def test_mmengine_union_of_types_and_isinstance(npu_emulator):
    # mmengine 0.10.7 structures/instance_data.py at import, when the NPU is available.
    bool_type = Union[torch.BoolTensor, torch.npu.BoolTensor]  # noqa: UP007 (mmengine's spelling)
    long_type = Union[torch.LongTensor, torch.npu.LongTensor]  # noqa: UP007
    mask = torch.tensor([True, False], device="npu")
    index = torch.tensor([0, 1], device="npu")
    assert isinstance(mask, bool_type.__args__) and isinstance(index, long_type.__args__)
    assert not isinstance(index, bool_type.__args__)


def test_deactivate_takes_the_types_and_the_patch_back():
    handle = emulator.activate()
    storage_types = [getattr(torch.npu, f"{p}Storage") for p in DTYPES]
    patched_type = torch.Tensor.type
    handle.deactivate()
    assert not any(cls in torch._storage_classes for cls in storage_types)
    assert torch.Tensor.type is not patched_type
    assert "type" not in torch.Tensor.__dict__
    assert torch.zeros(1).type() == "torch.FloatTensor"
    with pytest.raises(AttributeError, match="not active"):
        torch.npu.FloatTensor  # noqa: B018


def test_legacy_types_under_the_cli(tmp_path):
    script = tmp_path / "types.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from typing import Union
            BoolTypeTensor = Union[torch.BoolTensor, torch.npu.BoolTensor]
            mask = torch.npu.BoolTensor([1, 0, 1])
            print(torch.npu.is_available(), mask.dtype, isinstance(mask, torch.npu.BoolTensor))
            """
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "ascend_patch_core._cli", "run", "--emulate-npu", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "torch.bool", "True"]
