"""One bad plugin fails alone, with provenance, however it goes wrong -- through ``apply()``,
``ascend-patch run`` and ``ascend-patch doctor``, the three ways users meet plugins.

The bad plugins here do what tests/test_plugins.py's do not: raise from a generator
while their result is read, call ``sys.exit()`` (in a hook, at import, in a group's
``patches()``, in a precheck), return objects whose ``__iter__``, ``__len__``,
``items()`` or ``__repr__`` raise, and hang (in a hook, at import). Each is a real
distribution found through its entry point (a ``.dist-info`` on PYTHONPATH), all
installed together beside a healthy plugin, so each must also leave the others alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest


BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"

HEALTHY = """
from ascend_patch_core import AtomicPatch, hookimpl


def where():
    return "patched"


@hookimpl
def register_patches():
    return [AtomicPatch("apx_iso_target.where", "apx_iso_good:where")]
"""

TARGET = """
def where():
    return "original"


def other():
    return "original"
"""

#: plugin name -> (its module's source, what its failure reason must say).
BAD: dict[str, tuple[str, str]] = {
    "apx_iso_generator": (
        """
        from ascend_patch_core import hookimpl

        @hookimpl
        def register_patches():
            yield from ()
            raise RuntimeError("generator broke mid-iteration")
        """,
        "hook register_patches returned a generator that raised RuntimeError: "
        "generator broke mid-iteration when it was read",
    ),
    "apx_iso_exit_hook": (
        """
        import sys
        from ascend_patch_core import hookimpl

        @hookimpl
        def register_patches():
            sys.exit(3)
        """,
        "hook register_patches called sys.exit(3)",
    ),
    "apx_iso_exit_import": (
        """
        import sys
        sys.exit("leaving at import")
        """,
        "importing 'apx_iso_exit_import' called sys.exit('leaving at import')",
    ),
    "apx_iso_iter": (
        """
        from ascend_patch_core import hookimpl

        class Declarations:
            def __iter__(self):
                raise LookupError("no iteration today")

        @hookimpl
        def register_import_rules():
            return Declarations()
        """,
        "hook register_import_rules returned a Declarations that raised LookupError: "
        "no iteration today when it was read",
    ),
    "apx_iso_len": (
        """
        from ascend_patch_core import hookimpl

        class Declarations:
            def __iter__(self):
                return iter(())

            def __len__(self):
                raise ArithmeticError("len is broken")

        @hookimpl
        def register_patches():
            return Declarations()
        """,
        "raised ArithmeticError: len is broken when it was read",
    ),
    "apx_iso_items": (
        """
        from collections.abc import Mapping
        from ascend_patch_core import hookimpl

        class Settings(Mapping):
            def __getitem__(self, key):
                raise KeyError(key)

            def __iter__(self):
                raise OSError("cannot list the settings")

            def __len__(self):
                return 1

        @hookimpl
        def configure_env():
            return Settings()
        """,
        "hook configure_env returned a Settings that raised OSError: cannot list the settings",
    ),
    "apx_iso_repr": (
        """
        from ascend_patch_core import hookimpl

        class Odd:
            def __repr__(self):
                raise RuntimeError("no repr")

        @hookimpl
        def register_patches():
            return [Odd()]
        """,
        "register_patches returned <Odd object whose repr() raised>; expected Patch subclasses",
    ),
    "apx_iso_hang_hook": (
        """
        import time
        from ascend_patch_core import hookimpl

        @hookimpl
        def register_patches():
            time.sleep(3600)
        """,
        "did not finish within 1 s (ASCEND_PATCH_PLUGIN_TIMEOUT): it was stopped in hook "
        "register_patches at ",
    ),
    "apx_iso_hang_import": (
        """
        import threading
        threading.Event().wait()
        """,
        "did not finish within 1 s (ASCEND_PATCH_PLUGIN_TIMEOUT): it was stopped importing "
        "'apx_iso_hang_import' at ",
    ),
}

#: Healthy plugins whose lazily evaluated parts call sys.exit(): that part fails, nothing exits.
LAZY_EXITS = """
import sys
from ascend_patch_core import AtomicPatch, Patch, hookimpl


