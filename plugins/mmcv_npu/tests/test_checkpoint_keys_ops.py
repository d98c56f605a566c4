"""MmcvCheckpointKeys with mmdet 3.x's own DETR-family layers: mmcv 1.7.2's numbers come back.

Each state dict was saved by a layer that real mmcv 1.7.2 built and ran
(``checkpoint_keys_mmcv172.pth``, see test_checkpoint_keys_mmcv1.py); mmengine's
``load_checkpoint(..., strict=True)`` loads it into the mmdet 3.3.0 layer that replaced
it, which must compute the same output. mmdet's layers import ``mmcv.ops``: this runs
where mmcv 2.x has its compiled ops (nox -s openmmlab_cpu_ops).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from checkpoint_keys_layers import LAYERS_FIXTURE
from checkpoint_keys_layers import layer_keys
from mmcv_stacks import require_module
from mmcv_stacks import require_stack


require_stack("mmcv-ops")
require_stack("mmdet")
torch = require_module("torch", "mmcv-ops")
layers = require_module("mmdet.models.layers.transformer", "mmdet")

from ascend_patch_mmcv.checkpoint_keys import DUPLICATES  # noqa: E402
from ascend_patch_mmcv.groups import MmcvCheckpointKeys  # noqa: E402
from mmengine.runner import load_checkpoint  # noqa: E402


FIXTURE = Path(__file__).resolve().parent / "checkpoint_keys_mmcv172.pth"
CASES = torch.load(FIXTURE, weights_only=True)["cases"]
EMBED, HEADS, HIDDEN, LEVELS, POINTS = 8, 2, 16, 2, 2
FFN_CFG = dict(embed_dims=EMBED, feedforward_channels=HIDDEN, act_cfg=dict(type="PReLU"))
MHA_CFG = dict(embed_dims=EMBED, num_heads=HEADS)
MSDA_CFG = dict(embed_dims=EMBED, num_heads=HEADS, num_levels=LEVELS, num_points=POINTS)
LOGGER = logging.getLogger("test_checkpoint_keys_ops")
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # same arithmetic, possibly in another order


def test_mmcv_layers_keep_their_1x_keys_but_for_the_known_duplicates() -> None:
    """mmcv 1.7.2 -> 2.x, every parametrised layer of checkpoint_keys_layers.LAYERS: same keys
    and shapes, except keys that DUPLICATES drops (the 1.x FFN's activate)."""
    old = json.loads(LAYERS_FIXTURE.read_text())
    new = layer_keys()
    assert old["mmcv"] == "1.7.2" and new["mmcv"].startswith("2.")
    explained = []
    for name, old_keys in old["layers"].items():
        new_keys = new["layers"][name]
        assert set(new_keys) <= set(old_keys), (name, set(new_keys) - set(old_keys))
        for key, shape in new_keys.items():
            assert old_keys[key] == shape, (name, key)
        for key in set(old_keys) - set(new_keys):
            twins = [key.replace(rule.old, rule.kept, 1) for rule in DUPLICATES if rule.old in key]
            assert any(twin in new_keys for twin in twins), (name, key)
            explained.append(f"{name}: {key}")
    assert explained == ["FFN(PReLU): activate.weight"]


def batch_first(tensor: Any) -> Any:
    """mmcv 1.x layers are sequence-first; mmdet 3.x's are batch-first."""
    return tensor.transpose(0, 1)


def load_old(model: Any, case: str, tmp_path: Path, **kwargs: Any) -> Any:
    path = tmp_path / f"{case}.pth"
    torch.save({"state_dict": CASES[case]["state_dict"]}, path)
    load_checkpoint(model, str(path), strict=True, logger=LOGGER, **kwargs)
    return model.eval()


def test_detr_encoder_layer(isolated_patcher: Any, tmp_path: Path) -> None:
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    case = CASES["encoder_layer"]
    model = layers.DetrTransformerEncoderLayer(self_attn_cfg=MHA_CFG, ffn_cfg=FFN_CFG)
    load_old(model, "encoder_layer", tmp_path)
    with torch.no_grad():
        output = model(batch_first(case["query"]), batch_first(case["query_pos"]), None)
    torch.testing.assert_close(batch_first(output), case["output"], **TOLERANCE)


def test_deformable_detr_decoder_layer(isolated_patcher: Any, tmp_path: Path) -> None:
    """Self-attention (MultiheadAttention) and cross-attention (deformable) differ in shape."""
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    case = CASES["deformable_decoder_layer"]
    model = layers.DeformableDetrTransformerDecoderLayer(
        self_attn_cfg=MHA_CFG, cross_attn_cfg=MSDA_CFG, ffn_cfg=FFN_CFG
    )
    load_old(model, "deformable_decoder_layer", tmp_path)
    with torch.no_grad():
        output = model(
            batch_first(case["query"]),
            value=batch_first(case["value"]),
            query_pos=batch_first(case["query_pos"]),
            key_padding_mask=None,
            reference_points=case["reference_points"],
            spatial_shapes=case["spatial_shapes"],
            level_start_index=case["level_start_index"],
        )
    torch.testing.assert_close(batch_first(output), case["output"], **TOLERANCE)


def test_detr_decoder_layer_needs_the_users_revise_keys(
    isolated_patcher: Any, tmp_path: Path
) -> None:
    """Two attentions of one shape: the patch does not guess; revise_keys tells it."""
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    case = CASES["detr_decoder_layer"]

    def decoder_layer() -> Any:
        return layers.DetrTransformerDecoderLayer(
            self_attn_cfg=MHA_CFG, cross_attn_cfg=MHA_CFG, ffn_cfg=FFN_CFG
        )

    with pytest.raises(RuntimeError, match="missing keys"):
        load_old(decoder_layer(), "detr_decoder_layer", tmp_path)
    revise = [(r"^attentions\.0\.", "self_attn."), (r"^attentions\.1\.", "cross_attn.")]
    model = load_old(decoder_layer(), "detr_decoder_layer", tmp_path, revise_keys=revise)
    with torch.no_grad():
        output = model(
            batch_first(case["query"]),
            key=batch_first(case["memory"]),
            value=batch_first(case["memory"]),
            query_pos=batch_first(case["query_pos"]),
        )
    torch.testing.assert_close(batch_first(output), case["output"], **TOLERANCE)
