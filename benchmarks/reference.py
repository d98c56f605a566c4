"""Per-patch cost of ascend_patch_core next to DrivingSDK's ``mx_driving.patcher``.

Run with ``python benchmarks/reference.py [--reference PATH] [--n 1000] [--rounds 15]
[--scaling 1000,2000,5000] [--json]``; ``benchmarks/run.py`` runs it in a fresh
interpreter as its section "per patch, beside mx_driving.patcher". PATH is a DrivingSDK
work tree or a bare git dir (default: ``$ASCEND_PATCH_REFERENCE``, else the local
mirror); its ``mx_driving/patcher/*.py`` are copied, with an empty
``mx_driving/__init__.py`` (no stub needed), into a temporary directory put first on
``sys.path``. Nothing of the reference is kept in this repository.

Workload, identical for both sides: a fresh module (``types.ModuleType``, registered in
``sys.modules``, so already imported) holding N functions ``f0..f{N-1}(x, y=1)``, N
replacements ``g_i`` of the same signature (both made by exec of one generated source),
and ``AtomicPatch(f"{mod}.f{i}", g_i)`` of each side's class; variant "runtime_check"
passes one shared ``check(x, y=1) -> True`` to every patch. Patch objects and the module
are built anew for every measurement and not timed; the reference cannot undo, so no
module is ever seen twice. Measured, per patch: ``Patcher().add(*patches)``, ``.apply()``
and (ours only: the reference's ``__exit__`` does nothing) ``.revert()``; per call:
``mod.f0`` after apply (read once, so no attribute lookup is timed) minus ``g0`` called
directly, with timeit. The garbage collector runs before and is off during each timed
block, as in timeit. Every apply is checked to have installed all N patches.

Statistics (the machine is shared and noisy): in every round each variant measures
both sides back to back, variants and the order of the sides shuffled, and the round's
ratio ours/reference is recorded per measure. Reported per side: min over rounds and
the median; per measure: the median of the per-round ratios, which is what the verdict
uses (<= 1.00: ours no slower). The scaling table times add() (both ways), apply() and
revert() (plain variant) at several N, both sides back to back at each N, and gives the
log-log slope of total time between the smallest and largest N (1.0 = linear), from the minima
over rounds (the medians' slope beside it).

Logging: the reference's logger (``mx_driving.patcher``, own StreamHandler) is set above
CRITICAL, every event action to "silent" and its summary off, so it prints nothing; it
still buffers one record per applied patch, which is part of its apply(). Ours prints
nothing. The reference imports torch at its own import when torch is installed; both
sides then run in one process with the same modules loaded. Our apply() makes one pass
over ``sys.modules`` (stale references), so its fixed cost depends on len(sys.modules).
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import gc
import io
import itertools
import json
import logging
import math
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import timeit
import types
from pathlib import Path
from typing import Any


MIRROR = Path("/work/.mirror/Ascend+DrivingSDK/repo")
HOW_TO_GET = (
    "get it with `git clone https://github.com/Ascend/DrivingSDK` and pass --reference PATH "
    "(or set ASCEND_PATCH_REFERENCE)"
)
CALLS = 200_000
VARIANTS = ("plain", "runtime_check")
SIDES = ("ours", "reference")
#: Measures timed per patch (µs/patch) and per call (ns/call).
PER_PATCH = ("add", "add_each", "apply", "revert")
#: How the scaling table and the verdicts name each measure.
LABELS = {
    "add": "add()",
    "add_each": "add() one call per patch",
    "apply": "apply()",
    "revert": "revert()",
}
#: The largest log-log slope still called linear.
LINEAR = 1.1
_unique = itertools.count()
_code: dict[tuple[int, str], types.CodeType] = {}
Classes = tuple[type, type]  # (AtomicPatch, Patcher)


def check(x, y=1):
    return True


def locate(reference: str | None = None) -> Path | None:
    """The reference to use: ``reference``, else $ASCEND_PATCH_REFERENCE, else the mirror."""
    chosen = reference or os.environ.get("ASCEND_PATCH_REFERENCE")
    if chosen:
        return Path(chosen).expanduser()
    return MIRROR if MIRROR.exists() else None


def materialise(reference: str | None) -> tuple[Path, str]:
    """Copy mx_driving/patcher/*.py and an empty mx_driving/__init__.py to a temp dir."""
    source = locate(reference)
    if source is None:
        raise SystemExit(f"no DrivingSDK reference found: {HOW_TO_GET}")
    tmp = Path(tempfile.mkdtemp(prefix="ap-reference-"))
    atexit.register(shutil.rmtree, tmp, True)
    dest = tmp / "mx_driving" / "patcher"
    dest.mkdir(parents=True)
    if (source / "mx_driving" / "patcher" / "patcher.py").is_file():
        git = ["git", "-C", str(source)]
        kind = "work tree"
        for file in (source / "mx_driving" / "patcher").glob("*.py"):
            shutil.copyfile(file, dest / file.name)
    elif (source / "HEAD").is_file() and (source / "objects").is_dir():
        git = ["git", f"--git-dir={source}"]
        kind = "git dir"
        archive = subprocess.run(
            [*git, "archive", "HEAD", "mx_driving/patcher"], capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar.getmembers():
                if member.isfile() and re.fullmatch(r"mx_driving/patcher/[^/]+\.py", member.name):
                    data = tar.extractfile(member)
                    assert data is not None
                    (dest / Path(member.name).name).write_bytes(data.read())
    else:
        raise SystemExit(f"{source} is neither a DrivingSDK work tree nor a git dir: {HOW_TO_GET}")
    if not (dest / "patcher.py").is_file():
        raise SystemExit(f"{source} holds no mx_driving/patcher/patcher.py: {HOW_TO_GET}")
    (tmp / "mx_driving" / "__init__.py").write_text("")
    head = subprocess.run(
        [*git, "log", "-1", "--format=%h %cs"], capture_output=True, text=True
    ).stdout.split()
    commit = f"{head[0]} ({head[1]})" if len(head) == 2 else "unknown commit"
    # The repository and commit say what was measured; the local path would not.
    return tmp, f"Ascend/DrivingSDK (github.com/Ascend/DrivingSDK) @ {commit}, from a local {kind}"


def load_sides(reference: str | None) -> tuple[dict[str, Classes], str]:
    from ascend_patch_core import AtomicPatch
    from ascend_patch_core import Patcher

    if "mx_driving" in sys.modules:
        raise SystemExit("mx_driving is already imported; run this in a fresh interpreter")
    tmp, origin = materialise(reference)
    sys.path.insert(0, str(tmp))
    import mx_driving.patcher as ref

    # Silence the reference completely: logger level, event actions, summary.
    ref.set_patcher_log_level(logging.CRITICAL + 1)
    ref.configure_patcher_logging(
        on_apply="silent", on_skip="silent", on_fail="silent", on_error="silent"
    )
    ref.patcher_logger.configure_summary(enabled=False)
    return {"ours": (AtomicPatch, Patcher), "reference": (ref.AtomicPatch, ref.Patcher)}, origin


def functions(n: int, prefix: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Define ``{prefix}0..{prefix}{n-1}(x, y=1)`` in namespace (one compiled source per n)."""
    code = _code.get((n, prefix))
    if code is None:
        source = "".join(f"def {prefix}{i}(x, y=1):\n    return x\n" for i in range(n))
        code = _code[n, prefix] = compile(source, f"<bench {prefix} x{n}>", "exec")
    exec(code, namespace)
    return namespace


def timed(call: Any) -> tuple[Any, float]:
    gc.collect()
    gc.disable()
    try:
        start = timeit.default_timer()
        result = call()
        return result, timeit.default_timer() - start
    finally:
        gc.enable()


def measure(side: str, classes: Classes, n: int, runtime_check: bool) -> dict[str, float]:
    """One fresh module and patch set: add, apply, per call (runtime_check), revert (ours).

    Per-patch measures come back in seconds (total), per-call ones in ns per call.
    """
    atomic, patcher_class = classes
    name = f"_ap_bench_{side}_{next(_unique)}"
    module = types.ModuleType(name)
    functions(n, "f", module.__dict__)
    sys.modules[name] = module
    repl = functions(n, "g", {"__name__": f"{name}_replacements"})
    originals = [module.__dict__[f"f{i}"] for i in range(n)]
    extra = {"runtime_check": check} if runtime_check else {}
    patches = [atomic(f"{name}.f{i}", repl[f"g{i}"], **extra) for i in range(n)]
    out: dict[str, float] = {}
    try:
        patcher, seconds = timed(lambda: patcher_class().add(*patches))
        out["add"] = seconds
        out["add_each"] = timed(lambda: add_each(patcher_class(), patches))[1]
        out["apply"] = timed(patcher.apply)[1]
        missed = [i for i in range(n) if module.__dict__[f"f{i}"] is originals[i]]
        if missed or (not runtime_check and module.f0 is not repl["g0"]) or module.f0(1) != 1:
            raise RuntimeError(f"{side}: apply() left {len(missed)} of {n} targets unpatched")
        if runtime_check:
            for key, fn in (("call", module.f0), ("direct", repl["g0"])):
                timer = timeit.Timer("fn(1)", globals={"fn": fn})
                out[key] = timer.timeit(CALLS) / CALLS * 1e9
            out["overhead"] = out["call"] - out["direct"]
        if side == "ours":
            out["revert"] = timed(patcher.revert)[1]
            if any(module.__dict__[f"f{i}"] is not originals[i] for i in range(n)):
                raise RuntimeError("ours: revert() did not restore every original")
    finally:
        del sys.modules[name]
    return out


def add_each(patcher: Any, patches: list[Any]) -> Any:
    """One add() call per patch (the patcher is thrown away: only add() is measured)."""
    for patch in patches:
        patcher.add(patch)
    return patcher


def summary(values: list[float], scale: float) -> dict[str, float]:
    return {"min": min(values) * scale, "median": statistics.median(values) * scale}


def slope(sizes: list[int], totals: list[float]) -> float | None:
    if len(sizes) < 2:
        return None
    return math.log(totals[-1] / totals[0]) / math.log(sizes[-1] / sizes[0])


def run(reference: str | None, n: int, rounds: int, scaling: list[int]) -> dict[str, Any]:
    """Measure; the result is plain JSON (``--json``), rendered by markdown() and verdicts()."""
    sides, origin = load_sides(reference)
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    info = {
        "date": datetime.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "reference": origin,
        "modules": len(sys.modules),
        "torch": getattr(torch, "__version__", None),
        "numpy": getattr(numpy, "__version__", None),
        "n": n,
        "rounds": rounds,
        "calls": CALLS,
    }
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    variants = list(VARIANTS)
    for _ in range(rounds):
        random.shuffle(variants)
        for variant in variants:
            this_round = {}
            for side in random.sample(SIDES, len(SIDES)):
                this_round[side] = measure(side, sides[side], n, variant == "runtime_check")
                samples.setdefault((side, variant), []).append(this_round[side])
            ours, ref = this_round["ours"], this_round["reference"]
            for key in ours.keys() & ref.keys():
                if ref[key] > 0:
                    ratios.setdefault((variant, key), []).append(ours[key] / ref[key])
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for (side, variant), rows in samples.items():
        cell = table.setdefault(variant, {})
        for key in rows[0]:
            scale = 1e6 / n if key in PER_PATCH else 1.0
            cell.setdefault(key, {})[side] = summary([r[key] for r in rows], scale)
    for (variant, key), values in ratios.items():
        table[variant][key]["ratio"] = statistics.median(values)

    sizes = sorted(set(scaling))
    series: dict[tuple[str, str], dict[int, list[float]]] = {}
    for _ in range(rounds):
        for size in random.sample(sizes, len(sizes)):
            for side in random.sample(SIDES, len(SIDES)):
                for key, seconds in measure(side, sides[side], size, False).items():
                    series.setdefault((side, key), {}).setdefault(size, []).append(seconds)
    scaled = []
    for (side, key), by_size in sorted(series.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        mins = [min(by_size[s]) * 1e3 for s in sizes]
        medians = [statistics.median(by_size[s]) * 1e3 for s in sizes]
        scaled.append(
            {
                "side": side,
                "key": key,
                "min_ms": mins,
                "median_ms": medians,
                "slope": slope(sizes, mins),
                "slope_median": slope(sizes, medians),
            }
        )
    return {"info": info, "table": table, "scaling": scaled, "sizes": sizes}


def fmt(cell: dict[str, float] | None, digits: int) -> str:
    if cell is None:
        return "n/a"
    return f"{cell['min']:.{digits}f} ({cell['median']:.{digits}f})"


def verdicts(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(budget, what was measured, whether it holds) for each per-patch budget."""
    table, sizes = results["table"], results["sizes"]
    out: list[tuple[str, str, bool]] = []
    for variant in VARIANTS:
        cell = table[variant]["apply"]
        ratio = cell["ratio"]
        out.append(
            (
                f"apply() per patch, {variant}: ours no slower than mx_driving.patcher "
                "(median of per-round ratios ours/reference ≤ 1.00)",
                f"ratio {ratio:.2f}; medians {cell['ours']['median']:.2f} vs "
                f"{cell['reference']['median']:.2f} µs/patch",
                ratio <= 1.0,
            )
        )
    cell = table["runtime_check"]["overhead"]
    out.append(
        (
            "per call with runtime_check, ns over calling the replacement directly: "
            "ours no more than mx_driving.patcher's (median ratio ≤ 1.00)",
            f"ratio {cell['ratio']:.2f}; medians {cell['ours']['median']:.1f} vs "
            f"{cell['reference']['median']:.1f} ns",
            cell["ratio"] <= 1.0,
        )
    )
    for row in results["scaling"]:
        linear = ("add", "add_each", "revert")
        if row["side"] == "ours" and row["key"] in linear and row["slope"] is not None:
            out.append(
                (
                    f"{LABELS[row['key']]} linear: log-log slope ≤ {LINEAR} from N = {sizes[0]} "
                    f"to {sizes[-1]}",
                    f"slope {row['slope']:.2f} (of the minima; medians: {row['slope_median']:.2f})",
                    row["slope"] <= LINEAR,
                )
            )
    return out


def markdown(results: dict[str, Any]) -> str:
    info, table = results["info"], results["table"]
    loaded = ", ".join(
        f"{name} {info[name]}" for name in ("torch", "numpy") if info.get(name) is not None
    )
    lines = [
        f"Measured {info['date']} on {info['cpus']} CPUs, Python {info['python']}, "
        f"N = {info['n']} patches, {info['rounds']} rounds, both sides back to back in "
        "every round (order shuffled): min over rounds (median); ratio: median of the "
        "per-round ratios ours/reference (≤ 1.00: ours no slower).",
        "",
        f"Reference: mx_driving.patcher from {info['reference']}.",
        f"len(sys.modules) at measurement: {info['modules']} ({loaded or 'no torch'}; the "
        "reference imports torch at its own import, so both sides run in one process with "
        "the same modules).",
        "Logging: the reference's logger set above CRITICAL, its event actions 'silent' and "
        "its summary off; ours prints nothing. GC off during timed blocks.",
    ]
    rows = [
        ("add", "add() (µs/patch)", 3),
        ("add_each", "add() one call per patch (µs/patch)", 3),
        ("apply", "apply() (µs/patch)", 3),
        ("revert", "revert() (µs/patch)", 3),
        ("direct", f"replacement called directly (ns/call, {info['calls']} calls)", 1),
        ("call", "patched mod.f0(1) (ns/call)", 1),
        ("overhead", "per call over the replacement (ns/call)", 1),
    ]
    for variant in VARIANTS:
        lines += [
            "",
            f"#### {variant}",
            "",
            "| measure | ours | reference | ratio |",
            "|---|---|---|---|",
        ]
        for key, label, digits in rows:
            cells = table[variant].get(key)
            if cells is None:
                continue
            ref = fmt(cells.get("reference"), digits)
            if key == "revert":
                ref = "n/a (cannot revert: `__exit__` does nothing)"
            ratio = f"{cells['ratio']:.2f}" if "ratio" in cells else "n/a"
            lines.append(f"| {label} | {fmt(cells.get('ours'), digits)} | {ref} | {ratio} |")
    sizes = results["sizes"]
    lines += [
        "",
        "#### scaling (plain; total ms, min over rounds; slope: log-log, "
        f"N = {sizes[0]} to {sizes[-1]}, 1.0 = linear)",
        "",
        "| measure | " + " | ".join(f"N = {s}" for s in sizes) + " | slope | slope of medians |",
        "|---|" + "---|" * (len(sizes) + 2),
    ]
    for row in results["scaling"]:
        slopes = ["n/a" if row[k] is None else f"{row[k]:.2f}" for k in ("slope", "slope_median")]
        values = " | ".join(f"{ms:.2f}" for ms in row["min_ms"])
        lines.append(f"| {row['side']} {LABELS[row['key']]} | {values} | {' | '.join(slopes)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", help="DrivingSDK work tree or bare git dir")
    parser.add_argument("--n", type=int, default=1000, help="patches per measurement")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--scaling", default="1000,2000,5000", help="comma-separated N list")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args()
    scaling = [int(s) for s in args.scaling.split(",") if s.strip()]
    results = run(args.reference, args.n, args.rounds, scaling)
    if args.json:
        print(json.dumps(results))
        return
    print(markdown(results))
    print()
    for budget, measured, holds in verdicts(results):
        print(f"- {'met' if holds else 'NOT MET'}: {budget}: {measured}")


if __name__ == "__main__":
    main()
