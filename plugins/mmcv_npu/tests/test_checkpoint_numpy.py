"""MmengineCheckpointNumpy: mmengine's ``load_checkpoint`` of a checkpoint whose ``meta``
holds numpy objects, under torch >= 2.6 (``torch.load`` defaults to ``weights_only=True``).

Runs in the nox session ``openmmlab_emulated`` (mmengine 0.10.7, torch 2.13). Elsewhere
it skips when mmengine is missing; in that session ASCEND_PATCH_TEST_REQUIRE names
mmengine and a missing mmengine is a failure instead.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ascend_patch_core import Status


def require(module: str) -> Any:
    if "mmengine" in os.environ.get("ASCEND_PATCH_TEST_REQUIRE", "").split(","):
        return importlib.import_module(module)  # in its own session, missing is an error
    return pytest.importorskip(module)


torch = require("torch")
np = require("numpy")
require("mmengine")

from ascend_patch_mmcv.groups import MmengineCheckpointNumpy  # noqa: E402
from mmengine.runner import load_checkpoint  # noqa: E402
from mmengine.runner.checkpoint import CheckpointLoader  # noqa: E402


TARGET = "mmengine.runner.checkpoint:CheckpointLoader.load_checkpoint"


def save_checkpoint_with_numpy_meta(path: Path, model: Any) -> dict[str, Any]:
    """What CheckpointHook and user code save: numpy scalars and arrays in ``meta``."""
    meta = {
        "seed": np.int64(1234),
        "best_score": np.float32(0.75),
        "class_weights": np.arange(4, dtype=np.float64),
        "palette": np.array([[0, 255, 0]], dtype=np.uint8),
        "epoch": 3,
    }
    torch.save({"meta": meta, "state_dict": model.state_dict()}, path)
    return meta


def test_unpatched_mmengine_fails_on_numpy_meta_under_weights_only(tmp_path: Path) -> None:
    """The bug the group fixes is real with the torch installed here."""
    path = tmp_path / "epoch_3.pth"
    save_checkpoint_with_numpy_meta(path, torch.nn.Linear(3, 2))
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_checkpoint(torch.nn.Linear(3, 2), str(path))


def test_load_checkpoint_with_numpy_meta_loads_weights_and_meta(
    isolated_patcher: Any, tmp_path: Path
) -> None:
    original = CheckpointLoader.__dict__["load_checkpoint"]
    allowed_before = set(torch.serialization.get_safe_globals())
    source = torch.nn.Linear(3, 2)
    path = tmp_path / "epoch_3.pth"
    meta = save_checkpoint_with_numpy_meta(path, source)

    isolated_patcher.add(MmengineCheckpointNumpy).apply()
    assert isolated_patcher.report.get(TARGET).status is Status.APPLIED

    target = torch.nn.Linear(3, 2)
    checkpoint = load_checkpoint(target, str(path), map_location="cpu")
    for name, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[name], value, rtol=0, atol=0)
    assert checkpoint["meta"]["epoch"] == 3
    for key in ("seed", "best_score", "class_weights", "palette"):
        assert type(checkpoint["meta"][key]) is type(meta[key])
        np.testing.assert_array_equal(checkpoint["meta"][key], meta[key])

    # The allow-list lasted for the call only: a plain torch.load still refuses numpy.
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path)
    assert set(torch.serialization.get_safe_globals()) == allowed_before

    isolated_patcher.revert()
    assert CheckpointLoader.__dict__["load_checkpoint"] is original
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_checkpoint(torch.nn.Linear(3, 2), str(path))


def as_written_by_the_other_numpy(path: Path) -> Path:
    """``path`` as the other numpy major would have pickled it: ``numpy.core.multiarray``
    (numpy 1.x, which wrote most old checkpoints) <-> ``numpy._core.multiarray`` (numpy 2)."""
    names = (b"numpy._core.multiarray", b"numpy.core.multiarray")
    other = path.with_name("other-numpy-" + path.name)
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(other, "w") as copy:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename.endswith("data.pkl"):
                mine, theirs = names if names[0] in data else names[::-1]
                assert mine in data
                data = data.replace(mine, theirs)
            copy.writestr(item, data)
    return other


def test_checkpoint_pickled_by_the_other_numpy_major_loads(
    isolated_patcher: Any, tmp_path: Path
) -> None:
    source = torch.nn.Linear(3, 2)
    meta = save_checkpoint_with_numpy_meta(tmp_path / "epoch_3.pth", source)
    path = as_written_by_the_other_numpy(tmp_path / "epoch_3.pth")
    isolated_patcher.add(MmengineCheckpointNumpy).apply()
    checkpoint = load_checkpoint(torch.nn.Linear(3, 2), str(path), map_location="cpu")
    for key in ("seed", "best_score", "class_weights", "palette"):
        assert type(checkpoint["meta"][key]) is type(meta[key])
        np.testing.assert_array_equal(checkpoint["meta"][key], meta[key])


class NotAllowed:
    """A class nobody allow-listed: a checkpoint pickling it must still be refused."""

    def __init__(self) -> None:
        self.payload = 1


def test_weights_only_stays_on_for_everything_but_numpy(
    isolated_patcher: Any, tmp_path: Path
) -> None:
    allowed_before = set(torch.serialization.get_safe_globals())
    path = tmp_path / "evil.pth"
    torch.save({"meta": {"seed": np.int64(1), "other": NotAllowed()}, "state_dict": {}}, path)
    isolated_patcher.add(MmengineCheckpointNumpy).apply()
    with pytest.raises(pickle.UnpicklingError, match="NotAllowed"):
        load_checkpoint(torch.nn.Linear(3, 2), str(path))
    # Nor is an object array (it would unpickle arbitrary objects) let through.
    torch.save({"meta": {"names": np.array(["a", None], dtype=object)}, "state_dict": {}}, path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(torch.nn.Linear(3, 2), str(path))
    assert set(torch.serialization.get_safe_globals()) == allowed_before


def test_installed_plugin_applies_the_group_by_default(tmp_path: Path) -> None:
    """The user's way: ``apply()`` with the plugin installed, then mmengine's loader."""
    path = tmp_path / "epoch_3.pth"
    save_checkpoint_with_numpy_meta(path, torch.nn.Linear(3, 2))
    script = (
        "import ascend_patch_core, torch\n"
        "report = ascend_patch_core.apply()\n"
        "from mmengine.runner import load_checkpoint\n"
        f"checkpoint = load_checkpoint(torch.nn.Linear(3, 2), {str(path)!r})\n"
        "print('seed', int(checkpoint['meta']['seed']))\n"
        f"print(report.get({TARGET!r}).status.name)\n"
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "seed 1234" in done.stdout
    assert "APPLIED" in done.stdout
