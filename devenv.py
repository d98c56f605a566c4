"""What dev.py and noxfile.py share: the shared torch environment and the compiled wheels.

Standard library only: dev.py imports it before anything is installed, and nox imports it
from the noxfile's directory. docs/dev.md explains the design; in short:

* One *base environment* per Python (``.nox/_base-cp311``) holds requirements/tests.txt
  (torch and the test tools). Every session that needs torch is layered on it by a
  ``.pth`` file, the way ``--system-site-packages`` layers a venv on its interpreter:
  the session's own packages come first, the base's after them. torch is installed and
  stored once instead of once per session (it was ~1 GB and ~30 s each).
* torch comes from the PyTorch CPU index (``CPU_TORCH_INDEX``): on PyPI, Linux torch is
  the CUDA build with ~17 ``nvidia-*`` wheels (5 GB) that no session uses.
* Two sessions compare with compiled third-party code that PyPI has no wheel of for CPU
  (mmcv 2.1.0 with its ops, torch_scatter): ``dev.py wheels`` builds those wheels once
  into the project's wheel cache, and ``dev.py test`` runs the two sessions only where
  the wheels are cached (CI builds them first, so CI runs everything).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path


ROOT = Path(__file__).resolve().parent
BASE_REQUIREMENTS = ROOT / "requirements" / "tests.txt"

#: Where pip finds the CPU-only builds of torch. Overridden by ASCEND_PATCH_TORCH_INDEX
#: (an empty value: only the indexes pip is configured with).
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"

#: The file that layers a session on the base environment (in the session's site-packages).
#: site runs .pth files in name order: "00" first, so that the base is on sys.path before
#: the others run (the start hook of `ascend-patch run` imports pluggy, which is in the base).
LAYER_FILE = "00_devenv_base.pth"


def torch_index() -> str:
    return os.environ.get("ASCEND_PATCH_TORCH_INDEX", CPU_TORCH_INDEX)


def torch_pin(requirements: Path = BASE_REQUIREMENTS) -> str:
    """The torch version requirements/tests.txt pins (``torch==X``)."""
    match = re.search(r"^torch==(\S+)", requirements.read_text(encoding="utf-8"), re.M)
    if not match:
        raise ValueError(f"{requirements} pins no torch version (torch==X)")
    return match.group(1)


def wheel_cache() -> Path:
    """The project's cache of compiled wheels (ASCEND_PATCH_WHEEL_CACHE overrides)."""
    default = Path.home() / ".cache" / "ascend-patch" / "wheels"
    return Path(os.environ.get("ASCEND_PATCH_WHEEL_CACHE", default))


@dataclass(frozen=True)
class CompiledWheel:
    """A third-party wheel built from source for one torch version and Python."""

    session: str  #: the ci session that needs it
    requirement: str  #: what is built, as pip names it
    prefix: str  #: the wheel file name up to the Python tag
    minutes: int  #: about how long the build takes on 2 idle cores
    env: dict[str, str] = field(default_factory=dict)  #: build settings
    #: Its session runs on the stack Python (3.11+; see STACK_PYTHON in noxfile.py).
    stack_python: bool = False


COMPILED = (
    CompiledWheel("torch_plugin", "torch-scatter==2.1.2", "torch_scatter-2.1.2", 5),
    CompiledWheel(
        "openmmlab_cpu_ops",
        "mmcv==2.1.0",
        "mmcv-2.1.0",
        25,
        # The sdist's setup.py imports torch and pkg_resources (setuptools<81, in the
        # base); MMCV_WITH_OPS compiles the CPU kernels the parity tests compare with.
        env={"MMCV_WITH_OPS": "1", "FORCE_CUDA": "0", "MAX_JOBS": "2"},
        stack_python=True,
    ),
)


def cached(
    wheel: CompiledWheel, python_tags: list[str], torch_version: str, cache: Path
) -> Path | None:
    """The cached wheel for ``torch_version`` (and its local builds: ``2.13.0+cpu``), if any."""
    if not cache.is_dir():
        return None
    folders = [f for f in cache.iterdir() if f.name.split("+")[0] == f"torch-{torch_version}"]
    for folder in sorted(folders):
        for tag in python_tags:
            found = sorted(folder.glob(f"{wheel.prefix}-{tag}-*.whl"))
            if found:
                return found[0]
    return None


def python_tags(wheel: CompiledWheel, version: tuple[int, int]) -> list[str]:
    """The tags of the Pythons ``wheel``'s session may run on when dev.py runs on ``version``."""
    if wheel.stack_python and version < (3, 11):
        return ["cp311", "cp312", "cp313"]  # whichever 3.11+ the machine has
    return [f"cp{version[0]}{version[1]}"]


