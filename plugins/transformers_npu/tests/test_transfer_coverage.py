"""transfer_to_npu's library functions, run under the NPU emulator with the torch plugin.

Each ``redirect`` / ``patch`` item of ``hf_transfer_coverage`` (beside these tests)
names a test here (or elsewhere); each test runs the library's own function the way
the library calls it and checks that it gives the NPU answer. Results are emulated.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hf_transfer_coverage
import pytest
from hf_stacks import require_module
from hf_stacks import required


transformers = require_module("transformers")
accelerate = require_module("accelerate")

import torch  # noqa: E402


def _clear_caches() -> None:
    """accelerate and transformers cache their device probes (lru_cache): start afresh."""
    from accelerate.utils import imports as accelerate_imports
    from transformers.utils import import_utils

    for module in (accelerate_imports, import_utils):
        for value in vars(module).values():
            clear = getattr(value, "cache_clear", None)
            if callable(clear):
                clear()


@pytest.fixture(scope="module")
def npu_stack() -> Iterator[Any]:
    """The emulator, the torch plugin's groups and this plugin's runtime and attention groups."""
    import ascend_patch_emulator
    from ascend_patch_torch import plugin as torch_plugin
    from ascend_patch_transformers import groups as hf_groups

    from ascend_patch_core import Patcher

    was_active = ascend_patch_emulator.is_active()
    handle = ascend_patch_emulator.activate()
    patcher = Patcher(autoload=False)
    # The attention groups too: on 4.51/4.52 with an NPU, importing transformers.modeling_utils
    # (peft does) needs einops unless the attention import rules serve it, as apply() does for users.
    groups = (
        *torch_plugin.register_patches(),
        *hf_groups.RUNTIME_GROUPS,
        *hf_groups.ATTENTION_GROUPS,
    )
    for group in groups:
        patcher.add(group)
    patcher.add(*hf_groups.import_rules())
    patcher.apply()
    _clear_caches()
    try:
        yield patcher
    finally:
        patcher.revert()
        _clear_caches()
        if not was_active:
            handle.deactivate()


def test_every_item_has_a_verdict_and_a_test() -> None:
    tests = {name for name in globals() if name.startswith("test_")}
    assert len(hf_transfer_coverage.ITEMS) == 28
    for item in hf_transfer_coverage.ITEMS:
        assert item.verdict in ("patch", "redirect", "absent", "cuda-only"), item
        assert item.why and item.test in tests, item
        if item.verdict == "patch":
            assert item.by, item


def test_import_checks_on_the_npu(npu_stack: Any) -> None:
    from transformers.utils import import_utils as iu

    assert iu.is_torch_npu_available() and iu.is_torch_cuda_available()
    assert iu.is_torch_bf16_gpu_available()
    for gated in (
        "is_mamba_ssm_available",
        "is_causal_conv1d_available",
        "is_torch_tf32_available",
        "is_bitsandbytes_available",
        "is_flash_attn_2_available",
    ):
        assert getattr(iu, gated)() is False, gated


def test_training_arguments_pick_the_npu(npu_stack: Any, tmp_path: Path) -> None:
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], bf16=True)
    assert args.device.type == "npu" and args.n_gpu == 1


def test_accelerator_picks_the_npu(npu_stack: Any) -> None:
    from accelerate import Accelerator
    from accelerate.utils.imports import is_cuda_available

    accelerator = Accelerator()
    assert accelerator.device.type == "npu"
    assert is_cuda_available()  # the redirected torch.cuda; accelerate asks for the NPU first
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert next(model.parameters()).is_npu  # emulated NPU tensors live on the CPU


def test_trainer_rng_state_round_trip(npu_stack: Any, tmp_path: Path) -> None:
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[])
    trainer = transformers.Trainer(model=torch.nn.Linear(2, 2), args=args)
    if not hasattr(torch.npu, "random"):  # transformers' own NPU branch uses it
        pytest.skip("the NPU emulator has no torch.npu.random (torch_npu has)")
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    torch.npu.manual_seed(7)
    trainer._save_rng_state(str(checkpoint))
    expected = torch.randn(3, device="npu")
    # Written just above by the Trainer, with numpy's RNG state in it: not weights-only.
    saved = torch.load(next(checkpoint.glob("rng_state*.pth")), weights_only=False)
    assert "cuda" in saved and "npu" in saved
    torch.npu.manual_seed(99)
    trainer._load_rng_state(str(checkpoint))
    assert torch.equal(torch.randn(3, device="npu"), expected)


def test_memory_tracker_measures_the_npu(npu_stack: Any) -> None:
    from transformers.trainer_utils import TrainerMemoryTracker

    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    if tracker.skip_memory_metrics:
        pytest.skip("psutil is not installed: the tracker measures nothing")
    calls = npu_stack.report.get("torch.cuda.memory_allocated").counters.replacement_calls

    def train() -> None:  # the tracker names its stage after its caller
        tracker.start()
        tracker.stop("train")

    train()
    assert npu_stack.report.get("torch.cuda.memory_allocated").counters.replacement_calls > calls


def test_peft_infer_device(npu_stack: Any) -> None:
    peft = require_module("peft")
    device = peft.utils.other.infer_device()
    assert device == "cuda" and torch.zeros(1).to(device).is_npu  # the torch plugin's redirect


def test_trl_items() -> None:
    """trl's two items, read from its sources (importing trl needs datasets and pandas).

    trl 1.x has neither; trl 0.x (0.24 pairs with transformers 4.5x) has only
    ``get_kbit_device_map``, and every caller asks for it only with a quantization config.
    """
    import importlib.util
    import re

    if importlib.util.find_spec("trl") is None:
        assert not required("trl"), "this session promises trl"
        pytest.skip("trl is not installed")
    from importlib.metadata import version

    def source_origin(module: str) -> str:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        return spec.origin

    def source(module: str) -> str:
        return Path(source_origin(module)).read_text(encoding="utf-8")

    assert "def is_bitsandbytes_available(" not in source("trl.import_utils")
    has_kbit_map = "def get_kbit_device_map(" in source("trl.trainer.utils")
    assert has_kbit_map == (int(version("trl").split(".")[0]) == 0)
    if has_kbit_map:
        package = Path(source_origin("trl")).parent
        call_site = re.compile(r"(?<!def )get_kbit_device_map\(\)")
        callers = [
            path
            for path in package.rglob("*.py")
            if call_site.search(path.read_text(encoding="utf-8"))
        ]
        assert callers, "trl 0.x calls get_kbit_device_map somewhere"
        for path in callers:
            text = path.read_text(encoding="utf-8")
            for call in call_site.finditer(text):
                before = text[: call.start()].splitlines()[-3:]
                assert any("quantization_config" in line for line in before), (path, before)


def test_cuda_only_stacks_are_not_there(npu_stack: Any) -> None:
    """Megatron-LM and bitsandbytes are not part of an NPU stack; accelerate says so."""
    from accelerate.utils import BnbQuantizationConfig
    from accelerate.utils import is_bnb_available
    from accelerate.utils import is_megatron_lm_available
    from accelerate.utils.bnb import load_and_quantize_model

    assert not is_megatron_lm_available() and not is_bnb_available()
    with pytest.raises(ImportError, match="bitsandbytes"):
        load_and_quantize_model(torch.nn.Linear(2, 2), BnbQuantizationConfig(load_in_8bit=True))


def test_accelerate_env_command(npu_stack: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from accelerate.commands.env import env_command

    env_command(type("Args", (), {"config_file": None})())
    assert torch.npu.get_device_name(0) in capsys.readouterr().out


def test_notebook_launcher_runs_on_the_npu(npu_stack: Any) -> None:
    from accelerate import notebook_launcher

    seen: list[bool] = []
    notebook_launcher(lambda: seen.append(torch.zeros(1, device="cuda").is_npu), num_processes=1)
    assert seen == [True]


def test_write_basic_config_counts_npus(npu_stack: Any, tmp_path: Path) -> None:
    import json

    from accelerate.commands.config.default import write_basic_config

    path = tmp_path / "config.json"
    write_basic_config(save_location=str(path))
    config = json.loads(path.read_text())
    assert config["distributed_type"] in ("NO", "MULTI_NPU") and config["num_processes"] == 1
    assert config.get("use_cpu") is not True


def test_numa_affinity_on_the_npu(npu_stack: Any) -> None:
    from accelerate.utils.environment import override_numa_affinity

    before = os.sched_getaffinity(0)
    override_numa_affinity(0)  # the original asks NVML for a GPU and fails without pynvml
    assert os.sched_getaffinity(0) == before
    counters = npu_stack.report.get("accelerate.utils.environment.override_numa_affinity").counters
    assert counters.replacement_calls >= 1


def test_get_max_memory_lists_npus(npu_stack: Any) -> None:
    from accelerate.utils.modeling import get_max_memory

    memory = get_max_memory()
    assert 0 in memory and "cpu" in memory


def test_accelerate_cli_test_counts_npus(npu_stack: Any) -> None:
    assert torch.cuda.device_count() == torch.npu.device_count() >= 1


def test_tracemalloc_on_the_npu(npu_stack: Any) -> None:
    """TorchTracemalloc's CUDA branch (its module needs ``datasets``: its calls, else)."""
    import importlib.util

    name = "accelerate.test_utils.scripts.external_deps.test_peak_memory_usage"
    calls = ("empty_cache", "reset_max_memory_allocated", "memory_allocated")
    before = {c: _served(npu_stack, f"torch.cuda.{c}") for c in calls}
    if importlib.util.find_spec("datasets") is not None:
        with importlib.import_module(name).TorchTracemalloc() as tracked:
            torch.zeros(1024, device="cuda")
        assert tracked.begin >= 0 and tracked.peaked >= 0
    else:  # what __enter__ does on CUDA, in its order
        torch.cuda.empty_cache()
        torch.cuda.reset_max_memory_allocated()
        assert torch.cuda.memory_allocated() >= 0
    assert all(_served(npu_stack, f"torch.cuda.{c}") > before[c] for c in calls)


