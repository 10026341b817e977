"""`export_and_check(target="tensorrt")`: the ONNX path of one export, its file run by onnxruntime here.

The report's parity is recomputed from the file run row by row in an `onnxruntime.InferenceSession`
of its own against the Keras model; the lines, metadata and host rows are checked as the CLI and
the kit read them (tests/test_export_pipeline.py checks the TFLite targets the same way).
"""

import os
import sys

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from test_export_quality import reference_cross_entropy  # noqa: E402
from tiny_lm import tiny_lm, two_language_lm  # noqa: E402

from keras_posenc import export  # noqa: E402
from keras_posenc.backend import ops  # noqa: E402
from keras_posenc.export.host_table import dequantized_table  # noqa: E402

LENGTH = 12
VOCAB = 64
HOST_LINE = ("Embedding: host (int8 rows, 32 values a scale); the runner feeds the rows of "
             "FILE.embeddings.npz[token_ids] as `embeddings` (export/jetson/run_tflite.py and "
             "run_tensorrt.py do)")


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(VOCAB, seed=5)


def _rows(seed):
    ids = np.random.default_rng(seed).integers(5, VOCAB, size=[4, LENGTH]).astype(np.int32)
    ids[1, 8:] = 0
    ids[3, :5] = 0  # left padding
    return ids


def _onnx_outputs(flat, token_ids, table=None, batch=1):
    """The file's outputs for `token_ids`, `batch` rows a call (with `table`: its rows fed too), float64."""
    import onnxruntime

    session = onnxruntime.InferenceSession(bytes(flat), providers=["CPUExecutionProvider"])
    outputs = []
    for start in range(0, len(token_ids), batch):
        feeds = {"token_ids": token_ids[start:start + batch]}
        if table is not None:
            feeds["embeddings"] = table[feeds["token_ids"]].astype(np.float32)
        outputs.append(session.run(None, feeds)[0])
    return np.concatenate(outputs).astype(np.float64)


def _parity(flat, model, rows, table=None, real_only=True):
    keras_outputs = np.asarray(ops.convert_to_numpy(model(rows, training=False)), np.float64)
    difference = np.abs(_onnx_outputs(flat, rows, table) - keras_outputs)
    return (difference[rows != 0] if real_only else difference).max()


def test_a_float32_onnx_export_with_its_lines_and_metadata(edge, lm):
    rows = _rows(seed=1)
    result = export.export_and_check(lm, sequence_length=LENGTH, target="tensorrt", token_ids=rows)
    assert (result.target, result.quantize, result.embedding) == ("tensorrt", None, "graph")
    assert result.host_table is None
    assert result.lines[0] == "ONNX opset 17, static shapes, int32 ids (trtexec --onnx=FILE --fp16)"
    assert result.lines[1] == f"Parity onnxruntime vs Keras: max abs diff {result.parity:.3g} on real tokens"
    assert result.lines[2].startswith("Cost: ") and len(result.lines) == 3
    assert result.parity == pytest.approx(_parity(result.exported, lm, rows), rel=1e-3, abs=1e-7)
    assert result.parity < 1e-5 and result.failures() == []
    assert result.report["verdicts"] == {} and result.report["file_bytes"] == len(result.exported)
    assert result.metadata["cost"] == result.report["cost"] and result.metadata["target"] == "tensorrt"
    assert result.metadata["inputs"] == ["token_ids"] and "quantization" not in result.metadata
    assert result.description == f"target tensorrt, quantize=none, batch 1 x length {LENGTH}"


def test_an_int8_onnx_export_with_host_rows_calibrated_on_the_given_rows(edge, lm):
    rows = np.random.default_rng(2).integers(5, VOCAB, size=[4, LENGTH]).astype(np.int32)
    rows[0, 3:], rows[2, 2:], rows[1, :9] = 0, 0, 0  # much padding: its outputs differ the most here
    result = export.export_and_check(lm, sequence_length=LENGTH, target="tensorrt", embedding="host",
                                     quantize="int8", token_ids=rows, eval_token_ids=rows)
    assert isinstance(result.host_table, dict) and result.embedding == "host"
    assert result.lines[0] == ("Quantized by onnxruntime.quantization: int8 QDQ: weights per channel "
                               "(MatMul, Gemm), the token table (Gather) per tensor, activations per tensor, "
                               "calibrated on the parity rows")
    assert result.lines[1] == "ONNX opset 17, static shapes, int32 ids (trtexec --onnx=FILE)"
    assert result.lines[-1] == HOST_LINE
    assert result.metadata["quantization"]["runtime"] == "onnxruntime"
    assert result.metadata["inputs"] == ["token_ids", "embeddings"]
    own = dequantized_table(result.host_table)
    assert result.parity == pytest.approx(_parity(result.exported, lm, rows, own), rel=1e-4)
    every = _parity(result.exported, lm, rows, own, real_only=False)
    assert result.report["parity_all"] == pytest.approx(every, rel=1e-4) and every > 1.01 * result.parity
    assert result.lines[2] == f"Parity onnxruntime vs Keras: max abs diff {result.parity:.3g} on real tokens"
    import onnx as onnx_lib

    nodes = {node.op_type for node in onnx_lib.load_from_string(bytes(result.exported)).graph.node}
    assert "DequantizeLinear" in nodes  # int8 QDQ, not a float32 file
    float32_rows = _parity(result.exported, lm, rows, export.host_embedding_table(lm))
    assert float32_rows != pytest.approx(result.parity, rel=1e-3)  # the file was checked with its own rows
    # The held-out loss: the int8 file fed its own rows against the float32 file (the Keras loss).
    quality = result.report["quality"]
    keras_logits = np.asarray(ops.convert_to_numpy(lm(rows, training=False)), np.float64)
    assert quality["loss_float"] == pytest.approx(reference_cross_entropy(keras_logits, rows, 0)[0], rel=1e-5)
    own_loss, count = reference_cross_entropy(_onnx_outputs(result.exported, rows, own), rows, 0)
    assert quality["loss_quantized"] == pytest.approx(own_loss, rel=1e-9) and quality["tokens"] == count
    other = export.export_and_check(lm, sequence_length=LENGTH, target="tensorrt", embedding="host",
                                    quantize="int8", token_ids=_rows(seed=3))
    assert other.exported != result.exported  # the activations' ranges come from the rows given


