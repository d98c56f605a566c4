"""fork() while other threads apply, revert and import patched modules (#22 item 4).

DataLoader workers are forked from the main thread while other threads may be inside
apply(), revert() or the import of a patched module. A lock or a wait such a thread
held stays held in the child, which has only the forking thread: the child hung
(27 of 50 in the issue's run). Each test runs a real program, as users do, that forks
many children while threads churn; every child must import patched modules, apply,
revert and exit within a deadline, and see each patch whole or not at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")

#: The program: argv = package, iterations, modules per iteration.
_PROGRAM = textwrap.dedent(
    r"""
    import importlib
    import os
    import random
    import sys
    import threading
    import time
    import warnings

    # Python 3.12+ warns that fork() with threads may deadlock the child: the point here.
    warnings.simplefilter("ignore", DeprecationWarning)

    from ascend_patch_core import AtomicPatch, Patcher

    PKG, ITERATIONS, MODULES = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    CHILD_DEADLINE_S = 20.0
    random.seed(22)


    def patched_f():
        return "patched f"


    def patched_g():
        return "patched g"


    def names(i):
        return [f"{PKG}.it{i}.m{k}" for k in range(MODULES)]


    every = [name for i in range(ITERATIONS + 1) for name in names(i)]
    # Applied once: each module must have g patched from its first import, in parent and child.
    steady = Patcher()
    for name in every:
        steady.add(AtomicPatch(f"{name}.g", patched_g, name=f"g:{name}"))
    steady.apply()
    # Applied and reverted in a loop by a thread while the main thread forks.
    churn = Patcher()
    for name in every:
        churn.add(AtomicPatch(f"{name}.f", patched_f, name=f"f:{name}"))


    def check(where, modules, churn_applied):
        for name in modules:
            module = sys.modules[name]
            if module.g() != "patched g":
                sys.exit(f"{where}: {name}.g is not patched: {steady.report.get(chr(103)+chr(58)+name)!r} {steady.report.get(chr(103)+chr(58)+name).reason} {module.g}")
            record = churn.report.get(f"f:{name}")
            expected = "patched f" if churn_applied else "original f"
            if module.f() != expected:
                sys.exit(f"{where}: {name}.f() is {module.f()!r}, churn applied={churn_applied}")
            if churn_applied and record.status.value != "applied":
                sys.exit(f"{where}: {name}.f is patched but its record is {record.status.value}")


    def child(i):
        # The patch of a module whose import a parent thread had begun or not begun.
        modules = [importlib.import_module(name).__name__ for name in names(i)]
        # The churn patcher as the fork left it: each patch whole or not at all.
        for name in modules:
            record = churn.report.get(f"f:{name}")
            value = sys.modules[name].f()
            if (value == "patched f") != (record.status.value == "applied"):
                sys.exit(f"child: {name}.f() is {value!r} but its record is {record.status.value}")
        churn.revert()
        check("child after revert()", modules, False)
        churn.apply()
        check("child after apply()", modules, True)
        later = importlib.import_module(f"{PKG}.it{ITERATIONS}.m0")
        if later.f() != "patched f" or later.g() != "patched g":
            sys.exit("child: a module first imported after apply() is not patched")
        churn.revert()
        check("child after the last revert()", modules, False)


    def churner(stop):
        while not stop.is_set():
            churn.apply()
            churn.revert()


    def importer(i):
        for name in names(i):
            importlib.import_module(name)


    for i in range(ITERATIONS):
        stop = threading.Event()
        threads = [
            threading.Thread(target=churner, args=(stop,)),
            threading.Thread(target=importer, args=(i,)),
        ]
        for thread in threads:
            thread.start()
        time.sleep(random.random() * 0.02)
        pid = os.fork()
        if pid == 0:
            try:
                child(i)
            except SystemExit as exc:
                print(exc, file=sys.stderr, flush=True)
                os._exit(1)
            except BaseException as exc:
                print(f"child: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                os._exit(1)
            os._exit(0)
        deadline = time.monotonic() + CHILD_DEADLINE_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                stop.set()
                sys.exit(f"iteration {i}: the child hung (killed after {CHILD_DEADLINE_S} s)")
            time.sleep(0.005)
        stop.set()
        for thread in threads:
            thread.join()
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"iteration {i}: the child failed ({os.waitstatus_to_exitcode(status)})")
        check("parent", names(i), False)
    print("ok")
    """
)


def _package(root: Path, iterations: int, modules: int) -> str:
    """A package whose modules take a moment to import (the window a fork() hits)."""
    package = root / "forkpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    body = textwrap.dedent(
        """
        import time

        time.sleep(0.003)


        def f():
            return "original f"


        def g():
            return "original g"
        """
    )
    for i in range(iterations + 1):  # the last one is first imported by the children
        sub = package / f"it{i}"
        sub.mkdir()
        (sub / "__init__.py").write_text("")
        for k in range(modules):
            (sub / f"m{k}.py").write_text(body)
    return "forkpkg"


def test_children_forked_while_threads_apply_revert_and_import_never_hang(
    tmp_path: Path,
) -> None:
    """Forks during apply()/revert() and imports of patched modules: every child finishes.

    Each child imports patched modules (some a parent thread was importing at the
    fork), sees each patch whole, and can revert() and apply() again.
    """
    iterations, modules = 30, 6
    package = _package(tmp_path, iterations, modules)
    program = tmp_path / "forking.py"
    program.write_text(_PROGRAM)
    path = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        [sys.executable, str(program), package, str(iterations), str(modules)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_the_fork_machinery_loads_only_at_the_first_fork() -> None:
    """Importing the core and creating a Patcher stay cheap: ``_fork`` loads at a fork()."""
    code = textwrap.dedent(
        """
        import os, sys
        import ascend_patch_core
        ascend_patch_core.Patcher().apply()
        assert "ascend_patch_core._engine.fork" not in sys.modules
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        assert "ascend_patch_core._engine.fork" in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
