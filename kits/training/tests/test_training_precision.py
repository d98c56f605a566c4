"""with_precision_check: replacements compared with their originals on live inputs."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from ascend_patch_core import AtomicPatch
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import Status


LAYERS = """
import torch


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class RunningMean(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.mean.mul_(0.9).add_(0.1 * x.detach().mean(0))
        self.calls += 1
        return x - self.mean


def noisy(x, p=0.5):
    return torch.nn.functional.dropout(x, p, training=True) * 2


def count_positive(x):
    return int((x > 0).sum())


def scale(x, factor):
    return x * factor
"""

FUSED = """
import torch


def rms_norm(self, x):
    # A fused-style formula: same maths, another evaluation order.
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rms_norm_wrong_eps(self, x):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, 1e-2)


def rms_norm_no_grad_through_variance(self, x):
    # Same forward values, wrong backward: the variance is treated as a constant.
    variance = x.detach().pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.eps))


def running_mean_in_place(self, x):
    self.mean.mul_(0.9).add_(0.1 * x.detach().mean(0))
    self.calls += 1
    x.sub_(self.mean)  # modifies its input in place: the original must see the pristine one
    return x


def noisy(x, p=0.5):
    return 2 * torch.nn.functional.dropout(x, p, training=True)


def count_positive(x):
    return int((x >= 0).sum())


def make_scale(offset):
    def scaled(x, factor):
        return x * factor + offset
    return scaled


class NotAFunction:
    pass
