"""Benchmarks for the core's performance budgets (issue: core, "Performance").

Run with ``python3 dev.py -s bench`` (add ``-- --write`` to refresh docs/benchmarks.md).
Every comparison is measured side by side in one run, variants interleaved in a
shuffled order each round, because the machine is shared and noisy; medians are
reported.

1. start-up: ``import ascend_patch_core; ascend_patch_core.apply()`` with the three
   plugins installed and ~150 distributions on the path -- standalone (over
   ``python -c pass``) and inside a process that already imported torch;
2. per call: a patch without runtime_check (the replacement itself is installed)
   and with one (generated fixed-signature wrapper, and the generic fallback);
3. the import finder on a heavy import (torch plus building a model).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import timeit
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
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


def count_distributions(env: dict[str, str]) -> int:
    code = "import importlib.metadata as m; print(len(list(m.distributions())))"
    return int(
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
    )


def wall(code: str, env: dict[str, str]) -> float:
    start = timeit.default_timer()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return timeit.default_timer() - start


def startup(rounds: int) -> dict[str, float | int | str]:
    tmp = Path(tempfile.mkdtemp(prefix="ap-bench-"))
    make_fake_distributions(tmp / "site", 120)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "site"), env.get("PYTHONPATH", "")]).strip(
        os.pathsep
    )
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp / "cache")
    dists = count_distributions(env)
    apply_code = "import ascend_patch_core; ascend_patch_core.apply()"
    check = (
        "import sys, ascend_patch_core; r = ascend_patch_core.apply(); "
        f"bad = [m for m in {HEAVY!r} if m in sys.modules]; "
        "assert not bad, bad; print(len([x for x in r if x.kind == 'plugin']))"
    )
    plugins = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True
    )
    in_torch = textwrap.dedent(
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
    # Every redirect group applicable: the NPU emulator stands in for torch_npu. The
    # emulator lives in ascend_patch_core, so the core is imported before timing, and
    # its own start-up garbage is collected first (it is the emulator's, not apply()'s).
    npu_apply = textwrap.dedent(
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
    cold_env = dict(env, ASCEND_PATCH_CACHE="0")
    samples: dict[str, list[float]] = {
        "pass": [],
        "warm": [],
        "cold": [],
        "in_torch": [],
        "in_torch_settled": [],
        "npu_apply": [],
    }
    npu_applied = 0

    def in_process(code: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return out.stdout.split()

    for _ in range(rounds):
        order = list(samples)
        random.shuffle(order)
        for key in order:
            if key == "pass":
                samples[key].append(wall("pass", env))
            elif key == "warm":
                samples[key].append(wall(apply_code, env))
            elif key == "cold":
                samples[key].append(wall(apply_code, cold_env))
            elif key == "npu_apply":
                seconds, applied = in_process(npu_apply)
                samples[key].append(float(seconds))
                npu_applied = int(applied)
            else:
                settle = key == "in_torch_settled"
                code = in_torch.replace("SETTLE", str(settle))
                samples[key].append(float(in_process(code)[0]))
    med = {k: statistics.median(v) * 1000 for k, v in samples.items()}
    return {
        "distributions": dists,
        "plugins": int(plugins.stdout.strip()),
        "python -c pass (ms)": round(med["pass"], 1),
        "standalone, warm cache, over pass (ms)": round(med["warm"] - med["pass"], 1),
        "standalone, no cache, over pass (ms)": round(med["cold"] - med["pass"], 1),
        "after import torch, in-process (ms)": round(med["in_torch"], 2),
        "the same, torch's pending garbage collected first (ms)": round(med["in_torch_settled"], 2),
        f"apply() alone, torch-npu emulated: {npu_applied} patches installed (ms)": round(
            med["npu_apply"], 1
        ),
    }


def per_call(rounds: int, number: int) -> dict[str, float]:
    from ascend_patch_core._report import CallCounters
    from ascend_patch_core._wrappers import _generic_wrapper
    from ascend_patch_core._wrappers import make_runtime_check_wrapper

    def original(a, b=None):
        return a

    def replacement(a, b=None):
        return a

    def check(a, b=None):
        return True

    fixed = make_runtime_check_wrapper(check, replacement, original, CallCounters())
    generic = _generic_wrapper(check, replacement, original, CallCounters())
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
    samples: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(rounds):
        for key in random.sample(list(samples), 2):
            setup = with_hub if key == "with" else without
            out = subprocess.run(
                [sys.executable, "-c", heavy.replace("{setup}", setup)],
                capture_output=True,
                text=True,
                check=True,
            )
            samples[key].append(float(out.stdout.strip()))
    a, b = statistics.median(samples["without"]), statistics.median(samples["with"])
    # The side-by-side difference is at this machine's noise floor; count what the
    # finder is actually asked during the same import, to price it exactly.
    counting = (
        with_hub + "; from ascend_patch_core._hub import hub; real = hub.find_spec; calls = [0]\n"
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
        capture_output=True,
        text=True,
        check=True,
    )
    lookups = int(counted.stdout.strip().splitlines()[-1])
    from ascend_patch_core import ModuleHook
    from ascend_patch_core import Patcher
    from ascend_patch_core._hub import hub

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


def ensure_bytecode() -> None:
    """Users run from .pyc files; this machine sets PYTHONDONTWRITEBYTECODE, so compile explicitly."""
    import compileall

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    for directory in [
        ROOT / "ascend_patch_core",
        *sorted((ROOT / "plugins").glob("*/ascend_patch_*")),
    ]:
        compileall.compile_dir(str(directory), quiet=1)


def main() -> None:
    ensure_bytecode()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    results = {
        "start-up": startup(args.rounds),
        "per call, ns over calling the replacement directly": per_call(args.rounds, 200_000),
        "import finder": finder_overhead(max(5, args.rounds // 2)),
    }
    import platform
    import time

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{args.rounds} rounds.\n"
    ]
    for title, rows in results.items():
        lines.append(f"### {title}\n\n| measure | value |\n|---|---|")
        lines.extend(f"| {k} | {v} |" for k, v in rows.items())
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.write:
        target = ROOT / "docs" / "benchmarks.md"
        head = (
            target.read_text().split("<!-- results -->")[0]
            if target.exists()
            else "# Benchmarks\n\n"
        )
        target.write_text(f"{head}<!-- results -->\n\n{text}\n")


if __name__ == "__main__":
    main()
