"""Planning: declarations in, an ordered plan with a verdict for every patch out.

One pipeline for every caller: ``Patcher.apply()`` installs what the plan leaves
pending; ``ascend-patch doctor`` and ``scan`` show the plan without installing
anything. Planning imports no target library and changes nothing outside the
ledger it is given (a dry run passes a fresh one). The verdicts, in order:

1. group verdicts -- disabled, opt-in and not enabled, requirement unmet (checked
   from metadata before ``patches()`` runs, so a group that cannot apply costs one
   lookup), ``patches()`` raised or returned something that is not a patch;
2. patch verdicts -- disabled, requirement unmet;
3. collisions -- two live patches on one target (a warning; an error when strict);
4. dependencies -- ``after=`` names linked, unknown names and cycles failed;
5. order -- declaration order, dependencies first.

Group conflicts (``conflicts_with``) and unknown names in ``disable()`` are
separate functions, because the Patcher checks them at other moments.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

from .._discovery.metadata import MetadataCache
from .._discovery.requires import check_requirement
from .._install.entries import NOT_APPLIED
from .._install.entries import Entry
from .._install.entries import HookState
from .._install.entries import Ledger
from .._install.entries import LegacyState
from .._install.entries import who
from .._model.errors import PatchConflictError
from .._model.errors import PatchDefinitionError
from .._model.patch import AtomicPatch
from .._model.patch import ModuleHook
from .._model.patch import Patch
from .._model.patch import PatchLike
from .._model.report import FAILED
from .._model.report import PENDING
from .._model.report import SKIPPED
from .._model.report import CallCounters
from .._model.report import Provenance
from .._model.report import Record
from .._model.report import Status
from .group_names import group_names


__all__ = [
    "Declared",
    "Plan",
    "conflicting_groups",
    "enabled_by",
    "known_names",
    "plan",
]


class Declared:
    """One declaration to plan: a patch-like object, its ``add()`` options, where it came from.

    ``group`` names the group of a lone AtomicPatch (the ModuleHook that produced it).
    """

    __slots__ = ("group", "item", "options", "provenance")

    def __init__(
        self, item: PatchLike, options: Any, provenance: Provenance, group: str | None = None
    ) -> None:
        self.item = item
        self.options = options
        self.provenance = provenance
        self.group = group


class Plan:
    """What planning produced; everything in it is already in the ledger."""

    __slots__ = ("collisions", "entries", "groups", "hooks", "legacy", "missing_after", "records")

    def __init__(self) -> None:
        #: Every record made, in declaration order (groups, patches, hooks, 1.0 patches).
        self.records: list[Record] = []
        #: Dependency-ordered; open ones are to be installed, the others carry their verdict.
        self.entries: list[Entry] = []
        self.hooks: list[HookState] = []
        self.legacy: list[LegacyState] = []
        #: Group classes by name, with the provenance that declared them.
        self.groups: dict[str, tuple[type[Patch], Provenance]] = {}
        #: (path, first entry, later entry) for each target patched twice.
        self.collisions: list[tuple[str, Entry, Entry]] = []
        #: (entry, name) for each ``after=`` name that matches nothing.
        self.missing_after: list[tuple[Entry, str]] = []


def enabled_by(group: type[Patch], names: frozenset[str]) -> bool:
    """Whether ``names`` (the enable switches) turn on the opt-in ``group``."""
    return "*" in names or not group_names(group).isdisjoint(names)


def switched_on(group: type[Patch], provenance: Provenance, names: frozenset[str]) -> bool:
    """Whether ``group`` is on as far as opt-in goes: a plugin's opt-in group needs a switch."""
    return not (group.opt_in and provenance.plugin is not None and not enabled_by(group, names))


def plan_bootstrapped(
    declared: list[Declared],
    ledger: Ledger,
    meta: MetadataCache,
    start: Callable[[Plan], None],
    **switches: Any,
) -> Plan:
    """``plan()``, but groups with ``apply_before_collect`` are planned and started first.

    The DrivingSDK patcher's bootstrap: a group whose ``patches()`` imports code that
    needs another group applied (``np.int`` from NumpyCompat) then finds it applied.
    """
    early = [d for d in declared if getattr(d.item, "apply_before_collect", False) is True]
    if not early:
        return plan(declared, ledger, meta, **switches)
    first = plan(early, ledger, meta, **switches)
    start(first)
    started = {id(d) for d in early}
    rest = plan([d for d in declared if id(d) not in started], ledger, meta, **switches)
    rest.groups = {**first.groups, **rest.groups}
    return rest


