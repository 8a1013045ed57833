"""Splitting an ONNX file's weights out of its protobuf (hostd/runtimes/onnx_split.py): the session built
from the graph and the buffer computes what the file computes, the buffer gives back the exact file, every
moved weight is aligned, and anything this cannot rewrite is declined (None), never half-done."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hostd.runtimes.onnx_split import split_in_place, split_initializers
from mmhost.demo_models import build_onnx_mlp


def _mixed_model() -> bytes:
    """Initializers of several element sizes at whatever offsets protobuf gives them, used in place
    (Gather, Add on doubles) and prepacked (Conv)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((1001, 33)).astype(np.float32), "emb"),
        numpy_helper.from_array(rng.integers(0, 1000, 300).astype(np.int64), "ids"),
        numpy_helper.from_array(rng.standard_normal((8, 3, 5, 5)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((1, 8, 5, 5)).astype(np.float64), "d"),
        numpy_helper.from_array(rng.standard_normal(1300).astype(np.float16), "h"),
        numpy_helper.from_array(np.arange(3, dtype=np.float32), "small"),  # stays inline
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["g"]),
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 2, 2, 2]),
        helper.make_node("Cast", ["c"], ["cd"], to=TensorProto.DOUBLE),
        helper.make_node("Add", ["cd", "d"], ["y"]),
        helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["g"], ["gs"], keepdims=0),
        helper.make_node("Add", ["gs", "small"], ["gs2"]),
    ]
    g = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None),
         helper.make_tensor_value_info("gs2", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("hf", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _run(model: bytes, feed: dict, weights=None, name: str = "w.bin") -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if weights is not None:
        so.add_external_initializers_from_files_in_memory([name], [weights], [len(weights)])
        so.add_session_config_entry("session.use_external_initializer_file_buffers_directly", "1")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feed)


@pytest.mark.parametrize("which", ["mixed", "mlp"])
def test_split_graph_computes_what_the_file_computes_and_gives_the_file_back(which, tmp_path):
    if which == "mlp":
        build_onnx_mlp(tmp_path / "m.onnx", (64, 300, 10))
        data = (tmp_path / "m.onnx").read_bytes()
        feed = {"input": np.random.default_rng(1).random((3, 64), dtype=np.float32)}
    else:
        data = _mixed_model()
        feed = {"x": np.random.default_rng(1).standard_normal((1, 3, 5, 5)).astype(np.float32)}
    want = _run(data, feed)

    graph = split_initializers(data, "w.bin")  # left as it is
    assert graph is not None and len(graph) < len(data) // 10
    for a, b in zip(want, _run(graph, feed, data), strict=True):
        np.testing.assert_array_equal(a, b)

    for shift in range(8):  # wherever the buffer starts, every moved weight ends up aligned
        backing = np.empty(len(data) + shift, np.uint8)
        buf = memoryview(backing)[shift:]
        buf[:] = data
        split = split_in_place(buf, "w.bin")
        assert split is not None
        assert b"".join(split.original(buf)) == data, "the exact file, from the rearranged buffer"
        base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        model = onnx.load_from_string(split.graph)
        elem = {TensorProto.FLOAT: 4, TensorProto.INT64: 8, TensorProto.DOUBLE: 8, TensorProto.FLOAT16: 2}
        external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
        assert {t.name for t in external} == ({"emb", "ids", "w", "d", "h"} if which == "mixed"
                                              else {"w0", "b0", "w1"})  # b1 (40 bytes) stays inline
        for t in external:
            offset = int({e.key: e.value for e in t.external_data}["offset"])
            assert (base + offset) % elem[t.data_type] == 0, (t.name, shift)
        for a, b in zip(want, _run(split.graph, feed, buf), strict=True):
            np.testing.assert_array_equal(a, b)


def test_files_it_cannot_rewrite_are_declined(tmp_path):
    assert split_initializers(b"", "w") is None
    assert split_initializers(b"not a model \xff\xff\xff", "w") is None
    data = _mixed_model()
    assert split_initializers(data[: len(data) // 2], "w") is None, "truncated"
    # a model whose weights are already external data is not a self-contained file
    m = onnx.load_from_string(data)
    onnx.save_model(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.bin", size_threshold=0)
    assert split_initializers((tmp_path / "ext.onnx").read_bytes(), "w") is None
    # no initializer worth moving
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    assert split_initializers(helper.make_model(g).SerializeToString(), "w") is None
    buf = bytearray(data[:100])
    assert split_in_place(buf, "w") is None and bytes(buf) == data[:100], "declined means untouched"
