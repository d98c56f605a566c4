"""Developer and CI sessions. Run them through ``python3 dev.py`` (see README.md).

Sessions tagged ``ci`` are what ``python3 dev.py test`` and ``.ci/run`` execute.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox


ROOT = Path(__file__).resolve().parent
PYTHON = "3.11"

#: The distributions besides the core, each in its own directory: the kits (the
#: training utilities, the NPU emulator) and the plugins.
DISTRIBUTIONS = [
    "kits/training",
    "kits/emulator",
    "plugins/torch_npu_ops",
    "plugins/mmcv_npu",
    "plugins/transformers_npu",
]

nox.options.default_venv_backend = "venv"
# Reusing environments between local runs saves the ~20 s torch install each time;
# CI starts from a fresh clone, so it always builds them anew.
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

#: Hypothesis draws the same examples on every run (conftest.py); set
#: HYPOTHESIS_PROFILE=explore to search with fresh randomness instead.
TEST_ENV = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}


def install_project(session: nox.Session) -> None:
    """Install the test requirements, then the core, the kits and every plugin in editable mode.

    The editable installs use ``--no-build-isolation``: with isolation pip builds a
    fresh setuptools environment for each of the four projects (measured 7.5 s vs
    2.1 s, plus a PyPI download whenever its cache is cold). setuptools and wheel
    come from requirements/tests.txt, installed first.
    """
    session.install("-r", "requirements/tests.txt")
    editables = ["-e", "."]
    for directory in DISTRIBUTIONS:
        editables += ["-e", directory]
    session.install("--no-build-isolation", *editables)


@nox.session(python=PYTHON, tags=["ci"])
def tests(session: nox.Session) -> None:
    """Run the whole test suite (core and plugins). Extra args go to pytest."""
    install_project(session)
    # Exit code 5 means "no tests collected": allowed while the suite is being written.
    session.run("pytest", *session.posargs, success_codes=[0, 5], env=TEST_ENV)


@nox.session(python=PYTHON, tags=["ci"])
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff (configured in pyproject.toml)."""
    session.install("-r", "requirements/lint.txt")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON, tags=["ci"])
def typecheck(session: nox.Session) -> None:
    """Type-check with mypy: strict on ascend_patch_core, plugins non-strict."""
    session.install("-r", "requirements/typecheck.txt")
    # No posargs: `dev.py test -- ARGS` forwards ARGS to every ci session, and they are for pytest.
    session.run("mypy")


def training_stack_tests(
    session: nox.Session, stack: str, requirements: str, *install_args: str
) -> None:
    """Install one training framework beside the project and run its training-utility tests.

    ASCEND_PATCH_TEST_REQUIRE makes those tests fail, instead of skip, when the
    framework does not import: in its own session a missing stack is an error.
    """
    install_project(session)
    session.install(*install_args, "-r", f"requirements/{requirements}")
    session.run(
        "pytest",
        f"tests/test_training_{stack}.py",
        *session.posargs,
        env={**TEST_ENV, "ASCEND_PATCH_TEST_REQUIRE": stack},
    )


@nox.session(python=PYTHON, tags=["ci"])
def training_mmengine(session: nox.Session) -> None:
    """Profiling and brake under mmengine's Runner (epoch- and iteration-based loops)."""
    training_stack_tests(session, "mmengine", "training-mmengine.txt")


@nox.session(python=PYTHON, tags=["ci"])
def training_mmcv1(session: nox.Session) -> None:
    """Profiling and brake under mmcv 1.x's EpochBasedRunner and IterBasedRunner."""
    training_stack_tests(session, "mmcv1", "training-mmcv1.txt", "--no-build-isolation")


@nox.session(python=PYTHON, tags=["ci"])
def training_hf(session: nox.Session) -> None:
    """Profiling and brake under the Hugging Face Trainer (transformers + accelerate)."""
    training_stack_tests(session, "hf", "training-hf.txt")


@nox.session(python=PYTHON, tags=["ci"])
def training_msprobe(session: nox.Session) -> None:
    """The precision check's mindstudio-probe PrecisionDebugger around each training step."""
    training_stack_tests(session, "msprobe", "training-msprobe.txt")


TORCH_SCATTER = "torch-scatter==2.1.2"


