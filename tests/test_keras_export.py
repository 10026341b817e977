"""Keras's own export of models built from every public layer: SavedModel and LiteRT files run and match.

Keras 3, TensorFlow backend: `model.export(format="tf_saved_model")` and `format="litert"` (a static
signature: the inputs have static shapes), read back with `tf.saved_model.load` and ai-edge-litert's
interpreter. Keras 3, JAX backend: Keras exports `format="tf_saved_model"` with jax2tf, but in the
locked stack (jax 0.12, TF 2.21) TensorFlow cannot run what it writes, for any model (a plain Dense
model too: StableHLO v1.18 from jax, v1.13.7 in TF's deserializer), so it is skipped there; Keras's
LiteRT export is TensorFlow/PyTorch only. Keras 2: the equivalents, `tf.saved_model.save` and
`tf.lite.TFLiteConverter.from_keras_model` with builtin ops only, run by `tf.lite.Interpreter`.
Every LiteRT file is free of CUMSUM, IF, WHILE and Flex ops, read from the flatbuffer. The ONNX export
(tf2onnx + onnxruntime, in the locks) is tests/edge/edge_keras_export.py.
"""

import os

import numpy as np
import pytest
from keras_export_models import MODELS, feed_by_name, forbidden_ops, input_signature
from layer_test_helper import to_numpy

from keras_posenc.backend import backend_name, is_keras3, keras

TOLERANCE = 1e-4
tf = pytest.importorskip("tensorflow")


def _expected(model, feeds):
    return to_numpy(model(feeds))


def _saved_model_output(model, feeds, path):
    if is_keras3():
        model.export(path, format="tf_saved_model", verbose=False)
        loaded = tf.saved_model.load(path)  # keep a reference: its variables die with it
        return to_numpy(loaded.serve(feeds))
    tf.saved_model.save(model, path)
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    outputs = serve(**{name: tf.constant(value) for name, value in feeds.items()})
    (output,) = outputs.values()
    return output.numpy()


def _litert_bytes(model, path):
    if is_keras3():
        model.export(path, format="litert", verbose=False, input_signature=input_signature(model))
        with open(path, "rb") as f:
            return f.read()
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


def _run_litert(flat, feeds):
    from keras_posenc.export.runners import interpreter_class

    interpreter = interpreter_class()(model_content=flat)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        assert -1 not in list(detail["shape_signature"]), detail  # a static signature
    for index, value in feed_by_name(interpreter.get_input_details(), feeds).items():
        interpreter.set_tensor(index, value)
    interpreter.invoke()
    (output,) = interpreter.get_output_details()
    return interpreter.get_tensor(output["index"])


@pytest.mark.skipif(backend_name() == "jax", reason="TF 2.21 cannot run jax 0.12's StableHLO (any model)")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_saved_model_export_matches_keras(name, tmp_path):
    model, feeds = MODELS[name]()
    expected = _expected(model, feeds)
    output = _saved_model_output(model, feeds, os.path.join(str(tmp_path), name))
    np.testing.assert_allclose(output, expected, rtol=0, atol=TOLERANCE)


@pytest.mark.skipif(backend_name() != "tensorflow", reason="Keras exports LiteRT from TensorFlow and PyTorch")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_litert_export_matches_keras_and_holds_only_static_gpu_ops(name, tmp_path):
    from keras_posenc.export.flatbuffer import op_counts

    model, feeds = MODELS[name]()
    expected = _expected(model, feeds)
    flat = _litert_bytes(model, os.path.join(str(tmp_path), f"{name}.tflite"))
    counts = op_counts(flat)
    assert forbidden_ops(counts) == {}, counts
    np.testing.assert_allclose(_run_litert(flat, feeds), expected, rtol=0, atol=TOLERANCE)


def test_the_op_check_finds_a_cumulative_sum():
    """Not vacuous: the same check flags a graph that does hold a cumulative sum."""
    from keras_posenc.export.flatbuffer import op_counts

    cumsum = tf.function(lambda x: tf.cumsum(x, axis=1), input_signature=[tf.TensorSpec([2, 8], tf.float32)])
    flat = tf.lite.TFLiteConverter.from_concrete_functions([cumsum.get_concrete_function()]).convert()
    assert forbidden_ops(op_counts(flat)) == {"CUMSUM": 1}


def test_masked_models_really_depend_on_the_mask():
    """Not vacuous: a different padding gives a different output, so parity covers the mask path."""
    model, feeds = MODELS["learned_mask"]()
    unmasked = dict(feeds, real=np.ones_like(feeds["real"]))
    assert np.abs(_expected(model, feeds) - _expected(model, unmasked)).max() > 1e-3
    assert keras.backend.floatx() == "float32"


PLAIN_GRAPH_FORBIDDEN = {"If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall",
                         "StatefulPartitionedCall", "Cumsum"}


def _graph_ops(concrete):
    graph = concrete.graph.as_graph_def()
    return {node.op for node in graph.node} | {n.op for f in graph.library.function for n in f.node_def}


@pytest.mark.skipif(backend_name() != "tensorflow", reason="inspects TensorFlow graphs")
@pytest.mark.parametrize("kwargs", [{}, {"table": "factorized"}, {"table": "interpolated"},
                                    {"overflow": "extend"}, {"num_languages": 2}],
                         ids=["full", "factorized", "interpolated", "extend", "languages"])
def test_the_layer_traces_to_a_plain_graph_without_captured_tensors(kwargs):
    from keras_posenc.layers import SinusoidalPositionEmbedding

    layer = SinusoidalPositionEmbedding(max_length=16, **kwargs)
    def call(x, mask):
        languages = {"language_ids": tf.constant([0, 1])} if "num_languages" in kwargs else {}
        return layer(x, mask=mask, **languages)

    fn = tf.function(call)
    concrete = fn.get_concrete_function(tf.TensorSpec([2, 8, 4]), tf.TensorSpec([2, 8], tf.bool))
    assert _graph_ops(concrete) & PLAIN_GRAPH_FORBIDDEN == set()
    # Only variables are captured (the language scale), never a tensor of the table.
    variables = {id(v.handle) for v in layer.weights}
    assert [t for t in concrete.captured_inputs if id(t) not in variables] == []


@pytest.mark.skipif(backend_name() != "tensorflow", reason="inspects TensorFlow graphs")
def test_the_graph_check_finds_a_cond_and_a_capture():
    """Not vacuous: a graph with a cond and a captured tensor is flagged."""
    table = tf.constant(np.ones([4, 2], np.float32))
    fn = tf.function(lambda x: tf.cond(tf.reduce_sum(x) > 0, lambda: x + table[:2], lambda: x))
    concrete = fn.get_concrete_function(tf.TensorSpec([2, 2]))
    assert _graph_ops(concrete) & PLAIN_GRAPH_FORBIDDEN
    assert len(concrete.captured_inputs) == 1


def test_configs_with_the_old_fusion_argument_still_load():
    from keras_posenc.layers import SinusoidalPositionEmbedding

    layer = SinusoidalPositionEmbedding.from_config({"max_length": 8, "fuse_min_tokens": 4096})
    assert "fuse_min_tokens" not in layer.get_config() and layer.max_length == 8
