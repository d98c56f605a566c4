"""OptimizerHooks: an mmcv 1.x EpochBasedRunner clips with the optimizer's fused clipping.

One epoch of a toy model on the (emulated) NPU, ``grad_clip`` set, the opt-in group
enabled. torch_npu's fused optimizers (``NpuFused*``) only exist on an NPU and the
emulator has none, so a **stand-in** plays one: a torch SGD with a
``clip_grad_norm_fused_(max_norm, norm_type)`` that records its calls and clips like
torch. With it the fused path runs for every clipping hook and the hook logs the norm
it returns; with a plain torch optimizer the original clipping runs, and the weights
and logged norms equal those of an unpatched run.

mmcv.runner imports torchvision, which has no CPU build for torch 2.13 here: a
stand-in module (empty, labelled so) is put in its place, as the training kit's
mmcv 1.x tests do. Runs in the nox session ``openmmlab1_emulated`` (mmcv 1.7.2);
skipped where mmcv 1.x is missing, a failure there (ASCEND_PATCH_TEST_REQUIRE=mmcv1).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack

from ascend_patch_core import Patcher


require_stack("mmcv1")
torch = require_module("torch", "mmcv1")
if "torchvision" not in sys.modules:
    stand_in = types.ModuleType("torchvision")  # a stand-in: mmcv.runner only imports it
    stand_in.__version__ = "0.0.0+stand-in"  # type: ignore[attr-defined]
    stand_in.__path__ = []  # type: ignore[attr-defined]
    sys.modules["torchvision"] = stand_in

from ascend_patch_mmcv.groups import OptimizerHooks  # noqa: E402
from mmcv.runner import EpochBasedRunner  # noqa: E402
from mmcv.runner import Hook  # noqa: E402


CLIP_TARGET = "mmcv.runner.hooks.optimizer:OptimizerHook.clip_grads"
ITERS = 4
GRAD_CLIP = {"max_norm": 0.5, "norm_type": 2}


class StandInFusedSGD(torch.optim.SGD):
    """A STAND-IN for a torch_npu ``NpuFused*`` optimizer: SGD plus ``clip_grad_norm_fused_``.

    It records each call and clips the gradients of its parameter groups the way
    torch does, returning the total norm, as torch_npu's method does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fused_calls: list[dict[str, Any]] = []
        self.returned: list[float] = []

    def clip_grad_norm_fused_(self, max_norm: float, norm_type: float = 2) -> Any:
        self.fused_calls.append({"max_norm": max_norm, "norm_type": norm_type})
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        self.returned.append(float(norm))
        return norm


@pytest.fixture(autouse=True)
def _no_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmcv's runners sleep 1-2 s at every epoch change and at the end of run()."""
    import mmcv.runner.epoch_based_runner as epoch_based

    monkeypatch.setattr(
        epoch_based, "time", types.SimpleNamespace(sleep=lambda s: None, time=time.time)
    )


class Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def train_step(self, data_batch: Any, optimizer: Any, **kwargs: Any) -> dict[str, Any]:
        x = data_batch[0].to("npu")
        loss = self.linear(x).pow(2).sum()  # large gradients: the clipping acts
        return {"loss": loss, "log_vars": {"loss": float(loss.detach())}, "num_samples": len(x)}


