"""``mmcv._ext`` without compiling mmcv: the module the mmcv plugin serves where mmcv has none.

:mod:`.provider` builds the module (the plugin's ``ReplaceImport("mmcv._ext", ...,
when_missing=True)`` rule calls it on the first ``import mmcv._ext``, and only where no
compiled ``mmcv._ext`` is installed); :mod:`.registry` holds the implementations the
op-family modules (:data:`.registry.FAMILIES`) register; :mod:`.provider_sources` reads
what ``mmcv._ext`` must hold from mmcv's sources (``tools/mmcv_ext_names.py`` writes the
committed table, ``data/ext_mmcv.json``). Importing this package imports none of them.
"""

from __future__ import annotations


__all__: list[str] = []
