"""What every test directory of the repository shares (tests/, kits/*/tests, plugins/*/tests).

The kits and the plugins keep their tests beside their code; pytest loads this file for
all of them (it is the rootdir conftest, the one place ``pytest_plugins`` would be allowed
too), so the hygiene below holds wherever a test lives:

* Hypothesis profiles: ``ci`` -- what the nox sessions (the README's test command,
  .ci/run) use: the same examples on every run, no example database, and a reproduction
  blob on failure. A suite that must stay green on a clean clone cannot depend on which
  random examples a run happens to draw; exploring is a separate activity. ``explore``
  -- fresh randomness (and 1000 examples where a test does not set its own number), for
  looking for bugs: ``HYPOTHESIS_PROFILE=explore python3 dev.py test``. ``default`` --
  Hypothesis' own defaults (plain ``pytest`` runs).
* Autouse hygiene: the metadata cache of test runs kept out of the user's home, the
  developer's ``ASCEND_PATCH_*`` switches kept out of tests, and no test leaving
  import-hub state behind.
* The fixtures ``make_package`` and ``patcher``.
* The torch-free collection rules of the ``core_pythons`` session
  (``ASCEND_PATCH_TEST_WITHOUT_TORCH``).

Tests build real packages on disk (``make_package``) under unique names, so that the
import system, the hub's finder and the target resolver run exactly as they do for
users; every module a test imported from its temporary directory is removed from
``sys.modules`` afterwards.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import textwrap
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

import pytest

from ascend_patch_core import Patcher
from ascend_patch_core.imports._hub import hub


try:
    from hypothesis import settings
except ImportError:  # a session without hypothesis has no property-based tests either
    pass
else:
    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    settings.register_profile("explore", max_examples=1000)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


_REPO = Path(__file__).resolve().parent

_counter = itertools.count()

PackageFactory = Callable[..., str]


@pytest.fixture(autouse=True, scope="session")
def _isolated_metadata_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep the on-disk metadata cache of test runs out of the user's home."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ASCEND_PATCH_CACHE_DIR", str(tmp_path_factory.mktemp("metadata-cache")))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _clean_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment switches of the developer's shell must not leak into tests."""
    for name in (
        "ASCEND_PATCH_DISABLE",
        "ASCEND_PATCH_PLUGINS",
        "ASCEND_PATCH_AUTOLOAD",
        "ASCEND_PATCH_STRICT",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def make_package(tmp_path: Path) -> Iterator[PackageFactory]:
    """Write a package tree and put it on sys.path; returns its unique top-level name.

    ``make_package({"__init__.py": "...", "core.py": "..."})`` creates package
    ``pkgN`` (N unique in the session) whose files are the given sources (dedented).
    Use ``{name}`` inside sources to refer to the package's own name.
    """
    root = tmp_path / "site"
    root.mkdir()
    sys.path.insert(0, str(root))
    created: list[str] = []

    def factory(files: dict[str, str], name: str | None = None) -> str:
        pkg = name or f"appkg{next(_counter)}"
        for rel, source in files.items():
            path = root / pkg / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source).replace("{name}", pkg))
        for directory in [p for p in (root / pkg).rglob("*") if p.is_dir()] + [root / pkg]:
            init = directory / "__init__.py"
            if not init.exists():
                init.write_text("")
        created.append(pkg)
        import importlib

        importlib.invalidate_caches()
        return pkg

    yield factory
    sys.path.remove(str(root))
    for module_name in list(sys.modules):
        if any(module_name == pkg or module_name.startswith(pkg + ".") for pkg in created):
            del sys.modules[module_name]


@pytest.fixture
def patcher() -> Iterator[Patcher]:
    """A fresh Patcher, always reverted at the end of the test."""
    p = Patcher()
    yield p
    p.revert()


@pytest.fixture(autouse=True)
def _no_hub_leak() -> Iterator[None]:
    """No test leaves import-hub state behind: what it added is gone when it ends (reverts are exact).

    Only additions count: a test that imports a watched module consumes that watch
    legitimately, as a plugin test does under its module-scoped patcher (applied once
    per test module, reverted after its last test).
    """
    before, served_before = _hub_state(), dict(hub._served)
    yield
    after = _hub_state()
    left = {kind: after[kind] - before[kind] for kind in after}
    if any(left.values()):
        # Clean up so one leaking test does not fail all the following ones.
        for module, handle in left["watches"]:
            hub._watches[module].remove(handle)
            if not hub._watches[module]:
                del hub._watches[module]
        hub._patterns[:] = [p for p in hub._patterns if _identity(p) not in left["patterns"]]
        for name, _ in left["served"]:
            if name in served_before:
                hub._served[name] = served_before[name]
            else:
                del hub._served[name]
        hub._recompute_roots()
        hub._maybe_uninstall()
        pytest.fail(f"the test left import-hub state behind: {left} ({hub!r})")


def _identity(obj: object) -> tuple[str, int]:
    return (type(obj).__name__, id(obj))


def _hub_state() -> dict[str, set[tuple[object, ...]]]:
    """What the hub holds, by identity: watch handles, pattern hooks, served modules, its finder."""
    return {
        "watches": {(m, h) for m, handles in hub._watches.items() for h in handles},
        "patterns": {_identity(p) for p in hub._patterns},
        "served": {(name, id(entry)) for name, entry in hub._served.items()},
        "installed": {("finder",)} if hub.installed else set(),
    }


#: Set by the nox session ``core_pythons``: the core's tests (and the training kit's) on
#: the oldest and newest supported Pythons, where this machine has no CPU build of torch
#: (an unpinned or non-cp311 torch is a multi-GB CUDA download). Tests that need torch
#: are then left out: the emulator kit's directory, modules that import torch (or the
#: emulator kit) at the top, and tests marked ``torch``. Everywhere else they run.
WITHOUT_TORCH = os.environ.get("ASCEND_PATCH_TEST_WITHOUT_TORCH") == "1"
_TOP_LEVEL_TORCH_IMPORT = re.compile(
    r"^(?:import|from) (?:torch|ascend_patch_emulator)\b", re.MULTILINE
)
_EMULATOR_KIT = _REPO / "kits" / "emulator"


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if not WITHOUT_TORCH:
        return None
    if collection_path.is_dir() and collection_path.resolve() == _EMULATOR_KIT:
        return True  # the emulator kit and its tests: torch everywhere
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return bool(_TOP_LEVEL_TORCH_IMPORT.search(collection_path.read_text(encoding="utf-8")))
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not WITHOUT_TORCH:
        return
    skip = pytest.mark.skip(reason="needs torch; this session (core_pythons) runs without it")
    for item in items:
        # The emulator kit's fixtures (npu_emulator, ...) need torch as well.
        uses_emulator = any(f.startswith("npu_") for f in getattr(item, "fixturenames", ()))
        if item.get_closest_marker("torch") or uses_emulator:
            item.add_marker(skip)
