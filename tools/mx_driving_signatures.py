#!/usr/bin/env python3
"""Regenerate the committed mx_driving API data from the mx-driving wheel on PyPI.

DrivingSDK's op library (``mx_driving``, on the index as ``mx-driving``) cannot be
imported here: its ``__init__`` imports torch_npu and a compiled ``_C``. So this
script reads the wheel's Python sources straight out of the zip, with ``ast``, and
never runs them: ``mx_driving/__init__.py``'s ``__all__`` lists the public names, its
imports say which module defines each, and that module's ``def``/``class``/assignment
gives the kind and the Python signature:

* ``function``: a module-level ``def``; its signature;
* ``apply``: ``name = SomeFunction.apply``; the signature of ``SomeFunction.forward``
  without ``ctx`` (what the call binds to), the class in ``function_class``;
* ``autograd_function``: a ``torch.autograd.Function`` subclass; ``forward`` without ``ctx``;
* ``module``: an ``nn.Module`` subclass; ``init`` (``__init__`` without ``self``) and
  ``forward`` (without ``self``), inherited ones found through the package's classes;
* ``class``: any other class; ``init``;
* ``instance``: ``name = SomeClass()``, a class of the package; ``class`` names it, and
  ``signature`` is what calling the instance binds to (``__call__``, or an
  ``nn.Module``'s ``forward``), without ``self``;
* ``object``: anything else, e.g. a compiled ``_C`` function (no signature recorded).

Parameters are stored with their kind and, as source text, their default and
annotation. The data goes to
``kits/emulator/ascend_patch_emulator/data/mx_driving-<version>.json`` with the wheel's
name and sha256; only facts about the API are stored, never the package's code.

Run it with any Python 3.10+ (no torch needed)::

    python3 tools/mx_driving_signatures.py              # every version in VERSIONS
    python3 tools/mx_driving_signatures.py --check      # compare, write nothing

Wheels are cached in ``--cache`` (default: ``<tmp>/ascend-patch-wheels``), as by
``tools/extract_npu_schemas.py``; the output is deterministic.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "kits" / "emulator" / "ascend_patch_emulator" / "data"

#: The versions with committed data. Add one here and run the script to support it.
VERSIONS = ("26.2.0.post2",)
#: The data format (read by ``ascend_patch_emulator._mx_data``).
FORMAT = 1
PACKAGE = "mx_driving"
PIP_TAG_ARGS = (
    "--only-binary",
    ":all:",
    "--implementation",
    "cp",
    "--python-version",
    "3.11",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
)
#: Decorators that do not change what a method binds.
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod"})
_FUNCTION_BASES = frozenset({"Function", "torch.autograd.Function", "autograd.Function"})
_MODULE_BASES = frozenset({"Module", "nn.Module", "torch.nn.Module"})


def default_cache() -> Path:
    return Path(tempfile.gettempdir()) / "ascend-patch-wheels"


def wheel_for(version: str, cache: Path) -> Path:
    """The mx-driving ``version`` wheel, from ``cache`` or downloaded into it with pip."""
    found = sorted(cache.glob(f"mx_driving-{version}-cp311-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        *PIP_TAG_ARGS,
        "--dest",
        str(cache),
        f"mx-driving=={version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(cache.glob(f"mx_driving-{version}-cp311-*.whl"))
    if result.returncode != 0 or not found:
        raise SystemExit(
            f"pip could not download mx-driving=={version} (exit {result.returncode}):\n"
            f"{result.stdout}{result.stderr}"
        )
    return found[0]


class Sources:
    """The package's modules, parsed on demand from the wheel."""

    def __init__(self, archive: zipfile.ZipFile) -> None:
        self._files = {name: name for name in archive.namelist() if name.startswith(f"{PACKAGE}/")}
        self._archive = archive
        self._parsed: dict[str, tuple[str, ast.Module] | None] = {}

    def path(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self._files:
                return candidate
        return None

    def is_package(self, module: str) -> bool:
        return f"{module.replace('.', '/')}/__init__.py" in self._files

    def tree(self, module: str) -> tuple[str, ast.Module] | None:
        if module not in self._parsed:
            path = self.path(module)
            if path is None:
                self._parsed[module] = None
            else:
                text = self._archive.read(path).decode("utf-8")
                self._parsed[module] = (text, ast.parse(text, filename=path))
        return self._parsed[module]


def _absolute(module: str, node: ast.ImportFrom, package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if package else 0)
    base = ".".join(parts[:keep])
    return f"{base}.{node.module}" if node.module else base


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop: int) -> list[dict[str, str]]:
    """The parameters of ``fn`` (the first ``drop`` positional ones left out), in order."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    rows: list[dict[str, str]] = []

    def row(arg: ast.arg, kind: str, default: ast.expr | None) -> dict[str, str]:
        entry = {"name": arg.arg, "kind": kind}
        if default is not None:
            entry["default"] = ast.unparse(default)
        if arg.annotation is not None:
            entry["annotation"] = ast.unparse(arg.annotation)
        return entry

    for index, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        if index < drop:
            continue
        kind = "POSITIONAL_ONLY" if index < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        rows.append(row(arg, kind, default))
    if args.vararg is not None:
        rows.append(row(args.vararg, "VAR_POSITIONAL", None))
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        rows.append(row(arg, "KEYWORD_ONLY", kw_default))
    if args.kwarg is not None:
        rows.append(row(args.kwarg, "VAR_KEYWORD", None))
    return rows


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [t for t in (ast.unparse(d) for d in fn.decorator_list) if t not in _PLAIN_DECORATORS]


class Reader:
    """Resolves public names to their definitions, across the package's imports."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """(defining module, node) of ``module.name``: a def, class, or assignment value."""
        if depth > 20:
            raise SystemExit(f"import cycle resolving {module}.{name}")
        parsed = self.sources.tree(module)
        if parsed is None:
            return None
        package = self.sources.is_package(module)
        found: tuple[str, ast.AST] | None = None
        # The last binding at module level wins, as at run time.
        for node in parsed[1].body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == name:
                    found = (module, node)
            elif isinstance(node, ast.Assign):
                if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                    found = (module, node.value)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, package)
                        submodule = f"{source}.{alias.name}"
                        if self.sources.path(submodule) is not None and not self._defines(
                            source, alias.name
                        ):
                            found = (submodule, ast.Module(body=[], type_ignores=[]))
                        else:
                            found = self.resolve(source, alias.name, depth + 1) or found
        if found is not None and isinstance(found[1], ast.Name) and found[1].id != name:
            return self.resolve(found[0], found[1].id, depth + 1) or found
        return found

    def _defines(self, module: str, name: str) -> bool:
        parsed = self.sources.tree(module)
        if parsed is None:
            return False
        for node in parsed[1].body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return True
            if isinstance(node, ast.ImportFrom) and any(
                (a.asname or a.name) == name for a in node.names
            ):
                return True
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                return True
        return False

    def class_kind(self, module: str, node: ast.ClassDef, depth: int = 0) -> str:
        for base in node.bases:
            text = ast.unparse(base)
            if text in _FUNCTION_BASES:
                return "autograd_function"
            if text in _MODULE_BASES:
                return "module"
            if isinstance(base, ast.Name) and depth < 20:
                resolved = self.resolve(module, base.id)
                if resolved is not None and isinstance(resolved[1], ast.ClassDef):
                    kind = self.class_kind(resolved[0], resolved[1], depth + 1)
                    if kind != "class":
                        return kind
        return "class"

    def method(
        self, module: str, node: ast.ClassDef, name: str, depth: int = 0
    ) -> ast.FunctionDef | None:
        """``node``'s method ``name``, or the one it inherits from a class of the package."""
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == name:
                return item
        for base in node.bases:
            if isinstance(base, ast.Name) and depth < 20:
                resolved = self.resolve(module, base.id)
                if resolved is not None and isinstance(resolved[1], ast.ClassDef):
                    found = self.method(resolved[0], resolved[1], name, depth + 1)
                    if found is not None:
                        return found
        return None

    def describe(self, name: str) -> dict[str, Any]:
        resolved = self.resolve(PACKAGE, name)
        if resolved is None:
            raise SystemExit(f"{PACKAGE}.{name} is in __all__ but defined nowhere the script sees")
        module, node = resolved
        row: dict[str, Any] = {"name": name, "module": module}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            row.update(kind="function", signature=_parameters(node, 0))
            if _decorators(node):
                row["decorators"] = _decorators(node)
        elif isinstance(node, ast.ClassDef):
            kind = self.class_kind(module, node)
            row["kind"] = kind
            init = self.method(module, node, "__init__")
            if kind == "autograd_function":
                forward = self.method(module, node, "forward")
                row["signature"] = _parameters(forward, 1) if forward else None
                if forward is not None and _decorators(forward):
                    row["decorators"] = _decorators(forward)
                return row
            row["init"] = _parameters(init, 1) if init is not None else []
            if kind == "module":
                forward = self.method(module, node, "forward")
                row["forward"] = _parameters(forward, 1) if forward is not None else None
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "apply"
            and isinstance(node.value, ast.Name)
        ):
            owner = self.resolve(module, node.value.id)
            if owner is None or not isinstance(owner[1], ast.ClassDef):
                raise SystemExit(f"{PACKAGE}.{name} = {ast.unparse(node)}: class not found")
            forward = self.method(owner[0], owner[1], "forward")
            row.update(
                kind="apply",
                function_class=owner[1].name,
                signature=_parameters(forward, 1) if forward is not None else None,
            )
            row["module"] = owner[0]
            if forward is not None and _decorators(forward):
                row["decorators"] = _decorators(forward)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            owner = self.resolve(module, node.func.id)
            if owner is None or not isinstance(owner[1], ast.ClassDef):
                row["kind"] = "object"
                return row
            call = self.method(owner[0], owner[1], "__call__")
            if call is None and self.class_kind(owner[0], owner[1]) == "module":
                call = self.method(owner[0], owner[1], "forward")
            row.update(
                kind="instance",
                **{"class": owner[1].name},
                signature=_parameters(call, 1) if call is not None else None,
            )
        else:
            row["kind"] = "object"
        return row


