"""One-off: spconv 2.3's CPU forward on the sparse-conv case of benchmarks/ext_ops.py.

Not part of the bench session (spconv is not in its requirements; its CPU path has no
backward). Run in a scratch environment holding torch and spconv::

    python -m venv /tmp/spv && /tmp/spv/bin/pip install torch==2.13.0 spconv
    OMP_NUM_THREADS=1 /tmp/spv/bin/python benchmarks/ext_spconv.py

The voxels are ext_ops.sparse_voxels' (same generator, same sites); one thread, as
spconv's CPU results vary run to run with more (issue 14).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import spconv
import spconv.pytorch as spconv_torch
import torch


sys.path.insert(0, str(Path(__file__).parent))
from ext_ops import sparse_voxels


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    indices, features = sparse_voxels(40_000, g)
    subm = spconv_torch.SubMConv3d(16, 16, 3, indice_key="subm1", bias=False)
    strided = spconv_torch.SparseConv3d(16, 32, 3, stride=2, padding=1, bias=False)
    best = float("inf")
    with torch.no_grad():
        for _ in range(4):
            start = time.perf_counter()
            tensor = spconv_torch.SparseConvTensor(features, indices, [41, 1600, 1408], 1)
            out = strided(subm(tensor))
            best = min(best, time.perf_counter() - start)
    print(
        f"spconv {spconv.__version__}: forward {best * 1000:.1f} ms, {out.features.shape[0]} out sites"
    )


if __name__ == "__main__":
    main()
