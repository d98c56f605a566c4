"""What the served ``mmcv._ext`` holds: the committed tables, the source reader, stand-ins.

No mmcv needed (the plain session runs these): the reader is tested on a small mmcv-like
source tree written here, the committed table for its shape and known facts of mmcv
2.1.0 and 1.7.2, and every registered implementation for mmcv's argument names.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest
from ascend_patch_mmcv.served.mmcv_ext import provider
from ascend_patch_mmcv.served.mmcv_ext import registry
from ascend_patch_mmcv.served.mmcv_ext.provider_sources import ext_table


PYBIND = """
    #include "pytorch_cpp_helper.hpp"

    Tensor nms(Tensor boxes, Tensor scores, float iou_threshold, int offset);

    std::vector<std::vector<int> > nms_match(Tensor dets, float iou_threshold);

    void knn_forward(Tensor xyz_tensor, Tensor new_xyz_tensor, Tensor idx_tensor,
                     Tensor dist2_tensor, int b, int n, int m, int nsample);

    // void not_this(Tensor commented);

    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
      m.def("nms", &nms, "nms (CPU/CUDA) ", py::arg("boxes"), py::arg("scores"),
            py::arg("iou_threshold"), py::arg("offset"));
      m.def("knn_forward", &knn_forward, "knn_forward", py::arg("xyz_tensor"),
            py::arg("new_xyz_tensor"), py::arg("idx_tensor"),
            py::arg("dist2_tensor"), py::arg("b"), py::arg("n"), py::arg("m"),
            py::arg("nsample"));
      m.def("nms_match", &nms_match, "nms_match (CPU) ", py::arg("dets"),
            py::arg("iou_threshold"));
      m.def("knn_forward", &knn_forward, "knn_forward", py::arg("b"), py::arg("n"),
            py::arg("m"), py::arg("nsample"), py::arg("xyz_tensor"),
            py::arg("new_xyz_tensor"), py::arg("idx_tensor"),
            py::arg("dist2_tensor"));
      m.def("unused_op", &unused_op, "unused", py::arg("x"));
    }
