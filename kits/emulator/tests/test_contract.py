"""The contract check: the torch_npu ops plugins call exist and bind in every supported version."""

from __future__ import annotations

import inspect
import os
import textwrap
import threading
from pathlib import Path

import ascend_patch_emulator as emulator
import pytest
from ascend_patch_emulator import CallRecorder
from ascend_patch_emulator import OpCall
from ascend_patch_emulator import available_mx_versions
from ascend_patch_emulator import available_versions
from ascend_patch_emulator import check_calls
from ascend_patch_emulator import check_plugin
from ascend_patch_emulator import check_plugins
from ascend_patch_emulator import format_mismatches
from ascend_patch_emulator import load_schemas
from ascend_patch_emulator import record_call
from ascend_patch_emulator import scan_sources
from ascend_patch_emulator import supported_versions
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


ALL = available_versions()
OLDEST = "2.1.0.post17"
FIRST_PARTY = {
    "torch": "ascend_patch_torch",
    "mmcv": "ascend_patch_mmcv",
    "transformers": "ascend_patch_transformers",
}


def write_plugin(tmp_path: Path, files: dict[str, str], name: str = "fakeplugin") -> Path:
    """A plugin package on disk (not installed); returns its folder."""
    root = tmp_path / name
    for rel, source in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return root


def found(check) -> set[tuple[str, str, str, str]]:
    return {(m.plugin, m.site, m.op, m.version) for m in check.mismatches}


# --------------------------------------------------------------------------- first-party plugins


def test_first_party_plugins_keep_their_torch_npu_contract():
    """Every op the three first-party plugins use exists and binds in each version they support."""
    checks = {check.plugin: check for check in check_plugins(FIRST_PARTY)}
    assert set(checks) == set(FIRST_PARTY)
    for name, check in checks.items():
        assert check.root.name == FIRST_PARTY[name]
        assert (check.root / "plugin.py").is_file()
        # No torch-npu requirement declared yet: every version with data is checked.
        assert check.versions == tuple(ALL)
        # Their mx_driving calls too, against every mx-driving version with data.
        assert check.mx_versions == tuple(available_mx_versions())
    mismatches = [m for check in checks.values() for m in check.mismatches]
    assert not mismatches, "\n" + format_mismatches(mismatches)


def test_check_plugins_names_what_is_not_installed():
    with pytest.raises(LookupError, match="no installed ascend-patch plugin named nope"):
        check_plugins(["nope"])


# --------------------------------------------------------------------------- static scan: mismatches


def test_wrong_keyword_is_reported_with_plugin_site_op_and_every_version(tmp_path):
    root = write_plugin(
        tmp_path,
        {
            "norm.py": """\
            import torch_npu


            def rms_norm(x, weight):
                return torch_npu.npu_rms_norm(x, weight, eps=1e-6)[0]
            """
        },
    )
    check = check_plugin(root, plugin="norms")
    assert found(check) == {("norms", "fakeplugin/norm.py:5", "npu_rms_norm", v) for v in ALL}
    first = check.mismatches[0]
    assert first.message == (
        f"npu_rms_norm: no keyword 'eps' (schema has 'epsilon') in torch_npu {first.version}"
    )
    assert str(first) == f"norms: fakeplugin/norm.py:5: {first.message}"


def test_too_many_positionals_is_reported(tmp_path):
    root = write_plugin(
        tmp_path, {"act.py": "import torch_npu\ny = torch_npu.npu_swiglu(1, -1, 2)\n"}
    )
    check = check_plugin(root)
    assert found(check) == {("fakeplugin", "fakeplugin/act.py:2", "npu_swiglu", v) for v in ALL}
    assert all(
        "npu_swiglu: takes at most 2 positional arguments but 3 were given" in m.message
        for m in check.mismatches
    )


