"""Each export target run by its own runtime: LiteRT GPU (lavapipe), GL delegate (llvmpipe), onnxruntime.

Demo-size models (2 layers, d_model 64, 4 heads, length 48), with and without language ids,
tables full / factorized / interpolated, float32 and float16 weights.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import export
from keras_posenc.backend import is_keras3, keras
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


def tie_head(model):
    """The LM head tied to the token table (as many LMs are): logits with clear winners.

    An untrained untied head scores the vocab with independent random columns: its top two
    logits lie within the float16 GPU's rounding (3e-3 of max |x|) for a few tokens in a hundred.
    """
    table = model.encoder.embedding.token_embedding.embeddings
    model.head.kernel.assign(np.transpose(table.numpy()))
    return model


def demo_model(options):
    keras.utils.set_random_seed(11)
    model = CausalLM(dict(DEMO, **options), name="demo")
    model.build_on_dummy()
    tie_head(model)
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


def feeds_of(ids, languages, row, dtype, table=None):
    """The probe's feeds of one row; with `table` (an `embedding="host"` file) the rows table[ids]."""
    feeds = {"token_ids": ids[row:row + 1].astype(dtype)}
    if languages is not None:
        feeds["language_ids"] = languages[row:row + 1].astype(dtype)
    if table is not None:
        feeds["embeddings"] = table[ids[row:row + 1]]
    return feeds


def keras_rows(model, ids, languages, row):
    kwargs = {} if languages is None else {"language_ids": tf.constant(languages[row:row + 1])}
    return model(tf.constant(ids[row:row + 1]), training=False, **kwargs).numpy()


# Rows of sample_token_batch: 0 full, 1 right-padded, 3 left-padded.
ROWS = (1, 3)


def check_gpu_file(edge, half_precision, path, model, ids, languages, rows, tolerance, table=None):
    """The `gpu` file on LiteRT: GPU-only in float32 (== CPU to 1e-4, == Keras to `tolerance`) and
    in the accelerator's float16 mode (`half_precision` against the float32 CPU logits)."""
    length, vocab = ids.shape[1], model.encoder_config["vocab_size"]
    for row in rows:
        feeds = feeds_of(ids, languages, row, np.int32, table)
        gpu = edge.run_litert(path, feeds, accelerator="gpu")  # GPU only: fails unless every op runs
        cpu = edge.run_litert(path, feeds, accelerator="cpu")
        half = edge.run_litert(path, feeds, accelerator="gpu", fp16=True)
        assert gpu.returncode == 0 and gpu.info["fully_accelerated"], gpu.log[-3000:]
        assert cpu.returncode == 0, cpu.log[-3000:]
        assert half.returncode == 0 and half.info["fully_accelerated"], half.log[-3000:]
        assert np.max(np.abs(gpu.output - cpu.output)) <= 1e-4
        real = ids[row] != 0
        expected = keras_rows(model, ids, languages, row)[0][real]
        assert np.max(np.abs(gpu.output[0][real] - expected)) <= tolerance
        half_precision(half.output.reshape(length, vocab), cpu.output.reshape(length, vocab), real)


def check_gl_file(edge, half_precision, path, model, ids, languages, rows, tolerance, table=None):
    """The `gl` file on the GL delegate: float32 (no refusal, == CPU to 1e-3, == Keras to
    `tolerance`) and `allow_precision_loss: true` (`half_precision` against the CPU logits)."""
    length, vocab = ids.shape[1], model.encoder_config["vocab_size"]
    for row in rows:
        feeds = feeds_of(ids, languages, row, np.float32, table)
        gl = edge.run_gl(path, feeds)
        cpu = edge.run_gl(path, feeds, cpu=True)
        half = edge.run_gl(path, feeds, fp16=True)
        assert gl.returncode == 0, gl.log[-3000:]
        assert edge.refusals(gl.log) == []  # no "not supported", no "No shader", no failed Prepare
        assert cpu.returncode == 0, cpu.log[-3000:]
        assert half.returncode == 0 and edge.refusals(half.log) == [], half.log[-3000:]
        assert np.max(np.abs(gl.output - cpu.output)) <= 1e-3
        assert np.any(gl.output != 0)
        real = np.repeat(ids[row] != 0, vocab)
        expected = keras_rows(model, ids, languages, row).reshape(-1)[real]
        assert np.max(np.abs(gl.output[real] - expected)) <= tolerance
        half_precision(half.output.reshape(length, vocab), cpu.output.reshape(length, vocab), ids[row] != 0)


def test_gpu_target_is_fully_accelerated_and_gpu_equals_cpu(edge, case, tflite_file, half_precision):
    name, model, quantize, ids, languages = case
    flat = export.to_tflite(model, sequence_length=LENGTH, target="gpu", quantize=quantize)
    assert export.gpu_incompatible_ops(flat, "webgpu") == []
    check_gpu_file(edge, half_precision, tflite_file(name, flat), model, ids, languages, ROWS,
                   KERAS_TOLERANCE[quantize])


def test_gl_target_runs_every_op_on_gl_and_gl_equals_cpu(edge, case, tflite_file, half_precision):
    name, model, quantize, ids, languages = case
    flat = export.to_tflite(model, sequence_length=LENGTH, target="gl", quantize=quantize)
    assert export.gpu_incompatible_ops(flat, "gl") == []
    check_gl_file(edge, half_precision, tflite_file(name, flat), model, ids, languages, ROWS,
                  KERAS_TOLERANCE[quantize])


# A vocab whose ids exceed 2048 (float16's exact integers) at T = 128: one Keras stack is enough
# (the two converters emit the same gl formulation).
SCALE = dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=8000, max_length=128, dropout=0.0)


