"""MmcvCheckpointKeys: checkpoints saved in the mmcv 1.x layer layout, loaded into 2.x models.

What changed between mmcv 1.7.2 and 2.1.0 in the state_dict keys of the layers mmcv
owns (every parametrised layer of ``mmcv.cnn`` and ``mmcv.ops``, built alike in both
and compared): one thing. mmcv 1.x's ``FFN`` registers its activation twice, as
``activate`` and inside ``layers`` (``layers.0.1``); 2.x registers it once. An
activation with parameters (PReLU) thus leaves a duplicate ``<ffn>.activate.*`` that
a 2.x model does not have.

What OpenMMLab 2.0 changed on top (mmdet 3.x rebuilt the DETR family on mmcv 2.x's
bricks): mmcv's ``BaseTransformerLayer`` holds its attentions and feed-forward
networks in index lists (``attentions.0``, ``ffns.0``) in the order of its
``operation_order``; mmdet 3.x's layers name them (``self_attn``, ``cross_attn``,
``ffn``). ``norms`` keeps its name and order.

Both are tables (:data:`DUPLICATES`, :data:`LIST_RENAMES`) read by one mechanism
(:func:`remap_old_layout`) that the patch runs on the state dict mmengine's
``load_state_dict`` receives, before mmengine loads it. It only

* drops a duplicate key the model lacks when its kept twin is in the checkpoint with
  the same value (the twin is what loads), and
* renames one list entry of a layer (all of its keys) onto a submodule of the same
  layer when every key of the entry lands on a key the model has, the checkpoint lacks,
  of the same shape -- and that entry fits exactly one of the layer's submodules. When
  two fit (a DETR decoder layer's two attentions have one shape), which is which
  depends on the 1.x ``operation_order`` (Mask2Former's decoder runs cross-attention
  first), which a checkpoint does not record: nothing is renamed, and the log says so.

Anything else -- and a checkpoint that already matches the model -- reaches mmengine
untouched, whose missing/unexpected-key report stays as it was. Renames and drops are
logged through mmengine (``print_log``, level WARNING, the loader's own logger).
Model-level moves (Deformable DETR's ``bbox_head.transformer.`` prefix of mmdet 2.x,
Co-DETR's ``query_head.label_embedding`` now under ``dn_generator``) belong to the
model: mmengine's ``load_checkpoint(..., revise_keys=[(pattern, replacement)])`` does
them, before this patch sees the keys.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = [
    "DUPLICATES",
    "LIST_RENAMES",
    "DuplicateKey",
    "ListRename",
    "Remapping",
    "checkpoint_key_patches",
    "expected_shapes",
    "remap_old_layout",
]

TARGET = "mmengine.runner.checkpoint:load_state_dict"
#: mmengine.runner re-exports it; mmengine's own callers look it up in its module.
ALIASES = ("mmengine.runner:load_state_dict",)


@dataclasses.dataclass(frozen=True)
class DuplicateKey:
    """A 1.x submodule registered under two names; 2.x keeps only ``kept``.

    ``<m>.<old>.<rest>`` is dropped when the model lacks it and the checkpoint holds
    ``<m>.<kept>.<rest>`` with the same value (loaded as usual, or renamed with its
    module by a :class:`ListRename`: duplicates go first).
    """

    family: str
    old: str
    kept: str


@dataclasses.dataclass(frozen=True)
class ListRename:
    """A 1.x index list of a layer whose entries are named submodules in 2.x.

    ``<layer>.<old_list>.<i>.<rest>`` becomes ``<layer>.<name>.<rest>`` for the one
    ``name`` of ``new_names`` that entry ``i`` fits (see :func:`remap_old_layout`).
    """

    family: str
    old_list: str
    new_names: tuple[str, ...]


#: mmcv 1.x FFN: ``self.activate`` is also ``layers[0][1]`` (mmcv 2.x dropped the attribute).
DUPLICATES: tuple[DuplicateKey, ...] = (DuplicateKey("mmcv FFN", "activate", "layers.0.1"),)

#: mmcv's BaseTransformerLayer lists -> the OpenMMLab 2.0 layers' names (mmdet 3.x
#: DetrTransformer{Encoder,Decoder}Layer and the layers derived from them).
LIST_RENAMES: tuple[ListRename, ...] = (
    ListRename("transformer layer", "attentions", ("self_attn", "cross_attn")),
    ListRename("transformer layer", "ffns", ("ffn",)),
)


_RULES: tuple[DuplicateKey | ListRename, ...] = (*DUPLICATES, *LIST_RENAMES)


@dataclasses.dataclass
class Remapping:
    """What :func:`remap_old_layout` did: renamed keys (``renamed``, by module in ``moved``),
    dropped duplicates, and the lists it left alone because they were ambiguous."""

    renamed: dict[str, str] = dataclasses.field(default_factory=dict)
    moved: dict[str, str] = dataclasses.field(default_factory=dict)
    dropped: list[str] = dataclasses.field(default_factory=list)
    ambiguous: list[str] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.renamed or self.dropped or self.ambiguous)

    def message(self) -> str:
        """The lines logged at load time."""
        lines = []
        if self.moved:
            pairs = ", ".join(f"{old} -> {new}" for old, new in self.moved.items())
            lines.append(
                f"loaded {len(self.renamed)} keys of the mmcv 1.x layout under their 2.x "
                f"names: {pairs}"
            )
        if self.dropped:
            lines.append(
                f"dropped {len(self.dropped)} mmcv 1.x duplicate keys (their twin "
                f"was loaded): {', '.join(self.dropped)}"
            )
        lines.extend(self.ambiguous)
        return "ascend-patch MmcvCheckpointKeys: " + "\n".join(lines)


def _unwrap(module: Any, is_wrapper: Callable[[Any], bool]) -> Any:
    while is_wrapper(module):
        module = module.module
    return module


def expected_shapes(
    module: Any, is_wrapper: Callable[[Any], bool] = lambda module: False
) -> dict[str, tuple[int, ...] | None]:
    """Every key ``module`` loads, with its shape (``None``: any shape), as mmengine walks it.

    mmengine's ``load_state_dict`` steps through model wrappers at every level
    (``is_wrapper``); this walks the same way, so the keys read as mmengine's report
    reads them.
    """
    torch = sys.modules["torch"]
    base_extra_state = torch.nn.Module.get_extra_state
    shapes: dict[str, tuple[int, ...] | None] = {}

    def visit(child: Any, prefix: str) -> None:
        child = _unwrap(child, is_wrapper)
        for name, parameter in child._parameters.items():
            if parameter is not None:
                lazy = torch.nn.parameter.is_lazy(parameter)
                shapes[prefix + name] = None if lazy else tuple(parameter.shape)
        for name, buffer in child._buffers.items():
            if buffer is not None and name not in child._non_persistent_buffers_set:
                lazy = torch.nn.parameter.is_lazy(buffer)
                shapes[prefix + name] = None if lazy else tuple(buffer.shape)
        if type(child).get_extra_state is not base_extra_state:
            shapes[prefix + "_extra_state"] = None
        for name, grandchild in child._modules.items():
            if grandchild is not None:
                visit(grandchild, f"{prefix}{name}.")

    visit(module, "")
    return shapes


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return None if shape is None else tuple(shape)


def _drop_duplicates(
    keys: dict[str, Any],
    expected: Mapping[str, tuple[int, ...] | None],
    duplicates: tuple[DuplicateKey, ...],
    done: Remapping,
) -> None:
    torch = sys.modules["torch"]
    for key in [k for k in keys if k not in expected]:
        parts = key.split(".")
        for rule in duplicates:
            old = rule.old.split(".")
            for at in range(len(parts) - len(old)):
                if parts[at : at + len(old)] != old:
                    continue
                twin = ".".join([*parts[:at], *rule.kept.split("."), *parts[at + len(old) :]])
                value, kept = keys[key], keys.get(twin)
                if (
                    isinstance(value, torch.Tensor)
                    and isinstance(kept, torch.Tensor)
                    and value.shape == kept.shape
                    and torch.equal(value, kept)
                ):
                    del keys[key]
                    done.dropped.append(key)
                    break
            if key not in keys:
                break


def _entries(
    keys: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...] | None],
    rule: ListRename,
) -> dict[str, dict[int, dict[str, Any]]]:
    """``{layer: {index: {rest: value}}}`` of the checkpoint's keys the model lacks.

    A key is cut at the first ``.<old_list>.<index>.`` whose layer holds one of the
    rule's new names in the model.
    """
    layers_with_names: set[str] = set()
    for key in expected:
        parts = key.split(".")
        layers_with_names.update(
            ".".join(parts[:at]) for at, part in enumerate(parts) if part in rule.new_names
        )
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for key, value in keys.items():
        if key in expected:
            continue
        parts = key.split(".")
        for at in range(len(parts) - 2):
            if parts[at] != rule.old_list or not parts[at + 1].isdigit():
                continue
            layer = ".".join(parts[:at])
            if layer in layers_with_names:
                rest = ".".join(parts[at + 2 :])
                found.setdefault(layer, {}).setdefault(int(parts[at + 1]), {})[rest] = value
                break
    return found


def _fits(
    entry: Mapping[str, Any],
    target: str,
    keys: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...] | None],
) -> bool:
    """Every key of ``entry`` lands on a key of ``target`` the checkpoint lacks, same shape."""
    owned = [key for key in expected if key.startswith(target)]
    if not owned or any(key in keys for key in owned):
        return False  # no such submodule, or the checkpoint already fills it
    for rest, value in entry.items():
        shape = expected.get(target + rest)
        if shape is None or _shape(value) != shape:
            return False  # not a key of the model, a lazy one, or another shape
    return True


def _rename_lists(
    keys: dict[str, Any],
    expected: Mapping[str, tuple[int, ...] | None],
    list_renames: tuple[ListRename, ...],
    done: Remapping,
) -> None:
    """Rename the entries that fit exactly one submodule (``done.moved``: by module)."""
    for rule in list_renames:
        for layer, entries in _entries(keys, expected, rule).items():
            dot = f"{layer}." if layer else ""
            fits = {
                index: [
                    name for name in rule.new_names if _fits(entry, f"{dot}{name}.", keys, expected)
                ]
                for index, entry in entries.items()
            }
            chosen = [names[0] for names in fits.values() if len(names) == 1]
            if any(len(names) > 1 for names in fits.values()) or len(set(chosen)) < len(chosen):
                listed = ", ".join(f"{dot}{rule.old_list}.{index}" for index in sorted(fits))
                done.ambiguous.append(
                    f"left {listed} as they are: each fits more than one of "
                    f"{', '.join(rule.new_names)} (which is which depends on the 1.x "
                    "operation_order); map them with load_checkpoint's revise_keys"
                )
                continue
            for index, names in fits.items():
                if len(names) != 1:
                    continue  # fits nothing: mmengine reports it
                old_prefix = f"{dot}{rule.old_list}.{index}"
                new_prefix = f"{dot}{names[0]}"
                for rest in entries[index]:
                    old, new = f"{old_prefix}.{rest}", f"{new_prefix}.{rest}"
                    keys[new] = keys.pop(old)
                    done.renamed[old] = new
                done.moved[old_prefix] = new_prefix


def _moved_metadata(metadata: Any, moved: Mapping[str, str]) -> Any:
    """``_metadata`` (per-module versions) follows the modules it describes."""
    if metadata is None or not moved:
        return metadata
    copied = type(metadata)(metadata)
    for module, value in metadata.items():
        for old, new in moved.items():
            if module == old or module.startswith(old + "."):
                copied.setdefault(new + module[len(old) :], value)
    return copied


def remap_old_layout(
    state_dict: Any,
    module: Any,
    *,
    is_wrapper: Callable[[Any], bool] = lambda module: False,
    duplicates: tuple[DuplicateKey, ...] = DUPLICATES,
    list_renames: tuple[ListRename, ...] = LIST_RENAMES,
) -> tuple[Any, Remapping]:
    """``state_dict`` with its mmcv 1.x-layout keys moved to where ``module`` has them.

    Returns the very same ``state_dict`` object when there is nothing to do, otherwise
    a copy (same type, same ``_metadata`` moved along): the caller's dict is never
    changed.
    """
    done = Remapping()
    if not isinstance(state_dict, Mapping):
        return state_dict, done
    expected = expected_shapes(module, is_wrapper)
    if all(key in expected for key in state_dict):
        return state_dict, done  # the checkpoint matches the model: leave it alone
    keys = dict(state_dict)
    _drop_duplicates(keys, expected, duplicates, done)
    _rename_lists(keys, expected, list_renames, done)
    if not (done.renamed or done.dropped):
        return state_dict, done
    remapped: Any
    try:
        remapped = type(state_dict)(keys)  # type: ignore[call-arg]
    except Exception:  # a mapping type that cannot be built from a dict
        remapped = OrderedDict(keys)
    metadata = _moved_metadata(getattr(state_dict, "_metadata", None), done.moved)
    if metadata is not None:
        if not hasattr(remapped, "__dict__"):  # a plain dict takes no attribute
            remapped = OrderedDict(remapped)
        remapped._metadata = metadata
    return remapped, done


def with_old_layout_keys(original: Callable[..., Any]) -> Callable[..., Any]:
    """``target_wrapper``: mmengine's ``load_state_dict``, fed the remapped state dict."""
    # The target's module (imported: the patch is installed on it), whatever ``original`` is.
    checkpoint = sys.modules[TARGET.partition(":")[0]]

    def is_wrapper(module: Any) -> bool:
        # As mmengine's loader: a model wrapper or a test-time-augmentation model.
        return bool(checkpoint.is_model_wrapper(module)) or isinstance(
            module, checkpoint.BaseTTAModel
        )

    @functools.wraps(original)
    def load_state_dict(
        module: Any, state_dict: Any, strict: bool = False, logger: Any = None
    ) -> Any:
        remapped, done = remap_old_layout(state_dict, module, is_wrapper=is_wrapper)
        if done:
            checkpoint.print_log(done.message(), logger=logger, level=logging.WARNING)
        return original(module, remapped, strict, logger)

    return load_state_dict


def checkpoint_key_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patch of :class:`ascend_patch_mmcv.groups.MmcvCheckpointKeys`."""
    yield AtomicPatch(
        TARGET,
        target_wrapper=with_old_layout_keys,
        aliases=ALIASES,
        note="rules: " + ", ".join(sorted({rule.family for rule in _RULES})),
    )
