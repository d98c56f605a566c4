"""The plugin module stays light, its declarations are valid, and its torch_npu calls bind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ascend_patch_core import Patch


def test_loading_the_plugin_and_calling_its_hooks_imports_no_target_library():
    code = (
        "import sys\n"
        "from ascend_patch_torch import plugin\n"
        "plugin.register_patches(); plugin.register_import_rules()\n"
        "heavy = [m for m in ('torch', 'numpy', 'torch_npu', 'torch_scatter') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr


def test_every_group_declares_valid_patches_without_side_effects():
    from ascend_patch_torch import plugin

    groups = plugin.register_patches()  # which are opt-in: test_opt_in.py
    names = set()
    for group in groups:
        assert issubclass(group, Patch)
        for patch in group.patches():
            assert patch.name not in names, f"two patches named {patch.name}"
            names.add(patch.name)
    assert len(names) > 200


def test_torch_npu_calls_match_the_op_schemas_of_every_supported_version():
    from ascend_patch_emulator import check_plugin
    from ascend_patch_emulator import format_mismatches

    root = Path(__file__).resolve().parents[1] / "ascend_patch_torch"
    result = check_plugin(root)
    assert not result.mismatches, format_mismatches(result.mismatches)
