"""The transformers plugin's tests: :mod:`hf_stacks` (which stack a test module needs) on the path.

The suite runs with ``--import-mode=importlib``, where a test module cannot import a
sibling; this directory goes on ``sys.path`` so that ``from hf_stacks import ...`` works.
"""

from __future__ import annotations

import sys
from pathlib import Path


_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
