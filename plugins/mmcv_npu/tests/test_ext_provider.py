"""The ``mmcv._ext`` the plugin serves where mmcv has no compiled ops, as users meet it.

Runs where mmcv 2.x has no compiled ``mmcv._ext`` (mmcv-lite; nox -s openmmlab_emulated):
the programs run in subprocesses -- ``ascend-patch run --emulate-npu`` as the issue's
user ran it, and plain Python with ``ascend_patch_core.apply()`` -- so that an
``mmcv.ops`` imported with the served module never leaks into other tests. The reference
for the NMS results here is an explicit greedy loop (this stack has no compiled kernel;
tests/test_ext_nms.py compares with mmcv's compiled kernels where they exist).
test_ext_provider_data.py tests the tables and stand-ins without mmcv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from mmcv_stacks import require_stack


require_stack("mmcv-lite")

BIN = Path(sys.executable).parent

USER_PROGRAM = """
    import json, sys
    import torch
    from mmcv.ops import batched_nms, nms, soft_nms
    import mmdet.models  # needs mmcv.ops

    def greedy(boxes, scores, threshold):
        # The explicit definition: visit boxes by score, keep one unless a kept box overlaps it more.
        kept = []
        for i in sorted(range(len(scores)), key=lambda k: -float(scores[k])):
            ok = True
            for j in kept:
                lt = torch.maximum(boxes[i, :2], boxes[j, :2])
                rb = torch.minimum(boxes[i, 2:], boxes[j, 2:])
                inter = (rb - lt).clamp(min=0).prod()
                area = lambda b: (b[2:] - b[:2]).prod()
                if inter / (area(boxes[i]) + area(boxes[j]) - inter) > threshold:
                    ok = False
                    break
            if ok:
                kept.append(i)
        return kept

    torch.manual_seed(0)
    xy = torch.rand(60, 2) * 100
    boxes = torch.cat([xy, xy + torch.rand(60, 2) * 40 + 1], 1).to("npu")
    scores = torch.rand(60).to("npu")
    idxs = torch.randint(0, 3, (60,)).to("npu")
    dets, keep = batched_nms(boxes, scores, idxs, dict(type="nms", iou_threshold=0.5))
    expected = []
    for c in range(3):
        members = [i for i in range(60) if int(idxs[i]) == c]
        expected += [members[k] for k in greedy(boxes.cpu()[members], scores.cpu()[members], 0.5)]
    expected.sort(key=lambda i: -float(scores[i]))
    _, single = nms(boxes, scores, 0.3)
    soft_dets, soft_keep = soft_nms(boxes.cpu(), scores.cpu(), 0.3, method="linear")
    print(json.dumps({
        "keep": keep.cpu().tolist(),
        "expected": expected,
        "keep_is_npu": bool(getattr(keep, "is_npu", False)),
        "dets_scores": dets[:, 4].cpu().tolist(),
        "single": single.cpu().tolist(),
        "single_expected": greedy(boxes.cpu(), scores.cpu(), 0.3),
        "soft": soft_keep.tolist(),
    }))
"""

PROBES = """
    import importlib, json, pkgutil, sys, warnings
    warnings.simplefilter("ignore")
    import ascend_patch_core
    report = ascend_patch_core.apply()
    record = next(r for r in report.records if r.kind == "rule" and r.target == "mmcv._ext")
    out = {"before": record.status.value}
    import mmcv.ops
    import mmcv._ext as ext
    from mmcv.utils.ext_loader import check_ops_exist
    from mmengine.utils.dl_utils import mmcv_full_available
    out.update(
        after=record.status.value,
        reason=record.reason,
        find_loader=pkgutil.find_loader("mmcv._ext") is not None,
        check_ops_exist=check_ops_exist(),
        mmcv_full_available=mmcv_full_available(),
        provider=ext.__ascend_patch_provider__,
        names=sorted(n for n in vars(ext) if not n.startswith("_")),
    )
    try:
        ext.carafe_forward(*range(9))
    except NotImplementedError as exc:
        out["error"] = [type(exc).__name__, str(exc)]
    try:
        ext.carafe_forward(1, 2)
    except TypeError as exc:
        out["type_error"] = str(exc)
    import inspect
    out["signature"] = list(inspect.signature(ext.carafe_forward).parameters)
    ascend_patch_core.revert()
    out["reverted"] = record.status.value
    out["gone"] = "mmcv._ext" not in sys.modules
    out["find_loader_after"] = pkgutil.find_loader("mmcv._ext") is not None
    print(json.dumps(out))
"""


def _run(tmp_path: Path, source: str, *launcher: str) -> dict[str, Any]:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [*launcher, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_batched_nms_under_ascend_patch_run(tmp_path: Path) -> None:
    """The issue's program: `from mmcv.ops import batched_nms` and a call, on NPU tensors."""
    out = _run(tmp_path, USER_PROGRAM, str(BIN / "ascend-patch"), "run", "--emulate-npu")
    assert out["keep"] == out["expected"]
    assert out["keep_is_npu"]
    assert out["dets_scores"] == sorted(out["dets_scores"], reverse=True)
    assert out["single"] == out["single_expected"]
    assert out["soft"], "soft_nms ran"


def test_the_served_module_probes_and_stand_ins(tmp_path: Path) -> None:
    """Served only while applied; probes see it; stand-ins have mmcv's arguments and raise."""
    out = _run(tmp_path, PROBES, sys.executable)
    assert out["before"] == "pending"
    assert (out["after"], out["reason"]) == ("applied", "no real mmcv._ext is installed")
    assert out["find_loader"] and out["check_ops_exist"] and out["mmcv_full_available"]
    provider = out["provider"]
    assert provider["release"].startswith("2.")
    assert {"nms", "softnms", "nms_match"} <= set(provider["implemented"])
    assert "carafe_forward" in provider["stand_ins"]
    assert set(provider["implemented"]) | set(provider["stand_ins"]) <= set(out["names"])
    assert len(set(provider["implemented"]) | set(provider["stand_ins"])) == 112  # mmcv 2.1.0
    kind, message = out["error"]
    assert kind == "ExtOpNotImplementedError"
    assert "mmcv._ext.carafe_forward" in message and "mmcv.ops.carafe" in message
    assert "MMCV_WITH_OPS=1" in message and "contribute a kernel" in message
    assert "argument" in out["type_error"]
    assert out["signature"] == [
        "features", "masks", "rfeatures", "routput", "rmasks", "output",
        "kernel_size", "group_size", "scale_factor",
    ]  # fmt: skip
    assert (out["reverted"], out["gone"], out["find_loader_after"]) == ("reverted", True, False)


def test_doctor_says_the_plugin_serves_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "ascend-patch"), "doctor", "--json"], capture_output=True, text=True, timeout=300
    )
    plugin = next(p for p in json.loads(done.stdout)["plugins"] if p["name"] == "mmcv")
    (rule,) = [r for r in plugin["rules"] if r["module"] == "mmcv._ext"]
    assert (rule["in_use"], rule["real_origin"]) == ("replacement", None)
    text = subprocess.run(
        [str(BIN / "ascend-patch"), "doctor"], capture_output=True, text=True, timeout=300
    ).stdout
    assert "mmcv._ext  served by plugin 'mmcv' (no real one installed)" in text
