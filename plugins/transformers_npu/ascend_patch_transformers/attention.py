"""The patches of :class:`ascend_patch_transformers.groups.NpuAttention`.

* ``attn_implementation="npu"``: the fused path in front of the fallback
  (:mod:`ascend_patch_transformers.attention_kernels`), its name in transformers' attention
  interface and, from transformers 4.53, SDPA's mask builder under the same name;
* ``attn_implementation="flash_attention_2"`` is transformers' own NPU path in every
  supported version (``transformers.integrations.npu_flash_attention``, on
  npu_fusion_attention): left alone, except where the plugin's ``flash_attn`` stand-in
  would make transformers 4.51-4.56 take it for a real flash-attn and fail (see
  :func:`enable_flash_attention_2`).

Each patch's note says which path a model takes; ``ascend-patch doctor`` shows them in
its Groups section, with the installed transformers version.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from .attention_kernels import IMPLEMENTATION
from .attention_kernels import fusion_supported


__all__ = ["attention_patches", "enable_flash_attention_2", "flash_attn_stand_in"]

_KERNELS = "ascend_patch_transformers.attention_kernels"
_INTERFACE = "transformers.modeling_utils:AttentionInterface._global_mapping"
_MASKS = "transformers.masking_utils:AttentionMaskInterface._global_mapping"
_FUSED = f"{_KERNELS}:npu_attention_forward"
_FUSED_NAME = "npu attention: fused path"


def _transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def flash_attn_stand_in() -> bool:
    """Whether ``flash_attn`` here is the plugin's stand-in: findable, with no flash-attn distribution."""
    try:
        importlib.metadata.distribution("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        return _findable("flash_attn") and _findable("torch_npu")
    return False


def _stand_in_check(cls: Any, config: Any, *args: Any, **kwargs: Any) -> bool:
    return bool(getattr(cls, "_supports_flash_attn_2", False)) and flash_attn_stand_in()


def enable_flash_attention_2(
    cls: Any,
    config: Any,
    torch_dtype: Any = None,
    device_map: Any = None,
    check_device_map: bool = True,
    hard_check_only: bool = False,
) -> Any:
    """transformers 4.51's own NPU branch of ``_check_and_enable_flash_attn_2``.

    That branch runs only when ``importlib.util.find_spec("flash_attn") is None``; with
    the plugin's stand-in findable, transformers would read flash-attn's version from
    metadata and raise ``PackageNotFoundError`` instead. So for a stand-in (no flash-attn
    distribution, an NPU runtime) this does what transformers does on an NPU without
    flash-attn: select ``flash_attention_2``, whose kernels transformers then takes from
    ``transformers.integrations.npu_flash_attention``.
    """
    if not hard_check_only:
        config._attn_implementation = "flash_attention_2"
    return config


def attention_patches(
    options: Any = None, *, npu_module_served: bool = False
) -> Iterator[AtomicPatch]:
    """The group's patches, each noted with the path a model takes.

    ``npu_module_served``: the group's import rule serves transformers' NPU integration
    without einops (:func:`ascend_patch_transformers.groups.npu_integration_needs_einops`).
    """
    version = _transformers_version()
    fused = (
        f'attn_implementation="{IMPLEMENTATION}": npu_fusion_attention (BNSD); '
        "fallback: sdpa (eager for attention weights or softcap)"
    )

    einops_free = ", served without einops" if npu_module_served else ""
    flash = (
        f'"flash_attention_2": transformers {version}\'s own NPU path '
        f'(integrations.npu_flash_attention{einops_free}); "sdpa": torch\'s SDPA, not patched'
    )
    # The fused path in front of the fallback, counted per call in the report.
    yield AtomicPatch(
        _FUSED,
        f"{_KERNELS}:fusion_attention_forward",
        runtime_check=fusion_supported,
        name=_FUSED_NAME,
        note=fused,
    )
    # The name models ask for; resolved after the fused path is installed, so the
    # interface holds the counting wrapper.
    yield AtomicPatch(
        f"{_INTERFACE}['{IMPLEMENTATION}']",
        _FUSED,
        create=True,
        after=_FUSED_NAME,
        name=f"attn_implementation={IMPLEMENTATION!r}",
        note=flash,
    )
    # transformers >= 4.53 builds the mask a layer gets by the implementation's name and
    # builds none for a name it does not know: the "npu" layers get SDPA's boolean masks.
    # (4.51/4.52 give every implementation but sdpa and flash an additive float mask.)
    yield AtomicPatch(
        f"{_MASKS}['{IMPLEMENTATION}']",
        "transformers.masking_utils:sdpa_mask",
        create=True,
        requires="transformers>=4.53",
        name=f"attention mask for {IMPLEMENTATION!r}",
        note='"npu" layers get the sdpa masks (boolean, True = attend; transformers >= 4.53)',
    )
    # 4.51's flash_attention_2 check, with the plugin's flash_attn stand-in findable.
    yield AtomicPatch(
        "transformers.modeling_utils:PreTrainedModel._check_and_enable_flash_attn_2",
        f"{__name__}:enable_flash_attention_2",
        runtime_check=_stand_in_check,
        requires="transformers<4.57",
        note="transformers < 4.57: its flash_attention_2 check takes the NPU branch with the "
        "flash_attn stand-in",
    )
