"""Targets the engine itself depends on are refused (issue #22, item 8).

``AtomicPatch("sys.modules", f)`` or ``"sys.meta_path"`` used to be accepted: apply()
installed it, and from then on every import failed, revert() included (it imports
its undo module on first use), so the process stayed broken for good. Such targets
are now refused when the patch is declared -- also when spelled another way
(``sys:modules``, ``_frozen_importlib``, ``os.sys.modules``) -- and, reached under a
name that can only be read once its module is imported, when it would be installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import PatchError
from ascend_patch_core import Status


PackageFactory = Callable[..., str]
BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"


def replacement(*args: object, **kwargs: object) -> None:
    return None


def run_python(
    code: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


# ----------------------------------------------------------------------------- as users met it


@pytest.mark.parametrize("target", ["sys.modules", "sys.meta_path"])
def test_the_issue_targets_are_refused_and_the_process_keeps_working(
    target: str, tmp_path: Path
) -> None:
    """The issue's script: declare the patch, apply, import, revert. Declaring now raises a
    PatchDefinitionError naming the patch, the target, why and what to do instead; nothing
    was installed, so imports, apply() and revert() of other patches keep working."""
    done = run_python(
        f"""
        import sys
        from ascend_patch_core import AtomicPatch, Patcher, PatchDefinitionError

        def f(*args, **kwargs):
            return None

        try:
            patcher = Patcher().add(AtomicPatch({target!r}, f, name="mine"))
        except PatchDefinitionError as exc:
            print("refused:", exc)
        else:
            patcher.apply()
            try:
                patcher.revert()
            finally:
                print("applied and reverted")
        import json.tool  # a fresh import still works
        other = Patcher().add(AtomicPatch("json.dumps", f))
        other.apply()
        assert json.dumps({{}}) is None
        other.revert()
        assert json.dumps({{}}) == "{{}}"
        print("ok")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    first, last = done.stdout.splitlines()[0], done.stdout.splitlines()[-1]
    assert first.startswith(f"refused: AtomicPatch({target!r}, name='mine'): target {target!r}")
    assert "the engine itself depends on" in first and "revert()" in first
    assert "Instead, to serve, hide or stub a module use an import rule" in first
    assert last == "ok"


# ----------------------------------------------------------------------------- spellings


REFUSED = {
    # the import system's state, however it is spelled
    "sys.modules": "sys.modules",
    "sys:modules": "sys.modules",
    "sys.meta_path": "sys.meta_path",
    "sys.path_hooks": "sys.path_hooks",
    "sys.path_importer_cache": "sys.path_importer_cache",
    "sys.modules['json']": "sys.modules",
    "sys.meta_path.append": "sys.meta_path",
    "os.sys.modules": "sys.modules",  # os.sys is the sys module
    "os.sys.meta_path": "sys.meta_path",
    # the import machinery, also under its frozen names
    "importlib.import_module": "every import runs on it",
    "importlib._bootstrap._find_and_load": "every import runs on it",
    "_frozen_importlib._find_and_load": "every import runs on it",
    "_frozen_importlib_external.PathFinder": "every import runs on it",
    "importlib.machinery.PathFinder.find_spec": "every import runs on it",
    "importlib.machinery:ModuleSpec": "every import runs on it",
    "_thread.get_ident": "importlib calls it",
    "posix.stat": "importlib calls it",
    # builtins: the engine reads them while installing and undoing
    "builtins.__import__": "builtins",
    "builtins.setattr": "builtins",
    "builtins.brand_new_name": "builtins",
    "json.__builtins__.len": "builtins",
    # what the engine's locks and fork handling call
    "threading.RLock": "fork() handling",
    "threading.get_ident": "fork() handling",
    "os.register_at_fork": "fork() handling",
    "os.environ": "fork() handling",
    # the engine itself
    "ascend_patch_core.Patcher.apply": "it is the engine",
    "ascend_patch_core.imports._hub.hub": "it is the engine",
    "ascend_patch_core._install.installer:Installer.advance": "it is the engine",
}


@pytest.mark.parametrize("target", sorted(REFUSED))
def test_engine_targets_are_refused_when_declared(target: str) -> None:
    with pytest.raises(PatchDefinitionError) as caught:
        AtomicPatch(target, replacement, create=True)
    message = str(caught.value)
    assert message.startswith(f"AtomicPatch({target!r}): target {target!r}")
    assert "the engine itself depends on" in message and "Instead, " in message
    assert REFUSED[target] in message


