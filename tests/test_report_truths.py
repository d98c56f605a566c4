"""What the report and the switches tell a user is true: counts add up, a reverted
patcher still shows what it reverted, on/off variables say when a value means neither,
``ASCEND_PATCH_PLUGINS=*`` loads every plugin, and calls can be counted without a
runtime_check.

CLI behaviour is checked through the real ``ascend-patch`` in a subprocess, with a
probe plugin "installed" as a ``.dist-info`` on PYTHONPATH (as tests/test_cli_run.py does).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ascend_patch_core
from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import Status
from ascend_patch_core import hookimpl
from ascend_patch_core._model.env_flags import env_flag


BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"

PROBE = {
    "apx_truth_plugin.py": """
        from ascend_patch_core import AtomicPatch, EnvSetting, hookimpl


        def patched_where():
            return "patched"


        @hookimpl
        def register_patches():
            return [AtomicPatch("apx_truth_target.where", "apx_truth_plugin:patched_where")]


        @hookimpl
        def configure_env():
            return [EnvSetting("APX_TRUTH_SETTING", "1", "a probe default")]
        """,
    "apx_truth_target.py": """
        def where():
            return "original"
        """,
}


def write_plugin(site: Path, dist: str, entry_point: str, modules: dict[str, str]) -> None:
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[ascend_patch]\n{entry_point}\n")
    for name, source in modules.items():
        (site / name).write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    write_plugin(root, "apx-truth", "apx_truth = apx_truth_plugin", PROBE)
    return root


def clean_env(tmp_path: Path, site: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


def cli(*args: str) -> list[str]:
    if CLI.exists():
        return [str(CLI), *args]
    return [sys.executable, "-m", "ascend_patch_core._cli", *args]


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


_SUMMARY = re.compile(
    r"^ascend-patch: (?P<counts>.*?)(?: \((?P<hidden>\d+) plugin records? not listed.*\))?$"
)
_ROW = re.compile(r"^  (applied|pending|skipped|failed|reverted) +\S")


def summary_and_rows(table: str) -> tuple[dict[str, int], int, list[str]]:
    """(counts by status, hidden rows, listed rows) of a printed report table."""
    lines = table.splitlines()
    found = _SUMMARY.match(lines[0])
    assert found, lines[0]
    counts = {
        status: int(n)
        for n, status in (part.split(" ") for part in found["counts"].split(", "))
        if status in {s.value for s in Status}
    }
    rows = [line for line in lines[1:] if _ROW.match(line)]
    return counts, int(found["hidden"] or 0), rows


def assert_adds_up(table: str) -> None:
    counts, hidden, rows = summary_and_rows(table)
    assert sum(counts.values()) == len(rows) + hidden, table
    for status, n in counts.items():
        listed = sum(1 for row in rows if row.split()[0] == status)
        assert listed <= n, (status, table)


# ----------------------------------------------------------------------------- counts


def test_cli_report_summary_counts_the_rows_it_lists_and_those_it_hides(
    tmp_path: Path, site: Path
) -> None:
    """`ascend-patch report` (every installed plugin, the torch plugin included): the first
    line's counts equal the listed rows plus the plugin records it says are not listed."""
    env = clean_env(tmp_path, site)
    short = run(cli("report"), tmp_path, env)
    verbose = run(cli("report", "-v"), tmp_path, env)

    assert short.returncode == 0, short.stderr
    assert_adds_up(short.stdout)
    counts, hidden, _ = summary_and_rows(short.stdout)
    assert hidden >= 1 and "-v" in short.stdout.splitlines()[0]
    assert_adds_up(verbose.stdout)
    v_counts, v_hidden, v_rows = summary_and_rows(verbose.stdout)
    assert v_hidden == 0 and v_counts == counts
    assert any("apx_truth = apx_truth_plugin" in row for row in v_rows)

    as_json = json.loads(run(cli("report", "--json"), tmp_path, env).stdout)
    assert sum(as_json["counts"].values()) == len(as_json["records"])
    assert as_json["counts"] == {**{s.value: 0 for s in Status}, **counts}


