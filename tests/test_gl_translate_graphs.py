"""`gl_translate`'s encode and decode graphs, run in TensorFlow before any conversion, against the model.

`--target gpu` and `gl` translate with shader-only graphs of their own (`gl_translate`), not the
model's cached step. Here those graphs (`ShaderTranslatorSignatures`, int32 ids on `gpu`, float32 on
`gl`) run as the `tf.function`s the converter is given: the cross keys and values and the source
mask equal the model's, and a teacher-forced run of the decode step, cache passed from step to step,
gives the model's full-pass logits at every position, for every position kind, post- and pre-LN,
tied and untied heads, padded sources and ids past 2048. tests/test_export_translation.py converts
them and runs the files; this file runs in seconds (it is what `make mutation` runs for the module).
"""

import numpy as np
import pytest
from stacks import once_on_keras2

from keras_posenc.backend import keras
from keras_posenc.export import contract, translator
from keras_posenc.export.targets import target_of
from keras_posenc.seq2seq import Seq2SeqTransformer

SOURCE_LENGTH, CACHE_LENGTH = 7, 6
TOLERANCE = 2e-4  # float32 shader ops (one-hot products, their own softmax) against Keras's kernels


def _model(seed=0, vocab_size=48, num_layers=2, **options):
    """A tiny translator whose every weight is moved off its initial value (norm scales, language
    scales and biases included), so that a weight read from the wrong place shows."""
    keras.utils.set_random_seed(seed)
    model = Seq2SeqTransformer(num_layers=num_layers, d_model=16, num_heads=2, dff=32, vocab_size=vocab_size,
                               max_length=16, dropout=0.0, **options)
    model.build_on_dummy()
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(0.0, 0.2, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def _graphs(model, target):
    clone = translator.float32_clone(model, CACHE_LENGTH)
    module = translator.ShaderTranslatorSignatures(clone, SOURCE_LENGTH, CACHE_LENGTH, target_of(target))
    return module, module.encode_function(), module.decode_function()


def _ids(values, target):
    return np.asarray(values, target_of(target).input_dtype)


def _run_steps(model, target, source, target_ids):
    """The decode graph's logits `[len(target_ids), V]` fed `target_ids` one by one from slot 0."""
    module, encode, decode = _graphs(model, target)
    row = np.full([1, SOURCE_LENGTH], model.pad_id, np.int64)
    row[0, :len(source)] = source
    encoded = {name: np.asarray(value) for name, value in encode(_ids(row, target)).items()}
    cross = [encoded[name] for name in module.cross_names]
    past = [np.zeros(module.cache_shape, np.float32) for _ in module.past_names]
    logits = []
    for position, token in enumerate(target_ids):
        outputs = decode(_ids([[token]], target), _ids([position], target), *past, *cross,
                         encoded[translator.SOURCE_MASK])
        logits.append(np.asarray(outputs[translator.LOGITS])[0])
        past = [np.asarray(outputs[name.replace("past", "present", 1)]) for name in module.past_names]
    return np.stack(logits), encoded


def _full_pass(model, source, target_ids):
    return np.asarray(model({"source_ids": np.array([source], np.int32),
                             "target_ids": np.array([target_ids], np.int32)}), np.float64)[0]


# Keras 3 runs two cases (one per target): the graphs are the same over its clone, whose weights the
# other cases read the same way.
KERAS3_CASES = 2
CASES = [
    ("gpu", {}), ("gl", {"norm_first": True, "position": "sinusoidal"}), ("gl", {}),
    ("gpu", {"position": "sinusoidal"}), ("gl", {"position": "sinusoidal", "language_scale": False}),
    ("gpu", {"position": "alibi"}), ("gl", {"position": "learned"}),
    ("gpu", {"norm_first": True}),
    ("gpu", {"tie_output": True}), ("gl", {"share_embeddings": True, "tie_output": True}),
    ("gpu", {"num_layers": 1, "position": "alibi"}),
]


@pytest.mark.parametrize("target, options", [
    pytest.param(target, options, marks=() if i < KERAS3_CASES else once_on_keras2("the same graphs"),
                 id="-".join([target] + [f"{k}={v}" for k, v in options.items()]))
    for i, (target, options) in enumerate(CASES)])
def test_teacher_forced_steps_give_the_models_full_pass_logits(target, options):
    model = _model(**options)
    source = [9, 14, 30, 22, model.eos_id]  # two padding slots after it
    target_ids = [model.bos_id, 17, 5, 40, 11, 29]  # every cache slot
    logits, _ = _run_steps(model, target, source, target_ids)
    np.testing.assert_allclose(logits, _full_pass(model, source, target_ids), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_the_cross_keys_values_and_mask_are_the_models_at_the_real_tokens(target):
    model = _model(1, position="sinusoidal")
    source = [7, 8, 25, model.eos_id]
    module, encode, _ = _graphs(model, target)
    row = np.full([1, SOURCE_LENGTH], model.pad_id, np.int64)
    row[0, :4] = source
    encoded = encode(_ids(row, target))
    assert np.asarray(encoded[translator.SOURCE_MASK]).tolist() == [[1.0] * 4 + [0.0] * 3]
    outputs, _ = model.encode(row.astype(np.int32))
    for layer, (keys, values) in enumerate(model.cross_key_values(outputs)):
        for kind, expected in (("key", keys), ("value", values)):
            got = np.asarray(encoded[contract.cross_name(kind, layer)])
            assert got.shape == (1, SOURCE_LENGTH, 2, 8)
            np.testing.assert_allclose(got[:, :4], np.asarray(expected)[:, :4], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_the_source_padding_is_masked_whatever_its_keys(target):
    """The padding's cross keys and values are read by nothing: replaced by noise, the logits stay."""
    model = _model(2)
    module, encode, decode = _graphs(model, target)
    row = np.full([1, SOURCE_LENGTH], model.pad_id, np.int64)
    row[0, :3] = [12, 19, model.eos_id]
    encoded = {name: np.asarray(value) for name, value in encode(_ids(row, target)).items()}
    noisy = {name: value.copy() for name, value in encoded.items()}
    for name in module.cross_names:
        noisy[name][:, 3:] = np.random.default_rng(0).normal(0, 5, noisy[name][:, 3:].shape)
    past = [np.zeros(module.cache_shape, np.float32) for _ in module.past_names]

    def step(tensors):
        cross = [tensors[name] for name in module.cross_names]
        outputs = decode(_ids([[model.bos_id]], target), _ids([0], target), *past, *cross,
                         tensors[translator.SOURCE_MASK])
        return np.asarray(outputs[translator.LOGITS])

    np.testing.assert_allclose(step(noisy), step(encoded), atol=1e-5, rtol=0)
    np.testing.assert_allclose(step(encoded)[0], _full_pass(model, row[0, :3], [model.bos_id])[0],
                               atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_ids_past_2048_are_looked_up_exactly(target):
    model = _model(3, vocab_size=2100, tie_output=True)
    source = [2090, 2049, 7, model.eos_id]
    target_ids = [model.bos_id, 2099, 2048, 2047]
    logits, _ = _run_steps(model, target, source, target_ids)
    np.testing.assert_allclose(logits, _full_pass(model, source, target_ids), atol=TOLERANCE, rtol=0)


def test_the_step_writes_only_its_own_cache_slot():
    model = _model(4)
    module, encode, decode = _graphs(model, "gpu")
    row = np.full([1, SOURCE_LENGTH], model.pad_id, np.int32)
    row[0, :2] = [10, model.eos_id]
    encoded = {name: np.asarray(value) for name, value in encode(row).items()}
    cross = [encoded[name] for name in module.cross_names]
    rng = np.random.default_rng(1)
    past = [rng.normal(size=module.cache_shape).astype(np.float32) for _ in module.past_names]
    outputs = decode(np.array([[21]], np.int32), np.array([3], np.int32), *past, *cross,
                     encoded[translator.SOURCE_MASK])
    for name, before in zip(module.past_names, past):
        after = np.asarray(outputs[name.replace("past", "present", 1)])
        np.testing.assert_array_equal(np.delete(after, 3, axis=1), np.delete(before, 3, axis=1))
        assert not np.allclose(after[:, 3], before[:, 3])