def test_an_alias_on_an_engine_target_is_refused_and_named_as_an_alias() -> None:
    with pytest.raises(PatchDefinitionError) as caught:
        AtomicPatch("apx_nowhere.f", replacement, aliases=["apx_nowhere.g", "sys:meta_path"])
    assert str(caught.value).startswith(
        "AtomicPatch('apx_nowhere.f'): alias target 'sys:meta_path'"
    )


@pytest.mark.parametrize(
    "target",
    [
        "sys.stdout",
        "sys.excepthook",
        "os.getcwd",
        "os.path.exists",
        "os.environ['APX_SOME_VARIABLE']",
        "threading.Thread.run",
        "importlib.util.find_spec",
        "importlib.metadata.version",
        "warnings.warn",
        "json.dumps",
    ],
)
def test_other_standard_library_targets_stay_allowed(target: str) -> None:
    """Only what the engine depends on is refused: sys.stdout, os.path, env variables,
    importlib.util.find_spec (availability probes) and the like can still be patched."""
    assert AtomicPatch(target, replacement).target == target


def test_an_allowed_standard_library_patch_applies_and_reverts_exactly() -> None:
    original = os.getcwd
    patcher = Patcher().add(AtomicPatch("os.getcwd", lambda: "/patched"))
    try:
        assert patcher.apply().get("os.getcwd").status is Status.APPLIED
        assert os.getcwd() == "/patched"
    finally:
        patcher.revert()
    assert os.getcwd is original


# ----------------------------------------------------------------------------- other names


def test_a_name_read_only_after_import_fails_at_installation(make_package: PackageFactory) -> None:
    """``pkg.mod.S.modules`` where mod does ``import sys as S``: not readable when declared
    (mod is not imported), refused when it would be installed -- sys.modules stays intact,
    the report says why, and revert() works."""
    pkg = make_package({"mod.py": "import sys as S\nimport builtins as B\n"})
    modules = sys.modules
    patcher = Patcher().add(
        AtomicPatch(f"{pkg}.mod.S.modules", {}), AtomicPatch(f"{pkg}.mod.B.len", replacement)
    )
    patcher.apply()
    try:
        __import__(f"{pkg}.mod")
        assert sys.modules is modules and len([1, 2]) == 2
        report = patcher.report
        first, second = report.get(f"{pkg}.mod.S.modules"), report.get(f"{pkg}.mod.B.len")
        assert first.status is second.status is Status.FAILED
        assert "(that is sys.modules) is something the engine itself depends on" in str(
            first.reason
        )
        assert "(that is builtins.len)" in str(second.reason)
    finally:
        patcher.revert()
    assert sys.modules is modules


def test_an_engine_module_under_another_name_is_refused_by_apply_itself() -> None:
    """A library may register a module in sys.modules under a name of its own (six.moves
    does). Declared before that, ``<alias>.register_at_fork`` cannot be read; apply()
    then finds the slot at once, in the batch of patches it installs directly, and
    still refuses it -- while the other patches of the batch apply."""
    alias = "_ap_engine_alias_os"
    fork_hook, environ, dumps = os.register_at_fork, os.environ, json.dumps
    patcher = Patcher().add(
        AtomicPatch(f"{alias}.register_at_fork", replacement),
        AtomicPatch(f"{alias}.environ", {"PATH": "/nowhere"}),
        AtomicPatch("json.dumps", replacement),
    )
    sys.modules[alias] = os
    try:
        report = patcher.apply()
        assert os.register_at_fork is fork_hook and os.environ is environ
        assert json.dumps is replacement
        for name in ("register_at_fork", "environ"):
            record = report.get(f"{alias}.{name}")
            assert record.status is Status.FAILED
            assert f"(that is os.{name})" in str(record.reason)
    finally:
        patcher.revert()
        del sys.modules[alias]
    assert os.register_at_fork is fork_hook and json.dumps is dumps


def test_in_strict_mode_the_import_that_reaches_an_engine_target_raises(
    make_package: PackageFactory,
) -> None:
    pkg = make_package({"mod.py": "import sys as S\n"})
    patcher = Patcher(strict=True).add(AtomicPatch(f"{pkg}.mod.S.meta_path", []))
    patcher.apply()
    meta_path = list(sys.meta_path)
    try:
        with pytest.raises(PatchError, match=r"that is sys\.meta_path"):
            __import__(f"{pkg}.mod")
        assert [f for f in sys.meta_path if f not in meta_path] == []
    finally:
        patcher.revert()


