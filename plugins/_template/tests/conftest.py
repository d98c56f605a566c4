"""The template is not installed in this repository's environments (an installed plugin
would apply in every test), so its package is imported from the source tree; its group
is applied by hand, through the ``isolated_patcher`` fixture.

In your copy, installed with ``pip install -e .[test]``, delete this file.
"""

from __future__ import annotations

import sys
from pathlib import Path


_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
