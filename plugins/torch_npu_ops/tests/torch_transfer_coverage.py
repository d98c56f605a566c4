"""torch_npu's ``transfer_to_npu``, item by item: which patch of this plugin covers each.

``transfer_to_npu`` is ``torch_npu/contrib/transfer_to_npu.py`` in torch_npu 2.14.0 (the
same file in the Ascend/pytorch repository); its ``_init()`` patches the items listed
here, in the order of its sections (:data:`ROWS`). An :class:`Item` is *covered* by the
patches it names -- by default the patch whose name or alias is the item's own name --
or *left out* on purpose, with the reason. An item that is neither is missing, which the
tests refuse.

This is the single source of the coverage table in docs/torch-plugin.md
(``tools/torch_coverage_table.py`` writes it; a test fails when the page is stale) and
of the test that runs every covered item (``tests/test_every_item_runs.py``). Test and
doc data, so it lives beside the plugin's tests, not in its wheel; the name is distinct
because the tests directories of every plugin share one ``sys.path``.

The names under section 1 are those of ``torch_npu.npu.__all__`` that ``torch.cuda``
also has (torch 2.13): ``transfer_to_npu`` copies every name of ``__all__`` onto
``torch.cuda``, and the NPU-only ones are one left-out item.

Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from ascend_patch_torch import groups
from ascend_patch_torch import plugin

from ascend_patch_core import AtomicPatch


__all__ = ["ITEMS", "ROWS", "Declared", "Item", "Row", "declared_patches", "patches_of"]


class Row(NamedTuple):
    """One section of ``transfer_to_npu``'s ``_init()``."""

    key: str
    number: str
    upstream: str


class Item(NamedTuple):
    """One thing ``transfer_to_npu`` patches.

    :param row: the :attr:`Row.key` of its section.
    :param name: what is patched there (a dotted name, or a short description).
    :param by: the patches here that cover it; empty: the patch named ``name``.
    :param differs: for a covered item, how this plugin differs on purpose.
    :param left_out: why nothing here covers it (then the item is not covered).
    """

    row: str
    name: str
    by: tuple[str, ...] = ()
    differs: str = ""
    left_out: str = ""


