"""ResNetAddRelu, ResNetMaxPool, ResNetFP16: mmdet's ResNet backbone on the NPU.

The three groups patch ``mmdet.models.backbones.resnet``, the same module in mmdet 2.x
and 3.x, whose ``BasicBlock.forward``, ``Bottleneck.forward`` and ``ResNet.forward``
are the same code in both lines (2.28 and 3.3 checked).

* **ResNetAddRelu** re-states the two block forwards with the residual ``out +=
  identity`` and the ReLU after it done by one call: ``mx_driving.npu_add_relu`` (a
  fused kernel; its backward is ReLU's, given to both inputs) when the kernel source
  is ``mx_driving``, else the portable ``self.relu(out + identity)`` in place -- what
  mmdet computes (torch_npu has no fused add-relu op). The kernel is used only where
  its backward is right: both tensors of one shape and dtype, and the block's
  activation a plain ``nn.ReLU``.
* **ResNetMaxPool** re-states ``ResNet.forward`` with the stem's max pool done by
  ``mx_driving.npu_max_pool2d(x, 3, 2, 1)`` when the pool and the input are what
  that kernel serves (:func:`kernel_pool_refusal`), else by the module's own
  ``self.maxpool``. The kernel has no backward, so it serves only calls that need no
  gradient of the pool's input (inference, or a frozen stem).
* **ResNetFP16** (opt-in) runs a ResNet call under ``torch.autocast(<input's device
  type>, float16)`` and gives float32 outputs. It wraps ``ResNet.__call__``, the slot
  around ``forward``, so it composes with ResNetMaxPool instead of replacing the same
  method (see docs/mmcv-plugin.md, "ResNetFP16").

Each replacement runs for NPU tensors only (``runtime_check``); others get mmdet's
code. Importing this module imports neither torch nor mmdet: the replacements import
torch when they first run, long after mmdet did.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from . import _kernel_source


__all__ = [
    "ADD_RELU_OP",
    "KERNEL_POOL",
    "MAX_POOL_OP",
    "TARGET_MODULE",
    "add_relu_patches",
    "fp16_patches",
    "kernel_pool_refusal",
    "max_pool_patches",
    "on_npu",
]

TARGET_MODULE = "mmdet.models.backbones.resnet"
#: The kernel names :func:`ascend_patch_mmcv._kernel_source.choose` knows these ops by
#: (also the names ``ASCEND_PATCH_MMCV_KERNELS`` takes): mx_driving's function names.
ADD_RELU_OP = "npu_add_relu"
MAX_POOL_OP = "npu_max_pool2d"

#: The only pool ``mx_driving.npu_max_pool2d`` computes. Its C++ entry checks
#: ``kernel_size == 3``, ``stride == 2`` and ``padding == 1`` and its AscendC kernel
#: hard-codes them; it has no dilation, ceil mode or indices.
KERNEL_POOL = {"kernel_size": (3, 3), "stride": (2, 2), "padding": (1, 1), "dilation": (1, 1)}
#: Channel counts the kernel takes: at most 1024, a multiple of 8 (float32) or 16 (float16).
KERNEL_MAX_CHANNELS = 1024
KERNEL_CHANNEL_MULTIPLE = {"torch.float32": 8, "torch.float16": 16}


def on_npu(module: Any, x: Any = None, *args: Any, **kwargs: Any) -> bool:
    """``runtime_check``: the call's input is an NPU tensor (elsewhere mmdet's code runs)."""
    return bool(getattr(x, "is_npu", False))


def _torch() -> Any:
    return sys.modules["torch"]  # imported by mmdet before any of these replacements runs


# --- ResNetAddRelu ---------------------------------------------------------------------

AddRelu = Callable[[Any, Any, Any], Any]


def portable_add_relu(block: Any, out: Any, identity: Any) -> Any:
    """mmdet's own residual: ``out += identity`` then the block's in-place ReLU."""
    out += identity
    return block.relu(out)


def mx_driving_add_relu(block: Any, out: Any, identity: Any) -> Any:
    """The fused kernel where it computes mmdet's residual, else :func:`portable_add_relu`.

    ``npu_add_relu``'s backward gives ReLU's gradient to both inputs, which is right
    only when neither was broadcast or promoted; and the activation must be ReLU.
    """
    torch = _torch()
    if (
        type(block.relu) is torch.nn.ReLU
        and out.shape == identity.shape
        and out.dtype == identity.dtype
    ):
        return _kernel_source.mx_driving().npu_add_relu(out, identity)
    return portable_add_relu(block, out, identity)


def basic_block_forward(add_relu: AddRelu) -> Callable[[Any, Any], Any]:
    """``BasicBlock.forward`` with the residual and its ReLU done by ``add_relu``."""

    def forward(self: Any, x: Any) -> Any:
        def inner_forward(x: Any) -> Any:
            identity = x
            out = self.relu(self.norm1(self.conv1(x)))
            out = self.norm2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return add_relu(self, out, identity)

        if self.with_cp and x.requires_grad:
            # As mmdet calls it (its default use_reentrant); the ReLU is now inside.
            return _torch().utils.checkpoint.checkpoint(inner_forward, x)
        return inner_forward(x)

    return forward


def bottleneck_forward(add_relu: AddRelu) -> Callable[[Any, Any], Any]:
    """``Bottleneck.forward`` (plugins included) with the residual done by ``add_relu``."""

    def forward(self: Any, x: Any) -> Any:
        def inner_forward(x: Any) -> Any:
            identity = x
            out = self.relu(self.norm1(self.conv1(x)))
            if self.with_plugins:
                out = self.forward_plugin(out, self.after_conv1_plugin_names)
            out = self.relu(self.norm2(self.conv2(out)))
            if self.with_plugins:
                out = self.forward_plugin(out, self.after_conv2_plugin_names)
            out = self.norm3(self.conv3(out))
            if self.with_plugins:
                out = self.forward_plugin(out, self.after_conv3_plugin_names)
            if self.downsample is not None:
                identity = self.downsample(x)
            return add_relu(self, out, identity)

        if self.with_cp and x.requires_grad:
            return _torch().utils.checkpoint.checkpoint(inner_forward, x)
        return inner_forward(x)

    return forward


def add_relu_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_mmcv.groups.ResNetAddRelu`."""
    source = _kernel_source.choose(
        ADD_RELU_OP, (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE)
    )
    add_relu = mx_driving_add_relu if source == _kernel_source.MX_DRIVING else portable_add_relu
    note = _kernel_source.note(source)
    for block, make in (("BasicBlock", basic_block_forward), ("Bottleneck", bottleneck_forward)):
        yield AtomicPatch(
            f"{TARGET_MODULE}:{block}.forward", make(add_relu), runtime_check=on_npu, note=note
        )


