"""The committed torch_npu schema data: its shape, the torch-free argument parser, the generator.

The network test regenerates one version from its PyPI wheel and compares it with
the committed file byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
from ascend_patch_emulator import DEFAULT_VERSION
from ascend_patch_emulator import Argument
from ascend_patch_emulator import available_versions
from ascend_patch_emulator import load_schemas
from ascend_patch_emulator import parse_arguments
from hypothesis import given
from hypothesis import strategies as st


ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "kits" / "emulator" / "ascend_patch_emulator" / "data"
REQUIRED = ["2.1.0.post17", "2.6.0.post5", "2.9.0.post9", "2.12.0.post3", "2.13.0", "2.14.0"]


@pytest.fixture(scope="module")
def extractor() -> ModuleType:
    """tools/extract_npu_schemas.py, imported from its path (tools/ is not a package)."""
    path = ROOT / "tools" / "extract_npu_schemas.py"
    spec = importlib.util.spec_from_file_location("extract_npu_schemas", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def torchgen_model() -> ModuleType:
    import torchgen.model  # ships with torch, a test requirement

    return torchgen.model


# --------------------------------------------------------------------------- committed data


def test_committed_versions_are_the_generators_list(extractor):
    """Every required version has data, and the data folder holds exactly the script's versions."""
    assert set(REQUIRED) <= set(available_versions())
    assert available_versions() == list(extractor.VERSIONS)
    assert DEFAULT_VERSION in available_versions()


def test_data_files_are_compact_and_one_op_per_line():
    """Files total under 1.5 MB; each op is one line, sorted, and the header names the version and wheel."""
    files = sorted(DATA.glob("torch_npu-*.json"))
    assert {f.name for f in files} >= {f"torch_npu-{v}.json" for v in REQUIRED}, DATA
    assert sum(f.stat().st_size for f in files) < 1_500_000
    for path in files:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
        version = path.name[len("torch_npu-") : -len(".json")]
        assert data["format"] == 2
        assert data["torch_npu"] == version
        assert re.fullmatch(rf"torch_npu-{re.escape(version)}-cp311-.*\.whl", data["source"])
        op_lines = [line for line in text.splitlines() if line.startswith('{"name": ')]
        assert len(op_lines) == len(data["ops"])
        keys = [(op["name"], op["overload"]) for op in data["ops"]]
        assert keys == sorted(keys)
        assert len(set(keys)) == len(keys)


@pytest.mark.parametrize("version", REQUIRED)
def test_every_committed_schema_parses_as_torch_registers_it_and_matches_its_row(version):
    """Name and overload of each row are what torch's schema parser (``m.def``'s) reads."""
    import torch

    for key, op in load_schemas(version).items():
        parsed = torch._C.parse_schema(op.schema)
        assert (parsed.name, parsed.overload_name) == (op.name, op.overload)
        assert key == op.qualified
        assert op.section in ("custom", "autograd", "symint")


@pytest.mark.parametrize("version", REQUIRED)
def test_no_committed_schema_names_an_argument_self(version):
    """torch_npu registers the yaml's ``self`` as ``input``; the data holds the registered names."""
    for op in load_schemas(version).values():
        assert "self" not in [a.name for a in op.arguments], op.schema
    data = json.loads((DATA / f"torch_npu-{version}.json").read_text(encoding="utf-8"))
    assert not any(re.search(r"\bself\b", row["schema"]) for row in data["ops"])


def test_the_rename_reaches_every_op_the_yaml_declares_with_self():
    """The yaml gives 131 of the 425 2.14 ops (122 of 321 in 2.1) a ``self``; 60 (49) name an
    ``input`` of their own. All of them now take ``input``, and only the yaml's ``self`` moved."""
    for version, expected in (("2.1.0.post17", 122 + 49), ("2.14.0", 131 + 60)):
        taking_input = [op for op in load_schemas(version).values() if "input" in _names(op)]
        assert len(taking_input) == expected, version

    def names(op):
        return _names(load_schemas("2.14.0")[op])

    assert names("fast_gelu") == ["input"]
    assert names("npu_rms_norm") == ["input", "gamma", "epsilon"]
    assert names("npu_format_cast")[:3] == ["input", "acl_format", "customize_dtype"]
    assert load_schemas("2.14.0")["npu_silu_"].arguments[0] == Argument(
        "input", "Tensor(a!)", None, False
    )


def _names(op) -> list[str]:
    return [a.name for a in op.arguments]


@pytest.mark.parametrize("version", REQUIRED)
def test_torch_free_argument_parser_agrees_with_torchgen(version):
    """For every committed op: same argument names, types, defaults and keyword-only flags as torchgen."""
    model = torchgen_model()
    for op in load_schemas(version).values():
        assert [_render(a) for a in op.arguments] == _torchgen_view(model, op.schema), op.schema


