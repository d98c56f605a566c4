"""torch_npu's exact op schemas as ``torch.ops.npu``, dispatching to the reference kernels.

Every schema of the emulated version is defined with ``torch.library`` in the
``npu`` namespace, so a call binds (or fails to bind) exactly as on an NPU: a wrong
keyword name raises torch's own ``Unknown keyword argument 'eps' for operator
'npu::npu_rms_norm'``. Each op gets one ``CompositeExplicitAutograd`` kernel that
checks the emulator is active, reports the call to the contract recorder, and runs
the reference kernel, or raises :class:`KernelNotImplementedError` naming the op
and the version when there is none.

Autograd follows the real op: ops with a derivative get one (the derivative of
the reference formula); the others get none, so torch's autograd fallback treats
them exactly as on an NPU (backward through them warns and yields no gradient).

Definitions stay for the life of the process: torch can remove a library's ops,
but op objects that user code still holds (``from torch_npu import npu_rms_norm``)
then crash the interpreter when called. So one torch_npu version is registered per
process; deactivating hides ``torch.ops.npu`` and makes every kernel raise
:class:`EmulatorInactiveError`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import torch

from . import _runtime
from ._errors import EmulatorInactiveError
from ._errors import EmulatorVersionError
from ._errors import KernelNotImplementedError
from ._kernels import Kernel
from ._kernels import kernels
from ._schemas import OpSchema
from ._schemas import load_schemas


__all__ = [
    "Registration",
    "hide",
    "register",
    "registration",
    "show",
]

_NAMESPACE = "npu"


def _kernel_name(parameters: Mapping[str, Any], name: str) -> str:
    """The kernel parameter that takes schema argument ``name``.

    torch_npu registers its yaml's ``self`` as ``input`` (see ``_schemas``); kernels
    keep the yaml's ``self``, as torch_npu's C++ kernels do, so a registered ``input``
    goes to a kernel's ``self`` when the kernel has no ``input`` of its own.
    """
    if name == "input" and "input" not in parameters and "self" in parameters:
        return "self"
    return name


class _Entry:
    """One op overload: how to turn the dispatcher's arguments into the kernel's."""

    __slots__ = ("defaults", "fn", "missing", "names", "positional", "record_name")

    def __init__(self, schema: Any, fn: Callable[..., Any] | None, missing: str) -> None:
        parameters = inspect.signature(fn).parameters if fn is not None else {}
        self.names = {a.name: _kernel_name(parameters, a.name) for a in schema.arguments}
        self.positional = tuple(self.names[a.name] for a in schema.arguments if not a.kwarg_only)
        self.defaults = {
            self.names[a.name]: a.default_value for a in schema.arguments if a.has_default_value()
        }
        self.fn = fn
        self.missing = missing
        name = schema.name.partition("::")[2]
        # The contract recorder reads a default overload as "through the op packet".
        self.record_name = f"{name}.{schema.overload_name}" if schema.overload_name else name

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        named = dict(self.defaults)
        named.update(zip(self.positional, args, strict=False))
        named.update((self.names.get(k, k), v) for k, v in kwargs.items())
        return named


class Registration:
    """What :func:`register` did for one torch_npu version."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.schemas: dict[str, OpSchema] = {}
        #: Op overloads with a reference kernel.
        self.implemented: list[str] = []
        #: Op overloads whose kernel does not accept this version's schema, with why.
        self.unfit: dict[str, str] = {}
        #: Schemas torch refused to define, with the error.
        self.skipped: dict[str, str] = {}
        self.libraries: list[Any] = []
        self.namespace: Any = None
        self.hidden: Any = None

    @property
    def op_names(self) -> list[str]:
        """The op names defined (``torch_npu.<name>``), sorted."""
        return sorted({s.name for q, s in self.schemas.items() if q not in self.skipped})

    @property
    def exposed(self) -> list[str]:
        """The op names torch_npu lists in ``__all__`` (its public API)."""
        return sorted(
            {s.name for q, s in self.schemas.items() if s.exposed and q not in self.skipped}
        )


_registration: Registration | None = None


def registration() -> Registration | None:
    return _registration


def _recorder() -> Callable[..., None] | None:
    try:
        from . import _contract
    except ImportError:  # the contract check is optional for the emulator
        return None
    record: Callable[..., None] | None = getattr(_contract, "record_call", None)
    return record


def _fit(fn: Callable[..., Any], schema: Any) -> str:
    """Why ``fn`` cannot take ``schema``'s arguments by name ("" when it can)."""
    parameters = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return ""
    names = [_kernel_name(parameters, a.name) for a in schema.arguments]
    unknown = [n for n in names if n not in parameters]
    required = [
        n
        for n, p in parameters.items()
        if p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_POSITIONAL
        and n not in names
    ]
    problems = []
    if unknown:
        problems.append(f"does not accept {', '.join(unknown)}")
    if required:
        problems.append(f"requires {', '.join(required)}, which the schema lacks")
    return "; ".join(problems)


def _make_impl(
    entry: _Entry, version: str, record: Callable[..., None] | None
) -> Callable[..., Any]:
    def impl(*args: Any, **kwargs: Any) -> Any:
        if not _runtime.state.active:
            raise EmulatorInactiveError(
                f"npu::{entry.record_name}: ascend-patch's NPU emulator (torch_npu {version}) "
                f"is not active; call ascend_patch_emulator.activate() first"
            )
        if record is not None:
            record(entry.record_name, args, kwargs)
        if entry.fn is None:
            raise KernelNotImplementedError(entry.missing)
        with torch.no_grad():
            return entry.fn(**entry.bind(args, kwargs))

    return impl


