"""NPU storage formats as torch_npu keeps them: per storage, with torch_npu's cast rules.

Facts from torch_npu's ``FormatCastKernelNpu.cpp``/``InferFormat.cpp`` and its
``test_npu_format.py``/``test_npu_format_cast.py``: a cast to the current format
returns the input (same storage); base-format casts relabel the input; NZ needs a
storage of rank >= 2; ``Format`` is an ``IntEnum``; ``_C._weak_ref_tensor`` aliases.
"""

from __future__ import annotations

import copy
import enum
import gc
import warnings

import pytest
import torch


ND, NCHW, NHWC, NZ, NCDHW, NC1HWC0 = 2, 0, 1, 29, 30, 3


@pytest.fixture
def npu(emulated):
    import torch_npu

    return torch_npu


def test_format_is_an_int_enum_and_get_npu_format_returns_members(npu):
    assert issubclass(npu.Format, enum.IntEnum)
    assert npu.Format.NCHW.value == 0 and npu.Format.NHWC.value == 1
    assert npu.Format.FRACTAL_NZ == 29 and str(npu.Format.FRACTAL_NZ) == "FRACTAL_NZ"
    assert npu.Format(54) is npu.Format.FRACTAL_NZ_C0_8
    found = npu.get_npu_format(torch.ones(2, 2))
    assert found is npu.Format.ND and found == 2
    # the op itself answers a plain int, as torch.ops.npu.get_npu_format does upstream
    assert type(torch.ops.npu.get_npu_format(torch.ones(2, 2))) is int


def test_default_formats_follow_the_rank(npu):
    assert npu.get_npu_format(torch.ones(3)) == ND
    assert npu.get_npu_format(torch.ones(2, 3)) == ND
    assert npu.get_npu_format(torch.ones(1, 2, 3, 4)) == NCHW
    assert npu.get_npu_format(torch.ones(1, 2, 3, 4, 5)) == NCDHW


def test_cast_to_the_current_format_returns_the_input(npu):
    t = torch.rand(4, 8)
    assert npu.npu_format_cast(t, ND) is t
    nz = npu.npu_format_cast(t, NZ)
    assert nz is not t and nz.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    again = npu.npu_format_cast(nz, NZ)
    assert again is nz
    assert npu.npu_format_cast(t, nz) is not t  # Tensor overload: dst's format
    assert npu.npu_format_cast(nz, torch.rand(4, 8)) is not nz


def test_same_format_cast_keeps_autograd(npu):
    a = torch.rand(4, 8, requires_grad=True)
    b = npu.npu_format_cast(a, npu.get_npu_format(a))
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    b.sum().backward()
    assert torch.equal(a.grad, torch.ones(4, 8))
    c = npu.npu_format_cast(a, NZ)
    assert c.requires_grad
    (c * 3).sum().backward()
    assert torch.equal(a.grad, torch.full((4, 8), 4.0))


def test_base_format_cast_relabels_the_input_in_place(npu):
    t = torch.ones(2, 2)
    out = npu.npu_format_cast(t, NCHW)
    assert out is t
    assert npu.get_npu_format(t) == NCHW  # torch_npu relabels the storage itself
    assert npu.get_npu_format(npu.npu_format_cast(t, NHWC)) == NHWC


def test_format_lives_on_the_storage(npu):
    t = npu.npu_format_cast(torch.rand(4, 16), NZ)
    assert npu.get_npu_format(t.detach()) == NZ
    assert npu.get_npu_format(t.view(2, 2, 16)) == NZ
    assert npu.get_npu_format(t.reshape(-1)) == NZ
    assert npu.get_npu_format(t[1:]) == NZ
    t.add_(1)
    t.mul_(2)
    assert npu.get_npu_format(t) == NZ
    assert npu.get_npu_format(t.clone()) == ND  # a new storage, made by a plain torch op


def test_deepcopy_keeps_the_format_on_the_copy(npu):
    t = npu.npu_format_cast(torch.rand(4, 16), NZ)
    copied = copy.deepcopy(t)
    assert copied.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    assert npu.get_npu_format(copied) == NZ and torch.equal(copied, t)
    memo_shared = copy.deepcopy({"a": t, "b": t.view(-1)})
    assert npu.get_npu_format(memo_shared["b"]) == NZ


def test_freed_storage_takes_its_format_with_it(npu):
    from ascend_patch_emulator._kernels import layout

    before = len(layout._descs)
    for _ in range(50):
        t = npu.npu_format_cast(torch.rand(64, 64), NZ)
        assert npu.get_npu_format(t) == NZ
        del t
        # The young generation, where t is: a full collection walks the whole test
        # session's heap (~0.5 s each, 28 s for the loop in the full suite).
        gc.collect(0)
        fresh = torch.empty(64, 64)  # may reuse the freed memory
        assert npu.get_npu_format(fresh) == ND
    assert len(layout._descs) <= before + 1


