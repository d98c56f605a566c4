"""Patch groups of the plugin: mmcv's ops (see :mod:`ascend_patch_mmcv.groups` for the rules).

:data:`ascend_patch_mmcv.groups.GROUPS` lists them, in report order, with the others;
users import them from there. Like ``groups``, this module imports no patch family:
a group's ``patches()`` imports its family module only when the core builds the
group. Each op group picks its kernel once, when it is built
(:mod:`ascend_patch_mmcv._kernel_source`), and says which in its patches' note.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


__all__ = [
    "DeformConv",
    "ModulatedDeformConv",
    "MultiScaleDeformableAttention",
    "SigmoidFocalLoss",
    "SparseConv3D",
    "Voxelization",
]

# mmcv with ops: 1.7 (mmcv-full, or mmcv built with ops) and 2.0-2.2 (2.2 for the NPU
# stacks that need it). mmcv-lite has no mmcv.ops of its own until an ``mmcv._ext``
# provider serves it; its patches then wait for mmcv.ops to be imported.
MMCV_WITH_OPS = "mmcv>=1.7,<2.3 | mmcv-full>=1.7,<1.8 | mmcv-lite>=2.0,<2.3"


class MultiScaleDeformableAttention(Patch):
    """mmcv's multi-scale deformable attention on NPU tensors: DrivingSDK's kernel.

    Replaces ``MultiScaleDeformableAttnFunction.apply`` and, with the mx_driving
    kernel, the ``grid_sample`` path ``multi_scale_deformable_attn_pytorch`` that
    ``MultiScaleDeformableAttention`` takes on any non-CUDA device
    (see :mod:`ascend_patch_mmcv.msda`).
    """

    legacy_name = "msda"
    requires = (MMCV_WITH_OPS, "torch>=2.1")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .msda import msda_patches

        return msda_patches(options)


class DeformConv(Patch):
    """mmcv's deformable convolution (DCNv1) on NPU tensors (see :mod:`ascend_patch_mmcv.deform_conv`)."""

    legacy_name = "dc"
    requires = (MMCV_WITH_OPS, "torch>=2.1")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .deform_conv import deform_conv_patches

        return deform_conv_patches(options)


class ModulatedDeformConv(Patch):
    """mmcv's modulated deformable convolution (DCNv2) on NPU tensors (see :mod:`ascend_patch_mmcv.deform_conv`)."""

    legacy_name = "mdc"
    requires = (MMCV_WITH_OPS, "torch>=2.1")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .deform_conv import modulated_deform_conv_patches

        return modulated_deform_conv_patches(options)


class SparseConv3D(Patch):
    """mmcv's sparse convolutions (``SubMConv3d``, ``SparseConv3d``, ...) on NPU tensors.

    mmcv's classes stay and its sparse op layer (``mmcv.ops.sparse_ops``) runs portable
    PyTorch kernels for NPU tensors; with mx_driving installed, DrivingSDK's 3-D sparse
    classes also replace mmcv's at their class paths and layer-registry entries
    (see :mod:`ascend_patch_mmcv.sparse_conv`).
    """

    legacy_name = "spconv3d"
    requires = (MMCV_WITH_OPS, "torch>=2.1")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .sparse_conv import sparse_conv_patches

        return sparse_conv_patches(options)


class SigmoidFocalLoss(Patch):
    """mmcv's sigmoid focal loss on NPU tensors: DrivingSDK's kernel when it is installed.

    Without mx_driving it installs nothing (mmcv's NPU build has its own kernel); see
    :mod:`ascend_patch_mmcv.focal_loss`.
    """

    requires = (MMCV_WITH_OPS, "torch>=2.1")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .focal_loss import sigmoid_focal_loss_patches

        return sigmoid_focal_loss_patches(options)


class Voxelization(Patch):
    """mmcv's hard voxelization on NPU points: DrivingSDK's kernel (opt-in).

    See :mod:`ascend_patch_mmcv.voxelization`; without mx_driving it installs nothing.
    """

    legacy_name = "voxelization"
    opt_in = True
    requires = (MMCV_WITH_OPS, "torch>=2.1")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .voxelization import voxelization_patches

        return voxelization_patches(options)
