"""TFLite export: builtin ops only, GPU-delegate verdict, parity, quantization, errors."""

import json

import numpy as np
import pytest
import tensorflow as tf
from tensorflow import keras

from keras_posenc import export
from keras_posenc.encoder import Encoder
from keras_posenc.layers import SinusoidalPositionEmbedding, TokenAndPositionEmbedding
from keras_posenc.layers.sinusoidal_position_embedding import tables

LENGTH = 8
# Right padding, a one-token row, left padding and a full row.
BATCH = np.array([[3, 4, 5, 6, 0, 0, 0, 0],
                  [9, 0, 0, 0, 0, 0, 0, 0],
                  [0, 0, 7, 8, 9, 1, 2, 3],
                  [4, 4, 8, 9, 10, 11, 12, 13]], np.int32)
FORBIDDEN = {"SIN", "COS", "RANGE", "SHAPE", "GATHER", "GATHER_ND", "SELECT", "SELECT_V2"}


def encoder_model(vocab=40, d_model=16, max_length=16, num_layers=1, dff=32, **position_kwargs):
    """A functional model around our Encoder plus a float32 Dense head."""
    ids = keras.Input(shape=(None,), dtype="int32")
    inputs = [ids]
    language_shape = position_kwargs.pop("language_shape", ())
    encoder = Encoder(num_layers, d_model, 2, dff, vocab, max_length, dropout=0.0, **position_kwargs)
    if position_kwargs.get("num_languages"):
        languages = keras.Input(shape=language_shape, dtype="int32")
        inputs.append(languages)
        hidden = encoder(ids, language_ids=languages)
    else:
        hidden = encoder(ids)
    outputs = keras.layers.Dense(5, dtype="float32")(hidden)
    return keras.Model(inputs if len(inputs) > 1 else ids, outputs)


def hand_built_model(vocab=40, d_model=16, max_length=16):
    """Same shape as the Encoder, from TokenAndPositionEmbedding + keras MHA/LayerNorm/Dense."""
    ids = keras.Input(shape=(None,), dtype="int32")
    x = TokenAndPositionEmbedding(vocab, d_model, max_length, dropout=0.0)(ids)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.MultiHeadAttention(2, 8)(x, x))
    hidden = keras.layers.Dense(32, activation="relu")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.Dense(d_model)(hidden))
    return keras.Model(ids, x)


def assert_gpu_ready(flat):
    ops = export.op_counts(flat)
    assert export.gpu_incompatible_ops(flat) == []
    assert not FORBIDDEN & set(ops), ops
    assert not [name for name in ops if name.startswith("Flex")]


@pytest.fixture(scope="module")
def fp32_model():
    tf.keras.utils.set_random_seed(1)
    return encoder_model()


@pytest.fixture(scope="module")
def fp32_flat(fp32_model):
    return export.to_tflite(fp32_model, sequence_length=LENGTH)


def test_fp32_encoder_export_is_gpu_ready_with_parity(fp32_model, fp32_flat):
    assert_gpu_ready(fp32_flat)
    assert export.check_parity(fp32_model, fp32_flat, BATCH) <= 1e-4
    # Padding positions agree too for float32 (they are excluded by default only
    # because they are float-rounding-decided, see check_parity).
    assert export.check_parity(fp32_model, fp32_flat, BATCH, ignore_padding=False) <= 1e-4


def test_hand_built_model_exports_to_the_documented_builtins():
    tf.keras.utils.set_random_seed(2)
    model = hand_built_model()
    flat = export.to_tflite(model, sequence_length=LENGTH)
    assert_gpu_ready(flat)
    ops = export.op_counts(flat)
    # The TF 2.12 measurement for an encoder without token lookup or masks, plus what
    # the lookup and the masks add in their GPU-friendly form.
    measured = {"ADD", "FULLY_CONNECTED", "MEAN", "MUL", "PACK", "RESHAPE", "RSQRT", "SOFTMAX", "SPLIT",
                "SQUARED_DIFFERENCE", "SUB", "TRANSPOSE"}
    ours = {"CAST", "CUMSUM", "EQUAL", "NOT_EQUAL", "LOGICAL_AND", "STRIDED_SLICE"}
    assert set(ops) <= measured | ours
    assert ops["TRANSPOSE"] > 0  # the OpenGL ES risk of export/README.md is real
    assert export.check_parity(model, flat, BATCH) <= 1e-4


