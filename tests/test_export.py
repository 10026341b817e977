"""Export: every target against Keras (on the TFLite interpreter), per-backend verdicts, errors, CLI.

The runtimes themselves (LiteRT GPU accelerator, the GL delegate, onnxruntime) are exercised by
tests/edge/ (`make test-edge`); here the TFLite CPU interpreter runs each target's file.
"""

import json
import sys

import numpy as np
import pytest
import tensorflow as tf
from stacks import once_on_keras2

from keras_posenc import export
from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import constants, model_spec, runners, shader_ops, window_export
from keras_posenc.layers import SinusoidalPositionEmbedding, TokenAndPositionEmbedding
from keras_posenc.layers.encoder import Encoder
from keras_posenc.layers.sinusoidal_position_embedding import tables

LENGTH = 8
TFLITE_TARGETS = ("gpu", "gl", "cpu")
# Right padding, a one-token row, left padding and a full row.
BATCH = np.array([[3, 4, 5, 6, 0, 0, 0, 0],
                  [9, 0, 0, 0, 0, 0, 0, 0],
                  [0, 0, 7, 8, 9, 1, 2, 3],
                  [4, 4, 8, 9, 10, 11, 12, 13]], np.int32)
# Explicit position ids (reversed, and a decode offset) and packed segments (ids never reused).
POSITIONS = np.array([[7, 6, 5, 4, 3, 2, 1, 0], [3, 4, 5, 6, 7, 8, 9, 10]] * 2, np.int32)
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 2, 2, 2, 3, 3, 3],
                     [1, 1, 1, 1, 2, 2, 2, 2], [1, 2, 3, 4, 5, 6, 7, 8]], np.int32)
LANGUAGES = np.array([0, 1, 1, 0], np.int32)
NEVER = {"SIN", "COS", "RANGE", "SHAPE"}
# The backend whose verdict must be empty for each target.
OWN_BACKENDS = {"gpu": ("webgpu", "opencl"), "gl": ("gl", "webgpu"), "cpu": ()}


def encoder_model(vocab=40, d_model=16, max_length=16, num_layers=1, dff=32, takes=(), language_shape=(),
                  causal=False, **position_kwargs):
    """A functional model around our Encoder plus a Dense head; `takes` names extra inputs."""
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    inputs, kwargs = [ids], {}
    if position_kwargs.get("num_languages"):
        kwargs["language_ids"] = keras.Input(shape=language_shape, dtype="int32", name="language_ids")
    for name in takes:
        kwargs[name] = keras.Input(shape=(None,), dtype="int32", name=name)
    inputs += list(kwargs.values())
    encoder = Encoder(num_layers, d_model, 2, dff, vocab, max_length, dropout=0.0, **position_kwargs)
    hidden = encoder(ids, use_causal_mask=causal, **kwargs)
    outputs = keras.layers.Dense(5, dtype="float32")(hidden)
    return keras.Model(inputs if len(inputs) > 1 else ids, outputs)


def embedding_model(num_languages=None, language_shape=(), **position_kwargs):
    """TokenAndPositionEmbedding alone: every table kind, quickly."""
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    layer = TokenAndPositionEmbedding(40, 16, 16, dropout=0.0, num_languages=num_languages,
                                      **position_kwargs)
    if num_languages is None:
        return keras.Model(ids, layer(ids))
    languages = keras.Input(shape=language_shape, dtype="int32", name="language_ids")
    return keras.Model([ids, languages], layer(ids, language_ids=languages))


def assert_runs_on(flat, target):
    ops = export.op_counts(flat)
    assert not NEVER & set(ops), ops
    assert not [name for name in ops if name.startswith("Flex")]
    for backend in OWN_BACKENDS[target]:
        assert export.gpu_incompatible_ops(flat, backend) == [], (backend, ops)
    if target in ("gpu", "gl"):
        assert not {"GATHER", "GATHER_ND", "SELECT", "SELECT_V2"} & set(ops)
    else:
        assert "GATHER" in ops
    if target == "gl":  # no shader in the GL backend; the LiteRT GPU accelerator runs them (tests/edge)
        assert not {"TRANSPOSE", "BATCH_MATMUL"} & set(ops)


