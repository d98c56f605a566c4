"""``ascend-patch scan``: the real CLI in a subprocess on tests/data/scan_fixture, a small
CUDA-written project, with exact findings; coverage decided by a test plugin's declarations.
"""

from __future__ import annotations

import json
import keyword
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_patch_core import _scan


FIXTURE = Path(__file__).parent / "data" / "scan_fixture"
BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"

COVERAGE_PLUGIN = """
    from ascend_patch_core import AtomicPatch, InjectImport, ModuleHook, ReplaceImport, SkipImport, hookimpl


    def replacement(*args, **kwargs):
        return None


    def visit(module):
        return []


    @hookimpl
    def register_import_rules():
        return [
            SkipImport("flash_attn"),
            ReplaceImport("torch_scatter", "apx_cov_plugin"),
            InjectImport("apx_cov_plugin", "nms", "mmcv.ops"),
        ]


    @hookimpl
    def register_patches():
        return [
            AtomicPatch("torch.Tensor.cuda", replacement),
            AtomicPatch("torch.Tensor.to", replacement),
            AtomicPatch("torch.cuda.synchronize", replacement),
            AtomicPatch(
                "torch.distributed.distributed_c10d.init_process_group",
                replacement,
                aliases="torch.distributed.init_process_group",
            ),
            ModuleHook("torch.utils.*", visit),
        ]
    """

# (path, line, rule, symbol, covered): everything the fixture contains, in report order.
EXPECTED = [
    ("ext/jit.py", 6, "cuda-extension", "torch.utils.cpp_extension.load('fused_jit')", False),
    (
        "ext/jit.py",
        8,
        "cuda-extension",
        "torch.utils.cpp_extension.load_inline('inline_ops')",
        False,
    ),
    ("ext/jit.py", 11, "cuda-device", "torch.load(map_location='cuda:1')", False),
    (
        "ext/setup.py",
        8,
        "cuda-extension",
        "torch.utils.cpp_extension.CUDAExtension('fused_ops')",
        False,
    ),
    ("models/net.py", 5, "cuda-import", "flash_attn.flash_attn_func", True),
    ("models/net.py", 9, "cuda-import", "xformers.ops", False),
    ("models/net.py", 19, "cuda-device", ".to(0)", True),
    ("models/ops.py", 1, "cuda-import", "torch_scatter", True),
    ("models/ops.py", 2, "cuda-import", "apex.amp", False),
    ("models/ops.py", 3, "cuda-import", "mmcv.ops.nms", True),
    ("models/ops.py", 4, "cuda-import", "mmcv.ops.roi_align", False),
    ("models/ops.py", 5, "cuda-import", "spconv.pytorch.SparseConvTensor", False),
    ("train.py", 8, "torch-cuda", "torch.cuda.amp.GradScaler", False),
    ("train.py", 16, "nccl", 'torch.distributed.init_process_group("nccl")', True),
    ("train.py", 17, "torch-cuda", "torch.cuda.set_device", False),
    ("train.py", 18, "torch-cuda", "torch.cuda.is_available", False),
    ("train.py", 19, "cuda-call", ".cuda()", True),
    ("train.py", 20, "torch-cuda", "torch.cuda.amp.GradScaler", False),
    ("train.py", 21, "cuda-device", "torch.randn(device='cuda')", False),
    ("train.py", 22, "cuda-device", ".to('cuda:0')", True),
    ("train.py", 23, "cuda-device", "torch.autocast('cuda')", False),
    ("train.py", 26, "torch-cuda", "torch.cuda.synchronize", True),
    ("utils/dist.py", 10, "nccl", "torch.distributed.Backend.NCCL", True),
    ("utils/dist.py", 10, "nccl", "torch.distributed.is_nccl_available", False),
    ("utils/dist.py", 12, "cuda-device", "torch.device('cuda')", False),
]


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    info = root / "apx_cov-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apx-cov\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[ascend_patch]\napx_cov = apx_cov_plugin\n")
    (root / "apx_cov_plugin.py").write_text(textwrap.dedent(COVERAGE_PLUGIN))
    return root


def scan(tmp_path: Path, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(
        PYTHONPATH=str(site),
        ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"),
        ASCEND_PATCH_PLUGINS="apx_cov",
    )
    cmd = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "ascend_patch_core._cli"]
    return subprocess.run(
        [*cmd, "scan", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def scan_json(tmp_path: Path, site: Path, *args: str) -> dict[str, Any]:
    done = scan(tmp_path, site, "--json", *args)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_fixture_findings_exactly(tmp_path: Path, site: Path) -> None:
    """Every CUDA-only construct of the fixture, with place, rule, symbol and coverage; exact counts per rule."""
    result = scan_json(tmp_path, site, str(FIXTURE))

    assert result["schema"] == "ascend-patch-scan/1"
    got = [(f["path"], f["line"], f["rule"], f["symbol"], f["covered"]) for f in result["findings"]]
    assert got == EXPECTED
    summary = result["summary"]
    assert (summary["findings"], summary["covered"], summary["not_covered"]) == (25, 9, 16)
    assert summary["by_rule"] == {
        "cuda-call": {"findings": 1, "covered": 1, "not_covered": 0},
        "torch-cuda": {"findings": 5, "covered": 1, "not_covered": 4},
        "cuda-device": {"findings": 6, "covered": 2, "not_covered": 4},
        "nccl": {"findings": 3, "covered": 2, "not_covered": 1},
        "cuda-import": {"findings": 7, "covered": 3, "not_covered": 4},
        "cuda-extension": {"findings": 3, "covered": 0, "not_covered": 3},
    }
    assert summary["not_covered_symbols"][0] == {
        "rule": "torch-cuda",
        "symbol": "torch.cuda.amp.GradScaler",
        "count": 2,
    }
    assert (result["files_scanned"], result["files_with_findings"]) == (8, 6)
    assert result["cuda_source_files"] == ["ext/fused_kernel.cu"]
    assert result["parse_errors"] == []
    plugins = {p["name"]: p for p in result["plugins"]}
    assert plugins.pop("apx_cov") == {
        "name": "apx_cov",
        "distribution": "apx-cov",
        "version": "0.1.0",
        "status": "loaded",
    }
    assert {p["status"] for p in plugins.values()} == {
        "not selected"
    }  # ASCEND_PATCH_PLUGINS=apx_cov


def test_what_covers_a_finding(tmp_path: Path, site: Path) -> None:
    """covered_by names the plugin and the patch, alias or import rule; a module hook is only a possibility."""
    findings = {
        (f["path"], f["line"], f["symbol"]): f
        for f in scan_json(tmp_path, site, str(FIXTURE))["findings"]
    }

    def by(path: str, line: int, symbol: str) -> list[tuple[str, str, str]]:
        return sorted(
            (c["plugin"], c["kind"], c["target"])
            for c in findings[(path, line, symbol)]["covered_by"]
        )

    assert by("train.py", 19, ".cuda()") == [("apx_cov", "patch", "torch.Tensor.cuda")]
    assert by("train.py", 16, 'torch.distributed.init_process_group("nccl")') == [
        ("apx_cov", "patch", "torch.distributed.distributed_c10d.init_process_group"),
        ("apx_cov", "patch", "torch.distributed.init_process_group"),
    ]
    assert by("models/net.py", 5, "flash_attn.flash_attn_func") == [
        ("apx_cov", "rule", "flash_attn")
    ]
    assert by("models/ops.py", 3, "mmcv.ops.nms") == [("apx_cov", "rule", "mmcv.ops")]
    assert by("models/ops.py", 4, "mmcv.ops.roi_align") == []  # the rule injects nms only
    assert findings[("models/net.py", 5, "flash_attn.flash_attn_func")]["guarded"] is True
    assert findings[("models/net.py", 9, "xformers.ops")]["guarded"] is False
    load = findings[("ext/jit.py", 6, "torch.utils.cpp_extension.load('fused_jit')")]
    assert load["covered"] is False
    assert [(c["kind"], c["target"]) for c in load["possibly_covered_by"]] == [
        ("hook", "torch.utils.*")
    ]


def test_the_text_report(tmp_path: Path, site: Path) -> None:
    """Concise text: per-rule table, uncovered findings with file:line:col, the migration gap; -v lists covered ones too."""
    plain = scan(tmp_path, site, str(FIXTURE))
    verbose = scan(tmp_path, site, "-v", str(FIXTURE))

    assert plain.returncode == 0
    assert "\x1b[" not in plain.stdout
    assert "Migration gap: 16 of 25 CUDA-only constructs in 6 files are not covered" in plain.stdout
    assert "train.py:17:9" in plain.stdout and "torch.cuda.set_device" in plain.stdout
    assert "train.py:19:18" not in plain.stdout  # covered: only with -v
    assert (
        "train.py:19:18" in verbose.stdout
        and "covered by apx_cov:torch.Tensor.cuda" in verbose.stdout
    )
    assert "module hook apx_cov:" in verbose.stdout


def test_check_exclusions_and_parse_errors(tmp_path: Path, site: Path) -> None:
    """Virtualenvs and --exclude are skipped, unparsable files reported, nothing is imported; --check fails on gaps."""
    tree = tmp_path / "tree"
    shutil.copytree(FIXTURE, tree)
    (tree / "broken.py").write_text("def f(:\n")
    (tree / ".venv" / "lib").mkdir(parents=True)
    (tree / ".venv" / "lib" / "dep.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (tree / "third_party").mkdir()
    (tree / "third_party" / "vendored.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (tree / "side_effect.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w')\nimport torch\nx = 1\n"
    )

    result = scan_json(tmp_path, site, str(tree), "--exclude", "third_party")
    checked = scan(tmp_path, site, "--check", str(tree))
    clean = scan(tmp_path, site, "--check", str(tree / "clean.py"))
    missing = scan(tmp_path, site, str(tree / "nope"))

    assert result["files_scanned"] == 10  # the fixture's 8, broken.py, side_effect.py
    assert result["parse_errors"] == [
        {"path": "broken.py", "line": 1, "error": "SyntaxError: invalid syntax"}
    ]
    assert result["summary"]["findings"] == 25
    assert not (tmp_path / "imported").exists()
    assert checked.returncode == 1
    assert (clean.returncode, "No CUDA-only constructs found." in clean.stdout) == (0, True)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


# ---------------------------------------------------------------------------- the analysis itself

_identifiers = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s) and s not in ("torch", "cuda")
)


@given(alias=_identifiers, attr=_identifiers)
def test_torch_cuda_is_found_under_any_import_alias(alias: str, attr: str) -> None:
    """torch.cuda is found through `import torch as X`, `from torch import cuda as X` and `import torch.cuda as X`."""
    sources = [
        f"import torch as {alias}\n{alias}.cuda.{attr}()\n",
        f"from torch import cuda as {alias}\n{alias}.{attr}()\n",
        f"import torch.cuda as {alias}\n{alias}.{attr}()\n",
    ]
    for source in sources:
        symbols = [(f.rule, f.symbol) for f in _scan.scan_source(source) if f.line == 2]
        assert symbols == [("torch-cuda", f"torch.cuda.{attr}")], source


@given(index=st.integers(min_value=0, max_value=15))
def test_device_strings_and_indices(index: int) -> None:
    """'cuda', 'cuda:N' and integer indices given to .to()/device= are found; 'cpu', 'npu' and look-alikes are not."""
    source = textwrap.dedent(
        f"""
        import torch
        a = x.to("cuda:{index}")
        b = x.to({index})
        c = torch.zeros(2, device={index})
        d = torch.zeros(2, device="cuda")
        e = x.to("cpu"), x.to("npu:{index}"), x.to("cudax"), x.to(torch.float16), x.to(True)
        f = torch.zeros(2, device="cuda:{index}x"), print("cuda"), torch.ones(2, dtype={index})
        """
    )
    found = [(f.line, f.rule) for f in _scan.scan_source(source)]

    assert found == [(3, "cuda-device"), (4, "cuda-device"), (5, "cuda-device"), (6, "cuda-device")]


def test_the_rules_table_is_documented() -> None:
    """Every rule and every CUDA-only package is named in docs/cli.md."""
    doc = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()

    for rule in _scan.RULES:
        assert f"`{rule}`" in doc
    for module in _scan.CUDA_ONLY_MODULES:
        assert module in doc
