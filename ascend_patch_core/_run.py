"""``ascend-patch run``: run a program unmodified, with the patches applied before its first line.

The program runs in this interpreter, the way ``python script.py`` / ``python -m
module`` run it: a fresh ``__main__`` module, ``sys.argv`` and ``sys.path[0]`` set as
Python sets them, ``SystemExit`` propagating as is and an uncaught exception printed
by ``sys.excepthook`` (without this module's frames) with exit status 1. Processes the
program starts are patched by the start hook (``_bootstrap``), which reads the
options from the ``ASCEND_PATCH_RUN`` variable set here.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

from ._bootstrap import ENV_VAR
from ._bootstrap import RunOptions


__all__ = [
    "EMULATED_DEVICES_VAR",
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

_THIS_FILE = __file__


class UsageError(Exception):
    """The command line is wrong; the message says how. ``status`` is the exit status."""

    def __init__(self, message: str, *, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class RunTarget(NamedTuple):
    #: "script" or "module".
    kind: str
    #: The script path as given, or the module name.
    name: str
    args: tuple[str, ...]


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
    if ns.brake_at is not None and ns.brake_at < 1:
        raise UsageError(f"--brake-at must be a positive number of steps, got {ns.brake_at}")
    emulate = ns.emulate_npu is not None
    version = ns.emulate_npu if isinstance(ns.emulate_npu, str) and ns.emulate_npu else None
    devices = getattr(ns, "emulated_devices", None)
    if devices is not None:
        if not emulate:
            raise UsageError("--emulated-devices N sets how many NPUs --emulate-npu provides")
        if devices < 1:
            raise UsageError(f"--emulated-devices must be a positive number, got {devices}")
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
        report=os.path.abspath(ns.report) if ns.report else None,
    )


# ---------------------------------------------------------------------------- running


def run(options: RunOptions, target: RunTarget, *, verbose: bool = False) -> int:
    """Patch this process, export the options to child processes, run the program.

    Returns the exit status; ``SystemExit`` raised by the program propagates.
    """
    from . import _bootstrap

    # A script is read before anything changes, so a wrong path is a plain usage error.
    # A module is looked up after the patches are applied: finding it imports its parent
    # packages (torch, for torch.distributed.run), and they must be imported patched.
    loaded = _load_script(target) if target.kind == "script" else None
    if options.report is not None:
        import tempfile

        parts = tempfile.mkdtemp(prefix="ascend-patch-run-")
        options = options._replace(report_parts=parts, main_pid=os.getpid())
    os.environ[ENV_VAR] = options.to_env()
    try:
        report = _bootstrap.start(options, role="main")
    except _bootstrap.StartError as exc:
        raise UsageError(str(exc)) from None
    if verbose:
        import atexit

        atexit.register(lambda: print(report.table(verbose=True), file=sys.stderr))
    code, prepare = loaded if loaded is not None else _load_module(target)
    prepare()
    status = _execute(code)
    _bootstrap.set_exit_status(status)
    return status


def _set_path0(entry: str) -> None:
    # Python puts the script's directory (or, for -m, the working directory) first,
    # unless -P / PYTHONSAFEPATH. Our own sys.path[0] is the launcher's directory.
    if getattr(sys.flags, "safe_path", False):
        return
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.insert(0, entry)


def _fresh_main(**attributes: Any) -> types.ModuleType:
    import builtins

    main = types.ModuleType("__main__")
    main.__dict__.update(
        __builtins__=builtins,
        __annotations__={},
        __cached__=None,
        __package__=None,
        __spec__=None,
        __loader__=None,
    )
    main.__dict__.update(attributes)
    return main


def _resolve_script(name: str) -> str:
    """The file to run: ``name`` itself, or a Python script found on PATH (``torchrun``)."""
    if os.path.exists(name):
        return name
    import shutil

    if os.sep not in name and (os.altsep is None or os.altsep not in name):
        found = shutil.which(name)
        if found and _is_python_script(found):
            return found
        if found:
            raise UsageError(
                f"{name!r} ({found}) is not a Python script, so it cannot run in this interpreter; "
                f"to patch the Python processes it starts, export {ENV_VAR}=1 (docs/cli.md)"
            )
    raise UsageError(
        f"can't open file {os.path.abspath(name)!r}: [Errno 2] No such file or directory"
    )


def _is_python_script(path: str) -> bool:
    if path.endswith((".py", ".pyw")):
        return True
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _load_script(target: RunTarget) -> tuple[types.CodeType, Callable[[], None]]:
    path = _resolve_script(target.name)
    argv0 = target.name if path == target.name else path
    if os.path.isdir(path) or _is_zipfile(path):
        return _load_archive(path, argv0, target.args)
    abspath = os.path.abspath(path)
    import io
    import pkgutil

    try:
        with io.open_code(abspath) as fh:
            code = pkgutil.read_code(fh)  # a compiled .pyc script
        if code is None:
            with io.open_code(abspath) as fh:
                source = fh.read()
            code = compile(source, abspath, "exec", dont_inherit=True)
    except OSError as exc:
        raise UsageError(f"can't open file {abspath!r}: {exc}") from None

    def prepare() -> None:
        from importlib.machinery import SourceFileLoader
        from importlib.machinery import SourcelessFileLoader

        loader_class = SourcelessFileLoader if abspath.endswith(".pyc") else SourceFileLoader
        sys.argv[:] = [argv0, *target.args]
        _set_path0(os.path.dirname(os.path.realpath(abspath)))
        sys.modules["__main__"] = _fresh_main(
            __name__="__main__", __file__=abspath, __loader__=loader_class("__main__", abspath)
        )

    return code, prepare


def _is_zipfile(path: str) -> bool:
    import zipfile

    return os.path.isfile(path) and zipfile.is_zipfile(path)


def _load_archive(
    path: str, argv0: str, args: tuple[str, ...]
) -> tuple[types.CodeType, Callable[[], None]]:
    """A directory or zip file with a ``__main__.py``: Python puts it first on sys.path."""
    saved_path = list(sys.path)
    # The lookup must not find the launcher's own __main__ in sys.modules.
    saved_main = sys.modules.pop("__main__", None)
    sys.path.insert(0, path)
    try:
        _name, spec, code = _module_details()("__main__")
    except ImportError:
        raise UsageError(
            f"can't find '__main__' module in {os.path.abspath(path)!r}", status=1
        ) from None
    finally:
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main

    def prepare() -> None:
        sys.argv[:] = [argv0, *args]
        _set_path0(os.path.abspath(path))
        sys.modules["__main__"] = _fresh_main(
            __name__="__main__",
            __file__=spec.origin,
            __spec__=spec,
            __loader__=spec.loader,
            __package__="",
            __cached__=spec.cached,
        )

    return code, prepare


def _module_details() -> Callable[[str], tuple[str, Any, types.CodeType]]:
    # runpy's module lookup is what `python -m` itself uses: packages run their
    # __main__, and its errors read exactly like Python's. It is private but has kept
    # this signature since Python 3.4; run_module() would restore the launcher's
    # __main__ afterwards, which atexit handlers and pickling must not see.
    import runpy

    details: Callable[[str], tuple[str, Any, types.CodeType]] = runpy._get_module_details  # type: ignore[attr-defined]
    return details


def _load_module(target: RunTarget) -> tuple[types.CodeType, Callable[[], None]]:
    # Python searches for the module with the working directory first on sys.path.
    cwd = os.getcwd()
    saved = list(sys.path)
    _set_path0(cwd)
    try:
        _name, spec, code = _module_details()(target.name)
    except ImportError as exc:
        raise UsageError(str(exc), status=1) from None  # python -m exits 1 here too
    finally:
        sys.path[:] = saved

    def prepare() -> None:
        sys.argv[:] = [spec.origin or target.name, *target.args]
        _set_path0(cwd)
        sys.modules["__main__"] = _fresh_main(
            __name__="__main__",
            __file__=spec.origin,
            __spec__=spec,
            __loader__=spec.loader,
            __package__=spec.parent,
            __cached__=spec.cached,
        )

    return code, prepare


def _execute(code: types.CodeType) -> int:
    main = sys.modules["__main__"]
    try:
        exec(code, main.__dict__)
    except SystemExit as exc:
        from . import _bootstrap

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

    hidden = {_THIS_FILE, getattr(runpy, "__file__", None)}
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