@pytest.fixture(scope="module")
def fp32_model():
    keras.utils.set_random_seed(1)
    return encoder_model()


@pytest.fixture(scope="module", params=TFLITE_TARGETS)
def fp32_export(request, fp32_model):
    return request.param, export.to_tflite(fp32_model, sequence_length=LENGTH, target=request.param)


def test_every_target_matches_keras(fp32_model, fp32_export):
    target, flat = fp32_export
    assert_runs_on(flat, target)
    assert export.check_parity(fp32_model, flat, BATCH) <= 1e-4
    # Padding positions agree too for a non-causal float32 encoder.
    assert export.check_parity(fp32_model, flat, BATCH, ignore_padding=False) <= 1e-4


def test_gl_takes_float_inputs_and_gpu_int32(fp32_export):
    target, flat = fp32_export
    details = export.interpreter_class()(model_content=flat).get_input_details()
    assert [d["dtype"] for d in details] == [np.float32 if target == "gl" else np.int32]
    assert details[0]["shape"].tolist() == [1, LENGTH]


# Branches of the position layers, on every target (issue: position_ids, segment_ids,
# zero_padding=False, language ids) ----------------------------------------------------------
BRANCHES = {
    "position_ids": (dict(takes=("position_ids",)), dict(position_ids=POSITIONS)),
    "segment_ids": (dict(takes=("segment_ids",)), dict(segment_ids=SEGMENTS)),
    "zero_padding_false": (dict(zero_padding=False), {}),
    "languages_per_row": (dict(num_languages=2), dict(language_ids=LANGUAGES)),
    "languages_per_token": (dict(num_languages=2, language_shape=(LENGTH,)),
                            dict(language_ids=np.repeat(LANGUAGES[:, None], LENGTH, axis=1))),
    "causal_segments": (dict(takes=("segment_ids",), causal=True), dict(segment_ids=SEGMENTS)),
}


def branch_model(branch):
    keras.utils.set_random_seed(4)
    model = encoder_model(**BRANCHES[branch][0])
    for weight in model.weights:
        if "language_scale" in weight.name:
            weight.assign([1.0, 3.0])  # distinct scales, so a wrong language would show
    return model


@pytest.mark.parametrize("target", TFLITE_TARGETS)
@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_every_branch_on_every_target(branch, target):
    model = branch_model(branch)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
    assert_runs_on(flat, target)
    assert export.check_parity(model, flat, BATCH, **BRANCHES[branch][1]) <= 1e-4


@once_on_keras2("check_parity's sensitivity; test_every_branch_on_every_target checks the same files on both")
@pytest.mark.parametrize("target", TFLITE_TARGETS)
@pytest.mark.parametrize("branch", ["position_ids", "segment_ids", "languages_per_row"])
def test_parity_catches_a_table_shifted_by_one_row(branch, target, monkeypatch):
    # The mutation of the issue: the exported table shifted by one row. The parity must see it.
    model = branch_model(branch)
    original = constants.Frozen.__init__

    def shifted(self, layer):
        original(self, layer)
        self.table = np.roll(self.table, 1, axis=0)

    monkeypatch.setattr(constants.Frozen, "__init__", shifted)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
    assert export.check_parity(model, flat, BATCH, **BRANCHES[branch][1]) > 1e-2


@pytest.mark.parametrize("target", TFLITE_TARGETS)
def test_zero_padding_false_keeps_row_zero_at_padding(target):
    # Without zero padding, padding positions get row 0 of the table (not zeros): compared at the
    # padding positions too, so a dropped padding factor (ids not zeroed there) shows.
    keras.utils.set_random_seed(3)
    model = embedding_model(zero_padding=False)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
    assert export.check_parity(model, flat, BATCH, ignore_padding=False) <= 1e-5
    padded = export.run_interpreter(flat, [BATCH[1:2]])[0, 3]
    token = model.layers[1].token_embedding.embeddings.numpy()[0] * np.sqrt(16)
    expected = token + tables.sinusoidal_table(1, 16, dtype=np.float64)[0]
    np.testing.assert_allclose(padded, expected, atol=1e-5)


@pytest.mark.parametrize("target", TFLITE_TARGETS)
@pytest.mark.parametrize("position_kwargs", [
    {"table": "full"}, {"table": "factorized"}, {"table": "interpolated", "stored_dims": 4},
    {"position": "learned"}, {"table": "full", "layout": "concat"}])
