"""``ascend-patch doctor``: the real CLI in a subprocess, against plugins, libraries, a torch_npu,
a CANN toolkit and an ``npu-smi`` laid out on disk for the test.

Distributions are "installed" as ``.dist-info`` directories on PYTHONPATH, which is
where importlib.metadata finds them. (tests/test_cli_venv.py repeats the main case
with distributions installed by pip into a fresh virtual environment.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest


BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"

DOC_PLUGIN = """
    from ascend_patch_core import AtomicPatch, EnvSetting, Patch, SkipImport, hookimpl


    def replacement(*args):
        return "patched"


    class DocGroup(Patch):
        requires = "apx-doc-lib>=2.0"

        @classmethod
        def patches(cls, options=None):
            return [AtomicPatch("apx_doc_lib.f", "apx_doc_plugin:replacement")]


    @hookimpl
    def configure_env():
        return [EnvSetting("APX_DOC_SETTING", "1", why="the test says so")]


    @hookimpl
    def register_import_rules():
        return [SkipImport("apx_cuda_only")]


    @hookimpl
    def register_patches():
        return [
            DocGroup,
            AtomicPatch("apx_doc_lib.g", "apx_doc_plugin:replacement"),
            AtomicPatch("apx_missing_lib.h", "apx_doc_plugin:replacement"),
        ]
    """

TWIN_PLUGIN = """
    from ascend_patch_core import AtomicPatch, hookimpl


    @hookimpl
    def register_patches():
        return [AtomicPatch("apx_doc_lib.g", "apx_doc_twin:other", name="TwinG")]
    """

BROKEN_PLUGIN = """
    import apx_nonexistent_dependency  # the distribution forgot a dependency
    """

# Importing the library leaves a mark: doctor must never do it.
DOC_LIB = """
    import os
    open(os.environ["APX_DOC_MARK"], "w").close()

    def f():
        return "original"

    def g():
        return "original"
    """

NPU_SMI = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 88.3        37                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3390 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Warning       | 90.1        38                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3390 / 65536         |
+===========================+===============+====================================================+
"""


#: Without torch (the core_pythons sessions) doctor reports that as one more error.
TORCH_MISSING = int(importlib.util.find_spec("torch") is None)


