#!/usr/bin/env python3
"""Regenerate the committed torch_npu op schema data from the torch_npu wheels on PyPI.

For each version this downloads the x86_64 Linux CPython 3.11 wheel with
``pip download --no-deps`` (never installs it: an installed torch_npu breaks
``import torch`` on a machine without CANN), reads
``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`` straight out of the
zip, parses the schema of every entry of its ``custom``, ``autograd`` and
``symint`` sections with ``torchgen.model.FunctionSchema`` (shipped inside the
torch wheel), rewrites each as torch_npu's code generator does when it registers
the op (``self`` becomes ``input``, several out arguments one ``Tensor[] out``; see
:func:`registered_schema`), and writes
``kits/emulator/ascend_patch_emulator/data/torch_npu-<version>.json`` in the format
documented in ``kits/emulator/ascend_patch_emulator/_schemas.py``.

Run it with an interpreter that has torch and PyYAML (the tests environment)::

    .nox/tests/bin/python tools/extract_npu_schemas.py              # every version in VERSIONS
    .nox/tests/bin/python tools/extract_npu_schemas.py 2.14.0       # just one
    .nox/tests/bin/python tools/extract_npu_schemas.py --check      # compare, write nothing

Wheels are cached in ``--cache`` (default: ``<tmp>/ascend-patch-wheels``); a cached
wheel is reused without asking PyPI again. The output is deterministic, so a
regenerated file equals the committed one byte for byte unless the wheel changed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any
from typing import NamedTuple


ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "kits" / "emulator" / "ascend_patch_emulator" / "data"

#: The versions with committed data. Add one here and run the script to support it.
VERSIONS = ("2.1.0.post17", "2.6.0.post5", "2.9.0.post9", "2.12.0.post3", "2.13.0", "2.14.0")

YAML_PATH = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
#: The sections that declare ``npu::`` ops (``supported``/``quant`` override aten ops).
SECTIONS = ("custom", "autograd", "symint")
#: 2: schemas as registered (``self`` renamed to ``input``, several outs merged into one
#: ``Tensor[] out``); 1 held the yaml's text.
FORMAT = 2

#: torch_npu's codegen (``codegen/custom_functions.py`` in 2.1 from 2.1.0.post9 on,
#: ``torchnpugen/custom_functions.py`` from 2.6 to master; class ``RegisterCustomSchema``;
#: the 2.1.0.post4 branch lacks it) runs exactly this substitution on each
#: custom op's schema before ``m.def(...)``: the yaml says ``self``, ``torch.ops.npu`` (and so
#: ``torch_npu.<op>``, which is ``torch.ops.npu.<op>``) takes ``input=``.
SELF_ARGUMENT = re.compile(r"\bself\b(?=[,\)])")

# Fixed wheel tags, so what is downloaded (and the "source" recorded in the data)
# does not depend on the interpreter running the script. Older releases are tagged
# manylinux2014/2_17, newer ones manylinux_2_28; pip picks whichever exists.
PIP_TAG_ARGS = (
    "--only-binary",
    ":all:",
    "--implementation",
    "cp",
    "--python-version",
    "3.11",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
)


class DownloadError(RuntimeError):
    """pip could not download a wheel; ``output`` is what pip printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


def default_cache() -> Path:
    return Path(tempfile.gettempdir()) / "ascend-patch-wheels"


def cached_wheel(version: str, cache: Path) -> Path | None:
    """The wheel of ``version`` already in ``cache``, if any."""
    found = sorted(cache.glob(f"torch_npu-{version}-cp311-*.whl"))
    return found[0] if found else None


def download_wheel(version: str, cache: Path, pip_args: tuple[str, ...] = ()) -> Path:
    """The torch_npu ``version`` wheel, from ``cache`` or downloaded into it with pip."""
    wheel = cached_wheel(version, cache)
    if wheel is not None:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        *PIP_TAG_ARGS,
        *pip_args,
        "--dest",
        str(cache),
        f"torch-npu=={version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = cached_wheel(version, cache)
    if result.returncode != 0 or wheel is None:
        raise DownloadError(
            f"pip could not download torch-npu=={version} (exit {result.returncode})",
            result.stdout + result.stderr,
        )
    return wheel


def read_yaml_text(wheel: Path) -> str:
    """The codegen yaml of ``wheel``, read from the zip without unpacking it."""
    with zipfile.ZipFile(wheel) as archive:
        try:
            return archive.read(YAML_PATH).decode("utf-8")
        except KeyError:
            raise SystemExit(f"{wheel.name} has no {YAML_PATH}") from None


class Entry(NamedTuple):
    name: str
    overload: str
    section: str
    exposed: bool
    schema: str


