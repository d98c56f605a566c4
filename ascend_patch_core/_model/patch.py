"""Declarations: AtomicPatch (one target), Patch (a named group), ModuleHook, LegacyPatch,
and EnvSetting (an environment default a plugin recommends).

Declaring a patch does nothing: no import, no resolution. A Patcher decides when.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from typing import ClassVar
from typing import TypeAlias
from typing import Union

from .errors import PatchDefinitionError
from .paths import TargetPath
from .paths import engine_check
from .paths import may_reach_the_engine
from .standalone import standalone as _standalone
from .value import Value


__all__ = [
    "AtomicPatch",
    "EnvSetting",
    "LegacyPatch",
    "ModuleHook",
    "Patch",
    "PatchLike",
    "is_import_rule",
    "normalize_requires",
    "shared_signature",
    "signature_of",
]


def normalize_requires(requires: str | Sequence[str] | None, where: str) -> tuple[str, ...]:
    """Requirement strings, each 'dist SPEC' or alternatives 'a SPEC | b SPEC'."""
    if requires is None:
        return ()
    if isinstance(requires, str):
        items: tuple[str, ...] = (requires,)
    elif isinstance(requires, (list, tuple)) and all(isinstance(r, str) for r in requires):
        items = tuple(requires)
    else:
        raise PatchDefinitionError(
            f"{where}: requires must be a string or a sequence of strings, got {requires!r}"
        )
    for item in items:
        if not item.strip() or any(not alt.strip() for alt in item.split("|")):
            raise PatchDefinitionError(f"{where}: empty requirement in {requires!r}")
    return items


def _names(value: str | Sequence[str] | None, what: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise PatchDefinitionError(
        f"{where}: {what} must be a string or a sequence of strings, got {value!r}"
    )


def _check_callable(value: object, what: str, where: str) -> None:
    if value is not None and not callable(value):
        raise PatchDefinitionError(f"{where}: {what} must be callable, got {value!r}")


class AtomicPatch:
    """Replace one target (and its aliases) with a replacement.

    :param target: dotted path of the slot to replace; see :mod:`ascend_patch_core` docs.
    :param replacement: the object to install, or a dotted string (``"pkg.mod:func"``
        or ``"pkg.mod.func"``) resolved when the target is installed.
    :param aliases: other paths bound to the same object (re-exports); each is
        patched when its module is imported, and reported on its own.
    :param precheck: called right before installation (after the target module is
        imported); False skips the patch with its reason, an exception fails it. It may
        take any of the keyword arguments ``target``, ``replacement``, ``aliases``,
        ``original``.
    :param runtime_check: ``check(*args, **kwargs)``; per call, a falsy result or an
        exception runs the original instead of the replacement.
    :param replacement_wrapper: ``wrapper(replacement) -> object`` applied to the resolved replacement.
    :param target_wrapper: ``wrapper(original) -> object``; used when no replacement is given.
    :param requires: distribution constraints checked from metadata before anything
        is imported, e.g. ``"mmcv>=2.0,<2.3 | mmcv-lite>=2.0,<2.3"``.
    :param after: names of patches (or groups) that must be applied first.
    :param after_import: modules that must be imported before this patch is applied
        (for registry entries filled by another module).
    :param create: allow the target slot not to exist yet (registry entries); revert removes it.
    :param rebind: rebind modules that hold the original (``from x import f`` made
        before apply); ``None`` follows the patcher's ``rebind_stale`` setting.
    :param name: the patch's name; defaults to the target path.
    :param note: one line for the report and ``doctor`` about how this patch does its
        work, e.g. ``"kernel: mx_driving"`` for a replacement that picked its kernel.
    """

    __module__ = "ascend_patch_core"

    def __init__(
        self,
        target: str,
        replacement: Any = None,
        *,
        aliases: str | Sequence[str] = (),
        precheck: Callable[..., object] | None = None,
        runtime_check: Callable[..., object] | None = None,
        replacement_wrapper: Callable[[Any], Any] | None = None,
        target_wrapper: Callable[[Any], Any] | None = None,
        requires: str | Sequence[str] | None = None,
        after: str | Sequence[str] = (),
        after_import: str | Sequence[str] = (),
        create: bool = False,
        rebind: bool | None = None,
        name: str | None = None,
        note: str | None = None,
    ) -> None:
        where = f"AtomicPatch({target!r})"
        self.path = TargetPath.parse(target)
        self.target = target
        if replacement is None and target_wrapper is None:
            raise PatchDefinitionError(f"{where}: give a replacement or a target_wrapper")
        _check_callable(precheck, "precheck", where)
        _check_callable(runtime_check, "runtime_check", where)
        _check_callable(replacement_wrapper, "replacement_wrapper", where)
        _check_callable(target_wrapper, "target_wrapper", where)
        self.replacement = replacement
        self.alias_paths = tuple(TargetPath.parse(a) for a in _names(aliases, "aliases", where))
        self.aliases = tuple(p.text for p in self.alias_paths)
        if target in self.aliases:
            raise PatchDefinitionError(f"{where}: the target is listed among its own aliases")
        self.precheck = precheck
        self.runtime_check = runtime_check
        self.replacement_wrapper = replacement_wrapper
        self.target_wrapper = target_wrapper
        self.requires = normalize_requires(requires, where)
        self.after = _names(after, "after", where)
        self.after_import = _names(after_import, "after_import", where)
        _check_switch(create, "create", where)
        _check_switch(rebind, "rebind", where)
        self.create = bool(create)
        self.rebind = None if rebind is None else bool(rebind)
        self.name = name or target
        if name is not None:
            where = f"AtomicPatch({target!r}, name={name!r})"
        for path in (self.path, *self.alias_paths):
            if may_reach_the_engine(path):  # the check is loaded only for such paths
                engine_check()(path, where, path is not self.path)
        if note is not None and not isinstance(note, str):
            raise PatchDefinitionError(f"{where}: note must be a string, got {type(note).__name__}")
        self.note = note
        #: The replacement is an object, used as given: no import, no wrapper, no precheck
        #: (a runtime_check may still be put around it).
        self.direct = (
            replacement is not None
            and not isinstance(replacement, str)
            and replacement_wrapper is None
            and precheck is None
        )
        #: ... and no runtime_check either: installed exactly as given.
        self.plain = self.direct and runtime_check is None

    def __repr__(self) -> str:
        return f"AtomicPatch({self.target!r})"

    # -- the DrivingSDK patcher's per-patch use (on a Patcher of its own: _per_patch) --

    @property
    def module(self) -> str:
        """The target's top-level package (``"mmcv"`` for ``"mmcv.ops.nms"``)."""
        return self.target.partition(".")[0]

    def apply(self) -> Any:
        """Apply this patch alone; return its :class:`Record`. Lazy like any patch: it
        says ``pending`` until the target module is imported. :meth:`revert` undoes it."""
        return _standalone().apply_one(self)

    def revert(self) -> Any:
        """Undo :meth:`apply`; return the record (None if never applied alone)."""
        return _standalone().revert_one(self)

    @property
    def is_applied(self) -> bool:
        """Whether :meth:`apply` installed it (a Patcher's patches: see its report)."""
        record = _standalone().record_of(self)
        return record is not None and record.status.value == "applied"

    def get_info(self, show_diff: bool = False) -> str:
        """``"target: original -> replacement"`` (plus the source diff with ``show_diff``)."""
        standalone = _standalone()
        own = getattr(self, "_own_patcher", None)
        installed = [i for i in own.installed() if i.record.name == self.name] if own else []
        original = installed[0].original if installed else None
        replacement = installed[0].replacement if installed else self.replacement
        return str(standalone.info_line(self, original, replacement, show_diff))

    def call_precheck(self, original: Any) -> object:
        """Call the precheck with the keyword arguments it declares."""
        precheck = self.precheck
        assert precheck is not None
        wanted = _keyword_names(precheck)
        if not wanted:
            return precheck()
        offered = {
            "target": self.target,
            "replacement": self.replacement,
            "aliases": self.aliases,
            "original": original,
            "replacement_wrapper": self.replacement_wrapper,
            "target_wrapper": self.target_wrapper,
        }
        if wanted is _ALL:
            return precheck(**offered)
        return precheck(**{k: v for k, v in offered.items() if k in wanted})


