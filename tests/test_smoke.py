"""The core's central promise, end to end: lazy application and exact revert."""

from __future__ import annotations

import sys

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patcher
from ascend_patch_core import Status


def test_patch_applies_on_first_import_and_reverts_exactly(make_package, patcher: Patcher) -> None:
    pkg = make_package(
        {
            "__init__.py": "from .core import compute\n",
            "core.py": "def compute(a):\n    return ('orig', a)\n",
            "user.py": "from {name}.core import compute\ndef run():\n    return compute(1)\n",
        }
    )

    def compute(a):
        return ("new", a)

    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", compute, aliases=[f"{pkg}.compute"])
    ).apply()
    assert pkg not in sys.modules, "apply() must not import the target"
    assert report.get(f"{pkg}.core.compute").status is Status.PENDING

    user = __import__(f"{pkg}.user", fromlist=["run"])
    core = sys.modules[f"{pkg}.core"]
    assert user.run() == ("new", 1)
    assert sys.modules[pkg].compute(2) == ("new", 2)

    patcher.revert()
    assert user.run() == ("orig", 1)
    assert core.compute.__module__ == f"{pkg}.core"
    assert sys.modules[pkg].compute is core.compute
    assert user.compute is core.compute
