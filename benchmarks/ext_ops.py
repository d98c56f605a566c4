"""The ``mmcv._ext`` provider's portable functions beside mmcv's compiled CPU kernels (issue 14).

Run with ``python benchmarks/ext_ops.py [--rounds N] [--json]`` in an environment
holding mmcv 2.1.0 built with its CPU ops and the project (nox -s openmmlab_cpu_ops's);
``benchmarks/run.py`` runs it that way as its section "mmcv._ext ops" (``--ext-python``).

Each case calls mmcv's own Python wrapper (``mmcv.ops.nms``, ``roi_align``,
``DeformConv2dFunction``, ...) twice per round, in a shuffled order: once with its
module's ``ext_module`` the compiled ``mmcv._ext``, once with it the module the plugin
serves where mmcv has none (every ``mmcv.ops`` module's ``ext_module`` is swapped for
the call), so both sides pay the same Python around the kernel. Where mmcv has no CPU
kernel the left side is mmcv's pure-PyTorch code (ms_deform_attn) or there is none
(sparse convolution: the portable time alone). One thread (mmcv's CPU kernels are
single-threaded); the best of the rounds is reported, as the machine is shared (the
ms_deform_attn cases, seconds a call, run once a side and are not warmed up).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import random
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any


#: (op, size, reference label or None, {side: call}, rounds)
Case = tuple[str, str, "str | None", dict[str, Callable[[], Any]], int]


def served_module() -> types.ModuleType:
    """What the plugin's provider serves as ``mmcv._ext`` (built beside the real one)."""
    from ascend_patch_mmcv.served.mmcv_ext.provider import build_module

    module = types.ModuleType("mmcv._ext (served)")
    module.__dict__.update(build_module("mmcv._ext"))
    return module


class ExtSwitch:
    """Points every imported ``mmcv.ops`` module's ``ext_module`` at one ``_ext``."""

    def __init__(self) -> None:
        import mmcv._ext as compiled
        import mmcv.ops  # noqa: F401  (every op module imported)

        self.compiled = compiled
        self.served = served_module()
        self.modules = [
            m
            for name, m in sorted(sys.modules.items())
            if name.startswith("mmcv.ops.") and hasattr(m, "ext_module")
        ]

    def use(self, ext: types.ModuleType) -> None:
        for module in self.modules:
            module.ext_module = ext

    def wrap(self, side: str, call: Callable[[], Any]) -> Callable[[], Any]:
        ext = self.compiled if side == "mmcv" else self.served

        def run() -> Any:
            self.use(ext)
            try:
                return call()
            finally:
                self.use(self.compiled)

        return run


def _boxes(count: int, generator: Any, extent: float = 1000.0, side: float = 100.0) -> Any:
    import torch

    xy = torch.rand(count, 2, generator=generator) * extent
    wh = torch.rand(count, 2, generator=generator) * (side - 1) + 1
    return torch.cat([xy, xy + wh], 1)


def _clusters(count: int, generator: Any) -> Any:
    import torch

    centres = torch.rand(20, 2, generator=generator) * 900 + 50
    which = torch.randint(0, 20, (count,), generator=generator)
    xy = centres[which] + torch.randn(count, 2, generator=generator) * 8
    return torch.cat([xy - 30, xy + 30], 1)


def _backward(make: Callable[[], Any], inputs: list[Any]) -> Callable[[], Any]:
    def run() -> Any:
        out = make()
        out.backward(torch_ones_like(out))
        for tensor in inputs:
            tensor.grad = None

    return run


def torch_ones_like(tensor: Any) -> Any:
    import torch

    return torch.ones_like(tensor)


def _ops(name: str) -> Any:
    """The module ``mmcv.ops.<name>`` (``mmcv.ops`` re-exports functions of the same names)."""
    return importlib.import_module(f"mmcv.ops.{name}")


