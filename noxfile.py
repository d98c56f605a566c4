"""Developer and CI sessions. Run them through ``python3 dev.py`` (see README.md).

Sessions tagged ``ci`` are what ``python3 dev.py test`` and ``.ci/run`` execute.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

import devenv


ROOT = Path(__file__).resolve().parent

#: The Pythons the project supports (the classifiers in every pyproject.toml say the same).
SUPPORTED_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


def _runs(interpreter: str) -> bool:
    done = subprocess.run([interpreter, "-c", "import venv"], capture_output=True, check=False)
    return done.returncode == 0


def find_python(version: str) -> str | None:
    """A working interpreter of ``version``: on PATH, else a pyenv installation.

    A pyenv shim for a version that is installed but not selected fails when run, so
    each candidate is tried; the directory of the one that works goes to the front of
    PATH, where nox (which looks for ``python3.X``) finds it.
    """
    pattern = os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")
    for candidate in [shutil.which(f"python{version}"), *sorted(glob.glob(pattern))]:
        if candidate and _runs(candidate):
            directory = os.path.dirname(candidate)
            os.environ["PATH"] = os.pathsep.join([directory, os.environ.get("PATH", "")])
            return candidate
    return None


#: The main sessions run on the interpreter that runs nox: dev.py's python3, whatever
#: supported version that is (None means exactly that to nox).
PYTHON = None

#: The framework stacks (mmengine, transformers, msprobe, ...) are pip freezes whose pins
#: (numpy 2.4, scipy 1.17, pandas 3) need Python 3.11 or newer: on a 3.10 python3 they run
#: on the newest 3.11+ interpreter the machine has (nox names the missing one otherwise).
STACK_PYTHON: str | None = None
if sys.version_info < (3, 11):
    STACK_PYTHON = next(
        (v for v in reversed(SUPPORTED_PYTHONS[1:]) if find_python(v)), SUPPORTED_PYTHONS[1]
    )

#: The oldest and the newest supported Python this machine has, for the core's own tests.
_FOUND = [v for v in SUPPORTED_PYTHONS if find_python(v)]
CORE_PYTHONS = sorted({_FOUND[0], _FOUND[-1]}) if _FOUND else []

#: The distributions besides the core, each in its own directory: the kits (the
#: training utilities, the NPU emulator) and the plugins.
DISTRIBUTIONS = [
    "kits/training",
    "kits/emulator",
    "plugins/torch_npu_ops",
    "plugins/mmcv_npu",
    "plugins/transformers_npu",
]

# The standard venv backend, with pip: pip reads the machine's pip configuration (a
# company index, a wheelhouse in find-links, constraints), which uv does not; the base
# environment (devenv.py) saves what uv's shared cache would. nox still probes every
# optional backend when it creates an environment and logs "uv binary not found.":
# noise here, since uv is not wanted, so that one message is filtered out.
nox.options.default_venv_backend = "venv"
logging.getLogger("nox").addFilter(lambda record: record.getMessage() != "uv binary not found.")
# Reusing environments between local runs saves the ~20 s torch install each time;
# CI starts from a fresh clone, so it always builds them anew.
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

#: Hypothesis draws the same examples on every run (conftest.py); set
#: HYPOTHESIS_PROFILE=explore to search with fresh randomness instead.
TEST_ENV = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}


def session_python(session: nox.Session) -> str:
    """The session's interpreter, to run directly: the install steps that need it run
    under ``--install-only`` too, where session.run does nothing."""
    return str(Path(session.bin) / ("python.exe" if os.name == "nt" else "python"))


def layer_on_base(session: nox.Session) -> None:
    """Layer the session on the shared base environment: torch and requirements/tests.txt.

    The base is built once per Python (devenv.py, docs/dev.md); the session's own
    installs go into its own environment and come first on sys.path.
    """
    python = session_python(session)
    devenv.layer(python, devenv.ensure_base(python, session.log))


def install_project(session: nox.Session) -> None:
    """Install the test requirements, then the core, the kits and every plugin in editable mode.

    The test requirements come from the shared base environment (layer_on_base), so the
    install of requirements/tests.txt finds them satisfied and takes seconds.
    The editable installs use ``--no-build-isolation``: with isolation pip builds a
    fresh build environment for each of the six projects (and downloads hatchling
    whenever its cache is cold). The build backend (hatchling, editables) comes from
    requirements/tests.txt, installed first.
    """
    layer_on_base(session)
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


@nox.session(python=CORE_PYTHONS or None, tags=["ci"])
def core_pythons(session: nox.Session) -> None:
    """The core's tests on the oldest and the newest supported Python this machine has.

    Without torch: this machine holds a CPU build of torch for one Python only, and any
    other torch is a multi-GB CUDA download. The root conftest.py leaves out what needs
    torch (ASCEND_PATCH_TEST_WITHOUT_TORCH); the full suite runs in the tests session.
    The training kit's tests live beside it and its torch-free ones run here too (the
    emulator kit's need torch throughout).
    """
    if not CORE_PYTHONS:
        session.skip(f"none of Python {', '.join(SUPPORTED_PYTHONS)} found besides nox's own")
    session.install("-r", "requirements/core-pythons.txt")
    editables = ["-e", "."]
    for directory in DISTRIBUTIONS:
        if directory != "kits/emulator":  # the emulator needs torch
            editables += ["-e", directory]
    session.install("--no-build-isolation", "--no-deps", *editables)
    session.run(
        "pytest",
        "tests",
        "kits/training/tests",
        "-m",
        "not venv",
        *session.posargs,
        env={**TEST_ENV, "ASCEND_PATCH_TEST_WITHOUT_TORCH": "1"},
    )


# dev.py runs the sessions tagged ci two at a time in the order they are defined here:
# the quick checks (while the first session builds the shared base), then the longest,
# so that the last to start are short and the two workers end together. By one full
# run's session times on 2 cores, that ends ~80 s sooner than the stacks in the order
# of their subjects (openmmlab, then transformers), which left one worker idle for
# the last ~3 min.


#: What the transformers sessions promise. trl is installed without its dependencies
#: (datasets, pandas, pyarrow: ~150 MB): the tests read its sources for the two
#: transfer_to_npu items that name it and never import it.
HF_REQUIRED = "transformers,diffusers,accelerate,peft,trl"


@nox.session(python=STACK_PYTHON, tags=["ci"])
def transformers_older(session: nox.Session) -> None:
    """The transformers plugin against transformers 4.57.6 (with diffusers 0.35.1), then 4.51.3.

    Old transformers needs huggingface_hub < 1.0 and new diffusers >= 1.32, so the older
    releases share an environment of their own; 4.51.3 replaces 4.57.6 in it for the
    second run (one environment instead of two: installing torch is most of the cost).
    """
    install_project(session)
    session.install("-r", "requirements/transformers-older.txt")
    session.install("--no-deps", "trl==0.24.0")  # the last 0.x, for transformers 4.5x
    required = {"ASCEND_PATCH_TEST_REQUIRE": HF_REQUIRED}
    session.run(
        "pytest", "plugins/transformers_npu", *session.posargs, env={**TEST_ENV, **required}
    )
    session.install("transformers==4.51.3", "tokenizers==0.21.4")
    session.run(
        "pytest", "plugins/transformers_npu", *session.posargs, env={**TEST_ENV, **required}
    )


@nox.session(python=STACK_PYTHON, tags=["ci"])
def openmmlab_cpu_ops(session: nox.Session) -> None:
    """The mmcv plugin's op replacements against mmcv 2.1.0's compiled CPU kernels.

    mmcv 2.1.0 built with ops (cached wheel), mmengine 0.10.7, mmdet 3.3.0 and mmdet3d
    1.4.0 (without its heavy optional dependencies); the plugin's tests run under the
    emulator and compare each replacement with mmcv's own implementation.
    """
    install_project(session)
    session.install("-r", "requirements/openmmlab-cpu-ops.txt")
    wheels = compiled_wheels(session, devenv.COMPILED[1])
    session.install("--no-index", "--find-links", str(wheels), "--no-deps", MMCV_CPU_OPS)
    # mmdet3d 1.4.0's declared dependencies pull open3d and old pins; what it imports is
    # in the requirements file, the package itself comes without its dependencies.
    session.install("--no-deps", "-r", "requirements/openmmlab-cpu-ops-nodeps.txt")
    session.run(
        "pytest",
        "plugins/mmcv_npu/tests",
        *session.posargs,
        env={**TEST_ENV, "ASCEND_PATCH_TEST_REQUIRE": "mmcv-ops,mmengine,mmdet,mmdet3d"},
    )


@nox.session(python=STACK_PYTHON, tags=["ci"])
def transformers_newest(session: nox.Session) -> None:
    """The transformers plugin against the newest transformers (5.x), accelerate and diffusers."""
    install_project(session)
    session.install("-r", "requirements/transformers-newest.txt")
    session.install("--no-deps", "trl==1.16.0")  # read, not imported: see HF_REQUIRED
    session.run(
        "pytest",
        "plugins/transformers_npu",
        *session.posargs,
        env={**TEST_ENV, "ASCEND_PATCH_TEST_REQUIRE": HF_REQUIRED},
    )


@nox.session(python=STACK_PYTHON, tags=["ci"])
def openmmlab_emulated(session: nox.Session) -> None:
    """mmengine/mmdet import and index their structures under ``run --emulate-npu``;
    the mmcv plugin's tests (its mmengine groups) run against the real mmengine.

    mmcv-lite 2.1.0, mmengine 0.10.7 and mmdet 3.3.0 (pure wheels, nothing built);
    one subprocess under the emulator: about a minute to install, seconds to test.
    """
    install_project(session)
    session.install("-r", "requirements/openmmlab-emulated.txt")
    session.run(
        "pytest",
        "tests/test_openmmlab_emulated.py",
        "plugins/mmcv_npu/tests",
        *session.posargs,
        # Comma-separated: each test file fails (not skips) when what it names is missing.
        env={
            **TEST_ENV,
            "ASCEND_PATCH_TEST_REQUIRE": "openmmlab-emulated,mmengine,mmcv-lite,mmdet",
        },
    )
    # Profiling and brake under mmengine's Runner (epoch- and iteration-based loops): the
    # same mmengine 0.10.7 a session of its own would install.
    run_training_tests(session, "mmengine")


@nox.session(python=STACK_PYTHON, tags=["ci"])
def openmmlab1_emulated(session: nox.Session) -> None:
    """The mmcv plugin's mmcv 1.x groups against mmcv 1.7.2 (no compiled ops).

    mmcv 1.x and 2.x cannot share an environment (both are the package ``mmcv``).
    """
    install_project(session)
    session.install("--no-build-isolation", "-r", "requirements/openmmlab1-emulated.txt")
    session.run(
        "pytest",
        "plugins/mmcv_npu/tests",
        *session.posargs,
        env={**TEST_ENV, "ASCEND_PATCH_TEST_REQUIRE": "mmcv1"},
    )
    # Profiling and brake under mmcv 1.x's EpochBasedRunner and IterBasedRunner.
    run_training_tests(session, "mmcv1")


@nox.session(python=PYTHON, tags=["ci"])
def torch_plugin(session: nox.Session) -> None:
    """The torch plugin's tests with a real torch_scatter (compared with ours).

    The examples (marked slow) already run in the tests session, so they are left out here.
    """
    install_project(session)
    wheels = compiled_wheels(session, devenv.COMPILED[0])
    session.install("--no-index", "--find-links", str(wheels), TORCH_SCATTER)
    session.run(
        "pytest",
        "plugins/torch_npu_ops",
        "-m",
        "not slow",
        *session.posargs,
        env={**TEST_ENV, "ASCEND_PATCH_TEST_REQUIRE": "numpy,torch_scatter"},
    )


def run_training_tests(session: nox.Session, stack: str) -> None:
    """Run the training utilities' tests for one loop library (kits/training/tests).

    ASCEND_PATCH_TEST_REQUIRE makes those tests fail, instead of skip, when the
    framework does not import: in a session that installs it, a missing stack is an error.
    A pytest run of its own: the mmcv 1.x test puts a torchvision stand-in in sys.modules.
    """
    session.run(
        "pytest",
        f"kits/training/tests/test_training_{stack}.py",
        *session.posargs,
        env={**TEST_ENV, "ASCEND_PATCH_TEST_REQUIRE": stack},
    )


def training_stack_tests(session: nox.Session, stack: str, requirements: str) -> None:
    """Install one training framework beside the project and run its training-utility tests.

    For the loop libraries no other session installs: mmengine's and mmcv 1.x's tests run
    in openmmlab_emulated and openmmlab1_emulated, which install the same pins.
    """
    install_project(session)
    session.install("-r", f"requirements/{requirements}")
    run_training_tests(session, stack)


@nox.session(python=STACK_PYTHON, tags=["ci"])
def training_hf(session: nox.Session) -> None:
    """Profiling and brake under the Hugging Face Trainer (transformers + accelerate)."""
    training_stack_tests(session, "hf", "training-hf.txt")


@nox.session(python=STACK_PYTHON, tags=["ci"])
def training_msprobe(session: nox.Session) -> None:
    """The precision check's mindstudio-probe PrecisionDebugger around each training step."""
    training_stack_tests(session, "msprobe", "training-msprobe.txt")


