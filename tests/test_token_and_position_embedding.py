"""TokenAndPositionEmbedding: token lookup, sqrt scale, every position kind, mask, per-token invariances."""

import math

import numpy as np
import pytest
import tensorflow as tf
from layer_test_helper import requires_tf, run_layer_test

from keras_posenc import position_ids
from keras_posenc.backend import is_keras3, keras
from keras_posenc.layers import TokenAndPositionEmbedding
from keras_posenc.layers.token_and_position_embedding import POSITION_LAYERS

# Written against TensorFlow tensors and graphs; the JAX backend runs tests/test_keras3_backends.py.
pytestmark = requires_tf

D_MODEL = 8


def tokens_tensor():
    """A right- and a left-padded row (a tensor made per test: no TF op at import)."""
    return tf.constant([[5, 6, 7, 0, 0], [0, 0, 3, 4, 9]])


def expected_pe(ids, depth=D_MODEL):
    ids = np.asarray(ids, np.float64)[..., None]
    columns = np.arange(depth)
    angles = ids / 10000.0 ** (2.0 * (columns // 2) / depth)
    return np.where(columns % 2 == 0, np.sin(angles), np.cos(angles))


def layer(**kwargs):
    kwargs = {"vocab_size": 20, "d_model": D_MODEL, "max_length": 16, "dropout": 0.0, **kwargs}
    built = TokenAndPositionEmbedding(**kwargs)
    built(tokens_tensor(), language_ids=tf.zeros([2], tf.int32) if "num_languages" in kwargs else None)
    return built


@pytest.mark.parametrize("position", sorted(POSITION_LAYERS))
def test_layer_contract_each_position_kind(position, tmp_path):
    out = run_layer_test(TokenAndPositionEmbedding,
                         {"vocab_size": 20, "d_model": D_MODEL, "max_length": 16, "position": position},
                         tokens_tensor(), expected_output_shape=(2, 5, D_MODEL), tmp_dir=tmp_path)
    assert np.isfinite(out.numpy()).all()


def test_layer_contract_with_languages_and_segments(tmp_path):
    run_layer_test(TokenAndPositionEmbedding,
                   {"vocab_size": 20, "d_model": D_MODEL, "max_length": 16, "num_languages": 2},
                   {"inputs": tokens_tensor(),
                    "language_ids": tf.constant([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]]),
                    "segment_ids": tf.constant([[1, 1, 2, 2, 2], [1, 1, 1, 2, 2]])},
                   expected_num_trainable_weights=2, tmp_dir=tmp_path)


def test_output_is_scaled_token_embedding_plus_sinusoid_and_emits_the_mask():
    emb = layer()
    table = emb.token_embedding.embeddings.numpy()
    out = emb(tokens_tensor()).numpy()
    tokens = tokens_tensor().numpy()
    ids = np.array([[0, 1, 2, 0, 0], [0, 0, 0, 1, 2]])
    real = tokens != 0
    expected = table[tokens] * math.sqrt(D_MODEL) + expected_pe(ids) * real[..., None]
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_array_equal(emb.compute_mask(tokens_tensor()).numpy(), real)
    assert emb(tokens_tensor())._keras_mask.numpy().tolist() == real.tolist()
    unscaled = layer(scale_embeddings=False)
    unscaled.set_weights(emb.get_weights())
    np.testing.assert_allclose(unscaled(tokens_tensor()).numpy(),
                               table[tokens] + expected_pe(ids) * real[..., None], atol=1e-5)


SIGNATURE = [tf.TensorSpec([None, None], tf.int32)]


def three_modes(fn, signature):
    return {"eager": fn, "graph": tf.function(fn, input_signature=signature),
            "xla": tf.function(fn, input_signature=signature, jit_compile=True)}


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_left_padding_packing_and_decoding_per_token(position, mode):
    emb = layer(position=position)
    ids_spec = tf.TensorSpec([None, None], tf.int32)
    plain = three_modes(lambda t: emb(t), SIGNATURE)[mode]
    packed_call = three_modes(lambda t, s: emb(t, segment_ids=s), [ids_spec, ids_spec])[mode]
    with_ids = three_modes(lambda t, p: emb(t, position_ids=p), [ids_spec, ids_spec])[mode]

    # XLA on Keras 3 may contract the scale and the add into one FMA for some shapes only (1 ulp).
    assert_same = (np.testing.assert_array_equal if mode != "xla" or not is_keras3() else
                   lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6))
    row = tf.constant([[3, 4, 9, 11]])
    unpadded = plain(row).numpy()
    left = plain(tf.constant([[0, 0, 3, 4, 9, 11]])).numpy()
    assert_same(left[:, 2:], unpadded)

    other = tf.constant([[7, 8, 2]])
    packed = packed_call(tf.constant([[3, 4, 9, 11, 7, 8, 2, 0]]),
                         tf.constant([[1, 1, 1, 1, 2, 2, 2, 2]])).numpy()
    assert_same(packed[:, :4], unpadded)
    assert_same(packed[:, 4:7], plain(other).numpy())

    batch = tf.constant([[0, 0, 3, 4, 9, 11], [5, 6, 7, 8, 9, 10]])
    full = plain(batch).numpy()
    decoded = np.zeros([2], np.int32)
    for t in range(6):
        step_tokens = batch[:, t:t + 1]
        step_ids = position_ids(step_tokens != 0, offset=tf.constant(decoded))
        step = with_ids(step_tokens, step_ids).numpy()
        assert_same(step[:, 0], full[:, t])
        decoded += (step_tokens.numpy()[:, 0] != 0)


