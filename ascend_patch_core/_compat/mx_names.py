"""Names of the DrivingSDK patcher's API that a migrated ``patch.py`` imports.

Thin, on top of the core's model: ``RegistryPatch`` is an :class:`AtomicPatch` on the
registry's entry, ``PatchStatus``/``PatchResult`` are :class:`Status`/:class:`Record`,
and the version helpers read distribution metadata (nothing is imported, so asking
for mmcv's version does not import mmcv). docs/migrating-from-mx-driving.md says what
is not provided and what to write instead.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

from .._model.errors import PatchDefinitionError
from .._model.patch import AtomicPatch
from .._model.report import Record
from .._model.report import Status


__all__ = [
    "PatchResult",
    "PatchStatus",
    "RegistryPatch",
    "check_version",
    "get_version",
    "is_mmcv_v1x",
    "is_mmcv_v2x",
    "mmcv_version",
]

#: The DrivingSDK patcher's names for the result of applying a patch.
PatchStatus = Status
PatchResult = Record

#: Distributions that provide an import package under several names.
_DISTRIBUTIONS = {"mmcv": ("mmcv", "mmcv-full", "mmcv-lite")}


def get_version(package: str) -> str | None:
    """The installed version of ``package`` (an import name), or None; imports nothing."""
    for distribution in _DISTRIBUTIONS.get(package, (package,)):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str | None) -> tuple[int, ...]:
    from packaging.version import InvalidVersion
    from packaging.version import Version

    try:
        return Version(version).release if version else ()
    except InvalidVersion:
        return ()


def check_version(package: str, major: int | None = None, minor: int | None = None) -> bool:
    """Whether ``package`` is installed with this major (and minor) version."""
    release = _release(get_version(package))
    if not release:
        return False
    wanted = [(0, major), (1, minor)]
    return all(n is None or (len(release) > i and release[i] == n) for i, n in wanted)


class _MmcvVersion:
    """``mmcv_version.version``, ``.is_v1x``, ``.is_v2x``, ``.has_mmcv``, ``.has_mmengine``.

    Read from metadata at each use (the DrivingSDK patcher cached the first answer).
    """

    __module__ = "ascend_patch_core"

    @property
    def version(self) -> str | None:
        return get_version("mmcv")

    @property
    def has_mmcv(self) -> bool:
        return self.version is not None

    @property
    def has_mmengine(self) -> bool:
        return get_version("mmengine") is not None

    @property
    def is_v1x(self) -> bool:
        return check_version("mmcv", major=1)

    @property
    def is_v2x(self) -> bool:
        return check_version("mmcv", major=2)

    def __bool__(self) -> bool:
        return self.has_mmcv

    def __call__(self) -> str | None:
        return self.version

    def __repr__(self) -> str:
        return f"mmcv_version({self.version!r})"


mmcv_version = _MmcvVersion()


def is_mmcv_v1x() -> bool:
    return mmcv_version.is_v1x


def is_mmcv_v2x() -> bool:
    return mmcv_version.is_v2x


class RegistryPatch(AtomicPatch):
    """Register ``module_cls`` in ``registry`` (a dotted path) under ``name``, overwriting.

    ``RegistryPatch("mmdet3d.registry.MODELS", NpuSparseConv)`` replaces the entry
    ``MODELS._module_dict["NpuSparseConv"]``, creating it if absent, when the registry's
    module is imported; revert() restores (or removes) it. ``module_factory()`` makes
    the class at installation instead (``name`` is then required). ``force=False``
    fails the patch where the name is already registered. ``precheck`` may take any of
    ``registry``, ``module_cls``, ``name``, ``force``, ``module_factory``.
    """

    __module__ = "ascend_patch_core"

    def __init__(
        self,
        registry: str,
        module_cls: Any = None,
        *,
        name: str | None = None,
        force: bool = True,
        precheck: Callable[..., object] | None = None,
        module_factory: Callable[[], Any] | None = None,
        **options: Any,
    ) -> None:
        key = name or getattr(module_cls, "__name__", None)
        if not isinstance(key, str) or not key:
            raise PatchDefinitionError(
                f"RegistryPatch({registry!r}): give name= (required with module_factory)"
            )
        if (module_cls is None) == (module_factory is None):
            raise PatchDefinitionError(
                f"RegistryPatch({registry!r}): give exactly one of module_cls and module_factory"
            )
        given = {"registry": registry, "module_cls": module_cls, "name": key, "force": force,
                 "module_factory": module_factory}  # fmt: skip

        def check(original: Any = None) -> object:
            if not force and original is not None:
                raise PatchDefinitionError(f"{key!r} is already registered in {registry}")
            if precheck is None:
                return True
            from .._model.patch import _keyword_names

            wanted = _keyword_names(precheck)
            return precheck(**{k: v for k, v in given.items() if k in wanted or "*" in wanted})

        super().__init__(
            f"{registry}._module_dict[{key!r}]",
            module_cls if module_factory is None else module_factory,
            # The factory runs at installation, as register_module(module=factory()) did.
            replacement_wrapper=None if module_factory is None else (lambda factory: factory()),
            precheck=check,
            create=True,
            name=f"{registry}.{key}",
            **options,
        )
        self.registry, self.module_cls, self.force = registry, module_cls, force
