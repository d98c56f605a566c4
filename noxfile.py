"""Developer and CI sessions. Run them through ``python3 dev.py`` (see README.md).

Sessions tagged ``ci`` are what ``python3 dev.py test`` and ``.ci/run`` execute.
"""

from __future__ import annotations

from pathlib import Path

import nox


ROOT = Path(__file__).resolve().parent
PYTHON = "3.11"

PLUGINS = [
    "plugins/torch_npu_ops",
    "plugins/mmcv_npu",
    "plugins/transformers_npu",
]

nox.options.default_venv_backend = "venv"
# Reusing environments between local runs saves the ~20 s torch install each time;
# CI starts from a fresh clone, so it always builds them anew.
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True


def install_project(session: nox.Session) -> None:
    """Install the test requirements, then the core and every plugin in editable mode.

    The editable installs use ``--no-build-isolation``: with isolation pip builds a
    fresh setuptools environment for each of the four projects (measured 7.5 s vs
    2.1 s, plus a PyPI download whenever its cache is cold). setuptools and wheel
    come from requirements/tests.txt, installed first.
    """
    session.install("-r", "requirements/tests.txt")
    editables = ["-e", "."]
    for plugin in PLUGINS:
        editables += ["-e", plugin]
    session.install("--no-build-isolation", *editables)


@nox.session(python=PYTHON, tags=["ci"])
def tests(session: nox.Session) -> None:
    """Run the whole test suite (core and plugins). Extra args go to pytest."""
    install_project(session)
    # Exit code 5 means "no tests collected": allowed while the suite is being written.
    session.run("pytest", *session.posargs, success_codes=[0, 5])


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
        env={"ASCEND_PATCH_TEST_REQUIRE": stack},
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


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Run the benchmarks (benchmarks/run.py). Extra args go to the script."""
    script = ROOT / "benchmarks" / "run.py"
    if not script.is_file():
        session.log("No benchmarks yet: benchmarks/run.py does not exist.")
        return
    install_project(session)
    session.run("python", str(script.relative_to(ROOT)), *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Run the main demo (examples/demo.py)."""
    script = ROOT / "examples" / "demo.py"
    if not script.is_file():
        session.error(f"The demo is missing: {script.relative_to(ROOT)} does not exist yet.")
    install_project(session)
    session.run("python", str(script.relative_to(ROOT)), *session.posargs)