"""


def _mmcv_tree(root: Path) -> Path:
    package = root / "mmcv"
    (package / "ops" / "csrc" / "pytorch").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "csrc" / "pytorch" / "pybind.cpp").write_text(textwrap.dedent(PYBIND))
    (package / "ops" / "nms.py").write_text(
        "from ..utils import ext_loader\n"
        "ext_module = ext_loader.load_ext('_ext', ['nms', 'nms_match'])\n"
    )
    (package / "ops" / "knn.py").write_text(
        "from ..utils import ext_loader\n"
        "ext_module = ext_loader.load_ext(\n    '_ext', ['knn_forward', 'missing_op'])\n"
        "other = ext_loader.load_ext('_other', ['not_ext'])\n"
    )
    (package / "ops" / "also_nms.py").write_text(
        "from mmcv.utils import ext_loader\nx = ext_loader.load_ext('_ext', ('nms',))\n"
    )
    return package


def test_the_source_reader(tmp_path: Path) -> None:
    """Asking modules, argument names, C++ return types, overloads (the first one wins)."""
    table = ext_table(_mmcv_tree(tmp_path))
    names = table["names"]
    assert names["nms"] == {
        "args": ["boxes", "scores", "iou_threshold", "offset"],
        "returns": "Tensor",
        "asked_by": ["mmcv.ops.also_nms", "mmcv.ops.nms"],
    }
    assert names["nms_match"]["returns"] == "std::vector<std::vector<int> >"
    knn = names["knn_forward"]
    assert knn["args"][:4] == ["xyz_tensor", "new_xyz_tensor", "idx_tensor", "dist2_tensor"]
    assert knn["overloads"] == [
        ["b", "n", "m", "nsample", "xyz_tensor", "new_xyz_tensor", "idx_tensor", "dist2_tensor"]
    ]
    assert knn["returns"] == "void"
    assert names["missing_op"] == {"args": None, "returns": None, "asked_by": ["mmcv.ops.knn"]}
    assert "not_ext" not in names
    assert table["asked_not_defined"] == ["missing_op"]
    assert table["defined_not_asked"] == ["unused_op"]


def test_the_committed_tables() -> None:
    """112 names in mmcv 2.1.0, 107 in 1.7.2, all with argument names; known facts hold."""
    assert provider.known_releases() == ["1.7.2", "2.1.0"]
    for release, count in (("2.1.0", 112), ("1.7.2", 107)):
        table = provider.release_table(release)
        assert table.release == release and table.source == f"committed table of mmcv {release}"
        assert len(table.names) == count
        assert all(
            entry["args"] is not None and entry["asked_by"] for entry in table.names.values()
        )
    names = provider.release_table("2.1.0").names
    assert names["softnms"]["args"] == [
        "boxes", "scores", "dets", "iou_threshold", "sigma", "min_score", "method", "offset"
    ]  # fmt: skip
    assert names["softnms"]["returns"] == "Tensor"
    assert names["roi_align_forward"]["returns"] == "void"
    assert names["knn_forward"]["args"][-4:] == [
        "b",
        "n",
        "m",
        "nsample",
    ]  # mmcv/ops/knn.py binds this one
    assert names["ms_deform_attn_forward"]["asked_by"] == ["mmcv.ops.multi_scale_deform_attn"]


def test_releases_without_a_committed_table(tmp_path: Path) -> None:
    """Read from the installed sources; without them, the nearest release of the same major."""
    read = provider.release_table("2.2.0", _mmcv_tree(tmp_path))
    assert (read.release, read.source) == ("2.2.0", f"read from {tmp_path / 'mmcv'}")
    assert set(read.names) == {"nms", "nms_match", "knn_forward", "missing_op"}
    newer = provider.release_table("2.2.0", tmp_path / "nowhere")
    assert "mmcv 2.1.0 (nearest to 2.2.0)" in newer.source
    assert provider.release_table("1.6.0").source.startswith("committed table of mmcv 1.7.2")
    assert provider.release_table(None).names


def test_a_stand_in_has_mmcvs_arguments_and_raises_at_the_call() -> None:
    entry = {"args": ["features", "masks", "output"], "asked_by": ["mmcv.ops.carafe"]}
    function = provider.stand_in("carafe_naive_forward", entry, "2.1.0")
    assert list(inspect.signature(function).parameters) == ["features", "masks", "output"]
    assert function.__name__ == "carafe_naive_forward"
    with pytest.raises(TypeError):
        function(1, 2)
    with pytest.raises(TypeError):
        function(1, 2, 3, nonsense=4)
    with pytest.raises(provider.ExtOpNotImplementedError) as caught:
        function(1, masks=2, output=3)
    error = caught.value
    assert isinstance(error, NotImplementedError)
    assert (error.op, error.asked_by) == ("carafe_naive_forward", ["mmcv.ops.carafe"])
    assert "mmcv._ext.carafe_naive_forward" in str(error) and "mmcv 2.1.0" in str(error)
    assert "MMCV_WITH_OPS=1" in str(error) and "mx_driving" in str(error)
    unknown = provider.stand_in("new_op", {"args": None, "asked_by": []}, "9.0")
    with pytest.raises(provider.ExtOpNotImplementedError):
        unknown(1, 2, anything=3)


def test_the_module_built_without_mmcv() -> None:
    """Every name of the release, implementations where registered, stand-ins elsewhere."""
    attributes = provider.build_module("mmcv._ext")
    info = attributes["__ascend_patch_provider__"]
    table = provider.release_table(info["release"])
    assert set(table.names) <= set(attributes)
    implementations = registry.load_all()
    for name in table.names:
        if name in implementations:
            assert attributes[name] is implementations[name]
        else:
            assert getattr(attributes[name], "__ascend_patch_stand_in__", False)
    assert sorted(info["implemented"]) == sorted(set(table.names) & set(implementations))


@pytest.mark.parametrize("release", ["2.1.0", "1.7.2"])
def test_every_implementation_takes_mmcvs_argument_names(release: str) -> None:
    """Names and order of the pybind declaration: call sites pass many of them by keyword."""
    names = provider.release_table(release).names
    wrong = {
        name: list(inspect.signature(function).parameters)
        for name, function in registry.load_all().items()
        if name in names and list(inspect.signature(function).parameters) != names[name]["args"]
    }
    assert wrong == {}, f"argument names differ from mmcv {release}'s: {wrong}"
