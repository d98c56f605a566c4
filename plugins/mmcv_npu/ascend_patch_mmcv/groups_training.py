"""Patch groups of the plugin: the training family (see :mod:`ascend_patch_mmcv.groups` for the rules).

mmcv 1.x's data-parallel wrappers (``Stream``, ``DDP``) and the gradient clipping of
mmcv 1.x's optimizer hooks (``OptimizerHooks``) and mmengine's ``OptimWrapper``
(``OptimizerWrapper``). Like ``groups``, this module imports no patch family: a
group's ``patches()`` imports its family module only when the core builds the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


__all__ = ["DDP", "GROUPS", "OptimizerHooks", "OptimizerWrapper", "Stream"]

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


#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = (Stream, DDP, OptimizerHooks, OptimizerWrapper)
