#!/usr/bin/env python3
"""Bootstrap the developer tools and run nox. Standard library only.

A fresh machine needs nothing but ``python3`` (3.10 or newer)::

    python3 dev.py test               # the sessions tagged "ci", two at a time
    python3 dev.py test -- -k plugin  # ... one after another, args after "--" to pytest
    python3 dev.py wheels             # build the compiled wheels two ci sessions need (once)
    python3 dev.py demo               # the main demo (nox -s demo)
    python3 dev.py -s bench           # anything else goes to nox as it is
    python3 dev.py --list             # the sessions there are

The first run creates ``.venv-dev/`` with a pinned nox in it; nox then builds one shared
base environment with torch (``.nox/_base-*``) and one small environment per session on
top of it (devenv.py; docs/dev.md has the design and the timings). ``dev.py test`` runs
the two sessions that compare with compiled third-party code (torch_plugin,
openmmlab_cpu_ops) only where ``dev.py wheels`` has cached their wheels; CI (.ci/run)
builds them first. The exit status is nox's (for ``dev.py test``: 1 if any session
failed; each session's log is also in ``.nox/logs/``).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
import time
import venv
from collections.abc import Callable
from pathlib import Path

import devenv


ROOT = Path(__file__).resolve().parent
VENV_DIR = ROOT / ".venv-dev"
NOX_VERSION = "2026.10.20"
MIN_PYTHON = (3, 10)

# Sub-commands that stand for a nox selection; everything else is passed to nox verbatim.
COMMANDS = {
    "demo": ["-s", "demo"],
    "wheels": ["-s", "wheels"],
}

#: What a first `dev.py test` on a machine costs (measured on 2 cores: docs/dev.md).
FIRST_RUN = (
    "first run here: downloads torch (CPU build, ~200 MB) and each session's framework"
    " stack, and fills .nox/ with about {disk} GB; about {minutes} min on 2 cores."
    " Later runs reuse .nox/"
)
FIRST_RUN_DISK_GB = 5
FIRST_RUN_MINUTES = 25

#: How often a line says which sessions are still running (seconds).
HEARTBEAT_S = 120.0


_PRINTING = threading.Lock()


def step(message: str) -> None:
    # One write per line under a lock: sessions start and end on two threads at once,
    # and print() writes the text and its newline separately.
    with _PRINTING:
        sys.stdout.write(f"dev.py: {message}\n")
        sys.stdout.flush()


def venv_python() -> Path:
    if os.name == "nt":
        return VENV_DIR / "Scripts" / "python.exe"
    return VENV_DIR / "bin" / "python"


def works(*args: str) -> bool:
    """Whether the dev venv's Python runs ``args`` successfully (quietly)."""
    python = venv_python()
    if not python.exists():
        return False
    result = subprocess.run(
        [str(python), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return result.returncode == 0


def pip(*args: str) -> None:
    subprocess.run(
        [str(venv_python()), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        check=True,
    )


def ensure_venv() -> None:
    if works("-c", "pass"):
        return
    version = ".".join(map(str, sys.version_info[:3]))
    step(f"creating {VENV_DIR.name}/ with Python {version}")
    # clear=True replaces a broken leftover (say, one whose Python was removed).
    venv.EnvBuilder(with_pip=True, clear=True).create(VENV_DIR)
    step(f"upgrading pip in {VENV_DIR.name}/")
    pip("install", "--upgrade", "pip")


def ensure_nox() -> None:
    check = f"import importlib.metadata as m, sys; sys.exit(m.version('nox') != {NOX_VERSION!r})"
    if works("-c", check):
        return
    step(f"installing nox=={NOX_VERSION} into {VENV_DIR.name}/")
    pip("install", f"nox=={NOX_VERSION}")


def nox_args(argv: list[str]) -> list[str]:
    """Translate ``dev.py`` arguments into nox arguments."""
    if argv and argv[0] in COMMANDS:
        return [*COMMANDS[argv[0]], *argv[1:]]
    return argv


def ci_sessions() -> list[str]:
    """The names of the sessions tagged ``ci``, as ``nox --list`` prints them."""
    listing = subprocess.run(
        [str(venv_python()), "-m", "nox", "-t", "ci", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split()[1] for line in listing.splitlines() if line.startswith("* ")]


def select_sessions(
    sessions: list[str], missing: list[devenv.CompiledWheel]
) -> tuple[list[str], list[str]]:
    """The sessions to run, and lines saying which are left out and why.

    A session whose compiled wheel is not cached would build it first (5 to 30 minutes
    on 2 cores): left out, with the command that builds it (CI runs that first).
    """
    skipped = {w.session: w for w in missing if w.session in sessions}
    notes = [
        f"skipping {name}: its {wheel.requirement} wheel (built from source, about"
        f" {wheel.minutes} min on 2 cores) is not in {devenv.wheel_cache()}"
        for name, wheel in skipped.items()
    ]
    if notes:
        notes.append("`python3 dev.py wheels` builds them once; `dev.py test` then runs them")
    return [s for s in sessions if s not in skipped], notes


def nox_session(name: str, log: Path) -> int:
    """Run one nox session, its output to ``log``; nox's exit status."""
    with open(log, "w", encoding="utf-8") as handle:
        return subprocess.call(
            [str(venv_python()), "-m", "nox", "-s", name],
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def run_in_parallel(
    sessions: list[str],
    jobs: int,
    runner: Callable[[str, Path], int] = nox_session,
    logs: Path = ROOT / ".nox" / "logs",
    heartbeat: float = HEARTBEAT_S,
) -> int:
    """Run ``sessions`` ``jobs`` at a time, saying as it happens which start and end.

    Two cores run two sessions in about the time of the longest chain, instead of one
    after another (the ``tests`` session alone is a quarter of a serial run). Each
    session writes to its own log under ``.nox/logs/``: a failed session's log is
    printed when it ends, a passed one's stays in its file. Every ``heartbeat`` seconds
    a line names the sessions still running, so a long session is not silence. The
    status is 1 if any session failed.
    """
    logs.mkdir(parents=True, exist_ok=True)
    total = len(sessions)
    started: dict[str, float] = {}
    results: list[tuple[str, int, float]] = []

    def run(name: str) -> tuple[str, int, float]:
        started[name] = time.monotonic()
        step(f"[{sessions.index(name) + 1}/{total}] {name}: started")
        code = runner(name, logs / f"{name}.log")
        return name, code, time.monotonic() - started[name]

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        pending = {pool.submit(run, name) for name in sessions}
        while pending:
            done, pending = concurrent.futures.wait(
                pending, timeout=heartbeat, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in done:
                name, code, seconds = future.result()
                results.append((name, code, seconds))
                log = logs / f"{name}.log"
                if code:
                    sys.stdout.write(log.read_text(encoding="utf-8", errors="replace"))
                verdict = "passed" if code == 0 else "FAILED"
                where = log.relative_to(ROOT) if log.is_relative_to(ROOT) else log
                # The session's own number, as on its "started" line; the count finished after.
                number = sessions.index(name) + 1
                step(
                    f"[{number}/{total}] {name}: {verdict} in {minutes(seconds)} "
                    f"({where}; {len(results)} of {total} done)"
                )
            if not done:
                now = time.monotonic()
                running = [
                    f"{n} ({minutes(now - t)})"
                    for n, t in started.items()
                    if n not in {r[0] for r in results}
                ]
                step(f"still running: {', '.join(running)}")
    failed = [name for name, code, _ in results if code]
    for name, code, seconds in sorted(results, key=lambda r: sessions.index(r[0])):
        print(f"  {'ok    ' if code == 0 else 'FAILED'} {name} ({seconds:.0f} s)")
    step(f"{len(results) - len(failed)} of {len(results)} sessions passed")
    sys.stdout.flush()
    return 1 if failed else 0


def plan_test_run() -> tuple[list[str], list[str]]:
    """``dev.py test``: the sessions to run and what to say before running them."""
    sessions, notes = select_sessions(ci_sessions(), devenv.missing_wheels())
    if not any((ROOT / ".nox").glob("_base-*")):
        notes.insert(0, FIRST_RUN.format(disk=FIRST_RUN_DISK_GB, minutes=FIRST_RUN_MINUTES))
    return sessions, notes


def main(argv: list[str]) -> int:
    if sys.version_info < MIN_PYTHON:
        wanted = ".".join(map(str, MIN_PYTHON))
        print(f"dev.py: needs Python {wanted} or newer, this is {sys.version.split()[0]}")
        return 2
    ensure_venv()
    ensure_nox()
    if argv[:1] == ["test"]:
        sessions, notes = plan_test_run()
        for note in notes:
            step(note)
        if argv == ["test"]:
            # Two sessions at a time on a machine with two cores or more
            # (ASCEND_PATCH_CI_JOBS overrides; 1 runs them one after another).
            jobs = int(os.environ.get("ASCEND_PATCH_CI_JOBS", min(2, os.cpu_count() or 1)))
            step(f"running {len(sessions)} sessions, {jobs} at a time: {', '.join(sessions)}")
            try:
                return run_in_parallel(sessions, max(1, jobs))
            except KeyboardInterrupt:
                return 130
        # `dev.py test [NOX ARGS] [-- PYTEST ARGS]`: nox runs them one after another and
        # forwards what follows "--" to the sessions as posargs (the tests one to pytest).
        argv = ["-s", *sessions, *argv[1:]]
    args = nox_args(argv)
    step("running " + " ".join(["nox", *args]))
    try:
        return subprocess.call([str(venv_python()), "-m", "nox", *args], cwd=ROOT)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