def plan(
    declared: Iterable[Declared],
    ledger: Ledger,
    meta: MetadataCache,
    *,
    disabled: frozenset[str] = frozenset(),
    enabled: frozenset[str] = frozenset(),
    strict: bool = False,
    dry_run: bool = False,
) -> Plan:
    """Plan ``declared`` against what ``ledger`` already holds, and record it there.

    ``enabled`` names opt-in groups to turn on (``"*"``: all). With ``dry_run``, a
    group whose requirement is unmet is still expanded (its patches then carry the
    unmet requirement), so a report can list every patch a plugin declares.
    """
    result = Plan()
    answers: dict[str, tuple[bool, str]] = {}
    seen: set[type[Patch]] = set()
    records, entries = result.records, result.entries
    for declaration in declared:
        item = declaration.item
        if type(item) is AtomicPatch:  # most declarations
            entries.append(_new_entry(item, declaration.group, (), declaration.provenance, result))
            continue
        try:
            if isinstance(item, type):
                if item in seen:  # hashes the class: a plugin's metaclass may raise here
                    continue  # a plugin's group the user added too: one group, enabled
                seen.add(item)
                _plan_group(
                    declaration, item, ledger, meta, answers, result, disabled, enabled, dry_run
                )
            elif isinstance(item, AtomicPatch):
                result.entries.append(
                    _new_entry(item, declaration.group, (), declaration.provenance, result)
                )
            elif isinstance(item, ModuleHook):
                result.hooks.append(_new_hook(item, declaration.provenance, None, result, disabled))
            else:
                result.legacy.append(_new_legacy(item, declaration.provenance, result, disabled))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            if declaration.provenance.plugin is None:
                raise  # the user's own declaration: their traceback
            # A plugin's object whose __hash__, __eq__ or attributes raise: it fails alone.
            records.append(_failed_declaration(item, declaration.provenance, exc))
    with ledger.lock:
        ledger.records.extend(records)
    if disabled:
        for entry in entries:
            if entry.names & disabled:
                entry.record.set(SKIPPED, "disabled")
    _check_requirements(entries, meta, answers)
    _check_collisions(entries, ledger, result, strict)
    if any(entry.after for entry in entries):
        # Loaded when a plan has ``after=`` names: most have none.
        from .._install.dependencies import link_dependencies

        result.entries = link_dependencies(entries, ledger, result.missing_after)
    else:
        result.entries = entries
    ledger.add(result.entries, result.hooks, result.legacy)
    with ledger.lock:
        for name, (group, _) in result.groups.items():
            for alias in group_names(group) - {name}:
                ledger.group_aliases.setdefault(alias, name)
    return result


def _failed_declaration(item: object, provenance: Provenance, exc: BaseException) -> Record:
    name = getattr(item, "__qualname__", None) if isinstance(item, type) else None
    name = name if isinstance(name, str) else type(item).__qualname__
    kind = "group" if isinstance(item, type) else "patch"
    reason = f"planning it raised {type(exc).__name__}: {exc}"
    return Record(kind, name, name, FAILED, reason, None, provenance)


def _plan_group(
    declaration: Declared,
    group: type[Patch],
    ledger: Ledger,
    meta: MetadataCache,
    answers: dict[str, tuple[bool, str]],
    result: Plan,
    disabled: frozenset[str],
    enabled: frozenset[str],
    dry_run: bool,
) -> None:
    provenance = declaration.provenance

    def group_record(status: Status, reason: str) -> None:
        record = Record("group", group.name, group.name, status, reason, group.name, provenance)
        result.records.append(record)

    result.groups[group.name] = (group, provenance)
    held_back = None
    if not group_names(group).isdisjoint(disabled):
        held_back = "disabled"
    # A group the user added is wanted, opt-in or not; a plugin's needs the switch.
    elif group.opt_in and provenance.plugin is not None and not enabled_by(group, enabled):
        held_back = f"opt-in: enable it with ASCEND_PATCH_ENABLE={group.name} or Patcher.enable({group.name!r})"
    if held_back is not None and not dry_run:
        group_record(SKIPPED, held_back)
        return
    try:
        requires = group.normalized_requires()
    except PatchDefinitionError as exc:
        group_record(FAILED, str(exc))
        return
    if not dry_run:
        for text in requires:
            ok, why = _answer(text, meta, answers)
            if not ok:
                group_record(SKIPPED, f"requires {text}: {why}")
                return
    first_entry, first_hook = len(result.entries), len(result.hooks)
    try:
        # None is "nothing here", as from a plugin hook or a ModuleHook callback.
        children = list(group.patches(declaration.options) or ())
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a plugin's sys.exit() fails its group only
        raised = (
            f"called sys.exit({exc.code!r})"
            if isinstance(exc, SystemExit)
            else f"raised {type(exc).__name__}: {exc}"
        )
        group_record(FAILED, f"{group.__qualname__}.patches() {raised}")
        return
    if not children and not dry_run:
        # Said, not skipped in silence: an op group with no kernel on this machine.
        group_record(SKIPPED, "declares no patch on this machine")
    for child in children:
        if isinstance(child, AtomicPatch):
            result.entries.append(
                _new_entry(child, group.name, tuple(group.after), provenance, result, requires)
            )
        elif isinstance(child, ModuleHook):
            result.hooks.append(_new_hook(child, provenance, group, result, disabled, requires))
        else:
            group_record(FAILED, f"{group.__qualname__}.patches() returned {child!r}")
    if held_back is not None:  # a dry run lists them, with the reason they would not apply
        for entry in result.entries[first_entry:]:
            entry.record.set(SKIPPED, held_back)
        for hook in result.hooks[first_hook:]:
            hook.record.set(SKIPPED, held_back)


