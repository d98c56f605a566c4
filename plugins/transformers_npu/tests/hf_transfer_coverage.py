"""torch_npu's ``transfer_to_npu``, its library functions, item by item.

``transfer_to_npu`` (torch_npu 2.13.0/2.14.0, ``contrib/apis_config.json``) wraps 28
functions of transformers (>= 4.32.0), trl (>= 0.7.1), peft (>= 0.5.0) and accelerate
(>= 0.22.0): while one runs, ``torch.cuda.is_available`` is put back to the CUDA one
(False on an Ascend machine), so the function skips its CUDA branch and takes its NPU
branch, or none. This plugin does not hide CUDA (that swaps a global of ``torch.cuda``
for the duration of a call, which another thread sees): the torch plugin makes
``torch.cuda`` the NPU, so a CUDA branch that calls ``torch.cuda.*`` drives the NPU.
Each item says what it is for and which of three holds:

* ``patch``: a patch of this plugin covers it (named);
* ``redirect``: not needed -- with ``torch.cuda`` redirected, the function gives the
  NPU answer (or the same answer as under transfer_to_npu); a test runs it;
* ``absent``: the function is not in the versions this plugin supports (the library
  dropped or moved it);
* ``cuda-only``: it serves a CUDA-only stack (Megatron-LM, bitsandbytes' CUDA
  kernels) that no patch here makes run on the NPU.

This is the single source of the table in docs/transformers-plugin.md
(``tools/hf_transfer_table.py`` writes it) and of
``tests/test_transfer_coverage.py``, which runs each ``redirect`` and ``patch`` item
whose library is installed, under the NPU emulator with the torch plugin applied.
Test and doc data, so it lives beside the plugin's tests, not in its wheel.
Importing this module imports no library.
"""

from __future__ import annotations

from typing import NamedTuple


__all__ = ["ITEMS", "Item"]


class Item(NamedTuple):
    """One function ``transfer_to_npu`` wraps.

    :param target: the dotted name in ``apis_config.json``.
    :param purpose: what the function decides with ``torch.cuda.is_available``.
    :param verdict: ``patch``, ``redirect``, ``absent`` or ``cuda-only``.
    :param why: for ``redirect`` / ``absent`` / ``cuda-only``, the reason; for ``patch``,
        what it does.
    :param by: for ``patch``, the patch (its target) that covers it.
    :param test: the test that shows it (a test function of tests/test_transfer_coverage.py,
        or another test file).
    """

    target: str
    purpose: str
    verdict: str
    why: str
    by: str = ""
    test: str = ""


_T = "transformers."
_A = "accelerate."

