"""The one reader of the on/off ``ASCEND_PATCH_*`` variables.

``ASCEND_PATCH_AUTOLOAD``, ``ASCEND_PATCH_STRICT``, ``ASCEND_PATCH_CACHE``,
``ASCEND_PATCH_COUNT_CALLS`` (and plugins' own switches, through the public
:func:`env_flag`) accept the same words. A value that is neither on nor off
(``ASCEND_PATCH_STRICT=maybe``) is an error naming the variable and the accepted
values: guessing would turn strict mode, or plugin discovery, silently on or off.
Unset or empty means the variable's default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ._errors import PatchDefinitionError


__all__ = ["FALSE_WORDS", "TRUE_WORDS", "env_flag"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Read the on/off variable ``name``: ``1/true/yes/on`` or ``0/false/no/off``.

    Case and surrounding blanks do not matter; unset or empty gives ``default``.
    Anything else raises :class:`~ascend_patch_core.PatchDefinitionError` (a
    ``ValueError``) naming the variable, its value and the accepted words.
    """
    value = (os.environ if environ is None else environ).get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if not word:
        return default
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise PatchDefinitionError(
        f"{name}={value!r} is neither on nor off: use {'/'.join(TRUE_WORDS)} to turn it on, "
        f"{'/'.join(FALSE_WORDS)} to turn it off, or leave it unset "
        f"(default: {'on' if default else 'off'})"
    )
