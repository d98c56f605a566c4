"""The core's architecture, read from its source files (ast; nothing under test is imported).

* No circle among the core's modules, counting every kind of edge: imports at any
  depth (functions, ``if TYPE_CHECKING:``), literal dynamic imports, run-time lookups
  by name (``sys.modules["ascend_patch_core._x"]``, ``f"{__package__}._x"``, mock
  targets) and injection (module A assigning an attribute of module B, or
  ``setattr(B, ...)``, makes B depend on A at run time).
* Only the install layer writes the Installer's state; the Patcher asks it.

(tests/test_architecture.py checks what the kits and plugins may import.)
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from cycles import find_cycles


REPO = Path(__file__).resolve().parent.parent
CORE = "ascend_patch_core"


@dataclass(frozen=True)
class Source:
    name: str
    is_package: bool
    tree: ast.Module
    text: str
    where: str

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


def core_sources(root: Path = REPO / CORE, top: str = CORE) -> dict[str, Source]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = [top, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        text = path.read_text(encoding="utf-8")
        name = ".".join(parts)
        found[name] = Source(
            name, is_package, ast.parse(text), text, str(path.relative_to(root.parent))
        )
    return found


def _absolute(source: Source, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = source.package.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes: prose naming a module is no dependency."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def edges(sources: dict[str, Source], top: str = CORE) -> dict[str, dict[str, str]]:
    """module -> {module it depends on: "line kind"}, every kind of edge counted."""
    graph: dict[str, dict[str, str]] = {name: {} for name in sources}

    def owner(dotted: str) -> str | None:
        """The module ``dotted`` names (itself, or the module holding that attribute)."""
        while dotted and dotted not in sources:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def add(src: str, dst: str | None, line: int, kind: str) -> None:
        # A string naming the top package's public names (an error message's
        # "ascend_patch_core.Patch") is no dependency; an import of it is one.
        if dst == top and kind == "by name":
            return
        if dst is not None and dst != src:
            graph[src].setdefault(dst, f"line {line} {kind}")

    # A core module named in a string: "ascend_patch_core._x", f"{__package__}._x" ...
    named = re.compile(rf"({re.escape(top)}|\{{__package__\}}|\{{__name__\}})((?:\.\w+)+)")
    for name, source in sources.items():
        module_names: dict[str, str] = {}  # local name -> core module it is bound to
        prose = _docstrings(source.tree)
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(name, owner(alias.name), node.lineno, "import")
                    if alias.asname and alias.name in sources:
                        module_names[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(source, node.level, node.module)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    add(name, full if full in sources else owner(base), node.lineno, "import")
                    if full in sources:
                        module_names[alias.asname or alias.name] = full
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in prose:
                    continue
                for match in named.finditer(node.value):
                    if match.group(1) == top:
                        add(name, owner(top + match.group(2)), node.lineno, "by name")
            elif isinstance(node, ast.JoinedStr):
                text = ast.get_source_segment(source.text, node) or ""
                for match in named.finditer(text):
                    base = {top: top, "{__package__}": source.package, "{__name__}": name}
                    add(name, owner(base[match.group(1)] + match.group(2)), node.lineno, "by name")
        # Injection: a module's attribute set from outside. Found in a second pass, once
        # every local name bound to a core module is known.
        for node in ast.walk(source.tree):
            target_module = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                        target_module = module_names.get(target.value.id) or target_module
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and node.args
                and isinstance(node.args[0], ast.Name)
            ):
                target_module = module_names.get(node.args[0].id)
            if target_module is not None and target_module != name:
                add(target_module, name, node.lineno, f"injected by {name}")
    return graph


def _describe(graph: dict[str, dict[str, str]], cycle: list[str]) -> str:
    return (
        " -> ".join(f"{a} ({graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
    )


# ----------------------------------------------------------------------------- the checker itself


def _sources_of(tmp_path: Path, files: dict[str, str]) -> dict[str, Source]:
    for relative, text in files.items():
        path = tmp_path / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return core_sources(tmp_path / "pkg", "pkg")


def test_hidden_edges_are_counted(tmp_path: Path) -> None:
    """TYPE_CHECKING imports, imports in functions, lookups by name and injection each close a circle."""
    sources = _sources_of(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
            "b.py": "def f():\n    from . import a\n",
            "c.py": "import sys\nx = sys.modules.get('pkg.d')\n",
            "d.py": "from . import c\n",
            "e.py": "g = None\n",
            "f.py": "import sys\nfrom . import e\ne.g = sys.modules[__name__]\n",
            "h.py": "import importlib\ndef k():\n    importlib.import_module(f'{__package__}.i')\n",
            "i.py": "from .h import k\n",
        },
    )

    graph = edges(sources, "pkg")

    assert sorted(find_cycles(graph)) == [
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.c", "pkg.d", "pkg.c"],
        ["pkg.e", "pkg.f", "pkg.e"],
        ["pkg.h", "pkg.i", "pkg.h"],
    ]


# ----------------------------------------------------------------------------- the core


def test_no_circle_in_the_core_counting_every_edge() -> None:
    """No circle among the core's modules, TYPE_CHECKING, in-function, by-name and injected edges included."""
    graph = edges(core_sources())

    described = [_describe(graph, cycle) for cycle in find_cycles(graph)]

    assert not described, "circles in the core:\n" + "\n".join(described)


