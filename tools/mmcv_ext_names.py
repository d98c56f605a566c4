#!/usr/bin/env python3
"""Regenerate the committed list of what ``mmcv._ext`` holds, per mmcv release, from mmcv's sdists.

For each release in :data:`VERSIONS` this downloads mmcv's source distribution with
``pip download --no-deps --no-build-isolation mmcv==<version>`` (never builds or
installs it), reads it straight out of the tarball with ``ast`` and regular
expressions (:mod:`ascend_patch_mmcv.served.mmcv_ext.provider_sources`: which module
asks ``load_ext('_ext', [...])`` for which name, the ``py::arg`` names of each ``m.def``
in ``mmcv/ops/csrc/pytorch/pybind.cpp`` and the C++ return type), and writes
``plugins/mmcv_npu/ascend_patch_mmcv/served/mmcv_ext/data/ext_mmcv.json``, which the
provider of ``mmcv._ext`` reads for the installed mmcv release.

Run it with a pip whose setuptools still has ``pkg_resources`` (<81; mmcv's setup.py
imports it even to describe the sdist)::

    python tools/mmcv_ext_names.py                       # every version in VERSIONS
    python tools/mmcv_ext_names.py --check               # compare, write nothing
    python tools/mmcv_ext_names.py --source 2.1.0=/path/mmcv-2.1.0.tar.gz   # no download

Sdists are cached in ``--cache`` (default: ``<tmp>/ascend-patch-sdists``). The output is
deterministic: a regenerated file equals the committed one byte for byte.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "mmcv_npu"))

from ascend_patch_mmcv.served.mmcv_ext.provider_sources import ext_table  # noqa: E402


#: The mmcv releases whose ``_ext`` the provider knows (2.x and the last 1.x).
VERSIONS = ("2.1.0", "1.7.2")
OUTPUT = ROOT / "plugins/mmcv_npu/ascend_patch_mmcv/served/mmcv_ext/data/ext_mmcv.json"
SCHEMA = "ascend-patch-mmcv-ext/1"


def download(version: str, cache: Path, pip: str) -> Path:
    """The cached sdist of mmcv ``version``, downloaded by pip if missing."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"mmcv-{version}.tar.gz"))
    if found:
        return found[0]
    subprocess.run(
        [
            *pip.split(),
            "download",
            "--no-deps",
            "--no-binary",
            "mmcv",
            "--no-build-isolation",
            "-d",
            str(cache),
            f"mmcv=={version}",
        ],
        check=True,
    )
    return next(cache.glob(f"mmcv-{version}.tar.gz"))


def read_release(source: Path) -> dict[str, Any]:
    """The ``_ext`` table of the mmcv in ``source``: an sdist, a wheel or a source directory."""
    if source.is_dir():
        package = source / "mmcv" if (source / "mmcv" / "__init__.py").is_file() else source
        return ext_table(package)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if source.name.endswith((".whl", ".zip")):
            with zipfile.ZipFile(source) as archive:
                archive.extractall(root, [n for n in archive.namelist() if n.startswith("mmcv/")])
        else:
            with tarfile.open(source) as archive:
                members = [m for m in archive.getmembers() if "/mmcv/" in f"/{m.name}"]
                archive.extractall(root, members, filter="data")
        (init,) = [p for p in root.rglob("mmcv/__init__.py") if p.parent.parent.name != "mmcv"][:1]
        return ext_table(init.parent)


def build(sources: dict[str, Path]) -> str:
    versions = {}
    for version, source in sources.items():
        table = read_release(source)
        versions[version] = {"source": source.name, **table}
    data = {
        "schema": SCHEMA,
        "generated_by": "tools/mmcv_ext_names.py",
        "note": (
            "names: what mmcv's modules ask load_ext('_ext', ...) for (asked_by), with the "
            "py::arg names of pybind.cpp's m.def (args) and the C++ return type (returns; "
            "void: writes into the tensors given). overloads: later m.def of the same name; "
            "pybind11 tries them in order, the first that binds a call wins."
        ),
        "versions": versions,
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("versions", nargs="*", default=list(VERSIONS))
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "ascend-patch-sdists"
    )
    parser.add_argument("--pip", default=f"{sys.executable} -m pip")
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="VERSION=PATH",
        help="read this sdist, wheel or directory for VERSION instead of downloading",
    )
    parser.add_argument("--check", action="store_true", help="compare with the committed file")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    given = dict(item.split("=", 1) for item in args.source)
    versions = list(dict.fromkeys([*args.versions, *given]))
    sources = {
        v: Path(given[v]) if v in given else download(v, args.cache, args.pip) for v in versions
    }
    text = build(sources)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run tools/mmcv_ext_names.py", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    counts = ", ".join(
        f"{v}: {len(json.loads(text)['versions'][v]['names'])} names" for v in versions
    )
    print(f"wrote {args.output} ({counts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
