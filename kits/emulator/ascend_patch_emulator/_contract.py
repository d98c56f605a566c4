"""The contract check: every torch_npu op a plugin calls exists, and the call binds,
in every torch_npu version the plugin supports.

Calls are found two ways and checked the same way:

* statically, by :func:`scan_sources`: an ``ast`` scan of the plugin's package for
  ``torch_npu.<op>(...)``, ``torch.ops.npu.<op>[.<overload>](...)``, names bound by
  ``from torch_npu import <op>`` or ``with_imports(("torch_npu", "<op>"))``, plain
  references to them and ``"torch_npu:<op>"`` replacement strings;
* at run time, by :class:`CallRecorder`: the emulator reports every op call it
  dispatches to :func:`record_call`, and the caller's file and line say which
  plugin made it.

Binding follows torch's rules for schema calls, read from the committed schema data
(no torch needed): at most as many positionals as there are arguments before ``*``,
only declared keywords, no argument twice, every argument without a default given.
Keyword names are the registered ones: torch_npu renames its yaml's ``self`` to
``input`` when it registers an op, so ``self=`` is flagged and ``input=`` binds.
A call through the op packet (``torch_npu.npu_x``) binds if any overload accepts it.

A plugin declares the torch_npu versions it supports with a ``torch-npu``
requirement in its distribution metadata (``[project.optional-dependencies]
npu = ["torch-npu>=2.6"]``); without one it is checked against every version with
data. A call reached only on some versions (behind a feature test) carries a
``# contract: torch-npu>=2.9`` comment on one of its lines or on the header line of
an enclosing ``def``/``if``/``with``/``try``/``for``/``while``.
"""

from __future__ import annotations

import ast
import difflib
import os
import sys
import threading
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

from ._scan import OpCall
from ._scan import all_op_names
from ._scan import contract_markers
from ._scan import overload_name
from ._scan import scan_sources
from ._scan import versions_for
from ._schemas import OpSchema
from ._schemas import available_versions
from ._schemas import load_schemas


__all__ = [
    "CallRecorder",
    "Mismatch",
    "OpCall",
    "PluginCheck",
    "RecordedCall",
    "check_calls",
    "check_plugin",
    "check_plugins",
    "format_mismatches",
    "record_call",
    "scan_sources",
    "supported_versions",
]

_EMULATOR_DIR = os.path.dirname(os.path.abspath(__file__))


class Mismatch(NamedTuple):
    """A call that does not bind (or an op that is missing) in one torch_npu version."""

    plugin: str
    site: str
    op: str
    version: str
    message: str

    def __str__(self) -> str:
        return f"{self.plugin}: {self.site}: {self.message}"


class PluginCheck(NamedTuple):
    """What :func:`check_plugin` looked at and found."""

    plugin: str
    #: The package folder that was scanned.
    root: Path
    #: The torch_npu versions checked.
    versions: tuple[str, ...]
    calls: tuple[OpCall, ...]
    mismatches: tuple[Mismatch, ...]


# --------------------------------------------------------------------------- versions


def supported_versions(spec: str | None = None) -> list[str]:
    """The versions with schema data that satisfy ``spec`` (``">=2.6"``), oldest first."""
    versions = available_versions()
    if not spec or not spec.strip():
        return versions
    from packaging.specifiers import InvalidSpecifier
    from packaging.specifiers import SpecifierSet

    try:
        specifier = SpecifierSet(spec.strip())
    except InvalidSpecifier:
        raise ValueError(
            f"invalid torch-npu version specifier {spec!r}; write it like '>=2.6' or '>=2.6,<2.13'"
        ) from None
    return [v for v in versions if specifier.contains(v, prereleases=True)]