class ModuleHook:
    """Patches discovered when a module is imported.

    ``callback(module)`` runs after every import of a module whose name matches
    ``pattern`` (``fnmatch`` syntax, e.g. ``"transformers.models.*.modeling_*"``) and
    returns the :class:`AtomicPatch` es to apply to it, for instance every RMSNorm
    class it finds. Modules already imported when the hook is applied are visited at once.
    """

    __module__ = "ascend_patch_core"

    def __init__(
        self,
        pattern: str,
        callback: Callable[[Any], Iterable[AtomicPatch] | None],
        *,
        name: str | None = None,
        requires: str | Sequence[str] | None = None,
    ) -> None:
        where = f"ModuleHook({pattern!r})"
        if (
            not isinstance(pattern, str)
            or not pattern
            or any(c in pattern.partition(".")[0] for c in "*?[")
        ):
            raise PatchDefinitionError(
                f"{where}: the pattern must start with a literal package name"
            )
        _check_callable(callback, "callback", where)
        self.pattern = pattern
        self.callback = callback
        self.name: str = name or str(getattr(callback, "__name__", pattern))
        self.requires = normalize_requires(requires, where)

    def __repr__(self) -> str:
        return f"ModuleHook({self.pattern!r}, name={self.name!r})"


class LegacyPatch:
    """A 1.0-style patch function ``func(module, options)`` run when ``target_module`` is imported.

    Kept for the DrivingSDK patcher's 1.0 API. It cannot be reverted exactly (the function may
    change anything); revert() reports it as such.
    """

    __module__ = "ascend_patch_core"

    def __init__(
        self,
        func: Callable[[Any, Any], object],
        options: Any = None,
        target_module: str | None = None,
        *,
        priority: int = 0,
        patch_failure_warning: bool = True,
    ) -> None:
        if not callable(func):
            raise PatchDefinitionError(f"LegacyPatch: {func!r} is not callable")
        self.func = func
        # The function gets a dict it can .get() from, as in 1.0, when none was given.
        self.options = {} if options is None else options
        self.target_module = target_module
        self.priority = priority
        #: Accepted for 1.0 scripts; a failure is in the report either way.
        self.patch_failure_warning = patch_failure_warning
        self.name = str(
            getattr(func, "__patch_name__", None) or getattr(func, "__name__", repr(func))
        )

    @classmethod
    def from_1_0(
        cls,
        func: Callable[[Any, Any], object],
        options: Any = None,
        priority: int = 0,
        patch_failure_warning: bool = True,
    ) -> LegacyPatch:
        """1.0's ``Patch(func, options=None, priority=0, patch_failure_warning=True)``."""
        return cls(func, options, priority=priority, patch_failure_warning=patch_failure_warning)

    def bound_to(self, module: str) -> LegacyPatch:
        return LegacyPatch(
            self.func,
            self.options,
            module,
            priority=self.priority,
            patch_failure_warning=self.patch_failure_warning,
        )

    def __lt__(self, other: object) -> bool:
        # 1.0 sorted a module's patches by priority (lowest first).
        if not isinstance(other, LegacyPatch):
            return NotImplemented
        return self.priority < other.priority

    def __repr__(self) -> str:
        return f"LegacyPatch({self.name!r}, target_module={self.target_module!r})"


