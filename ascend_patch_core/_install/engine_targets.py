"""Targets the engine itself depends on: refused when a patch names them.

A patch replaces its target for the whole interpreter, the engine included. Some
objects the engine needs in order to see imports, to install and undo patches and to
stay usable across ``fork()``; a replacement there can leave a process that can
neither apply nor revert (``AtomicPatch("sys.modules", f)`` did: both raised, for
good). So these targets are refused:

* the import system's state: ``sys.modules``, ``sys.meta_path``, ``sys.path_hooks``,
  ``sys.path_importer_cache`` -- the slots and everything in them;
* the import machinery: ``importlib``'s own names, ``importlib._bootstrap`` and
  ``importlib._bootstrap_external`` (also as ``_frozen_importlib`` and
  ``_frozen_importlib_external``), ``importlib.machinery``, their classes, and the
  built-in modules importlib calls (``_imp``, ``_thread``, ``_weakref``, ``_warnings``,
  ``marshal``, ``_io``, ``posix``/``nt``, ``winreg``);
* ``builtins``, every name (``__import__``, ``setattr``, ``getattr``, ``isinstance`` ...:
  the engine reads them while it installs and undoes patches, like every module);
* the ``threading`` and ``os`` functions the engine's locks and fork handling call;
* the engine itself: ``ascend_patch_core`` and everything in it.

A target is looked at twice. When the patch is declared, by its text (``sys:modules``
and ``_frozen_importlib`` spell the same slots as ``sys.modules`` and
``importlib._bootstrap``) and, through modules already imported, by identity
(``os.sys.modules`` is ``sys.modules``): the constructor raises. Reached under a name
that cannot be read before its module is imported, the patch fails when it would be
installed, with the same message.
"""

from __future__ import annotations

import sys
import types

from .._model.errors import PatchDefinitionError
from .._model.errors import PatchError
from .._model.paths import ENGINE
from .._model.paths import TargetPath
from .target import IMPORT_STATE as _IMPORT_STATE
from .target import LOW_LEVEL as _LOW_LEVEL
from .target import MACHINERY as _MACHINERY
from .target import Slot
from .target import is_engine as _is_engine


__all__ = ["refusal_for_path", "refusal_for_slot", "refuse_declared", "refuse_slot"]

#: What the engine's locks, its waits and its fork handling call.
_THREADING = frozenset(("Condition", "Event", "Lock", "RLock", "get_ident", "local"))
_OS = frozenset(("register_at_fork", "environ"))
_ALIASES = {
    "_frozen_importlib": "importlib._bootstrap",
    "_frozen_importlib_external": "importlib._bootstrap_external",
}

_WHY_IMPORT_STATE = (
    "the engine finds targets, sees imports and undoes patches through it; replaced, "
    "neither apply() nor revert() can work (nor any import)"
)
_FIX_IMPORT = (
    "to serve, hide or stub a module use an import rule (Patcher.replace_import, "
    "skip_import, inject_import); to change a module's attribute, target that attribute "
    "(package.module.name)"
)
_WHY_MACHINERY = (
    "every import runs on it, the engine's import hook and its own deferred imports "
    "included; replaced, revert() may not be able to run"
)
_FIX_MACHINERY = (
    _FIX_IMPORT + "; to act after a module is imported, use a ModuleHook or a patch on "
    "that module (patches wait for their module's import)"
)
_WHY_BUILTINS = (
    "every module looks these names up there, the engine too while it installs and "
    "undoes patches (__import__, setattr, getattr, isinstance, ...)"
)
_FIX_LOCAL = (
    "patch the name where your code uses it: '<module>.{name}' with create=True "
    "shadows it for that module only"
)
_WHY_THREADS = "the engine's locks, waits and fork() handling call it"
_WHY_ENGINE = "it is the engine that applies and reverts patches"
_FIX_ENGINE = (
    "configure the engine through Patcher and its switches (docs/core.md); patch your "
    "own code or the library instead"
)


def _module_name(obj: object) -> str | None:
    if isinstance(obj, types.ModuleType):
        name = vars(obj).get("__name__")
        return name if isinstance(name, str) else None
    return None


def _verdict(kind: str, key: str) -> tuple[str, str] | None:
    """(why, fix) for slot ``key`` of an object of ``kind`` (see _known_as), or None if allowed."""
    if kind == "sys":
        return (_WHY_IMPORT_STATE, _FIX_IMPORT) if key in _IMPORT_STATE else None
    if kind == "import state":
        return _WHY_IMPORT_STATE, _FIX_IMPORT
    if kind == "builtins":
        return _WHY_BUILTINS, _FIX_LOCAL.format(name=key)
    if kind == "machinery":
        return _WHY_MACHINERY, _FIX_MACHINERY
    if kind == "low level":
        return "importlib calls it while importing every module", _FIX_LOCAL.format(name=key)
    if (kind == "threading" and key in _THREADING) or (kind == "os" and key in _OS):
        return _WHY_THREADS, _FIX_LOCAL.format(name=key)
    if kind == "engine":
        return _WHY_ENGINE, _FIX_ENGINE
    return None


