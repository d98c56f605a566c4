"""MmcvCheckpointKeys: checkpoints of mmcv 1.x layers load through mmengine into mmcv 2.x layers.

The old state dicts come from real mmcv 1.7.2 (``checkpoint_keys_mmcv172.pth``, checked
against mmcv 1.7.2 by test_checkpoint_keys_mmcv1.py). Runs where mmengine and mmcv 2.x
are (nox -s openmmlab_emulated: mmcv-lite 2.1.0; openmmlab_cpu_ops); the real mmdet
3.x layers with deformable attention are in test_checkpoint_keys_ops.py.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack

from ascend_patch_core import Status


require_stack("mmengine")
torch = require_module("torch", "mmengine")
np = require_module("numpy", "mmengine")
transformer = require_module("mmcv.cnn.bricks.transformer", "mmengine")

from ascend_patch_mmcv.checkpoint_keys import remap_old_layout  # noqa: E402
from ascend_patch_mmcv.groups import MmcvCheckpointKeys  # noqa: E402
from ascend_patch_mmcv.groups import MmengineCheckpointNumpy  # noqa: E402
from mmengine.runner import checkpoint as mmengine_checkpoint  # noqa: E402
from mmengine.runner import load_checkpoint  # noqa: E402


TARGET = "mmengine.runner.checkpoint:load_state_dict"
FIXTURE = Path(__file__).resolve().parent / "checkpoint_keys_mmcv172.pth"
CASES = torch.load(FIXTURE, weights_only=True)["cases"]
EMBED, HEADS, HIDDEN = 8, 2, 16
FFN_CFG = dict(embed_dims=EMBED, feedforward_channels=HIDDEN, act_cfg=dict(type="PReLU"))


def ffn_2x() -> Any:
    return transformer.FFN(**FFN_CFG).eval()


class NamedLayer(torch.nn.Module):  # type: ignore[misc]
    """The state-dict layout of mmdet 3.x's DETR layers (``self_attn``, ``cross_attn``,
    ``ffn``, ``norms``), built from mmcv 2.x's own bricks; mmdet's layers themselves
    (they need mmcv.ops to import) are tested in test_checkpoint_keys_ops.py."""

    def __init__(self, cross_attn: bool = False) -> None:
        super().__init__()
        self.self_attn = transformer.MultiheadAttention(EMBED, HEADS, batch_first=True)
        if cross_attn:
            self.cross_attn = transformer.MultiheadAttention(EMBED, HEADS, batch_first=True)
        self.ffn = transformer.FFN(**FFN_CFG)
        self.norms = torch.nn.ModuleList(
            torch.nn.LayerNorm(EMBED) for _ in range(3 if cross_attn else 2)
        )


def save(tmp_path: Path, state_dict: Any, name: str = "old.pth", **extra: Any) -> str:
    path = tmp_path / name
    torch.save({"state_dict": state_dict, **extra}, path)
    return str(path)


def messages(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if "MmcvCheckpointKeys" in r.getMessage()]


LOGGER = logging.getLogger("test_checkpoint_keys")


def test_unpatched_mmengine_refuses_an_mmcv1_ffn_checkpoint(tmp_path: Path) -> None:
    """The problem is real: the 1.x FFN's duplicate activation is an unexpected key."""
    path = save(tmp_path, CASES["ffn"]["state_dict"])
    with pytest.raises(
        RuntimeError, match=r"unexpected key in source state_dict: activate\.weight"
    ):
        load_checkpoint(ffn_2x(), path, strict=True, logger=LOGGER)


def test_mmcv1_ffn_loads_strictly_and_computes_what_mmcv1_computed(
    isolated_patcher: Any, tmp_path: Path, caplog: Any
) -> None:
    original = mmengine_checkpoint.load_state_dict
    path = save(tmp_path, CASES["ffn"]["state_dict"])
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    assert isolated_patcher.report.get(TARGET).status is Status.APPLIED

    model = ffn_2x()
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        load_checkpoint(model, path, strict=True, logger=LOGGER)
    with torch.no_grad():
        output = model(CASES["ffn"]["x"])
    torch.testing.assert_close(output, CASES["ffn"]["output"], rtol=1e-5, atol=1e-6)
    assert model.layers[0][1].weight.item() == 0.25  # the saved PReLU slope, not the default
    assert any(
        "dropped 1 mmcv 1.x duplicate keys" in m and "activate.weight" in m
        for m in messages(caplog)
    )

    isolated_patcher.revert()
    assert mmengine_checkpoint.load_state_dict is original
    with pytest.raises(RuntimeError, match="unexpected key"):
        load_checkpoint(ffn_2x(), path, strict=True, logger=LOGGER)


