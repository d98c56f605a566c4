"""Environment settings plugins recommend through the ``configure_env`` hook."""

from __future__ import annotations

import os
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass

from ._errors import PatchDefinitionError


__all__ = ["EnvSetting", "normalize_env"]


@dataclass(frozen=True)
class EnvSetting:
    """A recommended environment variable: written only if the user has not set it."""

    name: str
    value: str
    why: str = ""

    __module__ = "ascend_patch_core"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "=" in self.name:
            raise PatchDefinitionError(f"EnvSetting: invalid variable name {self.name!r}")
        if not isinstance(self.value, str):
            raise PatchDefinitionError(
                f"EnvSetting({self.name!r}): value must be a string, got {self.value!r}"
            )

    def user_value(self) -> str | None:
        return os.environ.get(self.name)


def normalize_env(result: object) -> list[EnvSetting]:
    """Accept what a ``configure_env`` hook may return; raise TypeError otherwise."""
    if result is None:
        return []
    if isinstance(result, Mapping):
        return [EnvSetting(str(k), v) for k, v in result.items()]
    if isinstance(result, Iterable) and not isinstance(result, (str, bytes)):
        items = list(result)
        bad = [x for x in items if not isinstance(x, EnvSetting)]
        if bad:
            raise TypeError(f"expected EnvSetting objects, got {bad[0]!r}")
        return items
    raise TypeError(f"expected a mapping or EnvSetting objects, got {type(result).__name__}")
