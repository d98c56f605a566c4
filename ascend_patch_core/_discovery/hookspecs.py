"""The plugin author's contract: the three hooks a plugin may implement.

A plugin is a module named by an entry point in the group ``ascend_patch``. It marks
its functions with :data:`hookimpl`; the core calls them in this order during
:func:`ascend_patch_core.apply`:

1. :func:`configure_env` -- environment defaults, before anything imports torch_npu;
2. :func:`register_import_rules` -- skip / replace / inject rules, before any patch;
3. :func:`register_patches` -- the patches themselves.

Every hook returns declarations; none should import the libraries it patches
(``apply()`` must stay cheap and must not import target libraries).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pluggy


if TYPE_CHECKING:
    from .._model.patch import EnvSetting
    from .._model.patch import PatchLike
    from ..imports._rules import ImportRule

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

#: The pluggy project name; also the entry-point group plugins are published in.
PROJECT_NAME = "ascend_patch"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Decorator a plugin puts on its hook implementations.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def configure_env() -> Iterable[EnvSetting] | Mapping[str, str] | None:
    """Return recommended environment settings for this plugin's runtime.

    Called first. Each value is a *default*: the core writes it into ``os.environ``
    only when the user has not set that variable, and records which plugin asked for
    it and why (``ascend-patch doctor`` shows both). Return :class:`EnvSetting`
    objects to give a reason, or a plain ``{name: value}`` mapping.
    """


@hookspec
def register_import_rules() -> Iterable[ImportRule] | None:
    """Return import rules (:func:`skip_import`, :func:`replace_import`, :func:`inject_import`).

    Called after :func:`configure_env` and before :func:`register_patches`. Rules take
    effect when the named module is first imported; registering one imports nothing.
    """


@hookspec
def register_patches() -> Iterable[PatchLike] | None:
    """Return the plugin's default patches.

    Items may be :class:`Patch` subclasses, :class:`AtomicPatch` instances or
    :class:`ModuleHook` instances. Return declarations only: replacements given as
    dotted strings are resolved when their target module is imported.
    """