def cases(switch: ExtSwitch) -> list[Case]:
    import torch

    nms, roi_align, bbox, points_in_boxes, voxelize = map(
        _ops, ["nms", "roi_align", "bbox", "points_in_boxes", "voxelize"]
    )
    deform_conv, modulated_deform_conv = _ops("deform_conv"), _ops("modulated_deform_conv")
    msda = _ops("multi_scale_deform_attn")
    MultiScaleDeformableAttnFunction = msda.MultiScaleDeformableAttnFunction
    multi_scale_deformable_attn_pytorch = msda.multi_scale_deformable_attn_pytorch

    g = torch.Generator().manual_seed(0)
    out: list[Case] = []

    def both(op: str, size: str, call: Callable[[], Any], rounds: int = 5) -> None:
        sides = {side: switch.wrap(side, call) for side in ("mmcv", "portable")}
        out.append((op, size, "compiled CPU kernel", sides, rounds))

    # nms family
    spread, clustered = _boxes(10_000, g), _clusters(10_000, g)
    scores = torch.rand(10_000, generator=g)
    both("nms", "10 000 boxes spread over 1000x1000 px, IoU 0.5",
         lambda: nms.nms(spread, scores, 0.5))  # fmt: skip
    both("nms", "10 000 boxes in 20 clusters, IoU 0.5", lambda: nms.nms(clustered, scores, 0.5))
    few, few_scores = spread[:1000].clone(), scores[:1000].clone()
    both("softnms", "1 000 boxes spread, gaussian",
         lambda: nms.soft_nms(few, few_scores, 0.3, sigma=0.5, min_score=1e-3, method="gaussian"))  # fmt: skip

    # roi_align
    feature = torch.rand(2, 256, 64, 64, generator=g, requires_grad=True)
    xy = torch.rand(512, 2, generator=g) * 400
    rois = torch.cat(
        [torch.randint(0, 2, (512, 1), generator=g).float(), xy,
         xy + torch.rand(512, 2, generator=g) * 100 + 8], 1
    )  # fmt: skip
    for mode, ratio in (("avg", 0), ("max", 2)):
        args = (rois, (7, 7), 0.125, ratio, mode, True)
        size = f"512 rois 7x7 on 2x256x64x64, {mode}, sampling ratio {ratio}"
        both("roi_align forward", size, lambda a=args: roi_align.roi_align(feature.detach(), *a))
        both("roi_align forward + backward", size,
             _backward(lambda a=args: roi_align.roi_align(feature, *a), [feature]))  # fmt: skip

    # bbox_overlaps: mmcv.ops.bbox_overlaps calls ext_module.bbox_overlaps on CPU
    first, second = _boxes(2000, g), _boxes(2000, g)
    both("bbox_overlaps", "2000 x 2000 boxes", lambda: bbox.bbox_overlaps(first, second))

    # deformable convolutions
    x = torch.rand(2, 128, 64, 64, generator=g, requires_grad=True)
    offset = (torch.randn(2, 18, 64, 64, generator=g) * 2).requires_grad_()
    mask = torch.rand(2, 9, 64, 64, generator=g, requires_grad=True)
    weight = (torch.randn(128, 128, 3, 3, generator=g) * 0.05).requires_grad_()
    bias = torch.zeros(128, requires_grad=True)
    size = "2x128x64x64, 3x3, 128 out"

    def dcn() -> Any:
        return deform_conv.deform_conv2d(x, offset, weight, 1, 1, 1, 1, 1, False, 32)

    def mdcn() -> Any:
        return modulated_deform_conv.modulated_deform_conv2d(
            x, offset, mask, weight, bias, 1, 1, 1, 1, 1
        )

    with_grad = [x, offset, mask, weight, bias]
    both("deform_conv forward", size, lambda: _no_grad(dcn), rounds=3)
    both("deform_conv forward + backward", size, _backward(dcn, with_grad), rounds=3)
    both("modulated_deform_conv forward", size, lambda: _no_grad(mdcn), rounds=3)
    both("modulated_deform_conv forward + backward", size, _backward(mdcn, with_grad), rounds=3)

    # ms_deform_attn, BEVFormer-sized: 6 cameras x 5000 queries (30 000), 4 levels.
    shapes = torch.tensor([[58, 100], [29, 50], [15, 25], [8, 13]])
    starts = torch.cat((shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]))
    cams, queries, heads, dims, points = 6, 5000, 8, 32, 8
    value = torch.rand(cams, int(shapes.prod(1).sum()), heads, dims, generator=g)
    locations = torch.rand(cams, queries, heads, 4, points, 2, generator=g)
    attention = torch.rand(cams, queries, heads, 4, points, generator=g).softmax(-1)
    msda_inputs = [t.requires_grad_() for t in (value, locations, attention)]
    msda_size = "6 cameras x 5000 queries, 8 heads x 32, 4 levels (58x100..8x13), 8 points"

    def msda_pytorch() -> Any:
        return multi_scale_deformable_attn_pytorch(value, shapes, locations, attention)

    def msda_served() -> Any:
        return MultiScaleDeformableAttnFunction.apply(
            value, shapes, starts, locations, attention, 64
        )

    reference = "mmcv's multi_scale_deformable_attn_pytorch (no CPU kernel)"
    out.append(("ms_deform_attn forward", msda_size, reference,
                {"mmcv": lambda: _no_grad(msda_pytorch),
                 "portable": switch.wrap("portable", lambda: _no_grad(msda_served))}, 1))  # fmt: skip
    out.append(("ms_deform_attn forward + backward", msda_size, reference,
                {"mmcv": _backward(msda_pytorch, msda_inputs),
                 "portable": switch.wrap("portable", _backward(msda_served, msda_inputs))},
                1))  # fmt: skip

    # voxelization and points
    cloud = torch.rand(100_000, 4, generator=g) * torch.tensor([70.4, 80, 4, 1])
    cloud -= torch.tensor([0, 40, 3, 0])
    for grid, voxel_size, max_points, max_voxels in (
        ("SECOND grid 1408x1600x40", [0.05, 0.05, 0.1], 5, 16000),
        ("PointPillars grid 432x496x1", [0.16, 0.16, 4], 32, 16000),
    ):
        both("hard_voxelize_forward", f"100 000 points, {grid}",
             lambda v=voxel_size, p=max_points, m=max_voxels: voxelize.voxelization(
                 cloud, v, [0, -40, -3, 70.4, 40, 1], p, m, True))  # fmt: skip
    centres = torch.rand(1, 50, 3, generator=g) * torch.tensor([60.0, 70, 2]) + torch.tensor(
        [5.0, -35, -2]
    )
    dims3 = torch.rand(1, 50, 3, generator=g) * 3 + 1
    boxes3 = torch.cat([centres, dims3, torch.rand(1, 50, 1, generator=g) * 6.28], 2)
    both("points_in_boxes_cpu", "100 000 points x 50 boxes",
         lambda: points_in_boxes.points_in_boxes_cpu(cloud[None, :, :3].contiguous(), boxes3))  # fmt: skip

    out.extend(sparse_cases(switch, g))
    return out


