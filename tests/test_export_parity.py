"""`keras_posenc.export.parity`, function by function: what each one hands back, recomputed here.

Every parity figure is recomputed from the file run by an interpreter of this test
(`tf.lite.Interpreter`, as many rows a call as the file's batch) against the Keras model in
float64; the reports' figures from `op_counts`, `graph_cost`, the verdicts and the weights
counted here. Tiny models (a one-layer language model, TokenAndPositionEmbedding alone),
exported once per module, so that `make mutation MODULE=keras_posenc/export/parity.py` can run
these per mutant. The int8 file's error depends on the rows fed, so its figures tell rows and
positions apart where a float32 file's (~1e-7) could coincide. ONNX (`check_onnx_parity`,
`run_onnx`, `onnx_input_names`): tests/edge/edge_parity.py.
"""

import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from tiny_lm import tiny_lm

from keras_posenc import export
from keras_posenc.backend import keras, ops
from keras_posenc.export import parity, runners
from keras_posenc.export.flatbuffer import decoded
from keras_posenc.layers import SinusoidalPositionEmbedding, TokenAndPositionEmbedding
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.models import CausalLM

LENGTH = 12
VOCAB = 64
ROLE_NAMES = ("embeddings", "language_ids", "position_ids", "segment_ids")  # else token ids
# The model that takes every input lists them in another order than `ROLES` (whose default order is
# token ids, language ids, position ids, segment ids): the roles, not the order, match feeds to inputs.
INPUT_ROLES = ["token_ids", "language_ids", "segment_ids", "position_ids"]
# Two rows for the model that takes every input: per-token languages, explicit positions, packed segments.
INPUT_IDS = np.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 0, 0, 0],
                      [0, 0, 0, 30, 31, 32, 33, 34, 35, 36, 37, 38]], np.int32)
LANGUAGES = np.array([[0, 1] * 6, [1] * 12], np.int32)
POSITIONS = np.array([list(range(11, -1, -1)), list(range(3, 15))], np.int32)
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3], [1] * 6 + [2] * 6], np.int32)
REPORT_KEYS = {"cost", "target", "ops", "verdicts", "verdict_lines", "flex_ops", "parity", "parity_all",
               "file_bytes", "weight_bytes", "size_ratio", "rope_notes"}


# Models and files, each built once --------------------------------------------------------------
@pytest.fixture(scope="module")
def lm():
    return tiny_lm(VOCAB, seed=5)


@pytest.fixture(scope="module")
def int8_file(lm):
    """cpu, int8 weights, batch 2: its error depends on the rows and positions fed."""
    return export.to_tflite(lm, sequence_length=LENGTH, target="cpu", quantize="int8", batch_size=2)


@pytest.fixture(scope="module")
def host_file(lm):
    """gpu, float32, `embedding="host"`: takes `token_ids` and the looked-up rows `embeddings`."""
    return export.to_tflite(lm, sequence_length=LENGTH, target="gpu", embedding="host")


def _embedding_model(num_languages=None, language_shape=(), takes=(), pad_id=0, head=None):
    """TokenAndPositionEmbedding(40, 16, 16) alone (or under `head`), with the inputs named in `takes`."""
    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    kwargs = {}
    if num_languages:
        kwargs["language_ids"] = keras.Input(shape=language_shape, dtype="int32", name="language_ids")
    for name in takes:
        kwargs[name] = keras.Input(shape=(None,), dtype="int32", name=name)
    layer = TokenAndPositionEmbedding(40, 16, 16, dropout=0.0, num_languages=num_languages, pad_id=pad_id)
    outputs = layer(ids, **kwargs)
    model = keras.Model([ids, *kwargs.values()] if kwargs else ids, head(outputs) if head else outputs)
    for weight in model.weights:
        if "language_scale" in weight.name:
            weight.assign([1.0, 0.25, 2.0][:num_languages])  # distinct scales: a wrong language shows
    return model


@pytest.fixture(scope="module")
def inputs_model():
    """Takes token ids, per-token language ids (2 languages), segment ids and position ids, in this order."""
    return _embedding_model(num_languages=2, language_shape=(None,), takes=("segment_ids", "position_ids"))


@pytest.fixture(scope="module")
def inputs_file(inputs_model):
    return export.to_tflite(inputs_model, sequence_length=LENGTH, target="cpu")


@pytest.fixture(scope="module")
def language_model():
    """Takes token ids and one language id per row (3 languages)."""
    return _embedding_model(num_languages=3)


@pytest.fixture(scope="module")
def sinusoidal_model():
    """No token table (no vocabulary, no pad id) and no weights at all."""
    embedded = keras.Input(shape=(None, 4))
    return keras.Model(embedded, SinusoidalPositionEmbedding(max_length=16)(embedded))


