"""SinusoidalPositionEmbedding (full table): values, padding, masks, languages, precision, errors."""

import re

import numpy as np
import pytest
import tensorflow as tf
from layer_test_helper import error_message, requires_tf, run_layer_test

from keras_posenc import position_ids
from keras_posenc.backend import keras
from keras_posenc.layers import SinusoidalPositionEmbedding

# Written against TensorFlow tensors and graphs; the JAX backend runs tests/test_keras3_backends.py.
pytestmark = requires_tf

DEPTH = 6


def expected_pe(ids, depth=DEPTH, layout="interleave"):
    """float64 PE rows for integer positions `ids` (any shape), from the paper's formula."""
    ids = np.asarray(ids, np.float64)[..., None]
    columns = np.arange(depth)
    if layout == "interleave":
        pair, is_sin = columns // 2, columns % 2 == 0
    else:
        sines = (depth + 1) // 2
        pair, is_sin = np.where(columns < sines, columns, columns - sines), columns < sines
    angles = ids / 10000.0 ** (2.0 * pair / depth)
    return np.where(is_sin, np.sin(angles), np.cos(angles))


def random_x(batch, length, depth=DEPTH, seed=0):
    return tf.constant(np.random.RandomState(seed).standard_normal((batch, length, depth)), tf.float32)


def three_modes(fn, signature):
    """fn eagerly, as a tf.function with dynamic batch and length, and compiled with XLA."""
    return {"eager": fn, "graph": tf.function(fn, input_signature=signature),
            "xla": tf.function(fn, input_signature=signature, jit_compile=True)}


X_SPEC = tf.TensorSpec([None, None, DEPTH], tf.float32)
MASK_SPEC = tf.TensorSpec([None, None], tf.bool)
IDS_SPEC = tf.TensorSpec([None, None], tf.int32)
LAYER = SinusoidalPositionEmbedding(max_length=32)
WITH_MASK = three_modes(lambda x, mask: LAYER(x, mask=mask), [X_SPEC, MASK_SPEC])
WITH_IDS = three_modes(lambda x, mask, ids: LAYER(x, mask=mask, position_ids=ids),
                       [X_SPEC, MASK_SPEC, IDS_SPEC])
MODES = ["eager", "graph", "xla"]


# Keras contract (shared helper) ---------------------------------------------------------------
def test_layer_contract_plain(tmp_path):
    out = run_layer_test(SinusoidalPositionEmbedding, {"max_length": 16}, random_x(2, 5),
                         expected_output_shape=(2, 5, DEPTH), expected_num_trainable_weights=0,
                         tmp_dir=tmp_path)
    pe = np.broadcast_to(expected_pe(np.arange(5)), (2, 5, DEPTH))
    np.testing.assert_allclose(out - random_x(2, 5), pe, atol=1e-6)


def test_layer_contract_with_mask_and_concat_layout(tmp_path):
    mask = tf.constant([[True, True, True, False, False], [False, True, True, True, True]])
    out = run_layer_test(SinusoidalPositionEmbedding, {"max_length": 16, "layout": "concat"},
                         {"inputs": random_x(2, 5), "mask": mask}, tmp_dir=tmp_path)
    np.testing.assert_allclose((out - random_x(2, 5))[1, 1:], expected_pe(np.arange(4), layout="concat"),
                               atol=1e-6)


def test_layer_contract_with_position_ids(tmp_path):
    ids = tf.constant([[3, 4, 5, 6, 7], [0, 0, 9, 2, 1]])
    out = run_layer_test(SinusoidalPositionEmbedding, {"max_length": 16},
                         {"inputs": random_x(2, 5), "position_ids": ids}, tmp_dir=tmp_path)
    np.testing.assert_allclose(out - random_x(2, 5), expected_pe(ids.numpy()), atol=1e-6)


@pytest.mark.parametrize("language_ids", [[0, 1], [[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]]])
def test_layer_contract_with_languages_and_mask(language_ids, tmp_path):
    mask = tf.constant([[True] * 5, [False, False, True, True, True]])
    out = run_layer_test(SinusoidalPositionEmbedding, {"max_length": 16, "num_languages": 2},
                         {"inputs": random_x(2, 5), "mask": mask, "language_ids": tf.constant(language_ids)},
                         expected_num_trainable_weights=1, tmp_dir=tmp_path)
    assert np.all((out - random_x(2, 5)).numpy()[1, :2] == 0)


