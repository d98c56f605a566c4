"""Acceptance in a fresh virtual environment: the core installed by pip from a regular (non-editable)
wheel, the three first-party plugins, a broken throwaway plugin distribution and a probe plugin.

* ``ascend-patch doctor`` finds all five plugins, explains the broken one and exits 1;
* the wheel put the start hook into site-packages, so ``ascend-patch run`` patches spawned
  children there too; ``pip uninstall`` removes the hook again;
* neither kit is installed there (the documented minimal install), and what needs one says
  exactly what to install: ``run --emulate-npu`` names ``ascend-patch-core[emulator]``, the
  training settings name ``ascend-patch-core[training]``; no pytest plugin is registered, and
  doctor finds nothing wrong with the kits' absence.

(The editable install's start hook is what the rest of the suite runs with: nox installs the
project with ``pip install -e``; tests/test_cli_run.py checks it.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


pytestmark = [pytest.mark.venv, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
FIRST_PARTY = {
    "torch": "ascend-patch-torch",
    "mmcv": "ascend-patch-mmcv",
    "transformers": "ascend-patch-transformers",
}

PROJECTS = {
    "apx-broken": {
        "pyproject.toml": """
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "apx-broken"
            version = "0.0.1"

            [project.entry-points.ascend_patch]
            apx_broken = "apx_broken_plugin"

            [tool.setuptools]
            py-modules = ["apx_broken_plugin"]
            """,
        "apx_broken_plugin.py": """
            from ascend_patch_core import hookimpl


            @hookimpl
            def register_patchez():  # a typo: an unknown hook makes the plugin fail as a whole
                return []
            """,
    },
    "apx-probe": {
        "pyproject.toml": """
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "apx-probe"
            version = "1.0.0"

            [project.entry-points.ascend_patch]
            apx_probe = "apx_probe_plugin"

            [tool.setuptools]
            py-modules = ["apx_probe_plugin", "apx_probe_target"]
            """,
        "apx_probe_plugin.py": """
            from ascend_patch_core import AtomicPatch, hookimpl


            def where():
                return "patched"


            @hookimpl
            def register_patches():
                return [AtomicPatch("apx_probe_target.where", "apx_probe_plugin:where")]
            """,
        "apx_probe_target.py": """
            def where():
                return "original"
            """,
    },
}

SPAWN_PROBE = """
import json, multiprocessing as mp
import apx_probe_target


def child(queue):
    queue.put(apx_probe_target.where())


if __name__ == "__main__":
    mp.set_start_method("spawn")
    queue = mp.Queue()
    workers = [mp.Process(target=child, args=(queue,)) for _ in range(2)]
    for w in workers:
        w.start()
    answers = sorted(queue.get(timeout=60) for _ in workers)
    for w in workers:
        w.join()
    print(json.dumps({"main": apx_probe_target.where(), "children": answers}))
"""


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _invoke(cwd: Path, *cmd: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """Run a command of the venv from ``cwd`` with a clean environment; its result, any exit code."""
    return subprocess.run(
        list(cmd), capture_output=True, text=True, cwd=cwd, env=_env(cwd), timeout=timeout
    )


def _env(tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ASCEND_PATCH_", "PYTHON", "VIRTUAL_ENV"))
    }
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp / "cache")
    return env


class Venv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = root / "venv" / "bin" / "python"
        self.cli = root / "venv" / "bin" / "ascend-patch"
        self.site_packages = Path(
            _run(
                [
                    str(self.python),
                    "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                ]
            ).stdout.strip()
        )


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    root = tmp_path_factory.mktemp("cli-venv")
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    _run([base_python, "-m", "venv", str(root / "venv")])
    env = Venv(root)
    pip = [str(env.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "-r", str(REPO / "requirements" / "venv-tests.txt")])

    # Build the core's wheel from a copy, so the build leaves nothing in the working tree.
    source = root / "core-src"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".*",
            "__pycache__",
            "*.egg-info",
            "build",
            "dist",
            "plugins",
            "tests",
            "benchmarks",
            "examples",
        ),
    )
    _run(
        [
            str(env.python),
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            str(source),
        ],
        cwd=root,
    )
    wheels = sorted(root.glob("ascend_patch_core-*.whl"))
    assert len(wheels) == 1, wheels

    for name, files in PROJECTS.items():
        directory = root / name
        directory.mkdir()
        for filename, text in files.items():
            (directory / filename).write_text(textwrap.dedent(text))
    plugins = [
        arg
        for d in ("torch_npu_ops", "mmcv_npu", "transformers_npu")
        for arg in ("-e", str(REPO / "plugins" / d))
    ]
    _run(
        [
            *pip,
            "--no-build-isolation",
            "--no-deps",
            str(wheels[0]),
            *plugins,
            *(str(root / n) for n in PROJECTS),
        ],
        cwd=root,
    )
    yield env


def test_doctor_finds_the_three_plugins_and_the_broken_one(venv: Venv, tmp_path: Path) -> None:
    """doctor --json in the venv: three first-party plugins, the probe plugin, the broken plugin with its reason; exit 1."""
    done = _invoke(tmp_path, str(venv.cli), "doctor", "--json")

    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    plugins = {p["name"]: p for p in result["plugins"]}
    assert sorted(plugins) == sorted([*FIRST_PARTY, "apx_broken", "apx_probe"])
    for name, distribution in FIRST_PARTY.items():
        plugin = plugins[name]
        # None of their libraries (torch, mmcv, transformers) is in this venv: listed, idle.
        assert plugin["status"] == "idle", plugin
        assert plugin["distribution"].replace("_", "-").lower() == distribution
        assert plugin["entry_point"].startswith(f"{name} = ")
    probe = plugins["apx_probe"]
    assert (probe["status"], probe["version"]) == ("loaded", "1.0.0")
    assert Path(probe["file"]).parent == venv.site_packages  # a real (non-editable) install
    assert [p["target"] for p in probe["patches"]] == ["apx_probe_target.where"]
    assert probe["patches"][0]["library_installed"] is True
    broken = plugins["apx_broken"]
    assert broken["status"] == "broken"
    assert broken["distribution"] == "apx-broken" and broken["version"] == "0.0.1"
    assert (
        "implements unknown hook 'register_patchez'; did you mean 'register_patches'?"
        in broken["reason"]
    )
    # No torch in this environment: the first-party plugins' torch patches cannot apply.
    errors = [f["code"] for f in result["findings"] if f["level"] == "error"]
    assert sorted(errors) == ["plugin-broken", "torch-missing"]
    hook = result["core"]["start_hook"]
    assert hook == {
        "installed": True,
        "path": str(venv.site_packages / "ascend_patch_core_start.pth"),
        "current": True,
    }
    assert result["core"]["path"] == str(venv.site_packages / "ascend_patch_core")

    text = _invoke(tmp_path, str(venv.cli), "doctor")
    assert text.returncode == 1
    assert "BROKEN  apx_broken" in text.stdout


def test_run_patches_spawned_children_through_the_wheel_installed_hook(
    venv: Venv, tmp_path: Path
) -> None:
    """ascend-patch run in the venv: main process and two spawn children run the probe plugin's patch."""
    (tmp_path / "probe.py").write_text(SPAWN_PROBE)

    done = _invoke(
        tmp_path, str(venv.cli), "run", "--disable", "apx_broken", "probe.py", timeout=300
    )

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"main": "patched", "children": ["patched", "patched"]}


