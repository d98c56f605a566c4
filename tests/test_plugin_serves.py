"""Plugins that name the libraries they serve (entry-point group ``ascend_patch.serves``).

A plugin none of whose served libraries is installed is idle: ``apply()`` does not
import it, its record says why, doctor lists it as ``idle``. Each test runs the way a
user meets it: a program calling ``apply()``, or the ``ascend-patch`` command, in a
subprocess whose ``sys.path`` holds distributions written as dist-info directories
(what ``importlib.metadata`` and the core's metadata cache read; no pip).
"""

from __future__ import annotations

import compileall
import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest


CLI = Path(sys.executable).parent / "ascend-patch"
_counter = itertools.count()

#: A plugin module that leaves a trace when it is imported, and patches nothing.
PLUGIN = """
from ascend_patch_core import hookimpl

@hookimpl
def register_patches():
    return []
"""

#: apply() in a fresh process: each plugin's record, which plugin modules got imported,
#: and whether the metadata cache was read from disk.
PROBE = """
import json, sys
import ascend_patch_core
from ascend_patch_core._discovery.metadata import metadata
report = ascend_patch_core.apply()
print(json.dumps({
    "plugins": {r.name: [r.status.value, r.reason] for r in report.records if r.kind == "plugin"},
    "imported": sorted(m for m in sys.modules if m.startswith("apx_serves_")),
    "hit": metadata.hit,
}))
"""


def _unique(stem: str) -> str:
    return f"{stem}{os.getpid()}_{next(_counter)}"


def _library(stem: str = "apx-absent-lib-") -> str:
    """A distribution name as the core writes it (normalized: dashes only)."""
    return _unique(stem).replace("_", "-")


def _dist_info(site: Path, name: str, version: str = "1.0", entry_points: str = "") -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("")
    if entry_points:
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def _plugin(site: Path, serves: list[str] | None, *, value: str | None = None) -> tuple[str, str]:
    """A plugin distribution serving ``serves`` (None: it declares nothing); (entry point, module)."""
    module = _unique("apx_serves_mod")
    ep = _unique("apx_serves_ep")
    (site / f"{module}.py").write_text(PLUGIN)
    text = f"[ascend_patch]\n{ep} = {module}\n"
    if serves is not None:
        text += "[ascend_patch.serves]\n" + "".join(
            f"{library} = {value or module}\n" for library in serves
        )
    _dist_info(site, _unique("apx-serves-dist-"), entry_points=text)
    return ep, module


@pytest.fixture
def site(tmp_path: Path) -> Path:
    directory = tmp_path / "site"
    directory.mkdir()
    return directory


