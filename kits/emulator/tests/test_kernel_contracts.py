"""Every reference kernel honours its op's schema (no undeclared aliasing or mutation,
autograd registered as declared) and fits every torch_npu version with schema data."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from ascend_patch_emulator import available_versions


def _t(*shape, dtype=torch.float32, seed=0):
    return torch.randn(
        shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    ).to(dtype)


def _boxes():
    return torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0], [0.1, 0.0, 2.0, 2.1]])


#: One call per implemented op overload, with arguments every version's schema has.
SAMPLES = {
    "npu_fusion_attention": lambda: (
        (_t(1, 2, 3, 4), _t(1, 2, 3, 4, seed=1), _t(1, 2, 3, 4, seed=2), 2, "BNSD"),
        {},
    ),
    "npu_rms_norm": lambda: ((_t(2, 8), _t(8, seed=1)), {}),
    "npu_add_rms_norm": lambda: ((_t(2, 8), _t(2, 8, seed=1), _t(8, seed=2)), {}),
    "npu_rotary_mul": lambda: (
        (_t(1, 2, 3, 4), _t(1, 1, 3, 4, seed=1), _t(1, 1, 3, 4, seed=2)),
        {},
    ),
    "npu_swiglu": lambda: ((_t(2, 8),), {}),
    "npu_geglu": lambda: ((_t(2, 8),), {}),
    "fast_gelu": lambda: ((_t(2, 8),), {}),
    "npu_fast_gelu": lambda: ((_t(2, 8),), {}),
    "npu_gelu": lambda: ((_t(2, 8),), {}),
    "npu_silu": lambda: ((_t(2, 8),), {}),
    "npu_mish": lambda: ((_t(2, 8),), {}),
    "npu_bmmV2": lambda: ((_t(2, 3, 4), _t(2, 4, 5, seed=1), []), {}),
    "npu_grouped_matmul": lambda: (
        ([_t(2, 3), _t(4, 3, seed=1)], [_t(3, 5, seed=2), _t(3, 6, seed=3)]),
        {"group_type": -1},
    ),
    "npu_grouped_matmul.List": lambda: (([_t(2, 3)], [_t(3, 5, seed=1)]), {}),
    "npu_confusion_transpose": lambda: ((_t(2, 3, 4), [0, 2, 1], [2, 12], True), {}),
    "npu_format_cast": lambda: ((_t(2, 3), 29), {}),
    "npu_format_cast.Tensor": lambda: ((_t(2, 3), _t(2, 3, seed=1)), {}),
    "npu_format_cast_": lambda: ((_t(2, 3), _t(2, 3, seed=1)), {}),
    "npu_format_cast_.acl_format": lambda: ((_t(2, 3), 2), {}),
    "get_npu_format": lambda: ((_t(2, 3),), {}),
    "npu_scatter_nd_update": lambda: ((_t(4, 2), torch.tensor([[1], [3]]), _t(2, 2, seed=1)), {}),
    "npu_scatter_nd_update_": lambda: ((_t(4, 2), torch.tensor([[1], [3]]), _t(2, 2, seed=1)), {}),
    "npu_iou": lambda: ((_boxes(), _boxes()[:2]), {}),
    "npu_ptiou": lambda: ((_boxes(), _boxes()[:2]), {}),
    "npu_nms_v4": lambda: (
        (_boxes(), torch.tensor([0.9, 0.8, 0.7]), 3, torch.tensor(0.5), torch.tensor(0.1)),
        {},
    ),
    "npu_roi_align": lambda: (
        (_t(1, 2, 5, 5), torch.tensor([[0.0, 0.5, 0.5, 3.0, 4.0]]), 1.0, 2, 2, 2, 0),
        {},
    ),
    "npu_deformable_conv2d": lambda: (
        (
            _t(1, 2, 4, 4),
            _t(3, 2, 3, 3, seed=1),
            0.2 * _t(1, 27, 4, 4, seed=2),
            None,
            [3, 3],
            [1, 1, 1, 1],
            [1, 1, 1, 1],
        ),
        {},
    ),
    "npu_moe_gating_top_k_softmax": lambda: ((_t(3, 6), None, 2), {}),
    "npu_silu_": lambda: ((_t(2, 8),), {}),
    "npu_silu_backward": lambda: ((_t(2, 8), _t(2, 8, seed=1), _t(2, 8, seed=2)), {}),
    "npu_linear": lambda: ((_t(2, 3), _t(4, 3, seed=1), _t(4, seed=2)), {}),
    "npu_linear_backward": lambda: ((_t(2, 4), _t(2, 3, seed=1), _t(4, 3, seed=2)), {}),
    "npu_giou": lambda: ((_boxes().T.contiguous(), _boxes().T.contiguous(), True), {}),
    "npu_giou_backward": lambda: (
        (_t(3, 1), _boxes().T.contiguous(), _boxes().T.contiguous(), True),
        {},
    ),
    "npu_ciou": lambda: ((_boxes().T.contiguous(), _boxes()[:2].T.contiguous()), {}),
    "npu_ciou_backward": lambda: (
        (_t(1, 3), _boxes().T.contiguous(), _boxes().T.contiguous(), None, True, False),
        {},
    ),
    "npu_rotary_mul_backward": lambda: (
        (_t(1, 2, 3, 4), _t(1, 2, 3, 4, seed=1), _t(1, 1, 3, 4, seed=2), _t(1, 1, 3, 4, seed=3)),
        {},
    ),
    "npu_roi_alignbk": lambda: (
        (_t(1, 2, 2, 2), torch.tensor([[0.0, 0.5, 0.5, 3.0, 4.0]]), [1, 2, 5, 5], 2, 2, 1.0, 2, 0),
        {},
    ),
    "npu_deformable_conv2dbk": lambda: (
        (
            _t(1, 2, 4, 4),
            _t(1, 3, 4, 4, seed=3),
            _t(1, 2, 12, 12, seed=4),
            _t(3, 2, 3, 3, seed=1),
            0.2 * _t(1, 27, 4, 4, seed=2),
            [3, 3],
            [1, 1, 1, 1],
            [1, 1, 1, 1],
        ),
        {},
    ),
    "npu_fusion_attention_grad": lambda: (
        (
            _t(1, 2, 3, 4),
            _t(1, 2, 3, 4, seed=1),
            _t(1, 2, 3, 4, seed=2),
            _t(1, 2, 3, 4, seed=3),
            2,
            "BNSD",
        ),
        {},
    ),
}


def _overload(qualified):
    name, _, overload = qualified.partition(".")
    return getattr(getattr(torch.ops.npu, name), overload or "default")


def test_every_kernel_has_a_sample(emulated):
    assert sorted(SAMPLES) == sorted(emulated.implemented)


#: Ops that, as torch_npu's, return their input although the schema declares no alias:
#: a cast to the format the input already has (opcheck's input copies are all ND).
_RETURN_THEIR_INPUT = {"npu_format_cast.Tensor"}


@pytest.mark.parametrize("qualified", sorted(SAMPLES))
def test_kernel_honours_the_schema(emulated, qualified):
    args, kwargs = SAMPLES[qualified]()
    checks = ("test_schema", "test_autograd_registration")
    if qualified in _RETURN_THEIR_INPUT:
        checks = ("test_autograd_registration",)
    torch.library.opcheck(_overload(qualified), args, kwargs, test_utils=checks)


_PROBE = """
import json, runpy, sys, torch
import ascend_patch_emulator as emulator
from ascend_patch_emulator import _library
handle = emulator.activate(sys.argv[1])
samples = runpy.run_path(sys.argv[2])["SAMPLES"]
failures = {}
for qualified, make in samples.items():
    name, _, overload = qualified.partition(".")
    packet = getattr(torch.ops.npu, name, None)
    if packet is None or (overload or "default") not in packet.overloads():
        continue  # not an op of this version
    args, kwargs = make()
    try:
        getattr(packet, overload or "default")(*args, **kwargs)
    except Exception as exc:
        failures[qualified] = repr(exc)
print(json.dumps({"unfit": _library.registration().unfit, "failures": failures,
                  "implemented": len(handle.implemented)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("version", available_versions())
def test_kernels_fit_every_version_with_data(version):
    """Each version in its own process: one torch_npu version per process."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, version, __file__],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["unfit"] == {}
    assert result["failures"] == {}
    assert result["implemented"] >= 20
