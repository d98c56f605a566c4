"""The main demo: run a CUDA-written project unchanged, patched lazily and reversibly.

``examples/cuda_project`` imports ``fused_cuda_ops``, a compiled CUDA extension that
does not exist on this machine, so its training step cannot even be imported. A
migration package (the shape of ``migrate_to_ascend/`` in the layout of DrivingSDK's mx_driving.patcher) declares:

* an import rule serving ``fused_cuda_ops`` from a module factory (the original is
  never executed -- it does not exist);
* a patch on ``RMSNorm.forward`` with a ``runtime_check``: small inputs take the
  replacement, anything else falls back to the original;

and ``apply()`` is called *before* the project is imported, without importing it.
Part two runs ``examples/torch_amp_loop/train.py`` -- a plain CUDA training loop
with AMP, ``.cuda()`` and ``torch.cuda`` calls -- unmodified under ``ascend-patch run
--emulate-npu``: the installed torch plugin redirects its CUDA calls to ``torch.npu``,
which the NPU emulator provides on the CPU. Its losses are compared with a CPU
reference run of the same script. Everything there is *emulated*: the NPU code paths
run, on the CPU, with no claim about NPU speed.

Run with ``python3 dev.py demo``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

import ascend_patch_core
from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch
from ascend_patch_core import Patcher


sys.path.insert(0, str(Path(__file__).resolve().parent / "cuda_project"))


def build_fused_ops(name: str) -> types.ModuleType:
    """Stands in for the CUDA extension: the same functions, as plain torch."""
    module = types.ModuleType(name)

    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    module.rms_norm = rms_norm  # type: ignore[attr-defined]
    return module


def rms_norm_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    # On an NPU this would be torch_npu.npu_rms_norm(x, self.weight, self.eps)[0].
    return torch.nn.functional.rms_norm(x, x.shape[-1:], self.weight, self.eps)


class FusedRMSNorm(Patch):
    """Route RMSNorm to a fused kernel when the input is one it supports."""

    @classmethod
    def patches(cls, options: object = None) -> list[AtomicPatch]:
        return [
            AtomicPatch(
                "cuda_project.layers.RMSNorm.forward",
                rms_norm_forward,
                runtime_check=lambda self, x: x.dim() == 2,
            )
        ]


def main() -> int:
    print(f"ascend-patch {ascend_patch_core.__version__} demo (CPU; no NPU involved)\n")
    try:
        import train
    except ModuleNotFoundError as exc:
        print(f"1. unpatched: importing the project fails: {exc}\n")

    patcher = Patcher().replace_import("fused_cuda_ops", build_fused_ops).add(FusedRMSNorm)
    report = patcher.apply()
    assert "cuda_project.layers" not in sys.modules, "apply() imported nothing"
    print("2. apply() before the project is imported -- everything waits for its import:")
    print(report.table() + "\n")

    import train  # the project's own, unmodified code

    loss = train.main()
    print(f"3. the unmodified training step runs: loss = {loss:.6f}")
    print(patcher.report.table(verbose=True) + "\n")

    patcher.disable("FusedRMSNorm")
    reference = train.main()
    print("4. disable('FusedRMSNorm') after apply() reverts just that patch; the original")
    print(f"   forward (through the served fused_cuda_ops) gives loss = {reference:.6f}")
    assert abs(reference - loss) < 1e-6, (reference, loss)
    print("   -- the same number, so the replacement is faithful.\n")

    final = patcher.revert()
    print("5. revert() restores every original by identity:")
    print(final.table())
    from cuda_project.layers import RMSNorm

    assert RMSNorm.forward.__qualname__ == "RMSNorm.forward"
    print("\nRMSNorm.forward is the project's own again.\n")
    return run_cuda_example()


def run_cuda_example() -> int:
    """Part two: an unmodified CUDA training loop under `ascend-patch run --emulate-npu`."""
    example = Path(__file__).resolve().parent / "torch_amp_loop" / "train.py"
    print("6. examples/torch_amp_loop/train.py, a CUDA training loop nobody edited, run twice:")
    with tempfile.TemporaryDirectory() as tmp:
        common = ["--epochs", "3", "--checkpoint", str(Path(tmp) / "model.pt")]
        cpu_out, npu_out, report = (Path(tmp) / n for n in ("cpu.json", "npu.json", "report.json"))
        reference = [
            sys.executable,
            str(example),
            "--device",
            "cpu",
            "--out",
            str(cpu_out),
            *common,
        ]
        emulated = [
            sys.executable, "-m", "ascend_patch_core._cli", "run", "--emulate-npu",
            "--report", str(report), str(example), "--out", str(npu_out), *common,
        ]  # fmt: skip
        # Count the calls of every patch, not only of those with a runtime_check.
        counting = {**os.environ, "ASCEND_PATCH_COUNT_CALLS": "1"}
        for command, env in ((reference, None), (emulated, counting)):
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                print(done.stdout, done.stderr, sep="\n")
                return done.returncode
        cpu = json.loads(cpu_out.read_text())
        npu = json.loads(npu_out.read_text())
        print("   epoch   CPU reference   ascend-patch run --emulate-npu (emulated NPU)")
        for a, b in zip(cpu, npu, strict=True):
            if "epoch" in a:
                print(f"   {a['epoch']:>5}   {a['loss']:>13.6f}   {b['loss']:>13.6f}")
        same = all(
            abs(a.get("loss", 0) - b.get("loss", 0)) < 1e-5 for a, b in zip(cpu, npu, strict=True)
        )
        print(f"   same losses: {same}")
        records = json.loads(report.read_text())["processes"][0]["report"]["records"]
        redirected = sorted(
            (r["counters"]["replacement_calls"], r["name"])
            for r in records
            if r.get("counters") and r["counters"]["replacement_calls"]
        )
        shown = redirected[-8:]
        print(
            f"   CUDA calls redirected to torch.npu: {len(redirected)} patches called;"
            f" the {len(shown)} most called:"
            if len(shown) < len(redirected)
            else f"   CUDA calls redirected to torch.npu, by patch ({len(redirected)} patches):"
        )
        for calls, name in reversed(shown):
            print(f"   {calls:>6}  {name}")
        if len(shown) < len(redirected):
            rest = redirected[: -len(shown)]
            print(
                f"   {sum(c for c, _ in rest):>6}  in the other {len(rest)} patches"
                " (the run report lists every one)"
            )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
