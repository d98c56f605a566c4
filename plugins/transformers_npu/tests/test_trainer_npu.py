"""A Hugging Face Trainer trains a tiny llama on the emulated NPU and stops at ``brake_at``.

The emulator, the torch plugin's groups and every group of this plugin are applied
(as ``ascend-patch run --emulate-npu`` would); no ``use_cpu``: the Trainer picks the
NPU through accelerate. The runtime counters show the redirect ran (``torch.cuda``
calls served by the NPU) and, where one of this plugin's groups acts on a llama, its
NPU path. Results are emulated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hf_stacks import require_module


transformers = require_module("transformers")
require_module("accelerate")
pytest.importorskip("ascend_patch_training", reason="brake_at is the training kit's")

import torch  # noqa: E402


@pytest.fixture
def npu_patcher() -> Iterator[Any]:
    import ascend_patch_emulator
    from accelerate.utils import imports as accelerate_imports
    from ascend_patch_torch import plugin as torch_plugin
    from ascend_patch_transformers import plugin
    from transformers.utils import import_utils

    from ascend_patch_core import Patcher

    def clear_caches() -> None:  # accelerate and transformers cache their device probes
        for module in (accelerate_imports, import_utils):
            for value in vars(module).values():
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()

    was_active = ascend_patch_emulator.is_active()
    handle = ascend_patch_emulator.activate()
    patcher = Patcher(autoload=False)
    for group in (*torch_plugin.register_patches(), *plugin.register_patches()):
        patcher.add(group)
    patcher.add(*plugin.register_import_rules())  # as apply(): 4.51 without einops needs one
    clear_caches()
    try:
        yield patcher
    finally:
        patcher.revert()
        clear_caches()
        if not was_active:
            handle.deactivate()


def _tiny_llama() -> Any:
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def test_a_trainer_stops_at_brake_at_on_the_npu(
    npu_patcher: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = npu_patcher.brake_at(3).apply()
    model = _tiny_llama()
    torch.manual_seed(1)
    data = [{"input_ids": (ids := torch.randint(0, 128, (16,))), "labels": ids} for _ in range(8)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=20,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    assert args.device.type == "npu"  # accelerate picked the NPU, not the CPU
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    output = trainer.train()
    assert output.global_step == 3
    assert "stopping the Hugging Face Trainer" in capsys.readouterr().err
    assert next(trainer.model.parameters()).is_npu

    counted = [r for r in report.records if r.counters is not None]
    redirect_calls = sum(
        r.counters.replacement_calls for r in counted if r.target.startswith("torch.")
    )
    assert redirect_calls > 0  # the torch plugin served torch.cuda / device calls
    # This plugin's patches target the Hugging Face libraries; the torch plugin's, torch.
    ours = [
        r for r in counted if r.target.startswith(("transformers.", "accelerate.", "diffusers."))
    ]
    assert any(r.counters.replacement_calls > 0 for r in ours)  # RMSNorm, rotary, SwiGLU: NPU ops
    for record in ours:  # every group of this plugin that acts on a llama ran its NPU path
        if record.counters.replacement_calls + record.counters.fallback_calls:
            assert record.counters.replacement_calls > 0, record
