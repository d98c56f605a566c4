"""``torch.compile`` (inductor, the default backend) under ``ascend-patch run --emulate-npu``.

Every inductor compile failed under CudaApi + the emulator: inductor's cache key
(``CacheBase.get_system``) sees ``torch.cuda.is_available()`` (the NPU's, now) and, with
``torch.version.cuda`` unset, reads ``get_device_properties().gcnArchName``, a name
torch_npu's properties object has (None) and the emulated one lacked. See
docs/torch-plugin.md, "torch.compile".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _run(script: str, tmp_path: Path, timeout: int = 900) -> dict:
    cli = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
    assert cli is not None, "the ascend-patch command is not installed in this environment"
    (tmp_path / "prog.py").write_text(textwrap.dedent(script))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    environment["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    # A cache of its own: a compiled graph from another run must not hide a failure.
    environment["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    # Compiled in the process: inductor's default pool of compile workers starts
    # interpreters that each import torch, which for this two-layer model cost more
    # than the compile (on 2 cores, ~15 of the test's ~40 s).
    environment["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    result = subprocess.run(
        [cli, "run", "--emulate-npu", "prog.py"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    found: dict = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_inductor_sees_the_npus_properties_through_torch_cuda(tmp_path):
    found = _run(
        """
        import json
        import torch
        import torch_npu
        from torch._inductor.codecache import CacheBase

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        system = CacheBase.get_system()
        print(json.dumps({
            "same": props == torch.npu.get_device_properties(0),
            "gcnArchName": props.gcnArchName,
            "major": props.major,
            "system": system,
        }))
        """,
        tmp_path,
    )
    # torch.cuda answers with torch_npu's object itself: no invented CUDA capability.
    assert found["same"] and found["gcnArchName"] is None and found["major"] is None
    assert found["system"]["hash"]


MODEL = """
    import json
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.Linear(8, 16)
            self.second = torch.nn.Linear(16, 4)

        def forward(self, x):
            # Factories inside the compiled region go through the redirect's wrappers.
            position = torch.arange(x.shape[-1], device=x.device, dtype=x.dtype)
            scale = torch.full((x.shape[0], 1), 0.5, device=x.device)
            hidden = torch.nn.functional.gelu(self.first(x + position)) + x.new_zeros(16)
            # CUDA-written code names the device too: the redirect makes it the NPU's.
            return self.second(hidden) * scale + torch.ones(4, device="cuda")

    assert torch.cuda.is_available()  # CUDA-written code checks, then moves to "cuda"
    torch.manual_seed(0)
    eager = Net().cuda()
    compiled_model = Net().cuda()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(5, 8, device="cuda")

    expected = eager(x)
    expected.square().sum().backward()
    result = compiled(x)
    result.square().sum().backward()
    print(json.dumps({
        "output": (result - expected).abs().max().item(),
        "grads": max(
            (a.grad - b.grad).abs().max().item()
            for a, b in zip(compiled_model.parameters(), eager.parameters())
        ),
    }))
"""


@pytest.mark.slow
def test_torch_compile_of_a_model_runs_and_matches_eager(tmp_path):
    found = _run(MODEL, tmp_path)
    assert found["output"] < 1e-5
    assert found["grads"] < 1e-5
