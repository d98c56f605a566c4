"""Which device torch's factories get from ``with torch.device(X)`` / ``set_default_device(X)``.

Run by ``test_device_context.py`` in a fresh interpreter, so that torch's factory list
(``torch.utils._device._device_constructors``, an ``lru_cache``) is built exactly when
the mode says. Prints one JSON object.

``argv[1]``, what happens before the first measurement:

* ``plain`` -- nothing: the baseline, plain torch;
* ``run`` -- ``ascend-patch run --emulate-npu`` has applied the patches already;
* ``warm`` -- torch builds its list, then the emulator and ``apply()`` in code;
* ``cold`` -- the emulator and ``apply()`` in code first; torch builds its list later.

Every mode but ``plain`` then reverts and measures again.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import torch
import torch.utils._device


MODE = sys.argv[1]
warnings.simplefilter("ignore")  # torch.range, nested and sparse tensors warn

if MODE == "warm":
    torch.utils._device._device_constructors()
if MODE in ("warm", "cold"):
    import ascend_patch_emulator

    import ascend_patch_core

    ascend_patch_emulator.activate()
    ascend_patch_core.apply()

_CPU = {"values": torch.tensor([1.0]), "crow": torch.tensor([0, 1, 1]), "col": torch.tensor([1])}
_BLOCK = {"compressed": torch.tensor([0, 1]), "plain": torch.tensor([0])}


def _quantized() -> Any:
    return torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)


#: Arguments (made on the CPU, outside the context) for each factory in torch's list.
ARGS: dict[str, Any] = {
    "empty": lambda: ((2,),),
    "empty_permuted": lambda: ((2, 3), (1, 0)),
    "empty_strided": lambda: ((2,), (1,)),
    "empty_quantized": lambda: ((2,), _quantized()),
    "ones": lambda: ((2,),),
    "zeros": lambda: ((2,),),
    "full": lambda: ((2,), 1.5),
    "eye": lambda: (2,),
    "arange": lambda: (3,),
    "range": lambda: (0, 2),
    "linspace": lambda: (0, 1, 3),
    "logspace": lambda: (0, 1, 3),
    "rand": lambda: ((2,),),
    "randn": lambda: ((2,),),
    "randint": lambda: (5, (2,)),
    "randperm": lambda: (4,),
    "bartlett_window": lambda: (4,),
    "blackman_window": lambda: (4,),
    "hamming_window": lambda: (4,),
    "hann_window": lambda: (4,),
    "kaiser_window": lambda: (4,),
    "fftfreq": lambda: (4,),
    "rfftfreq": lambda: (4,),
    "tril_indices": lambda: (3, 3),
    "triu_indices": lambda: (3, 3),
    "tensor": lambda: ([1.0, 2.0],),
    "as_tensor": lambda: (torch.tensor([1.0, 2.0]),),
    "asarray": lambda: (torch.tensor([1.0, 2.0]),),
    "scalar_tensor": lambda: (1.0,),
    "nested_tensor": lambda: ([torch.ones(2), torch.ones(3)],),
    "sparse_coo_tensor": lambda: (torch.tensor([[0], [1]]), _CPU["values"], (2, 2)),
    "sparse_csr_tensor": lambda: (_CPU["crow"], _CPU["col"], _CPU["values"], (2, 2)),
    "sparse_csc_tensor": lambda: (_CPU["crow"], _CPU["col"], _CPU["values"], (2, 2)),
    "sparse_compressed_tensor": lambda: (
        _CPU["crow"],
        _CPU["col"],
        _CPU["values"],
        (2, 2),
    ),
    "sparse_bsr_tensor": lambda: (_BLOCK["compressed"], _BLOCK["plain"], torch.ones(1, 1, 1)),
    "sparse_bsc_tensor": lambda: (_BLOCK["compressed"], _BLOCK["plain"], torch.ones(1, 1, 1)),
}
KWARGS = {"sparse_compressed_tensor": {"layout": torch.sparse_csr}}


def factories() -> list[tuple[str, Any]]:
    """torch's own list, by name, as the program reaches each: ``torch.X`` (or ``torch.fft.X``)."""
    # The undecorated function: calling it builds no cache.
    listed = torch.utils._device._device_constructors.__wrapped__()
    found = []
    modules = {"fft_": torch.fft, "nested_": torch.nested}
    for function in listed:
        name, module = function.__name__, torch
        for prefix, namespace in modules.items():
            if name.startswith(prefix):
                name = name[len(prefix) :] if prefix == "fft_" else name
                module = namespace
        found.append((name, getattr(module, name)))
    return sorted(found, key=lambda pair: pair[0])


def _outcome(name: str, function: Any) -> str:
    if name not in ARGS:
        return "no arguments for this factory in device_context_probe.py"
    try:
        made = function(*ARGS[name](), **KWARGS.get(name, {}))
    except Exception as error:
        return f"raised {type(error).__name__}"
    return str(made.device)


def measure(*, redirected: bool) -> dict[str, Any]:
    """Each factory's device in a meta context and under a meta default device."""
    listed = factories()
    with torch.device("meta"):
        context = {name: _outcome(name, function) for name, function in listed}
    torch.set_default_device("meta")
    try:
        default = {name: _outcome(name, function) for name, function in listed}
    finally:
        torch.set_default_device(None)
    return {"context": context, "default": default, "npu": npu_devices() if redirected else None}


def npu_devices() -> dict[str, list[str]]:
    """The devices torch's dispatcher sees inside ``with torch.device("cuda")``.

    Under the emulator an NPU tensor is a CPU tensor, so the tensor's device cannot
    show whether the factory got the context's device; what the kernel receives can.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class Devices(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if "device" in kwargs:
                self.seen.append(str(kwargs["device"]))
            return func(*args, **kwargs)

    def made(*, default: bool) -> list[str]:
        recorder = Devices()
        if default:
            torch.set_default_device("cuda")
        try:
            with recorder:
                torch.empty(2), torch.zeros(2), torch.tensor([1.0]), torch.arange(3)
                torch.nn.Linear(2, 2)
        finally:
            if default:
                torch.set_default_device(None)
        return recorder.seen

    with torch.device("cuda"):
        context = made(default=False)
    return {"context": context, "default": made(default=True)}


def wrappers_in_torch_cache() -> list[str]:
    """Members of torch's own cached list that are ascend-patch wrappers (there must be none)."""
    function = torch.utils._device._device_constructors
    if not hasattr(function, "cache_info") or not function.cache_info().currsize:
        return []
    return sorted(
        f.__name__
        for f in function()
        if "__ascend_patch_original__" in (getattr(f, "__dict__", None) or {})
    )


result: dict[str, Any] = {"patched": measure(redirected=MODE != "plain")}
if MODE != "plain":
    import ascend_patch_core

    ascend_patch_core.revert()
    result["reverted"] = measure(redirected=False)  # "cuda" is CUDA again
    result["wrappers_in_torch_cache"] = wrappers_in_torch_cache()
    result["torch_function_restored"] = (
        torch.utils._device._device_constructors.__module__ == "torch.utils._device"
    )
print(json.dumps(result))