def test_every_table_kind_exports_with_its_own_values(position_kwargs, target):
    keras.utils.set_random_seed(3)
    model = embedding_model(**position_kwargs)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
    assert_runs_on(flat, target)
    assert export.check_parity(model, flat, BATCH, ignore_padding=False) <= 1e-5


def test_interpolated_table_is_exported_with_its_interpolation_error():
    # The export must carry the layer's own (lossy) rows, not an exact table.
    lossy = embedding_model(table="interpolated", stored_dims=4)
    exact = embedding_model(table="full")
    exact.set_weights(lossy.get_weights())
    flat = export.to_tflite(lossy, sequence_length=LENGTH)
    ids = BATCH[3:]
    got = export.run_interpreter(flat, [ids])
    assert np.abs(got - lossy(ids).numpy()).max() <= 1e-5
    assert np.abs(got - exact(ids).numpy()).max() > 1e-3


def test_sinusoidal_layer_alone_exports_its_table():
    ids = keras.Input(shape=(None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 6)(ids)
    model = keras.Model(ids, SinusoidalPositionEmbedding(max_length=16)(embedded))
    flat = export.to_tflite(model, sequence_length=5, target="cpu")
    out = export.run_interpreter(flat, [np.zeros([1, 5], np.int32)])
    expected = model.layers[1].get_weights()[0][0] + tables.sinusoidal_table(5, 6, dtype=np.float64)
    np.testing.assert_allclose(out[0], expected, atol=1e-6)


def test_demo_size_causal_lm_on_gpu_and_gl():
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(8)
    model = CausalLM(dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=300, max_length=48,
                          dropout=0.0), name="lm")
    model.build_on_dummy()
    ids, _ = export.sample_token_batch(model, 48)
    for target in ("gpu", "gl"):
        flat = export.to_tflite(model, sequence_length=48, target=target)
        assert_runs_on(flat, target)
        assert export.check_parity(model, flat, ids) <= 1e-4


def test_float16_weights_halve_the_file_on_the_gpu_target():
    keras.utils.set_random_seed(6)
    model = encoder_model(vocab=3000, d_model=64, dff=128)
    fp32 = export.to_tflite(model, sequence_length=LENGTH)
    fp16 = export.to_tflite(model, sequence_length=LENGTH, quantize="float16")
    assert len(fp16) <= 0.6 * len(fp32)
    assert_runs_on(fp16, "gpu")
    assert export.check_parity(model, fp16, BATCH) <= 2e-2
    int8 = export.to_tflite(model, sequence_length=LENGTH, target="cpu", quantize="dynamic_int8")
    assert len(int8) <= 0.35 * len(export.to_tflite(model, sequence_length=LENGTH, target="cpu"))
    assert 0 < export.check_parity(model, int8, BATCH) < 0.5


def test_mixed_float16_model_exports_as_float32():
    keras.utils.set_random_seed(7)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = encoder_model()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.layers[1].compute_dtype == "float16"
    flat = export.to_tflite(model, sequence_length=LENGTH)
    assert_runs_on(flat, "gpu")
    assert "DEQUANTIZE" not in export.op_counts(flat)
    # Against a float16-computing Keras model: float16 rounding, not export error.
    assert export.check_parity(model, flat, BATCH) <= 2e-2


def test_batch_size_is_fixed_and_parity_feeds_in_chunks(fp32_model):
    flat = export.to_tflite(fp32_model, sequence_length=LENGTH, target="cpu", batch_size=2)
    details = export.interpreter_class()(model_content=flat).get_input_details()
    assert details[0]["shape"].tolist() == [2, LENGTH]
    assert export.check_parity(fp32_model, flat, BATCH) <= 1e-4
    with pytest.raises(ValueError, match="target='gl' exports batch 1 only.*batch_size=2"):
        export.to_tflite(fp32_model, sequence_length=LENGTH, target="gl", batch_size=2)


