"""What ``mmcv._ext`` must hold, read from mmcv's own sources (``ast`` and regular expressions).

Two sources in mmcv say it, and both are read:

* every ``ext_loader.load_ext('_ext', [...])`` call in mmcv's Python modules: the
  names each module asks for (``load_ext`` asserts each is an attribute of
  ``mmcv._ext`` when the module is imported);
* every ``m.def("name", &fn, "doc", py::arg("a"), ...)`` in
  ``mmcv/ops/csrc/pytorch/pybind.cpp``: the argument names the compiled function
  takes (call sites pass many of them by keyword) and, from the C++ declaration of
  ``fn`` above it, what it returns (``void``: it writes into the tensors it is given).

A name defined twice is a pybind11 overload: the first definition whose arguments
fit a call wins, in definition order. mmcv 2.1.0 defines ``knn_forward`` twice over
the same C++ function, ``(xyz_tensor, new_xyz_tensor, idx_tensor, dist2_tensor, b,
n, m, nsample)`` and then ``(b, n, m, nsample, xyz_tensor, ...)``; its one caller
(mmcv/ops/knn.py) passes four tensors positionally and ``b=, n=, m=, nsample=`` by
keyword, which only the first binds, so the first is the signature kept; the second
is recorded under ``overloads``.

Used by ``tools/mmcv_ext_names.py`` (which writes the committed data for the mmcv
releases the plugin knows) and by the provider for an installed mmcv release that
data does not cover. Nothing here imports mmcv.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any


__all__ = ["asked_names", "ext_table", "pybind_definitions"]

_DEF = re.compile(r"\bm\.def\(\s*\"(\w+)\"\s*,\s*&?\s*([\w:]+)(.*?)\)\s*;", re.S)
_ARG = re.compile(r"py::arg\(\s*\"(\w+)\"\s*\)")
# A C++ function declaration at namespace level: return type, name, parameters, ';'.
_DECL = re.compile(
    r"^[ \t]*((?:const\s+)?[\w:]+(?:<[\w:<>,\s]*>)?[&*]?)\s+(\w+)\s*\(([^;{}]*?)\)\s*;", re.M
)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def asked_names(package_dir: Path) -> dict[str, list[str]]:
    """``{name: [module, ...]}``: which mmcv modules ask ``load_ext('_ext', ...)`` for which name.

    ``package_dir`` is the ``mmcv`` package directory (its ``__init__.py`` is there).
    """
    asked: dict[str, list[str]] = {}
    root = package_dir.parent
    for path in sorted(package_dir.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "load_ext" not in text:
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for names in _load_ext_calls(ast.parse(text, str(path))):
            for name in names:
                owners = asked.setdefault(name, [])
                if module not in owners:
                    owners.append(module)
    return {name: sorted(owners) for name, owners in sorted(asked.items())}


def _load_ext_calls(tree: ast.AST) -> Iterable[list[str]]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called != "load_ext" or len(node.args) < 2:
            continue
        first, second = node.args[0], node.args[1]
        if not (isinstance(first, ast.Constant) and first.value == "_ext"):
            continue
        if isinstance(second, (ast.List, ast.Tuple)):
            yield [
                e.value
                for e in second.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]


def pybind_definitions(pybind_cpp: str) -> dict[str, dict[str, Any]]:
    """``{name: {"args": [...], "returns": "...", "overloads": [[...], ...]}}`` from pybind.cpp."""
    text = _COMMENT.sub("", pybind_cpp)
    module_at = text.find("PYBIND11_MODULE")
    declarations = {
        name: " ".join(returns.split())
        for returns, name, _ in _DECL.findall(text[:module_at] if module_at >= 0 else text)
    }
    defined: dict[str, dict[str, Any]] = {}
    for name, function, rest in _DEF.findall(text[module_at:] if module_at >= 0 else text):
        args = _ARG.findall(rest)
        entry = defined.get(name)
        if entry is None:
            cpp = function.rpartition("::")[2]
            defined[name] = {"args": args, "returns": declarations.get(cpp, "?"), "overloads": []}
        elif args != entry["args"]:
            entry["overloads"].append(args)
    return defined


def ext_table(package_dir: Path) -> dict[str, Any]:
    """Every name the mmcv in ``package_dir`` asks of ``mmcv._ext``, with its arguments.

    ``{"names": {name: {"args", "returns", "asked_by", "overloads"?}}, "asked_not_defined":
    [...], "defined_not_asked": [...]}``. A name asked but not defined in pybind.cpp has
    ``args: null`` (mmcv's own build would fail its ``load_ext`` assertion too).
    """
    asked = asked_names(package_dir)
    pybind = package_dir / "ops" / "csrc" / "pytorch" / "pybind.cpp"
    defined = pybind_definitions(pybind.read_text(encoding="utf-8")) if pybind.is_file() else {}
    names: dict[str, Any] = {}
    for name, owners in asked.items():
        definition = defined.get(name)
        entry: dict[str, Any] = {
            "args": None if definition is None else definition["args"],
            "returns": None if definition is None else definition["returns"],
            "asked_by": owners,
        }
        if definition is not None and definition["overloads"]:
            entry["overloads"] = definition["overloads"]
        names[name] = entry
    return {
        "names": names,
        "asked_not_defined": sorted(set(asked) - set(defined)) if defined else [],
        "defined_not_asked": sorted(set(defined) - set(asked)),
    }
