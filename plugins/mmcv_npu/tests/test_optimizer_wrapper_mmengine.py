"""OptimizerWrapper: mmengine's ``OptimWrapper`` clips by norm through ``clip_grad_norm_fused_``.

torch_npu's fused optimizers (``NpuFused*``) only exist on an NPU, so a **stand-in**
plays one: a torch SGD with a ``clip_grad_norm_fused_(max_norm, norm_type)`` that
records its calls and clips like torch. With it the wrapper's norm clipping goes
through the fused method and the wrapper logs the norm it returns
(``train/grad_norm``); with a plain optimizer, or value clipping, nothing changes.
(The DrivingSDK patcher's version of this group set an attribute mmengine never
reads: ``test_the_fused_method_is_really_called`` fails against such a no-op.)

Runs in the nox sessions with mmengine 0.10.7 (``openmmlab_emulated``,
``openmmlab_cpu_ops``); skipped where mmengine is missing, a failure where the
session requires it (ASCEND_PATCH_TEST_REQUIRE).
"""

from __future__ import annotations

from typing import Any

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack

from ascend_patch_core import Patcher
from ascend_patch_core import Status


require_stack("mmengine")
torch = require_module("torch", "mmengine")

from ascend_patch_mmcv.groups import OptimizerWrapper  # noqa: E402
from mmengine.logging import MessageHub  # noqa: E402
from mmengine.optim import OptimWrapper  # noqa: E402


TARGET = "mmengine.optim.optimizer.optimizer_wrapper:OptimWrapper._clip_grad"
STEPS = 3


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


def train(optimizer_type: type, clip_grad: dict[str, Any]) -> dict[str, Any]:
    """A few ``update_params`` steps of a toy model, as mmengine's train loop makes them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model.to("npu" if hasattr(torch, "npu") and torch.npu.is_available() else "cpu")
    optimizer = optimizer_type(model.parameters(), lr=0.1)
    hub = MessageHub.get_instance("optimizer-wrapper-test")
    wrapper = OptimWrapper(optimizer, clip_grad=dict(clip_grad))
    wrapper.message_hub = hub  # this test's own hub, not the process's current one
    logged = []
    for _ in range(STEPS):
        batch = torch.randn(6, 4)
        wrapper.update_params(model(batch).pow(2).sum() * 10)  # large norms: clipping acts
        if "train/grad_norm" in hub.log_scalars:
            logged.append(hub.get_scalar("train/grad_norm").current())
    hub.log_scalars.clear()
    return {
        "weights": [p.detach().clone() for p in model.parameters()],
        "logged": logged,
        "optimizer": optimizer,
    }


NORM = {"max_norm": 0.5, "norm_type": 2}


def test_the_fused_method_is_really_called(npu_emulator: Any, isolated_patcher: Patcher) -> None:
    unpatched = train(StandInFusedSGD, NORM)
    assert unpatched["optimizer"].fused_calls == []  # mmengine itself never calls it

    isolated_patcher.add(OptimizerWrapper).apply()
    patched = train(StandInFusedSGD, NORM)

    optimizer = patched["optimizer"]
    assert optimizer.fused_calls == [NORM] * STEPS
    # What the wrapper logs is the norm the fused method returned.
    assert patched["logged"] == optimizer.returned
    assert all(norm > NORM["max_norm"] for norm in optimizer.returned)
    # The stand-in clips as torch does: the same training as without the group.
    assert patched["logged"] == pytest.approx(unpatched["logged"], rel=1e-6)
    for got, want in zip(patched["weights"], unpatched["weights"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    counters = isolated_patcher.report.get(TARGET).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (STEPS, 0)


def test_max_norm_alone_uses_the_fused_default_norm_type(isolated_patcher: Patcher) -> None:
    isolated_patcher.add(OptimizerWrapper).apply()
    patched = train(StandInFusedSGD, {"max_norm": 1.0})
    assert patched["optimizer"].fused_calls == [{"max_norm": 1.0, "norm_type": 2}] * STEPS


@pytest.mark.parametrize(
    ("optimizer_type", "clip_grad"),
    [
        (torch.optim.SGD, NORM),
        (torch.optim.SGD, {"type": "value", "clip_value": 0.1}),
        (StandInFusedSGD, {"type": "value", "clip_value": 0.1}),
        (StandInFusedSGD, {**NORM, "error_if_nonfinite": True}),
    ],
    ids=["plain-norm", "plain-value", "fused-value", "fused-torch-only-argument"],
)
def test_otherwise_mmengine_clips_as_before(
    optimizer_type: type, clip_grad: dict[str, Any], isolated_patcher: Patcher
) -> None:
    unpatched = train(optimizer_type, clip_grad)
    isolated_patcher.add(OptimizerWrapper).apply()
    patched = train(optimizer_type, clip_grad)

    assert getattr(patched["optimizer"], "fused_calls", []) == []
    assert patched["logged"] == unpatched["logged"]
    for got, want in zip(patched["weights"], unpatched["weights"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    counters = isolated_patcher.report.get(TARGET).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (0, STEPS)


def test_no_gradient_no_clipping_and_nothing_logged(isolated_patcher: Patcher) -> None:
    """As mmengine: parameters without gradients are not clipped and no norm is logged."""
    isolated_patcher.add(OptimizerWrapper).apply()
    optimizer = StandInFusedSGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    wrapper = OptimWrapper(optimizer, clip_grad=dict(NORM))
    wrapper.message_hub = MessageHub.get_instance("optimizer-wrapper-no-grad")
    wrapper.step()
    assert optimizer.fused_calls == []
    assert "train/grad_norm" not in wrapper.message_hub.log_scalars


def test_default_on_and_reverted() -> None:
    """Installed, the plugin applies it with no opt-in; revert restores mmengine's method."""
    original = OptimWrapper.__dict__["_clip_grad"]
    patcher = Patcher(autoload=True, plugins="mmcv")
    try:
        patcher.apply()
        assert patcher.report.get(TARGET).status is Status.APPLIED
        patched = train(StandInFusedSGD, NORM)
        assert len(patched["optimizer"].fused_calls) == STEPS
    finally:
        patcher.revert()
    assert OptimWrapper.__dict__["_clip_grad"] is original