@pytest.mark.parametrize("embedding", ["graph", "host"])
def test_gpu_target_exports_a_batch_of_two_rows(fp32_model, embedding):
    """The LiteRT GPU accelerator runs batch > 1 (tests/edge): rows of one batch stay independent."""
    flat = export.to_tflite(fp32_model, sequence_length=LENGTH, target="gpu", batch_size=2,
                            embedding=embedding)
    details = export.interpreter_class()(model_content=flat).get_input_details()
    assert [d["shape"].tolist() for d in details][0] == [2, LENGTH]
    assert export.gpu_incompatible_ops(flat, backend="webgpu") == []
    assert export.check_parity(fp32_model, flat, BATCH) <= 1e-4


def test_gpu_batch_with_runtime_segment_ids_is_refused():
    model = encoder_model(takes=("segment_ids",))
    assert export.check_parity(model, export.to_tflite(model, sequence_length=LENGTH, target="gpu"), BATCH,
                               segment_ids=SEGMENTS) <= 1e-4
    with pytest.raises(ValueError, match=r"runtime segment_ids export batch 1 only, got shape \(2, 8\)"):
        export.to_tflite(model, sequence_length=LENGTH, target="gpu", batch_size=2)


# Verdicts ------------------------------------------------------------------------------------
def test_op_counts_match_the_analyzer_listing(fp32_model):
    flat = export.to_tflite(fp32_model, sequence_length=LENGTH, target="cpu")
    report = export.analyzer_report(flat)
    listed = [line.split("Op#")[1].split()[1].split("(")[0] for line in report.splitlines() if "Op#" in line]
    counts = {name: listed.count(name) for name in set(listed)}
    assert export.op_counts(flat) == dict(sorted(counts.items()))
    assert [op.name for op in export.operators(flat)] == listed


def test_cpu_file_lists_its_missing_gl_ops(fp32_model):
    flat = export.to_tflite(fp32_model, sequence_length=LENGTH, target="cpu")
    ops = set(export.op_counts(flat))
    missing = export.gpu_incompatible_ops(flat, "gl")
    # The ops without a GL shader, MEAN (its shader cannot reduce channels) and the ops on int32
    # tensors (the delegate: "ADD: OP is supported, but tensor type/shape isn't compatible").
    # On Keras 3 also MUL: TF 2.21 leaves broadcasting MULs that the delegate's parser refuses.
    keras3_mul = {"MUL"} if is_keras3() else set()
    assert set(missing) == (ops - export.GL_SHADER_OPS) | {"MEAN", "ADD", "RESHAPE"} | keras3_mul
    assert {"GATHER", "TRANSPOSE", "CAST", "MEAN"} <= set(missing)
    if not is_keras3():  # Keras 2's MultiHeadAttention splits its heads with SPLIT; Keras 3 reshapes
        assert "SPLIT" in missing
    line = export.verdict_line(flat, "gl")
    assert line.startswith("OpenGL ES (Jetson + tflite-runtime): NOT fully accelerated")
    assert "MEAN (over channels)" in line and "ADD (int or bool tensors)" in line and "GATHER" in line
    assert export.gpu_incompatible_ops(flat, "webgpu") == ["EMBEDDING_LOOKUP", "GATHER", "SELECT_V2"]


def test_keras_attention_mask_ops_are_flagged_by_the_gpu_verdicts():
    # Keras 2 MultiHeadAttention with the Keras mask slices it with a new axis: STRIDED_SLICE v3,
    # beyond the GPU parser's v2 (what LiteRT 2.3 reported for the old export).
    keras.utils.set_random_seed(2)
    ids = keras.Input(shape=(None,), dtype="int32")
    x = TokenAndPositionEmbedding(40, 16, 16, dropout=0.0)(ids)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.MultiHeadAttention(2, 8)(x, x))
    model = keras.Model(ids, x)
    flat = export.to_tflite(model, sequence_length=LENGTH)
    if is_keras3():  # Keras 3 masks the scores with where(): a float SELECT_V2 that LiteRT's GPU runs
        assert export.gpu_incompatible_ops(flat, "webgpu") == []
        assert {"TRANSPOSE", "SELECT_V2", "BATCH_MATMUL"} <= set(export.gpu_incompatible_ops(flat, "gl"))
    else:
        versions = {op.version for op in export.operators(flat) if op.name == "STRIDED_SLICE"}
        assert versions == {3}
        assert "STRIDED_SLICE" in export.gpu_incompatible_ops(flat, "webgpu")
        assert {"TRANSPOSE", "STRIDED_SLICE"} <= set(export.gpu_incompatible_ops(flat, "gl"))
    assert export.check_parity(model, flat, BATCH) <= 1e-4


