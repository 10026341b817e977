"""Each export target run by its own runtime: LiteRT GPU (lavapipe), GL delegate (llvmpipe), onnxruntime.

Demo-size models (2 layers, d_model 64, 4 heads, length 48), with and without language ids,
tables full / factorized / interpolated, float32 and float16 weights.
"""

import functools
import json

import numpy as np
import pytest
import tensorflow as tf
from stacks import once_on_keras2, once_on_keras3

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


def bigram_language(vocab, seed=0):
    """`(first, second, rng)`: the successor permutations of `train_briefly`'s bigram language and the
    generator they were drawn from (which then draws its rows)."""
    rng = np.random.default_rng(seed)
    first, second = (np.concatenate([[1], rng.permutation(np.arange(1, vocab))]) for _ in range(2))
    return first, second, rng


def bigram_rows(language, rng, batch, length=LENGTH):
    """Rows of a bigram language `(first, second, _)`: each token is followed by its first successor
    with probability 0.7, by its second with 0.2 and by any token with 0.1; drawn with `rng`."""
    first, second, _ = language
    vocab = len(first)
    ids = np.zeros([batch, length], np.int32)
    ids[:, 0] = rng.integers(1, vocab, batch)
    for t in range(1, length):
        draw = rng.random(batch)
        ids[:, t] = np.where(draw < 0.7, first[ids[:, t - 1]],
                             np.where(draw < 0.9, second[ids[:, t - 1]], rng.integers(1, vocab, batch)))
    return ids


def train_briefly(model, *, steps=150, length=LENGTH, batch=16, seed=0):
    """A few Adam steps on a random bigram language (`bigram_rows`), so that the logits look like a real LM's.

    The trained model has a clear winner for most tokens and near-ties only where the language is
    ambiguous, as a real LM. The logits of an untrained model are no such test: its random head
    puts the top two within the float16 GPU's rounding (3e-3 of max |x|) for about one token in
    25, a tie that any runtime decides by rounding. Language ids (if the model takes them) are
    random per row.
    """
    vocab = model.encoder_config["vocab_size"]
    languages = model.encoder_config.get("num_languages")
    language = bigram_language(vocab, seed)
    rng = language[2]
    optimizer = keras.optimizers.Adam(1e-2)

    @tf.function
    def step(ids, language_ids):
        with tf.GradientTape() as tape:
            kwargs = {} if languages is None else {"language_ids": language_ids[:, :-1]}
            logits = model(ids[:, :-1], training=True, **kwargs)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(ids[:, 1:], logits,
                                                                               from_logits=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    for _ in range(steps):
        ids = bigram_rows(language, rng, batch, length)
        language_ids = np.repeat(rng.integers(0, languages or 1, [batch, 1]), length, axis=1).astype(np.int32)
        step(tf.constant(ids), tf.constant(language_ids))
    return model


def demo_model(options):
    """The demo-size model of `options`, trained briefly; made once per process for each `options`
    (each training takes seconds, and the tests only read the model)."""
    return _trained_demo_model(json.dumps(options, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _trained_demo_model(options_json):
    keras.utils.set_random_seed(11)
    model = CausalLM(dict(DEMO, **json.loads(options_json)), name="demo")
    model.build_on_dummy()
    for weight in model.weights:
        if "language_scale" in weight.name:
            weight.assign(np.linspace(0.5, 2.0, weight.shape[0]))
    return train_briefly(model)


# Each converter runs one float32 and one float16 case, one of them with languages: the cases differ in
# their tables and weights, not in the formulations, which both converters get alike.
CASE_STACKS = {"full-fp32": once_on_keras2, "factorized-fp16-languages": once_on_keras2,
               "full-fp16": once_on_keras3, "interpolated-fp32-languages": once_on_keras3}


@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=CASE_STACKS[name]("each converter runs two of the four cases, one float16 each"))
    for name in sorted(CASES)])
def case(request):
    options, quantize = CASES[request.param]
    model = demo_model(options)
    ids, languages = export.sample_token_batch(model, LENGTH, rows=ROWS, seed=3)
    return request.param, model, quantize, ids, languages