def test_table_counts_hidden_plugin_records(make_package) -> None:
    """The short table summarises a plugin's records in one line but counts them, and says how to list them."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})

    class Plugin:
        @hookimpl
        def register_patches(self) -> list[AtomicPatch]:
            return [AtomicPatch(f"{pkg}.core.f", lambda: "new")]

    patcher = Patcher(extra_plugins=[("probe", Plugin())])
    try:
        report = patcher.apply()
        table = report.table()
        assert table.splitlines()[0] == (
            "ascend-patch: 1 applied, 1 pending"
            " (2 plugin records not listed: -v or table(verbose=True) lists them)"
        )
        assert table.splitlines()[1:] == ["  plugins:", "    probe  loaded, 1 pending"]
        assert_adds_up(table)
        assert_adds_up(report.table(verbose=True))
        assert "not listed" not in report.table(verbose=True)
    finally:
        patcher.revert()


def test_report_get_finds_a_patch_by_an_alias(make_package, patcher: Patcher) -> None:
    """Records are named by the defining module; the public names are aliases and find them too."""
    pkg = make_package(
        {"impl.py": "def f():\n    return 'orig'\n", "__init__.py": "from .impl import f\n"}
    )
    report = patcher.add(AtomicPatch(f"{pkg}.impl.f", lambda: "new", aliases=(f"{pkg}.f",))).apply()
    __import__(pkg)

    record = report.get(f"{pkg}.f")
    assert record.name == f"{pkg}.impl.f"
    assert record.as_dict()["aliases"] == {f"{pkg}.f": "applied"}
    with pytest.raises(KeyError):
        report.get(f"{pkg}.nothing")


# ----------------------------------------------------------------------------- after revert


def test_report_after_revert_shows_the_reverted_records_until_the_next_apply(
    make_package,
) -> None:
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    patcher = Patcher().add(AtomicPatch(f"{pkg}.core.f", lambda: "new"))
    first = patcher.apply()
    __import__(f"{pkg}.core")
    returned = patcher.revert()

    assert [r.status for r in returned] == [Status.REVERTED]
    assert [r.status for r in patcher.report] == [Status.REVERTED]
    assert patcher.report.counts()["reverted"] == 1
    assert [r.status for r in first] == [Status.REVERTED]  # the report apply() gave too

    # A rule declared now acts at once: it belongs to the next report, not the reverted one.
    patcher.skip_import(f"{pkg}_absent_dep")
    try:
        assert [r.kind for r in patcher.report] == ["patch", "rule"]
        second = patcher.apply()
        assert sorted((r.kind, r.status.value) for r in second) == [
            ("patch", "applied"),
            ("rule", "pending"),
        ]
        assert [r.status for r in returned] == [Status.REVERTED]  # frozen copy
        assert len(first.records) == 1  # the first cycle's report is not the second's
    finally:
        patcher.revert()


# ----------------------------------------------------------------------------- on/off switches

BOOLEAN_SWITCHES = (
    "ASCEND_PATCH_AUTOLOAD",
    "ASCEND_PATCH_STRICT",
    "ASCEND_PATCH_CACHE",
    "ASCEND_PATCH_COUNT_CALLS",
)


@pytest.mark.parametrize("name", BOOLEAN_SWITCHES)
def test_a_switch_that_is_neither_on_nor_off_is_rejected_by_apply(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, "maybe")
    patcher = Patcher(autoload=True)
    with pytest.raises(PatchDefinitionError) as raised:
        patcher.apply()
    patcher.revert()
    message = str(raised.value)
    assert f"{name}='maybe'" in message
    assert "1/true/yes/on" in message and "0/false/no/off" in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), (" YES ", True), ("On", True), ("true", True), ("0", False), ("off", False),
     ("No", False), ("FALSE", False), ("", None), ("  ", None)],
)  # fmt: skip
def test_switch_words(value: str, expected: bool | None) -> None:
    for default in (True, False):
        want = default if expected is None else expected
        assert env_flag("X", default, {"X": value}) is want
    assert env_flag("X", True, {}) is True


@pytest.mark.parametrize("name", ["ASCEND_PATCH_STRICT", "ASCEND_PATCH_AUTOLOAD"])
def test_run_rejects_a_switch_that_is_neither_on_nor_off(
    name: str, tmp_path: Path, site: Path
) -> None:
    (tmp_path / "prog.py").write_text("print('ran')\n")
    done = run(cli("run", "prog.py"), tmp_path, clean_env(tmp_path, site, **{name: "maybe"}))

    assert done.returncode != 0
    assert done.stdout == ""
    assert f"{name}='maybe'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [["doctor"], ["doctor", "--json"], ["report"], ["scan", "."]])
@pytest.mark.parametrize("name", ["ASCEND_PATCH_STRICT", "ASCEND_PATCH_AUTOLOAD"])
def test_every_command_rejects_a_switch_in_one_line(
    name: str, command: list[str], tmp_path: Path, site: Path
) -> None:
    """doctor, report and scan: exit 2, one stderr line naming the command, the variable and the words."""
    done = run(cli(*command), tmp_path, clean_env(tmp_path, site, **{name: "maybe"}))

    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(f"ascend-patch {command[0]}: {name}='maybe'"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and "1/true/yes/on" in done.stderr


def test_plugins_star_loads_every_plugin(tmp_path: Path, site: Path) -> None:
    """ASCEND_PATCH_PLUGINS=* means all plugins -- even with ASCEND_PATCH_AUTOLOAD=0."""
    for extra in ({}, {"ASCEND_PATCH_AUTOLOAD": "0"}):
        env = clean_env(tmp_path, site, ASCEND_PATCH_PLUGINS="*", **extra)
        done = run(cli("report", "--json"), tmp_path, env)
        records = json.loads(done.stdout)["records"]
        plugins = {r["name"]: r["status"] for r in records if r["kind"] == "plugin"}
        assert plugins["apx_truth"] == "applied", (extra, plugins)
        # Every plugin selected; those none of whose libraries is installed stay idle.
        idle = "none of the libraries it serves is installed"
        assert not [
            r
            for r in records
            if r["kind"] == "plugin"
            and r["status"] != "applied"
            and not (r["status"] == "skipped" and r["reason"].startswith(idle))
        ]
        assert not json.loads(done.stdout)["warnings"], extra


# ----------------------------------------------------------------------------- call counting


def _counting_package(make_package) -> str:
    return make_package(
        {
            "core.py": """
                def f(x):
                    return ('orig', x)

                class C:
                    def m(self, x):
                        return ('orig-m', x)

                    @staticmethod
                    def s(x):
                        return ('orig-s', x)
                """
        }
    )


class _Replacements(Patch):
    pkg = ""

    @classmethod
    def patches(cls, options: object = None) -> list[AtomicPatch]:
        pkg = cls.pkg
        return [
            AtomicPatch(f"{pkg}.core.f", lambda x: ("new", x)),
            AtomicPatch(f"{pkg}.core.C.m", lambda self, x: ("new-m", x)),
            AtomicPatch(f"{pkg}.core.C.s", lambda x: ("new-s", x)),
        ]


@pytest.mark.parametrize("how", ["argument", "env"])
def test_count_calls_without_a_runtime_check(
    make_package, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    pkg = _counting_package(make_package)
    group = type("Counted", (_Replacements,), {"pkg": pkg})
    if how == "env":
        monkeypatch.setenv("ASCEND_PATCH_COUNT_CALLS", "1")
    patcher = Patcher(count_calls=True if how == "argument" else None).add(group)
    report = patcher.apply()
    core = __import__(f"{pkg}.core", fromlist=["C"])
    original_class = core.C
    try:
        obj = original_class()
        results = [core.f(1), core.f(2), obj.m(3), original_class.s(4), obj.s(5)]
        assert results == [("new", 1), ("new", 2), ("new-m", 3), ("new-s", 4), ("new-s", 5)]
        counts = {
            r.name.rpartition(".")[2]: r.counters.as_dict() for r in report if r.kind == "patch"
        }
        assert counts == {
            "f": {"replacement_calls": 2, "fallback_calls": 0},
            "m": {"replacement_calls": 1, "fallback_calls": 0},
            "s": {"replacement_calls": 2, "fallback_calls": 0},
        }
        assert "calls: 2 replacement, 0 fallback" in report.table(verbose=True)
        assert json.loads(report.to_json())["records"][0]["counters"]["replacement_calls"] == 2
    finally:
        patcher.revert()
    assert core.f(1) == ("orig", 1) and original_class().m(1) == ("orig-m", 1)
    assert original_class.s(1) == ("orig-s", 1)


def test_counting_off_installs_the_replacement_itself(make_package, patcher: Patcher) -> None:
    """Off (the default): no wrapper, no counters -- nothing on the call path."""
    pkg = _counting_package(make_package)

    def replacement(x: object) -> tuple[str, object]:
        return ("new", x)

    report = patcher.add(AtomicPatch(f"{pkg}.core.f", replacement)).apply()
    core = __import__(f"{pkg}.core", fromlist=["f"])
    assert core.f is replacement
    assert report.get(f"{pkg}.core.f").counters is None


def test_counting_leaves_classes_uncounted_and_unwrapped(make_package) -> None:
    pkg = _counting_package(make_package)
    replacement = type("D", (), {})
    patcher = Patcher(count_calls=True).add(AtomicPatch(f"{pkg}.core.C", replacement))
    report = patcher.apply()
    try:
        core = __import__(f"{pkg}.core", fromlist=["C"])
        assert core.C is replacement
        assert report.get(f"{pkg}.core.C").counters is None
    finally:
        patcher.revert()


def test_counting_off_puts_nothing_on_the_call_path(make_package) -> None:
    """Counting off: the installed object is the replacement itself; on: a wrapper that counts.

    (What counting costs per call is a benchmark figure, docs/core.md: no timing here.)"""
    pkg = _counting_package(make_package)

    def replacement(x: object) -> object:
        return x

    core = __import__(f"{pkg}.core", fromlist=["f"])
    for on in (False, True):
        patcher = Patcher(count_calls=on).add(AtomicPatch(f"{pkg}.core.f", replacement))
        patcher.apply()
        try:
            assert (core.f is replacement) is (not on)
            assert core.f(7) == 7
        finally:
            patcher.revert()


def test_count_calls_under_run(tmp_path: Path, site: Path) -> None:
    """ASCEND_PATCH_COUNT_CALLS=1 with `ascend-patch run --report`: the run report counts calls."""
    (tmp_path / "prog.py").write_text(
        "import apx_truth_target\nfor _ in range(3):\n    print(apx_truth_target.where())\n"
    )
    report = tmp_path / "report.json"
    env = clean_env(tmp_path, site, ASCEND_PATCH_COUNT_CALLS="1")
    done = run(cli("run", "--report", str(report), "prog.py"), tmp_path, env)

    assert done.returncode == 0, done.stderr
    assert done.stdout == "patched\n" * 3
    records = json.loads(report.read_text())["processes"][0]["report"]["records"]
    where = next(r for r in records if r["name"] == "apx_truth_target.where")
    assert where["counters"] == {"replacement_calls": 3, "fallback_calls": 0}


def test_default_patcher_reads_count_calls_per_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is read at apply(), like the other switches."""
    monkeypatch.setenv("ASCEND_PATCH_COUNT_CALLS", "off")
    assert ascend_patch_core.default_patcher._config.counting() is False
    monkeypatch.setenv("ASCEND_PATCH_COUNT_CALLS", "on")
    assert ascend_patch_core.default_patcher._config.counting() is True