def test_a_group_declaring_an_engine_target_fails_alone() -> None:
    class Hooks(Patch):
        name = "ApxHooks"

        @classmethod
        def patches(cls, options: object = None) -> list[AtomicPatch]:
            return [AtomicPatch("sys.meta_path", [])]

    meta_path = list(sys.meta_path)
    patcher = Patcher().add(Hooks, AtomicPatch("os.getcwd", lambda: "/patched"))
    try:
        report = patcher.apply()
        group = report.get("ApxHooks", kind="group")
        assert group.status is Status.FAILED
        assert "Hooks.patches() raised PatchDefinitionError" in str(group.reason)
        assert "'sys.meta_path' is something the engine itself depends on" in str(group.reason)
        assert report.get("os.getcwd").status is Status.APPLIED
        assert sys.meta_path == meta_path or sys.meta_path[1:] == meta_path  # the hub only
    finally:
        patcher.revert()


# ----------------------------------------------------------------------------- a plugin's group

PLUGIN = """
from ascend_patch_core import AtomicPatch, Patch, hookimpl


class ApxImportHooks(Patch):
    @classmethod
    def patches(cls, options=None):
        return [AtomicPatch("sys:meta_path", [], name="apx_meta_path")]


class ApxFine(Patch):
    @classmethod
    def patches(cls, options=None):
        return [AtomicPatch("apx_engine_target_lib.where", "apx_engine_plugin:patched")]


def patched():
    return "patched"


@hookimpl
def register_patches():
    return [ApxImportHooks, ApxFine]
"""


def _site(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    site = tmp_path / "site"
    info = site / "apx_engine_plugin-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: apx-engine-plugin\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[ascend_patch]\napx_engine_plugin = apx_engine_plugin\n"
    )
    (site / "apx_engine_plugin.py").write_text(textwrap.dedent(PLUGIN))
    (site / "apx_engine_target_lib.py").write_text("def where():\n    return 'original'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(PYTHONPATH=str(site), ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"))
    return site, env


def _cli(*args: str) -> list[str]:
    return (
        [str(CLI), *args]
        if CLI.exists()
        else [sys.executable, "-m", "ascend_patch_core._cli", *args]
    )


def test_a_plugin_group_with_an_engine_target_is_named_with_its_plugin(tmp_path: Path) -> None:
    """Through the CLI, as a plugin author meets it: `run` runs the program with the other
    group applied and the report names the failed group and its plugin; `run --strict`
    stops naming both; `doctor` lists the error under the plugin."""
    _, env = _site(tmp_path)
    (tmp_path / "prog.py").write_text(
        "import apx_engine_target_lib\nprint(apx_engine_target_lib.where())\n"
    )

    ran = subprocess.run(
        _cli("run", "--report", str(tmp_path / "report.json"), "prog.py"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    strict = subprocess.run(
        _cli("run", "--strict", "prog.py"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )  # fmt: skip
    doctor = subprocess.run(
        _cli("doctor", "--json"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )  # fmt: skip

    assert (ran.returncode, ran.stdout) == (0, "patched\n"), ran.stderr
    main = json.loads((tmp_path / "report.json").read_text())["processes"][0]
    records = main["report"]["records"]
    group = next(r for r in records if r["kind"] == "group" and r["name"] == "ApxImportHooks")
    assert group["status"] == "failed" and group["provenance"]["plugin"] == "apx_engine_plugin"
    assert (
        "'sys:meta_path' (that is sys.meta_path) is something the engine itself depends on"
        in group["reason"]
    )

    assert (strict.returncode, strict.stdout) == (1, ""), strict.stderr
    assert "group 'ApxImportHooks' of plugin 'apx_engine_plugin'" in strict.stderr
    assert "(that is sys.meta_path) is something the engine itself depends on" in strict.stderr

    plugin = next(
        p for p in json.loads(doctor.stdout)["plugins"] if p["name"] == "apx_engine_plugin"
    )
    assert any(
        e.startswith("group ApxImportHooks: ApxImportHooks.patches() raised PatchDefinitionError")
        and "sys:meta_path" in e
        for e in plugin["errors"]
    ), plugin["errors"]


def test_the_installed_plugins_declare_no_engine_target() -> None:
    """Every group of every installed plugin (opt-in ones too) still expands."""
    from ascend_patch_core._engine.declarations import collect

    inventory = collect(enable=["*"])
    assert inventory.loaded(), "no plugin installed"
    for plugin in inventory.loaded():
        assert not [e for e in plugin.errors if "engine itself depends on" in e], plugin.errors
