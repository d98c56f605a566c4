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

The pieces: options in :mod:`._precision_options`, results, records and the JSON
report in :mod:`._precision_records`, recognising and capturing calls in
:mod:`._precision_calls`, the re-run in :mod:`._rerun`; this module follows the
patches and runs the profile function.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import Record
from ascend_patch_core import Status
from ascend_patch_core import imports

from ._precision_calls import PatchState
from ._precision_calls import Pending
from ._precision_calls import capture
from ._precision_calls import observable
from ._precision_calls import pick
from ._precision_options import DEFAULT_TOLERANCES
from ._precision_options import PrecisionOptions
from ._precision_records import PrecisionRecord
from ._precision_records import PrecisionSummaryRecord
from ._precision_records import render_table
from ._precision_records import report
from ._precision_records import verdict
from ._precision_records import write_report


if TYPE_CHECKING:
    from ascend_patch_core import Patcher

__all__ = ["DEFAULT_TOLERANCES", "PrecisionCheck", "PrecisionOptions", "PrecisionRecord"]

#: Python calls between two looks for newly applied patches.
_REFRESH_EVERY = 2048


class PrecisionCheck:
    """Observes the patcher's replacements and compares them with their originals."""

    def __init__(self, options: PrecisionOptions, patcher: Patcher) -> None:
        self.options = options
        self._patcher = patcher
        self.summary = PrecisionSummaryRecord(self)
        self._lock = threading.RLock()
        self._states: dict[int, PatchState] = {}
        self._by_code: dict[types.CodeType, list[PatchState]] = {}
        self._pending: dict[int, Pending] = {}
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
            write_report(path, self.to_dict())
        except OSError as exc:
            self.summary.warnings.append(f"cannot write {path}: {exc}")

    def to_dict(self) -> dict[str, Any]:
        return report(self.options, self._records())

    def table(self) -> str:
        """One line per checked patch, worst first."""
        return render_table(self._records())

    def _records(self) -> list[PrecisionRecord]:
        with self._lock:
            return [s.record for s in self._states.values()]

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
                    state = PatchState(PrecisionRecord(record))
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
            handles = [imports.on_every_import(f"{root}.*", self._imported)]
            if root not in sys.modules:  # an imported root has no import left to see
                handles.append(imports.on_import(root, self._root_imported))
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

    def _watch(self, state: PatchState, replacement: Any, original: Any) -> None:
        function, why = observable(replacement)
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

    def _unwatch(self, state: PatchState, why: str | None = None) -> None:
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

    def _on_call(self, frame: types.FrameType, states: list[PatchState]) -> None:
        state = pick(frame, states)
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
        self._pending[id(frame)] = capture(frame, state, call, gradients=self.options.gradients)

    def _on_return(self, pending: Pending, result: Any) -> None:
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
        with state.lock:
            had_its_checks = self.options.finite and state.record.result.calls >= self.options.first
            cannot_compare = state.record.add_outcome(pending.call, outcome)
        if had_its_checks or cannot_compare:
            self._retire(state)
        self._update_summary()

    def _retire(self, state: PatchState) -> None:
        with self._lock:
            self._unwatch(state)
        self._maybe_finished()

    def _update_summary(self) -> None:
        records = self._records()
        if self._blocked:
            return
        self.summary.set(*verdict(self.options, records))


def _root(target: str) -> str:
    return target.replace(":", ".").partition(".")[0]
