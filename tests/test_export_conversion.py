"""`keras_posenc.export.conversion` piece by piece: the model's spec, the rebuilt clone, the converter's
options and every refusal, with tiny models (one conversion takes well under a second).

tests/test_export.py converts the branches of every layer for every target; this file pins what the
exporter reads off a model and what it tells the user when it cannot.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from litert_stand_in import FAILED_QUANTIZE, failing_litert_python
from tflite_files import tensor_dtypes

from keras_posenc.backend import is_keras3, keras, save_model
from keras_posenc.export import conversion, model_spec
from keras_posenc.export.contract import TENSORS
from keras_posenc.export.flatbuffer import op_counts
from keras_posenc.export.targets import TARGETS
from keras_posenc.export.tool_env import ToolEnvironmentError
from keras_posenc.layers import (
    RotaryEmbedding,
    SinusoidalPositionEmbedding,
    TokenAndPositionEmbedding,
)
from keras_posenc.layers.encoder import Encoder
from keras_posenc.models import CausalLM
from keras_posenc.seq2seq import Seq2SeqTransformer

LENGTH = 6


def _embedding_model(num_languages=None, language_shape=(), scale_embeddings=True, max_length=16, pad_id=0,
                     seed=3):
    keras.utils.set_random_seed(seed)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    layer = TokenAndPositionEmbedding(30, 8, max_length, dropout=0.0, num_languages=num_languages,
                                      scale_embeddings=scale_embeddings, pad_id=pad_id)
    if num_languages is None:
        return keras.Model(ids, layer(ids), name="tape")
    languages = keras.Input(shape=language_shape, dtype="int32")  # unnamed: the second input
    return keras.Model([ids, languages], layer(ids, language_ids=languages), name="tape")


def _causal_lm(name="lm", **config):
    keras.utils.set_random_seed(4)
    settings = {"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 30, "max_length": 12,
                "dropout": 0.0, **config}
    model = CausalLM(settings, name=name)
    model.build_on_dummy()
    return model


def _message(error):
    return str(error.value)


def _run_file(flat, *arrays):
    """The file's first output for `arrays`, fed in the order of its inputs (by index)."""
    interpreter = tf.lite.Interpreter(model_content=flat)
    interpreter.allocate_tensors()
    details = sorted(interpreter.get_input_details(), key=lambda detail: detail["index"])
    for detail, array in zip(details, arrays):
        interpreter.set_tensor(detail["index"], np.asarray(array, detail["dtype"]))
    interpreter.invoke()
    return np.asarray(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), np.float64)


IDS = np.array([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]], np.int32)


# What the spec reads off a model ---------------------------------------------------------------
def test_the_spec_of_a_plain_model():
    model = _embedding_model(max_length=16)
    spec = model_spec.ModelSpec.of(model, LENGTH, 2)
    assert (spec.model, spec.sequence_length, spec.batch_size) == (model, LENGTH, 2)
    assert (spec.roles, spec.ranks, spec.needs_languages, spec.language_rank) == (["token_ids"], [2], False,
                                                                                   None)
    assert (spec.pad_id, spec.vocab_size, spec.functional) == (0, 30, True)
    assert [type(layer) for layer in spec.position_layers] == [SinusoidalPositionEmbedding]  # the layer's own
    [signature] = spec.signature()
    assert signature.shape.as_list() == [2, LENGTH]
    assert (signature.dtype, signature.name) == (tf.int32, "token_ids")
    assert spec.signature(tf.float32)[0].dtype == tf.float32
    assert model_spec.ModelSpec.of(model, 16, 1).sequence_length == 16  # exactly max_length


@pytest.mark.parametrize("language_shape, rank", [((), 1), ((None,), 2)])
def test_an_unnamed_second_input_of_a_model_with_languages_is_the_language_ids(language_shape, rank):
    model = _embedding_model(num_languages=2, language_shape=language_shape)
    spec = model_spec.ModelSpec.of(model, LENGTH, 3)
    assert (spec.roles, spec.ranks, spec.needs_languages, spec.language_rank) == (
        ["token_ids", "language_ids"], [2, rank], True, rank)
    shapes = [(s.shape.as_list(), s.name) for s in spec.signature()]
    assert shapes == [([3, LENGTH], "token_ids"), ([3, LENGTH][:rank], "language_ids")]


