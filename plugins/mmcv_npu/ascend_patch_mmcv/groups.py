"""Every patch group of the plugin: its name, requirements and documentation.

``apply()`` imports this module; it imports no patch family. A group's
``patches()`` imports its family module only when the core builds the group, which it
does only once the group's ``requires`` hold (checked from metadata, before any
import) and, for an opt-in group, once it is enabled (``ASCEND_PATCH_ENABLE``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ModuleHook
from ascend_patch_core import Patch


__all__ = ["CollectionsCompat", "MmcvVersionCheck", "MmengineCheckpointNumpy"]


class MmengineCheckpointNumpy(Patch):
    """mmengine ``load_checkpoint`` under torch >= 2.6: allow the numpy globals of ``meta``.

    ``weights_only`` loading stays on; exactly the numpy array/scalar/dtype globals are
    allowed, only during mmengine's loader call (see :mod:`ascend_patch_mmcv.checkpoint`).
    """

    # torch >= 2.6: where weights_only became the default. mmengine 0.10.x: the loader
    # this wraps (CheckpointLoader.load_checkpoint); tested with 0.10.7.
    requires = ("torch>=2.6", "mmengine>=0.10,<0.11")

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
