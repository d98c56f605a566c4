"""The OpenMMLab 2.x stack imports and indexes its structures under ``ascend-patch run --emulate-npu``.

mmengine 0.10.7 decides at import that the device is ``npu`` (``torch_npu`` imports and
``torch.npu.is_available()``) and then evaluates ``torch.npu.BoolTensor`` and
``torch.npu.LongTensor`` in ``mmengine/structures/instance_data.py``; ``InstanceData``
indexing tests tensors against them. Before the emulator had torch_npu's legacy tensor
types, ``from mmdet.structures import DetDataSample`` stopped there with an
AttributeError, which stopped every mmdet/mmdet3d program under ``--emulate-npu``.

Runs in the nox session ``openmmlab_emulated`` (mmcv-lite 2.1.0, mmengine 0.10.7, mmdet
3.3.0: requirements/openmmlab-emulated.txt; mmcv-lite has no compiled ops, so
nothing here imports ``mmcv.ops``). Elsewhere it skips when that stack is
missing; in its session ASCEND_PATCH_TEST_REQUIRE=openmmlab-emulated makes a missing
stack a failure instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


STACK = ("mmcv", "mmengine", "mmdet")
_missing = [name for name in STACK if importlib.util.find_spec(name) is None]
if _missing:
    # A comma-separated list: the session also names what other test files require.
    if "openmmlab-emulated" in os.environ.get("ASCEND_PATCH_TEST_REQUIRE", "").split(","):
        raise ImportError(f"the OpenMMLab stack is incomplete here: missing {', '.join(_missing)}")
    pytest.skip(f"needs {', '.join(_missing)} (nox -s openmmlab_emulated)", allow_module_level=True)


SCRIPT = textwrap.dedent(
    """
    import json

    import torch
    from mmengine.device import get_device
    from mmengine.structures import InstanceData
    import mmengine.structures.instance_data as instance_data
    from mmdet.structures import DetDataSample
    from mmcv.cnn import ConvModule

    result = {"device": get_device(), "torch_npu": torch.npu.is_available()}
    result["bool_types"] = [t.__module__ + "." + t.__name__ for t in instance_data.BoolTypeTensor.__args__]

    instances = InstanceData(metainfo={"img_shape": (32, 32)})
    instances.bboxes = torch.rand(4, 4, device="npu") * 32
    instances.labels = torch.tensor([3, 1, 4, 1], device="npu")
    instances.names = ["a", "b", "c", "d"]
    keep = torch.npu.BoolTensor([1, 0, 1, 1])
    order = torch.npu.LongTensor([2, 0])
    result["by_mask"] = instances[keep].labels.tolist()
    result["names_by_mask"] = instances[keep].names
    result["by_index"] = instances[order].labels.tolist()
    result["bool_is_npu_type"] = isinstance(keep, torch.npu.BoolTensor)

    sample = DetDataSample(metainfo={"img_id": 7})
    sample.gt_instances = instances[keep]
    result["sample_labels"] = sample.gt_instances.labels.tolist()
    result["sample_boxes"] = list(sample.gt_instances.bboxes.shape)

    conv = ConvModule(3, 4, 3, padding=1, norm_cfg=dict(type="BN")).cuda()
    result["conv_out"] = list(conv(torch.rand(2, 3, 8, 8).cuda()).shape)
    print("RESULT " + json.dumps(result))
    """
)


def _ascend_patch() -> list[str]:
    script = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "ascend_patch_core._cli"]


def test_mmdet_structures_import_and_index_under_the_emulator(tmp_path):
    script = tmp_path / "openmmlab_probe.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("ASCEND_PATCH_RUN", None)
    out = subprocess.run(
        [*_ascend_patch(), "run", "--emulate-npu", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-6000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["device"] == "npu" and result["torch_npu"] is True
    assert result["bool_types"] == ["torch.BoolTensor", "torch.npu.BoolTensor"]
    assert result["by_mask"] == [3, 4, 1]
    assert result["names_by_mask"] == ["a", "c", "d"]
    assert result["by_index"] == [4, 3]
    assert result["bool_is_npu_type"] is True
    assert result["sample_labels"] == [3, 4, 1]
    assert result["sample_boxes"] == [3, 4]
    assert result["conv_out"] == [2, 4, 8, 8]
