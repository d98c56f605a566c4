"""Calls bind to torch.ops.npu exactly as the schema data of the emulated version dictates."""

from __future__ import annotations

import contextlib
import keyword

import pytest
import torch
from ascend_patch_emulator import CallRecorder
from ascend_patch_emulator import load_schemas
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from schema_values import schema_value


def test_every_op_of_the_version_has_its_exact_schema(emulated):
    schemas = load_schemas(emulated.version)
    assert schemas
    for qualified, op in schemas.items():
        packet = getattr(torch.ops.npu, op.name)
        real = getattr(packet, op.overload or "default")._schema
        declared = op.arguments
        assert [a.name for a in real.arguments] == [a.name for a in declared], qualified
        assert [a.kwarg_only for a in real.arguments] == [a.kwarg_only for a in declared]
        assert [a.has_default_value() for a in real.arguments] == [
            a.default is not None for a in declared
        ], qualified


def test_a_wrong_keyword_fails_exactly_as_on_the_npu(emulated):
    import torch_npu

    x, gamma = torch.randn(2, 8), torch.ones(8)
    with pytest.raises(RuntimeError) as caught:
        torch_npu.npu_rms_norm(x, gamma, eps=1e-5)
    assert str(caught.value).startswith(
        "Unknown keyword argument 'eps' for operator 'npu::npu_rms_norm'. Schema: "
        "npu::npu_rms_norm(Tensor input, Tensor gamma, float epsilon="
    )
    torch_npu.npu_rms_norm(x, gamma, epsilon=1e-5)  # the schema's own name binds
    # The yaml says `self`; torch_npu registers it as `input`, so `self=` fails.
    torch_npu.fast_gelu(input=x)
    with pytest.raises(
        RuntimeError, match=r"npu::fast_gelu\(\) is missing value for argument 'input'"
    ):
        torch_npu.fast_gelu(self=x)
    # Keyword-only arguments cannot be passed by position.
    with pytest.raises(RuntimeError, match="npu::npu_gelu"):
        torch_npu.npu_gelu(x, "tanh")
    assert torch.allclose(
        torch_npu.npu_gelu(x, approximate="tanh"), torch.nn.functional.gelu(x, approximate="tanh")
    )


_WRONG_NAMES = st.sampled_from(
    ["eps", "input", "x", "dim_", "inputs", "scale_value_"]
) | st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_binding_agrees_with_the_schema_data(emulated, data):
    """Random positional counts and keyword sets, right and wrong: bound iff the schema says so."""
    schemas = load_schemas(emulated.version)
    op = schemas[data.draw(st.sampled_from(sorted(schemas)), label="op")]
    arguments = op.arguments
    positional = [a for a in arguments if not a.kwarg_only]
    names = [a.name for a in arguments]
    count = data.draw(st.integers(0, len(positional) + 1), label="positional")
    complete = data.draw(st.booleans(), label="all required arguments given")
    by_position = {a.name for a in positional[:count]}
    chosen = [
        a.name
        for a in arguments
        if a.name not in by_position
        and ((complete and a.default is None) or data.draw(st.booleans(), label=a.name))
    ]
    if by_position and data.draw(st.integers(0, 4), label="duplicate") == 0:
        chosen.append(data.draw(st.sampled_from(sorted(by_position)), label="given twice"))
    wrong = data.draw(
        st.lists(
            _WRONG_NAMES.filter(lambda n: n not in names and not keyword.iskeyword(n)), max_size=1
        ),
        label="wrong keywords",
    )
    args = [schema_value(a.type) for a in positional[:count]]
    if count > len(positional):
        args.append(1)
    kwargs = {n: schema_value(next(a.type for a in arguments if a.name == n)) for n in chosen}
    kwargs.update({n: 1 for n in wrong})
    given_names = {a.name for a in positional[:count]} | set(chosen)
    expected = (
        count <= len(positional)
        and not wrong
        and not ({a.name for a in positional[:count]} & set(chosen))
        and all(a.default is not None or a.name in given_names for a in arguments)
    )
    overload = getattr(getattr(torch.ops.npu, op.name), op.overload or "default")
    # Whether the call bound is what the recorder saw; what the kernel made of dummy values is not.
    with CallRecorder() as recorder, contextlib.suppress(Exception):
        overload(*args, **kwargs)
    bound = any(call.op == op.name for call in recorder.calls)
    event(f"binds={expected}")
    assert bound == expected, (op.schema, args, kwargs)


def test_calls_reach_the_contract_recorder_with_their_site(emulated):
    import inspect
    import os

    import torch_npu

    with CallRecorder() as recorder:
        torch_npu.npu_swiglu(torch.ones(2, 4))
        line = inspect.currentframe().f_lineno - 1
        torch.ops.npu.npu_format_cast.Tensor(torch.ones(2), torch.ones(2))
    swiglu, cast = recorder.calls
    assert (swiglu.op, swiglu.overload, swiglu.file, swiglu.line) == (
        "npu_swiglu",
        None,
        os.path.abspath(__file__),
        line,
    )
    assert (cast.op, cast.overload, cast.positional) == ("npu_format_cast", "Tensor", 2)
