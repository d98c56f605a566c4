"""The mmcv 1.x side of MmcvCheckpointKeys: the old-layout checkpoints come from real mmcv 1.7.2.

``checkpoint_keys_mmcv172.pth`` (next to this file) holds, for each case, the
``state_dict`` of a layer built by mmcv 1.7.2, an input and that layer's output. The
mmcv 2.x tests (test_checkpoint_keys.py, test_checkpoint_keys_ops.py) load those state
dicts into the OpenMMLab 2.0 layers and compare outputs. This module, in the session
with mmcv 1.7.2 (nox -s openmmlab1_emulated), rebuilds every case with mmcv 1.7.2 and
checks that the file still holds exactly what mmcv 1.7.2 builds and computes, so the
fixture is evidence and not a guess. Rebuild it with::

    python plugins/mmcv_npu/tests/test_checkpoint_keys_mmcv1.py  # under mmcv 1.7.2 (both files)

It also checks ``checkpoint_keys_mmcv172_layers.json``: the state-dict keys and shapes
of mmcv's parametrised layers under 1.7.2 (see checkpoint_keys_layers.py).

Test-only stand-ins (mmcv 1.7.2 without compiled ops): ``torchvision`` and
``mmcv._ext`` (checkpoint_keys_layers.mmcv1_stand_ins); the layers used here run
mmcv's pure-PyTorch deformable attention on CPU, so no kernel is ever called.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from checkpoint_keys_layers import LAYERS_FIXTURE
from checkpoint_keys_layers import layer_keys
from checkpoint_keys_layers import mmcv1_stand_ins
from mmcv_stacks import require_module
from mmcv_stacks import require_stack


require_stack("mmcv1")
torch = require_module("torch", "mmcv1")

FIXTURE = Path(__file__).resolve().parent / "checkpoint_keys_mmcv172.pth"

EMBED, HEADS, HIDDEN, QUERIES, BATCH = 8, 2, 16, 5, 2
LEVELS, POINTS, SHAPES = 2, 2, ((4, 4), (2, 2))


def _ffn(transformer: Any) -> dict[str, Any]:
    """mmcv 1.x FFN with a PReLU: the activation is registered twice (activate, layers.0.1)."""
    torch.manual_seed(1)
    ffn = transformer.FFN(
        embed_dims=EMBED, feedforward_channels=HIDDEN, act_cfg=dict(type="PReLU")
    ).eval()
    with torch.no_grad():
        ffn.activate.weight.fill_(0.25)  # not PReLU's default, so a lost value shows
    x = torch.randn(BATCH, QUERIES, EMBED)
    return {"state_dict": ffn.state_dict(), "x": x, "output": ffn(x).detach()}


def _layer(transformer: Any, attn_cfgs: list[dict[str, Any]], order: tuple[str, ...]) -> Any:
    ffn_cfgs = dict(
        type="FFN", embed_dims=EMBED, feedforward_channels=HIDDEN, act_cfg=dict(type="PReLU")
    )
    return transformer.BaseTransformerLayer(
        attn_cfgs=attn_cfgs, ffn_cfgs=ffn_cfgs, operation_order=order
    ).eval()


def _mha() -> dict[str, Any]:
    return dict(type="MultiheadAttention", embed_dims=EMBED, num_heads=HEADS)


def _encoder_layer(transformer: Any) -> dict[str, Any]:
    """A DETR encoder layer of mmdet 2.x: BaseTransformerLayer(self_attn, norm, ffn, norm)."""
    torch.manual_seed(2)
    layer = _layer(transformer, [_mha()], ("self_attn", "norm", "ffn", "norm"))
    query = torch.randn(QUERIES, BATCH, EMBED)  # 1.x layers are sequence-first
    query_pos = torch.randn(QUERIES, BATCH, EMBED)
    output = layer(query, query_pos=query_pos)
    return {
        "state_dict": layer.state_dict(),
        "query": query,
        "query_pos": query_pos,
        "output": output.detach(),
    }


def _detr_decoder_layer(transformer: Any) -> dict[str, Any]:
    """A DETR decoder layer: two MultiheadAttention of one shape (which is which is ambiguous)."""
    torch.manual_seed(3)
    order = ("self_attn", "norm", "cross_attn", "norm", "ffn", "norm")
    layer = _layer(transformer, [_mha(), _mha()], order)
    query = torch.randn(QUERIES, BATCH, EMBED)
    memory = torch.randn(7, BATCH, EMBED)
    query_pos = torch.randn(QUERIES, BATCH, EMBED)
    output = layer(query, memory, memory, query_pos=query_pos)
    return {
        "state_dict": layer.state_dict(),
        "query": query,
        "memory": memory,
        "query_pos": query_pos,
        "output": output.detach(),
    }


def _deformable_decoder_layer(transformer: Any) -> dict[str, Any]:
    """A Deformable DETR decoder layer: self_attn MultiheadAttention, cross_attn deformable."""
    torch.manual_seed(4)
    msda = dict(
        type="MultiScaleDeformableAttention",
        embed_dims=EMBED,
        num_heads=HEADS,
        num_levels=LEVELS,
        num_points=POINTS,
    )
    order = ("self_attn", "norm", "cross_attn", "norm", "ffn", "norm")
    layer = _layer(transformer, [_mha(), msda], order)
    with torch.no_grad():  # mmcv zero-initialises the offsets: give them values that matter
        for parameter in layer.attentions[1].parameters():
            parameter.normal_(0, 0.3)
    spatial_shapes = torch.tensor(SHAPES, dtype=torch.long)
    level_start_index = torch.cat(
        (spatial_shapes.new_zeros(1), spatial_shapes.prod(1).cumsum(0)[:-1])
    )
    values = int(spatial_shapes.prod(1).sum())
    query = torch.randn(QUERIES, BATCH, EMBED)
    value = torch.randn(values, BATCH, EMBED)
    query_pos = torch.randn(QUERIES, BATCH, EMBED)
    reference_points = torch.rand(BATCH, QUERIES, LEVELS, 2)
    output = layer(
        query,
        None,
        value,
        query_pos=query_pos,
        reference_points=reference_points,
        spatial_shapes=spatial_shapes,
        level_start_index=level_start_index,
    )
    return {
        "state_dict": layer.state_dict(),
        "query": query,
        "value": value,
        "query_pos": query_pos,
        "reference_points": reference_points,
        "spatial_shapes": spatial_shapes,
        "level_start_index": level_start_index,
        "output": output.detach(),
    }


@functools.cache
def build_cases() -> dict[str, Any]:
    """Every case, built and run by the mmcv 1.x installed here (once: mmcv.ops registers
    its layers with mmcv's registries on import, and a second import would clash)."""
    with mmcv1_stand_ins():
        import mmcv
        import mmcv.ops.multi_scale_deform_attn  # registers the attention with mmcv's registry
        from mmcv.cnn.bricks import transformer

        assert mmcv.__version__.startswith("1."), mmcv.__version__
        cases = {
            "ffn": _ffn(transformer),
            "encoder_layer": _encoder_layer(transformer),
            "detr_decoder_layer": _detr_decoder_layer(transformer),
            "deformable_decoder_layer": _deformable_decoder_layer(transformer),
        }
        keys = layer_keys()
    return {
        "mmcv": mmcv.__version__,
        "torch": str(torch.__version__),
        "cases": cases,
        "layer_keys": keys,
    }


def test_fixture_is_what_mmcv_1_7_2_builds_and_computes() -> None:
    saved = torch.load(FIXTURE, weights_only=True)
    built = dict(build_cases())
    built.pop("layer_keys")
    assert saved["mmcv"] == built["mmcv"] == "1.7.2"
    assert saved["cases"].keys() == built["cases"].keys()
    for name, case in built["cases"].items():
        old = saved["cases"][name]
        assert list(old["state_dict"]) == list(case["state_dict"]), name  # keys, in order
        for key, value in case["state_dict"].items():
            torch.testing.assert_close(old["state_dict"][key], value, rtol=0, atol=0)
        assert old.keys() == case.keys(), name
        for key in case.keys() - {"state_dict"}:
            # Same torch build: the same numbers; another one may round differently.
            torch.testing.assert_close(old[key], case[key], rtol=1e-5, atol=1e-6)


def test_mmcv1_ffn_registers_its_activation_twice() -> None:
    """The one mmcv-owned key difference: a 1.x FFN's activation under activate and layers.0.1."""
    case = build_cases()["cases"]["ffn"]
    keys = list(case["state_dict"])
    assert "activate.weight" in keys and "layers.0.1.weight" in keys
    assert case["state_dict"]["activate.weight"] is not None
    torch.testing.assert_close(
        case["state_dict"]["activate.weight"], case["state_dict"]["layers.0.1.weight"]
    )


def test_layer_keys_fixture_is_what_mmcv_1_7_2_builds() -> None:
    """The keys and shapes of mmcv's layers under 1.7.2; test_checkpoint_keys_ops.py
    compares them with mmcv 2.x."""
    assert json.loads(LAYERS_FIXTURE.read_text()) == build_cases()["layer_keys"]


if __name__ == "__main__":
    built = dict(build_cases())
    keys = built.pop("layer_keys")
    rows = ",\n".join(f"  {json.dumps(n)}: {json.dumps(k)}" for n, k in keys["layers"].items())
    LAYERS_FIXTURE.write_text(f'{{"mmcv": {json.dumps(keys["mmcv"])}, "layers": {{\n{rows}\n}}}}\n')
    torch.save(built, FIXTURE)
    print(f"wrote {FIXTURE} and {LAYERS_FIXTURE}")
