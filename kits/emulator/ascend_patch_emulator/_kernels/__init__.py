"""CPU reference kernels for torch_npu ops, one module per op family.

A kernel is a plain function of the op's schema arguments, by their schema names
(``self``, ``gamma``, ``epsilon``), written from the formulas in the op docs. ``self``
is the yaml's name, which torch_npu registers as ``input``; a kernel may take either,
the dispatch hands the registered ``input`` to a ``self`` parameter. The
emulator's dispatch passes every argument of the active version's schema by name,
defaults filled in; arguments that only newer versions have get Python defaults in
the kernel, so one kernel serves every version. Kernels run with autograd off and
must return new tensors (never an input or a view of one), as a functional op does,
unless torch_npu's op itself returns its input (in-place ops; ``npu_format_cast`` to
the format the input already has, see ``layout``).

``differentiable=True`` marks ops whose real counterpart has a derivative
(op-plugin's ``derivatives.yaml``); their gradient is the derivative of the
reference formula, by autograd through the kernel. ``grad_outputs`` lists the
outputs whose incoming gradients the real backward formula uses (most use only
the first output's); ``nondifferentiable`` lists outputs that do not require grad
at all (``output_differentiability: false``, e.g. ``npu_rms_norm``'s ``rstd``).
``replay`` returns extra keyword arguments that make the backward's recomputation
repeat the forward exactly (the dropout seed of ``npu_fusion_attention``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any
from typing import NamedTuple
from typing import TypeVar


__all__ = ["Kernel", "compute_dtype", "kernel", "kernels", "recording"]

#: The family modules, imported by :func:`kernels`.
_FAMILIES = (
    "norms",
    "activations",
    "rotary",
    "attention",
    "matmul",
    "layout",
    "detection",
    "deform_conv",
    "moe",
    "iou_losses",
    "backward",
)

Replay = Callable[[Mapping[str, Any], Any], Mapping[str, Any]]
F = TypeVar("F", bound=Callable[..., Any])


class Kernel(NamedTuple):
    """A reference kernel for one op overload (``"npu_x"`` or ``"npu_x.overload"``)."""

    op: str
    fn: Callable[..., Any]
    differentiable: bool
    grad_outputs: tuple[int, ...] | None
    nondifferentiable: tuple[int, ...]
    replay: Replay | None


_registry: dict[str, Kernel] = {}


def kernel(
    *ops: str,
    differentiable: bool = False,
    grad_outputs: tuple[int, ...] | None = None,
    nondifferentiable: tuple[int, ...] = (),
    replay: Replay | None = None,
) -> Callable[[F], F]:
    """Register the decorated function as the reference kernel of ``ops``."""

    def register(fn: F) -> F:
        for op in ops:
            if op in _registry:
                raise ValueError(f"two reference kernels for {op}")
            _registry[op] = Kernel(op, fn, differentiable, grad_outputs, nondifferentiable, replay)
        return fn

    return register


def kernels() -> dict[str, Kernel]:
    """Every reference kernel, keyed by op overload (imports the family modules)."""
    for family in _FAMILIES:
        importlib.import_module(f"{__name__}.{family}")
    return dict(_registry)


def compute_dtype(tensor: Any) -> Any:
    """The dtype a kernel computes in: float32, or float64 for float64 inputs.

    NPU kernels compute half-precision inputs in float32; keeping float64 lets
    ``torch.autograd.gradcheck`` check the emulator's derivatives.
    """
    import torch

    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


@contextmanager
def recording() -> Iterator[None]:
    """Autograd on inside a kernel: the dispatcher calls kernels below autograd (its keys
    excluded, as under ``torch.library.opcheck`` or a dispatch mode); the recomputed forward
    needs them back to record its graph."""
    import torch

    keys = torch._C.DispatchKey
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (
        keys.AutogradFunctionality,
        keys.AutogradOther,
        keys.AutogradNestedTensor,
        keys.ADInplaceOrView,
        keys.AutogradCPU,
    ):
        exclude = exclude.remove(key)
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield
