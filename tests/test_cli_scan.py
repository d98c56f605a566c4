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

    # the fixture's 8 and side_effect.py; broken.py is found but not scanned
    assert (result["files_scanned"], result["files_not_scanned"]) == (9, 1)
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
    """Every rule and every CUDA-only package is named in docs/cli-reference.md."""
    doc = (Path(__file__).parent.parent / "docs" / "cli-reference.md").read_text()

    for rule in _scan.RULES:
        assert f"`{rule}`" in doc
    for module in _scan.CUDA_ONLY_MODULES:
        assert module in doc


# ---------------------------------------------------------------------------- exit statuses


def _cli_command() -> list[str]:
    return [str(CLI)] if CLI.exists() else [sys.executable, "-m", "ascend_patch_core._cli"]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["doctor", "--json"], id="doctor-json"),
        pytest.param(["doctor", "-v"], id="doctor-text"),
        pytest.param(["scan", "--json", str(FIXTURE)], id="scan-json"),
        pytest.param(["scan", "-v", str(FIXTURE)], id="scan-text"),
        pytest.param(["report", "--json"], id="report-json"),
        pytest.param(["--version", "--version"], id="version"),
    ],
)
def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path, args: list[str]) -> None:
    """`ascend-patch doctor --json | head`: no BrokenPipeError traceback, exit status 141 (128 + SIGPIPE)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    process = subprocess.Popen(
        [*_cli_command(), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first line is written
    stderr = process.stderr.read().decode()
    status = process.wait(timeout=120)

    assert stderr == ""
    assert status == 141


def test_scan_check_and_files_that_do_not_parse(tmp_path: Path, site: Path) -> None:
    """Every file unparsable: exit 1 (nothing was read), --check or not. Some unparsable: 0, but 1 under --check."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.py").write_text("def f(:\n")
    (broken / "b.py").write_text("x = (1\n")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.py").write_text("def f(:\n")
    (mixed / "clean.py").write_text("import torch\nx = torch.zeros(2)\n")

    all_broken = scan(tmp_path, site, str(broken))
    all_broken_check = scan(tmp_path, site, "--check", str(broken))
    some_broken = scan(tmp_path, site, str(mixed))
    some_broken_check = scan(tmp_path, site, "--check", str(mixed))
    clean_check = scan(tmp_path, site, "--check", str(mixed / "clean.py"))

    assert all_broken.returncode == all_broken_check.returncode == 1
    assert "Nothing was scanned: none of the 2 Python files parses." in all_broken.stdout
    assert some_broken.returncode == 0
    assert "Not scanned: 1 of 2 files" in some_broken.stdout
    assert some_broken_check.returncode == 1
    assert clean_check.returncode == 0


# ---------------------------------------------------------------------------- deep files


def _deep_sources() -> dict[str, str]:
    def terms(n: int) -> str:
        return " + ".join(["a"] * n)

    return {
        "sum600.py": f"import torch\nx = {terms(600)}\ny = torch.zeros(1).cuda()\n",
        "sum5000.py": f"import torch\nx = {terms(5000)}\ny = torch.zeros(1).cuda()\n",
        "sum50000.py": f"import torch\nx = {terms(50_000)}\ny = torch.zeros(1).cuda()\n",
        "cuda_terms.py": "import torch\nx = "
        + " + ".join(["torch.cuda.synchronize()"] * 3000)
        + "\n",
        "chain.py": "import torch\nx = torch.zeros(1)" + ".cuda()" * 4000 + "\n",
        "attributes.py": "import torch\nx = torch" + ".b" * 20_000 + "\ny = x.cuda()\n",
        "nested_calls.py": "import torch\nx = "
        + "f(" * 150
        + "torch.cuda.synchronize()"
        + ")" * 150
        + "\n",
        "nested_lambdas.py": "import torch\nx = " + "lambda: " * 800 + "torch.zeros(1).cuda()\n",
        "nested_blocks.py": "import torch\n"
        + "".join("    " * i + "if a:\n" for i in range(90))
        + "    " * 90
        + "torch.zeros(1).cuda()\n",
        "too_deep_parens.py": "x = " + "(" * 2000 + "1" + ")" * 2000 + "\n",
        "too_deep_not.py": "x = " + "not " * 20_000 + "a\n",
    }


def test_deep_files_are_scanned_not_a_crash(tmp_path: Path, site: Path) -> None:
    """Long expressions (600 to 50,000 terms), long chains and deep nesting are scanned like any file;
    what Python's own parser cannot hold is listed as not scanned, with the reason."""
    tree = tmp_path / "deep"
    tree.mkdir()
    for name, source in _deep_sources().items():
        (tree / name).write_text(source)

    done = scan(tmp_path, site, "--json", str(tree))

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    per_file: dict[str, list[str]] = {}
    for f in result["findings"]:
        per_file.setdefault(f["path"], []).append(f["rule"])
    errors = {e["path"]: e["error"] for e in result["parse_errors"]}
    expected = {
        "sum600.py": ["cuda-call"],
        "sum5000.py": ["cuda-call"],
        "sum50000.py": ["cuda-call"],
        "cuda_terms.py": ["torch-cuda"] * 3000,
        "chain.py": ["cuda-call"] * 4000,
        "attributes.py": ["cuda-call"],
        "nested_calls.py": ["torch-cuda"],
        "nested_lambdas.py": ["cuda-call"],
        "nested_blocks.py": ["cuda-call"],
    }
    for name, rules in expected.items():
        # How deep Python's parser goes depends on the Python version: whatever it can
        # parse is scanned in full; the rest is listed with the reason.
        if _parses(_deep_sources()[name]):
            assert per_file.get(name) == rules, name
        else:
            assert errors[name].startswith(("RecursionError:", "MemoryError:")), errors[name]
    assert per_file["sum600.py"] == ["cuda-call"]  # python itself runs this file
    assert errors["too_deep_parens.py"].startswith("SyntaxError: too many nested parentheses")
    assert errors["too_deep_not.py"].startswith(("SyntaxError:", "MemoryError:", "RecursionError:"))
    assert set(errors) <= {*expected, "too_deep_parens.py", "too_deep_not.py"}
    assert result["files_scanned"] + result["files_not_scanned"] == len(_deep_sources())
    assert result["files_not_scanned"] == len(errors)


def _parses(source: str) -> bool:
    from ascend_patch_core._scan.parse import parse

    try:
        parse(source)
    except (SyntaxError, RecursionError, MemoryError):
        return False
    return True


def test_a_deep_file_through_the_library_api() -> None:
    """scan_source() on a 600-term expression and on a 5,000-deep chain returns findings, never RecursionError."""
    wide = "import torch\nx = " + " + ".join(["a"] * 600) + "\ny = torch.cuda.synchronize()\n"
    deep = "import torch\nx = torch" + ".cuda" * 1 + ".b" * 5000 + "\n"

    assert [(f.line, f.symbol) for f in _scan.scan_source(wide)] == [(3, "torch.cuda.synchronize")]
    assert [f.rule for f in _scan.scan_source(deep)] == ["torch-cuda"]


# ---------------------------------------------------------------------------- verdicts = the run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _installed(group: str, name: str) -> bool:
    from importlib.metadata import entry_points

    return any(ep.name == name for ep in entry_points(group=group))


needs_torch_plugin = pytest.mark.skipif(
    not _installed("ascend_patch", "torch"), reason="needs the torch plugin (ascend-patch-torch)"
)


def real_scan(tmp_path: Path, *args: str) -> dict[str, Any]:
    """scan --json with the plugins installed in this environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [*_cli_command(), "scan", "--json", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _gaps(result: dict[str, Any]) -> list[str]:
    return [
        f"{f['path']}:{f['line']} {f['symbol']}" for f in result["findings"] if not f["covered"]
    ]


@needs_torch_plugin
def test_the_examples_have_no_gap_the_run_does_not_have(tmp_path: Path) -> None:
    """examples/ run unmodified under the torch plugin (its test_examples.py), so scan reports no gap there.

    torch.cuda.amp.GradScaler and torch.device("cuda") are covered by the patches the run
    applies (GradScaler.__init__ of torch.amp, where the device is consumed), and only by them:
    disabling those groups brings the gaps back.
    """
    result = real_scan(tmp_path, str(EXAMPLES))
    without = real_scan(
        tmp_path, "--disable", "Autocast,TensorDevices,ModuleDevices", str(EXAMPLES)
    )

    assert result["summary"]["findings"] > 20
    assert _gaps(result) == []
    symbols = {f["symbol"]: f for f in result["findings"]}
    scaler = symbols["torch.cuda.amp.GradScaler"]
    assert [c["target"] for c in scaler["covered_by"]] == [
        "torch.amp.grad_scaler.GradScaler.__init__"
    ]
    gaps = {f["symbol"] for f in without["findings"] if not f["covered"]}
    assert {"torch.cuda.amp.GradScaler", "torch.device('cuda')"} <= gaps


_REDIRECTED_PROGRAM = """
import torch
from torch import nn


def make(n, device="cuda"):
    return torch.zeros(n, device=device)


def place(module, *, device=torch.device("cuda")):
    return module.to(device)


def main():
    device = torch.device("cuda", 0)
    x = make(4) + torch.ones(4).to(device)
    model = place(nn.Linear(4, 2))
    scaler = torch.cuda.amp.GradScaler()
    with torch.cuda.amp.autocast():
        y = model(x)
    with torch.device("cuda"):
        z = torch.ones(2)
    where = "cuda"
    w = torch.ones(2, device=where)
    print(scaler.scale(y.float().sum()).item() is not None, z.sum().item(), w.sum().item())


main()
"""


@needs_torch_plugin
@pytest.mark.skipif(
    not _installed("ascend_patch.emulator", "torch_npu"), reason="needs the NPU emulator"
)
def test_covered_means_the_run_redirects_it(tmp_path: Path) -> None:
    """Each finding scan calls covered is covered by a patch that really redirected a call in the run.

    Parameter defaults (device="cuda", device=torch.device("cuda")), a device bound to a
    name (torch.device("cuda", 0), and the string "cuda"), torch.cuda.amp's GradScaler and
    autocast, `with torch.device("cuda"):`: the run
    report's replacement calls name the same patches as covered_by.
    """
    (tmp_path / "prog.py").write_text(_REDIRECTED_PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore")

    result = real_scan(tmp_path, "prog.py")
    run = subprocess.run(
        [*_cli_command(), "run", "--emulate-npu", "--report", "run.json", "prog.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    redirected = {
        record["target"]
        for process in report["processes"]
        for record in process["report"]["records"]
        if record.get("counters", {}).get("replacement_calls")
    }
    found = {(f["line"], f["symbol"]): f for f in result["findings"]}
    assert set(found) == {
        (6, "def make(device='cuda')"),
        (10, "torch.device('cuda')"),
        (15, "torch.device('cuda')"),
        (18, "torch.cuda.amp.GradScaler"),
        (19, "torch.cuda.amp.autocast"),
        (21, "torch.device('cuda')"),
        (23, "where = 'cuda'"),
    }
    for key, finding in found.items():
        assert finding["covered"], key
        assert {c["target"] for c in finding["covered_by"]} & redirected, key


LIBRARY = {
    "apx_lib/__init__.py": "from .api import Scaler as PublicScaler\nfrom .sub import *\n",
    "apx_lib/api.py": """
        from apx_lib import base


        class Scaler(base.Base):
            def __init__(self, device="cuda"):
                super().__init__(device)


        def other(device):
            return device


        def legacy(device):
            '''The old spelling: only forwards.'''
            return Scaler(device)
        """,
    "apx_lib/base.py": "class Base:\n    def __init__(self, device):\n        self.device = device\n",
    "apx_lib/sub.py": "from apx_lib.base import Base as helper\nfrom apx_lib.api import other\n",
    "apx_lib_plugin.py": """
        from ascend_patch_core import AtomicPatch, hookimpl


        def replacement(self, device):
            self.device = "npu"


        @hookimpl
        def register_patches():
            return [AtomicPatch("apx_lib.base.Base.__init__", replacement)]
        """,
}


def test_names_are_followed_into_the_library_that_defines_them(tmp_path: Path) -> None:
    """A re-exported subclass is covered by the patch of its base class's __init__ (where the
    library is read, never imported), and so is a function that only forwards to it; another
    function of the same library is not; --disable the patch and none is covered."""
    site = tmp_path / "site"
    for name, source in LIBRARY.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(textwrap.dedent(source))
    info = site / "apx_lib_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apx-lib-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[ascend_patch]\napx_lib = apx_lib_plugin\n")
    (site / "apx_lib" / "__init__.py").write_text(
        LIBRARY["apx_lib/__init__.py"] + "open('imported', 'w')\n"
    )
    code = tmp_path / "code"
    code.mkdir()
    (code / "use.py").write_text(
        "import apx_lib\n"
        "from apx_lib import helper\n"
        "a = apx_lib.PublicScaler(device='cuda')\n"
        "b = helper(device='cuda:1')\n"
        "c = apx_lib.other(device='cuda')\n"
        "d = apx_lib.api.legacy(device='cuda')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(
        PYTHONPATH=str(site),
        ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"),
        ASCEND_PATCH_PLUGINS="apx_lib",
    )

    def verdicts(*args: str) -> dict[int, list[str] | None]:
        done = subprocess.run(
            [*_cli_command(), "scan", "--json", *args, str(code)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return {
            f["line"]: [c["target"] for c in f["covered_by"]] if f["covered"] else None
            for f in json.loads(done.stdout)["findings"]
        }

    assert verdicts() == {
        3: ["apx_lib.base.Base.__init__"],
        4: ["apx_lib.base.Base.__init__"],
        5: None,
        6: ["apx_lib.base.Base.__init__"],  # a function that only forwards, to the subclass
    }
    disabled = verdicts("--disable", "apx_lib.base.Base.__init__")
    assert disabled == {3: None, 4: None, 5: None, 6: None}
    assert not (tmp_path / "imported").exists()


OPS_LIBRARY = {
    "mmcv/__init__.py": "",
    "mmcv/ops/__init__.py": (
        "from .deform import DeformLayer\nfrom .other import OtherLayer\n"
        "from .sparse import SubLayer\n"
    ),
    "mmcv/ops/kernels.py": """
        def pairs(x):
            return x
        """,
    "mmcv/ops/sparse.py": """
        import torch

        from . import kernels as ops


        class SparseLayer(torch.nn.Module):
            def forward(self, x):
                return ops.pairs(x)


        class SubLayer(SparseLayer):
            pass
        """,
    "mmcv/ops/deform.py": """
        import torch


        class _Function(torch.autograd.Function):
            pass


        deform = _Function.apply


        class DeformLayer(torch.nn.Module):
            def forward(self, x):
                return deform(x, torch.zeros(1))
        """,
    "mmcv/ops/other.py": """
        import torch


        def kernel(x):
            return x


        class OtherLayer(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x)
        """,
    "apx_ops_plugin.py": """
        from ascend_patch_core import AtomicPatch, hookimpl


        @hookimpl
        def register_patches():
            return [
                AtomicPatch("mmcv.ops.deform:deform", lambda *a: a[0]),
                AtomicPatch("mmcv.ops.kernels:pairs", lambda *a: a[0]),
            ]
        """,
}


def test_a_class_is_covered_by_the_patch_of_what_its_methods_call(tmp_path: Path) -> None:
    """``DeformLayer.forward`` calls its module's ``deform``: patching that serves the
    class, so importing the class is covered; so is ``SubLayer``, whose base calls a
    patched function of another module of its library (``ops.pairs``); a class of
    another module whose methods call nothing patched is not."""
    site = tmp_path / "site"
    for name, source in OPS_LIBRARY.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(textwrap.dedent(source))
    info = site / "apx_ops_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apx-ops-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[ascend_patch]\napx_ops = apx_ops_plugin\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "use.py").write_text(
        "from mmcv.ops import DeformLayer\nfrom mmcv.ops.other import OtherLayer\n"
        "from mmcv.ops import SubLayer\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(
        PYTHONPATH=str(site),
        ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"),
        ASCEND_PATCH_PLUGINS="apx_ops",
    )
    done = subprocess.run(
        [*_cli_command(), "scan", "--json", str(code)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    verdicts = {
        f["line"]: [c["target"] for c in f["covered_by"]] if f["covered"] else None
        for f in json.loads(done.stdout)["findings"]
        if f["rule"] == "cuda-import"
    }
    assert verdicts == {1: ["mmcv.ops.deform.deform"], 2: None, 3: ["mmcv.ops.kernels.pairs"]}


# ---------------------------------------------------------------------------- files that are not files


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_only_regular_files_are_read(tmp_path: Path, site: Path) -> None:
    """A FIFO named *.py would block the scan forever, a symlink to /dev/zero would read
    forever: neither is opened; both are listed as not scanned, with what they are."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ok.py").write_text("import torch\nx = torch.ones(1).cuda()\n")
    os.mkfifo(tree / "fifo.py")
    devices = Path("/dev/zero").exists()
    if devices:
        (tree / "zero.py").symlink_to("/dev/zero")
    (tree / "pkg.py").mkdir()  # a directory named like a module: not a file at all

    done = scan(tmp_path, site, "--json", str(tree))
    text = scan(tmp_path, site, str(tree))
    checked = scan(tmp_path, site, "--check", str(tree))
    fifo_alone = scan(tmp_path, site, str(tree / "fifo.py"))

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    errors = {e["path"]: e["error"] for e in result["parse_errors"]}
    expected = {"fifo.py": "not a regular file (a FIFO)"}
    if devices:
        expected["zero.py"] = "not a regular file (a character device)"
    assert errors == expected
    assert (result["files_scanned"], result["files_not_scanned"]) == (1, len(expected))
    assert [f["rule"] for f in result["findings"]] == ["cuda-call"]
    assert text.returncode == 0
    assert "fifo.py: not scanned: not a regular file (a FIFO)" in text.stdout
    assert checked.returncode == 1  # under --check a file not read cannot be vouched for
    assert fifo_alone.returncode == 1
    assert "fifo.py: not scanned: not a regular file (a FIFO)" in fifo_alone.stdout
    assert "Nothing was scanned: none of the 1 Python files could be read and parsed." in (
        fifo_alone.stdout
    )


