"""layout kernels (not written yet)."""

from __future__ import annotations