def test_op_counts_match_the_analyzer_listing(fp32_flat):
    report = export.analyzer_report(fp32_flat)
    listed = [line.split("Op#")[1].split()[1].split("(")[0] for line in report.splitlines() if "Op#" in line]
    counts = {name: listed.count(name) for name in set(listed)}
    assert export.op_counts(fp32_flat) == dict(sorted(counts.items()))
    assert sum(counts.values()) == len(listed) > 20


def test_gather_export_is_flagged_by_both_checks(fp32_model, monkeypatch):
    flat = export.to_tflite(fp32_model, sequence_length=LENGTH, gpu_friendly=False)
    assert "GATHER" in export.op_counts(flat)
    assert "GATHER" in export.gpu_incompatible_ops(flat)
    assert export.check_parity(fp32_model, flat, BATCH) <= 1e-4
    # The op-level check alone, whatever the analyzer prints.
    monkeypatch.setattr(export, "analyzer_report", lambda flat: "")
    assert "GATHER" in export.gpu_incompatible_ops(flat)


def test_gpu_incompatible_ops_reads_analyzer_warnings(fp32_flat, monkeypatch):
    report = ("  Op#0 FULLY_CONNECTED(T#0) -> [T#1]\n"
              "GPU COMPATIBILITY WARNING: Some constraint of this op\n"
              "GPU COMPATIBILITY WARNING: Subgraph#0 has GPU delegate compatibility issues at nodes 0\n")
    monkeypatch.setattr(export, "analyzer_report", lambda flat: report)
    assert export.gpu_incompatible_ops(fp32_flat) == ["FULLY_CONNECTED"]


def embedding_model(num_languages=None, language_shape=(), **position_kwargs):
    """TokenAndPositionEmbedding alone: every table kind, quickly."""
    ids = keras.Input(shape=(None,), dtype="int32")
    layer = TokenAndPositionEmbedding(40, 16, 16, dropout=0.0, num_languages=num_languages,
                                      **position_kwargs)
    if num_languages is None:
        return keras.Model(ids, layer(ids))
    languages = keras.Input(shape=language_shape, dtype="int32")
    return keras.Model([ids, languages], layer(ids, language_ids=languages))


@pytest.mark.parametrize("position_kwargs", [
    {"table": "full"}, {"table": "factorized"}, {"table": "interpolated", "stored_dims": 4},
    {"position": "learned"}, {"table": "full", "layout": "concat"}])
def test_every_table_kind_exports_with_its_own_values(position_kwargs):
    tf.keras.utils.set_random_seed(3)
    model = embedding_model(**position_kwargs)
    flat = export.to_tflite(model, sequence_length=LENGTH)
    assert_gpu_ready(flat)
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


@pytest.mark.parametrize("language_shape", [(), (LENGTH,)])
def test_per_language_scaling_exports(language_shape):
    tf.keras.utils.set_random_seed(5)
    model = embedding_model(num_languages=3, language_shape=language_shape)
    scales = [w for w in model.weights if "language_scale" in w.name][0]
    scales.assign([1.0, 0.25, 3.0])  # distinct scales, so a wrong language would show
    flat = export.to_tflite(model, sequence_length=LENGTH)
    assert_gpu_ready(flat)
    languages = np.array([0, 1, 2, 1], np.int32)
    if language_shape:
        languages = np.repeat(languages[:, None], LENGTH, axis=1)
    assert export.check_parity(model, flat, BATCH, languages) <= 1e-5
    swapped = export.run_interpreter(flat, [BATCH, languages[::-1].copy()])
    assert np.abs(swapped - model([BATCH, languages]).numpy()).max() > 1e-2


def test_encoder_with_languages_exports():
    tf.keras.utils.set_random_seed(5)
    model = encoder_model(num_languages=2, language_shape=(LENGTH,))
    flat = export.to_tflite(model, sequence_length=LENGTH)
    assert_gpu_ready(flat)
    languages = np.repeat(np.array([[0], [1], [1], [0]], np.int32), LENGTH, axis=1)
    assert export.check_parity(model, flat, BATCH, languages) <= 1e-4


