"""Rewriting a quantizer's file for older runtimes (keras_posenc/export/litert_runtime.py `_inline`).

LiteRT Quantizer stores buffers past 256 KB after the flatbuffer (an offset and a size instead of
the data), which TFLite before 2.15 cannot read, and gives each subgraph its own copy of a weight.
`_inline` puts every buffer back inside and shares identical ones. Its schema module is the edge
cache's LiteRT Python's (`ai_edge_litert.schema_py_generated`, pure Python: loaded here); the
rewritten files then run in TensorFlow's interpreter here, their outputs checked against numpy.
The files are made here: converted by TensorFlow, their buffers moved after the flatbuffer (or
made identical) with that same schema module.
"""

import glob
import importlib.util
import os
import sys
import types

import numpy as np
import pytest

from keras_posenc.export import litert_runtime
from keras_posenc.export.flatbuffer import TfliteFile

W1 = np.linspace(-1.0, 1.0, 48, dtype=np.float32).reshape(8, 6)
W2 = np.linspace(2.0, -3.0, 48, dtype=np.float32).reshape(8, 6)
X = np.linspace(-2.0, 3.0, 8, dtype=np.float32).reshape(1, 8)


@pytest.fixture(scope="module")
def schema(edge):
    (path,) = glob.glob(os.path.join(edge.CACHE, "venv-litertlm", "lib", "python3*", "site-packages",
                                     "ai_edge_litert", "schema_py_generated.py"))
    spec = importlib.util.spec_from_file_location("ai_edge_litert.schema_py_generated", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def litert(schema, monkeypatch):
    """`from ai_edge_litert import schema_py_generated` gives the edge cache's module."""
    package = types.ModuleType("ai_edge_litert")
    package.schema_py_generated = schema
    monkeypatch.setitem(sys.modules, "ai_edge_litert", package)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.schema_py_generated", schema)
    return schema


@pytest.fixture(scope="module")
def two_matmuls():
    """x[1, 8] @ W1 + x @ W2: two FULLY_CONNECTED ops, each with its own weight buffer."""
    import tensorflow as tf

    function = tf.function(lambda x: tf.matmul(x, tf.constant(W1)) + tf.matmul(x, tf.constant(W2)),
                           input_signature=[tf.TensorSpec([1, 8], tf.float32, name="x")])
    return tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()]).convert()


def _pack(schema, model):
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _weights(schema, flat):
    """The weight buffers' indices of the FULLY_CONNECTED ops, in op order."""
    model = schema.ModelT.InitFromPackedBuf(flat, 0)
    graph = model.subgraphs[0]
    fully_connected = schema.BuiltinOperator.FULLY_CONNECTED
    return [graph.tensors[op.inputs[1]].buffer for op in graph.operators
            if model.operatorCodes[op.opcodeIndex].builtinCode == fully_connected]


def _outside(schema, flat):
    """`flat` with every non-empty buffer after the flatbuffer, as the quantizer writes large ones."""
    model = schema.ModelT.InitFromPackedBuf(flat, 0)
    moved = [(buffer, bytes(buffer.data)) for buffer in model.buffers
             if buffer.data is not None and len(buffer.data)]
    for buffer, data in moved:
        buffer.data, buffer.offset, buffer.size = None, 2, len(data)  # the length of the file: see below
    length = len(_pack(schema, model))  # offsets do not change the size of the flatbuffer
    tail, position = b"", -(-length // 16) * 16
    for buffer, data in moved:
        buffer.offset = position + len(tail)
        tail += data + b"\x00" * (-len(data) % 16)
    head = _pack(schema, model)
    assert len(head) == length
    return head + b"\x00" * (position - length) + tail, len(moved)


def _run(flat):
    import tensorflow as tf

    interpreter = tf.lite.Interpreter(model_content=flat)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], X)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def test_buffers_after_the_flatbuffer_are_put_back_inside(litert, two_matmuls):
    outside, count = _outside(litert, two_matmuls)
    assert count >= 2  # both weights at least
    assert [b.data for b in litert.ModelT.InitFromPackedBuf(outside, 0).buffers if b.offset > 1][:1] == [None]
    flat, shared = litert_runtime._inline(outside)
    assert shared == 0
    model = litert.ModelT.InitFromPackedBuf(flat, 0)
    assert all(buffer.offset == 0 and buffer.size == 0 for buffer in model.buffers)
    first, second = _weights(litert, flat)
    assert bytes(model.buffers[first].data) == W1.T.tobytes()  # FULLY_CONNECTED keeps weights [out, in]
    assert bytes(model.buffers[second].data) == W2.T.tobytes()
    assert len(flat) < len(outside)  # no tail left
    np.testing.assert_allclose(_run(flat), X @ W1 + X @ W2, rtol=1e-5)
    names = [op.name for op in TfliteFile(two_matmuls).operators]
    assert [op.name for op in TfliteFile(flat).operators] == names


def test_a_file_with_its_buffers_inside_keeps_them(litert, two_matmuls):
    flat, shared = litert_runtime._inline(two_matmuls)
    assert shared == 0
    np.testing.assert_allclose(_run(flat), X @ W1 + X @ W2, rtol=1e-5)
    original = litert.ModelT.InitFromPackedBuf(two_matmuls, 0)
    model = litert.ModelT.InitFromPackedBuf(flat, 0)
    assert [None if b.data is None else bytes(b.data) for b in model.buffers] == [
        None if b.data is None else bytes(b.data) for b in original.buffers]