def registered_schema(yaml_schema: str) -> str:
    """``yaml_schema`` as torch_npu registers it (``m.def``), which is not the yaml's text.

    torch_npu's codegen makes two changes before registering an op: an overload with
    more than one out argument (``*, Tensor(a!) pdf, Tensor(b!) mantissa``) takes them
    as one ``Tensor[] out`` and returns plain ``(Tensor, Tensor)``; then every ``self``
    argument becomes ``input`` (:data:`SELF_ARGUMENT`). torch_npu rewrites torchgen's
    rendering of the schema; the data keeps the yaml's own spelling, so each result is
    checked against torchgen's reading of the arguments: the same ones in the same
    order, the out arguments merged, each ``self`` renamed, nothing else touched.
    (Only the arguments are parsed: torchgen's whole-schema check rejects an in-place
    op returning a mutated argument not named ``self``, which torch's own schema
    parser, the one ``m.def`` uses, accepts.)
    """
    outs = _arguments(yaml_schema).out
    merged = yaml_schema
    if len(outs) > 1:
        declaration = yaml_schema.rsplit(") -> ", maxsplit=1)[0]
        # The out arguments are the last declarations (torchgen checks it); none holds a comma.
        kept = declaration.rsplit(",", maxsplit=len(outs))[0]
        merged = f"{kept}, Tensor[] out) -> ({', '.join(['Tensor'] * len(outs))})"
    renamed, count = SELF_ARGUMENT.subn("input", merged)
    yaml_names = [a.name for a in _arguments(yaml_schema).flat_all]
    out_names = {a.name for a in outs} if len(outs) > 1 else set()
    expected = [n for n in yaml_names if n not in out_names] + (["out"] if out_names else [])
    expected = ["input" if name == "self" else name for name in expected]
    if (
        count != yaml_names.count("self")
        or [a.name for a in _arguments(renamed).flat_all] != expected
    ):
        raise SystemExit(
            f"registering changed more than the out and self arguments:\n"
            f"  yaml: {yaml_schema}\n  registered: {renamed}"
        )
    return renamed


def _arguments(schema: str) -> Any:
    """torchgen's ``Arguments`` of ``schema`` (split as ``FunctionSchema.parse`` splits)."""
    from torchgen.model import Arguments

    declaration = schema.rsplit(") -> ", maxsplit=1)[0]
    return Arguments.parse(declaration.split("(", maxsplit=1)[1])


def parse_entries(yaml_text: str) -> tuple[list[Entry], list[dict[str, str]]]:
    """(parsed ops sorted by name and overload, entries torchgen rejects).

    The ``symint`` section repeats some ``custom`` entries verbatim: one op each.
    A repeat whose schema differs would make the data ambiguous, so it stops the run.
    Schemas are stored as registered (:func:`registered_schema`).
    """
    import yaml
    from torchgen.model import FunctionSchema

    document = yaml.safe_load(yaml_text)
    ops: dict[str, Entry] = {}
    skipped: list[dict[str, str]] = []
    for section in SECTIONS:
        for item in document.get(section) or []:
            raw: Any = item if isinstance(item, str) else item.get("func")
            # Bare names ("as_strided_") re-register aten ops; they have no npu schema.
            if not isinstance(raw, str) or "(" not in raw:
                continue
            exposed = isinstance(item, dict) and item.get("exposed") is True
            try:
                parsed = FunctionSchema.parse(raw)
            except Exception as error:  # torchgen raises bare RuntimeError/AssertionError
                skipped.append({"schema": raw, "section": section, "reason": f"torchgen: {error}"})
                continue
            schema = registered_schema(raw)
            entry = Entry(
                str(parsed.name.name), parsed.name.overload_name, section, exposed, schema
            )
            key = f"{entry.name}.{entry.overload}"
            previous = ops.get(key)
            if previous is None:
                ops[key] = entry
            elif previous.schema != schema:
                raise SystemExit(
                    f"{key} is declared twice with different schemas:\n"
                    f"  {previous.section}: {previous.schema}\n  {section}: {schema}"
                )
            elif exposed and not previous.exposed:
                ops[key] = previous._replace(exposed=True)
    return sorted(ops.values(), key=lambda e: (e.name, e.overload)), skipped


def render(version: str, source: str, ops: list[Entry], skipped: list[dict[str, str]]) -> str:
    """The data file text: a small header, then one JSON object per line."""
    import json

    def line(obj: dict[str, Any]) -> str:
        return json.dumps(obj, ensure_ascii=False)

    header = line({"format": FORMAT, "torch_npu": version, "source": source})
    sections = []
    for key, rows in (("skipped", skipped), ("ops", [op._asdict() for op in ops])):
        body = ",\n".join(line(row) for row in rows)
        sections.append(f'"{key}": [\n{body}\n]' if rows else f'"{key}": []')
    # header[:-1] drops its closing brace: the sections continue the same object.
    return header[:-1] + ",\n" + ",\n".join(sections) + "}\n"


def generate(version: str, cache: Path, pip_args: tuple[str, ...] = ()) -> str:
    """Download (or reuse) the wheel of ``version`` and return its data file text."""
    wheel = download_wheel(version, cache, pip_args)
    ops, skipped = parse_entries(read_yaml_text(wheel))
    return render(version, wheel.name, ops, skipped)


def data_path(version: str) -> Path:
    return DATA_DIR / f"torch_npu-{version}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "versions", nargs="*", help=f"torch_npu versions (default: {' '.join(VERSIONS)})"
    )
    parser.add_argument("--cache", type=Path, default=default_cache(), help="wheel cache folder")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="where the data files go")
    parser.add_argument(
        "--check", action="store_true", help="compare with the files in --out; write nothing"
    )
    args = parser.parse_args(argv)
    stale = []
    for version in args.versions or VERSIONS:
        try:
            text = generate(version, args.cache)
        except DownloadError as error:
            print(f"{error}\n{error.output}", file=sys.stderr)
            return 2
        path = args.out / f"torch_npu-{version}.json"
        if args.check:
            current = path.read_text(encoding="utf-8") if path.is_file() else None
            status = "up to date" if current == text else "STALE"
            if current != text:
                stale.append(version)
            print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {status}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({len(text)} bytes)")
    if stale:
        print(f"regenerate: {sys.argv[0]} {' '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