class Patch:
    """A named group of patches. Subclass it and implement :meth:`patches`.

    Class attributes: ``name`` (defaults to the class name), ``conflicts_with`` (names
    of groups that must not be enabled together with this one), ``requires``
    (constraints applied to every patch of the group), ``after`` (groups or patches
    to apply first), ``legacy_name`` (the 1.0 function name), ``opt_in`` (a plugin's
    group that applies only when enabled by name: ``ASCEND_PATCH_ENABLE``,
    ``apply(enable=...)`` or ``Patcher.enable()``; a group the user adds is always on).
    """

    __module__ = "ascend_patch_core"

    name: ClassVar[str] = "Patch"
    conflicts_with: ClassVar[Sequence[str]] = ()
    requires: ClassVar[str | Sequence[str] | None] = None
    after: ClassVar[Sequence[str]] = ()
    legacy_name: ClassVar[str | None] = None
    #: Planned and started before every other group's ``patches()`` runs (their imports need it).
    apply_before_collect: ClassVar[bool] = False
    #: Other names ``disable()``, ``enable()`` and ``conflicts_with`` may use (see group_names).
    aliases: ClassVar[Sequence[str]] = ()
    opt_in: ClassVar[bool] = False

    def __init__(self, options: Any = None) -> None:
        #: What iterating the instance passes to :meth:`patches`.
        self.options = options

    def __iter__(self) -> Iterator[AtomicPatch | ModuleHook]:
        """The group's patches, as the DrivingSDK patcher's ``for p in MyPatch():`` reads them."""
        return iter(type(self).patches(self.options) or ())

    @classmethod
    def apply_all(cls, options: Any = None) -> list[Any]:
        """Apply this group alone, on a Patcher of its own; return its patches' records."""
        return list(_standalone().apply_group(cls, options))

    @classmethod
    def revert_all(cls) -> list[Any]:
        """Undo :meth:`apply_all` (and :meth:`apply`); return the records."""
        return list(_standalone().revert_group(cls))

    def apply(self) -> Any:
        """Apply this group alone; one :class:`Record` summing up its patches'."""
        standalone = _standalone()
        return standalone.fold(standalone.apply_group(type(self), self.options), self.name)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # 1.0 compatibility: Patch(func, options) declares a function-style patch. (Not
        # a metaclass: every plugin group is a subclass, and their creation is budgeted.)
        if cls is Patch and args and callable(args[0]) and not isinstance(args[0], type):
            return LegacyPatch.from_1_0(*args, **kwargs)
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    @classmethod
    def normalized_requires(cls) -> tuple[str, ...]:
        """``requires`` as a tuple of requirement strings (raises PatchDefinitionError if invalid)."""
        return normalize_requires(cls.requires, f"{cls.__qualname__}.requires")

    @classmethod
    def patches(cls, options: Any = None) -> Iterable[AtomicPatch | ModuleHook]:
        """Return this group's patches. ``options`` is what was passed to ``add()``."""
        raise NotImplementedError(f"{cls.__qualname__}.patches() is not implemented")