def test_files_scanned_counts_only_files_scanned(tmp_path: Path, site: Path) -> None:
    """JSON and text agree: a file that fails to parse is not among files_scanned but
    counted by files_not_scanned and listed under parse_errors ("Not scanned")."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.py").write_text("def f(:\n")
    (mixed / "clean.py").write_text("import torch\nx = torch.zeros(2)\n")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.py").write_text("def f(:\n")

    some = scan_json(tmp_path, site, str(mixed))
    some_text = scan(tmp_path, site, str(mixed)).stdout
    alone = scan(tmp_path, site, "--json", str(mixed / "a.py"))
    none = scan(tmp_path, site, "--json", str(broken))

    assert (some["files_scanned"], some["files_not_scanned"]) == (1, 1)
    assert [e["path"] for e in some["parse_errors"]] == ["a.py"]
    assert "(1 Python files scanned, 1 not scanned)" in some_text
    assert "a.py:1: not scanned: SyntaxError" in some_text
    assert "Not scanned: 1 of 2 files" in some_text
    for done in (alone, none):
        assert done.returncode == 1  # nothing was read
        result = json.loads(done.stdout)
        assert (result["files_scanned"], result["files_not_scanned"]) == (0, 1)


# ---------------------------------------------------------------------------- modules of torch

_SUBMODULE_IMPORTS = """\
import torch
from torch.cuda import amp as camp
scaler = camp.GradScaler()
import torch.cuda as tc
from torch import cuda
import torch.cuda.amp as a
import torch.cuda.amp
from torch.cuda.amp import GradScaler
import torch.cuda.nccl
torch.cuda.nccl.all_reduce([])
"""

_SCALER_PLUGIN = """
from ascend_patch_core import AtomicPatch, hookimpl