def test_named_inputs_take_their_roles_in_the_model_s_order():
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    segments = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
    positions = keras.Input(shape=(None,), dtype="int32", name="position_ids")
    encoder = Encoder(1, 8, 2, 16, 30, 16, dropout=0.0)
    outputs = encoder(ids, segment_ids=segments, position_ids=positions)
    model = keras.Model([ids, segments, positions], outputs, name="encoder")
    spec = model_spec.ModelSpec.of(model, LENGTH, 1)
    assert spec.roles == ["token_ids", "segment_ids", "position_ids"] and spec.ranks == [2, 2, 2]
    feeds = spec.feeds(np.ones((1, LENGTH)), position_ids=np.arange(LENGTH)[None],
                       segment_ids=np.zeros((1, LENGTH)))
    assert [array.dtype for array in feeds] == [np.int32] * 3
    np.testing.assert_array_equal(feeds[2], np.arange(LENGTH)[None])
    with pytest.raises(ValueError) as error:
        spec.feeds(np.ones((1, LENGTH)), segment_ids=np.zeros((1, 6)))
    assert _message(error) == ("Model 'encoder' takes ['token_ids', 'segment_ids', 'position_ids']: pass "
                               "`position_ids`.")
    with pytest.raises(ValueError) as error:
        spec.feeds(np.ones((1, LENGTH)))
    assert _message(error).endswith(": pass `segment_ids`, `position_ids`.")


def test_inputs_the_exporter_cannot_place_are_refused_with_their_index_and_name():
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    other = keras.Input(shape=(None,), dtype="int32", name="extra")
    layer = TokenAndPositionEmbedding(30, 8, 16, dropout=0.0)
    model = keras.Model([ids, other], layer(ids, position_ids=other), name="two_inputs")
    with pytest.raises(ValueError) as error:
        model_spec.ModelSpec.of(model, LENGTH, 1)
    assert _message(error) == ("Model 'two_inputs': input 1 ('extra') is not one of ('language_ids', "
                               "'position_ids', 'segment_ids'); name the inputs with keras.Input(name=...).")
    twice = [keras.Input(shape=(None,), dtype="int32", name=name)
             for name in ("token_ids", "position_ids", "position_ids_again")]
    model = keras.Model(twice, layer(twice[0], position_ids=twice[1] + twice[2]), name="twice")
    with pytest.raises(ValueError) as error:
        model_spec.ModelSpec.of(model, LENGTH, 1)
    assert _message(error).startswith("Model 'twice': input 2 ('position_ids_again') is not one of ")


def test_a_model_with_languages_and_one_input_is_refused():
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    layer = TokenAndPositionEmbedding(30, 8, 16, dropout=0.0, num_languages=2)
    model = keras.Model(ids, layer(ids, language_ids=ids[:, 0] * 0), name="one_input")
    with pytest.raises(ValueError) as error:
        model_spec.ModelSpec.of(model, LENGTH, 1)
    assert _message(error) == ("Model 'one_input' scales positions per language: it must take "
                               "[token_ids, language_ids] as inputs, got 1 inputs.")


def test_a_subclassed_model_takes_per_token_language_ids():
    spec = model_spec.ModelSpec.of(_causal_lm(num_languages=2), LENGTH, 1)
    assert (spec.roles, spec.ranks, spec.functional) == (["token_ids", "language_ids"], [2, 2], False)
    plain = model_spec.ModelSpec.of(_causal_lm(), LENGTH, 1)
    assert (plain.roles, plain.ranks, plain.pad_id, plain.vocab_size) == (["token_ids"], [2], 0, 30)


