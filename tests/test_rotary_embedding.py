"""RotaryEmbedding against independent float64 numpy RoPE (both layouts, every scaling), its properties."""

import math

import numpy as np
import pytest
from layer_test_helper import run_layer_test, to_numpy

from keras_posenc.backend import is_tensorflow
from keras_posenc.layers import RotaryEmbedding
from keras_posenc.layers.rotary_embedding import rotary_embedding

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