def feeds_of(ids, languages, rows, dtype, table=None):
    """The probe's feeds of `rows`; with `table` (an `embedding="host"` file) the rows table[ids]."""
    rows = list(rows)
    feeds = {"token_ids": ids[rows].astype(dtype)}
    if languages is not None:
        feeds["language_ids"] = languages[rows].astype(dtype)
    if table is not None:
        feeds["embeddings"] = table[ids[rows]]
    return feeds


def keras_rows(model, ids, languages, rows):
    rows = list(rows)
    kwargs = {} if languages is None else {"language_ids": tf.constant(languages[rows])}
    return model(tf.constant(ids[rows]), training=False, **kwargs).numpy()


# sample_token_batch(rows=ROWS) cycles full, right-padded, one-token and left-padded rows: 357
# real tokens at T = 48, for the float16 argmax agreement (99 % allows 3 differences).
ROWS = 12


def check_gpu_file(edge, half_precision, path, model, ids, languages, tolerance, table=None):
    """The `gpu` file on LiteRT, every row of `ids`: GPU-only in float32 (== CPU to 1e-4, == Keras to
    `tolerance`) and in the accelerator's float16 mode (`half_precision` against the float32 CPU
    logits, over the real tokens of all rows)."""
    rows = range(len(ids))
    feeds = feeds_of(ids, languages, rows, np.int32, table)
    gpu = edge.run_litert(path, feeds, accelerator="gpu")  # GPU only: fails unless every op runs
    cpu = edge.run_litert(path, feeds, accelerator="cpu")
    half = edge.run_litert(path, feeds, accelerator="gpu", fp16=True)
    assert gpu.returncode == 0 and gpu.info["fully_accelerated"], gpu.log[-3000:]
    assert cpu.returncode == 0, cpu.log[-3000:]
    assert half.returncode == 0 and half.info["fully_accelerated"], half.log[-3000:]
    assert np.max(np.abs(gpu.output - cpu.output)) <= 1e-4
    real = ids != 0
    expected = keras_rows(model, ids, languages, rows)
    assert np.max(np.abs(gpu.output[real] - expected[real])) <= tolerance
    half_precision(half.output, cpu.output, real)


def check_gl_file(edge, half_precision, path, model, ids, languages, tolerance, table=None):
    """The `gl` file on the GL delegate, every row of `ids`: float32 (no refusal, == CPU to 1e-3, ==
    Keras to `tolerance`) and `allow_precision_loss: true` (`half_precision` against the CPU logits)."""
    rows = range(len(ids))
    shape = ids.shape + (-1,)
    feeds = feeds_of(ids, languages, rows, np.float32, table)
    gl = edge.run_gl(path, feeds, rows=len(ids))
    cpu = edge.run_gl(path, feeds, cpu=True, rows=len(ids))
    half = edge.run_gl(path, feeds, fp16=True, rows=len(ids))
    assert gl.returncode == 0, gl.log[-3000:]
    assert edge.refusals(gl.log) == []  # no "not supported", no "No shader", no failed Prepare
    assert cpu.returncode == 0, cpu.log[-3000:]
    assert half.returncode == 0 and edge.refusals(half.log) == [], half.log[-3000:]
    assert np.max(np.abs(gl.output - cpu.output)) <= 1e-3
    assert np.any(gl.output != 0)
    real = ids != 0
    expected = keras_rows(model, ids, languages, rows)
    assert np.max(np.abs(gl.output.reshape(shape)[real] - expected[real])) <= tolerance
    half_precision(half.output.reshape(shape), cpu.output.reshape(shape), real)


def test_gpu_target_is_fully_accelerated_and_gpu_equals_cpu(edge, case, tflite_file, half_precision):
    name, model, quantize, ids, languages = case
    flat = export.to_tflite(model, sequence_length=LENGTH, target="gpu", quantize=quantize)
    assert export.gpu_incompatible_ops(flat, "webgpu") == []
    check_gpu_file(edge, half_precision, tflite_file(name, flat), model, ids, languages,
                   KERAS_TOLERANCE[quantize])


