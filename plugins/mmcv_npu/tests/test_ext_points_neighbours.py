"""``mmcv._ext`` neighbour queries (ball query, knn, three_nn) against explicit references.

Runs in the nox session ``openmmlab_cpu_ops`` (mmcv 2.1.0 has no CPU kernel for these).
The references, written here after mmcv's CUDA kernels (naive loops on tiny inputs):

- ball query: the first ``nsample`` indices with ``d2 == 0`` or ``min² <= d2 < max²``,
  the row filled with the first one; rows without any are left as the caller made them;
- knn: the nearest ``k`` by squared distance, ascending (distinct distances here),
  written ``[B, m, k]``; missing neighbours are index 0 at distance 1e10; both of mmcv's
  pybind spellings bind, other calls raise TypeError as pybind does;
- three_nn: the three nearest, ascending, equal distances by lowest index (the kernel's
  strict-< insertion); missing ones are index 0 at distance inf.

Tolerances: indices exact; float32 distances 1e-5; fp16 inputs against the float32
results with half tolerances. mmcv's own Python (``mmcv.ops.ball_query``, ``three_nn``)
runs on the family (its ``ext_module`` replaced); ``mmcv.ops.knn`` needs CUDA, so knn is
called as mmcv/ops/knn.py calls it.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import torch  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import points as family  # noqa: E402


TOL = {"atol": 1e-5, "rtol": 1e-5}
OURS = SimpleNamespace(**{name: getattr(family, name) for name in family.__all__})


@pytest.fixture
def with_ours(monkeypatch):
    """mmcv's op modules calling this family instead of the compiled extension."""
    for name in ("ball_query", "three_nn"):
        monkeypatch.setattr(importlib.import_module(f"mmcv.ops.{name}"), "ext_module", OURS)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _ball_reference(centres, cloud, low, high, nsample, fill):
    out = fill.clone()
    for b in range(centres.shape[0]):
        for j in range(centres.shape[1]):
            d2 = ((cloud[b] - centres[b, j]) ** 2).sum(1)
            hits = [k for k in range(cloud.shape[1]) if d2[k] == 0 or (low**2 <= d2[k] < high**2)]
            hits = hits[:nsample]
            if hits:
                out[b, j] = torch.tensor(hits + [hits[0]] * (nsample - len(hits)))
    return out