ROWS: tuple[Row, ...] = (
    Row("cuda", "1", "`torch.cuda.*` ← the names of `torch_npu.npu.__all__` (and of its `amp`, "
        "`random` submodules) copied onto `torch.cuda`, `torch.cuda.amp`, `torch.cuda.random`"),
    Row("cuda-devices", "1", "`_device_wrapper` on 24 `torch.cuda` functions: device arguments "
        "rewritten"),
    Row("cuda-device", "2", "`torch.cuda.device.__init__`, `torch.cuda.amp.autocast_mode`, "
        "`default_generators`, `cuda.random.get/set_rng_state`"),
    Row("memory", "3", "memory history and snapshots, `_host_emptyCache`"),
    Row("profiler", "4", "profiler → torch_npu.profiler; `ProfilerActivity.CUDA` ← `NPU`; "
        "`export_memory_timeline` device"),
    Row("factories", "5", "47 `torch.<fn>` wrapped: any string containing \"cuda\" rewritten"),
    Row("torch", "6", "`UntypedStorage.__new__`, `TypedStorage.is_cuda`, `torch.Generator`, "
        "`torch.Event`, `autocast.__init__`"),
    Row("autocast", "7", "autocast state functions, `amp.custom_fwd/bwd`"),
    Row("tensor", "8", "`Tensor.new_*`, `to`, `pin_memory`, `cuda`, `is_cuda`; "
        "`cuda.DoubleTensor = npu.FloatTensor`"),
    Row("module", "9", "`Module.to/to_empty`, `Module.cuda`"),
    Row("fft", "10", "`torch.fft.fftfreq/rfftfreq`"),
    Row("distributed", "11", "torch.distributed: nccl → hccl in any positional string, "
        "device arguments, `ProcessGroupNCCL`, pipelining"),
    Row("graph", "12", "`torch.cuda.CUDAGraph = torch.npu.NPUGraph`"),
    Row("device-context", "13", "`DeviceContext.__init__` (`with torch.device('cuda'):`)"),
    Row("jit", "14", "`torch.jit.script` / `script_method` return their argument unchanged"),
    Row("compile", "15", "dynamo / inductor: triton off, `get_gpu_type` → npu, "
        "`_get_available_device_type`"),
    Row("checkpoint", "16", "`_OverlappingCpuLoader.__init__`"),
    Row("lazy", "17", "`UninitializedTensorMixin._allowed_methods`"),
    Row("extensions", "18", "`cpp_extension.include_paths`, profiler `Kernel.__new__`"),
    Row("third-party", "19", "transformers / trl / peft / accelerate functions run with CUDA's "
        "`is_available`"),
    Row("banner", "20", "an ImportWarning banner; `warnings.filterwarnings(\"once\")` globally"),
)  # fmt: skip


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# torch_npu.npu.__all__ names that torch.cuda (torch 2.13) has too.
_SHARED_CUDA_NAMES = _words(
    "is_initialized init synchronize device_count can_device_access_peer set_device "
    "current_device get_device_name get_device_properties get_device_capability mem_get_info "
    "is_available device device_of StreamContext stream set_stream current_stream "
    "default_stream set_sync_debug_mode get_sync_debug_mode utilization manual_seed "
    "manual_seed_all seed seed_all initial_seed caching_allocator_alloc caching_allocator_delete "
    "get_per_process_memory_fraction set_per_process_memory_fraction empty_cache memory_stats "
    "memory_stats_as_nested_dict reset_accumulated_memory_stats reset_peak_memory_stats "
    "reset_max_memory_allocated reset_max_memory_cached memory_allocated max_memory_allocated "
    "memory_reserved max_memory_reserved memory_cached max_memory_cached memory_snapshot "
    "memory_summary MemPool use_mem_pool get_allocator_backend change_current_allocator Stream "
    "Event get_rng_state set_rng_state get_rng_state_all set_rng_state_all is_bf16_supported "
    "BoolStorage ByteStorage ShortStorage LongStorage IntStorage HalfStorage CharStorage "
    "DoubleStorage FloatStorage BoolTensor ByteTensor CharTensor DoubleTensor FloatTensor "
    "HalfTensor IntTensor LongTensor ShortTensor BFloat16Tensor BFloat16Storage "
    "current_blas_handle graph graph_pool_handle is_current_stream_capturing "
    "make_graphed_callables ExternalStream ipc_collect host_memory_stats "
    "host_memory_stats_as_nested_dict reset_accumulated_host_memory_stats "
    "reset_peak_host_memory_stats"
)
_RANDOM_NAMES = _words(
    "get_rng_state set_rng_state get_rng_state_all set_rng_state_all manual_seed "
    "manual_seed_all seed seed_all initial_seed"
)
# torch_cuda_fn_white_list of torch_npu 2.14.0.
_DEVICE_WRAPPED = _words(
    "get_device_properties get_device_name get_device_capability list_gpu_processes set_device "
    "synchronize mem_get_info memory_stats memory_summary memory_allocated max_memory_allocated "
    "reset_max_memory_allocated memory_reserved max_memory_reserved reset_max_memory_cached "
    "reset_peak_memory_stats default_stream can_device_access_peer current_stream utilization "
    "set_per_process_memory_fraction caching_allocator_alloc get_rng_state set_rng_state"
)
# torch_fn_white_list of torch_npu 2.14.0 (torch.load is the Serialization group's).
_FACTORIES = _words(
    "logspace randint hann_window rand full_like ones_like rand_like randperm arange frombuffer "
    "normal _empty_per_channel_affine_quantized empty_strided empty_like scalar_tensor "
    "tril_indices bartlett_window ones sparse_coo_tensor randn kaiser_window tensor triu_indices "
    "as_tensor zeros randint_like full eye _sparse_csr_tensor_unsafe empty "
    "_sparse_coo_tensor_unsafe blackman_window zeros_like range sparse_csr_tensor randn_like "
    "from_file _cudnn_init_dropout_state _empty_affine_quantized linspace hamming_window "
    "empty_quantized _pin_memory load set_default_device get_device_module "
    "sparse_compressed_tensor"
)

