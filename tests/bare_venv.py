"""A virtual environment built in a second, without pip: this environment's installs
linked in (tests/conftest.py puts this directory on sys.path)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path


__all__ = ["make_bare_venv"]


def make_bare_venv(root: Path, wanted: tuple[str, ...]) -> tuple[Path, Path]:
    """``(python, site-packages)`` of a new venv at ``root`` holding copies of this
    environment's ``.pth`` files and ``.dist-info`` directories whose names (leading
    underscores aside) start with one of ``wanted`` -- editable installs, so the code
    stays in the clone -- plus pluggy and packaging, linked from wherever this
    environment imports them (its own site-packages, or the shared base it is layered
    on: devenv.py, docs/dev.md). Nothing else: no torch, no pip.
    """
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name
        if name.lstrip("_").startswith(wanted) and name.endswith((".pth", ".dist-info")):
            if entry.is_dir():
                shutil.copytree(entry, site / name)
            else:
                shutil.copy(entry, site / name)
    for package in ("pluggy", "packaging"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None
        for entry in Path(spec.origin).parents[1].iterdir():
            if entry.name.split("-")[0] == package and not (site / entry.name).exists():
                os.symlink(entry, site / entry.name)
    return python, site
