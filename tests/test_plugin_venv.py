"""Acceptance: in a fresh virtual environment with the core, the three first-party plugins and
a third-party plugin distribution installed by pip, ``ascend_patch_core.apply()`` discovers
them all, applies the third-party patch with its provenance, and obeys every switch.

The venv is built once per module from the base interpreter (isolated from the test
environment): pip installs requirements/venv-tests.txt (the core's dependencies and the
build backends) from the configured index, then the repository's projects in editable
mode and the third-party plugin as a regular (built) install.
"""

from __future__ import annotations

import json
import os
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
EP = "apx_thirdparty"
DIST = "apx-thirdparty"
VERSION = "0.4.2"

_THIRD_PARTY = {
    "pyproject.toml": f"""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{DIST}"
        version = "{VERSION}"
        dependencies = ["ascend-patch-core"]

        [project.entry-points.ascend_patch]
        {EP} = "apx_thirdparty_plugin"

        [tool.setuptools]
        py-modules = ["apx_thirdparty_plugin", "apx_thirdparty_target"]
        """,
    "apx_thirdparty_plugin.py": """
        from ascend_patch_core import AtomicPatch, hookimpl


        def greet(name):
            return f"patched hello {name}"


        @hookimpl
        def register_patches():
            return [AtomicPatch("apx_thirdparty_target.greet", greet)]
        """,
    "apx_thirdparty_target.py": """
        def greet(name):
            return f"hello {name}"
        """,
}

#: How a plugin none of whose served libraries is installed is reported.
IDLE = "none of the libraries it serves is installed"

