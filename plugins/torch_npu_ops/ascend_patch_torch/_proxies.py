"""Class stand-ins that move a CUDA device argument to the NPU and build the class they stand for.

:func:`proxy_of` builds, per installation, a subclass of a base class with a
metaclass that

* calls the class it replaces with the device arguments rewritten, so objects of
  that class come back (not of the proxy): torch's C++ checks (``Stream.record_event``,
  ``generator=``) accept only the exact base type;
* keeps ``isinstance(obj, proxy)`` / ``issubclass(cls, proxy)`` true for every object
  and subclass of the base;
* lets user subclasses of the proxy construct normally (devices rewritten).

Two uses:

* ``torch.Generator`` and ``torch.Event`` (:func:`torch_proxy_of`): the base is the C++
  class (``torch._C.Generator``, ``torch.Event``), the class called is whatever stood in
  ``torch.Generator`` when the patch was installed (e.g. the NPU emulator's);
* the ``torch.cuda`` classes that take a device (``device``, ``Stream``,
  ``ExternalStream``): the base and the class called are the ``torch.npu`` class, so
  ``torch.cuda.Stream(device="cuda:0")`` is a ``torch.npu.Stream`` and
  ``isinstance(torch.npu.current_stream(), torch.cuda.Stream)`` holds. ``torch.npu``
  itself is left untouched (transfer_to_npu rewrote ``torch.npu.device.__init__``).

Imported only when such a patch is installed, i.e. after torch is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._calls import Param
from ._calls import device
from ._calls import rewrite_call


__all__ = ["proxy_of", "torch_proxy_of"]

_TORCH_DEVICE = (device(0, ints=True),)
_TORCH_BASES = {"Generator": torch._C.Generator, "Event": torch.Event}


def proxy_of(
    original: type, params: Sequence[Param], *, base: type | None = None, module: str, doc: str
) -> type:
    """A stand-in for ``original`` that rewrites the CUDA devices named by ``params``.

    ``base`` (default: ``original``) is the class the proxy derives from and answers
    ``isinstance`` for; ``module`` and ``doc`` are what the stand-in shows.
    """
    params = tuple(params)
    root: type = original if base is None else base
    base_meta = type(root)

    class ProxyMeta(base_meta):  # type: ignore[misc, valid-type]
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = rewrite_call(params, args, kwargs)
            if cls is proxy:
                return original(*args, **kwargs)
            return super().__call__(*args, **kwargs)

        def __instancecheck__(cls, obj: Any) -> bool:
            if cls is proxy:
                return isinstance(obj, root)
            return bool(super().__instancecheck__(obj))

        def __subclasscheck__(cls, sub: Any) -> bool:
            if cls is proxy:
                return issubclass(sub, root)
            return bool(super().__subclasscheck__(sub))

    name = original.__name__
    ProxyMeta.__name__ = f"{name}ProxyMeta"
    proxy = ProxyMeta(name, (root,), {"__module__": module, "__doc__": doc})
    proxy.__qualname__ = name
    return proxy


def torch_proxy_of(original: type) -> type:
    """A ``torch.Generator`` / ``torch.Event`` replacement building ``original`` on the NPU."""
    base = next(b for b in _TORCH_BASES.values() if issubclass(original, b))
    name = base.__name__
    return proxy_of(
        original,
        _TORCH_DEVICE,
        base=base,
        module="torch",
        doc=f"``torch.{name}``; ``torch.{name}('cuda')`` builds an NPU {name.lower()}.",
    )
