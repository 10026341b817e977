"""EncoderLayer and Encoder: masks, causality, packing, LN placement, Keras contract."""

import numpy as np
import pytest
import tensorflow as tf
from layer_test_helper import error_message, randomized, run_layer_test

from keras_posenc import Encoder, EncoderLayer
from keras_posenc.backend import keras
from keras_posenc.layers.encoder_layer import merge_attention_masks
from keras_posenc.seq2seq import Seq2SeqTransformer

SMALL = {"d_model": 16, "num_heads": 2, "dff": 32}
SMALL_ENCODER = {"num_layers": 2, "vocab_size": 30, "max_length": 12, **SMALL}


def random_inputs(shape, seed=0):
    return tf.constant(np.random.RandomState(seed).normal(size=shape).astype("float32"))


# The shared Keras-contract test ------------------------------------------------------------------

# Softmax is invariant to a per-query constant, and q . b_k is one: the key bias gets no gradient.
KEY_BIAS = ("key/bias",)


def test_encoder_layer_contract_pre_ln(tmp_path):
    mask = tf.constant([[True] * 5, [False, True, True, True, False]])
    run_layer_test(EncoderLayer, {**SMALL, "norm_first": True},
                   {"inputs": random_inputs([2, 5, 16]), "mask": mask},
                   expected_output_shape=(2, 5, 16), expected_num_trainable_weights=16,
                   weights_without_gradient=KEY_BIAS, tmp_dir=tmp_path)


def test_encoder_layer_contract_post_ln(tmp_path):
    mask = tf.constant([[True] * 5, [True, True, True, False, False]])
    run_layer_test(EncoderLayer, {**SMALL, "activation": "gelu"},
                   {"inputs": random_inputs([2, 5, 16]), "mask": mask,
                    "attention_mask": tf.ones([2, 5, 5], tf.bool)},
                   expected_output_shape=(2, 5, 16), weights_without_gradient=KEY_BIAS, tmp_dir=tmp_path)


def test_encoder_contract_sinusoidal_post_ln(tmp_path):
    ids = tf.constant([[3, 4, 5, 0, 0], [0, 0, 7, 8, 9]])
    run_layer_test(Encoder, {**SMALL_ENCODER, "num_layers": 1}, ids, expected_output_shape=(2, 5, 16),
                   weights_without_gradient=KEY_BIAS, tmp_dir=tmp_path)


def test_encoder_contract_learned_pre_ln_packed(tmp_path):
    inputs = {"inputs": tf.constant([[3, 4, 5, 6, 0], [7, 8, 9, 0, 0]]),
              "segment_ids": tf.constant([[1, 1, 2, 2, 2], [1, 2, 2, 0, 0]])}
    run_layer_test(Encoder, {**SMALL_ENCODER, "num_layers": 1, "norm_first": True, "position": "learned"},
                   inputs, expected_output_shape=(2, 5, 16), weights_without_gradient=KEY_BIAS,
                   tmp_dir=tmp_path)


@pytest.mark.parametrize("norm_first", [False, True])
def test_one_fit_step_trains_every_weight(norm_first):
    keras.utils.set_random_seed(1)
    ids = tf.constant([[3, 4, 5, 0], [6, 7, 8, 9]])
    encoder = Encoder(**{**SMALL_ENCODER, "num_layers": 1}, norm_first=norm_first, dropout=0.0)
    target = random_inputs([2, 4, 16], seed=3)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((encoder(ids, training=True) - target) ** 2)
    grads = dict(zip([w.name for w in encoder.trainable_weights],
                     tape.gradient(loss, encoder.trainable_weights)))
    for name, grad in grads.items():
        size = float(tf.reduce_max(tf.abs(tf.convert_to_tensor(grad))))
        if "key/bias" in name:
            # Softmax is invariant to the key bias: it adds q.b_k to every score of a query row.
            assert size < 1e-6, (name, size)
        else:
            assert size > 1e-6, (name, size)


# Masks ------------------------------------------------------------------------------------------

