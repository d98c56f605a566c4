"""Modules served in place of a missing library by the plugin's ``ReplaceImport`` rules.

Each is named after the library module it stands in for (:mod:`.flash_attn` for
``flash_attn``); :func:`ascend_patch_transformers.groups.import_rules` points at them.
"""