@pytest.mark.skipif(is_keras3(), reason="run once, on the Keras 2 stack: both converters get the same gl "
                    "formulation, and CI time is tight")
@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_length_128_vocab_8000_in_float32_and_float16(edge, target, tflite_file, half_precision):
    keras.utils.set_random_seed(13)
    model = CausalLM(SCALE, name="scale")
    model.build_on_dummy()
    tie_head(model)
    length = SCALE["max_length"]
    ids, _ = export.sample_token_batch(model, length, seed=5)
    assert (ids > 2048).sum() > 100  # most ids are above float16's exact integers
    flat = export.to_tflite(model, sequence_length=length, target=target)
    assert export.gpu_incompatible_ops(flat, "webgpu" if target == "gpu" else "gl") == []
    check = check_gpu_file if target == "gpu" else check_gl_file
    check(edge, half_precision, tflite_file(target, flat), model, ids, None, (3,), 1e-4)  # left padded


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_host_embedding_file_on_the_gpu_runtimes(edge, target, tflite_file, half_precision):
    """`embedding="host"`: the runner feeds table[ids]; ids above 2048 never reach the GPU as floats."""
    model = demo_model({"table": "full", "vocab_size": 3000})
    ids, _ = export.sample_token_batch(model, LENGTH, seed=4)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target, embedding="host")
    assert export.gpu_incompatible_ops(flat, "webgpu" if target == "gpu" else "gl") == []
    table = export.host_embedding_table(model)
    check = check_gpu_file if target == "gpu" else check_gl_file
    check(edge, half_precision, tflite_file(target, flat), model, ids, None, ROWS, 1e-4, table)


# T = 512 at d_model 512 (the seed's width; 2 layers to keep the conversion short): conversion only.
WIDE = dict(num_layers=2, d_model=512, num_heads=8, dff=2048, vocab_size=8000, max_length=512, dropout=0.0)


@pytest.mark.skipif(is_keras3(), reason="run once, on the Keras 2 stack: both converters get the same gl "
                    "formulation, and CI time is tight")
@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_length_512_file_stays_within_1_10_times_the_weights(target):
    """No constant grows faster than T^2: at T = 512 the file is the weights plus a few [T, T] tables.

    With the token lookup in the file (`embedding="graph"`, the larger file). A `[T, T * T]`
    constant alone would be 512 MiB here.
    """
    keras.utils.set_random_seed(0)
    model = CausalLM(WIDE, name="wide")
    model.build_on_dummy()
    flat = export.to_tflite(model, sequence_length=512, target=target, embedding="graph")
    weights = export.weight_bytes(model)
    assert len(flat) <= 1.10 * weights, (len(flat), weights)
    cost = export.graph_cost(flat)
    assert cost["constant_bytes"] - weights <= 6 * 512 * 512 * 4  # a handful of [T, T] float32 tables


def float16_copy(onnx_bytes):
    """The ONNX model with float16 weights and compute, float32/int32 inputs and outputs kept: the
    stand-in for TensorRT's `--fp16` (onnxconverter-common, as TensorRT users convert)."""
    import onnx as onnx_lib
    from onnxconverter_common import float16

    half = float16.convert_float_to_float16(onnx_lib.load_from_string(onnx_bytes), keep_io_types=True)
    # onnxconverter-common 1.16 types the outputs of the graph's own int -> float Casts as float16
    # but leaves their `to` at FLOAT, which onnxruntime refuses ("Type Error"): cast to float16.
    # (Listing Cast in op_block_list instead makes the conversion loop forever.)
    halves = {value.name for value in half.graph.value_info
              if value.type.tensor_type.elem_type == onnx_lib.TensorProto.FLOAT16}
    for node in half.graph.node:
        if node.op_type == "Cast" and node.output[0] in halves:
            for attribute in node.attribute:
                if attribute.name == "to" and attribute.i == onnx_lib.TensorProto.FLOAT:
                    attribute.i = onnx_lib.TensorProto.FLOAT16
    return half.SerializeToString()


def test_tensorrt_target_onnxruntime_equals_keras_left_and_right_padding(edge, case, half_precision):
    name, model, quantize, ids, languages = case
    onnx = export.to_onnx(model, sequence_length=LENGTH)
    import onnx as onnx_lib

    proto = onnx_lib.load_from_string(onnx)
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    shapes = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input]
    assert all(all(n > 0 for n in shape) for shape in shapes)  # static shapes
    assert all(i.type.tensor_type.elem_type == onnx_lib.TensorProto.INT32 for i in proto.graph.input)
    half = float16_copy(onnx)
    for row in ROWS:  # right padding, left padding
        single = None if languages is None else languages[row:row + 1]
        assert export.check_onnx_parity(model, onnx, ids[row:row + 1], single) <= 1e-4
        feeds = [ids[row:row + 1]] + ([] if single is None else [single])
        roles = ["token_ids"] + ([] if single is None else ["language_ids"])
        full = export.run_onnx(onnx, feeds, roles)[0]
        half_precision(export.run_onnx(half, feeds, roles)[0], full, ids[row] != 0)


def test_runtime_segment_ids_on_gl_and_litert(edge, tflite_file, half_precision):
    """Packed rows with runtime segment ids: per-segment positions and block-diagonal attention on GPU."""
    from keras_posenc.layers.encoder import Encoder

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
        half = run(path, feeds, fp16=True)
        assert half.returncode == 0 and edge.refusals(half.log) == [], half.log[-3000:]
        half_precision(half.output.reshape(LENGTH, 7)[tokens[0] != 0], expected, slice(None))
