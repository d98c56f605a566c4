"""method_rewrite: a function recompiled from its source with one AST change, or why not.

Synthetic modules written to a temporary directory and imported, each with a pitfall
of recompiling a method out of its module: an indented docstring, private names, the
class's own name, ``from __future__ import annotations``, a decorator, ``super()``, a
file edited after import. Needs no library: runs in every session.
"""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
import traceback

import pytest
from ascend_patch_transformers.method_rewrite import rewritten_function


HELPER = "_apx_test_helper"
UNCHANGED = "nothing to change"


class _TripleNotDouble(ast.NodeTransformer):
    """``double(x)`` -> ``_apx_test_helper(x)`` (the helper below triples)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "double":
            return ast.copy_location(ast.Call(ast.Name(HELPER, ast.Load()), node.args, []), node)
        return node


def _triple(x: object) -> object:
    return 3 * x  # type: ignore[operator]


def _rewrite(function: object, helpers: dict[str, object] | None = None) -> object:
    return rewritten_function(
        function, _TripleNotDouble(), helpers or {HELPER: _triple}, unchanged=UNCHANGED
    )


@pytest.fixture
def load(tmp_path, monkeypatch):
    def load(name, source):
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        module = importlib.import_module(name)
        monkeypatch.setitem(sys.modules, name, module)  # removed again at teardown
        return module, path

    return load


_MODULE = '''
    from __future__ import annotations

    import functools
    import math


    def double(x):
        return 2 * x


    def registered(function):
        function.registered = True
        return function


    def wrapped(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            return function(*args, **kwargs)

        return wrapper


    class Base:
        def scale(self, x):
            return x


    class Model(Base):
        __factor = 1

        def compute(self, x: int, *, offset: int = 0) -> tuple[int, type]:
            """Docstring
                with an indented line, and a string that must keep its indentation."""
            text = """
        kept as written"""
            return double(x) * self.__factor + offset + math.prod([1]), Model, len(text)

        @registered
        def decorated(self, x):
            return double(x)

        @wrapped
        def wrapped_method(self, x):
            return double(x)

        def with_super(self, x):
            return super().scale(double(x))

        def nothing(self, x):
            return x

        def uses_the_helper_name(self, x):
            _apx_test_helper = 1
            return double(x) + _apx_test_helper

        def fails(self, x):
            raise ValueError(double(x))

        class Inner:
            def compute(self, x):
                return double(x)


    def recursive(n):
        return double(n) if n <= 1 else recursive(n - 1)
'''


def test_the_twin_runs_its_own_code_with_the_change(load):
    module, _ = load("apx_rewrite_plain", _MODULE)
    original = module.Model.__dict__["compute"]
    twin = _rewrite(original)
    model = module.Model()
    assert original(model, 5, offset=1)[:2] == (12, module.Model)
    # 3 * 5 + 1 + 1 and the same class: mangled private names, the class's own name global
    assert twin(model, 5, offset=1)[:2] == (17, module.Model)
    assert twin(model, 5)[2] == original(model, 5)[2]  # the string kept its indentation
    assert twin.__kwdefaults__ == {"offset": 0} and twin.__annotations__ == original.__annotations__
    assert twin.__doc__ == original.__doc__ and twin.__qualname__ == "Model.compute"
    assert twin.__module__ == original.__module__ and twin.__globals__ is module.__dict__
    assert twin.__code__.co_filename == original.__code__.co_filename
    assert twin.__code__.co_firstlineno == original.__code__.co_firstlineno
    if sys.version_info >= (3, 11):
        assert twin.__code__.co_qualname == "Model.compute"
    assert twin.__code__.co_freevars == (HELPER,)
    assert "double" not in twin.__code__.co_names


def test_tracebacks_point_at_the_library_line(load):
    module, path = load("apx_rewrite_traceback", _MODULE)
    original = module.Model.__dict__["fails"]
    twin = _rewrite(original)
    with pytest.raises(ValueError) as error:
        twin(module.Model(), 2)
    assert error.value.args == (6,)
    frame = traceback.extract_tb(error.value.__traceback__)[-1]
    line = path.read_text().splitlines()[frame.lineno - 1]
    assert frame.filename == str(path) and "raise ValueError(double(x))" in line


def test_a_module_function_referring_to_itself(load):
    module, _ = load("apx_rewrite_function", _MODULE)
    twin = _rewrite(module.recursive)
    assert twin(1) == 3 and twin(3) == module.recursive(3) == 2  # it recurses to the global
    assert "recursive" in twin.__code__.co_names and twin.__code__.co_freevars == (HELPER,)


def test_a_decorator_that_returns_the_function_is_kept(load):
    module, _ = load("apx_rewrite_decorated", _MODULE)
    original = module.Model.__dict__["decorated"]
    twin = _rewrite(original)
    assert twin(module.Model(), 2) == 6 and twin.registered is True


@pytest.mark.parametrize(
    ("method", "reason"),
    [
        ("wrapped_method", "wrapper a decorator returned"),
        ("with_super", "closure"),
        ("nothing", UNCHANGED),
        ("uses_the_helper_name", f"already uses the name {HELPER}"),
    ],
)
def test_what_is_not_rewritten_says_why(load, method, reason):
    module, _ = load(f"apx_rewrite_refused_{method}", _MODULE)
    assert reason in _rewrite(module.Model.__dict__[method])


def test_a_nested_class_method_is_refused(load):
    module, _ = load("apx_rewrite_nested", _MODULE)
    assert "no definition at its line" in _rewrite(module.Model.Inner.__dict__["compute"])
    assert "not a plain function" in _rewrite(len)


def test_a_source_edited_after_import_is_refused(load):
    module, path = load("apx_rewrite_edited", _MODULE)
    path.write_text(path.read_text().replace("* self.__factor + offset", "* 2 + offset"))
    reason = _rewrite(module.Model.__dict__["compute"])
    assert "does not match the loaded code" in reason
    path.unlink()
    assert "source is not available" in _rewrite(module.Model.__dict__["compute"])


def test_a_rewrite_that_does_not_compile_says_why(load):
    module, _ = load("apx_rewrite_broken", _MODULE)

    class Broken(ast.NodeTransformer):
        def visit_Return(self, node: ast.Return) -> ast.AST:
            return ast.copy_location(ast.Return(ast.Name("x", ast.Store())), node)

    reason = rewritten_function(module.Model.__dict__["compute"], Broken(), {}, UNCHANGED)
    assert reason.startswith("its rewritten source does not compile")


def test_without_future_annotations_and_with_a_module_import(load):
    # No __future__ flags; ``torch.cat``-like attribute calls on imported modules, one
    # imported under a condition (compiled differently from other globals in 3.11).
    module, _ = load(
        "apx_rewrite_no_future",
        """
        import math
        try:
            import json
        except ImportError:
            json = None

        def double(x):
            return 2 * x

        class Plain:
            def compute(self, values: list) -> str:
                return json.dumps(math.fsum(double(v) for v in values))
        """,
    )
    twin = _rewrite(module.Plain.__dict__["compute"])
    assert twin(module.Plain(), [1, 2]) == "9.0"