def write_dist(
    site: Path,
    dist: str,
    version: str,
    modules: dict[str, str] | None = None,
    entry_points: dict[str, dict[str, str]] | None = None,
) -> None:
    """A distribution as importlib.metadata sees one: a .dist-info directory (plus its modules) on sys.path."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    if entry_points:
        text = ""
        for group, items in entry_points.items():
            text += f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items())
        (info / "entry_points.txt").write_text(text)
    for name, source in (modules or {}).items():
        (site / name).write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    write_dist(
        root,
        "apx-doc",
        "1.2.0",
        {"apx_doc_plugin.py": DOC_PLUGIN},
        {"ascend_patch": {"apx_doc": "apx_doc_plugin"}},
    )
    write_dist(
        root,
        "apx-doc-twin",
        "0.3.0",
        {"apx_doc_twin.py": TWIN_PLUGIN},
        {"ascend_patch": {"apx_doc_twin": "apx_doc_twin"}},
    )
    write_dist(
        root,
        "apx-doc-broken",
        "0.0.1",
        {"apx_doc_broken.py": BROKEN_PLUGIN},
        {"ascend_patch": {"apx_doc_broken": "apx_doc_broken"}},
    )
    write_dist(root, "apx-doc-lib", "1.0", {"apx_doc_lib.py": DOC_LIB})
    return root


def clean_env(tmp_path: Path, site: Path, **extra: str) -> dict[str, str]:
    """No NPU-stack variables of the developer's shell leak in; npu-smi and CANN only where a test puts them."""
    prefixes = (
        "ASCEND_",
        "PYTHON",
        "HCCL_",
        "NCCL_",
        "CUDA_",
        "PYTORCH_",
        "TORCH_",
        "TASK_QUEUE",
        "LD_LIBRARY",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PATH"] = f"{BIN}{os.pathsep}/usr/bin{os.pathsep}/bin"
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(site)
    env["APX_DOC_MARK"] = str(tmp_path / "apx_doc_lib-was-imported")
    env.update(extra)
    return env


def doctor(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, Any]:
    cmd = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "ascend_patch_core._cli"]
    done = subprocess.run(
        [*cmd, "doctor", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert not done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout) if "--json" in args else done.stdout


def findings(result: dict[str, Any], code: str) -> list[str]:
    return [f["message"] for f in result["findings"] if f["code"] == code]


def test_plugins_declarations_and_problems(tmp_path: Path, site: Path) -> None:
    """doctor --json lists every plugin with provenance and declarations, finds the broken one, the collision and the typo; exit 1."""
    env = clean_env(tmp_path, site, ASCEND_PATCH_DISABLE="apx_dco", APX_DOC_SETTING="2")

    status, result = doctor(tmp_path, env, "--json")

    assert status == 1
    assert result["schema"] == "ascend-patch-doctor/1"
    assert result["ok"] is False
    plugins = {p["name"]: p for p in result["plugins"]}
    assert {"apx_doc", "apx_doc_twin", "apx_doc_broken", "torch", "mmcv", "transformers"} <= set(
        plugins
    )

    doc = plugins["apx_doc"]
    assert (doc["status"], doc["distribution"], doc["version"]) == ("loaded", "apx-doc", "1.2.0")
    assert doc["entry_point"] == "apx_doc = apx_doc_plugin"
    assert doc["file"] == str(site / "apx_doc_plugin.py")
    patches = {p["target"]: p for p in doc["patches"]}
    assert set(patches) == {"apx_doc_lib.f", "apx_doc_lib.g", "apx_missing_lib.h"}
    f = patches["apx_doc_lib.f"]
    assert f["group"] == "DocGroup"
    assert f["library"] == "apx_doc_lib" and f["library_installed"] is True
    assert f["requires"] == [
        {
            "requirement": "apx-doc-lib>=2.0",
            "satisfied": False,
            "detail": "apx-doc-lib 1.0 is installed; the patch requires apx-doc-lib>=2.0",
        }
    ]
    assert f["applicable"] is False
    assert patches["apx_doc_lib.g"]["applicable"] is True
    h = patches["apx_missing_lib.h"]
    assert (h["library_installed"], h["applicable"]) == (False, False)
    assert h["not_applicable_reason"] == "apx_missing_lib is not installed"
    assert doc["rules"] == [
        {
            "kind": "skip",
            "module": "apx_cuda_only",
            "description": "skip apx_cuda_only",
            "in_use": None,  # only rules that serve when the real module is missing say
            "real_origin": None,
        }
    ]
    assert doc["env"] == [
        {"name": "APX_DOC_SETTING", "value": "1", "why": "the test says so", "user_value": "2"}
    ]

    broken = plugins["apx_doc_broken"]
    assert broken["status"] == "broken"
    assert broken["distribution"] == "apx-doc-broken" and broken["version"] == "0.0.1"
    assert "No module named 'apx_nonexistent_dependency'" in broken["reason"]
    assert broken["patches"] == []

    assert findings(result, "plugin-broken") == [broken["reason"]]
    assert findings(result, "patch-collision") == [
        "'apx_doc_lib.g' (plugin 'apx_doc') and 'TwinG' (plugin 'apx_doc_twin') both patch apx_doc_lib.g; "
        "the last one applied wins (an error in strict mode)"
    ]
    assert findings(result, "unknown-name") == [
        "ASCEND_PATCH_DISABLE names 'apx_dco', which is not an installed plugin (did you mean 'apx_doc'?)"
    ]
    assert findings(result, "env-overridden") == [
        "plugin 'apx_doc' recommends APX_DOC_SETTING=1 (the test says so); you set APX_DOC_SETTING=2, which is kept"
    ]
    assert result["counts"]["error"] == 1 + TORCH_MISSING
    libraries = {lib["name"]: lib for lib in result["libraries"]}
    assert libraries["apx_doc_lib"] == {
        "name": "apx_doc_lib",
        "installed": True,
        "version": "1.0",  # the distribution apx-doc-lib, found by the import name
        "patches": 3,
        "applicable": 2,
    }
    assert libraries["apx_missing_lib"]["installed"] is False
    assert not (tmp_path / "apx_doc_lib-was-imported").exists(), "doctor imported a target library"


def test_the_text_report_is_concise_and_plain_when_not_a_tty(tmp_path: Path, site: Path) -> None:
    """The human report names broken plugins and problems, has no colour codes off a TTY; -v adds every patch."""
    env = clean_env(tmp_path, site)

    status, text = doctor(tmp_path, env)
    _, verbose = doctor(tmp_path, env, "-v")

    assert status == 1
    assert "\x1b[" not in text
    assert "BROKEN  apx_doc_broken" in text
    assert "plugin-broken" in text and "patch-collision" in text
    assert f"problems found: {1 + TORCH_MISSING} error" in text
    assert "apx_missing_lib.h" not in text  # patches only with -v
    assert "apx_missing_lib.h" in verbose and "apx_missing_lib is not installed" in verbose
    assert "requires apx-doc-lib>=2.0: apx-doc-lib 1.0 is installed" in verbose
    assert "skip apx_cuda_only" in verbose
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" in verbose and "(unset)" in verbose


def test_colour_only_when_forced_or_on_a_tty(tmp_path: Path, site: Path) -> None:
    """FORCE_COLOR turns colour on (as a TTY would); NO_COLOR wins over it."""
    _, coloured = doctor(tmp_path, clean_env(tmp_path, site, FORCE_COLOR="1"))
    _, plain = doctor(tmp_path, clean_env(tmp_path, site, FORCE_COLOR="1", NO_COLOR="1"))

    assert "\x1b[31;1mBROKEN\x1b[0m" in coloured
    assert "\x1b[" not in plain


def test_selection_and_strict(tmp_path: Path, site: Path) -> None:
    """--plugins leaves the others unselected (and the broken one unimported); warnings fail only with --strict."""
    env = clean_env(tmp_path, site, CUDA_VISIBLE_DEVICES="0,1")

    status, result = doctor(tmp_path, env, "--json", "--plugins", "apx_doc", "--disable", "DocGrop")
    strict_status, strict = doctor(tmp_path, env, "--json", "--plugins", "apx_doc", "--strict")

    plugins = {p["name"]: p["status"] for p in result["plugins"]}
    assert plugins["apx_doc"] == "loaded"
    assert plugins["apx_doc_broken"] == plugins["torch"] == "not selected"
    assert result["selection"]["plugins"] == ["apx_doc"]
    assert findings(result, "unknown-name") == [
        "--disable names 'DocGrop', which matches no plugin, group or patch (did you mean 'DocGroup'?)"
    ]
    assert findings(result, "visible-devices") == [
        "CUDA_VISIBLE_DEVICES=0,1 does not select NPUs; set ASCEND_RT_VISIBLE_DEVICES=0,1"
    ]
    assert (status, result["ok"]) == (0, True)
    assert (strict_status, strict["ok"]) == (1, False)


def _fake_stack(tmp_path: Path, site: Path, *, libs: bool) -> dict[str, str]:
    """torch_npu 2.12.0 (with torch's backend-autoload entry point), a CANN toolkit and npu-smi, on disk."""
    write_dist(
        site,
        "torch_npu",
        "2.12.0",
        entry_points={"torch.backends": {"torch_npu": "torch_npu:_autoload"}},
    )
    home = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
    (home / "x86_64-linux").mkdir(parents=True)
    (home / "x86_64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.0.RC3\narch=x86_64\n"
    )
    tools = tmp_path / "tools"
    tools.mkdir()
    smi = tools / "npu-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{NPU_SMI}EOF\n")
    smi.chmod(0o755)
    lib_dir = tmp_path / "lib64"
    lib_dir.mkdir()
    if libs:
        for name in ("libascendcl.so", "libhccl.so"):
            (lib_dir / name).write_text("")
    env = clean_env(tmp_path, site, ASCEND_TOOLKIT_HOME=str(home), LD_LIBRARY_PATH=str(lib_dir))
    env["PATH"] = f"{tools}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.torch
