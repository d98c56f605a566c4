"""The pip commands ascend-patch gives, as a user meets them (issue 24, items 3 and 4).

* ``run --emulate-npu`` without the emulator kit names the command that works where the
  user is: the kit's directory in the clone the core was installed from (pip's
  ``direct_url.json``, PEP 610), else the index name; and torch's CPU index when torch
  is not installed yet (pip would take the 5 GB CUDA build).
* ``ascend-patch suggest`` and doctor name the plugin that serves an installed library
  (transformers here, ascend-patch-transformers not), with the same kind of command.
* ``python -m ascend_patch_core`` is the command; ``-V`` prints the version.

Each environment is a fresh virtual environment built in a second by copying in this
one's editable install of the core (its ``.pth`` and ``.dist-info``) and linking
pluggy and packaging, without pip: the plugins, kits and torch are absent unless a
test adds them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest
from bare_venv import make_bare_venv


REPO = Path(__file__).resolve().parent.parent
HERE = Path(sysconfig.get_paths()["purelib"])
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _fake_dist(site: Path, name: str, version: str, module: str | None = None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if module:
        (site / module).mkdir()
        (site / module / "__init__.py").write_text("")


def make_venv(root: Path, *, from_clone: bool, plugins: tuple[str, ...] = ()) -> Path:
    """A venv with the core (installed from the clone, or as if from an index) and ``plugins``."""
    python, site = make_bare_venv(root, ("ascend_patch_core", *plugins))
    (core_info,) = site.glob("ascend_patch_core-*.dist-info")
    direct_url = json.loads((core_info / "direct_url.json").read_text())
    assert direct_url["url"] == REPO.as_uri(), direct_url  # the premise: an editable clone
    if not from_clone:
        # What pip records for a distribution from an index: no direct_url.json.
        (core_info / "direct_url.json").unlink()
    return python


def run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(cwd / "cache")
    return subprocess.run(
        [str(python), "-m", "ascend_patch_core", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def program(tmp_path: Path) -> Path:
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")
    return tmp_path / "prog.py"


# ----------------------------------------------------------------------------- run --emulate-npu


def test_emulate_npu_from_a_clone_names_the_kit_directory_and_the_cpu_torch_index(
    tmp_path: Path, program: Path
) -> None:
    """Core installed from a clone, no emulator, no torch: the advice is pip install <clone>/kits/emulator after torch from the CPU index."""
    python = make_venv(tmp_path / "venv", from_clone=True)

    done = run(python, tmp_path, "run", "--emulate-npu", "prog.py")

    assert done.returncode == 2 and not (tmp_path / "ran").exists(), done.stderr
    assert f"pip install torch {CPU_INDEX}" in done.stderr, done.stderr
    assert f"then pip install {REPO / 'kits' / 'emulator'}" in done.stderr, done.stderr
    assert "ascend-patch-core[emulator]" not in done.stderr
    assert "Traceback" not in done.stderr


def test_emulate_npu_from_an_index_names_the_extra_and_no_cpu_index_when_torch_is_there(
    tmp_path: Path, program: Path
) -> None:
    """Core from an index, torch installed: pip install 'ascend-patch-core[emulator]', no torch step."""
    python = make_venv(tmp_path / "venv", from_clone=False)
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    _fake_dist(site, "torch", "2.6.0", module="torch")

    done = run(python, tmp_path, "run", "--emulate-npu", "prog.py")

    assert done.returncode == 2 and not (tmp_path / "ran").exists(), done.stderr
    assert done.stderr.rstrip().endswith("pip install 'ascend-patch-core[emulator]'"), done.stderr
    assert "index-url" not in done.stderr and str(REPO) not in done.stderr


# ----------------------------------------------------------------------------- suggest and doctor


def test_suggest_and_doctor_name_the_plugin_for_an_installed_library(tmp_path: Path) -> None:
    """transformers installed, ascend-patch-transformers not: suggest and doctor say so, with the clone's plugin directory."""
    python = make_venv(tmp_path / "venv", from_clone=True, plugins=("ascend_patch_torch",))
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    _fake_dist(site, "transformers", "4.57.1")
    _fake_dist(site, "accelerate", "1.10.0")
    _fake_dist(site, "torch", "2.6.0")
    command = f"pip install {REPO / 'plugins' / 'transformers_npu'}"

    text = run(python, tmp_path, "suggest")
    as_json = run(python, tmp_path, "suggest", "--json")
    doctor = run(python, tmp_path, "doctor", "--json")

    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    row = next(line for line in lines if "ascend-patch-transformers" in line)
    assert "transformers 4.57.1, accelerate 1.10.0" in row and "NOT installed" in row
    row = next(line for line in lines if "ascend-patch-torch" in line)
    assert "torch 2.6.0" in row and "installed (0.1.0)" in row
    assert lines[-1].strip() == command
    result = json.loads(as_json.stdout)
    assert result["schema"] == "ascend-patch-suggest/1"
    assert result["missing"] == ["ascend-patch-transformers"]
    assert result["command"] == command
    assert "ascend-patch-mmcv" not in as_json.stdout  # no OpenMMLab library installed
    notes = [f for f in json.loads(doctor.stdout)["findings"] if f["code"] == "plugin-suggested"]
    assert len(notes) == 1 and notes[0]["level"] == "note", notes
    assert "transformers 4.57.1, accelerate 1.10.0 are installed" in notes[0]["message"]
    assert notes[0]["message"].endswith(f"is not: {command}")


def test_suggest_from_an_index_gives_the_distribution_names(tmp_path: Path) -> None:
    """Core from an index: the command names the plugins as an index knows them."""
    python = make_venv(tmp_path / "venv", from_clone=False)
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    _fake_dist(site, "mmengine", "0.10.7")
    _fake_dist(site, "diffusers", "0.35.1")

    done = run(python, tmp_path, "suggest", "--json")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["command"] == "pip install ascend-patch-mmcv ascend-patch-transformers"


# ----------------------------------------------------------------------------- the command itself


def test_python_dash_m_and_capital_v(tmp_path: Path) -> None:
    """python -m ascend_patch_core is the command; -V prints the version, -VV the plugins one line each."""
    python = make_venv(tmp_path / "venv", from_clone=True, plugins=("ascend_patch_torch",))

    version = run(python, tmp_path, "-V")
    plugins = run(python, tmp_path, "-VV")
    usage = run(python, tmp_path, "--help")

    assert version.returncode == 0 and version.stdout.startswith("ascend-patch 0.1.0 ("), version
    assert len(version.stdout.splitlines()) == 1
    assert plugins.stdout.splitlines()[1:] == [
        "registered plugins:",
        "  torch: ascend-patch-torch 0.1.0 (ascend_patch_torch.plugin)",
    ]
    assert usage.returncode == 0 and "examples:\n  ascend-patch doctor" in usage.stdout
    assert "ascend-patch suggest" in usage.stdout