class ExitingGroup(Patch):
    @classmethod
    def patches(cls, options=None):
        sys.exit(4)


def _exit_precheck(original):
    sys.exit(5)


@hookimpl
def register_patches():
    return [
        ExitingGroup,
        AtomicPatch("apx_iso_target.other", lambda: "patched", precheck=_exit_precheck),
    ]
"""

PROGRAM = """
import apx_iso_target
print(apx_iso_target.where(), apx_iso_target.other())
"""


def install(site: Path, plugin: str, source: str) -> None:
    dist = plugin.replace("_", "-")
    info = site / f"{plugin}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[ascend_patch]\n{plugin} = {plugin}\n")
    (site / f"{plugin}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    (root / "apx_iso_target.py").write_text(TARGET)
    install(root, "apx_iso_good", HEALTHY)
    install(root, "apx_iso_lazy", LAZY_EXITS)
    for name, (source, _) in BAD.items():
        install(root, name, source)
    (tmp_path / "prog.py").write_text(PROGRAM)
    return root


def env_for(tmp_path: Path, site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(
        ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=str(site),
        # Only the plugins of this test (the first-party ones are installed too).
        ASCEND_PATCH_PLUGINS=",".join(["apx_iso_good", "apx_iso_lazy", *BAD]),
        ASCEND_PATCH_PLUGIN_TIMEOUT="1",
    )
    env.update(extra)
    return env


def cli(*args: str) -> list[str]:
    if CLI.exists():
        return [str(CLI), *args]
    return [sys.executable, "-m", "ascend_patch_core._cli", *args]


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def assert_bad_plugins_failed_alone(reasons: dict[str, str], site: Path) -> None:
    """Every bad plugin failed with its distribution, version, file and cause."""
    for name, (_, expected) in BAD.items():
        reason = reasons[name]
        assert reason.startswith(f"plugin {name!r} from {name.replace('_', '-')} 0.1.0 ("), reason
        assert str(site / f"{name}.py") in reason, reason
        assert expected in reason, reason


APPLY = """
import json, ascend_patch_core
report = ascend_patch_core.apply()
import apx_iso_target
print(json.dumps({
    "where": apx_iso_target.where(),
    "other": apx_iso_target.other(),
    "records": [[r.kind, r.name, r.status.value, r.reason] for r in report.records],
}))
"""


def test_apply_records_each_bad_plugin_and_applies_the_good_one(tmp_path: Path, site: Path) -> None:
    """apply(): no exception, no exit; every bad plugin FAILED with provenance; the good one applied."""
    done = run([sys.executable, "-c", APPLY], tmp_path, env_for(tmp_path, site))

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    plugins = {
        name: (status, reason)
        for kind, name, status, reason in result["records"]
        if kind == "plugin"
    }
    assert_bad_plugins_failed_alone({n: r for n, (s, r) in plugins.items() if s == "failed"}, site)
    assert plugins["apx_iso_good"][0] == plugins["apx_iso_lazy"][0] == "applied"
    assert result["where"] == "patched"
    # The lazily evaluated parts of a healthy plugin: each fails alone too.
    records = {name: (status, reason) for _, name, status, reason in result["records"]}
    assert records["ExitingGroup"] == ("failed", "ExitingGroup.patches() called sys.exit(4)")
    status, reason = records["apx_iso_target.other"]
    assert status == "failed" and "precheck raised SystemExit: 5" in reason
    assert result["other"] == "original"


def test_run_runs_the_program_with_the_good_plugin_and_names_each_bad_one(
    tmp_path: Path, site: Path
) -> None:
    """ascend-patch run: the program runs patched by the good plugin; one stderr line per bad plugin."""
    done = run(cli("run", "prog.py"), tmp_path, env_for(tmp_path, site))

    assert done.returncode == 0, done.stderr
    assert done.stdout == "patched original\n"
    lines = [line for line in done.stderr.splitlines() if " -- running without it" in line]
    reasons = {}
    for line in lines:
        assert line.startswith("ascend-patch run: plugin '"), line
        reasons[line.split("'")[1]] = line.removeprefix("ascend-patch run: ")
    assert sorted(reasons) == sorted(BAD)
    assert_bad_plugins_failed_alone(reasons, site)


def test_doctor_reports_each_bad_plugin_and_loads_the_good_one(tmp_path: Path, site: Path) -> None:
    """ascend-patch doctor --json: exit 1, each bad plugin broken with its reason, the good one loaded."""
    done = run(cli("doctor", "--json"), tmp_path, env_for(tmp_path, site))

    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    plugins = {p["name"]: p for p in result["plugins"]}
    assert plugins["apx_iso_good"]["status"] == "loaded"
    reasons = {name: p["reason"] for name, p in plugins.items() if p["status"] == "broken"}
    assert sorted(reasons) == sorted(BAD)
    assert_bad_plugins_failed_alone(reasons, site)
    broken = [f["message"] for f in result["findings"] if f["code"] == "plugin-broken"]
    assert sorted(broken) == sorted(reasons.values())


def test_strict_mode_still_stops_and_names_the_plugin(tmp_path: Path, site: Path) -> None:
    """--strict: a plugin whose generator raises stops the program before its first line, named."""
    env = env_for(tmp_path, site, ASCEND_PATCH_PLUGINS="apx_iso_good,apx_iso_generator")

    done = run(cli("run", "--strict", "prog.py"), tmp_path, env)

    assert done.returncode == 1 and done.stdout == ""
    assert "plugin 'apx_iso_generator' from apx-iso-generator 0.1.0" in done.stderr
    assert "generator broke mid-iteration" in done.stderr
    assert "--disable apx_iso_generator" in done.stderr
    assert "Traceback" not in done.stderr


def test_keyboard_interrupt_in_a_plugin_still_stops_the_program(tmp_path: Path, site: Path) -> None:
    """Ctrl-C belongs to the user: a KeyboardInterrupt while a plugin loads is not contained."""
    install(site, "apx_iso_ctrl_c", "raise KeyboardInterrupt\n")
    env = env_for(tmp_path, site, ASCEND_PATCH_PLUGINS="apx_iso_good,apx_iso_ctrl_c")
    code = "import ascend_patch_core\ntry:\n    ascend_patch_core.apply()\nexcept KeyboardInterrupt:\n    print('interrupted')\n"

    done = run([sys.executable, "-c", code], tmp_path, env)

    assert (done.returncode, done.stdout) == (0, "interrupted\n"), done.stderr


THREADED_APPLY = """
import json, threading, ascend_patch_core
found = {}
worker = threading.Thread(target=lambda: found.update(report=ascend_patch_core.apply()))
worker.start()
worker.join()
import apx_iso_target
print(json.dumps({
    "where": apx_iso_target.where(),
    "plugins": {r.name: r.reason for r in found["report"].records if r.kind == "plugin"},
}))
"""


def test_a_bound_outside_the_main_thread_leaves_the_hanging_plugin_behind(
    tmp_path: Path, site: Path
) -> None:
    """apply() from another thread cannot use an alarm: the hanging plugin is left running in a
    thread of its own, reported as such, and the good plugin applies."""
    env = env_for(tmp_path, site, ASCEND_PATCH_PLUGINS="apx_iso_good,apx_iso_hang_hook")

    done = run([sys.executable, "-c", THREADED_APPLY], tmp_path, env)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["where"] == "patched"
    reason = result["plugins"]["apx_iso_hang_hook"]
    assert "did not finish within 1 s (ASCEND_PATCH_PLUGIN_TIMEOUT)" in reason
    assert "it is still in hook register_patches at " in reason
    assert f"{site / 'apx_iso_hang_hook.py'}:7 in register_patches" in reason
    assert "left running" in reason


ALARM_KEPT = """
import json, signal, ascend_patch_core
def mine(signum, frame):
    pass
