"""Per-patch cost of ascend_patch_core next to DrivingSDK's ``mx_driving.patcher``.

Run with ``python benchmarks/reference.py [--reference PATH] [--n 1000] [--rounds 7]
[--scaling 1000,2000,5000]``. PATH is a DrivingSDK work tree or a bare git dir (default:
``$ASCEND_PATCH_REFERENCE``, else the local mirror); its ``mx_driving/patcher/*.py`` are
copied, with an empty ``mx_driving/__init__.py`` (no stub needed), into a temporary
directory put first on ``sys.path``. Nothing of the reference is kept in this repository.

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

Sides and variants are interleaved in a shuffled order every round; the minimum over
rounds is reported, the median in brackets (the machine is shared and noisy). The
scaling table times add(), apply() and revert() (plain variant) at several N and gives
the log-log slope of total time between the smallest and largest N (1.0 = linear).

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
_unique = itertools.count()
_code: dict[tuple[int, str], types.CodeType] = {}
Classes = tuple[type, type]  # (AtomicPatch, Patcher)


def check(x, y=1):
    return True


def materialise(reference: str | None) -> tuple[Path, str]:
    """Copy mx_driving/patcher/*.py and an empty mx_driving/__init__.py to a temp dir."""
    chosen = reference or os.environ.get("ASCEND_PATCH_REFERENCE")
    if not chosen and MIRROR.exists():
        chosen = str(MIRROR)
    if not chosen:
        raise SystemExit(f"no DrivingSDK reference found: {HOW_TO_GET}")
    source = Path(chosen).expanduser()
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
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return tmp, f"{kind} {source} @ {head.stdout.strip() or 'unknown commit'}"


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
    """One fresh module and patch set: add, apply, per call (runtime_check), revert (ours)."""
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
        out["apply"] = timed(patcher.apply)[1]
        missed = [i for i in range(n) if module.__dict__[f"f{i}"] is originals[i]]
        if missed or (not runtime_check and module.f0 is not repl["g0"]) or module.f0(1) != 1:
            raise RuntimeError(f"{side}: apply() left {len(missed)} of {n} targets unpatched")
        if runtime_check:
            for key, fn in (("call", module.f0), ("direct", repl["g0"])):
                timer = timeit.Timer("fn(1)", globals={"fn": fn})
                out[key] = timer.timeit(CALLS) / CALLS * 1e9
        if side == "ours":
            out["revert"] = timed(patcher.revert)[1]
            if any(module.__dict__[f"f{i}"] is not originals[i] for i in range(n)):
                raise RuntimeError("ours: revert() did not restore every original")
    finally:
        del sys.modules[name]
    return out


def summary(values: list[float], scale: float) -> dict[str, float]:
    return {"min": min(values) * scale, "median": statistics.median(values) * scale}


def run(reference: str | None, n: int, rounds: int, scaling: list[int]) -> dict[str, Any]:
    sides, origin = load_sides(reference)
    torch = sys.modules.get("torch")
    info = {
        "date": datetime.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "reference": origin,
        "modules": len(sys.modules),
        "torch": getattr(torch, "__version__", None),
        "n": n,
        "rounds": rounds,
        "calls": CALLS,
    }
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    tasks = [(side, variant) for side in sides for variant in VARIANTS]
    for _ in range(rounds):
        random.shuffle(tasks)
        for side, variant in tasks:
            result = measure(side, sides[side], n, variant == "runtime_check")
            samples.setdefault((side, variant), []).append(result)
    table: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for (side, variant), rows in samples.items():
        cell = table.setdefault(variant, {})
        for key in rows[0]:
            scale = 1e6 / n if key in ("add", "apply", "revert") else 1.0
            cell.setdefault(key, {})[side] = summary([r[key] for r in rows], scale)
        if variant == "runtime_check":
            call, direct = cell["call"][side], cell["direct"][side]
            cell.setdefault("overhead", {})[side] = {k: call[k] - direct[k] for k in call}

    sizes = sorted(set(scaling))
    series: dict[tuple[str, str], dict[int, list[float]]] = {}
    jobs = [(side, size) for side in sides for size in sizes]
    for _ in range(rounds):
        random.shuffle(jobs)
        for side, size in jobs:
            for key, seconds in measure(side, sides[side], size, False).items():
                series.setdefault((side, key), {}).setdefault(size, []).append(seconds)
    scaled: dict[str, dict[str, Any]] = {}
    for (side, key), by_size in sorted(series.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        best = {size: min(v) * 1e3 for size, v in by_size.items()}
        slope = None
        if len(sizes) > 1:
            lo, hi = sizes[0], sizes[-1]
            slope = math.log(best[hi] / best[lo]) / math.log(hi / lo)
        scaled[f"{side} {key}()"] = {"ms": best, "slope": slope}
    return {"info": info, "table": table, "scaling": scaled, "sizes": sizes}


def fmt(cell: dict[str, float] | None, digits: int) -> str:
    if cell is None:
        return "n/a"
    return f"{cell['min']:.{digits}f} ({cell['median']:.{digits}f})"


def markdown(results: dict[str, Any]) -> str:
    info, table = results["info"], results["table"]
    torch = f"torch {info['torch']} imported" if info["torch"] else "torch not imported"
    lines = [
        f"Measured {info['date']} on {info['cpus']} CPUs, Python {info['python']}, "
        f"N = {info['n']} patches, {info['rounds']} rounds: min over rounds (median).",
        f"Reference: mx_driving.patcher from {info['reference']}.",
        f"len(sys.modules) at measurement: {info['modules']} ({torch}; the reference imports "
        "torch at its own import, so both sides run in one process with the same modules).",
        "Logging: the reference's logger set above CRITICAL, its event actions 'silent' and "
        "its summary off; ours prints nothing. GC off during timed blocks.",
    ]
    rows = [
        ("add", "add() (µs/patch)", 3),
        ("apply", "apply() (µs/patch)", 3),
        ("revert", "revert() (µs/patch)", 3),
        ("direct", f"replacement called directly (ns/call, {info['calls']} calls)", 1),
        ("call", "patched mod.f0(1) (ns/call)", 1),
        ("overhead", "per call over the replacement, min - min (ns/call)", 1),
    ]
    for variant in VARIANTS:
        lines += ["", f"### {variant}", "", "| measure | ours | reference |", "|---|---|---|"]
        for key, label, digits in rows:
            cells = table[variant].get(key)
            if cells is None:
                continue
            ref = fmt(cells.get("reference"), digits)
            if key == "revert":
                ref = "n/a (cannot revert: `__exit__` does nothing)"
            lines.append(f"| {label} | {fmt(cells.get('ours'), digits)} | {ref} |")
    sizes = results["sizes"]
    lines += [
        "",
        "### scaling (plain; total ms, min over rounds; slope: log-log, "
        f"N = {sizes[0]} to {sizes[-1]}, 1.0 = linear)",
        "",
        "| measure | " + " | ".join(f"N = {s}" for s in sizes) + " | slope |",
        "|---|" + "---|" * (len(sizes) + 1),
    ]
    for label, row in results["scaling"].items():
        slope = "n/a" if row["slope"] is None else f"{row['slope']:.2f}"
        values = " | ".join(f"{row['ms'][s]:.2f}" for s in sizes)
        lines.append(f"| {label} | {values} | {slope} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", help="DrivingSDK work tree or bare git dir")
    parser.add_argument("--n", type=int, default=1000, help="patches per measurement")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scaling", default="1000,2000,5000", help="comma-separated N list")
    args = parser.parse_args()
    scaling = [int(s) for s in args.scaling.split(",") if s.strip()]
    print(markdown(run(args.reference, args.n, args.rounds, scaling)))


if __name__ == "__main__":
    main()