def _known_as(owner: object) -> tuple[str, str] | None:
    """(what it is called, its kind) if ``owner`` is an object guarded here (by identity)."""
    name = _module_name(owner)
    if name is not None:
        name = _ALIASES.get(name, name)
        if name in ("sys", "builtins", "threading", "os"):
            return name, name
        if name == "importlib" or name in _MACHINERY:
            return name, "machinery"
        if name in _LOW_LEVEL:
            return name, "low level"
        return (name, "engine") if _is_engine(name) else None
    if isinstance(owner, type):
        defined = vars(owner).get("__module__")
        if isinstance(defined, str) and defined in _MACHINERY:
            return f"{_ALIASES.get(defined, defined)}.{owner.__qualname__}", "machinery"
        if _is_engine(defined):
            return f"{defined}.{owner.__qualname__}", "engine"
        return None
    for key in _IMPORT_STATE:
        if owner is getattr(sys, key, None):
            return f"sys.{key}", "import state"
    if owner is vars(sys.modules["builtins"]):
        return "builtins", "builtins"
    kind = type(owner)
    if _is_engine(getattr(kind, "__module__", None)):
        return f"{kind.__module__}.{kind.__qualname__} object", "engine"
    return None


def _textual(path: TargetPath) -> tuple[str, str, str] | None:
    """(why, fix, the slot's usual name) from the path's spelling alone: also slots that
    do not exist yet."""
    names = [segment.name for segment in path.segments]
    if "__builtins__" in names[:-1]:
        return _WHY_BUILTINS, _FIX_LOCAL.format(name=names[-1]), f"builtins.{names[-1]}"
    dotted = _ALIASES.get(names[0], names[0]).split(".") + names[1:]
    found = _textual_verdict(dotted)
    return None if found is None else (*found, ".".join(dotted))


def _textual_verdict(dotted: list[str]) -> tuple[str, str] | None:
    root = dotted[0]
    if root == ENGINE:
        return _WHY_ENGINE, _FIX_ENGINE
    if root == "importlib" and len(dotted) > 2:
        # importlib._bootstrap.*, importlib.machinery.*; not importlib.metadata.version,
        # importlib.util.find_spec and the like, which the engine does not run on.
        return _verdict("machinery", dotted[2]) if ".".join(dotted[:2]) in _MACHINERY else None
    if root == "sys" and len(dotted) > 2 and dotted[1] in _IMPORT_STATE:
        return _verdict("import state", dotted[2])
    if len(dotted) != 2:
        return None
    if root in ("sys", "builtins", "threading", "os"):
        return _verdict(root, dotted[1])
    if root == "importlib":
        return _verdict("machinery", dotted[1])
    return _verdict("low level", dotted[1]) if root in _LOW_LEVEL else None


def refusal_for_slot(owner: object, key: str, text: str) -> str | None:
    """Why slot ``key`` of ``owner`` (named ``text`` by a patch) is refused, or None."""
    known = _known_as(owner)
    if known is None:
        return None
    what, kind = known
    found = _verdict(kind, key)
    if found is None:
        return None
    slot = f"{what}[{key!r}]" if isinstance(owner, dict) else f"{what}.{key}"
    return _message(text, slot, *found)


def refusal_for_path(path: TargetPath) -> str | None:
    """Why a patch may not target ``path`` (read without importing anything), or None."""
    spelled = _textual(path)
    if spelled is not None:
        why, fix, usual = spelled
        return _message(path.text, usual, why, fix)
    from .target import resolve

    # By identity, through modules already imported: ``os.sys.modules`` is sys.modules.
    try:
        slot = resolve(path, create=True)
    except Exception:  # an attribute on the way that raises: judged when installed
        return None
    if isinstance(slot, Slot):
        return refusal_for_slot(slot.owner, slot.key, path.text)
    return None


def _message(text: str, canonical: str | None, why: str, fix: str) -> str:
    same = f" (that is {canonical})" if canonical and canonical != text else ""
    return (
        f"target {text!r}{same} is something the engine itself depends on: {why}. Instead, {fix}."
    )


def refuse_declared(path: TargetPath, where: str, alias: bool) -> None:
    """Raise PatchDefinitionError if a patch declared at ``where`` may not target ``path``."""
    why = refusal_for_path(path)
    if why is not None:
        raise PatchDefinitionError(f"{where}: {'alias ' if alias else ''}{why}")


def refuse_slot(slot: Slot, text: str) -> None:
    """Raise PatchError if ``slot`` (that ``text`` named) is one the engine depends on.

    Declaring such a patch raises already; this catches a target that reaches one
    under a name that could not be read before its module was imported. Callers ask
    ``_target.engine_owned(slot.owner)`` first (cheap), and load this module only then.
    """
    why = refusal_for_slot(slot.owner, slot.key, text)
    if why is not None:
        raise PatchError(why)
