"""FusedRMSNorm: ``torch.nn.functional.rms_norm`` -> ``torch_npu.npu_rms_norm`` on the NPU.

One module per patch family. This one is imported only when its group is built
(see :mod:`ascend_patch_template.groups`), and it still imports neither torch nor
torch_npu: the runtime check reads torch from ``sys.modules`` (the patch is
installed once ``torch.nn.functional`` is imported), and ``with_imports`` imports
``npu_rms_norm`` on the replacement's first call.

``npu_rms_norm(self, gamma, epsilon=1e-06) -> (y, rstd)`` normalizes over the
trailing ``gamma.dim()`` dimensions. The replacement serves the calls it can do
exactly: a weight shaped ``normalized_shape``, an input of float16, bfloat16 or
float32 on the NPU. Everything else (no weight, CPU or CUDA tensors, float64,
tensor subclasses) runs the original and counts as a fallback call in the report.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import with_imports


if TYPE_CHECKING:  # at run time, with_imports binds it on the replacement's first call
    from torch_npu import npu_rms_norm


__all__ = ["is_fused_rms_norm_call", "npu_rms_norm_function", "rms_norm_patches"]


def is_fused_rms_norm_call(
    input: Any,
    normalized_shape: int | Sequence[int],
    weight: Any = None,
    eps: float | None = None,
) -> bool:
    """``runtime_check``: called with the original's arguments; True sends the call to the NPU op."""
    torch = sys.modules["torch"]
    if type(input) is not torch.Tensor or type(weight) is not torch.Tensor:
        return False  # no weight (npu_rms_norm needs one), or a subclass with its own rules
    if input.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    return (
        tuple(weight.shape) == tuple(normalized_shape)
        and tuple(input.shape[input.dim() - weight.dim() :]) == tuple(weight.shape)
        and bool(getattr(input, "is_npu", False))
    )


@with_imports(("torch_npu", "npu_rms_norm"))
def npu_rms_norm_function(
    input: Any,
    normalized_shape: int | Sequence[int],
    weight: Any = None,
    eps: float | None = None,
) -> Any:
    """``rms_norm`` through the fused NPU kernel; same signature as the original."""
    if eps is None:  # torch's default
        eps = sys.modules["torch"].finfo(input.dtype).eps
    # Tensors positionally, other arguments by the schema's names (epsilon, not eps).
    return npu_rms_norm(input, weight, epsilon=eps)[0]


def rms_norm_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_template.groups.FusedRMSNorm`."""
    yield AtomicPatch(
        "torch.nn.functional.rms_norm",
        npu_rms_norm_function,
        runtime_check=is_fused_rms_norm_call,
    )