# Values -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["interleave", "concat"])
def test_output_is_input_plus_the_formula(layout):
    layer = SinusoidalPositionEmbedding(max_length=100, layout=layout)
    x = random_x(3, 100, depth=11)
    pe = np.broadcast_to(expected_pe(np.arange(100), 11, layout), x.shape)
    np.testing.assert_allclose(layer(x) - x, pe, atol=1e-6)


# position_ids and masks, per token, in every mode --------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_left_padded_row_gives_the_unpadded_outputs(mode):
    x = random_x(1, 5)
    unpadded = WITH_MASK[mode](x, tf.ones([1, 5], tf.bool))
    padded_x = tf.concat([random_x(1, 3, seed=9), x], axis=1)
    padded = WITH_MASK[mode](padded_x, tf.constant([[False] * 3 + [True] * 5]))
    np.testing.assert_array_equal(padded[:, 3:], unpadded)
    np.testing.assert_array_equal(padded[:, :3], padded_x[:, :3])  # PE exactly 0 at padding
    np.testing.assert_allclose(unpadded - x, expected_pe(np.arange(5))[None], atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_packed_row_gives_the_outputs_of_its_two_rows(mode):
    first, second = random_x(1, 3, seed=1), random_x(1, 4, seed=2)
    packed_x = tf.concat([first, second, random_x(1, 2, seed=3)], axis=1)
    mask = tf.constant([[True] * 7 + [False] * 2])
    ids = position_ids(mask, segment_ids=tf.constant([[0, 0, 0, 1, 1, 1, 1, 2, 2]]))
    packed = WITH_IDS[mode](packed_x, mask, ids)
    np.testing.assert_array_equal(packed[:, :3], WITH_MASK[mode](first, tf.ones([1, 3], tf.bool)))
    np.testing.assert_array_equal(packed[:, 3:7], WITH_MASK[mode](second, tf.ones([1, 4], tf.bool)))
    np.testing.assert_array_equal(packed[:, 7:], packed_x[:, 7:])


@pytest.mark.parametrize("mode", MODES)
def test_incremental_decoding_with_offset_equals_the_full_pass(mode):
    mask = np.array([[False, False, True, True, True, True], [True] * 6])
    x = random_x(2, 6)
    full = WITH_MASK[mode](x, tf.constant(mask)).numpy()
    decoded = np.zeros([2], np.int32)
    for t in range(6):
        step_mask = tf.constant(mask[:, t:t + 1])
        ids = position_ids(step_mask, offset=tf.constant(decoded))
        step = WITH_IDS[mode](x[:, t:t + 1], step_mask, ids).numpy()
        np.testing.assert_array_equal(step[:, 0], full[:, t])
        decoded += mask[:, t]


def test_zero_padding_false_keeps_position_zero_at_padding():
    layer = SinusoidalPositionEmbedding(max_length=8, zero_padding=False)
    out = layer(tf.zeros([1, 4, DEPTH]), mask=tf.constant([[False, True, True, False]]))
    np.testing.assert_allclose(out[0], expected_pe([0, 0, 1, 0]), atol=1e-6)


def test_position_ids_of_shape_length_broadcast_over_the_batch():
    layer = SinusoidalPositionEmbedding(max_length=8)
    out = layer(tf.zeros([2, 3, DEPTH]), position_ids=tf.constant([5, 6, 7]),
                mask=tf.constant([[True, True, False], [True, True, True]]))
    np.testing.assert_allclose(out[1], expected_pe([5, 6, 7]), atol=1e-6)
    np.testing.assert_allclose(out[0], np.concatenate([expected_pe([5, 6]), np.zeros([1, DEPTH])]), atol=1e-6)


# The Keras mask reaches attention ------------------------------------------------------------------
class AttachMask(keras.layers.Layer):
    """Passes x through and emits the given bool mask as its Keras mask."""

    def call(self, inputs):
        return tf.identity(inputs[0])  # a new tensor: Keras keeps a mask already set on `inputs[0]`

    def compute_mask(self, inputs, mask=None):
        return inputs[1]


class RecordMask(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True
        self.seen = None

    def call(self, inputs, mask=None):
        self.seen = mask
        return inputs


def test_keras_mask_reaches_a_masked_layer_and_attention():
    x_in = keras.Input(shape=(None, DEPTH))
    mask_in = keras.Input(shape=(None,), dtype=tf.bool)
    pe_layer = SinusoidalPositionEmbedding(max_length=16)
    recorder = RecordMask()
    encoded = recorder(pe_layer(AttachMask()([x_in, mask_in])))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(encoded, encoded)
    model = keras.Model([x_in, mask_in], attended)

    mask = tf.constant([[True, True, True, False, False], [False, False, True, True, True]])
    x = random_x(2, 5)
    out = model([x, mask]).numpy()
    np.testing.assert_array_equal(recorder.seen.numpy(), mask.numpy())
    # Other values at padding positions change nothing at the real positions ...
    noisy = tf.where(mask[:, :, None], x, 50.0 * random_x(2, 5, seed=4))
    np.testing.assert_allclose(model([noisy, mask]).numpy()[mask.numpy()], out[mask.numpy()], atol=1e-5)
    # ... and the left-padded row attends exactly as its right-padded twin.
    shifted = tf.concat([x[:1, 3:], x[:1, :3]], axis=1)
    twin = model([shifted, tf.constant([[False, False, True, True, True]])]).numpy()
    np.testing.assert_allclose(twin[0, 2:], out[0, :3], atol=1e-5)
    # Without the mask the padding would leak into the real positions (the check above can fail).
    unmasked = model([noisy, tf.ones_like(mask)]).numpy()
    assert np.abs(unmasked[mask.numpy()] - out[mask.numpy()]).max() > 1e-2


# Language scaling ----------------------------------------------------------------------------------
@pytest.mark.parametrize("language_ids", [[0, 2, 1], [[0, 0, 1, 2], [2, 2, 2, 2], [1, 0, 1, 0]]])
def test_language_scale_starts_as_identity(language_ids):
    x = random_x(3, 4)
    mask = tf.constant([[True] * 4, [False, True, True, True], [True, True, False, False]])
    plain = SinusoidalPositionEmbedding(max_length=8)(x, mask=mask)
    scaled = SinusoidalPositionEmbedding(max_length=8, num_languages=3)(
        x, mask=mask, language_ids=tf.constant(language_ids))
    np.testing.assert_array_equal(scaled.numpy(), plain.numpy())


@pytest.mark.parametrize("per_token", [False, True])
def test_language_scales_learn_different_values(per_token):
    keras.utils.set_random_seed(1)
    batch, length = 8, 6
    x = random_x(batch, length)
    languages = np.arange(batch) % 2
    ids = np.repeat(languages[:, None], length, axis=1) if per_token else languages
    true_scale = np.array([2.0, 0.5])[ids]
    true_scale = true_scale if per_token else true_scale[:, None]
    target = x + true_scale[..., None] * expected_pe(np.arange(length))[None]

    x_in = keras.Input(shape=(length, DEPTH))
    lang_in = keras.Input(shape=ids.shape[1:], dtype=tf.int32)
    layer = SinusoidalPositionEmbedding(max_length=8, num_languages=2)
    model = keras.Model([x_in, lang_in], layer(x_in, language_ids=lang_in))
    model.compile(keras.optimizers.SGD(0.5), "mse")
    model.fit([x, ids], target, epochs=30, batch_size=batch, verbose=0)
    scale = layer.language_scale.numpy()
    assert scale[0] > 1.5 and scale[1] < 0.7, scale
    # The output is x + scale[language] * PE, per token.
    out = layer(x, language_ids=tf.constant(ids))
    want = scale[ids] if per_token else scale[ids][:, None]
    np.testing.assert_allclose(out - x, want[..., None] * expected_pe(np.arange(length))[None], atol=1e-5)


# Weights and gradients -------------------------------------------------------------------------
def test_no_weights_and_no_gradient_to_the_table():
    layer = SinusoidalPositionEmbedding(max_length=8)
    x = random_x(2, 4)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer(x)
        loss = tf.reduce_sum(out * out)
    assert layer.weights == [] and layer.trainable_weights == []
    # d loss / d x = 2 * out: the table adds a constant and takes no part in differentiation.
    np.testing.assert_allclose(tape.gradient(loss, x), 2 * out, rtol=1e-6)


def test_only_the_language_scale_is_trainable_and_the_table_survives_training():
    x_in = keras.Input(shape=(4, DEPTH))
    lang_in = keras.Input(shape=(), dtype=tf.int32)
    layer = SinusoidalPositionEmbedding(max_length=8, num_languages=2)
    hidden = keras.layers.Dense(DEPTH)(x_in)
    model = keras.Model([x_in, lang_in], layer(hidden, language_ids=lang_in))
    assert [w.name.split("/")[-1].split(":")[0] for w in layer.trainable_weights] == ["language_scale"]
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit([random_x(4, 4), tf.constant([0, 1, 0, 1])], tf.zeros([4, 4, DEPTH]), epochs=2, verbose=0)
    layer.language_scale.assign([1.0, 1.0])
    np.testing.assert_allclose(layer(tf.zeros([1, 4, DEPTH]), language_ids=tf.constant([0]))[0],
                               expected_pe(np.arange(4)), atol=1e-6)


# Mixed precision -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"max_length": 8192}, {"max_length": 64, "overflow": "extend"}])
def test_mixed_float16_stays_accurate_to_8192(kwargs):
    depth, length = 64, 8192
    layer = SinusoidalPositionEmbedding(dtype="mixed_float16", **kwargs)
    reference = expected_pe(np.arange(length), depth)
    out = layer(tf.zeros([1, length, depth], tf.float16))
    assert out.dtype == tf.float16
    assert np.abs(out.numpy()[0].astype(np.float64) - reference).max() <= 2e-3
    # Per-sample ids (left padding, mask path) and explicit ids, also float16 and accurate.
    mask = tf.constant([[False] * 100 + [True] * (length - 100)])
    masked = layer(tf.zeros([1, length, depth], tf.float16), mask=mask).numpy()[0].astype(np.float64)
    assert np.abs(masked[100:] - reference[:-100]).max() <= 2e-3 and np.all(masked[:100] == 0)
    ids = tf.constant([[8191, 4096, 0, 7000]])
    explicit = layer(tf.zeros([1, 4, depth], tf.float16), position_ids=ids)
    assert explicit.dtype == tf.float16
    assert np.abs(explicit.numpy()[0] - expected_pe(ids.numpy()[0], depth)).max() <= 2e-3


def test_float16_angles_would_fail_the_precision_bound():
    """Why tables are float64: computing the angle in float16 is far outside 2e-3 by position 8192."""
    positions = np.arange(8192, dtype=np.float16)[:, None]
    frequencies = (10000.0 ** (-2.0 * (np.arange(64) // 2) / 64)).astype(np.float16)
    angles = positions * frequencies
    naive = np.where(np.arange(64) % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float64)
    assert np.abs(naive - expected_pe(np.arange(8192), 64)).max() > 0.1


# Bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    ({"max_length": 0}, ValueError, "`max_length` must be >= 1, got max_length=0"),
    ({"max_length": 2.5}, TypeError, "`max_length` must be an int, got max_length=2.5"),
    ({"layout": "zigzag"}, ValueError, "`layout` must be one of .*, got layout='zigzag'"),
    ({"table": "tiny"}, ValueError, "`table` must be one of .*, got table='tiny'"),
    ({"overflow": "wrap"}, ValueError, "`overflow` must be one of .*, got overflow='wrap'"),
    ({"base": 0.5}, ValueError, "`base` must be a finite number > 1, got base=0.5"),
    ({"num_languages": 0}, ValueError, "`num_languages` must be >= 1, got num_languages=0"),
    ({"dropout": 1.0}, ValueError, "`dropout` must be a float in \\[0, 1\\), got dropout=1.0"),
])
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        SinusoidalPositionEmbedding(**kwargs)


def test_mixed_float16_language_scale_multiplies_float32_rows():
    # The rows are scaled in float32 and rounded to float16 once, at the add (not first rounded to
    # float16, then scaled and rounded again).
    depth, length = 64, 512
    layer = SinusoidalPositionEmbedding(max_length=length, num_languages=2, dtype="mixed_float16")
    x = tf.constant(np.random.default_rng(0).normal(size=[2, length, depth]).astype(np.float16))
    mask = np.ones([2, length], bool)
    mask[1, :7] = False
    layer(x, mask=tf.constant(mask), language_ids=tf.constant([0, 1]))
    layer.language_scale.assign([1.37, 0.61])
    out = layer(x, mask=tf.constant(mask), language_ids=tf.constant([0, 1])).numpy()
    ids = np.where(mask, np.cumsum(mask, 1) - 1, 0)
    scale = np.array([1.37, 0.61], np.float32)[:, None, None]
    pe = (expected_pe(ids, depth).astype(np.float32) * scale).astype(np.float16) * mask[..., None]
    np.testing.assert_array_equal(out, x.numpy() + pe)

LONG = "Sequence length 9 exceeds max_length=8 of SinusoidalPositionEmbedding"
ID_RANGE = r"`position_ids` must be in \[0, max_length=8\), got min {} and max {}"
LANG_RANGE = r"`language_ids` must be in \[0, num_languages=2\), got min 0 and max 2"
MASK_SHAPE = r"`mask` must have shape \[batch, length\]"


@pytest.mark.parametrize("case", ["too_long", "too_long_mask", "negative_id", "id_at_max_length",
                                  "language_range", "mask_shape"])
def test_bad_values_raise_in_eager_and_in_tf_function(case):
    layer = SinusoidalPositionEmbedding(max_length=8, num_languages=2 if case == "language_range" else None)
    x9, x3 = tf.zeros([1, 9, DEPTH]), tf.zeros([1, 3, DEPTH])
    cases = {
        "too_long": ((x9,), {}, LONG),
        "too_long_mask": ((tf.zeros([1, 12, DEPTH]),), {"mask": tf.constant([[False] * 3 + [True] * 9])},
                          LONG),
        "negative_id": ((x3,), {"position_ids": tf.constant([[0, -1, 2]])}, ID_RANGE.format(-1, 2)),
        "id_at_max_length": ((x3,), {"position_ids": tf.constant([[0, 8, 2]])}, ID_RANGE.format(0, 8)),
        "language_range": ((tf.zeros([2, 3, DEPTH]),), {"language_ids": tf.constant([0, 2])}, LANG_RANGE),
        "mask_shape": ((x3,), {"mask": tf.ones([1, 4], tf.bool)}, MASK_SHAPE + r".*got shape.*4"),
    }
    (x,), kwargs, match = cases[case]
    with pytest.raises(ValueError, match=match):
        layer(x, **kwargs)
    names = list(kwargs)
    specs = [tf.TensorSpec([None, None, DEPTH])] + [
        tf.TensorSpec([None] * len(v.shape), v.dtype) for v in kwargs.values()]
    graph = tf.function(lambda x, *rest: layer(x, **dict(zip(names, rest))), input_signature=specs)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        graph(x, *kwargs.values())


def test_longer_tensor_is_fine_when_every_row_fits():
    """With a mask, max_length bounds the real tokens of a row, not the padded width."""
    layer = SinusoidalPositionEmbedding(max_length=8)
    out = layer(tf.zeros([1, 12, DEPTH]), mask=tf.constant([[False] * 4 + [True] * 8]))
    np.testing.assert_allclose(out[0, 4:], expected_pe(np.arange(8)), atol=1e-6)


def test_bad_types_and_ranks_raise_in_eager_and_while_tracing():
    layer = SinusoidalPositionEmbedding(max_length=8)
    x = tf.zeros([1, 3, DEPTH])
    float_ids = tf.function(lambda x, ids: layer(x, position_ids=ids),
                            input_signature=[X_SPEC, tf.TensorSpec([None, None], tf.float32)])
    for call in (lambda: layer(x, position_ids=tf.constant([[0.0, 1.0, 2.0]])),
                 lambda: float_ids(x, tf.zeros([1, 3]))):
        with pytest.raises(TypeError, match="`position_ids` must be an integer tensor, got dtype float32"):
            call()
    rank2 = tf.function(lambda x: layer(x), input_signature=[tf.TensorSpec([None, DEPTH])])
    for call in (lambda: layer(tf.zeros([3, DEPTH])), lambda: rank2(tf.zeros([3, DEPTH]))):
        with pytest.raises(ValueError, match=r"`inputs` must have rank 3 \[batch, length, depth\], got"):
            call()
    without = tf.function(lambda x, lang: layer(x, language_ids=lang),
                          input_signature=[X_SPEC, tf.TensorSpec([None], tf.int32)])
    for call in (lambda: layer(x, language_ids=tf.constant([0])), lambda: without(x, tf.constant([0]))):
        with pytest.raises(ValueError, match="`language_ids` was given but .* num_languages=None"):
            call()
    with pytest.raises(TypeError, match="`language_ids` must be an integer tensor, got dtype float32"):
        SinusoidalPositionEmbedding(max_length=8, num_languages=2)(x, language_ids=tf.constant([0.0]))
    with pytest.raises(ValueError, match="has num_languages=2: pass `language_ids`"):
        SinusoidalPositionEmbedding(max_length=8, num_languages=2)(x)


@pytest.mark.parametrize("mode", MODES)
def test_zero_length_and_all_padding_rows(mode):
    empty = WITH_MASK[mode](tf.zeros([2, 0, DEPTH]), tf.zeros([2, 0], tf.bool))
    assert empty.shape == (2, 0, DEPTH)
    x = random_x(2, 4)
    mask = tf.constant([[False] * 4, [True, True, False, False]])
    out = WITH_MASK[mode](x, mask).numpy()
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[0], x[0])
    np.testing.assert_allclose(out[1, :2] - x[1, :2], expected_pe([0, 1]), atol=1e-6)
    ids_out = WITH_IDS[mode](x, mask, tf.zeros([2, 4], tf.int32)).numpy()
    np.testing.assert_array_equal(ids_out[0], x[0])
    assert WITH_IDS[mode](tf.zeros([0, 3, DEPTH]), tf.zeros([0, 3], tf.bool),
                          tf.zeros([0, 3], tf.int32)).shape == (0, 3, DEPTH)


def test_empty_sequence_without_mask():
    assert SinusoidalPositionEmbedding(max_length=4)(tf.zeros([3, 0, DEPTH])).shape == (3, 0, DEPTH)


def test_extend_computes_rows_past_the_table_in_graph_mode():
    layer = SinusoidalPositionEmbedding(max_length=4, overflow="extend")
    fn = tf.function(lambda x, mask: layer(x, mask=mask), input_signature=[X_SPEC, MASK_SPEC])
    out = fn(tf.zeros([1, 10, DEPTH]), tf.constant([[False, False] + [True] * 8]))
    np.testing.assert_allclose(out[0, 2:], expected_pe(np.arange(8)), atol=1e-6)
    assert np.all(out.numpy()[0, :2] == 0)
    short = fn(tf.zeros([1, 3, DEPTH]), tf.constant([[False, True, True]]))
    np.testing.assert_allclose(short[0], expected_pe([0, 0, 1]) * [[0], [1], [1]], atol=1e-6)


def test_large_and_small_batches_give_the_same_values(tmp_path):
    # 8 x 512 tokens and 1 x 512 tokens (the sizes around the old XLA-fused path). Both must give
    # x + PE(position) at real tokens and exactly x at padding, also after a SavedModel round trip.
    layer = SinusoidalPositionEmbedding(max_length=1024)
    lengths = np.array([512, 300, 1, 0, 512, 17, 256, 511])
    mask = np.arange(512)[None, :] >= 512 - lengths[:, None]  # left padded
    x = random_x(8, 512, seed=3)
    ids = position_ids(mask).numpy()
    reference = x.numpy() + np.where(mask[..., None], expected_pe(ids), 0.0).astype(np.float32)
    spec = [tf.TensorSpec([None, None, DEPTH]), tf.TensorSpec([None, None], tf.bool)]
    graph = tf.function(lambda x, m: layer(x, mask=m), input_signature=spec)
    for call in (lambda x, m: layer(x, mask=m), graph):
        np.testing.assert_allclose(call(x, mask).numpy(), reference, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(call(x, mask).numpy()[~mask], x.numpy()[~mask])
        np.testing.assert_array_equal(call(x[:1], mask[:1]).numpy(), call(x, mask).numpy()[:1])
    module = tf.Module()
    module.layer, module.call = layer, graph
    tf.saved_model.save(module, str(tmp_path / "fused"))
    restored = tf.saved_model.load(str(tmp_path / "fused"))
    np.testing.assert_array_equal(restored.call(x, mask).numpy(), graph(x, mask).numpy())


# The shared base (PositionEmbeddingBase): its messages in full and its paths ---------------------------
def _message_lines(call):
    """The lines of the ValueError or TypeError that `call` raises."""
    return error_message(call).splitlines()


def test_call_argument_messages_in_full():
    layer = SinusoidalPositionEmbedding(max_length=8)
    x = tf.zeros([1, 3, DEPTH])
    assert ("`position_ids` must have shape [batch, length] or [length], got shape (1, 1, 3)."
            in _message_lines(lambda: layer(x, position_ids=tf.zeros([1, 1, 3], tf.int32))))
    assert ("`position_ids` length 4 must equal the inputs length 3."
            in _message_lines(lambda: layer(x, position_ids=tf.constant([[0, 1, 2, 3]]))))
    # One token: its id alone decides the range check, at the ends of int32 too.
    assert ("`position_ids` must be in [0, max_length=8), got min 8 and max 8."
            in _message_lines(lambda: layer(x[:, :1], position_ids=tf.constant([[8]]))))
    assert ("`position_ids` must be in [0, max_length=8), got min 2147483647 and max 2147483647."
            in _message_lines(lambda: layer(x[:, :1], position_ids=tf.constant([[2**31 - 1]]))))
    assert ("`position_ids` must be in [0, max_length=8), got min -2147483648 and max -2147483648."
            in _message_lines(lambda: layer(x[:, :1], position_ids=tf.constant([[-2**31]]))))
    assert ("`position_ids` must be in [0, max_length=8), got min 70 and max 90."
            in _message_lines(lambda: layer(x, position_ids=tf.constant([[70, 90, 80]]))))
    extend = SinusoidalPositionEmbedding(max_length=8, overflow="extend")
    assert ("`position_ids` must be in [0, inf), got min -1 and max 20."
            in _message_lines(lambda: extend(x, position_ids=tf.constant([[-1, 20, 2]]))))
    languages = SinusoidalPositionEmbedding(max_length=8, num_languages=2, name="pe")
    assert ("SinusoidalPositionEmbedding 'pe' has num_languages=2: pass `language_ids` of shape [batch] or "
            "[batch, length]." in _message_lines(lambda: languages(x)))
    assert ("`language_ids` must have shape [batch] or [batch, length], got shape (1, 1, 1)."
            in _message_lines(lambda: languages(x, language_ids=tf.zeros([1, 1, 1], tf.int32))))
    # One row: its language alone decides the range check.
    assert ("`language_ids` must be in [0, num_languages=2), got min 2 and max 2."
            in _message_lines(lambda: languages(x, language_ids=tf.constant([2]))))


def test_mask_messages_in_full():
    layer = SinusoidalPositionEmbedding(max_length=8)
    x = tf.zeros([1, 3, DEPTH])
    assert ("`mask` must have shape [batch, length] = (1, 3), got shape (1, 3, 1)."
            in _message_lines(lambda: layer(x, mask=tf.ones([1, 3, 1], tf.bool))))
    graph = tf.function(lambda x, mask: layer(x, mask=mask), input_signature=[X_SPEC, MASK_SPEC])
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        graph(x, tf.ones([1, 4], tf.bool))
    # TensorFlow prints a failed assertion's data in brackets: the message, whole.
    assert "[`mask` must have shape [batch, length] = [1 3], got shape [1 4].]" in str(error.value)


def test_language_arguments_are_checked_on_the_masked_path_too():
    # A mask alone takes the one-gather path: it must not skip the language checks.
    x, mask = tf.zeros([1, 3, DEPTH]), tf.constant([[False, True, True]])
    languages = SinusoidalPositionEmbedding(max_length=8, num_languages=2, name="pe")
    assert ("SinusoidalPositionEmbedding 'pe' has num_languages=2: pass `language_ids` of shape [batch] or "
            "[batch, length]." in _message_lines(lambda: languages(x, mask=mask)))
    plain = SinusoidalPositionEmbedding(max_length=8, name="plain")
    assert ("`language_ids` was given but SinusoidalPositionEmbedding 'plain' was built with "
            "num_languages=None; pass num_languages=N to learn a scale per language."
            in _message_lines(lambda: plain(x, mask=mask, language_ids=tf.constant([0]))))


def test_mask_shape_is_checked_in_a_tf1_session():
    # A session runs only the ops its fetches depend on: the output itself must carry the check, or a
    # [1, 3] mask would broadcast a one-token input to three tokens without a word.
    with tf.Graph().as_default():
        layer = SinusoidalPositionEmbedding(max_length=8)
        x = tf.compat.v1.placeholder(tf.float32, [None, None, DEPTH])
        mask = tf.compat.v1.placeholder(tf.bool, [None, None])
        out = layer(x, mask=mask)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            fine = session.run(out, {x: np.zeros([1, 3, DEPTH]), mask: [[True, True, False]]})
            np.testing.assert_allclose(fine[0], expected_pe([0, 1, 0]) * [[1], [1], [0]], atol=1e-6)
            message = "[`mask` must have shape [batch, length] = [1 1], got shape [1 3].]"
            with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(message)):
                session.run(out, {x: np.zeros([1, 1, DEPTH]), mask: np.ones([1, 3], bool)})


def test_range_messages_inside_a_graph():
    # In a traced graph the range checks run with the call; the lengths match, so only they can fail.
    layer = SinusoidalPositionEmbedding(max_length=8, num_languages=3)
    fn = tf.function(lambda x, ids, languages: layer(x, position_ids=ids, language_ids=languages))
    x = tf.zeros([2, 3, DEPTH])
    good_ids, good_languages = tf.constant([[0, 1, 2], [5, 6, 7]]), tf.constant([0, 2])
    assert fn(x, good_ids, good_languages).shape == (2, 3, DEPTH)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        fn(x, tf.constant([[0, 1, 2], [70, 90, 80]]), good_languages)
    assert "`position_ids` must be in [0, max_length=8), got min 0 and max 90." in str(error.value)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        fn(x, good_ids, tf.constant([0, 3]))
    assert "`language_ids` must be in [0, num_languages=3), got min 0 and max 3." in str(error.value)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        fn(x, good_ids, tf.constant([[0, 1, 1], [2, -1, 0]]))
    assert "`language_ids` must be in [0, num_languages=3), got min -1 and max 2." in str(error.value)


def test_extend_without_a_mask_in_a_graph_of_any_length():
    # A length known only when the graph runs: rows inside the table and past it.
    layer = SinusoidalPositionEmbedding(max_length=4, overflow="extend")
    fn = tf.function(lambda x: layer(x), input_signature=[X_SPEC])
    for length in (3, 4, 10):
        out = fn(tf.zeros([2, length, DEPTH])).numpy()
        np.testing.assert_allclose(out, np.broadcast_to(expected_pe(np.arange(length)), out.shape), atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_padding_inside_a_row_is_skipped_by_the_positions(mode):
    # Real tokens are numbered over the mask: a gap inside a row does not take a position.
    x = random_x(2, 6)
    mask = np.array([[True, False, True, True, False, True], [False, True, False, False, True, True]])
    out = WITH_MASK[mode](x, tf.constant(mask)).numpy() - x.numpy()
    ids = np.where(mask, np.cumsum(mask, 1) - 1, 0)
    np.testing.assert_allclose(out, expected_pe(ids) * mask[..., None], atol=1e-6)
    assert (out[~mask] == 0).all()


@pytest.mark.parametrize("kind", ["mask", "position_ids", "none"])
def test_dropout_drops_in_training_only_and_padding_stays_zero(kind):
    # Dropout on the embedding alone: each value of output - input is 0 or PE / (1 - rate) in
    # training, PE otherwise; a padding position stays exactly 0 either way.
    from keras_posenc.backend import keras

    layer = SinusoidalPositionEmbedding(max_length=16, dropout=0.5)
    x = random_x(4, 8)
    mask = np.arange(8)[None] >= np.array([[0], [3], [1], [5]])  # left padded
    ids = np.where(mask, np.cumsum(mask, 1) - 1, 0)
    arguments = {"mask": {"mask": tf.constant(mask)}, "position_ids": {"position_ids": tf.constant(ids)},
                 "none": {}}[kind]
    pe = expected_pe(ids) * mask[..., None] if kind == "mask" else expected_pe(
        ids if kind == "position_ids" else np.broadcast_to(np.arange(8), (4, 8)))
    for training in (False, None):
        np.testing.assert_allclose(layer(x, training=training, **arguments) - x, pe, atol=1e-6)
    keras.utils.set_random_seed(0)
    out = (layer(x, training=True, **arguments) - x).numpy()
    kept, dropped = np.isclose(out, 2 * pe, atol=1e-5), out == 0
    assert (kept | dropped).all()
    assert (dropped & (np.abs(pe) > 0.1)).any() and (kept & (np.abs(pe) > 0.1)).any()
    if kind == "mask":
        assert (out[~mask] == 0).all()
