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

Calls of DrivingSDK's ``mx_driving`` are checked too (``mx_driving.<name>(...)``,
``mx_driving.<Function>.apply(...)``, names bound by ``from mx_driving import``, the
module returned by a ``...mx_driving()`` accessor such as the mmcv plugin's
``_kernel_source.mx_driving()``): the name must be public in the recorded mx-driving
version and the call must bind to its Python signature (``_contract_mx``), in every
version the plugin's ``mx-driving`` requirement allows (all with data without one).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ._contract_mx import mx_call_problem
from ._contract_mx import supported_mx_versions
from ._contract_runtime import CallRecorder
from ._contract_runtime import RecordedCall
from ._contract_runtime import record_call
from ._contract_runtime import recorded_in
from ._scan import MX_DRIVING
from ._scan import OpCall
from ._scan import all_op_names
from ._scan import scan_sources
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


class Mismatch(NamedTuple):
    """A call that does not bind (or an op that is missing) in one version of a library."""

    plugin: str
    site: str
    op: str
    version: str
    message: str
    #: The library ``version`` is of: ``"torch_npu"`` or ``"mx_driving"``.
    library: str = "torch_npu"

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
    #: The mx-driving versions its mx_driving calls were checked against.
    mx_versions: tuple[str, ...] = ()


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


def _declared_spec(distribution: str, requirement: str = "torch-npu") -> str | None:
    """The ``requirement`` specifier in ``distribution``'s requirements (all extras)."""
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
        if canonicalize_name(req.name) == requirement
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


def check_calls(
    plugin: str,
    calls: Iterable[OpCall],
    versions: Sequence[str],
    *,
    mx_versions: Sequence[str] | None = None,
) -> list[Mismatch]:
    """Check each call against each of ``versions`` (narrowed by the call's own marker).

    mx_driving calls are checked against ``mx_versions`` instead (default: every
    mx-driving version with data).
    """
    mismatches: list[Mismatch] = []
    seen: set[Mismatch] = set()
    for call in calls:
        if call.library == MX_DRIVING:
            for version in supported_mx_versions() if mx_versions is None else mx_versions:
                problem = mx_call_problem(call, version)
                if problem is None:
                    continue
                message = f"{problem} in mx_driving {version}"
                mismatch = Mismatch(plugin, call.site, call.target, version, message, MX_DRIVING)
                if mismatch not in seen:
                    seen.add(mismatch)
                    mismatches.append(mismatch)
            continue
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
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for m in mismatches:
        problem = m.message.removesuffix(f" in {m.library} {m.version}")
        grouped.setdefault((m.plugin, m.site, problem, m.library), []).append(m.version)
    return "\n".join(
        f"{plugin}: {site}: {problem} [{library} {', '.join(versions)}]"
        for (plugin, site, problem, library), versions in grouped.items()
    )


# --------------------------------------------------------------------------- plugins


def check_plugin(
    root: str | os.PathLike[str],
    *,
    plugin: str | None = None,
    torch_npu: str | None = None,
    mx_driving: str | None = None,
    recorded: Iterable[RecordedCall] = (),
) -> PluginCheck:
    """Check one plugin's sources (a package folder or a file) and its recorded calls.

    ``plugin`` names it in the mismatches (default: the folder name); ``torch_npu``
    and ``mx_driving`` are the specifiers of the versions it supports (default: every
    version with data).
    """
    path = Path(root)
    label = plugin or path.stem
    versions = supported_versions(torch_npu)
    mx_versions = supported_mx_versions(mx_driving)
    calls = [*scan_sources(path), *recorded_in(path, recorded)]
    if not mx_versions and any(c.library == MX_DRIVING for c in calls):
        problem = Mismatch(
            label,
            f"{label} metadata",
            "",
            mx_driving or "",
            f"no mx_driving API data matches mx-driving{mx_driving} (data: "
            f"{', '.join(supported_mx_versions())}); add a version to VERSIONS in "
            "tools/mx_driving_signatures.py and run it",
            MX_DRIVING,
        )
        return PluginCheck(label, path, tuple(versions), tuple(calls), (problem,))
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
    mismatches = check_calls(label, calls, versions, mx_versions=mx_versions)
    return PluginCheck(
        label, path, tuple(versions), tuple(calls), tuple(mismatches), tuple(mx_versions)
    )


def check_plugins(
    names: Iterable[str] | None = None, *, recorded: Iterable[RecordedCall] = ()
) -> list[PluginCheck]:
    """Check every installed ascend-patch plugin (or those with entry-point ``names``).

    A plugin's sources are its entry point's top-level package; the versions come
    from the ``torch-npu`` and ``mx-driving`` requirements of its distribution. An
    unknown name raises.
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
        mx_declared = _declared_spec(distribution, "mx-driving") if distribution else None
        checks.append(
            check_plugin(
                root,
                plugin=name,
                torch_npu=declared,
                mx_driving=mx_declared,
                recorded=recorded,
            )
        )
    return checks
