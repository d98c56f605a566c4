"""What apply() puts in place besides patches: import rules and environment defaults.

Both act at once and are taken back by revert(): a rule stops serving its module,
a variable a plugin set is unset again (one the user set is never touched).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._ledger import Ledger
from ._report import APPLIED
from ._report import PENDING
from ._report import REVERTED
from ._report import SKIPPED
from ._report import Provenance
from ._report import Record


if TYPE_CHECKING:
    from ._env import EnvSetting
    from ._rules import ImportRule

__all__ = ["Activations"]


class Activations:
    """The import rules and environment variables one patcher put in place."""

    __slots__ = ("_env_set", "_ledger", "_strict", "rules")

    def __init__(self, ledger: Ledger, strict: Callable[[], bool]) -> None:
        self._ledger = ledger
        self._strict = strict
        #: Active rules with their records, oldest first.
        self.rules: list[tuple[ImportRule, Record]] = []
        #: (name, value) of each variable this patcher wrote into os.environ.
        self._env_set: list[tuple[str, str]] = []

    def rule(self, rule: ImportRule, provenance: Provenance) -> None:
        """Start serving ``rule`` (it imports nothing now; it acts when its module is imported)."""
        record = Record("rule", rule.describe(), rule.module, provenance=provenance)
        with self._ledger.lock:
            self._ledger.records.append(record)
            self.rules.append((rule, record))
        rule.strict = self._strict
        rule.activate(record)

    def env(self, setting: EnvSetting, provenance: Provenance) -> None:
        """Write a plugin's recommended variable, unless the user set it already."""
        record = Record(
            "env", setting.name, f"{setting.name}={setting.value}", provenance=provenance
        )
        current = os.environ.get(setting.name)
        if current is not None:
            record.set(SKIPPED, f"the user set {setting.name}={current}")
        else:
            os.environ[setting.name] = setting.value
            self._env_set.append((setting.name, setting.value))
            record.set(APPLIED, setting.why or None)
        with self._ledger.lock:
            self._ledger.records.append(record)

    def undo(self, warn: Callable[[str], None]) -> None:
        """Deactivate the rules and unset the variables, newest first."""
        with self._ledger.lock:
            rules, self.rules = self.rules, []
            env_set, self._env_set = self._env_set, []
        for rule, record in reversed(rules):
            for warning in rule.deactivate():
                warn(warning)
            if record.status in (APPLIED, PENDING):
                record.set(REVERTED, None)
        for name, value in reversed(env_set):
            if os.environ.get(name) == value:
                del os.environ[name]
