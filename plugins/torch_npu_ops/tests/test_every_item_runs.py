"""Every covered transfer_to_npu item, and every other redirect patch, runs once under the emulator.

Parametrized from ``torch_transfer_coverage`` (beside these tests: the declarations the doc
table is generated from) and from the patches the groups declare: an item or a patch without an
exercise fails. An exercise (``exercises_*.py``) calls the item the way CUDA-written code
does (``"cuda:0"``, ``torch.device("cuda", 0)``, ``0``) and checks the effect; each patch
it stands for must then be applied and, where it counts calls, show a redirected one.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ascend_patch_torch import plugin
from torch_transfer_coverage import ITEMS
from torch_transfer_coverage import declared_patches
from torch_transfer_coverage import patches_of

from ascend_patch_core import Patcher


def _load(name: str) -> types.ModuleType:
    """A module of this directory, by path (it is not a package), registered under ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


kit = _load("exercise_kit")
for _family in ("exercises_cuda", "exercises_torch", "exercises_dist"):
    _load(_family)

DECLARED = declared_patches()
COVERED = [item for item in ITEMS if not item.left_out]
_USED = {name for item in COVERED for name in patches_of(item, DECLARED)}
PARAMS = [pytest.param(i.name, patches_of(i, DECLARED), id=i.name) for i in COVERED] + [
    pytest.param(name, (name,), id=name) for name in DECLARED if name not in _USED
]


def _resolve(dotted: str) -> Any:
    """The object at ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise LookupError(dotted)


def _fake_npu_profiler() -> types.ModuleType:
    """torch_npu.profiler's names (the emulator has none), recording what its profile gets."""
    module = types.ModuleType("torch_npu.profiler")

    class Profile:
        def __init__(self, *, activities: Any = None, **kwargs: Any) -> None:
            self.activities, self.kwargs, self.timelines = activities, kwargs, []

        def export_memory_timeline(self, output_path: str, device: Any = None) -> None:
            self.timelines.append((output_path, device))

    module.profile = Profile  # type: ignore[attr-defined]
    module.ProfilerActivity = types.SimpleNamespace(CPU="npu-profiler CPU", NPU="npu-profiler NPU")  # type: ignore[attr-defined]
    module._ExperimentalConfig = type("ExperimentalConfig", (), {})  # type: ignore[attr-defined]
    module.schedule = lambda *args, **kwargs: ("npu schedule", args, kwargs)  # type: ignore[attr-defined]
    module.tensorboard_trace_handler = lambda *args, **kwargs: ("npu handler", args)  # type: ignore[attr-defined]
    module.ProfilerAction = types.SimpleNamespace(RECORD="npu RECORD")  # type: ignore[attr-defined]
    return module


@contextlib.contextmanager
def _applied(monkeypatch: pytest.MonkeyPatch, npu_profiler: bool) -> Iterator[Patcher]:
    """The plugin's default groups applied (with a torch_npu.profiler if asked); reverted after."""
    with monkeypatch.context() as patch:
        if npu_profiler:
            patch.setitem(sys.modules, "torch_npu.profiler", _fake_npu_profiler())
            patch.delitem(sys.modules, "ascend_patch_torch._npu_profiler", raising=False)
        patcher = Patcher(autoload=False, strict=True)
        for group in plugin.register_patches():
            if not group.opt_in:
                patcher.add(group)
        patcher.apply()
        try:
            yield patcher
        finally:
            patcher.revert()
            # Built against the stand-in: the next import must build it again.
            sys.modules.pop("ascend_patch_torch._npu_profiler", None)


def _runs(name: str, patches: tuple[str, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(exercise key, object to hand it, patches it stands for) for one parameter."""
    if name in kit.EXERCISES:  # an exercise of the item itself (named, or described)
        return [(name, name if "`" not in name else DECLARED[patches[0]].names[1], patches)]
    missing = [patch for patch in patches if patch not in kit.EXERCISES]
    if missing:
        pytest.fail(f"{name}: no exercise for the patch(es) {missing}: add one to exercises_*.py")
    # The item's own name when it is one of the patch's names (an alias: torch.cuda.random.seed).
    return [(p, name if name in DECLARED[p].names else DECLARED[p].names[1], (p,)) for p in patches]


@pytest.mark.parametrize(("name", "patches"), PARAMS)
def test_runs_under_the_emulator_with_cuda_arguments(
    name: str, patches: tuple[str, ...], npu_emulator: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    for key, target, stands_for in _runs(name, patches):
        with _applied(monkeypatch, npu_profiler=key in kit.WITH_NPU_PROFILER) as patcher:
            kit.EXERCISES[key](_resolve(target), kit.Ctx(tmp_path, monkeypatch))
            for patch in stands_for:
                record = patcher.report.get(patch)
                assert record.status.value == "applied", f"{patch}: {record.status} {record.reason}"
                if record.counters is not None:
                    assert record.counters.replacement_calls >= 1, f"{patch} was not redirected"


def test_every_exercise_stands_for_an_item_or_a_patch() -> None:
    known = {item.name for item in COVERED} | set(DECLARED)
    assert not sorted(set(kit.EXERCISES) - known), "an exercise of nothing the plugin declares"
