"""The README's main demo keeps working (it is what a new user runs first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.torch
def test_main_demo_runs_and_reaches_the_reference_losses() -> None:
    """examples/demo.py exits 0; the emulated run of the CUDA loop matches the CPU reference."""
    demo = Path(__file__).resolve().parent.parent / "examples" / "demo.py"
    done = subprocess.run([sys.executable, str(demo)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RMSNorm.forward is the project's own again." in done.stdout
    assert "same losses: True" in done.stdout
    assert "torch.Tensor.cuda" in done.stdout  # a redirect was counted
