"""Compiling a script as ``python script.py`` does, down to how it reads the bytes.

``python script.py`` reads the file through CPython's file tokenizer; ``compile()``
-- what ``ascend-patch run`` uses, like ``runpy`` and ``importlib`` -- reads a bytes
object through the string tokenizer. The two agree on every file that decodes
cleanly, and disagree on the others: a NUL byte is "source code cannot contain null
bytes" with the file and line in one, a ``ValueError`` without them in the other;
an undecodable byte with no encoding declared is "Non-UTF-8 code starting with
'\\xff' in file ... but no encoding declared" in one and "(unicode error) 'utf-8'
codec can't decode ..." in the other, or no error at all when the byte sits in a
comment. Both vary between Python versions (3.10 reports the line after the bad one).

So a script with a NUL byte, or one that its declared (or the default UTF-8)
encoding does not decode, is compiled by the interpreter's own file reader: a
short-lived ``python -I -S`` running :data:`_READER` hands the file to
``PyRun_SimpleFileExFlags`` -- what ``python script.py`` calls -- and stops it at the
``exec`` audit event (and, should that event ever move, at the first profiled call
of the script's frame), before the script's first line. It sends back the error, or
the compiled code when this Python does accept the file. Every other script, nearly
all of them, is compiled here with ``compile()``, at no extra cost.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import types


__all__ = ["compile_script", "read_like_python"]


# Run as `python -I -S -c _READER PATH`. Writes b"C" + marshal(code) when the file
# compiles, b"E" + JSON [type name, args] when it does not; never runs the file.
_READER = r"""
import ctypes, json, marshal, os, sys
path = sys.argv[1]
out = sys.stdout.buffer
def done(tag, payload, status):
    out.write(tag + payload)
    out.flush()
    os._exit(status)
def caught(code):
    if getattr(code, "co_filename", None) == path:
        done(b"C", marshal.dumps(code), 0)
def audit(event, args):
    if event == "exec" and args:
        caught(args[0])
def profile(frame, event, arg):
    if event == "call":
        caught(frame.f_code)
def excepthook(kind, exc, tb):
    try:
        payload = json.dumps([kind.__name__, list(exc.args)])
    except Exception:
        payload = json.dumps([kind.__name__, None])
    done(b"E", payload.encode(), 0)
sys.excepthook = excepthook
sys.addaudithook(audit)
sys.setprofile(profile)
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
fp = libc.fopen(os.fsencode(path), b"rb")
if not fp:
    os._exit(3)
run = ctypes.pythonapi.PyRun_SimpleFileExFlags
run.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
run(fp, os.fsencode(path), 1, None)
os._exit(4)
"""


def compile_script(source: bytes, abspath: str) -> types.CodeType:
    """The script's code, or the exception ``python abspath`` would print.

    Raises what ``python`` raises: ``SyntaxError`` (and ``ValueError``,
    ``RecursionError``, ``MemoryError`` from ``compile()``).
    """
    if _reads_differently(source):
        code = read_like_python(abspath)
        if code is not None:
            return code
    return compile(source, abspath, "exec", dont_inherit=True)


def _reads_differently(source: bytes) -> bool:
    """Whether the file and string tokenizers may disagree on ``source`` (see the module doc)."""
    if b"\0" in source:
        return True
    if source.isascii() and not any(b"coding" in line for line in source.split(b"\n", 2)[:2]):
        return False  # nearly every script: nothing to decode, no encoding declared
    import io
    import tokenize

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        source.decode(encoding)
    except (SyntaxError, UnicodeError, LookupError):
        return True
    return False


def read_like_python(abspath: str) -> types.CodeType | None:
    """Compile ``abspath`` with this interpreter's file reader, in a child interpreter.

    Returns the code; raises the error ``python abspath`` prints; None when the child
    could not tell (no ``sys.executable``, no ``ctypes``, a platform whose C library
    ``ctypes`` cannot hand a ``FILE *`` to Python): the caller compiles the bytes itself.
    """
    if not sys.executable or os.name != "posix":
        return None
    import subprocess

    flags = ["-O"] * min(sys.flags.optimize, 2) + [f"-W{w}" for w in sys.warnoptions]
    if sys.flags.dev_mode:
        flags += ["-X", "dev"]
    try:
        child = subprocess.run(
            [sys.executable, "-I", "-S", *flags, "-c", _READER, abspath],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    except OSError:
        return None
    tag, payload = child.stdout[:1], child.stdout[1:]
    if tag in (b"C", b"E") and child.stderr:  # compile-time warnings python shows too
        sys.stderr.write(child.stderr.decode(errors="backslashreplace"))
    if tag == b"C":
        import marshal

        code = marshal.loads(payload)
        return code if isinstance(code, types.CodeType) else None
    if tag == b"E":
        error = _rebuild(payload)
        if error is not None:
            raise error
    return None


def _rebuild(payload: bytes) -> BaseException | None:
    try:
        name, args = json.loads(payload)
    except ValueError:
        return None
    kind = getattr(builtins, name, None) if isinstance(name, str) else None
    if not (isinstance(kind, type) and issubclass(kind, BaseException)) or args is None:
        return None
    if issubclass(kind, SyntaxError) and len(args) == 2 and isinstance(args[1], list):
        args = [args[0], tuple(args[1])]  # (msg, (filename, lineno, offset, text, ...))
    try:
        return kind(*args)
    except Exception:
        return None
