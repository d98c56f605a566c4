"""`ascend-patch run --check-precision` turns on the precision check in the run and its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_run_check_precision_reports_the_setting(tmp_path: Path) -> None:
    """The flag reaches the patched process: the run report holds the precision_check setting."""
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('ran', sys.argv[1:])\n")
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ascend_patch_core._cli",
            "run",
            "--check-precision",
            "--report",
            str(report),
            str(script),
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "ran ['x']" in result.stdout
    data = json.loads(report.read_text())
    assert data["options"]["check_precision"] is True
    records = data["processes"][0]["report"]["records"]
    assert any(r["kind"] == "setting" and r["name"] == "precision_check" for r in records)