def test_the_npu_stack(tmp_path: Path, site: Path) -> None:
    """torch_npu/torch pairing, import prediction, torch's autoload trap, CANN version and npu-smi devices."""
    env = _fake_stack(tmp_path, site, libs=False)

    status, result = doctor(tmp_path, env, "--json", "--plugins", "apx_doc")

    stack = result["environment"]
    npu = stack["torch_npu"]
    assert npu["installed"] is True and npu["version"] == "2.12.0"
    assert (
        npu["expected_torch"] == "2.12.0" and npu["pairs_with_torch"] is False
    )  # torch 2.13.0 here
    assert npu["autoload_entry_point"] is True
    assert (npu["importable"], npu["import_check"]) == (False, "static")
    assert "libascendcl.so, libhccl.so not found on LD_LIBRARY_PATH" in npu["import_detail"]
    assert stack["cann"]["found"] is True
    assert stack["cann"]["version"] == "8.0.RC3"
    assert stack["cann"]["home"] == str(tmp_path / "Ascend" / "ascend-toolkit" / "latest")
    assert stack["npu"]["version"] == "24.1.0"
    assert stack["npu"]["devices"] == [
        {"id": 0, "name": "910B3", "health": "OK"},
        {"id": 1, "name": "910B3", "health": "Warning"},
    ]
    assert findings(result, "torch-npu-mismatch") == [
        f"torch_npu 2.12.0 pairs with torch 2.12.0, but torch {stack['torch']['version']} is installed: "
        "pip install torch==2.12.0 (or the torch_npu release for your torch)"
    ]
    assert len(findings(result, "torch-import-breaks")) == 1
    assert status == 1


