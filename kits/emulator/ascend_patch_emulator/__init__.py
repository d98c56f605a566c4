"""The NPU emulator: torch_npu's real op schemas on CPU, with reference kernels, and
DrivingSDK's ``mx_driving`` with its real Python signatures.

Not imported by ``import ascend_patch_core``; importing it does not import torch.
"""

from __future__ import annotations

from ._activate import EmulatorHandle
from ._activate import EmulatorWarning
from ._activate import activate
from ._activate import active_version
from ._activate import deactivate
from ._activate import is_active
from ._contract import CallRecorder
from ._contract import Mismatch
from ._contract import OpCall
from ._contract import PluginCheck
from ._contract import RecordedCall
from ._contract import check_calls
from ._contract import check_plugin
from ._contract import check_plugins
from ._contract import format_mismatches
from ._contract import record_call
from ._contract import scan_sources
from ._contract import supported_versions
from ._contract_mx import supported_mx_versions
from ._errors import EmulatorInactiveError
from ._errors import EmulatorVersionError
from ._errors import KernelNotImplementedError
from ._mx_data import DEFAULT_MX_VERSION
from ._mx_data import MxName
from ._mx_data import available_mx_versions
from ._mx_data import load_mx_api
from ._schemas import DEFAULT_VERSION
from ._schemas import Argument
from ._schemas import OpSchema
from ._schemas import available_versions
from ._schemas import load_schemas
from ._schemas import parse_arguments


__all__ = [
    "DEFAULT_MX_VERSION",
    "DEFAULT_VERSION",
    "Argument",
    "CallRecorder",
    "EmulatorHandle",
    "EmulatorInactiveError",
    "EmulatorVersionError",
    "EmulatorWarning",
    "KernelNotImplementedError",
    "Mismatch",
    "MxName",
    "OpCall",
    "OpSchema",
    "PluginCheck",
    "RecordedCall",
    "activate",
    "active_version",
    "available_mx_versions",
    "available_versions",
    "check_calls",
    "check_plugin",
    "check_plugins",
    "deactivate",
    "format_mismatches",
    "is_active",
    "load_mx_api",
    "load_schemas",
    "parse_arguments",
    "record_call",
    "scan_sources",
    "supported_mx_versions",
    "supported_versions",
]
