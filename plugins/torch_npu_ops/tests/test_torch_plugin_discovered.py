"""The torch plugin is installed and discoverable through its entry point."""

from __future__ import annotations

import importlib.metadata


def test_torch_plugin_is_discoverable_through_its_entry_point():
    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="ascend_patch") if ep.name == "torch"
    ]
    assert entry_point.value == "ascend_patch_torch.plugin"

    module = entry_point.load()

    assert module.__name__ == "ascend_patch_torch.plugin"
    assert isinstance(module.register_patches(), list)