def test_models_the_exporter_does_not_take():
    with pytest.raises(TypeError) as error:
        model_spec.ModelSpec.of("model.keras", LENGTH, 1)
    assert _message(error) == "`model` must be a keras Model or Layer, got str."
    config = {"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 30, "max_length": 12}
    with pytest.raises(ValueError) as error:
        model_spec.ModelSpec.of(CausalLM(config, name="unbuilt"), LENGTH, 1)
    assert _message(error) == "Model 'unbuilt' is not built: call it on a batch or load a trained model."
    for name, value in (("sequence_length", 0), ("batch_size", 0)):
        sizes = {"sequence_length": LENGTH, "batch_size": 1, name: value}
        with pytest.raises(ValueError) as error:
            model_spec.ModelSpec.of(_embedding_model(), sizes["sequence_length"], sizes["batch_size"])
        assert _message(error) == f"`{name}` must be >= 1, got {name}=0."
    with pytest.raises(ValueError) as error:
        model_spec.ModelSpec.of(_embedding_model(max_length=16), 17, 1)
    assert _message(error) == "`sequence_length`=17 exceeds the model's max_length=16."
    ids = keras.Input(shape=(None,), dtype="int32")
    no_positions = keras.Model(ids, keras.layers.Embedding(10, 4)(ids), name="plain")
    with pytest.raises(ValueError) as error:
        model_spec.ModelSpec.of(no_positions, LENGTH, 1)
    assert _message(error) == ("Model 'plain' contains no keras_posenc position layer "
                               "(TokenAndPositionEmbedding, SinusoidalPositionEmbedding, ...): nothing to "
                               "export with this tool.")


def test_the_longest_sequence_is_the_shortest_table_rope_included():
    model = _causal_lm(max_length=12)
    assert model_spec.longest_sequence(model) == 12
    x = keras.Input(shape=(None, 8))
    rope = keras.Model(x, RotaryEmbedding(max_length=10)(SinusoidalPositionEmbedding(max_length=14)(x)))
    assert model_spec.longest_sequence(rope) == 10
    with pytest.raises(ValueError) as error:
        model_spec.ModelSpec.of(rope, 11, 1)
    assert _message(error) == "`sequence_length`=11 exceeds the model's max_length=10."
    unbounded = keras.Model(x, RotaryEmbedding()(SinusoidalPositionEmbedding(max_length=14)(x)))
    assert model_spec.longest_sequence(unbounded) == 14
    ids = keras.Input(shape=(None,), dtype="int32")
    assert model_spec.longest_sequence(keras.Model(ids, keras.layers.Embedding(10, 4)(ids))) is None


def test_input_names_stand_for_their_roles():
    assert model_spec.role_of("serving_default_embeddings:0") == TENSORS["embeddings"]
    assert model_spec.role_of("language_ids_1") == "language_ids"
    assert model_spec.role_of("position_ids") == "position_ids"
    assert model_spec.role_of("segment_ids") == "segment_ids"
    assert model_spec.role_of("input_3") == "token_ids"
    assert model_spec.role_of("token_ids") == "token_ids"
    assert model_spec.ROLES == ("token_ids", "language_ids", "position_ids", "segment_ids")


# The host table and the lookup ------------------------------------------------------------------
@pytest.mark.parametrize("scale", [True, False])
def test_the_host_table_is_the_token_table_scaled_as_the_layer_scales_it(scale):
    model = _embedding_model(scale_embeddings=scale)
    table = model_spec.host_embedding_table(model)
    weights = np.asarray(model.layers[1].token_embedding.embeddings.numpy(), np.float64)
    assert table.dtype == np.float32 and table.shape == (30, 8)
    np.testing.assert_allclose(table, weights * (math.sqrt(8) if scale else 1.0), rtol=1e-6)


def test_without_a_token_table_there_are_no_host_rows_and_the_lookup_stays_in_the_graph():
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, SinusoidalPositionEmbedding(max_length=16)(keras.layers.Embedding(30, 8)(ids)),
                        name="sinusoidal")
    with pytest.raises(ValueError) as error:
        model_spec.host_embedding_table(model)
    assert _message(error) == ("`embedding='host'` needs a token embedding, and model 'sinusoidal' has no "
                               "TokenAndPositionEmbedding: export it with embedding='graph'.")
    assert [model_spec.default_embedding(model, target) for target in ("gpu", "gl", "cpu", "tensorrt")] == [
        "graph"] * 4
    lm = _causal_lm()
    assert [model_spec.default_embedding(lm, target) for target in ("gpu", "gl", "cpu", "tensorrt")] == [
        "host", "host", "graph", "graph"]


def test_a_host_file_takes_the_rows_after_the_ids():
    model = _embedding_model()
    flat = conversion.to_tflite(model, sequence_length=LENGTH, target="gpu", embedding="host", batch_size=2)
    interpreter = tf.lite.Interpreter(model_content=flat)
    details = sorted(interpreter.get_input_details(), key=lambda detail: detail["index"])
    assert [(list(detail["shape"]), np.dtype(detail["dtype"]).name) for detail in details] == [
        ([2, LENGTH], "int32"), ([2, LENGTH, 8], "float32")]
    assert TENSORS["embeddings"] in details[1]["name"]
    got = _run_file(flat, IDS, model_spec.host_embedding_table(model)[IDS])
    np.testing.assert_allclose(got, np.asarray(model(IDS, training=False)), atol=1e-5, rtol=0)


