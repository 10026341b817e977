"""CausalLM.generate and the key/value cache: decode steps equal the full forward pass.

Backend-agnostic (Keras 2, Keras 3 on TensorFlow and JAX). Every position
kind: the logits of a prefill and of each decode step equal those of one
full causal pass over the same tokens, and left padding never changes a
continuation.
"""

import numpy as np
import pytest

from keras_posenc.backend import ops
from keras_posenc.generation import check_prompt, sample_next
from keras_posenc.models import CausalLM

BASE = {"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 24,
        "dropout": 0.0}
# Every RoPE scaling. "dynamic" and "longrope" scale by the call's length, as Hugging Face does:
# each decode step by its own length, the cached keys keeping the rotation they were written
# with. Their steps equal the full pass while the length stays within `original_length` (below),
# where neither switches; past it they follow Hugging Face's generate, not one full pass.
ROTARY = [{"scaling": None}, {"scaling": "linear", "scaling_factor": 2.0},
          {"scaling": "ntk", "scaling_factor": 2.0},
          {"scaling": "yarn", "scaling_factor": 2.0, "original_length": 12},
          {"scaling": "yarn", "scaling_factor": 4.0, "original_length": 12, "mscale": 0.707,
           "mscale_all_dim": 0.707, "partial_rotary_factor": 0.5},
          {"scaling": "yarn-turns", "scaling_factor": 2.0, "original_length": 12},
          {"scaling": "llama3", "scaling_factor": 8.0, "original_length": 12},
          {"scaling": "dynamic", "scaling_factor": 2.0, "original_length": 16},
          {"scaling": "longrope", "scaling_factor": 2.0, "original_length": 16,
           "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [2.0, 3.0, 4.0, 5.0]}]
POSITIONS = (
    [("sinusoidal", {"table": table}) for table in ("full", "factorized", "interpolated")]
    + [("learned", {}), ("integer", {}), ("none", {}), ("alibi", {}),
       ("sinusoidal", {"num_languages": 3}), ("sinusoidal", {"overflow": "extend"})]
    + [("rope", config) for config in ROTARY])
IDS = [f"{p}-{'-'.join(f'{k}={v}' for k, v in c.items()) or 'default'}" for p, c in POSITIONS]


def _model(position="sinusoidal", position_config=None, seed=0, **overrides):
    import keras_posenc.backend as backend

    backend.keras.utils.set_random_seed(seed)
    config = {**BASE, "position": position, **(position_config or {}), **overrides}
    model = CausalLM(config)
    languages = np.zeros([1, 2], np.int32) if model.num_languages else None
    model(np.ones([1, 2], np.int32), language_ids=languages)
    return model


def _languages(model, batch):
    return np.arange(batch, dtype=np.int32) % 3 if model.num_languages else None


def _full_logits(model, ids):
    languages = _languages(model, ids.shape[0])
    if languages is not None:
        languages = np.repeat(languages[:, None], ids.shape[1], axis=1)
    return ops.convert_to_numpy(model(ids, language_ids=languages))


def _step(model, ids, positions, cache, index):
    languages = _languages(model, ids.shape[0])
    if languages is not None:
        languages = np.repeat(languages[:, None], ids.shape[1], 1)
    logits, cache = model(ids.astype(np.int32), position_ids=positions.astype(np.int32),
                          language_ids=languages, cache=cache, cache_index=np.int32(index))
    return ops.convert_to_numpy(logits), cache


@pytest.mark.parametrize("position,config", POSITIONS, ids=IDS)
def test_decode_steps_equal_the_full_forward_pass(position, config):
    model = _model(position, config)
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, BASE["vocab_size"], size=[2, 10])
    tokens[1, :3] = 0  # row 1: a left-padded prompt of 3 real tokens
    prompt_length, cache_length = 6, 12
    full = _full_logits(model, tokens)
    real = tokens[:, :prompt_length] != 0
    positions = np.where(real, np.cumsum(real, 1) - 1, 0)
    cache = ops.zeros(model.encoder.cache_shape(2, cache_length), "float32")
    logits, cache = _step(model, tokens[:, :prompt_length], positions, cache, 0)
    np.testing.assert_allclose(logits[real], full[:, :prompt_length][real], atol=1e-4, rtol=0)
    next_position = real.sum(1)
    for t in range(prompt_length, tokens.shape[1]):
        logits, cache = _step(model, tokens[:, t:t + 1], next_position[:, None], cache, t)
        np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-4, rtol=0, err_msg=f"step {t}")
        next_position = next_position + 1


# One of each family: generate compiles its step per model (slow on JAX), the step itself is
# covered for every kind above.
GENERATE_POSITIONS = [POSITIONS[i] for i in (0, 3, 6, 7, 12)]


@pytest.mark.parametrize("position,config", GENERATE_POSITIONS, ids=[IDS[i] for i in (0, 3, 6, 7, 12)])
def test_left_padding_never_changes_a_continuation(position, config):
    model = _model(position, config)
    prompt = np.array([[0, 0, 0, 7, 3, 9], [5, 2, 8, 7, 3, 9]])
    languages = None if not model.num_languages else np.array([1, 1])
    batched = model.generate(prompt, 8, language_ids=languages).ids
    alone = model.generate([7, 3, 9], 8, language_ids=None if languages is None else 1).ids
    np.testing.assert_array_equal(batched[0], alone[0])
    # Greedy ids are the argmax of the full pass over prompt + continuation (pad_id excluded).
    sequence = np.concatenate([prompt, batched], 1)
    full = _full_logits(model, sequence) if languages is None else ops.convert_to_numpy(
        model(sequence, language_ids=np.ones(sequence.shape, np.int32)))
    full = full[:, prompt.shape[1] - 1:-1]
    full[..., 0] = -np.inf
    np.testing.assert_array_equal(full.argmax(-1), batched)


