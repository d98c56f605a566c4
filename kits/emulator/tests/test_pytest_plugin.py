"""The pytest plugin for patch authors: fixtures, the version option, and assert_parity."""

from __future__ import annotations

import pytest
import torch
from ascend_patch_emulator import is_active
from ascend_patch_emulator.pytest_plugin import assert_parity
from ascend_patch_emulator.pytest_plugin import tolerance_for


pytest_plugins = ["pytester"]


def test_fixtures_activate_the_emulator_and_revert_the_patcher(pytester, make_package):
    package = make_package({"__init__.py": "def greet():\n    return 'hello'\n"})
    pytester.makepyfile(
        f"""
        import importlib
        import pytest
        from ascend_patch_core import AtomicPatch

        def test_emulator(npu_emulator, emulated_torch_npu_version):
            import torch, torch_npu
            assert torch_npu.__version__ == npu_emulator.version == emulated_torch_npu_version
            assert torch.zeros(1, device="npu").is_npu

        def test_patcher(isolated_patcher):
            isolated_patcher.add(AtomicPatch("{package}.greet", target_wrapper=lambda f: lambda: "patched"))
            isolated_patcher.apply()
            assert importlib.import_module("{package}").greet() == "patched"

        def test_parity_fixture(assert_parity):
            assert_parity(abs, abs, -1.5)
            with pytest.raises(AssertionError):
                assert_parity(abs, lambda x: x, -1.5)
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert not is_active()
    import importlib

    assert importlib.import_module(package).greet() == "hello"


def test_version_option_is_validated(pytester, emulated_torch_npu_version):
    pytester.makepyfile(
        "def test_v(emulated_torch_npu_version):\n    print('V', emulated_torch_npu_version)\n"
    )
    ok = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-s", f"--torch-npu-version={emulated_torch_npu_version}"
    )
    ok.assert_outcomes(passed=1)
    ok.stdout.fnmatch_lines([f"*V {emulated_torch_npu_version}*"])
    bad = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--torch-npu-version=9.9.9")
    bad.assert_outcomes(errors=1)
    bad.stdout.fnmatch_lines(["*no torch_npu schema data for version '9.9.9'*"])


def test_a_fixture_does_not_deactivate_an_emulator_it_did_not_start(pytester, emulated):
    pytester.makepyfile("def test_inner(npu_emulator):\n    pass\n")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert emulated.active


# --------------------------------------------------------------------------- assert_parity


def test_parity_passes_for_equivalent_implementations():
    def original(x, w):
        return torch.nn.functional.silu(x @ w), (x * 2).sum()

    def replacement(x, w):
        y = x @ w
        return y * torch.sigmoid(y), x.sum() * 2

    assert_parity(original, replacement, torch.randn(3, 4), torch.randn(4, 5))


def test_parity_reports_where_outputs_differ():
    def off_by_one_element(x):
        y = x.clone()
        y[1, 2] += 0.5
        return y

    with pytest.raises(AssertionError) as caught:
        assert_parity(lambda x: x.clone(), off_by_one_element, torch.zeros(3, 4))
    message = str(caught.value)
    assert "off_by_one_element does not match" in message
    assert "output: 1 of 12 values outside rtol=1e-05, atol=1e-05 (torch.float32)" in message
    assert "max abs diff 0.5 at index (1, 2)" in message


def test_parity_compares_gradients():
    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, grad):
            return grad * 2  # should be 3

    with pytest.raises(AssertionError, match="gradient of input 0: 6 of 6 values outside"):
        assert_parity(lambda x: x * 3, WrongBackward.apply, torch.randn(2, 3))
    assert_parity(lambda x: x * 3, WrongBackward.apply, torch.randn(2, 3), grad=False)


def test_parity_tolerance_follows_the_dtype():
    def nudge(x):
        return x * (1 + 4e-3)

    assert_parity(lambda x: x * 1.0, nudge, torch.ones(8, dtype=torch.bfloat16))
    with pytest.raises(AssertionError, match="float32"):
        assert_parity(lambda x: x * 1.0, nudge, torch.ones(8))
    assert_parity(lambda x: x * 1.0, nudge, torch.ones(8), rtol=1e-2)
    assert tolerance_for(torch.float32, torch.bfloat16) == tolerance_for(torch.bfloat16)


def test_parity_checks_structure_dtype_and_integers_exactly():
    with pytest.raises(AssertionError, match="structure differs"):
        assert_parity(lambda x: (x, x), lambda x: [x, x], torch.ones(2))
    with pytest.raises(AssertionError, match=r"dtype torch\.float64 != original's torch\.float32"):
        assert_parity(lambda x: x, lambda x: x.double(), torch.ones(2))
    with pytest.raises(
        AssertionError,
        match=r"1 of 1 values differ \(exact comparison for torch.int64\); first at index \(0, 0\): 1 vs original 0",
    ):
        assert_parity(
            lambda x: x.argmax(-1, keepdim=True) * 0,
            lambda x: x.argmax(-1, keepdim=True) * 0 + 1,
            torch.ones(1, 3),
            grad=False,
        )
    with pytest.raises(AssertionError, match=r"output\[1\]: 3 != original's 2"):
        assert_parity(lambda x: (x, 2), lambda x: (x, 3), torch.ones(1))


def test_parity_gives_each_side_its_own_inputs():
    seen = []

    def mutating(x, counter, *, scale):
        counter.add_(1)  # shared inputs would make the second call see 2
        seen.append(x)
        return x * scale + counter

    inputs, counter = torch.arange(3.0), torch.zeros(3, dtype=torch.int64)
    assert_parity(mutating, mutating, inputs, counter, kwargs={"scale": torch.tensor(2.0)})
    assert torch.equal(counter, torch.zeros(3, dtype=torch.int64))
    assert seen[0] is not seen[1] and seen[0] is not inputs


def test_parity_seeds_random_ops_alike():
    def dropout(x):
        return torch.nn.functional.dropout(x, 0.5)

    assert_parity(dropout, dropout, torch.ones(64))
    with pytest.raises(AssertionError):
        assert_parity(dropout, dropout, torch.ones(64), seed=None)