def _converted(function, *specs, flex=False):
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [tf.function(function, input_signature=list(specs)).get_concrete_function()])
    if flex:
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    return converter.convert()


@pytest.fixture(scope="module")
def unnamed_file():
    """Two float inputs whose names stand for no role: `first - 2 * second`."""
    return _converted(lambda first, second: first - 2.0 * second, tf.TensorSpec([1, 3], tf.float32, "first"),
                      tf.TensorSpec([1, 3], tf.float32, "second"))


@pytest.fixture
def recording():
    """A subclass of `tf.lite.Interpreter` that records each instance (`made`) and its `invoke` calls."""
    made = []

    class Recording(tf.lite.Interpreter):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.kwargs, self.invokes = kwargs, 0
            made.append(self)

        def invoke(self):
            self.invokes += 1
            return super().invoke()

    Recording.made = made
    return Recording


# Independent computations ---------------------------------------------------------------------
def _run(flat, arrays):
    """The file's first output run here, as many rows a call as its batch, float64; `arrays` by role."""
    interpreter = tf.lite.Interpreter(model_content=bytes(flat))
    interpreter.allocate_tensors()
    details = interpreter.get_input_details()
    batch = int(details[0]["shape"][0])
    outputs = []
    for start in range(0, len(arrays["token_ids"]), batch):
        for detail in details:
            role = next((role for role in ROLE_NAMES if role in detail["name"]), "token_ids")
            value = np.asarray(arrays[role][start:start + batch]).astype(detail["dtype"])
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
        outputs.extend(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    return np.asarray(outputs, np.float64)


def _input_names(flat):
    return [detail["name"] for detail in tf.lite.Interpreter(model_content=bytes(flat)).get_input_details()]


def _keras(model, *inputs):
    outputs = model(list(inputs) if len(inputs) > 1 else inputs[0], training=False)
    return np.asarray(ops.convert_to_numpy(outputs), np.float64)


def _sparse_rows():
    """Mostly padding (3 real tokens a row, one row left-padded): the int8 file errs most at padding."""
    rows = np.random.default_rng(3).integers(1, VOCAB, size=(4, LENGTH)).astype(np.int32)
    rows[:, 3:] = 0
    rows[1] = np.r_[np.zeros(LENGTH - 3, np.int32), rows[1, :3]]
    return rows


def _dense_rows(count=6, seed=2, vocab=VOCAB):
    """Every other row right-padded by 4."""
    rows = np.random.default_rng(seed).integers(1, vocab, size=(count, LENGTH)).astype(np.int32)
    rows[::2, LENGTH - 4:] = 0
    return rows


def _host_arrays(lm, rows, table=None):
    table = export.host_embedding_table(lm) if table is None else table
    return {"token_ids": rows, "embeddings": table[rows].astype(np.float32)}


def _real_and_every(outputs, expected, rows):
    difference = np.abs(outputs - expected)
    return difference[rows != 0].max(), difference.max()


# check_parity and parity: the figures -----------------------------------------------------------
def test_parity_is_the_largest_difference_on_real_tokens_and_with_padding(lm, int8_file):
    rows = _sparse_rows()
    real, every = _real_and_every(_run(int8_file, {"token_ids": rows}), _keras(lm, rows), rows)
    assert every > real and every != pytest.approx(real, rel=1e-3)  # the padding positions err more
    assert export.check_parity(lm, int8_file, rows) == pytest.approx(real, rel=1e-5)
    assert export.check_parity(lm, int8_file, rows, ignore_padding=False) == pytest.approx(every, rel=1e-5)
    spec = export.ModelSpec.of(lm, LENGTH, 1)
    assert parity.parity(spec, int8_file, rows) == pytest.approx((real, every), rel=1e-5)
    # int64 ids and nested lists are int arrays too; other rows, another figure (the rows decide).
    assert export.check_parity(lm, int8_file, rows.astype(np.int64).tolist()) == pytest.approx(real, rel=1e-5)
    other = _dense_rows(4)
    other_real, _ = _real_and_every(_run(int8_file, {"token_ids": other}), _keras(lm, other), other)
    assert export.check_parity(lm, int8_file, other) == pytest.approx(other_real, rel=1e-5)
    assert other_real != pytest.approx(real, rel=1e-2)


def test_a_host_file_is_fed_the_model_s_rows_and_its_padding_outputs_are_left_out(lm, host_file):
    """The gpu formulation masks with its own constant: a left-padded row's padding outputs differ."""
    rows = _sparse_rows()
    real, every = _real_and_every(_run(host_file, _host_arrays(lm, rows)), _keras(lm, rows), rows)
    assert real < 1e-5 < 1e-3 < every
    assert export.check_parity(lm, host_file, rows) == pytest.approx(real, rel=1e-3, abs=1e-9)
    assert export.check_parity(lm, host_file, rows, ignore_padding=False) == pytest.approx(every, rel=1e-5)


def test_rows_of_padding_only_leave_no_real_token_to_compare(lm, int8_file):
    rows = np.zeros((2, LENGTH), np.int32)
    every = np.abs(_run(int8_file, {"token_ids": rows}) - _keras(lm, rows)).max()
    assert every > 0
    assert export.check_parity(lm, int8_file, rows) == 0.0
    assert export.check_parity(lm, int8_file, rows, ignore_padding=False) == pytest.approx(every, rel=1e-5)


def test_a_per_sequence_output_has_no_padding_position_to_leave_out():
    """[batch, 3] outputs (pooled tokens): every output is compared, padding or not."""
    model = _embedding_model(head=lambda x: keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(x)))
    flat = export.to_tflite(model, sequence_length=LENGTH, target="cpu")
    rows = _dense_rows(2, vocab=40)
    difference = np.abs(_run(flat, {"token_ids": rows}) - _keras(model, rows))
    assert difference.shape == (2, 3)
    assert export.check_parity(model, flat, rows) == pytest.approx(difference.max(), rel=1e-5, abs=1e-12)
    every = export.check_parity(model, flat, rows, ignore_padding=False)
    assert every == export.check_parity(model, flat, rows)