def test_merge_attention_masks_matches_numpy():
    mask = np.array([[1, 1, 1, 0], [0, 1, 1, 1]], bool)
    explicit = np.random.RandomState(0).rand(2, 4, 4) > 0.3
    segments = np.array([[1, 1, 2, 2], [1, 1, 1, 2]])
    got = merge_attention_masks(4, mask=mask, attention_mask=explicit, use_causal_mask=True,
                                segment_ids=segments).numpy()
    causal = np.tril(np.ones([4, 4], bool))
    # Padding masks keys only: a real query never sees padding; padding queries are ignored.
    expected = (mask[:, None, :] & explicit & causal
                & (segments[:, :, None] == segments[:, None, :]))
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(merge_attention_masks(4, mask=mask).numpy(), mask[:, None, :])
    assert merge_attention_masks(4) is None
    eye = merge_attention_masks(3, attention_mask=np.eye(3)).numpy()
    np.testing.assert_array_equal(eye, np.eye(3)[None] > 0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_layer_ignores_values_at_padding(norm_first, padding):
    layer = EncoderLayer(**SMALL, norm_first=norm_first)
    real = [True, True, True, False, False]
    mask = tf.constant([real if padding == "right" else real[::-1]])
    x = random_inputs([1, 5, 16])
    noise = random_inputs([1, 5, 16], seed=1) * 100.0
    x_changed = tf.where(mask[:, :, None], x, noise)
    y, y_changed = layer(x, mask=mask), layer(x_changed, mask=mask)
    np.testing.assert_allclose(tf.boolean_mask(y_changed, mask), tf.boolean_mask(y, mask), atol=1e-6)
    assert np.all(np.isfinite(y_changed.numpy()))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_padding_left_right_or_none_gives_same_real_outputs(norm_first):
    encoder = Encoder(**SMALL_ENCODER, norm_first=norm_first)
    alone = encoder(tf.constant([[5, 6, 7]]))[0]
    right = encoder(tf.constant([[5, 6, 7, 0, 0]]))[0, :3]
    left = encoder(tf.constant([[0, 0, 5, 6, 7]]))[0, 2:]
    np.testing.assert_allclose(right, alone, atol=1e-5)
    np.testing.assert_allclose(left, alone, atol=1e-5)


def test_padding_queries_and_all_padding_rows_are_finite():
    encoder = Encoder(**SMALL_ENCODER)
    y = encoder(tf.constant([[0, 0, 0, 0], [4, 0, 0, 0]]))
    assert np.all(np.isfinite(y.numpy()))
    layer = EncoderLayer(**SMALL, dtype="mixed_float16")
    y16 = layer(random_inputs([2, 4, 16]), mask=tf.constant([[False] * 4, [True, False, False, False]]))
    assert y16.dtype == tf.float16 and np.all(np.isfinite(y16.numpy()))


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_mask_blocks_the_future(norm_first):
    layer = EncoderLayer(**SMALL, norm_first=norm_first)
    x = random_inputs([2, 6, 16])
    x_changed = tf.concat([x[:, :4], random_inputs([2, 2, 16], seed=5)], axis=1)
    y, y_changed = (layer(v, use_causal_mask=True) for v in (x, x_changed))
    np.testing.assert_allclose(y_changed[:, :4], y[:, :4], atol=1e-6)
    assert np.max(np.abs(y_changed[:, 4:] - y[:, 4:])) > 1e-3
    # Without the causal mask every position sees the change.
    assert np.min(np.max(np.abs(layer(x_changed) - layer(x)), axis=-1)) > 1e-4

    encoder = Encoder(**SMALL_ENCODER, norm_first=norm_first)
    ids = tf.constant([[3, 4, 5, 6, 7, 8]])
    ids_changed = tf.constant([[3, 4, 5, 6, 9, 10]])
    out, out_changed = (encoder(v, use_causal_mask=True) for v in (ids, ids_changed))
    np.testing.assert_allclose(out_changed[:, :4], out[:, :4], atol=1e-6)
    assert np.max(np.abs(out_changed[:, 4:] - out[:, 4:])) > 1e-3


def test_explicit_attention_mask_blocks_a_key():
    layer = EncoderLayer(**SMALL)
    x = random_inputs([1, 4, 16])
    x_changed = tf.concat([x[:, :3], random_inputs([1, 1, 16], seed=9)], axis=1)
    allowed = tf.constant([[[True, True, True, False]] * 4])  # nobody attends to key 3
    y, y_changed = (layer(v, attention_mask=allowed) for v in (x, x_changed))
    np.testing.assert_allclose(y_changed[:, :3], y[:, :3], atol=1e-6)


def test_packed_segments_compute_what_each_sequence_computes_alone():
    encoder = Encoder(**SMALL_ENCODER)
    packed = encoder(tf.constant([[5, 6, 7, 8, 9, 0]]), segment_ids=tf.constant([[1, 1, 1, 2, 2, 0]]))
    first = encoder(tf.constant([[5, 6, 7]]))
    second = encoder(tf.constant([[8, 9]]))
    np.testing.assert_allclose(packed[0, :3], first[0], atol=1e-5)
    np.testing.assert_allclose(packed[0, 3:5], second[0], atol=1e-5)


def test_output_mask_is_the_padding_mask():
    ids = tf.constant([[3, 4, 0], [0, 5, 6]])
    expected = [[True, True, False], [False, True, True]]
    encoder = Encoder(**SMALL_ENCODER, pad_id=0)
    assert encoder(ids)._keras_mask.numpy().tolist() == expected
    inputs = keras.Input((3,), dtype="int32")
    hidden = Encoder(**SMALL_ENCODER)(inputs)
    outputs = EncoderLayer(**SMALL)(hidden)
    assert keras.Model(inputs, outputs)(ids)._keras_mask.numpy().tolist() == expected


# Post-LN versus pre-LN --------------------------------------------------------------------------

def _silence_sublayers(layer):
    for dense in (layer.ffn_output, layer.attention.output_dense):
        dense.set_weights([np.zeros_like(w) for w in dense.get_weights()])


def test_pre_ln_is_identity_when_sublayers_output_zero():
    layer = EncoderLayer(**SMALL, norm_first=True)
    x = random_inputs([2, 5, 16]) * 3.0 + 7.0
    layer(x)
    _silence_sublayers(layer)
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy())


