"""`quantization.quantize_onnx` on a small hand-built graph, its files run by onnxruntime.

The graph has the three ops the int8 recipe quantizes (a token table `Gather`, a `Gemm` and a
`MatMul` with a constant weight); its outputs are compared with the same arithmetic in numpy
float64. tests/edge/edge_pipeline.py and edge_quantize.py quantize whole exported models.
"""

import numpy as np
import pytest

from keras_posenc.export import quantization

VOCAB, WIDTH, HIDDEN, OUT, LENGTH = 16, 8, 6, 5, 7
LARGE_ROWS = range(8, 16)  # token rows 20x the others: what a calibration has to see


def _weights():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table[LARGE_ROWS.start:] *= 20.0
    return (table, rng.normal(size=(HIDDEN, WIDTH)).astype(np.float32),  # Gemm, transB
            rng.normal(size=HIDDEN).astype(np.float32), rng.normal(size=(HIDDEN, OUT)).astype(np.float32))


def _model_bytes(nodes, name, inputs, outputs, initializers):
    """The serialized, checked model of one graph (opset 13); inputs and outputs `(name, type, shape)`."""
    import onnx
    from onnx import helper, numpy_helper

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(*value) for value in inputs],
                              [helper.make_tensor_value_info(*value) for value in outputs],
                              [numpy_helper.from_array(array, key) for key, array in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _graph():
    from onnx import TensorProto, helper

    table, gemm_weight, gemm_bias, matmul_weight = _weights()
    nodes = [helper.make_node("Gather", ["token_table", "token_ids"], ["embedded"], name="lookup"),
             helper.make_node("Gemm", ["embedded", "dense_kernel", "dense_bias"], ["hidden"], transB=1,
                              name="dense"),
             helper.make_node("Relu", ["hidden"], ["activated"], name="relu"),
             helper.make_node("MatMul", ["activated", "head_kernel"], ["logits"], name="head")]
    initializers = {"token_table": table, "dense_kernel": gemm_weight, "dense_bias": gemm_bias,
                    "head_kernel": matmul_weight}
    return _model_bytes(nodes, "small", [("token_ids", TensorProto.INT32, [LENGTH])],
                        [("logits", TensorProto.FLOAT, [LENGTH, OUT])], initializers)


def _reference(ids):
    table, gemm_weight, gemm_bias, matmul_weight = (np.asarray(w, np.float64) for w in _weights())
    return np.maximum(table[ids] @ gemm_weight.T + gemm_bias, 0.0) @ matmul_weight


def _run(model_bytes, *feeds):
    """The model's first output for each feed dict, in one onnxruntime session, float64."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return np.stack([np.asarray(session.run(None, feed)[0], np.float64) for feed in feeds])


def _ids(seed, large):
    low, high = (LARGE_ROWS.start, VOCAB) if large else (0, LARGE_ROWS.start)
    return np.random.default_rng(seed).integers(low, high, size=LENGTH).astype(np.int32)


RECIPES = quantization.recipes_of("tensorrt", "window")


def test_without_a_recipe_the_model_is_returned_as_it_is(edge):
    flat = _graph()
    assert quantization.quantize_onnx(flat, None) is flat


def test_float16_stores_float16_weights_and_keeps_float32_inputs_and_outputs(edge):
    import onnx
    from onnx import TensorProto

    model = onnx.load_from_string(quantization.quantize_onnx(_graph(), RECIPES["float16"]))
    assert {initializer.data_type for initializer in model.graph.initializer} == {TensorProto.FLOAT16}
    assert [value.type.tensor_type.elem_type for value in model.graph.input] == [TensorProto.INT32]
    assert [value.type.tensor_type.elem_type for value in model.graph.output] == [TensorProto.FLOAT]
    ids = np.arange(LENGTH, dtype=np.int32)
    reference = _reference(ids)
    got = _run(model.SerializeToString(), {"token_ids": ids})[0]
    assert np.abs(got - reference).max() <= 2e-3 * np.abs(reference).max()
    assert not np.array_equal(got, _run(_graph(), {"token_ids": ids})[0])  # float16 arithmetic, not float32


def _quantized(calibration_rows):
    import onnx

    calibration = [{"token_ids": rows} for rows in calibration_rows]
    return onnx.load_from_string(quantization.quantize_onnx(_graph(), RECIPES["int8"], calibration))


def test_int8_is_qdq_with_kernels_per_channel_the_table_per_tensor_and_symmetric_activations(edge):
    from onnx import numpy_helper

    model = _quantized([_ids(seed, large=seed % 2 == 0) for seed in range(6)])
    assert {"QuantizeLinear", "DequantizeLinear", "Gather", "Gemm", "MatMul"} <= {node.op_type
                                                                                for node in model.graph.node}
    initializers = {item.name: numpy_helper.to_array(item) for item in model.graph.initializer}
    int8 = {name: value for name, value in initializers.items() if value.dtype == np.int8 and value.ndim == 2}
    scales = {int8[node.input[0]].shape: initializers[node.input[1]].size for node in model.graph.node
              if node.op_type == "DequantizeLinear" and node.input[0] in int8}
    # The token table (one scale: onnxruntime quantizes a Gather's table as an activation), the
    # Gemm kernel (one scale per output row, transB) and the MatMul kernel (one per output column).
    assert scales == {(VOCAB, WIDTH): 1, (HIDDEN, WIDTH): HIDDEN, (HIDDEN, OUT): OUT}
    assert not any(value.dtype == np.float32 and value.ndim == 2 for value in initializers.values())
    # Symmetric activations: every zero point a QuantizeLinear uses is 0.
    points = [initializers[node.input[2]] for node in model.graph.node if node.op_type == "QuantizeLinear"]
    assert points and all(point.dtype == np.int8 and np.all(point == 0) for point in points)


def test_int8_tensors_and_nodes_are_named_by_their_index_and_the_inputs_keep_theirs(edge):
    model = _quantized([_ids(seed, large=True) for seed in range(3)])
    assert [value.name for value in model.graph.input] == ["token_ids"]
    assert [value.name for value in model.graph.output] == ["logits"]
    assert [node.name for node in model.graph.node] == [f"n{index}" for index in range(len(model.graph.node))]
    names = {initializer.name for initializer in model.graph.initializer}
    names |= {name for node in model.graph.node for name in list(node.input) + list(node.output) if name}
    names -= {"token_ids", "logits"}
    assert names and all(name[0] == "v" and name[1:].isdigit() for name in names)
    assert sorted(int(name[1:]) for name in names) == list(range(len(names)))  # numbered in order, once each
    for value in model.graph.value_info:
        assert value.name in names


def test_int8_activations_are_scaled_on_the_calibration_rows(edge):
    """Calibrated on small rows only, the large rows' activations saturate: the calibration decides."""
    large = [_ids(seed, large=True) for seed in range(3)]
    small = [_ids(seed, large=False) for seed in range(3)]
    seen, unseen = _quantized(large + small).SerializeToString(), _quantized(small).SerializeToString()
    ids = _ids(10, large=True)
    reference = _reference(ids)
    error_seen = np.abs(_run(seen, {"token_ids": ids})[0] - reference).max()
    error_unseen = np.abs(_run(unseen, {"token_ids": ids})[0] - reference).max()
    assert error_seen <= 0.05 * np.abs(reference).max()
    assert error_unseen > 4 * error_seen


def _attention_like_graph():
    """x @ W (a constant kernel), then h @ h^T: a MatMul of two activations, as attention's scores."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("MatMul", ["x", "kernel"], ["h"], name="project"),
             helper.make_node("Transpose", ["h"], ["h_t"], perm=[1, 0], name="transpose"),
             helper.make_node("MatMul", ["h", "h_t"], ["scores"], name="scores")]
    return _model_bytes(nodes, "scores", [("x", TensorProto.FLOAT, [LENGTH, WIDTH])],
                        [("scores", TensorProto.FLOAT, [LENGTH, LENGTH])], {"kernel": _attention_kernel()})


def _attention_kernel():
    return np.random.default_rng(1).normal(size=(WIDTH, HIDDEN)).astype(np.float32)


def test_int8_quantizes_a_matmul_of_two_activations_too(edge):
    """Attention's scores as TensorRT gets them: both inputs of h @ h^T come from a DequantizeLinear."""
    import onnx

    rows = np.random.default_rng(2).normal(size=(3, LENGTH, WIDTH)).astype(np.float32)
    model = onnx.load_from_string(quantization.quantize_onnx(_attention_like_graph(), RECIPES["int8"],
                                                             [{"x": row} for row in rows]))
    producers = {output: node.op_type for node in model.graph.node for output in node.output}
    fed = [[producers.get(name, "input") for name in node.input] for node in model.graph.node
           if node.op_type == "MatMul"]
    assert fed == [["DequantizeLinear", "DequantizeLinear"]] * 2
    projected = rows.astype(np.float64) @ _attention_kernel().astype(np.float64)
    reference = projected @ projected.transpose(0, 2, 1)
    got = _run(model.SerializeToString(), *({"x": row} for row in rows))
    assert np.abs(got - reference).max() <= 0.05 * np.abs(reference).max()


def test_the_intermediate_files_stay_out_of_the_working_folder(edge, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    quantization.quantize_onnx(_graph(), RECIPES["int8"], [{"token_ids": _ids(0, large=True)}])
    assert list(tmp_path.iterdir()) == []


def test_the_calibration_reader_gives_each_feed_once_then_none():
    feeds = [{"token_ids": np.array([1])}, {"token_ids": np.array([2])}]
    reader = quantization._Calibration(iter(feeds))
    assert [reader.get_next() for _ in range(4)] == [feeds[0], feeds[1], None, None]


@pytest.mark.parametrize("empty", [(), []])
def test_an_empty_calibration_reads_as_none(empty):
    assert quantization._Calibration(empty).get_next() is None
