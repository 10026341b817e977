"""Property-based invariants of positions, every position layer, RoPE and the encoder.

Hypothesis draws the layouts (padding on either side or scattered, packed segments, offsets, any
pad id), the configurations (every position kind, table kind, base, layout, odd depths, language
counts, overflow modes, RoPE scalings) and the dtype policies; tests/strategies.py has the
strategies and the loop oracle of position numbering. The invariants are the package's promises:
left padding = no padding, packed = separate, offset k = shifted ids, exact zeros at padding,
config round trips, masks passed on.

Backend-agnostic (numpy inputs, `keras_posenc.backend` only): it runs on Keras 2 and on Keras 3
with TensorFlow and JAX. Profiles (tests/conftest.py): `ci` by default, `thorough` with
HYPOTHESIS_PROFILE=thorough (`make test-thorough`).
"""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from layer_test_helper import to_numpy
from strategies import (
    POLICIES,
    any_masks_and_segments,
    depths,
    offsets_for,
    padded_batches,
    policies,
    position_layer_configs,
    reference_position_ids,
    rope_configs,
    seeds,
    segment_layouts,
    token_ids_for,
)

from keras_posenc import Encoder, position_ids
from keras_posenc.backend import backend_name, keras, ops
from keras_posenc.layers import RotaryEmbedding, SinusoidalPositionEmbedding2D, TokenAndPositionEmbedding
from keras_posenc.layers.encoder import ENCODER_POSITIONS
from keras_posenc.layers.token_and_position_embedding import POSITION_LAYERS

