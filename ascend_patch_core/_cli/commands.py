"""The ``ascend-patch`` command: report, doctor, suggest, run, scan (docs/cli.md,
docs/cli-reference.md).

Importing this module imports argparse and nothing of the core: each command loads
what it needs, so ``ascend-patch doctor`` and ``scan`` never pay for ``run``'s
machinery and no command imports torch.
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Sequence

from .._model.errors import PatchDefinitionError


__all__ = ["main"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version

    try:
        return version("ascend-patch-core")
    except PackageNotFoundError:  # running from a source tree
        return "unknown"


def _version_text(*, verbose: bool) -> str:
    import os
    import platform

    import ascend_patch_core

    where = os.path.dirname(os.path.abspath(ascend_patch_core.__file__ or "."))
    lines = [f"ascend-patch {_version()} ({where}, Python {platform.python_version()})"]
    if verbose:
        # From metadata only, like doctor: no plugin is imported to list it.
        from .._discovery.hookspecs import PROJECT_NAME
        from .._discovery.metadata import MetadataCache

        plugins = MetadataCache(persistent=False).entry_points(PROJECT_NAME)
        lines.append("registered plugins:" if plugins else "registered plugins: none")
        lines.extend(f"  {ep.name}: {ep.distribution} {ep.version} ({ep.value})" for ep in plugins)
    return "\n".join(lines)


def _selection_options(parser: argparse.ArgumentParser, *, what: str) -> None:
    parser.add_argument(
        "--disable",
        action="append",
        metavar="NAMES",
        help=f"comma-separated plugin, group or patch names {what} (repeatable); "
        "besides ASCEND_PATCH_DISABLE, which names plugins only",
    )
    parser.add_argument(
        "--plugins",
        action="append",
        metavar="NAMES",
        help="comma-separated allow-list of plugins (repeatable); replaces ASCEND_PATCH_PLUGINS",
    )
    parser.add_argument(
        "--enable",
        action="append",
        metavar="NAMES",
        help="comma-separated opt-in patch groups to turn on ('*': all; repeatable); adds to ASCEND_PATCH_ENABLE",
    )


def _names(values: Sequence[str] | None) -> list[str]:
    return [n.strip() for value in values or () for n in value.split(",") if n.strip()]


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(
        prog="ascend-patch",
        description="Run CUDA-era PyTorch code on Ascend NPUs without editing it.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  ascend-patch doctor                      is this installation ready? what applies here?\n"
            "  ascend-patch suggest                     which plugins serve the libraries installed here\n"
            "  ascend-patch scan ./src                  CUDA-only code in a project, and what covers it\n"
            "  ascend-patch run train.py --lr 0.1       run a program with the patches applied\n"
            "  ascend-patch run --emulate-npu train.py  run its NPU code paths on the CPU\n"
            "  ascend-patch report -v                   apply every plugin here and list every record\n"
            "\n"
            "'ascend-patch COMMAND --help' describes a command; docs/cli.md the common tasks,\n"
            "docs/cli-reference.md every option.\n"
            "'python -m ascend_patch_core' is the same command."
        ),
    )
    parser.add_argument(
        "-V",
        "--version",
        action="count",
        default=0,
        help="show the version; twice (-VV) also the installed plugins, one line each",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    report = commands.add_parser(
        "report",
        help="apply every installed plugin in this interpreter and print the report",
        description="Apply every installed plugin in this interpreter and print the report.",
    )
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument("-v", "--verbose", action="store_true", help="show every record")

    doctor = commands.add_parser(
        "doctor",
        help="check plugins, their patches and the NPU software stack (applies nothing)",
        description=(
            "Check the installed plugins, what they patch, and the NPU software stack "
            "(torch, torch_npu, CANN, NPUs, environment variables). Applies nothing and "
            "imports no target library. Exit status 1 when something is broken."
        ),
    )
    doctor.add_argument(
        "--json", action="store_true", help="print JSON (schema ascend-patch-doctor/1)"
    )
    doctor.add_argument(
        "-v", "--verbose", action="store_true", help="list every patch, rule and variable"
    )
    doctor.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    doctor.add_argument(
        "--try-import",
        action="store_true",
        help="really import torch_npu in a child process (slow) instead of predicting it",
    )
    _selection_options(doctor, what="to check as disabled")

    run = commands.add_parser(
        "run",
        help="run a script or module with the patches applied, in every process it starts",
        usage="%(prog)s [options] (script.py | -m module) [args ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Run an unmodified program with the patches applied before its first line,\n"
            "in this process and in every process it starts (DataLoader workers,\n"
            "multiprocessing children, torchrun ranks). sys.argv, __main__, sys.path[0]\n"
            "and the exit status are those of `python script.py` / `python -m module`."
        ),
        epilog=(
            "Options go before the program; everything after it belongs to the program.\n\n"
            "examples:\n"
            "  ascend-patch run train.py --lr 0.1\n"
            "  ascend-patch run --emulate-npu --report run.json -m mypkg.train\n"
            "  ascend-patch run -m torch.distributed.run --nproc-per-node 2 train.py"
        ),
    )
    _selection_options(run, what="to disable")
    run.add_argument(
        "--emulate-npu",
        nargs="?",
        const="",
        metavar="VERSION",
        help="run NPU code on the CPU under the emulator (optionally imitating torch_npu VERSION; "
        "give it as --emulate-npu=VERSION)",
    )
    run.add_argument(
        "--emulated-devices",
        type=int,
        metavar="N",
        help="how many NPUs the emulator provides in every process (sets "
        "ASCEND_PATCH_EMULATED_DEVICES; default: torchrun's LOCAL_WORLD_SIZE, else 1)",
    )
    run.add_argument(
        "--report", metavar="PATH", help="write the run report (JSON, with call counters) at exit"
    )
    run.add_argument(
        "--profile", metavar="DIR", help="profile training steps into DIR (with_profiling)"
    )
    run.add_argument(
        "--brake-at", type=int, metavar="N", help="stop training cleanly after N steps (brake_at)"
    )
    run.add_argument(
        "--check-precision",
        action="store_true",
        help="also run the originals of patched calls on live inputs and report deviations "
        "(with_precision_check; see docs/training.md)",
    )
    run.add_argument(
        "--strict", action="store_true", help="any patch or plugin failure stops the program"
    )
    run.add_argument(
        "-v", "--verbose", action="store_true", help="print the patch report to stderr at exit"
    )

    suggest = commands.add_parser(
        "suggest",
        help="name the plugins that would serve the libraries installed here, with the pip command",
        description=(
            "Name the ascend-patch plugins that serve the libraries installed in this "
            "environment (transformers installed, ascend-patch-transformers not: it says so) "
            "and the pip command that installs the missing ones -- from your clone when the "
            "core was installed from one. Reads metadata only; imports nothing."
        ),
    )
    suggest.add_argument(
        "--json", action="store_true", help="print JSON (schema ascend-patch-suggest/1)"
    )

    scan = commands.add_parser(
        "scan",
        help="find CUDA-only constructs in a codebase and what the installed plugins cover",
        description=(
            "Statically analyse Python files (nothing is imported or run) for CUDA-only "
            "constructs and report, for each, whether an installed plugin covers it."
        ),
    )
    scan.add_argument("path", help="a directory or a Python file")
    scan.add_argument("--json", action="store_true", help="print JSON (schema ascend-patch-scan/1)")
    scan.add_argument(
        "-v", "--verbose", action="store_true", help="list every finding, covered ones too"
    )
    scan.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip matching paths (repeatable)",
    )
    scan.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a finding is not covered or a file could not be scanned",
    )
    _selection_options(scan, what="whose declarations do not count")
    return parser, run


#: Exit status when the reader of our output went away (``ascend-patch doctor --json | head``):
#: 128 + SIGPIPE, what a shell reports for a Unix tool killed by SIGPIPE.
PIPE_CLOSED_STATUS = 141


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser, run_parser = _parser()
    if args and args[0] == "run":
        # The program's output is the program's business, as under python.
        return _run(run_parser, args[1:])
    command = next((a for a in args if not a.startswith("-")), None)
    prefix = " ".join(filter(None, ["ascend-patch", command]))
    if sys.stdout is None:  # started with stdout closed (`>&-`): the output has nowhere to go
        print(f"{prefix}: cannot write the output: standard output is closed", file=sys.stderr)
        return 1
    try:
        try:
            status = _command(parser, args)
        finally:  # --help's SystemExit too: flush here, not at exit, to catch a closed pipe
            sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        return PIPE_CLOSED_STATUS
    except OSError as error:
        if error.errno not in _OUTPUT_ERRORS:
            raise
        # The output could not be written (a full disk, /dev/full): say so in one line,
        # as Unix tools do, and keep Python's flush at exit from failing again.
        _stdout_to_devnull()
        print(f"{prefix}: cannot write the output: {error.strerror}", file=sys.stderr)
        return 1
    except PatchDefinitionError as error:
        # A setting no command can honour (ASCEND_PATCH_STRICT=maybe, say): its message
        # names the variable and the accepted values; a traceback would only bury it.
        print(f"{prefix}: {error}", file=sys.stderr)
        return 2
    return status


#: errno values of a failed write to stdout (BrokenPipeError, EPIPE, is handled apart).
_OUTPUT_ERRORS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EIO", "EFBIG", "EDQUOT", "EBADF", "EROFS")
    if hasattr(errno, name)
)


def _stdout_to_devnull() -> None:
    """Quiet exit on a closed pipe, the recipe of Python's signal docs (SIGPIPE)."""
    import os

    # Python flushes stdout again at exit; pointed at devnull that flush cannot fail.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (stdout replaced)
        pass


