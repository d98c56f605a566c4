"""``mmcv._ext`` without compiling mmcv: the provider the mmcv plugin serves (issue in progress)."""

from __future__ import annotations


__all__: list[str] = []
