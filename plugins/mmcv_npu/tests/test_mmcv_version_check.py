"""MmcvVersionCheck: mmdet / mmdet3d import under an mmcv outside their asserted range,
and ``mmcv.__version__`` stays the real one for everybody.

Each case runs the user's way, in a fresh interpreter: ``apply()``, then ``import``.
The on-disk packages (mmcv 1.7.2 with an mmdet 2.x and an mmdet3d 1.0.0rc6 whose
``__init__`` has the real layout: ``import mmcv``, ``from .version import ...``, the
assertion) run in the plain tests session. The real mmdet 3.3.0 case runs in the nox
session ``openmmlab_emulated`` (ASCEND_PATCH_TEST_REQUIRE names openmmlab-emulated
there, and a missing mmdet fails); elsewhere it skips without mmdet.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


DIGIT_VERSION = """
def digit_version(version):
    return tuple(int(part) for part in version.split('rc')[0].split('.'))
"""

MMDET2_INIT = (
    "import mmcv\nfrom .version import __version__\n"
    + DIGIT_VERSION
    + """
mmcv_minimum_version = '1.3.17'
mmcv_maximum_version = '1.8.0'
mmcv_version = digit_version(mmcv.__version__)
assert (mmcv_version >= digit_version(mmcv_minimum_version)
        and mmcv_version < digit_version(mmcv_maximum_version)), \\
    f'MMCV=={mmcv.__version__} is used but incompatible.'
"""
)

MMDET3D_INIT = (
    "import mmcv\nimport mmdet\nfrom .version import __version__\n"
    + DIGIT_VERSION
    + """
mmcv_minimum_version = '1.5.2'
mmcv_maximum_version = '1.7.0'
mmcv_version = digit_version(mmcv.__version__)
assert (mmcv_version >= digit_version(mmcv_minimum_version)
        and mmcv_version < digit_version(mmcv_maximum_version)), \\
    f'MMCV=={mmcv.__version__} is used but incompatible.'
import os
assert not os.environ.get('FAKE_MMDET3D_FAILS'), 'a later check of the library fails'
"""
)


def write_distribution(root: Path, name: str, version: str, init: str) -> None:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text(init)
    (package / "version.py").write_text(f"__version__ = {version!r}\n")
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def mmcv1_stack(tmp_path: Path) -> Path:
    """mmcv 1.7.2 (the 1.x stack's) with an mmdet 2.x and an mmdet3d 1.0.0rc6 layout."""
    write_distribution(tmp_path, "mmcv", "1.7.2", "__version__ = '1.7.2'\n")
    write_distribution(tmp_path, "mmdet", "2.28.2", MMDET2_INIT)
    write_distribution(tmp_path, "mmdet3d", "1.0.0rc6", MMDET3D_INIT)
    return tmp_path


def run(
    code: str, *, path: Path | None = None, apply: bool, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    prelude = "import ascend_patch_core\nascend_patch_core.apply()\n" if apply else ""
    full_env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **(env or {})}
    if path is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(path), os.environ.get("PYTHONPATH")) if p
        )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


IMPORT_MMDET3D = """
import mmcv, mmdet, mmdet3d
assert mmcv.__version__ == '1.7.2', mmcv.__version__
assert mmdet.mmcv is mmcv and mmdet3d.mmcv is mmcv
print('imported', mmdet.__version__, mmdet3d.__version__, 'under mmcv', mmcv.__version__)
"""


def test_mmdet3d_rc_asserts_without_the_group(mmcv1_stack: Path) -> None:
    done = run(IMPORT_MMDET3D, path=mmcv1_stack, apply=False)
    assert "MMCV==1.7.2 is used but incompatible" in done.stderr


def test_mmdet_and_mmdet3d_import_and_mmcv_keeps_its_version(mmcv1_stack: Path) -> None:
    done = run(IMPORT_MMDET3D, path=mmcv1_stack, apply=True)
    assert done.returncode == 0, done.stderr
    assert "imported 2.28.2 1.0.0rc6 under mmcv 1.7.2" in done.stdout


def test_a_failed_import_leaves_no_view_behind(mmcv1_stack: Path) -> None:
    code = """
    import sys, mmcv
    try:
        import mmdet3d
    except AssertionError as exc:
        print('failed:', exc)
    assert 'mmdet3d' not in sys.modules and mmcv.__version__ == '1.7.2'
    assert sys.modules['mmdet'].mmcv is mmcv
    """
    done = run(code, path=mmcv1_stack, apply=True, env={"FAKE_MMDET3D_FAILS": "1"})
    assert done.returncode == 0, done.stderr
    assert "failed: a later check of the library fails" in done.stdout


def test_another_major_line_still_fails(tmp_path: Path) -> None:
    """mmdet 2.x under an mmcv 2.x: the shim keeps the major line, the assertion holds."""
    write_distribution(tmp_path, "mmcv", "2.1.0", "__version__ = '2.1.0'\n")
    write_distribution(tmp_path, "mmdet", "2.28.2", MMDET2_INIT)
    done = run("import mmdet", path=tmp_path, apply=True)
    assert "MMCV==2.1.0 is used but incompatible" in done.stderr


def test_real_mmdet3_imports_under_mmcv_2_2(tmp_path: Path) -> None:
    """mmdet 3.3.0 asserts mmcv < 2.2.0; the NPU stack's mmcv 2.2.0 is simulated by
    setting the installed mmcv's version before anything imports mmdet."""
    if importlib.util.find_spec("mmdet") is None:
        promised = os.environ.get("ASCEND_PATCH_TEST_REQUIRE", "").split(",")
        if "openmmlab-emulated" in promised or "mmdet" in promised:
            pytest.fail("mmdet is missing in a session that requires it")
        pytest.skip("needs mmdet (nox -s openmmlab_emulated)")
    code = """
    import mmcv
    mmcv.__version__ = '2.2.0'
    import mmdet
    assert mmcv.__version__ == '2.2.0' and mmdet.mmcv is mmcv
    print('mmdet', mmdet.__version__, 'under mmcv', mmcv.__version__)
    """
    assert "MMCV==2.2.0 is used but incompatible" in run(code, apply=False).stderr
    done = run(code, apply=True)
    assert done.returncode == 0, done.stderr
    assert "mmdet 3.3.0 under mmcv 2.2.0" in done.stdout
