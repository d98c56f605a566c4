"""Recognising transformers' modeling code by its source, not by its names.

The modeling files of transformers are generated from a few reference implementations
("modular" files), so the RMSNorm of Qwen3, the ``apply_rotary_pos_emb`` of Mistral and
the MLP of Llama are the same code under other names. A family module states the
formula it can serve as a *canonical source* (a function written the way transformers
writes it); :func:`shape` reduces a function to what it computes -- its parameters,
defaults and body, with docstrings, annotations and decorators dropped and the names
of parameters and local variables replaced by their order of appearance -- and a
function of a loaded modeling module is served only when its shape equals a canonical
one. So a class named ``*RMSNorm`` whose forward computes something else (Gemma's
``1 + weight``, a norm over another axis, a different epsilon attribute) never takes a
replacement meant for another formula: it matches another canonical shape, or none.

Each modeling module's source is parsed once and shared by the families
(:func:`module_definitions`): about 10 ms for ``modeling_qwen3`` measured on a loaded
2-CPU machine, next to the ~1 s its import takes; a module with no ``forward`` and no
rotary function (``modeling_auto``) is not parsed.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any


__all__ = [
    "MAX_STATEMENTS",
    "MODELING_MODULES",
    "ROTATE_HALF",
    "Definitions",
    "defined_class",
    "module_definitions",
    "shape",
    "shape_of_source",
]

#: The pattern of the modules the hooks visit (``fnmatch``; groups declares the same).
MODELING_MODULES = "transformers.models.*.modeling_*"


class _Canonical(ast.NodeTransformer):
    """Renames parameters and locals to ``_0``, ``_1``, ... in order of first appearance."""

    def __init__(self, local_names: set[str]) -> None:
        self.local_names = local_names
        self.renamed: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        if name not in self.local_names:
            return name  # a global (torch, nn, rotate_half) keeps its name
        return self.renamed.setdefault(name, f"_{len(self.renamed)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._rename(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._rename(node.arg)
        node.annotation = None
        return node


def _local_names(func: ast.FunctionDef) -> set[str]:
    names = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def shape(func: ast.FunctionDef) -> str:
    """What ``func`` computes, independent of its name, docstring, annotations and local names.

    ``func`` is renamed in place: pass a tree of your own (a deep copy would cost most of
    the time of a modeling module's visit).
    """
    body = list(func.body)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]  # the docstring
    func.name = "f"
    func.body = body
    func.decorator_list = []
    func.returns = None
    canonical = _Canonical(_local_names(func)).visit(func)
    return ast.dump(canonical, annotate_fields=False)


def shape_of_source(source: str) -> str:
    """:func:`shape` of the single function written in ``source``."""
    func = ast.parse(textwrap.dedent(source)).body[0]
    if not isinstance(func, ast.FunctionDef):
        raise TypeError("the canonical source must be one function definition")
    return shape(func)


@dataclass(frozen=True)
class Definitions:
    """The shapes of a modeling module's top-level functions and of its classes' methods.

    A function longer than :data:`MAX_STATEMENTS` has the empty shape: it matches nothing.
    """

    #: function name -> shape
    functions: dict[str, str]
    #: class name -> {method name -> shape}
    classes: dict[str, dict[str, str]]

    def classes_with(self, method: str, shapes: dict[str, str]) -> Iterator[tuple[str, str]]:
        """``(class name, kind)`` for each class whose ``method`` has one of ``shapes`` (shape -> kind)."""
        for name, methods in self.classes.items():
            kind = shapes.get(methods.get(method, ""))
            if kind is not None:
                yield name, kind


_parsed: dict[tuple[str, str | None], Definitions] = {}

#: The shape of transformers' standard ``rotate_half`` (``cat(-x2, x1)`` of the two
#: halves of the last dim): the rotary families are served only where the module's own
#: ``rotate_half`` is this one, which is ``npu_rotary_mul``'s ``half`` mode.
ROTATE_HALF = shape_of_source(
    """
    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)
    """
)

#: The canonical forms have at most this many statements (the vision rotary has 9,
#: GPT-NeoX's partial rotary 10); a longer function (an attention or a model forward)
#: gets no shape and matches nothing, which saves work.
MAX_STATEMENTS = 10


def _short_shape(func: ast.FunctionDef) -> str:
    return shape(func) if len(func.body) <= MAX_STATEMENTS + 1 else ""  # + a docstring


def module_definitions(module: ModuleType) -> Definitions:
    """The :class:`Definitions` of ``module``'s source (parsed once per module; empty without source)."""
    key = (module.__name__, getattr(module, "__file__", None))
    found = _parsed.get(key)
    if found is not None:
        return found
    try:
        source = inspect.getsource(module)
        # No forward and no rotary function (modeling_auto's tables): nothing to parse.
        wanted = "def forward" in source or "def apply_rotary_pos_emb" in source
        tree = ast.parse(source) if wanted else ast.Module(body=[], type_ignores=[])
    except (OSError, TypeError, SyntaxError):
        tree = ast.Module(body=[], type_ignores=[])
    functions: dict[str, str] = {}
    classes: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            name = node.name  # read before shape() renames the node
            functions[name] = _short_shape(node)
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = {
                item.name: _short_shape(item)  # the key is evaluated first
                for item in node.body
                if isinstance(item, ast.FunctionDef)
            }
    found = _parsed[key] = Definitions(functions, classes)
    return found


def defined_class(module: ModuleType, name: str) -> Any:
    """``module.<name>`` if it is the class the module's source defines there, else None.

    A name rebound to a class from elsewhere (an alias, an earlier patch) is not the
    source this module shows, so its formula is unknown.
    """
    value = module.__dict__.get(name)
    if isinstance(value, type) and value.__module__ == module.__name__:
        return value
    return None