def torch_scatter_wheels(session: nox.Session) -> Path:
    """A folder holding a torch_scatter wheel built for this session's torch.

    torch_scatter ships only an sdist whose build takes ~5 min on 2 cores, so the
    wheel is built once per torch version and kept (ASCEND_PATCH_WHEEL_CACHE, default
    ~/.cache/ascend-patch/wheels); CI keeps that folder between runs to skip the build.
    """
    import os

    torch_version = session.run(
        "python", "-c", "import torch; print(torch.__version__)", silent=True
    )
    root = Path(
        os.environ.get(
            "ASCEND_PATCH_WHEEL_CACHE", Path.home() / ".cache" / "ascend-patch" / "wheels"
        )
    )
    folder = root / f"torch-{str(torch_version).strip()}"
    if not any(folder.glob("torch_scatter-2.1.2-*.whl")):
        session.log(f"building {TORCH_SCATTER} from source into {folder} (about 5 minutes, once)")
        session.run(
            "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(folder), TORCH_SCATTER
        )
    return folder


@nox.session(python=PYTHON, tags=["ci"])
def torch_plugin(session: nox.Session) -> None:
    """The torch plugin's tests with numpy and a real torch_scatter (compared with ours).

    The examples (marked slow) already run in the tests session, so they are left out here.
    """
    install_project(session)
    session.install("-r", "requirements/torch-plugin.txt")
    wheels = torch_scatter_wheels(session)
    session.install("--no-index", "--find-links", str(wheels), TORCH_SCATTER)
    session.run(
        "pytest",
        "plugins/torch_npu_ops",
        "-m",
        "not slow",
        *session.posargs,
        env={**TEST_ENV, "ASCEND_PATCH_TEST_REQUIRE": "numpy,torch_scatter"},
    )


#: The bench session's second environment: the project from regular wheels.
BENCH_REGULAR_VENV = ROOT / ".nox" / "bench-regular"


def project_sources(destination: Path) -> None:
    """Copy what a clean clone of the project holds (with uncommitted edits) to destination.

    Wheels are built from this copy, not in place: building in the work tree would write
    build/ and *.egg-info there, and setuptools would pack whatever stale modules an
    earlier build left in build/lib.
    """
    import shutil
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.split("\0")):
            source = ROOT / name
            if source.is_file():
                (destination / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination / name)
        return
    shutil.copytree(
        ROOT,
        destination,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(
            ".git", ".nox", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*cache*"
        ),
    )


def regular_install(session: nox.Session) -> Path:
    """A second environment: requirements/bench.txt, and the project as regular wheels.

    The core, the kits and the plugins are built into wheels (``pip wheel
    --no-build-isolation``, from a copy of the sources) and installed as users get them:
    no editable finder, no source tree on the path. Returns its interpreter. Kept under
    .nox/ and reused like the session's own environment; the wheels are rebuilt and
    reinstalled on every run, so it always holds the current code.
    """
    import tempfile

    python = BENCH_REGULAR_VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        session.run("python", "-m", "venv", "--clear", str(BENCH_REGULAR_VENV))
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    session.run(*pip, "install", "-r", "requirements/bench.txt", external=True)
    with tempfile.TemporaryDirectory(prefix="ap-bench-wheels-") as tmp:
        sources, wheels = Path(tmp) / "src", Path(tmp) / "wheels"
        project_sources(sources)
        directories = [str(sources / d) for d in [".", *DISTRIBUTIONS]]
        session.run(
            *pip,
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            str(wheels),
            *directories,
            external=True,
        )
        built = [str(w) for w in sorted(wheels.glob("*.whl"))]
        # Replace what an earlier run installed (same version, new code), then let pip
        # add the dependencies (pluggy, packaging) a fresh environment still lacks.
        session.run(*pip, "install", "--force-reinstall", "--no-deps", *built, external=True)
        session.run(*pip, "install", *built, external=True)
    return python


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Run the benchmarks (benchmarks/run.py). Extra args go to the script.

    Start-up is measured in two environments with the same requirements (bench.txt:
    the test requirements plus numpy): this one, with the project installed editable,
    and a second one with the project installed from regular wheels, as users have it
    (editable installs add an import finder users do not have).
    """
    script = ROOT / "benchmarks" / "run.py"
    if not script.is_file():
        session.log("No benchmarks yet: benchmarks/run.py does not exist.")
        return
    install_project(session)
    session.install("-r", "requirements/bench.txt")
    regular = regular_install(session)
    session.run(
        "python",
        str(script.relative_to(ROOT)),
        "--regular-python",
        str(regular),
        *session.posargs,
    )


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Run the main demo (examples/demo.py)."""
    script = ROOT / "examples" / "demo.py"
    if not script.is_file():
        session.error(f"The demo is missing: {script.relative_to(ROOT)} does not exist yet.")
    install_project(session)
    session.run("python", str(script.relative_to(ROOT)), *session.posargs)