"""


@pytest.fixture
def pkg(make_package) -> str:
    return make_package({"layers.py": LAYERS, "fused.py": FUSED})


def rms_patch(pkg: str, replacement: str) -> AtomicPatch:
    return AtomicPatch(f"{pkg}.layers.RMSNorm.forward", f"{pkg}.fused:{replacement}")


def train_rms(pkg: str, steps: int = 3, device: str = "cpu", dtype=torch.float32) -> None:
    layers = __import__(f"{pkg}.layers", fromlist=["RMSNorm"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), layers.RMSNorm(16)).to(
        device=device, dtype=dtype
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 16, device=device, dtype=dtype)).pow(2).mean().backward()
        optimizer.step()


@pytest.mark.parametrize(
    ("replacement", "status"),
    [("rms_norm", Status.APPLIED), ("rms_norm_wrong_eps", Status.FAILED)],
)
def test_a_wrong_epsilon_is_flagged_and_a_correct_replacement_passes(
    pkg: str, patcher: Patcher, tmp_path: Path, replacement: str, status: Status
) -> None:
    """RMSNorm with eps 1e-2 instead of 1e-6 exceeds the float32 tolerance; the right one stays within it."""
    output = tmp_path / "precision.json"
    report = (
        patcher.add(rms_patch(pkg, replacement)).with_precision_check(output=str(output)).apply()
    )
    train_rms(pkg)
    record = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision")
    assert record.status is status
    result = record.as_dict()["precision"]
    assert result["calls"] == 3 and result["checked"] == 3
    atol, rtol = result["tolerances"]["float32"]
    if status is Status.FAILED:
        assert result["max_abs"] > 1e-3 and result["max_rel"] > 1e-3
        assert "EXCEEDS float32 tolerance" in (record.reason or "")
        assert record.name in report.get("precision_check").reason
        assert record.name in report.table()
    else:
        assert result["max_abs"] <= atol + rtol and result["exceeded"] == []
        assert result["grad_max_abs"] is not None and result["grad_max_abs"] <= 1e-4
    patcher.revert()
    written = json.loads(output.read_text())
    assert written["schema"] == "ascend-patch-precision/1"
    assert written["exceeded"] == ([record.name] if status is Status.FAILED else [])
    assert json.loads(report.to_json())["records"]  # the report stays JSON-able


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("exceeds", [False, True], ids=["right-eps", "wrong-eps"])
def test_under_the_emulator_npu_rms_norm_with_the_wrong_epsilon_is_flagged(
    make_package, npu_emulator, patcher: Patcher, exceeds: bool, dtype
) -> None:
    """The acceptance case: a torch_npu.npu_rms_norm replacement, run on (emulated) NPU tensors."""
    eps = "1e-2" if exceeds else "self.eps"
    pkg = make_package(
        {
            "layers.py": LAYERS,
            "fused.py": (
                "import torch_npu\n\n"
                "def rms_norm(self, x):\n"
                f"    return torch_npu.npu_rms_norm(x, self.weight, epsilon={eps})[0]\n"
            ),
        }
    )
    report = patcher.add(rms_patch(pkg, "rms_norm")).with_precision_check(first=2).apply()
    train_rms(pkg, device="npu", dtype=dtype)
    record = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision")
    assert record.status is (Status.FAILED if exceeds else Status.APPLIED), record.reason
    assert record.as_dict()["precision"]["dtypes"] == [str(dtype).removeprefix("torch.")]


def test_a_wrong_backward_is_flagged_through_the_input_gradients(
    pkg: str, patcher: Patcher
) -> None:
    """Same forward values, wrong gradient: only the gradient comparison exceeds (input and weight)."""
    report = (
        patcher.add(rms_patch(pkg, "rms_norm_no_grad_through_variance"))
        .with_precision_check()
        .apply()
    )
    train_rms(pkg)
    result = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision").as_dict()["precision"]
    assert result["max_abs"] == 0.0
    wheres = {e["where"] for e in result["exceeded"]}
    assert wheres and all(w.startswith("grad[") for w in wheres)
    assert "grad[x]" in wheres


def test_gradients_can_be_switched_off(pkg: str, patcher: Patcher) -> None:
    """gradients=False compares outputs only: the wrong backward goes unnoticed, as asked."""
    report = (
        patcher.add(rms_patch(pkg, "rms_norm_no_grad_through_variance"))
        .with_precision_check(gradients=False)
        .apply()
    )
    train_rms(pkg)
    record = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision")
    assert record.status is Status.APPLIED
    assert record.as_dict()["precision"]["grad_max_abs"] is None


def test_no_state_is_changed_twice_and_in_place_inputs_are_seen_pristine(
    pkg: str, patcher: Patcher
) -> None:
    """Buffers updated by the extra run are put back; the original gets the input before the replacement modified it."""
    layers = __import__(f"{pkg}.layers", fromlist=["RunningMean"])
    inputs = [torch.randn(4, 3) for _ in range(5)]
    reference = layers.RunningMean(3)
    for x in inputs:
        reference(x.clone())
    report = (
        patcher.add(
            AtomicPatch(f"{pkg}.layers.RunningMean.forward", f"{pkg}.fused:running_mean_in_place")
        )
        .with_precision_check(first=5)
        .apply()
    )
    checked = layers.RunningMean(3)
    for x in inputs:
        checked(x.clone())
    assert torch.equal(checked.mean, reference.mean)
    assert int(checked.calls) == 5
    record = report.get(f"{pkg}.layers.RunningMean.forward", kind="precision")
    assert record.status is Status.APPLIED, record.reason
    assert record.as_dict()["precision"]["checked"] == 5


def test_the_original_sees_the_live_rng_state_and_the_live_stream_is_untouched(
    pkg: str, patcher: Patcher
) -> None:
    """Dropout in both: same mask from the same RNG state; the program's random stream is as without the check."""
    torch.manual_seed(1)
    layers = __import__(f"{pkg}.layers", fromlist=["noisy"])
    unchecked = [layers.noisy(torch.ones(64)) for _ in range(3)]
    after_unchecked = torch.rand(3)
    report = (
        patcher.add(AtomicPatch(f"{pkg}.layers.noisy", f"{pkg}.fused:noisy"))
        .with_precision_check()
        .apply()
    )
    torch.manual_seed(1)
    checked = [layers.noisy(torch.ones(64)) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(checked, unchecked, strict=True))
    assert torch.equal(torch.rand(3), after_unchecked)
    record = report.get(f"{pkg}.layers.noisy", kind="precision")
    assert record.status is Status.APPLIED and record.as_dict()["precision"]["max_abs"] == 0.0


def test_first_and_every_choose_the_calls(pkg: str, patcher: Patcher) -> None:
    """first=2, every=3 over 10 calls checks calls 1, 2, 3, 6 and 9."""
    report = patcher.add(rms_patch(pkg, "rms_norm")).with_precision_check(first=2, every=3).apply()
    layers = __import__(f"{pkg}.layers", fromlist=["RMSNorm"])
    norm = layers.RMSNorm(4)
    with torch.no_grad():
        for _ in range(10):
            norm(torch.randn(2, 4))
    result = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision").as_dict()["precision"]
    assert (result["calls"], result["checked"]) == (10, 5)


def test_the_profile_function_goes_away_once_every_check_is_done(
    pkg: str, patcher: Patcher
) -> None:
    """With every=0, after the first N calls of every selected patch nothing observes calls any more."""
    patcher.add(rms_patch(pkg, "rms_norm")).with_precision_check(first=1).apply()
    layers = __import__(f"{pkg}.layers", fromlist=["RMSNorm"])
    assert sys.getprofile() is not None
    layers.RMSNorm(4)(torch.randn(2, 4))
    assert sys.getprofile() is None


