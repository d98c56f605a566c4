"""Plugin discovery through entry points: isolation of broken plugins, the ASCEND_PATCH_* switches,
``configure_env`` defaults, ``requires=`` from metadata, and the on-disk metadata cache.

Plugins here are real installed distributions as far as ``importlib.metadata`` can tell:
each test writes ``<dist>-<version>.dist-info/{METADATA,entry_points.txt}`` plus the plugin
module into a temporary directory on ``sys.path`` (no pip). Entry-point, module and
distribution names are unique per test, because the first-party plugins of this
repository are installed in the test environment and are discovered as well.
"""

from __future__ import annotations

import importlib
import itertools
import marshal
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ascend_patch_core import Patcher
from ascend_patch_core import PluginError
from ascend_patch_core import Provenance
from ascend_patch_core import Report
from ascend_patch_core import Status
from ascend_patch_core import is_stub
from ascend_patch_core._discovery.metadata import MetadataCache
from ascend_patch_core._discovery.metadata import metadata


_counter = itertools.count()
GROUP = "ascend_patch"


# --------------------------------------------------------------------------- fixtures


@dataclass
class Dist:
    """A synthetic installed distribution carrying one ``ascend_patch`` entry point."""

    name: str  # distribution name as written in METADATA
    version: str
    ep: str  # entry-point name
    module: str  # the plugin module's import name
    root: Path  # the sys.path entry holding it

    @property
    def file(self) -> str:
        return str(self.root / f"{self.module}.py")

    @property
    def entry_point(self) -> str:
        return f"{self.ep} = {self.module}"


class DistFactory:
    """Writes dist-info directories and plugin modules into directories on sys.path."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.roots: list[Path] = []
        self.modules: list[str] = []
        self.root = self.new_root()

    def new_root(self) -> Path:
        """A new sys.path entry, inserted in front of the others."""
        root = self.base / f"site{len(self.roots)}"
        root.mkdir(parents=True)
        sys.path.insert(0, str(root))
        self.roots.append(root)
        importlib.invalidate_caches()
        return root

    def unique(self, stem: str) -> str:
        return f"{stem}{next(_counter)}"

    def __call__(
        self,
        source: str | None = "",
        *,
        ep: str | None = None,
        dist: str | None = None,
        version: str = "1.0",
        value: str | None = None,
        module: str | None = None,
        root: Path | None = None,
        entry_points: bool = True,
    ) -> Dist:
        """Install one plugin distribution. ``source`` is the plugin module (None: no module file)."""
        root = root or self.root
        module = module or self.unique("apx_plugin_mod")
        ep = ep or self.unique("apx_ep")
        dist = dist or self.unique("apx-dist-")
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        if entry_points:
            (info / "entry_points.txt").write_text(f"[{GROUP}]\n{ep} = {value or module}\n")
        if source is not None:
            (root / f"{module}.py").write_text(textwrap.dedent(source))
            self.modules.append(module)
        importlib.invalidate_caches()
        return Dist(dist, version, ep, module, root)

    def cleanup(self) -> None:
        for root in self.roots:
            if str(root) in sys.path:
                sys.path.remove(str(root))
        for name in list(sys.modules):
            if name.partition(".")[0] in self.modules:
                del sys.modules[name]
        importlib.invalidate_caches()


@pytest.fixture(autouse=True)
def _private_metadata_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test gets its own on-disk cache and an empty in-memory one."""
    monkeypatch.setenv("ASCEND_PATCH_CACHE_DIR", str(tmp_path / "metadata-cache"))
    monkeypatch.delenv("ASCEND_PATCH_CACHE", raising=False)
    metadata.clear()
    yield
    metadata.clear()


@pytest.fixture
def dists(tmp_path: Path) -> Iterator[DistFactory]:
    factory = DistFactory(tmp_path / "dists")
    yield factory
    factory.cleanup()


@pytest.fixture
def new_patcher() -> Iterator[Callable[..., Patcher]]:
    """``new_patcher(**kwargs)`` -> ``Patcher(autoload=True, **kwargs)``, reverted at teardown."""
    made: list[Patcher] = []

    def factory(**kwargs: Any) -> Patcher:
        patcher = Patcher(autoload=True, **kwargs)
        made.append(patcher)
        return patcher

    yield factory
    for patcher in reversed(made):
        patcher.revert()


@pytest.fixture
def target(make_package: Callable[..., str]) -> str:
    """A fresh target package ``<pkg>.core`` with ``compute`` and ``other`` functions."""
    return make_package(
        {
            "core.py": """
                def compute(x):
                    return ("orig", x)

                def other(x):
                    return ("orig-other", x)
                """,
        }
    )


