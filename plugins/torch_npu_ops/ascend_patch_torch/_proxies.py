"""``torch.Generator`` and ``torch.Event`` stand-ins that move a CUDA device to the NPU.

Each is a subclass of the real class with a metaclass that

* builds a *base* object (``torch._C.Generator``, ``torch.Event``) with the device
  rewritten -- torch's C++ checks (``Stream.record_event``, ``generator=``) accept
  only the exact base type;
* keeps ``isinstance(obj, torch.Generator)`` true for every base object;
* lets user subclasses of ``torch.Generator`` construct normally (devices rewritten).

Imported only when ``torch.Generator`` is patched, i.e. after torch is imported.
"""

from __future__ import annotations

from typing import Any

import torch

from ._calls import device
from ._calls import rewrite_call


__all__ = ["Event", "Generator"]

_GENERATOR_DEVICE = (device(0, ints=True),)


def _proxy_meta(base: type) -> type:
    base_meta = type(base)

    class ProxyMeta(base_meta):  # type: ignore[misc, valid-type]
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = rewrite_call(_GENERATOR_DEVICE, args, kwargs)
            if cls.__dict__.get("_ascend_patch_proxy_of") is base:
                return base(*args, **kwargs)
            return super().__call__(*args, **kwargs)

        def __instancecheck__(cls, obj: Any) -> bool:
            if cls.__dict__.get("_ascend_patch_proxy_of") is base:
                return isinstance(obj, base)
            return super().__instancecheck__(obj)

        def __subclasscheck__(cls, sub: Any) -> bool:
            if cls.__dict__.get("_ascend_patch_proxy_of") is base:
                return issubclass(sub, base)
            return super().__subclasscheck__(sub)

    ProxyMeta.__name__ = f"{base.__name__}ProxyMeta"
    return ProxyMeta


class Generator(torch.Generator, metaclass=_proxy_meta(torch.Generator)):  # type: ignore[misc, metaclass]
    """``torch.Generator``; ``torch.Generator("cuda")`` builds an NPU generator."""

    _ascend_patch_proxy_of = torch.Generator


class Event(torch.Event, metaclass=_proxy_meta(torch.Event)):  # type: ignore[misc, metaclass]
    """``torch.Event``; ``torch.Event("cuda")`` builds an NPU event."""

    _ascend_patch_proxy_of = torch.Event


Generator.__module__ = Event.__module__ = "torch"
