"""`RotaryEmbedding.from_hf_config` against float64 references of Hugging Face's published RoPE formulas.

Seven published configurations (LLaMA-2 linear, LLaMA-3.1 llama3, Qwen2.5 YaRN, DeepSeek-V2 YaRN with
mscale, Phi-3 LongRoPE, dynamic NTK, GPT-NeoX partial rotary): inverse frequencies to rtol 1e-6, the
attention factor, and rotated unit-normal queries at positions inside and up to twice the context.
The references below are written per pair with `math`, from the formulas of `transformers`'
`modeling_rope_utils` (and the YaRN, LongRoPE and Llama 3 papers), independently of the package.
Only numpy inputs and `keras_posenc.backend`, so the file also runs on `KERAS_BACKEND=jax`.
"""

import math

import numpy as np
import pytest
from layer_test_helper import to_numpy

from keras_posenc import Encoder
from keras_posenc.backend import is_tensorflow
from keras_posenc.layers import RotaryEmbedding
from keras_posenc.layers.rope_scaling import hf_rotary_kwargs, rotary_frequencies


def _ramp_keep(i, dim, base, original, beta_fast, beta_slow, truncate=True):
    """YaRN: 1 - clamp((i - low) / (high - low)), low/high: the dims turning beta_fast/beta_slow times."""
    low = dim * math.log(original / (beta_fast * 2 * math.pi)) / (2 * math.log(base))
    high = dim * math.log(original / (beta_slow * 2 * math.pi)) / (2 * math.log(base))
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    width = high - low if high != low else 0.001
    return 1.0 - min(1.0, max(0.0, (i - low) / width))


