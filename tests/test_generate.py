"""CausalLM.generate and the key/value cache: decode steps equal the full forward pass.

Backend-agnostic (Keras 2, Keras 3 on TensorFlow and JAX). Every position
kind: the logits of a prefill and of each decode step equal those of one
full causal pass over the same tokens, and left padding never changes a
continuation.
"""

import numpy as np
import pytest

from keras_posenc.backend import ops
from keras_posenc.generation import check_prompt, generate, sample_next
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


def test_rows_that_stop_at_different_steps():
    # Each row ends at its own first stop_id (the rest pad_id) and the other rows go on unchanged;
    # the decode steps end once every row has stopped.
    model = _model()
    prompt = np.array([[0, 3, 4], [5, 6, 7]])
    free = model.generate(prompt, 8).ids
    firsts = []
    for stop in np.unique(free):
        result = model.generate(prompt, 8, stop_id=int(stop))
        first = [int(np.argmax(row == stop)) if (row == stop).any() else None for row in free]
        for row, index in enumerate(first):
            end = 8 if index is None else index + 1
            np.testing.assert_array_equal(result.ids[row, :end], free[row, :end])
            assert (result.ids[row, end:] == 0).all()
        assert result.decode_steps == (7 if None in first else min(max(first), 7))
        firsts.append(first)
    # This model's free run gives both cases: one row stopping while the other goes on, and both
    # rows stopping at different steps.
    assert any(None in first for first in firsts)
    assert any(None not in first and first[0] != first[1] for first in firsts)


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


@pytest.mark.parametrize("prompt,message", [
    ([], "`prompt_ids` is empty: give at least one token."),
    (np.zeros([0], np.int32), "`prompt_ids` is empty (shape (1, 0)): give at least one token."),
    (np.zeros([2, 0], np.int64), "`prompt_ids` is empty (shape (2, 0)): give at least one token."),
    ([[[4, 5]]], "`prompt_ids` must have shape [length] or [batch, length], got shape (1, 1, 2)."),
    ([[4, 5], [6, 10]], "`prompt_ids` must lie in [0, vocab_size=10), got 10."),
    ([[4, -2], [6, 9]], "`prompt_ids` must lie in [0, vocab_size=10), got -2."),
    ([[2, 4, 5], [2, 2, 2]], "`prompt_ids` row 1 is all padding (pad_id=2): give at least one token."),
    ([[2, 4, 5], [2, 4, 2]], "`prompt_ids` must be left-padded: row 1 has padding (pad_id=2) after a "
                             "real token."),
])
def test_check_prompt_messages_name_the_row_and_the_value(prompt, message):
    with pytest.raises(ValueError) as error:
        check_prompt(prompt, vocab_size=10, pad_id=2)
    assert str(error.value) == message


def test_check_prompt_takes_one_token_and_left_padding_of_any_pad_id():
    assert check_prompt([7], vocab_size=10, pad_id=0).tolist() == [[7]]
    prompt = check_prompt(np.array([[2, 2, 0, 5], [1, 0, 9, 3]], np.uint8), vocab_size=10, pad_id=2)
    assert prompt.dtype == np.int64 and prompt.tolist() == [[2, 2, 0, 5], [1, 0, 9, 3]]


def test_float_prompt_is_a_type_error():
    with pytest.raises(TypeError) as error:
        check_prompt([[1.5, 2.0]], vocab_size=10, pad_id=0)
    assert str(error.value) == "`prompt_ids` must be integer token ids, got dtype float64."


def test_generating_past_max_length_is_rejected():
    model = _model()
    with pytest.raises(ValueError) as error:
        model.generate([[0, 0, 5, 6, 7]], 22)
    assert str(error.value) == ("Generating past the model's max_length=24: the longest prompt (3 tokens) "
                                "plus max_new_tokens=22 needs 25 positions.")
    # The limit counts positions, not cache slots: 3 real tokens + 21 new ones fit 24, in every row.
    assert model.generate([[0, 0, 5, 6, 7]], 21).ids.shape == (1, 21)
    assert model.generate([[0, 4, 5, 6], [9, 8, 5, 6]], 20).ids.shape == (2, 20)
    with pytest.raises(ValueError, match=r"the longest prompt \(4 tokens\) plus max_new_tokens=21 needs 25"):
        model.generate([[0, 4, 5, 6], [9, 8, 5, 6]], 21)


