"""mmcv's parametrised layers, built alike under mmcv 1.x and 2.x, for MmcvCheckpointKeys' tests.

:func:`layer_keys` builds each layer of :data:`LAYERS` with one small configuration and
returns its state-dict keys and shapes. ``checkpoint_keys_mmcv172_layers.json`` holds
what mmcv 1.7.2 returns (checked against mmcv 1.7.2 in test_checkpoint_keys_mmcv1.py);
test_checkpoint_keys_ops.py compares it with mmcv 2.x: every difference must be one
that ``ascend_patch_mmcv.checkpoint_keys.DUPLICATES`` explains.

Under mmcv 1.7.2 without compiled ops, :func:`mmcv1_stand_ins` provides test-only
stand-ins for ``torchvision`` (mmcv.cnn imports mmcv.runner, which imports it; it has
no CPU build for this torch) and ``mmcv._ext`` (``mmcv.ops`` loads it at import; the
layers' constructors build only torch modules, and no kernel is ever called).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any


__all__ = ["LAYERS", "LAYERS_FIXTURE", "layer_keys", "mmcv1_stand_ins"]

LAYERS_FIXTURE = Path(__file__).resolve().parent / "checkpoint_keys_mmcv172_layers.json"


def _ffn(prelu: bool) -> Callable[[Any, Any, Any], Any]:
    act = dict(type="PReLU") if prelu else dict(type="ReLU", inplace=True)
    return lambda bricks, ops, t: t.FFN(embed_dims=8, feedforward_channels=16, act_cfg=act)


def _layer(bricks: Any, ops: Any, t: Any) -> Any:
    mha = dict(type="MultiheadAttention", embed_dims=8, num_heads=2)
    msda = dict(
        type="MultiScaleDeformableAttention", embed_dims=8, num_heads=2, num_levels=2, num_points=2
    )
    return t.BaseTransformerLayer(
        attn_cfgs=[mha, msda],
        ffn_cfgs=dict(type="FFN", embed_dims=8, feedforward_channels=16),
        operation_order=("self_attn", "norm", "cross_attn", "norm", "ffn", "norm"),
    )


def _sequence(bricks: Any, ops: Any, t: Any) -> Any:
    layer = dict(
        type="BaseTransformerLayer",
        attn_cfgs=[dict(type="MultiheadAttention", embed_dims=8, num_heads=2)],
        ffn_cfgs=dict(type="FFN", embed_dims=8, feedforward_channels=16),
        operation_order=("self_attn", "norm", "ffn", "norm"),
    )
    return t.TransformerLayerSequence(transformerlayers=layer, num_layers=2)


#: name -> ``build(mmcv.cnn.bricks, mmcv.ops, mmcv.cnn.bricks.transformer)``.
LAYERS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "ConvModule(BN, PReLU)": lambda b, o, t: b.ConvModule(
        4, 8, 3, norm_cfg=dict(type="BN"), act_cfg=dict(type="PReLU")
    ),
    "ConvModule(GN)": lambda b, o, t: b.ConvModule(4, 8, 3, norm_cfg=dict(type="GN", num_groups=2)),
    "DepthwiseSeparableConvModule": lambda b, o, t: b.DepthwiseSeparableConvModule(
        4, 8, 3, norm_cfg=dict(type="BN")
    ),
    "ContextBlock": lambda b, o, t: b.ContextBlock(8, 0.5),
    "GeneralizedAttention": lambda b, o, t: b.GeneralizedAttention(8, num_heads=2),
    "NonLocal2d": lambda b, o, t: b.NonLocal2d(8),
    "Scale": lambda b, o, t: b.Scale(),
    "ConvWS2d": lambda b, o, t: b.ConvWS2d(4, 8, 3),
    "ConvAWS2d": lambda b, o, t: b.ConvAWS2d(4, 8, 3),
    "Conv2dAdaptivePadding": lambda b, o, t: b.Conv2dAdaptivePadding(4, 8, 3),
    "ConvTranspose2d": lambda b, o, t: b.ConvTranspose2d(4, 8, 3),
    "Linear": lambda b, o, t: b.Linear(4, 8),
    "FFN(ReLU)": _ffn(prelu=False),
    "FFN(PReLU)": _ffn(prelu=True),
    "MultiheadAttention": lambda b, o, t: t.MultiheadAttention(8, 2),
    "PatchEmbed": lambda b, o, t: t.PatchEmbed(
        in_channels=3, embed_dims=8, kernel_size=4, norm_cfg=dict(type="LN")
    ),
    "PatchMerging": lambda b, o, t: t.PatchMerging(8, 16),
    "BaseTransformerLayer": _layer,
    "TransformerLayerSequence": _sequence,
    "MultiScaleDeformableAttention": lambda b, o, t: o.MultiScaleDeformableAttention(8, 2, 2, 2),
    "DeformConv2dPack": lambda b, o, t: o.DeformConv2dPack(4, 8, 3),
    "ModulatedDeformConv2dPack": lambda b, o, t: o.ModulatedDeformConv2dPack(4, 8, 3),
    "SAConv2d": lambda b, o, t: o.SAConv2d(4, 8, 3, use_deform=True),
    "CARAFEPack": lambda b, o, t: o.CARAFEPack(8, 2),
    "MaskedConv2d": lambda b, o, t: o.MaskedConv2d(4, 8, 3),
    "DeformRoIPoolPack": lambda b, o, t: o.DeformRoIPoolPack(7, 8),
    "ModulatedDeformRoIPoolPack": lambda b, o, t: o.ModulatedDeformRoIPoolPack(7, 8),
    "CrissCrossAttention": lambda b, o, t: o.CrissCrossAttention(8),
    "SparseConv3d": lambda b, o, t: o.SparseConv3d(4, 8, 3),
    "SubMConv3d": lambda b, o, t: o.SubMConv3d(4, 8, 3),
    "SparseSequential": lambda b, o, t: o.SparseSequential(o.SubMConv3d(4, 8, 3)),
    "FusedBiasLeakyReLU": lambda b, o, t: o.FusedBiasLeakyReLU(8),
}


@contextlib.contextmanager
def mmcv1_stand_ins() -> Iterator[None]:
    """Test-only ``torchvision`` and ``mmcv._ext`` for mmcv 1.7.2 without ops (see above).

    A real module is never replaced. On exit the ``mmcv._ext`` stand-in and the
    ``mmcv.ops`` modules it let import are forgotten, so that the rest of the session
    sees mmcv 1.7.2 as installed (the torchvision stand-in stays, as in the training
    kit's mmcv 1.x tests). mmcv.ops registers its layers with mmcv's registries on
    import: enter this once per process.
    """
    if "torchvision" not in sys.modules:
        torchvision = types.ModuleType("torchvision")
        torchvision.__version__ = "0.0.0+stand-in"  # type: ignore[attr-defined]
        torchvision.__path__ = []  # type: ignore[attr-defined]
        sys.modules["torchvision"] = torchvision
    before = set(sys.modules)
    if "mmcv._ext" not in sys.modules:
        ext = types.ModuleType("mmcv._ext")

        def kernel(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)

            def absent(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"test stand-in mmcv._ext has no kernel {name}")

            return absent

        ext.__getattr__ = kernel  # type: ignore[attr-defined]
        sys.modules["mmcv._ext"] = ext
        before.discard("mmcv._ext")
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n not in before]:
            if name == "mmcv._ext" or name == "mmcv.ops" or name.startswith("mmcv.ops."):
                del sys.modules[name]
        mmcv = sys.modules.get("mmcv")
        if mmcv is not None and "mmcv.ops" not in before:
            vars(mmcv).pop("ops", None)


def layer_keys() -> dict[str, Any]:
    """``{"mmcv": version, "layers": {name: {key: shape}}}`` of the mmcv installed here."""
    import mmcv
    import mmcv.ops
    from mmcv.cnn import bricks
    from mmcv.cnn.bricks import transformer

    layers = {}
    for name, build in LAYERS.items():
        state_dict = build(bricks, mmcv.ops, transformer).state_dict()
        layers[name] = {key: list(value.shape) for key, value in state_dict.items()}
    return {"mmcv": mmcv.__version__, "layers": layers}