# The converter ---------------------------------------------------------------------------------
def test_refusals_before_any_conversion(monkeypatch):
    def no_conversion(*args, **kwargs):
        raise AssertionError("converted before refusing")

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_concrete_functions", no_conversion)
    model = _embedding_model()
    with pytest.raises(ValueError) as error:
        conversion.to_tflite(model, sequence_length=LENGTH, target="tensorrt")
    assert _message(error) == "target='tensorrt' exports ONNX: use to_onnx(model, sequence_length=...)."
    with pytest.raises(ValueError) as error:
        conversion.to_tflite(model, sequence_length=LENGTH, target="cpu", embedding="host")
    assert _message(error) == ("`embedding='host'` is for the gpu and gl targets (their lookup is a one-hot "
                               "product) and tensorrt (to_onnx); target='cpu' GATHERs: use "
                               "embedding='graph'.")
    with pytest.raises(ValueError) as error:
        conversion.to_tflite(model, sequence_length=LENGTH, target="gl", batch_size=2)
    assert _message(error) == ("target='gl' exports batch 1 only (the GL delegate takes the first axis of "
                               "every tensor for the batch), got batch_size=2.")
    with pytest.raises(ValueError) as error:
        conversion.to_tflite(model, sequence_length=LENGTH, embedding="rows")
    assert _message(error).startswith("`embedding` must be one of ('graph', 'host'), got embedding='rows'")


def test_batch_limits_per_target():
    conversion.check_batch_size(1, TARGETS["gl"])
    for name in ("gpu", "cpu", "tensorrt"):
        conversion.check_batch_size(64, TARGETS[name])
    with pytest.raises(ValueError, match="got batch_size=3"):
        conversion.check_batch_size(3, TARGETS["gl"])


def test_a_failed_conversion_names_the_model(monkeypatch):
    def fails(self):
        raise RuntimeError("op FlexSomething is neither a custom op nor a flex op")

    monkeypatch.setattr(tf.lite.TFLiteConverter, "convert", fails)
    with pytest.raises(ValueError) as error:
        conversion.to_tflite(_embedding_model(), sequence_length=LENGTH, target="cpu")
    assert _message(error) == ("TFLite conversion with builtin ops only failed for model 'tape': op "
                               "FlexSomething is neither a custom op nor a flex op")
    assert isinstance(error.value.__cause__, RuntimeError)


def _identity_converter():
    identity = tf.function(lambda x: x, input_signature=[tf.TensorSpec([1], tf.float32)])
    return tf.lite.TFLiteConverter.from_concrete_functions([identity.get_concrete_function()])


def test_the_converter_keeps_batch_matmul_where_the_target_runs_it():
    converter = _identity_converter()
    conversion.keep_batch_matmul(converter)
    if hasattr(converter, "unfold_batchmatmul"):
        assert converter.unfold_batchmatmul is False
    else:
        assert converter._experimental_disable_batchmatmul_unfold is True
    assert [name for name, target in TARGETS.items() if target.keep_batch_matmul] == ["gpu"]


def test_a_converter_with_the_public_switch_gets_it_turned_off():
    """TF >= 2.13 names it `unfold_batchmatmul` (set here on TF 2.12's converter too)."""
    converter = _identity_converter()
    converter.unfold_batchmatmul = True
    conversion.keep_batch_matmul(converter)
    assert converter.unfold_batchmatmul is False
    assert getattr(converter, "_experimental_disable_batchmatmul_unfold", False) is False  # the public one


