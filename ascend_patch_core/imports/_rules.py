"""Import rules: SkipImport, ReplaceImport, InjectImport.

A rule is a declaration. Activating it registers the module name with the import
hub and imports nothing; it takes effect when the program first imports that name.
Deactivating it removes every module it created from ``sys.modules`` and from its
parent package, so a reverted process imports the real module again.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import ClassVar

from .._model.errors import ImportRuleError
from .._model.errors import PatchDefinitionError
from .._model.paths import is_dotted_name
from .._model.report import Record
from .._model.report import Status
from ._hub import hub


__all__ = ["ImportRule", "InjectImport", "ReplaceImport", "SkipImport"]


_MISSING = object()


def _never() -> bool:
    return False


def _module_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not name or not is_dotted_name(name):
        raise PatchDefinitionError(f"{where}: {name!r} is not a dotted module name")
    return name


class ImportRule:
    """Base of the three rule kinds. ``kind`` and ``module`` identify a rule."""

    __module__ = "ascend_patch_core"
    #: What ``_model.patch.is_import_rule`` asks (the declarations cannot import this module).
    __ascend_patch_import_rule__: ClassVar[bool] = True
    kind: str = "rule"

    def __init__(self, module: str) -> None:
        self.module = module
        self.record: Record | None = None
        #: The modules this rule served, by name, in the order it served them.
        self._created: dict[str, types.ModuleType] = {}
        #: Whether a failure to serve the module raises (the activating patcher's
        #: strict mode) or falls back to the real module.
        self.strict: Callable[[], bool] = _never

    # The patcher drives these two.
    def activate(self, record: Record) -> None:
        raise NotImplementedError

    def deactivate(self) -> list[str]:
        """Undo the rule; return warnings about what could not be undone exactly."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.kind} {self.module}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.module!r})"

    def _forget_created(self) -> None:
        # Only what is still this rule's: a module put under the name since (a test's
        # stand-in, a program's own) is someone else's to take out.
        for name, module in reversed(self._created.items()):
            if sys.modules.get(name) is module:
                del sys.modules[name]
            parent_name, _, child = name.rpartition(".")
            parent = sys.modules.get(parent_name) if parent_name else None
            if parent is not None and vars(parent).get(child) is module:
                delattr(parent, child)
        self._created.clear()


