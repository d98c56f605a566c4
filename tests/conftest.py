"""The core's tests: the helper modules beside them (cycles.py, bare_venv.py) on the path.

The fixtures and the hygiene every test directory shares (tests/, kits/*/tests,
plugins/*/tests) are in the repository's root conftest.py.
"""

from __future__ import annotations

import sys
from pathlib import Path


# Helper modules beside the tests (cycles.py) are imported by name: --import-mode=importlib
# does not put this directory on sys.path.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