def test_post_ln_normalises_when_sublayers_output_zero():
    epsilon = 1e-6
    layer = EncoderLayer(**SMALL, epsilon=epsilon)
    x = random_inputs([2, 5, 16]) * 3.0 + 7.0
    layer(x)
    _silence_sublayers(layer)

    def layer_norm(v):
        v = np.asarray(v, np.float64)
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + epsilon)

    np.testing.assert_allclose(layer(x).numpy(), layer_norm(layer_norm(x)), atol=1e-5)


def test_encoder_final_norm_only_for_pre_ln():
    post = Encoder(**SMALL_ENCODER)
    pre = Encoder(**SMALL_ENCODER, norm_first=True)
    ids = tf.constant([[3, 4, 5]])
    y_post, y_pre = post(ids), pre(ids)
    assert post.final_norm is None and pre.final_norm is not None
    assert len(pre.trainable_weights) == len(post.trainable_weights) + 2
    # Both stacks end normalised: per-position mean 0 and variance 1 (gamma=1, beta=0).
    for y in (y_post, y_pre):
        np.testing.assert_allclose(np.mean(y, -1), 0.0, atol=1e-5)
        np.testing.assert_allclose(np.var(y, -1), 1.0, atol=1e-3)


# Arguments --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    ({"d_model": 10, "num_heads": 3, "dff": 8}, ValueError,
     r"`d_model` must be divisible by `num_heads`, got d_model=10 and num_heads=3"),
    ({**SMALL, "dropout": 1.0}, ValueError, r"`dropout` must be a float in \[0, 1\), got dropout=1.0"),
    ({**SMALL, "epsilon": 0}, ValueError, r"`epsilon` must be a float > 0, got epsilon=0"),
    ({**SMALL, "dff": 0}, ValueError, r"`dff` must be >= 1, got dff=0"),
    ({**SMALL, "d_model": 0}, ValueError, r"^`d_model` must be >= 1, got d_model=0\.$"),
    ({**SMALL, "num_heads": 2.0}, TypeError, r"`num_heads` must be an int, got num_heads=2.0"),
])
def test_invalid_layer_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        EncoderLayer(**kwargs)