def test_mask_reaches_attention_and_left_padding_attends_like_right_padding():
    tokens_in = keras.Input(shape=(None,), dtype=tf.int32)
    embedding = TokenAndPositionEmbedding(20, D_MODEL, 16, dropout=0.0)
    attention = keras.layers.MultiHeadAttention(2, 4)
    embedded = embedding(tokens_in)
    model = keras.Model(tokens_in, attention(embedded, embedded))
    unpadded = model(tf.constant([[5, 6, 7]])).numpy()
    right = model(tf.constant([[5, 6, 7, 0, 0]])).numpy()
    left = model(tf.constant([[0, 0, 5, 6, 7]])).numpy()
    np.testing.assert_allclose(right[0, :3], unpadded[0], atol=1e-5)
    np.testing.assert_allclose(left[0, 2:], unpadded[0], atol=1e-5)
    # Attention that ignored the mask would see the pads (so the checks above can fail).
    x = tf.identity(embedding(tf.constant([[5, 6, 7, 0, 0]])))  # the same values, no Keras mask
    leaky = attention(x, x, attention_mask=tf.ones([1, 5, 5], tf.bool)).numpy()
    assert np.abs(leaky[0, :3] - unpadded[0]).max() > 1e-3


def test_language_scale_with_batch_and_token_ids():
    emb = layer(num_languages=2)
    plain = layer()
    plain.set_weights(emb.get_weights()[:1])
    for language_ids in ([0, 1], [[0, 0, 1, 1, 1], [1, 0, 1, 0, 1]]):
        np.testing.assert_array_equal(emb(tokens_tensor(), language_ids=tf.constant(language_ids)).numpy(),
                                      plain(tokens_tensor()).numpy())
    emb.position_embedding.language_scale.assign([2.0, 0.0])
    out = emb(tokens_tensor(), language_ids=tf.constant([[0, 0, 1, 1, 1], [1, 0, 1, 0, 1]])).numpy()
    no_pe = emb.token_embedding(tokens_tensor()).numpy() * math.sqrt(D_MODEL)
    np.testing.assert_allclose(out[0, :2] - no_pe[0, :2], 2 * expected_pe([0, 1]), atol=1e-5)
    np.testing.assert_allclose(out[0, 2:], no_pe[0, 2:], atol=1e-6)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"position": "rotary"}, ValueError, "`position` must be one of .*, got position='rotary'"),
    ({"pad_id": 20}, ValueError, r"`pad_id` must be an int in \[0, vocab_size=20\), got pad_id=20"),
    ({"max_length": 0}, ValueError, "`max_length` must be >= 1, got max_length=0"),
    ({"d_model": 0}, ValueError, "`d_model` must be >= 1, got d_model=0"),
    ({"layout": "zigzag"}, ValueError, "got layout='zigzag'"),
    ({"overflow": "wrap"}, ValueError, "got overflow='wrap'"),
])
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        TokenAndPositionEmbedding(**{"vocab_size": 20, "d_model": D_MODEL, "max_length": 16, **kwargs})


def test_bad_call_arguments():
    emb = layer(max_length=4)
    with pytest.raises(TypeError, match="`token_ids` must be integers, got dtype float32"):
        emb(tf.zeros([1, 3]))
    with pytest.raises(ValueError, match=r"`token_ids` must have rank 2 \[batch, length\]"):
        emb(tf.ones([3], tf.int32))
    with pytest.raises(ValueError, match="Sequence length 5 exceeds max_length=4"):
        emb(tf.constant([[1, 2, 3, 4, 5]]))
    graph = tf.function(lambda t: emb(t), input_signature=SIGNATURE)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Sequence length 5 exceeds max_length=4"):
        graph(tf.constant([[0, 1, 2, 3, 4, 5]]))
    np.testing.assert_array_equal(graph(tf.constant([[0, 0, 1, 2, 3, 4]])).numpy()[0, 2:],
                                  emb(tf.constant([[1, 2, 3, 4]])).numpy()[0])


def test_zero_length_and_all_padding():
    emb = layer()
    assert emb(tf.zeros([2, 0], tf.int32)).shape == (2, 0, D_MODEL)
    out = emb(tf.zeros([1, 4], tf.int32)).numpy()
    table = emb.token_embedding.embeddings.numpy()
    np.testing.assert_allclose(out[0], np.repeat(table[:1] * math.sqrt(D_MODEL), 4, axis=0), atol=1e-6)
