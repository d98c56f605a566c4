"""A tiny transformers model under ``ascend-patch run --emulate-npu``, as transformers' own tests use it.

Two torch-plugin defects showed in transformers' model suites (issue #22): inside
``with torch.device("meta")`` factories made CPU tensors once ``apply()`` had wrapped them
(``from_pretrained``'s meta-device checks failed), and every inductor ``torch.compile``
failed on the emulated NPU's properties. The torch plugin's own tests cover both in
depth (test_device_context.py, test_compile.py); these run a real model.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from hf_stacks import CLI
from hf_stacks import require_module


require_module("transformers")

TINY_LLAMA = """
    import json
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    torch.manual_seed(0)
"""


def _run(tmp_path: Path, body: str) -> dict:
    (tmp_path / "prog.py").write_text(textwrap.dedent(TINY_LLAMA) + textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    done = subprocess.run(
        [*CLI, "run", "--emulate-npu", "prog.py"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    found: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_meta_device_context_and_from_pretrained(tmp_path):
    found = _run(
        tmp_path,
        """
        LlamaForCausalLM(config).save_pretrained("saved")
        with torch.device("meta"):
            on_meta = LlamaForCausalLM(config)
        loaded = LlamaForCausalLM.from_pretrained("saved").cuda()
        reference = LlamaForCausalLM.from_pretrained("saved")
        print(json.dumps({
            "meta": sorted({p.device.type for p in on_meta.parameters()}),
            "loaded_npu": all(p.is_npu for p in loaded.parameters()),
            "same": all(torch.equal(a.cpu(), b) for a, b in
                        zip(loaded.state_dict().values(), reference.state_dict().values())),
        }))
        """,
    )
    assert found == {"meta": ["meta"], "loaded_npu": True, "same": True}


@pytest.mark.slow
def test_torch_compile_of_a_tiny_llama_matches_eager(tmp_path):
    found = _run(
        tmp_path,
        """
        model = LlamaForCausalLM(config).cuda().eval()
        ids = torch.randint(0, 64, (2, 7), device="cuda")
        with torch.no_grad():
            expected = model(ids).logits
            logits = torch.compile(model)(ids).logits
        eager = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0,
                               cache_implementation="static")
        model.forward = torch.compile(model.forward, fullgraph=True)
        generated = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0,
                                   cache_implementation="static")
        print(json.dumps({
            "logits": (logits - expected).abs().max().item(),
            "generate": torch.equal(eager, generated),
        }))
        """,
    )
    assert found["logits"] < 1e-5
    assert found["generate"]