def test_gl_target_runs_every_op_on_gl_and_gl_equals_cpu(edge, case, tflite_file, half_precision):
    name, model, quantize, ids, languages = case
    flat = export.to_tflite(model, sequence_length=LENGTH, target="gl", quantize=quantize)
    assert export.gpu_incompatible_ops(flat, "gl") == []
    check_gl_file(edge, half_precision, tflite_file(name, flat), model, ids, languages,
                  KERAS_TOLERANCE[quantize])


# A vocab whose ids exceed 2048 (float16's exact integers) at T = 128: one Keras stack is enough
# (the two converters emit the same gl formulation).
SCALE = dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=8000, max_length=128, dropout=0.0)


def test_gl_float16_looks_up_every_token_id_of_a_vocab_8000_exactly(edge, tflite_file):
    """`token_one_hot` of float ids on GL in float16: the row of every id 0 .. 7999 is the id's own.

    The file returns the two digits of the id whose row is selected (`v // 128`, `v % 128`: small
    integers, exact in float16). A float16 GPU rounds ids above 2048 read by a CONV_2D; the split
    corrects that from an element-wise SUB, which reads the float32 input exactly.
    """
    from keras_posenc.export.shader_ops import linear, token_one_hot

    vocab, length = 8000, 128

    def digits(ids):
        rows = token_one_hot(ids, vocab)
        classes = np.arange(rows.shape[-1])
        return linear(rows, np.stack([classes // 128, classes % 128], 1).astype(np.float32))

    function = tf.function(digits, input_signature=[tf.TensorSpec([1, length], tf.float32, name="token_ids")])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    path = tflite_file("digits", converter.convert())
    ids = (np.arange(63 * length) % vocab).reshape(63, length).astype(np.float32)
    for fp16 in (False, True):
        result = edge.run_gl(path, {"token_ids": ids}, fp16=fp16, rows=len(ids))
        assert result.returncode == 0 and edge.refusals(result.log) == [], result.log[-3000:]
        got = result.output.reshape(len(ids), length, 2)
        wrong = ids[got[..., 0] * 128 + got[..., 1] != ids]
        assert wrong.size == 0, (fp16, wrong[:20])


@pytest.fixture(scope="module")
def scale_model():
    """The vocab-8000 model at T = 128, trained briefly on rows of 32 tokens (the bigram language
    needs no longer context; 8000 tokens take the time)."""
    keras.utils.set_random_seed(13)
    model = CausalLM(SCALE, name="scale")
    model.build_on_dummy()
    return train_briefly(model, steps=150, length=32, batch=32, seed=1)


@once_on_keras2("both converters get the same gl formulation, and CI time is tight")
@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_length_128_vocab_8000_in_float32_and_float16(edge, target, scale_model, tflite_file, half_precision):
    model = scale_model
    length = SCALE["max_length"]
    ids, _ = export.sample_token_batch(model, length, rows=4, seed=5)  # 319 real tokens
    assert (ids > 2048).sum() > 100  # most ids are above float16's exact integers
    flat = export.to_tflite(model, sequence_length=length, target=target)
    assert export.gpu_incompatible_ops(flat, "webgpu" if target == "gpu" else "gl") == []
    check = check_gpu_file if target == "gpu" else check_gl_file
    check(edge, half_precision, tflite_file(target, flat), model, ids, None, 1e-4)


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_host_embedding_file_on_the_gpu_runtimes(edge, target, host_model, tflite_file, half_precision):
    """`embedding="host"`: the runner feeds table[ids]; ids above 2048 never reach the GPU as floats."""
    model = host_model
    ids, _ = export.sample_token_batch(model, LENGTH, rows=ROWS, seed=4)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target, embedding="host")
    assert export.gpu_incompatible_ops(flat, "webgpu" if target == "gpu" else "gl") == []
    table = export.host_embedding_table(model)
    check = check_gpu_file if target == "gpu" else check_gl_file
    check(edge, half_precision, tflite_file(target, flat), model, ids, None, 1e-4, table)


@pytest.fixture(scope="module")
def full_model():
    return demo_model({"table": "full"})


@pytest.mark.parametrize("batch", [2, 4])
def test_gpu_target_runs_a_batch_on_litert(edge, batch, full_model, tflite_file, half_precision):
    """`batch_size` > 1 (gpu only): fully accelerated, GPU == CPU, each row == Keras, float16 close.

    `ROWS` rows (full, right, one-token and left-padded) run `batch` at a time through one compiled
    file; the float16 rule is judged over all of their real tokens, as for the batch-1 files.
    """
    model = full_model
    ids, _ = export.sample_token_batch(model, LENGTH, rows=ROWS, seed=3)
    flat = export.to_tflite(model, sequence_length=LENGTH, target="gpu", batch_size=batch)
    assert export.gpu_incompatible_ops(flat, "webgpu") == []
    path = tflite_file(f"batch{batch}", flat)
    feeds = {"token_ids": ids}
    gpu = edge.run_litert(path, feeds, accelerator="gpu")
    cpu = edge.run_litert(path, feeds, accelerator="cpu")
    half = edge.run_litert(path, feeds, accelerator="gpu", fp16=True)
    assert gpu.returncode == 0 and gpu.info["fully_accelerated"], gpu.log[-3000:]
    assert cpu.returncode == 0, cpu.log[-3000:]
    assert half.returncode == 0 and half.info["fully_accelerated"], half.log[-3000:]
    assert gpu.output.shape == (ROWS, LENGTH, DEMO["vocab_size"])
    assert np.max(np.abs(gpu.output - cpu.output)) <= 1e-4
    expected = model(tf.constant(ids), training=False).numpy()
    for row in range(ROWS):
        real = ids[row] != 0
        assert np.max(np.abs(gpu.output[row][real] - expected[row][real])) <= 1e-4, row
    half_precision(half.output, cpu.output, ids != 0)


# RoPE (two scalings, one partial) and ALiBi: the gpu attention (BATCH_MATMUL) and gl's (per head).
POSITIONAL = {
    "rope": {"position": "rope"},
    "rope-yarn-partial": {"position": "rope", "position_config": {
        "scaling": "yarn", "scaling_factor": 4.0, "original_length": 12, "partial_rotary_factor": 0.5}},
    "alibi": {"position": "alibi"},
}


@once_on_keras3("both converters get the same formulations, and CI time is tight")
@pytest.mark.parametrize("target", ["gpu", "gl"])
@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_rope_and_alibi_files_on_the_gpu_runtimes(edge, name, target, tflite_file, half_precision):
    model = demo_model(POSITIONAL[name])
    ids, _ = export.sample_token_batch(model, LENGTH, rows=ROWS, seed=6)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
    assert export.gpu_incompatible_ops(flat, "webgpu" if target == "gpu" else "gl") == []
    check = check_gpu_file if target == "gpu" else check_gl_file
    check(edge, half_precision, tflite_file(target, flat), model, ids, None, 1e-4)


# T = 512 at d_model 512 (the seed's width; 2 layers to keep the conversion short): conversion only.
WIDE = dict(num_layers=2, d_model=512, num_heads=8, dff=2048, vocab_size=8000, max_length=512, dropout=0.0)


@once_on_keras2("both converters get the same gl formulation, and CI time is tight")
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
    assert export.check_onnx_parity(model, onnx, ids, languages) <= 1e-4  # every row, left and right padded
    feeds = [ids] + ([] if languages is None else [languages])
    roles = ["token_ids"] + ([] if languages is None else ["language_ids"])
    half_precision(export.run_onnx(half, feeds, roles), export.run_onnx(onnx, feeds, roles), ids != 0)


@pytest.fixture(scope="module")
def host_model():
    return demo_model({"table": "full", "vocab_size": 3000})


def test_tensorrt_host_embedding_onnx_on_onnxruntime(edge, host_model, half_precision):
    """`to_onnx(embedding="host")`: int32 ids and float32 rows table[ids] in, no token table inside."""
    import onnx as onnx_lib

    model = host_model
    ids, _ = export.sample_token_batch(model, LENGTH, rows=ROWS, seed=4)
    onnx = export.to_onnx(model, sequence_length=LENGTH, embedding="host")
    proto = onnx_lib.load_from_string(onnx)
    inputs = {i.name: ([d.dim_value for d in i.type.tensor_type.shape.dim], i.type.tensor_type.elem_type)
              for i in proto.graph.input}
    assert sorted(inputs.values()) == [([1, LENGTH], onnx_lib.TensorProto.INT32),
                                       ([1, LENGTH, DEMO["d_model"]], onnx_lib.TensorProto.FLOAT)]
    vocab = model.encoder_config["vocab_size"]
    assert not [t.name for t in proto.graph.initializer if list(t.dims) == [vocab, DEMO["d_model"]]]
    graph = export.to_onnx(model, sequence_length=LENGTH)
    assert len(graph) - len(onnx) >= vocab * DEMO["d_model"] * 4  # the token table stays on the host
    table, half = export.host_embedding_table(model), float16_copy(onnx)
    assert export.check_onnx_parity(model, onnx, ids) <= 1e-4
    feeds, roles = [ids, table[ids]], ["token_ids", "embeddings"]
    half_precision(export.run_onnx(half, feeds, roles), export.run_onnx(onnx, feeds, roles), ids != 0)


# Each converter's file runs on one runtime: the segment ids' graph is the same for both targets'
# converters, and each target's other files run from both converters above.
@pytest.mark.parametrize("target", [
    pytest.param("gl", marks=once_on_keras2("the GL delegate gets TensorFlow 2.12's file, as Jetson")),
    pytest.param("gpu", marks=once_on_keras3("LiteRT's GPU accelerator gets TensorFlow 2.21's file"))])
def test_runtime_segment_ids_on_gl_and_litert(edge, tflite_file, half_precision, target):
    """Packed rows with runtime segment ids: per-segment positions and block-diagonal attention on GPU."""
    from keras_posenc.layers.encoder import Encoder

    keras.utils.set_random_seed(2)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    segments = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
    hidden = Encoder(2, 64, 4, 128, 1000, LENGTH, dropout=0.0)(ids, segment_ids=segments)
    model = keras.Model([ids, segments], keras.layers.Dense(7)(hidden))
    rng = np.random.default_rng(0)
    runs = [[15, 20, 13], [5, 30, 13], [40, 4, 4], [16, 16, 16]]
    packed = np.stack([np.repeat([1, 2, 3], run) for run in runs]).astype(np.int32)
    # Trained briefly to tell token ids (1 .. 99) apart mod 7: logits with clear winners, as a real
    # head has (a random head puts near-ties within float16 rounding).
    train = rng.integers(1, 100, size=(256, LENGTH)).astype(np.int32)
    train_segments = packed[np.arange(256) % len(runs)]
    optimizer = keras.optimizers.Adam(1e-2)

    @tf.function
    def step(tokens, segment_ids):
        with tf.GradientTape() as tape:
            logits = model([tokens, segment_ids], training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(tokens % 7, logits,
                                                                               from_logits=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    for start in range(0, 150 * 16, 16):
        rows = np.arange(start, start + 16) % 256
        step(tf.constant(train[rows]), tf.constant(train_segments[rows]))
    eval_segments = np.concatenate([packed, packed])  # two rows per packing: 344 real tokens for float16
    tokens = rng.integers(1, 100, size=(len(eval_segments), LENGTH)).astype(np.int32)
    tokens[:, :5] = 0  # left padding
    real = tokens != 0
    expected = model([tokens, eval_segments]).numpy()
    run, dtype = (edge.run_gl, np.float32) if target == "gl" else (edge.run_litert, np.int32)
    path = tflite_file(target, export.to_tflite(model, sequence_length=LENGTH, target=target))
    feeds = {"token_ids": tokens.astype(dtype), "segment_ids": eval_segments.astype(dtype)}
    options = {"rows": len(eval_segments)} if target == "gl" else {}
    result = run(path, feeds, **options)
    assert result.returncode == 0 and edge.refusals(result.log) == [], result.log[-3000:]
    got = result.output.reshape(len(eval_segments), LENGTH, 7)
    assert np.max(np.abs(got[real] - expected[real])) <= 1e-4, target
    half = run(path, feeds, fp16=True, **options)
    assert half.returncode == 0 and edge.refusals(half.log) == [], half.log[-3000:]
    half_precision(half.output.reshape(len(eval_segments), LENGTH, 7), expected, real)