_LIST_GPU = (
    "torch_npu has no `list_gpu_processes`; the rewrite hands torch's NVML-based function an "
    "NPU device it cannot answer for"
)
_NOT_IN_TORCH = "torch 2.13 has no such function: nothing to patch"
_AUTOCAST = "torch.amp.autocast_mode.autocast.__init__"
_SCALER = "torch.amp.grad_scaler.GradScaler.__init__"
_PROFILE_NPU = "torch.profiler.profile -> torch_npu.profiler"
_PROFILE_EMULATED = "torch.profiler.profile: CUDA activity on the emulated NPU"
_TIMELINE_EMULATED = "torch.profiler export_memory_timeline: CUDA device on the emulated NPU"
_DEVICE_TYPE = "torch._utils._get_available_device_type"
_COMPILE = (
    "left as torch and torch_npu set them up: `torch.compile` uses the inductor backend "
    "torch_npu registers for `npu`; pointing CUDA codegen at the NPU is not a device redirect"
)
_SCRIPT = (
    "TorchScript keeps working (`ScriptBuiltins` lets it see through the redirect's "
    "wrappers); scripted code runs plain aten ops"
)


def _items() -> Iterator[Item]:
    for name in _SHARED_CUDA_NAMES:
        yield Item("cuda", f"torch.cuda.{name}")
    yield Item(
        "cuda",
        "NPU-only names (`set_option`, `npu_format_cast`, `mstx`, … ~55)",
        left_out="not copied onto `torch.cuda`: CUDA-written code cannot call them",
    )
    for name in ("autocast", "GradScaler", "custom_fwd", "custom_bwd"):
        by = {"autocast": _AUTOCAST, "GradScaler": _SCALER}.get(
            name, f"torch.amp.autocast_mode.{name}"
        )
        yield Item("cuda", f"torch.cuda.amp.{name}", (by,))
    for name in ("autocast", "custom_fwd", "custom_bwd"):
        by = _AUTOCAST if name == "autocast" else f"torch.amp.autocast_mode.{name}"
        yield Item("cuda", f"torch.cuda.amp.autocast_mode.{name}", (by,))
    yield Item("cuda", "torch.cuda.amp.grad_scaler", (_SCALER,))
    yield Item(
        "cuda",
        "torch.cuda.amp.common",
        ("torch.cuda.is_available",),
        differs="not swapped: its one function asks `torch.cuda.is_available()`",
    )
    for name in _RANDOM_NAMES:
        yield Item("cuda", f"torch.cuda.random.{name}")
    for name in _DEVICE_WRAPPED:
        if name == "list_gpu_processes":
            yield Item("cuda-devices", f"torch.cuda.{name}", left_out=_LIST_GPU)
        else:
            yield Item("cuda-devices", f"torch.cuda.{name}(device)", (f"torch.cuda.{name}",))
    yield Item(
        "cuda-device",
        "torch.cuda.device.__init__",
        ("torch.cuda.device",),
        differs="a stand-in class builds `torch.npu.device`; `torch.npu` itself is untouched",
    )
    yield Item("cuda-device", "torch.cuda.amp.autocast_mode", (_AUTOCAST,))
    yield Item("cuda-device", "torch.cuda.default_generators")
    for name in ("get_rng_state", "set_rng_state"):
        yield Item("cuda-device", f"torch.cuda.random.{name}(device)", (f"torch.cuda.{name}",))
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot"):
        yield Item("memory", f"torch.cuda.memory.{name}")
    yield Item(
        "memory",
        "torch._C._host_emptyCache",
        left_out="its one caller, `torch.cuda.graphs`, is not reached once `CudaApi` hands "
        "graphs to `torch.npu`",
    )
    for name in ("profile", "schedule", "tensorboard_trace_handler", "ProfilerAction"):
        to_npu = f"torch.profiler.{name} -> torch_npu.profiler"
        covering = (to_npu, _PROFILE_EMULATED) if name == "profile" else (to_npu,)
        yield Item("profiler", f"torch.profiler.{name}", covering)
    for activity in ("CUDA", "CPU"):
        yield Item(
            "profiler",
            f"torch.profiler.ProfilerActivity.{activity}",
            (_PROFILE_NPU, _PROFILE_EMULATED),
            differs="not rebound globally: the profile maps activities for its own call",
        )
    yield Item("profiler", "torch.profiler.profile(experimental_config=…)", (_PROFILE_NPU,))
    yield Item(
        "profiler",
        "torch_npu.profiler._KinetoProfile.export_memory_timeline(device)",
        (_PROFILE_NPU, _TIMELINE_EMULATED),
    )
    for name in _FACTORIES:
        if name.endswith("_unsafe"):
            yield Item("factories", f"torch.{name}", left_out=_NOT_IN_TORCH)
        elif name == "frombuffer":
            yield Item(
                "factories",
                "torch.frombuffer",
                left_out="it takes no device (it wraps a host buffer): there is nothing to rewrite",
            )
        elif name == "load":
            yield Item(
                "factories",
                "torch.load",
                differs='only real device specs: `torch.load("/ckpt/cuda_model.pt")` opens that '
                "file; without `map_location`, CUDA storages load onto the NPU",
            )
        else:
            yield Item("factories", f"torch.{name}")
    yield Item("torch", "torch.UntypedStorage.__new__", ("torch.storage.UntypedStorage.__new__",))
    yield Item("torch", "torch.storage.TypedStorage.is_cuda")
    yield Item(
        "torch", "torch.Generator", differs="base objects are returned, as torch's C++ checks need"
    )
    yield Item("torch", "torch.Event")
    yield Item("torch", "torch.amp.autocast_mode.autocast.__init__")
    for name in ("is_autocast_enabled", "set_autocast_enabled", "get_autocast_dtype",
                 "set_autocast_dtype", "get_autocast_gpu_dtype", "set_autocast_gpu_dtype"):  # fmt: skip
        yield Item("autocast", f"torch.{name}")
    for name in ("custom_fwd", "custom_bwd"):
        yield Item("autocast", f"torch.amp.{name}")
    for name in ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor",
                 "new_zeros", "to", "pin_memory", "cuda", "is_cuda"):  # fmt: skip
        yield Item("tensor", f"torch.Tensor.{name}")
    yield Item(
        "tensor",
        "`torch.cuda.DoubleTensor = torch.npu.FloatTensor`",
        ("torch.cuda.DoubleTensor",),
        differs="`torch.cuda.DoubleTensor` stays float64 (`torch.npu.DoubleTensor`)",
    )
    for name in ("to", "to_empty", "cuda"):
        yield Item("module", f"torch.nn.Module.{name}", (f"torch.nn.modules.module.Module.{name}",))
    for name in ("fftfreq", "rfftfreq"):
        yield Item("fft", f"torch.fft.{name}")
    dist = "torch.distributed"
    yield Item(
        "distributed",
        f"{dist}.init_process_group",
        (f"{dist}.distributed_c10d.init_process_group",),
        differs="only backend names are rewritten, never other strings (`init_method` paths)",
    )
    yield Item("distributed", f"{dist}.is_nccl_available")
    yield Item("distributed", f"{dist}.ProcessGroup._get_backend")
    yield Item(
        "distributed",
        f"{dist}.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel.__init__",
    )
    yield Item(
        "distributed",
        f"{dist}.Backend.default_device_backend_map",
        (f"{dist}.distributed_c10d.Backend.default_device_backend_map",),
    )
    yield Item("distributed", f"{dist}.device_mesh.init_device_mesh")
    yield Item(
        "distributed",
        f"{dist}.distributed_c10d._new_group_with_tag",
        (f"{dist}.distributed_c10d.new_group",),
        differs="its public caller `new_group` is patched instead of the private function",
    )
    yield Item("distributed", f"{dist}.device_mesh.DeviceMesh.__init__")
    yield Item("distributed", f"{dist}.ProcessGroupNCCL")
    yield Item("distributed", f"{dist}.distributed_c10d.ProcessGroupNCCL")
    yield Item("distributed", f"{dist}.pipelining.stage.PipelineStage.__init__")
    yield Item("distributed", f"{dist}.pipelining.stage.build_stage")
    yield Item("distributed", "torch.nn.parallel.DistributedDataParallel.__init__",
               ("torch.nn.parallel.distributed.DistributedDataParallel.__init__",))  # fmt: skip
    yield Item("graph", "torch.cuda.CUDAGraph")
    yield Item("device-context", "torch.utils._device.DeviceContext.__init__")
    for name in ("script", "script_method"):
        yield Item("jit", f"torch.jit.{name}", left_out=_SCRIPT)
    yield Item("compile", "torch._dynamo.trace_rules._disallowed_callable_ids", left_out=_COMPILE)
    for where in ("utils._triton", "_dynamo.utils", "_inductor.runtime.autotune_cache",
                  "_inductor.compile_fx"):  # fmt: skip
        yield Item("compile", f"torch.{where}.has_triton", left_out=_COMPILE)
    for where in ("utils", "fx_passes.post_grad", "fx_passes.joint_graph", "autotune_process"):
        yield Item("compile", f"torch._inductor.{where}.get_gpu_type", left_out=_COMPILE)
    yield Item("compile", _DEVICE_TYPE)
    yield Item(
        "checkpoint",
        "torch.distributed.checkpoint.filesystem._OverlappingCpuLoader.__init__",
        (_DEVICE_TYPE,),
        differs="not replaced: in torch 2.13 it is device-agnostic and asks "
        "`_get_available_device_type`",
    )
    yield Item("lazy", "torch.nn.parameter.UninitializedTensorMixin._allowed_methods")
    yield Item("extensions", "torch.utils.cpp_extension.include_paths")
    yield Item(
        "extensions",
        "torch.autograd.profiler_util.Kernel.__new__",
        left_out="torch builds `Kernel(name, device, duration)` with an int index, positionally, "
        "which transfer_to_npu's wrapper never rewrites either",
    )
    yield Item(
        "third-party",
        "transformers / trl / peft / accelerate functions (`contrib/apis_config.json`)",
        left_out="the transformers plugin's job",
    )
    yield Item(
        "banner",
        'ImportWarning banner, global `warnings.filterwarnings("once")`',
        left_out="no banner and no global warnings filter: the report says what was patched",
    )


ITEMS: tuple[Item, ...] = tuple(_items())


class Declared(NamedTuple):
    """A patch this plugin declares, for the coverage table."""

    group: str
    name: str
    names: tuple[str, ...]  # its name, target and aliases


def declared_patches() -> dict[str, Declared]:
    """Every patch of the plugin's NPU redirect groups, by name (builds the declarations only)."""
    found: dict[str, Declared] = {}
    for group in plugin.register_patches():
        if group.requires != groups.NPU_RUNTIME:
            continue
        for patch in group.patches():
            if isinstance(patch, AtomicPatch):
                names = (patch.name, patch.target, *patch.aliases)
                found[patch.name] = Declared(group.__name__, patch.name, names)
    return found


def patches_of(item: Item, declared: dict[str, Declared]) -> tuple[str, ...]:
    """The names of the declared patches covering ``item``; raises KeyError for an unknown one."""
    if item.left_out:
        return ()
    wanted = item.by or (item.name,)
    by_any_name = {n: d.name for d in declared.values() for n in d.names}
    return tuple(by_any_name[name] for name in wanted)