class _ServedRule(ImportRule):
    """A rule that serves a module in place of the real one.

    A name can look like a module and be an attribute (``skip_import(
    "spconv.pytorch.SparseConvTensor")``, a class): no import ever asks for it, so the
    rule could never act. When the real parent module turns out to define that name
    as something other than a module, the rule stops, and its record says so and
    what to use instead.
    """

    subtree = False
    #: Serve the module only when the import system finds no real one (ReplaceImport's option).
    when_missing = False
    _parent_watch: Any = None
    #: Empty packages served for parents installed nowhere (_rule_parents).
    _parents: Any = None

    def activate(self, record: Record) -> None:
        self.record = record
        if self.module in sys.modules:
            if self.when_missing:
                record.set(
                    Status.SKIPPED,
                    f"the real {self.module} exists: it was already imported"
                    f"{_at(getattr(sys.modules[self.module], '__spec__', None))}",
                )
                return
            record.set(
                Status.SKIPPED, f"{self.module} was already imported; the rule cannot take effect"
            )
            return
        displaced = hub.serve(self.module, self, subtree=self.subtree)
        if "." in self.module and not self.when_missing:
            from ._rule_parents import MissingParents

            self._parents = MissingParents(self.module)
        when = ", if no real one is installed" if self.when_missing else ""
        record.set(Status.PENDING, f"takes effect when {self.module} is imported{when}")
        if isinstance(displaced, _ServedRule):  # two rules for one module: the last serves it
            why = f"{self.describe()} serves {self.module} now: keep one of the two rules"
            if displaced.record is not None and displaced.record.status is Status.PENDING:
                displaced.record.set(Status.SKIPPED, f"superseded: {why}")
            record.warnings.append(f"{displaced.describe()} was declared too; {why}")
        parent = self.module.rpartition(".")[0]
        if parent and parent in sys.modules:
            self._parent_imported(sys.modules[parent])
        elif parent:
            self._parent_watch = hub.when_imported(parent, self._parent_imported)

    def _parent_imported(self, parent: types.ModuleType) -> None:
        self._parent_watch = None
        record, leaf = self.record, self.module.rpartition(".")[2]
        value = vars(parent).get(leaf, _MISSING)
        served = str(getattr(getattr(parent, "__spec__", None), "origin", "")).startswith(
            "ascend-patch:"
        )
        if (
            record is None
            or record.status is not Status.PENDING
            or served  # a stub's or a served module's attributes are its own business
            or value is _MISSING  # may still be a submodule, imported later
            or isinstance(value, types.ModuleType)
        ):
            return
        hub.unserve(self.module, self)
        what = "a class" if isinstance(value, type) else f"a {type(value).__name__} object"
        record.set(
            Status.SKIPPED,
            f"{self.module} is not a module: {parent.__name__} defines {leaf!r} as {what}; "
            f"import rules act on modules -- {self._attribute_advice(parent.__name__)}",
        )

    def _attribute_advice(self, parent: str) -> str:
        return f"to replace the attribute, patch it: AtomicPatch({self.module!r}, ...)"

    def deactivate(self) -> list[str]:
        if self._parent_watch is not None:
            hub.unwatch(self._parent_watch)
            self._parent_watch = None
        hub.unserve(self.module, self)
        if self._parents is not None:
            self._parents.withdraw()
            self._parents = None
        self._forget_created()
        return []

    # ServedModule protocol
    def build(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        raise NotImplementedError

    def is_package(self, fullname: str) -> bool:
        raise NotImplementedError

    def origin(self, fullname: str) -> str:
        return f"ascend-patch:{self.kind}"

    def served(self, fullname: str, module: types.ModuleType) -> None:
        self._created[fullname] = module
        if self.record is not None and fullname == self.module:
            why = f"no real {fullname} is installed" if self.when_missing else None
            self.record.set(Status.APPLIED, why)

    def real_found(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> None:
        """The import system found the real module (``when_missing`` rules): it is used."""
        record = self.record
        if record is not None and record.status is Status.PENDING:
            record.set(Status.SKIPPED, f"the real {fullname} exists{_at(spec)}: it is used")

    def locate_real(self) -> tuple[bool, str | None]:
        """``(parent package installed, where the real module is or None)``; imports nothing."""
        parent_found, spec = _locate(self.module)
        if spec is None:
            return parent_found, None
        return True, str(spec.origin or "") or (
            ", ".join(spec.submodule_search_locations or ()) or self.module
        )


def _locate(fullname: str) -> tuple[bool, importlib.machinery.ModuleSpec | None]:
    """Where the real ``fullname`` is, found without importing anything.

    ``(top-level package found, the module's spec or None)``. Each package on the way
    is looked up by the import system's other finders in its parent's search
    locations, as an import would after importing the parents (an imported parent's
    ``__path__`` is used as it is; an unimported package whose ``__init__`` would change
    its own ``__path__`` is not followed there).
    """
    parts = fullname.split(".")
    path: list[str] | None = None
    spec: importlib.machinery.ModuleSpec | None = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        loaded_spec = getattr(loaded, "__spec__", None)
        if loaded is not None and not _is_served(loaded_spec):
            spec = loaded_spec
            found_path = getattr(loaded, "__path__", None)
        else:
            spec = hub._find_real_spec(name, path, None)
            found_path = None if spec is None else spec.submodule_search_locations
        if spec is None and loaded is None:
            return depth > 1, None
        if depth < len(parts):
            if found_path is None:
                return True, None
            path = list(found_path)
    return True, spec


def _is_served(spec: Any) -> bool:
    return str(getattr(spec, "origin", "")).startswith("ascend-patch:")


def _at(spec: Any) -> str:
    origin = getattr(spec, "origin", None)
    return f" ({origin})" if isinstance(origin, str) and origin else ""


class SkipImport(_ServedRule):
    """Serve a stub for ``module`` and all its submodules; the real one is never executed.

    Parents that exist are imported normally (``SkipImport("pkg.sub.heavy")`` still
    runs ``pkg/__init__.py``).
    """

    kind = "skip"
    subtree = True

    def __init__(self, module: str) -> None:
        super().__init__(_module_name(module, "SkipImport"))

    def _attribute_advice(self, parent: str) -> str:
        return (
            f"skip the module instead (skip_import({parent!r}) or its package), or "
            f"replace the attribute: AtomicPatch({self.module!r}, ...)"
        )

    def is_package(self, fullname: str) -> bool:
        return True

    def build(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        from ._stubs import new_stub_module

        return new_stub_module(fullname)


class ReplaceImport(_ServedRule):
    """Serve ``replacement`` as ``module``; the original module is never executed.

    With ``when_missing=True`` the replacement is served only where the import system
    finds no real module of that name (an optional compiled extension, say
    ``mmcv._ext``): where one exists, it is imported as usual and the rule's record is
    ``skipped`` ("the real mmcv._ext exists"). ``importlib.util.find_spec`` answers
    with the replacement's spec where it would be served.

    ``replacement`` may be:

    * ``None`` -- a new empty module holding ``exports``;
    * a module object -- served as is (``import mmcv._ext`` returns that very object);
    * a callable ``factory(name)`` returning a module or a mapping of attributes,
      called on the first import only (for large synthesized modules);
    * a string ``"pkg.mod:factory"`` naming such a factory, imported on first import;
    * a string ``"pkg.mod"`` naming a base module: the served module holds ``exports``
      and falls back to the base module's attributes (so does a module object given
      with exports).

    The DrivingSDK patcher's spellings are accepted: ``base_module="pkg.mod"`` (not
    together with ``replacement``), ``exports={...}`` and keyword attributes (a name
    given twice raises), ``replace_with.module(base, **exports)`` as the replacement.
    ``replacement``, ``base_module``, ``exports`` and ``when_missing`` are keywords of
    the rule; an attribute of one of these names is given in ``exports={...}``.
    """

    kind = "replace"

    def __init__(
        self,
        module: str,
        /,
        replacement: Any = None,
        *,
        base_module: str | types.ModuleType | None = None,
        exports: Mapping[str, Any] | None = None,
        when_missing: bool = False,
        **attrs: Any,
    ) -> None:
        from ._replace_args import merge_replacement

        super().__init__(_module_name(module, "ReplaceImport"))
        replacement, exports = merge_replacement(module, replacement, base_module, exports, attrs)
        if not isinstance(when_missing, bool):
            raise PatchDefinitionError(
                f"ReplaceImport({module!r}): when_missing must be True or False, got {when_missing!r}"
            )
        self.when_missing = when_missing
        if (
            replacement is not None
            and not isinstance(replacement, (str, types.ModuleType))
            and not callable(replacement)
        ):
            raise PatchDefinitionError(
                f"ReplaceImport({module!r}): replacement must be None, a module, a factory or a dotted name,"
                f" got {replacement!r}"
            )
        if isinstance(replacement, str) and ":" not in replacement:
            _module_name(replacement, f"ReplaceImport({module!r})")
        self.replacement = replacement
        self.exports = exports

    def is_package(self, fullname: str) -> bool:
        replacement = self.replacement
        return (
            isinstance(replacement, types.ModuleType)
            and not self.exports  # with exports, a new module falling back to it
            and hasattr(replacement, "__path__")
        )

    def describe(self) -> str:
        r = self.replacement
        target = (
            "exports"
            if r is None
            else r.__name__
            if isinstance(r, types.ModuleType)
            else r
            if isinstance(r, str)
            else getattr(r, "__qualname__", repr(r))
        )
        when = " (when missing)" if self.when_missing else ""
        return f"replace {self.module} -> {target}{when}"

    def build(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        replacement = self.replacement
        try:
            if isinstance(replacement, types.ModuleType) and not self.exports:
                placeholder = types.ModuleType(fullname)
                placeholder.__ascend_patch_alias__ = replacement  # type: ignore[attr-defined]
                return placeholder
            module = types.ModuleType(fullname, f"Served by ascend-patch in place of {fullname}.")
            if isinstance(replacement, types.ModuleType) or (
                isinstance(replacement, str) and ":" not in replacement
            ):
                # A base module: the served one holds the exports and falls back to it
                # (looked up on use, not copied: later additions to the base are seen).
                base = (
                    replacement
                    if isinstance(replacement, types.ModuleType)
                    else importlib.import_module(replacement)
                )

                def __getattr__(name: str) -> Any:
                    try:
                        return getattr(base, name)
                    except AttributeError:
                        raise AttributeError(
                            f"module {fullname!r} has no attribute {name!r}"
                        ) from None

                vars(module)["__getattr__"] = __getattr__
                module.__ascend_patch_base__ = base  # type: ignore[attr-defined]
            elif replacement is not None:
                factory = (
                    _load_factory(replacement) if isinstance(replacement, str) else replacement
                )
                try:
                    made = factory(fullname)
                except TypeError as exc:  # most often the signature: say what it is called with
                    raise TypeError(
                        f"{exc} (a factory is called as factory({fullname!r}))"
                    ) from exc
                if isinstance(made, types.ModuleType):
                    if made.__name__ != fullname:
                        placeholder = types.ModuleType(fullname)
                        placeholder.__ascend_patch_alias__ = made  # type: ignore[attr-defined]
                        return placeholder
                    module = made
                elif isinstance(made, Mapping):
                    module.__dict__.update(made)
                else:
                    raise TypeError(
                        f"the factory returned {type(made).__name__}; expected a module or a mapping"
                    )
            module.__dict__.update(self.exports)
            return module
        except Exception as exc:
            if self.record is not None:
                fallback = "" if self.strict() else "; the real module was imported instead"
                self.record.set(Status.FAILED, f"could not build the module: {exc!r}{fallback}")
            raise ImportRuleError(
                f"ascend-patch {self.describe()}: could not build the module: {exc}"
            ) from exc


def _load_factory(path: str) -> Callable[[str], Any]:
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


class InjectImport(ImportRule):
    """When ``target_module`` is imported, set ``target_module.<name> = source_module.<name>``.

    Never overwrites an existing attribute; appends ``name`` to a list/tuple ``__all__``.
    The source module is imported only then.
    """

    kind = "inject"

    def __init__(self, source_module: str, name: str, target_module: str) -> None:
        super().__init__(_module_name(target_module, "InjectImport"))
        self.source_module = _module_name(source_module, "InjectImport")
        if not isinstance(name, str) or not name.isidentifier():
            raise PatchDefinitionError(f"InjectImport: {name!r} is not an attribute name")
        self.name = name
        self._handle: Any = None
        self._injected: tuple[types.ModuleType, Any, Any] | None = None

    def describe(self) -> str:
        return f"inject {self.source_module}.{self.name} -> {self.module}"

    def activate(self, record: Record) -> None:
        self.record = record
        record.set(Status.PENDING, f"takes effect when {self.module} is imported")
        self._handle = hub.when_imported(self.module, self._inject)

    def _inject(self, module: types.ModuleType) -> None:
        self._handle = None
        record = self.record
        assert record is not None
        if self.name in vars(module):
            record.set(Status.SKIPPED, f"{self.module}.{self.name} already exists; not overwritten")
            return
        try:
            value = getattr(importlib.import_module(self.source_module), self.name)
        except ModuleNotFoundError as exc:
            record.set(Status.SKIPPED, f"{self.source_module} is not importable: {exc}")
            return
        except Exception as exc:
            record.set(Status.FAILED, f"cannot get {self.source_module}.{self.name}: {exc!r}")
            return
        setattr(module, self.name, value)
        old_all = vars(module).get("__all__")
        if isinstance(old_all, list):
            vars(module)["__all__"] = [*old_all, self.name]
        elif isinstance(old_all, tuple):
            vars(module)["__all__"] = (*old_all, self.name)
        self._injected = (module, value, old_all)
        record.set(Status.APPLIED, None)

    def deactivate(self) -> list[str]:
        if self._handle is not None:
            hub.unwatch(self._handle)
            self._handle = None
        warnings: list[str] = []
        if self._injected is not None:
            module, value, old_all = self._injected
            if vars(module).get(self.name) is value:
                delattr(module, self.name)
                if isinstance(old_all, (list, tuple)):
                    vars(module)["__all__"] = old_all
            else:
                warnings.append(
                    f"{self.module}.{self.name} was changed after injection; left as is"
                )
            self._injected = None
        return warnings
