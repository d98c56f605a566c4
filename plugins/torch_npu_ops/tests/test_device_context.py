"""``with torch.device(X)`` and ``torch.set_default_device(X)`` keep working with the factories wrapped.

torch hands those a ``DeviceContext`` mode that adds ``device=X`` to a call only when the
function is in ``torch.utils._device._device_constructors()``, a list torch builds once
(``lru_cache``) from the current ``torch.empty``, ``torch.zeros``, ... . Built after
``apply()``, it held FactoryDevices' wrappers, and no factory got the context device: inside
``with torch.device("meta")`` ``torch.empty(2)`` was on ``cpu`` -- for the rest of the
process, ``revert()`` included (transformers' ``from_pretrained`` meta-device checks failed).

Each case runs ``device_context_probe.py`` in a fresh interpreter, so torch builds its list
exactly when the case says, and compares every factory of torch's own list with plain torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


PROBE = Path(__file__).with_name("device_context_probe.py")
#: Factories every torch of the supported range makes on the context's meta device.
CORE = ("empty", "zeros", "ones", "full", "arange", "rand", "randn", "tensor", "as_tensor")


def _probe(mode: str, tmp_path: Path) -> dict[str, Any]:
    if mode == "run":
        cli = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
        assert cli is not None, "the ascend-patch command is not installed in this environment"
        command = [cli, "run", "--emulate-npu", str(PROBE), mode]
    else:
        command = [sys.executable, str(PROBE), mode]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    environment["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    result = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``probed(mode)``: the probe's findings in that mode, run once per module."""
    found: dict[str, dict[str, Any]] = {}

    def probe(mode: str) -> dict[str, Any]:
        if mode not in found:
            found[mode] = _probe(mode, tmp_path_factory.mktemp(mode))
        return found[mode]

    return probe


@pytest.fixture(scope="module")
def plain_torch(probed: Any) -> dict[str, Any]:
    """What plain torch does (no emulator, no patch), per factory."""
    measured: dict[str, Any] = probed("plain")["patched"]
    for where in ("context", "default"):
        assert [measured[where][name] for name in CORE] == ["meta"] * len(CORE), measured
        assert not [v for v in measured[where].values() if v.startswith("no arguments")], (
            "torch's factory list has a factory the probe cannot call: add its arguments"
        )
    return measured


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("run", id="ascend-patch-run"),
        pytest.param("cold", id="torch-list-built-after-apply"),
        pytest.param("warm", id="torch-list-built-before-apply"),
    ],
)
def test_every_factory_honours_the_context_device(mode, plain_torch, probed):
    found = probed(mode)
    for phase in ("patched", "reverted"):
        for where in ("context", "default"):
            assert found[phase][where] == plain_torch[where], (phase, where)
    # torch's own function is back after revert(), and its cache holds no wrapper.
    assert found["torch_function_restored"]
    assert found["wrappers_in_torch_cache"] == []


@pytest.mark.parametrize("mode", ["run", "cold"])
def test_the_npu_device_reaches_the_kernels(mode, probed):
    """``with torch.device("cuda")`` -> the NPU, seen where the emulator cannot hide it.

    An emulated NPU tensor is a CPU tensor, so a factory that lost the context device
    would still look right by its result; on an NPU it would land on the host. What the
    dispatcher receives shows it: every allocation must ask for the NPU.
    """
    npu = probed(mode)["patched"]["npu"]
    for where in ("context", "default"):
        assert npu[where], f"no allocation seen ({where})"
        assert all(device.startswith("npu") for device in npu[where]), (where, npu[where])