def test_gpu_attention_keeps_batch_matmul_and_cpu_has_no_variable_left():
    lm = _causal_lm()
    gpu = op_counts(conversion.to_tflite(lm, sequence_length=LENGTH, target="gpu"))
    cpu = op_counts(conversion.to_tflite(lm, sequence_length=LENGTH, target="cpu"))
    assert gpu.get("BATCH_MATMUL", 0) > 0
    for ops in (gpu, cpu):
        assert not {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"} & set(ops)
    assert "GATHER" in cpu and "GATHER" not in gpu


# The clone ---------------------------------------------------------------------------------------
def test_the_clone_has_the_weights_fixed_shapes_and_float32_compute():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _embedding_model()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    spec = model_spec.ModelSpec.of(model, LENGTH, 2)
    clone = model_spec.rebuild(model, spec)
    assert [tuple(tensor.shape) for tensor in clone.inputs] == [(2, LENGTH)]
    assert all(w.dtype == np.float32 for w in clone.get_weights())
    for ours, theirs in zip(clone.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(ours, np.asarray(theirs, np.float32))
    layer = [layer for layer in clone.layers if isinstance(layer, TokenAndPositionEmbedding)][0]
    assert layer.compute_dtype == "float32"
    assert keras.mixed_precision.global_policy().name == "float32"


def test_the_policy_comes_back_after_a_rebuild_that_fails(monkeypatch):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _embedding_model()
        spec = model_spec.ModelSpec.of(model, LENGTH, 1)
        original = TokenAndPositionEmbedding.get_config

        def wider(self):
            return {**original(self), "d_model": 10}

        monkeypatch.setattr(TokenAndPositionEmbedding, "get_config", wider)
        with pytest.raises(ValueError) as error:
            model_spec.rebuild(model, spec)
        assert keras.mixed_precision.global_policy().name == "mixed_float16"
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert _message(error) == ("Could not rebuild model 'tape' from its config: the rebuilt weights differ "
                               "in number or shape; does every custom layer have a complete get_config?")


def test_only_a_config_s_dtype_is_changed():
    changed = model_spec._float32_config({"dtype": "mixed_float16", "units": 3})
    assert changed == {"dtype": "float32", "units": 3}
    config = {"units": 3}
    assert model_spec._float32_config(config) == {"units": 3} and config == {"units": 3}
    original = {"dtype": "float16"}
    model_spec._float32_config(original)
    assert original == {"dtype": "float16"}  # a copy is changed


def test_the_model_itself_is_among_its_layers_and_only_keras_ones_are_known():
    model = _embedding_model()
    layers = model_spec.all_layers(model)
    assert layers[0] is model and any(isinstance(layer, TokenAndPositionEmbedding) for layer in layers)
    assert model_spec._is_known(model) and model_spec._is_known(layers[-1])

    class Custom(keras.layers.Layer):
        pass

    assert not model_spec._is_known(Custom())


def test_dynamic_rope_layers_are_named_with_the_length_they_were_frozen_at():
    x = keras.Input(shape=(None, 8))
    layer = RotaryEmbedding(max_length=32, scaling="dynamic", scaling_factor=2.0, original_length=16,
                            name="rope")
    model = keras.Model(x, layer(x))
    assert model_spec.rope_notes(model, 24) == [
        "RoPE 'rope' (scaling='dynamic'): cos/sin frozen for calls of the exported length 24 "
        "(max(position_ids) + 1 = 24); the Keras layer switches frequencies by each call's length"]
    fixed = keras.Model(x, RotaryEmbedding(max_length=32, scaling="linear", scaling_factor=2.0)(x))
    assert model_spec.rope_notes(_causal_lm(), 4) == []
    assert model_spec.rope_notes(fixed, 24) == []


def test_load_model_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        model_spec.load_model(str(tmp_path / "missing.keras"))
    assert _message(error) == f"Model file not found: {str(tmp_path / 'missing.keras')!r}."
    corrupt = tmp_path / "corrupt.keras"
    corrupt.write_bytes(b"not a zip archive")
    with pytest.raises(ValueError) as error:
        model_spec.load_model(str(corrupt))
    assert _message(error).startswith(f"Could not load a Keras model from {str(corrupt)!r}: ")
    assert _message(error).endswith(". Is it a model saved by keras_posenc, with every custom layer "
                                    "registered?")
    lm = _causal_lm()
    path = tmp_path / "lm.keras"
    save_model(lm, str(path))
    loaded = model_spec.load_model(str(path))
    ids = np.array([[3, 4, 5, 6]], np.int32)
    np.testing.assert_array_equal(np.asarray(loaded(ids)), np.asarray(lm(ids)))
    with pytest.raises(ValueError) as error:
        model_spec.load_model(str(path), translator=True)
    assert _message(error) == (f"--translate exports a translator (`keras-posenc train --task translate`); "
                               f"{str(path)!r} holds a CausalLM.")


def test_load_model_takes_a_translator_only_when_asked_to(tmp_path):
    translator = Seq2SeqTransformer(num_layers=1, d_model=8, num_heads=2, dff=16, vocab_size=24, max_length=8)
    translator.build_on_dummy()
    path = str(tmp_path / "de.keras")
    save_model(translator, path)
    with pytest.raises(ValueError) as error:
        model_spec.load_model(path)
    assert _message(error) == (f"{path!r} holds an encoder-decoder translator (Seq2SeqTransformer): "
                               "export it with `keras-posenc export MODEL --translate`.")
    loaded = model_spec.load_model(path, translator=True)
    assert isinstance(loaded, Seq2SeqTransformer)
    assert all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), translator.get_weights()))


