"""`translator`'s signatures and search before any conversion: the `tf.function`s the converter is given,
run in TensorFlow, and `translate_with` over them.

A session over the functions (tests/translator_sessions.py, the interface of `runners.TranslatorSession`)
stands where the files would: `translate_with` must give `Seq2SeqTransformer.translate`'s ids,
scores and log-probabilities, greedy and with beams, by `decode` per hypothesis or `decode_beams`
for several; teacher forcing gives the full pass's logits. The signatures' names, shapes and dtypes
are read as the contract (`export/jetson/`'s kit) reads them. tests/test_export_translation.py
converts the same functions; this file runs in seconds (what `make mutation` runs for the module).
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf
from stacks import once_on_keras2
from translator_sessions import (
    CACHE_LENGTH,
    SOURCE_LENGTH,
    check_sources,
    function_session,
    sharp_translator,
)

from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import contract, kinds, quantization, translator
from keras_posenc.export.targets import target_of
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.seq2seq import Seq2SeqTransformer

TOLERANCE = 1e-4  # float32 step kernels against the full pass's


def _lengths(model):
    return {len(model.translate(np.array([row]), CACHE_LENGTH - 1, beam_size=1).ids[0])
            for row in check_sources(model)}


# The seed that qualifies on each stack (they initialise differently), tried first: the search over
# the others, a second each, runs only if the initialisers change.
FIRST_SEED = 11 if is_keras3() else 0


@pytest.fixture(scope="module")
def model():
    """The first `sharp_translator(seed)` with a greedy translation that ends by </s> after a token or
    more and one that runs to the bound (the stacks initialise differently)."""
    for seed in [FIRST_SEED] + [seed for seed in range(30) if seed != FIRST_SEED]:
        model = sharp_translator(seed)
        lengths = _lengths(model)
        if 0 < min(lengths) < CACHE_LENGTH - 1 == max(lengths):
            return model
    raise AssertionError("no seed gives translations of several lengths")


def _session(model, beam_rows=0, write_cache=translator.write_by_update_slice):
    return function_session(model, SOURCE_LENGTH, CACHE_LENGTH, beam_rows, write_cache)


def _search(session, model, row, **settings):
    return translator.translate_with(session, row, bos_id=model.bos_id, eos_id=model.eos_id,
                                     pad_id=model.pad_id, **{"max_new_tokens": CACHE_LENGTH - 1, **settings})


KERAS2_ONLY = once_on_keras2("the same search over the same signatures; Keras 3 runs greedy and one beam")


@pytest.mark.parametrize("beam_size, beam_rows", [(1, 0), (3, 4)] + [
    pytest.param(size, rows, marks=KERAS2_ONLY) for size, rows in [(3, 0), (2, 4), (4, 4), (5, 4)]])
def test_the_search_over_the_signatures_is_translates(model, beam_size, beam_rows):
    session = _session(model, beam_rows)
    lengths = []
    for row in check_sources(model):
        expected = model.translate(np.array([row]), CACHE_LENGTH - 1, beam_size=beam_size, alpha=0.6)
        got = _search(session, model, row, beam_size=beam_size, alpha=0.6)
        assert got.ids[0].tolist() == expected.ids[0].tolist()
        np.testing.assert_allclose(got.scores, expected.scores, atol=1e-4, rtol=0)
        np.testing.assert_allclose(got.log_probs, expected.log_probs, atol=1e-4, rtol=0)
        lengths.append(len(expected.ids[0]))
    assert max(lengths) > 0
    used_beams = contract.BEAM_SIGNATURE in session.calls
    assert used_beams == (1 < beam_size <= beam_rows)
    assert session.calls.count(translator.ENCODE) == 3


def test_beams_ranked_with_translates_default_penalty_score_as_translate_does(model):
    """`alpha` left to its default reaches the search: scores of translations longer than one token
    depend on it (beam_search's own default is another, 0.6)."""
    session = _session(model, beam_rows=4)
    lengths = []
    for row in check_sources(model):
        expected = model.translate(np.array([row]), CACHE_LENGTH - 1, beam_size=3)
        got = _search(session, model, row, beam_size=3)
        assert got.ids[0].tolist() == expected.ids[0].tolist()
        np.testing.assert_allclose(got.scores, expected.scores, atol=TOLERANCE, rtol=0)
        lengths.append(len(expected.ids[0]))
    assert max(lengths) > 1


@pytest.mark.parametrize("beam_rows, calibration, missing", [
    (0, None, "encode, decode"),
    (2, {"encode": [{"source_ids": 0}], "decode": [{"token_id": 0}]}, "decode_beams"),
    (2, {"encode": [{"source_ids": 0}], "decode": [], "decode_beams": [{"token_id": 0}]}, "decode")])
def test_an_int8_onnx_pair_needs_feeds_for_every_signature(model, beam_rows, calibration, missing):
    recipe = quantization.recipe_for("tensorrt", "int8", kinds.TRANSLATE)
    with pytest.raises(ValueError, match=f"`calibration` has no feeds for {missing} "):
        translator.to_onnx_translator(model, source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH,
                                      recipe=recipe, calibration=calibration, beam_rows=beam_rows)


@pytest.mark.parametrize("beam_rows, signatures", [
    (None, ["encode", "decode"]), (2, ["encode", "decode", "decode_beams"])])
def test_a_cpu_file_gets_decode_beams_only_when_asked_for(model, monkeypatch, beam_rows, signatures):
    """What `to_tflite_translator` hands the converter (the conversion itself: test_export_translation.py)."""
    given = []
    monkeypatch.setattr(translator, "frozen_signature", lambda function, names: function)
    monkeypatch.setattr(translator, "convert_signatures",
                        lambda functions, recipe, litert_python: given.append(list(functions)) or b"")
    options = {} if beam_rows is None else {"beam_rows": beam_rows}
    translator.to_tflite_translator(model, source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH,
                                    target="cpu", **options)
    assert given == [signatures]


def test_the_default_length_penalty_is_translates():
    """Without `alpha`, beams are ranked as `translate` ranks them by default."""
    default = inspect.signature(translator.translate_with).parameters["alpha"].default
    assert default == inspect.signature(Seq2SeqTransformer.translate).parameters["alpha"].default == 1.0


def test_max_new_tokens_bounds_the_translation(model):
    session = _session(model)
    for row in check_sources(model):
        for count in (1, 2):
            expected = model.translate(np.array([row]), count, beam_size=1).ids[0].tolist()
            assert _search(session, model, row, max_new_tokens=count).ids[0].tolist() == expected
            assert len(expected) <= count


def test_teacher_forcing_gives_the_full_pass_logits_and_its_picks(model):
    session = _session(model)
    row = check_sources(model)[1]
    forced = [17, 5, 23, 9]
    logits = []
    picks = _search(session, model, row, forced_ids=forced, logits=logits)
    target = np.array([[model.bos_id] + forced[:-1]], np.int32)
    full = np.asarray(model({"source_ids": np.array([row], np.int32), "target_ids": target}), np.float64)[0]
    assert len(logits) == len(forced) and all(step.dtype == np.float32 for step in logits)
    np.testing.assert_allclose(np.stack(logits), full, atol=TOLERANCE, rtol=0)
    masked = full.copy()
    masked[:, [model.pad_id, model.bos_id]] = -np.inf
    assert picks == np.argmax(masked, axis=-1).tolist()
    assert session.calls == [translator.ENCODE] + [translator.DECODE] * len(forced)


def test_teacher_forcing_never_picks_padding_or_the_start_token():
    model = sharp_translator(1)
    bias = np.asarray(model.head.bias).copy()
    bias[[model.pad_id, model.bos_id]] = 1e3
    model.head.bias.assign(bias)
    picks = _search(_session(model), model, check_sources(model)[0], forced_ids=[11, 12])
    assert model.pad_id not in picks and model.bos_id not in picks and len(picks) == 2


def test_the_one_hot_and_update_slice_writes_give_the_same_translations(model):
    for row in check_sources(model, seed=3):
        ids = [_search(_session(model, write_cache=write), model, row, beam_size=2).ids[0].tolist()
               for write in (None, translator.write_by_update_slice)]
        expected = model.translate(np.array([row]), CACHE_LENGTH - 1, beam_size=2).ids[0].tolist()
        assert ids[0] == ids[1] == expected


def test_the_signatures_names_shapes_and_dtypes():
    model = sharp_translator(2)
    module = translator.TranslatorSignatures(translator.float32_clone(model, CACHE_LENGTH), SOURCE_LENGTH,
                                             CACHE_LENGTH, beam_rows=3)
    assert module.cache_shape == [1, CACHE_LENGTH, 2, 8] and module.cross_shape == [1, SOURCE_LENGTH, 2, 8]
    assert module.past_names == ["past_key_0", "past_value_0", "past_key_1", "past_value_1"]
    assert module.cross_names == ["cross_key_0", "cross_value_0", "cross_key_1", "cross_value_1"]
    assert module.encode_outputs == module.cross_names + ["source_mask"]
    assert module.decode_outputs == ["logits", "present_key_0", "present_value_0", "present_key_1",
                                     "present_value_1"]
    functions = module.signatures()
    assert list(functions) == ["encode", "decode", "decode_beams"]
    assert [names for _, names in functions.values()] == [module.encode_outputs, module.decode_outputs,
                                                           module.decode_outputs]
    [source] = functions["encode"][0].input_signature
    assert (source.name, source.shape.as_list(), source.dtype) == ("source_ids", [1, SOURCE_LENGTH], tf.int32)
    for signature, rows in (("decode", 1), ("decode_beams", 3)):
        specs = functions[signature][0].input_signature
        assert [(s.name, s.shape.as_list(), s.dtype) for s in specs] == (
            [("token_id", [rows, 1], tf.int32), ("position", [1], tf.int32)]
            + [(name, [rows, CACHE_LENGTH, 2, 8], tf.float32) for name in module.past_names]
            + [(name, [rows, SOURCE_LENGTH, 2, 8], tf.float32) for name in module.cross_names]
            + [("source_mask", [rows, SOURCE_LENGTH], tf.float32)])
    floats = module.decode_signature(tf.float32)
    assert (floats[0].dtype, floats[1].dtype, floats[2].dtype) == (tf.float32, tf.float32, tf.float32)
    assert list(translator.TranslatorSignatures(module.clone, SOURCE_LENGTH, CACHE_LENGTH).signatures()) == [
        "encode", "decode"]


@pytest.mark.parametrize("target, dtype", [("gpu", tf.int32), ("gl", tf.float32)])
def test_the_shader_signatures_take_ids_and_positions_in_the_targets_input_dtype(model, target, dtype):
    clone = translator.float32_clone(model, CACHE_LENGTH)
    module = translator.ShaderTranslatorSignatures(clone, SOURCE_LENGTH, CACHE_LENGTH, target_of(target))
    functions = module.signatures()
    assert list(functions) == ["encode", "decode"]
    [source] = functions["encode"][0].input_signature
    assert (source.name, source.shape.as_list(), source.dtype) == ("source_ids", [1, SOURCE_LENGTH], dtype)
    specs = functions["decode"][0].input_signature
    assert [(s.name, s.shape.as_list(), s.dtype) for s in specs] == (
        [("token_id", [1, 1], dtype), ("position", [1], dtype)]
        + [(name, [1, CACHE_LENGTH, 2, 8], tf.float32) for name in module.past_names]
        + [(name, [1, SOURCE_LENGTH, 2, 8], tf.float32) for name in module.cross_names]
        + [("source_mask", [1, SOURCE_LENGTH], tf.float32)])


def test_the_encode_signature_gives_the_models_cross_keys_and_mask(model):
    session = _session(model)
    row = np.full([1, SOURCE_LENGTH], model.pad_id, np.int32)
    row[0, :3] = [9, 21, model.eos_id]
    outputs = session.run(translator.ENCODE, {"source_ids": row})
    assert outputs["source_mask"].dtype == np.float32
    assert outputs["source_mask"].tolist() == [[1.0] * 3 + [0.0] * (SOURCE_LENGTH - 3)]
    encoded, _ = model.encode(row)
    for layer, pair in enumerate(model.cross_key_values(encoded)):
        for kind, expected in zip(("key", "value"), pair):
            np.testing.assert_allclose(outputs[f"cross_{kind}_{layer}"], np.asarray(expected), atol=1e-5,
                                       rtol=0)


def test_the_signatures_of_a_model_with_dropout_run_in_inference():
    """The files hold no dropout: encode and decode give the model's inference outputs, call after call."""
    keras.utils.set_random_seed(4)
    model = Seq2SeqTransformer(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=40, max_length=12,
                               dropout=0.5)
    model.build_on_dummy()
    session = _session(model)
    row = np.full([1, SOURCE_LENGTH], model.pad_id, np.int32)
    row[0, :4] = [9, 21, 14, model.eos_id]
    first, second = (session.run(translator.ENCODE, {"source_ids": row}) for _ in range(2))
    (keys, values), = model.cross_key_values(model.encode(row)[0])
    for outputs in (first, second):
        np.testing.assert_allclose(outputs["cross_key_0"], np.asarray(keys), atol=1e-5, rtol=0)
        np.testing.assert_allclose(outputs["cross_value_0"], np.asarray(values), atol=1e-5, rtol=0)
    forced = [17, 5, 23]
    logits = []
    _search(session, model, row[0, :4].tolist(), forced_ids=forced, logits=logits)
    target = np.array([[model.bos_id] + forced[:-1]], np.int32)
    full = np.asarray(model({"source_ids": row, "target_ids": target}), np.float64)[0]
    np.testing.assert_allclose(np.stack(logits), full, atol=TOLERANCE, rtol=0)


def test_the_float32_clone_has_the_weights_in_float32_and_rope_frozen_at_the_cache():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = sharp_translator(4)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    clone = translator.float32_clone(model, CACHE_LENGTH)
    assert type(clone) is Seq2SeqTransformer and clone.get_config() == model.get_config()
    for mine, theirs in zip(clone.get_weights(), model.get_weights()):
        assert mine.dtype == np.float32
        np.testing.assert_array_equal(mine, np.asarray(theirs, np.float32))
    assert all(layer.compute_dtype == "float32" for layer in clone._flatten_layers())
    ropes = [layer for layer in clone._flatten_layers() if isinstance(layer, RotaryEmbedding)]
    assert ropes and all(layer._frozen_length == CACHE_LENGTH for layer in ropes)


def test_cache_bytes_is_both_kinds_of_every_layers_float32_cache():
    model = sharp_translator(5)
    assert translator.cache_bytes(model, 7) == 2 * 2 * 7 * 16 * 4


def test_past_names_are_counted_from_the_cross_outputs():
    cross = {"cross_key_0": 0, "cross_value_0": 0, "cross_key_1": 0, "cross_value_1": 0,
             "cross_key_2": 0, "cross_value_2": 0, "source_mask": 0}
    assert translator._past_names(cross) == ["past_key_0", "past_value_0", "past_key_1", "past_value_1",
                                            "past_key_2", "past_value_2"]


def test_log_softmax_is_exact_in_float64_for_large_logits():
    logits = np.array([[1000.0, 999.0, 990.0], [-5.0, 0.0, 5.0]], np.float32)
    expected = np.log(np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True)).sum(-1))
    got = translator._log_softmax(logits)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, logits - logits.max(-1, keepdims=True) - expected[:, None], atol=1e-12)