def _writes_through(node: ast.AST, component: str) -> str | None:
    """``x.<component>.attr = ...`` (or +=): the text of the target, else None."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        for target in node.targets:
            targets += target.elts if isinstance(target, ast.Tuple) else [target]
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    for target in targets:
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Attribute)
            and target.value.attr in (component, f"_{component}")
        ):
            return ast.unparse(target)
    return None


def test_only_the_install_layer_writes_the_installer_state() -> None:
    """No module outside the installer's own files assigns an attribute of an Installer held by another object."""
    offenders = [
        f"{s.where}:{node.lineno}: {written}"
        for s in core_sources().values()
        for node in ast.walk(s.tree)
        if (written := _writes_through(node, "installer")) is not None
    ]

    assert not offenders, "the Installer's state written from outside:\n" + "\n".join(offenders)


# ----------------------------------------------------------------------------- folders and layers

#: The core's layers, lowest first: a module may depend on its own folder and on the
#: folders before its own, never after (every kind of edge counted, as above). The
#: package root (``ascend_patch_core/__init__.py``, the public API) sits between the
#: engine's layers and the commands. docs/core.md shows the same order.
LAYERS = (
    "_model",
    "imports",
    "_discovery",
    "_install",
    "_engine",
    "_compat",
    CORE,
    "_scan",
    "_cli",
)


def layer_of(module: str) -> str:
    """The layer a core module belongs to: its folder, or the root for the package itself.

    ``ascend_patch_core/__main__.py`` (``python -m ascend_patch_core``) runs the
    command: it is the top layer's, though it sits in the root.
    """
    folder = module.removeprefix(CORE).lstrip(".").partition(".")[0]
    if folder == "__main__":
        return LAYERS[-1]
    return folder or CORE


def test_every_module_sits_in_a_layer_folder() -> None:
    """No flat module beside the root's __init__ (and __main__), and every folder of the core is one of the layers."""
    root = REPO / CORE
    flat = sorted(p.name for p in root.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    folders = {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"}

    assert not flat, f"modules outside the layer folders: {flat}"
    assert folders == set(LAYERS) - {CORE}, (
        "a new folder needs its place in LAYERS (and docs/core.md)"
    )


def test_no_layer_depends_on_a_layer_above_it() -> None:
    """Every edge (imports at any depth, TYPE_CHECKING, by name, injected) goes to the same layer or one below."""
    graph = edges(core_sources())
    rank = {layer: i for i, layer in enumerate(LAYERS)}

    upward = [
        f"{a} -> {b} ({why})"
        for a, targets in graph.items()
        for b, why in targets.items()
        if rank[layer_of(b)] > rank[layer_of(a)]
    ]

    assert not upward, "edges to a higher layer:\n" + "\n".join(sorted(upward))


def test_docs_map_matches_the_folders() -> None:
    """docs/core.md's map lists the layer folders in LAYERS order, each with exactly its modules."""
    text = (REPO / "docs" / "core.md").read_text(encoding="utf-8")
    block = text.split("<!-- folders -->")[1]
    rows = [line.split() for line in block.splitlines() if line.startswith("  ")]
    listed = {row[0].rstrip("/"): set(row[1:]) for row in rows if row[0].endswith("/")}
    order = [row[0].rstrip("/") for row in rows if row[0].endswith("/") or row[0] == "__init__.py"]

    actual = {
        folder: {p.stem for p in (REPO / CORE / folder).glob("*.py") if p.stem != "__init__"}
        for folder in LAYERS
        if folder != CORE
    }
    assert listed == actual
    assert order == ["__init__.py" if layer == CORE else layer for layer in LAYERS]