# ----------------------------------------------------------------------------- behaviours


def test_skip_import_of_an_attribute_says_it_is_not_a_module(make_package) -> None:
    """skip_import("pkg.mod.Class"): a class is not a module; the rule says so and stops."""
    pkg = make_package({"mod/__init__.py": "class SparseConvTensor:\n    pass\n"})
    patcher = Patcher().skip_import(f"{pkg}.mod.SparseConvTensor")
    patcher.replace_import(f"{pkg}.mod.helper", exports={"x": 1})
    report = patcher.apply()
    try:
        assert {r.status for r in report} == {Status.PENDING}
        mod = __import__(f"{pkg}.mod", fromlist=["SparseConvTensor"])
        assert mod.SparseConvTensor.__module__ == f"{pkg}.mod"  # the real class, as before
        skip = report.get(f"{pkg}.mod.SparseConvTensor")
        assert skip.status is Status.SKIPPED
        assert "is not a module" in skip.reason and "defines 'SparseConvTensor' as a class" in (
            skip.reason
        )
        assert f"skip_import('{pkg}.mod')" in skip.reason and "AtomicPatch(" in skip.reason
        # A name the parent does not define may be a submodule imported later: it waits.
        assert report.get(f"{pkg}.mod.helper").status is Status.PENDING
        with pytest.raises(ModuleNotFoundError):
            __import__(f"{pkg}.mod.SparseConvTensor")
    finally:
        patcher.revert()


