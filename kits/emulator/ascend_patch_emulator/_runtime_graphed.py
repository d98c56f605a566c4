"""``torch.npu.make_graphed_callables``, emulated on the emulated :class:`NPUGraph`.

torch_npu's is torch's ``torch.cuda.make_graphed_callables`` on NPU graphs: warm each
callable up on a side stream, capture its forward into one graph and its backward
(``torch.autograd.grad`` of the outputs) into another, then return a callable whose
autograd node copies the inputs into the captured ones and replays. The same here,
so the same rules show: sample arguments must be tensors, modules must have no hooks
and no buffer requiring grad, the outputs returned are the static ones (the next
call overwrites them), and a module falls back to its own ``forward`` when its
``training`` flag differs from the one it was captured with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ._runtime_graphs import NPUGraph
from ._runtime_graphs import graph
from ._runtime_graphs import graph_pool_handle
from ._runtime_streams import Stream
from ._runtime_streams import StreamContext


__all__ = ["make_graphed_callables"]


def _check_callable(func: Any, flat_args: tuple[Any, ...]) -> None:
    if isinstance(func, torch.nn.Module):
        if func._backward_hooks or func._forward_hooks or func._forward_pre_hooks:
            raise AssertionError(
                "Modules must not have hooks registered at the time they are passed. However, "
                "registering hooks on modules after passing them through make_graphed_callables "
                "is allowed."
            )
        if any(buffer.requires_grad for buffer in func.buffers()):
            raise AssertionError(
                "In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, only "
                "parameters may be trainable. All buffers must have ``requires_grad=False``."
            )
    if not all(isinstance(arg, torch.Tensor) for arg in flat_args):
        raise AssertionError(
            "In the beta API, sample_args for each callable must contain only Tensors. Other "
            "types are not allowed."
        )


def _grads(
    outputs: tuple[Any, ...], inputs: tuple[Any, ...], grad_outputs: Any, unused: bool
) -> Any:
    return torch.autograd.grad(
        outputs=tuple(o for o in outputs if o.requires_grad),
        inputs=tuple(i for i in inputs if i.requires_grad),
        grad_outputs=grad_outputs,
        only_inputs=True,
        allow_unused=unused,
    )


class _Captured:
    """One callable's graphs and the static tensors they read and write."""

    def __init__(self, func: Any, args: tuple[Any, ...], pool: Any, unused: bool) -> None:
        self.func = func
        self.flat_args = tuple(pytree.arg_tree_leaves(*args))
        self.params = tuple(func.parameters()) if isinstance(func, torch.nn.Module) else ()
        self.inputs = self.flat_args + self.params
        self.args = args
        self.pool = pool
        self.unused = unused
        self.forward_graph = NPUGraph()
        self.backward_graph = NPUGraph()
        self.outputs: tuple[Any, ...] = ()
        self.spec: Any = None
        self.grad_outputs: tuple[Any, ...] = ()
        self.grad_inputs: tuple[Any, ...] = ()

    def warm_up(self, iterations: int) -> None:
        for _ in range(iterations):
            outputs = tuple(pytree.tree_leaves(self.func(*self.args)))
            if any(o.requires_grad for o in outputs):
                empty = tuple(torch.empty_like(o) for o in outputs if o.requires_grad)
                _grads(outputs, self.inputs, empty, self.unused)

    def capture_forward(self) -> None:
        with graph(self.forward_graph, pool=self.pool):
            outputs = self.func(*self.args)
        flat, self.spec = pytree.tree_flatten(outputs)
        self.outputs = tuple(flat)

    def capture_backward(self) -> None:
        self.grad_outputs = tuple(
            torch.empty_like(o) if o.requires_grad else None for o in self.outputs
        )
        grads: Any = None
        if any(o.requires_grad for o in self.outputs):
            with graph(self.backward_graph, pool=self.pool):
                given = tuple(g for g in self.grad_outputs if g is not None)
                grads = _grads(self.outputs, self.inputs, given, self.unused)
        produced = iter(grads or ())
        self.grad_inputs = tuple(
            next(produced) if i.requires_grad and grads is not None else None for i in self.inputs
        )

    def graphed(self) -> Callable[..., Any]:
        captured = self

        class Graphed(torch.autograd.Function):  # type: ignore[misc]
            @staticmethod
            def forward(ctx: Any, *inputs: Any) -> Any:
                for static, given in zip(captured.flat_args, inputs, strict=False):
                    if static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                captured.forward_graph.replay()
                return tuple(o.detach() for o in captured.outputs)

            @staticmethod
            @torch.autograd.function.once_differentiable  # type: ignore[untyped-decorator]
            def backward(ctx: Any, *grads: Any) -> Any:
                for static, given in zip(captured.grad_outputs, grads, strict=True):
                    if static is not None and static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                captured.backward_graph.replay()
                return tuple(g.detach() if g is not None else None for g in captured.grad_inputs)

        def functionalized(*user_args: Any) -> Any:
            flat = tuple(pytree.arg_tree_leaves(*user_args))
            out = Graphed.apply(*(flat + captured.params))
            return pytree.tree_unflatten(out, captured.spec)

        return functionalized


def _graphed_forward(module: Any, graphed: Callable[..., Any]) -> Callable[..., Any]:
    training, original = module.training, module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if module.training == training:
            return graphed(*args, **kwargs)
        return original(*args, **kwargs)

    return forward


def make_graphed_callables(
    callables: Any,
    sample_args: Any,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: Any = None,
) -> Any:
    """Graphed versions of ``callables`` (functions or modules; one, or a tuple of them)."""
    if torch.is_autocast_enabled("cpu") and torch.is_autocast_cache_enabled():
        raise RuntimeError(
            "make_graphed_callables does not support the autocast caching. Please set "
            "`cache_enabled=False`."
        )
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    shared_pool = graph_pool_handle() if pool is None else pool
    captures = []
    for func, args in zip(callables, sample_args, strict=True):
        capture = _Captured(func, args, shared_pool, allow_unused_input)
        _check_callable(func, capture.flat_args)
        captures.append(capture)
    with StreamContext(Stream()):
        for capture in captures:
            capture.warm_up(num_warmup_iters)
    for capture in captures:
        capture.capture_forward()
    for capture in reversed(captures):
        capture.capture_backward()
    graphed: list[Any] = []
    for capture in captures:
        function = capture.graphed()
        if isinstance(capture.func, torch.nn.Module):
            capture.func.forward = _graphed_forward(capture.func, function)
            graphed.append(capture.func)
        else:
            graphed.append(function)
    return graphed[0] if just_one else tuple(graphed)
