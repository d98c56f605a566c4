"""A library function recompiled from its own source with one AST change, or why not.

Two groups change one expression of a transformers method and keep the rest of it as
the installed version wrote it (PlaceholderMaskCount: ``values[mask].numel()`` becomes a
count; VisionPatchify: a permute of more than 8 dims becomes passes of at most 8).
:func:`rewritten_function` does the part they share: it reads the function's definition
from its module's source at the function's first line, applies the caller's :class:`ast.NodeTransformer` to it,
compiles it and builds the twin, whose helpers (the functions the new code calls) are
closure variables, so the library's module globals are read, never written.

Trust comes from a fingerprint: before any change, the same definition compiled the
same way must give the loaded function's bytecode exactly (code, names, constants,
nested code objects). So a file edited after import, another build of the file, or a
function that is not the definition at its line (a wrapper a decorator returned) is
refused with a reason, never rewritten from a source that is not what runs. How the
definition is compiled so that the unchanged source does give the same bytecode:

* from the file's lines as written, not dedented (a method's block is parsed as the
  body of a class line put before it): the docstring and every string keep their
  indentation, and the line numbers are the file's;
* inside a class of the owner's name (private names mangle the same), inside a factory
  function whose parameters are the helpers, with the owner (or the function) declared
  ``global``: a reference to the class's own name stays a global, not a closure variable;
* with the function's ``__future__`` flags, and after an ``import`` of each name the
  module binds with an import statement (read from the module's symbol table, ~5 ms;
  compiled, never run): Python 3.11 compiles ``torch.cat(...)`` differently when
  ``torch`` is imported in the module. The whole module is not parsed into an AST
  (~25 ms for a 1,600-line modeling file).

Only code objects are taken from the compiled module: nothing of it runs (no decorator,
no annotation, no import). Refused as well: a function using a closure (``super()``,
``__class__``, a nested function), one already using a helper's name, a nested class's
method (its owner is not a top-level class of the module).
"""

from __future__ import annotations
import __future__

import ast
import inspect
import symtable
import sys
import tokenize
import types
from collections.abc import Mapping
from typing import Any


__all__ = ["rewritten_function"]

_FACTORY = "_ascend_patch_method_factory"
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag


def _definition(function: types.FunctionType, source: str) -> ast.FunctionDef | str:
    """The ``def`` of ``function`` (decorators included) parsed from its lines of ``source``.

    The lines are the block starting at the function's first line, as written; a method's
    are parsed as the body of a class of its owner's name, and numbered as in the file.
    """
    owner, _, _ = function.__qualname__.rpartition(".")
    missing = "no definition at its line in the module source"
    if "." in owner:  # a nested class's method: its owner is not a top-level class
        return missing
    first = function.__code__.co_firstlineno
    try:
        block = "".join(inspect.getblock(source.splitlines(keepends=True)[first - 1 :]))
        tree = ast.parse(f"class {owner}:\n{block}" if owner else block)
    except (SyntaxError, ValueError, tokenize.TokenError):
        return missing
    ast.increment_lineno(tree, first - 2 if owner else first - 1)
    scope: list[ast.stmt] = tree.body
    if owner:
        scope = scope[0].body if len(scope) == 1 and isinstance(scope[0], ast.ClassDef) else []
    if (
        len(scope) != 1
        or not isinstance(scope[0], ast.FunctionDef)
        or scope[0].name != function.__name__
    ):
        return missing
    return scope[0]


def _imported(source: str, filename: str) -> list[str]:
    """The names ``source`` binds at module level with an import statement (its symbol table)."""
    table = symtable.symtable(source, filename, "exec")
    return sorted(symbol.get_name() for symbol in table.get_symbols() if symbol.is_imported())


def _compiled(
    function: types.FunctionType,
    definition: ast.FunctionDef,
    imported: list[str],
    helpers: tuple[str, ...],
) -> types.CodeType | None:
    """``definition``'s code object, compiled in the module's context (see the module doc)."""
    owner, _, _ = function.__qualname__.rpartition(".")
    body: list[ast.stmt] = [ast.Global([function.__name__]), definition]
    if owner:  # declared global, so a reference to the class stays a global, as in the module
        body = [ast.Global([owner]), ast.ClassDef(owner, [], [], [definition], [])]
    factory = ast.FunctionDef(
        _FACTORY,
        ast.arguments([], [ast.arg(name) for name in helpers], None, [], [], None, []),
        [*body, ast.Return(ast.Constant(None))],
        [],
    )
    # Never run: they mark the names as imported for the compiler (see the module doc).
    imports = [ast.Import([ast.alias(name) for name in imported])] if imported else []
    module = ast.Module([*imports, factory], [])
    ast.fix_missing_locations(module)
    flags = function.__code__.co_flags & _FUTURE_FLAGS
    code = compile(module, function.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    return _find_code(code, function.__name__, function.__code__.co_firstlineno)


def _find_code(code: types.CodeType, name: str, first_line: int) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name and const.co_firstlineno == first_line:
                return const
            inner = _find_code(const, name, first_line)
            if inner is not None:
                return inner
    return None


def _fingerprint(code: types.CodeType) -> tuple[Any, ...]:
    """What the code does: bytecode, names, constants (nested code recursively); not lines."""
    consts = tuple(
        _fingerprint(c) if isinstance(c, types.CodeType) else (type(c), c) for c in code.co_consts
    )
    return (
        code.co_code,
        code.co_names,
        code.co_varnames,
        code.co_cellvars,
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        consts,
    )


def _names(code: types.CodeType) -> set[str]:
    """Every name ``code`` and its nested code objects use."""
    names = {*code.co_names, *code.co_varnames, *code.co_cellvars, *code.co_freevars}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def rewritten_function(
    function: object,
    transformer: ast.NodeTransformer,
    helpers: Mapping[str, object],
    unchanged: str,
) -> types.FunctionType | str:
    """``function`` recompiled from its source with ``transformer`` applied; else why not.

    ``transformer`` visits the function's definition (a ``FunctionDef`` parsed from the
    module's source, decorators included) and may call the ``helpers`` by name: each
    becomes a closure variable of the twin bound to its value. ``unchanged`` is the
    reason returned when the transformer changes nothing in the compiled code. The
    twin keeps the original's name, qualified name, module, defaults, annotations,
    docstring and attributes; its code has the file and lines of the original.
    """
    if not isinstance(function, types.FunctionType):
        return f"{function!r} is not a plain function"
    if hasattr(function, "__wrapped__"):
        return "it is a wrapper a decorator returned, not the definition in its source"
    code = function.__code__
    if "<locals>" in function.__qualname__ or code.co_freevars:
        return "it uses a closure (super(), __class__ or a nested scope): not rewritten"
    used = sorted(_names(code) & set(helpers))
    if used:
        return f"it already uses the name {used[0]}"
    module = sys.modules.get(function.__module__)
    if module is None:
        return "its module is not loaded"
    try:
        source = inspect.getsource(module)
        imported = _imported(source, code.co_filename)
    except (OSError, TypeError, SyntaxError) as error:
        return f"its source is not available ({type(error).__name__}: {error})"
    definition = _definition(function, source)
    if isinstance(definition, str):
        return definition
    names = tuple(helpers)
    try:
        plain = _compiled(function, definition, imported, names)
    except (SyntaxError, ValueError, TypeError) as error:
        return f"its source does not compile out of its module ({type(error).__name__}: {error})"
    if plain is None or _fingerprint(plain) != _fingerprint(code):
        return "its source file does not match the loaded code (edited after import?)"
    changed = transformer.visit(definition)
    if not isinstance(changed, ast.FunctionDef):
        return "the rewrite did not return a function definition"
    try:
        new = _compiled(function, changed, imported, names)
    except (SyntaxError, ValueError, TypeError) as error:  # a defect of the rewrite
        return f"its rewritten source does not compile ({type(error).__name__}: {error})"
    if new is None:
        return "its rewritten code was not found"
    if _fingerprint(new) == _fingerprint(plain):
        return unchanged
    if not set(new.co_freevars) <= set(helpers):
        return f"the rewritten code has free variables {new.co_freevars}"
    if sys.version_info >= (3, 11):  # tracebacks and profilers name the function as before
        new = new.replace(co_qualname=code.co_qualname)
    twin = types.FunctionType(
        new,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        tuple(types.CellType(helpers[name]) for name in new.co_freevars),
    )
    twin.__kwdefaults__ = function.__kwdefaults__
    twin.__annotations__ = function.__annotations__
    twin.__doc__ = function.__doc__
    twin.__qualname__ = function.__qualname__
    twin.__module__ = function.__module__
    twin.__dict__.update(function.__dict__)
    return twin