def _served(patcher: Any, name: str) -> int:
    return int(patcher.report.get(name).counters.replacement_calls)


_USER_SCRIPT = textwrap.dedent(
    """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    tensor = torch.ones(2, device="cuda")
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(tensor)
    print(accelerator.device.type, accelerator.distributed_type, accelerator.state.backend)
    """
)


@pytest.mark.parametrize("torchrun", [False, True], ids=["single", "torchrun"])
def test_accelerate_distributed_uses_hccl(tmp_path: Path, torchrun: bool) -> None:
    """``ascend-patch run --emulate-npu``: the NPU; under torchrun MULTI_NPU on hccl (gloo here)."""
    script = tmp_path / "train.py"
    script.write_text(_USER_SCRIPT)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    if torchrun:
        env.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(29400 + os.getpid() % 500),
        )
    command = [sys.executable, "-m", "ascend_patch_core._cli", "run", "--emulate-npu", str(script)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = ["MULTI_NPU", "gloo"] if torchrun else ["NO", "None"]
    assert done.stdout.split()[-3:] == ["npu", f"DistributedType.{expected[0]}", expected[1]]


def test_the_docs_table_is_current() -> None:
    """docs/transformers-plugin.md's table is tools/hf_transfer_table.py's output."""
    tool = Path(__file__).resolve().parents[3] / "tools" / "hf_transfer_table.py"
    done = subprocess.run(
        [sys.executable, str(tool), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