def _new_entry(
    patch: AtomicPatch,
    group_name: str | None,
    group_after: tuple[str, ...],
    provenance: Provenance,
    result: Plan,
    requires: tuple[str, ...] = (),
) -> Entry:
    record = Record("patch", patch.name, patch.target, PENDING, None, group_name, provenance)
    record.note = patch.note
    entry = Entry(patch, record, requires=requires, after=group_after)
    if patch.runtime_check is not None:
        record.counters = CallCounters()
    result.records.append(record)
    return entry


def _new_hook(
    hook: ModuleHook,
    provenance: Provenance,
    group: type[Patch] | None,
    result: Plan,
    disabled: frozenset[str],
    requires: tuple[str, ...] = (),
) -> HookState:
    group_name = group.name if group is not None else None
    record = Record("hook", hook.name, hook.pattern, group=group_name, provenance=provenance)
    state = HookState(hook, record, requires)
    if hook.name in disabled or (group_name is not None and group_name in disabled):
        record.set(SKIPPED, "disabled")
    result.records.append(record)
    return state


def _new_legacy(
    patch: Any, provenance: Provenance, result: Plan, disabled: frozenset[str]
) -> LegacyState:
    record = Record("legacy", patch.name, patch.target_module or "?", provenance=provenance)
    state = LegacyState(patch, record)
    if patch.name in disabled:
        record.set(SKIPPED, "disabled")
    elif not patch.target_module:
        record.set(FAILED, "LegacyPatch needs target_module (use PatcherBuilder.add_module_patch)")
    result.records.append(record)
    return state


def _answer(
    text: str, meta: MetadataCache, answers: dict[str, tuple[bool, str]]
) -> tuple[bool, str]:
    # A group's requirement is repeated on each of its patches: one answer per text
    # and plan (answers about an overridden distribution are not cached on disk).
    answer = answers.get(text)
    if answer is None:
        answer = answers[text] = check_requirement(text, meta)
    return answer


def _check_requirements(
    entries: list[Entry], meta: MetadataCache, answers: dict[str, tuple[bool, str]]
) -> None:
    for entry in entries:
        if not entry.requires:
            continue
        entry.verdicts = [(text, *_answer(text, meta, answers)) for text in entry.requires]
        if entry.open:
            unmet = next((v for v in entry.verdicts if not v[1]), None)
            if unmet is not None:
                entry.record.set(SKIPPED, f"requires {unmet[0]}: {unmet[2]}")


def _check_collisions(entries: list[Entry], ledger: Ledger, result: Plan, strict: bool) -> None:
    by_target = ledger.by_target
    for entry in entries:
        if entry.record.status is not PENDING:
            continue
        patch = entry.patch
        if not patch.alias_paths:  # the common case, checked without a loop
            first = by_target.get(patch.path.key)
            if first is None or first.record.status in NOT_APPLIED:
                by_target[patch.path.key] = entry
                continue
        paths = (patch.path, *patch.alias_paths) if patch.alias_paths else (patch.path,)
        for target in paths:
            key = target.key
            first = by_target.get(key)
            if first is None or first.record.status in NOT_APPLIED:
                by_target[key] = entry
                continue
            if first is entry:
                continue
            result.collisions.append((key, first, entry))
            message = (
                f"{who(first)} and {who(entry)} both patch {target.text}; they are applied in that order, "
                f"so {entry.patch.name!r} is installed over {first.patch.name!r}"
            )
            if strict:
                raise PatchConflictError(f"ascend-patch (strict): {message}")
            ledger.warn(message)
            entry.record.warnings.append(message)


def conflicting_groups(
    groups: Iterable[type[Patch]], disabled: Iterable[str]
) -> list[tuple[str, str]]:
    """(group, other) for each pair of enabled groups where one names the other in ``conflicts_with``."""
    off = set(disabled)
    on = [g for g in groups if group_names(g).isdisjoint(off)]
    # conflicts_with may use any of a group's names (the DrivingSDK patcher's "resnet_maxpool").
    owner = {alias: g.name for g in on for alias in group_names(g)}
    found: list[tuple[str, str]] = []
    for group in on:
        for other in group.conflicts_with:
            name = owner.get(other)
            if name is not None and name != group.name and (group.name, name) not in found:
                found.append((group.name, name))
    return found


def known_names(
    ledger: Ledger, groups: Iterable[type[Patch]], extra: Iterable[str] = ()
) -> set[str]:
    """Every name ``disable()`` may use for what ``ledger`` holds."""
    from .._discovery.metadata import normalize_name

    known: set[str] = set(extra)
    with ledger.lock:
        for entry in ledger.entries:
            known |= entry.names
        known |= {h.hook.name for h in ledger.hooks}
        known |= {lg.patch.name for lg in ledger.legacy}
        for record in ledger.records:
            if record.kind in ("plugin", "group"):
                known.add(record.name)
                if record.provenance.distribution:
                    known.add(normalize_name(record.provenance.distribution))
    for group in groups:
        known |= group_names(group)
    return known