# ONNX calibration rows (no tf2onnx needed) -------------------------------------------------------
def test_calibration_rows_are_fed_one_exported_batch_at_a_time():
    spec = model_spec.ModelSpec.of(_embedding_model(), LENGTH, 2)
    rows = np.arange(5 * LENGTH).reshape(5, LENGTH) % 30
    feeds = conversion._calibration_feeds(spec, rows, "graph")
    assert [sorted(feed) for feed in feeds] == [["token_ids"], ["token_ids"]]  # the fifth row: no full batch
    np.testing.assert_array_equal(feeds[1]["token_ids"], rows[2:4])
    assert feeds[0]["token_ids"].dtype == np.int32
    host = conversion._calibration_feeds(spec, rows.tolist(), "host")
    table = model_spec.host_embedding_table(spec.model)
    np.testing.assert_array_equal(host[0][TENSORS["embeddings"]], table[rows[:2]])
    with pytest.raises(ValueError) as error:
        conversion._calibration_feeds(spec, None, "graph")
    assert _message(error) == ("an int8 ONNX export needs `calibration`: int token rows [n, sequence_length] "
                               "of real text, whose activations set the QDQ scales.")


@pytest.mark.parametrize("language_shape, shape", [((), (1,)), ((None,), (1, LENGTH))])
def test_calibration_rows_of_a_model_with_languages_are_language_zero(language_shape, shape):
    model = _embedding_model(num_languages=2, language_shape=language_shape)
    spec = model_spec.ModelSpec.of(model, LENGTH, 1)
    feeds = conversion._calibration_feeds(spec, np.ones((2, LENGTH)), "graph")
    assert len(feeds) == 2
    assert feeds[0]["language_ids"].shape == shape and not feeds[0]["language_ids"].any()


@pytest.fixture
def no_tf2onnx(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def without_tf2onnx(name, *args, **kwargs):
        if name in ("tf2onnx", "onnxruntime"):  # neither, whatever this venv has
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_tf2onnx)