def test_op_missing_in_an_older_version_is_reported_only_there(tmp_path):
    root = write_plugin(
        tmp_path, {"act.py": "from torch_npu import npu_clipped_swiglu\n\nnpu_clipped_swiglu(1)\n"}
    )
    (mismatch,) = check_plugin(root).mismatches
    assert (mismatch.site, mismatch.op, mismatch.version) == (
        "fakeplugin/act.py:3",
        "npu_clipped_swiglu",
        OLDEST,
    )
    later = ", ".join(v for v in ALL if v != OLDEST)
    assert mismatch.message == (
        f"npu_clipped_swiglu: no such op (it exists in {later}) in torch_npu {OLDEST}"
    )


def test_declared_versions_narrow_the_check(tmp_path):
    root = write_plugin(tmp_path, {"act.py": "import torch_npu\ntorch_npu.npu_clipped_swiglu(1)\n"})
    check = check_plugin(root, torch_npu=">=2.6")
    assert check.versions == tuple(v for v in ALL if v != OLDEST)
    assert check.mismatches == ()


def test_keyword_only_argument_passed_positionally_is_reported(tmp_path):
    root = write_plugin(
        tmp_path,
        {
            "act.py": """\
            import torch
            import torch_npu

            gelu = torch_npu.npu_gelu(1, "tanh")
            cast = torch.ops.npu.npu_format_cast(1, 2, None)
            """
        },
    )
    check = check_plugin(root)
    gelu = {(m.version, m.message) for m in check.mismatches if m.op == "npu_gelu"}
    assert gelu == {
        (
            v,
            "npu_gelu: takes at most 1 positional argument but 2 were given "
            f"('approximate' is keyword-only) in torch_npu {v}",
        )
        for v in ALL
    }
    # customize_dtype became keyword-only in 2.7.1.post8: older versions accept the call.
    cast = {m.version for m in check.mismatches if m.op == "npu_format_cast"}
    assert cast == {"2.9.0.post9", "2.12.0.post3", "2.13.0", "2.14.0"}
    assert all(
        "'customize_dtype' is keyword-only" in m.message
        for m in check.mismatches
        if m.op == "npu_format_cast"
    )


def test_keyword_added_in_a_later_version_fails_only_before_it(tmp_path):
    root = write_plugin(
        tmp_path,
        {
            "moe.py": "import torch_npu\ntorch_npu.npu_moe_finalize_routing(1, 2, 3, 4, 5, 6, 7, k=2)\n"
        },
    )
    assert {m.version for m in check_plugin(root).mismatches} == {OLDEST, "2.6.0.post5"}


def test_missing_required_duplicate_and_unknown_op_are_reported(tmp_path):
    root = write_plugin(
        tmp_path,
        {
            "bad.py": """\
            import torch_npu
            torch_npu.npu_rms_norm(1)
            torch_npu.npu_rms_norm(1, 2, input=3)
            torch_npu.npu_rms_nrom(1, 2)
            import torch
            torch.ops.npu.npu_rms_norm.nope(1, 2)
            """
        },
    )
    messages = {m.site: m.message for m in check_plugin(root).mismatches if m.version == "2.14.0"}
    assert messages == {
        "fakeplugin/bad.py:2": "npu_rms_norm: missing required argument 'gamma' in torch_npu 2.14.0",
        "fakeplugin/bad.py:3": (
            "npu_rms_norm: argument 'input' given by position and by keyword in torch_npu 2.14.0"
        ),
        "fakeplugin/bad.py:4": (
            "npu_rms_nrom: no such op (no version with data has it; did you mean 'npu_rms_norm'?)"
            " in torch_npu 2.14.0"
        ),
        "fakeplugin/bad.py:6": (
            "npu_rms_norm.nope: no such overload (overloads there: default) in torch_npu 2.14.0"
        ),
    }


# --------------------------------------------------------------------------- keyword names: input, not self


def _taking_input(version: str) -> list:
    return [
        op for op in load_schemas(version).values() if "input" in [a.name for a in op.arguments]
    ]


