"""What ``ascend-patch doctor`` says about the NPU software stack: torch_npu, CANN, NPUs, variables.

The core's doctor knows nothing of these: it finds this module through the
entry-point group ``ascend_patch.doctor`` (docs/core.md, "Doctor reporters") and
shows what it returns. A reporter has ``VARIABLES`` (name -> what it does),
``facts(environment, try_import)`` (sections of doctor's ``environment``),
``rows(environment)`` (lines of its Environment table) and ``findings(environment,
environ)`` (``(level, code, message)`` advice).

Everything here comes from distribution metadata, files the CANN installer writes,
``npu-smi`` and the environment, read without importing torch or torch_npu.
Importing torch costs seconds and importing torch_npu without CANN fails (and,
through torch's backend autoload, breaks ``import torch`` itself); ``ascend-patch
doctor`` must answer in well under a second, so a real import happens only on request
(``--try-import``), in a child process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple


__all__ = [
    "VARIABLES",
    "Finding",
    "cann_info",
    "facts",
    "findings",
    "npu_info",
    "rows",
    "torch_npu_info",
    "variable_findings",
]


class Finding(NamedTuple):
    """One observation for the user. ``level``: "error", "warning" or "note"."""

    level: str
    code: str
    message: str


#: The NPU runtime's variables doctor shows (set ones always, all of them with -v), with
#: what they do. Some are the defaults this plugin sets (env.py).
VARIABLES: dict[str, str] = {
    "TORCH_DEVICE_BACKEND_AUTOLOAD": "0 stops `import torch` from importing torch_npu",
    "ASCEND_RT_VISIBLE_DEVICES": "which NPUs the process sees (the NPU's CUDA_VISIBLE_DEVICES)",
    "ASCEND_TOOLKIT_HOME": "CANN toolkit root, set by set_env.sh",
    "ASCEND_HOME_PATH": "CANN root, set by set_env.sh",
    "ASCEND_OPP_PATH": "CANN operator package path, set by set_env.sh",
    "ASCEND_AICPU_PATH": "CANN AI CPU kernels path, set by set_env.sh",
    "ASCEND_LAUNCH_BLOCKING": "1 makes every op launch synchronous (debugging only)",
    "ASCEND_GLOBAL_LOG_LEVEL": "CANN log level: 0 debug, 1 info, 2 warning, 3 error",
    "ASCEND_SLOG_PRINT_TO_STDOUT": "1 prints CANN logs to stdout",
    "HCCL_CONNECT_TIMEOUT": "seconds HCCL waits for peers when a group is created",
    "HCCL_EXEC_TIMEOUT": "seconds a collective may run before HCCL aborts",
    "HCCL_BUFFSIZE": "HCCL buffer size per communicator, in MB",
    "HCCL_IF_IP": "IP address HCCL binds for its control plane",
    "HCCL_SOCKET_IFNAME": "network interface HCCL uses (the NPU's NCCL_SOCKET_IFNAME)",
    "HCCL_WHITELIST_DISABLE": "1 turns HCCL's peer whitelist off",
    "PYTORCH_NPU_ALLOC_CONF": "NPU caching allocator settings (the NPU's PYTORCH_CUDA_ALLOC_CONF)",
    "TASK_QUEUE_ENABLE": "torch_npu op-launch pipelining: 0 off, 1 on (default), 2 level 2",
    "CPU_AFFINITY_CONF": "torch_npu binding of host threads to CPU cores",
    "INF_NAN_MODE_ENABLE": "1 keeps inf/nan semantics in NPU arithmetic (saturation mode otherwise)",
    "COMBINED_ENABLE": "1 fuses discontiguous-tensor copies",
}

_CANN_ROOTS = (
    "/usr/local/Ascend/ascend-toolkit/latest",
    "/usr/local/Ascend/cann",
    "~/Ascend/ascend-toolkit/latest",
)
_CANN_LIBS = ("libascendcl.so", "libhccl.so")


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _entry_points(group: str) -> list[Any]:
    from importlib import metadata

    return list(metadata.entry_points(group=group))


def _release(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    try:
        from packaging.version import Version

        return Version(version).release[:3]
    except Exception:
        return None


def _lib_dirs() -> list[str]:
    return [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]


def _find_libs(names: tuple[str, ...]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in names:
        found[name] = next(
            (os.path.join(d, name) for d in _lib_dirs() if os.path.exists(os.path.join(d, name))),
            None,
        )
    return found


def torch_npu_info(torch_version: str | None, try_import: bool) -> dict[str, Any]:
    """Installed? Paired with torch? Importable (predicted from CANN's libraries, or tried)?"""
    version = _version("torch-npu")
    info: dict[str, Any] = {
        "installed": version is not None,
        "version": version,
        "pairs_with_torch": None,
        "expected_torch": None,
        "autoload_entry_point": False,
        "importable": None,
        "import_check": None,
        "import_detail": None,
    }
    if version is None:
        return info
    npu_release, torch_release = _release(version), _release(torch_version)
    if npu_release is not None:
        info["expected_torch"] = ".".join(map(str, npu_release))
    if npu_release is not None and torch_release is not None:
        # torch_npu X.Y.Z[.postN] pairs with torch X.Y.Z (its Requires-Dist pins it).
        info["pairs_with_torch"] = npu_release == torch_release
    info["autoload_entry_point"] = any(
        ep.name == "torch_npu" for ep in _entry_points("torch.backends")
    )
    if try_import:
        ok, detail = _try_import_torch_npu()
        info.update(importable=ok, import_check="import", import_detail=detail)
    else:
        missing = [name for name, path in _find_libs(_CANN_LIBS).items() if path is None]
        info["import_check"] = "static"
        if missing:
            info["importable"] = False
            info["import_detail"] = (
                f"{', '.join(missing)} not found on LD_LIBRARY_PATH; torch_npu's extension needs CANN"
            )
        else:
            info["importable"] = True
            info["import_detail"] = (
                "CANN's libraries are on LD_LIBRARY_PATH (not imported; --try-import imports it)"
            )
    return info


def _try_import_torch_npu() -> tuple[bool, str]:
    code = "import torch, torch_npu; print(torch_npu.__version__, torch.npu.is_available())"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if k != "ASCEND_PATCH_RUN"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"could not run the import check: {exc}"
    if done.returncode == 0:
        out = done.stdout.strip().split()
        return (
            True,
            f"imported torch_npu {out[0] if out else '?'}; npu available: {out[-1] if out else '?'}",
        )
    last = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return False, last[-1] if last else f"exit status {done.returncode}"


def _read_info_file(path: str) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition("=")
                if sep:
                    values[key.strip().lower()] = value.strip()
    except OSError:
        pass
    return values


def cann_info(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Where the CANN toolkit is and which version its install info names."""
    env = os.environ if environ is None else environ
    candidates: list[tuple[str, str]] = []
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        if env.get(var):
            candidates.append((env[var], var))
    candidates += [(os.path.expanduser(root), "default location") for root in _CANN_ROOTS]
    info: dict[str, Any] = {
        "found": False,
        "home": None,
        "found_by": None,
        "version": None,
        "version_file": None,
        "set_env_sourced": bool(env.get("ASCEND_TOOLKIT_HOME") or env.get("ASCEND_HOME_PATH")),
        "driver_version": None,
    }
    for home, how in candidates:
        if not os.path.isdir(home):
            continue
        info.update(found=True, home=home, found_by=how)
        version_files = [
            os.path.join(home, entry, "ascend_toolkit_install.info")
            for entry in sorted(os.listdir(home))
            if entry.endswith("-linux")
        ]
        version_files += [
            os.path.join(home, "ascend_toolkit_install.info"),
            os.path.join(home, "compiler", "version.info"),
            os.path.join(home, "runtime", "version.info"),
            os.path.join(home, "version.info"),
        ]
        for path in version_files:
            version = _read_info_file(path).get("version")
            if version:
                info.update(version=version, version_file=path)
                break
        break
    driver = _read_info_file("/usr/local/Ascend/driver/version.info").get("version")
    info["driver_version"] = driver
    return info


_DEVICE_ROW = re.compile(r"^\|\s*(\d+)\s+(\w[\w.-]*)\s*\|\s*([A-Za-z]+)\s*\|")


def npu_info(timeout: float = 10.0) -> dict[str, Any]:
    """NPU devices as ``npu-smi info`` lists them (absent tool: no devices, no error)."""
    tool = shutil.which("npu-smi")
    info: dict[str, Any] = {"npu_smi": tool, "version": None, "devices": [], "error": None}
    if tool is None:
        return info
    try:
        done = subprocess.run([tool, "info"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["error"] = f"npu-smi info failed: {exc}"
        return info
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        info["error"] = f"npu-smi info exited {done.returncode}" + (
            f": {message[-1]}" if message else ""
        )
        return info
    for line in done.stdout.splitlines():
        match = re.search(r"Version:\s*([\w.\-]+)", line)
        if match and info["version"] is None:
            info["version"] = match.group(1)
        row = _DEVICE_ROW.match(line)
        if row:
            info["devices"].append(
                {"id": int(row.group(1)), "name": row.group(2), "health": row.group(3)}
            )
    return info


def variable_findings(
    facts: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> list[Finding]:
    """Advice derived from the variables and ``facts`` (doctor's environment sections)."""
    env = os.environ if environ is None else environ
    out: list[Finding] = []
    npu = facts["torch_npu"]
    cann = facts["cann"]
    autoload = env.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    breaks_torch = npu["installed"] and npu["autoload_entry_point"] and npu["importable"] is False
    if breaks_torch and autoload != "0":
        out.append(
            Finding(
                "error",
                "torch-import-breaks",
                "`import torch` will fail: torch autoloads torch_npu (its torch.backends entry point) "
                "and torch_npu cannot load here ("
                + str(npu["import_detail"])
                + "); source CANN's set_env.sh, or export TORCH_DEVICE_BACKEND_AUTOLOAD=0",
            )
        )
    if npu["installed"] and autoload == "0" and npu["importable"]:
        out.append(
            Finding(
                "note",
                "autoload-off",
                "TORCH_DEVICE_BACKEND_AUTOLOAD=0: torch does not import torch_npu by itself; "
                "the program (or a plugin) must `import torch_npu`",
            )
        )
    if env.get("CUDA_VISIBLE_DEVICES") is not None and env.get("ASCEND_RT_VISIBLE_DEVICES") is None:
        out.append(
            Finding(
                "warning",
                "visible-devices",
                f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} does not select NPUs; "
                f"set ASCEND_RT_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}",
            )
        )
    if env.get("PYTORCH_CUDA_ALLOC_CONF") and env.get("PYTORCH_NPU_ALLOC_CONF") is None:
        out.append(
            Finding(
                "warning",
                "alloc-conf",
                f"PYTORCH_CUDA_ALLOC_CONF={env['PYTORCH_CUDA_ALLOC_CONF']} does not configure the NPU "
                "allocator; set PYTORCH_NPU_ALLOC_CONF (e.g. expandable_segments:True)",
            )
        )
    if env.get("NCCL_SOCKET_IFNAME") and env.get("HCCL_SOCKET_IFNAME") is None:
        out.append(
            Finding(
                "warning",
                "socket-ifname",
                f"NCCL_SOCKET_IFNAME={env['NCCL_SOCKET_IFNAME']} does not configure HCCL; "
                f"set HCCL_SOCKET_IFNAME={env['NCCL_SOCKET_IFNAME']}",
            )
        )
    if env.get("CUDA_LAUNCH_BLOCKING") == "1" and env.get("ASCEND_LAUNCH_BLOCKING") is None:
        out.append(
            Finding(
                "note",
                "launch-blocking",
                "CUDA_LAUNCH_BLOCKING=1 does not affect NPUs; ASCEND_LAUNCH_BLOCKING=1 is the NPU's",
            )
        )
    if env.get("ASCEND_LAUNCH_BLOCKING") == "1":
        out.append(
            Finding(
                "warning",
                "launch-blocking",
                "ASCEND_LAUNCH_BLOCKING=1 makes every op launch synchronous: for debugging only",
            )
        )
    if env.get("TASK_QUEUE_ENABLE") == "0":
        out.append(
            Finding(
                "warning",
                "task-queue",
                "TASK_QUEUE_ENABLE=0 turns op-launch pipelining off, which slows training; use 1 or 2",
            )
        )
    if env.get("ASCEND_GLOBAL_LOG_LEVEL") in ("0", "1"):
        out.append(
            Finding(
                "note",
                "log-level",
                f"ASCEND_GLOBAL_LOG_LEVEL={env['ASCEND_GLOBAL_LOG_LEVEL']} logs a lot and slows the NPU "
                "runtime; 3 (error) is the usual setting",
            )
        )
    if cann["found"] and not cann["set_env_sourced"]:
        out.append(
            Finding(
                "warning",
                "cann-env",
                f"CANN is installed at {cann['home']} but its environment is not set; "
                f"source {os.path.join(os.path.dirname(cann['home'].rstrip('/')), 'set_env.sh')}",
            )
        )
    return out


def facts(environment: Mapping[str, Any], try_import: bool) -> dict[str, Any]:
    """Doctor's ``torch_npu``, ``cann`` and ``npu`` sections (``environment`` holds the core's ``torch``)."""
    torch = environment.get("torch") or {}
    return {
        "torch_npu": torch_npu_info(torch.get("version"), try_import),
        "cann": cann_info(),
        "npu": npu_info(),
    }


def rows(environment: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The Environment table's torch_npu, CANN and NPUs lines."""
    npu, cann, devices = environment["torch_npu"], environment["cann"], environment["npu"]
    out: list[tuple[str, str]] = []
    if npu["installed"]:
        pairs = {True: "pairs with torch", False: f"needs torch {npu['expected_torch']}", None: ""}
        importable = {True: "importable", False: "not importable", None: ""}[npu["importable"]]
        how = "" if npu["import_check"] == "import" else " (predicted)"
        text = f"{npu['version']}, {pairs[npu['pairs_with_torch']]}, {importable}{how}"
        out.append(("torch_npu", text.replace(", ,", ",")))
    else:
        out.append(("torch_npu", "not installed"))
    if cann["found"]:
        out.append(("CANN", f"{cann['version'] or 'version unknown'}  {cann['home']}"))
    else:
        out.append(("CANN", "not found"))
    if devices["npu_smi"] is None:
        out.append(("NPUs", "npu-smi not found"))
    else:
        names = ", ".join(f"{d['id']}:{d['name']}({d['health']})" for d in devices["devices"])
        out.append(("NPUs", f"{len(devices['devices'])} {names}".strip()))
    return out


def findings(environment: Mapping[str, Any], environ: Mapping[str, str]) -> list[Finding]:
    """The stack's errors and advice: pairing, CANN, npu-smi, then the variables."""
    return stack_findings(environment) + variable_findings(environment, environ)


def stack_findings(environment: Mapping[str, Any]) -> list[Finding]:
    torch, npu = environment["torch"], environment["torch_npu"]
    cann, devices = environment["cann"], environment["npu"]
    out: list[Finding] = []
    if npu["installed"]:
        if not torch["installed"]:
            out.append(
                Finding(
                    "error",
                    "torch-missing",
                    f"torch_npu {npu['version']} is installed but torch is not",
                )
            )
        elif npu["pairs_with_torch"] is False:
            out.append(
                Finding(
                    "error",
                    "torch-npu-mismatch",
                    f"torch_npu {npu['version']} pairs with torch {npu['expected_torch']}, but torch "
                    f"{torch['version']} is installed: pip install torch=={npu['expected_torch']} "
                    "(or the torch_npu release for your torch)",
                )
            )
        if not cann["found"]:
            out.append(
                Finding(
                    "warning",
                    "cann-missing",
                    "torch_npu is installed but no CANN toolkit was found "
                    "(ASCEND_TOOLKIT_HOME, /usr/local/Ascend/ascend-toolkit/latest)",
                )
            )
        if npu["import_check"] == "import" and not npu["importable"]:
            out.append(
                Finding(
                    "error", "torch-npu-import", f"import torch_npu failed: {npu['import_detail']}"
                )
            )
    elif torch["installed"]:  # without torch, the core's doctor says what is missing
        emulator = any(ep.name == "torch_npu" for ep in _entry_points("ascend_patch.emulator"))
        hint = (
            "; NPU code paths can run on the CPU under the emulator: ascend-patch run --emulate-npu"
            if emulator
            # The pip command depends on where the core came from (a clone, an index):
            # run --emulate-npu names the one that works here.
            else "; to run NPU code paths on the CPU, install the emulator: "
            "ascend-patch run --emulate-npu names the pip command for this environment"
        )
        out.append(Finding("note", "no-torch-npu", f"torch_npu is not installed{hint}"))
    if devices["error"]:
        out.append(Finding("warning", "npu-smi", devices["error"]))
    elif devices["npu_smi"] and not devices["devices"]:
        out.append(Finding("warning", "no-devices", "npu-smi lists no NPU"))
    return out