def _missing_message(qualified: str, version: str, why: str) -> str:
    name = qualified.partition(".")[0]
    message = (
        f"torch_npu.{name} (npu::{qualified}) has no reference kernel in ascend-patch's NPU "
        f"emulator for torch_npu {version}: the call matched the op's schema, but the emulator "
        f"cannot compute it"
    )
    if why:
        message += f" (the kernel {why})"
    return (
        message + ". Add a kernel in kits/emulator/ascend_patch_emulator/_kernels/, or keep the op "
        "off the emulated code path."
    )


def _register_autograd(
    library: Any, qualified: str, schema: Any, entry: _Entry, found: Kernel
) -> None:
    tensor_returns = [
        i for i, r in enumerate(schema.returns) if str(r.type) in ("Tensor", "Optional[Tensor]")
    ]
    wanted = found.grad_outputs if found.grad_outputs is not None else tuple(tensor_returns)
    fn = found.fn

    def setup_context(
        ctx: Any, inputs: tuple[Any, ...], output: Any, keyword_only_inputs: Any = None
    ) -> None:
        named = entry.bind(inputs, keyword_only_inputs or {})
        keys = [k for k, v in named.items() if isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*(named[k] for k in keys))
        ctx.tensor_keys = keys
        ctx.others = {k: v for k, v in named.items() if not isinstance(v, torch.Tensor)}
        ctx.replay = dict(found.replay(named, output)) if found.replay is not None else {}
        outputs = output if isinstance(output, tuple) else (output,)
        frozen = [
            outputs[i] for i in found.nondifferentiable if isinstance(outputs[i], torch.Tensor)
        ]
        if frozen:
            ctx.mark_non_differentiable(*frozen)

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        named = dict(ctx.others)
        named.update(zip(ctx.tensor_keys, ctx.saved_tensors, strict=True))
        needs = ctx.needs_input_grad
        leaves: list[tuple[int, Any]] = []
        for index, need in enumerate(needs):
            value = named.get(entry.positional[index]) if index < len(entry.positional) else None
            if need and isinstance(value, torch.Tensor):
                leaf = value.detach().requires_grad_(True)
                named[entry.positional[index]] = leaf
                leaves.append((index, leaf))
        result: list[Any] = [None] * len(needs)
        if not leaves:
            return tuple(result)
        with torch.enable_grad():
            recomputed = fn(**named, **ctx.replay)
        outputs = recomputed if isinstance(recomputed, tuple) else (recomputed,)
        pairs = [
            (outputs[i], grads[i])
            for i in wanted
            if grads[i] is not None
            and isinstance(outputs[i], torch.Tensor)
            and outputs[i].requires_grad
        ]
        if not pairs:
            return tuple(result)
        computed = torch.autograd.grad(
            [o for o, _ in pairs],
            [leaf for _, leaf in leaves],
            [g.to(o.dtype) for o, g in pairs],
            allow_unused=True,
        )
        for (index, _), grad in zip(leaves, computed, strict=True):
            result[index] = grad
        return tuple(result)

    torch.library.register_autograd(
        f"{_NAMESPACE}::{qualified}", backward, setup_context=setup_context, lib=library
    )


def _overload(qualified: str) -> str:
    return qualified.partition(".")[2] or "default"


def _hidden_namespace() -> Any:
    class HiddenNamespace(torch._ops._OpNamespace):  # type: ignore[misc]
        """``torch.ops.npu`` while the emulator is inactive: it holds no op."""

        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            raise AttributeError(
                f"'_OpNamespace' 'npu' object has no attribute {name!r} "
                f"(ascend-patch's NPU emulator defines it only while active)"
            )

    return HiddenNamespace(_NAMESPACE)


def register(version: str) -> Registration:
    """Define ``version``'s schemas under ``torch.ops.npu`` (once per process)."""
    global _registration
    if _registration is not None:
        if _registration.version != version:
            raise EmulatorVersionError(
                f"this process already emulates torch_npu {_registration.version}; torch "
                f"cannot safely remove op definitions, so torch_npu {version} needs its own "
                f"process (run the tests once per version: pytest --torch-npu-version={version})"
            )
        return _registration
    schemas = load_schemas(version)
    done = Registration(version)
    done.schemas = dict(schemas)
    found = kernels()
    record = _recorder()
    library = torch.library.Library(_NAMESPACE, "DEF")
    done.libraries.append(library)
    for qualified, op in schemas.items():
        try:
            library.define(op.schema)
        except Exception as exc:  # a schema torch cannot parse: say so, define the rest
            done.skipped[qualified] = f"{type(exc).__name__}: {exc}"
    namespace = torch.ops.npu
    for qualified in schemas:
        if qualified in done.skipped:
            continue
        base = qualified.partition(".")[0]
        schema = getattr(getattr(namespace, base), _overload(qualified))._schema
        candidate = found.get(qualified)
        why = _fit(candidate.fn, schema) if candidate is not None else ""
        if why:
            done.unfit[qualified] = why
        usable = candidate if candidate is not None and not why else None
        entry = _Entry(
            schema, usable.fn if usable else None, _missing_message(qualified, version, why)
        )
        library.impl(qualified, _make_impl(entry, version, record), "CompositeExplicitAutograd")
        if usable is not None:
            done.implemented.append(qualified)
            if usable.differentiable:
                _register_autograd(library, qualified, schema, entry, usable)
    done.namespace = namespace
    done.hidden = _hidden_namespace()
    _registration = done
    return done


def show() -> None:
    """Put the real ``torch.ops.npu`` namespace back (activation)."""
    if _registration is not None:
        setattr(torch.ops, _NAMESPACE, _registration.namespace)


def hide() -> None:
    """Make ``torch.ops.npu`` look as if nothing were defined (deactivation)."""
    if _registration is not None:
        setattr(torch.ops, _NAMESPACE, _registration.hidden)