@pytest.mark.parametrize("version", ALL)
def test_input_binds_and_self_is_flagged_for_every_op_taking_input(version):
    """torch_npu registers its yaml's `self` as `input`: for every op overload (and every op
    packet) that takes an `input`, `input=` binds and `self=` in its place is a mismatch."""
    ops = _taking_input(version)
    assert len(ops) >= 171  # 122 (2.1) to 131 (2.9+) renamed from `self`, the rest the yaml's own
    for op in ops:
        required = [a.name for a in op.arguments if a.default is None]
        keywords = tuple(dict.fromkeys([*required, "input"]))
        as_self = tuple("self" if name == "input" else name for name in keywords)
        for overload in (op.overload, None):  # this overload; the op packet (any overload)
            good = OpCall(op.name, overload, "p.py:1", 0, keywords)
            assert check_calls("p", [good], [version]) == [], op.schema
            if overload is None and not all(
                "input" in [a.name for a in other.arguments]
                for other in load_schemas(version).values()
                if other.name == op.name
            ):
                continue  # another overload may bind `self=`-less calls; the overload case covers it
            (bad,) = check_calls("p", [OpCall(op.name, overload, "p.py:1", 0, as_self)], [version])
            assert "no keyword 'self' (schema has 'input'" in bad.message, (op.schema, bad)


def test_static_scan_flags_self_and_accepts_input_in_every_version(tmp_path):
    root = write_plugin(
        tmp_path,
        {
            "act.py": """\
            import torch
            import torch_npu
            from torch_npu import npu_rms_norm


            def forward(x, g):
                a = torch_npu.fast_gelu(input=x)
                b = torch_npu.fast_gelu(self=x)
                c = npu_rms_norm(input=x, gamma=g, epsilon=1e-6)
                d = torch.ops.npu.npu_rms_norm.default(self=x, gamma=g)
                return a, b, c, d
            """
        },
    )
    check = check_plugin(root)
    assert found(check) == {
        ("fakeplugin", f"fakeplugin/act.py:{line}", op, v)
        for line, op in ((8, "fast_gelu"), (10, "npu_rms_norm.default"))
        for v in ALL
    }
    messages = {m.site: m.message for m in check.mismatches if m.version == "2.14.0"}
    assert messages["fakeplugin/act.py:8"] == (
        "fast_gelu: no keyword 'self' (schema has 'input': torch_npu registers its yaml's "
        "'self' as 'input'); missing required argument 'input' in torch_npu 2.14.0"
    )


def test_several_outs_are_one_out_list_to_the_check(tmp_path):
    root = write_plugin(
        tmp_path,
        {
            "adam.py": """\
            import torch


            def step(s, g, var, m, v):
                torch.ops.npu.npu_apply_adam.out(s, s, s, s, s, s, g, None, None, out=[var, m, v])
                torch.ops.npu.npu_apply_adam.out(s, s, s, s, s, s, g, None, None, var=var, m=m, v=v)
            """
        },
    )
    check = check_plugin(root)
    assert {m.site for m in check.mismatches} == {"fakeplugin/adam.py:6"}
    assert {m.version for m in check.mismatches} == set(ALL)


def test_recorded_input_calls_pass_the_check(tmp_path):
    """Calls made with `input=` run under the emulator, are recorded and bind in every version."""
    import torch

    root = write_plugin(
        tmp_path,
        {
            "runtime.py": """\
            import torch_npu


            def forward(x):
                return torch_npu.fast_gelu(input=x), torch_npu.npu_swiglu(input=x, dim=0)
            """
        },
    )
    namespace: dict[str, object] = {}
    source = (root / "runtime.py").read_text(encoding="utf-8")
    was_active = emulator.is_active()
    handle = emulator.activate()
    try:
        exec(compile(source, str(root / "runtime.py"), "exec"), namespace)
        with CallRecorder() as recorder:
            namespace["forward"](torch.ones(2, 4))
    finally:
        if not was_active:
            handle.deactivate()
    # The dispatcher hands kernels their arguments by position: the names were checked by
    # torch when the call bound, and statically by the scan.
    assert [(c.op, c.positional) for c in recorder.calls] == [("fast_gelu", 1), ("npu_swiglu", 2)]
    check = check_plugin(root, recorded=recorder.calls)
    assert len(check.calls) == 4  # two found statically, two recorded
    assert not check.mismatches


