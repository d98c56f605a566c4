"""``ascend-patch run``: run a program unmodified, with the patches applied before its first line.

The program runs in this interpreter, the way ``python script.py`` / ``python -m
module`` run it: a fresh ``__main__`` module, ``sys.argv`` and ``sys.path[0]`` set as
Python sets them, ``SystemExit`` propagating as is and an uncaught exception printed
by ``sys.excepthook`` (without the launcher's frames) with exit status 1; a program
that does not compile prints what ``python`` prints (:mod:`.run_program`). Processes the
program starts are patched by the start hook (``_cli.bootstrap``), which reads the
options from the ``ASCEND_PATCH_RUN`` variable set here.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Sequence
from typing import Any

from . import run_program as _run_program
from . import script_source as _script_source
from .bootstrap import ENV_VAR
from .bootstrap import RunOptions
from .run_program import NotRunnable
from .run_program import RunTarget
from .run_program import UsageError
from .run_program import load_module
from .run_program import load_script


__all__ = [
    "EMULATED_DEVICES_VAR",
    "MAX_EMULATED_DEVICES",
    "OPTIONS_WITH_VALUE",
    "RunTarget",
    "UsageError",
    "run",
    "split_argv",
]

#: ``run`` options that take a value (``--opt VALUE`` or ``--opt=VALUE``).
OPTIONS_WITH_VALUE = (
    "--disable",
    "--plugins",
    "--enable",
    "--report",
    "--profile",
    "--brake-at",
    "--emulated-devices",
)
#: How many NPUs the emulator provides; read by the emulator in every process, so
#: ``--emulated-devices`` reaches torchrun's ranks through the environment.
EMULATED_DEVICES_VAR = "ASCEND_PATCH_EMULATED_DEVICES"
#: The most NPUs the emulator provides (its MAX_DEVICES): torch's device index is 8-bit.
MAX_EMULATED_DEVICES = 128

#: Frames of these files are the launcher's, not the program's: tracebacks leave them out.
_LAUNCHER_FILES = frozenset({__file__, _run_program.__file__, _script_source.__file__})


def split_argv(argv: Sequence[str]) -> tuple[list[str], RunTarget | None]:
    """Split ``run``'s arguments into its own options and the program to run.

    Like ``python``, the first argument that is not an option (or ``-m MODULE``)
    starts the program's command line: everything after it belongs to the program,
    even when it looks like a ``run`` option.
    """
    own: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if item == "--":
            if i + 1 >= len(items):
                return own, None
            return own, RunTarget("script", items[i + 1], tuple(items[i + 2 :]))
        if item.startswith("-m") and not item.startswith("--"):
            if item != "-m":
                return own, RunTarget("module", item[2:], tuple(items[i + 1 :]))
            if i + 1 >= len(items):
                raise UsageError(
                    "-m needs a module name, e.g. 'ascend-patch run -m torch.distributed.run ...'"
                )
            return own, RunTarget("module", items[i + 1], tuple(items[i + 2 :]))
        if item.startswith("-") and item != "-":
            own.append(item)
            if item in OPTIONS_WITH_VALUE:
                if i + 1 >= len(items):
                    raise UsageError(f"{item} needs a value")
                own.append(items[i + 1])
                i += 1
            i += 1
            continue
        return own, RunTarget("script", item, tuple(items[i + 1 :]))
    return own, None


def _names(values: Sequence[str] | None) -> tuple[str, ...]:
    out: list[str] = []
    for value in values or ():
        out.extend(name.strip() for name in value.split(",") if name.strip())
    return tuple(out)


def options_from_args(ns: Any) -> RunOptions:
    """RunOptions from the parsed ``run`` arguments (report locations are added by :func:`run`)."""
    if ns.report is not None and not ns.report:
        # `--report ""` (an unset shell variable) would otherwise write nothing, silently.
        raise UsageError(
            "--report needs the file to write, got an empty path; e.g. --report run.json"
        )
    if ns.brake_at is not None and ns.brake_at < 1:
        raise UsageError(f"--brake-at must be a positive number of steps, got {ns.brake_at}")
    emulate = ns.emulate_npu is not None
    version = ns.emulate_npu if isinstance(ns.emulate_npu, str) and ns.emulate_npu else None
    devices = getattr(ns, "emulated_devices", None)
    if devices is not None:
        if not emulate:
            raise UsageError("--emulated-devices N sets how many NPUs --emulate-npu provides")
        if not 1 <= devices <= MAX_EMULATED_DEVICES:
            raise UsageError(
                f"--emulated-devices must be a positive number, at most {MAX_EMULATED_DEVICES} "
                f"(torch's device index is 8-bit), got {devices}"
            )
        os.environ[EMULATED_DEVICES_VAR] = str(devices)
    return RunOptions(
        disable=_names(ns.disable),
        plugins=_names(ns.plugins) if ns.plugins else None,
        enable=_names(getattr(ns, "enable", None)),
        strict=bool(ns.strict),
        emulate_npu=emulate,
        npu_version=version,
        profile=os.path.abspath(ns.profile) if ns.profile else None,
        brake_at=ns.brake_at,
        check_precision=bool(getattr(ns, "check_precision", False)),
        report=os.path.abspath(ns.report) if ns.report is not None else None,
    )


# ---------------------------------------------------------------------------- running


def run(options: RunOptions, target: RunTarget, *, verbose: bool = False) -> int:
    """Patch this process, export the options to child processes, run the program.

    Returns the exit status; ``SystemExit`` raised by the program propagates.
    """
    from . import bootstrap as _bootstrap

    # A script is read before anything changes, so a wrong path is a plain usage error.
    # A module is looked up after the patches are applied: finding it imports its parent
    # packages (torch, for torch.distributed.run), and they must be imported patched.
    try:
        loaded = load_script(target) if target.kind == "script" else None
    except NotRunnable as exc:  # python prints it and exits 1, as here
        _print_uncaught(exc.error)
        return 1
    _check_plugin_names(options)
    if options.report is not None:
        from .report_file import target_problem
        from .run_parts import new_location

        problem = target_problem(options.report)
        if problem is not None:
            raise UsageError(f"--report {problem}")
        # Named, not made: the first child with a report to leave makes it (_run_parts).
        options = options._replace(report_parts=new_location(), main_pid=os.getpid())
    os.environ[ENV_VAR] = options.to_env()
    from .._model.errors import PatchError

    try:
        report = _bootstrap.start(options, role="main")
    except _bootstrap.StartError as exc:
        raise UsageError(str(exc)) from None
    except PatchError as exc:
        if not str(exc).startswith(_bootstrap.STRICT_PREFIX):
            # Not a failure strict mode turned into an error, but one apply() raises in
            # any mode (a bad switch, conflicting groups): a usage error, said as it is.
            raise UsageError(str(exc)) from None
        _bootstrap.set_exit_status(1)
        stopped = "the program before its first line"
        raise UsageError(_bootstrap.strict_stop_message(exc, stopped=stopped), status=1) from None
    if verbose:
        import atexit

        atexit.register(lambda: print(report.table(verbose=True), file=sys.stderr))
    else:
        _say_broken_plugins(report)
    try:
        code, prepare = loaded if loaded is not None else load_module(target)
    except NotRunnable as exc:
        _print_uncaught(exc.error)
        _bootstrap.set_exit_status(1)
        return 1
    if not options.emulate_npu:  # said of a program that is about to run, not of a typo
        _say_redirects_inactive(report, target)
    prepare()
    status = _execute(code)
    _bootstrap.set_exit_status(status)
    return status


def _check_plugin_names(options: RunOptions) -> None:
    """An allow-list name that no installed plugin has is a usage error, said with a "did you mean".

    ``--plugins torhc`` would otherwise run the program with no plugin at all, which
    looks like a run that worked; nobody lists a plugin they do not want loaded.
    """
    if options.plugins is not None:
        switch, names = "--plugins", list(options.plugins)
    else:
        switch = "ASCEND_PATCH_PLUGINS"
        names = list(_names([os.environ.get(switch, "")]))
    if not names:
        return
    from .._discovery.hookspecs import PROJECT_NAME
    from .._discovery.metadata import metadata
    from .._discovery.metadata import normalize_name
    from .._discovery.registry import close_match
    from .._discovery.registry import unknown_names

    installed = metadata.entry_points(PROJECT_NAME)
    known = {i.name for i in installed} | {normalize_name(i.distribution) for i in installed}
    problems = []
    for name in unknown_names(names, known):
        hint = close_match(name, sorted(i.name for i in installed))
        listed = ", ".join(sorted(i.name for i in installed)) or "none"
        problems.append(
            f"{switch} names {name!r}, which is not an installed plugin "
            + (
                f"(did you mean {hint!r}? installed: {listed})"
                if hint
                else f"(installed: {listed})"
            )
        )
    if problems:
        raise UsageError("; ".join(problems))


def _say_broken_plugins(report: Any) -> None:
    """One line per plugin left out, and per warning (an unknown name in --disable, say):
    without -v the report is not printed, and --strict is off."""
    from .._model.report import FAILED

    for warning in report.warnings:
        print(f"ascend-patch run: warning: {warning}", file=sys.stderr)
    for record in report.records:
        if record.kind == "plugin" and record.status is FAILED:
            print(
                f"ascend-patch run: {record.reason} -- running without it "
                "(-v prints the report at exit; --strict stops instead)",
                file=sys.stderr,
            )


def _say_redirects_inactive(report: Any, target: RunTarget) -> None:
    """One stderr line when torch_npu is missing and plugins hold their CUDA->NPU patches back.

    Without it the program runs as under plain python -- on the CPU, or CUDA -- and
    nothing says so; the way to run its NPU code paths here is the emulator. Said once,
    in the process run runs the program in (its children do not repeat it).
    """
    import importlib.util

    from .._model.report import SKIPPED

    if importlib.util.find_spec("torch_npu") is not None:
        return
    held = [
        r
        for r in report.records
        if r.kind == "group" and r.status is SKIPPED and "torch-npu" in (r.reason or "")
    ]
    if not held:
        return  # no loaded plugin redirects anything to the NPU
    from .._discovery.metadata import metadata
    from .bootstrap import EMULATOR_GROUP

    program = " ".join(["-m", target.name] if target.kind == "module" else [target.name])
    how = f"ascend-patch run --emulate-npu {program} ..."
    if metadata.entry_point(EMULATOR_GROUP, "torch_npu") is None:
        from .install_advice import emulator_install

        how = f"{emulator_install()}, then {how}"
    print(
        f"ascend-patch run: note: torch_npu is not installed, so the CUDA->NPU redirects are "
        f"inactive ({len(held)} patch group{'s' if len(held) != 1 else ''} need it) and the "
        f"program runs as under python. To run its NPU code paths on the CPU: {how}",
        file=sys.stderr,
    )


def _execute(code: types.CodeType) -> int:
    main = sys.modules["__main__"]
    try:
        exec(code, main.__dict__)
    except SystemExit as exc:
        from . import bootstrap as _bootstrap

        _bootstrap.set_exit_status(_exit_status_of(exc))
        raise
    except BaseException as exc:
        _print_uncaught(exc)
        if isinstance(exc, KeyboardInterrupt):
            _die_of_sigint()
        return 1
    return 0


def _exit_status_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    return 1


def _print_uncaught(exc: BaseException) -> None:
    """Print like Python's top level: through sys.excepthook, without the launcher's frames."""
    import runpy

    hidden = {*_LAUNCHER_FILES, getattr(runpy, "__file__", None)}
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in hidden:
        tb = tb.tb_next
    exc.__traceback__ = tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except Exception:
        import traceback

        traceback.print_exception(type(exc), exc, tb)


def _die_of_sigint() -> None:
    # Python ends an uncaught KeyboardInterrupt by dying of SIGINT, so that shells and
    # parents see "interrupted" (status 130 / -2), after running the exit handlers.
    import atexit
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is not None:
        run_exitfuncs()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
