"""NumpyCompat: removed numpy aliases are back, with their old meaning, early enough for import time."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
from ascend_patch_torch.groups import NumpyCompat
from ascend_patch_torch.numpy_compat import ALIASES


@pytest.fixture
def compat(np, isolated_patcher):
    isolated_patcher.add(NumpyCompat).apply()
    return isolated_patcher


def test_builtin_aliases_mean_the_builtins(np, compat):
    assert np.int is int
    assert np.float is float
    assert np.complex is complex
    assert np.object is object
    assert np.str is str
    assert np.unicode is str
    assert np.array([1.5, 2.5]).astype(np.int).tolist() == [1, 2]
    assert np.zeros(2, dtype=np.float).dtype == np.float64


def test_numpy_2_removals_mean_the_numpy_names(np, compat):
    assert np.float_ is np.float64
    assert np.complex_ is np.complex128
    assert np.string_ is np.bytes_
    assert np.unicode_ is np.str_
    assert np.Inf == np.infty == np.PINF == math.inf
    assert -math.inf == np.NINF
    assert math.isnan(np.NaN)
    assert np.product([2, 3, 4]) == 24
    assert np.cumproduct([1, 2, 3]).tolist() == [1, 2, 6]
    assert np.sometrue([False, True]) and not np.alltrue([False, True])
    assert np.round_(1.26, 1) == pytest.approx(1.3)
    assert np.asfarray([1, 2]).dtype == np.float64
    assert np.asfarray([1, 2], dtype=np.float32).dtype == np.float32
    assert np.asfarray([1, 2], dtype=np.int32).dtype == np.float64
    assert np.msort(np.array([[3, 1], [1, 2]])).tolist() == [[1, 1], [3, 2]]
    assert np.in1d(np.array([[1, 2], [3, 4]]), [2, 3]).tolist() == [False, True, True, False]


def test_names_numpy_still_has_keep_numpy_s_meaning(np, compat):
    # numpy 2 defines np.bool (= np.bool_) and np.long (the C long) again.
    for name in ("bool", "long", "round", "prod"):
        if name in vars(np):
            record = compat.report.get(f"numpy.{name}") if name in ALIASES else None
            assert record is None or record.status.value == "skipped"
    if "bool" in vars(np):
        assert np.bool is np.bool_


def test_revert_removes_what_was_added(np, isolated_patcher):
    had = {name for name in ALIASES if name in vars(np)}
    isolated_patcher.add(NumpyCompat).apply()
    assert "float" in vars(np)
    isolated_patcher.revert()
    assert {name for name in ALIASES if name in vars(np)} == had


def test_library_code_using_aliases_at_import_time_works(np, tmp_path):
    """In a fresh process numpy is patched right after its __init__, before old code runs."""
    package = tmp_path / "oldlib"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            DTYPES = {"f": np.float, "i": np.int, "b": np.bool, "o": np.object}
            EPS = np.finfo(np.float_).eps
            """
        )
    )
    script = textwrap.dedent(
        """
        from ascend_patch_core import Patcher
        from ascend_patch_torch.groups import NumpyCompat

        Patcher(autoload=False, strict=True).add(NumpyCompat).apply()
        import oldlib  # imports numpy for the first time
        assert oldlib.DTYPES["f"] is float and oldlib.DTYPES["i"] is int
        print("ok", oldlib.EPS)
        """
    )
    assert _run(script, tmp_path).startswith("ok")


def test_planning_the_group_needs_no_version_logic(np, tmp_path):
    """Its requirement is a bare "numpy": checking it never imports packaging's specifiers.

    Every run that misses the metadata cache would pay that import (~10 ms) for every
    user of a recent numpy; the per-alias precheck already leaves old numpy alone.
    """
    script = textwrap.dedent(
        """
        import sys
        from ascend_patch_core import Patcher
        from ascend_patch_torch.groups import NumpyCompat

        report = Patcher(autoload=False).add(NumpyCompat).apply()
        assert "packaging.specifiers" not in sys.modules, "version logic was imported"
        print(report.get("numpy.float").status.value)
        """
    )
    # numpy is installed here and not imported yet: the alias waits for its import.
    assert _run(script, tmp_path, ASCEND_PATCH_CACHE="0").split() == ["pending"]


def _run(script: str, cwd, **env: str) -> str:
    """Run ``script`` in a fresh interpreter; its stdout (it must succeed)."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout
