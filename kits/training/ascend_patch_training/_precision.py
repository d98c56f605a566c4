"""``with_precision_check``: run the original beside chosen replacements on live inputs.

How calls are seen. The patcher installs replacements itself and this module may not
change what it installed (its revert restores a slot only if the slot still holds
what it put there). So the check *observes* calls instead of wrapping them: a
profile function (``sys.setprofile``, and ``threading.setprofile`` for new threads)
watches for frames running a replacement's code object. At the call event the
inputs are cloned (before the replacement can modify them in place) together with
the RNG state; at the return event the original runs on those clones, with the same
RNG state, and the results are compared (``_compare``). Module buffers touched by
that extra run are put back, so no state changes twice. Nothing runs on the patched
path itself, and while checks remain the profile function costs every Python call
a little; it removes itself once every selected patch had its ``first`` checks and
``every`` is 0.

Input gradients, "where cheap": when the live call ran with autograd enabled and
an input (or a parameter of a module argument) requires grad, the replacement and
the original each run again on fresh clones and one random cotangent is pulled
back through both with ``torch.autograd.grad`` (no ``.grad`` is touched).

What can be checked: replacements that are Python functions (including methods,
``runtime_check`` and ``with_imports`` replacements, whose inner function is
watched). Class replacements and C functions cannot be observed and are reported
as skipped; patches whose results hold no tensor are skipped after their first call.
A profile function installed by someone else (cProfile, the torch profiler's Python
stack tracer at ``with_profiling(level=2)``) is left alone and the check reports that.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
import types
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import NamedTuple

from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Record
from ascend_patch_core import Status
from ascend_patch_core import imports


if TYPE_CHECKING:
    from ascend_patch_core import Patcher

    from ._compare import Deviation

__all__ = ["DEFAULT_TOLERANCES", "PrecisionCheck", "PrecisionOptions", "PrecisionRecord"]

#: (atol, rtol) per dtype name. Fused kernels reorder reductions, so these follow
#: what a correct fused kernel reaches rather than bit-exactness: about one unit in
#: the last place for bfloat16 and float16, 1e-4 relative for float32. Integer and
#: bool results must match exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-8, 1e-7),
    "float32": (1e-5, 1e-4),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1.6e-2),
    "float8_e4m3fn": (1.25e-1, 1.25e-1),
    "float8_e5m2": (2.5e-1, 2.5e-1),
    "complex128": (1e-8, 1e-7),
    "complex64": (1e-5, 1e-4),
}
_OPTION_KEYS = ("patches", "first", "every", "gradients", "thresholds", "output", "msprobe")
_MSPROBE_KEYS = ("config_path", "task", "dump_path", "level", "step")
#: Python calls between two looks for newly applied patches.
_REFRESH_EVERY = 2048
_NOT_OBSERVABLE_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class PrecisionOptions(NamedTuple):
    """The validated options of ``Patcher.with_precision_check``."""

    patches: tuple[str, ...] | None
    first: int
    every: int
    gradients: bool
    thresholds: dict[str, tuple[float, float]]
    output: str | None
    msprobe: dict[str, Any] | None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> PrecisionOptions:
        """Check ``with_precision_check(**options)``; raise PatchDefinitionError naming the fix."""
        where = "with_precision_check"
        unknown = sorted(set(options) - set(_OPTION_KEYS))
        if unknown:
            raise PatchDefinitionError(
                f"{where}: unknown option(s) {', '.join(unknown)}; the options are {', '.join(_OPTION_KEYS)}"
            )
        patches = options.get("patches")
        if patches is not None:
            if isinstance(patches, str):
                patches = (patches,)
            if not isinstance(patches, (list, tuple, set, frozenset)) or not all(
                isinstance(p, str) and p for p in patches
            ):
                raise PatchDefinitionError(
                    f"{where}: patches must be a patch, group or target name, or a list of them; got {patches!r}"
                )
            patches = tuple(patches)
        first = _count(options.get("first", 3), "first", where)
        every = _count(options.get("every", 0), "every", where)
        if first == 0 and every == 0 and patches != ():
            raise PatchDefinitionError(
                f"{where}: first=0 and every=0 would check no call; give first=N and/or every=K"
            )
        gradients = options.get("gradients", True)
        if not isinstance(gradients, bool):
            raise PatchDefinitionError(
                f"{where}: gradients must be True or False, got {gradients!r}"
            )
        thresholds = _thresholds(options.get("thresholds"), where)
        output = options.get("output")
        if output is not None and not isinstance(output, (str, os.PathLike)):
            raise PatchDefinitionError(f"{where}: output must be a file path, got {output!r}")
        return cls(
            patches,
            first,
            every,
            gradients,
            thresholds,
            None if output is None else os.fspath(output),
            _msprobe(options.get("msprobe", False), where),
        )

    def wants(self, call: int) -> bool:
        """Whether the ``call``-th call (1-based) of a patch is checked."""
        return call <= self.first or (self.every > 0 and call % self.every == 0)

    @property
    def finite(self) -> bool:
        return self.every == 0


def _count(value: object, name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PatchDefinitionError(f"{where}: {name} must be a non-negative int, got {value!r}")
    return value


def _thresholds(value: object, where: str) -> dict[str, tuple[float, float]]:
    merged = dict(DEFAULT_TOLERANCES)
    if value is None:
        return merged
    if not isinstance(value, Mapping):
        raise PatchDefinitionError(
            f"{where}: thresholds must map dtype names to (atol, rtol), e.g. {{'float32': (1e-5, 1e-4)}}"
        )
    for dtype, pair in value.items():
        name = str(dtype).removeprefix("torch.")
        ok = (
            isinstance(pair, (tuple, list))
            and len(pair) == 2
            and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in pair
            )
        )
        if not ok:
            raise PatchDefinitionError(
                f"{where}: thresholds[{dtype!r}] must be (atol, rtol), two non-negative numbers; got {pair!r}"
            )
        merged[name] = (float(pair[0]), float(pair[1]))
    return merged


def _msprobe(value: object, where: str) -> dict[str, Any] | None:
    if value is False or value is None:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_MSPROBE_KEYS))
        if unknown:
            raise PatchDefinitionError(
                f"{where}: unknown msprobe option(s) {', '.join(map(str, unknown))}; "
                f"PrecisionDebugger takes {', '.join(_MSPROBE_KEYS)}"
            )
        return dict(value)
    raise PatchDefinitionError(
        f"{where}: msprobe must be True or a dict of PrecisionDebugger arguments, got {value!r}"
    )


# ---------------------------------------------------------------------------- results


class PatchResult:
    """What the checks of one patch found so far."""

    def __init__(self) -> None:
        self.calls = 0
        self.checked = 0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.grad_max_abs: float | None = None
        self.grad_max_rel: float | None = None
        self.dtypes: set[str] = set()
        self.tolerances: dict[str, tuple[float, float]] = {}
        self.exceeded: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def add(self, call: int, deviations: Iterable[Deviation], gradient: bool) -> None:
        for d in deviations:
            self.dtypes.add(d.dtype)
            self.tolerances[d.dtype] = (d.atol, d.rtol)
            if gradient:
                self.grad_max_abs = max(self.grad_max_abs or 0.0, d.max_abs)
                self.grad_max_rel = max(self.grad_max_rel or 0.0, d.max_rel)
            else:
                self.max_abs = max(self.max_abs, d.max_abs)
                self.max_rel = max(self.max_rel, d.max_rel)
            if d.exceeded and len(self.exceeded) < 10:
                self.exceeded.append({"call": call, **d.as_dict()})

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "checked": self.checked,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "grad_max_abs": self.grad_max_abs,
            "grad_max_rel": self.grad_max_rel,
            "dtypes": sorted(self.dtypes),
            "tolerances": {k: list(v) for k, v in sorted(self.tolerances.items())},
            "exceeded": list(self.exceeded),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        tol = "; ".join(
            f"{k}: atol {a:g}, rtol {r:g}" for k, (a, r) in sorted(self.tolerances.items())
        )
        text = f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}"
        if self.grad_max_abs is not None:
            text += f"; gradients max abs {self.grad_max_abs:.3g}, max rel {self.grad_max_rel or 0.0:.3g}"
        return f"{text} ({tol or 'no tensor compared'})"


class PrecisionRecord(Record):
    """A record of kind ``precision``: one patch's replacement compared with its original."""

    __slots__ = ("result",)

    def __init__(self, patch_record: Record) -> None:
        super().__init__(
            "precision",
            patch_record.name,
            patch_record.target,
            Status.PENDING,
            "waiting for a call",
            patch_record.group,
            patch_record.provenance,
        )
        self.result = PatchResult()

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        data["precision"] = self.result.as_dict()
        return data


