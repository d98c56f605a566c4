"""The table of every mmcv._ext name in docs/mmcv-plugin.md is generated from the code and
current; every NPU kernel an implementation declares is one its family's code calls."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "mmcv_ext_table.py"


def _tool():
    spec = importlib.util.spec_from_file_location("mmcv_ext_table", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_current():
    pytest.importorskip("torch")
    assert _tool().main(["--check"]) == 0, "run: python tools/mmcv_ext_table.py"


def test_every_declared_npu_kernel_is_called_by_its_family():
    pytest.importorskip("torch")
    from ascend_patch_mmcv.served.mmcv_ext import registry

    implementations = registry.load_all()
    assert registry.NPU_KERNELS, "no implementation declares an NPU kernel"
    for name, text in registry.NPU_KERNELS.items():
        module = sys.modules[implementations[name].__module__]
        served = Path(sys.modules["ascend_patch_mmcv.served.mmcv_ext"].__path__[0])
        plugin = Path(sys.modules["ascend_patch_mmcv"].__path__[0])
        sources = [inspect.getsource(module)]
        # A family may call its kernels through the plugin's shared kernel modules.
        sources += [p.read_text() for p in plugin.glob("*_kernels.py")] + [
            p.read_text() for p in served.glob("_*.py")
        ]
        text_of_code = "\n".join(sources)
        for kernel in re.findall(r"(?:mx_driving|torch_npu) ([a-z_0-9, ]+)", text):
            for single in (k.strip() for k in kernel.split(",")):
                assert re.search(rf"\b{single}\b", text_of_code), (name, single)
