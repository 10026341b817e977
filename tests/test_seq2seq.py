"""DecoderLayer and Seq2SeqTransformer: the Keras contract, cached = full, padding invariance, the loss."""

import itertools

import numpy as np
import pytest
from layer_test_helper import error_message, randomized, run_layer_test, to_numpy

from keras_posenc.backend import keras, ops, save_model
from keras_posenc.beam_search import beam_search, greedy_search, length_penalty
from keras_posenc.layers.decoder_layer import DecoderLayer
from keras_posenc.seq2seq import TARGET_LANGUAGE, Seq2SeqTransformer

SMALL = {"d_model": 16, "num_heads": 2, "dff": 32}
MODEL = {"num_layers": 2, "vocab_size": 40, "max_length": 24, "dropout": 0.0, "position": "sinusoidal",
         **SMALL}
# Softmax is invariant to a per-query constant, and q . b_k is one: key biases get no gradient.
KEY_BIASES = ("key/bias",)


def normal(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


# DecoderLayer ------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_contract(tmp_path, norm_first):
    source_mask = np.array([[True] * 6, [True, True, True, False, False, False]])
    run_layer_test(DecoderLayer, {**SMALL, "norm_first": norm_first},
                   {"inputs": normal([2, 5, 16]), "encoder_outputs": normal([2, 6, 16], 1),
                    "encoder_mask": source_mask},
                   expected_output_shape=(2, 5, 16), expected_num_trainable_weights=26,
                   weights_without_gradient=KEY_BIASES, tmp_dir=tmp_path)


def test_decoder_layer_never_attends_to_source_padding_or_the_future():
    layer = DecoderLayer(**SMALL, dropout=0.0)
    x, source = normal([2, 5, 16]), normal([2, 6, 16], 1)
    source_mask = np.array([[True] * 6, [False, False, True, True, True, True]])
    y, self_scores, cross_scores = layer(x, source, encoder_mask=source_mask, return_attention_scores=True)
    self_scores, cross_scores = to_numpy(self_scores), to_numpy(cross_scores)
    assert np.triu(self_scores.max(axis=(0, 1)), k=1).max() == 0.0  # no later target token
    assert cross_scores[1, :, :, :2].max() == 0.0
    np.testing.assert_allclose(cross_scores.sum(-1), 1.0, atol=1e-6)
    # The padded source row gives what the unpadded source gives.
    alone = layer(x[1:], source[1:, 2:])
    np.testing.assert_allclose(to_numpy(y)[1], to_numpy(alone)[0], atol=1e-5)


def test_decoder_layer_output_is_causal():
    layer = DecoderLayer(**SMALL, dropout=0.0)
    x, source = normal([1, 5, 16]), normal([1, 4, 16], 1)
    changed = x.copy()
    changed[0, 3:] += 1.0
    a, b = to_numpy(layer(x, source)), to_numpy(layer(changed, source))
    np.testing.assert_array_equal(a[0, :3], b[0, :3])
    assert np.abs(a[0, 3:] - b[0, 3:]).min() > 0


def reference_decoder_layer(layer, x, source, target_mask, source_mask, norm_first, epsilon):
    """DecoderLayer's output from its weights in float64 numpy: causal self-attention over the real
    target tokens, cross-attention over the real source tokens, the feed-forward net (relu), each
    sublayer's residual and LayerNorm, post- or pre-LN."""
    def dense(layer_dense, v, spec):
        kernel, bias = (np.asarray(w, np.float64) for w in (layer_dense.kernel, layer_dense.bias))
        return np.einsum(spec, v, kernel) + bias

    def attend(attention, queries, keys_from, allowed):
        q = dense(attention.query_dense, queries, "btd,dhk->bthk")
        k = dense(attention.key_dense, keys_from, "btd,dhk->bthk")
        v = dense(attention.value_dense, keys_from, "btd,dhk->bthk")
        logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        logits = np.where(allowed[:, None], logits, -1e30)  # a padding query (no key) is never read
        probabilities = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        return dense(attention.output_dense, np.einsum("bhqk,bkhd->bqhd", probabilities, v), "bqhd,hdo->bqo")

    def norm(layer_norm, v):
        gamma, beta = (np.asarray(w, np.float64) for w in (layer_norm.gamma, layer_norm.beta))
        scale = gamma / np.sqrt(v.var(-1, keepdims=True) + epsilon)
        return (v - v.mean(-1, keepdims=True)) * scale + beta

    def feed_forward(h):
        hidden = np.maximum(dense(layer.ffn_hidden, h, "btd,dk->btk"), 0.0)
        return dense(layer.ffn_output, hidden, "btk,kd->btd")

    length = x.shape[1]
    causal = target_mask[:, None, :] & np.tril(np.ones([length, length], bool))[None]
    cross = np.broadcast_to(source_mask[:, None, :], [len(x), length, source.shape[1]])
    sublayers = [(layer.self_attention_norm, lambda h: attend(layer.self_attention, h, h, causal)),
                 (layer.cross_attention_norm, lambda h: attend(layer.cross_attention, h, source, cross)),
                 (layer.ffn_norm, feed_forward)]
    x, source = np.asarray(x, np.float64), np.asarray(source, np.float64)
    for layer_norm, sublayer in sublayers:
        x = x + sublayer(norm(layer_norm, x)) if norm_first else norm(layer_norm, x + sublayer(x))
    return x


def _randomized_decoder_layer(x, source, **settings):
    return randomized(DecoderLayer(**SMALL, **settings), x, source)


@pytest.mark.parametrize("norm_first", [False, True, "default"])
def test_decoder_layer_equals_a_numpy_reference(norm_first):
    # Left, right and inner padding of the target; padding of the source on both sides.
    x, source = normal([3, 5, 16], 2), normal([3, 6, 16], 3)
    target_mask = np.array([[True] * 5, [False, True, True, True, False], [True, True, False, True, True]])
    source_mask = np.array([[True] * 6, [False, True, True, True, True, False], [True] * 6])
    if norm_first == "default":  # post-LN, epsilon 1e-6
        layer, norm_first, epsilon = _randomized_decoder_layer(x, source), False, 1e-6
    else:
        layer, epsilon = _randomized_decoder_layer(x, source, norm_first=norm_first, epsilon=0.5,
                                                   dropout=0.3), 0.5
    expected = reference_decoder_layer(layer, x, source, target_mask, source_mask, norm_first, epsilon)
    got = to_numpy(layer(x, source, mask=target_mask, encoder_mask=source_mask))
    np.testing.assert_allclose(got[target_mask], expected[target_mask], atol=2e-5)


def test_decoder_layer_passes_the_keras_mask_on():
    ids, source = keras.Input([5], dtype="int32"), keras.Input([6, 16])
    embedded = keras.layers.Embedding(40, 16, mask_zero=True)(ids)
    outputs = DecoderLayer(**SMALL, dropout=0.0)(embedded, source)
    pooled = keras.layers.GlobalAveragePooling1D()(outputs)  # averages over the masked-in steps only
    model = keras.Model([ids, source], [outputs, pooled])
    ids_value = np.array([[5, 6, 7, 0, 0], [8, 9, 10, 11, 0]], np.int32)
    got, got_pooled = (to_numpy(v) for v in model([ids_value, normal([2, 6, 16])]))
    real = ids_value != 0
    expected = (got * real[..., None]).sum(1) / real.sum(1, keepdims=True)
    np.testing.assert_allclose(got_pooled, expected, atol=1e-5)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_decoder_layer_positions_follow_the_mask_or_the_given_ids(position):
    x, source = normal([1, 4, 16], 5), normal([1, 3, 16], 6)
    layer = _randomized_decoder_layer(x, source, position=position, dropout=0.0)
    real = [0, 2, 3]
    alone = to_numpy(layer(x[:, real], source))[0]
    # An inner padding step: the real tokens are numbered 0, 1, 2 as when alone.
    padded = to_numpy(layer(x, source, mask=np.array([[True, False, True, True]])))[0]
    np.testing.assert_allclose(padded[real], alone, atol=2e-5)
    # Given ids are used: a gap changes the output, a shift of every id does not (relative positions).
    gapped = to_numpy(layer(x[:, real], source, position_ids=np.array([[0, 1, 5]])))[0]
    shifted = to_numpy(layer(x[:, real], source, position_ids=np.array([[7, 8, 9]])))[0]
    assert np.abs(gapped - alone)[1:].max() > 1e-3
    np.testing.assert_allclose(shifted, alone, atol=2e-5)


def test_decoder_layer_errors():
    assert "divisible" in error_message(lambda: DecoderLayer(d_model=10, num_heads=3, dff=8))
    layer = DecoderLayer(**SMALL)
    message = error_message(lambda: layer(normal([1, 3, 16]), normal([1, 3, 8])))
    assert "`encoder_outputs` must have shape [batch, length, d_model=16]" in message
    message = error_message(lambda: DecoderLayer(**SMALL).build((1, 3, 8)))
    assert message == "`x` must have shape [batch, length, d_model=16], got shape (1, 3, 8)."
    built = DecoderLayer(**SMALL)
    built(normal([1, 3, 16]), normal([1, 3, 16]))  # built: the call checks its inputs itself
    message = error_message(lambda: built(normal([1, 3, 8]), normal([1, 3, 16])))
    assert "`x` must have shape [batch, length, d_model=16], got shape (1, 3, 8)." in message.splitlines()
    needed = "cached decoding needs `cache_index` and `position_ids` (int [batch, length])."
    for cache_index, position_ids in [(None, None), (None, np.zeros([1, 1], np.int32)), (0, None)]:
        message = error_message(lambda index=cache_index, ids=position_ids: layer.cached_step(
            normal([1, 1, 16]), None, None, index, ids, None, None))
        assert message.splitlines()[0] == needed, (cache_index, position_ids)


def test_decoder_sublayers_keep_their_names_rates_and_the_layer_policy():
    # The names are the weights' paths in checkpoints; every sublayer computes in the layer's policy.
    layer = DecoderLayer(**SMALL, dropout=0.25, dtype="mixed_float16")
    layer(normal([1, 3, 16]).astype(np.float16), normal([1, 4, 16]).astype(np.float16))
    sublayers = [layer.self_attention, layer.cross_attention, layer.self_attention_norm,
                 layer.cross_attention_norm, layer.ffn_hidden, layer.ffn_output, layer.ffn_norm]
    assert [sublayer.name for sublayer in sublayers] == [
        "self_attention", "cross_attention", "self_attention_norm", "cross_attention_norm", "ffn_hidden",
        "ffn_output", "ffn_norm"]
    assert {sublayer.dtype_policy.name for sublayer in sublayers} == {"mixed_float16"}
    assert [attention.get_config()["dropout"] for attention in sublayers[:2]] == [0.25, 0.25]
    assert layer.supports_masking is True  # Keras reads it before passing a mask on


def test_decoder_attention_kernels_start_at_the_glorot_scale_keras_has_always_used():
    # Fans of the rank-3 kernel [64, 4, 16] as a convolution's: limit sqrt(6 / (4 * 64 + 16 * 64)).
    layer = DecoderLayer(d_model=64, num_heads=4, dff=64)
    layer(np.zeros([1, 2, 64], np.float32), np.zeros([1, 3, 64], np.float32))
    for attention in (layer.self_attention, layer.cross_attention):
        largest = float(np.max(np.abs(to_numpy(attention.query_dense.kernel))))
        assert 0.06 < largest <= np.sqrt(6.0 / (4 * 64 + 16 * 64)), attention.name


# Seq2SeqTransformer ------------------------------------------------------------------------------
VARIANTS = {
    "sinusoidal-post-ln": {},
    "learned-pre-ln-untied": {"position": "learned", "norm_first": True},
    "shared-and-tied": {"share_embeddings": True, "tie_output": True},
    "rope": {"position": "rope"},
    "alibi-pre-ln": {"position": "alibi", "norm_first": True},
    "factorized-no-language-scale": {"position_config": {"table": "factorized"}, "language_scale": False},
    "dropout-0.5": {"dropout": 0.5},  # cached steps run at inference: no unit is dropped
}


def _model(seed=0, **overrides):
    keras.utils.set_random_seed(seed)
    model = Seq2SeqTransformer(**{**MODEL, **overrides})
    model.build_on_dummy()
    return model


@pytest.fixture(scope="module")
def default_model():
    """One model of the default settings for the tests that only translate with it (its traces shared)."""
    return _model()


SOURCES = np.array([[0, 0, 7, 8, 9, 10, 3], [11, 12, 13, 14, 15, 16, 3]], np.int32)
TARGETS = np.array([[2, 20, 21, 22, 23, 3], [2, 24, 25, 26, 3, 0]], np.int32)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_cached_decoder_step_equals_the_full_forward_pass(variant):
    model = _model(**VARIANTS[variant])
    full = to_numpy(model({"source_ids": SOURCES, "target_ids": TARGETS}))
    outputs, mask = model.encode(SOURCES)
    cross = model.cross_cache(outputs)
    cache = ops.zeros(model.cache_shape(2, TARGETS.shape[1]))
    for t in range(TARGETS.shape[1]):
        logits, cache = model.decode_step(TARGETS[:, t:t + 1], cache, t, cross, mask)
        real = TARGETS[:, t] != 0  # a padding slot's logits are never read
        np.testing.assert_allclose(to_numpy(logits)[real, 0], full[real, t], atol=1e-4, err_msg=f"step {t}")
    # A chunk of several tokens (a prefill) too.
    logits, _ = model.decode_step(TARGETS[:, :4], ops.zeros(model.cache_shape(2, 6)), 0, cross, mask)
    np.testing.assert_allclose(to_numpy(logits), full[:, :4], atol=1e-4)


def _cached_layer_inputs(model, chunk, cache_index, cache_length):
    """`cached_layers`' arguments for `chunk` at `cache_index`: empty caches, SOURCES' cross pairs."""
    outputs, mask = model.encode(SOURCES)
    pairs = model.cross_key_values(outputs)
    empty = [np.zeros([len(chunk), cache_length, MODEL["num_heads"], 8], np.float32)
             for _ in range(MODEL["num_layers"])]
    return chunk, empty, empty, cache_index, [k for k, _ in pairs], [v for _, v in pairs], mask


def test_cached_layers_write_every_layers_cache_with_the_given_write():
    """An export's own cache write (`write_cache`) is what every decoder layer writes with, and what it
    returns is the cache: here a write that also fills the slots after the chunk with 7."""
    model = _model()
    index = 2
    args = _cached_layer_inputs(model, TARGETS[:, 2:4], index, cache_length=6)
    calls = []

    def write_and_mark(cache, written, cache_index):
        calls.append((tuple(written.shape), cache_index))
        end = cache_index + written.shape[1]
        marks = ops.ones_like(cache[:, end:]) * 7.0
        return ops.concatenate([cache[:, :cache_index], written, marks], axis=1)

    logits, keys, values = model.cached_layers(*args)
    marked_logits, marked_keys, marked_values = model.cached_layers(*args, write_cache=write_and_mark)
    assert calls == [((2, 2, 2, 8), index)] * 4  # a key and a value cache in each of the 2 layers
    # The slots after the chunk are never attended to, so the logits are the default write's.
    np.testing.assert_array_equal(to_numpy(marked_logits), to_numpy(logits))
    for default, marked in zip(keys + values, marked_keys + marked_values):
        default, marked = to_numpy(default), to_numpy(marked)
        np.testing.assert_array_equal(marked[:, :4], default[:, :4])
        assert np.abs(default[:, 2:4]).min() > 0 and not default[:, 4:].any()
        np.testing.assert_array_equal(marked[:, 4:], 7.0)


@pytest.mark.parametrize("variant", ["sinusoidal-post-ln", "rope", "alibi-pre-ln"])
def test_padded_or_batched_sources_translate_as_alone(variant):
    model = _model(**VARIANTS[variant])
    sentences = [[7, 8, 9, 10, 3], [11, 12, 13, 3], [14, 3]]
    alone = [model.translate(np.array([s]), max_new_tokens=8, beam_size=3).ids[0].tolist() for s in sentences]
    width = 7
    left = np.array([[0] * (width - len(s)) + s for s in sentences])
    right = np.array([s + [0] * (width - len(s)) for s in sentences])
    for batch in (left, right):
        result = model.translate(batch, max_new_tokens=8, beam_size=3)
        assert [ids.tolist() for ids in result.ids] == alone
    greedy_alone = [model.translate(np.array([s]), max_new_tokens=8, beam_size=1).ids[0].tolist()
                    for s in sentences]
    assert [ids.tolist() for ids in model.translate(left, max_new_tokens=8, beam_size=1).ids] == greedy_alone


def test_translate_never_emits_padding_or_start_and_stops_at_the_limit(default_model):
    model = default_model
    result = model.translate(SOURCES, max_new_tokens=5, beam_size=2)
    for ids in result.ids:
        assert len(ids) <= 5
        assert not set(ids.tolist()) & {0, 2, 3}


def test_beam_scores_at_least_greedy_under_the_model():
    model = _model(seed=3)
    sources = np.array([[7, 8, 9, 3], [11, 12, 13, 3], [14, 15, 3, 0]], np.int32)
    greedy = model.translate(sources, max_new_tokens=6, beam_size=1)
    beam = model.translate(sources, max_new_tokens=6, beam_size=4, alpha=0.0)
    assert (beam.log_probs >= greedy.log_probs - 1e-9).all()


def _log_softmax64(logits):
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def test_label_smoothed_loss_against_numpy():
    model = _model(label_smoothing=0.1)
    labels = np.concatenate([TARGETS[:, 1:], np.zeros([2, 1], np.int32)], axis=1)
    features = {"source_ids": SOURCES, "target_ids": TARGETS}
    log_p = _log_softmax64(to_numpy(model(features)))
    nll = -np.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
    smoothed = 0.9 * nll - 0.1 * log_p.mean(-1)
    real = labels != 0
    loss_sum, count = model.token_loss_sums((features, labels), training=False)
    assert float(count) == real.sum()
    np.testing.assert_allclose(float(loss_sum), nll[real].sum(), rtol=1e-5)
    # Dropout is 0, so training=True differs only by the smoothing.
    loss_sum, _ = model.token_loss_sums((features, labels), training=True)
    np.testing.assert_allclose(float(loss_sum), smoothed[real].sum(), rtol=1e-5)


def test_tied_output_uses_the_target_embedding_and_shared_embeddings_are_one_table():
    def tables(model):  # [vocab, d_model] embedding tables and [d_model, vocab] head kernels
        shapes = [tuple(w.shape) for w in model.trainable_weights]
        return shapes.count((40, 16)), shapes.count((16, 40))

    model = _model(share_embeddings=True, tie_output=True)
    assert model.target_embedding is model.encoder.embedding
    assert tables(model) == (1, 0)
    hidden = normal([1, 3, 16])
    table = to_numpy(model.encoder.embedding.token_embedding.embeddings).astype(np.float64)
    expected = hidden.astype(np.float64) @ table.T
    np.testing.assert_allclose(to_numpy(model._logits(hidden)), expected, atol=1e-5)
    assert tables(_model()) == (2, 1)  # the default: separate tables and a softmax of its own
    assert tables(_model(tie_output=True)) == (2, 0)  # tied to the target embedding (Press & Wolf)


def test_language_scale_gives_source_and_target_their_own_scale():
    shared = _model(share_embeddings=True)
    scales = [w for w in shared.trainable_weights if tuple(w.shape) == (2,)]
    assert len(scales) == 1
    np.testing.assert_array_equal(to_numpy(scales[0]), [1.0, 1.0])
    # Separate embeddings: each has the scales, the source reads language 0 and the target 1.
    separate = _model()
    source_scale = separate.encoder.embedding.position_embedding.language_scale
    target_scale = separate.target_embedding.position_embedding.language_scale
    features = {"source_ids": SOURCES, "target_ids": TARGETS}
    unscaled = to_numpy(separate(features))
    source_scale.assign([2.0, 1.0])
    target_scale.assign([1.0, 3.0])
    scaled = to_numpy(separate(features))
    assert np.abs(scaled - unscaled).min() > 0
    source_scale.assign([2.0, 5.0])  # the unread entries change nothing
    target_scale.assign([7.0, 3.0])
    np.testing.assert_array_equal(to_numpy(separate(features)), scaled)
    assert not [w for w in _model(position="rope").trainable_weights if tuple(w.shape) == (2,)]


def test_config_round_trip_and_keras_file(tmp_path):
    model = _model(**VARIANTS["learned-pre-ln-untied"])
    config = model.get_config()
    clone = Seq2SeqTransformer.from_config(config)
    assert clone.get_config() == config
    features = {"source_ids": SOURCES, "target_ids": TARGETS}
    path = str(tmp_path / "model.keras")
    save_model(model, path)
    restored = keras.models.load_model(path)
    assert isinstance(restored, Seq2SeqTransformer)
    np.testing.assert_array_equal(to_numpy(restored(features)), to_numpy(model(features)))
    assert [ids.tolist() for ids in restored.translate(SOURCES, max_new_tokens=5).ids] == \
        [ids.tolist() for ids in model.translate(SOURCES, max_new_tokens=5).ids]


def test_model_errors(default_model):
    for name in ("num_layers", "vocab_size"):
        assert error_message(lambda name=name: Seq2SeqTransformer(**{**MODEL, name: 0})) == (
            f"`{name}` must be >= 1, got {name}=0.")
    assert error_message(lambda: Seq2SeqTransformer(**{**MODEL, "position": "rotary"})) == (
        "`position` must be one of ('sinusoidal', 'learned', 'integer', 'none', 'rope', 'alibi'), got "
        "position='rotary'.")
    for name, value in (("bos_id", True), ("bos_id", -1), ("eos_id", 40), ("eos_id", 3.0)):
        assert error_message(lambda name=name, value=value: Seq2SeqTransformer(**{**MODEL, name: value})) == (
            f"`{name}` must be an int in [0, vocab_size=40), got {name}={value!r}.")
    assert error_message(lambda: Seq2SeqTransformer(**{**MODEL, "label_smoothing": 1.0})) == (
        "`label_smoothing` must be a float in [0, 1), got label_smoothing=1.0.")
    assert "`bos_id` must be an int in [0, vocab_size=40)" in error_message(lambda: Seq2SeqTransformer(
        **{**MODEL, "bos_id": 40}))
    assert "`label_smoothing`" in error_message(
        lambda: Seq2SeqTransformer(**{**MODEL, "label_smoothing": 1.0}))
    model = default_model
    assert "`max_new_tokens` must be an int in [1, max_length - 1 = 23]" in error_message(
        lambda: model.translate(SOURCES, max_new_tokens=24))
    assert "`source_ids` must lie in [0, vocab_size=40)" in error_message(
        lambda: model.translate([[5, 40, 3]]))
    assert "longer than the model's max_length=24" in error_message(
        lambda: model.translate(np.full([1, 30], 5)))


# Beam search against exhaustive search -----------------------------------------------------------
def _markov(seed, vocab):
    table = np.random.default_rng(seed).dirichlet(np.ones(vocab) * 0.7, size=vocab)
    return np.log(table)


def _exhaustive_best(first, next_log_probs, vocab, end_id, max_new_tokens, alpha):
    """The best hypothesis by GNMT's score among every sequence: ended ones, and unended ones at the limit."""
    words = [t for t in range(vocab) if t != end_id]
    best = (-np.inf, None)
    for length in range(1, max_new_tokens + 1):
        for body in itertools.product(words, repeat=length):
            score, history = first[body[0]], [body[0]]
            for token in body[1:]:
                score += next_log_probs(history)[token]
                history.append(token)
            ended = length < max_new_tokens
            if ended:
                ended_score = score + next_log_probs(history)[end_id]
                best = max(best, (ended_score / length_penalty(length + 1, alpha), list(body)))
            if length == max_new_tokens:
                best = max(best, (score / length_penalty(length, alpha), list(body)))
        if length == 1:
            best = max(best, (first[end_id] / length_penalty(1, alpha), []))
    return best


def _history_model(seed, vocab):
    """Next-token log-probabilities that depend on the whole history, not only the last token."""
    table = _markov(seed, vocab)
    return lambda history: table[(7 * sum(history) + 3 * len(history)) % vocab]


@pytest.mark.parametrize("seed,alpha", [(0, 0.0), (1, 0.6), (2, 1.0), (3, 0.6)])
def test_a_beam_as_wide_as_the_search_space_finds_the_exhaustive_optimum(seed, alpha):
    vocab, end_id, limit = 3, 0, 4
    next_log_probs = _history_model(seed, vocab)
    firsts = np.stack([_markov(seed + 10, vocab)[0], _markov(seed + 20, vocab)[1]])

    def step(tokens, histories):  # the state: each hypothesis's tokens, reordered by the search
        histories = [history + [int(t)] for history, t in zip(histories, tokens)]
        return np.stack([next_log_probs(history) for history in histories]), histories

    def reorder(histories, rows):
        return [list(histories[r]) for r in rows]

    result = beam_search(firsts, [[], []], step, reorder, beam_size=(vocab - 1) ** limit,
                         max_new_tokens=limit, end_id=end_id, alpha=alpha)
    for row in range(2):
        score, ids = _exhaustive_best(firsts[row], next_log_probs, vocab, end_id, limit, alpha)
        assert result.ids[row].tolist() == ids
        np.testing.assert_allclose(result.scores[row], score, rtol=1e-12)


def test_greedy_is_beam_one_and_stops_at_the_end_token():
    table = _markov(7, 5)

    def step(tokens, state):
        return table[np.asarray(tokens)], state

    first = table[[1, 2, 3]]
    greedy = greedy_search(first, None, step, max_new_tokens=6, end_id=0)
    beam = beam_search(first, None, step, lambda s, r: s, beam_size=1, max_new_tokens=6, end_id=0)
    assert [g.tolist() for g in greedy.ids] == [b.tolist() for b in beam.ids]
    for row in range(3):  # the argmax chain, independently
        expected, token, logp = [], None, first[row]
        for _ in range(6):
            token = int(np.argmax(logp))
            if token == 0:
                break
            expected.append(token)
            logp = table[token]
        assert greedy.ids[row].tolist() == expected


def test_search_errors():
    first = np.log(np.full([1, 3], 1 / 3))
    assert "`beam_size` must be an int >= 1" in error_message(
        lambda: beam_search(first, None, None, None, beam_size=0, max_new_tokens=3, end_id=0))
    assert "`alpha` (the length penalty) must be >= 0" in error_message(
        lambda: beam_search(first, None, None, None, beam_size=2, max_new_tokens=3, end_id=0, alpha=-1))
    assert "`max_new_tokens` must be an int >= 1" in error_message(
        lambda: greedy_search(first, None, None, max_new_tokens=0, end_id=0))
    assert "`end_id` must lie in [0, vocab=3)" in error_message(
        lambda: greedy_search(first, None, None, max_new_tokens=2, end_id=3))


def test_the_default_position_is_rope_in_the_self_attention():
    keras.utils.set_random_seed(0)
    model = Seq2SeqTransformer(**{k: v for k, v in MODEL.items() if k != "position"})
    model.build_on_dummy()
    assert model.get_config()["position"] == "rope"
    # No position table and no language scale: only the token embeddings before the first layer.
    assert not [w for w in model.trainable_weights if "position" in w.name or tuple(w.shape) == (2,)]
    assert [layer.get_config()["position"] for layer in model.decoder_layers] == ["rope", "rope"]
    assert model.encoder.get_config()["position"] == "rope"


def test_translate_arguments_at_their_bounds(default_model):
    model = default_model
    source = np.array([[7, 8, 9, 3]], np.int32)
    limit = MODEL["max_length"] - 1
    assert len(model.translate(source, max_new_tokens=limit, beam_size=1).ids[0]) <= limit
    assert len(model.translate(source, max_new_tokens=np.int64(1), beam_size=1).ids[0]) <= 1
    for bad in (0, limit + 1, True, 2.0):
        assert error_message(lambda bad=bad: model.translate(source, max_new_tokens=bad)) == (
            f"`max_new_tokens` must be an int in [1, max_length - 1 = {limit}], got max_new_tokens={bad!r}.")
    # One sentence as a vector is a batch of one.
    assert model.translate(source[0], beam_size=1).ids[0].tolist() == \
        model.translate(source, beam_size=1).ids[0].tolist()
    for bad, shape, dtype in ((np.zeros([1, 0], np.int32), (1, 0), "int32"),
                              (np.ones([1, 2, 3], np.int32), (1, 2, 3), "int32"),
                              (np.ones([1, 3], np.float32), (1, 3), "float32")):
        assert error_message(lambda bad=bad: model.translate(bad)) == (
            f"`source_ids` must be int [batch, length] with at least one token, got shape {shape} and "
            f"dtype {dtype}.")
    for bad in (-1, MODEL["vocab_size"]):
        assert error_message(lambda bad=bad: model.translate([[5, bad, 3]])) == (
            "`source_ids` must lie in [0, vocab_size=40).")
    model.translate([[5, MODEL["vocab_size"] - 1, 3]], beam_size=1)


def test_a_source_padded_wider_than_max_length_is_narrowed_and_a_longer_one_refused(default_model):
    model = default_model
    width = MODEL["max_length"]
    sentences = [[7, 8, 9, 3], list(range(5, 5 + width - 1)) + [3]]  # the second as long as it may be
    wide = np.zeros([2, width + 6], np.int32)
    wide[0, 3:7] = sentences[0]  # left, middle and right padding columns
    wide[1, :width] = sentences[1]
    alone = [model.translate(np.array([s]), max_new_tokens=4, beam_size=2).ids[0].tolist() for s in sentences]
    assert [ids.tolist() for ids in model.translate(wide, max_new_tokens=4, beam_size=2).ids] == alone
    too_long = np.array([list(range(5, 5 + width)) + [3]], np.int32)
    assert error_message(lambda: model.translate(too_long)) == (
        f"A source of {width + 1} tokens is longer than the model's max_length={width}.")
    # A table that extends past max_length takes it as it is.
    extending = _model(position_config={"overflow": "extend"})
    assert len(extending.translate(too_long, max_new_tokens=3, beam_size=1).ids[0]) <= 3


def test_without_padding_columns_keeps_each_rows_tokens_in_order():
    from keras_posenc.seq2seq import _without_padding_columns

    source = np.array([[0, 5, 0, 6, 0], [0, 7, 8, 9, 0]], np.int32)
    narrowed = _without_padding_columns(source, 0)
    assert narrowed.dtype == np.int32
    np.testing.assert_array_equal(narrowed, [[5, 6, 0], [7, 8, 9]])
    np.testing.assert_array_equal(_without_padding_columns(np.array([[4, 5, 4], [6, 4, 4]]), 4), [[5], [6]])
    full = np.array([[5, 0], [0, 6]])
    assert _without_padding_columns(full, 0) is full  # no column is all padding


def test_translate_log_probs_are_the_teacher_forced_log_probabilities_of_its_tokens():
    model = _model(seed=2)
    sources = np.array([[7, 8, 9, 10, 3], [11, 12, 3, 0, 0]], np.int32)
    limit = 6
    for beam_size, alpha in ((1, 0.0), (3, 0.6)):
        result = model.translate(sources, max_new_tokens=limit, beam_size=beam_size, alpha=alpha)
        for row, ids in enumerate(result.ids):
            ids = ids.tolist()
            chosen = ids + [model.eos_id] if len(ids) < limit else ids
            target = np.array([[model.bos_id] + chosen[:-1]], np.int32)
            logits = to_numpy(model({"source_ids": sources[row:row + 1], "target_ids": target}))[0]
            expected = _log_softmax64(logits)[np.arange(len(chosen)), chosen].sum()
            np.testing.assert_allclose(result.log_probs[row], expected, atol=1e-4, err_msg=(beam_size, row))
            # The score is the log-probability over the given alpha's length penalty (greedy: none).
            penalty = length_penalty(len(chosen), alpha) if beam_size > 1 else 1.0
            np.testing.assert_allclose(result.scores[row], result.log_probs[row] / penalty, rtol=1e-12)


def test_the_cache_holds_a_key_and_a_value_per_layer_and_given_embeddings_are_used():
    model = _model(seed=7)
    assert model.cache_shape(3, 6) == (3, MODEL["num_layers"], 2, 6, MODEL["num_heads"], 8)
    outputs, mask = model.encode(SOURCES)
    cross = model.cross_cache(outputs)
    _, cache = model.decode_step(TARGETS[:, :2], ops.zeros(model.cache_shape(2, 6)), 0, cross, mask)
    assert tuple(cache.shape) == model.cache_shape(2, 6)
    # An export computes the target embedding in its own formulation and passes it in: it is what the
    # layers read (here twice the layer's own output).
    args = _cached_layer_inputs(model, TARGETS[:, :2], 0, cache_length=6)
    own = model.target_embedding(TARGETS[:, :2], position_ids=model._target_positions(TARGETS[:, :2]),
                                 language_ids=model._languages(TARGETS[:, :2], TARGET_LANGUAGE))
    default, _, _ = model.cached_layers(*args)
    same, _, _ = model.cached_layers(*args, embeddings=own)
    doubled, _, _ = model.cached_layers(*args, embeddings=own * 2.0)
    np.testing.assert_allclose(to_numpy(same), to_numpy(default), atol=1e-5)
    assert np.abs(to_numpy(doubled) - to_numpy(default)).max() > 1e-3


def test_translate_runs_at_inference_and_searches_four_beams_by_default(monkeypatch):
    import keras_posenc.seq2seq as seq2seq_module

    dropped = _model(seed=5, dropout=0.5)
    twin = Seq2SeqTransformer.from_config({**dropped.get_config(), "dropout": 0.0})
    twin.build_on_dummy()
    twin.set_weights(dropped.get_weights())
    sources = np.array([[7, 8, 9, 10, 3], [11, 12, 3, 0, 0]], np.int32)
    a, b = (m.translate(sources, max_new_tokens=5, beam_size=2) for m in (dropped, twin))
    # So do encode and decode called as they are (training=False by default).
    encoded = [m.encode(SOURCES) for m in (dropped, twin)]
    np.testing.assert_allclose(to_numpy(encoded[0][0]), to_numpy(encoded[1][0]), atol=1e-5)
    np.testing.assert_allclose(to_numpy(dropped.decode(TARGETS, *encoded[0])),
                               to_numpy(twin.decode(TARGETS, *encoded[1])), atol=1e-5)
    assert [ids.tolist() for ids in a.ids] == [ids.tolist() for ids in b.ids]
    np.testing.assert_allclose(a.log_probs, b.log_probs, atol=1e-5)
    widths = []

    def spy(*args, **kwargs):
        widths.append(kwargs["beam_size"])
        return beam_search(*args, **kwargs)

    monkeypatch.setattr(seq2seq_module, "beam_search", spy)
    twin.translate(sources, max_new_tokens=2)
    assert widths == [4]


def test_the_training_loss_drops_units_and_the_default_is_the_evaluation_loss():
    model = _model(seed=6, dropout=0.5, label_smoothing=0.0)
    labels = np.concatenate([TARGETS[:, 1:], np.zeros([2, 1], np.int32)], axis=1)
    data = ({"source_ids": SOURCES, "target_ids": TARGETS}, labels)
    evaluation = float(model.token_loss_sums(data, training=False)[0])
    assert float(model.token_loss_sums(data)[0]) == evaluation
    keras.utils.set_random_seed(1)
    trained = float(model.token_loss_sums(data, training=True)[0])
    assert abs(trained - evaluation) > 1e-3  # dropout acts, and without smoothing nothing else differs


def test_the_defaults_and_a_padding_id_at_the_end_of_the_vocabulary():
    model = _model()
    epsilons = {layer.epsilon for layer in model.decoder_layers + model.encoder.encoder_layers}
    assert epsilons == {1e-6} and model.get_config()["epsilon"] == 1e-6
    # The dummy batch that builds the weights holds an id of the vocabulary, also when pad_id is its last.
    last = _model(pad_id=MODEL["vocab_size"] - 1)
    assert len(last.trainable_weights) == len(model.trainable_weights)
    assert last.translate([[7, 8, 3]], max_new_tokens=3, beam_size=1).ids[0].size <= 3


def test_sublayer_names_the_pre_ln_final_norm_and_what_fit_reports():
    model = _model(norm_first=True, pad_id=1, bos_id=0, eos_id=0)  # ids at the vocabulary's start
    names = [model.encoder.name, model.target_embedding.name, *(layer.name for layer in model.decoder_layers),
             model.decoder_norm.name]
    assert names == ["encoder", "target_embedding", "decoder_layer_0", "decoder_layer_1", "decoder_norm"]
    assert model.decoder_norm.epsilon == 1e-6
    assert model.encoder.get_config()["pad_id"] == model.target_embedding.pad_id == 1
    assert model.decoder_layers[0].position_config == model.decoder_layers[1].position_config
    assert (model.eval_loss.name, model.distribute_reduction_method) == ("loss", "sum")
    features = {"source_ids": SOURCES + 1, "target_ids": TARGETS + 1}
    before = to_numpy(model(features))
    gamma = model.decoder_norm.gamma
    gamma.assign(to_numpy(gamma) * 2.0)  # the pre-LN decoder's final norm is on the logits' path
    assert np.abs(to_numpy(model(features)) - before).max() > 1e-3