def test_skip_import_of_an_attribute_of_a_loaded_module_is_skipped_at_once(
    make_package, patcher: Patcher
) -> None:
    pkg = make_package({"mod.py": "def helper():\n    return 1\n"})
    __import__(f"{pkg}.mod")
    patcher.skip_import(f"{pkg}.mod.helper")
    record = patcher.report.get(f"{pkg}.mod.helper")
    assert record.status is Status.SKIPPED
    assert "as a function object" in record.reason


def test_skip_import_of_a_real_submodule_still_serves_a_stub(
    make_package, patcher: Patcher
) -> None:
    pkg = make_package({"heavy.py": "raise ImportError('needs CUDA')\n"})
    report = patcher.skip_import(f"{pkg}.heavy").apply()
    heavy = __import__(f"{pkg}.heavy", fromlist=["x"])
    assert ascend_patch_core.is_stub(heavy)
    assert report.get(f"{pkg}.heavy").status is Status.APPLIED


def test_none_from_a_hook_means_nothing(make_package) -> None:
    """None from a plugin hook, a ModuleHook callback or Patch.patches() declares nothing
    (a group that declares nothing is reported as such)."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})

    class NoneGroup(Patch):
        @classmethod
        def patches(cls, options: object = None) -> None:
            return None

    class Plugin:
        @hookimpl
        def register_patches(self) -> None:
            return None

        @hookimpl
        def register_import_rules(self) -> None:
            return None

        @hookimpl
        def configure_env(self) -> None:
            return None

    hook = ascend_patch_core.ModuleHook(f"{pkg}.*", lambda module: None, name="none-hook")
    patcher = Patcher(extra_plugins=[("none_plugin", Plugin())]).add(NoneGroup, hook)
    report = patcher.apply()
    try:
        __import__(f"{pkg}.core")
        assert report.get("none_plugin").status is Status.APPLIED
        assert report.get("none_plugin").reason == "0 patch groups, 0 import rules"
        assert report.get("none-hook").status is Status.APPLIED
        assert not report.by_status(Status.FAILED)
        # The empty group is said, not skipped in silence.
        assert [r.kind for r in report] == ["plugin", "group", "hook"]
        group = report.get("NoneGroup", kind="group")
        assert (group.status, group.reason) == (Status.SKIPPED, "declares no patch on this machine")
    finally:
        patcher.revert()


def test_after_import_waits_and_imports_nothing(make_package, patcher: Patcher) -> None:
    pkg = make_package(
        {"core.py": "def f():\n    return 'orig'\n", "registry.py": "READY = True\n"}
    )
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.f", lambda: "new", after_import=f"{pkg}.registry")
    ).apply()
    core = __import__(f"{pkg}.core", fromlist=["f"])

    record = report.get(f"{pkg}.core.f")
    assert record.status is Status.PENDING
    assert record.reason == f"waiting for import of {pkg}.registry"
    assert f"{pkg}.registry" not in sys.modules and core.f() == "orig"
    __import__(f"{pkg}.registry")
    assert record.status is Status.APPLIED and core.f() == "new"


def test_a_missing_replacement_attribute_fails_a_missing_module_skips(
    make_package, patcher: Patcher
) -> None:
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n\ndef g():\n    return 'o'\n"})
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.f", "os.path:no_such_function"),
        AtomicPatch(f"{pkg}.core.g", "apx_no_such_module:g"),
    ).apply()
    __import__(f"{pkg}.core")

    failed, skipped = report.get(f"{pkg}.core.f"), report.get(f"{pkg}.core.g")
    assert failed.status is Status.FAILED
    assert "'os.path:no_such_function' cannot be resolved: AttributeError" in failed.reason
    assert skipped.status is Status.SKIPPED
    assert "'apx_no_such_module:g' is not importable" in skipped.reason


# ----------------------------------------------------------------------------- strict, lazily


def _strict_failure_in_import(make_package) -> tuple[str, BaseException]:
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})

    def cannot_wrap(original: object) -> object:
        raise RuntimeError("cannot wrap on this machine")

    class LazyGroup(Patch):
        @classmethod
        def patches(cls, options: object = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{pkg}.core.f", target_wrapper=cannot_wrap)]

    patcher = Patcher(strict=True).add(LazyGroup)
    patcher.apply()  # nothing to install yet: strict apply() succeeds
    try:
        with pytest.raises(ascend_patch_core.PatchError) as raised:
            __import__(f"{pkg}.core")
    finally:
        patcher.revert()
    return pkg, raised.value


def test_strict_failure_at_a_later_import_names_patch_target_and_fix(make_package) -> None:
    pkg, error = _strict_failure_in_import(make_package)
    message = str(error)
    assert f"patch '{pkg}.core.f' (group LazyGroup, declared by your program)" in message
    assert f"while {pkg}.core was being imported" in message
    assert "target_wrapper raised RuntimeError: cannot wrap on this machine" in message
    assert f"raised at {__file__}" in message
    assert "ascend-patch run --disable LazyGroup" in message and "Patcher.disable(" in message
    assert f"import {pkg}.core` fails" in message


def test_strict_failure_at_a_later_import_has_a_short_traceback(make_package) -> None:
    _, error = _strict_failure_in_import(make_package)
    import traceback

    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    core_frames = [f for f in files if "ascend_patch_core" in f]
    assert len(core_frames) == 1 and core_frames[0].endswith("_hub.py"), files
    assert error.__cause__ is None and error.__suppress_context__


LAZY_PLUGIN = {
    "apx_lazy_plugin.py": """
        from ascend_patch_core import AtomicPatch, Patch, hookimpl


        def _wrap(original):
            raise RuntimeError("cannot wrap on this machine")


        class LazyGroup(Patch):
            @classmethod
            def patches(cls, options=None):
                return [AtomicPatch("apx_lazy_target.where", target_wrapper=_wrap)]


        @hookimpl
        def register_patches():
            return [LazyGroup]
        """,
    "apx_lazy_target.py": """
        def where():
            return "original"
        """,
}


def test_run_strict_stops_at_the_import_with_the_patch_plugin_and_fix(tmp_path: Path) -> None:
    """`ascend-patch run --strict`: a patch whose module the program imports later stops
    the program at that import line; the traceback is that line and the message."""
    site = tmp_path / "site"
    site.mkdir()
    write_plugin(site, "apx-lazy", "apx_lazy = apx_lazy_plugin", LAZY_PLUGIN)
    (tmp_path / "prog.py").write_text(
        "print('first line ran')\nimport apx_lazy_target\nprint('after the import')\n"
    )
    env = clean_env(tmp_path, site)
    strict = run(cli("run", "--strict", "prog.py"), tmp_path, env)
    lenient = run(cli("run", "prog.py"), tmp_path, env)

    assert strict.returncode == 1
    assert strict.stdout == "first line ran\n"
    err = strict.stderr
    assert 'prog.py", line 2, in <module>' in err and "import apx_lazy_target" in err
    assert (
        "patch 'apx_lazy_target.where' (group LazyGroup, plugin 'apx_lazy' from apx-lazy 0.1.0)"
        in err
    )
    assert "ascend-patch run --disable LazyGroup" in err
    assert "ASCEND_PATCH_DISABLE=apx_lazy" in err
    assert "_installer.py" not in err and "The above exception" not in err
    assert err.count('  File "') <= 5, err  # the import line, importlib's three, one core line
    assert lenient.returncode == 0 and lenient.stdout == "first line ran\nafter the import\n"


def test_a_plugin_switch_uses_the_same_reader(tmp_path: Path) -> None:
    """The torch plugin's ASCEND_PATCH_NPU_ENV goes through the public env_flag: 'maybe'
    is reported (the plugin fails, naming the variable), never guessed."""
    env = clean_env(tmp_path, None, ASCEND_PATCH_NPU_ENV="maybe", ASCEND_PATCH_PLUGINS="torch")
    done = run(cli("report", "--json"), tmp_path, env)
    torch_plugin = next(
        r
        for r in json.loads(done.stdout)["records"]
        if r["kind"] == "plugin" and r["name"] == "torch"
    )
    assert torch_plugin["status"] == "failed"
    assert "ASCEND_PATCH_NPU_ENV='maybe' is neither on nor off" in torch_plugin["reason"]
    assert (
        ascend_patch_core.env_flag("ASCEND_PATCH_NPU_ENV", True, {"ASCEND_PATCH_NPU_ENV": "0"})
        is False
    )


@pytest.mark.slow
@pytest.mark.torch
def test_the_demo_s_numbers_add_up() -> None:
    """examples/demo.py: every report table's summary equals its rows plus those it hides,
    and the "by patch" list says how many patches it leaves out."""
    demo = Path(__file__).resolve().parent.parent / "examples" / "demo.py"
    done = subprocess.run([sys.executable, str(demo)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    tables = [i for i, line in enumerate(lines) if line.startswith("ascend-patch: ")]
    assert len(tables) == 3
    for start in tables:
        end = next((j for j in range(start + 1, len(lines)) if not lines[j].startswith("  ")), None)
        assert_adds_up("\n".join(lines[start:end]))
    header = next(line for line in lines if "CUDA calls redirected to torch.npu" in line)
    called = int(re.search(r"(\d+) patches", header)[1])  # type: ignore[index]
    listed = lines.index(header) + 1
    rows = [line for line in lines[listed:] if re.match(r"^ +\d+  \S", line)]
    other = re.search(r"in the other (\d+) patches", done.stdout)
    assert len(rows) - (1 if other else 0) + (int(other[1]) if other else 0) == called


DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize(
    "page",
    ["cli.md", "cli-reference.md", "cli.zh-CN.md", "cli-reference.zh-CN.md", "report-schema.md"],
)
def test_docs_quote_no_patch_count_without_saying_where_it_comes_from(page: str) -> None:
    """docs/cli.md said "217 patches" where doctor said 237: a count the plugins change
    is either not quoted, or quoted with where today's number comes from."""
    text = (DOCS / page).read_text()
    for block in re.findall(r"```json\n(.*?)```\n\n(.*?)\n\n", text, flags=re.S):
        if re.search(r'"(patches|applicable)": \d+', block[0]):
            assert "illustrative" in block[1], block[1]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for paragraph in prose.split("\n\n"):
        if re.search(r"\b\d+ (patches|个补丁)\b", paragraph):
            assert "ascend-patch doctor" in " ".join(paragraph.split()), paragraph


def test_a_patch_note_reaches_the_record_the_json_and_the_table():
    import types

    module = types.ModuleType("apx_noted_target")
    module.f = lambda: "original"
    sys.modules["apx_noted_target"] = module
    try:
        patcher = Patcher()
        patcher.add(AtomicPatch("apx_noted_target:f", lambda: "fast", note="kernel: portable"))
        report = patcher.apply()
        try:
            record = report.get("apx_noted_target:f")
            assert record.note == "kernel: portable"
            assert record.as_dict()["note"] == "kernel: portable"
            assert "apx_noted_target:f  (kernel: portable)" in report.table()
        finally:
            patcher.revert()
    finally:
        del sys.modules["apx_noted_target"]
    with pytest.raises(PatchDefinitionError, match="note must be a string"):
        AtomicPatch("apx_noted_target:f", lambda: 1, note=3)