def reference(config, length):
    """(inverse frequencies [rotary_dim // 2], attention factor, rotary_dim) for a call of `length`."""
    rope = config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    base = config.get("rope_theta", config.get("rotary_emb_base", 10000.0))
    head_dim = config.get("head_dim") or config.get("qk_rope_head_dim") or (
        config["hidden_size"] // config["num_attention_heads"])
    dim = int(head_dim * config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)))
    max_positions = config.get("max_position_embeddings")
    factor = rope.get("factor", 1.0)
    attention = 1.0
    if kind == "dynamic":
        n = max(length, max_positions)
        base = base * ((factor * n / max_positions) - (factor - 1)) ** (dim / (dim - 2))
    inv = [1.0 / base ** (2 * i / dim) for i in range(dim // 2)]
    if kind == "linear":
        inv = [f / factor for f in inv]
    elif kind == "yarn":
        original = rope.get("original_max_position_embeddings") or max_positions
        betas = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1
        truncate = rope.get("truncate", True)
        keeps = [_ramp_keep(i, dim, base, original, *betas, truncate) for i in range(len(inv))]
        inv = [f / factor * (1 - keep) + f * keep for f, keep in zip(inv, keeps)]

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if rope.get("attention_factor") is not None:
            attention = rope["attention_factor"]
        elif rope.get("mscale") and rope.get("mscale_all_dim"):
            attention = mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"])
        else:
            attention = mscale(factor)
    elif kind == "longrope":
        original = config["original_max_position_embeddings"]
        scale = max_positions / original
        attention = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        chosen = rope["long_factor"] if length > original else rope["short_factor"]
        inv = [f / e for f, e in zip(inv, chosen)]
    elif kind == "llama3":
        original = rope["original_max_position_embeddings"]
        low_wavelength = original / rope["low_freq_factor"]
        high_wavelength = original / rope["high_freq_factor"]
        scaled = []
        for f in inv:
            wavelength = 2 * math.pi / f
            if wavelength < high_wavelength:
                scaled.append(f)
            elif wavelength > low_wavelength:
                scaled.append(f / factor)
            else:
                smooth = (original / wavelength - rope["low_freq_factor"]) / (
                    rope["high_freq_factor"] - rope["low_freq_factor"])
                scaled.append((1 - smooth) * f / factor + smooth * f)
        inv = scaled
    return np.array(inv, np.float64), attention, dim


def reference_rotate(x, ids, inv, attention, dim):
    """HF's apply_rotary_pos_emb on the first `dim` features: x * cos + rotate_half(x) * sin, float64."""
    x = np.asarray(x, np.float64)
    angles = np.asarray(ids, np.float64)[..., None] * inv  # [B, T, dim // 2]
    cos = np.concatenate([np.cos(angles)] * 2, -1)[:, :, None] * attention
    sin = np.concatenate([np.sin(angles)] * 2, -1)[:, :, None] * attention
    rotated, passed = x[..., :dim], x[..., dim:]
    half = dim // 2
    turned = np.concatenate([-rotated[..., half:], rotated[..., :half]], -1)
    return np.concatenate([rotated * cos + turned * sin, passed], -1)


def _phi3_factors(pairs, top):
    """Monotone per-pair factors with the shape of Phi-3's lists (1 for the fastest pairs, rising)."""
    return [float(v) for v in 1.0 + (top - 1.0) * np.linspace(0.0, 1.0, pairs) ** 2]


# name -> (config.json fields, the context length the positions are measured against)
CONFIGS = {
    "llama2-linear": ({"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
                       "rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}, 4096),
    "llama3.1": ({"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
                  "rope_theta": 500000.0, "rope_scaling": {
                      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"}}, 8192),
    "qwen2.5-yarn": ({"hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768,
                      "rope_theta": 1000000.0, "rope_scaling": {
                          "factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}, 32768),
    "deepseek-v2-yarn": ({"hidden_size": 5120, "num_attention_heads": 128, "qk_rope_head_dim": 64,
                          "max_position_embeddings": 163840, "rope_theta": 10000, "rope_scaling": {
                              "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                              "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                              "type": "yarn"}}, 4096),
    "deepseek-mscale-ratio": ({"head_dim": 64, "max_position_embeddings": 163840, "rope_theta": 10000,
                               "rope_scaling": {"factor": 40, "mscale": 1.0, "mscale_all_dim": 0.707,
                                                "original_max_position_embeddings": 4096,
                                                "rope_type": "yarn"}}, 4096),
    "phi3-longrope": ({"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
                       "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": {
                           "type": "longrope", "short_factor": _phi3_factors(48, 1.2),
                           "long_factor": _phi3_factors(48, 60.0)}}, 4096),
    "llama2-dynamic": ({"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
                        "rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, 4096),
    "gpt-neox-partial": ({"hidden_size": 6144, "num_attention_heads": 64, "max_position_embeddings": 2048,
                          "rotary_pct": 0.25, "rotary_emb_base": 10000}, 2048),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_inverse_frequencies_and_attention_factor(name):
    config, _ = CONFIGS[name]
    layer = RotaryEmbedding.from_hf_config(config)
    inv, attention, dim = reference(config, 1)
    assert layer.inverse_frequencies.dtype == np.float64 and layer.inverse_frequencies.shape == (dim // 2,)
    np.testing.assert_allclose(layer.inverse_frequencies, inv, rtol=1e-6, atol=0)
    assert layer.attention_factor == pytest.approx(attention, rel=1e-12)


def test_published_figures():
    """Values worked out by hand from the configs, so the references above are pinned too."""
    qwen = RotaryEmbedding.from_hf_config(CONFIGS["qwen2.5-yarn"][0])
    assert qwen.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)  # 1.1386
    default = 1e6 ** (-np.arange(0, 128, 2) / 128)
    ratio = qwen.inverse_frequencies / default
    # pairs turning >= 32 times over 32768 (index <= floor(19.4) = 19) keep theirs; <= 1 turn (>= 41): / 4
    assert np.all(ratio[:20] == 1.0) and np.allclose(ratio[41:], 0.25) and 0.25 < ratio[30] < 1.0
    assert RotaryEmbedding.from_hf_config(CONFIGS["deepseek-v2-yarn"][0]).attention_factor == 1.0
    phi3 = RotaryEmbedding.from_hf_config(CONFIGS["phi3-longrope"][0])
    assert phi3.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    neox = RotaryEmbedding.from_hf_config(CONFIGS["gpt-neox-partial"][0])
    assert neox.inverse_frequencies.shape == (12,)  # 96 * 0.25 = 24 rotated features


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("reach", ["inside", "twice"])
def test_outputs_equal_reference(name, reach):
    config, context = CONFIGS[name]
    layer = RotaryEmbedding.from_hf_config(config)
    head_dim = layer.head_dim
    rng = np.random.default_rng(0)
    top = context if reach == "inside" else 2 * context
    ids = np.sort(rng.integers(0, top, size=[2, 8]), axis=1)
    ids[0, -1] = top - 1  # the call's length is exactly `top`: inside, or twice the context
    x = rng.standard_normal([2, 8, 2, head_dim]).astype(np.float32)
    got = to_numpy(layer(x, position_ids=ids)).astype(np.float64)
    expected = reference_rotate(x, ids, *reference(config, int(ids.max()) + 1))
    assert np.max(np.abs(got - expected)) <= 2e-4
    dim = reference(config, 1)[2]
    np.testing.assert_array_equal(got[..., dim:], x[..., dim:])  # the unrotated features pass through


@pytest.mark.parametrize("name", ["llama2-dynamic", "phi3-longrope"])
def test_call_length_switches_frequencies(name):
    """dynamic and longrope: the same position gets other angles in a longer call (HF's max(ids) + 1)."""
    config, context = CONFIGS[name]
    layer = RotaryEmbedding.from_hf_config(config)
    x = np.random.default_rng(1).standard_normal([1, 2, 1, layer.head_dim]).astype(np.float32)
    short = to_numpy(layer(x, position_ids=np.array([[10, context - 1]])))
    long = to_numpy(layer(x, position_ids=np.array([[10, 2 * context - 1]])))
    assert np.max(np.abs(short[0, 0] - long[0, 0])) > 1e-3
    for ids, out in (([[10, context - 1]], short), ([[10, 2 * context - 1]], long)):
        expected = reference_rotate(x, np.array(ids), *reference(config, int(np.max(ids)) + 1))
        assert np.max(np.abs(out - expected)) <= 2e-4


@pytest.mark.parametrize("max_length", [None, 48])
@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_switching_in_every_path(rope_type, max_length):
    """Tiny configs: plain 0..T-1 calls (one broadcast table), a traced graph, and the frozen length."""
    if rope_type == "dynamic":
        config = {"head_dim": 8, "max_position_embeddings": 16,
                  "rope_scaling": {"rope_type": "dynamic", "factor": 3.0}}
    else:
        config = {"head_dim": 8, "max_position_embeddings": 64, "original_max_position_embeddings": 16,
                  "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
                                   "long_factor": [1.0, 4.0, 9.0, 16.0]}}
    layer = RotaryEmbedding.from_hf_config(config, max_length=max_length)
    x = np.random.default_rng(2).standard_normal([2, 40, 2, 8]).astype(np.float32)
    for length in (12, 40):
        expected = reference_rotate(x[:, :length], np.arange(length)[None], *reference(config, length))
        assert np.max(np.abs(to_numpy(layer(x[:, :length])) - expected)) <= 2e-5
    ids = np.array([[0, 1, 2, 3], [5, 9, 30, 39]], np.int32)
    if is_tensorflow():  # a traced graph: the length is a tensor, frequencies switch inside the graph
        import tensorflow as tf

        traced = tf.function(lambda v, i: layer(v, position_ids=i))
    else:
        import jax

        traced = jax.jit(lambda v, i: layer(v, position_ids=i))
    got = to_numpy(traced(x[:, :4], ids))
    assert np.max(np.abs(got - reference_rotate(x[:, :4], ids, *reference(config, 40)))) <= 2e-5
    layer.freeze(40)  # an exporter: the tables of the exported length, whatever the call
    expected = reference_rotate(x[:, :12], np.arange(12)[None], *reference(config, 40))
    assert np.max(np.abs(to_numpy(layer(x[:, :12])) - expected)) <= 2e-5


@pytest.mark.parametrize("config, field", [
    ({"head_dim": 64, "rope_scaling": {"rope_type": "mrope"}}, "rope_type"),
    ({"head_dim": 64, "rope_scaling": {"type": "linear"}}, "factor"),
    ({"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 0.5}}, "factor"),
    ({"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "max_position_embeddings"),
    ({"head_dim": 64, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "original_max_position_embeddings": 8192}}, "high_freq_factor"),
    ({"head_dim": 64, "max_position_embeddings": 64,
      "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 32}}, "long_factor"),
    ({"hidden_size": 64, "rope_scaling": None}, "num_attention_heads"),
])
def test_bad_configs_name_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        RotaryEmbedding.from_hf_config(config)


def test_longrope_factor_count_is_checked():
    """From a config as soon as the head is known; from the constructor when the layer is built."""
    with pytest.raises(ValueError, match=r"short_factor.*one factor per rotated pair \(4\)"):
        RotaryEmbedding.from_hf_config({"head_dim": 8, "max_position_embeddings": 32, "rope_scaling": {
            "rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 4}})
    layer = RotaryEmbedding(scaling="longrope", original_length=32, short_factor=[1.0] * 3,
                            long_factor=[1.0] * 3)
    with pytest.raises(ValueError, match="short_factor"):
        layer(np.zeros([1, 2, 1, 8], np.float32))


def test_config_round_trip_keeps_every_setting():
    layer = RotaryEmbedding.from_hf_config(CONFIGS["phi3-longrope"][0], max_length=64, name="phi3")
    clone = RotaryEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    np.testing.assert_array_equal(clone.inverse_frequencies, layer.inverse_frequencies)
    assert clone.attention_factor == layer.attention_factor
    x = np.random.default_rng(3).standard_normal([1, 5, 1, 96]).astype(np.float32)
    np.testing.assert_array_equal(to_numpy(clone(x)), to_numpy(layer(x)))


def test_encoder_takes_the_options_of_a_hf_config():
    yarn = {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5,
            "original_max_position_embeddings": 16}
    options = hf_rotary_kwargs({"head_dim": 8, "max_position_embeddings": 64, "partial_rotary_factor": 0.5,
                                "rope_scaling": yarn})
    encoder = Encoder(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=30, max_length=12,
                      position="rope", position_config=options, dropout=0.0)
    ids = np.array([[5, 6, 7, 8, 9]])
    out = to_numpy(encoder(ids))
    rotary = encoder.encoder_layers[0].rotary
    assert rotary.rotary_dim == 4 and rotary.max_length == 12
    assert rotary.attention_factor == pytest.approx((0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1))
    clone = Encoder.from_config(encoder.get_config())
    clone(ids)
    clone.set_weights(encoder.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(ids)), out)


@pytest.mark.parametrize("base, original, beta_fast", [
    (100.0, 100000, 2000.0),  # the beta_slow dimension (8.4) is past dim - 1: the ramp ends at 7
    (10000.0, 4, 32.0),       # both dimensions clamp to 0: the references' 0.001-wide ramp
    (100.0, 988000, 32.0),    # floor(7.38) == dim - 1 == the clamped end: the 0.001-wide ramp there
])
def test_yarn_ramp_at_its_clamps(base, original, beta_fast):
    dim, factor = 8, 4.0
    inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    keep = np.array([_ramp_keep(i, dim, base, original, beta_fast, 1.0) for i in range(dim // 2)])
    got = rotary_frequencies(dim, base, scaling="yarn", scaling_factor=factor, original_length=original,
                             beta_fast=beta_fast, beta_slow=1.0)
    np.testing.assert_allclose(got, inv / factor * (1 - keep) + inv * keep, rtol=1e-12, atol=0)