def test_patches_selects_by_name_and_reports_unknown_names(pkg: str, patcher: Patcher) -> None:
    """Only the named patch is checked; a name matching nothing is a warning on the summary."""
    patcher.add(
        rms_patch(pkg, "rms_norm_wrong_eps"),
        AtomicPatch(f"{pkg}.layers.noisy", f"{pkg}.fused:noisy", name="noise"),
    ).with_precision_check(patches=["noise", "nonexistent"])
    report = patcher.apply()
    train_rms(pkg)
    kinds = [(r.kind, r.name) for r in report.records if r.kind == "precision"]
    assert kinds == [("precision", "noise")]
    summary = report.get("precision_check")
    patcher.revert()
    assert any("nonexistent" in w for w in summary.warnings)


def test_runtime_check_patches_are_checked_only_when_the_replacement_runs(
    pkg: str, patcher: Patcher
) -> None:
    """With runtime_check, calls that fall back to the original are not compared (nothing to compare)."""
    patch = AtomicPatch(
        f"{pkg}.layers.RMSNorm.forward",
        f"{pkg}.fused:rms_norm_wrong_eps",
        runtime_check=lambda self, x: x.shape[0] > 2,
    )
    report = patcher.add(patch).with_precision_check(first=5).apply()
    layers = __import__(f"{pkg}.layers", fromlist=["RMSNorm"])
    norm = layers.RMSNorm(4)
    norm(torch.randn(2, 4))  # falls back
    norm(torch.randn(3, 4))  # replacement
    result = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision").as_dict()["precision"]
    assert (result["calls"], result["checked"]) == (1, 1)
    assert result["exceeded"]


def test_closures_from_one_factory_are_told_apart(pkg: str, patcher: Patcher) -> None:
    """Two replacements sharing one code object (a factory's closures): each call goes to its own patch."""
    fused = __import__(f"{pkg}.fused", fromlist=["make_scale"])
    layers = __import__(f"{pkg}.layers", fromlist=["scale"])
    other = types.ModuleType(f"{pkg}.other")
    other.scale = layers.scale
    sys.modules[other.__name__] = other
    report = (
        patcher.add(
            AtomicPatch(f"{pkg}.layers.scale", fused.make_scale(0.0), name="exact"),
            AtomicPatch(f"{pkg}.other.scale", fused.make_scale(1.0), name="offset"),
        )
        .with_precision_check()
        .apply()
    )
    layers.scale(torch.ones(3), 2.0)
    other.scale(torch.ones(3), 2.0)
    assert report.get("exact", kind="precision").status is Status.APPLIED
    assert report.get("offset", kind="precision").status is Status.FAILED


def test_what_cannot_be_checked_is_reported_as_skipped(pkg: str, patcher: Patcher) -> None:
    """A class replacement and a result without tensors are skipped, each with its reason."""
    report = (
        patcher.add(
            AtomicPatch(f"{pkg}.layers.count_positive", f"{pkg}.fused:count_positive"),
            AtomicPatch(f"{pkg}.layers.RunningMean", f"{pkg}.fused:NotAFunction"),
        )
        .with_precision_check()
        .apply()
    )
    layers = __import__(f"{pkg}.layers", fromlist=["count_positive"])
    layers.count_positive(torch.zeros(3))
    counted = report.get(f"{pkg}.layers.count_positive", kind="precision")
    klass = report.get(f"{pkg}.layers.RunningMean", kind="precision")
    assert counted.status is Status.SKIPPED and "no tensor" in (counted.reason or "")
    assert klass.status is Status.SKIPPED and "is a class" in (klass.reason or "")


def test_thresholds_override_the_dtype_defaults(pkg: str, patcher: Patcher) -> None:
    """A loose float32 threshold lets the wrong epsilon pass: the thresholds are the user's call."""
    report = (
        patcher.add(rms_patch(pkg, "rms_norm_wrong_eps"))
        .with_precision_check(thresholds={torch.float32: (0.5, 0.5)})
        .apply()
    )
    train_rms(pkg)
    record = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision")
    assert record.status is Status.APPLIED
    assert record.as_dict()["precision"]["tolerances"]["float32"] == [0.5, 0.5]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"frist": 3}, "unknown option(s) frist"),
        ({"first": -1}, "first must be a non-negative int"),
        ({"first": 0, "every": 0}, "would check no call"),
        ({"thresholds": {"float32": 1e-3}}, "must be (atol, rtol)"),
        ({"msprobe": "yes"}, "msprobe must be True or a dict"),
        ({"msprobe": {"config": "x"}}, "unknown msprobe option(s) config"),
    ],
)
def test_bad_options_are_rejected_with_the_fix(patcher: Patcher, options, message: str) -> None:
    with pytest.raises(PatchDefinitionError) as error:
        patcher.with_precision_check(**options).apply()
    assert message in str(error.value)
    patcher.revert()