def test_op_counts_and_known_drift_across_versions():
    """Facts read from the wheels (docs: reference torch_npu §1, §4) hold in the data."""
    counts = {v: len(load_schemas(v)) for v in REQUIRED}
    assert counts == {
        "2.1.0.post17": 321,
        "2.6.0.post5": 337,
        "2.9.0.post9": 425,
        "2.12.0.post3": 425,
        "2.13.0": 425,
        "2.14.0": 425,
    }

    def names(version, op):
        return [a.name for a in load_schemas(version)[op].arguments]

    # npu_rotary_mul gained `rotate` in 2.7.1.post8.
    assert names("2.6.0.post5", "npu_rotary_mul") == ["input", "r1", "r2", "rotary_mode"]
    assert names("2.9.0.post9", "npu_rotary_mul")[-1] == "rotate"
    # npu_fusion_attention: softmax_layout (2.1.0.post17), sink (2.6.0.post5), dropout_mask.. (2.7.1.post8).
    assert names("2.1.0.post17", "npu_fusion_attention")[-1] == "softmax_layout"
    assert names("2.6.0.post5", "npu_fusion_attention")[-1] == "sink"
    assert names("2.14.0", "npu_fusion_attention")[-3:] == ["dropout_mask", "seed", "offset"]
    # npu_format_cast's customize_dtype became keyword-only in 2.7.1.post8.
    cast = {a.name: a for a in load_schemas("2.6.0.post5")["npu_format_cast"].arguments}
    assert not cast["customize_dtype"].kwarg_only
    cast = {a.name: a for a in load_schemas("2.9.0.post9")["npu_format_cast"].arguments}
    assert cast["customize_dtype"].kwarg_only
    rms = load_schemas("2.14.0")["npu_rms_norm"].arguments
    assert rms[-1] == Argument("epsilon", "float", "1e-06", False)
    # The 2.13 and 2.14 custom-op yaml are the same after parsing.
    assert load_schemas("2.13.0") == load_schemas("2.14.0")


def test_dimname_overloads_are_skipped_with_the_reason():
    """≤2.12 wheels carry three Dimname overloads torchgen (and torch.library) reject; 2.13+ have none."""
    for version in REQUIRED:
        data = json.loads((DATA / f"torch_npu-{version}.json").read_text(encoding="utf-8"))
        skipped = sorted(row["schema"].split("(")[0] for row in data["skipped"])
        if version in ("2.13.0", "2.14.0"):
            assert skipped == []
        else:
            assert skipped == ["empty_with_format.names", "npu_max.names_dim", "npu_min.names_dim"]
            assert all("Dimname" in row["reason"] for row in data["skipped"])
            assert "npu_max.names_dim" not in load_schemas(version)
            assert "npu_max.dim" in load_schemas(version)


# --------------------------------------------------------------------------- the argument parser


def test_parse_arguments_reads_brackets_quotes_annotations_and_the_star():
    schema = (
        'f.out(Tensor(a!) self, int[4] dilation=[1,1,1,1], str sep=",", *, '
        "str mode='a, b', float? scale=None, Tensor(b!) out) -> Tensor(b!)"
    )
    assert parse_arguments(schema) == (
        Argument("self", "Tensor(a!)", None, False),
        Argument("dilation", "int[4]", "[1,1,1,1]", False),
        Argument("sep", "str", '","', False),
        Argument("mode", "str", "'a, b'", True),
        Argument("scale", "float?", "None", True),
        Argument("out", "Tensor(b!)", None, True),
    )
    assert parse_arguments("npu_get_float_status() -> Tensor") == ()


@pytest.mark.parametrize(
    "bad", ["no_parens -> Tensor", "f(Tensor self -> Tensor", "f(Tensor) -> Tensor"]
)
def test_parse_arguments_rejects_what_is_not_a_schema(bad):
    with pytest.raises(ValueError, match=r"^(not an op schema|cannot read argument)"):
        parse_arguments(bad)


_TYPES = [
    "Tensor",
    "Tensor?",
    "Tensor[]",
    "int",
    "int[2]",
    "int[]?",
    "float",
    "bool",
    "str",
    "SymInt[]",
    "Scalar",
]
_DEFAULTS = {
    "Tensor?": ["None"],
    "int[]?": ["None", "[1,2]"],
    "int": ["0", "-1", "2147483647"],
    "int[2]": ["[1,1]", "1"],
    "float": ["1.", "1e-06", "0.5"],
    "bool": ["True", "False"],
    "str": ["'half'", '"BSND"', '""', "'a,b'"],
    "SymInt[]": ["[]"],
    "Scalar": ["1"],
}


