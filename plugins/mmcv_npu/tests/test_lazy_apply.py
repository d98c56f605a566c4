"""apply() and doctor build every applicable group of the plugin and import no library.

Meaningful where the OpenMMLab stack is installed (every group's requirements hold, so
every ``patches()`` runs): the nox sessions ``openmmlab_cpu_ops``, ``openmmlab_emulated``
and ``openmmlab1_emulated``; elsewhere it checks the plugin's own imports only.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


HEAVY = ("torch", "numpy", "mmcv", "mmdet", "mmdet3d", "mmengine", "mx_driving", "torch_npu")

PROGRAMS = {
    "apply": "import ascend_patch_core; ascend_patch_core.apply()",
    "apply-with-opt-in": "import ascend_patch_core; ascend_patch_core.apply(enable='*')",
    "doctor": "from ascend_patch_core._cli.doctor import diagnose; diagnose()",
}


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_nothing_heavy_is_imported(program):
    code = PROGRAMS[program] + f"; import sys; print([m for m in {HEAVY!r} if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
