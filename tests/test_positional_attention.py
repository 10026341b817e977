"""PositionalAttention: RoPE and ALiBi inside multi-head attention, against float64 numpy."""

import numpy as np
import pytest
from layer_test_helper import run_layer_test, to_numpy

from keras_posenc.backend import keras, ops
from keras_posenc.layers import PositionalAttention

KEY_BIAS = ("key/bias",)  # the softmax cancels a bias added to every key of a query
X = np.random.default_rng(1).normal(size=[2, 5, 8]).astype(np.float32)
IDS = np.array([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]], np.int32)  # row 1: two padding tokens, then 0, 1, 2
KEYS = np.array([[[True] * 5], [[False, False, True, True, True]]])


def reference(layer, x, ids, allowed):
    """Outputs of `layer` from its weights in float64 numpy (RoPE half layout, ALiBi, no dropout)."""
    def project(dense, inputs):
        kernel, bias = (np.asarray(to_numpy(v), np.float64) for v in (dense.kernel, dense.bias))
        return np.einsum("btd,dhk->bthk", inputs, kernel) + bias

    x = np.asarray(x, np.float64)
    q, k, v = (project(dense, x) for dense in (layer.query_dense, layer.key_dense, layer.value_dense))
    heads, head_dim = q.shape[2], q.shape[3]
    if layer.position == "rope":
        half = head_dim // 2
        angles = ids[..., None] * 10000.0 ** (-np.arange(half) * 2.0 / head_dim)
        cos, sin = np.cos(angles)[:, :, None], np.sin(angles)[:, :, None]

        def rotate(t):
            a, b = t[..., :half], t[..., half:]
            return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

        q, k = rotate(q), rotate(k)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
    if layer.position == "alibi":
        slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
        logits -= slopes[None, :, None, None] * np.abs(ids[:, None, :, None] - ids[:, None, None, :])
    logits = np.where(allowed[:, None], logits, -1e9)
    scores = np.exp(logits - logits.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    merged = np.einsum("bhqk,bkhd->bqhd", scores, v)
    kernel, bias = (np.asarray(to_numpy(w), np.float64) for w in (layer.output_dense.kernel,
                                                                   layer.output_dense.bias))
    return np.einsum("bqhd,hdo->bqo", merged, kernel) + bias


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_outputs_equal_the_float64_formula(position):
    layer = PositionalAttention(2, 4, position=position)
    got = layer(X, X, attention_mask=KEYS, position_ids=IDS)
    allowed = np.broadcast_to(KEYS, [2, 5, 5])
    np.testing.assert_allclose(to_numpy(got), reference(layer, X, IDS, allowed), atol=2e-5)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_left_padding_changes_nothing_at_real_tokens(position):
    layer = PositionalAttention(2, 4, position=position)
    padded = to_numpy(layer(X, attention_mask=KEYS, position_ids=IDS, use_causal_mask=True))
    alone = to_numpy(layer(X[1:, 2:], position_ids=IDS[1:, 2:], use_causal_mask=True))
    np.testing.assert_allclose(padded[1, 2:], alone[0], atol=1e-5)


def test_without_a_position_it_is_multi_head_attention():
    layer = PositionalAttention(2, 4)
    plain = keras.layers.MultiHeadAttention(2, 4)
    expected = plain(X, X, attention_mask=KEYS)
    layer(X, X)
    layer.set_weights(plain.get_weights())
    np.testing.assert_array_equal(to_numpy(layer(X, X, attention_mask=KEYS)), to_numpy(expected))
    assert (layer.num_heads, layer.head_dim, layer.rotary, layer.slopes) == (2, 4, None, None)


def test_cached_attention_equals_the_full_causal_call():
    layer = PositionalAttention(2, 4, position="rope")
    ids = np.arange(5, dtype=np.int32)[None]
    full = to_numpy(layer(X[:1], position_ids=ids, use_causal_mask=True))
    empty = ops.zeros([1, 5, 2, 4])
    first, keys, values, _ = layer.cached_attention(X[:1, :3], empty, empty, 0, ids[:, :3])
    rest, _, _, _ = layer.cached_attention(X[:1, 3:], keys, values, 3, ids[:, 3:])
    np.testing.assert_allclose(np.concatenate([to_numpy(first), to_numpy(rest)], axis=1), full, atol=1e-5)


def test_cached_attention_writes_its_cache_with_the_given_write_cache():
    """A `write_cache` (an export's runtime op) gets the chunk in the cache's dtype and its first slot;
    writing its slots as the one-hot product does gives the same outputs and caches, bit for bit."""
    layer = PositionalAttention(2, 4, position="alibi")
    ids = np.arange(5, dtype=np.int32)[None]
    layer(X[:1], position_ids=ids, use_causal_mask=True)  # built
    cache = ops.convert_to_tensor(np.random.default_rng(1).normal(size=[1, 6, 2, 4]).astype(np.float32))
    calls = []

    def write(cache, chunk, index):
        calls.append((tuple(chunk.shape), str(chunk.dtype), int(index)))
        written = np.array(to_numpy(cache))
        written[:, int(index):int(index) + chunk.shape[1]] = to_numpy(chunk)
        return ops.convert_to_tensor(written)

    default = layer.cached_attention(X[:1, 2:5], cache, cache, 2, ids[:, 2:5])
    given = layer.cached_attention(X[:1, 2:5], cache, cache, 2, ids[:, 2:5], write_cache=write)
    assert [call[0] for call in calls] == [(1, 3, 2, 4)] * 2 and {call[2] for call in calls} == {2}
    assert {call[1] for call in calls} <= {"float32", "<dtype: 'float32'>"}
    for expected, got in zip(default, given):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(expected))
    kept = to_numpy(given[1])  # the other slots as they were
    np.testing.assert_array_equal(kept[:, [0, 1, 5]], to_numpy(cache)[:, [0, 1, 5]])


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_layer_contract(position, tmp_path):
    config = {"max_length": 8} if position == "rope" else {}
    run_layer_test(PositionalAttention, {"num_heads": 2, "key_dim": 4, "position": position,
                                         "position_config": config},
                   {"inputs": X, "position_ids": IDS}, expected_output_shape=(2, 5, 8),
                   expected_num_trainable_weights=8, weights_without_gradient=KEY_BIAS, tmp_dir=tmp_path)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="position"):
        PositionalAttention(2, 4, position="learned")
    with pytest.raises(ValueError, match=r"unknown keys \['max_length'\]"):
        PositionalAttention(2, 4, position="alibi", position_config={"max_length": 8})