def test_language_position_and_segment_ids_reach_the_file(inputs_model, inputs_file):
    arrays = {"token_ids": INPUT_IDS, "language_ids": LANGUAGES, "position_ids": POSITIONS,
              "segment_ids": SEGMENTS}
    expected = _keras(inputs_model, INPUT_IDS, LANGUAGES, SEGMENTS, POSITIONS)
    real, every = _real_and_every(_run(inputs_file, arrays), expected, INPUT_IDS)
    got = export.check_parity(inputs_model, inputs_file, INPUT_IDS, LANGUAGES, position_ids=POSITIONS,
                              segment_ids=SEGMENTS)
    assert got == pytest.approx(real, rel=1e-4, abs=1e-9) and got <= 1e-5
    assert export.check_parity(inputs_model, inputs_file, INPUT_IDS, LANGUAGES, position_ids=POSITIONS,
                               segment_ids=SEGMENTS, ignore_padding=False) == pytest.approx(every, abs=1e-9)
    # The language and position ids change the file's outputs: had one not been fed, or fed as another
    # input, the parity would be far off (explicit position ids leave the segments nothing to number).
    for role, other in (("language_ids", 1 - LANGUAGES), ("position_ids", POSITIONS[::-1]),
                        ("position_ids", SEGMENTS)):
        assert np.abs(_run(inputs_file, dict(arrays, **{role: other})) - expected).max() > 0.1, role


@pytest.mark.parametrize("missing", ["language_ids", "position_ids", "segment_ids"])
def test_an_input_the_model_takes_must_be_given_naming_it(inputs_model, inputs_file, missing):
    given = {"language_ids": LANGUAGES, "position_ids": POSITIONS, "segment_ids": SEGMENTS}
    del given[missing]
    with pytest.raises(ValueError) as error:
        export.check_parity(inputs_model, inputs_file, INPUT_IDS, **given)
    assert str(error.value) == f"Model '{inputs_model.name}' takes {INPUT_ROLES}: pass `{missing}`."


BAD_IDS = [np.ones(LENGTH, np.int32), np.ones((2, LENGTH, 1), np.int32), np.ones((2, LENGTH), np.float32),
           np.ones((2, LENGTH), bool)]


@pytest.mark.parametrize("ids", BAD_IDS, ids=["1-D", "3-D", "float32", "bool"])
def test_token_ids_of_another_rank_or_dtype_are_refused_naming_them(lm, int8_file, ids):
    message = (f"`token_ids` must be an int array [batch, length], got shape {ids.shape} and dtype "
               f"{ids.dtype}.")
    spec = export.ModelSpec.of(lm, LENGTH, 1)
    for call in (lambda: export.check_parity(lm, int8_file, ids), lambda: parity.parity(spec, int8_file, ids),
                 lambda: export.export_report(lm, int8_file, ids)):
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value) == message


def test_check_parity_refuses_what_is_no_flatbuffer_first(lm):
    with pytest.raises(ValueError) as error:
        export.check_parity(lm, b"\x00" * 32, BAD_IDS[0])
    assert str(error.value) == "`tflite_bytes` is not a TFLite flatbuffer (no 'TFL3' identifier)."
    with pytest.raises(TypeError) as error:
        export.check_parity(lm, "model.tflite", _dense_rows(2))
    assert str(error.value) == "`tflite_bytes` must be bytes, got str."


