#!/usr/bin/env python3
"""Bootstrap the developer tools and run nox. Standard library only.

A fresh machine needs nothing but ``python3`` (3.10 or newer)::

    python3 dev.py test               # every session tagged "ci": tests, lint, typecheck
    python3 dev.py test -- -k plugin  # ... with the args after "--" passed on to pytest
    python3 dev.py demo               # the main demo (nox -s demo)
    python3 dev.py -s bench           # anything else goes to nox as it is
    python3 dev.py --list             # the sessions there are

The first run creates ``.venv-dev/`` with a pinned nox in it; nox then builds one
environment per session under ``.nox/``. The exit status is nox's.
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


def main(argv: list[str]) -> int:
    if sys.version_info < MIN_PYTHON:
        wanted = ".".join(map(str, MIN_PYTHON))
        print(f"dev.py: needs Python {wanted} or newer, this is {sys.version.split()[0]}")
        return 2
    ensure_venv()
    ensure_nox()
    args = nox_args(argv)
    step("running " + " ".join(["nox", *args]))
    try:
        return subprocess.call([str(venv_python()), "-m", "nox", *args], cwd=ROOT)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
