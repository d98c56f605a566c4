"""pytest plugin for patch authors (registered through the ``pytest11`` entry point).

Fixtures:

* ``npu_emulator`` -- the NPU emulator, active for the test (``import torch_npu``,
  ``torch.npu``, ``"npu"`` devices, ``torch.ops.npu`` with real schemas); yields its
  :class:`~ascend_patch_emulator.EmulatorHandle` and deactivates afterwards
  (unless it was already active before the test, e.g. from a conftest);
* ``emulated_torch_npu_version`` -- the torch_npu version the emulator uses,
  from ``--torch-npu-version`` (or the ``ascend_patch_torch_npu_version`` ini
  option); one version per pytest process;
* ``isolated_patcher`` -- a fresh strict :class:`~ascend_patch_core.Patcher` with no
  plugin discovery, always reverted at teardown;
* ``assert_parity`` -- :func:`ascend_patch_emulator.pytest_plugin.assert_parity`, for
  tests that prefer a fixture to an import.

Nothing here imports torch or ascend_patch_core at pytest start-up; the fixtures
import what they need when a test uses them. See docs/testing-patches.md.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

# torch-free at import (torch is imported when a helper runs): the plugin stays light.
from ._parity import assert_parity as assert_parity
from ._parity import tolerance_for as tolerance_for


if TYPE_CHECKING:
    from ascend_patch_core import Patcher
    from ascend_patch_emulator import EmulatorHandle


__all__ = [
    "assert_parity",
    "emulated_torch_npu_version",
    "isolated_patcher",
    "npu_emulator",
    "tolerance_for",
]

_OPTION = "--torch-npu-version"
_INI = "ascend_patch_torch_npu_version"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ascend-patch", "ascend-patch NPU emulator")
    group.addoption(
        _OPTION,
        action="store",
        default=None,
        metavar="VERSION",
        help="torch_npu version the npu_emulator fixture emulates (default: the emulator's "
        "default version). One version per pytest process.",
    )
    parser.addini(_INI, "torch_npu version the npu_emulator fixture emulates", default="")


@pytest.fixture(scope="session")
def emulated_torch_npu_version(pytestconfig: pytest.Config) -> str:
    """The torch_npu version ``npu_emulator`` emulates in this pytest process."""
    from ._activate import resolve_version

    chosen = pytestconfig.getoption(_OPTION) or pytestconfig.getini(_INI) or None
    return resolve_version(chosen)


@pytest.fixture
def npu_emulator(emulated_torch_npu_version: str) -> Iterator[EmulatorHandle]:
    """The NPU emulator, active for the test; deactivated after it unless it was active before."""
    from . import activate
    from . import is_active

    was_active = is_active()
    handle = activate(emulated_torch_npu_version)
    try:
        yield handle
    finally:
        if not was_active:
            handle.deactivate()


@pytest.fixture
def isolated_patcher() -> Iterator[Patcher]:
    """A strict ``Patcher`` without plugin discovery, reverted after the test whatever happens."""
    from ascend_patch_core import Patcher

    patcher = Patcher(autoload=False, strict=True)
    try:
        yield patcher
    finally:
        patcher.revert()


@pytest.fixture(name="assert_parity")
def _assert_parity_fixture() -> Callable[..., None]:
    """:func:`assert_parity` as a fixture."""
    return assert_parity
