"""``python -m ascend_patch_core._cli``: the ``ascend-patch`` command."""

import sys

from .commands import main


sys.exit(main())