@pytest.mark.parametrize("shapes, flagged", [
    (([1, 4, 1, 3], [1, 1, 5, 3]), True),   # neither dominates: the trap of a folded tf.tile
    (([1, 4, 5, 3], [1, 4, 1, 3]), False),  # one at least the other everywhere
    (([1, 4, 5, 3], [1, 4, 5, 3]), False)])
def test_gl_verdict_applies_the_mul_broadcast_limit(shapes, flagged):
    function = tf.function(lambda a, b: a * b, input_signature=[tf.TensorSpec(s, tf.float32) for s in shapes])
    flat = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()]).convert()
    assert (export.gpu_incompatible_ops(flat, "gl") == ["MUL"]) is flagged


@pytest.mark.parametrize("dtype, flagged", [(tf.float32, False), (tf.int32, True)])
def test_webgpu_verdict_takes_float_select_v2_only(dtype, flagged):
    # LiteRT's GPU runs a float SELECT_V2 with a scalar branch (the Keras 3 attention mask; tests/edge).
    function = tf.function(lambda x: tf.where(x > 0, x, tf.ones([], dtype)),
                           input_signature=[tf.TensorSpec([1, 4, 6], dtype)])
    flat = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()]).convert()
    assert "SELECT_V2" in export.op_counts(flat)
    assert (export.gpu_incompatible_ops(flat, "webgpu") == ["SELECT_V2"]) is flagged


@pytest.mark.parametrize("shape, constant, flagged", [
    ([1, 4, 1], [1, 1, 5], True),      # "MUL requires one tensor that not less than second in all dimensions"
    ([1, 4], [1, 4, 4], True),         # "Doesn't support broadcasting - input0: [1,4], input1: [1,4,4]"
    ([1, 4, 5, 3], [1, 5, 3], False),  # 3-D into 4-D with batch 1: the parser's allowed case
    ([1, 4, 5], [5], False)])          # a per-channel constant
def test_gl_verdict_applies_the_parser_broadcast_rules_to_constants(shape, constant, flagged):
    weights = np.arange(1, np.prod(constant) + 1, dtype=np.float32).reshape(constant)
    function = tf.function(lambda a: a * weights, input_signature=[tf.TensorSpec(shape, tf.float32)])
    flat = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()]).convert()
    assert export.op_counts(flat) == {"MUL": 1}
    assert (export.gpu_incompatible_ops(flat, "gl") == ["MUL"]) is flagged


def test_no_bare_compatible_verdict_is_left_in_the_package():
    import pathlib

    import keras_posenc

    root = pathlib.Path(keras_posenc.__file__).parent
    hits = [str(path) for path in root.rglob("*.py") if "GPU delegate: compatible" in path.read_text()]
    assert hits == []


def test_report_names_each_backend(fp32_model):
    flat = export.to_tflite(fp32_model, sequence_length=LENGTH, target="gl")
    ids, _ = export.sample_token_batch(fp32_model, LENGTH)
    report = export.export_report(fp32_model, flat, ids, target="gl")
    assert report["verdicts"]["gl"] == [] and report["parity"] <= 1e-4
    assert report["weight_bytes"] == sum(w.size * 4 for w in fp32_model.get_weights())
    text = "\n".join(export.format_report(report))
    count = len(export.operators(flat))
    assert f"OpenGL ES (Jetson + tflite-runtime): all {count} ops have shaders" in text
    assert "compatible" not in text


# Errors -------------------------------------------------------------------------------------
def test_sequence_length_beyond_max_length(fp32_model):
    with pytest.raises(ValueError, match=r"`sequence_length`=17 exceeds the model's max_length=16"):
        export.to_tflite(fp32_model, sequence_length=17)


def test_unknown_target_and_quantize_mode(fp32_model):
    with pytest.raises(ValueError, match=r"`target` must be one of .*got target='vulkan'"):
        export.to_tflite(fp32_model, sequence_length=LENGTH, target="vulkan")
    with pytest.raises(ValueError, match=r"target='tensorrt' exports ONNX: use to_onnx"):
        export.to_tflite(fp32_model, sequence_length=LENGTH, target="tensorrt")
    with pytest.raises(ValueError, match=r"`quantize` must be one of .*got quantize='int2'"):
        export.to_tflite(fp32_model, sequence_length=LENGTH, quantize="int2")


