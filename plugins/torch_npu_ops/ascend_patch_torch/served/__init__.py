"""Modules served in place of a missing library by the plugin's ``ReplaceImport`` rules.

Each is named after the library module it stands in for (:mod:`.torch_scatter` for
``torch_scatter``); :func:`ascend_patch_torch.groups.import_rules` points at them.
"""
