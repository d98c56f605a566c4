"""The pip command that installs a part of ascend-patch *where the user is*.

The distributions are not on PyPI yet (docs/install.md): ``pip install
'ascend-patch-core[emulator]'`` only works against an index that has them. A user who
installed the core from a clone (``pip install -e .``, ``pip install .``) can install
the other parts from the same clone, so that is what the advice names: pip records
where a distribution came from in its ``direct_url.json`` (PEP 610), and a
``dir_info`` entry there means a local directory. Otherwise the index name is given.
"""

from __future__ import annotations

import json
import os
import shlex


__all__ = ["CPU_TORCH_INDEX", "emulator_install", "pip_install", "source_checkout"]

CORE = "ascend-patch-core"
#: PyTorch's index of CPU-only builds: without it pip takes the CUDA build of torch
#: from PyPI, with 17 nvidia-* wheels (~5 GB), on a machine that has no GPU.
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def source_checkout() -> str | None:
    """The directory the core was installed from, when pip installed it from one.

    None for an install from an index or a wheel file, or when that directory is gone.
    """
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import distribution

    try:
        text = distribution(CORE).read_text("direct_url.json")
    except PackageNotFoundError:  # running from a source tree without installing
        return None
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    url = data.get("url") if isinstance(data, dict) else None
    if "dir_info" not in data or not isinstance(url, str) or not url.startswith("file:"):
        return None
    from urllib.parse import urlsplit
    from urllib.request import url2pathname

    path = url2pathname(urlsplit(url).path)
    return path if os.path.isdir(path) else None


def pip_install(*parts: tuple[str, str]) -> str:
    """``pip install`` for parts given as ``(requirement, directory)``: each from its
    directory in the clone the core came from (``kits/emulator``), else by
    ``requirement`` from an index."""
    checkout = source_checkout()
    arguments = []
    for requirement, directory in parts:
        local = None if checkout is None else os.path.join(checkout, directory)
        if local is not None and os.path.isfile(os.path.join(local, "pyproject.toml")):
            arguments.append(shlex.quote(local))
        else:
            arguments.append(shlex.quote(requirement))
    return "pip install " + " ".join(arguments)


def emulator_install() -> str:
    """What to run to get the NPU emulator, torch's CPU build first when torch is missing.

    The emulator requires torch; where torch is already installed pip keeps it, so
    the CPU index is named only when pip would otherwise fetch torch itself.
    """
    import importlib.util

    command = pip_install((f"{CORE}[emulator]", "kits/emulator"))
    if importlib.util.find_spec("torch") is None:
        return (
            f"pip install torch --index-url {CPU_TORCH_INDEX} (torch's CPU build; "
            f"without --index-url pip fetches the CUDA build, ~5 GB), then {command}"
        )
    return command