def good_plugin_source(pkg: str, tag: str = "plugin") -> str:
    """A plugin that patches ``<pkg>.core.compute`` to return ``(tag, x)``."""
    return f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        def compute(x):
            return ({tag!r}, x)

        @hookimpl
        def register_patches():
            return [AtomicPatch("{pkg}.core.compute", compute)]
        """


def plugin_records(report: Report) -> dict[str, Any]:
    return {r.name: r for r in report.records if r.kind == "plugin"}


def core(pkg: str) -> Any:
    return importlib.import_module(f"{pkg}.core")


# --------------------------------------------------------------------------- 1. discovery


def test_good_plugin_is_discovered_applied_and_reported_with_provenance(
    dists: DistFactory,
    target: str,
    make_package: Callable[..., str],
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plugin's patches (atomic and grouped), import rules and env defaults all take effect, with provenance."""
    skipped = make_package({"__init__.py": "REAL = True\n"})
    var = f"APX_GOOD_ENV_{next(_counter)}"
    monkeypatch.delenv(var, raising=False)
    plugin = dists(
        f"""
        from ascend_patch_core import AtomicPatch, EnvSetting, Patch, SkipImport, hookimpl

        def compute(x):
            return ("plugin", x)

        def other(x):
            return ("plugin-other", x)

        class OtherGroup(Patch):
            name = "ApxOtherGroup"

            @classmethod
            def patches(cls, options=None):
                return [AtomicPatch("{target}.core.other", other)]

        @hookimpl
        def register_patches():
            return [AtomicPatch("{target}.core.compute", compute), OtherGroup]

        @hookimpl
        def register_import_rules():
            return [SkipImport("{skipped}")]

        @hookimpl
        def configure_env():
            return [EnvSetting("{var}", "on", why="the NPU needs it")]
        """,
        dist="Apx-Good-Plugin",
        version="1.2.3",
    )
    report = new_patcher().apply()

    assert target not in sys.modules, "apply() must not import the plugin's target"
    record = plugin_records(report)[plugin.ep]
    assert record.status is Status.APPLIED
    assert record.provenance == Provenance(
        plugin.ep, "Apx-Good-Plugin", "1.2.3", plugin.entry_point, plugin.file
    )
    assert core(target).compute(1) == ("plugin", 1)
    assert core(target).other(2) == ("plugin-other", 2)
    patch_record = report.get(f"{target}.core.compute", kind="patch")
    assert patch_record.status is Status.APPLIED
    assert patch_record.provenance == record.provenance
    assert report.get(f"{target}.core.other", kind="patch").group == "ApxOtherGroup"

    assert is_stub(importlib.import_module(skipped))
    assert os.environ[var] == "on"
    env_record = report.get(var, kind="env")
    assert (env_record.status, env_record.reason) == (Status.APPLIED, "the NPU needs it")
    assert env_record.provenance.plugin == plugin.ep


