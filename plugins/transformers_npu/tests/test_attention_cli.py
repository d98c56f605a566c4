"""Through ``ascend-patch run --emulate-npu``: a CUDA-era script's attention on the NPU.

The script (written as a user would: ``.cuda()``, ``import flash_attn``,
``attn_implementation="flash_attention_2"``) runs unmodified in a fresh process, where
transformers sees the (emulated) NPU from its first import, as on an Ascend machine.
Checked: ``"npu"`` and ``"flash_attention_2"`` give sdpa's logits and greedy tokens on a
left-padded batch; npu_fusion_attention ran (the emulator's call recorder names the file
that called it: transformers' own ``npu_flash_attention`` for ``flash_attention_2``, the
plugin's einops-free stand-in for it on transformers 4.51/4.52 without einops);
``flash_attn`` is the plugin's stand-in; ``doctor`` names the paths.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from hf_stacks import require_module
from hf_stacks import transformers_version


require_module("transformers")

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json
    from pathlib import Path

    import torch
    from ascend_patch_emulator import CallRecorder
    from flash_attn import flash_attn_func
    from flash_attn.bert_padding import unpad_input
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "mistral", vocab_size=128, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    )
    ids = torch.randint(0, 128, (3, 9), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :2] = 0
    results = {"flash_attn": flash_attn_func.__module__, "unpad_input": unpad_input.__module__}
    for implementation in ("sdpa", "npu", "flash_attention_2"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation).cuda()
        with CallRecorder() as recorder, torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
            tokens = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                pad_token_id=0,
            )
        results[implementation] = {
            "selected": model.config._attn_implementation,
            "logits": logits.tolist(),
            "tokens": tokens.tolist(),
            "callers": sorted(
                {Path(c.file).name for c in recorder.calls if c.op == "npu_fusion_attention"}
            ),
        }
    print("RESULTS " + json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attention_cli")
    script = folder / "attention_script.py"
    script.write_text(SCRIPT)
    report = folder / "report.json"
    command = [sys.executable, "-m", "ascend_patch_core._cli", "run", "--emulate-npu"]
    done = subprocess.run(
        [*command, "--report", str(report), str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULTS ")]
    records = json.loads(report.read_text())["processes"][0]["report"]["records"]
    return json.loads(line[len("RESULTS ") :]), {r.get("target"): r for r in records}


def _close(a, b):
    import torch

    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=2e-5, rtol=1e-4)


def test_npu_implementation_equals_sdpa_and_counts(run):
    results, records = run
    _close(results["npu"]["logits"], results["sdpa"]["logits"])
    assert results["npu"]["tokens"] == results["sdpa"]["tokens"]
    assert results["npu"]["callers"] == ["attention_kernels.py"]
    fused = "ascend_patch_transformers.attention_kernels:npu_attention_forward"
    counters = records[fused]["counters"]
    assert counters["replacement_calls"] >= 2 * 5 and counters["fallback_calls"] == 0
    assert not results["sdpa"]["callers"]  # sdpa is left to torch (torch_npu's kernel on an NPU)


def test_flash_attention_2_takes_transformers_npu_path(run):
    results, records = run
    flash = results["flash_attention_2"]
    assert flash["selected"] == "flash_attention_2"
    _close(flash["logits"], results["sdpa"]["logits"])
    assert flash["tokens"] == results["sdpa"]["tokens"]
    from ascend_patch_transformers.groups import npu_integration_needs_einops

    if npu_integration_needs_einops():  # transformers 4.51/4.52 without einops
        assert flash["callers"] == ["flash_attn.py"]  # the einops-free stand-in (served/)
    else:
        assert flash["callers"] == ["npu_flash_attention.py"]  # transformers' own
    check = records.get(
        "transformers.modeling_utils:PreTrainedModel._check_and_enable_flash_attn_2"
    )
    if transformers_version() < (4, 57):
        assert check["counters"]["replacement_calls"] >= 1


def test_flash_attn_is_the_stand_in(run):
    results, _ = run
    assert results["flash_attn"] == "ascend_patch_transformers.served.flash_attn"
    assert results["unpad_input"] == "ascend_patch_transformers.served.flash_attn"


def test_doctor_names_the_paths():
    done = subprocess.run(
        [sys.executable, "-m", "ascend_patch_core._cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    data = json.loads(done.stdout)
    (plugin,) = [p for p in data["plugins"] if p["name"] == "transformers"]
    (group,) = [g for g in plugin["groups"] if g["name"] == "NpuAttention"]
    notes = " ".join(group["notes"])
    version = ".".join(map(str, transformers_version()))
    assert 'attn_implementation="npu": npu_fusion_attention' in notes
    assert f'"flash_attention_2": transformers {version}\'s own NPU path' in notes
