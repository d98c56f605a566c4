"""FusedOptimizers (opt-in): NPU parameters get fused Adam/AdamW/SGD steps, matching the plain ones."""

from __future__ import annotations

import pytest
import torch
from ascend_patch_torch.groups import FusedOptimizers


def _train(optimizer_class, steps=5, **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(
        "npu"
    )
    optimizer = optimizer_class(model.parameters(), **options)
    data = torch.randn(16, 6, device="npu")
    for _ in range(steps):
        optimizer.zero_grad()
        model(data).pow(2).mean().backward()
        optimizer.step()
    return optimizer, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("optimizer_class", "options", "target"),
    [
        (torch.optim.AdamW, {"lr": 1e-2}, "torch.optim.adamw.AdamW.__init__"),
        (torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}, "torch.optim.adam.Adam.__init__"),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, "torch.optim.sgd.SGD.__init__"),
    ],
)
def test_fused_steps_match_the_plain_ones(
    npu_emulator, isolated_patcher, optimizer_class, options, target
):
    plain_optimizer, plain = _train(optimizer_class, **options)
    assert not plain_optimizer.defaults.get("fused")
    isolated_patcher.add(FusedOptimizers).apply()
    fused_optimizer, fused = _train(optimizer_class, **options)
    assert fused_optimizer.defaults["fused"] is True
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert isolated_patcher.report.get(target).counters.replacement_calls == 1


def test_an_explicit_choice_is_kept(npu_emulator, isolated_patcher):
    isolated_patcher.add(FusedOptimizers).apply()
    optimizer, _ = _train(torch.optim.AdamW, steps=1, lr=1e-3, foreach=False)
    assert not optimizer.defaults["fused"]
    optimizer, _ = _train(torch.optim.SGD, steps=1, lr=1e-3, fused=False)
    assert not optimizer.defaults["fused"]
    assert (
        isolated_patcher.report.get("torch.optim.adamw.AdamW.__init__").counters.replacement_calls
        == 0
    )


def test_param_groups_and_generators_are_accepted(npu_emulator, isolated_patcher):
    isolated_patcher.add(FusedOptimizers).apply()
    model = torch.nn.Linear(3, 3).to("npu")
    optimizer = torch.optim.AdamW(
        [
            {"params": iter([model.weight]), "lr": 1e-3},
            {"params": [model.bias], "weight_decay": 0.0},
        ]
    )
    assert optimizer.defaults["fused"] is True
    assert [len(group["params"]) for group in optimizer.param_groups] == [1, 1]
    optimizer = torch.optim.SGD(model.named_parameters(), lr=0.1)
    assert optimizer.defaults["fused"] is True