def test_mapping_from_configure_env_is_accepted(
    dists: DistFactory, new_patcher: Callable[..., Patcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """configure_env may return a plain {name: value} mapping instead of EnvSetting objects."""
    var = f"APX_MAP_ENV_{next(_counter)}"
    monkeypatch.delenv(var, raising=False)
    dists(
        f"""
        from ascend_patch_core import hookimpl

        @hookimpl
        def configure_env():
            return {{"{var}": "42"}}
        """
    )
    report = new_patcher().apply()
    assert os.environ[var] == "42"
    assert report.get(var, kind="env").status is Status.APPLIED


def test_plugins_are_ordered_by_entry_point_name_not_sys_path(
    dists: DistFactory, target: str, new_patcher: Callable[..., Patcher]
) -> None:
    """Plugins load in entry-point name order; with two patches on one target, the later name wins."""
    stem = dists.unique("apx_order")
    first_root = dists.root
    dists(good_plugin_source(target, "from-a"), ep=f"{stem}_a", root=first_root)
    later_root = dists.new_root()  # now in front of first_root on sys.path
    dists(good_plugin_source(target, "from-b"), ep=f"{stem}_b", root=later_root)

    report = new_patcher().apply()

    names = [r.name for r in report.records if r.kind == "plugin"]
    assert names == sorted(names)
    assert names.index(f"{stem}_a") < names.index(f"{stem}_b")
    assert core(target).compute(1) == ("from-b", 1)
    assert any(f"{stem}_a" in w and f"{stem}_b" in w for w in report.warnings), report.warnings


def test_first_distribution_on_sys_path_wins_an_entry_point_name(
    dists: DistFactory, target: str, new_patcher: Callable[..., Patcher]
) -> None:
    """Two distributions publishing the same entry-point name: the one earlier on sys.path is used, with a warning."""
    ep = dists.unique("apx_dup")
    dists(good_plugin_source(target, "behind"), ep=ep, dist="apx-behind")
    front = dists(
        good_plugin_source(target, "front"), ep=ep, dist="apx-front", root=dists.new_root()
    )

    report = new_patcher().apply()

    record = plugin_records(report)[ep]
    assert record.provenance.distribution == "apx-front"
    assert record.provenance.file == front.file
    assert core(target).compute(1) == ("front", 1)
    assert any(
        ep in w and "apx-behind" in w and "apx-front" in w and "first on sys.path" in w
        for w in report.warnings
    ), report.warnings


@pytest.mark.parametrize("attr", ["plugin", "Plugin"], ids=["instance", "class"])
def test_object_entry_point_reports_the_defining_file(
    dists: DistFactory, target: str, new_patcher: Callable[..., Patcher], attr: str
) -> None:
    """An entry point naming an object (``mod:attr``) loads that object; its file is the module's file."""
    module = dists.unique("apx_object_plugin")
    plugin = dists(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        def compute(x):
            return ("object-plugin", x)

        class Plugin:
            @staticmethod
            @hookimpl
            def register_patches():
                return [AtomicPatch("{target}.core.compute", compute)]

        plugin = Plugin()
        """,
        module=module,
        value=f"{module}:{attr}",
    )

    report = new_patcher().apply()

    record = plugin_records(report)[plugin.ep]
    assert record.status is Status.APPLIED
    assert core(target).compute(3) == ("object-plugin", 3)
    assert record.provenance.entry_point == f"{plugin.ep} = {plugin.module}:{attr}"
    assert record.provenance.file == plugin.file


def test_patcher_disable_accepts_plugin_names(
    dists: DistFactory, target: str, new_patcher: Callable[..., Patcher]
) -> None:
    """Patcher.disable() with a plugin's entry-point or distribution name drops all of its declarations."""
    by_ep = dists(good_plugin_source(target, "by-ep"))
    by_dist = dists(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        @hookimpl
        def register_patches():
            return [AtomicPatch("{target}.core.other", lambda x: ("by-dist", x))]
        """,
        dist=dists.unique("Apx_Disabled.Dist"),
    )

    report = (
        new_patcher()
        .disable(by_ep.ep, by_dist.name.lower().replace("_", "-").replace(".", "-"))
        .apply()
    )

    records = plugin_records(report)
    for plugin in (by_ep, by_dist):
        assert records[plugin.ep].status is Status.SKIPPED
        assert "Patcher.disable()" in records[plugin.ep].reason
    assert core(target).compute(1) == ("orig", 1)
    assert core(target).other(1) == ("orig-other", 1)
    assert not [w for w in report.warnings if "matches no" in w], report.warnings


def test_patcher_disable_of_a_broken_plugin_keeps_it_unloaded(
    dists: DistFactory, target: str, new_patcher: Callable[..., Patcher]
) -> None:
    """A plugin disabled through Patcher.disable() is not imported, so its breakage cannot fail the run."""
    good = dists(good_plugin_source(target))
    broken = dists("raise RuntimeError('broken plugin module')\n")

    report = new_patcher(strict=True).disable(broken.ep).apply()

    assert broken.module not in sys.modules
    assert plugin_records(report)[broken.ep].status is Status.SKIPPED
    assert plugin_records(report)[good.ep].status is Status.APPLIED
    assert core(target).compute(1) == ("plugin", 1)
    assert report.ok


# --------------------------------------------------------------------------- 2. isolation


def assert_failed_with_provenance(record: Any, plugin: Dist, *, file_known: bool) -> None:
    assert record.status is Status.FAILED
    prov = record.provenance
    assert (prov.plugin, prov.distribution, prov.version, prov.entry_point) == (
        plugin.ep,
        plugin.name,
        plugin.version,
        plugin.entry_point,
    )
    assert plugin.name in record.reason and plugin.version in record.reason
    if file_known:
        assert prov.file == plugin.file
        assert plugin.file in record.reason


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("import apx_no_such_dependency_zz\n", "importing", id="missing-dependency"),
        pytest.param(None, "does not exist", id="own-module-missing"),
        pytest.param(
            "raise RuntimeError('boom at import')\n", "RuntimeError: boom at import", id="raises"
        ),
    ],
)
def test_plugin_that_fails_to_import_is_isolated(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    source: str | None,
    expected: str,
) -> None:
    """A plugin whose module cannot be imported is FAILED with an explanation; a good plugin still applies."""
    good = dists(good_plugin_source(target))
    bad = dists(source, version="0.9")

    report = new_patcher().apply()

    record = plugin_records(report)[bad.ep]
    assert_failed_with_provenance(record, bad, file_known=False)
    assert expected in record.reason
    if source is not None and "import apx_no_such" in source:
        assert "importing" in record.reason and "apx_no_such_dependency_zz" in record.reason
        assert "does not exist" not in record.reason
    if source is None:
        assert bad.module in record.reason and "importing" not in record.reason
    assert plugin_records(report)[good.ep].status is Status.APPLIED
    assert core(target).compute(1) == ("plugin", 1)
    assert not report.ok


def test_entry_point_naming_a_missing_submodule_says_it_does_not_exist(
    dists: DistFactory, make_package: Callable[..., str], new_patcher: Callable[..., Patcher]
) -> None:
    """An entry point ``pkg.missing`` (pkg exists) is reported as a module that does not exist."""
    pkg = make_package({"__init__.py": ""})
    bad = dists(None, value=f"{pkg}.plugin")

    report = new_patcher().apply()

    record = plugin_records(report)[bad.ep]
    assert record.status is Status.FAILED
    assert "does not exist" in record.reason and f"{pkg}.plugin" in record.reason


@pytest.mark.parametrize(
    "raising_hook", ["configure_env", "register_import_rules", "register_patches"]
)
def test_raising_hook_discards_all_of_that_plugins_declarations(
    dists: DistFactory,
    target: str,
    make_package: Callable[..., str],
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
    raising_hook: str,
) -> None:
    """When any hook of a plugin raises, none of its env, rules or patches are used; others still apply."""
    skipped = make_package({"__init__.py": "REAL = True\n"})
    var = f"APX_RAISING_ENV_{next(_counter)}"
    monkeypatch.delenv(var, raising=False)
    bodies = {
        "configure_env": f"return {{'{var}': 'set'}}",
        "register_import_rules": f"return [SkipImport('{skipped}')]",
        "register_patches": f"return [AtomicPatch('{target}.core.other', lambda x: ('bad', x))]",
    }
    bodies[raising_hook] = "raise ValueError('hook exploded')"
    source = "from ascend_patch_core import AtomicPatch, SkipImport, hookimpl\n" + "".join(
        f"\n@hookimpl\ndef {hook}():\n    {body}\n" for hook, body in bodies.items()
    )
    good = dists(good_plugin_source(target))
    bad = dists(source)

    report = new_patcher().apply()

    record = plugin_records(report)[bad.ep]
    assert_failed_with_provenance(record, bad, file_known=True)
    assert raising_hook in record.reason and "ValueError: hook exploded" in record.reason
    assert var not in os.environ
    assert importlib.import_module(skipped).REAL is True
    assert core(target).other(1) == ("orig-other", 1)
    assert not [r for r in report.records if r.kind != "plugin" and r.provenance.plugin == bad.ep]
    assert plugin_records(report)[good.ep].status is Status.APPLIED
    assert core(target).compute(1) == ("plugin", 1)


@pytest.mark.parametrize(
    ("hook", "returned", "expected"),
    [
        pytest.param("register_patches", "5", "register_patches returned int", id="patches-int"),
        pytest.param(
            "register_patches",
            "[Ok, 'a.b.c']",
            "register_patches returned 'a.b.c'",
            id="patches-str",
        ),
        pytest.param(
            "register_import_rules",
            "[object()]",
            "register_import_rules returned",
            id="rules-object",
        ),
        pytest.param("configure_env", "7", "configure_env returned an invalid value", id="env-int"),
        pytest.param(
            "configure_env",
            "{'APX_X': 1}",
            "configure_env returned an invalid value",
            id="env-non-str",
        ),
    ],
)
def test_invalid_return_value_is_isolated(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    hook: str,
    returned: str,
    expected: str,
) -> None:
    """A hook returning something invalid fails its plugin (nothing of it applies); others still apply."""
    source = textwrap.dedent(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        Ok = AtomicPatch("{target}.core.other", lambda x: ("bad", x))

        @hookimpl
        def {hook}():
            return {returned}
        """
    )
    if hook != "register_patches":
        source += "\n@hookimpl\ndef register_patches():\n    return [Ok]\n"
    good = dists(good_plugin_source(target))
    bad = dists(source)

    report = new_patcher().apply()

    record = plugin_records(report)[bad.ep]
    assert_failed_with_provenance(record, bad, file_known=True)
    assert expected in record.reason
    assert core(target).other(1) == ("orig-other", 1)
    assert core(target).compute(1) == ("plugin", 1)
    assert plugin_records(report)[good.ep].status is Status.APPLIED


def test_unknown_hook_fails_the_plugin_with_a_suggestion(
    dists: DistFactory, target: str, new_patcher: Callable[..., Patcher]
) -> None:
    """A @hookimpl named like no hook (``register_patch``) fails its plugin and suggests the right name."""
    good = dists(good_plugin_source(target))
    bad = dists(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        @hookimpl
        def register_patch():
            return [AtomicPatch("{target}.core.other", lambda x: ("bad", x))]
        """
    )

    report = new_patcher().apply()

    record = plugin_records(report)[bad.ep]
    assert_failed_with_provenance(record, bad, file_known=True)
    assert (
        "'register_patch'" in record.reason and "did you mean 'register_patches'" in record.reason
    )
    assert core(target).other(1) == ("orig-other", 1)
    assert plugin_records(report)[good.ep].status is Status.APPLIED
    assert core(target).compute(1) == ("plugin", 1)


def test_hookimpl_with_an_argument_not_in_the_spec_fails_validation(
    dists: DistFactory, target: str, new_patcher: Callable[..., Patcher]
) -> None:
    """pluggy's validation rejects a hook implementation asking for an argument the spec lacks."""
    good = dists(good_plugin_source(target))
    bad = dists(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        @hookimpl
        def register_patches(config):
            return [AtomicPatch("{target}.core.other", lambda x: ("bad", x))]
        """
    )

    report = new_patcher().apply()

    record = plugin_records(report)[bad.ep]
    assert_failed_with_provenance(record, bad, file_known=True)
    assert "invalid hook implementation" in record.reason and "config" in record.reason
    assert core(target).other(1) == ("orig-other", 1)
    assert core(target).compute(1) == ("plugin", 1)
    assert plugin_records(report)[good.ep].status is Status.APPLIED


def test_unmarked_hook_function_is_ignored_with_a_warning(
    dists: DistFactory, target: str, new_patcher: Callable[..., Patcher]
) -> None:
    """A function named ``register_patches`` without @hookimpl is not called; the plugin record warns."""
    plugin = dists(
        f"""
        from ascend_patch_core import AtomicPatch

        def register_patches():
            return [AtomicPatch("{target}.core.compute", lambda x: ("unmarked", x))]
        """
    )

    report = new_patcher().apply()

    record = plugin_records(report)[plugin.ep]
    assert record.status is Status.APPLIED
    assert any("register_patches" in w and "@hookimpl" in w for w in record.warnings), (
        record.warnings
    )
    assert core(target).compute(1) == ("orig", 1)


# --------------------------------------------------------------------------- 3. switches


def _configure(
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    new_patcher: Callable[..., Patcher],
    env: str,
    kwarg: str,
    value: Any,
) -> Patcher:
    """Apply one switch via the environment, the constructor, or select_plugins()."""
    if how == "env":
        monkeypatch.setenv(env, value if isinstance(value, str) else ("1" if value else "0"))
        return new_patcher()
    if how == "init" and kwarg in ("disable", "plugins", "strict"):
        return new_patcher(**{kwarg: value})
    return new_patcher().select_plugins(**{kwarg: value})


HOW = ["env", "init", "select"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("by", ["entry-point", "distribution", "distribution-respelt", "star"])
def test_disable_switch(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    by: str,
) -> None:
    """ASCEND_PATCH_DISABLE / disable= skip a plugin by entry point, normalized distribution or '*', unimported."""
    n = next(_counter)
    spellings = (f"Ascend_Patch.Apx{n}", f"ascend-patch-apx{n}")
    if by == "distribution-respelt":
        spellings = spellings[::-1]
    victim = dists(good_plugin_source(target, "victim"), dist=spellings[0])
    bystander = dists(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        @hookimpl
        def register_patches():
            return [AtomicPatch("{target}.core.other", lambda x: ("bystander", x))]
        """
    )
    name = victim.ep if by == "entry-point" else "*" if by == "star" else spellings[1]

    report = _configure(
        how, monkeypatch, new_patcher, "ASCEND_PATCH_DISABLE", "disable", name
    ).apply()

    records = plugin_records(report)
    assert records[victim.ep].status is Status.SKIPPED
    assert "disabled" in records[victim.ep].reason
    assert victim.module not in sys.modules, "a disabled plugin's module must not be imported"
    assert core(target).compute(1) == ("orig", 1)
    if by == "star":
        assert all(r.status is Status.SKIPPED for r in records.values())
        assert bystander.module not in sys.modules
        assert core(target).other(1) == ("orig-other", 1)
    else:
        assert records[bystander.ep].status is Status.APPLIED
        assert core(target).other(1) == ("bystander", 1)
    assert not [w for w in report.warnings if "not an installed plugin" in w]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("by", ["entry-point", "distribution"])
def test_plugins_allow_list(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    by: str,
) -> None:
    """ASCEND_PATCH_PLUGINS / plugins= loads only the named plugins; the others are never imported."""
    chosen = dists(good_plugin_source(target, "chosen"))
    other = dists(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        @hookimpl
        def register_patches():
            return [AtomicPatch("{target}.core.other", lambda x: ("other", x))]
        """
    )
    name = chosen.ep if by == "entry-point" else chosen.name.upper()

    report = _configure(
        how, monkeypatch, new_patcher, "ASCEND_PATCH_PLUGINS", "plugins", name
    ).apply()

    records = plugin_records(report)
    assert records[chosen.ep].status is Status.APPLIED
    assert core(target).compute(1) == ("chosen", 1)
    assert records[other.ep].status is Status.SKIPPED
    assert "not in ASCEND_PATCH_PLUGINS" in records[other.ep].reason
    assert other.module not in sys.modules
    assert core(target).other(1) == ("orig-other", 1)
    if "torch" in records:  # the first-party plugins obey the list too
        assert records["torch"].status is Status.SKIPPED


@pytest.mark.parametrize("how", ["env", "select"])
def test_autoload_off_discovers_nothing(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """ASCEND_PATCH_AUTOLOAD=0 / autoload=False: no plugin is discovered or imported."""
    plugin = dists(good_plugin_source(target))

    report = _configure(
        how, monkeypatch, new_patcher, "ASCEND_PATCH_AUTOLOAD", "autoload", False
    ).apply()

    assert plugin_records(report) == {}
    assert plugin.module not in sys.modules
    assert core(target).compute(1) == ("orig", 1)


@pytest.mark.parametrize("how", ["env", "select"])
def test_autoload_off_still_loads_the_allow_listed_plugins(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """With autoload off, plugins named in ASCEND_PATCH_PLUGINS / plugins= still load (pytest's model)."""
    chosen = dists(good_plugin_source(target, "chosen"))
    other = dists(good_plugin_source(target, "other"))
    if how == "env":
        monkeypatch.setenv("ASCEND_PATCH_AUTOLOAD", "0")
        monkeypatch.setenv("ASCEND_PATCH_PLUGINS", chosen.ep)
        patcher = new_patcher()
    else:
        patcher = new_patcher().select_plugins(autoload=False, plugins=[chosen.ep])

    report = patcher.apply()

    assert plugin_records(report)[chosen.ep].status is Status.APPLIED
    assert core(target).compute(1) == ("chosen", 1)
    assert other.module not in sys.modules
    assert (
        plugin_records(report).get(other.ep) is None
        or plugin_records(report)[other.ep].status is Status.SKIPPED
    )


@pytest.mark.parametrize("how", HOW)
def test_strict_mode_raises_on_a_broken_plugin(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """ASCEND_PATCH_STRICT=1 / strict=True: a broken plugin makes apply() raise PluginError naming it."""
    dists(good_plugin_source(target))
    bad = dists("raise ImportError('broken plugin module')\n")
    patcher = _configure(how, monkeypatch, new_patcher, "ASCEND_PATCH_STRICT", "strict", True)

    with pytest.raises(PluginError, match=bad.ep) as info:
        patcher.apply()

    assert "broken plugin module" in str(info.value)
    assert not patcher.is_applied
    assert core(target).compute(1) == ("orig", 1)


@pytest.mark.parametrize("switch", ["ASCEND_PATCH_DISABLE", "ASCEND_PATCH_PLUGINS"])
def test_strict_mode_raises_on_unknown_plugin_names(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
    switch: str,
) -> None:
    """In strict mode an unknown name in the disable or allow list is an error, not a warning."""
    plugin = dists(good_plugin_source(target))
    monkeypatch.setenv("ASCEND_PATCH_STRICT", "1")
    monkeypatch.setenv(switch, f"{plugin.ep}x")

    with pytest.raises(PluginError, match=f"{plugin.ep}x"):
        new_patcher().apply()
    assert core(target).compute(1) == ("orig", 1)


@pytest.mark.parametrize("how", ["env", "init"])
@pytest.mark.parametrize(
    ("switch", "kwarg"), [("ASCEND_PATCH_DISABLE", "disable"), ("ASCEND_PATCH_PLUGINS", "plugins")]
)
def test_unknown_plugin_names_are_reported_with_a_hint(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    switch: str,
    kwarg: str,
) -> None:
    """A misspelt plugin name in DISABLE / PLUGINS is a report warning that suggests the installed name."""
    plugin = dists(good_plugin_source(target))
    typo = plugin.ep[:-1] + "q" + plugin.ep[-1]
    patcher = _configure(how, monkeypatch, new_patcher, switch, kwarg, typo)

    report = patcher.apply()

    matching = [w for w in report.warnings if repr(typo) in w]
    assert matching, report.warnings
    assert switch in matching[0]
    assert f"did you mean {plugin.ep!r}" in matching[0]
    assert report.ok


def test_env_and_api_disable_lists_add_up(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API's disable= adds to ASCEND_PATCH_DISABLE rather than replacing it."""
    first = dists(good_plugin_source(target, "first"))
    second = dists(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        @hookimpl
        def register_patches():
            return [AtomicPatch("{target}.core.other", lambda x: ("second", x))]
        """
    )
    monkeypatch.setenv("ASCEND_PATCH_DISABLE", first.ep)

    report = new_patcher(disable=[second.ep]).apply()

    records = plugin_records(report)
    assert records[first.ep].status is Status.SKIPPED
    assert records[second.ep].status is Status.SKIPPED
    assert first.module not in sys.modules and second.module not in sys.modules
    assert core(target).compute(1) == ("orig", 1)
    assert core(target).other(1) == ("orig-other", 1)


# --------------------------------------------------------------------------- 4. configure_env


def test_configure_env_never_overwrites_the_user_and_is_undone_on_revert(
    dists: DistFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's variable is left alone (SKIPPED with the user's value); variables the core set go on revert."""
    n = next(_counter)
    mine, theirs = f"APX_SET_BY_PLUGIN_{n}", f"APX_SET_BY_USER_{n}"
    monkeypatch.delenv(mine, raising=False)
    monkeypatch.setenv(theirs, "user-choice")
    plugin = dists(
        f"""
        from ascend_patch_core import EnvSetting, hookimpl

        @hookimpl
        def configure_env():
            return [EnvSetting("{mine}", "plugin-default"), EnvSetting("{theirs}", "plugin-default")]
        """
    )
    patcher = Patcher(autoload=True)
    try:
        report = patcher.apply()
        assert os.environ[mine] == "plugin-default"
        assert os.environ[theirs] == "user-choice"
        skipped = report.get(theirs, kind="env")
        assert skipped.status is Status.SKIPPED
        assert "user-choice" in skipped.reason and theirs in skipped.reason
        assert skipped.provenance.plugin == plugin.ep
        assert report.get(mine, kind="env").status is Status.APPLIED
    finally:
        patcher.revert()
    assert mine not in os.environ
    assert os.environ[theirs] == "user-choice"


# --------------------------------------------------------------------------- 6. requires=


@pytest.mark.parametrize(
    ("requires", "applied", "reason"),
    [
        pytest.param("{dist}>=1.0,<2", True, None, id="in-range"),
        pytest.param("{DIST}>=2", False, "1.5 is installed", id="too-old"),
        pytest.param("apx-not-installed-zz>=1 | {dist}~=1.4", True, None, id="alternative"),
        pytest.param("apx-not-installed-zz>=1", False, "not installed", id="absent"),
    ],
)
def test_requires_on_plugin_patches_is_read_from_metadata(
    dists: DistFactory,
    target: str,
    new_patcher: Callable[..., Patcher],
    requires: str,
    applied: bool,
    reason: str | None,
) -> None:
    """``requires=`` of a plugin's patch is checked against installed versions, before any import."""
    lib = dists(None, dist=dists.unique("apx-lib-"), version="1.5", entry_points=False)
    text = requires.format(dist=lib.name, DIST=lib.name.replace("-", "_").upper())
    dists(
        f"""
        from ascend_patch_core import AtomicPatch, hookimpl

        @hookimpl
        def register_patches():
            return [AtomicPatch("{target}.core.compute", lambda x: ("gated", x), requires={text!r})]
        """
    )

    report = new_patcher().apply()

    record = report.get(f"{target}.core.compute", kind="patch")
    if applied:
        assert record.status is Status.PENDING
        assert core(target).compute(1) == ("gated", 1)
        assert record.status is Status.APPLIED
    else:
        assert target not in sys.modules
        assert record.status is Status.SKIPPED
        assert reason is not None and reason in record.reason
        assert core(target).compute(1) == ("orig", 1)


# --------------------------------------------------------------------------- 5. metadata cache


def test_warm_cache_is_hit_and_a_new_distribution_invalidates_it(dists: DistFactory) -> None:
    """A second cache instance reuses the disk cache; adding a dist-info directory invalidates it."""
    first = dists("")
    cold = MetadataCache()
    assert first.ep in {e.name for e in cold.entry_points(GROUP)}
    assert cold.hit is False
    cold.save()

    warm = MetadataCache()
    assert first.ep in {e.name for e in warm.entry_points(GROUP)}
    assert warm.hit is True

    before = os.stat(dists.root).st_mtime_ns
    second = dists("")
    assert os.stat(dists.root).st_mtime_ns != before
    after_install = MetadataCache()
    names = {e.name for e in after_install.entry_points(GROUP)}
    assert after_install.hit is False
    assert {first.ep, second.ep} <= names


def test_cache_can_be_disabled(
    dists: DistFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ASCEND_PATCH_CACHE=0 writes no cache file and never reports a hit."""
    monkeypatch.setenv("ASCEND_PATCH_CACHE", "0")
    plugin = dists("")
    cache = MetadataCache()
    assert plugin.ep in {e.name for e in cache.entry_points(GROUP)}
    cache.save()
    cache_dir = tmp_path / "metadata-cache"
    assert not cache_dir.exists() or not list(cache_dir.iterdir())
    again = MetadataCache()
    assert plugin.ep in {e.name for e in again.entry_points(GROUP)}
    assert again.hit is False


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00garbage\xff" * 10, marshal.dumps([1, 2, 3]), marshal.dumps({"fingerprint": "x"})],
    ids=["empty", "garbage", "not-a-dict", "foreign-fingerprint"],
)
def test_corrupt_cache_file_is_ignored(dists: DistFactory, content: bytes) -> None:
    """A corrupt or foreign cache file is ignored: fresh answers, then a good file replaces it."""
    plugin = dists("")
    path = Path(MetadataCache()._path())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)

    cache = MetadataCache()
    assert plugin.ep in {e.name for e in cache.entry_points(GROUP)}
    assert cache.hit is False
    cache.save()
    rebuilt = MetadataCache()
    assert plugin.ep in {e.name for e in rebuilt.entry_points(GROUP)}
    assert rebuilt.hit is True


_PROBE = """
import json, sys
import ascend_patch_core
from ascend_patch_core._discovery.metadata import metadata
report = ascend_patch_core.apply()
out = {
    "hit": metadata.hit,
    "importlib.metadata": "importlib.metadata" in sys.modules,
    "packaging": any(m == "packaging" or m.startswith("packaging.") for m in sys.modules),
    "plugins": {r.name: r.status.value for r in report.records if r.kind == "plugin"},
    "patches": {r.name: [r.status.value, r.reason] for r in report.records if r.kind == "patch"},
}
print(json.dumps(out))
"""


def test_second_process_with_a_warm_cache_imports_neither_importlib_metadata_nor_packaging(
    dists: DistFactory, tmp_path: Path
) -> None:
    """With a warm cache, apply() in a new process finds plugins and checks requires without those imports."""
    import json

    plugin = dists(
        """
        from ascend_patch_core import AtomicPatch, hookimpl

        @hookimpl
        def register_patches():
            return [AtomicPatch("apx_absent_target_zz.f", lambda: None, requires="pluggy>=1")]
        """,
        version="3.1",
    )
    import compileall

    # pip byte-compiles at install time; without it the first run's __pycache__ would
    # move the directory's times and make the next run list it again (still a hit).
    compileall.compile_dir(str(plugin.root), quiet=1)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    env.update(
        PYTHONPATH=str(plugin.root), ASCEND_PATCH_CACHE_DIR=str(tmp_path / "subprocess-cache")
    )

    def run() -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    cold, warm = run(), run()

    assert cold["hit"] is False and cold["importlib.metadata"] is True
    assert warm["hit"] is True
    assert warm["importlib.metadata"] is False
    assert warm["packaging"] is False
    for result in (cold, warm):
        assert result["plugins"][plugin.ep] == "applied"
        assert result["patches"]["apx_absent_target_zz.f"][0] == "pending"


def test_a_patcher_that_names_plugins_loads_them_without_autoload() -> None:
    """Patcher(plugins="mmcv") loads that plugin (autoload stays off for the rest);
    a plain Patcher() loads none."""
    from ascend_patch_core import Patcher

    named = Patcher(plugins="mmcv")
    try:
        plugins = {r.name: r for r in named.apply() if r.kind == "plugin"}
        assert str(plugins["mmcv"].status) == "applied"
        assert all(str(r.status) == "skipped" for n, r in plugins.items() if n != "mmcv")
    finally:
        named.revert()
    plain = Patcher()
    try:
        assert [r for r in plain.apply() if r.kind == "plugin"] == []
    finally:
        plain.revert()
