"""The emulated mx_driving: every public name with the wheel's signature, served only while
the emulator is on and no real mx_driving is importable, stand-ins that say what is missing."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from ascend_patch_emulator import CallRecorder
from ascend_patch_emulator import KernelNotImplementedError
from ascend_patch_emulator import activate
from ascend_patch_emulator import available_mx_versions
from ascend_patch_emulator import deactivate
from ascend_patch_emulator import is_active
from ascend_patch_emulator import load_mx_api
from ascend_patch_emulator._mx_data import mx_data_source
from ascend_patch_emulator._mx_kernels import implementations


ROOT = Path(__file__).resolve().parents[3]
VERSION = available_mx_versions()[-1]
API = load_mx_api(VERSION)
IMPLEMENTED = sorted(implementations())
#: The names the mmcv and torch plugins call (issue 13 §2); each needs a kernel.
CALLED_BY_PLUGINS = {
    "multi_scale_deformable_attn",
    "MultiScaleDeformableAttnFunction",
    "deform_conv2d",
    "DeformConv2dFunction",
    "modulated_deform_conv2d",
    "ModulatedDeformConv2dFunction",
    "npu_add_relu",
    "npu_max_pool2d",
    "scatter_add",
    "scatter_mean",
    "scatter_max",
    "voxelization",
    "Voxelization",
    "sigmoid_focal_loss",
}


def _shown(signature: inspect.Signature) -> list[tuple[str, object, str]]:
    return [(p.name, p.kind, repr(p.default)) for p in signature.parameters.values()]


def _strip_ctx(signature: inspect.Signature) -> inspect.Signature:
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def test_the_data_names_its_wheel_and_the_public_api():
    wheel, digest = mx_data_source(VERSION)
    assert wheel == f"mx_driving-{VERSION}-cp311-cp311-manylinux2014_x86_64.whl"
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert len(API) == 86
    scatter_add = API["scatter_add"]
    assert (scatter_add.kind, scatter_add.function_class) == ("apply", "ScatterAddFunction")
    assert str(scatter_add.signature) == "(src, index, out=None, dim=0, dim_size=None)"
    assert API["DeformConv2dFunction"].kind == "autograd_function"
    assert API["Voxelization"].kind == "module"
    assert str(API["Voxelization"].forward) == "(points: 'torch.Tensor')"
    assert set(IMPLEMENTED) >= CALLED_BY_PLUGINS


def test_every_public_name_is_served_with_its_signature(npu_emulator):
    import mx_driving

    assert sorted(mx_driving.__all__) == sorted(API)
    for name, entry in API.items():
        value = getattr(mx_driving, name)
        if entry.kind == "autograd_function":
            assert issubclass(value, torch.autograd.Function), name
            assert _shown(_strip_ctx(inspect.signature(value.forward))) == _shown(
                entry.signature
            ), name
        elif entry.call_signature is not None:
            assert _shown(inspect.signature(value)) == _shown(entry.call_signature), name
            assert str(inspect.signature(value)) == str(entry.call_signature), name
        if entry.kind == "module":
            assert issubclass(value, torch.nn.Module), name


def test_a_name_without_a_kernel_binds_then_says_what_exists(npu_emulator):
    import mx_driving

    with pytest.raises(TypeError, match="geom_feat"):
        mx_driving.bev_pool(torch.zeros(1))
    with pytest.raises(NotImplementedError) as caught:
        mx_driving.bev_pool(*[torch.zeros(1)] * 2, 1, 1, 1, 1)
    message = str(caught.value)
    assert isinstance(caught.value, KernelNotImplementedError)
    assert "mx_driving.bev_pool" in message and "emulated mx_driving" in message
    assert "multi_scale_deformable_attn" in message and "scatter_max" in message
    with pytest.raises(NotImplementedError, match=r"mx_driving\.FftConv1dFunction"):
        mx_driving.FftConv1dFunction.apply(torch.zeros(2), torch.zeros(2))
    with pytest.raises(NotImplementedError, match=r"mx_driving\.SparseConv3d.*emulated mx_driving"):
        mx_driving.SparseConv3d(4, 8, 3)
    with pytest.raises(NotImplementedError, match=r"mx_driving\.npu_rotated_iou"):
        mx_driving.npu_rotated_iou(torch.zeros(1))
    with pytest.raises(AttributeError, match="only the public names"):
        mx_driving._C  # noqa: B018


def test_served_only_while_active_and_calls_are_recorded(npu_emulator, tmp_path):
    import mx_driving

    assert mx_driving.__emulated__ and sys.modules["mx_driving"] is mx_driving
    caller = tmp_path / "caller.py"
    caller.write_text(
        "import mx_driving\n\ndef run(x):\n    return mx_driving.npu_add_relu(x, x)\n",
        encoding="utf-8",
    )
    spec = importlib.util.spec_from_file_location("mx_caller", caller)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with CallRecorder() as recorder:
        module.run(torch.ones(2, device="npu"))
    (call,) = [c for c in recorder.calls if c.library == "mx_driving"]
    assert (call.op, call.positional, call.file, call.line) == (
        "npu_add_relu",
        2,
        str(caller),
        4,
    )


def test_deactivation_removes_it_and_kernels_refuse_afterwards():
    was_active = is_active()
    if was_active:
        pytest.skip("the emulator is active for the whole session here")
    handle = activate()
    import mx_driving

    add_relu = mx_driving.npu_add_relu
    handle.deactivate()
    assert "mx_driving" not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module("mx_driving")
    with pytest.raises(RuntimeError, match="not active"):
        add_relu(torch.ones(1), torch.ones(1))


def test_a_real_mx_driving_is_left_alone(tmp_path, monkeypatch):
    if is_active():
        pytest.skip("the emulator is active for the whole session here")
    package = tmp_path / "site" / "mx_driving"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("REAL = True\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    with activate():
        import mx_driving

        assert getattr(mx_driving, "REAL", False) and not hasattr(mx_driving, "__emulated__")
    sys.modules.pop("mx_driving", None)


def test_the_mmcv_plugin_kernel_source_chooses_and_reaches_it(npu_emulator):
    _kernel_source = pytest.importorskip("ascend_patch_mmcv._kernel_source")
    _kernel_source.forget_choices()
    try:
        assert _kernel_source.choose("multi_scale_deformable_attn") == _kernel_source.MX_DRIVING
        module = _kernel_source.mx_driving()
        assert module is sys.modules["mx_driving"] and module.__emulated__
    finally:
        _kernel_source.forget_choices()


# --------------------------------------------------------------------------- the generator


def _wheel(tmp_path: Path, files: dict[str, str]) -> Path:
    wheel = tmp_path / "mx_driving-9.9.9-cp311-cp311-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(f"mx_driving/{name}", textwrap.dedent(text))
    return wheel


def test_the_generator_reads_kinds_and_signatures_without_importing(tmp_path):
    wheel = _wheel(
        tmp_path,
        {
            "__init__.py": """\
                __all__ = ["op", "Op", "plain", "Layer", "Child", "thing", "compiled", "Box"]
                import torch_npu  # never run
                from .ops.op import Op, op
                from .ops.plain import plain as plain
                from .modules.layer import Layer, Child
                from .ops.thing import thing
                from .ops import compiled_ops
                compiled = compiled_ops.compiled
                from .box import Box
            """,
            "ops/__init__.py": "",
            "ops/op.py": """\
                from torch.autograd import Function
                class Op(Function):
                    @staticmethod
                    def forward(ctx, a, b: int = 2, *rest, key=None, **kw):
                        raise SystemExit("run")
                op = Op.apply
            """,
            "ops/plain.py": "def plain(x, /, y=(1, 2), *, z=2 ** 0.5):\n    pass\n",
            "modules/__init__.py": "",
            "modules/layer.py": """\
                import torch.nn as nn
                class Layer(nn.Module):
                    def __init__(self, size, scale=1.0):
                        super().__init__()
                    def forward(self, points):
                        return points
                class Child(Layer):
                    pass
            """,
            "ops/thing.py": """\
                from torch.nn import Module
                class Thing(Module):
                    def forward(self, box1, box2):
                        pass
                thing = Thing()
            """,
            "ops/compiled_ops.py": "import mx_driving._C\ncompiled = mx_driving._C.compiled\n",
            "box.py": "class Box:\n    def __init__(self, corners):\n        pass\n",
        },
    )
    out = tmp_path / "out"
    command = [
        sys.executable,
        str(ROOT / "tools" / "mx_driving_signatures.py"),
        "9.9.9",
        "--cache",
        str(tmp_path),
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True)
    data = json.loads((out / "mx_driving-9.9.9.json").read_text(encoding="utf-8"))
    assert data["source"] == wheel.name and data["mx_driving"] == "9.9.9"
    rows = {row["name"]: row for row in data["names"]}
    assert rows["op"]["kind"] == "apply" and rows["op"]["function_class"] == "Op"
    assert [(p["name"], p["kind"], p.get("default")) for p in rows["op"]["signature"]] == [
        ("a", "POSITIONAL_OR_KEYWORD", None),
        ("b", "POSITIONAL_OR_KEYWORD", "2"),
        ("rest", "VAR_POSITIONAL", None),
        ("key", "KEYWORD_ONLY", "None"),
        ("kw", "VAR_KEYWORD", None),
    ]
    assert rows["op"]["signature"][1]["annotation"] == "int"
    assert rows["Op"]["kind"] == "autograd_function"
    assert [p["kind"] for p in rows["plain"]["signature"]] == [
        "POSITIONAL_ONLY",
        "POSITIONAL_OR_KEYWORD",
        "KEYWORD_ONLY",
    ]
    assert rows["plain"]["signature"][2]["default"] == "2 ** 0.5"
    assert rows["Layer"]["kind"] == "module" and rows["Child"]["kind"] == "module"
    assert [p["name"] for p in rows["Child"]["init"]] == ["size", "scale"]
    assert [p["name"] for p in rows["Child"]["forward"]] == ["points"]
    assert rows["thing"]["kind"] == "instance" and rows["thing"]["class"] == "Thing"
    assert [p["name"] for p in rows["thing"]["signature"]] == ["box1", "box2"]
    assert rows["compiled"]["kind"] == "object"
    assert rows["Box"]["kind"] == "class" and rows["Box"]["init"][0]["name"] == "corners"
    check = subprocess.run([*command, "--check"], capture_output=True, text=True)
    assert check.returncode == 0 and "up to date" in check.stdout


_OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|ConnectTimeout|Read timed out|"
    r"ProxyError|Max retries exceeded|No route to host|Connection refused"
)


@pytest.mark.network
@pytest.mark.slow
def test_regenerating_from_the_wheel_reproduces_the_committed_data():
    """Download the wheel (7.7 MB; cached in the temp folder) and compare, byte for byte."""
    script = ROOT / "tools" / "mx_driving_signatures.py"
    result = subprocess.run(
        [sys.executable, str(script), VERSION, "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    offline = _OFFLINE.search(output)
    if result.returncode != 0 and offline:
        pytest.skip(f"PyPI is unreachable (pip: {offline.group(0)})")
    assert result.returncode == 0, output
    assert "up to date" in result.stdout


def test_deactivate_is_idempotent_here():
    # Leaves the process as the other modules expect it (no emulator unless they start one).
    if not is_active():
        deactivate()
        assert not is_active()


def test_stand_ins_are_marked_and_kernels_are_not():
    """Code that picks a kernel (the mmcv plugin) tells a stand-in from a kernel without calling it."""
    with activate():
        import mx_driving

        marked = {
            name
            for name in mx_driving.__all__
            if getattr(getattr(mx_driving, name), "__ascend_patch_stand_in__", False)
        }
        for kernel in ("multi_scale_deformable_attn", "deform_conv2d", "sigmoid_focal_loss"):
            assert kernel not in marked
        for stand_in in ("SparseConv3d", "SubMConv3d", "dynamic_scatter", "knn"):
            assert stand_in in marked