ITEMS: tuple[Item, ...] = (
    # ---------------------------------------------------------------- transformers
    Item(_T + "training_args.TrainingArguments.__post_init__",
         "validates bf16/tf32 against the GPU, picks the device",
         "redirect", "bf16 is checked with is_torch_bf16_gpu_available (NPU: bf16 supported); "
         "the device is accelerate's (npu:0)", test="test_training_arguments_pick_the_npu"),
    Item(_T + "trainer.Trainer._load_rng_state",
         "restores the `cuda` RNG state of a checkpoint",
         "redirect", "`torch.cuda.random.set_rng_state*` is the NPU's; the `npu` key is "
         "restored too", test="test_trainer_rng_state_round_trip"),
    Item(_T + "trainer.Trainer._save_rng_state",
         "saves the `cuda` RNG state",
         "redirect", "saves the NPU state under `cuda` and under `npu`: a checkpoint written "
         "on the NPU reloads with or without ascend-patch", test="test_trainer_rng_state_round_trip"),
    Item(_T + "trainer_utils.TrainerMemoryTracker.start",
         "resets peak memory stats through torch.cuda",
         "redirect", "`torch.cuda.reset_peak_memory_stats`/`memory_allocated` are the NPU's",
         test="test_memory_tracker_measures_the_npu"),
    Item(_T + "utils.import_utils.is_torch_cuda_available",
         "transformers' answer to \"is CUDA here\"",
         "redirect", "True on the NPU (its CUDA branches call the redirected torch.cuda); the "
         "items below that gate CUDA-only packages say False", test="test_import_checks_on_the_npu"),
    Item(_T + "utils.import_utils.is_mamba_ssm_available",
         "gates the CUDA-only mamba_ssm kernels",
         "redirect", "False: mamba_ssm is not installable on an NPU machine",
         test="test_import_checks_on_the_npu"),
    Item(_T + "utils.import_utils.is_causal_conv1d_available",
         "gates the CUDA-only causal_conv1d kernels",
         "redirect", "False: causal_conv1d is not installable on an NPU machine",
         test="test_import_checks_on_the_npu"),
    Item(_T + "utils.import_utils.is_torch_bf16_gpu_available",
         "whether bf16 training is allowed",
         "redirect", "`torch.cuda.is_bf16_supported` is the NPU's: True, as under "
         "transfer_to_npu's NPU branch", test="test_import_checks_on_the_npu"),
    Item(_T + "utils.import_utils.is_torch_tf32_available",
         "whether `tf32=True` may set CUDA matmul flags",
         "redirect", "False: it also needs `torch.version.cuda`, None in an NPU build",
         test="test_import_checks_on_the_npu"),
    Item(_T + "utils.import_utils.is_bitsandbytes_available",
         "gates bitsandbytes quantization",
         "redirect", "False without bitsandbytes; with it, bitsandbytes' own backend check "
         "decides", test="test_import_checks_on_the_npu"),
    Item(_T + "utils.import_utils.is_flash_attn_2_available",
         "gates the flash_attn package's kernels",
         "redirect", "False: needs the flash_attn distribution and `torch.version.cuda`; NPU "
         "attention is the attention groups' `attn_implementation`", test="test_import_checks_on_the_npu"),
    # ---------------------------------------------------------------- trl
    Item("trl.import_utils.is_bitsandbytes_available",
         "gates bitsandbytes in trl",
         "absent", "not in trl 0.24 (the last 0.x, for transformers 4.5x) nor 1.x: trl uses "
         "transformers' check, above", test="test_trl_items"),
    Item("trl.trainer.utils.get_kbit_device_map",
         "device map for k-bit models ({'': cuda index})",
         "cuda-only", "absent from trl 1.x; in trl 0.x its only callers (the sft/dpo scripts) "
         "ask for it next to a bitsandbytes quantization config, whose kernels are CUDA's",
         test="test_trl_items"),
    # ---------------------------------------------------------------- peft
    Item("peft.utils.other.infer_device",
         "peft's default device name",
         "redirect", "returns \"cuda\", which the torch plugin sends to the NPU wherever peft "
         "uses it (`.to(\"cuda\")`, `device=\"cuda\"`)", test="test_peft_infer_device"),
    # ---------------------------------------------------------------- accelerate
    Item(_A + "commands.env.env_command",
         "`accelerate env`: prints the GPU type",
         "redirect", "prints the NPU's name (as \"GPU type\")", test="test_accelerate_env_command"),
    Item(_A + "launchers.notebook_launcher",
         "refuses to fork after CUDA was initialized",
         "redirect", "the check runs on the NPU runtime (torch.cuda.is_initialized is the "
         "NPU's); accelerate's NPU branch is what transfer_to_npu reaches too",
         test="test_notebook_launcher_runs_on_the_npu"),
    Item(_A + "commands.config.default.write_basic_config",
         "writes a default config with the GPU count",
         "redirect", "counts NPUs: accelerate >= 1.0 asks for the NPU before CUDA",
         test="test_write_basic_config_counts_npus"),
    Item(_A + "utils.environment.override_numa_affinity",
         "binds the process to the GPU's NUMA node through NVML",
         "patch", "does nothing on the NPU, as without CUDA (NVML is CUDA's)",
         by=_A + "utils.environment.override_numa_affinity", test="test_numa_affinity_on_the_npu"),
    Item(_A + "utils.modeling.get_max_memory",
         "per-device free memory for device maps",
         "redirect", "accelerate >= 1.0 asks for the NPU first (`torch.npu.mem_get_info`)",
         test="test_get_max_memory_lists_npus"),
    Item(_A + "utils.megatron_lm.initialize",
         "asserts CUDA for Megatron-LM",
         "cuda-only", "Megatron-LM is CUDA-only (MindSpeed is the NPU's): not installed with "
         "an NPU stack", test="test_cuda_only_stacks_are_not_there"),
    Item(_A + "utils.bnb.load_and_quantize_model",
         "bitsandbytes quantization",
         "cuda-only", "needs bitsandbytes; without it accelerate raises ImportError naming it, "
         "as under transfer_to_npu", test="test_cuda_only_stacks_are_not_there"),
    Item(_A + "utils.bnb.get_quantized_model_device_map",
         "bitsandbytes device map",
         "cuda-only", "bitsandbytes quantization, as load_and_quantize_model",
         test="test_cuda_only_stacks_are_not_there"),
    Item(_A + "utils.imports.is_cuda_available",
         "accelerate's NVML-based \"is CUDA here\"",
         "redirect", "True (the redirected torch.cuda); accelerate checks the NPU before it",
         test="test_accelerator_picks_the_npu"),
    Item(_A + "test_utils.scripts.test_script.training_check",
         "accelerate's self-test",
         "redirect", "runs on the state's device (npu)", test="test_accelerator_picks_the_npu"),
    Item(_A + "test_utils.scripts.test_cli.main",
         "`accelerate test`: counts accelerators",
         "redirect", "counts NPUs through the redirected torch.cuda.device_count",
         test="test_accelerate_cli_test_counts_npus"),
    Item(_A + "test_utils.scripts.external_deps.test_peak_memory_usage.TorchTracemalloc.__enter__",
         "peak-memory test helper",
         "redirect", "torch.cuda memory counters are the NPU's", test="test_tracemalloc_on_the_npu"),
    Item(_A + "test_utils.scripts.external_deps.test_peak_memory_usage.TorchTracemalloc.__exit__",
         "peak-memory test helper",
         "redirect", "as __enter__", test="test_tracemalloc_on_the_npu"),
    Item(_A + "state.PartialState._prepare_backend",
         "picks the collective backend (nccl)",
         "redirect", "accelerate >= 1.0 asks for the NPU before CUDA: hccl, MULTI_NPU (under the "
         "emulator the AccelerateNpu group turns hccl into gloo)",
         test="test_accelerate_distributed_uses_hccl"),
)  # fmt: skip
