"""Patch groups of the plugin: the mmdet family (see :mod:`ascend_patch_mmcv.groups` for the rules).

Like ``groups``, this module imports no patch family: a group's ``patches()`` imports
its family module only when the core builds the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


__all__ = ["GROUPS", "PseudoSampler", "ResNetAddRelu", "ResNetFP16", "ResNetMaxPool"]

# The mmdet lines supported: 2.x and 3.x. mmdet.models.backbones.resnet is the same
# module, with the same BasicBlock, Bottleneck and ResNet forwards, in both (tested:
# 3.3.0; 2.x through an on-disk package with its layout); PseudoSampler has one
# patch per line, each with its own requires.
_MMDET_VERSIONS = "mmdet>=2.0,<4"


class PseudoSampler(Patch):
    """mmdet's ``PseudoSampler.sample`` on the NPU without the no-op ``unique()`` calls.

    The same ``SamplingResult`` as mmdet's (see :mod:`ascend_patch_mmcv.pseudo_sampler`);
    one patch per mmdet line (2.x ``mmdet.core``, 3.x ``mmdet.models.task_modules``).
    Opt-in, as in DrivingSDK: the gain on an NPU is not measured here.
    """

    legacy_name = "pseudo_sampler"
    opt_in = True
    requires = _MMDET_VERSIONS

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .pseudo_sampler import pseudo_sampler_patches

        return pseudo_sampler_patches(options)


class ResNetAddRelu(Patch):
    """ResNet's residual add and ReLU as one ``mx_driving.npu_add_relu`` call, on the NPU.

    ``BasicBlock.forward`` and ``Bottleneck.forward``; the portable kernel source
    computes mmdet's own ``relu(out + identity)`` (see :mod:`ascend_patch_mmcv.resnet`).
    """

    legacy_name = "resnet_add_relu"
    requires = _MMDET_VERSIONS

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .resnet import add_relu_patches

        return add_relu_patches(options)


class ResNetMaxPool(Patch):
    """ResNet's stem max pool by ``mx_driving.npu_max_pool2d`` where that kernel computes it.

    Checks the module's actual pool (kernel 3, stride 2, padding 1, no dilation, ceil
    mode or indices), the input (dtype, channels) and that no gradient is needed;
    otherwise the module's own max pool runs (see :mod:`ascend_patch_mmcv.resnet`).
    """

    legacy_name = "resnet_maxpool"
    requires = _MMDET_VERSIONS

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .resnet import max_pool_patches

        return max_pool_patches(options)


class ResNetFP16(Patch):
    """A ResNet call on the NPU under float16 autocast, with float32 outputs.

    Opt-in: it changes the backbone's numerics. It wraps ``ResNet.__call__``, so it
    composes with ResNetMaxPool (DrivingSDK declared the two in conflict because both
    replaced ``ResNet.forward``).
    """

    legacy_name = "resnet_fp16"
    opt_in = True
    requires = _MMDET_VERSIONS

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .resnet import fp16_patches

        return fp16_patches(options)


#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = (ResNetAddRelu, ResNetMaxPool, ResNetFP16, PseudoSampler)