def test_autoload_off_and_cann_libraries_clear_the_import_errors(
    tmp_path: Path, site: Path
) -> None:
    """With CANN's libraries on LD_LIBRARY_PATH torch_npu is predicted importable; AUTOLOAD=0 alone also defuses the trap."""
    with_libs = _fake_stack(tmp_path, site, libs=True)
    _, predicted = doctor(tmp_path, with_libs, "--json", "--plugins", "apx_doc")
    (tmp_path / "lib64" / "libhccl.so").unlink()
    autoload_off = dict(with_libs, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    _, defused = doctor(tmp_path, autoload_off, "--json", "--plugins", "apx_doc")

    assert predicted["environment"]["torch_npu"]["importable"] is True
    assert findings(predicted, "torch-import-breaks") == []
    assert defused["environment"]["torch_npu"]["importable"] is False
    assert findings(defused, "torch-import-breaks") == []


@pytest.mark.parametrize(
    ("variables", "code"),
    [
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "alloc-conf"),
        ({"NCCL_SOCKET_IFNAME": "eth0"}, "socket-ifname"),
        ({"TASK_QUEUE_ENABLE": "0"}, "task-queue"),
        ({"ASCEND_LAUNCH_BLOCKING": "1"}, "launch-blocking"),
        ({"ASCEND_GLOBAL_LOG_LEVEL": "0"}, "log-level"),
    ],
)
def test_variable_advice(tmp_path: Path, site: Path, variables: dict[str, str], code: str) -> None:
    """CUDA-era variables that do nothing on an NPU, and NPU settings that slow it, get advice; they show in the report."""
    env = clean_env(tmp_path, site, **variables)

    _, result = doctor(tmp_path, env, "--json", "--plugins", "apx_doc")

    assert len(findings(result, code)) == 1
    shown = {v["name"]: v["value"] for v in result["environment"]["variables"]}
    for name, value in variables.items():
        if name in shown:
            assert shown[name] == value


def test_cann_on_disk_without_its_environment(tmp_path: Path, site: Path) -> None:
    """A CANN toolkit found only by its default location (set_env.sh not sourced) gets the source advice."""
    from ascend_patch_torch import stack

    home = tmp_path / "ascend-toolkit" / "latest"
    (home / "compiler").mkdir(parents=True)
    (home / "compiler" / "version.info").write_text("Version=7.0.0\n")
    original = stack._CANN_ROOTS
    stack._CANN_ROOTS = (str(home),)
    try:
        cann = stack.cann_info({})
    finally:
        stack._CANN_ROOTS = original
    facts = {
        "torch_npu": {"installed": False, "autoload_entry_point": False, "importable": None},
        "cann": cann,
    }
    advice = stack.variable_findings(facts, {})

    assert (cann["found"], cann["version"], cann["found_by"]) == (True, "7.0.0", "default location")
    assert cann["set_env_sourced"] is False
    assert [a.code for a in advice] == ["cann-env"]
    assert str(tmp_path / "ascend-toolkit" / "set_env.sh") in advice[0].message


