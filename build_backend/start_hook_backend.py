"""PEP 517 build backend: setuptools, plus the start hook at the root of every wheel.

``ascend-patch run`` patches the processes a program starts (spawned DataLoader
workers, ``multiprocessing`` children, torchrun ranks) through a ``.pth`` file that
must sit directly in site-packages. setuptools cannot put a file there: package data
lands inside the package, ``data-files`` land relative to the prefix, and PEP 660
editable wheels carry only setuptools' own ``__editable__`` files. So this backend
lets setuptools build the wheel -- regular or editable -- and then adds
``ascend_patch_core_start.pth`` to the wheel's root and to its RECORD. pip installs it
next to the packages and removes it on uninstall.

The hook's text lives in ``ascend_patch_core/ascend_patch_core_start.pth`` (package
data, so it also travels in the sdist); see ``ascend_patch_core/_bootstrap.py``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools  # type: ignore[import-untyped,unused-ignore]


__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

PTH_NAME = "ascend_patch_core_start.pth"
# PEP 517 runs every hook with the source tree as the working directory.
PTH_SOURCE = Path("ascend_patch_core") / PTH_NAME

get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _setuptools.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
build_sdist = _setuptools.build_sdist


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_start_hook(Path(wheel_directory) / name)
    return name


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_start_hook(Path(wheel_directory) / name)
    return name


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode('ascii')}"


def add_start_hook(wheel: Path, source: Path = PTH_SOURCE) -> None:
    """Rewrite ``wheel`` with the start-hook ``.pth`` at its root, listed in RECORD."""
    payload = source.read_bytes()
    with zipfile.ZipFile(wheel) as old:
        infos = old.infolist()
        records = [i for i in infos if i.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise RuntimeError(
                f"{wheel.name}: expected one .dist-info/RECORD, found {len(records)}"
            )
        record_info = records[0]
        lines = [
            line
            for line in old.read(record_info).decode("utf-8").splitlines()
            if line and not line.startswith(f"{PTH_NAME},")
        ]
        lines.insert(0, f"{PTH_NAME},{_record_hash(payload)},{len(payload)}")
        fd, tmp_name = tempfile.mkstemp(suffix=".whl", dir=wheel.parent)
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp_name, "w", zipfile.ZIP_DEFLATED) as new:
                # The .pth first, the dist-info (RECORD last) at the end, as the wheel spec recommends.
                hook_info = zipfile.ZipInfo(PTH_NAME, date_time=record_info.date_time)
                hook_info.external_attr = 0o644 << 16
                hook_info.compress_type = zipfile.ZIP_DEFLATED
                new.writestr(hook_info, payload)
                for info in infos:
                    if info.filename == PTH_NAME:
                        continue
                    if info is record_info:
                        new.writestr(info, ("\n".join(lines) + "\n").encode("utf-8"))
                    else:
                        new.writestr(info, old.read(info))
            shutil.move(tmp_name, wheel)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
