"""CollectionsCompat: old code using ``collections.Mapping`` & co. runs on Python >= 3.10.

No OpenMMLab library is needed: these run in the plain tests session.
"""

from __future__ import annotations

import collections
import collections.abc
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from ascend_patch_mmcv.collections_compat import REMOVED_ALIASES
from ascend_patch_mmcv.groups import CollectionsCompat

from ascend_patch_core import Status


OLD_CODE = textwrap.dedent(
    """
    import collections
    from collections import Iterable, Sequence


    class Config(collections.Mapping):
        def __init__(self, **items):
            self._items = dict(items)

        def __getitem__(self, key):
            return self._items[key]

        def __iter__(self):
            return iter(self._items)

        def __len__(self):
            return len(self._items)


    def to_list(value):
        if isinstance(value, str) or not isinstance(value, Iterable):
            return [value]
        return list(value)


    config = Config(lr=0.1, steps=(1, 2))
    assert dict(config) == {"lr": 0.1, "steps": (1, 2)}
    assert isinstance(config["steps"], Sequence)
    assert isinstance([], collections.MutableSequence)
    assert to_list("ab") == ["ab"] and to_list((1, 2)) == [1, 2]
    assert callable(print) and isinstance(print, collections.Callable)
    print("old code ran")
    """
)


def test_old_collections_code_runs_with_the_group_and_revert_removes_the_aliases(
    isolated_patcher: Any, tmp_path: Path
) -> None:
    assert not hasattr(collections, "Mapping")  # Python >= 3.10, before the group
    isolated_patcher.enable(CollectionsCompat).add(CollectionsCompat).apply()
    for name in REMOVED_ALIASES:
        assert getattr(collections, name) is getattr(collections.abc, name)
        assert isolated_patcher.report.get(f"collections.{name}").status is Status.APPLIED
    exec(compile(OLD_CODE, str(tmp_path / "old_code.py"), "exec"), {})

    isolated_patcher.revert()
    for name in REMOVED_ALIASES:
        assert name not in vars(collections)
    assert not hasattr(collections, "Mapping")


def test_an_alias_someone_else_set_is_left_alone(isolated_patcher: Any) -> None:
    theirs = object()
    collections.Sized = theirs  # type: ignore[attr-defined]
    try:
        isolated_patcher.add(CollectionsCompat).apply()
        assert collections.Sized is theirs  # type: ignore[attr-defined]
        assert collections.Mapping is collections.abc.Mapping  # type: ignore[attr-defined]
        isolated_patcher.revert()
        assert collections.Sized is theirs  # type: ignore[attr-defined]
        assert not hasattr(collections, "Mapping")
    finally:
        del collections.Sized  # type: ignore[attr-defined]


def run_old_code(tmp_path: Path, enable: str | None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "old_code.py"
    script.write_text("import ascend_patch_core\nascend_patch_core.apply()\n" + OLD_CODE)
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_PATCH_ENABLE"}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    if enable is not None:
        env["ASCEND_PATCH_ENABLE"] = enable
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )


def test_the_installed_plugin_serves_old_code_once_the_group_is_enabled(tmp_path: Path) -> None:
    """The user's way: opt-in, so old code fails until the group is enabled by name."""
    off = run_old_code(tmp_path, enable=None)
    assert off.returncode != 0
    assert "cannot import name 'Iterable' from 'collections'" in off.stderr
    on = run_old_code(tmp_path, enable="CollectionsCompat")
    assert on.returncode == 0, on.stderr
    assert "old code ran" in on.stdout