@st.composite
def schemas(draw):
    count = draw(st.integers(0, 6))
    names = draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
            min_size=count,
            max_size=count,
            unique=True,
        )
    )
    star = draw(st.integers(0, count))
    arguments = []
    for index, name in enumerate(names):
        type_ = draw(st.sampled_from(_TYPES))
        default = None
        if type_ in _DEFAULTS and draw(st.booleans()):
            default = draw(st.sampled_from(_DEFAULTS[type_]))
        arguments.append(Argument(f"a_{name}", type_, default, index >= star))
    parts = [_declaration(a) for a in arguments]
    if star < count:
        parts.insert(star, "*")
    return f"op_x({', '.join(parts)}) -> Tensor", tuple(arguments)


@given(schemas())
def test_parse_arguments_round_trips_generated_schemas_like_torchgen(case):
    """Any generated schema: the parser returns what was written, and torchgen reads the same."""
    schema, arguments = case
    assert parse_arguments(schema) == arguments
    model = torchgen_model()
    assert [_render(a) for a in arguments] == _torchgen_view(model, schema)


def _declaration(argument: Argument) -> str:
    """The argument as a schema writes it: ``type name[=default]``."""
    text = f"{argument.type} {argument.name}"
    return text if argument.default is None else f"{text}={argument.default}"


def _render(argument: Argument) -> str:
    """The declaration, starred when keyword-only: what both parsers are compared on."""
    return f"{'*' if argument.kwarg_only else ''}{_declaration(argument)}"


def _torchgen_view(model, schema: str) -> list[str]:
    # Only the arguments: torchgen's whole-schema check refuses an in-place op that returns
    # a mutated argument not named ``self`` (``_npu_index_add_(Tensor(a!) input, ...)``),
    # which is how torch_npu registers it and torch's own parser accepts.
    declaration = schema.rsplit(") -> ", maxsplit=1)[0]
    parsed = model.Arguments.parse(declaration.split("(", maxsplit=1)[1])
    keyword_only = {a.name for a in parsed.flat_kwarg_only}
    keyword_only |= {a.name for a in parsed.out}
    return [f"{'*' if a.name in keyword_only else ''}{a}" for a in parsed.flat_all]


# --------------------------------------------------------------------------- the generator


SYNTHETIC_YAML = """\
backend: NPU
cpp_namespace: at_npu::native
supported:
  - add.Tensor
custom:
  - func: npu_b(Tensor self, *, float eps=1e-06) -> Tensor
    exposed: True
  - func: npu_a.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
  - func: npu_a(Tensor self) -> Tensor
  - func: npu_max.names_dim(Tensor self, Dimname dim, bool keepdim=False) -> (Tensor values, Tensor indices)
autograd:
  - func: npu_c(Tensor x) -> Tensor
symint:
  - as_strided_
  - func: npu_a(Tensor self) -> Tensor
    exposed: True
"""


def test_generator_merges_symint_repeats_skips_bare_names_and_records_unparsable(extractor):
    import yaml  # noqa: F401  (a test requirement: missing must fail, not skip)

    torchgen_model()
    ops, skipped = extractor.parse_entries(SYNTHETIC_YAML)
    assert [(e.name, e.overload, e.section, e.exposed) for e in ops] == [
        ("npu_a", "", "custom", True),  # the symint repeat made it exposed, not a second row
        ("npu_a", "out", "custom", False),
        ("npu_b", "", "custom", True),
        ("npu_c", "", "autograd", False),
    ]
    assert [row["schema"].split("(")[0] for row in skipped] == ["npu_max.names_dim"]
    assert "Dimname" in skipped[0]["reason"]
    # Stored as registered: the yaml's `self` is `input`; skipped rows keep the yaml's text.
    assert [e.schema for e in ops][:3] == [
        "npu_a(Tensor input) -> Tensor",
        "npu_a.out(Tensor input, *, Tensor(a!) out) -> Tensor(a!)",
        "npu_b(Tensor input, *, float eps=1e-06) -> Tensor",
    ]
    assert "Tensor self" in skipped[0]["schema"]

    text = extractor.render("9.9.9", "torch_npu-9.9.9-cp311-x.whl", ops, skipped)
    data = json.loads(text)
    assert data["torch_npu"] == "9.9.9" and len(data["ops"]) == 4
    lines = text.splitlines()
    assert lines[1:2] + lines[3:5] + lines[-1:] == ['"skipped": [', "],", '"ops": [', "]}"]
    assert [json.loads(line.rstrip(","))["name"] for line in lines[5:-1]] == [
        "npu_a",
        "npu_a",
        "npu_b",
        "npu_c",
    ]