def test_layer_lists_load_under_their_2x_names(
    isolated_patcher: Any, tmp_path: Path, caplog: Any
) -> None:
    """attentions.0 -> self_attn, ffns.0 -> ffn, norms kept: every tensor lands where its module went."""
    old = CASES["encoder_layer"]["state_dict"]
    path = save(tmp_path, old)
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    model = NamedLayer()
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        load_checkpoint(model, path, strict=True, logger=LOGGER)
    loaded = model.state_dict()
    for key, value in old.items():
        if key == "ffns.0.activate.weight":
            continue  # the duplicate: its twin ffns.0.layers.0.1.weight is what loads
        new = re.sub(r"^attentions\.0\.", "self_attn.", re.sub(r"^ffns\.0\.", "ffn.", key))
        torch.testing.assert_close(loaded[new], value, rtol=0, atol=0)
    (message,) = messages(caplog)
    assert "attentions.0 -> self_attn, ffns.0 -> ffn" in message


def test_a_checkpoint_that_matches_the_model_is_passed_on_untouched(
    isolated_patcher: Any, monkeypatch: Any, caplog: Any
) -> None:
    source = NamedLayer(cross_attn=True)
    state_dict = source.state_dict()
    assert remap_old_layout(state_dict, NamedLayer(cross_attn=True))[0] is state_dict

    # What mmengine's own loader is handed, seen by a spy installed before the patch.
    received = []
    original = mmengine_checkpoint.load_state_dict

    def spy(module: Any, state: Any, strict: bool = False, logger: Any = None) -> Any:
        received.append(state)
        return original(module, state, strict, logger)

    monkeypatch.setattr(mmengine_checkpoint, "load_state_dict", spy)
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    model = NamedLayer(cross_attn=True)
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        mmengine_checkpoint.load_state_dict(model, state_dict, True, LOGGER)
    isolated_patcher.revert()
    assert len(received) == 1 and received[0] is state_dict
    assert messages(caplog) == []
    for key, value in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0)


def test_keys_of_no_old_layout_get_mmengines_usual_report(
    isolated_patcher: Any, caplog: Any
) -> None:
    """Missing and unexpected keys that no rule explains read exactly as without the patch."""
    state_dict = OrderedDict(NamedLayer().state_dict())
    state_dict["head.weight"] = state_dict.pop("norms.1.weight")

    def report(model: Any) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER.name):
            mmengine_checkpoint.load_state_dict(model, state_dict, False, LOGGER)
        return [r.getMessage() for r in caplog.records]

    before = report(NamedLayer())
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    assert report(NamedLayer()) == before
    assert "missing keys in source state_dict: norms.1.weight" in before[0]


def test_ambiguous_attentions_are_left_alone_and_said_so(
    isolated_patcher: Any, tmp_path: Path, caplog: Any
) -> None:
    """A DETR decoder layer's two attentions have one shape: no guess, revise_keys decides."""
    old = CASES["detr_decoder_layer"]["state_dict"]
    path = save(tmp_path, old)
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    missing = r"missing keys.*self_attn\.attn\.in_proj_weight"
    with (
        caplog.at_level(logging.WARNING, logger=LOGGER.name),
        pytest.raises(RuntimeError, match=missing),
    ):
        load_checkpoint(NamedLayer(cross_attn=True), path, strict=True, logger=LOGGER)
    (message,) = messages(caplog)
    assert "left attentions.0, attentions.1 as they are" in message
    assert "ffns.0 -> ffn" in message  # the unambiguous list of the same layer still moves

    # The user knows the 1.x operation_order (self-attention first): revise_keys says so.
    model = NamedLayer(cross_attn=True)
    revise = [(r"^attentions\.0\.", "self_attn."), (r"^attentions\.1\.", "cross_attn.")]
    load_checkpoint(model, path, strict=True, logger=LOGGER, revise_keys=revise)
    torch.testing.assert_close(
        model.cross_attn.attn.in_proj_weight, old["attentions.1.attn.in_proj_weight"]
    )