signal.signal(signal.SIGALRM, mine)
signal.setitimer(signal.ITIMER_REAL, 600)
report = ascend_patch_core.apply()
left, interval = signal.getitimer(signal.ITIMER_REAL)
print(json.dumps({
    "handler_kept": signal.getsignal(signal.SIGALRM) is mine,
    "timer_left": left,
    "failed": sorted(r.name for r in report.records if r.kind == "plugin" and r.status.value == "failed"),
}))
"""


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX alarms only")
def test_the_alarm_bound_gives_the_program_its_own_alarm_back(tmp_path: Path, site: Path) -> None:
    """The bound borrows SIGALRM: the program's handler and its timer (less the time spent) come back."""
    env = env_for(tmp_path, site, ASCEND_PATCH_PLUGINS="apx_iso_good,apx_iso_hang_hook")

    done = run([sys.executable, "-c", ALARM_KEPT], tmp_path, env)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["handler_kept"] is True
    assert 590 < result["timer_left"] <= 599.5  # one second went to the hanging plugin
    assert result["failed"] == ["apx_iso_hang_hook"]


def test_apply_alone_has_no_bound_unless_asked(tmp_path: Path, site: Path) -> None:
    """Without ASCEND_PATCH_PLUGIN_TIMEOUT, apply() in a program sets no alarm and starts no thread:
    a plugin that takes 2 s loads (it is slow, not broken)."""
    install(
        site,
        "apx_iso_slow",
        HEALTHY.replace("def where", "import time\ntime.sleep(2)\n\n\ndef where").replace(
            "apx_iso_good:where", "apx_iso_slow:where"
        ),
    )
    env = env_for(tmp_path, site, ASCEND_PATCH_PLUGINS="apx_iso_slow")
    del env["ASCEND_PATCH_PLUGIN_TIMEOUT"]
    code = "import ascend_patch_core as a, sys\nr = a.apply()\nprint(r.ok, 'ascend_patch_core._discovery.plugin_bound' in sys.modules)"

    done = run([sys.executable, "-c", code], tmp_path, env)

    assert (done.returncode, done.stdout) == (0, "True False\n"), done.stderr


