"""brake_at under torchrun: two ranks (gloo, CPU) stop at the same step with exit status 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch  # noqa: F401  (a test requirement: missing must fail, not skip)


SCRIPT = textwrap.dedent(
    """
    import atexit
    import json
    import sys
    import time
    from pathlib import Path

    from ascend_patch_core import Patcher

    out = Path(sys.argv[1])
    Patcher().brake_at(3).with_profiling(
        str(out / "trace"), skip_first=0, wait=0, warmup=1, active=1, repeat=0
    ).apply()

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters())
    iterations = []

    def report():
        state = optimizer.state[next(model.parameters())]
        record = {"adam_steps": int(state["step"]), "iterations": len(iterations)}
        (out / f"rank{rank}.json").write_text(json.dumps(record))

    atexit.register(report)
    for i in range(20):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        if rank == 1:
            time.sleep(0.05)  # rank 1 lags: rank 0 must wait for it at the barrier
        optimizer.step()
        iterations.append(i)
    print("the loop ran to its end", flush=True)
    """
)


@pytest.mark.slow
def test_both_ranks_stop_at_step_n_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the loop ran to its end" not in result.stdout
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record == {"adam_steps": 3, "iterations": 2}, rank
    # The message comes once, from rank 0; each rank wrote its own trace of step 2.
    assert result.stderr.count("brake_at(3): training step 3 ended") == 1
    traces = list((tmp_path / "trace").glob("*.pt.trace.json"))
    assert len(traces) == 2