#: What ``Patcher.add`` and the ``register_patches`` hook accept.
PatchLike: TypeAlias = Union[type[Patch], AtomicPatch, ModuleHook, LegacyPatch]  # noqa: UP007 (runtime alias on 3.10)


def is_import_rule(obj: object) -> bool:
    """Whether ``obj`` is a SkipImport, ReplaceImport or InjectImport (or a subclass).

    Answered without importing the rules module, which most programs never need (it
    is not part of the budgeted start-up), and without looking it up: it sits above
    this module (docs/core.md). ``ImportRule`` marks its class, so its subclasses
    carry the mark; asked of the class, never the instance (a mock answers anything).
    """
    cls = type(obj)
    # add() asks this of every patch and group: answer those at once (by identity, as a
    # class may be unhashable), since a failed class-attribute lookup costs ~0.25 us.
    if cls is AtomicPatch or cls is type:
        return False
    return getattr(cls, "__ascend_patch_import_rule__", False) is True


def _check_switch(value: object, flag: str, where: str) -> None:
    """A switch is True, False or None (default), not any value: ``create="no"`` was True."""
    try:
        ok = value is None or (not isinstance(value, (str, bytes)) and value in (True, False))
    except Exception:  # an array's ambiguous truth, a broken __eq__
        ok = False
    if not ok:
        raise PatchDefinitionError(f"{where}: {flag} must be True or False, got {value!r}")


#: What _keyword_names answers for a callable taking ``**kwargs``.
_ALL: frozenset[str] = frozenset(("*",))


def _keyword_names(func: Callable[..., object]) -> frozenset[str]:
    """The parameter names ``func`` can take by keyword (``_ALL`` with ``**kwargs``).

    Read from the code object of a plain function (plugins give each patch its own
    precheck closure: inspect.signature would cost ~10 us each), else from its signature.
    """
    code = getattr(func, "__code__", None)
    if type(func) is types.FunctionType and code is not None:
        if code.co_flags & inspect.CO_VARKEYWORDS:
            return _ALL
        start = code.co_posonlyargcount
        return frozenset(code.co_varnames[start : code.co_argcount + code.co_kwonlyargcount])
    signature = shared_signature(func)
    if signature is None:
        return frozenset()
    parameters = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return _ALL
    return frozenset(p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY)


def signature_of(obj: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature(obj)``, or None for a callable without one (some builtins)."""
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


#: Signatures of prechecks and runtime checks, which plugins share between many
#: patches (one ``always`` check and one precheck serve ~150 redirect patches). Keyed
#: by identity, not equality (a callable's ``__eq__`` is its own business); forgotten
#: when the callable is collected.
_shared_signatures: dict[int, tuple[weakref.ref[Any], inspect.Signature | None]] = {}


def shared_signature(func: Callable[..., object]) -> inspect.Signature | None:
    """``inspect.signature(func)`` (None if it has none), computed once per callable."""
    key = id(func)
    cached = _shared_signatures.get(key)
    if cached is not None and cached[0]() is func:
        return cached[1]
    found = signature_of(func)
    try:
        ref = weakref.ref(func, lambda _dead: _shared_signatures.pop(key, None))
    except TypeError:  # not weakly referenceable (a builtin): not cached
        return found
    _shared_signatures[key] = (ref, found)
    return found


class EnvSetting(Value):
    """A recommended environment variable: written only if the user has not set it."""

    __module__ = "ascend_patch_core"
    __slots__ = ("name", "value", "why")
    _fields = ("name", "value", "why")

    def __init__(self, name: str, value: str, why: str = "") -> None:
        if not isinstance(name, str) or not name or "=" in name:
            raise PatchDefinitionError(f"EnvSetting: invalid variable name {name!r}")
        if not isinstance(value, str):
            raise PatchDefinitionError(
                f"EnvSetting({name!r}): value must be a string, got {value!r}"
            )
        self.name = name
        self.value = value
        self.why = why

    def __repr__(self) -> str:
        return f"EnvSetting({self.name!r}, {self.value!r}, why={self.why!r})"