def test_missing_and_unnamed_inputs():
    model = encoder_model(takes=("segment_ids",))
    flat = export.to_tflite(model, sequence_length=LENGTH, target="cpu")
    with pytest.raises(ValueError, match=r"takes \['token_ids', 'segment_ids'\]: pass `segment_ids`"):
        export.check_parity(model, flat, BATCH)
    ids, other = keras.Input(shape=(None,), dtype="int32"), keras.Input(shape=(None,), dtype="int32")
    unnamed = keras.Model([ids, other], Encoder(1, 8, 2, 8, 20, 16)(ids, position_ids=other))
    with pytest.raises(ValueError, match=r"input 1 \('(input|keras_tensor)_\d+'\) is not one of"):
        export.to_tflite(unnamed, sequence_length=4)


def test_model_without_keras_posenc_layers():
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, keras.layers.Embedding(10, 4)(ids))
    with pytest.raises(ValueError, match="contains no keras_posenc position layer"):
        export.to_tflite(model, sequence_length=4)


class Doubler(keras.layers.Layer):
    def call(self, x):
        return 2 * x


def test_model_with_an_unknown_custom_layer():
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, Doubler(name="doubler")(TokenAndPositionEmbedding(10, 4, 8)(ids)))
    with pytest.raises(ValueError, match=r"layers the exporter does not know: 'doubler' \(.*Doubler\)"):
        export.to_tflite(model, sequence_length=4)


def test_missing_and_corrupt_model_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="Model file not found"):
        export.load_model(str(tmp_path / "missing.keras"))
    corrupt = tmp_path / "corrupt.keras"
    corrupt.write_bytes(b"not a zip archive")
    with pytest.raises(ValueError, match="Could not load a Keras model from"):
        export.load_model(str(corrupt))


def test_saved_file_round_trip(fp32_model, tmp_path):
    path = str(tmp_path / "model.keras")
    fp32_model.save(path)
    loaded = export.load_model(path)
    flat = export.to_tflite(loaded, sequence_length=LENGTH)
    assert export.check_parity(fp32_model, flat, BATCH) <= 1e-4


def test_not_a_flatbuffer():
    with pytest.raises(ValueError, match="not a TFLite flatbuffer"):
        export.op_counts(b"\x00" * 32)
    with pytest.raises(TypeError, match="`tflite_bytes` must be bytes"):
        export.gpu_incompatible_ops("model.tflite")
    with pytest.raises(ValueError, match=r"`backend` must be one of .*got backend='metal'"):
        export.gpu_incompatible_ops(b"", backend="metal")