# --------------------------------------------------------------------------- static scan: forms


def test_every_way_of_naming_an_op_is_found(tmp_path):
    source = """\
    import torch
    import torch as th
    import torch_npu
    import torch_npu as tnpu
    from torch_npu import npu_swiglu, npu_rotary_mul as rotary
    from ascend_patch_core import with_imports

    npu = torch.ops.npu
    fused = torch_npu.npu_fusion_attention


    @with_imports("torch_npu as tn", ("torch_npu", "npu_geglu as geglu", "npu_silu"))
    def forward(x, *rest, **options):
        torch_npu.npu_rms_norm(x, x, epsilon=1e-6)
        tnpu.npu_add_rms_norm(x, x, x)
        tn.fast_gelu(x)
        npu_swiglu(x, dim=-1)
        rotary(x, x, x)
        geglu(x)
        npu_silu(x)
        th.ops.npu.npu_gelu.default(x, approximate="tanh")
        npu.npu_max.dim(x, 1, keepdim=True)
        npu.npu_max(x, 1)
        fused(x, x, x, 8, "BNSD")
        getattr(torch_npu, "npu_mish")(x)
        torch_npu.npu_rms_norm(*rest, **options)
        torch_npu.npu.current_device()
        torch_npu.npu.synchronize()
        return torch.ops.npu.npu_swiglu


    REPLACEMENT = "torch_npu:npu_gemma_rms_norm"
    """
    root = write_plugin(tmp_path, {"forms.py": source})
    calls = {(c.target, int(c.site.rpartition(":")[2])) for c in scan_sources(root)}
    assert calls == {
        ("npu_fusion_attention", 9),
        ("npu_rms_norm", 14),
        ("npu_add_rms_norm", 15),
        ("fast_gelu", 16),
        ("npu_swiglu", 17),
        ("npu_rotary_mul", 18),
        ("npu_geglu", 19),
        ("npu_silu", 20),
        ("npu_gelu.default", 21),
        ("npu_max.dim", 22),
        ("npu_max", 23),
        ("npu_fusion_attention", 24),
        ("npu_mish", 25),
        ("npu_rms_norm", 26),
        ("npu_swiglu", 29),
        ("npu_gemma_rms_norm", 32),
    }
    by_line = {int(c.site.rpartition(":")[2]): c for c in scan_sources(root)}
    assert by_line[14].keywords == ("epsilon",) and by_line[14].positional == 2
    assert by_line[26].positional is None and by_line[26].more_keywords
    assert not by_line[9].called and not by_line[32].called and by_line[24].called
    # All of them are valid in every version (npu_fusion_attention with 5 positionals included).
    assert check_plugin(root).mismatches == ()


def test_a_contract_comment_limits_the_versions_of_guarded_calls(tmp_path):
    source = """\
    import torch_npu


    def clipped(x):  # contract: torch-npu>=2.6
        if hasattr(torch_npu, "npu_clipped_swiglu"):
            return torch_npu.npu_clipped_swiglu(x)
        return x


    def inline(x):
        return torch_npu.npu_clipped_swiglu(x)  # contract: torch-npu>=2.6


    def unguarded(x):
        return torch_npu.npu_clipped_swiglu(x)
    """
    root = write_plugin(tmp_path, {"guarded.py": source})
    assert [c.versions for c in scan_sources(root)] == [">=2.6", ">=2.6", ""]
    assert found(check_plugin(root)) == {
        ("fakeplugin", "fakeplugin/guarded.py:15", "npu_clipped_swiglu", OLDEST)
    }