def test_the_onnx_lookup_is_checked_before_tf2onnx_is_imported(no_tf2onnx):
    ids = keras.Input(shape=(None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 8)(ids)
    no_table = keras.Model(ids, SinusoidalPositionEmbedding(max_length=16)(embedded), name="sinusoidal")
    spec = model_spec.ModelSpec.of(no_table, LENGTH, 1)
    with pytest.raises(ValueError) as error:
        conversion.convert_onnx(spec, embedding="rows")
    assert _message(error).startswith("`embedding` must be one of ('graph', 'host'), got embedding='rows'")
    with pytest.raises(ValueError) as error:
        conversion.convert_onnx(spec, embedding="host")
    assert _message(error).startswith("`embedding='host'` needs a token embedding, and model 'sinusoidal'")
    with pytest.raises(ToolEnvironmentError):  # the graph lookup needs no token table
        conversion.convert_onnx(spec, embedding="graph")


def test_without_tf2onnx_the_error_says_how_to_get_it(no_tf2onnx):
    spec = model_spec.ModelSpec.of(_embedding_model(), LENGTH, 1)
    with pytest.raises(ToolEnvironmentError) as error:  # an OSError: the command prints it as one line
        conversion.convert_onnx(spec)
    assert _message(error) == ("--target tensorrt needs tf2onnx and onnxruntime (No module named "
                               "'onnxruntime'), which the locks install: pip install -r "
                               "requirements/tf212.txt (TF 2.12) or requirements/tf221.txt (Keras 3), or pip "
                               "install tf2onnx==1.17.0 onnx onnxruntime==1.23.2.")
    with pytest.raises(ValueError) as error:
        conversion.convert_onnx(spec, opset=16)
    assert _message(error) == "`opset` must be >= 17, got opset=16."


def test_a_keras3_model_s_variables_are_folded_into_the_file():
    """Keras 3's variables are not tracked by the traced function: frozen here, or they read as garbage."""
    lm = _causal_lm()
    flat = conversion.to_tflite(lm, sequence_length=4, target="cpu")
    ids = np.array([[3, 4, 5, 6]], np.int32)
    np.testing.assert_allclose(_run_file(flat, ids), np.asarray(lm(ids, training=False)), atol=2e-5, rtol=0)


# Models with more inputs, dropout, float16 weights ---------------------------------------------
@pytest.mark.parametrize("language_shape", [(), (None,)])
def test_a_functional_model_with_language_ids_converts_for_every_target(language_shape):
    """Dropout 0.5 too: the file is the model at inference, its second input the language ids."""
    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    languages = keras.Input(shape=language_shape, dtype="int32")
    layer = TokenAndPositionEmbedding(30, 8, 16, dropout=0.5, num_languages=2)
    model = keras.Model([ids, languages], layer(ids, language_ids=languages))
    [scale] = [weight for weight in model.weights if "language_scale" in weight.name]
    scale.assign([1.0, 0.25])
    per_row = np.array([0, 1], np.int32)
    languages_fed = per_row if language_shape == () else np.repeat(per_row[:, None], LENGTH, axis=1)
    expected = np.asarray(model([IDS, languages_fed], training=False), np.float64)
    for target in ("cpu", "gpu"):
        flat = conversion.to_tflite(model, sequence_length=LENGTH, target=target, batch_size=2)
        np.testing.assert_allclose(_run_file(flat, IDS, languages_fed), expected, atol=1e-5, rtol=0)
        assert ("GATHER" in op_counts(flat)) == (target == "cpu")  # gpu: the one-hot formulation
    for row in range(2):
        gl = conversion.to_tflite(model, sequence_length=LENGTH, target="gl")
        got = _run_file(gl, IDS[row:row + 1], languages_fed[row:row + 1])  # fed as the file's float32
        np.testing.assert_allclose(got, expected[row:row + 1], atol=1e-5, rtol=0)
    host = conversion.to_tflite(model, sequence_length=LENGTH, target="gpu", batch_size=2, embedding="host")
    rows = model_spec.host_embedding_table(model)[IDS]
    np.testing.assert_allclose(_run_file(host, IDS, languages_fed, rows), expected, atol=1e-5, rtol=0)


def test_a_subclassed_model_with_dropout_and_languages_converts_at_inference():
    lm = _causal_lm(dropout=0.5, num_languages=2)
    languages = np.array([[0] * LENGTH, [1] * LENGTH], np.int32)
    expected = np.asarray(lm(IDS, language_ids=languages, training=False), np.float64)
    flat = conversion.to_tflite(lm, sequence_length=LENGTH, target="cpu", batch_size=2)
    np.testing.assert_allclose(_run_file(flat, IDS, languages), expected, atol=2e-5, rtol=0)
    plain = _causal_lm(dropout=0.5)
    flat = conversion.to_tflite(plain, sequence_length=LENGTH, target="cpu", batch_size=2)
    np.testing.assert_allclose(_run_file(flat, IDS), np.asarray(plain(IDS, training=False), np.float64),
                               atol=2e-5, rtol=0)


def test_convert_tflite_defaults_to_the_gpu_graph_with_the_lookup_inside():
    model = _embedding_model()
    flat = conversion.convert_tflite(model_spec.ModelSpec.of(model, LENGTH, 2))
    assert "GATHER" not in op_counts(flat) and "CAST" in op_counts(flat)  # int32 ids, cast once
    np.testing.assert_allclose(_run_file(flat, IDS), np.asarray(model(IDS), np.float64), atol=1e-5, rtol=0)


def test_the_quantize_mode_and_the_litert_python_reach_the_converter(no_litert_python_variables, tmp_path):
    model = _embedding_model()
    half = conversion.to_tflite(model, sequence_length=LENGTH, target="cpu", quantize="float16")
    assert np.float16 in tensor_dtypes(half)
    python = failing_litert_python(tmp_path)
    with pytest.raises(RuntimeError) as error:
        conversion.to_tflite(model, sequence_length=LENGTH, target="cpu", quantize="int4",
                             litert_python=python)
    assert _message(error) == FAILED_QUANTIZE


def test_float16_weights_are_copied_as_float32():
    keras.mixed_precision.set_global_policy("float16")
    try:
        model = _embedding_model(scale_embeddings=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert {w.dtype for w in model.get_weights()} == {np.dtype(np.float16)}
    assert model_spec.host_embedding_table(model).dtype == np.float32
    clone = model_spec.rebuild(model, model_spec.ModelSpec.of(model, LENGTH, 1))
    for ours, theirs in zip(clone.get_weights(), model.get_weights()):
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, theirs.astype(np.float32))


def test_a_dynamic_rope_model_is_frozen_at_the_exported_length():
    keras.utils.set_random_seed(0)
    scaling = {"scaling": "dynamic", "scaling_factor": 2.0, "original_length": 4}
    lm = CausalLM({"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 30,
                   "max_length": 16, "dropout": 0.0, "position": "rope", "position_config": scaling})
    lm.build_on_dummy()
    flat = conversion.to_tflite(lm, sequence_length=LENGTH, target="cpu", batch_size=2)
    assert not {"SIN", "COS", "WHILE", "IF"} & set(op_counts(flat))
    full = np.array([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]], np.int32)
    np.testing.assert_allclose(_run_file(flat, full), np.asarray(lm(full, training=False), np.float64),
                               atol=2e-5, rtol=0)


