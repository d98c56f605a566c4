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
import re
import sys
import threading
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

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
_MARKER = re.compile(r"#\s*contract:\s*torch[-_]npu\s*(?P<spec>[^#]*)", re.IGNORECASE)
#: Attributes of an op packet that are not overload names.
_PACKET_ATTRIBUTES = frozenset({"overloads", "op", "name", "default_overload"})


class OpCall(NamedTuple):
    """One use of a torch_npu op: a call site, or a bare reference to the op."""

    op: str
    #: ``None``: through the packet (any overload may bind); ``""``: the default overload.
    overload: str | None
    #: ``"<path>:<line>"``, the path relative to the scanned package's parent.
    site: str
    #: Positional arguments passed; ``None`` when unknown (``*args``).
    positional: int | None
    keywords: tuple[str, ...]
    #: ``**kwargs`` was passed: other keywords may arrive, required ones may be in it.
    more_keywords: bool = False
    #: ``False`` for a reference (``f = torch_npu.npu_x``): only existence is checked.
    called: bool = True
    #: A version specifier (``">=2.9"``) limiting the versions this call is checked
    #: against (a ``# contract: torch-npu...`` comment); ``""`` for all.
    versions: str = ""

    @property
    def target(self) -> str:
        """The op as written: ``npu_x``, ``npu_x.default`` or ``npu_x.out``."""
        if self.overload is None:
            return self.op
        return f"{self.op}.{self.overload or 'default'}"


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


# --------------------------------------------------------------------------- static scan


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; ``None`` for anything else."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    names.append(node.id)
    return names[::-1]


def _is_op_name(name: str) -> bool:
    """Whether ``torch_npu.<name>`` is an op (not a submodule or a Python helper).

    Every known op name counts, and so does any ``npu_*`` name, so a misspelt op
    (``npu_rms_nrom``) is reported rather than ignored.
    """
    return name in _all_op_names() or name.startswith(("npu_", "_npu_"))


@cache
def _all_op_names() -> frozenset[str]:
    return frozenset(op.name for v in available_versions() for op in load_schemas(v).values())


class _Aliases:
    """The names a module binds to torch, torch_npu, ``torch.ops.npu`` and to single ops."""

    def __init__(self) -> None:
        self.torch: set[str] = set()
        self.torch_npu: set[str] = set()
        self.namespace: set[str] = set()
        self.ops: dict[str, tuple[str, str | None]] = {}

    def collect(self, tree: ast.AST) -> None:
        # Assignments may refer to each other in any order: repeat until nothing new.
        while True:
            before = (len(self.torch), len(self.torch_npu), len(self.namespace), len(self.ops))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name == "torch":
                            self.torch.add(alias.asname or "torch")
                        elif alias.name == "torch_npu":
                            self.torch_npu.add(alias.asname or "torch_npu")
                        elif alias.name.startswith("torch.") and not alias.asname:
                            self.torch.add("torch")  # `import torch.nn` binds `torch`
                        elif alias.name.startswith("torch_npu.") and not alias.asname:
                            self.torch_npu.add("torch_npu")
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    self._from_import(node)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if isinstance(target, ast.Name):
                        self._assign(target.id, node.value)
                elif isinstance(node, ast.Call) and _chain(node.func) in (
                    ["with_imports"],
                    ["ascend_patch_core", "with_imports"],
                ):
                    self._with_imports(node)
            if before == (len(self.torch), len(self.torch_npu), len(self.namespace), len(self.ops)):
                return

    def _from_import(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            bound = alias.asname or alias.name
            if node.module == "torch_npu" and _is_op_name(alias.name):
                self.ops[bound] = (alias.name, None)
            elif node.module == "torch.ops" and alias.name == "npu":
                self.namespace.add(bound)

    def _assign(self, name: str, value: ast.expr) -> None:
        resolved = self.resolve(value)
        if resolved is not None:
            self.ops[name] = resolved
        elif _chain(value) in [[t, "ops", "npu"] for t in self.torch]:
            self.namespace.add(name)
        elif isinstance(value, ast.Name) and value.id in self.torch_npu:
            self.torch_npu.add(name)

    def _with_imports(self, node: ast.Call) -> None:
        for arg in node.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                module, _, alias = arg.value.partition(" as ")
                if module.strip() == "torch_npu":
                    self.torch_npu.add(alias.strip() or "torch_npu")
                elif module.strip() == "torch":
                    self.torch.add(alias.strip() or "torch")
            elif isinstance(arg, (ast.Tuple, ast.List)) and arg.elts:
                items = [e.value for e in arg.elts if isinstance(e, ast.Constant)]
                if len(items) != len(arg.elts) or not all(isinstance(i, str) for i in items):
                    continue
                if str(items[0]).strip() != "torch_npu":
                    continue
                for item in items[1:]:
                    name, _, alias = str(item).partition(" as ")
                    if _is_op_name(name.strip()):
                        self.ops[alias.strip() or name.strip()] = (name.strip(), None)

    def resolve(self, node: ast.expr) -> tuple[str, str | None] | None:
        """(op, overload or None) that ``node`` names, if it names a torch_npu op."""
        chain = _chain(node)
        if chain is None:
            return None
        head, rest = chain[0], chain[1:]
        if head in self.ops:
            op, overload = self.ops[head]
            if not rest:
                return op, overload
            return (op, _overload(rest[0])) if overload is None and len(rest) == 1 else None
        if head in self.torch and rest[:2] == ["ops", "npu"]:
            rest = rest[2:]
        elif not (
            head in self.namespace or (head in self.torch_npu and rest and _is_op_name(rest[0]))
        ):
            return None
        if len(rest) == 1:
            return rest[0], None
        if len(rest) == 2 and rest[1] not in _PACKET_ATTRIBUTES and not rest[1].startswith("_"):
            return rest[0], _overload(rest[1])
        return None

    def is_module(self, node: ast.expr) -> bool:
        """Whether ``node`` is torch_npu or ``torch.ops.npu`` (for ``getattr``)."""
        chain = _chain(node)
        return chain is not None and (
            (len(chain) == 1 and (chain[0] in self.torch_npu or chain[0] in self.namespace))
            or (len(chain) == 3 and chain[0] in self.torch and chain[1:] == ["ops", "npu"])
        )


def _overload(name: str) -> str:
    return "" if name == "default" else name


_STRING_REFERENCE = re.compile(r"^torch_npu[.:](?P<op>\w+)$")
_GUARDED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.With, ast.Try, ast.For, ast.While)