def test_another_profile_function_is_left_alone(pkg: str, patcher: Patcher) -> None:
    """A profiler that already uses sys.setprofile keeps it; the check says it could not start."""

    def other(frame, event, arg):
        return None

    sys.setprofile(other)
    try:
        report = patcher.add(rms_patch(pkg, "rms_norm")).with_precision_check().apply()
        assert sys.getprofile() is other
        summary = report.get("precision_check")
        assert summary.status is Status.SKIPPED and "another profile function" in (
            summary.reason or ""
        )
    finally:
        sys.setprofile(None)


def test_patches_applied_at_import_time_are_checked_from_their_first_call(
    make_package, patcher: Patcher
) -> None:
    """apply() first, import later (the usual order): the patch is watched before its first call."""
    pkg = make_package({"layers.py": LAYERS, "fused.py": FUSED})
    report = patcher.add(rms_patch(pkg, "rms_norm_wrong_eps")).with_precision_check(first=1).apply()
    assert f"{pkg}.layers" not in sys.modules
    layers = __import__(f"{pkg}.layers", fromlist=["RMSNorm"])
    layers.RMSNorm(4)(torch.randn(2, 4))
    result = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision").as_dict()["precision"]
    assert result["checked"] == 1 and result["exceeded"]


def test_without_mindstudio_probe_msprobe_says_how_to_get_it(pkg: str, patcher: Patcher) -> None:
    """msprobe=True without mindstudio-probe installed: a skipped record naming the right package."""
    from ascend_patch_training._msprobe import msprobe_missing

    if msprobe_missing() is None:
        pytest.skip("mindstudio-probe is installed here")
    report = patcher.with_precision_check(patches=(), msprobe=True).apply()
    record = report.get("msprobe")
    assert record.status is Status.SKIPPED
    assert "pip install mindstudio-probe" in (record.reason or "")


def test_msprobe_precision_debugger_runs_around_each_training_step(
    patcher: Patcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """start at the first forward, then stop/step/start at every step end, stop at revert (msprobe's loop protocol)."""
    calls: list[str] = []

    class PrecisionDebugger:
        def __init__(self, **kwargs):
            calls.append(f"init {sorted(kwargs.items())}")

        def start(self, model=None):
            calls.append(f"start {type(model).__name__}")

        def stop(self):
            calls.append("stop")

        def step(self):
            calls.append("step")

    package = types.ModuleType("msprobe")
    package.__path__ = []  # type: ignore[attr-defined]
    module = types.ModuleType("msprobe.pytorch")
    module.PrecisionDebugger = PrecisionDebugger  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "msprobe", package)
    monkeypatch.setitem(sys.modules, "msprobe.pytorch", module)
    monkeypatch.setattr("ascend_patch_training._session.msprobe_missing", lambda: None)
    report = patcher.with_precision_check(patches=(), msprobe={"dump_path": "d"}).apply()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    patcher.revert()
    assert calls == [
        "init [('dump_path', 'd')]",
        "start Linear",
        "stop",
        "step",
        "start Linear",
        "stop",
        "step",
        "start Linear",
        "stop",
    ]
    assert report.get("msprobe").status is Status.APPLIED


def test_a_patch_applied_after_the_checks_paused_is_still_checked(
    make_package, patcher: Patcher
) -> None:
    """The profile function leaves when the known patches are done, and comes back for one imported later."""
    first = make_package({"layers.py": LAYERS, "fused.py": FUSED})
    later = make_package({"layers.py": LAYERS, "fused.py": FUSED})
    report = (
        patcher.add(rms_patch(first, "rms_norm"), rms_patch(later, "rms_norm_wrong_eps"))
        .with_precision_check(first=1)
        .apply()
    )
    __import__(f"{first}.layers", fromlist=["RMSNorm"]).RMSNorm(4)(torch.randn(2, 4))
    later_layers = __import__(f"{later}.layers", fromlist=["RMSNorm"])
    later_layers.RMSNorm(4)(torch.randn(2, 4))
    assert report.get(f"{first}.layers.RMSNorm.forward", kind="precision").status is Status.APPLIED
    assert report.get(f"{later}.layers.RMSNorm.forward", kind="precision").status is Status.FAILED
    assert sys.getprofile() is None


def test_apply_revert_apply_starts_afresh(pkg: str, patcher: Patcher) -> None:
    """A second apply() after revert() checks again from the first call, with new records."""
    patcher.add(rms_patch(pkg, "rms_norm_wrong_eps")).with_precision_check(first=1)
    for _ in range(2):
        report = patcher.apply()
        layers = __import__(f"{pkg}.layers", fromlist=["RMSNorm"])
        layers.RMSNorm(4)(torch.randn(2, 4))
        record = report.get(f"{pkg}.layers.RMSNorm.forward", kind="precision")
        assert record.status is Status.FAILED and record.as_dict()["precision"]["checked"] == 1
        patcher.revert()
        assert sys.getprofile() is None