def test_a_plugin_that_uses_no_torch_npu_passes_and_non_ops_are_ignored(tmp_path):
    root = write_plugin(
        tmp_path,
        {
            "plugin.py": "from ascend_patch_core import hookimpl\n",
            "devices.py": "import torch_npu\ntorch_npu.npu.set_device(0)\nx = torch_npu.__version__\n",
        },
    )
    check = check_plugin(root)
    assert check.calls == () and check.mismatches == ()


def test_unmatched_version_declaration_is_a_mismatch_and_bad_specifiers_raise(tmp_path):
    root = write_plugin(tmp_path, {"plugin.py": ""})
    (mismatch,) = check_plugin(root, torch_npu=">=9").mismatches
    assert "no torch_npu schema data matches torch-npu>=9" in mismatch.message
    with pytest.raises(ValueError, match="invalid torch-npu version specifier 'two'"):
        supported_versions("two")
    assert supported_versions("==2.1.*") == [OLDEST]
    assert supported_versions(None) == ALL


# --------------------------------------------------------------------------- installed plugins


def test_installed_plugin_declares_versions_in_its_distribution_metadata(tmp_path, monkeypatch):
    """A `torch-npu` requirement (here in an extra) sets the versions; the entry point names the plugin."""
    site = tmp_path / "site"
    write_plugin(
        site,
        {
            "plugin.py": "from ascend_patch_core import hookimpl\n",
            "gelu.py": "import torch_npu\n\ntorch_npu.npu_clipped_swiglu(1, 2)\n",
        },
        name="ascend_patch_contractdemo",
    )
    info = site / "ascend_patch_contractdemo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: ascend-patch-contractdemo\nVersion: 0.1\n"
        "Provides-Extra: npu\n"
        'Requires-Dist: torch-npu>=2.6; extra == "npu"\n',
        encoding="utf-8",
    )
    (info / "entry_points.txt").write_text(
        "[ascend_patch]\ncontractdemo = ascend_patch_contractdemo.plugin\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(site))
    (check,) = check_plugins(["contractdemo"])
    assert check.plugin == "contractdemo"
    assert check.root == site / "ascend_patch_contractdemo"
    assert check.versions == tuple(v for v in ALL if v != OLDEST)
    assert found(check) == {
        (
            "contractdemo",
            "ascend_patch_contractdemo/gelu.py:3",
            "npu_clipped_swiglu",
            v,
        )
        for v in check.versions
    }
    assert "takes at most 1 positional argument but 2 were given" in check.mismatches[0].message


# --------------------------------------------------------------------------- run-time recorder


def test_recorded_calls_are_attributed_to_the_plugin_file_and_checked(tmp_path):
    root = write_plugin(
        tmp_path,
        {
            "runtime.py": """\
            from ascend_patch_emulator import record_call


            def forward(x, g):
                record_call("npu_rms_norm", (x, g), {"eps": 1e-6})
                record_call("npu::npu_rms_norm.default", (x, g), {})
                record_call("npu_clipped_swiglu", (x,), {})  # contract: torch-npu>=2.6
            """
        },
    )
    namespace: dict[str, object] = {}
    source = (root / "runtime.py").read_text(encoding="utf-8")
    exec(compile(source, str(root / "runtime.py"), "exec"), namespace)
    forward = namespace["forward"]

    forward(1, 2)  # no recorder: nothing is kept
    with CallRecorder() as outer:
        with CallRecorder() as inner:
            for _ in range(3):
                forward(1, 2)
        record_call("npu_swiglu", (1,), {}, site=(str(tmp_path / "elsewhere.py"), 1))
    forward(1, 2)

    assert len(inner.calls) == 3  # each distinct call once, however often it ran
    assert [(c.op, c.overload, c.line) for c in inner.calls] == [
        ("npu_rms_norm", None, 5),
        ("npu_rms_norm", "", 6),
        ("npu_clipped_swiglu", None, 7),
    ]
    assert len(outer.calls) == 4
    check = check_plugin(root, recorded=outer.calls)
    assert check.calls[-1].site == "fakeplugin/runtime.py:7" and check.calls[-1].versions == ">=2.6"
    assert len(check.calls) == 3  # the call from elsewhere.py is not this plugin's
    assert found(check) == {
        ("fakeplugin", "fakeplugin/runtime.py:5", "npu_rms_norm", v) for v in ALL
    }


def test_recorder_skips_emulator_frames_to_find_the_caller(tmp_path):
    """The emulator's own dispatch frames are not the call site; the plugin line calling it is."""
    dispatch_file = os.path.join(os.path.dirname(emulator.__file__), "_fake_dispatch_for_test.py")
    namespace: dict[str, object] = {"record_call": record_call}
    exec(
        compile("def dispatch(op, *a, **k):\n    record_call(op, a, k)\n", dispatch_file, "exec"),
        namespace,
    )
    plugin_file = str(tmp_path / "caller.py")
    exec(
        compile(
            "def call(dispatch):\n    dispatch('npu_swiglu', 1, dim=-1)\n", plugin_file, "exec"
        ),
        namespace,
    )
    with CallRecorder() as recorder:
        namespace["call"](namespace["dispatch"])
    ((call),) = recorder.calls
    assert (call.file, call.line, call.positional, call.keywords) == (plugin_file, 2, 1, ("dim",))


def test_recorder_is_safe_across_threads():
    with CallRecorder() as recorder:

        def work(n):
            for i in range(200):
                record_call("npu_swiglu", (i,) * (i % 3), {}, site=("t.py", n))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(recorder.calls) == 8 * 3


# --------------------------------------------------------------------------- binding vs Python's binder


def _python_signature(schema) -> inspect.Signature:
    """The op's schema as a Python signature: Python binds calls by the same rules torch does."""
    parameters = [
        inspect.Parameter(
            a.name,
            inspect.Parameter.KEYWORD_ONLY
            if a.kwarg_only
            else inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=inspect.Parameter.empty if a.default is None else a.default,
        )
        for a in schema.arguments
    ]
    return inspect.Signature(parameters, __validate_parameters__=False)


_SCHEMAS_2_14 = sorted(load_schemas("2.14.0").values(), key=lambda s: s.qualified)


@st.composite
def calls_of_real_ops(draw):
    schema = draw(st.sampled_from(_SCHEMAS_2_14))
    names = [a.name for a in schema.arguments]
    if draw(st.booleans()):  # anything: mostly wrong
        positional = draw(st.integers(0, len(names) + 2))
        keywords = draw(
            st.lists(
                st.sampled_from([*names, "eps", "input", "self", "x_bogus"]),
                unique=True,
                max_size=4,
            )
        )
    else:  # near a valid call: required arguments given, a few optional ones by keyword
        positional_names = [a.name for a in schema.arguments if not a.kwarg_only]
        required = [
            i for i, a in enumerate(schema.arguments) if a.default is None and not a.kwarg_only
        ]
        positional = draw(st.integers(max(required, default=-1) + 1, len(positional_names)))
        rest = [a for a in schema.arguments[positional:]]
        keywords = [a.name for a in rest if a.default is None]
        keywords += draw(
            st.lists(
                st.sampled_from([a.name for a in rest] or ["x_bogus"]), unique=True, max_size=3
            )
        )
        keywords = list(dict.fromkeys(keywords))
    return schema, OpCall(schema.name, schema.overload, "s.py:1", positional, tuple(keywords))


@settings(max_examples=300)
@given(calls_of_real_ops())
def test_binding_verdict_matches_pythons_binder_on_real_schemas(case):
    """For any real 2.14 op and any call shape, a mismatch is reported exactly when Python's bind fails."""
    schema, call = case
    try:
        _python_signature(schema).bind(*range(call.positional), **dict.fromkeys(call.keywords))
        binds = True
    except TypeError:
        binds = False
    reported = check_calls("p", [call], ["2.14.0"])
    assert (not reported) == binds, (schema.schema, call, reported)


def test_a_bad_contract_comment_names_its_site(tmp_path):
    root = write_plugin(
        tmp_path, {"m.py": "import torch_npu\ntorch_npu.npu_swiglu(1)  # contract: torch-npu>>2\n"}
    )
    with pytest.raises(
        ValueError, match=r"fakeplugin: fakeplugin/m\.py:2: contract comment: invalid"
    ):
        check_plugin(root)


# --------------------------------------------------------------------------- mx_driving


MX = available_mx_versions()[-1]

MX_PLUGIN = """\
import importlib

import mx_driving
import mx_driving as mxd
from mx_driving import DeformConv2dFunction as DCF
from mx_driving import scatter_add
from mx_driving import scatter_sum

from . import kernel_source


def run(x, i, *rest, **options):
    mx_driving.multi_scale_deformable_attn(x, x, x, x, x)
    mxd.scatter_mean(x, i, None, 0, None)
    scatter_add(x, i)
    DCF.apply(x, x, x, 1, 0, 1, 1, 1, False, 32)
    kernel_source.mx_driving().npu_add_relu(x, x)
    mxd.Voxelization([1, 1, 1], [0] * 6, 5, max_voxels=3)
    mxd.npu_max_pool2d(x, 3, 2)
    kernel_source.mx_driving().scatter_max(x, i, None, 0)
    mxd.multi_scale_deformable_attention(x)
    scatter_add(x, i, dim=1)
    mxd.DeformConv2dFunction(x)
    mxd.Voxelization([1, 1, 1], [0] * 6, 5, max_voxel=3)
    mxd.scatter_add(*rest, **options)
    lazy = importlib.import_module("mx_driving")
    lazy.npu_add_relu(x)
    getattr(mxd, "npu_nothing")
    getattr(mxd, "npu_optional", None)
    return mxd.__file__, mxd.npu_deformable_aggregation


REPLACEMENT = "mx_driving:hypot"
"""


def test_mx_driving_uses_are_found_in_every_form(tmp_path):
    root = write_plugin(tmp_path, {"kernels.py": MX_PLUGIN})
    calls = [c for c in scan_sources(root) if c.library == "mx_driving"]
    assert {(c.target, int(c.site.rpartition(":")[2])) for c in calls} == {
        ("mx_driving.DeformConv2dFunction", 5),
        ("mx_driving.scatter_add", 6),
        ("mx_driving.scatter_sum", 7),
        ("mx_driving.multi_scale_deformable_attn", 13),
        ("mx_driving.scatter_mean", 14),
        ("mx_driving.scatter_add", 15),
        ("mx_driving.DeformConv2dFunction.apply", 16),
        ("mx_driving.npu_add_relu", 17),
        ("mx_driving.Voxelization", 18),
        ("mx_driving.npu_max_pool2d", 19),
        ("mx_driving.scatter_max", 20),
        ("mx_driving.multi_scale_deformable_attention", 21),
        ("mx_driving.scatter_add", 22),
        ("mx_driving.DeformConv2dFunction", 23),
        ("mx_driving.Voxelization", 24),
        ("mx_driving.scatter_add", 25),
        ("mx_driving.npu_add_relu", 27),
        ("mx_driving.npu_nothing", 28),
        ("mx_driving.npu_deformable_aggregation", 30),
        ("mx_driving.hypot", 33),
    }
    by_line = {int(c.site.rpartition(":")[2]): c for c in calls if c.called}
    assert by_line[16].positional == 10 and by_line[18].keywords == ("max_voxels",)
    assert by_line[25].positional is None and by_line[25].more_keywords


def test_mx_driving_calls_must_name_a_public_op_and_bind_to_its_signature(tmp_path):
    root = write_plugin(tmp_path, {"kernels.py": MX_PLUGIN})
    check = check_plugin(root)
    assert check.mx_versions == (MX,)
    site = "fakeplugin/kernels.py"
    assert found(check) == {
        ("fakeplugin", f"{site}:7", "mx_driving.scatter_sum", MX),
        ("fakeplugin", f"{site}:19", "mx_driving.npu_max_pool2d", MX),
        ("fakeplugin", f"{site}:20", "mx_driving.scatter_max", MX),
        ("fakeplugin", f"{site}:21", "mx_driving.multi_scale_deformable_attention", MX),
        ("fakeplugin", f"{site}:22", "mx_driving.scatter_add", MX),
        ("fakeplugin", f"{site}:23", "mx_driving.DeformConv2dFunction", MX),
        ("fakeplugin", f"{site}:24", "mx_driving.Voxelization", MX),
        ("fakeplugin", f"{site}:27", "mx_driving.npu_add_relu", MX),
        ("fakeplugin", f"{site}:28", "mx_driving.npu_nothing", MX),
    }
    messages = {m.site.rpartition(":")[2]: m.message for m in check.mismatches}
    assert all(m.library == "mx_driving" for m in check.mismatches)
    assert "missing a required argument: 'padding'" in messages["19"]
    assert "too many positional arguments" in messages["20"]
    assert "did you mean 'multi_scale_deformable_attn'" in messages["21"]
    assert "'out' skipped before a keyword through ScatterAddFunction.apply" in messages["22"]
    assert "autograd Function class: call mx_driving.DeformConv2dFunction.apply" in messages["23"]
    assert "unexpected keyword argument 'max_voxel'" in messages["24"]
    assert messages["19"].endswith(f"in mx_driving {MX}")
    text = format_mismatches(check.mismatches)
    assert f"{site}:19: mx_driving.npu_max_pool2d: missing a required argument" in text
    assert text.count(f"[mx_driving {MX}]") == len(check.mismatches)


def test_mx_driving_versions_come_from_the_requirement(tmp_path):
    root = write_plugin(tmp_path, {"kernels.py": "import mx_driving\nmx_driving.hypot(1, 2)\n"})
    assert check_plugin(root, mx_driving=f"=={MX}").mismatches == ()
    (problem,) = check_plugin(root, mx_driving=">=99").mismatches
    assert problem.library == "mx_driving" and "no mx_driving API data matches" in problem.message
    with pytest.raises(ValueError, match="mx-driving version specifier"):
        check_plugin(root, mx_driving="nonsense")
    clean = write_plugin(tmp_path, {"plain.py": "x = 1\n"}, name="plain")
    assert check_plugin(clean, mx_driving=">=99").mismatches == ()


def test_recorded_mx_driving_calls_are_checked(tmp_path, npu_emulator):
    """A call the scan cannot see (the name is a variable) is caught when it runs."""
    import torch

    root = write_plugin(
        tmp_path,
        {
            "dynamic.py": """\
            import mx_driving

            NAME = "scatter_add"


            def run(src, index):
                kernel = getattr(mx_driving, NAME, None)
                return kernel(src, index, dim=0)
            """
        },
    )
    namespace: dict[str, object] = {}
    path = root / "dynamic.py"
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    missing_out = pytest.raises(TypeError, match="missing required argument: 'out'")
    with CallRecorder() as recorder, missing_out:
        namespace["run"](torch.ones(3, device="npu"), torch.zeros(3, dtype=torch.int32))
    (call,) = [c for c in recorder.calls if c.library == "mx_driving"]
    assert (call.op, call.positional, call.keywords, call.line) == ("scatter_add", 2, ("dim",), 8)
    check = check_plugin(root, recorded=recorder.calls)
    assert found(check) == {("fakeplugin", "fakeplugin/dynamic.py:8", "mx_driving.scatter_add", MX)}
    assert "'out' skipped before a keyword" in check.mismatches[0].message