def test_sinusoidal_layer_alone_exports_its_table():
    ids = keras.Input(shape=(None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 6)(ids)
    model = keras.Model(ids, SinusoidalPositionEmbedding(max_length=16)(embedded))
    flat = export.to_tflite(model, sequence_length=5)
    out = export.run_interpreter(flat, [np.zeros([1, 5], np.int32)])
    expected = model.layers[1].get_weights()[0][0] + tables.sinusoidal_table(5, 6, dtype=np.float64)
    np.testing.assert_allclose(out[0], expected, atol=1e-6)


def test_float16_halves_the_file_and_stays_gpu_ready():
    tf.keras.utils.set_random_seed(6)
    model = encoder_model(vocab=3000, d_model=64, dff=128)
    fp32 = export.to_tflite(model, sequence_length=LENGTH)
    fp16 = export.to_tflite(model, sequence_length=LENGTH, quantize="float16")
    assert len(fp16) <= 0.55 * len(fp32)
    assert_gpu_ready(fp16)
    assert export.check_parity(model, fp16, BATCH) <= 2e-2
    int8 = export.to_tflite(model, sequence_length=LENGTH, quantize="dynamic_int8")
    assert len(int8) <= 0.35 * len(fp32)
    assert 0 < export.check_parity(model, int8, BATCH) < 0.5


def test_mixed_float16_model_exports_as_float32():
    tf.keras.utils.set_random_seed(7)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = encoder_model()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.layers[1].compute_dtype == "float16"
    flat = export.to_tflite(model, sequence_length=LENGTH)
    assert_gpu_ready(flat)
    assert "DEQUANTIZE" not in export.op_counts(flat)
    # Against a float16-computing Keras model: float16 rounding, not export error.
    assert export.check_parity(model, flat, BATCH) <= 2e-2


def test_batch_size_is_fixed_and_parity_feeds_in_chunks(fp32_model):
    flat = export.to_tflite(fp32_model, sequence_length=LENGTH, batch_size=2)
    details = tf.lite.Interpreter(model_content=flat).get_input_details()
    assert details[0]["shape"].tolist() == [2, LENGTH]
    assert export.check_parity(fp32_model, flat, BATCH) <= 1e-4


def test_report_and_sample_batch(fp32_model, fp32_flat):
    ids, languages = export.sample_token_batch(fp32_model, LENGTH)
    assert languages is None and ids.shape == (4, LENGTH)
    assert (ids[1, LENGTH // 2:] == 0).all() and (ids[3, :2] == 0).all() and (ids[0] != 0).all()
    report = export.export_report(fp32_model, fp32_flat, ids)
    assert report["gpu_incompatible"] == [] and report["parity"] <= 1e-4
    assert report["weight_bytes"] == sum(w.size * 4 for w in fp32_model.get_weights())
    text = "\n".join(export.format_report(report))
    assert "GPU delegate: compatible" in text and "TRANSPOSE ops:" in text


# Errors -------------------------------------------------------------------------------------
def test_sequence_length_beyond_max_length(fp32_model):
    with pytest.raises(ValueError, match=r"`sequence_length`=17 exceeds the model's max_length=16"):
        export.to_tflite(fp32_model, sequence_length=17)


def test_unknown_quantize_mode(fp32_model):
    with pytest.raises(ValueError, match=r"`quantize` must be one of .*got quantize='int4'"):
        export.to_tflite(fp32_model, sequence_length=LENGTH, quantize="int4")


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


# Command line -------------------------------------------------------------------------------
def test_export_command_reports_and_fails_on_request(tmp_path, capsys):
    from keras_posenc import cli
    from keras_posenc.train import CausalLM

    tf.keras.utils.set_random_seed(8)
    model = CausalLM(dict(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=40, max_length=16,
                          dropout=0.0), name="lm")
    model.build_on_dummy()
    model.save(str(tmp_path / "model.keras"), save_format="keras_v3")
    out = str(tmp_path / "model.tflite")
    argv = ["export", str(tmp_path / "model.keras"), "--out", out, "--sequence-length", "12"]
    assert cli.main(argv + ["--require-gpu"]) == 0
    printed = capsys.readouterr().out
    assert "GPU delegate: compatible" in printed and "FULLY_CONNECTED" in printed
    parity = float(printed.split("max abs diff ")[1].split()[0])
    assert parity <= 1e-4
    flat = open(out, "rb").read()
    batch = export.sample_token_batch(model, 12)[0]
    assert export.check_parity(model, flat, batch) == pytest.approx(parity, rel=0.01)
    assert json.load(open(out + ".json"))["vocab_size"] == 40
    # GATHER ops with --require-gpu, and float16 parity over a 1e-6 tolerance: exit status 1.
    argv += ["--quantize", "float16", "--no-gpu-friendly", "--require-gpu", "--tolerance", "1e-6"]
    assert cli.main(argv) == 1
    printed = capsys.readouterr().out
    assert "FAILED: --require-gpu and the GPU delegate rejects" in printed and "GATHER" in printed
    assert "FAILED: parity" in printed
    assert cli.main(["export", str(tmp_path / "none.keras"), "--out", out, "--sequence-length", "4"]) == 2
    assert "Model file not found" in capsys.readouterr().err