@pytest.mark.slow
@pytest.mark.torch
def test_try_import_really_imports(tmp_path: Path, site: Path) -> None:
    """--try-import imports torch and torch_npu in a child: here torch's autoload of the fake torch_npu fails, and says so."""
    env = _fake_stack(tmp_path, site, libs=True)

    status, result = doctor(tmp_path, env, "--json", "--plugins", "apx_doc", "--try-import")

    npu = result["environment"]["torch_npu"]
    assert (npu["importable"], npu["import_check"]) == (False, "import")
    assert "torch_npu" in npu["import_detail"]
    assert len(findings(result, "torch-npu-import")) == 1
    assert status == 1


def test_version_twice_lists_the_plugins(tmp_path: Path, site: Path) -> None:
    """--version prints the core's version and place; given twice (as pytest's) also every registered plugin."""
    cmd = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "ascend_patch_core._cli"]
    env = clean_env(tmp_path, site)
    once = subprocess.run([*cmd, "--version"], env=env, capture_output=True, text=True, timeout=60)
    twice = subprocess.run(
        [*cmd, "--version", "--version"], env=env, capture_output=True, text=True, timeout=60
    )

    assert once.returncode == twice.returncode == 0
    assert once.stdout.startswith("ascend-patch ") and "registered plugins" not in once.stdout
    assert "registered plugins:" in twice.stdout
    assert (
        "  apx_doc_broken: apx-doc-broken 0.0.1 (apx_doc_broken)\n" in twice.stdout
    )  # listed, not imported
    assert "  apx_doc: apx-doc 1.2.0 (apx_doc_plugin)\n" in twice.stdout