def test_generate_counts_positions_from_the_real_tokens():
    # An integer position embedding adds the position id itself: any slip in the decode
    # offsets of a padded row shows in the logits.
    model = _model("integer")
    padded = model.generate([[0, 0, 4, 5]], 5).ids
    np.testing.assert_array_equal(padded, model.generate([[4, 5]], 5).ids)


def test_stop_id_pads_the_rest_of_the_row():
    model = _model()
    free = model.generate([[3, 4]], 6).ids[0]
    stop = int(free[2])
    first = int(np.argmax(free == stop))
    stopped = model.generate([[3, 4]], 6, stop_id=stop).ids[0]
    np.testing.assert_array_equal(stopped[:first + 1], free[:first + 1])
    assert (stopped[first + 1:] == 0).all()


def test_sampling_is_seeded_and_stays_in_the_top_k():
    model = _model()
    first = model.generate([[3, 4]], 6, sampler="top_k", k=3, temperature=2.0, seed=7).ids
    again = model.generate([[3, 4]], 6, sampler="top_k", k=3, temperature=2.0, seed=7).ids
    np.testing.assert_array_equal(first, again)
    greedy = model.generate([[3, 4]], 6).ids
    np.testing.assert_array_equal(model.generate([[3, 4]], 6, sampler="top_k", k=1, seed=1).ids, greedy)
    np.testing.assert_array_equal(model.generate([[3, 4]], 6, sampler="top_p", p=1e-9, seed=1).ids, greedy)


def test_sample_next_against_numpy_probabilities():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rng = np.random.default_rng(0)
    draws = np.array([sample_next(logits, "top_p", p=0.7, rng=rng)[0] for _ in range(4000)])
    # top_p=0.7 keeps {0, 1} (mass before id 1 is 0.5 < 0.7, before id 2 is 0.8): renormalised 5/8, 3/8.
    assert set(draws.tolist()) == {0, 1}
    assert abs((draws == 0).mean() - 0.625) < 0.03
    draws = np.array([sample_next(logits, "top_k", k=3, temperature=0.5, rng=rng)[0] for _ in range(4000)])
    expected = np.array([0.5, 0.3, 0.15]) ** 2
    expected /= expected.sum()
    np.testing.assert_allclose(np.bincount(draws, minlength=4)[:3] / 4000, expected, atol=0.03)
    assert (draws != 3).all()


@pytest.mark.parametrize("prompt,match", [
    ([], "empty"),
    ([[0, 0]], "all padding"),
    ([[4, 0]], "left-padded"),
    ([[4, 40]], r"\[0, vocab_size=40\), got 40"),
    ([[4, -1]], "got -1"),
])
def test_bad_prompts_are_rejected(prompt, match):
    model = _model()
    with pytest.raises(ValueError, match=match):
        model.generate(prompt, 2)


def test_float_prompt_is_a_type_error():
    with pytest.raises(TypeError, match="integer token ids"):
        check_prompt([[1.5, 2.0]], vocab_size=10, pad_id=0)


def test_generating_past_max_length_is_rejected():
    model = _model()
    with pytest.raises(ValueError, match="max_length=24.*max_new_tokens=22 needs 25"):
        model.generate([[0, 0, 5, 6, 7]], 22)
    # The limit counts positions, not cache slots: 3 real tokens + 21 new ones fit 24.
    assert model.generate([[0, 0, 5, 6, 7]], 21).ids.shape == (1, 21)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 2, "sampler": "beam"}, "sampler"),
    ({"max_new_tokens": 2, "sampler": "top_k"}, "`k` must be an int >= 1"),
    ({"max_new_tokens": 2, "sampler": "top_p", "p": 1.5}, r"`p` must lie in \(0, 1\]"),
    ({"max_new_tokens": 2, "temperature": 0.0}, "temperature"),
])
def test_bad_sampling_settings_are_rejected(kwargs, match):
    model = _model()
    with pytest.raises(ValueError, match=match):
        model.generate([[3, 4]], **kwargs)


def test_language_ids_are_required_exactly_with_languages():
    with pytest.raises(ValueError, match="num_languages=3, language_ids=None"):
        _model("sinusoidal", {"num_languages": 3}).generate([[3, 4]], 2)
    with pytest.raises(ValueError, match="num_languages=None, language_ids=1"):
        _model().generate([[3, 4]], 2, language_ids=1)


def test_a_model_without_the_causal_mask_cannot_generate():
    model = CausalLM({**BASE}, causal=False)
    with pytest.raises(ValueError, match="causal=False"):
        model.generate([[3, 4]], 2)


def test_cache_shape_is_checked():
    model = _model()
    with pytest.raises(ValueError, match=r"cache.*num_layers=2"):
        model(np.ones([1, 2], np.int32), cache=ops.zeros([1, 3, 2, 8, 2, 8]), cache_index=0)