def test_invalid_encoder_arguments_and_inputs():
    with pytest.raises(ValueError, match=r"`num_layers` must be >= 1, got num_layers=0"):
        Encoder(**{**SMALL_ENCODER, "num_layers": 0})
    with pytest.raises(ValueError, match=r"`position` must be one of"):
        Encoder(**SMALL_ENCODER, position="rotary")
    layer = EncoderLayer(**SMALL)
    with pytest.raises(ValueError, match=r"`x` must have shape \[batch, length, d_model=16\], got shape"):
        layer(tf.zeros([1, 3, 8]))
    with pytest.raises(ValueError, match=r"`attention_mask` must have shape \[batch, length, length\] "
                                         r"with length 3, got shape \(1, 3, 4\)"):
        layer(tf.zeros([1, 3, 16]), attention_mask=tf.ones([1, 3, 4], tf.bool))
    with pytest.raises(ValueError, match=r"with length 3, got shape \(1, 3, 4\)"):
        traced = tf.function(lambda x, m: layer(x, attention_mask=m))
        traced(tf.zeros([1, 3, 16]), tf.ones([1, 3, 4], tf.bool))
    dynamic = tf.function(lambda x, m: layer(x, attention_mask=m), input_signature=[
        tf.TensorSpec([None, None, 16]), tf.TensorSpec([None, None, None], tf.bool)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`attention_mask` must have shape .* length 3"):
        dynamic(tf.zeros([1, 3, 16]), tf.ones([1, 3, 4], tf.bool))


# Positions inside attention: RoPE and ALiBi -------------------------------------------------------

ROPE_CONFIGS = [{}, {"layout": "interleave", "scaling": "ntk", "scaling_factor": 2.0},
                {"scaling": "yarn", "scaling_factor": 4.0, "original_length": 8, "mscale": 1.0,
                 "mscale_all_dim": 0.5, "partial_rotary_factor": 0.5},
                {"scaling": "llama3", "scaling_factor": 4.0, "original_length": 64, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0}]


def test_encoder_layer_contract_rope(tmp_path):
    mask = tf.constant([[True] * 5, [False, False, True, True, True]])
    run_layer_test(EncoderLayer, {**SMALL, "position": "rope", "position_config": {"max_length": 8}},
                   {"inputs": random_inputs([2, 5, 16]), "mask": mask},
                   expected_output_shape=(2, 5, 16), expected_num_trainable_weights=16,
                   weights_without_gradient=KEY_BIAS, tmp_dir=tmp_path)


def test_encoder_contract_alibi_pre_ln(tmp_path):
    ids = tf.constant([[3, 4, 5, 0, 0], [0, 0, 7, 8, 9]])
    run_layer_test(Encoder, {**SMALL_ENCODER, "num_layers": 1, "norm_first": True, "position": "alibi"}, ids,
                   expected_output_shape=(2, 5, 16), weights_without_gradient=KEY_BIAS, tmp_dir=tmp_path)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("position, config", [("rope", c) for c in ROPE_CONFIGS] + [("alibi", {})])
def test_left_padded_row_equals_unpadded_row_through_the_encoder(position, config, causal):
    keras.utils.set_random_seed(3)
    encoder = Encoder(**SMALL_ENCODER, position=position, position_config=config, dropout=0.0)
    alone = encoder(tf.constant([[5, 6, 7, 8]]), use_causal_mask=causal)[0].numpy()
    batch = encoder(tf.constant([[0, 0, 0, 5, 6, 7, 8], [5, 6, 7, 8, 0, 0, 0]]),
                    use_causal_mask=causal).numpy()
    np.testing.assert_allclose(batch[0, 3:], alone, atol=1e-5)
    np.testing.assert_allclose(batch[1, :4], alone, atol=1e-5)
    # Positions that are not one shift of the unpadded ones change the real outputs.
    gapped = encoder(tf.constant([[5, 6, 7, 8]]), position_ids=tf.constant([[0, 1, 5, 6]]),
                     use_causal_mask=causal)[0].numpy()
    assert np.max(np.abs(gapped - alone)) > 1e-3


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_packed_segments_with_positions_in_attention(position):
    encoder = Encoder(**SMALL_ENCODER, position=position)
    packed = encoder(tf.constant([[5, 6, 7, 8, 9]]), segment_ids=tf.constant([[1, 1, 1, 2, 2]]))[0]
    np.testing.assert_allclose(packed[:3], encoder(tf.constant([[5, 6, 7]]))[0], atol=1e-5)
    np.testing.assert_allclose(packed[3:], encoder(tf.constant([[8, 9]]))[0], atol=1e-5)


def reference_scores(layer, x, positions, allowed):
    """Attention probabilities of `layer` from its weights, in float64 numpy (RoPE half layout / ALiBi)."""
    def project(dense):
        kernel, bias = (np.asarray(v, np.float64) for v in (dense.kernel, dense.bias))
        return np.einsum("btd,dhk->bthk", x, kernel) + bias

    x = np.asarray(x, np.float64)
    q, k = project(layer.attention.query_dense), project(layer.attention.key_dense)
    heads, head_dim = q.shape[2], q.shape[3]
    if layer.position == "rope":
        half = head_dim // 2
        angles = positions[..., None] * 10000.0 ** (-np.arange(half) * 2.0 / head_dim)
        cos, sin = np.cos(angles)[:, :, None], np.sin(angles)[:, :, None]

        def rotate(v):
            return np.concatenate([v[..., :half] * cos - v[..., half:] * sin,
                                   v[..., half:] * cos + v[..., :half] * sin], -1)
        q, k = rotate(q), rotate(k)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
    if layer.position == "alibi":
        slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
        distance = np.abs(positions[:, None, None, :] - positions[:, None, :, None])
        logits = logits - slopes[None, :, None, None] * distance
    logits = np.where(allowed[:, None], logits, -1e30)
    logits = logits - logits.max(-1, keepdims=True)
    return np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_attention_scores_equal_a_numpy_reference(position):
    layer = EncoderLayer(**SMALL, position=position, dropout=0.0)
    x = random_inputs([2, 6, 16], seed=4)
    mask = np.array([[True] * 6, [False, False, True, True, True, True]])
    _, scores = layer(x, mask=tf.constant(mask), use_causal_mask=True, return_attention_scores=True)
    positions = np.array([np.arange(6), [0, 0, 0, 1, 2, 3]], np.float64)
    allowed = mask[:, None, :] & np.tril(np.ones([6, 6], bool))[None]
    expected = reference_scores(layer, x, positions, allowed)
    real_queries = np.broadcast_to(mask[:, None, :, None], expected.shape)  # padding queries are ignored
    np.testing.assert_allclose(scores.numpy()[real_queries], expected[real_queries], atol=1e-6)


def test_return_attention_scores_of_the_plain_layer():
    layer = EncoderLayer(**SMALL, dropout=0.0)
    mask = tf.constant([[True, True, True, False]])
    x = random_inputs([1, 4, 16])
    y, scores = layer(x, mask=mask, return_attention_scores=True)
    # Keras 3 may take a fused attention kernel when no scores are asked for: equal up to rounding.
    np.testing.assert_allclose(y, layer(x, mask=mask), atol=1e-5)
    assert scores.shape == (1, 2, 4, 4)
    np.testing.assert_allclose(tf.reduce_sum(scores, -1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(scores[..., 3], 0.0)


def test_position_config_and_flat_kwargs_agree():
    keras.utils.set_random_seed(0)
    explicit = Encoder(**SMALL_ENCODER, position="sinusoidal", position_config={"table": "factorized"})
    flat = Encoder(**SMALL_ENCODER, position="sinusoidal", table="factorized")
    assert explicit.get_config()["position_config"] == flat.get_config()["position_config"] == {
        "table": "factorized"}
    rope = Encoder(**SMALL_ENCODER, position="rope",
                   position_config={"scaling": "linear", "scaling_factor": 2.0})
    clone = Encoder.from_config(rope.get_config())
    assert clone.encoder_layers[0].rotary.get_config() == rope.encoder_layers[0].rotary.get_config()
    assert rope.encoder_layers[0].rotary.max_length == SMALL_ENCODER["max_length"]
    extended = Encoder(**SMALL_ENCODER, position="rope", overflow="extend")
    assert extended.encoder_layers[0].rotary.max_length is None
    assert extended(tf.constant([[5] * 30])).shape == (1, 30, 16)  # past max_length=12


def test_the_position_layers_own_dropout_is_not_the_sum_dropout():
    """`position_config={"dropout": r}` reaches the position layer; `dropout` stays the sum's."""
    encoder = Encoder(**SMALL_ENCODER, position="sinusoidal", position_config={"dropout": 0.25}, dropout=0.1)
    assert encoder.embedding.position_embedding.dropout == 0.25
    assert encoder.embedding.dropout == 0.1
    clone = Encoder.from_config(encoder.get_config())
    assert (clone.embedding.position_embedding.dropout, clone.embedding.dropout) == (0.25, 0.1)
    model = Seq2SeqTransformer(1, 16, 2, 32, 20, 12, dropout=0.1, position="sinusoidal",
                               position_config={"dropout": 0.25})
    assert model.target_embedding.position_embedding.dropout == 0.25
    assert model.target_embedding.dropout == 0.1
    assert Encoder(**SMALL_ENCODER, position="sinusoidal").embedding.position_embedding.dropout == 0.0


def test_invalid_positions():
    with pytest.raises(ValueError, match="`position` must be one of"):
        Encoder(**SMALL_ENCODER, position="rotary")
    with pytest.raises(ValueError, match="unknown keys"):
        EncoderLayer(**SMALL, position="rope", position_config={"base": 10.0})
    with pytest.raises(ValueError, match=r"position='alibi' takes \(\), got unknown keys \['scaling'\]"):
        Encoder(**SMALL_ENCODER, position="alibi", position_config={"scaling": "ntk"})
    with pytest.raises(ValueError, match="max_length=12"):
        Encoder(**SMALL_ENCODER, position="rope")(tf.constant([[5] * 13]))


# The whole layer against float64 numpy ------------------------------------------------------------

def reference_layer(layer, x, positions, allowed, epsilon, activation):
    """EncoderLayer's output from its weights in float64 numpy: attention over the `allowed` keys, each
    sublayer's residual and LayerNorm (post- or pre-LN), the feed-forward net with `activation`."""
    def weights(dense):
        return np.asarray(dense.kernel, np.float64), np.asarray(dense.bias, np.float64)

    def norm(layer_norm, v):
        gamma, beta = (np.asarray(w, np.float64) for w in (layer_norm.gamma, layer_norm.beta))
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + epsilon) * gamma + beta

    def attend(h):
        probabilities = reference_scores(layer, h, positions, allowed)
        value_kernel, value_bias = weights(layer.attention.value_dense)
        values = np.einsum("btd,dhk->bthk", h, value_kernel) + value_bias
        output_kernel, output_bias = weights(layer.attention.output_dense)
        return np.einsum("bhqk,bkhd,hdo->bqo", probabilities, values, output_kernel) + output_bias

    def feed_forward(h):
        (hidden_kernel, hidden_bias), (output_kernel, output_bias) = (
            weights(layer.ffn_hidden), weights(layer.ffn_output))
        return activation(h @ hidden_kernel + hidden_bias) @ output_kernel + output_bias

    x = np.asarray(x, np.float64)
    if layer.norm_first:
        x = x + attend(norm(layer.attention_norm, x))
        return x + feed_forward(norm(layer.ffn_norm, x))
    x = norm(layer.attention_norm, x + attend(x))
    return norm(layer.ffn_norm, x + feed_forward(x))


def _gelu(v):
    import math

    return 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_layer_equals_a_numpy_reference(norm_first):
    # Every setting away from its default (an epsilon large enough to show, gelu, dropout that
    # inference ignores), left padding and the causal mask.
    x = random_inputs([2, 5, 16], seed=6) * 2.0
    mask = np.array([[True] * 5, [False, False, True, True, True]])
    layer = randomized(EncoderLayer(**SMALL, norm_first=norm_first, activation="gelu", epsilon=0.5,
                                     dropout=0.3), x)
    allowed = mask[:, None, :] & np.tril(np.ones([5, 5], bool))[None]
    expected = reference_layer(layer, x, None, allowed, 0.5, _gelu)
    for training in (False, None):
        out = layer(x, mask=tf.constant(mask), use_causal_mask=True, training=training).numpy()
        np.testing.assert_allclose(out[mask], expected[mask], atol=2e-5)
    relu = randomized(EncoderLayer(**SMALL, norm_first=norm_first), x)  # the defaults: relu, 1e-6
    np.testing.assert_allclose(relu(x).numpy(), reference_layer(relu, x, None, np.ones([2, 5, 5], bool), 1e-6,
                                                                lambda v: np.maximum(v, 0.0)), atol=2e-5)


@pytest.mark.parametrize("silenced", ["attention", "ffn"])
def test_dropout_of_each_sublayer_acts_in_training_only(silenced):
    # With one sublayer's output weights at zero, only the other's dropout can change the output.
    x = random_inputs([2, 5, 16], seed=7)
    mask = tf.constant([[True] * 5, [False, True, True, True, True]])
    layer = randomized(EncoderLayer(**SMALL, dropout=0.5), x, mask=mask)
    dense = layer.attention.output_dense if silenced == "attention" else layer.ffn_output
    dense.set_weights([np.zeros_like(w) for w in dense.get_weights()])
    inference = layer(x, mask=mask).numpy()
    np.testing.assert_array_equal(layer(x, mask=mask, training=False).numpy(), inference)
    keras.utils.set_random_seed(1)
    trained = layer(x, mask=mask, training=True).numpy()
    assert np.abs(trained - inference).max() > 1e-2


def test_config_holds_every_setting_and_round_trips():
    layer = EncoderLayer(d_model=12, num_heads=3, dff=20, dropout=0.25, norm_first=True, activation="gelu",
                         epsilon=1e-3, position="rope", position_config={"scaling": "linear",
                                                                         "scaling_factor": 2.0},
                         name="block")
    config = layer.get_config()
    expected = {"name": "block", "trainable": True, "d_model": 12, "num_heads": 3, "dff": 20, "dropout": 0.25,
                "norm_first": True, "activation": "gelu", "epsilon": 1e-3, "position": "rope",
                "position_config": {"scaling": "linear", "scaling_factor": 2.0}}
    assert {key: config[key] for key in expected} == expected
    clone = EncoderLayer.from_config(config)
    assert clone.get_config() == config
    assert clone.rotary.get_config() == layer.rotary.get_config()
    assert (clone.attention_norm.epsilon, clone.ffn_norm.epsilon) == (1e-3, 1e-3)
    assert clone.attention.get_config()["dropout"] == 0.25
    assert clone.attention_dropout.rate == clone.ffn_dropout.rate == 0.25


def test_a_layer_rebuilt_from_its_configs_is_built_and_takes_its_weights():
    # What loading a `.keras` file of the layer does: from_config, build_from_config (the input shape
    # that `build` recorded), then the weights.
    layer = EncoderLayer(**SMALL)
    layer.build((2, 5, 16))
    assert layer.get_build_config() == {"input_shape": (2, 5, 16)}
    restored = EncoderLayer.from_config(layer.get_config())
    restored.build_from_config(layer.get_build_config())
    assert restored.built
    x = tf.random.stateless_normal([2, 5, 16], seed=[1, 2])
    expected = layer(x).numpy()
    restored(x)  # Keras 2's attention makes its kernels at the first call
    restored.set_weights(layer.get_weights())
    np.testing.assert_array_equal(restored(x).numpy(), expected)


def _message(call):
    return error_message(call, ValueError)


def test_sublayers_keep_their_names_and_the_layer_policy():
    # The names are the weights' paths in checkpoints; every sublayer computes in the layer's policy.
    layer = EncoderLayer(**SMALL, dtype="mixed_float16")
    layer(tf.zeros([1, 3, 16], tf.float16))
    sublayers = [layer.attention, layer.attention_norm, layer.ffn_hidden, layer.ffn_output, layer.ffn_norm]
    assert [sublayer.name for sublayer in sublayers] == [
        "attention", "attention_norm", "ffn_hidden", "ffn_output", "ffn_norm"]
    assert {sublayer.dtype_policy.name for sublayer in sublayers} == {"mixed_float16"}
    assert layer.supports_masking  # Keras reads it before passing a mask on


def test_attention_kernels_start_at_the_glorot_scale_keras_has_always_used():
    # Fans of the rank-3 kernel [64, 4, 16] as a convolution's: limit sqrt(6 / (4 * 64 + 16 * 64)).
    layer = EncoderLayer(d_model=64, num_heads=4, dff=64)
    layer(tf.zeros([1, 2, 64]))
    query = [w for w in layer.attention.weights if "query" in getattr(w, "path", w.name)
             and "kernel" in getattr(w, "path", w.name)]
    largest = float(np.max(np.abs(query[0].numpy())))
    assert 0.06 < largest <= np.sqrt(6.0 / (4 * 64 + 16 * 64))


def test_cached_step_returns_scores_when_asked():
    layer = EncoderLayer(d_model=8, num_heads=2, dff=16, dropout=0.0)
    out = layer(tf.ones([1, 2, 8]), cache=tf.zeros([1, 2, 4, 2, 4]), cache_index=0,
                position_ids=tf.constant([[0, 1]]), return_attention_scores=True)
    assert [tuple(t.shape) for t in out] == [(1, 2, 8), (1, 2, 4, 2, 4), (1, 2, 2, 4)]
    np.testing.assert_allclose(out[2].numpy().sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_the_layer_numbers_positions_from_its_mask(position):
    keras.utils.set_random_seed(4)
    layer = EncoderLayer(**SMALL, position=position, dropout=0.0)
    x = random_inputs([1, 4, 16])
    alone = layer(x).numpy()
    # A padding token inside the row: RoPE and ALiBi see distances, which only the mask's numbering keeps.
    gapped = tf.concat([x[:, :2], tf.zeros([1, 1, 16]), x[:, 2:]], axis=1)
    mask = tf.constant([[True, True, False, True, True]])
    out = layer(gapped, mask=mask).numpy()
    np.testing.assert_allclose(out[:, [0, 1, 3, 4]], alone, atol=1e-5)
    with_scores, _ = layer(gapped, mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(with_scores.numpy(), out, atol=1e-6)


def test_input_shape_is_checked_on_a_built_layer_too():
    layer = EncoderLayer(d_model=8, num_heads=2, dff=16, dropout=0.0)
    layer(tf.zeros([1, 2, 8]))  # built: only `call` checks the inputs from now on
    for shape in ((1, 2, 4), (2, 8)):
        assert (f"`x` must have shape [batch, length, d_model=8], got shape {shape}."
                in _message(lambda shape=shape: layer(tf.zeros(shape))))


def test_cache_argument_messages_in_full():
    layer = EncoderLayer(d_model=8, num_heads=2, dff=16, dropout=0.0)
    x = tf.zeros([1, 2, 8])
    cache = tf.zeros([1, 2, 4, 2, 4])
    ids = tf.constant([[0, 1]])
    needs = "cached attention needs `cache_index` and `position_ids` (int [batch, length])."
    assert needs in _message(lambda: layer(x, cache=cache, cache_index=0))
    assert needs in _message(lambda: layer(x, cache=cache, position_ids=ids))
    assert ("`attention_mask` cannot be combined with `cache`: cached attention is causal over the cache, "
            "with padding given by `position_ids`." in _message(
                lambda: layer(x, cache=cache, cache_index=0, position_ids=ids,
                              attention_mask=tf.ones([1, 2, 2], tf.bool))))
    for shape in ([1, 2, 4, 2, 3], [1, 3, 4, 2, 4], [1, 2, 4, 8]):
        def call(shape=shape):
            return layer(x, cache=tf.zeros(shape), cache_index=0, position_ids=ids)

        assert (f"`cache` must have shape [batch, 2, cache_length, num_heads=2, head_dim=4], got shape "
                f"{tuple(shape)}." in _message(call))


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_steps_of_a_layer_with_dropout_equal_its_inference_pass(norm_first):
    keras.utils.set_random_seed(11)
    layer = EncoderLayer(d_model=8, num_heads=2, dff=16, dropout=0.5, norm_first=norm_first)
    x = tf.random.normal([2, 5, 8], seed=3)
    full = layer(x, use_causal_mask=True, training=False).numpy()
    cache = tf.zeros([2, 2, 5, 2, 4])
    for t in range(5):
        out, cache = layer(x[:, t:t + 1], cache=cache, cache_index=t, position_ids=tf.fill([2, 1], t))
        np.testing.assert_allclose(out.numpy()[:, 0], full[:, t], rtol=0, atol=2e-6)