def _declared_spec(distribution: str) -> str | None:
    """The ``torch-npu`` specifier in ``distribution``'s requirements (all extras)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        lines = requires(distribution) or []
    except PackageNotFoundError:
        return None
    specs = [
        str(req.specifier)
        for req in map(Requirement, lines)
        if canonicalize_name(req.name) == "torch-npu"
    ]
    if not specs:
        return None
    return ",".join(s for s in specs if s)


# --------------------------------------------------------------------------- binding


def _bind_problems(call: OpCall, schema: OpSchema) -> list[str]:
    """Why ``call`` does not bind to ``schema`` (empty when it does)."""
    arguments = schema.arguments
    positional_names = [a.name for a in arguments if not a.kwarg_only]
    keyword_only = [a.name for a in arguments if a.kwarg_only]
    problems: list[str] = []
    given = call.positional
    if given is not None and given > len(positional_names):
        problem = (
            f"takes at most {len(positional_names)} positional argument"
            f"{'' if len(positional_names) == 1 else 's'} but {given} were given"
        )
        hit = keyword_only[: given - len(positional_names)]
        if hit:
            listed = ", ".join(f"'{n}'" for n in hit)
            problem += f" ({listed} {'is' if len(hit) == 1 else 'are'} keyword-only)"
        problems.append(problem)
    names = [a.name for a in arguments]
    for keyword in call.keywords:
        if keyword not in names:
            close = difflib.get_close_matches(keyword, names, n=1, cutoff=0.5)
            if keyword == "self" and "input" in names:
                hint = "schema has 'input': torch_npu registers its yaml's 'self' as 'input'"
            elif close:
                hint = f"schema has '{close[0]}'"
            else:
                hint = f"keywords: {', '.join(names) or 'none'}"
            problems.append(f"no keyword '{keyword}' ({hint})")
        elif given is not None and keyword in positional_names[:given]:
            problems.append(f"argument '{keyword}' given by position and by keyword")
    if given is not None and not call.more_keywords:
        missing = [
            a.name
            for index, a in enumerate(arguments)
            if a.default is None
            and a.name not in call.keywords
            and (a.kwarg_only or index >= given)
        ]
        if missing:
            listed = ", ".join(f"'{n}'" for n in missing)
            problems.append(f"missing required argument{'s' if len(missing) > 1 else ''} {listed}")
    return problems


def _call_problem(call: OpCall, version: str) -> str | None:
    """What is wrong with ``call`` in ``version`` (``"<op>: <problem>"``), or ``None``."""
    schemas = load_schemas(version)
    if call.overload is None:
        candidates = [s for s in schemas.values() if s.name == call.op]
    else:
        found = schemas.get(f"{call.op}.{call.overload}" if call.overload else call.op)
        candidates = [found] if found is not None else []
    if not candidates:
        return _missing(call, version, schemas)
    if not call.called:
        return None
    failures = []
    for schema in candidates:
        problems = _bind_problems(call, schema)
        if not problems:
            return None
        failures.append((schema, "; ".join(problems)))
    if len(failures) == 1:
        return f"{call.target}: {failures[0][1]}"
    each = "; ".join(f"{s.qualified}: {p}" for s, p in failures)
    return f"{call.target}: no overload accepts the call ({each})"


def _missing(call: OpCall, version: str, schemas: Mapping[str, OpSchema]) -> str:
    if call.overload is not None and any(s.name == call.op for s in schemas.values()):
        overloads = sorted(s.overload or "default" for s in schemas.values() if s.name == call.op)
        return f"{call.target}: no such overload (overloads there: {', '.join(overloads)})"
    elsewhere = [
        v for v in available_versions() if any(s.name == call.op for s in load_schemas(v).values())
    ]
    if elsewhere:
        where = f"it exists in {', '.join(elsewhere)}"
    else:
        close = difflib.get_close_matches(call.op, sorted(all_op_names()), n=1)
        where = "no version with data has it"
        if close:
            where += f"; did you mean '{close[0]}'?"
    return f"{call.target}: no such op ({where})"


def check_calls(plugin: str, calls: Iterable[OpCall], versions: Sequence[str]) -> list[Mismatch]:
    """Check each call against each of ``versions`` (narrowed by the call's own marker)."""
    mismatches: list[Mismatch] = []
    seen: set[Mismatch] = set()
    for call in calls:
        targets = versions
        if call.versions:
            try:
                allowed = set(supported_versions(call.versions))
            except ValueError as error:
                raise ValueError(f"{plugin}: {call.site}: contract comment: {error}") from None
            targets = [v for v in versions if v in allowed]
        for version in targets:
            problem = _call_problem(call, version)
            if problem is None:
                continue
            message = f"{problem} in torch_npu {version}"
            mismatch = Mismatch(plugin, call.site, call.target, version, message)
            if mismatch not in seen:
                seen.add(mismatch)
                mismatches.append(mismatch)
    return mismatches


def format_mismatches(mismatches: Iterable[Mismatch]) -> str:
    """One line per plugin, site and problem, with the versions it occurs in listed once."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for m in mismatches:
        problem = m.message.removesuffix(f" in torch_npu {m.version}")
        grouped.setdefault((m.plugin, m.site, problem), []).append(m.version)
    return "\n".join(
        f"{plugin}: {site}: {problem} [torch_npu {', '.join(versions)}]"
        for (plugin, site, problem), versions in grouped.items()
    )


# --------------------------------------------------------------------------- run time


class RecordedCall(NamedTuple):
    """An op call the emulator dispatched, with the file and line that made it."""

    op: str
    overload: str | None
    positional: int
    keywords: tuple[str, ...]
    file: str
    line: int


_active: list[CallRecorder] = []
_active_lock = threading.Lock()


class CallRecorder:
    """Collects the op calls reported to :func:`record_call` while it is entered.

    ::

        with CallRecorder() as recorder:
            run_the_plugin_under_the_emulator()
        mismatches = check_plugin(path, recorded=recorder.calls).mismatches

    Recorders nest and may be used from several threads; each distinct call
    (op, arguments shape, site) is kept once.
    """

    def __init__(self) -> None:
        self._calls: dict[RecordedCall, None] = {}
        self._lock = threading.Lock()

    @property
    def calls(self) -> list[RecordedCall]:
        with self._lock:
            return list(self._calls)

    def record(self, call: RecordedCall) -> None:
        with self._lock:
            self._calls.setdefault(call, None)

    def __enter__(self) -> CallRecorder:
        with _active_lock:
            _active.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with _active_lock:
            _active.remove(self)


def record_call(
    op: str,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    site: tuple[str, int] | None = None,
) -> None:
    """Report one op call to the active recorders (a no-op when none is active).

    ``op`` is the name the caller used: ``"npu_rms_norm"`` for the packet, or
    ``"npu_rms_norm.default"`` / ``"npu_max.dim"`` for an overload (an ``npu::``
    prefix is dropped). ``site`` is ``(file, line)``; by default it is the first
    frame outside the emulator and torch, i.e. the code that called the op.
    """
    if not _active:
        return
    name = op.removeprefix("npu::")
    base, dot, overload = name.partition(".")
    if site is None:
        site = _caller_site()
    call = RecordedCall(
        base,
        overload_name(overload) if dot else None,
        len(args),
        tuple(kwargs),
        os.path.abspath(site[0]),
        site[1],
    )
    with _active_lock:
        recorders = list(_active)
    for recorder in recorders:
        recorder.record(call)


def _caller_site() -> tuple[str, int]:
    skip = [_EMULATOR_DIR + os.sep]
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file:
        skip.append(os.path.dirname(os.path.abspath(torch_file)) + os.sep)
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(tuple(skip)):
            return filename, frame.f_lineno
        if frame.f_back is None:
            break
        frame = frame.f_back
    return os.path.abspath(frame.f_code.co_filename), frame.f_lineno


def _recorded_in(root: Path, recorded: Iterable[RecordedCall]) -> list[OpCall]:
    """The recorded calls made from files under ``root``, as :class:`OpCall` rows."""
    root = root.resolve()
    calls: list[OpCall] = []
    markers: dict[str, list[tuple[int, int, str]]] = {}
    for call in recorded:
        path = Path(call.file).resolve()
        inside = path.is_relative_to(root) if root.is_dir() else path == root
        if not inside:
            continue
        relative = path.relative_to(root.parent)
        if call.file not in markers:
            try:
                source = path.read_text(encoding="utf-8")
                markers[call.file] = contract_markers(source, ast.parse(source))
            except (OSError, SyntaxError, ValueError):
                markers[call.file] = []
        calls.append(
            OpCall(
                call.op,
                call.overload,
                f"{relative.as_posix()}:{call.line}",
                call.positional,
                call.keywords,
                False,
                True,
                versions_for(call.line, call.line, markers[call.file]),
            )
        )
    return calls


# --------------------------------------------------------------------------- plugins


def check_plugin(
    root: str | os.PathLike[str],
    *,
    plugin: str | None = None,
    torch_npu: str | None = None,
    recorded: Iterable[RecordedCall] = (),
) -> PluginCheck:
    """Check one plugin's sources (a package folder or a file) and its recorded calls.

    ``plugin`` names it in the mismatches (default: the folder name); ``torch_npu``
    is the specifier of the versions it supports (default: every version with data).
    """
    path = Path(root)
    label = plugin or path.stem
    versions = supported_versions(torch_npu)
    calls = [*scan_sources(path), *_recorded_in(path, recorded)]
    if not versions:
        known = ", ".join(available_versions())
        problem = Mismatch(
            label,
            f"{label} metadata",
            "",
            torch_npu or "",
            f"no torch_npu schema data matches torch-npu{torch_npu} (data: {known}); "
            "add a version to VERSIONS in tools/extract_npu_schemas.py and run it",
        )
        return PluginCheck(label, path, (), tuple(calls), (problem,))
    mismatches = check_calls(label, calls, versions)
    return PluginCheck(label, path, tuple(versions), tuple(calls), tuple(mismatches))


def check_plugins(
    names: Iterable[str] | None = None, *, recorded: Iterable[RecordedCall] = ()
) -> list[PluginCheck]:
    """Check every installed ascend-patch plugin (or those with entry-point ``names``).

    A plugin's sources are its entry point's top-level package; the versions come
    from the ``torch-npu`` requirement of its distribution. An unknown name raises.
    """
    from importlib.metadata import entry_points
    from importlib.util import find_spec

    wanted = None if names is None else set(names)
    # The entry-point group every plugin is published in (docs/plugin-authors.md).
    found = {ep.name: ep for ep in entry_points(group="ascend_patch")}
    if wanted is not None and wanted - set(found):
        missing = ", ".join(sorted(wanted - set(found)))
        raise LookupError(
            f"no installed ascend-patch plugin named {missing}; installed: {', '.join(sorted(found))}"
        )
    recorded = list(recorded)
    checks = []
    for name in sorted(found):
        if wanted is not None and name not in wanted:
            continue
        entry = found[name]
        package = entry.value.partition(":")[0].strip().partition(".")[0]
        spec = find_spec(package)
        if spec is None or not (spec.submodule_search_locations or spec.origin):
            raise LookupError(f"plugin {name!r}: cannot find the sources of package {package!r}")
        locations = list(spec.submodule_search_locations or [])
        root = Path(locations[0]) if locations else Path(str(spec.origin))
        distribution = entry.dist.name if entry.dist is not None else None
        declared = _declared_spec(distribution) if distribution else None
        checks.append(check_plugin(root, plugin=name, torch_npu=declared, recorded=recorded))
    return checks
