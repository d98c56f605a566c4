#!/usr/bin/env python3
"""Bootstrap the developer tools and run nox. Standard library only.

A fresh machine needs nothing but ``python3`` (3.10 or newer)::

    python3 dev.py test               # every session tagged "ci", two at a time (CI runs this)
    python3 dev.py test -- -k plugin  # ... one after another, args after "--" to pytest
    python3 dev.py demo               # the main demo (nox -s demo)
    python3 dev.py -s bench           # anything else goes to nox as it is
    python3 dev.py --list             # the sessions there are

The first run creates ``.venv-dev/`` with a pinned nox in it; nox then builds one
environment per session under ``.nox/``. The exit status is nox's (for ``dev.py test``:
1 if any session failed; each session's log is also in ``.nox/logs/``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path


ROOT = Path(__file__).resolve().parent
VENV_DIR = ROOT / ".venv-dev"
NOX_VERSION = "2026.10.20"
MIN_PYTHON = (3, 10)

# Sub-commands that stand for a nox selection; everything else is passed to nox verbatim.
COMMANDS = {
    "test": ["-t", "ci"],
    "demo": ["-s", "demo"],
}


def step(message: str) -> None:
    print(f"dev.py: {message}", flush=True)


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
        # `dev.py test [NOX ARGS] [-- PYTEST ARGS]`: nox forwards what follows "--"
        # to the sessions as posargs, which the tests session hands to pytest.
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


def run_in_parallel(sessions: list[str], jobs: int) -> int:
    """Run ``sessions`` ``jobs`` at a time; print each one's output when it ends.

    Two cores run two sessions in about the time of the longest chain, instead of one
    after another (the ``tests`` session alone is over half of a serial run). Each
    session writes to its own log under ``.nox/logs/``; the summary at the end says
    which passed, with their durations. The status is 1 if any session failed.
    """
    import concurrent.futures
    import time

    logs = ROOT / ".nox" / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def run(name: str) -> tuple[str, int, float]:
        started = time.monotonic()
        with open(logs / f"{name}.log", "w", encoding="utf-8") as log:
            code = subprocess.call(
                [str(venv_python()), "-m", "nox", "-s", name],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return name, code, time.monotonic() - started

    results: list[tuple[str, int, float]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in concurrent.futures.as_completed([pool.submit(run, s) for s in sessions]):
            name, code, seconds = future.result()
            results.append((name, code, seconds))
            sys.stdout.write((logs / f"{name}.log").read_text(encoding="utf-8", errors="replace"))
            step(f"session {name}: {'passed' if code == 0 else 'FAILED'} in {seconds:.0f} s")
            sys.stdout.flush()
    failed = [name for name, code, _ in results if code]
    for name, code, seconds in sorted(results, key=lambda r: sessions.index(r[0])):
        print(f"  {'ok    ' if code == 0 else 'FAILED'} {name} ({seconds:.0f} s)")
    step(f"{len(results) - len(failed)} of {len(results)} sessions passed")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if sys.version_info < MIN_PYTHON:
        wanted = ".".join(map(str, MIN_PYTHON))
        print(f"dev.py: needs Python {wanted} or newer, this is {sys.version.split()[0]}")
        return 2
    ensure_venv()
    ensure_nox()
    if argv == ["test"]:
        # The whole CI set, two sessions at a time on a machine with two cores or more
        # (ASCEND_PATCH_CI_JOBS overrides; 1 runs them one after another, as nox would).
        jobs = int(os.environ.get("ASCEND_PATCH_CI_JOBS", min(2, os.cpu_count() or 1)))
        sessions = ci_sessions()
        step(f"running {len(sessions)} sessions, {jobs} at a time: {', '.join(sessions)}")
        try:
            return run_in_parallel(sessions, max(1, jobs))
        except KeyboardInterrupt:
            return 130
    args = nox_args(argv)
    step("running " + " ".join(["nox", *args]))
    try:
        return subprocess.call([str(venv_python()), "-m", "nox", *args], cwd=ROOT)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
