"""Benchmarks for the core's performance budgets (issue: core, "Performance").

Run with ``python3 dev.py -s bench`` (add ``-- --write`` to refresh docs/benchmarks.md).
Every comparison is measured side by side in one run, variants interleaved in a
shuffled order each round, because the machine is shared and noisy; medians are
reported.

1. start-up: ``import ascend_patch_core; ascend_patch_core.apply()`` with the three
   plugins installed and ~150 distributions on the path -- standalone (over
   ``python -c pass``) and inside a process that already imported torch -- in this
   environment (the project installed editable) and, with ``--regular-python``, in a
   second one holding the same requirements with the project installed from regular
   wheels (the bench session builds it), the two interleaved;
2. per call: a patch without runtime_check (the replacement itself is installed)
   and with one (generated fixed-signature wrapper, and the generic fallback);
3. the import finder on a heavy import (torch plus building a model);
4. per patch, beside DrivingSDK's ``mx_driving.patcher`` (``benchmarks/reference.py``,
   in a fresh interpreter), when a reference is found: ``--reference PATH``, else
   ``$ASCEND_PATCH_REFERENCE``, else the local mirror; otherwise the section says how
   to get one and is skipped;
5. the mmcv plugin's ``mmcv._ext`` provider beside mmcv's compiled CPU kernels
   (``benchmarks/ext_ops.py``, run in an interpreter holding mmcv with its ops:
   ``--ext-python``, else ``$ASCEND_PATCH_EXT_BENCH_PYTHON``, else nox's
   openmmlab_cpu_ops environment; otherwise skipped, saying how); ``--only-ext`` runs
   that section alone.

Each budget gets a verdict line. Subprocesses run from a scratch directory, never from
the source tree, so that ``import ascend_patch_core`` goes through the installation
being measured and not through the current directory.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parent.parent
#: (budget, what was measured, whether it holds; None: not measured)
Verdict = tuple[str, str, "bool | None"]
REFERENCE_SCRIPT = ROOT / "benchmarks" / "reference.py"
EXT_OPS_SCRIPT = ROOT / "benchmarks" / "ext_ops.py"
HEAVY = ("torch", "mmcv", "mmdet", "mmdet3d", "mmengine", "transformers", "diffusers", "torch_npu")


def make_fake_distributions(directory: Path, count: int) -> None:
    """``count`` tiny installed distributions, a few with unrelated entry points."""
    for i in range(count):
        info = directory / f"benchdist_{i}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: benchdist-{i}\nVersion: 1.0\n"
        )
        (info / "RECORD").write_text("")
        if i % 3 == 0:
            (info / "entry_points.txt").write_text(
                f"[console_scripts]\nbenchdist{i} = benchdist_{i}:main\n"
            )


#: Start-up rows: key -> label. Rows measured in-process print seconds themselves.
STARTUP_ROWS = {
    "pass": "python -c pass (ms)",
    "warm": "standalone, warm cache, over pass (ms)",
    "cold": "standalone, no cache, over pass (ms)",
    "in_torch": "after import torch, in-process (ms)",
    "in_torch_settled": "the same, torch's pending garbage collected first (ms)",
    "in_torch_share": "apply() after import torch, share of import torch's CPU time (%)",
    "npu_apply": "apply() alone, torch-npu emulated (ms)",
}

APPLY_CODE = "import ascend_patch_core; ascend_patch_core.apply()"

#: Run untimed in each environment: what is installed, and that apply() stays lazy.
PROBE = textwrap.dedent(
    f"""
    import importlib.metadata as m, json, sys
    import ascend_patch_core
    report = ascend_patch_core.apply()
    heavy = [name for name in {HEAVY!r} if name in sys.modules]
    assert not heavy, heavy
    numpy_imported = "numpy" in sys.modules

    def version(name):
        try:
            return m.version(name)
        except m.PackageNotFoundError:
            return None

    print(json.dumps({{
        "distributions": len(list(m.distributions())),
        "plugins": len([r for r in report if r.kind == "plugin"]),
        "core": ascend_patch_core.__file__,
        "torch": version("torch"),
        "numpy": version("numpy"),
        "numpy_imported": numpy_imported,
    }}))
    """
)

IN_TORCH = textwrap.dedent(
    """
    import gc, sys, time, torch
    if SETTLE:
        gc.collect()
    t = time.perf_counter()
    import ascend_patch_core
    ascend_patch_core.apply()
    print(time.perf_counter() - t)
    """
)

# The same apply(), as a share of the CPU time of `import torch` measured just before
# in the same process: a ratio, which a slow or busy machine moves much less than
# milliseconds (both sides slow down together).
IN_TORCH_SHARE = textwrap.dedent(
    """
    import time
    start = time.process_time()
    import torch
    torch_done = time.process_time()
    import ascend_patch_core
    ascend_patch_core.apply()
    end = time.process_time()
    print(100 * (end - torch_done) / (torch_done - start))
    """
)

# Every redirect group applicable: the NPU emulator (the kit ascend_patch_emulator)
# stands in for torch_npu. Activating it imports the core, so the core is imported
# before timing, and the emulator's own start-up garbage is collected first (it is the
# emulator's, not apply()'s).
NPU_APPLY = textwrap.dedent(
    """
    import gc, time, torch
    import ascend_patch_emulator
    ascend_patch_emulator.activate()
    import ascend_patch_core
    gc.collect()
    t = time.perf_counter()
    report = ascend_patch_core.apply()
    elapsed = time.perf_counter() - t
    print(elapsed, sum(r.kind == "patch" for r in report.by_status("applied")))
    """
)


def startup(rounds: int, pythons: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Start-up rows for each environment in ``pythons`` (label -> interpreter).

    Every (environment, measure) pair runs once per round, all of them in one shuffled
    order. Each environment has its own metadata cache (ASCEND_PATCH_CACHE_DIR): a
    shared one would be invalidated by the other environment's path on every run.
    """
    tmp = Path(tempfile.mkdtemp(prefix="ap-bench-"))
    atexit.register(shutil.rmtree, tmp, True)
    make_fake_distributions(tmp / "site", 120)
    scratch = tmp / "cwd"
    scratch.mkdir()
    base = dict(os.environ)
    base["PYTHONPATH"] = os.pathsep.join([str(tmp / "site"), base.get("PYTHONPATH", "")]).strip(
        os.pathsep
    )
    envs = {
        label: dict(base, ASCEND_PATCH_CACHE_DIR=str(tmp / f"cache-{label}")) for label in pythons
    }

    def output(label: str, code: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run(
            [pythons[label], "-c", code],
            env=env or envs[label],
            cwd=scratch,
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise SystemExit(f"start-up ({label}) failed:\n{code}\n{out.stderr}")
        return out.stdout

    def wall(label: str, code: str, env: dict[str, str] | None = None) -> float:
        start = timeit.default_timer()
        subprocess.run(
            [pythons[label], "-c", code], env=env or envs[label], cwd=scratch, check=True
        )
        return timeit.default_timer() - start

    probes = {label: json.loads(output(label, PROBE)) for label in pythons}
    samples: dict[tuple[str, str], list[float]] = {
        (label, key): [] for label in pythons for key in STARTUP_ROWS
    }
    npu_applied: dict[str, int] = {}
    for _ in range(rounds):
        order = list(samples)
        random.shuffle(order)
        for label, key in order:
            if key == "pass":
                seconds = wall(label, "pass")
            elif key == "warm":
                seconds = wall(label, APPLY_CODE)
            elif key == "cold":
                seconds = wall(label, APPLY_CODE, dict(envs[label], ASCEND_PATCH_CACHE="0"))
            elif key == "npu_apply":
                elapsed, applied = output(label, NPU_APPLY).split()
                seconds = float(elapsed)
                npu_applied[label] = int(applied)
            elif key == "in_torch_share":
                seconds = float(output(label, IN_TORCH_SHARE)) / 1000  # a percentage, kept as is
            else:
                code = IN_TORCH.replace("SETTLE", str(key == "in_torch_settled"))
                seconds = float(output(label, code))
            samples[label, key].append(seconds)
    table: dict[str, dict[str, Any]] = {}
    for label, probe in probes.items():
        med = {key: statistics.median(samples[label, key]) * 1000 for key in STARTUP_ROWS}
        core = Path(probe["core"]).resolve()
        column: dict[str, Any] = {
            "distributions": probe["distributions"],
            "plugins": probe["plugins"],
            "ascend_patch_core imported from": (
                "the source tree" if core.parent == ROOT / "ascend_patch_core" else "site-packages"
            ),
            "torch, numpy installed": f"{probe['torch']}, {probe['numpy']}",
            "numpy imported by standalone apply()": "yes" if probe["numpy_imported"] else "no",
        }
        for key, row in STARTUP_ROWS.items():
            value = med[key] - med["pass"] if key in ("warm", "cold") else med[key]
            column[row] = f"{value:.{2 if key.startswith('in_torch') else 1}f}"
            if key in ("warm", "cold"):
                # In an editable install `python -c pass` already imports setuptools'
                # finders (from .pth files) and the modules they need, which apply() then
                # finds loaded: across installs, compare whole processes too.
                column[row.replace("over pass", "whole process")] = f"{med[key]:.1f}"
        column["patches installed under the emulator"] = npu_applied.get(label)
        table[label] = column
    return table


def per_call(rounds: int, number: int) -> dict[str, float]:
    from ascend_patch_core._install.wrappers import _GENERIC_CODE
    from ascend_patch_core._install.wrappers import make_runtime_check_wrapper
    from ascend_patch_core._model.report import CallCounters

    def original(a, b=None):
        return a

    def replacement(a, b=None):
        return a

    def check(a, b=None):
        return True

    def narrow_check(a):  # cannot take b: the wrapper must keep *args, **kwargs
        return True

    fixed = make_runtime_check_wrapper(check, replacement, original, CallCounters())
    generic = make_runtime_check_wrapper(narrow_check, replacement, original, CallCounters())
    fixed(1), generic(1)  # a wrapper's first call chooses the code it keeps
    if fixed.__code__ is _GENERIC_CODE or generic.__code__ is not _GENERIC_CODE:
        raise RuntimeError("per_call: the wrappers did not take the codes measured")
    cases = {
        "replacement called directly": lambda: replacement(1),
        "check + replacement called directly": lambda: (check(1), replacement(1)),
        "runtime_check wrapper (fixed signature)": lambda: fixed(1),
        "runtime_check wrapper (generic *args, **kwargs)": lambda: generic(1),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        keys = list(cases)
        random.shuffle(keys)
        for key in keys:
            samples[key].append(timeit.timeit(cases[key], number=number) / number * 1e9)
    base = statistics.median(samples["replacement called directly"])
    return {k: round(statistics.median(v) - base, 1) for k, v in samples.items()}


def finder_overhead(rounds: int) -> dict[str, float]:
    heavy = textwrap.dedent(
        """
        import time, sys
        t = time.perf_counter()
        {setup}
        import torch
        model = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(64, 4, 128) for _ in range(4)])
        model(torch.zeros(8, 2, 64))
        import torch.distributed, torch.optim, torch.utils.data
        print(time.perf_counter() - t)
        """
    )
    with_hub = (
        "import ascend_patch_core as ap; p = ap.Patcher(); "
        "p.add(*[ap.AtomicPatch(f'nothere{i}.mod.f', print) for i in range(50)]); "
        "p.add(ap.AtomicPatch('torch.nn.functional.silu', lambda x, inplace=False: x)); "
        "p.add(ap.ModuleHook('transformers.models.*.modeling_*', lambda m: [])); "
        "p.skip_import('flash_attn'); p.apply()"
    )
    without = "import ascend_patch_core as ap"
    scratch = tempfile.mkdtemp(prefix="ap-bench-cwd-")
    atexit.register(shutil.rmtree, scratch, True)
    samples: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(rounds):
        for key in random.sample(list(samples), 2):
            setup = with_hub if key == "with" else without
            out = subprocess.run(
                [sys.executable, "-c", heavy.replace("{setup}", setup)],
                cwd=scratch,
                capture_output=True,
                text=True,
                check=True,
            )
            samples[key].append(float(out.stdout.strip()))
    a, b = statistics.median(samples["without"]), statistics.median(samples["with"])
    # The side-by-side difference is at this machine's noise floor; count what the
    # finder is actually asked during the same import, to price it exactly.
    counting = (
        with_hub
        + "; from ascend_patch_core.imports._hub import hub; real = hub.find_spec; calls = [0]\n"
        "def find_spec(*args, **kwargs):\n"
        "    calls[0] += 1\n"
        "    return real(*args, **kwargs)\n"
        "hub.find_spec = find_spec"
    )
    counted = subprocess.run(
        [
            sys.executable,
            "-c",
            heavy.replace("{setup}", counting).replace(
                "print(time.perf_counter() - t)", "print(calls[0])"
            ),
        ],
        cwd=scratch,
        capture_output=True,
        text=True,
        check=True,
    )
    lookups = int(counted.stdout.strip().splitlines()[-1])
    from ascend_patch_core import ModuleHook
    from ascend_patch_core import Patcher
    from ascend_patch_core.imports._hub import hub

    patcher = Patcher().add(ModuleHook("transformers.models.*.modeling_*", lambda m: []))
    patcher.skip_import("flash_attn")
    patcher.apply()
    per_lookup = min(
        timeit.repeat(lambda: hub.find_spec("numpy.core.multiarray"), number=100_000, repeat=7)
    )
    patcher.revert()
    return {
        "finder lookup for an unrelated module (ns)": round(per_lookup / 100_000 * 1e9, 1),
        "heavy import without hub (s)": round(a, 3),
        "with hub (50 watches, 1 pattern, 1 skip rule) (s)": round(b, 3),
        "added, side by side (%)": round((b - a) / a * 100, 2),
        "finder lookups during that import": lookups,
        "their cost, lookups x ns per lookup (%)": round(
            lookups * per_lookup / 100_000 / a * 100, 4
        ),
    }


def ensure_bytecode(pythons: list[str]) -> None:
    """Users run from .pyc files; this machine sets PYTHONDONTWRITEBYTECODE, so compile explicitly.

    The source tree's packages (what the editable install imports), then the whole
    site-packages of every environment measured, each with its own interpreter (what a
    regular install imports; pip compiles at install, so mostly this only checks).
    """
    import compileall

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    for directory in [
        ROOT / "ascend_patch_core",
        *sorted((ROOT / "kits").glob("*/ascend_patch_*")),
        *sorted((ROOT / "plugins").glob("*/ascend_patch_*")),
    ]:
        compileall.compile_dir(str(directory), quiet=1)
    code = (
        "import compileall, sysconfig; "
        "compileall.compile_dir(sysconfig.get_path('purelib'), quiet=2, workers=0)"
    )
    for python in dict.fromkeys(pythons):
        subprocess.run([python, "-c", code], check=True)


def load_ext_module() -> Any:
    """benchmarks/ext_ops.py as a module (its section() and write())."""
    spec = importlib.util.spec_from_file_location("_ap_bench_ext_ops", EXT_OPS_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ext_ops(args: argparse.Namespace) -> str:
    """The mmcv._ext section: printed, and written into docs/benchmarks.md with --write."""
    module = load_ext_module()
    python = args.ext_python or module.default_python(ROOT)
    text = "\n".join(["### mmcv._ext ops", "", module.section(python, args.ext_rounds, ROOT)])
    print(text)
    if args.write:
        module.write(ROOT / "docs" / "benchmarks.md", text)
    return text


def load_reference_module() -> Any:
    """benchmarks/reference.py as a module (its markdown() and verdicts())."""
    spec = importlib.util.spec_from_file_location("_ap_bench_reference", REFERENCE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_patch(reference: str | None, rounds: int) -> tuple[str, list[Verdict]]:
    """The side-by-side per-patch section and its verdicts, or why it was skipped."""
    module = load_reference_module()
    source = module.locate(reference)
    budgets = [
        "apply() per patch (with and without runtime_check) no slower than mx_driving.patcher",
        "per call with runtime_check no slower than mx_driving.patcher",
        "add() (all at once and one call per patch) and revert() linear",
    ]
    if source is None:
        text = f"Skipped: no DrivingSDK reference found; {module.HOW_TO_GET}."
        return text, [(budget, "not measured: no reference", None) for budget in budgets]
    out = subprocess.run(
        [
            sys.executable,
            str(REFERENCE_SCRIPT),
            "--json",
            "--rounds",
            str(rounds),
            "--reference",
            str(source),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        error = (out.stderr.strip().splitlines() or ["no output"])[-1]
        text = f"Failed with the reference at {source}: {error}"
        why = "not measured: the comparison failed (see its section)"
        return text, [(budget, why, None) for budget in budgets]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    return module.markdown(results), list(module.verdicts(results))


def startup_verdicts(table: dict[str, dict[str, Any]]) -> list[Verdict]:
    out: list[Verdict] = []
    for label, column in table.items():
        for row, budget in (
            ("after import torch, in-process (ms)", 10),
            (STARTUP_ROWS["in_torch_share"], 0.8),
            ("standalone, warm cache, over pass (ms)", 50),
            ("standalone, no cache, over pass (ms)", 50),
        ):
            value = column[row]
            unit = "%" if row.endswith("(%)") else "ms"
            out.append(
                (
                    f"start-up, {label} install: {row.rpartition(' (')[0]} ≤ {budget} {unit}",
                    f"{value} {unit} (median)",
                    float(value) <= budget,
                )
            )
    out.append(
        (
            f"after apply() none of {', '.join(HEAVY[1:])} imported",
            "asserted in every environment",
            True,
        )
    )
    return out


def render_startup(table: dict[str, dict[str, Any]]) -> list[str]:
    labels = list(table)
    lines = [
        "| measure | " + " | ".join(f"{label} install" for label in labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for row in table[labels[0]]:
        lines.append(f"| {row} | " + " | ".join(str(table[x][row]) for x in labels) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    parser.add_argument(
        "--regular-python",
        help="interpreter of an environment with the project installed from regular wheels "
        "(start-up is measured there too)",
    )
    parser.add_argument(
        "--reference",
        help="DrivingSDK work tree or bare git dir for the per-patch comparison "
        "(default: $ASCEND_PATCH_REFERENCE, else the local mirror)",
    )
    parser.add_argument(
        "--ext-python",
        help="interpreter with mmcv's compiled CPU ops and the project, for the mmcv._ext "
        "section (default: $ASCEND_PATCH_EXT_BENCH_PYTHON, else .nox/openmmlab_cpu_ops)",
    )
    parser.add_argument("--ext-rounds", type=int, default=3)
    parser.add_argument("--only-ext", action="store_true", help="the mmcv._ext section alone")
    args = parser.parse_args()
    if args.only_ext:
        ext_ops(args)
        return
    pythons = {"editable": sys.executable}
    if args.regular_python:
        pythons["regular"] = args.regular_python
    ensure_bytecode(list(pythons.values()))

    started = startup(args.rounds, pythons)
    calls = per_call(args.rounds, 200_000)
    finder = finder_overhead(max(5, args.rounds // 2))
    reference_text, reference_verdicts = per_patch(args.reference, args.rounds)

    wrapper = calls["runtime_check wrapper (fixed signature)"]
    finder_share = finder["their cost, lookups x ns per lookup (%)"]
    verdicts = [
        *startup_verdicts(started),
        (
            "runtime_check: ≤ 130 ns per call over calling the replacement directly",
            f"{wrapper} ns (fixed-signature wrapper, median)",
            wrapper <= 130,
        ),
        (
            "the import finder adds ≤ 2 % to a heavy import",
            f"{finder_share} % (lookups x ns per lookup; side by side: "
            f"{finder['added, side by side (%)']} %)",
            finder_share <= 2,
        ),
        *reference_verdicts,
    ]
    if "regular" not in pythons:
        verdicts.insert(
            0,
            (
                "start-up, regular install",
                "not measured: no --regular-python (the bench session passes one)",
                None,
            ),
        )

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {args.rounds} rounds.",
        "",
        "### verdicts",
        "",
    ]
    for budget, measured, holds in verdicts:
        mark = {True: "met", False: "**NOT MET**", None: "not measured"}[holds]
        lines.append(f"- {mark}: {budget}: {measured}")
    lines += ["", "### start-up", "", *render_startup(started), ""]
    for title, rows in (
        ("per call, ns over calling the replacement directly", calls),
        ("import finder", finder),
    ):
        lines += [f"### {title}", "", "| measure | value |", "|---|---|"]
        lines.extend(f"| {k} | {v} |" for k, v in rows.items())
        lines.append("")
    lines += ["### per patch, beside mx_driving.patcher", "", reference_text, ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        target = ROOT / "docs" / "benchmarks.md"
        head = (
            target.read_text().split("<!-- results -->")[0]
            if target.exists()
            else "# Benchmarks\n\n"
        )
        target.write_text(f"{head}<!-- results -->\n\n{text}")
    ext_ops(args)


if __name__ == "__main__":
    main()