# JAX compiles every op again for every new shape in eager mode (about 6x TensorFlow's time per
# example here): a fifth of the profile's examples there, all of them on the TensorFlow stacks.
_JAX_SHARE = 5 if backend_name() == "jax" else 1
per_backend = settings(max_examples=max(4, settings.default.max_examples // _JAX_SHARE))

# Max abs difference allowed between two computations of the same value: float32 paths differ by
# rounding only; the half-precision policies round the sum to their precision (relative).
TOLERANCE = {"float32": 1e-5, "mixed_float16": 2e-3, "mixed_bfloat16": 1.6e-2, "bfloat16": 1.6e-2}


def assert_close(got, expected, policy="float32", what=""):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    bound = TOLERANCE[policy] * (1.0 + np.abs(expected))
    worst = float(np.max(np.abs(got - expected) - bound)) if got.size else -1.0
    assert worst <= 0, f"{what}: max abs diff {np.max(np.abs(got - expected)):.3g} ({policy})"


def numpy_of(x):
    return to_numpy(x).astype(np.float64)


def set_language_scales(layer, rng):
    """Distinct language scales (they start at 1.0), so a wrong language would show."""
    if getattr(layer, "num_languages", None):
        layer.language_scale.assign(rng.uniform(0.5, 2.0, layer.num_languages).astype("float32"))


# Positions ----------------------------------------------------------------------------------
@per_backend
@given(any_masks_and_segments(), st.data())
def test_position_ids_number_real_tokens_of_any_mask_segments_and_offset(layout, data):
    mask, segments = layout
    offset = data.draw(offsets_for(len(mask)), "offset")
    expected = reference_position_ids(mask, segments, offset)
    got = to_numpy(position_ids(mask, segment_ids=segments, offset=offset))
    np.testing.assert_array_equal(got, expected)
    # Without segments: one run per row.
    np.testing.assert_array_equal(to_numpy(position_ids(mask, offset=offset)),
                                  reference_position_ids(mask, None, offset))


def compiled_position_ids():
    """`position_ids` compiled with unknown batch and length: one dynamic-shape tf.function graph
    (its shape checks are graph ops) on TensorFlow, `jax.jit` on JAX. (XLA compiles again for
    every shape: tests/test_positions.py runs it on fixed cases.)"""
    def call(mask, segments, offset):
        return position_ids(mask, segment_ids=segments, offset=offset)

    if backend_name() == "jax":
        import jax

        return jax.jit(call)
    import tensorflow as tf

    signature = [tf.TensorSpec([None, None], tf.bool), tf.TensorSpec([None, None], tf.int32),
                 tf.TensorSpec([None], tf.int32)]
    return tf.function(call, input_signature=signature)


COMPILED_POSITION_IDS = compiled_position_ids()


@per_backend
@given(any_masks_and_segments(), st.lists(st.integers(0, 40), min_size=4, max_size=4))
def test_compiled_position_ids_match_the_loop(layout, offsets):
    mask, segments = layout
    offset = np.array(offsets[:len(mask)], np.int32)
    got = to_numpy(COMPILED_POSITION_IDS(mask, segments, offset))
    np.testing.assert_array_equal(got, reference_position_ids(mask, segments, offset))


@per_backend
@given(padded_batches(max_real=8), st.integers(2, 50), st.data(), seeds)
def test_position_ids_of_any_pad_id_match_the_unpadded_rows(batch, vocab_size, data, seed):
    lengths, mask = batch
    pad_id = data.draw(st.integers(0, vocab_size - 1), "pad_id")
    ids = token_ids_for(np.random.default_rng(seed), mask, vocab_size, pad_id)
    got = to_numpy(position_ids(ops.not_equal(ops.convert_to_tensor(ids), pad_id)))
    for b, n in enumerate(lengths):
        assert got[b][mask[b]].tolist() == list(range(n))
        assert not got[b][~mask[b]].any()


# Additive position layers -------------------------------------------------------------------
def draw_position_layer(data, depth, longest, policy):
    """A position layer for rows of up to `longest` real tokens: a table that holds them, or
    with overflow="extend" possibly a shorter one (rows past it computed)."""
    kind, kwargs = data.draw(position_layer_configs(depth=depth), "position layer")
    shortest = 1 if kwargs.get("overflow") == "extend" else longest
    max_length = data.draw(st.integers(shortest, longest + 3), "max_length")
    return POSITION_LAYERS[kind](max_length, dtype=policy, **kwargs)


@per_backend
@given(depths, policies, padded_batches(max_real=7), st.data(), seeds)
def test_position_layers_padded_rows_equal_bare_rows_and_padding_gets_zero(depth, policy, batch, data, seed):
    lengths, mask = batch
    layer = draw_position_layer(data, depth, max(lengths), policy)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(mask.shape + (depth,)).astype("float32")
    languages = rng.integers(0, layer.num_languages or 1, size=len(mask)).astype("int32")
    lang = (lambda rows: {"language_ids": languages[rows]}) if layer.num_languages else (lambda rows: {})
    layer.build(x.shape)
    set_language_scales(layer, rng)
    y = numpy_of(layer(x, mask=mask, **lang(slice(None))))
    for b in range(len(mask)):
        bare = numpy_of(layer(x[b][mask[b]][None], **lang(slice(b, b + 1))))[0]
        assert_close(y[b][mask[b]], bare, policy, f"row {b}")
    if layer.zero_padding:  # exactly the input: the embedding adds 0.0
        inputs = numpy_of(ops.cast(x, layer.compute_dtype))
        np.testing.assert_array_equal(y[~mask], inputs[~mask])
    assert to_numpy(layer.compute_mask(x, mask)).tolist() == mask.tolist()


@per_backend
@given(depths, policies, segment_layouts(), st.data(), seeds)
def test_position_layers_packed_rows_equal_separate_rows(depth, policy, layout, data, seed):
    lengths, segments = layout
    layer = draw_position_layer(data, depth, max(lengths), policy)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, len(segments), depth)).astype("float32")
    mask = (segments > 0)[None]
    language = {"language_ids": np.array([layer.num_languages - 1], "int32")} if layer.num_languages else {}
    layer.build(x.shape)
    set_language_scales(layer, rng)
    ids = position_ids(mask, segment_ids=segments[None])
    packed = numpy_of(layer(x, position_ids=ids, mask=mask, **language))[0]
    start = 0
    for n in lengths:
        alone = numpy_of(layer(x[:, start:start + n], **language))[0]
        assert_close(packed[start:start + n], alone, policy, f"segment at {start}")
        start += n