TORCH_SCATTER, MMCV_CPU_OPS = (wheel.requirement for wheel in devenv.COMPILED)


def compiled_wheels(session: nox.Session, wheel: devenv.CompiledWheel) -> Path:
    """A folder holding ``wheel`` built for this session's torch and Python.

    PyPI has no CPU build of either compiled wheel (torch_scatter ships an sdist; mmcv's
    ops come only in its sdist), and building one takes 5 to 30 minutes on 2 cores, so
    each is built once per torch version and Python into the project's wheel cache
    (ASCEND_PATCH_WHEEL_CACHE, default ~/.cache/ascend-patch/wheels) and kept.
    ``python3 dev.py wheels`` builds them as a step of its own; a session that finds its
    wheel missing builds it here.
    """
    probe = "import sys, torch; print(torch.__version__, 'cp%d%d' % sys.version_info[:2])"
    done = subprocess.run([session_python(session), "-c", probe], capture_output=True, text=True)
    torch_version, python_tag = done.stdout.split()
    folder = devenv.wheel_cache() / f"torch-{torch_version}"
    if not any(folder.glob(f"{wheel.prefix}-{python_tag}-*.whl")):
        session.log(
            f"building {wheel.requirement} from source into {folder}"
            f" (about {wheel.minutes} minutes on 2 cores, once)"
        )
        session.install("ninja")  # parallel C++ compilation for torch's extension builder
        session.run_install(  # part of the install: --install-only builds it too
            *("pip", "wheel", "--no-build-isolation", "--no-deps"),
            *("-w", str(folder), wheel.requirement),
            env=wheel.env,
        )
    return folder


@nox.session(python=PYTHON)
def wheels(session: nox.Session) -> None:
    """Build the compiled wheels (torch_scatter, mmcv 2.1.0 with ops) into the wheel cache.

    Once per torch version: ``dev.py test`` runs the two sessions that need them
    (torch_plugin, openmmlab_cpu_ops) only where they are cached. CI runs this first.
    """
    layer_on_base(session)
    for wheel in devenv.COMPILED:
        if wheel.stack_python and STACK_PYTHON:
            # The session runs on another Python than this one: build it there.
            session.log(
                f"{wheel.requirement}: built by `nox -s {wheel.session}` (Python {STACK_PYTHON})"
            )
            continue
        session.log(f"{wheel.requirement}: {compiled_wheels(session, wheel)}")


#: The bench session's second environment: the project from regular wheels.
BENCH_REGULAR_VENV = ROOT / ".nox" / "bench-regular"


def project_sources(destination: Path) -> None:
    """Copy what a clean clone of the project holds (with uncommitted edits) to destination.

    Wheels are built from this copy, not in place, so that a build sees exactly the
    files a clean clone has (nothing ignored, nothing left over from an earlier build).
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
