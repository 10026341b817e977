"""RotaryEmbedding against independent float64 numpy RoPE (both layouts, every scaling), its properties."""

import math

import numpy as np
import pytest
from layer_test_helper import error_message, run_layer_test, to_numpy

from keras_posenc.backend import is_tensorflow
from keras_posenc.layers import RotaryEmbedding
from keras_posenc.layers.rotary_embedding import apply_rotary, rotary_cos_sin, rotary_embedding

SCALINGS = [
    {},
    {"scaling": "linear", "scaling_factor": 4.0},
    {"scaling": "ntk", "scaling_factor": 4.0},
    {"scaling": "yarn", "scaling_factor": 4.0, "original_length": 64},
    {"scaling": "yarn", "scaling_factor": 8.0, "original_length": 512, "beta_fast": 16.0, "beta_slow": 2.0},
    {"scaling": "yarn-turns", "scaling_factor": 4.0, "original_length": 64},
]


def reference_angles(positions, dim, base=10000.0, scaling=None, scaling_factor=1.0, original_length=None,
                     beta_fast=32.0, beta_slow=1.0):
    """Angle of pair i at each position, straight from each paper's formula, float64, loop by pair."""
    s = scaling_factor
    positions = np.asarray(positions, np.float64)
    angles = np.zeros(positions.shape + (dim // 2,))
    for i in range(dim // 2):
        if scaling == "ntk":  # bloc97: base' = base * s^(d / (d - 2))
            theta = (base * s ** (dim / (dim - 2))) ** (-2.0 * i / dim)
        else:  # RoFormer eq. 15: theta_i = 10000^(-2(i-1)/d), 1-based i
            theta = base ** (-2.0 * i / dim)
        if scaling == "linear":  # position interpolation: m -> m / s
            angles[..., i] = (positions / s) * theta
            continue
        if scaling == "yarn-turns":  # YaRN eq. 17-19 as printed: r = L / lambda turns, ramp gamma(r)
            r = original_length / (2 * math.pi / theta)
            gamma = min(1.0, max(0.0, (r - beta_slow) / (beta_fast - beta_slow)))
            theta = (1 - gamma) * theta / s + gamma * theta
        if scaling == "yarn":  # as shipped: a ramp over the pair index i between the dims turning beta times
            def dim_turning(turns):  # solve L * base^(-2i/d) / (2 pi) = turns for i
                return dim * math.log(original_length / (2 * math.pi * turns)) / (2 * math.log(base))
            low = max(math.floor(dim_turning(beta_fast)), 0)
            high = min(math.ceil(dim_turning(beta_slow)), dim - 1)
            interpolated = min(1.0, max(0.0, (i - low) / (high - low if high > low else 0.001)))
            theta = interpolated * theta / s + (1 - interpolated) * theta
        angles[..., i] = positions * theta
    return angles


def reference_rope(x, positions, layout="half", **scaling):
    """RoPE of x [batch, length, (heads,) dim] by explicit 2x2 rotations, float64."""
    x = np.asarray(x, np.float64)
    dim = x.shape[-1]
    angles = reference_angles(positions, dim, **scaling)
    if x.ndim == 4:
        angles = angles[:, :, None, :]
    out = np.empty_like(x)
    for i in range(dim // 2):
        a, b = (i, i + dim // 2) if layout == "half" else (2 * i, 2 * i + 1)
        c, s = np.cos(angles[..., i]), np.sin(angles[..., i])
        out[..., a] = c * x[..., a] - s * x[..., b]
        out[..., b] = s * x[..., a] + c * x[..., b]
    if scaling.get("scaling") in ("yarn", "yarn-turns"):  # sqrt(1/t) = 0.1 ln(s) + 1 on queries and keys
        out = out * (0.1 * math.log(scaling["scaling_factor"]) + 1)
    return out


def _inputs(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize("layout", ["half", "interleave"])
@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: f"{s.get('scaling')}{s.get('beta_fast', '')}")
@pytest.mark.parametrize("tabled", [False, True])
def test_equals_numpy_float64_rope(layout, scaling, tabled):
    x = _inputs([2, 6, 3, 16])
    positions = np.array([[0, 1, 2, 3, 4, 5], [7, 100, 999, 4095, 8191, 3]])
    layer = RotaryEmbedding(layout=layout, max_length=8192 if tabled else None, **scaling)
    got = to_numpy(layer(x, position_ids=positions))
    assert np.max(np.abs(got - reference_rope(x, positions, layout, **scaling))) <= 1e-6
    function = to_numpy(rotary_embedding(x[:, :, 0], positions, layout=layout, **scaling))
    assert np.max(np.abs(function - reference_rope(x[:, :, 0], positions, layout, **scaling))) <= 1e-6


@pytest.mark.parametrize("layout", ["half", "interleave"])
@pytest.mark.parametrize("scaling", SCALINGS[:4], ids=lambda s: s.get("scaling", "none"))
def test_query_key_products_depend_only_on_the_distance(layout, scaling):
    q, k = _inputs([1, 12, 2, 8], 1), _inputs([1, 12, 2, 8], 2)
    layer = RotaryEmbedding(layout=layout, **scaling)
    positions = np.arange(12)[None]

    def scores(shift):
        rq = to_numpy(layer(q, position_ids=positions + shift)).astype(np.float64)
        rk = to_numpy(layer(k, position_ids=positions + shift)).astype(np.float64)
        return np.einsum("bihd,bjhd->bhij", rq, rk)

    np.testing.assert_allclose(scores(37), scores(0), atol=2e-6)
    assert not np.allclose(scores(0), np.einsum("bihd,bjhd->bhij", q, k), atol=1e-3)  # positions matter


def test_ids_from_mask_segments_and_offset():
    x = _inputs([1, 5, 8])
    layer = RotaryEmbedding()

    def rope(*args, **kwargs):
        return to_numpy(layer(*args, **kwargs))

    plain = rope(x[:, :3])
    left_padded = rope(np.concatenate([np.zeros([1, 2, 8], np.float32), x[:, :3]], 1),
                       mask=np.array([[False, False, True, True, True]]))
    np.testing.assert_array_equal(left_padded[:, 2:], plain)
    np.testing.assert_array_equal(left_padded[:, :2], 0.0)  # padding: position 0, no rotation
    packed = rope(x, mask=np.ones([1, 5], bool), segment_ids=np.array([[1, 1, 1, 2, 2]]))
    np.testing.assert_allclose(packed[:, 3:], rope(x[:, 3:]), atol=1e-7)
    np.testing.assert_allclose(rope(x[:, 3:], offset=3), rope(x)[:, 3:], atol=1e-7)
    np.testing.assert_allclose(rope(x[:, 3:], position_ids=np.array([[0, 1]]), offset=3), rope(x)[:, 3:],
                               atol=1e-7)


def test_tables_stay_float32_under_mixed_precision():
    x = _inputs([1, 4, 2, 64])
    positions = np.array([[3000, 5000, 7000, 8191]])
    mixed = RotaryEmbedding(dtype="mixed_float16")(x.astype(np.float16), position_ids=positions)
    assert "float16" in str(mixed.dtype)
    # float16 angles would be off by up to ~4 rad at these positions; float32 tables leave fp16 rounding only.
    expected = reference_rope(x.astype(np.float16).astype(np.float32), positions)
    assert np.max(np.abs(to_numpy(mixed).astype(np.float64) - expected)) < 2e-3


def test_layer_contract(tmp_path):
    x = _inputs([2, 5, 2, 8])
    ids = np.array([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]], np.int32)
    run_layer_test(RotaryEmbedding, {"layout": "interleave", "scaling": "yarn", "scaling_factor": 2.0,
                                     "original_length": 16, "max_length": 32},
                   {"inputs": x, "position_ids": ids}, expected_output_shape=(2, 5, 2, 8),
                   expected_num_trainable_weights=0, mixed_precision_atol=5e-3, tmp_dir=tmp_path)


def test_invalid_arguments_and_inputs():
    with pytest.raises(ValueError, match="layout"):
        RotaryEmbedding(layout="pairs")
    with pytest.raises(ValueError, match="scaling"):
        RotaryEmbedding(scaling="ntk-by-parts")
    with pytest.raises(ValueError, match="scaling_factor"):
        RotaryEmbedding(scaling_factor=2.0)
    with pytest.raises(ValueError, match="scaling_factor"):
        RotaryEmbedding(scaling="linear", scaling_factor=0.5)
    with pytest.raises(ValueError, match="original_length"):
        RotaryEmbedding(scaling="yarn", scaling_factor=2.0)
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding()(np.zeros([1, 2, 5], np.float32))
    with pytest.raises(TypeError, match="position_ids"):
        RotaryEmbedding()(np.zeros([1, 2, 4], np.float32), position_ids=np.zeros([1, 2], np.float32))
    with pytest.raises(ValueError, match=r"max_length=4\) .* got min 0 and max 4"):
        RotaryEmbedding(max_length=4)(np.zeros([1, 5, 4], np.float32))
    if not is_tensorflow():
        return
    import tensorflow as tf

    @tf.function
    def graph(x, ids):
        return RotaryEmbedding(max_length=4, name="rope")(x, position_ids=ids)

    with pytest.raises(tf.errors.InvalidArgumentError, match="max_length=4"):
        graph(tf.zeros([1, 2, 4]), tf.constant([[0, 9]]))


# The function forms, the messages in full and the paths a plain call does not take -------------------
def test_the_function_forms_default_to_half_pairs_and_take_the_base():
    x, ids = _inputs([2, 3, 2, 8]), np.array([[0, 1, 2], [4, 7, 9]])
    np.testing.assert_allclose(to_numpy(rotary_embedding(x, ids)), reference_rope(x, ids), atol=1e-6)
    np.testing.assert_allclose(to_numpy(rotary_embedding(x, ids, max_wavelength=500.0)),
                               reference_rope(x, ids, base=500.0), atol=1e-6)
    # [length] ids: the same positions for every row, also for [batch, length, heads, head_dim].
    np.testing.assert_allclose(to_numpy(rotary_embedding(x, np.array([4, 7, 9]))),
                               reference_rope(x, np.array([[4, 7, 9]] * 2)), atol=1e-6)
    cos, sin = rotary_cos_sin(ids[:1], RotaryEmbedding().frequencies(8))
    half = to_numpy(apply_rotary(x[:1, :, 0], cos, sin))
    np.testing.assert_allclose(half, reference_rope(x[:1, :, 0], ids[:1]), atol=1e-6)


def test_argument_messages_in_full():
    x = np.zeros([1, 3, 4], np.float32)
    assert ("`layout` must be one of ('half', 'interleave'), got layout='pairs'."
            in error_message(lambda: apply_rotary(x, np.ones([1, 3, 2]), np.zeros([1, 3, 2]), "pairs")))
    assert ("`position_ids` must be an integer tensor, got dtype float32."
            in error_message(lambda: rotary_embedding(x, np.zeros([1, 3], np.float32))))
    assert ("`position_ids` must have shape [batch, length] or [length], got shape (1, 1, 3)."
            in error_message(lambda: rotary_embedding(x, np.zeros([1, 1, 3], np.int32))))
    assert "`length` must be >= 1, got length=0." in error_message(lambda: RotaryEmbedding().freeze(0))


def test_range_messages_in_full_at_the_ends():
    layer = RotaryEmbedding(max_length=100, name="rope")
    x = np.zeros([1, 2, 4], np.float32)
    template = "Position ids must be in [0, max_length=100) of RotaryEmbedding 'rope', got min {} and max {}."
    assert template.format(70, 200) in error_message(lambda: layer(x, position_ids=np.array([[70, 200]])))
    for single in (100, 2**31 - 1, -2**31):  # one id alone decides the check
        assert template.format(single, single) in error_message(
            lambda single=single: layer(x[:, :1], position_ids=np.array([[single]])))
    np.testing.assert_allclose(to_numpy(layer(_inputs([1, 2, 4]), position_ids=np.array([[99, 0]]))),
                               reference_rope(_inputs([1, 2, 4]), np.array([[99, 0]])), atol=1e-5)
    assert to_numpy(layer(x[:, :0], position_ids=np.zeros([1, 0], np.int32))).shape == (1, 0, 4)


def test_a_call_of_max_length_tokens_uses_the_whole_table():
    x = _inputs([1, 8, 4])
    np.testing.assert_allclose(to_numpy(RotaryEmbedding(max_length=8)(x)),
                               reference_rope(x, np.arange(8)[None]), atol=1e-6)


@pytest.mark.parametrize("max_length", [None, 16])
def test_an_attention_factor_of_two_doubles_the_rotation(max_length):
    x, ids = _inputs([1, 3, 4]), np.array([[0, 5, 2]])
    scaled = RotaryEmbedding(attention_factor=2.0, max_length=max_length)
    np.testing.assert_allclose(to_numpy(scaled(x, position_ids=ids)), 2 * reference_rope(x, ids), atol=1e-6)
    np.testing.assert_allclose(to_numpy(scaled(x)), 2 * reference_rope(x, np.arange(3)[None]), atol=1e-6)


def test_offsets_per_row_and_with_a_mask():
    layer = RotaryEmbedding()
    x = _inputs([2, 3, 4])
    ids = np.array([[0, 1, 2], [0, 1, 2]])
    out = to_numpy(layer(x, position_ids=ids, offset=np.array([0, 5])))
    np.testing.assert_allclose(out, reference_rope(x, np.array([[0, 1, 2], [5, 6, 7]])), atol=1e-6)
    masked = to_numpy(layer(x, mask=np.ones([2, 3], bool), offset=4))
    np.testing.assert_allclose(masked, reference_rope(x, np.array([[4, 5, 6]] * 2)), atol=1e-6)


def test_cos_sin_tables_of_the_call_or_the_frozen_length():
    cos, sin = RotaryEmbedding(max_wavelength=500.0).cos_sin_tables(5, 8)
    angles = reference_angles(np.arange(5), 8, base=500.0)
    np.testing.assert_allclose(cos, np.cos(angles), atol=1e-7)
    np.testing.assert_allclose(sin, np.sin(angles), atol=1e-7)
    dynamic = RotaryEmbedding(scaling="dynamic", scaling_factor=2.0, original_length=4)
    for frozen in (None, 16):
        if frozen:
            dynamic.freeze(frozen)
        angles = np.arange(5)[:, None] * dynamic.frequencies(8, frozen or 5)
        cos, sin = dynamic.cos_sin_tables(5, 8)
        np.testing.assert_allclose(cos, np.cos(angles), atol=1e-7)
        np.testing.assert_allclose(sin, np.sin(angles), atol=1e-7)
    assert not np.allclose(dynamic.frequencies(8, 16), dynamic.frequencies(8, 5))


@pytest.mark.parametrize("max_length", [None, 4])
def test_dynamic_scaling_of_empty_ids(max_length):
    layer = RotaryEmbedding(scaling="dynamic", scaling_factor=2.0, original_length=4, max_length=max_length)
    out = layer(np.zeros([1, 0, 4], np.float32), position_ids=np.zeros([1, 0], np.int32))
    assert to_numpy(out).shape == (1, 0, 4)


LONGROPE = {"scaling": "longrope", "scaling_factor": 4.0, "original_length": 8,
            "short_factor": [1.0, 1.5], "long_factor": [2.0, 6.0]}
DYNAMIC = {"scaling": "dynamic", "scaling_factor": 2.0, "original_length": 64}


@pytest.mark.parametrize("options, top", [(LONGROPE, 7), (LONGROPE, 8), (dict(LONGROPE, max_length=32), 7),
                                          (dict(LONGROPE, max_length=32), 8), (DYNAMIC, 9000)])
def test_call_length_switches_in_a_graph_as_in_eager_mode(options, top):
    # Eagerly the ids' values pick the frequencies in NumPy; in a graph, ops do: at the original
    # length itself LongRoPE keeps its short factors, one past it the long ones.
    if not is_tensorflow():
        pytest.skip("tf.function: the JAX runs trace with jax.jit in tests/test_keras3_rope_hf_configs.py")
    import tensorflow as tf

    layer = RotaryEmbedding(**options)
    x, ids = _inputs([1, 3, 4]), np.array([[0, top - 1, top]])
    eager = to_numpy(layer(x, position_ids=ids))
    signature = [tf.TensorSpec([None, None, 4]), tf.TensorSpec([None, None], tf.int32)]
    graph = tf.function(lambda x, ids: layer(x, position_ids=ids), input_signature=signature)
    np.testing.assert_allclose(graph(x, ids).numpy(), eager, atol=2e-6)  # float64 angles in both
    if options["scaling"] == "longrope":
        short = to_numpy(layer(x, position_ids=np.array([[0, 6, 7]])))
        assert (top <= 7) == np.allclose(eager, short, atol=1e-6)


def test_a_frozen_layer_rotates_without_reverse():
    # Exporters freeze the layer: every converter maps its ops (TensorFlow's own path uses one REVERSE).
    if not is_tensorflow():
        pytest.skip("TensorFlow graphs")
    import tensorflow as tf

    def op_types(layer):
        function = tf.function(lambda x: layer(x)).get_concrete_function(tf.TensorSpec([1, 4, 8]))
        return {op.type for op in function.graph.get_operations()}

    frozen = RotaryEmbedding()
    frozen.freeze(4)
    assert "ReverseV2" in op_types(RotaryEmbedding())
    assert "ReverseV2" not in op_types(frozen)
    x = _inputs([1, 4, 8])
    np.testing.assert_allclose(to_numpy(frozen(x)), reference_rope(x, np.arange(4)[None]), atol=1e-6)


def test_range_check_inside_a_graph_and_a_tf1_session():
    if not is_tensorflow():
        pytest.skip("TensorFlow graphs")
    import tensorflow as tf

    message = ("[Position ids must be in [0, max_length=100) of RotaryEmbedding 'rope', got min 70 and "
               "max 200.]")

    def text(error):  # TensorFlow escapes the quotes of an assertion's data
        return str(error.value).replace("\\'", "'")

    layer = RotaryEmbedding(max_length=100, name="rope")
    graph = tf.function(lambda x, ids: layer(x, position_ids=ids))
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        graph(tf.zeros([1, 2, 4]), tf.constant([[70, 200]]))
    assert message in text(error)
    # A session runs only what its fetches depend on: the rotated output must carry the check.
    with tf.Graph().as_default():
        layer = RotaryEmbedding(max_length=100, name="rope")
        ids = tf.compat.v1.placeholder(tf.int32, [None, None])
        out = layer(tf.zeros([1, 2, 4]), position_ids=ids)
        with tf.compat.v1.Session() as session:
            assert session.run(out, {ids: [[70, 99]]}).shape == (1, 2, 4)
            with pytest.raises(tf.errors.InvalidArgumentError) as error:
                session.run(out, {ids: [[70, 200]]})
            assert message in text(error)


def test_one_rotary_per_attention_type_names_and_messages():
    gemma3 = {"model_type": "gemma3_text", "head_dim": 8, "rope_theta": 1e6}
    named = RotaryEmbedding.from_hf_config_per_layer_type(gemma3, name="rope")
    assert {k: v.name for k, v in named.items()} == {"full_attention": "rope_full_attention",
                                                      "sliding_attention": "rope_sliding_attention"}
    unnamed = RotaryEmbedding.from_hf_config_per_layer_type(gemma3)
    assert not any(layer.name.startswith("None") for layer in unnamed.values())
    assert ("The config has one RoPE for every layer (no `rope_parameters` per attention type): use "
            "RotaryEmbedding.from_hf_config." in error_message(
                lambda: RotaryEmbedding.from_hf_config_per_layer_type({"head_dim": 8, "rope_theta": 5e5})))


def test_constructor_messages_in_full():
    for kwargs, message in [
            ({"head_dim": 1}, "`head_dim` must be >= 2, got head_dim=1."),
            ({"max_length": 0}, "`max_length` must be >= 1, got max_length=0."),
            ({"layout": "pairs"}, "`layout` must be one of ('half', 'interleave'), got layout='pairs'."),
            *(({"partial_rotary_factor": factor},
               f"`partial_rotary_factor` must be in (0, 1], got partial_rotary_factor={factor!r}.")
              for factor in (0, 1.5, True, "1"))]:
        assert message in error_message(lambda kwargs=kwargs: RotaryEmbedding(**kwargs))
    for head_dim, factor in ((4, 0.75), (6, 0.5)):
        assert (f"The rotated width int(head_dim * partial_rotary_factor) = int({head_dim} * {factor}) = 3 "
                "must be even and >= 2." in error_message(
                    lambda head_dim=head_dim, factor=factor: RotaryEmbedding(
                        partial_rotary_factor=factor).rotated_width(head_dim)))
    assert RotaryEmbedding(head_dim=2).rotated_width(2) == 2  # the smallest head: one pair
    assert RotaryEmbedding(partial_rotary_factor=0.5).rotated_width(4) == 2
    assert RotaryEmbedding().supports_masking  # Keras reads it before passing a mask on


def test_input_shape_messages_in_full():
    def shape_message(shape):
        return ("`inputs` must have shape [batch, length, heads, head_dim] or [batch, length, dim] with an "
                f"even, known last dimension, got shape {shape}.")

    ids = np.zeros([1, 2], np.int32)
    for shape in ((1, 2, 5), (2, 4), (1, 1, 2, 2, 4), (1, 2, 3, 7)):
        x = np.zeros(shape, np.float32)
        assert error_message(lambda x=x: RotaryEmbedding()(x)) == shape_message(shape)
        assert error_message(lambda x=x: rotary_embedding(x, ids)) == shape_message(shape)
    for head_dim, shape in ((8, (1, 2, 4)), (4, (1, 2, 3, 8))):
        layer, x = RotaryEmbedding(head_dim=head_dim, name="rope"), np.zeros(shape, np.float32)
        assert error_message(lambda layer=layer, x=x: layer(x)) == (
            f"RotaryEmbedding 'rope' has head_dim={head_dim}, got inputs of shape {shape}.")
    assert RotaryEmbedding(head_dim=8)(np.zeros([1, 2, 3, 8], np.float32)).shape == (1, 2, 3, 8)
    assert error_message(lambda: RotaryEmbedding(name="rope").inverse_frequencies) == (
        "RotaryEmbedding 'rope' does not know its head dimension yet: pass `head_dim` or build it.")
    built = RotaryEmbedding()
    built.build((1, 2, 6))
    assert built.inverse_frequencies.shape == (3,)
    assert RotaryEmbedding(head_dim=8).inverse_frequencies.shape == (4,)
    if not is_tensorflow():
        return
    import tensorflow as tf

    unknown_width = tf.TensorSpec([None, None, None], tf.float32)
    for call in (lambda x: RotaryEmbedding()(x), lambda x: rotary_embedding(x, tf.zeros([1, 2], tf.int32))):
        assert error_message(lambda call=call: tf.function(call, input_signature=[unknown_width])
                             .get_concrete_function()) == shape_message("(None, None, None)")


def test_partial_rotation_passes_the_other_features_through():
    x, ids = _inputs([1, 3, 8]), np.array([[0, 3, 5]])
    out = to_numpy(RotaryEmbedding(partial_rotary_factor=0.5)(x, position_ids=ids))
    np.testing.assert_allclose(out[..., :4], reference_rope(x[..., :4], ids), atol=1e-6)
    np.testing.assert_array_equal(out[..., 4:], x[..., 4:])


def test_scaling_settings_reach_the_frequencies_and_the_config():
    llama3 = {"scaling": "llama3", "scaling_factor": 8.0, "original_length": 64}
    explicit = RotaryEmbedding(**llama3, low_freq_factor=1.0, high_freq_factor=4.0)
    np.testing.assert_array_equal(RotaryEmbedding(**llama3).frequencies(16), explicit.frequencies(16))
    yarn = {"scaling": "yarn", "scaling_factor": 4.0, "original_length": 64, "mscale": 1.0,
            "mscale_all_dim": 0.5}
    config = RotaryEmbedding(**yarn, attention_factor=1.5).get_config()
    assert {key: config[key] for key in ("mscale", "mscale_all_dim", "attention_factor")} == {
        "mscale": 1.0, "mscale_all_dim": 0.5, "attention_factor": 1.5}


@pytest.mark.parametrize("layout", ["half", "interleave"])
@pytest.mark.parametrize("with_ids", [False, True])
def test_rotate_pair_equals_two_calls(layout, with_ids):
    layer = RotaryEmbedding(max_length=16, layout=layout)
    rng = np.random.default_rng(4)
    query, key = (rng.normal(size=(2, 5, 3, 8)).astype("float32") for _ in range(2))
    ids = np.array([[0, 0, 1, 2, 3], [4, 5, 6, 7, 8]], np.int32) if with_ids else None
    pair = layer.rotate_pair(query, key, position_ids=ids)
    for rotated, x in zip(pair, (query, key)):
        np.testing.assert_array_equal(to_numpy(rotated),
                                      to_numpy(layer(x, position_ids=ids)))
    assert np.abs(to_numpy(pair[1]) - key).max() > 0.1  # rotated, not passed through
