"""Which OpenMMLab stack a test needs, and whether its absence is a skip or a failure.

Each nox session installs one stack and names what it installed in
``ASCEND_PATCH_TEST_REQUIRE`` (comma-separated): there, a test whose stack is missing
fails instead of skipping, so a broken install cannot pass as "all skipped".

Names: ``mmengine``, ``mmdet``, ``mmdet3d``, ``mmcv1`` (mmcv 1.x), ``mmcv-ops`` (mmcv
with its compiled ``mmcv._ext``, the numeric oracle of the op replacements),
``mmcv-lite`` (mmcv 2.x without a compiled ``mmcv._ext``: where the plugin serves one).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
from typing import Any

import pytest


__all__ = ["require_module", "require_stack", "required"]


def required(name: str) -> bool:
    """Whether this session promises ``name`` (a missing one is then a failure)."""
    return name in os.environ.get("ASCEND_PATCH_TEST_REQUIRE", "").split(",")


def require_module(module: str, stack: str | None = None) -> Any:
    """Import ``module``; skip the test module without it, unless ``stack`` is required."""
    if required(stack or module):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def _mmcv_major() -> int | None:
    for dist in ("mmcv", "mmcv-full", "mmcv-lite"):
        try:
            return int(importlib.metadata.version(dist).split(".")[0])
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _compiled_ext() -> bool:
    """Whether mmcv's own compiled ``mmcv._ext`` is installed (found on disk, nothing imported).

    Not ``importlib.util.find_spec("mmcv._ext")``: where the plugin's import rule is
    active, that finds the ``mmcv._ext`` the plugin serves.
    """
    spec = importlib.util.find_spec("mmcv")
    locations = list(getattr(spec, "submodule_search_locations", None) or ())
    return (
        bool(locations)
        and importlib.machinery.PathFinder.find_spec("mmcv._ext", locations) is not None
    )


def require_stack(stack: str) -> None:
    """Skip the test module unless ``stack`` is here (fail when the session requires it)."""
    if stack == "mmcv1":
        present, what = _mmcv_major() == 1, "mmcv 1.x"
    elif stack == "mmcv-ops":
        present = _mmcv_major() == 2 and _compiled_ext()
        what = "mmcv 2.x with its compiled ops (nox -s openmmlab_cpu_ops)"
    elif stack == "mmcv-lite":
        present = _mmcv_major() == 2 and not _compiled_ext()
        what = "mmcv 2.x without compiled ops, e.g. mmcv-lite (nox -s openmmlab_emulated)"
    else:
        present, what = importlib.util.find_spec(stack) is not None, stack
    if present:
        return
    if required(stack):
        pytest.fail(f"this session requires {what}, which is not installed", pytrace=False)
    pytest.skip(f"needs {what}", allow_module_level=True)
