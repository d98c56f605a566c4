"""The emulated ops under tracing: fake kernels and functionalization of in-place ops.

:func:`install` registers, for the registered torch_npu version,

* a fake (shape-only) kernel for every op with a reference kernel, from
  :data:`._fakes.RULES`, so ``FakeTensorMode``, ``make_fx(tracing_mode="fake")`` and
  ``torch.compile`` never run a reference kernel on fake tensors;
* a ``Functionalize`` kernel for every in-place op whose result aliases its first
  argument (``npu_silu_(Tensor(a!) self) -> Tensor(a!)``) and that has a functional
  twin with the same arguments (``npu_silu``): torch's auto-functionalization refuses
  ops whose outputs carry alias annotations ("Found a custom (non-ATen) operator whose
  output has alias annotations"), so this does what torch's codegen does for ATen's
  in-place ops: call the functional op on the unwrapped values, then replace the
  mutated argument's value with the result. A functionalized graph holds the
  functional op and a ``copy_`` back into the graph input, as for ``aten.add_``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._fakes import RULES


__all__ = ["install", "installed_fakes", "installed_functionalizations"]

_NAMESPACE = "npu"
_state: dict[str, Any] = {"library": None, "fakes": [], "functional": {}}


def installed_fakes() -> list[str]:
    """The op overloads with a fake kernel."""
    return list(_state["fakes"])


def installed_functionalizations() -> dict[str, str]:
    """In-place op overload -> the functional overload its Functionalize kernel calls."""
    return dict(_state["functional"])


def _overload(qualified: str) -> Any:
    name, _, overload = qualified.partition(".")
    return getattr(getattr(torch.ops.npu, name), overload or "default")


def _fake(schema: Any, rule: Callable[..., Any]) -> Callable[..., Any]:
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}

    def fake(*args: Any, **kwargs: Any) -> Any:
        named = dict(defaults)
        named.update(zip(positional, args, strict=False))
        named.update(kwargs)
        return rule(named)

    return fake


def _mutated_alias(schema: Any) -> bool:
    """Whether the op writes its first argument and returns it (``Tensor(a!)``)."""
    if not schema.arguments or len(schema.returns) != 1:
        return False
    first, result = schema.arguments[0].alias_info, schema.returns[0].alias_info
    return bool(first and first.is_write and result and result.is_write)


def _twin(qualified: str, implemented: list[str]) -> str | None:
    """The functional overload with the in-place one's argument names and types, if any.

    Names matter: ``npu_format_cast_(self, Tensor src)`` writes ``src``'s values into
    ``self``, so ``npu_format_cast.Tensor(self, Tensor dst)`` is not its functional form.
    """
    name = qualified.partition(".")[0]
    if not name.endswith("_"):
        return None
    wanted = [(a.name, str(a.type)) for a in _overload(qualified)._schema.arguments]
    for candidate in implemented:
        if candidate.partition(".")[0] != name[:-1]:
            continue
        schema = _overload(candidate)._schema
        if [(a.name, str(a.type)) for a in schema.arguments] == wanted and not any(
            a.alias_info for a in schema.arguments
        ):
            return candidate
    return None


def _functionalize(functional: Any) -> Callable[..., Any]:
    def functionalized(*args: Any, **kwargs: Any) -> Any:
        from torch._subclasses.functional_tensor import CppFunctionalizeAPI

        api = CppFunctionalizeAPI()
        target = args[0]
        unwrapped_args = api.unwrap_tensors(args)
        unwrapped_kwargs = api.unwrap_tensors(kwargs)
        with api.redispatch_to_next():
            result = functional(*unwrapped_args, **unwrapped_kwargs)
        api.replace(target, result)
        api.commit_update(target)
        api.sync(target)
        return target

    return functionalized


def install(registration: Any) -> None:
    """Register fake and Functionalize kernels for ``registration`` (once per process)."""
    if _state["library"] is not None:
        return
    library = torch.library.Library(_NAMESPACE, "IMPL")
    _state["library"] = library
    for qualified in registration.implemented:
        overload = _overload(qualified)
        rule = RULES.get(qualified)
        if rule is not None:
            torch.library.register_fake(
                f"{_NAMESPACE}::{qualified}", _fake(overload._schema, rule), lib=library
            )
            _state["fakes"].append(qualified)
        if _mutated_alias(overload._schema):
            twin = _twin(qualified, registration.implemented)
            if twin is not None:
                library.impl(qualified, _functionalize(_overload(twin)), "Functionalize")
                _state["functional"][qualified] = twin