def test_identical_buffers_are_stored_once(litert, two_matmuls):
    """W2's buffer made a copy of W1's: both FULLY_CONNECTED ops read the first of the two buffers."""
    model = litert.ModelT.InitFromPackedBuf(two_matmuls, 0)
    first, second = _weights(litert, two_matmuls)
    assert first != second
    model.buffers[second].data = np.array(model.buffers[first].data, copy=True)
    copied = _pack(litert, model)
    flat, shared = litert_runtime._inline(copied)
    assert shared == 1
    kept, emptied = sorted((first, second))
    assert _weights(litert, flat) == [kept, kept]
    rewritten = litert.ModelT.InitFromPackedBuf(flat, 0)
    assert rewritten.buffers[emptied].data is None
    assert bytes(rewritten.buffers[kept].data) == W1.T.tobytes()
    assert len(flat) < len(copied) - W1.nbytes + 16
    np.testing.assert_allclose(_run(flat), 2 * (X @ W1), rtol=1e-5)
    outside, _ = _outside(litert, copied)  # identical once put back inside
    flat, shared = litert_runtime._inline(outside)
    assert shared == 1 and _weights(litert, flat) == [kept, kept]
    np.testing.assert_allclose(_run(flat), 2 * (X @ W1), rtol=1e-5)


def _per_channel(schema, scales):
    """Per-channel parameters of a [6, 8] weight: zero points all 0, as the quantizer writes them."""
    parameters = schema.QuantizationParametersT()
    parameters.scale = np.asarray(scales, np.float32)
    parameters.zeroPoint = np.zeros(len(scales), np.int64)
    parameters.quantizedDimension = 0
    return parameters


def test_identical_vectors_are_written_once(litert, two_matmuls):
    """Both weights' six int64 zero points (0) and shapes are stored once; every value reads back the same."""
    model = litert.ModelT.InitFromPackedBuf(two_matmuls, 0)
    graph = model.subgraphs[0]
    for index, scale in zip(_weights(litert, two_matmuls), (0.5, 0.25)):
        (tensor,) = [t for t in graph.tensors if t.buffer == index]
        tensor.quantization = _per_channel(litert, [scale * (k + 1) for k in range(6)])
    quantized = _pack(litert, model)
    flat, _ = litert_runtime._inline(quantized)
    unnamed = litert.ModelT.InitFromPackedBuf(quantized, 0)
    kept = set(unnamed.subgraphs[0].inputs) | set(unnamed.subgraphs[0].outputs)
    for index, tensor in enumerate(unnamed.subgraphs[0].tensors):
        tensor.name = tensor.name if index in kept else None
    assert len(_pack(litert, unnamed)) - len(flat) >= 4 + 6 * 8  # a zero-point vector less, at least
    rewritten = litert.ModelT.InitFromPackedBuf(flat, 0).subgraphs[0]
    quantized = [t.quantization for t in rewritten.tensors if t.quantization is not None]
    quantization = [(q.scale.tolist(), q.zeroPoint.tolist()) for q in quantized if q.scale is not None]
    assert sorted(quantization) == [([0.25 * (k + 1) for k in range(6)], [0] * 6),
                                    ([0.5 * (k + 1) for k in range(6)], [0] * 6)]
    assert [list(t.shape) for t in rewritten.tensors] == [list(t.shape) for t in unnamed.subgraphs[0].tensors]
    np.testing.assert_allclose(_run(flat), X @ W1 + X @ W2, rtol=1e-5)


def _structure(schema, flat):
    """What a runtime reads of a file, but for tensor names: ops, tensors, buffers, signatures."""
    model = schema.ModelT.InitFromPackedBuf(flat, 0)
    graphs = [([(op.opcodeIndex, list(op.inputs), list(op.outputs)) for op in graph.operators],
               [(list(t.shape), t.type, t.buffer) for t in graph.tensors],
               list(graph.inputs), list(graph.outputs)) for graph in model.subgraphs]
    signatures = [(s.signatureKey, s.subgraphIndex, [(t.name, t.tensorIndex) for t in s.inputs],
                   [(t.name, t.tensorIndex) for t in s.outputs]) for s in model.signatureDefs or []]
    return (graphs, [code.builtinCode for code in model.operatorCodes],
            [None if b.data is None else bytes(b.data) for b in model.buffers], signatures)


def test_vectors_of_tables_are_never_shared(litert):
    """One FULLY_CONNECTED: its operators, subgraph and signature vectors hold one offset each, with the
    same relative bytes; shared, each would name the wrong table (the file would not even decode)."""
    import tensorflow as tf

    function = tf.function(lambda x: tf.matmul(x, tf.constant(W1)),
                           input_signature=[tf.TensorSpec([1, 8], tf.float32, name="x")])
    one_matmul = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()]).convert()
    flat, shared = litert_runtime._inline(one_matmul)
    assert shared == 0
    assert _structure(litert, flat) == _structure(litert, one_matmul)
    np.testing.assert_allclose(_run(flat), X @ W1, rtol=1e-5)


def test_only_the_inputs_and_outputs_keep_their_names(litert, two_matmuls):
    original = litert.ModelT.InitFromPackedBuf(two_matmuls, 0).subgraphs[0]
    flat, _ = litert_runtime._inline(two_matmuls)
    rewritten = litert.ModelT.InitFromPackedBuf(flat, 0).subgraphs[0]
    ends = set(original.inputs) | set(original.outputs)
    assert len(original.tensors) > len(ends)
    for index, (before, after) in enumerate(zip(original.tensors, rewritten.tensors)):
        assert after.name == (before.name if index in ends else None), index
    import tensorflow as tf

    interpreter = tf.lite.Interpreter(model_content=flat)
    assert interpreter.get_input_details()[0]["name"] == "x"
    signatures = tf.lite.Interpreter(model_content=two_matmuls).get_signature_list()
    assert interpreter.get_signature_list() == signatures
