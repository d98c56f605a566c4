"""The ``ascend-patch`` command. This version has ``report``; doctor, run and scan come next."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


__all__ = ["main"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version

    try:
        return version("ascend-patch-core")
    except PackageNotFoundError:  # running from a source tree
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ascend-patch",
        description="Run CUDA-era PyTorch code on Ascend NPUs without editing it.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    report = commands.add_parser(
        "report",
        help="apply every installed plugin in this interpreter and print the report",
    )
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument("-v", "--verbose", action="store_true", help="show every record")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    import ascend_patch_core

    result = ascend_patch_core.apply()
    print(result.to_json() if args.json else result.table(verbose=args.verbose))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
