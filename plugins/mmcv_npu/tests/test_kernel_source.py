"""The kernel-source choice: mx_driving, else torch_npu, else portable; once; overridable."""

from __future__ import annotations

import sys
import types

import pytest
from ascend_patch_mmcv import _kernel_source

from ascend_patch_core import PatchDefinitionError


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    _kernel_source.forget_choices()
    yield
    _kernel_source.forget_choices()


def test_portable_when_neither_library_is_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "mx_driving", None)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    assert _kernel_source.choose("op") == _kernel_source.PORTABLE


def test_mx_driving_first_then_torch_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setitem(sys.modules, "mx_driving", None)
    assert _kernel_source.choose("a") == _kernel_source.TORCH_NPU
    monkeypatch.setitem(sys.modules, "mx_driving", types.ModuleType("mx_driving"))
    # Chosen once: the answer stays until forget_choices().
    assert _kernel_source.choose("a") == _kernel_source.TORCH_NPU
    _kernel_source.forget_choices()
    assert _kernel_source.choose("a") == _kernel_source.MX_DRIVING
    # An op without a torch_npu kernel skips that source.
    monkeypatch.setitem(sys.modules, "mx_driving", None)
    assert _kernel_source.choose("b", (_kernel_source.MX_DRIVING,)) == _kernel_source.PORTABLE


def test_the_variable_forces_a_source(monkeypatch):
    monkeypatch.setitem(sys.modules, "mx_driving", types.ModuleType("mx_driving"))
    monkeypatch.setenv(_kernel_source.VARIABLE, "portable, b=mx_driving")
    assert _kernel_source.choose("a") == _kernel_source.PORTABLE
    assert _kernel_source.choose("b") == _kernel_source.MX_DRIVING


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fast", "unknown kernel source 'fast'"),
        ("a=torch_npu", "which this op does not have"),
        ("a=mx_driving", "which is not available; available here: portable"),
    ],
)
def test_a_bad_override_names_the_op_and_the_choices(monkeypatch, value, message):
    monkeypatch.setitem(sys.modules, "mx_driving", None)
    monkeypatch.setenv(_kernel_source.VARIABLE, value)
    with pytest.raises(PatchDefinitionError, match=message):
        _kernel_source.choose("a", (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE))


def test_an_emulated_stand_in_is_no_mx_driving_kernel(monkeypatch):
    fake = types.ModuleType("mx_driving")

    def stand_in(*args):
        raise NotImplementedError

    stand_in.__ascend_patch_stand_in__ = True
    fake.sparse_op = stand_in
    fake.real_op = lambda *args: None
    monkeypatch.setitem(sys.modules, "mx_driving", fake)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    assert _kernel_source.choose("sparse_op") == _kernel_source.PORTABLE
    assert _kernel_source.choose("real_op") == _kernel_source.MX_DRIVING
    assert _kernel_source.choose("both", mx_names=("real_op", "sparse_op")) == "portable"
    monkeypatch.setenv(_kernel_source.VARIABLE, "other=mx_driving")
    with pytest.raises(PatchDefinitionError, match="is not available; available here: portable"):
        _kernel_source.choose("other", mx_names=("sparse_op",))
