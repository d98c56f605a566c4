"""Modules the mmcv plugin serves in place of a library module that is missing.

Each is named after the module it stands in for and is imported only by the core,
through the ``ReplaceImport`` rule of :func:`ascend_patch_mmcv.groups.import_rules`
that names its factory: :mod:`.mmcv_ext` for ``mmcv._ext`` (mmcv without compiled ops).
"""