def test_overflow_extend_generates_past_max_length():
    # overflow="extend" computes the positions past the table: 4 real tokens + 12 new ones past
    # max_length=12, each id still the argmax of the full pass (which extends the same way).
    model = _model("sinusoidal", {"overflow": "extend"}, max_length=12)
    prompt = np.array([[0, 4, 5, 6], [9, 8, 5, 6]])
    ids = model.generate(prompt, 12).ids
    full = _full_logits(model, np.concatenate([prompt, ids], 1))[:, prompt.shape[1] - 1:-1]
    full[..., 0] = -np.inf
    np.testing.assert_array_equal(full.argmax(-1), ids)


def test_generate_runs_one_prefill_and_one_step_per_later_token(monkeypatch):
    # The cost model: one call of the compiled step over the prompt, then one per new token after
    # the first. `warmup` runs one prefill and one decode step of the same shapes first (so the timed
    # steps reuse their trace), and the same ids follow.
    from keras_posenc import generation

    calls = []
    compiled = generation._step_function

    def shape(tensor):
        return None if tensor is None else tuple(tensor.shape)

    def counting(model):
        step = compiled(model)

        def recorded(ids, positions, cache, index, languages):
            calls.append((shape(ids), shape(positions), shape(cache), shape(index), shape(languages)))
            return step(ids, positions, cache, index, languages)

        return recorded

    monkeypatch.setattr(generation, "_step_function", counting)
    for model, languages in ((_model(), None), (_model("sinusoidal", {"num_languages": 3}), (2,))):
        cache = tuple(model.encoder.cache_shape(2, 7))
        prefill, decode = ((2, 3), (2, 3), cache, (), languages), ((2, 1), (2, 1), cache, (), languages)
        language_ids = None if languages is None else [1, 2]
        calls.clear()
        plain = generate(model, [[0, 3, 4], [5, 6, 7]], 4, language_ids=language_ids)
        assert calls == [prefill, decode, decode, decode] and plain.decode_steps == 3
        calls.clear()
        warm = generate(model, [[0, 3, 4], [5, 6, 7]], 4, language_ids=language_ids, warmup=True)
        assert calls == [prefill, decode, prefill, decode, decode, decode]
        np.testing.assert_array_equal(warm.ids, plain.ids)


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


def test_sampling_settings_messages_and_bounds():
    model = _model()
    bad = [
        ({"max_new_tokens": 0}, "`max_new_tokens` must be an int >= 1, got max_new_tokens=0."),
        ({"max_new_tokens": 2.0}, "`max_new_tokens` must be an int >= 1, got max_new_tokens=2.0."),
        ({"max_new_tokens": True}, "`max_new_tokens` must be an int >= 1, got max_new_tokens=True."),
        ({"sampler": "beam"}, "`sampler` must be one of ('greedy', 'top_k', 'top_p'), got sampler='beam'."),
        ({"temperature": 0.0}, "`temperature` must be > 0, got temperature=0.0."),
        ({"temperature": float("nan")}, "`temperature` must be > 0, got temperature=nan."),
        ({"sampler": "top_k"}, "`k` must be an int >= 1 with sampler='top_k', got k=None."),
        ({"sampler": "top_k", "k": 0}, "`k` must be an int >= 1 with sampler='top_k', got k=0."),
        ({"sampler": "top_k", "k": 2.0}, "`k` must be an int >= 1 with sampler='top_k', got k=2.0."),
        ({"sampler": "top_k", "k": True}, "`k` must be an int >= 1 with sampler='top_k', got k=True."),
        ({"sampler": "top_p"}, "`p` must lie in (0, 1] with sampler='top_p', got p=None."),
        ({"sampler": "top_p", "p": 0.0}, "`p` must lie in (0, 1] with sampler='top_p', got p=0.0."),
        ({"sampler": "top_p", "p": 1.5}, "`p` must lie in (0, 1] with sampler='top_p', got p=1.5."),
    ]
    for kwargs, message in bad:
        kwargs = {"max_new_tokens": 2, **kwargs}
        with pytest.raises(ValueError) as error:
            model.generate([[3, 4]], **kwargs)
        assert str(error.value) == message, kwargs
    # The bounds themselves are allowed; k and p matter only for their own sampler.
    for kwargs in ({"max_new_tokens": np.int64(1)}, {"sampler": "top_k", "k": np.int32(1)},
                   {"sampler": "top_p", "p": 1.0}, {"sampler": "greedy", "k": 0, "p": 5.0}):
        kwargs = {"max_new_tokens": 1, "seed": 0, **kwargs}
        assert model.generate([[3, 4]], **kwargs).ids.shape == (1, 1)


