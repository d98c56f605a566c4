"""``torch.Generator`` and ``torch.Event`` stand-ins that move a CUDA device to the NPU.

:func:`proxy_of` builds, per installation, a subclass of the C++ base class with a
metaclass that

* calls the class it replaces (``torch._C.Generator``, or whatever stands in
  ``torch.Generator`` when the patch is installed, e.g. the NPU emulator's) with the
  device rewritten, so *base* objects come back -- torch's C++ checks
  (``Stream.record_event``, ``generator=``) accept only the exact base type;
* keeps ``isinstance(obj, torch.Generator)`` true for every base object;
* lets user subclasses of ``torch.Generator`` construct normally (devices rewritten).

Imported only when ``torch.Generator`` is patched, i.e. after torch is imported.
"""

from __future__ import annotations

from typing import Any

import torch

from ._calls import device
from ._calls import rewrite_call


__all__ = ["proxy_of"]

_DEVICE = (device(0, ints=True),)
_BASES = {"Generator": torch._C.Generator, "Event": torch.Event}


def proxy_of(original: type) -> type:
    """A ``torch.Generator`` / ``torch.Event`` replacement building ``original`` on the NPU."""
    base = next(b for b in _BASES.values() if issubclass(original, b))
    base_meta = type(base)

    class ProxyMeta(base_meta):  # type: ignore[misc, valid-type]
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = rewrite_call(_DEVICE, args, kwargs)
            if cls is proxy:
                return original(*args, **kwargs)
            return super().__call__(*args, **kwargs)

        def __instancecheck__(cls, obj: Any) -> bool:
            if cls is proxy:
                return isinstance(obj, base)
            return bool(super().__instancecheck__(obj))

        def __subclasscheck__(cls, sub: Any) -> bool:
            if cls is proxy:
                return issubclass(sub, base)
            return bool(super().__subclasscheck__(sub))

    name = base.__name__
    ProxyMeta.__name__ = f"{name}ProxyMeta"
    proxy = ProxyMeta(
        name,
        (base,),
        {
            "__module__": "torch",
            "__doc__": f"``torch.{name}``; ``torch.{name}('cuda')`` builds an NPU {name.lower()}.",
        },
    )
    return proxy