@per_backend
@given(depths, st.integers(1, 12), st.data(), seeds)
def test_position_layer_config_round_trip_gives_the_same_layer(depth, max_length, data, seed):
    layer = draw_position_layer(data, depth, max_length, data.draw(policies, "policy"))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, max_length, depth)).astype("float32")
    layer.build(x.shape)
    set_language_scales(layer, rng)
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    kwargs = {"language_ids": np.zeros([2], "int32")} if layer.num_languages else {}
    np.testing.assert_array_equal(numpy_of(clone(x, **kwargs)), numpy_of(layer(x, **kwargs)))


@per_backend
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.booleans(), st.sampled_from(POLICIES))
def test_2d_layer_encodes_the_column_then_the_row_and_passes_the_mask(height, width, quarter, cls, policy):
    layer = SinusoidalPositionEmbedding2D(height, width, cls_token=cls, dtype=policy)
    depth = 4 * quarter
    x = np.zeros([1, layer.num_tokens, depth], "float32")
    pe = numpy_of(layer(x))[0]
    if cls:
        assert not pe[0].any()
        pe = pe[1:]
    grid = pe.reshape(height, width, depth)
    columns, rows = grid[..., :depth // 2], grid[..., depth // 2:]
    # The first half depends on the column only, the second half on the row only.
    np.testing.assert_array_equal(columns, np.broadcast_to(columns[:1], columns.shape))
    np.testing.assert_array_equal(rows, np.broadcast_to(rows[:, :1], rows.shape))
    mask = np.arange(layer.num_tokens)[None] % 2 == 0
    assert to_numpy(layer.compute_mask(x, mask)).tolist() == mask.tolist()
    clone = SinusoidalPositionEmbedding2D.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    np.testing.assert_array_equal(numpy_of(clone(x)), numpy_of(layer(x)))


# TokenAndPositionEmbedding ------------------------------------------------------------------
@st.composite
def token_and_position_configs(draw, max_length, policy=None, languages=True):
    """kwargs of a TokenAndPositionEmbedding: any pad id, every position kind (layers are built in
    the test body: Keras 3 draws random names, which hypothesis refuses inside a strategy)."""
    depth = draw(depths)
    vocab_size = draw(st.integers(2, 30))
    kind, config = draw(position_layer_configs(depth=depth, languages=languages))
    return dict(vocab_size=vocab_size, d_model=depth, max_length=max_length,
                pad_id=draw(st.integers(0, vocab_size - 1)), position=kind,
                scale_embeddings=draw(st.booleans()), dropout=0.0, embeddings_initializer="random_normal",
                position_config=config, dtype=policy or draw(policies))


def token_embedding_of(layer, ids):
    """What TokenAndPositionEmbedding adds its position embedding to (checked exactly at padding)."""
    x = layer.token_embedding(ids)
    return x * ops.cast(math.sqrt(layer.d_model), x.dtype) if layer.scale_embeddings else x


@per_backend
@given(padded_batches(max_real=7), st.data(), seeds)
def test_token_and_position_embedding_any_pad_id_padded_rows_equal_bare_rows(batch, data, seed):
    lengths, mask = batch
    layer = TokenAndPositionEmbedding(**data.draw(token_and_position_configs(max(lengths)), "layer"))
    policy = layer.dtype_policy.name
    rng = np.random.default_rng(seed)
    ids = token_ids_for(rng, mask, layer.vocab_size, layer.pad_id)
    position = layer.position_embedding
    languages = rng.integers(0, position.num_languages or 1, size=len(mask)).astype("int32")
    lang = (lambda rows: {"language_ids": languages[rows]}) if position.num_languages else (lambda rows: {})
    layer.build(ids.shape)
    set_language_scales(position, rng)
    y = numpy_of(layer(ids, **lang(slice(None))))
    for b in range(len(mask)):
        bare = numpy_of(layer(ids[b][mask[b]][None], **lang(slice(b, b + 1))))[0]
        assert_close(y[b][mask[b]], bare, policy, f"row {b} (pad_id={layer.pad_id})")
    if position.zero_padding:
        np.testing.assert_array_equal(y[~mask], numpy_of(token_embedding_of(layer, ids))[~mask])
    assert to_numpy(layer.compute_mask(ids)).tolist() == mask.tolist()


@per_backend
@given(segment_layouts(), st.data(), seeds)
def test_token_and_position_embedding_packed_rows_equal_separate_rows(layout, data, seed):
    lengths, segments = layout
    layer = TokenAndPositionEmbedding(**data.draw(token_and_position_configs(max(lengths)), "layer"))
    rng = np.random.default_rng(seed)
    ids = token_ids_for(rng, (segments > 0)[None], layer.vocab_size, layer.pad_id)
    language = ({"language_ids": np.array([0], "int32")} if layer.position_embedding.num_languages else {})
    packed = numpy_of(layer(ids, segment_ids=segments[None], **language))[0]
    start = 0
    for n in lengths:
        alone = numpy_of(layer(ids[:, start:start + n], **language))[0]
        assert_close(packed[start:start + n], alone, layer.dtype_policy.name, f"segment at {start}")
        start += n


@per_backend
@given(st.integers(1, 8), st.data())
def test_token_and_position_embedding_config_round_trip_and_mask_reaches_the_next_layer(length, data):
    layer = TokenAndPositionEmbedding(**data.draw(
        token_and_position_configs(length, policy="float32", languages=False), "layer"))
    rng = np.random.default_rng(length)
    mask = np.stack([data.draw(st.lists(st.booleans(), min_size=length, max_size=length), "mask")
                     for _ in range(2)])
    ids = token_ids_for(rng, mask, layer.vocab_size, layer.pad_id)
    layer.build(ids.shape)
    clone = TokenAndPositionEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    clone.build(ids.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(numpy_of(clone(ids)), numpy_of(layer(ids)))
    # The Keras mask (ids != pad_id) reaches the next layer of a functional model.
    after = POSITION_LAYERS["integer"](length, scale=1.0)
    inputs = keras.Input(shape=(length,), dtype="int32")
    model = keras.Model(inputs, after(layer(inputs)))
    expected = numpy_of(after(layer(ids), mask=ids != layer.pad_id))
    np.testing.assert_array_equal(numpy_of(model(ids)), expected)


# RoPE ---------------------------------------------------------------------------------------
@st.composite
def rotary_inputs(draw, rng_seed, length):
    rank4 = draw(st.booleans())
    heads = draw(st.integers(1, 2))
    dim = 2 * draw(st.integers(2, 8))
    rng = np.random.default_rng(rng_seed)
    shape = (1, length, heads, dim) if rank4 else (1, length, dim)
    return rng.uniform(-1, 1, shape).astype("float32")


def rotary_logits(q, k):
    """q . k over the last axis for every query/key pair, per head: [..., Tq, Tk]."""
    q, k = numpy_of(q), numpy_of(k)
    if q.ndim == 3:
        q, k = q[:, :, None], k[:, :, None]
    return np.einsum("bqhd,bkhd->bhqk", q, k)


@per_backend
@given(rope_configs(), st.integers(1, 6), st.integers(1, 6), st.integers(0, 200), st.booleans(), st.data(),
       seeds)
def test_rope_logits_depend_only_on_relative_positions(config, queries, keys, shift, tables, data, seed):
    q = data.draw(rotary_inputs(seed, queries), "q")
    k = np.random.default_rng(seed + 1).uniform(-1, 1, q.shape[:1] + (keys,) + q.shape[2:]).astype("float32")
    q_ids = np.array([data.draw(st.lists(st.integers(0, 60), min_size=queries, max_size=queries), "q ids")])
    k_ids = np.array([data.draw(st.lists(st.integers(0, 60), min_size=keys, max_size=keys), "k ids")])
    layer = RotaryEmbedding(max_length=61 + shift if tables else None, **config)
    before = rotary_logits(layer(q, position_ids=q_ids), layer(k, position_ids=k_ids))
    after = rotary_logits(layer(q, position_ids=q_ids + shift), layer(k, position_ids=k_ids + shift))
    # Bound: |q||k| <= dim (entries in [-1, 1]) times float32 rounding of cos/sin and the products.
    np.testing.assert_allclose(after, before, rtol=0, atol=2e-5 * q.shape[-1] * layer.attention_factor ** 2)
    # `offset` shifts given ids the same way.
    np.testing.assert_array_equal(numpy_of(layer(q, position_ids=q_ids, offset=shift)),
                                  numpy_of(layer(q, position_ids=q_ids + shift)))


@per_backend
@given(rope_configs(), any_masks_and_segments(max_batch=3, max_length=8), st.booleans(), st.data(), seeds)
def test_rope_mask_segments_and_offset_equal_the_ids_they_number(config, layout, tables, data, seed):
    mask, segments = layout
    offset = data.draw(offsets_for(len(mask)), "offset")
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, mask.shape + (data.draw(st.sampled_from([4, 6])),)).astype("float32")
    layer = RotaryEmbedding(max_length=60 if tables else None, **config)
    expected = reference_position_ids(mask, segments, offset)
    by_mask = numpy_of(layer(x, mask=mask, segment_ids=segments, offset=offset))
    np.testing.assert_array_equal(by_mask, numpy_of(layer(x, position_ids=expected.astype("int32"))))
    # A left-padded row equals the bare row on its real tokens.
    first = np.asarray(offset).reshape(-1)[:1]
    bare = numpy_of(layer(x[:1][:, mask[0]], offset=first))[0]
    padded = numpy_of(layer(x[:1], mask=mask[:1], offset=first))[0]
    np.testing.assert_allclose(padded[mask[0]], bare, rtol=0, atol=1e-6 * (1 + layer.attention_factor))
    clone = RotaryEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


# Encoder ------------------------------------------------------------------------------------
@st.composite
def encoder_configs(draw, max_length):
    """kwargs of a small Encoder: every position (RoPE with every relative scaling), any pad id."""
    position = draw(st.sampled_from(ENCODER_POSITIONS))
    config = {}
    if position == "rope":
        config = draw(rope_configs())
    elif position in POSITION_LAYERS:
        _, config = draw(position_layer_configs((position,), depth=8, languages=False))
    vocab_size = draw(st.integers(3, 20))
    return dict(num_layers=draw(st.integers(1, 2)), d_model=8, num_heads=draw(st.sampled_from([1, 2])), dff=8,
                vocab_size=vocab_size, max_length=max_length, dropout=0.0, norm_first=draw(st.booleans()),
                pad_id=draw(st.integers(0, vocab_size - 1)), position=position, position_config=config)


@per_backend
@given(segment_layouts(max_segments=3, max_segment_length=4), st.booleans(), st.data(), seeds)
def test_encoder_packed_rows_equal_separate_rows(layout, causal, data, seed):
    lengths, segments = layout
    keras.utils.set_random_seed(seed)
    encoder = Encoder(**data.draw(encoder_configs(max(lengths) + 3), "encoder"))
    rng = np.random.default_rng(seed)
    ids = token_ids_for(rng, (segments > 0)[None], encoder.vocab_size, encoder.pad_id)
    packed = numpy_of(encoder(ids, segment_ids=segments[None], use_causal_mask=causal))[0]
    start = 0
    for n in lengths:
        alone = numpy_of(encoder(ids[:, start:start + n], use_causal_mask=causal))[0]
        assert_close(packed[start:start + n], alone, "float32", f"{encoder.position} segment at {start}")
        start += n


@per_backend
@given(padded_batches(max_real=5, max_batch=2, max_pad=3), st.data(), seeds)
def test_encoder_padded_rows_equal_bare_rows(batch, data, seed):
    lengths, mask = batch
    keras.utils.set_random_seed(seed)
    encoder = Encoder(**data.draw(encoder_configs(max(lengths)), "encoder"))
    ids = token_ids_for(np.random.default_rng(seed), mask, encoder.vocab_size, encoder.pad_id)
    y = numpy_of(encoder(ids))
    for b in range(len(mask)):
        bare = numpy_of(encoder(ids[b][mask[b]][None]))[0]
        assert_close(y[b][mask[b]], bare, "float32", f"{encoder.position} row {b}")
