"""torch internals that pick an accelerator or check Tensor.to by identity, on the (emulated) NPU."""

from __future__ import annotations

import torch


def test_available_device_type_is_the_npu(redirect, calls):
    from torch._utils import _get_available_device_type

    assert torch.cuda.is_available()  # the redirect says so, which torch asks first
    assert _get_available_device_type() == "npu"
    assert calls("torch._utils._get_available_device_type")[0] >= 1


def test_overlapping_cpu_loader_uses_the_npu(redirect):
    from torch.distributed.checkpoint.filesystem import _OverlappingCpuLoader

    loader = _OverlappingCpuLoader(lambda item: torch.ones(2))
    assert loader.device_type == "npu"
    assert loader.device_module is torch.npu
    assert loader.stream is torch.npu.current_stream()


def test_lazy_modules_move_to_cuda_and_initialize(redirect):
    model = torch.nn.LazyLinear(3)
    model.to("cuda")  # the wrapped Tensor.to must pass the uninitialized-parameter check
    out = model(torch.ones(2, 4, device="cuda"))
    assert out.shape == (2, 3)
    assert model.weight.shape == (3, 4) and model.weight.is_npu


def test_lazy_modules_still_refuse_other_methods(redirect):
    import pytest

    with pytest.raises(ValueError, match="uninitialized parameter"):
        torch.nn.LazyLinear(3).weight.sum()


def test_extension_include_paths_for_cuda_name_no_cuda_toolkit(redirect, calls):
    from torch.utils import cpp_extension

    assert cpp_extension.include_paths("cuda") == cpp_extension.include_paths("cpu")
    assert cpp_extension.include_paths(device_type="cuda") == cpp_extension.include_paths()
    assert calls("torch.utils.cpp_extension.include_paths") == (2, 2)
