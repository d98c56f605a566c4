"""The start hook: patch a process at start-up when ``ascend-patch run`` asked for it.

``ascend-patch run`` writes its options, as JSON, into the environment variable
``ASCEND_PATCH_RUN``; every process started below it inherits the variable. The core
distribution installs ``ascend_patch_core_start.pth`` into site-packages, whose one
line imports this module only when the variable is set: an unrelated interpreter
pays one dictionary lookup and imports nothing.

The hook does not patch while ``site`` is still reading ``.pth`` files. They are
read in name order, so path entries added by later ones (a plugin installed in
develop mode by some tools) would still be missing from plugin discovery. Instead it
puts a finder on ``sys.meta_path`` that waits for ``site`` to import
``sitecustomize`` -- the last step of start-up, after every ``.pth`` file -- applies
the patches, removes itself and declines, so a user's own ``sitecustomize`` is found
and run as usual. ``python -S`` (no ``site``) runs no start hook at all.

``ASCEND_PATCH_RUN=1`` (or ``true``/``on``) starts with default options; launchers that
cannot be wrapped by ``ascend-patch run`` can export it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any
from typing import NamedTuple

from .._model.env_flags import CLI_PLUGIN_TIMEOUT_S
from .._model.env_flags import FALSE_WORDS
from .._model.env_flags import TRUE_WORDS
from ..imports._hub import remove_finder


__all__ = [
    "ENV_VAR",
    "PTH_NAME",
    "PTH_TEXT",
    "RUN_REPORT_SCHEMA",
    "STRICT_PREFIX",
    "RunOptions",
    "StartError",
    "set_exit_status",
    "start",
    "start_from_pth",
    "started_options",
    "strict_stop_message",
]

#: The variable ``ascend-patch run`` sets; its value is :meth:`RunOptions.to_env`.
ENV_VAR = "ASCEND_PATCH_RUN"
#: The file the core distribution installs into site-packages.
PTH_NAME = "ascend_patch_core_start.pth"
#: Its exact text, as the wheel installs it (start_hook/ascend_patch_core_start.pth in the
#: source tree; a test keeps the two equal). Kept here because the installed package does
#: not carry a second copy of the file, and doctor compares the installed hook with this.
PTH_TEXT = (
    "# ascend-patch start hook (docs/cli.md): does nothing unless `ascend-patch run` set ASCEND_PATCH_RUN.\n"
    'import os; os.environ.get("ASCEND_PATCH_RUN") and '
    '__import__("ascend_patch_core._cli.bootstrap", fromlist=["_"]).start_from_pth()\n'
)
#: Schema of the file ``ascend-patch run --report PATH`` writes (docs/cli-reference.md).
RUN_REPORT_SCHEMA = "ascend-patch-run/1"
#: Where the NPU emulator (ascend-patch-emulator) publishes its ``activate``.
EMULATOR_GROUP = "ascend_patch.emulator"

#: How the core's strict-mode errors begin (``PatchError`` messages); other PatchErrors
#: are raised in any mode (a bad switch, conflicting groups).
STRICT_PREFIX = "ascend-patch (strict): "

# The words of every other on/off ASCEND_PATCH_* switch; an empty ASCEND_PATCH_RUN is off.
_ON = TRUE_WORDS
_OFF = ("", *FALSE_WORDS)


class StartError(Exception):
    """The options cannot be honoured (say, the emulator is missing). The message says why."""


class RunOptions(NamedTuple):
    """What ``ascend-patch run`` asks of every process it starts."""

    #: Plugin, group or patch names to disable (``Patcher.disable``).
    disable: tuple[str, ...] = ()
    #: Allow-list of plugins (``ASCEND_PATCH_PLUGINS``); None = all.
    plugins: tuple[str, ...] | None = None
    #: Opt-in patch groups to turn on (``Patcher.enable``).
    enable: tuple[str, ...] = ()
    strict: bool = False
    emulate_npu: bool = False
    #: torch_npu version the emulator imitates; None = its default.
    npu_version: str | None = None
    profile: str | None = None
    brake_at: int | None = None
    #: Compare patched calls with their originals on live inputs (with_precision_check).
    check_precision: bool = False
    #: Where the main process writes the run report.
    report: str | None = None
    #: Directory where the other processes leave their reports for the main one.
    report_parts: str | None = None
    #: The process that writes ``report`` (the one ``ascend-patch run`` runs in).
    main_pid: int | None = None

    def to_env(self) -> str:
        return json.dumps(
            {
                key: list(value) if isinstance(value, tuple) else value
                for key, value in self._asdict().items()
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_env(cls, value: str) -> RunOptions | None:
        """Parse the variable's value; None when it says "off". Raises ValueError if malformed."""
        text = value.strip()
        if text.lower() in _OFF:
            return None
        if text.lower() in _ON:
            return cls()
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"expected 1 or a JSON object, got {text[:80]!r} ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        fields: dict[str, Any] = {}
        # Unknown keys are ignored: a newer `ascend-patch run` may start an older child.
        for key in cls._fields:
            if key in data and data[key] is not None:
                fields[key] = _checked(key, data[key])
        return cls(**fields)

    def same_patching(self, other: RunOptions) -> bool:
        """Whether both patch a process the same way (report destinations aside)."""
        keys = (
            "disable",
            "plugins",
            "enable",
            "strict",
            "emulate_npu",
            "npu_version",
            "profile",
            "brake_at",
            "check_precision",
        )
        return all(getattr(self, k) == getattr(other, k) for k in keys)