def test_language_ids_are_required_exactly_with_languages():
    with pytest.raises(ValueError, match="num_languages=3, language_ids=None"):
        _model("sinusoidal", {"num_languages": 3}).generate([[3, 4]], 2)
    with pytest.raises(ValueError, match="num_languages=None, language_ids=1"):
        _model().generate([[3, 4]], 2, language_ids=1)


def test_a_model_without_the_causal_mask_cannot_generate():
    model = CausalLM({**BASE}, causal=False)
    with pytest.raises(ValueError) as error:
        model.generate([[3, 4]], 2)
    assert str(error.value) == "`generate` needs a causal model; this CausalLM has causal=False."


def test_cache_shape_is_checked():
    model = _model()
    with pytest.raises(ValueError, match=r"cache.*num_layers=2"):
        model(np.ones([1, 2], np.int32), cache=ops.zeros([1, 3, 2, 8, 2, 8]), cache_index=0)


def test_sample_next_defaults_to_greedy_int64_ids():
    # [batch, vocab] logits; the default sampler is the argmax, and the ids are int64 (they index a
    # vocabulary as they are).
    logits = np.array([[0.0, 3.0, 1.0], [2.0, -1.0, 5.0]], np.float32)
    ids = sample_next(logits)
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(ids, [1, 2])
    assert np.array(["a", "b", "c"])[ids].tolist() == ["b", "c"]


def test_top_k_ranks_tied_logits_by_id():
    # 40 tied logits: top_k keeps the lowest k ids (ranked as argmax ranks ties), so a seed draws
    # the same ids whatever numpy's default sort does with ties.
    rng = np.random.default_rng(0)
    draws = {int(sample_next(np.zeros([1, 40]), "top_k", k=2, rng=rng)[0]) for _ in range(200)}
    assert draws == {0, 1}


def test_top_p_compares_the_float64_mass_of_float32_logits():
    # Three tied float32 logits: the mass before the third id is 2/3 in float64, not below
    # p = 0.66666666, so the third id is dropped (float32 arithmetic gives 0.6666666 and keeps it).
    logits = np.zeros([1, 3], np.float32)
    rng = np.random.default_rng(0)
    draws = {int(sample_next(logits, "top_p", p=0.66666666, rng=rng)[0]) for _ in range(200)}
    assert draws == {0, 1}


def test_sampling_is_invariant_to_a_constant_added_to_the_logits():
    # Softmax ignores a constant per row: logits around 500 (exp would overflow unshifted) draw
    # the same ids as the same logits around 0, for the same seed.
    logits = np.array([[0.0, -0.5, -1.0, -3.0], [-2.0, 0.0, -0.2, -1.0]])
    for sampler, kwargs in (("top_k", {"k": 3}), ("top_p", {"p": 0.8})):
        small, large = np.random.default_rng(5), np.random.default_rng(5)
        for _ in range(50):
            np.testing.assert_array_equal(sample_next(logits + 500.0, sampler, rng=large, **kwargs),
                                          sample_next(logits, sampler, rng=small, **kwargs))