def replacement(self, *args, **kwargs):
    return None


@hookimpl
def register_patches():
    return [AtomicPatch("torch.amp.grad_scaler.GradScaler.__init__", replacement)]
"""


def test_a_torch_submodule_import_is_judged_like_import_torch_cuda(tmp_path: Path) -> None:
    """`from torch.cuda import amp as camp` is covered by the rule that covers `import
    torch.cuda`: something in the module is patched -- here its GradScaler, defined in
    torch.amp and patched there. So is every other spelling of that import; a module
    nothing covers (torch.cuda.nccl) stays a gap, and with the patch disabled so is all."""
    site = tmp_path / "site"
    info = site / "apx_scaler-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apx-scaler\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[ascend_patch]\napx_scaler = apx_scaler_plugin\n")
    (site / "apx_scaler_plugin.py").write_text(_SCALER_PLUGIN)
    (tmp_path / "prog.py").write_text(_SUBMODULE_IMPORTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(
        PYTHONPATH=str(site),
        ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"),
        ASCEND_PATCH_PLUGINS="apx_scaler",
    )

    def verdicts(*args: str) -> dict[int, bool]:
        done = subprocess.run(
            [*_cli_command(), "scan", "--json", *args, "prog.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return {f["line"]: f["covered"] for f in json.loads(done.stdout)["findings"]}

    assert verdicts() == {
        2: True,  # from torch.cuda import amp as camp
        3: True,  # camp.GradScaler
        4: True,  # import torch.cuda as tc
        5: True,  # from torch import cuda
        6: True,  # import torch.cuda.amp as a
        7: True,  # import torch.cuda.amp
        8: True,  # from torch.cuda.amp import GradScaler
        9: False,  # import torch.cuda.nccl: nothing in it is redirected
        10: False,
    }
    disabled = verdicts("--disable", "torch.amp.grad_scaler.GradScaler.__init__")
    assert set(disabled.values()) == {False}


@needs_torch_plugin
def test_the_reviewers_amp_import_under_the_torch_plugin(tmp_path: Path) -> None:
    """The three lines from the review: one verdict for all of them, covered."""
    (tmp_path / "prog.py").write_text(
        "import torch\n"
        "from torch.cuda import amp as camp\n"
        "with camp.autocast():\n"
        "    pass\n"
        "import torch.cuda as tc\n"
    )

    result = real_scan(tmp_path, "prog.py")

    assert {(f["line"], f["symbol"]): f["covered"] for f in result["findings"]} == {
        (2, "torch.cuda.amp"): True,
        (3, "torch.cuda.amp.autocast"): True,
        (5, "torch.cuda"): True,
    }


# ---------------------------------------------------------------------------- a device in a name

_NAMED_DEVICES = """\
import torch
dev = "cuda"
torch.ones(1, device=dev)


