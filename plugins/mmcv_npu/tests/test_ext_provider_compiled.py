"""A compiled mmcv keeps its own ``mmcv._ext``: the plugin's rule steps aside and says so.

Runs where mmcv 2.1.0 has its compiled ops (nox -s openmmlab_cpu_ops), in subprocesses
(the program as users run it, and doctor).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mmcv_stacks import require_stack


require_stack("mmcv-ops")

BIN = Path(sys.executable).parent

PROGRAM = """
    import json
    import ascend_patch_core
    report = ascend_patch_core.apply()
    record = next(r for r in report.records if r.kind == "rule" and r.target == "mmcv._ext")
    import mmcv.ops
    import mmcv._ext as ext
    print(json.dumps({
        "file": ext.__file__,
        "status": record.status.value,
        "reason": record.reason,
        "served": hasattr(ext, "__ascend_patch_provider__"),
    }))
"""


def test_the_real_extension_is_imported(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM))
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["file"].endswith(".so") and not out["served"]
    assert out["status"] == "skipped"
    assert out["reason"] == f"the real mmcv._ext exists ({out['file']}): it is used"


def test_doctor_says_the_real_one_is_used() -> None:
    done = subprocess.run(
        [str(BIN / "ascend-patch"), "doctor", "--json"], capture_output=True, text=True, timeout=300
    )
    plugin = next(p for p in json.loads(done.stdout)["plugins"] if p["name"] == "mmcv")
    (rule,) = [r for r in plugin["rules"] if r["module"] == "mmcv._ext"]
    assert rule["in_use"] == "real"
    assert rule["real_origin"].endswith(".so")
