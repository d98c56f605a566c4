"""The one reader of the on/off ``ASCEND_PATCH_*`` variables.

``ASCEND_PATCH_AUTOLOAD``, ``ASCEND_PATCH_STRICT``, ``ASCEND_PATCH_CACHE``,
``ASCEND_PATCH_COUNT_CALLS`` (and plugins' own switches, through the public
:func:`env_flag`) accept the same words. A value that is neither on nor off
(``ASCEND_PATCH_STRICT=maybe``) is an error naming the variable and the accepted
values: guessing would turn strict mode, or plugin discovery, silently on or off.
Unset or empty means the variable's default. :func:`env_seconds` reads the one
number among them, ``ASCEND_PATCH_PLUGIN_TIMEOUT``, with the same verdict for a bad
value; :func:`check_switches` checks every one of them at once, so each command
(and ``apply()``) refuses the same values with the same message before doing anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import PatchDefinitionError


__all__ = [
    "CLI_PLUGIN_TIMEOUT_S",
    "FALSE_WORDS",
    "PLUGIN_TIMEOUT",
    "SWITCHES",
    "TRUE_WORDS",
    "check_switches",
    "env_flag",
    "env_seconds",
]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

#: The core's on/off switches and their defaults.
SWITCHES = {
    "ASCEND_PATCH_AUTOLOAD": True,
    "ASCEND_PATCH_STRICT": False,
    "ASCEND_PATCH_CACHE": True,
    "ASCEND_PATCH_COUNT_CALLS": False,
}
#: Seconds a plugin may take to load (import and hooks); 0 = no bound (docs/plugin-authors.md).
PLUGIN_TIMEOUT = "ASCEND_PATCH_PLUGIN_TIMEOUT"
#: The bound of the ``ascend-patch`` commands (doctor, scan, report, run and the
#: processes it starts) when the variable is unset; ``apply()`` alone has none.
CLI_PLUGIN_TIMEOUT_S = 10.0
#: Longer than any bound anyone means (a day): a larger number is a typo, not a wish.
_MAX_SECONDS = 86400.0


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


def env_seconds(
    name: str, default: float | None, environ: Mapping[str, str] | None = None
) -> float | None:
    """Read the variable ``name`` as a number of seconds; None means "no bound".

    Unset or empty gives ``default``; ``0`` gives None. Anything but a number from 0
    to a day raises :class:`~ascend_patch_core.PatchDefinitionError` naming the
    variable, its value and what it accepts.
    """
    value = (os.environ if environ is None else environ).get(name)
    if value is None or not value.strip():
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= _MAX_SECONDS:  # also NaN
        shown = "no bound" if default is None else f"{default:g} s"
        raise PatchDefinitionError(
            f"{name}={value!r} is not a number of seconds: use a number from 0 to "
            f"{_MAX_SECONDS:g} (e.g. 30), 0 for no bound, or leave it unset (default: {shown})"
        )
    return seconds or None


def check_switches(environ: Mapping[str, str] | None = None) -> None:
    """Raise PatchDefinitionError naming every core switch whose value is invalid.

    The message is the one :func:`env_flag` (or :func:`env_seconds`) gives for each,
    so ``apply()`` and every command say the same thing about the same value.
    """
    problems: list[str] = []
    for name, default in SWITCHES.items():
        try:
            env_flag(name, default, environ)
        except PatchDefinitionError as exc:
            problems.append(str(exc))
    try:
        env_seconds(PLUGIN_TIMEOUT, None, environ)
    except PatchDefinitionError as exc:
        problems.append(str(exc))
    if problems:
        raise PatchDefinitionError("; ".join(problems))
