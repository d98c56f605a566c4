"""The shape the project promises, read from the source files (ast; nothing under test is imported).

* The engine (ascend_patch_core) never imports a kit or a plugin, in any form.
* The kits and plugins reach the engine only through its public API.
* No import circle inside the engine, a kit package or a plugin package.
* The core's own shape -- its layer folders, no circle counting every kind of edge --
  is tests/test_architecture_layers.py's (folder rules, not line caps: issue 23).
* ``import ascend_patch_core`` loads no kit and no plugin (checked in a fresh interpreter).

A module's imports are every ``import`` / ``from ... import`` statement anywhere in it
(top level, in functions, under ``if TYPE_CHECKING:``), relative ones resolved against
the module's package, plus ``importlib.import_module("...")`` / ``__import__("...")`` with
a literal name. Test directories and conftest.py files are not part of any package here.
"""

from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from cycles import find_cycles


REPO = Path(__file__).resolve().parent.parent
ENGINE = "ascend_patch_core"

#: Distribution directory -> its import package, as the pyproject files declare them.
KITS = {"emulator": "ascend_patch_emulator", "training": "ascend_patch_training"}
PLUGINS = {
    "torch_npu_ops": "ascend_patch_torch",
    "mmcv_npu": "ascend_patch_mmcv",
    "transformers_npu": "ascend_patch_transformers",
    "_template": "ascend_patch_template",
}
EXTENSIONS = (*KITS.values(), *PLUGINS.values())


# ----------------------------------------------------------------------------- reading the sources


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    lines: int

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @property
    def where(self) -> str:
        return str(self.path.relative_to(REPO))


@dataclass(frozen=True)
class Import:
    #: The absolute module the statement names (for ``from X import a``: X).
    module: str
    #: The names of a ``from`` import; empty for ``import X`` and dynamic imports.
    names: tuple[str, ...]
    line: int
    type_checking: bool
    #: "import", "from" or "dynamic" (import_module / __import__ with a literal).
    kind: str


def package_dirs() -> dict[str, Path]:
    """Each package under test -> its directory (the engine, the kits, the plugins)."""
    dirs = {ENGINE: REPO / ENGINE}
    dirs.update({pkg: REPO / "kits" / dist / pkg for dist, pkg in KITS.items()})
    dirs.update({pkg: REPO / "plugins" / dist / pkg for dist, pkg in PLUGINS.items()})
    return dirs