def test_revise_keys_move_the_model_prefix_and_the_layer_rules_do_the_rest(
    isolated_patcher: Any, tmp_path: Path
) -> None:
    """mmdet 2.x kept the transformer under bbox_head.transformer.: a model-level move."""

    class Detector(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.encoder = torch.nn.Module()
            self.encoder.layers = torch.nn.ModuleList([NamedLayer(), NamedLayer()])

    old = CASES["encoder_layer"]["state_dict"]
    state_dict = OrderedDict(
        (f"bbox_head.transformer.encoder.layers.{i}.{key}", value)
        for i in range(2)
        for key, value in old.items()
    )
    path = save(tmp_path, state_dict)
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    model = Detector()
    load_checkpoint(
        model, path, strict=True, logger=LOGGER, revise_keys=[(r"^bbox_head\.transformer\.", "")]
    )
    torch.testing.assert_close(
        model.encoder.layers[1].ffn.layers[1].weight, old["ffns.0.layers.1.weight"]
    )


def test_a_different_shape_is_not_renamed(isolated_patcher: Any, tmp_path: Path) -> None:
    path = save(tmp_path, CASES["encoder_layer"]["state_dict"])
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    model = NamedLayer()
    model.ffn = transformer.FFN(embed_dims=EMBED, feedforward_channels=HIDDEN * 2)
    before = {k: v.clone() for k, v in model.ffn.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"unexpected key.*ffns\.0\.layers\.0\.0\.weight"):
        load_checkpoint(model, path, strict=True, logger=LOGGER)
    for key, value in model.ffn.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_module_versions_in_metadata_follow_the_renamed_modules() -> None:
    old = CASES["encoder_layer"]["state_dict"]
    state_dict = OrderedDict(old)
    state_dict._metadata = OrderedDict(  # type: ignore[attr-defined]
        [("", {"version": 1}), ("attentions.0", {"version": 7}), ("attentions.0.attn", {"v": 2})]
    )
    remapped, done = remap_old_layout(state_dict, NamedLayer())
    assert remapped is not state_dict and list(state_dict) == list(old)  # the input is kept
    assert remapped._metadata["self_attn"] == {"version": 7}
    assert remapped._metadata["self_attn.attn"] == {"v": 2}
    assert done.moved == {"attentions.0": "self_attn", "ffns.0": "ffn"}
    assert done.dropped == ["ffns.0.activate.weight"]


def test_pretrained_init_cfg_goes_through_the_patch(isolated_patcher: Any, tmp_path: Path) -> None:
    """mmengine's Pretrained initialiser loads with load_checkpoint, looked up at call time."""
    path = save(tmp_path, CASES["ffn"]["state_dict"])
    isolated_patcher.add(MmcvCheckpointKeys).apply()
    model = transformer.FFN(**FFN_CFG, init_cfg=dict(type="Pretrained", checkpoint=path))
    model.init_weights()
    model.eval()
    with torch.no_grad():
        output = model(CASES["ffn"]["x"])
    torch.testing.assert_close(output, CASES["ffn"]["output"], rtol=1e-5, atol=1e-6)


def test_composes_with_the_numpy_checkpoint_group(isolated_patcher: Any, tmp_path: Path) -> None:
    """One mmcv 1.x-era checkpoint: numpy in its meta, old keys. Both groups, both revert."""
    loader = mmengine_checkpoint.CheckpointLoader.__dict__["load_checkpoint"]
    original = mmengine_checkpoint.load_state_dict
    meta = {"seed": np.int64(7), "epoch": 12}
    path = save(tmp_path, CASES["ffn"]["state_dict"], meta=meta)
    isolated_patcher.add(MmengineCheckpointNumpy).add(MmcvCheckpointKeys).apply()
    model = ffn_2x()
    checkpoint = load_checkpoint(model, path, strict=True, logger=LOGGER)
    assert int(checkpoint["meta"]["seed"]) == 7
    with torch.no_grad():
        torch.testing.assert_close(
            model(CASES["ffn"]["x"]), CASES["ffn"]["output"], rtol=1e-5, atol=1e-6
        )
    isolated_patcher.revert()
    assert mmengine_checkpoint.CheckpointLoader.__dict__["load_checkpoint"] is loader
    assert mmengine_checkpoint.load_state_dict is original


def test_installed_plugin_applies_the_group_by_default(tmp_path: Path) -> None:
    """The user's way: ``apply()``, then mmengine's load_checkpoint with strict=True."""
    path = save(tmp_path, CASES["ffn"]["state_dict"])
    script = (
        "import ascend_patch_core, torch\n"
        "report = ascend_patch_core.apply()\n"
        "from mmcv.cnn.bricks.transformer import FFN\n"
        "from mmengine.runner import load_checkpoint\n"
        f"model = FFN(**{FFN_CFG!r})\n"
        f"load_checkpoint(model, {path!r}, strict=True)\n"
        "print('slope', model.layers[0][1].weight.item())\n"
        f"print(report.get({TARGET!r}).status.name)\n"
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "slope 0.25" in done.stdout
    assert "APPLIED" in done.stdout
    assert "MmcvCheckpointKeys: dropped 1 mmcv 1.x duplicate keys" in done.stdout + done.stderr
