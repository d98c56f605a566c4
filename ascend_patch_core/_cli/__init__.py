"""The ``ascend-patch`` command: report, doctor, run, scan (docs/cli.md), and the
bootstrap the start hook runs in ``ascend-patch run`` children.

The console script is ``ascend_patch_core._cli:main``, as before the core had
subpackages. :func:`main` imports the commands when called: the start hook imports
``.bootstrap`` (so this package) at every interpreter start of a run, and must not
pay for argparse there.
"""

from __future__ import annotations

from collections.abc import Sequence


__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ascend-patch`` command (``argv``: sys.argv[1:] when None)."""
    from .commands import main as run

    return run(argv)
