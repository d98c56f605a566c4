"""What ``ascend-patch doctor`` shows of the emulator: the variable that steers it.

Found by the core's doctor through the entry-point group ``ascend_patch.doctor``
(docs/core.md, "Doctor reporters"); the core itself knows nothing of the emulator's
settings. Whether the kit is installed, doctor reads from the metadata.
"""

from __future__ import annotations

from ._activate import DEVICES_VARIABLE


__all__ = ["VARIABLES"]

#: Variables doctor shows (set ones always, all of them with -v), with what they do.
VARIABLES: dict[str, str] = {
    DEVICES_VARIABLE: (
        "ascend-patch: how many NPUs the emulator provides (default: torchrun's"
        " LOCAL_WORLD_SIZE, else 1); `run --emulated-devices N` sets it"
    ),
}