class PrecisionSummaryRecord(Record):
    """The ``precision_check`` setting: options and every patch's result (later ones included)."""

    __slots__ = ("check",)

    def __init__(self, check: PrecisionCheck) -> None:
        super().__init__("setting", "precision_check", "with_precision_check")
        self.check = check

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        data["precision"] = self.check.to_dict()
        return data


# ---------------------------------------------------------------------------- the check


class _PatchState:
    __slots__ = ("done", "function", "lock", "original", "record")

    def __init__(self, record: PrecisionRecord) -> None:
        self.record = record
        self.function: types.FunctionType | None = None
        self.original: Any = None
        self.done = False
        self.lock = threading.Lock()


class _Pending(NamedTuple):
    frame: types.FrameType
    state: _PatchState
    call: int
    names: list[str]
    inputs: tuple[tuple[Any, ...], dict[str, Any]]
    grad_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None
    rng: Any
    buffers: Any


class PrecisionCheck:
    """Observes the patcher's replacements and compares them with their originals."""

    def __init__(self, options: PrecisionOptions, patcher: Patcher) -> None:
        self.options = options
        self._patcher = patcher
        self.summary = PrecisionSummaryRecord(self)
        self._lock = threading.RLock()
        self._states: dict[int, _PatchState] = {}
        self._by_code: dict[types.CodeType, list[_PatchState]] = {}
        self._pending: dict[int, _Pending] = {}
        self._countdown = _REFRESH_EVERY
        self._installed = False
        self._started = False
        #: Someone else's profile function was there: never replace it.
        self._blocked = False
        self._closed = False
        self._seen_names: set[str] = set()
        #: Import-hub watches on the packages of patches not applied yet, by root package.
        self._import_watches: dict[str, list[Any]] = {}

    # -- setup ------------------------------------------------------------------------

    def initial_records(self) -> list[Record]:
        """Records for the selected patches the patcher knows now (later ones go in the summary)."""
        self.refresh()
        with self._lock:
            return [self.summary, *(s.record for s in self._states.values())]

    def start(self) -> None:
        if self._closed:
            return
        if self.options.patches == ():
            self.summary.set(Status.APPLIED, "no patch selected (patches=())")
            return
        self._started = True
        self._install()
        self._update_summary()

    def _install(self) -> None:
        """Observe calls (again, after a pause with nothing to check)."""
        if self._closed or self._blocked or self._installed or not self._started:
            return
        current = sys.getprofile()
        if current is not None and current != self._profile:
            self._blocked = True
            self.summary.set(
                Status.SKIPPED,
                f"another profile function is active ({current!r}); the precision check "
                "observes calls with sys.setprofile and does not replace it",
            )
            return
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)
        self._installed = True

    def stop(self) -> None:
        """Stop observing; write the JSON report if asked. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._uninstall()
        with self._lock:
            watches, self._import_watches = self._import_watches, {}
        for handles in watches.values():
            for handle in handles:
                imports.cancel(handle)
        unseen = [n for n in (self.options.patches or ()) if n not in self._seen_names]
        if unseen:
            self.summary.warnings.append(
                f"patches={list(unseen)!r}: no applied patch has these names, groups or targets"
            )
        self._update_summary()
        self.write_output()

    def _uninstall(self) -> None:
        if not self._installed:
            return
        self._installed = False
        if sys.getprofile() == self._profile:
            sys.setprofile(None)
        threading.setprofile(None)

    def write_output(self) -> None:
        path = self.options.output
        if not path:
            return
        from ._brake import rank

        path = path.replace("{rank}", str(rank()))
        try:
            directory = os.path.dirname(path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self.to_dict(), handle, indent=2, ensure_ascii=False)
        except OSError as exc:
            self.summary.warnings.append(f"cannot write {path}: {exc}")

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            states = list(self._states.values())
        options = self.options._asdict()
        options["thresholds"] = {k: list(v) for k, v in sorted(self.options.thresholds.items())}
        return {
            "schema": "ascend-patch-precision/1",
            "options": options,
            "exceeded": [s.record.name for s in states if s.record.status is Status.FAILED],
            "patches": [s.record.as_dict() for s in states],
        }

    def table(self) -> str:
        """One line per checked patch, worst first."""
        with self._lock:
            states = list(self._states.values())
        order = {Status.FAILED: 0, Status.APPLIED: 1, Status.PENDING: 2, Status.SKIPPED: 3}
        states.sort(key=lambda s: (order.get(s.record.status, 4), s.record.name))
        lines = ["ascend-patch precision check:"]
        for s in states:
            r = s.record
            label = "EXCEEDS" if r.status is Status.FAILED else r.status.value
            lines.append(f"  {label:<8} {r.target}  {r.reason or ''}".rstrip())
        return "\n".join(lines)

    # -- finding the patches ------------------------------------------------------------

    def refresh(self) -> None:
        """Pick up patches applied since the last look (imports happen at any time).

        Reads only the patcher's public view: its report (every patch and hook, with
        its status) and ``installed()`` (original and replacement of applied ones).
        """
        if self._closed:
            return
        records = self._patcher.report.records
        installed = {id(p.record): p for p in self._patcher.installed()}
        wanted = self.options.patches
        changed = watching = False
        roots: set[str] = set()
        with self._lock:
            for record in records:
                if record.kind == "hook" and record.status is Status.APPLIED:
                    roots.add(_root(record.target))
                if record.kind != "patch":
                    continue
                status = record.status
                if status is Status.PENDING:
                    roots.add(_root(record.target))
                if wanted is not None:
                    matched = {record.name, record.target, record.group} & set(wanted)
                    if not matched:
                        continue
                    self._seen_names |= {n for n in matched if n}
                state = self._states.get(id(record))
                if state is None:
                    state = _PatchState(PrecisionRecord(record))
                    self._states[id(record)] = state
                    changed = True
                patch = installed.get(id(record))
                if state.function is None and not state.done and patch is not None:
                    self._watch(state, patch.replacement, patch.original)
                    changed = True
                    watching = watching or state.function is not None
                elif state.function is not None and patch is None:
                    self._unwatch(state, f"the patch is {status.value} now")
                    changed = True
                elif (
                    state.function is None
                    and status in (Status.SKIPPED, Status.FAILED, Status.REVERTED)
                    and state.record.status is Status.PENDING
                ):
                    state.record.set(Status.SKIPPED, f"the patch itself is {status.value}")
                    state.done = True
        self._watch_imports(roots)
        if watching:
            self._install()
        if changed:
            self._update_summary()

    def _watch_imports(self, roots: set[str]) -> None:
        """Look again right after imports under these packages: their patches apply then.

        The hub runs these callbacks after the patcher's own (registered first), so
        a patch installed by an import is seen before the module's functions are called.
        """
        for root in roots:
            with self._lock:
                if root in self._import_watches or self._closed:
                    continue
                self._import_watches[root] = []
            handles = [
                imports.on_every_import(f"{root}.*", self._imported),
                imports.when_imported(root, self._root_imported),
            ]
            with self._lock:
                self._import_watches[root] = handles

    def _imported(self, module: types.ModuleType) -> None:
        self._safely(self.refresh)

    def _root_imported(self, module: types.ModuleType) -> None:
        with self._lock:
            handles = self._import_watches.pop(module.__name__, [])
        for handle in handles:  # the exact watch fired; renew both on the next refresh
            imports.cancel(handle)
        self._safely(self.refresh)

    def _watch(self, state: _PatchState, replacement: Any, original: Any) -> None:
        function, why = _observable(replacement)
        if function is None or not callable(original):
            state.done = True
            state.record.set(
                Status.SKIPPED,
                why or "the original is not callable, so there is nothing to compare",
            )
            return
        state.function, state.original = function, original
        self._by_code.setdefault(function.__code__, []).append(state)
        if state.record.status is Status.PENDING:
            state.record.set(Status.PENDING, "waiting for a call")

    def _unwatch(self, state: _PatchState, why: str | None = None) -> None:
        if state.function is not None:
            states = self._by_code.get(state.function.__code__, [])
            if state in states:
                states.remove(state)
            if not states:
                self._by_code.pop(state.function.__code__, None)
        state.function = None
        state.done = True
        if why and state.record.status is Status.PENDING:
            state.record.set(Status.SKIPPED, why)

    def _maybe_finished(self) -> None:
        """Remove the profile function once nothing is left to check."""
        if not self.options.finite:
            return
        with self._lock:
            if self._by_code or self._pending:
                return
            open_entries = any(
                r.kind == "patch" and r.status is Status.PENDING
                for r in self._patcher.report.records
            )
        if not open_entries:
            self._uninstall()

    # -- the profile function -----------------------------------------------------------

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        # Runs for every Python call and return while installed: keep the common
        # path to a dict lookup. Exceptions must not escape (CPython would drop the
        # profile function and raise them in the user's code).
        if event == "call":
            states = self._by_code.get(frame.f_code)
            if states is None:
                self._countdown -= 1
                if self._countdown <= 0:
                    self._countdown = _REFRESH_EVERY
                    self._safely(self.refresh)
                return
            self._safely(self._on_call, frame, states)
        elif event == "return" and self._pending:
            pending = self._pending.pop(id(frame), None)
            if pending is not None and pending.frame is frame:
                self._safely(self._on_return, pending, arg)

    def _safely(self, function: Any, *args: Any) -> None:
        try:
            function(*args)
        except Exception as exc:  # a bug here must never break training
            self.summary.warnings.append(f"internal error in the precision check: {exc!r}")

    def _on_call(self, frame: types.FrameType, states: list[_PatchState]) -> None:
        state = _pick(frame, states)
        if state is None:
            self.summary.warnings.append(
                f"{frame.f_code.co_qualname if hasattr(frame.f_code, 'co_qualname') else frame.f_code.co_name}: "
                "several patches share this code and the call could not be attributed"
            )
            return
        with state.lock:
            if state.done:
                return
            state.record.result.calls += 1
            call = state.record.result.calls
        if not self.options.wants(call):
            if self.options.finite and call > self.options.first:
                self._retire(state)
            return
        import torch

        from ._rerun import Buffers
        from ._rerun import clone_inputs

        args, kwargs, names = _frame_arguments(frame)
        grad_inputs = None
        if self.options.gradients and torch.is_grad_enabled():
            grad_inputs = clone_inputs(args, kwargs)
        self._pending[id(frame)] = _Pending(
            frame,
            state,
            call,
            names,
            clone_inputs(args, kwargs),
            grad_inputs,
            torch.get_rng_state(),
            Buffers(names, (args, kwargs)),
        )

    def _on_return(self, pending: _Pending, result: Any) -> None:
        from ._rerun import run_comparison

        state = pending.state
        if state.function is None:  # reverted meanwhile
            return
        outcome = run_comparison(
            state.function,
            state.original,
            result,
            pending.names,
            pending.inputs,
            pending.grad_inputs,
            pending.rng,
            pending.buffers,
            self.options.thresholds,
        )
        found = state.record.result
        with state.lock:
            retire = self.options.finite and found.calls >= self.options.first
            if outcome.no_tensor:
                state.record.set(
                    Status.SKIPPED, f"its result holds no tensor (seen at call {pending.call})"
                )
                retire = True
            elif outcome.error is not None:
                state.record.set(Status.SKIPPED, f"cannot compare: {outcome.error}")
                retire = True
            else:
                found.checked += 1
                found.add(pending.call, outcome.deviations, gradient=False)
                found.add(pending.call, outcome.gradient_deviations, gradient=True)
                for note in outcome.notes:
                    found.note(note)
                self._set_status(state)
        if retire:
            self._retire(state)
        self._update_summary()

    def _retire(self, state: _PatchState) -> None:
        with self._lock:
            self._unwatch(state)
        self._maybe_finished()

    @staticmethod
    def _set_status(state: _PatchState) -> None:
        result = state.record.result
        checked = f"{result.checked} call(s) checked"
        if result.exceeded:
            worst = result.exceeded[0]
            detail = worst["problem"] or (
                f"max abs {worst['max_abs']:.3g}, max rel {worst['max_rel']:.3g}"
            )
            state.record.set(
                Status.FAILED,
                f"EXCEEDS {worst['dtype']} tolerance (atol {worst['atol']:g}, rtol {worst['rtol']:g}) "
                f"at call {worst['call']}, {worst['where']}: {detail}; {checked}",
            )
            message = f"replacement deviates from the original: {state.record.reason}"
            if message not in state.record.warnings:
                state.record.warnings[:] = [message]
        else:
            state.record.set(Status.APPLIED, f"{checked}, within tolerance: {result.summary()}")

    def _update_summary(self) -> None:
        with self._lock:
            states = list(self._states.values())
        if self._blocked:
            return
        failed = [s.record.name for s in states if s.record.status is Status.FAILED]
        checked = [s for s in states if s.record.result.checked]
        how = f"first {self.options.first} call(s)"
        if self.options.every:
            how += f" and every {self.options.every}th"
        text = f"{len(states)} patch(es) selected, {len(checked)} checked ({how} each)"
        if failed:
            text += f"; exceeding their tolerance: {', '.join(failed)}"
        self.summary.set(Status.FAILED if failed else Status.APPLIED, text)


def _root(target: str) -> str:
    return target.replace(":", ".").partition(".")[0]


def _observable(function: Any) -> tuple[types.FunctionType | None, str | None]:
    """The Python function whose frames are the patch's replacement running."""
    if isinstance(function, type):
        return None, (
            "the replacement is a class: calls cannot be compared (patch its methods to check them)"
        )
    if not isinstance(function, types.FunctionType):
        return None, (
            f"the replacement is a {type(function).__name__}, not a Python function: "
            "its calls cannot be observed"
        )
    if function.__code__.co_flags & _NOT_OBSERVABLE_FLAGS:
        return None, "the replacement is a generator or coroutine function"
    return function, None


def _frame_arguments(
    frame: types.FrameType,
) -> tuple[tuple[Any, ...], dict[str, Any], list[str]]:
    """A frame's arguments at its call event: positional ones (and their names), keyword-only ones.

    Positional parameters are passed on positionally, so the original may name them
    differently; keyword-only ones go by name.
    """
    code = frame.f_code
    values = frame.f_locals
    names = code.co_varnames
    count, kwonly = code.co_argcount, code.co_kwonlyargcount
    labels = list(names[:count])
    args = [values[name] for name in labels]
    kwargs = {name: values[name] for name in names[count : count + kwonly] if name in values}
    index = count + kwonly
    if code.co_flags & inspect.CO_VARARGS:
        extra = values[names[index]]
        labels += [f"{names[index]}[{i}]" for i in range(len(extra))]
        args.extend(extra)
        index += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(values[names[index]])
    return tuple(args), kwargs, labels


def _pick(frame: types.FrameType, states: list[_PatchState]) -> _PatchState | None:
    """Which patch a frame belongs to when several replacements share one code object.

    Closures made by one factory share their code; their cell contents tell them apart.
    """
    if len(states) == 1:
        return states[0]
    code = frame.f_code
    values = frame.f_locals
    matches = []
    for state in states:
        function = state.function
        cells = function.__closure__ if function is not None else None
        if cells is None:
            continue
        if all(
            name in values and values[name] is cell.cell_contents
            for name, cell in zip(code.co_freevars, cells, strict=False)
        ):
            matches.append(state)
    return matches[0] if len(matches) == 1 else None