@pytest.mark.slow
def test_doctor_bounds_a_hanging_plugin_by_default(tmp_path: Path, site: Path) -> None:
    """doctor with ASCEND_PATCH_PLUGIN_TIMEOUT unset: the commands' bound (10 s) reports the hang."""
    env = env_for(tmp_path, site, ASCEND_PATCH_PLUGINS="apx_iso_good,apx_iso_hang_hook")
    del env["ASCEND_PATCH_PLUGIN_TIMEOUT"]

    done = run(cli("doctor", "--json"), tmp_path, env)

    assert done.returncode == 1, done.stderr
    plugins: dict[str, Any] = {p["name"]: p for p in json.loads(done.stdout)["plugins"]}
    assert plugins["apx_iso_good"]["status"] == "loaded"
    reason = plugins["apx_iso_hang_hook"]["reason"]
    assert "did not finish within 10 s (ASCEND_PATCH_PLUGIN_TIMEOUT)" in reason
    assert f"{site / 'apx_iso_hang_hook.py'}:7 in register_patches" in reason


UNHASHABLE_GROUP = """
from ascend_patch_core import AtomicPatch, Patch, hookimpl


class Unhashable(type):
    def __hash__(cls):
        raise TypeError("this metaclass refuses to hash")


class OddGroup(Patch, metaclass=Unhashable):
    @classmethod
    def patches(cls, options=None):
        return [AtomicPatch("apx_iso_target.other", lambda: "patched")]


@hookimpl
def register_patches():
    return [OddGroup]
"""


def test_a_group_whose_metaclass_raises_fails_alone(tmp_path: Path, site: Path) -> None:
    """A plugin's group class that cannot be hashed (planning looks it up in a set): that group
    fails with its plugin named; apply() returns and the good plugin's patch is applied."""
    install(site, "apx_iso_unhashable", UNHASHABLE_GROUP)
    env = env_for(tmp_path, site, ASCEND_PATCH_PLUGINS="apx_iso_good,apx_iso_unhashable")

    done = run([sys.executable, "-c", APPLY], tmp_path, env)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    records = {name: (kind, status, reason) for kind, name, status, reason in result["records"]}
    assert records["OddGroup"] == (
        "group",
        "failed",
        "planning it raised TypeError: this metaclass refuses to hash",
    )
    assert result["where"] == "patched" and result["other"] == "original"