def test_top_p_keeps_each_rows_own_nucleus_in_a_batch():
    # Row 0: probabilities 0.5, 0.3, 0.15, 0.05, p = 0.7 keeps ids {0, 1}. Row 1: the same
    # probabilities over the ids in reverse order, so it keeps {3, 2}. Each row's mass is its own.
    probabilities = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(np.stack([probabilities, probabilities[::-1]]))
    rng = np.random.default_rng(0)
    draws = np.stack([sample_next(logits, "top_p", p=0.7, rng=rng) for _ in range(300)])
    assert set(draws[:, 0].tolist()) == {0, 1}
    assert set(draws[:, 1].tolist()) == {2, 3}


def test_top_p_stops_at_the_first_id_whose_mass_reaches_p():
    # Two tied ids of probability exactly 0.5: with p = 0.5 the first id alone reaches p, so the
    # second is never drawn; a p just above 0.5 needs both.
    logits = np.zeros([1, 2])
    rng = np.random.default_rng(0)
    assert {int(sample_next(logits, "top_p", p=0.5, rng=rng)[0]) for _ in range(100)} == {0}
    assert {int(sample_next(logits, "top_p", p=0.5 + 1e-9, rng=rng)[0]) for _ in range(100)} == {0, 1}


def test_generate_reports_the_clock_split():
    # A clock read at the prefill's start and end, then at the decode's start and end.
    readings = iter([10.0, 12.5, 13.0, 20.0])
    model = _model()
    result = generate(model, [[0, 3, 4], [5, 6, 7]], 4, clock=lambda: next(readings))
    assert (result.prefill_seconds, result.decode_seconds, result.decode_steps) == (2.5, 7.0, 3)
    assert result.decode_tokens_per_second == 2 * 3 / 7.0
    assert result.ids.shape == (2, 4) and result.ids.dtype == np.int64


def _replayed_draws(model, prompt, ids, sampler, seed, **kwargs):
    """The ids a generator seeded with `seed` draws from the full causal pass over prompt + ids."""
    full = _full_logits(model, np.concatenate([prompt, ids], 1))[:, prompt.shape[1] - 1:-1]
    full = full.astype(np.float64)
    full[..., 0] = -np.inf  # pad_id is never generated
    rng = np.random.default_rng(seed)
    return np.stack([sample_next(full[:, t], sampler, rng=rng, **kwargs) for t in range(ids.shape[1])], 1)


@pytest.mark.parametrize("sampler,kwargs", [("top_k", {"k": 6, "temperature": 1.5}),
                                            ("top_p", {"p": 0.9, "temperature": 0.7})])
def test_sampled_ids_are_the_seeded_draws_from_the_full_pass(sampler, kwargs):
    # Each sampled id is the draw of a generator seeded like generate's from the full causal pass's
    # logits over prompt + ids, with the sampler's settings.
    model = _model()
    prompt = np.array([[0, 3, 4], [5, 6, 7]])
    ids = model.generate(prompt, 5, sampler=sampler, seed=3, **kwargs).ids
    assert (ids != model.generate(prompt, 5).ids).any()  # not the greedy continuation
    np.testing.assert_array_equal(ids, _replayed_draws(model, prompt, ids, sampler, 3, **kwargs))
    # generate's own default temperature is 1.0.
    settings = {key: value for key, value in kwargs.items() if key != "temperature"}
    ids = generate(model, prompt, 5, sampler=sampler, seed=3, **settings).ids
    np.testing.assert_array_equal(ids, _replayed_draws(model, prompt, ids, sampler, 3, temperature=1.0,
                                                       **settings))


def test_generate_runs_the_model_in_inference_mode():
    # With dropout in the model, generated ids are the argmax of the full pass in inference mode.
    model = _model(dropout=0.5)
    prompt = np.array([[0, 3, 4], [5, 6, 7]])
    ids = model.generate(prompt, 6).ids
    full = _full_logits(model, np.concatenate([prompt, ids], 1))[:, prompt.shape[1] - 1:-1]
    full[..., 0] = -np.inf
    np.testing.assert_array_equal(full.argmax(-1), ids)