def test_doctor_and_scan_import_no_torch_with_the_real_plugins(tmp_path: Path) -> None:
    """With the first-party plugins (hundreds of torch patches) installed, doctor and scan never import torch or torch_npu."""
    probe = textwrap.dedent(
        f"""
        import contextlib, io, sys
        from ascend_patch_core import _cli
        with contextlib.redirect_stdout(io.StringIO()):
            _cli.main(["doctor", "--json"])
            _cli.main(["scan", {str(Path(__file__).parent / "data" / "scan_fixture")!r}])
        print(sorted(m for m in ("torch", "torch_npu", "transformers", "mmcv") if m in sys.modules))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")

    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_a_plugin_that_declares_nothing_is_a_warning(tmp_path: Path, site: Path) -> None:
    """An installed plugin whose hooks register no patch, rule or env default is pointed out."""
    hollow = """
        from ascend_patch_core import hookimpl

        @hookimpl
        def register_patches():
            return []
        """
    unmarked = """
        def register_patches():  # forgot @hookimpl: pluggy never calls it
            return ["would-be patches"]
        """
    env_only = """
        from ascend_patch_core import EnvSetting, hookimpl

        @hookimpl
        def configure_env():
            return [EnvSetting("APX_ONLY_ENV", "1")]
        """
    for dist, module, source in (
        ("apx-hollow", "apx_hollow", hollow),
        ("apx-unmarked", "apx_unmarked", unmarked),
        ("apx-env-only", "apx_env_only", env_only),
    ):
        write_dist(site, dist, "0.1", {f"{module}.py": source}, {"ascend_patch": {module: module}})
    env = clean_env(tmp_path, site)

    status, result = doctor(
        tmp_path, env, "--json", "--plugins", "apx_hollow,apx_unmarked,apx_env_only,apx_doc"
    )
    _, text = doctor(tmp_path, env, "--plugins", "apx_hollow")

    empty = findings(result, "plugin-empty")
    assert [m.split()[1] for m in empty] == ["'apx_hollow'", "'apx_unmarked'"]
    assert empty[0].startswith("plugin 'apx_hollow' (apx-hollow 0.1) declares nothing")
    assert status == 0  # a warning: the plugin works, it just does nothing
    assert "plugin-empty" in text


BROKEN_KINDS = {
    # entry-point value, files (relative to the site), where doctor must point
    "apx_fail_dep": (
        "apx_fail_dep",
        {"apx_fail_dep.py": "import apx_missing_dep_zz\n"},
        "apx_fail_dep.py",
    ),
    "apx_fail_syntax": (
        "apx_fail_syn",
        {"apx_fail_syn/__init__.py": "from . import bad\n", "apx_fail_syn/bad.py": "def f(:\n"},
        "apx_fail_syn/bad.py",
    ),
    "apx_fail_inner": (
        "apx_fail_inner.plugin",
        {
            "apx_fail_inner/__init__.py": "",
            "apx_fail_inner/plugin.py": "from . import helpers\nhelpers.setup()\n",
            "apx_fail_inner/helpers.py": "def setup():\n    raise RuntimeError('no config')\n",
        },
        "apx_fail_inner/helpers.py",
    ),
    # The error is raised inside a library it imports: the plugin's line that imported it.
    "apx_fail_lib": (
        "apx_fail_lib",
        {
            "apx_fail_lib.py": "import apx_outside_lib\n",
            "apx_outside_lib.py": "raise ValueError('x')\n",
        },
        "apx_fail_lib.py",
    ),
    "apx_fail_attr": (
        "apx_fail_attr:plugin",
        {"apx_fail_attr.py": "x = 1\n"},
        "apx_fail_attr.py",
    ),
    "apx_fail_absent": ("apx_absent_module_zz", {}, None),
}


def test_an_import_failure_names_the_plugin_file_where_it_happened(
    tmp_path: Path, site: Path
) -> None:
    """A plugin that fails to import carries the file of the error (the innermost frame in the plugin)."""
    for name, (value, files, _) in BROKEN_KINDS.items():
        for relative, source in files.items():
            (site / relative).parent.mkdir(parents=True, exist_ok=True)
            (site / relative).write_text(source)
        write_dist(
            site, name.replace("_", "-"), "0.1", entry_points={"ascend_patch": {name: value}}
        )
    env = clean_env(tmp_path, site)

    _, result = doctor(tmp_path, env, "--json", "--plugins", ",".join(BROKEN_KINDS))

    plugins = {p["name"]: p for p in result["plugins"]}
    for name, (_, _, where) in BROKEN_KINDS.items():
        plugin = plugins[name]
        assert plugin["status"] == "broken", plugin
        expected = None if where is None else str(site / where)
        assert plugin["file"] == expected, (name, plugin["reason"])
        if expected:
            assert f"({expected})" in plugin["reason"]
    broken = [m for m in findings(result, "plugin-broken") if "apx_fail_dep" in m]
    assert broken and str(site / "apx_fail_dep.py") in broken[0]


NOTED_PLUGIN = """
    from ascend_patch_core import AtomicPatch, Patch, hookimpl


    class FastKernel(Patch):
        @classmethod
        def patches(cls, options=None):
            return [
                AtomicPatch("apx_doc_lib.f", "apx_noted:fast", note="kernel: portable"),
                AtomicPatch("apx_doc_lib.g", "apx_noted:fast", note="kernel: portable"),
            ]


    class Empty(Patch):
        @classmethod
        def patches(cls, options=None):
            return []


    class NotHere(Patch):
        requires = "apx-doc-lib>=9"
        opt_in = True

        @classmethod
        def patches(cls, options=None):
            return [AtomicPatch("apx_doc_lib.f", "apx_noted:fast", name="NotHere.f")]


    def fast(*args):
        return "fast"


    @hookimpl
    def register_patches():
        return [FastKernel, NotHere, Empty]
    """


def test_groups_with_their_applicability_and_notes(tmp_path: Path) -> None:
    """doctor lists each group of each plugin: default or opt-in, how many of its patches
    apply here, why the others do not, and what its patches note (an op's kernel)."""
    root = tmp_path / "site"
    root.mkdir()
    write_dist(
        root,
        "apx-noted",
        "0.1.0",
        {"apx_noted.py": NOTED_PLUGIN},
        {"ascend_patch": {"apx_noted": "apx_noted"}},
    )
    write_dist(root, "apx-doc-lib", "1.0", {"apx_doc_lib.py": DOC_LIB})
    env = clean_env(tmp_path, root, ASCEND_PATCH_PLUGINS="apx_noted")

    _, result = doctor(tmp_path, env, "--json")
    (plugin,) = [p for p in result["plugins"] if p["name"] == "apx_noted"]
    groups = {g["name"]: g for g in plugin["groups"]}
    fast, absent = groups["FastKernel"], groups["NotHere"]
    assert (fast["default"], fast["patches"], fast["applicable"]) == (True, 2, 2)
    assert fast["notes"] == ["kernel: portable"] and fast["reason"] is None
    assert (absent["default"], absent["patches"], absent["applicable"]) == (False, 1, 0)
    # The switch is the reason shown, before the unmet requirement.
    assert absent["reason"].startswith("opt-in: enable it with ASCEND_PATCH_ENABLE=NotHere")
    empty = groups["Empty"]
    assert (empty["patches"], empty["reason"]) == (0, "declares no patch on this machine")
    assert [p["note"] for p in plugin["patches"]] == ["kernel: portable", "kernel: portable", None]

    _, text = doctor(tmp_path, env)
    rows = {line.split()[1]: line for line in text.split("Groups\n", 1)[1].splitlines()[:3]}
    assert rows["FastKernel"].split()[2:5] == ["default", "applies", "2/2"]
    assert rows["FastKernel"].endswith("kernel: portable")
    assert rows["NotHere"].split()[2:5] == ["opt-in", "no", "0/1"]
    assert rows["Empty"].split()[2:5] == ["default", "no", "0/0"]
    assert rows["Empty"].endswith("declares no patch on this machine")
    assert not (tmp_path / "apx_doc_lib-was-imported").exists()


WHEN_MISSING_PLUGIN = """
    from ascend_patch_core import ReplaceImport, hookimpl


    @hookimpl
    def register_import_rules():
        return [
            ReplaceImport("apx_wm_full._ext", None, when_missing=True, X=1),
            ReplaceImport("apx_wm_lite._ext", None, when_missing=True, X=1),
            ReplaceImport("apx_wm_absent._ext", None, when_missing=True, X=1),
        ]
    """


def test_which_module_a_when_missing_rule_gives_without_importing(tmp_path: Path) -> None:
    """doctor says, per when_missing rule, whether the real module or the replacement is used, importing neither."""
    root = tmp_path / "site"
    write_dist(
        root,
        "apx-wm",
        "0.1",
        {"apx_wm_plugin.py": WHEN_MISSING_PLUGIN},
        {"ascend_patch": {"apx_wm": "apx_wm_plugin"}},
    )
    for package, files in {
        "apx_wm_full": ("__init__.py", "_ext.py"),
        "apx_wm_lite": ("__init__.py",),
    }.items():
        (root / package).mkdir()
        for name in files:  # importing either leaves a mark
            (root / package / name).write_text(
                f"open({str(tmp_path / (package + name))!r}, 'w').close()\n"
            )
    env = clean_env(tmp_path, root, ASCEND_PATCH_PLUGINS="apx_wm")

    _, result = doctor(tmp_path, env, "--json")
    _, text = doctor(tmp_path, env)

    (plugin,) = [p for p in result["plugins"] if p["name"] == "apx_wm"]
    rules = {r["module"]: r for r in plugin["rules"]}
    assert rules["apx_wm_full._ext"]["in_use"] == "real"
    assert rules["apx_wm_full._ext"]["real_origin"] == str(root / "apx_wm_full" / "_ext.py")
    assert rules["apx_wm_lite._ext"]["in_use"] == "replacement"
    assert rules["apx_wm_absent._ext"]["in_use"] == "none"
    assert rules["apx_wm_lite._ext"]["description"].endswith("(when missing)")
    assert f"apx_wm_full._ext  the real one: {root / 'apx_wm_full' / '_ext.py'}" in text
    assert "apx_wm_lite._ext  served by plugin 'apx_wm' (no real one installed)" in text
    assert "apx_wm_absent" not in text  # a package not installed: nothing to say
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("apx_wm")) == [], (
        "doctor imported a package"
    )
