"""The transfer_to_npu coverage declarations agree with the patches, and the doc table is generated.

docs/torch-plugin.md once claimed coverage it did not have (every shared torch.cuda name,
``torch.cuda.device``, every factory, the profiler row): its table is now written by
tools/torch_coverage_table.py from ``torch_transfer_coverage`` (beside these tests), and
these tests fail when an item names a patch the plugin does not declare or the page is stale.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from torch_transfer_coverage import ITEMS
from torch_transfer_coverage import ROWS
from torch_transfer_coverage import declared_patches
from torch_transfer_coverage import patches_of


ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "torch_coverage_table.py"
PAGE = ROOT / "docs" / "torch-plugin.md"


def _tool():
    spec = importlib.util.spec_from_file_location("torch_coverage_table", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("item", [i for i in ITEMS if not i.left_out], ids=lambda i: i.name)
def test_every_covered_item_names_declared_patches(item):
    declared = declared_patches()
    try:
        patches = patches_of(item, declared)
    except KeyError as exc:
        pytest.fail(f"{item.name}: no patch of the plugin is named {exc}")
    assert patches


def test_left_out_items_say_why_and_nothing_is_missing():
    for item in ITEMS:
        assert item.left_out or not item.name.startswith(" "), item
        if item.left_out:
            assert not item.by and not item.differs, f"{item.name}: left out, yet covered"
            assert len(item.left_out) > 20, f"{item.name}: the reason is too short to be one"
    assert len({(i.row, i.name) for i in ITEMS}) == len(ITEMS), "an item is listed twice"
    assert {i.row for i in ITEMS} == {r.key for r in ROWS}, "a row without items, or the reverse"


def test_the_shared_torch_cuda_names_exist_in_torch_cuda():
    import torch

    shared = [i.name for i in ITEMS if i.row == "cuda" and i.name.startswith("torch.cuda.")]
    missing = [name for name in shared if not _resolves(torch, name)]
    assert not missing, f"not in this torch: {missing}"


def _resolves(root, dotted):
    obj = root
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True


def test_the_doc_table_is_generated_and_current():
    result = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_a_stale_table_is_detected_and_rewritten():
    tool = _tool()
    page = PAGE.read_text(encoding="utf-8")
    stale = page.replace("| `CudaApi` (", "| `CudaApi` (1", 1)
    assert stale != page
    assert tool.updated(stale) == page
    assert tool.main(["--check"]) == 0


def test_the_page_cites_only_what_a_reader_can_open():
    page = PAGE.read_text(encoding="utf-8")
    assert "../shared" not in page
    assert "torch_npu/contrib/transfer_to_npu.py" in page