# --- ResNetMaxPool ---------------------------------------------------------------------

MaxPool = Callable[[Any, Any], Any]


def _pair(value: Any) -> tuple[Any, Any]:
    return (value, value) if isinstance(value, int) else tuple(value)  # type: ignore[return-value]


def kernel_pool_refusal(pool: Any, x: Any) -> str | None:
    """Why ``mx_driving.npu_max_pool2d`` cannot compute ``pool(x)``; None when it can.

    From the kernel's signature and checks (mx-driving 26.2): ``(x, kernel_size,
    stride, padding)`` with int arguments that must be 3, 2 and 1; ``x`` 4-D float32
    or float16 with at most 1024 channels, a multiple of 8 (float32) or 16 (float16);
    no dilation, ceil mode or indices; no backward. Its first window reads two rows
    and two columns, so an input below 2x2 is left to the module (read from the
    kernel source, not measured).
    """
    torch = _torch()
    if type(pool) is not torch.nn.MaxPool2d:
        return f"the pool is {type(pool).__qualname__}, not nn.MaxPool2d"
    for name, wanted in KERNEL_POOL.items():
        if _pair(getattr(pool, name)) != wanted:
            return f"{name}={getattr(pool, name)!r} (the kernel computes {wanted})"
    if pool.ceil_mode or pool.return_indices:
        return "ceil_mode or return_indices is set"
    if x.requires_grad and torch.is_grad_enabled():
        return "the input needs a gradient and the kernel has no backward"
    multiple = KERNEL_CHANNEL_MULTIPLE.get(str(x.dtype))
    if multiple is None or x.dim() != 4:
        return f"a {x.dim()}-D {x.dtype} input (the kernel takes 4-D float32 or float16)"
    channels, height, width = x.shape[1:]
    if channels > KERNEL_MAX_CHANNELS or channels % multiple:
        return f"{channels} channels (at most {KERNEL_MAX_CHANNELS}, a multiple of {multiple})"
    if height < 2 or width < 2:
        return f"a {height}x{width} input (the kernel reads 2x2 at least)"
    return None


def portable_max_pool(pool: Any, x: Any) -> Any:
    """The module's own max pool (torch's, or torch_npu's on an NPU)."""
    return pool(x)


def mx_driving_max_pool(pool: Any, x: Any) -> Any:
    """``mx_driving.npu_max_pool2d`` where it computes ``pool(x)``, else the module."""
    if kernel_pool_refusal(pool, x) is not None:
        return pool(x)
    try:
        return _kernel_source.mx_driving().npu_max_pool2d(x, 3, 2, 1)
    except NotImplementedError:
        # mx_driving's wrapper raises this on chips it has no kernel for (not 910B/C, 950).
        return pool(x)


def resnet_forward(max_pool: MaxPool) -> Callable[[Any, Any], Any]:
    """``ResNet.forward`` with the stem's max pool done by ``max_pool``."""

    def forward(self: Any, x: Any) -> Any:
        x = self.stem(x) if self.deep_stem else self.relu(self.norm1(self.conv1(x)))
        x = max_pool(self.maxpool, x)
        outs = []
        for i, layer_name in enumerate(self.res_layers):
            x = getattr(self, layer_name)(x)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)

    return forward


def max_pool_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patch of :class:`ascend_patch_mmcv.groups.ResNetMaxPool`."""
    source = _kernel_source.choose(
        MAX_POOL_OP, (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE)
    )
    max_pool = mx_driving_max_pool if source == _kernel_source.MX_DRIVING else portable_max_pool
    yield AtomicPatch(
        f"{TARGET_MODULE}:ResNet.forward",
        resnet_forward(max_pool),
        runtime_check=on_npu,
        note=_kernel_source.note(source),
    )


# --- ResNetFP16 ------------------------------------------------------------------------


def _as_float32(value: Any) -> Any:
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, (tuple, list)):
        return type(value)(_as_float32(item) for item in value)
    return value


def under_fp16_autocast(original: Callable[..., Any]) -> Callable[..., Any]:
    """``target_wrapper`` of ``ResNet.__call__``: the call under float16 autocast, float32 out."""

    @functools.wraps(original)
    def call(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        with _torch().autocast(device_type=x.device.type, dtype=_torch().float16):
            outputs = original(self, x, *args, **kwargs)
        return _as_float32(outputs)

    return call


def fp16_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patch of :class:`ascend_patch_mmcv.groups.ResNetFP16`."""
    yield AtomicPatch(
        f"{TARGET_MODULE}:ResNet.__call__",
        target_wrapper=under_fp16_autocast,
        runtime_check=on_npu,
        note="torch.autocast float16",
    )