def _command(parser: argparse.ArgumentParser, args: list[str]) -> int:
    ns = parser.parse_args(args)
    if ns.version:
        print(_version_text(verbose=ns.version > 1))
        return 0
    if ns.command is None:
        parser.print_help()
        return 2
    _check_switches()
    if ns.command == "report":
        return _report(ns)
    if ns.command == "doctor":
        return _doctor(ns)
    if ns.command == "suggest":
        return _suggest(ns)
    return _scan(parser, ns)


def _check_switches() -> None:
    """A bad ASCEND_PATCH_* value stops every command alike, before it does anything.

    The same PatchDefinitionError (and message) as apply() raises: exit status 2, as
    for any usage error, whether the command would have read the variable or not.
    """
    from .._model.env_flags import check_switches

    check_switches()


def _report(ns: argparse.Namespace) -> int:
    import ascend_patch_core

    from .._model.env_flags import CLI_PLUGIN_TIMEOUT_S

    ascend_patch_core.default_patcher._config.plugin_timeout = CLI_PLUGIN_TIMEOUT_S
    result = ascend_patch_core.apply()
    print(result.to_json() if ns.json else result.table(verbose=ns.verbose))
    return 0 if result.ok else 1


def _doctor(ns: argparse.Namespace) -> int:
    import json

    from . import doctor as _doctor

    result = _doctor.diagnose(
        disable=_names(ns.disable),
        plugins=_names(ns.plugins) if ns.plugins else None,
        enable=_names(ns.enable),
        try_import=ns.try_import,
        strict=ns.strict,
    )
    if ns.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(_doctor.render(result, verbose=ns.verbose, stream=sys.stdout))
    return _doctor.exit_status(result)