def local(x):
    d: str = "cuda:1"
    return x.to(d)


def through_a_device(n):
    kind = "cuda"
    return torch.zeros(n, device=torch.device(kind))


def shadowed(device):
    return torch.ones(1, device=device)


def rebound(x):
    where = "cuda"
    where = "cpu"
    return x.to(where)


label = "cuda"
print(label)


def bound_later(x):
    target = "cuda"
    placed = torch.device(target)
    return x.to(placed)
"""


def test_a_device_held_in_a_name(tmp_path: Path, site: Path) -> None:
    """`dev = "cuda"; torch.ones(1, device=dev)` is a CUDA device like the literal: reported
    at the string, judged by the calls the name reaches (torch.ones is not patched by the
    test plugin, Tensor.to is). A name bound twice, or never passed as a device, is not a
    finding; a parameter of the same name in another function is another name."""
    (tmp_path / "prog.py").write_text(_NAMED_DEVICES)

    result = scan_json(tmp_path, site, "prog.py")

    found = {(f["line"], f["symbol"]): f for f in result["findings"]}
    assert set(found) == {
        (2, "dev = 'cuda'"),
        (7, "d = 'cuda:1'"),
        (12, "kind = 'cuda'"),
        (31, "target = 'cuda'"),
    }
    assert {f["rule"] for f in found.values()} == {"cuda-device"}
    module_level = found[(2, "dev = 'cuda'")]
    assert (module_level["uses"], module_level["covered"]) == ([["torch.ones"]], False)
    local = found[(7, "d = 'cuda:1'")]
    assert local["uses"] == [["torch.Tensor.to", "torch.nn.Module.to"]]
    assert [c["target"] for c in local["covered_by"]] == ["torch.Tensor.to"]
    assert found[(12, "kind = 'cuda'")]["uses"] == [["torch.zeros"]]
    assert found[(31, "target = 'cuda'")]["covered"] is True  # through torch.device, to .to()
    text = scan(tmp_path, site, "prog.py").stdout
    assert "prog.py:2:7" in text and "dev = 'cuda'" in text