@pytest.mark.parametrize(
    ("b", "n", "m", "low", "high", "nsample"),
    [
        (2, 80, 16, 0.0, 0.3, 8),
        (1, 50, 10, 0.1, 0.4, 5),
        (2, 6, 4, 0.0, 2.0, 10),
        (1, 30, 5, 0.0, 0.01, 4),
    ],
)
def test_ball_query_matches_the_reference(with_ours, b, n, m, low, high, nsample):
    from mmcv.ops import ball_query

    cloud = torch.rand(b, n, 3, generator=_gen(n + m))
    centres = torch.cat(
        (cloud[:, : m // 2], torch.rand(b, m - m // 2, 3, generator=_gen(1))), 1
    ).contiguous()
    idx = ball_query(low, high, nsample, cloud, centres)
    expected = _ball_reference(
        centres, cloud, low, high, nsample, torch.zeros(b, m, nsample, dtype=torch.int32)
    )
    assert idx.dtype == torch.int32 and torch.equal(idx, expected)


def test_ball_query_leaves_rows_without_neighbours():
    cloud = torch.rand(1, 20, 3, generator=_gen(2))
    centres = torch.full((1, 3, 3), 50.0)
    centres[0, 1] = cloud[0, 4]
    idx = torch.full((1, 3, 4), -3, dtype=torch.int32)
    family.ball_query_forward(
        centres, cloud, idx, b=1, n=20, m=3, min_radius=0.0, max_radius=0.001, nsample=4
    )
    assert idx[0, 0].tolist() == [-3] * 4 and idx[0, 2].tolist() == [-3] * 4
    assert idx[0, 1].tolist() == [4] * 4


def _knn_call(cloud, centres, k, **spelling):
    b, n, m = cloud.shape[0], cloud.shape[1], centres.shape[1]
    idx = torch.zeros(b, m, k, dtype=torch.int32)
    dist2 = torch.zeros(b, m, k)
    if spelling.get("second"):
        family.knn_forward(
            b=cloud,
            n=centres,
            m=idx,
            nsample=dist2,
            xyz_tensor=b,
            new_xyz_tensor=n,
            idx_tensor=m,
            dist2_tensor=k,
        )
    elif spelling.get("positional"):
        family.knn_forward(cloud, centres, idx, dist2, b, n, m, k)
    else:  # mmcv/ops/knn.py's call
        family.knn_forward(cloud, centres, idx, dist2, b=b, n=n, m=m, nsample=k)
    return idx, dist2


@pytest.mark.parametrize("spelling", [{}, {"positional": True}, {"second": True}])
@pytest.mark.parametrize(
    ("b", "n", "m", "k"), [(2, 50, 20, 8), (1, 5, 3, 5), (1, 3, 2, 6), (2, 200, 7, 1)]
)
def test_knn_matches_the_reference(b, n, m, k, spelling):
    cloud = torch.rand(b, n, 3, generator=_gen(n))
    centres = torch.rand(b, m, 3, generator=_gen(m + 100))
    idx, dist2 = _knn_call(cloud, centres, k, **spelling)
    for batch in range(b):
        for j in range(m):
            d2 = [float(((cloud[batch, i] - centres[batch, j]) ** 2).sum()) for i in range(n)]
            order = sorted(range(n), key=lambda i, d2=d2: (d2[i], i))[:k]
            want_idx = order + [0] * (k - len(order))
            want_d2 = [d2[i] for i in order] + [1e10] * (k - len(order))
            assert idx[batch, j].tolist() == want_idx
            torch.testing.assert_close(dist2[batch, j], torch.tensor(want_d2), **TOL)


def test_knn_rejects_other_calls_as_mmcv_does():
    with pytest.raises(TypeError, match="incompatible"):
        family.knn_forward(1, 5, 2, 2, torch.rand(1, 5, 3))


def _three_nn_reference(targets, known):
    b, n, m = targets.shape[0], targets.shape[1], known.shape[1]
    dist = torch.full((b, n, 3), float("inf"))
    idx = torch.zeros(b, n, 3, dtype=torch.int32)
    for batch in range(b):
        for i in range(n):
            best = [(float("inf"), 0)] * 3
            for k in range(m):  # the kernel's strict-< insertion
                d = float(((targets[batch, i] - known[batch, k]) ** 2).sum())
                if d < best[0][0]:
                    best = [(d, k), best[0], best[1]]
                elif d < best[1][0]:
                    best = [best[0], (d, k), best[1]]
                elif d < best[2][0]:
                    best = [best[0], best[1], (d, k)]
            dist[batch, i] = torch.tensor([d for d, _ in best])
            idx[batch, i] = torch.tensor([k for _, k in best])
    return dist, idx


@pytest.mark.parametrize(("b", "n", "m"), [(2, 40, 12), (1, 10, 2), (1, 4, 1), (1, 20, 20)])
def test_three_nn_matches_the_reference(with_ours, b, n, m):
    from mmcv.ops import three_nn

    known = torch.rand(b, m, 3, generator=_gen(m))
    if m >= 4:
        known[:, m // 2 :] = known[:, : m - m // 2].clone()  # equal distances: lowest index first
    targets = torch.rand(b, n, 3, generator=_gen(n))
    dist, idx = three_nn(targets, known)
    expected_dist, expected_idx = _three_nn_reference(targets, known)
    assert torch.equal(idx, expected_idx)
    torch.testing.assert_close(dist, torch.sqrt(expected_dist), **TOL)


def test_fp16_inputs_follow_the_float32_results():
    """mmcv's CUDA kernels take half here; the arithmetic is half, so half tolerances."""
    cloud = torch.rand(2, 60, 3, generator=_gen(31))
    centres = cloud[:, :10].contiguous()
    results = {}
    for dtype in (torch.float32, torch.float16):
        idx = torch.zeros(2, 10, 6, dtype=torch.int32)
        family.ball_query_forward(centres.to(dtype), cloud.to(dtype), idx, 2, 60, 10, 0.0, 0.25, 6)
        dist = torch.zeros(2, 60, 3, dtype=dtype)
        nearest = torch.zeros(2, 60, 3, dtype=torch.int32)
        family.three_nn_forward(cloud.to(dtype), centres.to(dtype), dist, nearest, 2, 60, 10)
        results[dtype] = (idx, dist, nearest)
    (idx32, dist32, nn32), (idx16, dist16, nn16) = results[torch.float32], results[torch.float16]
    # indices may differ only where half rounding reorders nearly equal distances
    assert (idx16 == idx32).float().mean() > 0.95 and (nn16 == nn32).float().mean() > 0.95
    same = (nn16 == nn32).all(2, keepdim=True)
    torch.testing.assert_close(dist16.float() * same, dist32 * same, atol=2e-3, rtol=2e-3)