def test_rank_one_storage_cannot_be_nz(npu):
    t = torch.rand(12)
    out = npu.npu_format_cast(t, NZ)
    assert out is t and npu.get_npu_format(out) == ND
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        npu.npu_format_cast_(t, NZ)
    assert npu.get_npu_format(t) == ND
    assert npu.get_npu_format(npu.npu_format_cast(torch.rand(2, 3), NZ)) == NZ
    assert npu.get_npu_format(npu.npu_format_cast(torch.rand(2, 3, 4), NZ)) == NZ


def test_internal_to_base_cast_follows_the_storage_rank(npu):
    nz4 = npu.npu_format_cast(torch.rand(2, 3, 16, 16), NZ)
    # GuessFormatUnit: a 4-D tensor in ND is created as NCHW
    assert npu.get_npu_format(npu.npu_format_cast(nz4, ND)) == NCHW
    nz2 = npu.npu_format_cast(torch.rand(16, 16), NZ)
    assert npu.get_npu_format(npu.npu_format_cast(nz2, NCHW)) == ND  # NCHW needs 4 dims
    assert npu.get_npu_format(npu.npu_format_cast(nz2, ND)) == ND


def test_unknown_format_is_refused(npu):
    with pytest.raises(RuntimeError, match="unknown format type:47"):
        npu.npu_format_cast(torch.rand(2, 3), npu.Format.NCL)


def test_inplace_cast_moves_self_to_a_new_storage(npu):
    t = torch.rand(8, 16)
    alias = t.view(-1)
    expected = t.clone()
    assert npu.npu_format_cast_(t, NZ) is t
    assert npu.get_npu_format(t) == NZ and torch.equal(t, expected)
    assert npu.get_npu_format(alias) == ND  # the old storage keeps its format
    npu.npu_format_cast_(t, ND)
    assert npu.get_npu_format(t) == ND and torch.equal(t, expected)


def test_inplace_cast_from_src_copies_values_and_keeps_self_format(npu):
    dst = npu.npu_format_cast(torch.zeros(4, 16), NZ)
    src = torch.rand(4, 16)
    assert npu.npu_format_cast_(dst, src) is dst
    assert torch.equal(dst, src) and npu.get_npu_format(dst) == NZ


def test_weak_ref_tensor_aliases_memory_and_keeps_the_format(npu):
    from torch_npu._C import _weak_ref_tensor

    base = torch.arange(3072, dtype=torch.float32)  # last element: 128 + 1536 + 7*192 + 63
    view = torch.as_strided(base, (2, 1, 8, 64), (1536, 0, 192, 1), 128)
    weak = _weak_ref_tensor(view)
    assert weak.shape == view.shape and weak.stride() == view.stride()
    assert weak.storage_offset() == view.storage_offset()
    assert weak.untyped_storage().nbytes() == view.untyped_storage().nbytes()
    assert weak.data_ptr() == view.data_ptr() and torch.equal(weak, view)
    base[128] = -1.0
    assert weak[0, 0, 0, 0] == -1.0  # same memory, not a copy

    nz = npu.npu_format_cast(torch.ones(2, 2), NZ)
    weak_nz = _weak_ref_tensor(nz)
    assert npu.get_npu_format(weak_nz) == NZ and weak_nz.data_ptr() == nz.data_ptr()
    # it does not own the memory: the source storage can still be freed
    ref = torch.ones(3)
    storage = ref.untyped_storage()
    import weakref

    alive = weakref.ref(storage)
    weak_ref = _weak_ref_tensor(ref)
    del ref, storage
    gc.collect()
    assert alive() is None
    del weak_ref


def test_a_view_answers_for_the_storage_it_was_taken_from(npu):
    # torch_npu's test_view_reshape_nd_to_nz_fallback: a 1-D view of a 2-D storage can be NZ
    t = torch.rand(32, 64)
    flat = t.reshape(-1)
    nz = npu.npu_format_cast(flat, NZ)
    assert npu.get_npu_format(nz) == NZ and nz.shape == flat.shape
    back = npu.npu_format_cast(nz, ND)
    assert npu.get_npu_format(back) == ND and torch.equal(back, flat)
    # the default format is the storage's: a 2-D view of a 4-D tensor reports NCHW
    assert npu.get_npu_format(torch.ones(2, 3, 4, 5).view(6, 20)) == NCHW