KIT_PROBE = """
import importlib.metadata as md, importlib.util, json
from ascend_patch_core import Patcher, PatchDefinitionError

calls = {
    "brake_at": lambda p: p.brake_at(3),
    "with_profiling": lambda p: p.with_profiling("out"),
    "with_precision_check": lambda p: p.with_precision_check(),
}
raised = {}
for name, call in calls.items():
    try:
        call(Patcher())
    except Exception as exc:
        raised[name] = [type(exc).__name__, isinstance(exc, PatchDefinitionError), str(exc)]
    else:
        raised[name] = None
print(json.dumps({
    "kits_found": [n for n in ("ascend_patch_emulator", "ascend_patch_training")
                   if importlib.util.find_spec(n) is not None],
    "pytest11": [f"{ep.name} = {ep.value}" for ep in md.entry_points(group="pytest11")],
    "raised": raised,
}))
"""


def test_run_emulate_npu_without_the_emulator_names_the_extra_and_runs_nothing(
    venv: Venv, tmp_path: Path
) -> None:
    """Without the emulator kit, run --emulate-npu stops before the program with exit 2 and names ascend-patch-core[emulator]."""
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\nprint('ran')\n")

    done = _invoke(
        tmp_path, str(venv.cli), "run", "--disable", "apx_broken", "--emulate-npu", "prog.py"
    )

    assert not (tmp_path / "ran").exists() and done.stdout == ""
    assert done.returncode == 2, done.stderr  # a start error is reported like a usage error
    assert done.stderr.startswith("ascend-patch run: "), done.stderr
    assert "pip install 'ascend-patch-core[emulator]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_the_kits_training_settings_name_the_extra_and_no_pytest_plugin_is_registered(
    venv: Venv, tmp_path: Path
) -> None:
    """Without the training kit, brake_at/with_profiling/with_precision_check raise PatchDefinitionError naming what to install; no pytest11 plugin."""
    done = _invoke(tmp_path, str(venv.python), "-c", KIT_PROBE)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["kits_found"] == []  # the premise: this is the minimal install
    for method, raised in result["raised"].items():
        assert raised is not None, f"Patcher().{method}() raised nothing"
        kind, is_definition_error, message = raised
        assert is_definition_error, f"Patcher().{method}() raised {kind}: {message}"
        assert "ascend-patch-training" in message, (method, message)
        assert "pip install 'ascend-patch-core[training]'" in message, (method, message)
        assert f"Patcher.{method}()" in message, (method, message)
    assert not [ep for ep in result["pytest11"] if "ascend_patch" in ep.partition(" = ")[2]], result


def test_doctor_without_the_kits_finds_nothing_wrong_with_their_absence(
    venv: Venv, tmp_path: Path
) -> None:
    """doctor --json without either kit: no error or warning about the kits, the emulator's absence
    a note at most. (The one error is torch's absence from this environment, not the kits'.)"""
    done = _invoke(tmp_path, str(venv.cli), "doctor", "--json", "--disable", "apx_broken")

    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert (result["core"]["emulator"], result["core"]["training"]) == (None, None)
    assert result["core"]["emulator_entry_point"] is False
    findings = result["findings"]
    assert [f["code"] for f in findings if f["level"] == "error"] == ["torch-missing"]
    about_kits = [
        f
        for f in findings
        if any(word in f["message"].lower() for word in ("emulator", "training", "kit"))
    ]
    assert [f for f in about_kits if f["level"] != "note"] == [], findings


def test_uninstall_removes_the_start_hook(venv: Venv) -> None:
    """The .pth is in the wheel's RECORD, so pip uninstall removes it (runs last: it breaks the venv's core)."""
    hook = venv.site_packages / "ascend_patch_core_start.pth"
    assert hook.exists()

    _run([str(venv.python), "-m", "pip", "uninstall", "--yes", "--quiet", "ascend-patch-core"])

    assert not hook.exists()
    assert not (venv.site_packages / "ascend_patch_core").exists()
