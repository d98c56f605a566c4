"""The compressed causal mask: the op's documented triangle, one per device, shared, freeable."""

from __future__ import annotations

import threading

import pytest


torch = pytest.importorskip("torch")

from ascend_patch_transformers import attention_kernels  # noqa: E402
from ascend_patch_transformers import causal_mask  # noqa: E402
from ascend_patch_transformers.served import flash_attn  # noqa: E402


def test_the_mask_is_the_upper_triangle_true_masked_out() -> None:
    causal_mask.release()
    mask = causal_mask.compressed_causal_mask(torch.device("cpu"))
    assert mask.shape == (causal_mask.SIZE, causal_mask.SIZE) and mask.dtype == torch.bool
    assert torch.equal(mask, torch.ones_like(mask).triu(1))
    assert not mask[5, 5] and mask[5, 6] and not mask[6, 5]


def test_one_mask_per_device_for_both_attention_paths() -> None:
    causal_mask.release()
    first = causal_mask.compressed_causal_mask(torch.device("cpu"))
    assert causal_mask.compressed_causal_mask(torch.device("cpu")) is first
    # The flash_attn stand-in hands the op the cached mask (causal, and a sliding window)...
    for window in ((-1, -1), (3, 0)):
        assert flash_attn._band(True, window, torch.device("cpu"))["atten_mask"] is first
    # ... and the attention interface asks the same cache.
    assert attention_kernels.compressed_causal_mask is causal_mask.compressed_causal_mask


def test_release_forgets_the_masks() -> None:
    first = causal_mask.compressed_causal_mask(torch.device("cpu"))
    causal_mask.release()
    assert causal_mask.compressed_causal_mask(torch.device("cpu")) is not first


def test_threads_starting_together_share_one_mask() -> None:
    causal_mask.release()
    barrier = threading.Barrier(4)
    masks: list[object] = []

    def ask() -> None:
        barrier.wait()
        masks.append(causal_mask.compressed_causal_mask(torch.device("cpu")))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(mask) for mask in masks}) == 1
