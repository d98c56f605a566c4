"""The emulator's ops take the keyword names torch_npu registers: ``input``, never the yaml's ``self``.

torch_npu's code generator renames every ``self`` argument of its custom ops to
``input`` before registering them, so on an NPU ``torch_npu.fast_gelu(input=x)``
binds and ``fast_gelu(self=x)`` fails. Checked for every op overload of the
emulated version that takes an ``input``, through the op object and through the
``torch_npu`` attribute, and through the reference kernels that compute the result.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from ascend_patch_emulator import DEFAULT_VERSION
from ascend_patch_emulator import CallRecorder
from ascend_patch_emulator import load_schemas
from schema_values import schema_value


def _taking_input(version: str) -> list[str]:
    return sorted(
        qualified
        for qualified, op in load_schemas(version).items()
        if "input" in [a.name for a in op.arguments]
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One case per op overload of the version this run emulates (--torch-npu-version):
    every case runs, none skips for an op another version has."""
    if "qualified" in metafunc.fixturenames:
        from ascend_patch_emulator._activate import resolve_version

        config = metafunc.config
        chosen = config.getoption("--torch-npu-version") or config.getini(
            "ascend_patch_torch_npu_version"
        )
        metafunc.parametrize("qualified", _taking_input(resolve_version(chosen or None)))


def _required_keywords(op) -> dict[str, object]:
    """Every argument without a default, by keyword, with a dummy value of its type."""
    return {a.name: schema_value(a.type) for a in op.arguments if a.default is None}


def _bound(call) -> bool:
    """Whether ``call()`` bound to the schema (the recorder saw it; the kernel's result is moot)."""
    with CallRecorder() as recorder, contextlib.suppress(Exception):
        call()
    return bool(recorder.calls)


def test_every_op_with_a_self_in_the_yaml_is_covered():
    taking_input = [
        q
        for q, op in load_schemas(DEFAULT_VERSION).items()
        if "input" in [a.name for a in op.arguments]
    ]
    # 2.13: 131 overloads renamed from the yaml's `self`, 60 that name an `input` of their own.
    assert len(taking_input) == 191
    assert taking_input == _taking_input(DEFAULT_VERSION)


def test_input_binds_and_self_fails(emulated, qualified):
    op = load_schemas(emulated.version)[qualified]
    overload = getattr(getattr(torch.ops.npu, op.name), op.overload or "default")
    kwargs = _required_keywords(op)
    kwargs.setdefault(
        "input", schema_value(next(a.type for a in op.arguments if a.name == "input"))
    )
    assert _bound(lambda: overload(**kwargs)), op.schema

    as_self = {("self" if name == "input" else name): value for name, value in kwargs.items()}
    with CallRecorder() as recorder, pytest.raises(RuntimeError, match=r"'self'|'input'"):
        overload(**as_self)
    assert not recorder.calls, op.schema


def test_through_torch_npu_and_the_reference_kernels(emulated):
    """The public attributes take ``input=`` and compute what the positional call computes."""
    import torch_npu

    x, gamma = torch.randn(2, 8), torch.rand(8) + 0.5
    torch.testing.assert_close(torch_npu.fast_gelu(input=x), torch_npu.fast_gelu(x))
    by_keyword = torch_npu.npu_rms_norm(input=x, gamma=gamma, epsilon=1e-5)
    by_position = torch_npu.npu_rms_norm(x, gamma, 1e-5)
    for got, want in zip(by_keyword, by_position, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        torch_npu.npu_swiglu(input=torch.ones(2, 4), dim=-1), torch_npu.npu_swiglu(torch.ones(2, 4))
    )
    # torch names the missing `input` first, as it does on an NPU.
    with pytest.raises(RuntimeError, match=r"missing value for argument 'input'"):
        torch_npu.npu_rms_norm(self=x, gamma=gamma)
    with pytest.raises(RuntimeError, match=r"missing value for argument 'input'"):
        torch_npu.npu_swiglu(self=torch.ones(2, 4))
    # With `input` given too, the extra `self` is an unknown keyword.
    with pytest.raises(RuntimeError, match=r"Unknown keyword argument 'self'"):
        torch_npu.npu_rms_norm(input=x, gamma=gamma, self=x)


def test_an_in_place_op_takes_input_and_writes_it(emulated):
    import torch_npu

    if "npu_scatter_nd_update_" not in load_schemas(emulated.version):
        pytest.skip("no npu_scatter_nd_update_ in this version")
    target = torch.zeros(4, 2)
    returned = torch_npu.npu_scatter_nd_update_(
        input=target, indices=torch.tensor([[1], [3]]), updates=torch.ones(2, 2)
    )
    assert returned.data_ptr() == target.data_ptr()
    torch.testing.assert_close(target, torch.tensor([[0.0, 0], [1, 1], [0, 0], [1, 1]]))


def test_autograd_reaches_a_kernel_called_with_input(emulated):
    """The backward of a differentiable op called by ``input=`` gives the positional call's gradient."""
    import torch_npu

    x = torch.randn(3, 8, requires_grad=True)
    torch_npu.fast_gelu(input=x).sum().backward()
    by_keyword = x.grad.clone()
    x.grad = None
    torch_npu.fast_gelu(x).sum().backward()
    torch.testing.assert_close(by_keyword, x.grad)


def test_an_overload_with_several_outs_takes_one_out_list(emulated):
    """torch_npu registers ``npu_apply_adam.out(..., *, Tensor(a!) var, Tensor(b!) m, ...)`` as
    ``(..., *, Tensor[] out)``: ``out=[...]`` binds, the yaml's names do not."""
    op = load_schemas(emulated.version)["npu_apply_adam.out"]
    overload = torch.ops.npu.npu_apply_adam.out
    scalars = [1.0] * 6
    given = [*scalars, torch.zeros(2), None, None]
    outs = [torch.zeros(2) for _ in range(3)]
    assert _bound(lambda: overload(*given, out=outs)), op.schema
    with pytest.raises(RuntimeError, match=r"npu::npu_apply_adam"):
        overload(*given, var=outs[0], m=outs[1], v=outs[2])
    with CallRecorder() as recorder, contextlib.suppress(RuntimeError):
        overload(*given, var=outs[0], m=outs[1], v=outs[2])
    assert not recorder.calls