# Command line -------------------------------------------------------------------------------
def test_export_command_names_the_backend_and_fails_on_request(tmp_path, capsys):
    from keras_posenc.app import cli
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(8)
    model = CausalLM(dict(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=40, max_length=16,
                          dropout=0.0), name="lm")
    model.build_on_dummy()
    model.save(str(tmp_path / "model.keras"), save_format="keras_v3")
    out = str(tmp_path / "model.tflite")
    argv = ["export", str(tmp_path / "model.keras"), "--out", out, "--sequence-length", "12"]
    assert cli.main(argv + ["--require-gpu"]) == 0
    printed = capsys.readouterr().out
    flat = open(out, "rb").read()
    count = len(export.operators(flat))
    assert (f"LiteRT GPU accelerator (ai-edge-litert CompiledModel; WebGPU over Vulkan, JetPack 6): "
            f"all {count} ops run on the GPU") in printed
    gl_line = next(line for line in printed.splitlines() if line.strip().startswith("OpenGL ES (Jetson"))
    assert "NOT fully accelerated; runs on the CPU: " in gl_line  # the gpu file's BATCH_MATMUL, CAST, ...
    assert "BATCH_MATMUL" in gl_line and "CAST" in gl_line
    parity = float(printed.split("max abs diff ")[1].split()[0])
    assert parity <= 1e-4
    batch = export.sample_token_batch(model, 12)[0]
    assert export.check_parity(model, flat, batch) == pytest.approx(parity, rel=0.01, abs=1e-7)
    metadata = json.load(open(out + ".json"))
    assert metadata["vocab_size"] == 40 and metadata["target"] == "gpu" and metadata["input_dtype"] == "int32"
    # The gpu default: the runner looks the rows up (the cost model's choice), from the .npy beside.
    assert metadata["embedding"] == "host" and metadata["inputs"] == ["token_ids", "embeddings"]
    np.testing.assert_array_equal(np.load(out + ".embeddings.npy"), export.host_embedding_table(model))
    assert metadata["cost"]["multiply_adds"] == export.graph_cost(flat)["multiply_adds"] > 0
    assert "Cost: " in printed and "G multiply-adds" in printed
    # The cpu target with --require-gpu, and float16 parity over a 1e-6 tolerance: exit status 1.
    assert cli.main(argv + ["--target", "cpu", "--quantize", "float16", "--require-gpu",
                            "--tolerance", "1e-6"]) == 1
    printed = capsys.readouterr().out
    assert "FAILED: --require-gpu and OpenGL ES (Jetson + tflite-runtime) does not run" in printed
    assert "GATHER" in printed and "FAILED: parity" in printed
    assert cli.main(["export", str(tmp_path / "none.keras"), "--out", out, "--sequence-length", "4"]) == 2
    assert "Model file not found" in capsys.readouterr().err
    # Bad input: clear errors, exit status 2, nothing written.
    bad = ["export", str(tmp_path / "model.keras"), "--out", str(tmp_path / "bad.tflite")]
    for flags, message in ((["--sequence-length", "32"], "=32 exceeds the model's max_length=16"),
                           (["--target", "gl", "--batch-size", "2"], "target='gl' exports batch 1 only"),
                           (["--target", "cpu", "--embedding", "host"], "--embedding host is for the gpu")):
        flags = flags if "--sequence-length" in flags else flags + ["--sequence-length", "12"]
        assert cli.main(bad + flags) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad.tflite").exists()