def test_parity_feeds_the_table_given_through_the_interpreter_given(lm, host_file, recording):
    """A float16-rounded table (a quantized export's): its rows, not the model's, are fed."""
    rows = _sparse_rows()
    table = export.host_embedding_table(lm).astype(np.float16).astype(np.float64)
    expected = _keras(lm, rows)
    own = _real_and_every(_run(host_file, _host_arrays(lm, rows, table)), expected, rows)
    models = _real_and_every(_run(host_file, _host_arrays(lm, rows)), expected, rows)
    assert own[0] > 10 * models[0]  # the table makes the difference
    spec = export.ModelSpec.of(lm, LENGTH, 1)
    got = parity.parity(spec, decoded(host_file), rows, table=table, interpreter=recording)
    assert got == pytest.approx(own, rel=1e-5)
    assert [made.kwargs for made in recording.made] == [{"model_content": host_file}]
    assert recording.made[0].invokes == len(rows)  # batch 1: one call a row


# Host rows -------------------------------------------------------------------------------------
def test_host_rows_are_added_for_a_file_that_takes_embeddings_only(lm, host_file, int8_file):
    rows = _dense_rows(2)
    feeds = [rows]
    same, roles = runners.with_host_rows(lm, int8_file, feeds, ("token_ids",))
    assert same is feeds and roles == ["token_ids"] and isinstance(roles, list)
    added, roles = runners.with_host_rows(lm, host_file, feeds, ("token_ids",))
    assert roles == ["token_ids", "embeddings"] and len(added) == 2 and added[0] is rows
    np.testing.assert_array_equal(added[1], export.host_embedding_table(lm)[rows])
    assert added[1].dtype == np.float32 and added[1].shape == (2, LENGTH, 32)
    table = np.random.default_rng(0).normal(size=(VOCAB, 32))  # float64: fed as float32 rows
    added, _ = runners.with_host_rows(lm, host_file, feeds, ("token_ids",), table)
    assert added[1].dtype == np.float32
    np.testing.assert_array_equal(added[1], table.astype(np.float32)[rows])


def test_host_rows_of_input_names_look_up_the_token_ids(language_model):
    ids, languages = _dense_rows(2, vocab=40), np.array([2, 1], np.int32)
    feeds, roles = runners.with_host_rows_of(language_model, ["token_ids", "language_ids"], [ids, languages],
                                            ["token_ids", "language_ids"])
    assert feeds == [ids, languages] and roles == ["token_ids", "language_ids"]
    feeds, roles = runners.with_host_rows_of(language_model, ["embeddings", "token_ids", "language_ids"],
                                            [ids, languages], ("token_ids", "language_ids"))
    assert roles == ["token_ids", "language_ids", "embeddings"]
    np.testing.assert_array_equal(feeds[2], export.host_embedding_table(language_model)[ids])


# run_interpreter --------------------------------------------------------------------------------
def test_rows_run_in_chunks_of_the_file_s_batch(lm, int8_file, recording):
    rows = _dense_rows(6)
    expected = _run(int8_file, {"token_ids": rows})
    got = export.run_interpreter(int8_file, [rows], interpreter=recording)
    assert got.shape == (6, LENGTH, VOCAB) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert len(recording.made) == 1 and recording.made[0].invokes == 3  # 6 rows, 2 a call
    assert recording.made[0].kwargs == {"model_content": int8_file}
    np.testing.assert_allclose(export.run_interpreter(decoded(int8_file), [rows]), expected, rtol=1e-6,
                               atol=1e-6)
    assert np.abs(expected - _keras(lm, rows)).max() < 0.1  # the rows' own outputs, not others'


def test_feeds_that_do_not_fit_the_file_are_refused_naming_the_input(lm, int8_file):
    [name] = _input_names(int8_file)
    rows = _dense_rows(5)
    expected = (f"Input '{name}' of shape (5, {LENGTH}) does not fit the exported shape (2, {LENGTH}) "
                "(same length, batch a multiple of it).")
    for call in (lambda: export.run_interpreter(int8_file, [rows]),
                 lambda: export.check_parity(lm, int8_file, rows)):
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value) == expected
    with pytest.raises(ValueError) as error:
        export.run_interpreter(int8_file, [rows[:4, :LENGTH - 1]])
    assert str(error.value) == (f"Input '{name}' of shape (4, {LENGTH - 1}) does not fit the exported shape "
                                f"(2, {LENGTH}) (same length, batch a multiple of it).")
    with pytest.raises(ValueError) as error:
        export.run_interpreter(int8_file, [rows[:4], rows[:4]])
    assert str(error.value) == "The TFLite model has 1 inputs, got 2 arrays."


@pytest.mark.parametrize("embedding_rows", [2, 6])
def test_a_later_feed_with_another_row_count_is_refused_naming_both(lm, host_file, embedding_rows):
    """Fewer rows would run out mid-way, more would be dropped without a word: both refused."""
    rows = _dense_rows(4)
    embeddings = _host_arrays(lm, _dense_rows(embedding_rows))["embeddings"]
    with pytest.raises(ValueError) as error:
        export.run_interpreter(host_file, [rows, embeddings], ["token_ids", "embeddings"])
    assert str(error.value) == (f"Input 'embeddings' has {embedding_rows} rows, input 'token_ids' 4: every "
                                "input needs one row per token row.")


