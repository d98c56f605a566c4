"""Finding and reading the program ``ascend-patch run`` runs, as ``python`` would.

A script is compiled (a ``.pyc`` read) before anything is patched, so a wrong path is
a plain usage error (a script with NUL bytes or undecodable bytes is read by Python's
own file reader: :mod:`.script_source`); a module, a directory or a zip file with ``__main__.py`` is
looked up with ``python -m``'s own lookup. ``prepare()`` then gives the program the
``sys.argv``, ``sys.path[0]`` and fresh ``__main__`` that Python gives it. A program
that cannot start -- it does not compile, its package raises on import -- raises
:class:`NotRunnable` carrying what Python would print.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

from .bootstrap import ENV_VAR
from .script_source import compile_script


__all__ = ["NotRunnable", "RunTarget", "UsageError", "load_module", "load_script"]


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


class NotRunnable(Exception):
    """The program cannot start (it does not compile, its package fails to import)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


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
    """The file to run: ``name`` itself, or a Python script found on PATH (``torchrun``).

    Only a file that is not there is looked for on PATH; any other reason it cannot be
    reached (EACCES, ENOTDIR, ELOOP ...) is said as ``python`` says it, with its errno.
    """
    try:
        os.stat(name)
        return name
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise UsageError(_cannot_open(name, exc)) from None
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


def _cannot_open(name: str, exc: OSError) -> str:
    """python's words for a script it cannot open: the errno and the OS's reason, not the path twice."""
    return f"can't open file {os.path.abspath(name)!r}: [Errno {exc.errno}] {exc.strerror}"


def _is_python_script(path: str) -> bool:
    if path.endswith((".py", ".pyw")):
        return True
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def load_script(target: RunTarget) -> tuple[types.CodeType, Callable[[], None]]:
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
            code = compile_script(source, abspath)
    except OSError as exc:
        raise UsageError(_cannot_open(abspath, exc)) from None
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise NotRunnable(exc) from None

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
    except Exception as exc:  # a __main__.py that does not compile
        raise NotRunnable(exc) from None
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


def load_module(target: RunTarget) -> tuple[types.CodeType, Callable[[], None]]:
    # Python searches for the module with the working directory first on sys.path.
    cwd = os.getcwd()
    saved = list(sys.path)
    _set_path0(cwd)
    try:
        _name, spec, code = _module_details()(target.name)
    except ImportError as exc:
        raise UsageError(str(exc), status=1) from None  # python -m exits 1 here too
    except Exception as exc:  # the module does not compile, its package raises on import
        raise NotRunnable(exc) from None
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