def _is_test_file(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return path.name == "conftest.py" or any(p in ("tests", "test") for p in parts[:-1])


@cache
def modules_of(package: str) -> tuple[Module, ...]:
    """Every module of ``package`` (not its tests), parsed."""
    root = package_dirs()[package]
    assert (root / "__init__.py").is_file(), f"{root} is no package: the layout changed"
    found = []
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts or _is_test_file(path, root):
            continue
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        text = path.read_text(encoding="utf-8")
        found.append(
            Module(
                ".".join(parts),
                path,
                is_package,
                ast.parse(text, filename=str(path)),
                len(text.splitlines()),
            )
        )
    return tuple(found)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def resolve(module: Module, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.package.split(".")
    if level - 1 >= len(base):
        raise AssertionError(f"{module.where}: relative import beyond the top-level package")
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _dynamic_import(module: Module, call: ast.Call) -> str | None:
    """The module a literal ``importlib.import_module(...)`` / ``__import__(...)`` loads."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not call.args:
        return None
    target = _literal(call.args[0])
    if target is None:
        return None
    if name == "import_module" and target.startswith("."):
        anchor = call.args[1] if len(call.args) > 1 else None
        anchor = next((k.value for k in call.keywords if k.arg == "package"), anchor)
        if _literal(anchor) is not None:
            package = _literal(anchor)
        elif isinstance(anchor, ast.Name) and anchor.id in ("__name__", "__package__"):
            package = module.name if anchor.id == "__name__" else module.package
        else:
            return None
        level = len(target) - len(target.lstrip("."))
        base = package.split(".")[: len(package.split(".")) - (level - 1)]
        return ".".join([*base, target[level:]] if target[level:] else base)
    return target


def _walk(node: ast.AST, type_checking: bool) -> Iterator[tuple[ast.AST, bool]]:
    """Every node below ``node``, with whether it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        yield child, type_checking
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.body:
                yield sub, True
                yield from _walk(sub, True)
            for sub in child.orelse:
                yield sub, type_checking
                yield from _walk(sub, type_checking)
        else:
            yield from _walk(child, type_checking)


@cache
def imports_of(module: Module) -> tuple[Import, ...]:
    found = []
    for node, type_checking in _walk(module.tree, False):
        if isinstance(node, ast.Import):
            found += [Import(a.name, (), node.lineno, type_checking, "import") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names)
            target = resolve(module, node.level, node.module)
            found.append(Import(target, names, node.lineno, type_checking, "from"))
        elif isinstance(node, ast.Call):
            target = _dynamic_import(module, node)
            if target is not None:
                found.append(Import(target, (), node.lineno, type_checking, "dynamic"))
    return tuple(found)


def _top(name: str) -> str:
    return name.partition(".")[0]


def _is_private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.endswith("__") for p in dotted.split("."))


# ----------------------------------------------------------------------------- the resolver itself


def test_relative_imports_resolve_against_the_module_package() -> None:
    """`from . import x` / `from ..x import y` resolve against the package of a module and of an __init__."""
    tree = ast.parse("")
    leaf = Module("pkg.sub.mod", REPO / "m.py", False, tree, 0)
    init = Module("pkg.sub", REPO / "i.py", True, tree, 0)

    assert resolve(leaf, 1, None) == "pkg.sub"
    assert resolve(leaf, 1, "x") == "pkg.sub.x"
    assert resolve(leaf, 2, "x") == "pkg.x"
    assert resolve(init, 1, "x") == "pkg.sub.x"
    assert resolve(init, 2, None) == "pkg"
    with pytest.raises(AssertionError):
        resolve(leaf, 4, "x")


def test_imports_are_found_in_functions_and_under_type_checking() -> None:
    """The collector sees imports at every depth, marks TYPE_CHECKING ones, and reads literal dynamic imports."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import importlib\n"
        "if TYPE_CHECKING:\n"
        "    from .a import A\n"
        "else:\n"
        "    import b\n"
        "def f():\n"
        "    class C:\n"
        "        def g(self):\n"
        "            from .. import c\n"
        "    importlib.import_module('d.e')\n"
        "    importlib.import_module('.f', __name__)\n"
        "    __import__('g')\n"
        "    importlib.import_module(f'{x}')\n"
    )
    module = Module("pkg.sub.mod", REPO / "m.py", False, ast.parse(source), 0)

    got = {(i.module, i.names, i.type_checking, i.kind) for i in imports_of(module)}

    assert got == {
        ("typing", ("TYPE_CHECKING",), False, "from"),
        ("importlib", (), False, "import"),
        ("pkg.sub.a", ("A",), True, "from"),
        ("b", (), False, "import"),
        ("pkg", ("c",), False, "from"),
        ("d.e", (), False, "dynamic"),
        ("pkg.sub.mod.f", (), False, "dynamic"),
        ("g", (), False, "dynamic"),
    }


# ----------------------------------------------------------------------------- who imports whom


def test_every_package_under_test_is_found_with_its_modules() -> None:
    """The engine, both kits and every plugin package exist where the checks below look, each with modules."""
    for package in package_dirs():
        names = [m.name for m in modules_of(package)]
        assert package in names, f"{package}: no __init__ module found"
    assert len(modules_of(ENGINE)) > 10


def test_the_lists_above_name_every_kit_and_plugin_distribution() -> None:
    """A new kit or plugin directory is checked too: KITS and PLUGINS are every one with a pyproject.toml."""
    for folder, listed in (("kits", KITS), ("plugins", PLUGINS)):
        found = {p.parent.name for p in (REPO / folder).glob("*/pyproject.toml")}
        assert found == set(listed), f"{folder}/: add the new distribution to the list here"


def test_engine_never_imports_a_kit_or_a_plugin() -> None:
    """No module of ascend_patch_core imports a kit or plugin package, anywhere in the file or by a literal dynamic import."""
    offenders = [
        f"{m.where}:{i.line}: {i.kind} {i.module}"
        for m in modules_of(ENGINE)
        for i in imports_of(m)
        if _top(i.module) in EXTENSIONS
    ]

    assert not offenders, "the engine imports kits/plugins:\n" + "\n".join(offenders)


def test_kits_and_plugins_use_only_the_public_engine_api() -> None:
    """No module of a kit or plugin package imports a private engine module or name (ascend_patch_core._x)."""
    offenders = []
    for package in EXTENSIONS:
        for m in modules_of(package):
            for i in imports_of(m):
                if _top(i.module) != ENGINE:
                    continue
                named = [i.module] + [f"{i.module}.{n}" for n in i.names if n != "*"]
                private = [n for n in named if _is_private(n)]
                if private:
                    offenders.append(f"{m.where}:{i.line}: {private[0]}")

    assert not offenders, "private engine modules imported:\n" + "\n".join(offenders)


def import_graph(package: str) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}, within ``package``: what runs at import time.

    TYPE_CHECKING imports and dynamic ones (``importlib.import_module``, made when a
    function runs) are left out: they cannot form a circle at import.

    ``from X import a`` is an edge to X.a when that is a module of the package, else to X;
    ``import X.Y`` is an edge to X.Y only (its parent packages are not counted).
    """
    modules = {m.name: m for m in modules_of(package)}
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, m in modules.items():
        for i in imports_of(m):
            if i.type_checking or i.kind == "dynamic":
                continue
            targets = (
                [f"{i.module}.{n}" if f"{i.module}.{n}" in modules else i.module for n in i.names]
                if i.kind == "from"
                else [i.module]
            )
            for target in targets:
                if target in modules and target != name:
                    graph[name].setdefault(target, i.line)
    return graph


def test_cycle_finder_reports_a_closed_path() -> None:
    """The cycle finder returns each circle as a closed path and ignores an __init__ fan-out."""
    graph = {
        "p": {"p.a": 1, "p.b": 1},
        "p.a": {"p.b": 1},
        "p.b": {"p.c": 1},
        "p.c": {"p.a": 1},
        "p.d": {},
    }

    assert find_cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert find_cycles({"p": {"p.a": 1}, "p.a": {"p.b": 1}, "p.b": {}}) == []


@pytest.mark.parametrize("package", list(package_dirs()))
def test_no_import_circle_inside_the_package(package: str) -> None:
    """The runtime imports among one package's modules (function-level ones included, TYPE_CHECKING ones not) form no circle."""
    graph = import_graph(package)

    described = [
        " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
        for cycle in find_cycles(graph)
    ]

    assert not described, f"import circles in {package}:\n" + "\n".join(described)


# ----------------------------------------------------------------------------- at run time


@pytest.mark.torch
def test_importing_the_engine_loads_no_kit_and_no_plugin(tmp_path: Path) -> None:
    """`import ascend_patch_core` (and its public ascend_patch_core.imports) puts no kit or plugin package in sys.modules."""
    installed = [
        p for p in EXTENSIONS if p != "ascend_patch_template"
    ]  # the template is never installed
    code = (
        "import sys, importlib.util, ascend_patch_core, ascend_patch_core.imports\n"
        f"loaded = sorted(m for m in sys.modules if m.partition('.')[0] in {EXTENSIONS!r})\n"
        # Found by the import system (the test environment has every kit and plugin), yet not loaded.
        f"missing = [n for n in {installed!r} if importlib.util.find_spec(n) is None]\n"
        "print(loaded, missing)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")

    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[] []"
