"""Each export target run by its own runtime: LiteRT GPU (lavapipe), GL delegate (llvmpipe), onnxruntime.

Demo-size models (2 layers, d_model 64, 4 heads, length 48), with and without language ids,
tables full / factorized / interpolated, float32 and float16 weights.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import export
from keras_posenc.backend import keras
from keras_posenc.models import CausalLM

LENGTH = 48
DEMO = dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000, max_length=LENGTH, dropout=0.0)
# name: (position options, quantize); languages per token (CausalLM's), scales set apart.
CASES = {
    "full-fp32": ({"table": "full"}, None),
    "factorized-fp16-languages": ({"table": "factorized", "num_languages": 2}, "float16"),
    "interpolated-fp32-languages": ({"table": "interpolated", "stored_dims": 16, "num_languages": 3}, None),
    "full-fp16": ({"table": "full"}, "float16"),
}
# float16 weights: the file computes with rounded weights, Keras with the float32 ones.
KERAS_TOLERANCE = {None: 1e-4, "float16": 2e-2}


def demo_model(options):
    keras.utils.set_random_seed(11)
    model = CausalLM(dict(DEMO, **options), name="demo")
    model.build_on_dummy()
    for weight in model.weights:
        if "language_scale" in weight.name:
            weight.assign(np.linspace(0.5, 2.0, weight.shape[0]))
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    options, quantize = CASES[request.param]
    model = demo_model(options)
    ids, languages = export.sample_token_batch(model, LENGTH, seed=3)
    return request.param, model, quantize, ids, languages


def feeds_of(ids, languages, row, dtype):
    feeds = {"token_ids": ids[row:row + 1].astype(dtype)}
    if languages is not None:
        feeds["language_ids"] = languages[row:row + 1].astype(dtype)
    return feeds


def keras_rows(model, ids, languages, row):
    kwargs = {} if languages is None else {"language_ids": tf.constant(languages[row:row + 1])}
    return model(tf.constant(ids[row:row + 1]), training=False, **kwargs).numpy()


# Rows of sample_token_batch: 0 full, 1 right-padded, 3 left-padded.
ROWS = (1, 3)


def test_gpu_target_is_fully_accelerated_and_gpu_equals_cpu(edge, case, tflite_file):
    name, model, quantize, ids, languages = case
    flat = export.to_tflite(model, sequence_length=LENGTH, target="gpu", quantize=quantize)
    assert export.gpu_incompatible_ops(flat, "webgpu") == []
    path = tflite_file(name, flat)
    for row in ROWS:
        feeds = feeds_of(ids, languages, row, np.int32)
        gpu = edge.run_litert(path, feeds, accelerator="gpu")  # GPU only: fails unless every op runs
        cpu = edge.run_litert(path, feeds, accelerator="cpu")
        assert gpu.returncode == 0 and gpu.info["fully_accelerated"], gpu.log[-3000:]
        assert cpu.returncode == 0, cpu.log[-3000:]
        assert np.max(np.abs(gpu.output - cpu.output)) <= 1e-4
        real = ids[row] != 0
        expected = keras_rows(model, ids, languages, row)[0][real]
        assert np.max(np.abs(gpu.output[0][real] - expected)) <= KERAS_TOLERANCE[quantize]


def test_gl_target_runs_every_op_on_gl_and_gl_equals_cpu(edge, case, tflite_file):
    name, model, quantize, ids, languages = case
    flat = export.to_tflite(model, sequence_length=LENGTH, target="gl", quantize=quantize)
    assert export.gpu_incompatible_ops(flat, "gl") == []
    path = tflite_file(name, flat)
    for row in ROWS:
        feeds = feeds_of(ids, languages, row, np.float32)
        gl = edge.run_gl(path, feeds)
        cpu = edge.run_gl(path, feeds, cpu=True)
        assert gl.returncode == 0, gl.log[-3000:]
        assert edge.refusals(gl.log) == []  # no "not supported", no "No shader", no failed Prepare
        assert cpu.returncode == 0, cpu.log[-3000:]
        assert np.max(np.abs(gl.output - cpu.output)) <= 1e-3
        assert np.any(gl.output != 0)
        real = np.repeat(ids[row] != 0, DEMO["vocab_size"])
        expected = keras_rows(model, ids, languages, row).reshape(-1)[real]
        assert np.max(np.abs(gl.output[real] - expected)) <= KERAS_TOLERANCE[quantize]


def test_tensorrt_target_onnxruntime_equals_keras_left_and_right_padding(edge, case):
    name, model, quantize, ids, languages = case
    onnx = export.to_onnx(model, sequence_length=LENGTH)
    import onnx as onnx_lib

    proto = onnx_lib.load_from_string(onnx)
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    shapes = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input]
    assert all(all(n > 0 for n in shape) for shape in shapes)  # static shapes
    assert all(i.type.tensor_type.elem_type == onnx_lib.TensorProto.INT32 for i in proto.graph.input)
    for row in ROWS:  # right padding, left padding
        single = None if languages is None else languages[row:row + 1]
        assert export.check_onnx_parity(model, onnx, ids[row:row + 1], single) <= 1e-4


def test_runtime_segment_ids_on_gl_and_litert(edge, tflite_file):
    """Packed rows with runtime segment ids: per-segment positions and block-diagonal attention on GPU."""
    from keras_posenc.encoder import Encoder

    keras.utils.set_random_seed(2)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    segments = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
    hidden = Encoder(2, 64, 4, 128, 1000, LENGTH, dropout=0.0)(ids, segment_ids=segments)
    model = keras.Model([ids, segments], keras.layers.Dense(7)(hidden))
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 1000, size=(1, LENGTH)).astype(np.int32)
    tokens[0, :5] = 0  # left padding
    packed = np.repeat([[1, 2, 3]], [15, 20, 13], axis=1).astype(np.int32)
    expected = model([tokens, packed]).numpy()[0][tokens[0] != 0]
    for target, run, dtype in (("gl", edge.run_gl, np.float32), ("gpu", edge.run_litert, np.int32)):
        path = tflite_file(target, export.to_tflite(model, sequence_length=LENGTH, target=target))
        feeds = {"token_ids": tokens.astype(dtype), "segment_ids": packed.astype(dtype)}
        result = run(path, feeds)
        assert result.returncode == 0 and edge.refusals(result.log) == [], result.log[-3000:]
        got = result.output.reshape(LENGTH, 7)[tokens[0] != 0]
        assert np.max(np.abs(got - expected)) <= 1e-4, target
