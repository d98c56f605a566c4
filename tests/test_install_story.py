"""The install story of README.md and docs/install.md, run as a user runs it, in fresh venvs.

* From a clone: one pip command installs the core and the plugins wanted
  (``pip install . ./plugins/torch_npu_ops ./plugins/mmcv_npu``), with build isolation,
  as on a user's machine.
* From an index: the wheels of every distribution in a folder that pip uses as its
  index (``--find-links``); ``pip install ascend-patch-mmcv`` pulls a compatible core.
* What the wheels carry: licence metadata, a long description per distribution without
  relative links (they break on an index page), the start hook once (at the wheel root,
  not again inside the package), and normal file modes.
"""

from __future__ import annotations

import email
import json
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest


pytestmark = [pytest.mark.venv, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DISTRIBUTIONS = {
    ".": "ascend-patch-core",
    "kits/training": "ascend-patch-training",
    "kits/emulator": "ascend-patch-emulator",
    "plugins/torch_npu_ops": "ascend-patch-torch",
    "plugins/mmcv_npu": "ascend-patch-mmcv",
    "plugins/transformers_npu": "ascend-patch-transformers",
}
PTH = "ascend_patch_core_start.pth"
# Markdown links and images whose target is neither absolute nor an in-page anchor.
RELATIVE_LINK = re.compile(
    r"\]\((?!https?://|mailto:|#)([^)\s]+)\)|^\[[^\]]+\]:\s*(?!https?://)(\S+)", re.M
)


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _sources(destination: Path) -> Path:
    """The files a clean clone has (tracked and new, not ignored), copied to destination."""
    listed = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO
    ).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            (destination / name).write_bytes(source.read_bytes())
    return destination


def _venv(root: Path) -> Path:
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    _run([base_python, "-m", "venv", str(root)])
    return root / "bin" / "python"


def _clean_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp / "cache")
    return env


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sources(tmp_path_factory.mktemp("clone"))


@pytest.fixture(scope="module")
def wheels(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every distribution built into one folder by pip, with build isolation."""
    folder = tmp_path_factory.mktemp("wheels")
    old_umask = os.umask(0o022)
    try:
        _run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder),
             *(str(clone / d) for d in DISTRIBUTIONS)],
            cwd=clone,
        )  # fmt: skip
    finally:
        os.umask(old_umask)
    return folder


def _wheel(folder: Path, distribution: str) -> Path:
    (found,) = folder.glob(distribution.replace("-", "_") + "-*.whl")
    return found


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


@pytest.mark.parametrize("directory", list(DISTRIBUTIONS))
def test_every_wheel_has_licence_a_description_without_relative_links_and_normal_modes(
    wheels: Path, directory: str
) -> None:
    """Licence expression and file, a long description of its own that works on an index page, 0644 files."""
    wheel = _wheel(wheels, DISTRIBUTIONS[directory])
    metadata = _metadata(wheel)

    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    description = metadata.get_payload()
    assert isinstance(description, str)
    assert description.startswith(f"# {DISTRIBUTIONS[directory]}\n"), description[:80]
    assert RELATIVE_LINK.findall(description) == []
    assert stat.S_IMODE(wheel.stat().st_mode) == 0o644
    with zipfile.ZipFile(wheel) as archive:
        modes = {i.filename: stat.S_IMODE(i.external_attr >> 16) for i in archive.infolist()}
        licence = [n for n in archive.namelist() if n.endswith("/licenses/LICENSE")]
    assert {m for m in modes.values() if m} <= {0o644}, modes
    assert len(licence) == 1


def test_the_start_hook_is_in_the_core_wheel_once_at_its_root(wheels: Path) -> None:
    """ascend_patch_core_start.pth at the root of the core wheel only; no plugin or kit ships one."""
    for directory, distribution in DISTRIBUTIONS.items():
        with zipfile.ZipFile(_wheel(wheels, distribution)) as archive:
            hooks = [n for n in archive.namelist() if n.endswith(".pth")]
        assert hooks == ([PTH] if directory == "." else []), (distribution, hooks)


def test_from_a_clone_one_command_installs_the_core_and_the_plugins(
    clone: Path, tmp_path: Path
) -> None:
    """README's clone command in a fresh venv: doctor finds both plugins; the hook is in site-packages once."""
    python = _venv(tmp_path / "venv")

    _run([str(python), "-m", "pip", "install", "--quiet", ".", "./plugins/torch_npu_ops",
          "./plugins/mmcv_npu"], cwd=clone)  # fmt: skip

    done = subprocess.run(
        [str(python), "-m", "ascend_patch_core._cli", "doctor", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(tmp_path), timeout=120,
    )  # fmt: skip
    report = json.loads(done.stdout)
    # Neither torch nor mmcv is in this venv: both plugins are found and listed, idle.
    assert {p["name"]: p["status"] for p in report["plugins"]} == {
        "torch": "idle",
        "mmcv": "idle",
    }
    hook = report["core"]["start_hook"]
    assert hook["installed"] and hook["current"], hook
    site = Path(hook["path"]).parent
    assert sorted(p.name for p in site.rglob(PTH)) == [PTH]
    assert stat.S_IMODE((site / "ascend_patch_core" / "__init__.py").stat().st_mode) & 0o044


def test_from_an_index_a_plugin_pulls_a_compatible_core(wheels: Path, tmp_path: Path) -> None:
    """`pip install ascend-patch-mmcv` with the wheels as index: the core comes with it, in range."""
    python = _venv(tmp_path / "venv")

    _run([str(python), "-m", "pip", "install", "--quiet", "--find-links", str(wheels),
          "ascend-patch-mmcv"])  # fmt: skip

    versions = _run(
        [str(python), "-c", "import importlib.metadata as m, json; print(json.dumps("
         "{d: m.version(d) for d in ('ascend-patch-core', 'ascend-patch-mmcv')}))"],
    )  # fmt: skip
    assert json.loads(versions.stdout) == {
        "ascend-patch-core": "0.1.0",
        "ascend-patch-mmcv": "0.1.0",
    }
    requires = _run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; print(m.requires('ascend-patch-mmcv'))",
        ]
    ).stdout
    assert "ascend-patch-core<0.2,>=0.1" in requires
