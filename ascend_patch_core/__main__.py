"""``python -m ascend_patch_core``: the ``ascend-patch`` command, as ``python -m pip`` is pip.

For an environment whose scripts directory is not on PATH, or to be sure which
interpreter's installation is meant. Imports only the CLI module (argparse), as the
console script does.
"""

import sys

from ._cli.commands import main


if __name__ == "__main__":
    sys.exit(main())