_PROBE = """
import json, sys
import ascend_patch_core

report = ascend_patch_core.apply(**json.loads(sys.argv[1]))
plugin_imported = "apx_thirdparty_plugin" in sys.modules
import apx_thirdparty_target

patches = {r.name: r for r in report.records if r.kind == "patch"}
print(json.dumps({
    "prefix": sys.prefix,
    "core": ascend_patch_core.__file__,
    "plugins": {
        r.name: {"status": r.status.value, "reason": r.reason, "provenance": r.provenance.as_dict()}
        for r in report.records if r.kind == "plugin"
    },
    "patch": None if "apx_thirdparty_target.greet" not in patches else {
        "status": patches["apx_thirdparty_target.greet"].status.value,
        "provenance": patches["apx_thirdparty_target.greet"].provenance.as_dict(),
    },
    "plugin_imported": plugin_imported,
    "result": apx_thirdparty_target.greet("npu"),
    "warnings": report.warnings,
}))
"""


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A throwaway venv with the core, the first-party plugins and a third-party plugin installed."""
    root = tmp_path_factory.mktemp("plugin-venv")
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    _run([base_python, "-m", "venv", str(root / "venv")])
    python = root / "venv" / "bin" / "python"

    third_party = root / "apx-thirdparty-src"
    third_party.mkdir()
    for name, text in _THIRD_PARTY.items():
        (third_party / name).write_text(textwrap.dedent(text))

    pip = [str(python), "-m", "pip", "install", "--quiet"]
    _run([*pip, "-r", str(REPO / "requirements" / "venv-tests.txt")])
    editables = [
        arg
        for project in ("", "plugins/torch_npu_ops", "plugins/mmcv_npu", "plugins/transformers_npu")
        for arg in ("-e", str(REPO / project))
    ]
    _run([*pip, "--no-build-isolation", "--no-deps", *editables, str(third_party)], cwd=root)
    yield python


def probe(
    python: Path, tmp_path: Path, env: dict[str, str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Run apply() in a fresh process of the venv; return what it reported and what the patched code did."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    clean["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    clean.update(env or {})
    done = _run([str(python), "-c", _PROBE, json.dumps(kwargs)], cwd=tmp_path, env=clean)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_apply_discovers_first_and_third_party_plugins_and_applies_with_provenance(
    venv: Path, tmp_path: Path
) -> None:
    """In a fresh venv apply() finds all four plugins and the third-party patch runs, reported with its dist."""
    result = probe(venv, tmp_path)

    assert Path(result["prefix"]) == venv.parent.parent
    assert Path(result["core"]).resolve().is_relative_to(REPO)
    plugins = result["plugins"]
    assert sorted(plugins) == sorted([*FIRST_PARTY, EP])
    for name, distribution in FIRST_PARTY.items():
        # None of their libraries is in this venv: found, with provenance, and left unimported.
        assert plugins[name]["status"] == "skipped", plugins[name]
        assert plugins[name]["reason"].startswith(IDLE), plugins[name]
        assert plugins[name]["provenance"]["distribution"].replace("_", "-").lower() == distribution
    third = plugins[EP]
    assert third["status"] == "applied", third
    assert third["provenance"]["distribution"].replace("_", "-").lower() == DIST
    assert third["provenance"]["version"] == VERSION
    assert third["provenance"]["entry_point"] == f"{EP} = apx_thirdparty_plugin"
    assert third["provenance"]["file"].endswith("apx_thirdparty_plugin.py")
    assert "site-packages" in third["provenance"]["file"]  # a real (non-editable) install
    assert result["result"] == "patched hello npu"
    assert result["patch"]["status"] == "applied"
    assert result["patch"]["provenance"] == third["provenance"]
    assert result["warnings"] == []

    again = probe(venv, tmp_path)  # warm metadata cache: same answer
    assert again["plugins"] == plugins and again["result"] == "patched hello npu"


@pytest.mark.parametrize(
    ("env", "kwargs"),
    [
        pytest.param({"ASCEND_PATCH_DISABLE": EP}, {}, id="env-disable-entry-point"),
        pytest.param({"ASCEND_PATCH_DISABLE": "Apx_ThirdParty"}, {}, id="env-disable-distribution"),
        pytest.param({"ASCEND_PATCH_DISABLE": "*"}, {}, id="env-disable-all"),
        pytest.param({"ASCEND_PATCH_PLUGINS": "torch"}, {}, id="env-allow-other"),
        pytest.param({"ASCEND_PATCH_AUTOLOAD": "0"}, {}, id="env-autoload-off"),
        pytest.param({}, {"disable": EP}, id="api-disable-entry-point"),
        pytest.param({}, {"disable": ["APX.thirdparty"]}, id="api-disable-distribution"),
        pytest.param({}, {"plugins": "torch"}, id="api-allow-other"),
        pytest.param({}, {"autoload": False}, id="api-autoload-off"),
    ],
)
def test_switches_keep_the_third_party_plugin_out(
    venv: Path, tmp_path: Path, env: dict[str, str], kwargs: dict[str, Any]
) -> None:
    """Each switch, by environment or API, keeps the third-party plugin unimported and its patch off."""
    result = probe(venv, tmp_path, env, **kwargs)

    assert result["result"] == "hello npu"
    assert result["patch"] is None
    assert result["plugin_imported"] is False
    assert result["warnings"] == []
    plugins = result["plugins"]
    autoload_off = env.get("ASCEND_PATCH_AUTOLOAD") == "0" or kwargs.get("autoload") is False
    if autoload_off:
        assert plugins == {}
        return
    assert plugins[EP]["status"] == "skipped"
    allow = env.get("ASCEND_PATCH_PLUGINS") or kwargs.get("plugins")
    everything_off = env.get("ASCEND_PATCH_DISABLE") == "*"
    for name in FIRST_PARTY:
        # Idle (no library of theirs in this venv) unless the allow-list names them.
        expected = "applied" if not everything_off and name == allow else "skipped"
        assert plugins[name]["status"] == expected, (name, plugins[name])


def test_autoload_off_still_loads_allow_listed_third_party_plugin(
    venv: Path, tmp_path: Path
) -> None:
    """ASCEND_PATCH_AUTOLOAD=0 with ASCEND_PATCH_PLUGINS naming the plugin loads just that plugin."""
    result = probe(venv, tmp_path, {"ASCEND_PATCH_AUTOLOAD": "0", "ASCEND_PATCH_PLUGINS": EP})

    assert result["plugins"][EP]["status"] == "applied"
    assert result["result"] == "patched hello npu"
    assert all(result["plugins"][name]["status"] == "skipped" for name in FIRST_PARTY)
