"""What tensors are for CPython and ``torch.tensor()``, with TensorIndex applied and after revert().

Run by ``test_tensor_index.py`` in a fresh interpreter: plainly (``plain``: the
baseline), or under ``ascend-patch run --emulate-npu`` with ``ASCEND_PATCH_ENABLE=TensorIndex``
(``run``), which then reverts and measures again. Prints one JSON object.
"""

from __future__ import annotations

import ctypes
import json
import sys
import warnings
from typing import Any

import torch


warnings.simplefilter("ignore")
_is_sequence = ctypes.pythonapi.PySequence_Check
_is_sequence.argtypes = (ctypes.py_object,)


class MadeBefore(torch.Tensor):
    """A tensor class that exists before anything is measured (before revert() too)."""


def _outcome(make: Any) -> str:
    try:
        return repr(make().tolist())
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def measure() -> dict[str, Any]:
    class MadeNow(torch.Tensor):
        """A tensor class created while the patch is (or was) applied."""

    class OwnGetitem(torch.Tensor):
        def __getitem__(self, index: Any) -> Any:  # a sequence in plain torch as well
            return super().__getitem__(index)

    parameter = torch.nn.Parameter(torch.tensor(2.0))
    x = torch.arange(6.0).reshape(3, 2)
    samples = {
        "tensor": torch.ones(2),
        "parameter": parameter,
        "made_before": torch.ones(2).as_subclass(MadeBefore),
        "made_now": torch.ones(2).as_subclass(MadeNow),
        "own_getitem": torch.ones(2).as_subclass(OwnGetitem),
    }
    return {
        "sequence": {name: bool(_is_sequence(value)) for name, value in samples.items()},
        "0-d tensors": _outcome(lambda: torch.tensor([torch.tensor(1), torch.tensor(2)])),
        "1-d tensors": _outcome(lambda: torch.tensor([torch.tensor([1, 2]), torch.tensor([3])])),
        "parameters": _outcome(lambda: torch.tensor([parameter, parameter])),
        "mixed": _outcome(lambda: torch.tensor([[torch.tensor(1.5), 2.0], [3, torch.tensor(4)]])),
        "mask": x[torch.tensor([True, False, True])].tolist(),
        "index": [x[1].tolist(), x[:, 0].tolist(), x[torch.tensor([2, 0])].tolist()],
    }


result: dict[str, Any] = {"patched": measure()}
if sys.argv[1] == "run":
    import ascend_patch_core

    report = ascend_patch_core.default_patcher.report
    result["applied"] = sorted(
        r.name for r in report.records if r.group == "TensorIndex" and r.status.value == "applied"
    )
    result["masks_redirected"] = report.get("torch.Tensor.__getitem__").counters.replacement_calls
    ascend_patch_core.revert()
    result["reverted"] = measure()
print(json.dumps(result))