def test_generator_renames_self_exactly_as_torch_npus_codegen(extractor):
    """Only arguments named exactly ``self`` move; ``selfish``/``self_dim`` stay; so do in-place ops."""
    torchgen_model()
    assert (
        extractor.registered_schema(
            "npu_x_(Tensor(a!) self, Tensor selfish, int self_dim, Tensor[] self2) -> Tensor(a!)"
        )
        == "npu_x_(Tensor(a!) input, Tensor selfish, int self_dim, Tensor[] self2) -> Tensor(a!)"
    )
    assert extractor.registered_schema("f(Tensor x, Tensor self) -> Tensor") == (
        "f(Tensor x, Tensor input) -> Tensor"
    )
    assert extractor.registered_schema("f(Tensor x) -> Tensor") == "f(Tensor x) -> Tensor"
    # The substitution is torch_npu's own, applied verbatim.
    assert extractor.SELF_ARGUMENT.pattern == r"\bself\b(?=[,\)])"


def test_generator_merges_several_out_arguments_into_one_list_as_torch_npu_registers_them(
    extractor,
):
    """An overload with more than one out argument is registered with ``Tensor[] out`` and plain
    returns; one out argument stays as declared."""
    torchgen_model()
    assert (
        extractor.registered_schema(
            "npu_h.out(Tensor self, bool s=False, int[2] k=[1,1], *, Tensor(a!) pdf, "
            "Tensor(b!) mantissa) -> (Tensor(a!), Tensor(b!))"
        )
        == "npu_h.out(Tensor input, bool s=False, int[2] k=[1,1], *, Tensor[] out) -> (Tensor, Tensor)"
    )
    assert (
        extractor.registered_schema(
            "npu_g.out(Tensor x, *, float? e=None, Tensor(a!) a, Tensor(b!) b, Tensor(c!) c) "
            "-> (Tensor(a!), Tensor(b!), Tensor(c!))"
        )
        == "npu_g.out(Tensor x, *, float? e=None, Tensor[] out) -> (Tensor, Tensor, Tensor)"
    )
    single = "npu_a.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)"
    assert extractor.registered_schema(single) == single


@pytest.mark.parametrize("version", REQUIRED)
def test_no_committed_overload_declares_several_out_arguments(version):
    """6 (2.1, 2.6) or 8 (2.9+) ``.out`` overloads had several; each now takes one ``out`` list."""
    merged = []
    for op in load_schemas(version).values():
        written = [a for a in op.arguments if a.kwarg_only and "!" in a.type]
        assert len(written) <= 1, op.schema
        if op.arguments and op.arguments[-1] == Argument("out", "Tensor[]", None, True):
            merged.append(op.qualified)
    assert len(merged) == (6 if version in ("2.1.0.post17", "2.6.0.post5") else 8)
    assert "npu_apply_adam.out" in merged


def test_loading_refuses_format_1_data_which_kept_the_yamls_self(tmp_path, monkeypatch):
    import ascend_patch_emulator._schemas as schemas

    (tmp_path / "torch_npu-9.9.9.json").write_text(
        '{"format": 1, "torch_npu": "9.9.9", "source": "x.whl", "skipped": [], "ops": []}',
        encoding="utf-8",
    )
    monkeypatch.setattr(schemas, "_DATA", tmp_path)
    with pytest.raises(LookupError, match=r"format 1, not 2 .*extract_npu_schemas\.py 9\.9\.9"):
        schemas.load_schemas.__wrapped__("9.9.9")


def test_generator_stops_on_a_repeat_with_a_different_schema(extractor):
    import yaml  # noqa: F401  (a test requirement: missing must fail, not skip)

    torchgen_model()
    conflicting = textwrap.dedent(
        """\
        custom:
          - func: npu_a(Tensor self) -> Tensor
        symint:
          - func: npu_a(Tensor self, int n) -> Tensor
        """
    )
    with pytest.raises(SystemExit, match=r"npu_a\. is declared twice"):
        extractor.parse_entries(conflicting)


# Lines pip prints when PyPI cannot be reached (as opposed to a real failure).
_OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|ConnectTimeout|Read timed out|"
    r"ProxyError|Max retries exceeded|No route to host|Connection refused"
)


@pytest.mark.network
@pytest.mark.slow
def test_regenerating_a_version_from_its_wheel_reproduces_the_committed_file(extractor):
    """Download the smallest wheel (2.1.0.post17, ~27 MB; cached in the temp folder) and regenerate."""
    import yaml  # noqa: F401  (a test requirement: missing must fail, not skip)

    torchgen_model()
    version = "2.1.0.post17"
    try:
        text = extractor.generate(
            version, extractor.default_cache(), ("--timeout", "30", "--retries", "2")
        )
    except extractor.DownloadError as error:
        offline = _OFFLINE.search(error.output)
        if offline:
            pytest.skip(f"PyPI is unreachable (pip: {offline.group(0)}); {error}")
        raise AssertionError(f"{error}\n{error.output}") from None
    committed = (DATA / f"torch_npu-{version}.json").read_text(encoding="utf-8")
    assert text == committed, (
        f"regenerate with: .nox/tests/bin/python tools/extract_npu_schemas.py {version}"
    )
