"""Target paths: what a patch names, parsed once when it is declared.

A target names one slot that holds an object:

* ``"pkg.mod.func"`` -- a module attribute;
* ``"pkg.mod.Class.method"`` -- a class attribute;
* ``"pkg.registry.MODELS._module_dict.Key"`` or ``"...MODELS._module_dict['a.b']"`` --
  a mapping entry;
* ``"pkg.mod:Class.method"`` -- the part before ``:`` is the module, said explicitly.

Parsing computes, once per patch, what resolution and planning ask of a path again
and again: its dotted key, the module names it passes through, and whether it names
a module global.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .errors import PatchDefinitionError
from .value import Value


__all__ = [
    "ENGINE",
    "Segment",
    "TargetPath",
    "engine_check",
    "is_dotted_name",
    "may_reach_the_engine",
    "use_engine_check",
]

ENGINE = "ascend_patch_core"

#: Names on the way to what the engine itself depends on (``_install.engine_targets``): a
#: path without any of them is not looked at more closely when it is declared.
_ENGINE_WAYS = frozenset(
    ("sys", "builtins", "__builtins__", "importlib", "_bootstrap", "_bootstrap_external",
     "machinery", "_frozen_importlib", "_frozen_importlib_external", "threading", "os", "_os",
     "_imp", "_thread", "_weakref", "_warnings", "marshal", "_io", "posix", "nt", "winreg",
     ENGINE)
)  # fmt: skip

# Patterns are compiled on first use (re caches them): import time is budgeted.
_BRACKET = r"""\[(?:'([^']*)'|"([^"]*)")\]"""


def is_dotted_name(text: str) -> bool:
    """True for 'a', 'a.b_c.d': what a module path or attribute chain may look like."""
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def may_reach_the_engine(path: TargetPath) -> bool:
    """Cheap screen (every declared patch passes it): whether ``path`` names a module the
    engine depends on, or one that may lead there (``os.sys.modules``)."""
    return any(segment.name in _ENGINE_WAYS for segment in path.segments)


#: How to load the check of a path that may reach the engine (``_install.engine_targets``, in
#: the install layer, since it resolves the path): handed over by the package root, so
#: the declarations never import a layer above them (docs/core.md: no circles).
_load_engine_check: Callable[[], Callable[[TargetPath, str, bool], None]] | None = None


def use_engine_check(load: Callable[[], Callable[[TargetPath, str, bool], None]]) -> None:
    """Set how to get the check :func:`engine_check` returns."""
    global _load_engine_check
    _load_engine_check = load


def engine_check() -> Callable[[TargetPath, str, bool], None]:
    """``refuse_declared(path, where, alias)``: raises for a target the engine depends on."""
    if _load_engine_check is None:  # pragma: no cover - ascend_patch_core hands it over
        raise RuntimeError("import ascend_patch_core first")
    return _load_engine_check()


# The small value types below are Value (__slots__) classes, not NamedTuples: see _value.py.


class Segment(Value):
    """One step of a target path: an attribute, or (``is_key``) a mapping key."""

    __slots__ = ("is_key", "name")
    _fields = ("name", "is_key")

    def __init__(self, name: str, is_key: bool = False) -> None:
        self.name = name
        #: Written as ``['key']``: always a mapping key, never an attribute.
        self.is_key = is_key


class TargetPath(Value):
    """A parsed target path."""

    __slots__ = ("global_module", "key", "module", "prefixes", "segments", "text")
    _fields = ("text", "module", "segments")

    def __init__(self, text: str, module: str | None, segments: tuple[Segment, ...]) -> None:
        self.text = text
        #: Set when the path says where the module ends (``mod.sub:Attr``).
        self.module = module
        self.segments = segments
        #: The path as one dotted name (``pkg.mod:Cls.f`` -> ``pkg.mod.Cls.f``): what
        #: two patches on the same slot have in common.
        self.key = text.replace(":", ".")
        #: Dotted names of the path's leading segments (``pkg``, ``pkg.mod``, ...), up to
        #: the first mapping key, without the last segment: the modules it may pass through.
        prefixes: list[str] = []
        name = ""
        for segment in segments[:-1]:
            if segment.is_key:
                break
            name = f"{name}.{segment.name}" if name else segment.name
            prefixes.append(name)
        self.prefixes = tuple(prefixes)
        #: For a path that names a module global (every segment but the last a module
        #: name, the last an attribute): that module's name, else None.
        last = segments[-1]
        self.global_module = (
            prefixes[-1] if len(prefixes) == len(segments) - 1 and not last.is_key else None
        )

    def __repr__(self) -> str:
        return f"TargetPath({self.text!r})"

    @classmethod
    def parse(cls, text: str) -> TargetPath:
        if not isinstance(text, str) or not text:
            raise PatchDefinitionError(f"invalid target path {text!r}: expected a dotted string")
        module: str | None = None
        rest = text
        if ":" in text:
            module, _, rest = text.partition(":")
            if not module or not rest or not is_dotted_name(module):
                raise PatchDefinitionError(
                    f"invalid target path {text!r}: write 'package.module:Attribute.attr'"
                )
            segments = list(_split(rest, text))
            head = [Segment(p) for p in module.split(".")]
            segments = head + segments
        else:
            segments = list(_split(rest, text))
        if len(segments) < 2:
            raise PatchDefinitionError(
                f"invalid target path {text!r}: name a module and an attribute, e.g. 'torch.matmul'"
            )
        if segments[0].is_key:
            raise PatchDefinitionError(
                f"invalid target path {text!r}: must start with a module name"
            )
        return cls(text, module, tuple(segments))

    @property
    def root(self) -> str:
        return self.segments[0].name

    def __str__(self) -> str:
        return self.text


def _split(text: str, whole: str) -> list[Segment]:
    if "[" not in text:
        # The common case, a plain dotted name: no regular expression needed.
        parts = text.split(".")
        if all(part.isidentifier() for part in parts):
            return [Segment(part) for part in parts]
    out: list[Segment] = []
    pos = 0
    n = len(text)
    while pos < n:
        if text[pos] == "[":
            m = re.compile(_BRACKET).match(text, pos)
            if not m:
                raise PatchDefinitionError(
                    f"invalid target path {whole!r}: bad key near {text[pos:]!r}"
                )
            out.append(Segment(m.group(1) if m.group(1) is not None else m.group(2), True))
            pos = m.end()
            pos = _after_segment(text, pos, whole)
            continue
        # A name runs to the next '.' or '['; it must be a Python identifier, judged
        # by str.isidentifier as on the plain path above.
        end = pos
        while end < n and text[end] not in ".[":
            end += 1
        name = text[pos:end]
        if not name.isidentifier():
            raise PatchDefinitionError(
                f"invalid target path {whole!r}: bad name near {text[pos:]!r}"
            )
        out.append(Segment(name))
        pos = _after_segment(text, end, whole)
    return out


def _after_segment(text: str, pos: int, whole: str) -> int:
    """Position of the next segment: a segment ends the path, or is followed by '.' or '['."""
    if pos == len(text) or text[pos] == "[":
        return pos
    if text[pos] == ".":
        if pos + 1 == len(text):
            raise PatchDefinitionError(f"invalid target path {whole!r}: ends with '.'")
        return pos + 1
    raise PatchDefinitionError(f"invalid target path {whole!r}: bad name near {text[pos:]!r}")
