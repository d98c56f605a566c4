"""Patch groups of the plugin: the checkpoint family (see :mod:`ascend_patch_mmcv.groups` for the rules).

Like ``groups``, this module imports no patch family: a group's ``patches()`` imports
its family module only when the core builds the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


__all__ = ["GROUPS", "MmcvCheckpointKeys"]


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


#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = (MmcvCheckpointKeys,)