def test_export_command_runs_each_analysis_once(tmp_path, monkeypatch, capsys):
    """`keras-posenc export`: one ModelSpec, one parity (one interpreter), one flatbuffer decode."""
    from tensorflow.lite.tools import flatbuffer_utils

    from keras_posenc.app import cli
    from keras_posenc.export import flatbuffer
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(8)
    model = CausalLM(dict(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=40, max_length=16,
                          dropout=0.0), name="lm")
    model.build_on_dummy()
    model.save(str(tmp_path / "model.keras"), save_format="keras_v3")
    calls = {"spec": 0, "parity": 0, "interpreter": 0, "decode": 0, "analyzer": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            # Decodes by the package's own code (the TFLite converter decodes its result itself).
            caller = sys._getframe(1).f_globals["__name__"]
            calls[name] += name != "decode" or caller.startswith("keras_posenc")
            return function(*args, **kwargs)
        return wrapper

    spec_of = model_spec.ModelSpec.of.__func__
    monkeypatch.setattr(model_spec.ModelSpec, "of", classmethod(counted("spec", spec_of)))
    monkeypatch.setattr(window_export, "parity", counted("parity", window_export.parity))
    monkeypatch.setattr(runners, "interpreter_class", counted("interpreter", runners.interpreter_class))
    monkeypatch.setattr(flatbuffer_utils, "convert_bytearray_to_object",
                        counted("decode", flatbuffer_utils.convert_bytearray_to_object))
    monkeypatch.setattr(flatbuffer, "analyzer_report", counted("analyzer", flatbuffer.analyzer_report))
    out = str(tmp_path / "model.tflite")
    assert cli.main(["export", str(tmp_path / "model.keras"), "--out", out, "--sequence-length", "12"]) == 0
    assert "Parity vs Keras: max abs diff" in capsys.readouterr().out
    # Three backends' verdicts (webgpu, opencl, gl), two analyzer readers: one decode, one analyzer run.
    assert calls == {"spec": 1, "parity": 1, "interpreter": 1, "decode": 1, "analyzer": 1}


# float16 safety, quadratic constants, host embedding, cost ----------------------------------
def test_token_ids_above_2048_are_split_into_exact_digits():
    """vocab > 2048: two one-hot digits joined by an outer product select the id's own row."""
    keras.utils.set_random_seed(4)
    model = encoder_model(vocab=5000, causal=True)
    batch = np.array([[2049, 2051, 4097, 4999, 0, 0, 0, 0], [1, 2048, 3333, 4998, 4096, 7, 0, 0]], np.int32)
    for target in ("gpu", "gl"):
        flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
        assert ("FLOOR_DIV" in export.op_counts(flat)) == (target == "gpu")  # int32 ids on gpu only
        assert export.check_parity(model, flat, batch) <= 1e-4


def test_masked_scores_are_finite_in_float16():
    assert np.isfinite(np.float16(shader_ops.MASKED))
    assert np.exp(np.float32(shader_ops.MASKED) + 50.0) == 0.0  # a masked key gets exactly 0 weight


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_constants_beyond_the_weights_grow_at_most_quadratically(target):
    """Doubling T at most quadruples what the formulation adds (a [T, T*T] constant would octuple it)."""
    keras.utils.set_random_seed(2)
    model = encoder_model(max_length=64, takes=("segment_ids",), causal=True)
    extra = []
    for length in (16, 32, 64):
        cost = export.graph_cost(export.to_tflite(model, sequence_length=length, target=target))
        extra.append(cost["constant_bytes"] - export.weight_bytes(model))
    assert extra[2] / extra[1] <= 4.2 and extra[1] / extra[0] <= 4.2, extra


def test_graph_cost_counts_the_dense_products_of_the_cpu_file():
    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    hidden = TokenAndPositionEmbedding(40, 16, 16, dropout=0.0)(ids)
    model = keras.Model(ids, keras.layers.Dense(24)(hidden))
    cost = export.graph_cost(export.to_tflite(model, sequence_length=LENGTH, target="cpu"))
    # The head (T x 16 x 24) and the sqrt(d) scale and mask MULs (T x 16 each at most).
    assert LENGTH * 16 * 24 <= cost["multiply_adds"] <= LENGTH * 16 * 24 + 3 * LENGTH * 16
    assert cost["largest_tensor_bytes"] == LENGTH * 24 * 4


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_host_embedding_takes_the_looked_up_rows(target):
    keras.utils.set_random_seed(5)
    model = encoder_model(vocab=40, causal=True)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target, embedding="host")
    details = export.interpreter_class()(model_content=flat).get_input_details()
    shapes = sorted(tuple(d["shape"]) for d in details)
    assert shapes == [(1, LENGTH), (1, LENGTH, 16)]
    assert export.check_parity(model, flat, BATCH) <= 1e-4
    graph = export.to_tflite(model, sequence_length=LENGTH, target=target, embedding="graph")
    # The one-hot lookup is gone: T x vocab x d_model multiply-adds fewer (at least).
    saved = export.graph_cost(graph)["multiply_adds"] - export.graph_cost(flat)["multiply_adds"]
    assert saved >= LENGTH * 40 * 16
    assert export.default_embedding(model, target) == "host"


def test_host_embedding_errors(fp32_model):
    with pytest.raises(ValueError, match="is for the gpu and gl targets .* and tensorrt .*target='cpu'"):
        export.to_tflite(fp32_model, sequence_length=LENGTH, target="cpu", embedding="host")
    with pytest.raises(ValueError, match="`embedding` must be one of"):
        export.to_tflite(fp32_model, sequence_length=LENGTH, embedding="table")
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, SinusoidalPositionEmbedding(max_length=16)(keras.layers.Embedding(30, 6)(ids)))
    assert export.default_embedding(model, "gpu") == "graph"
    no_table = "needs a token embedding, and model '.*' has no TokenAndPosition"
    for target in ("gpu", "gl"):
        with pytest.raises(ValueError, match=no_table):
            export.to_tflite(model, sequence_length=LENGTH, target=target, embedding="host")
    with pytest.raises(ValueError, match=no_table):
        export.to_onnx(model, sequence_length=LENGTH, embedding="host")  # before tf2onnx is imported
    with pytest.raises(ValueError, match="`embedding` must be one of"):
        export.to_onnx(fp32_model, sequence_length=LENGTH, embedding="table")