def sparse_voxels(count: int, generator: Any) -> tuple[Any, Any]:
    """``count`` distinct active sites of a SECOND grid (41 x 1600 x 1408), 16 features."""
    import torch

    shape = torch.tensor([41, 1600, 1408])
    flat = torch.randperm(int(shape.prod()), generator=generator)[:count].sort().values
    z, rest = flat // (1600 * 1408), flat % (1600 * 1408)
    indices = torch.stack([torch.zeros_like(z), z, rest // 1408, rest % 1408], 1).int()
    return indices, torch.rand(count, 16, generator=generator)


def sparse_cases(switch: ExtSwitch, g: Any) -> list[Case]:
    """SubMConv3d then a strided SparseConv3d on 40 000 voxels: portable only."""
    import torch
    from mmcv.ops import SparseConv3d
    from mmcv.ops import SparseConvTensor
    from mmcv.ops import SubMConv3d

    indices, features = sparse_voxels(40_000, g)
    subm = SubMConv3d(16, 16, 3, indice_key="subm1", bias=False)
    strided = SparseConv3d(16, 32, 3, stride=2, padding=1, bias=False)
    feats = features.requires_grad_()

    def layers() -> Any:
        tensor = SparseConvTensor(feats, indices, [41, 1600, 1408], 1)
        return strided(subm(tensor)).features

    def forward() -> Any:
        return _no_grad(switch.wrap("portable", layers))

    def forward_backward() -> Any:
        switch.use(switch.served)
        try:
            out = layers()
            out.backward(torch.ones_like(out))
            feats.grad = None
            subm.weight.grad = strided.weight.grad = None
        finally:
            switch.use(switch.compiled)

    size = (
        "40 000 voxels in 41x1600x1408: SubMConv3d 16->16 3x3x3, then SparseConv3d 16->32 "
        "stride 2 (indice pairs included)"
    )
    return [
        ("sparse conv forward", size, None, {"portable": forward}, 3),
        ("sparse conv forward + backward", size, None, {"portable": forward_backward}, 3),
    ]


def _no_grad(call: Callable[[], Any]) -> Any:
    import torch

    with torch.no_grad():
        return call()


def measure(selected: list[Case], rounds: int) -> list[dict[str, Any]]:
    """Best time per case and side (ms), sides interleaved in a shuffled order per round."""
    best: dict[tuple[int, str], float] = {}
    for index, (_, _, _, sides, case_rounds) in enumerate(selected):
        if case_rounds > 2:  # heavy cases (seconds a call) are not warmed up
            for call in sides.values():
                call()  # warm-up (first-call allocations, lazy imports)
        for _ in range(min(rounds, case_rounds)):
            order = list(sides)
            random.shuffle(order)
            for side in order:
                start = time.perf_counter()
                sides[side]()
                seconds = time.perf_counter() - start
                key = (index, side)
                best[key] = min(best.get(key, math.inf), seconds)
        print(f"{selected[index][0]}: done", file=sys.stderr, flush=True)
    rows = []
    for index, (op, size, reference, _, _) in enumerate(selected):
        mmcv = best.get((index, "mmcv"))
        portable = best[index, "portable"]
        rows.append(
            {
                "op": op,
                "size": size,
                "reference": reference,
                "mmcv_ms": None if mmcv is None else round(mmcv * 1000, 2),
                "portable_ms": round(portable * 1000, 2),
                "ratio": None if mmcv is None else round(portable / mmcv, 2),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], rounds: int) -> str:
    import platform

    import mmcv
    import torch

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')}: mmcv {mmcv.__version__} (compiled CPU ops), "
        f"torch {torch.__version__}, Python {platform.python_version()}, one thread, best of "
        f"up to {rounds} rounds.",
        "",
        "| op | size | mmcv (ms) | portable (ms) | portable / mmcv |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        mmcv_ms = "--" if row["mmcv_ms"] is None else f"{row['mmcv_ms']:g}"
        ratio = "--" if row["ratio"] is None else f"{row['ratio']:.2f}"
        if row["ratio"] is not None and row["ratio"] > 2:
            ratio = f"**{ratio}**"
        note = "" if row["reference"] in (None, "compiled CPU kernel") else " [1]"
        lines.append(f"| {row['op']}{note} | {row['size']} | {mmcv_ms} | {row['portable_ms']:g} "
                     f"| {ratio} |")  # fmt: skip
    lines += [
        "",
        "[1] mmcv has no CPU kernel: its pure-PyTorch path instead. `--`: no CPU reference "
        "in mmcv (portable time alone).",
    ]
    return "\n".join(lines)


#: Where benchmarks/run.py writes this section in docs/benchmarks.md.
BEGIN, END = "<!-- ext results -->", "<!-- /ext results -->"
HOW_TO_GET = (
    "run `python3 dev.py -s openmmlab_cpu_ops` once (it builds mmcv 2.1.0 with its CPU "
    "ops into .nox/openmmlab_cpu_ops), or pass `--ext-python` an interpreter holding mmcv "
    "with its compiled ops and the project"
)


def default_python(root: Path) -> str | None:
    """$ASCEND_PATCH_EXT_BENCH_PYTHON, else nox's openmmlab_cpu_ops environment if built."""
    named = os.environ.get("ASCEND_PATCH_EXT_BENCH_PYTHON")
    if named:
        return named
    built = root / ".nox" / "openmmlab_cpu_ops" / ("Scripts" if os.name == "nt" else "bin")
    python = built / ("python.exe" if os.name == "nt" else "python")
    return str(python) if python.exists() else None


def section(python: str | None, rounds: int, root: Path) -> str:
    """This benchmark run in ``python`` (a fresh interpreter): its table, or why not."""
    if python is None:
        return f"Skipped: no Python with mmcv's compiled CPU ops found; {HOW_TO_GET}."
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [python, str(Path(__file__)), "--json", "--rounds", str(rounds)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"Failed in {python}: {error}"
    text: str = json.loads(done.stdout.strip().splitlines()[-1])["markdown"]
    return text


def write(target: Path, text: str) -> None:
    """Replace the generated block of docs/benchmarks.md's mmcv._ext section."""
    page = target.read_text()
    head, found, rest = page.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"{target} has no {BEGIN} ... {END} block to write into")
    target.write_text(f"{head}{BEGIN}\n\n{text}\n\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON line")
    parser.add_argument("-k", default="", help="only the cases whose op contains this")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    random.seed(0)
    switch = ExtSwitch()
    selected = [case for case in cases(switch) if args.k in case[0]]
    rows = measure(selected, args.rounds)
    if args.json:
        print(json.dumps({"rows": rows, "markdown": markdown(rows, args.rounds)}))
    else:
        print(markdown(rows, args.rounds))


if __name__ == "__main__":
    main()