def missing_wheels(
    version: tuple[int, int] | None = None, cache: Path | None = None
) -> list[CompiledWheel]:
    """The compiled wheels not in the cache for the pinned torch (and their sessions)."""
    version = version or (sys.version_info[0], sys.version_info[1])
    cache = cache or wheel_cache()
    pin = torch_pin()
    return [w for w in COMPILED if not cached(w, python_tags(w, version), pin, cache)]


# --------------------------------------------------------------------- base environment


def _stamp(index: str) -> str:
    """What the base was built from: rebuilt when the requirements or the index change."""
    digest = hashlib.sha256(BASE_REQUIREMENTS.read_bytes())
    digest.update(index.encode())
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``: dev.py runs two sessions at once, and both may
    find the base missing; the second waits and then finds it built."""
    try:
        import fcntl
    except ImportError:  # Windows: sessions run one at a time there (no parallel dev.py)
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _purelib(python: Path | str) -> Path:
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def _bin(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_base(python: str, log: Callable[[str], None]) -> Path:
    """The base environment for ``python``'s version, built if it is missing or stale.

    Returns the base's site-packages. ``python`` (a session's interpreter) creates it, so
    the base runs on the same Python as the sessions layered on it.
    """
    code = "import sys; print('cp%d%d' % sys.version_info[:2])"
    tag = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    venv = ROOT / ".nox" / f"_base-{tag.strip()}"
    base_python = _bin(venv)
    stamp_file = venv / "ascend-patch-base.stamp"
    index = torch_index()
    with _locked(venv.parent / f"{venv.name}.lock"):
        fresh = base_python.exists() and stamp_file.exists()
        if fresh and stamp_file.read_text(encoding="utf-8") == _stamp(index):
            return _purelib(base_python)
        if not base_python.exists() or subprocess.call([str(base_python), "-c", "pass"]):
            log(f"creating the shared base environment {venv.relative_to(ROOT)} (torch, once)")
            subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(base_python), "-m", "pip", "--disable-pip-version-check", "-q"]
        pin = f"torch=={torch_pin()}"
        # A wheelhouse the machine's pip is configured with (find-links) wins; else the
        # CPU index, so that pip never picks PyPI's CUDA build.
        local = subprocess.run(
            [*pip, "install", "--no-index", "--no-deps", pin], capture_output=True
        )
        if local.returncode != 0:
            extra = ["--extra-index-url", index] if index else []
            log(f"installing {pin} into the base" + (f" from {index}" if index else ""))
            subprocess.run([*pip, "install", *extra, pin], check=True)
        log(f"installing {BASE_REQUIREMENTS.relative_to(ROOT)} into the base")
        subprocess.run([*pip, "install", "-r", str(BASE_REQUIREMENTS)], check=True)
        stamp_file.write_text(_stamp(index), encoding="utf-8")
    return _purelib(base_python)


def layer(session_python: str, base_site: Path) -> Path:
    """Put ``base_site`` behind the session's own site-packages; returns the .pth written.

    ``site.addsitedir`` (not a bare path line) also runs the base's own .pth files, as
    the interpreter does for a ``--system-site-packages`` venv. The base's commands
    (pytest, torchrun, ...) get scripts in the session's bin (scripts).
    """
    pth = _purelib(session_python) / LAYER_FILE
    pth.write_text(f"import site; site.addsitedir({str(base_site)!r})\n", encoding="utf-8")
    console_scripts(base_site, Path(session_python).parent, session_python)
    return pth


_SCRIPT = """#!{python}
import sys
from {module} import {name}
if __name__ == "__main__":
    sys.exit({call}())
"""


def console_scripts(site: Path, bin_dir: Path, python: str) -> list[Path]:
    """Write into ``bin_dir`` the console scripts of the distributions in ``site``, run by
    ``python``; returns those written.

    The base's own scripts start the base's interpreter, which lacks the session's
    packages: each session needs its own, as pip writes them (those pip already wrote
    there, for packages of the session's own, stay). POSIX only: Windows needs .exe
    launchers, and the sessions run one at a time there (nothing is written).
    """
    import importlib.metadata

    if os.name == "nt":
        return []
    written = []
    for dist in importlib.metadata.distributions(path=[str(site)]):
        for entry in dist.entry_points.select(group="console_scripts"):
            script = bin_dir / entry.name
            if script.exists() or not entry.attr:
                continue
            name = entry.attr.split(".")[0]
            text = _SCRIPT.format(python=python, module=entry.module, name=name, call=entry.attr)
            script.write_text(text, encoding="utf-8")
            script.chmod(0o755)
            written.append(script)
    return written
