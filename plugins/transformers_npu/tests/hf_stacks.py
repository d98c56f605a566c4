"""Which Hugging Face stack a test module needs, and whether its absence is a skip or a failure.

Each nox session installs one stack and names it in ``ASCEND_PATCH_TEST_REQUIRE``
(comma-separated): there a missing stack fails instead of skipping. Names:
``transformers``, ``diffusers``, ``accelerate``, ``peft``, ``trl``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


__all__ = ["CLI", "require_module", "required", "run_emulated", "transformers_version"]


def required(name: str) -> bool:
    """Whether this session promises ``name`` (a missing one is then a failure)."""
    return name in os.environ.get("ASCEND_PATCH_TEST_REQUIRE", "").split(",")


def require_module(module: str) -> Any:
    """Import ``module``; skip the test module without it, unless the session requires it."""
    if required(module):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def transformers_version() -> tuple[int, ...]:
    """The installed transformers version as numbers (``(0,)`` when absent)."""
    try:
        text = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return (0,)
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


_SCRIPT = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
#: The command line of this environment's ``ascend-patch``.
CLI = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "ascend_patch_core._cli"]


def run_emulated(directory: Path, script: str, program: str, *options: str) -> dict[str, dict]:
    """Run ``program`` as ``directory/script`` the way a user does (``ascend-patch run
    --emulate-npu <options>``); return the report's records by name (one process)."""
    (directory / script).write_text(program)
    report = directory / "report.json"
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop("ASCEND_PATCH_ENABLE", None)
    done = subprocess.run(
        [*CLI, "run", "--emulate-npu", *options, "--report", str(report), str(directory / script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=directory,
    )
    assert done.returncode == 0, done.stderr
    (process,) = json.loads(report.read_text())["processes"]
    return {r["name"]: r for r in process["report"]["records"]}