def test_load_model_names_the_error_by_its_type_and_first_line(monkeypatch, tmp_path):
    path = tmp_path / "model.keras"
    path.write_bytes(b"")
    for raised, shown in ((OSError(), "OSError: "),
                          (ValueError("no layers\nin the file"), "ValueError: no layers")):
        def load(*args, raised=raised, **kwargs):
            raise raised

        monkeypatch.setattr(keras.models, "load_model", load)
        with pytest.raises(ValueError) as error:
            model_spec.load_model(str(path))
        assert _message(error) == (f"Could not load a Keras model from {str(path)!r}: {shown}. Is it a model "
                                   "saved by keras_posenc, with every custom layer registered?")


def test_a_compiled_model_loads_uncompiled(tmp_path):
    lm = _causal_lm()
    lm.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    path = str(tmp_path / "compiled.keras")
    save_model(lm, path)
    loaded = model_spec.load_model(path)
    assert (loaded.compiled if is_keras3() else loaded._is_compiled) is False


class Doubler(keras.layers.Layer):
    def call(self, x):
        return 2 * x


def test_layers_of_other_packages_are_named_with_their_class():
    ids = keras.Input(shape=(None,), dtype="int32")
    hidden = TokenAndPositionEmbedding(30, 8, 16, dropout=0.0)(ids)
    model = keras.Model(ids, Doubler(name="twice")(Doubler(name="doubler")(hidden)), name="custom")
    with pytest.raises(ValueError) as error:
        model_spec.ModelSpec.of(model, LENGTH, 1)
    assert _message(error) == (
        f"Model 'custom' contains layers the exporter does not know: 'doubler' ({__name__}.Doubler), 'twice' "
        f"({__name__}.Doubler). Only keras built-in layers and keras_posenc layers can be exported.")
    legacy = type("Dense", (keras.layers.Layer,), {"__module__": "tensorflow.python.keras.layers.core"})
    assert model_spec._is_known(legacy())  # TF's own copy of Keras layers, as older TF 2.x names them


def test_a_model_without_a_token_table_has_no_pad_id_or_vocab():
    x = keras.Input(shape=(None, 8))
    spec = model_spec.ModelSpec.of(keras.Model(x, SinusoidalPositionEmbedding(max_length=16)(x)), LENGTH, 1)
    assert (spec.pad_id, spec.vocab_size) == (None, None)


def test_a_layer_passed_alone_is_counted_once():
    layer = RotaryEmbedding(max_length=32, scaling="dynamic", scaling_factor=2.0, original_length=16,
                            name="rope")
    layer(np.zeros((1, 4, 8), np.float32))
    assert model_spec.all_layers(layer) == [layer]
    assert len(model_spec.rope_notes(layer, 24)) == 1


def test_a_plain_clone_of_a_dynamic_rope_model_keeps_the_exported_length_s_scaling():
    """The prefill/decode graphs run the plain clone on fewer tokens than the cache: the frequencies
    stay those of the exported length (dynamic scaling starts past `original_length`)."""
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(None,), dtype="int32")
    hidden = SinusoidalPositionEmbedding(max_length=16)(keras.layers.Embedding(30, 32)(ids))
    rope = RotaryEmbedding(max_length=16, scaling="dynamic", scaling_factor=8.0, original_length=2)
    model = keras.Model(ids, rope(hidden))
    clone = model_spec.rebuild(model, model_spec.ModelSpec.of(model, 16, 1))
    [frozen] = [layer for layer in clone.layers if isinstance(layer, RotaryEmbedding)]
    x = np.random.default_rng(0).normal(size=(1, 16, 32)).astype(np.float32)
    prefix = np.asarray(frozen(x[:, :8]), np.float64)  # a call of 8 positions, as a prefill chunk
    np.testing.assert_allclose(prefix, np.asarray(rope(x), np.float64)[:, :8], atol=1e-5, rtol=0)
    assert np.abs(prefix - np.asarray(rope(x[:, :8]), np.float64)).max() > 1e-2
