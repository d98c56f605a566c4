"""MmcvVersionCheck: mmdet and mmdet3d import under the mmcv the NPU stack needs.

Their package ``__init__`` asserts an mmcv version range at import (mmdet 3.3:
``2.0.0rc4 <= mmcv < 2.2.0``; mmdet 2.28: mmcv 1.3.17 up to 1.8.0), reading
``mmcv.__version__`` through the name ``mmcv`` of their own namespace, after
importing their ``.version`` submodule. An NPU stack with another mmcv build (say
mmcv 2.2.0) then cannot import them at all.

When ``<lib>.version`` has been imported and ``<lib>`` is still initializing, this
rebinds the name ``mmcv`` in ``<lib>``'s namespace to a view of the real mmcv module
whose ``__version__`` lies inside the range of that major line; when ``<lib>``
finishes importing, the name is rebound to the real module. The real
``mmcv.__version__`` is never changed, so nobody else sees another version; if the
import fails, the half-built module (and the view) is discarded by Python. The
major line is kept: mmdet 3.x under mmcv 1.x still fails its assertion.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import ModuleHook


__all__ = ["COMPATIBLE_VERSIONS", "MmcvVersionView", "mmcv_version_patches"]

#: The version the view shows, per major line of the real mmcv: inside the range of
#: every supported release of that line (mmdet 2.28: 1.3.17 up to 1.8.0; mmdet3d
#: 1.0.0rc6: 1.5.2 up to 1.7.0; mmdet 3.x and mmdet3d 1.1+: >=2.0.0rc4,<2.2.0).
COMPATIBLE_VERSIONS = {"1": "1.6.2", "2": "2.1.0"}

#: The libraries whose ``__init__`` asserts the mmcv version.
CHECKING_LIBRARIES = ("mmdet", "mmdet3d")


class MmcvVersionView(types.ModuleType):
    """The real mmcv module seen with another ``__version__`` (every other name is the real one)."""

    def __init__(self, module: types.ModuleType, version: str) -> None:
        super().__init__(module.__name__, module.__doc__)
        self.__dict__["real_module"] = module
        self.__version__ = version

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["real_module"], name)


def _initializing(module: types.ModuleType | None) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def show_compatible_mmcv(version_module: types.ModuleType) -> None:
    """``<lib>.version`` imported: ``<lib>`` is about to assert; let it see a compatible mmcv."""
    library = sys.modules.get(version_module.__name__.rpartition(".")[0])
    mmcv = sys.modules.get("mmcv")
    if library is None or mmcv is None or not _initializing(library):
        return None  # imported before apply(): its assertion already ran
    real = vars(library).get("mmcv")
    if real is not mmcv or not isinstance(real, types.ModuleType):
        return None  # not the layout this shim knows: leave the library alone
    version = COMPATIBLE_VERSIONS.get(str(getattr(real, "__version__", "")).partition(".")[0])
    if version is not None:
        vars(library)["mmcv"] = MmcvVersionView(real, version)
    return None


def restore_real_mmcv(library: types.ModuleType) -> None:
    """``<lib>`` imported: its name ``mmcv`` is the real module again."""
    view = vars(library).get("mmcv")
    if isinstance(view, MmcvVersionView):
        vars(library)["mmcv"] = view.__dict__["real_module"]
    return None


def mmcv_version_patches(options: Any = None) -> Iterator[ModuleHook]:
    """The hooks of :class:`ascend_patch_mmcv.groups.MmcvVersionCheck`."""
    for library in CHECKING_LIBRARIES:
        yield ModuleHook(
            f"{library}.version", show_compatible_mmcv, name=f"{library}: compatible mmcv"
        )
        yield ModuleHook(library, restore_real_mmcv, name=f"{library}: real mmcv")