def public_names(sources: Sources) -> list[str]:
    parsed = sources.tree(PACKAGE)
    assert parsed is not None
    for node in parsed[1].body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = ast.literal_eval(node.value)
            return [str(n) for n in names]
    raise SystemExit(f"{PACKAGE}/__init__.py has no literal __all__")


def render(version: str, wheel: Path) -> str:
    """The data file text: a header, then one JSON object per public name, sorted."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel) as archive:
        sources = Sources(archive)
        reader = Reader(sources)
        names = public_names(sources)
        rows = [reader.describe(name) for name in sorted(set(names))]
    header = json.dumps(
        {"format": FORMAT, "mx_driving": version, "source": wheel.name, "sha256": digest}
    )
    body = ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows)
    return header[:-1] + f',\n"names": [\n{body}\n]}}\n'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "versions", nargs="*", help=f"mx-driving versions (default: {' '.join(VERSIONS)})"
    )
    parser.add_argument("--cache", type=Path, default=default_cache(), help="wheel cache folder")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="where the data files go")
    parser.add_argument(
        "--check", action="store_true", help="compare with the files in --out; write nothing"
    )
    args = parser.parse_args(argv)
    stale = []
    for version in args.versions or VERSIONS:
        text = render(version, wheel_for(version, args.cache))
        path = args.out / f"{PACKAGE}-{version}.json"
        if args.check:
            current = path.read_text(encoding="utf-8") if path.is_file() else None
            print(f"{path}: {'up to date' if current == text else 'STALE'}")
            if current != text:
                stale.append(version)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({len(text)} bytes)")
    if stale:
        print(f"regenerate: {sys.argv[0]} {' '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
