"""Every patch group of the plugin (its name, requirements and documentation) and its import rule.

``apply()`` imports this module; it imports no patch family. A group's
``patches()`` imports its family module only when the core builds the group, which it
does only once the group's ``requires`` hold (checked from metadata, before any
import) and, for an opt-in group, once it is enabled (``ASCEND_PATCH_ENABLE``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ModuleHook
from ascend_patch_core import Patch

from .groups_ops import DeformConv
from .groups_ops import ModulatedDeformConv
from .groups_ops import MultiScaleDeformableAttention
from .groups_ops import SigmoidFocalLoss
from .groups_ops import SparseConv3D
from .groups_ops import Voxelization


if TYPE_CHECKING:
    from ascend_patch_core import ImportRule


__all__ = [
    "DDP",
    "GROUPS",
    "CollectionsCompat",
    "DeformConv",
    "MmcvCheckpointKeys",
    "MmcvVersionCheck",
    "MmengineCheckpointNumpy",
    "ModulatedDeformConv",
    "MultiScaleDeformableAttention",
    "NuScenesDataset",
    "NuScenesMetric",
    "OptimizerHooks",
    "OptimizerWrapper",
    "PseudoSampler",
    "ResNetAddRelu",
    "ResNetFP16",
    "ResNetMaxPool",
    "SigmoidFocalLoss",
    "SparseConv3D",
    "Stream",
    "Voxelization",
    "import_rules",
]


class MmengineCheckpointNumpy(Patch):
    """mmengine ``load_checkpoint`` under torch >= 2.6: allow the numpy globals of ``meta``.

    ``weights_only`` loading stays on; exactly the numpy array/scalar/dtype globals are
    allowed, only during mmengine's loader call (see :mod:`ascend_patch_mmcv.checkpoint`).
    """

    # torch >= 2.6: where weights_only became the default. mmengine 0.10.x: the loader
    # this wraps (CheckpointLoader.load_checkpoint); tested with 0.10.7. mmengine first:
    # requirements are checked in order, and without mmengine the answer then needs no
    # version logic (packaging stays unimported on a cache miss).
    requires = ("mmengine>=0.10,<0.11", "torch>=2.6")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .checkpoint import checkpoint_numpy_patches

        return checkpoint_numpy_patches(options)


class CollectionsCompat(Patch):
    """``collections.Mapping``, ``collections.Sequence``, ... (removed in Python 3.10) for old code.

    Opt-in: it adds names to a standard-library module for every module of the process,
    and code that tests ``hasattr(collections, "Mapping")`` to detect an old Python would
    take its old-Python path. OpenMMLab 2.x does not need it; enable it by name for code
    that does (``ASCEND_PATCH_ENABLE=CollectionsCompat``).
    """

    opt_in = True

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .collections_compat import collections_alias_patches

        return collections_alias_patches(options)


class MmcvVersionCheck(Patch):
    """mmdet / mmdet3d import under the NPU stack's mmcv despite their mmcv version assertion.

    Only their own import sees a compatible ``mmcv.__version__`` (a view of the real
    module, within the same major line); ``mmcv.__version__`` itself never changes
    (see :mod:`ascend_patch_mmcv.mmcv_version`).
    """

    requires = ("mmcv | mmcv-full | mmcv-lite", "mmdet>=2.0,<4 | mmdet3d>=1.0.0rc0,<2")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[ModuleHook]:
        from .mmcv_version import mmcv_version_patches

        return mmcv_version_patches(options)


# -- old checkpoints -------------------------------------------------------------------


class MmcvCheckpointKeys(Patch):
    """Checkpoints saved by mmcv 1.x layers load into their mmcv 2.x / OpenMMLab 2.0 equivalents.

    Wraps mmengine's ``load_state_dict`` (every ``load_checkpoint``, ``Runner.load_checkpoint``
    and ``init_cfg=dict(type="Pretrained")`` ends there): a key the model lacks is
    dropped (mmcv 1.x FFN's duplicate ``activate``) or renamed (``attentions.<i>`` ->
    ``self_attn``/``cross_attn``, ``ffns.0`` -> ``ffn``) only where it lands,
    unambiguously, on keys the model has and the checkpoint lacks, of the same shapes;
    each change is logged. A checkpoint that matches the model is passed on untouched
    (see :mod:`ascend_patch_mmcv.checkpoint_keys`).

    On by default: it changes nothing mmengine would load, only fills keys mmengine
    would leave missing with the checkpoint's own tensors that it would discard.
    """

    # mmengine 0.10.x: the load_state_dict(module, state_dict, strict, logger) this wraps;
    # tested with 0.10.7.
    requires = ("mmengine>=0.10,<0.11",)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .checkpoint_keys import checkpoint_key_patches

        return checkpoint_key_patches(options)


# -- mmcv 1.x parallel and optimizer hooks, mmengine optimizer wrapper ------------------


# mmcv 1.x, as the package ``mmcv`` (built with or without ops) or ``mmcv-full``. Tested
# with mmcv 1.7.2, the last 1.x and the one the NPU stacks use.
MMCV_1 = "mmcv>=1.7,<2 | mmcv-full>=1.7,<2"


class Stream(Patch):
    """mmcv 1.x's ``Scatter.forward`` (DataContainer inputs of MMDataParallel/MMDDP) onto NPUs.

    mmcv 1.7.2 copies host tensors to the target devices with ``torch.cuda`` and
    asks torch for a copy stream by device *index*, which newer torch rejects
    (torch 2.13: ``AttributeError: 'int' object has no attribute 'type'``). On an NPU the
    replacement copies on a ``torch.npu`` side stream per device, then makes each
    device's current stream wait for it (see :mod:`ascend_patch_mmcv.mmcv1_parallel`).
    """

    legacy_name = "stream"
    requires = (MMCV_1,)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .mmcv1_parallel import stream_patches

        return stream_patches(options)


class DDP(Patch):
    """mmcv 1.x's ``MMDistributedDataParallel`` forward on torch >= 2.0.

    mmcv 1.7.2's ``_run_ddp_forward`` reads ``_use_replicated_tensor_module``, which
    torch 2.0 removed: every ``forward`` of the wrapper raises ``AttributeError``.
    The replacement keeps mmcv's input handling (``to_kwargs``, DataContainer aware)
    and runs the module through torch's own ``_run_ddp_forward``. The class itself is
    not swapped for mmcv's ``NPUDistributedDataParallel`` (docs/mmcv-plugin.md says why).
    """

    legacy_name = "ddp"
    requires = (MMCV_1, "torch>=2.0")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .mmcv1_parallel import ddp_patches

        return ddp_patches(options)


class OptimizerHooks(Patch):
    """mmcv 1.x optimizer hooks clip with the fused clipping of torch_npu's fused optimizers.

    When the runner's optimizer offers ``clip_grad_norm_fused_`` (torch_npu's
    ``NpuFused*`` optimizers), ``OptimizerHook.clip_grads`` -- inherited by the
    gradient-cumulative and fp16 hooks -- calls it instead of torch's per-parameter
    ``clip_grad_norm_``; with any other optimizer the original runs
    (see :mod:`ascend_patch_mmcv.optimizer_hooks`).

    Opt-in (``ASCEND_PATCH_ENABLE=OptimizerHooks``): the fused clipping computes the
    norm over the optimizer's combined gradient buffer, not over the parameters the
    hook passes, so a run's logged ``grad_norm`` may differ in the last digits.
    """

    legacy_name = "optimizer_hooks"
    opt_in = True
    requires = (MMCV_1,)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .optimizer_hooks import optimizer_hook_patches

        return optimizer_hook_patches(options)


class OptimizerWrapper(Patch):
    """mmengine's ``OptimWrapper`` clips by norm with the optimizer's fused clipping when it has one.

    When the wrapped optimizer offers ``clip_grad_norm_fused_`` (torch_npu's
    ``NpuFused*`` optimizers) and the wrapper clips by norm, ``OptimWrapper._clip_grad``
    calls it, and the norm it returns is what the wrapper logs (``train/grad_norm``);
    otherwise the original runs (see :mod:`ascend_patch_mmcv.optimizer_wrapper`).

    Default on: it acts only when the user chose a fused optimizer, whose gradients
    live in one combined buffer that torch's per-parameter clipping cannot use.
    """

    legacy_name = "optimizer_wrapper"
    # mmengine 0.10.x: OptimWrapper._clip_grad, clip_grad_kwargs and grad_name as
    # this reads them; tested with 0.10.7.
    requires = ("mmengine>=0.10,<0.11",)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .optimizer_wrapper import optimizer_wrapper_patches

        return optimizer_wrapper_patches(options)


# -- mmdet ----------------------------------------------------------------------------


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


# -- mmdet3d --------------------------------------------------------------------------


class NuScenesDataset(Patch):
    """mmdet3d 1.0.0rc (the mmcv 1.x line): nuScenes datasets' ``output_to_nusc_box``, faster.

    ``mmdet3d.datasets.nuscenes_dataset`` (LiDAR boxes) and ``nuscenes_mono_dataset``
    (camera boxes): the same nuScenes boxes, in mmdet3d 1.0's own box convention, with
    the quaternions and velocities of a frame computed at once
    (see :mod:`ascend_patch_mmcv.nuscenes_kernels`).
    """

    legacy_name = "nuscenes_dataset"
    # The function lives in these modules from 1.0.0rc0 (the coordinate-system refactor)
    # to 1.0.0rc6; mmdet3d 1.1 moved it to the metric (NuScenesMetric). Before 1.0 it
    # had another box convention, which this group does not reproduce.
    requires = ("mmdet3d>=1.0.0rc0,<1.1.0rc0",)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .nuscenes import nuscenes_dataset_patches

        return nuscenes_dataset_patches(options)


class NuScenesMetric(Patch):
    """mmdet3d 1.1-1.4 (the mmcv 2.x line): ``NuScenesMetric``'s ``output_to_nusc_box``, faster.

    ``mmdet3d.evaluation.metrics.nuscenes_metric.output_to_nusc_box``, LiDAR and camera
    branches, the same boxes as the installed mmdet3d's
    (see :mod:`ascend_patch_mmcv.nuscenes_kernels`).
    """

    legacy_name = "nuscenes_metric"
    # Checked identical in 1.1.0 and 1.4.0; the 1.1.0rc pre-releases are not covered.
    requires = ("mmdet3d>=1.1.0,<1.5",)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .nuscenes import nuscenes_metric_patches

        return nuscenes_metric_patches(options)


#: Every group of the plugin, in report order (the order ``register_patches`` returns
#: them): the op groups, declared in :mod:`ascend_patch_mmcv.groups_ops`, after the
#: checkpoint and version groups.
GROUPS: tuple[type[Patch], ...] = (
    MmengineCheckpointNumpy,
    MmcvVersionCheck,
    CollectionsCompat,
    MmcvCheckpointKeys,
    MultiScaleDeformableAttention,
    DeformConv,
    ModulatedDeformConv,
    SparseConv3D,
    SigmoidFocalLoss,
    Voxelization,
    Stream,
    DDP,
    OptimizerHooks,
    OptimizerWrapper,
    ResNetAddRelu,
    ResNetMaxPool,
    ResNetFP16,
    PseudoSampler,
    NuScenesDataset,
    NuScenesMetric,
)


def import_rules() -> list[ImportRule]:
    """``mmcv._ext`` where mmcv has no compiled ops (mmcv-lite): a compiled mmcv keeps its own.

    Only where mmcv is installed at all: declaring the rule imports the core's rule
    machinery (~0.4 ms of every ``apply()``), which a program without mmcv need not pay.
    The served module's factory is imported on the first ``import mmcv._ext`` only.
    """
    import importlib.util

    if importlib.util.find_spec("mmcv") is None:
        return []
    from ascend_patch_core import ReplaceImport  # the rule machinery: only now

    return [
        ReplaceImport(
            "mmcv._ext",
            "ascend_patch_mmcv.served.mmcv_ext.provider:build_module",
            when_missing=True,
        )
    ]
