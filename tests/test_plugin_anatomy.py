"""Every plugin in plugins/ (the template included) has the one anatomy of docs/plugin-authors.md.

Checked from the files (names and syntax trees), so that a new plugin or a moved
module that breaks the shape fails here with the rule it breaks:

* ``plugin.py`` holds hook implementations only; at module level it imports the core
  and ``groups``, nothing else;
* ``groups.py`` names every group once, in ``GROUPS`` (report order), and every
  import rule, in ``import_rules()``; groups of one area may live in
  ``groups_<area>.py``, which ``groups.py`` imports by name;
* a family is ``<family>.py``, with ``<family>_kernels.py`` beside it when it
  outgrows one module (never ``<family>_patches.py``);
* modules served in place of a missing library live in ``served/``, and every
  ``ReplaceImport`` factory is a literal dotted string into it;
* ``*_compat.py`` is only the family of a ``<Name>Compat`` group;
* coverage tables are test data, not in the wheel; every plugin and kit keeps its
  tests beside it.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIRS = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())
KIT_DIRS = sorted(p for p in (ROOT / "kits").iterdir() if (p / "pyproject.toml").is_file())

#: What ``plugin.py`` may import at module level besides ``from . import groups``;
#: ``groups.py`` may import the standard library too (``find_spec`` for its rules).
PLUGIN_MODULE_IMPORTS = {"__future__", "typing", "ascend_patch_core"}


def package_of(plugin_dir: Path) -> Path:
    """The package whose ``plugin`` module the ``ascend_patch`` entry point names."""
    pyproject = (plugin_dir / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[project.entry-points.ascend_patch]", 1)
    assert len(section) == 2, f"{plugin_dir.name}: no [project.entry-points.ascend_patch]"
    entry = re.search(r'^\w[\w-]* = "(\w+)\.plugin"$', section[1].split("\n[", 1)[0], re.M)
    assert entry, f"{plugin_dir.name}: the ascend_patch entry point must be '<package>.plugin'"
    return plugin_dir / entry.group(1)


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def module_level_imports(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """(module imported, level) for every import outside functions and classes.

    ``if TYPE_CHECKING:`` blocks are left out: they are never run.
    """

    def walk(statements: list[ast.stmt]) -> Iterator[tuple[str, int]]:
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, 0
            elif isinstance(node, ast.ImportFrom):
                if node.level and node.module is None:
                    for alias in node.names:
                        yield alias.name, node.level
                else:
                    yield node.module or "", node.level
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    yield from walk(node.body)
                yield from walk(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody):
                    yield from walk(block)
                for handler in node.handlers:
                    yield from walk(handler.body)

    yield from walk(tree.body)


def group_modules(package: Path) -> list[Path]:
    return [package / "groups.py", *sorted(package.glob("groups_*.py"))]


def patch_classes(tree: ast.Module) -> list[str]:
    """Classes defined at module level whose bases name ``Patch``."""
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Name) and b.id == "Patch" for b in node.bases)
    ]


def functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def names_attribute(node: ast.AST, owner: str, attribute: str) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == attribute
        and isinstance(n.value, ast.Name)
        and n.value.id == owner
        for n in ast.walk(node)
    )


plugin_dirs = pytest.mark.parametrize("plugin_dir", PLUGIN_DIRS, ids=lambda p: p.name)


@plugin_dirs
def test_package_has_init_plugin_and_groups(plugin_dir: Path) -> None:
    package = package_of(plugin_dir)
    for name in ("__init__.py", "plugin.py", "groups.py"):
        assert (package / name).is_file(), f"{package.relative_to(ROOT)} has no {name}"
    exported = [
        node
        for node in parse(package / "__init__.py").body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and "__all__"
        in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
    ]
    assert exported and ast.unparse(exported[0].value) == "[]", (
        f"{package.name}/__init__.py: the package exports nothing (__all__ = []);"
        " users import groups from <pkg>.groups"
    )


@plugin_dirs
def test_plugin_names_the_libraries_it_serves(plugin_dir: Path) -> None:
    """Every plugin, the template first, says which distributions its groups patch
    (group ``ascend_patch.serves``, each entry naming its plugin module): without it a
    plugin is imported by every apply(), whatever is installed (docs/core.md, Idle plugins)."""
    pyproject = (plugin_dir / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split('[project.entry-points."ascend_patch.serves"]', 1)
    assert len(section) == 2, (
        f'{plugin_dir.name}: no [project.entry-points."ascend_patch.serves"] naming the '
        "libraries it patches (docs/plugin-authors.md)"
    )
    module = f"{package_of(plugin_dir).name}.plugin"
    entries = re.findall(r'^([\w.-]+) = "([\w.]+)"$', section[1].split("\n[", 1)[0], re.M)
    assert entries, f"{plugin_dir.name}: ascend_patch.serves lists no library"
    assert {target for _, target in entries} == {module}, (
        f"{plugin_dir.name}: every ascend_patch.serves entry names {module!r}"
    )


@plugin_dirs
def test_plugin_module_imports_only_the_core_and_groups(plugin_dir: Path) -> None:
    package = package_of(plugin_dir)
    tree = parse(package / "plugin.py")
    for module, level in module_level_imports(tree):
        if level:
            assert (level, module) == (1, "groups"), (
                f"{package.name}/plugin.py imports .{module} at module level: it imports only"
                " `from . import groups`; other modules are imported inside the hook"
            )
        else:
            assert module in PLUGIN_MODULE_IMPORTS, (
                f"{package.name}/plugin.py imports {module} at module level: apply() imports"
                " plugin.py in every program; import it inside the hook that needs it"
            )
    hooks = functions(tree)
    assert "register_patches" in hooks, f"{package.name}/plugin.py: no register_patches hook"
    assert names_attribute(hooks["register_patches"], "groups", "GROUPS"), (
        f"{package.name}/plugin.py: register_patches returns groups.GROUPS (the one list)"
    )
    # A plugin may leave out of GROUPS a group whose library is absent (a filter over
    # GROUPS), but never writes a list of groups of its own.
    listed = [
        element
        for node in ast.walk(hooks["register_patches"])
        if isinstance(node, (ast.List, ast.Tuple, ast.Set))
        for element in node.elts
        if isinstance(element, (ast.Attribute, ast.Starred))
    ]
    assert not listed, (
        f"{package.name}/plugin.py: register_patches writes its own list"
        f" ({', '.join(ast.unparse(e) for e in listed)}): list every group in groups.GROUPS"
    )
    if "register_import_rules" in hooks:
        assert names_attribute(hooks["register_import_rules"], "groups", "import_rules"), (
            f"{package.name}/plugin.py: register_import_rules returns groups.import_rules()"
        )


@plugin_dirs
def test_groups_module_names_every_group_and_rule(plugin_dir: Path) -> None:
    package = package_of(plugin_dir)
    groups = parse(package / "groups.py")
    assigned = {
        ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target)
        for n in groups.body
        if isinstance(n, (ast.Assign, ast.AnnAssign))
    }
    assert "GROUPS" in assigned, f"{package.name}/groups.py: no GROUPS tuple"
    assert "import_rules" in functions(groups), (
        f"{package.name}/groups.py: no import_rules() (it returns [] where there are none)"
    )
    for path in group_modules(package):
        for module, level in module_level_imports(parse(path)):
            if level:
                assert level == 1 and module.startswith("groups_") and path.name == "groups.py", (
                    f"{package.name}/{path.name} imports .{module} at module level: group"
                    " modules import no family (a group's patches() imports it)"
                )
            else:
                top = module.partition(".")[0]
                assert top in sys.stdlib_module_names or module == "ascend_patch_core", (
                    f"{package.name}/{path.name} imports {module} at module level: group"
                    " modules import the standard library and the core, no library, no family"
                )


@plugin_dirs
def test_every_declared_group_is_in_GROUPS(plugin_dir: Path) -> None:
    package = package_of(plugin_dir)
    sys.path.insert(0, str(plugin_dir))
    try:
        groups = importlib.import_module(f"{package.name}.groups")
        plugin = importlib.import_module(f"{package.name}.plugin")
    finally:
        sys.path.remove(str(plugin_dir))
    declared = [name for path in group_modules(package) for name in patch_classes(parse(path))]
    listed = [group.__name__ for group in groups.GROUPS]
    assert sorted(listed) == sorted(declared), (
        f"{package.name}: GROUPS lists {sorted(set(listed) ^ set(declared))} differently"
        " from the classes its group modules define"
    )
    assert len(set(listed)) == len(listed), f"{package.name}: a group twice in GROUPS"
    registered = list(plugin.register_patches())
    # A plugin may leave out a group whose library is absent; it never reorders them.
    assert registered == [g for g in groups.GROUPS if g in registered], (
        f"{package.name}: register_patches() returns groups in another order than GROUPS"
    )


@plugin_dirs
def test_family_module_shapes(plugin_dir: Path) -> None:
    package = package_of(plugin_dir)
    modules = {p.stem: p for p in package.rglob("*.py")}
    for stem, path in modules.items():
        where = path.relative_to(ROOT)
        assert not stem.endswith("_patches"), (
            f"{where}: a family is <family>.py (declarations) with <family>_kernels.py"
            " (numerics) beside it, not <family>_patches.py"
        )
        if stem.endswith("_kernels"):
            family = path.with_name(stem.removesuffix("_kernels") + ".py")
            assert family.is_file(), f"{where}: no {family.name} beside it"
        assert "coverage" not in stem, (
            f"{where}: coverage tables are test and documentation data: keep them in"
            f" {plugin_dir.relative_to(ROOT)}/tests, out of the wheel"
        )


def camel(stem: str) -> str:
    return "".join(part.capitalize() for part in stem.split("_"))


@plugin_dirs
def test_compat_modules_are_families_of_compat_groups(plugin_dir: Path) -> None:
    package = package_of(plugin_dir)
    groups = {name for path in group_modules(package) for name in patch_classes(parse(path))}
    for path in package.rglob("*_compat.py"):
        group = camel(path.stem.removesuffix("_compat")) + "Compat"
        assert path.parent == package and group in groups, (
            f"{path.relative_to(ROOT)}: *_compat.py is only the family of a <Name>Compat group"
            f" (here {group}) restoring names a library removed; a module served in place of a"
            " library goes to served/, a family of fixes is named for what it fixes"
        )


FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@plugin_dirs
def test_served_modules_live_in_served(plugin_dir: Path) -> None:
    package = package_of(plugin_dir)
    for path in group_modules(package):
        for node in ast.walk(parse(path)):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "ReplaceImport"
            ):
                continue
            factories = node.args[1:2] + [k.value for k in node.keywords if k.arg == "factory"]
            for factory in factories:
                assert isinstance(factory, ast.Constant) and isinstance(factory.value, str), (
                    f"{package.name}/{path.name}:{node.lineno}: a ReplaceImport factory is a"
                    " literal 'pkg.module:function' (readable by grep and by this check)"
                )
                assert FACTORY.match(factory.value) and factory.value.startswith(
                    f"{package.name}.served."
                ), (
                    f"{package.name}/{path.name}:{node.lineno}: {factory.value!r} -- modules"
                    f" served in place of a library live in {package.name}/served/"
                )
    served = package / "served"
    if served.exists():
        assert (served / "__init__.py").is_file(), f"{served.relative_to(ROOT)} is no package"


@pytest.mark.parametrize("directory", PLUGIN_DIRS + KIT_DIRS, ids=lambda p: p.name)
def test_tests_live_beside_their_distribution(directory: Path) -> None:
    tests = directory / "tests"
    assert any(tests.glob("test_*.py")), (
        f"{directory.relative_to(ROOT)} has no tests/test_*.py: a plugin's or kit's tests"
        " live beside it"
    )