def test_a_litert_quantizer_file_is_checked_and_measured_by_litert_s_interpreter(edge, lm, tflite_file):
    """cpu int4 (LiteRT Quantizer): TFLite 2.12 computes it wrong, so the parity and the held-out
    loss come from LiteRT's interpreter; here the file runs in LiteRT's own runner."""
    from edge_targets import feeds_of

    rows = _rows(seed=4)
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int4",
                                     token_ids=rows, eval_token_ids=rows,
                                     litert_python=edge.litertlm_python())
    feeds = feeds_of(rows, None, range(len(rows)), np.int32)
    run = edge.run_litert(tflite_file("cpu-int4", result.exported), feeds, accelerator="cpu")
    assert run.returncode == 0, run.log[-3000:]
    logits = np.asarray(run.output, np.float64).reshape(*rows.shape, -1)
    keras_logits = np.asarray(ops.convert_to_numpy(lm(rows, training=False)), np.float64)
    assert result.parity == pytest.approx(np.abs(logits - keras_logits)[rows != 0].max(), rel=1e-4)
    loss, _ = reference_cross_entropy(logits, rows, 0)
    assert result.report["quality"]["loss_quantized"] == pytest.approx(loss, rel=1e-5)
    assert result.metadata["quantization"]["tool"] == "LiteRT Quantizer 0.11"


def test_given_language_ids_reach_the_onnx_parity(edge):
    """A language model's int8 ONNX file: the parity shows which language ids were fed."""
    import onnxruntime

    model = two_language_lm(VOCAB)
    rows = _rows(seed=6)
    ones = np.ones_like(rows)
    result = export.export_and_check(model, sequence_length=LENGTH, target="tensorrt", quantize="int8",
                                     token_ids=rows, language_ids=ones, eval_token_ids=rows)
    session = onnxruntime.InferenceSession(bytes(result.exported), providers=["CPUExecutionProvider"])

    def parity_with(languages):
        feeds = [{"token_ids": rows[i:i + 1], "language_ids": languages[i:i + 1]} for i in range(len(rows))]
        outputs = np.concatenate([session.run(None, feed)[0] for feed in feeds]).astype(np.float64)
        keras_outputs = np.asarray(ops.convert_to_numpy(model(rows, language_ids=languages, training=False)))
        return np.abs(outputs - keras_outputs)[rows != 0].max()

    assert result.parity == pytest.approx(parity_with(ones), rel=1e-4)
    assert parity_with(0 * ones) != pytest.approx(result.parity, rel=1e-3)
    # The held-out loss is measured in language 0 (the eval rows come without language ids).
    keras_logits = np.asarray(ops.convert_to_numpy(model(rows, language_ids=0 * ones, training=False)))
    expected, _ = reference_cross_entropy(keras_logits, rows, 0)
    assert result.report["quality"]["loss_float"] == pytest.approx(expected, rel=1e-5)


def test_to_onnx_takes_the_batch_opset_lookup_and_precision_it_is_given(edge, lm):
    """`to_onnx` itself (the CLI and `export_and_check` go through `convert_onnx`)."""
    import onnx

    from keras_posenc.export import conversion

    rows = _rows(3)
    flat = export.to_onnx(lm, sequence_length=LENGTH, batch_size=2, opset=18, embedding="host",
                          quantize="float16")
    model = onnx.load_from_string(flat)
    assert conversion.onnx_opset(flat) == 18
    assert [[dim.dim_value for dim in value.type.tensor_type.shape.dim] for value in model.graph.input] == [
        [2, LENGTH], [2, LENGTH, 32]]
    assert onnx.TensorProto.FLOAT16 in {initializer.data_type for initializer in model.graph.initializer}
    got = _onnx_outputs(flat, rows, export.host_embedding_table(lm), batch=2)
    expected = np.asarray(ops.convert_to_numpy(lm(rows, training=False)), np.float64)
    assert np.abs(got - expected)[rows != 0].max() < 5e-2  # float16 weights and compute
    int8 = onnx.load_from_string(export.to_onnx(lm, sequence_length=LENGTH, quantize="int8",
                                                calibration=rows))
    assert "QuantizeLinear" in {node.op_type for node in int8.graph.node}
    assert [dim.dim_value for dim in int8.graph.input[0].type.tensor_type.shape.dim] == [1, LENGTH]  # batch 1


def test_the_opset_is_read_from_the_default_domain_by_either_name(edge):
    from onnx import TensorProto, helper

    from keras_posenc.export import conversion

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    for domain in ("", "ai.onnx"):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1),
                                                        helper.make_opsetid(domain, 19)])
        assert conversion.onnx_opset(model.SerializeToString()) == 19