class GradNorms(Hook):
    """Reads the ``grad_norm`` the optimizer hook logged, after each iteration."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def after_train_iter(self, runner: Any) -> None:
        history = runner.log_buffer.val_history.get("grad_norm")
        if history:
            self.seen.append(float(history[-1]))
            history.clear()


def train_one_epoch(tmp_path: Path, optimizer_type: type, hook: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Toy().to("npu")
    optimizer = optimizer_type(model.parameters(), lr=0.1)
    runner = EpochBasedRunner(
        model,
        optimizer=optimizer,
        work_dir=str(tmp_path / "work"),
        logger=logging.getLogger("mmcv-optimizer-hooks-test"),
        max_epochs=1,
        meta={},  # as mmdet passes it; the fp16 hooks keep their loss scaler there
    )
    runner.register_optimizer_hook(dict(hook))
    norms = GradNorms()
    runner.register_hook(norms)
    data = torch.utils.data.TensorDataset(torch.randn(2 * ITERS, 4))
    runner.run([torch.utils.data.DataLoader(data, batch_size=2)], [("train", 1)])
    return {
        "weights": [p.detach().clone() for p in model.parameters()],
        "grad_norms": norms.seen,
        "optimizer": optimizer,
    }


HOOKS = {
    "OptimizerHook": {"type": "OptimizerHook"},
    "GradientCumulativeOptimizerHook": {
        "type": "GradientCumulativeOptimizerHook",
        "cumulative_iters": 2,
    },
    # torch >= 1.6: mmcv's fp16 hooks use torch's GradScaler (inactive on the host, so
    # the loss is not scaled here) and call clip_grads after unscaling.
    "Fp16OptimizerHook": {"type": "Fp16OptimizerHook", "loss_scale": 512.0},
    "GradientCumulativeFp16OptimizerHook": {
        "type": "GradientCumulativeFp16OptimizerHook",
        "cumulative_iters": 2,
        "loss_scale": 512.0,
    },
}


@pytest.mark.parametrize("hook_name", list(HOOKS))
def test_a_fused_optimizer_clips_through_its_fused_method(
    hook_name: str, tmp_path: Path, npu_emulator: Any, isolated_patcher: Patcher
) -> None:
    hook = {**HOOKS[hook_name], "grad_clip": GRAD_CLIP}
    unpatched = train_one_epoch(tmp_path / "unpatched", StandInFusedSGD, hook)
    assert unpatched["optimizer"].fused_calls == []  # mmcv itself never calls it

    isolated_patcher.add(OptimizerHooks).apply()
    patched = train_one_epoch(tmp_path / "patched", StandInFusedSGD, hook)

    optimizer = patched["optimizer"]
    clips = ITERS // hook.get("cumulative_iters", 1)
    assert optimizer.fused_calls == [GRAD_CLIP] * clips
    # The hook logged the norms the fused method returned, and they were clipped ones.
    assert patched["grad_norms"] == optimizer.returned
    assert all(norm > GRAD_CLIP["max_norm"] for norm in optimizer.returned)
    # The stand-in clips as torch does: the same training as without the group.
    assert patched["grad_norms"] == pytest.approx(unpatched["grad_norms"], rel=1e-6)
    for got, want in zip(patched["weights"], unpatched["weights"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    counters = isolated_patcher.report.get(CLIP_TARGET).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (clips, 0)


@pytest.mark.parametrize("hook_name", list(HOOKS))
def test_a_plain_optimizer_keeps_the_original_clipping(
    hook_name: str, tmp_path: Path, npu_emulator: Any, isolated_patcher: Patcher
) -> None:
    hook = {**HOOKS[hook_name], "grad_clip": GRAD_CLIP}
    unpatched = train_one_epoch(tmp_path / "unpatched", torch.optim.SGD, hook)

    isolated_patcher.add(OptimizerHooks).apply()
    patched = train_one_epoch(tmp_path / "patched", torch.optim.SGD, hook)

    assert patched["grad_norms"] == unpatched["grad_norms"] and patched["grad_norms"]
    for got, want in zip(patched["weights"], unpatched["weights"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    counters = isolated_patcher.report.get(CLIP_TARGET).counters
    assert counters.replacement_calls == 0 and counters.fallback_calls > 0


def test_a_clip_config_the_fused_method_cannot_take_keeps_the_original(
    tmp_path: Path, npu_emulator: Any, isolated_patcher: Patcher
) -> None:
    """``error_if_nonfinite`` is torch's argument only: torch's function runs, fused optimizer or not."""
    hook = {"type": "OptimizerHook", "grad_clip": {**GRAD_CLIP, "error_if_nonfinite": True}}
    isolated_patcher.add(OptimizerHooks).apply()
    patched = train_one_epoch(tmp_path, StandInFusedSGD, hook)
    assert patched["optimizer"].fused_calls == []
    assert len(patched["grad_norms"]) == ITERS


def test_revert_restores_the_hook_and_the_runner(isolated_patcher: Patcher) -> None:
    from mmcv.runner.base_runner import BaseRunner
    from mmcv.runner.hooks.optimizer import OptimizerHook

    originals = (OptimizerHook.__dict__["clip_grads"], BaseRunner.__dict__["call_hook"])
    isolated_patcher.add(OptimizerHooks).apply()
    assert OptimizerHook.__dict__["clip_grads"] is not originals[0]
    isolated_patcher.revert()
    assert (OptimizerHook.__dict__["clip_grads"], BaseRunner.__dict__["call_hook"]) == originals


@pytest.mark.parametrize("enable", [None, "OptimizerHooks"])
def test_the_group_is_opt_in(enable: str | None) -> None:
    """Installed, the plugin leaves it off until it is enabled by name (ASCEND_PATCH_ENABLE)."""
    script = (
        "import sys, types\n"
        "sys.modules['torchvision'] = types.ModuleType('torchvision')  # stand-in, as above\n"
        "import ascend_patch_core\n"
        "report = ascend_patch_core.apply()\n"
        "import mmcv.runner\n"
        "groups = [r for r in report.records if r.kind == 'group' and r.name == 'OptimizerHooks']\n"
        "for r in groups: print('group', r.status.name, r.reason)\n"
        f"print('clip', [r.status.name for r in report.records if r.target == {CLIP_TARGET!r}])\n"
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop("ASCEND_PATCH_ENABLE", None)
    if enable:
        env["ASCEND_PATCH_ENABLE"] = enable
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    if enable:
        assert "clip ['APPLIED']" in done.stdout
    else:
        assert (
            "group SKIPPED opt-in: enable it with ASCEND_PATCH_ENABLE=OptimizerHooks" in done.stdout
        )
        assert "clip []" in done.stdout