def _checked(key: str, value: Any) -> Any:
    expected: dict[str, type | tuple[type, ...]] = {
        "disable": list,
        "plugins": list,
        "enable": list,
        "strict": bool,
        "emulate_npu": bool,
        "npu_version": str,
        "profile": str,
        "brake_at": int,
        "check_precision": bool,
        "report": str,
        "report_parts": str,
        "main_pid": int,
    }
    kind = expected[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    if isinstance(value, list):
        if not all(isinstance(item, str) for item in value):
            raise ValueError(f"{key!r} must be a list of strings, got {value!r}")
        return tuple(value)
    return value


# ---------------------------------------------------------------------------- state

_started: RunOptions | None = None
_role: str | None = None
_exit_status: int | None = None
_pth_read = False


def started_options() -> RunOptions | None:
    """The options this process was patched with, or None if :func:`start` has not run."""
    return _started


def set_exit_status(status: int) -> None:
    """Record the program's exit status for the run report."""
    global _exit_status
    _exit_status = status


def start(options: RunOptions, *, role: str) -> Any:
    """Patch this process as ``options`` say; return the live report.

    ``role`` is ``"main"`` in the process ``ascend-patch run`` runs the program in and
    ``"child"`` in processes started through the start hook. Raises :class:`StartError`
    when the options cannot be honoured and, in strict mode, what ``apply()`` raises.
    """
    global _started, _role
    if _started is not None:
        # Already patched at start-up (ASCEND_PATCH_RUN was inherited): fine if the
        # patching is the same; the newer report destination wins.
        if not _started.same_patching(options):
            raise StartError(
                f"this process was already patched at start-up because {ENV_VAR} was set (by an "
                f"outer 'ascend-patch run'?) with other options; unset {ENV_VAR} or run it directly"
            )
        register = _started.report is None and options.report is not None
        _started, _role = options, role
        if register:
            import atexit

            atexit.register(_write_report)
        import ascend_patch_core

        return ascend_patch_core.default_patcher.report
    if options.emulate_npu:
        _activate_emulator(options.npu_version)
    import ascend_patch_core

    patcher = ascend_patch_core.default_patcher
    # A process `run` patches before its program starts is the command's: a plugin
    # that hangs fails after the commands' bound instead of hanging it (docs/plugin-authors.md).
    patcher._config.plugin_timeout = CLI_PLUGIN_TIMEOUT_S
    patcher.select_plugins(
        plugins=list(options.plugins) if options.plugins is not None else None,
        strict=True if options.strict else None,
    )
    if options.disable:
        patcher.disable(*options.disable)
    if options.enable:
        patcher.enable(*options.enable)
    if options.profile is not None:
        patcher.with_profiling(options.profile)
    if options.brake_at is not None:
        patcher.brake_at(options.brake_at)
    if options.check_precision:
        patcher.with_precision_check()
    _started, _role = options, role
    if options.report is not None:
        import atexit

        # Registered before the program runs, so it runs after the program's own handlers.
        atexit.register(_write_report)
    return patcher.apply()


def strict_stop_message(exc: BaseException, *, stopped: str) -> str:
    """What a process stopped by strict mode says: the failure once, then the way on.

    ``exc`` is the core's ``PatchError`` from ``apply()``; the core's own
    ``ascend-patch (strict): `` prefix is left out (the caller says who is talking).
    ``stopped``: what was stopped, e.g. "the program before its first line".
    """
    text = str(exc)
    if text.startswith(STRICT_PREFIX):
        text = text[len(STRICT_PREFIX) :]
    if "To run without it:" in text:  # a patch's own failure (_strict) says how to go on
        return text
    plugins, patches = _failed_names()
    way = ""
    if plugins or patches:
        names = [*plugins, *patches]
        way = f"To run without {'it' if len(names) == 1 else 'them'}: --disable {','.join(names)}"
        if plugins and not patches:  # the variable names plugins only
            way += f" (or ASCEND_PATCH_DISABLE={','.join(plugins)})"
        way += ". "
    return (
        f"{text} -- strict mode stopped {stopped}. {way}To go on with the failure recorded "
        "in the report instead: run without --strict (and without ASCEND_PATCH_STRICT=1)"
    )


def _failed_names() -> tuple[list[str], list[str]]:
    """The plugins, and the groups or patches, that failed: what --disable leaves out."""
    import ascend_patch_core

    from .._model.report import FAILED

    plugins: list[str] = []
    patches: list[str] = []
    for record in ascend_patch_core.default_patcher.report.records:
        if record.status is not FAILED:
            continue
        names = plugins if record.kind == "plugin" else patches
        name = record.name if record.kind == "plugin" else record.group or record.name
        if name not in names:
            names.append(name)
    return plugins, patches


def _activate_emulator(version: str | None) -> None:
    from .._discovery.metadata import metadata

    # The emulator is its own distribution, found through its entry point: the engine
    # never imports it (docs/core.md, "Dev kits").
    info = metadata.entry_point(EMULATOR_GROUP, "torch_npu")
    if info is None:
        from .install_advice import emulator_install

        # The command that works here: from the clone the core came from, if it did.
        raise StartError(
            "--emulate-npu needs the NPU emulator (the distribution ascend-patch-emulator), "
            f"which is not installed: {emulator_install()}"
        )
    try:
        activate = info.load()
    except Exception as exc:
        raise StartError(
            f"--emulate-npu: the emulator ({info.value} from {info.distribution} {info.version}) "
            f"cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        activate(version=version)
    except Exception as exc:  # an unknown version, torch_npu already imported, ...
        # Some errors have no message (MemoryError): their type is then the reason.
        raise StartError(f"--emulate-npu: {str(exc) or type(exc).__name__}") from exc


# ---------------------------------------------------------------------------- the .pth hook


class _StartAfterSite:
    """A meta-path finder that starts the patches when ``site`` imports ``sitecustomize``."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname != "sitecustomize":
            return None
        # Not sys.meta_path.remove(self): importlib is walking that very list right
        # now, and an in-place removal would make it skip the next finder.
        remove_finder(self)
        _start_child(self.options)
        return None  # the real sitecustomize, if any, is found by the next finder


def start_from_pth() -> None:
    """Called by ``ascend_patch_core_start.pth`` when ``ASCEND_PATCH_RUN`` is set."""
    global _pth_read
    if _pth_read or _started is not None:
        # site reads a site-packages directory twice when lib64 links to lib: one
        # start, and one message about a bad value, per process.
        return
    _pth_read = True
    try:
        options = RunOptions.from_env(os.environ.get(ENV_VAR, ""))
    except ValueError as exc:
        print(f"ascend-patch: {ENV_VAR} is ignored: {exc}", file=sys.stderr)
        return
    if options is None:
        return
    site = sys.modules.get("site")
    if getattr(getattr(site, "__spec__", None), "_initializing", False):
        sys.meta_path.insert(0, _StartAfterSite(options))
    else:  # a .pth read later by site.addsitedir(): start-up is over
        _start_child(options)


def _start_child(options: RunOptions) -> None:
    try:
        start(options, role="child")
    except Exception as exc:
        from .._model.errors import PatchError

        if isinstance(exc, PatchError) and options.strict:
            detail = strict_stop_message(exc, stopped="this process before its first line")
        else:
            detail = f"{type(exc).__name__}: {exc}"
        message = f"ascend-patch (start hook, pid {os.getpid()}): {detail}"
        print(message, file=sys.stderr, flush=True)
        if options.strict:
            # Raising here would surface as "Fatal Python error: init_import_site";
            # strict mode means the process must not run unpatched.
            os._exit(1)


# ---------------------------------------------------------------------------- run report


def _process_entry() -> dict[str, Any]:
    import ascend_patch_core

    entry: dict[str, Any] = {
        "pid": os.getpid(),
        "role": _role,
        "argv": list(sys.argv),
    }
    ranks = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k in os.environ}
    if ranks:
        entry["distributed"] = ranks
    entry["report"] = ascend_patch_core.default_patcher.report.to_dict()
    return entry


def _write_report() -> None:
    options = _started
    if options is None or options.report is None:
        return
    from . import run_parts as _run_parts
    from .report_file import write_json

    try:
        is_main = _role == "main" and options.main_pid == os.getpid()
        if not is_main:  # a child, or a forked copy of the main process
            # A process that outlives the main one (multiprocessing's resource tracker)
            # leaves nothing: its report has no reader any more.
            if options.report_parts:
                entry = _process_entry()
                entry["role"] = "child"
                _run_parts.deliver(options.report_parts, options.main_pid, entry)
            return
        children = _run_parts.collect(options.report_parts)
        data = {
            "schema": RUN_REPORT_SCHEMA,
            "exit_status": _exit_status,
            "options": {
                k: v
                for k, v in json.loads(options.to_env()).items()
                if k not in ("report_parts", "main_pid")
            },
            "processes": [_process_entry(), *children],
        }
        write_json(options.report, data)
    except Exception as exc:  # at exit there is nobody left to raise to
        print(
            f"ascend-patch: could not write the run report to {options.report}: "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