def _suggest(ns: argparse.Namespace) -> int:
    import json

    from . import suggest as _suggest

    result = _suggest.suggest()
    print(json.dumps(result, indent=2) if ns.json else _suggest.render(result))
    return 0


def _scan(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    import json
    import os

    from .. import _scan
    from .._engine.declarations import collect
    from .progress import Progress

    try:
        os.stat(ns.path)
    except FileNotFoundError:
        parser.error(f"scan: {ns.path!r} does not exist")
    except OSError as exc:  # EACCES, ENOTDIR, ELOOP ...: the OS's reason, not "does not exist"
        parser.error(f"scan: cannot read {ns.path!r}: [Errno {exc.errno}] {exc.strerror}")
    inventory = collect(
        disable=_names(ns.disable),
        plugins=_names(ns.plugins) if ns.plugins else None,
        enable=_names(ns.enable),
        # Code is read for what it would need wherever it runs: libraries absent here count.
        load_idle=True,
    )
    # Files done / total on stderr, only where a person watches it: never in a pipe,
    # a log or with --json (docs/cli-reference.md, "Progress").
    progress = Progress(None if ns.json else sys.stderr, "scanning")
    try:
        result = _scan.scan(
            ns.path,
            inventory=inventory,
            exclude=ns.exclude,
            progress=progress.update if progress.enabled else None,
        )
    finally:
        progress.close()
    if ns.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(_scan.render(result, verbose=ns.verbose, stream=sys.stdout))
    return _scan.exit_status(result, check=ns.check)


def _run(run_parser: argparse.ArgumentParser, args: list[str]) -> int:
    from . import run as _run

    try:
        own, target = _run.split_argv(args)
    except _run.UsageError as exc:
        run_parser.error(str(exc))
    ns = run_parser.parse_args(own)
    if target is None:
        run_parser.error("give the program to run: a script (train.py) or -m module")
    try:
        _check_switches()
    except PatchDefinitionError as exc:
        print(f"ascend-patch run: {exc}", file=sys.stderr)
        return 2
    try:
        options = _run.options_from_args(ns)
        return _run.run(options, target, verbose=ns.verbose)
    except _run.UsageError as exc:
        print(f"ascend-patch run: {exc}", file=sys.stderr)
        return exc.status
    except Exception as exc:
        # Only the patching itself gets here (the program's own errors are printed by
        # run()): strict mode, or a broken installation.
        from .._model.errors import PatchError

        if isinstance(exc, PatchError):
            print(f"ascend-patch run: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