def test_feeds_are_matched_to_the_inputs_by_role(lm, inputs_file, host_file, unnamed_file):
    arrays = {"token_ids": INPUT_IDS, "language_ids": LANGUAGES, "position_ids": POSITIONS,
              "segment_ids": SEGMENTS}
    expected = _run(inputs_file, arrays)
    # Default roles: token ids, language ids, position ids, segment ids (not the file's order).
    default = ["token_ids", "language_ids", "position_ids", "segment_ids"]
    np.testing.assert_allclose(export.run_interpreter(inputs_file, [arrays[role] for role in default]),
                               expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(export.run_interpreter(inputs_file, [arrays[role] for role in INPUT_ROLES],
                                                      INPUT_ROLES), expected, rtol=1e-6, atol=1e-6)
    shuffled = ["segment_ids", "token_ids", "position_ids", "language_ids"]
    np.testing.assert_allclose(export.run_interpreter(inputs_file, [arrays[role] for role in shuffled],
                                                      shuffled), expected, rtol=1e-6, atol=1e-6)
    # A host file: roles given in any order; without roles, its own order (token ids, then rows).
    rows = _dense_rows(2)
    host = _host_arrays(lm, rows)
    expected = _run(host_file, host)
    np.testing.assert_allclose(export.run_interpreter(host_file, [host["embeddings"], rows],
                                                      ["embeddings", "token_ids"]), expected, rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(export.run_interpreter(host_file, [rows, host["embeddings"]]), expected,
                               rtol=1e-6, atol=1e-6)
    # Inputs named for no role run in the file's order.
    first, second = np.array([[1.0, 2.0, 3.0]], np.float32), np.array([[10.0, 20.0, 40.0]], np.float32)
    assert export.run_interpreter(unnamed_file, [first, second]).tolist() == [[-19.0, -38.0, -77.0]]


def test_the_docstring_example_of_run_interpreter():
    double = _converted(lambda x: x * 2.0, tf.TensorSpec([1, 3], tf.float32))
    assert export.run_interpreter(double, [np.arange(6, dtype=np.float32).reshape(2, 3)]).tolist() == [
        [0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]


# interpreter_class ------------------------------------------------------------------------------
def test_interpreter_class_is_litert_s_where_it_is_installed_else_tensorflow_s(monkeypatch, int8_file,
                                                                              recording):
    try:
        from ai_edge_litert.interpreter import Interpreter as installed
    except ImportError:
        installed = tf.lite.Interpreter
    assert export.interpreter_class() is installed
    # LiteRT's module present: its Interpreter, which run_interpreter then uses by default.
    package, module = types.ModuleType("ai_edge_litert"), types.ModuleType("ai_edge_litert.interpreter")
    module.Interpreter, package.interpreter = recording, module
    monkeypatch.setitem(sys.modules, "ai_edge_litert", package)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", module)
    assert export.interpreter_class() is recording
    rows = _dense_rows(2)
    export.run_interpreter(int8_file, [rows])
    assert len(recording.made) == 1 and recording.made[0].invokes == 1
    # Not importable: TensorFlow's.
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    assert export.interpreter_class() is tf.lite.Interpreter


# Weights -----------------------------------------------------------------------------------------
def test_weight_bytes_counts_every_weight_at_its_stored_dtype(lm):
    features = keras.Input(shape=(4,))
    hidden = keras.layers.Dense(3, dtype="float16")(features)  # 15 float16 weights: 30 bytes
    model = keras.Model(features, keras.layers.BatchNormalization()(hidden))  # 4 x 3 float32: 48 bytes
    assert export.weight_bytes(model) == 78
    dense = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])
    assert export.weight_bytes(dense) == 60  # the docstring's (4 * 3 + 3) * 4
    assert export.weight_bytes(lm) == 4 * lm.count_params()
    assert isinstance(export.weight_bytes(lm), int)


def test_the_weights_in_a_file_leave_out_the_table_a_host_file_is_fed(lm, int8_file, host_file):
    table_bytes = VOCAB * 32 * 4
    assert parity.weights_in_file(lm, int8_file) == export.weight_bytes(lm) == 4 * lm.count_params()
    assert parity.weights_in_file(lm, host_file) == 4 * lm.count_params() - table_bytes
    assert parity.weights_in_file(lm, int8_file, 10 ** 6) == 10 ** 6
    assert parity.weights_in_file(lm, decoded(host_file), 10 ** 6) == 10 ** 6 - table_bytes


# sample_token_batch and sample_batch -----------------------------------------------------------
@pytest.mark.parametrize("length, real", [
    (12, [[1] * 12, [1] * 6 + [0] * 6, [1] + [0] * 11, [0, 0] + [1] * 10] * 2),
    (3, [[1, 1, 1], [1, 0, 0], [1, 0, 0], [0, 0, 1], [1, 1, 1]]),
    (2, [[1, 1], [1, 0], [1, 0], [0, 1]]),
    (1, [[1], [1], [1], [1], [1]])])
def test_sample_rows_cycle_full_half_one_token_and_left_padded(lm, length, real):
    """Full, half, one token, left-padded (two pads) rows, over and over; at least one token each."""
    tokens, languages = export.sample_token_batch(lm, length, rows=len(real))
    assert (tokens != 0).astype(int).tolist() == real and languages is None
    assert tokens.shape == (len(real), length) and tokens.dtype == np.int32


def test_sample_ids_cover_the_vocabulary_except_the_pad_id(lm):
    tokens, _ = export.sample_token_batch(lm, LENGTH, rows=256)
    real = tokens[(np.arange(256) % 4 == 0)]  # the full rows
    assert set(real.ravel().tolist()) == set(range(1, VOCAB))
    assert set(tokens.ravel().tolist()) == set(range(VOCAB))
    # pad_id 5: the ids skip 5, which fills the padding positions.
    model = _embedding_model(pad_id=5)
    tokens, _ = export.sample_token_batch(model, LENGTH, rows=64)
    full = tokens[::4]
    assert set(full.ravel().tolist()) == set(range(40)) - {5}
    assert tokens[1, 6:].tolist() == [5] * 6 and tokens[3, :2].tolist() == [5, 5]
    assert 5 not in tokens[1, :6] and 5 not in tokens[3, 2:]


def test_sample_rows_are_reproducible_for_a_seed(lm):
    tokens, _ = export.sample_token_batch(lm, LENGTH)
    assert tokens.shape == (4, LENGTH)
    np.testing.assert_array_equal(tokens, export.sample_token_batch(lm, LENGTH, rows=4, seed=0)[0])
    spec = export.ModelSpec.of(lm, LENGTH, 1)
    np.testing.assert_array_equal(tokens, parity.sample_batch(spec)[0])
    other, _ = export.sample_token_batch(lm, LENGTH, seed=1)
    assert (other != tokens).any() and ((other != 0) == (tokens != 0)).all()


def test_sample_language_ids_cycle_through_the_languages(language_model, inputs_model):
    tokens, languages = export.sample_token_batch(language_model, LENGTH, rows=5)
    assert languages.tolist() == [0, 1, 2, 0, 1] and languages.dtype == np.int32  # one a row, 3 languages
    assert tokens.max() < 40
    _, languages = parity.sample_batch(export.ModelSpec.of(inputs_model, 5, 1), rows=3)
    assert languages.tolist() == [[0] * 5, [1] * 5, [0] * 5] and languages.dtype == np.int32  # per token


def test_a_model_without_a_token_table_gets_rows_of_id_0_without_padding(sinusoidal_model):
    tokens, languages = export.sample_token_batch(sinusoidal_model, LENGTH, rows=5, seed=3)
    assert tokens.tolist() == [[0] * LENGTH] * 5 and tokens.dtype == np.int32 and languages is None


# runtime_metadata and spec_metadata -------------------------------------------------------------
def test_runtime_metadata_of_the_defaults(lm):
    assert export.runtime_metadata(lm, LENGTH) == {
        "kind": "window", "sequence_length": LENGTH, "batch_size": 1, "vocab_size": VOCAB, "pad_id": 0,
        "num_languages": None, "inputs": ["token_ids"], "input_dtype": "int32", "quantize": None,
        "target": "gpu", "accelerators": ["gpu", "cpu"], "embedding": "graph"}


def test_runtime_metadata_of_a_host_gl_file_with_every_input(inputs_model):
    metadata = export.runtime_metadata(inputs_model, 10, 1, quantize="float16", target="gl", embedding="host",
                                       embedding_table="model.tflite.embeddings.npy")
    assert metadata == {
        "kind": "window", "sequence_length": 10, "batch_size": 1, "vocab_size": 40, "pad_id": 0,
        "num_languages": 2, "inputs": INPUT_ROLES + ["embeddings"], "input_dtype": "float32",
        "quantize": "float16", "target": "gl", "accelerators": ["gpu", "cpu"], "embedding": "host",
        "embedding_table": "model.tflite.embeddings.npy"}


def test_spec_metadata_reads_the_spec_s_length_and_batch(language_model):
    spec = export.ModelSpec.of(language_model, 7, 3)
    assert parity.spec_metadata(spec, quantize="int8", target="cpu", embedding_table="unused.npy") == {
        "kind": "window", "sequence_length": 7, "batch_size": 3, "vocab_size": 40, "pad_id": 0,
        "num_languages": 3, "inputs": ["token_ids", "language_ids"], "input_dtype": "int32",
        "quantize": "int8", "target": "cpu", "accelerators": ["cpu"], "embedding": "graph"}
    assert parity.spec_metadata(spec) == {  # the defaults: float32 for the gpu target, graph lookup
        "kind": "window", "sequence_length": 7, "batch_size": 3, "vocab_size": 40, "pad_id": 0,
        "num_languages": 3, "inputs": ["token_ids", "language_ids"], "input_dtype": "int32",
        "quantize": None, "target": "gpu", "accelerators": ["gpu", "cpu"], "embedding": "graph"}


# export_report and report_of --------------------------------------------------------------------
def _expected_cost(flat, weights):
    cost = export.graph_cost(flat)
    return dict(cost, non_weight_constant_bytes=max(0, cost["constant_bytes"] - weights))


def test_export_report_of_a_cpu_file(lm, int8_file):
    rows = _sparse_rows()
    real, every = _real_and_every(_run(int8_file, {"token_ids": rows}), _keras(lm, rows), rows)
    report = export.export_report(lm, int8_file, rows, target="cpu")
    assert set(report) == REPORT_KEYS
    weights = 4 * lm.count_params()
    assert report["target"] == "cpu" and report["ops"] == export.op_counts(int8_file)
    assert report["verdicts"] == {backend: export.gpu_incompatible_ops(int8_file, backend)
                                  for backend in ("gl", "webgpu")}
    assert report["verdicts"]["gl"] != []  # GATHER: a verdict with something in it
    assert report["verdict_lines"] == [export.verdict_line(int8_file, backend)
                                       for backend in ("gl", "webgpu")]
    assert report["flex_ops"] == [] and report["rope_notes"] == []
    assert report["parity"] == pytest.approx(real, rel=1e-5)
    assert report["parity_all"] == pytest.approx(every, rel=1e-5)
    assert report["file_bytes"] == len(int8_file) and report["weight_bytes"] == weights
    assert report["size_ratio"] == len(int8_file) / weights
    assert report["cost"] == _expected_cost(int8_file, weights)


def test_export_report_of_a_host_file_on_the_default_target(lm, host_file):
    rows = _sparse_rows()
    real, every = _real_and_every(_run(host_file, _host_arrays(lm, rows)), _keras(lm, rows), rows)
    report = export.export_report(lm, host_file, rows)
    assert report["target"] == "gpu"
    assert list(report["verdicts"]) == ["webgpu", "opencl", "gl"]
    assert report["verdicts"] == {backend: export.gpu_incompatible_ops(host_file, backend)
                                  for backend in ("webgpu", "opencl", "gl")}
    assert report["verdict_lines"] == [export.verdict_line(host_file, backend)
                                       for backend in ("webgpu", "opencl", "gl")]
    assert report["parity"] == pytest.approx(real, rel=1e-3, abs=1e-9)
    assert report["parity_all"] == pytest.approx(every, rel=1e-5)
    # The file holds the weights less the token table: the constants beyond them count from there.
    in_file = 4 * lm.count_params() - VOCAB * 32 * 4
    assert report["cost"] == _expected_cost(host_file, in_file)
    assert report["cost"]["constant_bytes"] < report["weight_bytes"] < report["cost"]["constant_bytes"] + 8192


def test_export_report_feeds_the_language_ids_given(language_model):
    flat = export.to_tflite(language_model, sequence_length=LENGTH, target="cpu")
    rows, languages = _dense_rows(3, vocab=40), np.array([2, 0, 1], np.int32)
    real, _ = _real_and_every(_run(flat, {"token_ids": rows, "language_ids": languages}),
                              _keras(language_model, rows, languages), rows)
    report = export.export_report(language_model, flat, rows, languages, target="cpu")
    assert report["parity"] == pytest.approx(real, rel=1e-4, abs=1e-9) and report["parity"] <= 1e-5
    with pytest.raises(ValueError) as error:
        export.export_report(language_model, flat, rows)
    assert str(error.value) == (f"Model '{language_model.name}' takes ['token_ids', 'language_ids']: "
                                "pass `language_ids`.")


def test_report_of_reads_the_file_and_the_parities_given():
    """A Flex file's ops, RoPE notes of a dynamic scaling, the parities handed in."""
    keras.utils.set_random_seed(0)
    model = CausalLM({"num_layers": 1, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 20,
                      "max_length": 16, "position": "rope",
                      "position_config": {"scaling": "dynamic", "scaling_factor": 2.0, "original_length": 4}})
    model.build_on_dummy()
    flex = _converted(lambda matrix: tf.linalg.det(matrix) + 1.0, tf.TensorSpec([1, 3, 3], tf.float32),
                      flex=True)
    report = parity.report_of(export.ModelSpec.of(model, LENGTH, 1), decoded(flex), (0.25, 0.5), target="gl")
    [rope] = [layer for layer in model._flatten_layers() if isinstance(layer, RotaryEmbedding)]
    assert report["rope_notes"] == [
        f"RoPE '{rope.name}' (scaling='dynamic'): cos/sin frozen for calls of the exported length {LENGTH} "
        f"(max(position_ids) + 1 = {LENGTH}); the Keras layer switches frequencies by each call's length"]
    assert report["flex_ops"] == ["FlexMatrixDeterminant"] and report["ops"] == export.op_counts(flex)
    assert report["verdicts"] == {"gl": export.gpu_incompatible_ops(flex, "gl"),
                                  "webgpu": export.gpu_incompatible_ops(flex, "webgpu")}
    assert (report["parity"], report["parity_all"], report["target"]) == (0.25, 0.5, "gl")
    weights = 4 * model.count_params()
    assert report["weight_bytes"] == weights and report["file_bytes"] == len(flex)
    assert report["size_ratio"] == len(flex) / weights and report["cost"] == _expected_cost(flex, weights)


def test_the_size_ratio_of_a_model_without_weights_is_the_file_size(sinusoidal_model, unnamed_file):
    report = parity.report_of(export.ModelSpec.of(sinusoidal_model, LENGTH, 1), decoded(unnamed_file),
                              (0.0, 0.0))
    assert report["weight_bytes"] == 0 and report["size_ratio"] == len(unnamed_file)
    assert report["target"] == "gpu" and list(report["verdicts"]) == ["webgpu", "opencl", "gl"]  # default
    assert report["cost"]["non_weight_constant_bytes"] == report["cost"]["constant_bytes"]


# cost_summary, format_cost, format_report ------------------------------------------------------
def test_cost_summary_adds_the_constant_bytes_beyond_the_weights():
    cost = {"multiply_adds": 10, "constant_bytes": 1500.0, "largest_tensor_bytes": 8,
            "largest_tensor_shape": [1, 2]}
    assert export.cost_summary(cost, 1000.9) == dict(cost, non_weight_constant_bytes=500)
    assert export.cost_summary(cost, 1499) == dict(cost, non_weight_constant_bytes=1)
    assert export.cost_summary(cost, 2000) == dict(cost, non_weight_constant_bytes=0)  # never negative
    assert "non_weight_constant_bytes" not in cost  # a new dict


def test_format_cost_is_one_line_in_giga_and_mebi_units():
    cost = {"multiply_adds": 1.5e18, "non_weight_constant_bytes": 7 * 2 ** 19,
            "largest_tensor_bytes": 5 * 2 ** 18, "largest_tensor_shape": (1, 12, 64)}
    assert export.format_cost(cost) == ("Cost: 1500000000.000 G multiply-adds; constants beyond the weights "
                                        "3.50 MiB; largest intermediate [1, 12, 64] 1.25 MiB")
    docstring = {"multiply_adds": 2.5e9, "non_weight_constant_bytes": 3 * 2 ** 20,
                 "largest_tensor_bytes": 2 ** 26, "largest_tensor_shape": [1, 512, 512, 64]}
    assert export.format_cost(docstring) == ("Cost: 2.500 G multiply-adds; constants beyond the weights "
                                             "3.00 MiB; largest intermediate [1, 512, 512, 64] 64.00 MiB")


def test_format_report_lines():
    report = {"target": "gl", "ops": {"ADD": 1, "FULLY_CONNECTED": 2},
              "verdict_lines": ["OpenGL ES (Jetson + tflite-runtime): all 3 ops have shaders", "second"],
              "parity": 1.23456e-6, "parity_all": 0.5, "file_bytes": 6328, "weight_bytes": 1600,
              "size_ratio": 3.955}
    lines = [
        "Op histogram:",
        "  ADD                     1",
        "  FULLY_CONNECTED         2",
        "Target gl; GPU verdicts, per backend:",
        "  OpenGL ES (Jetson + tflite-runtime): all 3 ops have shaders",
        "  second",
        "Parity vs Keras: max abs diff 1.23e-06 on real tokens (0.5 with padding positions)",
        "File size: 6328 bytes = 3.955 x the weight bytes (1600); frozen position tables and graph count "
        "toward the file"]
    assert export.format_report(report) == lines
    cost = {"multiply_adds": 2.5e9, "non_weight_constant_bytes": 0, "largest_tensor_bytes": 2 ** 20,
            "largest_tensor_shape": [2]}
    notes = ["RoPE note one", "RoPE note two"]
    assert export.format_report(dict(report, cost=cost, rope_notes=notes)) == lines + [
        "Cost: 2.500 G multiply-adds; constants beyond the weights 0.00 MiB; largest intermediate [2] "
        "1.00 MiB",
        *notes]
    assert export.format_report(dict(report, rope_notes=notes)) == lines + notes