def _env(tmp_path: Path, site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    env.update(PYTHONPATH=str(site), ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


def _apply(tmp_path: Path, site: Path, code: str = PROBE, **extra: str) -> dict[str, Any]:
    compileall.compile_dir(str(site), quiet=1)  # as pip does: no __pycache__ written later
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=_env(tmp_path, site, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_plugin_whose_libraries_are_absent_is_not_imported(tmp_path: Path, site: Path) -> None:
    library = _library()
    ep, module = _plugin(site, [library])

    cold = _apply(tmp_path, site)
    warm = _apply(tmp_path, site)

    assert cold["hit"] is False and warm["hit"] is True  # the served rows validate as cached
    for result in (cold, warm):
        assert result["plugins"][ep] == [
            "skipped",
            f"none of the libraries it serves is installed ({library})",
        ]
        assert module not in result["imported"]


def test_installing_a_served_library_wakes_the_plugin(tmp_path: Path, site: Path) -> None:
    library = _library("apx-lib-")
    other = _library()
    ep, module = _plugin(site, [other, library])
    assert _apply(tmp_path, site)["plugins"][ep][0] == "skipped"

    _dist_info(site, library, "2.0")  # installed after the cache was written
    result = _apply(tmp_path, site)

    assert result["plugins"][ep][0] == "applied"
    assert module in result["imported"]


def test_a_plugin_that_declares_nothing_is_always_imported(tmp_path: Path, site: Path) -> None:
    ep, module = _plugin(site, None)
    result = _apply(tmp_path, site)
    assert result["plugins"][ep][0] == "applied"
    assert module in result["imported"]


def test_naming_an_idle_plugin_in_ascend_patch_plugins_loads_it(tmp_path: Path, site: Path) -> None:
    """The way out where a library runs from a source tree, without installed metadata."""
    ep, module = _plugin(site, [_library()])
    result = _apply(tmp_path, site, ASCEND_PATCH_PLUGINS=ep)
    assert result["plugins"][ep][0] == "applied"
    assert module in result["imported"]


def test_a_disabled_idle_plugin_is_reported_as_disabled(tmp_path: Path, site: Path) -> None:
    ep, _ = _plugin(site, [_library()])
    result = _apply(tmp_path, site, ASCEND_PATCH_DISABLE=ep)
    assert result["plugins"][ep] == ["skipped", "disabled by ASCEND_PATCH_DISABLE"]


def test_a_served_row_naming_no_plugin_is_a_warning(tmp_path: Path, site: Path) -> None:
    ep, _ = _plugin(site, [_library()], value="apx_serves_wrong:plugin")
    done = subprocess.run(
        [str(CLI), "doctor", "--json"],
        cwd=tmp_path,
        env=_env(tmp_path, site),
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(done.stdout)
    plugin = next(p for p in result["plugins"] if p["name"] == ep)
    assert plugin["status"] == "loaded"  # the row is ignored: the plugin declares nothing
    messages = [f["message"] for f in result["findings"] if f["level"] == "warning"]
    assert any("apx_serves_wrong:plugin" in m and "no plugin" in m for m in messages)


def test_doctor_lists_an_idle_plugin_and_says_why(tmp_path: Path, site: Path) -> None:
    library = _library()
    ep, _ = _plugin(site, [library])
    env = _env(tmp_path, site, NO_COLOR="1")
    done = subprocess.run(
        [str(CLI), "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    result = json.loads(done.stdout)
    plugin = next(p for p in result["plugins"] if p["name"] == ep)
    assert plugin["status"] == "idle"
    assert plugin["reason"] == f"none of the libraries it serves is installed ({library})"
    text = subprocess.run(
        [str(CLI), "doctor"], env=env, capture_output=True, text=True, timeout=120
    ).stdout
    row = next(line for line in text.splitlines() if f" {ep} " in line)
    assert row.split()[0] == "idle" and library in row


def test_first_party_plugins_of_absent_libraries_stay_unimported(
    tmp_path: Path, site: Path
) -> None:
    """The benchmark's case: torch installed, neither mmcv nor transformers."""
    pytest.importorskip("torch")
    for library in ("mmcv", "mmcv-lite", "mmcv-full", "mmdet", "transformers", "torch-npu"):
        if (
            subprocess.run(
                [sys.executable, "-c", f"import importlib.metadata as m; m.version({library!r})"],
                capture_output=True,
            ).returncode
            == 0
        ):
            pytest.skip(f"{library} is installed here")
    code = PROBE.replace(
        '"hit": metadata.hit,',
        '"hit": metadata.hit, "first": sorted(m for m in sys.modules if m in '
        '("ascend_patch_mmcv", "ascend_patch_transformers", "ascend_patch_torch")),',
    )
    result = _apply(tmp_path, site, code)
    assert result["plugins"]["torch"][0] == "applied"
    for name, libraries in (
        ("mmcv", "mmcv, mmcv-full, mmcv-lite, mmdet, mmdet3d, mmengine"),
        ("transformers", "accelerate, diffusers, torch-npu, transformers"),
    ):
        assert result["plugins"][name] == [
            "skipped",
            f"none of the libraries it serves is installed ({libraries})",
        ]
    assert result["first"] == ["ascend_patch_torch"]


def test_the_emulators_torch_npu_wakes_the_transformers_plugin(tmp_path: Path, site: Path) -> None:
    """Installed as requirements see it: the emulator announces the torch-npu it stands in for."""
    pytest.importorskip("torch")
    pytest.importorskip("ascend_patch_emulator")
    code = "import ascend_patch_emulator\nascend_patch_emulator.activate()\n" + PROBE
    result = _apply(tmp_path, site, code)
    assert result["plugins"]["transformers"][0] == "applied"
    assert result["plugins"]["mmcv"][0] == "skipped"


def test_scan_still_reads_code_with_the_plugins_of_absent_libraries(
    tmp_path: Path, site: Path
) -> None:
    """scan says what code would need wherever it runs: an idle plugin's patches count."""
    ep, _ = _plugin(site, [_library()])
    program = tmp_path / "prog.py"
    program.write_text("import torch\n")
    done = subprocess.run(
        [str(CLI), "scan", "--json", str(program)],
        env=_env(tmp_path, site),
        capture_output=True,
        text=True,
        timeout=120,
    )
    plugins = {p["name"]: p["status"] for p in json.loads(done.stdout)["plugins"]}
    assert plugins[ep] == "loaded"


def _run_program(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """Run ``source`` as a program with the installed plugins, no ASCEND_PATCH_* switch set."""
    program = tmp_path / "program.py"
    program.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


def test_enable_by_api_loads_an_idle_plugin_holding_the_group(tmp_path: Path) -> None:
    """Patcher.enable("CollectionsCompat") where mmcv is absent: the mmcv plugin, idle
    otherwise, is loaded and its opt-in group serves old code (as ASCEND_PATCH_ENABLE does)."""
    done = _run_program(
        tmp_path,
        "import ascend_patch_core\n"
        "patcher = ascend_patch_core.Patcher(autoload=True).enable('CollectionsCompat')\n"
        "patcher.apply()\n"
        "from collections import Iterable\n"
        "print('old code ran', Iterable)\n",
    )
    assert "old code ran" in done.stdout


def test_print_info_before_apply_plans_the_idle_plugin_that_enable_names(tmp_path: Path) -> None:
    """print_info() before apply() plans as apply() would: with enable("CollectionsCompat")
    where mmcv is absent, the mmcv plugin's opt-in group is listed (it was left out: only
    ASCEND_PATCH_ENABLE loaded idle plugins there)."""
    done = _run_program(
        tmp_path,
        "import ascend_patch_core\n"
        "ascend_patch_core.Patcher(autoload=True).enable('CollectionsCompat').print_info()\n",
    )
    assert "collections:Iterable" in done.stdout
