"""``print(report)``: the caller's own patches first, the plugins' records summarised (issue 24).

With the three first-party plugins installed and no torch_npu, a user who added one
patch and printed the report got ~90 lines, their patch last. The short table now
lists their records, then what failed (always in full), then one line per plugin;
``table(verbose=True)`` still lists everything.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def write_plugin(site: Path, dist: str, entry_point: str, modules: dict[str, str]) -> None:
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[ascend_patch]\n{entry_point}\n")
    for name, source in modules.items():
        (site / name).write_text(textwrap.dedent(source))


def clean_env(tmp_path: Path, site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env["PYTHONPATH"] = str(site)
    return env


_SUMMARY = re.compile(
    r"^ascend-patch: (?P<counts>.*?)(?: \((?P<hidden>\d+) plugin records? not listed.*\))?$"
)
_ROW = re.compile(r"^  (applied|pending|skipped|failed|reverted) +\S")


def assert_adds_up(table: str) -> None:
    """The first line's counts are the rows listed plus the records it says are not listed."""
    lines = table.splitlines()
    found = _SUMMARY.match(lines[0])
    assert found, lines[0]
    total = sum(int(part.split(" ")[0]) for part in found["counts"].split(", "))
    rows = [line for line in lines[1:] if _ROW.match(line)]
    assert total == len(rows) + int(found["hidden"] or 0), table


FAILING_PLUGIN = {
    "apx_failing_plugin.py": """
        from ascend_patch_core import AtomicPatch, hookimpl


        def boom():
            raise ValueError("boom-in-precheck")


        @hookimpl
        def register_patches():
            return [
                AtomicPatch("apx_failing_target.f", lambda: "new", precheck=boom),
                AtomicPatch("apx_failing_target.g", lambda: "new"),
            ]
        """,
    "apx_failing_target.py": """
        def f():
            return "original"


        def g():
            return "original"
        """,
}

USER_PROGRAM = """
    import sys

    import apx_failing_target  # imported first: the plugin's patches apply (or fail) at once
    import ascend_patch_core
    from ascend_patch_core import AtomicPatch

    sys.modules["apx_user_target"] = type(sys)("apx_user_target")
    sys.modules["apx_user_target"].h = lambda: "original"
    ascend_patch_core.default_patcher.add(AtomicPatch("apx_user_target.h", lambda: "mine"))
    report = ascend_patch_core.apply()
    print(report)
    print("-----")
    print(report.table(verbose=True))
    """


@pytest.mark.torch  # the torch plugin is idle without torch: fewer plugin records to summarise
def test_print_report_leads_with_the_users_patch_and_summarises_plugins(tmp_path: Path) -> None:
    """print(report) lists the user's patch on line 2, a plugin's failure in full, one line per plugin for the rest."""
    site = tmp_path / "site"
    site.mkdir()
    write_plugin(site, "apx-failing", "apx_failing = apx_failing_plugin", FAILING_PLUGIN)
    program = tmp_path / "prog.py"
    program.write_text(textwrap.dedent(USER_PROGRAM))

    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=clean_env(tmp_path, site),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    short, full = done.stdout.split("-----\n")
    lines = short.splitlines()
    assert lines[1].split() == ["applied", "patch", "apx_user_target.h"], short
    failed = [line for line in lines if line.split()[:1] == ["failed"]]
    assert len(failed) == 1 and "apx_failing_target.f" in failed[0], short
    assert "[apx_failing]" in failed[0] and "boom-in-precheck" in failed[0]
    plugins = lines[lines.index("  plugins:") + 1 :]
    by_name = {line.split()[0]: line for line in plugins}
    # The probe's healthy patch is counted in its line; the first-party plugins too.
    assert by_name["apx_failing"].split(None, 1)[1] == "loaded, 1 applied", short
    assert {"torch", "mmcv", "transformers"} <= set(by_name), short
    assert "apx_failing_target.g" not in short
    assert len(lines) <= 12, short  # was ~90 lines with the first-party plugins
    assert_adds_up(short)
    # The full listing stays: every record, the user's patch among them.
    assert_adds_up(full)
    assert "apx_failing_target.g" in full and "apx_user_target.h" in full
    assert len(full.splitlines()) > len(lines)