def _markers(source: str, tree: ast.AST) -> list[tuple[int, int, str]]:
    """(first line, last line, specifier) of every ``# contract: torch-npu...`` comment."""
    lines = source.splitlines()
    found = {
        number: m.group("spec").strip()
        for number, text in enumerate(lines, start=1)
        if (m := _MARKER.search(text))
    }
    if not found:
        return []
    ranges = [(line, line, spec) for line, spec in found.items()]
    for node in ast.walk(tree):
        if isinstance(node, _GUARDED) and node.lineno in found:
            ranges.append((node.lineno, node.end_lineno or node.lineno, found[node.lineno]))
    return ranges


def _versions_for(first: int, last: int, ranges: list[tuple[int, int, str]]) -> str:
    """The specifiers of the markers covering lines ``first..last``, joined."""
    specs = {
        spec
        for low, high, spec in ranges
        if (low == high and first <= low <= last) or (low != high and low <= first <= high)
    }
    return ",".join(sorted(specs))


def _scan_file(path: Path, label: str) -> list[OpCall]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    aliases = _Aliases()
    aliases.collect(tree)
    ranges = _markers(source, tree)
    handled: set[int] = set()
    calls: list[OpCall] = []

    def add(node: ast.expr, op: str, overload: str | None, call: ast.Call | None) -> None:
        versions = _versions_for(node.lineno, node.end_lineno or node.lineno, ranges)
        site = f"{label}:{node.lineno}"
        if call is None:
            calls.append(OpCall(op, overload, site, None, (), called=False, versions=versions))
            return
        starred = any(isinstance(a, ast.Starred) for a in call.args)
        calls.append(
            OpCall(
                op,
                overload,
                site,
                None if starred else len(call.args),
                tuple(k.arg for k in call.keywords if k.arg is not None),
                any(k.arg is None for k in call.keywords),
                True,
                versions,
            )
        )

    def mark(node: ast.expr) -> None:
        while isinstance(node, ast.Attribute):
            handled.add(id(node))
            node = node.value
        handled.add(id(node))

    # ast.walk is breadth first: a call is seen before its callee, an outer
    # attribute before the inner ones, so each use is recorded once.
    for node in ast.walk(tree):
        if id(node) in handled:
            continue
        if isinstance(node, ast.Call):
            resolved = aliases.resolve(node.func)
            if resolved is not None:
                mark(node.func)
                add(node, *resolved, node)
            elif (
                _chain(node.func) == ["getattr"]
                and len(node.args) >= 2
                and aliases.is_module(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                # getattr(torch_npu, "npu_x"): the op must exist (hasattr is a feature test).
                add(node, node.args[1].value, None, None)
        elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
            resolved = aliases.resolve(node)
            if resolved is not None:
                mark(node)
                add(node, *resolved, None)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _STRING_REFERENCE.match(node.value)
            if match and _is_op_name(match.group("op")):
                add(node, match.group("op"), None, None)
    return sorted(calls, key=lambda c: (int(c.site.rpartition(":")[2]), c.op))


def scan_sources(root: str | os.PathLike[str]) -> list[OpCall]:
    """Every torch_npu op use in ``root`` (a ``.py`` file, or a folder scanned recursively).

    Sites are ``<path>:<line>`` with the path relative to ``root``'s parent, so a
    package folder ``.../ascend_patch_foo`` gives ``ascend_patch_foo/norm.py:12``.
    """
    root = Path(root)
    if root.is_file():
        return _scan_file(root, root.name)
    if not root.is_dir():
        raise FileNotFoundError(f"no plugin sources at {root}")
    calls: list[OpCall] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent)
        if any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            continue
        calls.extend(_scan_file(path, relative.as_posix()))
    return calls


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
            hint = (
                f"schema has '{close[0]}'" if close else f"keywords: {', '.join(names) or 'none'}"
            )
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
        close = difflib.get_close_matches(call.op, sorted(_all_op_names()), n=1)
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
        _overload(overload) if dot else None,
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
                markers[call.file] = _markers(source, ast.parse(source))
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
                _versions_for(call.line, call.line, markers[call.file]),
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

    from .._hookspecs import PROJECT_NAME

    wanted = None if names is None else set(names)
    found = {ep.name: ep for ep in entry_points(group=PROJECT_NAME)}
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
