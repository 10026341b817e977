"""`RotaryEmbedding.from_hf_config` per model family: the pairs, the RoPE per attention type, the legacy
names, the rotated width and the attention factors, against float64 NumPy formulas written here.

Every expectation below is stated by hand from the family's modeling code in transformers 5.23 (the
layout, the base, the rotated width, the scaling formula, the factor on cos and sin) and computed in
NumPy float64, independently of the package. The same configs were checked against transformers'
own rotary classes by tools/check_rope_against_transformers.py (benchmarks/RESULTS.md); the pinned
`TRANSFORMERS_*` values are that run's float32 output. NumPy inputs and `keras_posenc.backend` only,
so the file also runs on Keras 3 (TF and JAX backends).
"""

import math

import numpy as np
import pytest
from layer_test_helper import to_numpy

from keras_posenc.layers import RotaryEmbedding
from keras_posenc.layers.rope_scaling import (
    HFRopeConfigError,
    check_scaling,
    hf_layer_types,
    hf_rotary_kwargs,
    rotary_attention_factor,
    rotary_frequencies,
)


def _inv(base, dim):
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def _yarn(base, dim, s, original, beta_fast=32.0, beta_slow=1.0, truncate=True):
    """YaRN's blend of f and f / s, the ramp linear in the pair index between the correction dims."""
    def correction(turns):
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction(beta_fast), correction(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / ((high - low) or 0.001), 0, 1)
    f = _inv(base, dim)
    return f / s * ramp + f * (1 - ramp)


def _llama3(base, dim, s, original, low, high):
    f = _inv(base, dim)
    wavelength = 2 * math.pi / f
    out = np.where(wavelength > original / low, f / s, f)
    if high > low:
        smooth = (original / wavelength - low) / (high - low)
        middle = (wavelength >= original / high) & (wavelength <= original / low)
        out = np.where(middle, (1 - smooth) * f / s + smooth * f, out)
    return out


def _mscale(s, m=1.0):
    return 0.1 * m * math.log(s) + 1.0 if s > 1 else 1.0


def _rotate(x, ids, inv, attention, width, layout):
    """float64 RoPE of the first `width` features of `x` [B, T, H, D]; pairs (k, k + w/2) or (2k, 2k+1)."""
    x = np.asarray(x, np.float64)
    angles = np.asarray(ids, np.float64)[..., None] * inv  # [B, T, w/2]
    cos, sin = (fn(angles)[:, :, None] * attention for fn in (np.cos, np.sin))
    part, rest = x[..., :width], x[..., width:]
    if layout == "half":
        a, b = part[..., :width // 2], part[..., width // 2:]
        turned = np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    else:
        a, b = part[..., 0::2], part[..., 1::2]
        turned = np.stack([a * cos - b * sin, b * cos + a * sin], -1).reshape(part.shape)
    return np.concatenate([turned, rest], -1)


PHI3_SHORT = [1.0 + 0.05 * k for k in range(48)]
PHI3_LONG = [1.0 + 1.3 * k for k in range(48)]
_PHI3 = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
         "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_theta": 10000.0}
_DEEPSEEK = {"hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
             "max_position_embeddings": 163840, "rope_theta": 10000}
_YARN40 = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "original_max_position_embeddings": 4096,
           "type": "yarn"}
_GEMMA3_1B = {"model_type": "gemma3_text", "hidden_size": 1152, "num_attention_heads": 4, "head_dim": 256,
              "max_position_embeddings": 32768, "rope_theta": 1000000, "rope_local_base_freq": 10000,
              "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
_GEMMA3_NESTED = {"model_type": "gemma3_text", "head_dim": 256, "max_position_embeddings": 131072,
                  "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "rope_parameters": {
                      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
_MODERNBERT = {"model_type": "modernbert", "hidden_size": 768, "num_attention_heads": 12,
               "max_position_embeddings": 8192, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0}

# name -> (config, layer_type, call length -> (head_dim, rotated width, layout, frequencies, attention))
FAMILIES = {
    "deepseek-v2-lite": (
        {"model_type": "deepseek_v2", **_DEEPSEEK, "hidden_size": 2048, "num_attention_heads": 16,
         "rope_scaling": {**_YARN40, "mscale": 0.707, "mscale_all_dim": 0.707}}, None,
        lambda n: (64, 64, "interleave", _yarn(1e4, 64, 40.0, 4096), 1.0)),
    "deepseek-v3": (
        {"model_type": "deepseek_v3", **_DEEPSEEK, "rope_scaling": {**_YARN40, "mscale": 1.0,
                                                                     "mscale_all_dim": 1.0}}, None,
        lambda n: (64, 64, "interleave", _yarn(1e4, 64, 40.0, 4096), 1.0)),
    "deepseek-v3-flag-off-mscale-ratio": (
        {"model_type": "deepseek_v3", **_DEEPSEEK, "rope_interleave": False,
         "rope_scaling": {**_YARN40, "mscale": 1.0, "mscale_all_dim": 0.707}}, None,
        lambda n: (64, 64, "half", _yarn(1e4, 64, 40.0, 4096), _mscale(40, 1.0) / _mscale(40, 0.707))),
    "deepseek-v3-no-factor": (  # factor null: transformers takes max_position_embeddings / original
        {"model_type": "deepseek_v3", **_DEEPSEEK, "rope_scaling": {
            "type": "yarn", "original_max_position_embeddings": 4096, "factor": None}}, None,
        lambda n: (64, 64, "interleave", _yarn(1e4, 64, 40.0, 4096), _mscale(40.0))),
    "gemma3-legacy-full": (_GEMMA3_1B, "full_attention",
                           lambda n: (256, 256, "half", _inv(1e6, 256) / 8.0, 1.0)),
    "gemma3-legacy-sliding": (_GEMMA3_1B, "sliding_attention",
                              lambda n: (256, 256, "half", _inv(1e4, 256), 1.0)),
    "gemma3-nested-full": (_GEMMA3_NESTED, "full_attention",
                           lambda n: (256, 256, "half", _inv(1e6, 256) / 8.0, 1.0)),
    "gemma3-nested-sliding": (_GEMMA3_NESTED, "sliding_attention",
                              lambda n: (256, 256, "half", _inv(1e4, 256), 1.0)),
    "gemma3-4b-text-config": (  # the hub's sparse text_config: head_dim and bases are the class defaults
        {"model_type": "gemma3", "text_config": {"hidden_size": 2560, "model_type": "gemma3_text",
                                                 "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}},
        "full_attention", lambda n: (256, 256, "half", _inv(1e6, 256) / 8.0, 1.0)),
    "modernbert-global": (_MODERNBERT, "full_attention", lambda n: (64, 64, "half", _inv(160000.0, 64), 1.0)),
    "modernbert-local": (_MODERNBERT, "sliding_attention", lambda n: (64, 64, "half", _inv(1e4, 64), 1.0)),
    "phi3-su": (
        {**_PHI3, "rope_scaling": {"type": "su", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG}}, None,
        lambda n: (96, 96, "half", _inv(1e4, 96) / np.array(PHI3_LONG if n > 4096 else PHI3_SHORT),
                   math.sqrt(1 + math.log(32) / math.log(4096)))),
    "phi3.5-moe-mscale": (
        {**_PHI3, "model_type": "phimoe", "rope_scaling": {
            "type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG,
            "short_mscale": 1.243163121016122, "long_mscale": 1.243163121016122}}, None,
        lambda n: (96, 96, "half", _inv(1e4, 96) / np.array(PHI3_LONG if n > 4096 else PHI3_SHORT),
                   1.243163121016122)),
    "pythia-default-pct": (  # gpt_neox's config class defaults rotary_pct to 0.25
        {"model_type": "gpt_neox", "hidden_size": 768, "num_attention_heads": 12, "rotary_emb_base": 10000},
        None, lambda n: (64, 16, "half", _inv(1e4, 16), 1.0)),
    "phi-2": ({"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
               "partial_rotary_factor": 0.4, "rope_theta": 10000.0}, None,
              lambda n: (80, 32, "half", _inv(1e4, 32), 1.0)),
    "gpt-j": ({"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "rope_theta": 5e5}, None,
              lambda n: (256, 64, "interleave", _inv(1e4, 64), 1.0)),  # GPT-J's base is fixed
    "glm-4": ({"model_type": "glm", "head_dim": 128, "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
              None, lambda n: (128, 64, "interleave", _inv(1e4, 64), 1.0)),
    "command-r": ({"model_type": "cohere", "hidden_size": 8192, "num_attention_heads": 64,
                   "rope_theta": 8000000.0}, None, lambda n: (128, 128, "interleave", _inv(8e6, 128), 1.0)),
    "gpt-oss-truncate-false": (
        {"model_type": "gpt_oss", "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 150000,
         "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                          "truncate": False, "original_max_position_embeddings": 4096}}, None,
        lambda n: (64, 64, "half", _yarn(150000.0, 64, 32.0, 4096, truncate=False), _mscale(32.0))),
    "llama4-equal-bounds": (
        {"model_type": "llama4", "text_config": {
            "model_type": "llama4_text", "head_dim": 128, "rope_theta": 500000.0, "rope_scaling": {
                "factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}}, None,
        lambda n: (128, 128, "interleave", _llama3(5e5, 128, 16.0, 8192, 1.0, 1.0), 1.0)),
    "qwen2.5-yarn-top-level-original": (  # a top-level original_max_position_embeddings wins, as in HF
        {"model_type": "qwen2", "head_dim": 128, "rope_theta": 1e6, "max_position_embeddings": 131072,
         "original_max_position_embeddings": 16384,
         "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, None,
        lambda n: (128, 128, "half", _yarn(1e6, 128, 4.0, 16384), _mscale(4.0))),
    "mistral-dynamic": (
        {"model_type": "mistral", "head_dim": 128, "rope_theta": 1e6, "max_position_embeddings": 4096,
         "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, None,
        lambda n: (128, 128, "half", _inv(1e6 * (2.0 * max(n, 4096) / 4096 - 1.0) ** (128 / 126), 128), 1.0)),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("top", [64, 9000])
def test_family_matches_float64_formulas(name, top):
    config, layer_type, expected = FAMILIES[name]
    layer = RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
    head_dim, width, layout, inv, attention = expected(top)
    assert (layer.head_dim, layer.rotated_width(head_dim), layer.layout) == (head_dim, width, layout)
    np.testing.assert_allclose(layer.frequencies(head_dim, top), inv, rtol=1e-12, atol=0)
    assert layer.attention_factor == pytest.approx(attention, rel=1e-12)
    rng = np.random.default_rng(7)
    ids = np.sort(rng.integers(0, top, [2, 6]), axis=1)
    ids[0, -1] = top - 1  # the call's length is `top`: dynamic and longrope switch on it
    x = rng.standard_normal([2, 6, 2, head_dim]).astype(np.float32)
    got = to_numpy(layer(x, position_ids=ids)).astype(np.float64)
    assert np.max(np.abs(got - _rotate(x, ids, inv, attention, width, layout))) <= 2e-5


# transformers 5.23's float32 inverse frequencies of pairs 0, 10, 20 and 31 (its rotary classes).
TRANSFORMERS_DEEPSEEK_V3 = [1.0, 0.05623412877321243, 0.0007905694073997438, 3.3338035336782923e-06]
TRANSFORMERS_GEMMA3_4B_FULL = [0.125, 0.04247760400176048, 0.014434775337576866, 0.004403368104249239]


@pytest.mark.parametrize("name, layer_type, pinned", [
    ("deepseek-v3", None, TRANSFORMERS_DEEPSEEK_V3),
    ("gemma3-4b-text-config", "full_attention", TRANSFORMERS_GEMMA3_4B_FULL)])
def test_pinned_transformers_values(name, layer_type, pinned):
    layer = RotaryEmbedding.from_hf_config(FAMILIES[name][0], layer_type=layer_type)
    np.testing.assert_allclose(layer.inverse_frequencies[[0, 10, 20, 31]], pinned, rtol=1e-6)


def test_deepseek_layout_changes_the_rotation():
    """The pairs matter: the "half" rotation of a DeepSeek-V3 query differs by O(1) at a far position."""
    config = FAMILIES["deepseek-v3"][0]
    interleaved = RotaryEmbedding.from_hf_config(config)
    half = RotaryEmbedding.from_hf_config(config, layout="half")
    assert (interleaved.layout, half.layout) == ("interleave", "half")
    x = np.random.default_rng(3).standard_normal([1, 1, 1, 64]).astype(np.float32)
    ids = np.array([[3000]])
    gap = to_numpy(interleaved(x, position_ids=ids)) - to_numpy(half(x, position_ids=ids))
    assert np.max(np.abs(gap)) > 0.5


@pytest.mark.parametrize("model_type, extra, layout", [
    (None, {}, "half"), ("llama", {}, "half"), ("qwen3", {}, "half"), ("falcon", {}, "half"),
    ("deepseek_v2", {}, "interleave"), ("deepseek_v3", {}, "interleave"),
    ("deepseek_v3", {"rope_interleave": True}, "interleave"),
    ("deepseek_v3", {"rope_interleave": False}, "half"), ("deepseek_v3", {"rope_interleave": None}, "half"),
    ("glm4_moe_lite", {}, "interleave"), ("gptj", {"rotary_dim": 32}, "interleave"),
    ("cohere", {}, "interleave"), ("helium", {}, "interleave")])
def test_layout_follows_the_family(model_type, extra, layout):
    config = {"head_dim": 64, "qk_rope_head_dim": 64, **extra}
    if model_type is not None:
        config["model_type"] = model_type
    assert hf_rotary_kwargs(config)["layout"] == layout


def test_text_config_without_model_type_takes_the_outer_family():
    config = {"model_type": "gemma3", "text_config": {"head_dim": 256, "rope_scaling": {
        "rope_type": "linear", "factor": 8.0}}}
    assert hf_layer_types(config) == ("full_attention", "sliding_attention")
    assert hf_rotary_kwargs(config, "full_attention")["max_wavelength"] == 1e6  # Gemma 3's default, not 1e4
    with pytest.raises(HFRopeConfigError, match="`model_type`='llava'"):
        hf_rotary_kwargs({"model_type": "llava", "text_config": {"head_dim": 64}})


def test_gptj_default_rotary_dim_is_64():
    assert hf_rotary_kwargs({"model_type": "codegen", "n_embd": 1024, "n_head": 4})[
        "partial_rotary_factor"] == 0.25


def test_su_and_phi3_yarn_are_longrope():
    base = {**_PHI3, "rope_scaling": {"short_factor": PHI3_SHORT, "long_factor": PHI3_LONG}}
    kwargs = [hf_rotary_kwargs({**base, "rope_scaling": {**base["rope_scaling"], "type": kind}})
              for kind in ("longrope", "su", "yarn")]
    assert kwargs[0]["scaling"] == "longrope" and kwargs[0] == kwargs[1] == kwargs[2]
    assert kwargs[0]["scaling_factor"] == 32.0 and kwargs[0]["original_length"] == 4096


def test_one_rotary_per_attention_type():
    for config in (_GEMMA3_1B, _GEMMA3_NESTED, _MODERNBERT):
        assert hf_layer_types(config) == ("full_attention", "sliding_attention")
        rotaries = RotaryEmbedding.from_hf_config_per_layer_type(config, name="rope", max_length=32)
        assert sorted(rotaries) == ["full_attention", "sliding_attention"]
        assert rotaries["sliding_attention"].name == "rope_sliding_attention"
        assert rotaries["full_attention"].max_length == 32
        assert rotaries["full_attention"].max_wavelength != rotaries["sliding_attention"].max_wavelength
    assert hf_layer_types({"head_dim": 64}) == ()
    with pytest.raises(HFRopeConfigError, match="one RoPE for every layer"):
        RotaryEmbedding.from_hf_config_per_layer_type({"head_dim": 64})


def test_flat_config_accepts_a_declared_layer_type():
    config = {"model_type": "gemma2", "head_dim": 256, "rope_theta": 10000.0,
              "layer_types": ["sliding_attention", "full_attention"]}
    assert hf_rotary_kwargs(config, "sliding_attention") == hf_rotary_kwargs(config)
    with pytest.raises(HFRopeConfigError, match="`layer_type`='chunked_attention'"):
        hf_rotary_kwargs(config, "chunked_attention")


@pytest.mark.parametrize("config, layer_type, pattern", [
    (_GEMMA3_NESTED, None, r"one RoPE per attention type \(\['full_attention', 'sliding_attention'\]\): "
                           r"pass `layer_type` \(or use RotaryEmbedding\.from_hf_config_per_layer_type\)\.$"),
    (_GEMMA3_1B, None, "pass `layer_type`"),
    (_GEMMA3_NESTED, "global", r"`layer_type`='global' is not an attention type"),
    ({"head_dim": 64, "layer_types": ["full_attention", "linear_attention"],
      "rope_parameters": {"full_attention": {"rope_type": "default"}, "linear_attention": None}},
     "linear_attention", r"`rope_parameters\['linear_attention'\]` is null"),
    ({"head_dim": 64, "rope_parameters": {"full_attention": {"rope_type": "default"}, "rope_theta": 1e4}},
     None, r"flat key: `rope_parameters\['rope_theta'\]`=10000.0"),
    ({"head_dim": 64, "layer_types": ["full_attention"], "rope_parameters": {"sliding": {}}}, None,
     r"`rope_parameters\['sliding'\]` names no attention type"),
    ({"head_dim": 64, "rope_scaling": {"rope_type": "default", "mrope_section": [16, 24, 24]}}, None,
     r"`rope_scaling\['mrope_section'\]`=\[16, 24, 24\] is a RoPE setting from_hf_config does not know"),
    ({"head_dim": 64, "rope_scaling": {"rope_type": "proportional"}}, None,
     r"`rope_scaling\['rope_type'\]`='proportional' is not supported"),
    ({"model_type": "mistral4", "head_dim": 64}, None,
     r"^`model_type`='mistral4' is not a RoPE family from_hf_config knows, so which features its rotary "
     r"pairs is not known: pass layout='half' \(pairs \(k, k \+ d/2\), rotate_half\) or "
     r"layout='interleave' \(pairs \(2k, 2k \+ 1\)\)\.$"),
    ({"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 2, "alibi": True}, None,
     r"`alibi`=True: this model has ALiBi"),
    ({"head_dim": 64, "position_embedding_type": "absolute"}, None, r"`position_embedding_type`='absolute'"),
    ({"model_type": "deepseek_v3", "qk_rope_head_dim": 64, "rope_interleave": "yes"}, None,
     r"`rope_interleave` must be true, false or null, got 'yes'"),
    ({"model_type": "deepseek_v3", "head_dim": 64}, None, r"no `config\['qk_rope_head_dim'\]`"),
    ({**_PHI3, "model_type": "phimoe", "rope_scaling": {
        "type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG, "short_mscale": 1.1,
        "long_mscale": 1.2}}, None,
     r"`rope_scaling\['short_mscale'\]`=1.1 and `\['long_mscale'\]`=1.2 differ"),
    ({"model_type": "gptj", "n_embd": 64, "n_head": 2, "rotary_dim": None}, None,
     r"`config\['rotary_dim'\]` must be an int in \[2, head_dim=32\], got None"),
    ({"model_type": "gptj", "n_embd": 64, "n_head": 2, "rotary_dim": 33}, None,
     r"`config\['rotary_dim'\]` must be an int in \[2, head_dim=32\], got 33"),
    ({"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": "4"}, "max_position_embeddings": 64},
     None, r"`rope_scaling\['factor'\]` must be a number >= 1, got '4'"),
    ({"head_dim": 64, "rope_scaling": [1, 2]}, None, r"`rope_scaling` must be a dict, got \[1, 2\]"),
    ({"head_dim": 64, "rope_theta": "big"}, None, r"`rope_scaling\['rope_theta'\]` must be a number"),
    ({"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, None,
     r"^The Hugging Face config has no `config\['max_position_embeddings'\]`, which its RoPE needs\.$"),
    *(({"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": bad}}, None,
       rf"^`original_max_position_embeddings` must be an int >= 1, got {bad!r}\.$")
      for bad in (0, True, 4096.0)),
    *(({"head_dim": 64, "rope_scaling": {"rope_type": "llama3", "original_max_position_embeddings": 8192,
                                         "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         **change}}, None, pattern) for change, pattern in (
        ({"factor": None},
         r"^The Hugging Face config has no `rope_scaling\['factor'\]`, which its RoPE needs\.$"),
        ({"factor": 0.5}, r"^`rope_scaling\['factor'\]` must be a number >= 1, got 0\.5\.$"),
        ({"low_freq_factor": "1"}, r"^`rope_scaling\['low_freq_factor'\]` must be a number, got '1'\.$"),
        ({"high_freq_factor": "4"}, r"^`rope_scaling\['high_freq_factor'\]` must be a number, got '4'\.$"))),
    ({"model_type": "deepseek_v3", "qk_rope_head_dim": 1}, None,
     r"^`config\['qk_rope_head_dim'\]` must be a number >= 2, got 1\.$"),
    ({"head_dim": 1}, None, r"^`config\['head_dim'\]` must be a number >= 2, got 1\.$"),
    ({"model_type": 3, "head_dim": 8}, None, r"^`model_type` must be a string, got 3\.$"),
    ({"head_dim": 8, "rope_scaling": {"type": "linear", "factor": 0.5}}, None,
     r"^`rope_scaling\['factor'\]` must be a number >= 1, got 0\.5\.$"),
    ({"head_dim": 8, "rope_scaling": {"type": "dynamic"}}, None,
     r"^The Hugging Face config has no `rope_scaling\['factor'\]`, which its RoPE needs\.$"),
    ({"head_dim": 8, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, None,
     r"^The Hugging Face config has no `config\['max_position_embeddings'\]`, which its RoPE needs\.$"),
    *(({"head_dim": 8, "rope_scaling": {"original_max_position_embeddings": 16, **rope}}, None,
       r"^The Hugging Face config has no `config\['max_position_embeddings'\]`, which its RoPE needs\.$")
      for rope in ({"rope_type": "yarn"},
                   {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4})),
    ({"head_dim": 8, "rope_scaling": {"type": "longrope", "factor": 2.0,
                                      "original_max_position_embeddings": 16, "short_factor": [1.0] * 4,
                                      "long_factor": [1.0] * 4,
                                      "short_mscale": "x", "long_mscale": "x"}}, None,
     r"^`rope_scaling\['short_mscale'\]` must be a number, got 'x'\.$"),
    *(({"head_dim": 8, "rope_scaling": {"type": "longrope", "factor": 2.0,
                                        "original_max_position_embeddings": 16,
                                        "short_factor": [1.0] * 4, **change}}, None, pattern)
      for change, pattern in (
          ({}, r"^The Hugging Face config has no `rope_scaling\['long_factor'\]`, which its RoPE needs\.$"),
          ({"short_factor": [1.0, "a", 1.0, 1.0], "long_factor": [1.0] * 4},
           r"^`rope_scaling\['short_factor'\]` must be a number, got 'a'\.$"))),
    ({"head_dim": 8, "rope_scaling": {"type": "longrope", "factor": 0.5,
                                      "original_max_position_embeddings": 16, "short_factor": [1.0] * 4,
                                      "long_factor": [1.0] * 4}}, None,
     r"^`rope_scaling\['factor'\]` must be a number >= 1, got 0\.5\.$"),
    ({"head_dim": 8, "rope_theta": 0.5}, None,
     r"^`rope_scaling\['rope_theta'\]` must be a number >= 1, got 0\.5\.$"),
    ({"head_dim": 8, "rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": "4",
                                                            "original_max_position_embeddings": 16},
                                         "sliding_attention": {"rope_type": "default"}}}, "full_attention",
     r"^`rope_parameters\['full_attention'\]\['factor'\]` must be a number >= 1, got '4'\.$"),
    ({"head_dim": 8, "rope_scaling": {"type": "su", "bogus": 1}}, None,
     r"^`rope_scaling\['bogus'\]`=1 is a RoPE setting from_hf_config does not know \(rope_type 'longrope' "
     r"reads \['attention_factor', 'factor', 'long_factor', 'long_mscale', "
     r"'original_max_position_embeddings', 'partial_rotary_factor', 'rope_theta', 'rope_type', "
     r"'short_factor', 'short_mscale', 'type'\]\)\.$"),
    ({"head_dim": 64, "rope_parameters": [1, 2]}, None,
     r"^`rope_parameters` must be a dict, got \[1, 2\]\.$"),
    *((config, None, rf"^The Hugging Face config has no `config\['{key}'\]`, which its RoPE needs\.$")
      for config, key in (({"num_attention_heads": 8}, "hidden_size"),
                          ({"hidden_size": 64}, "num_attention_heads"))),
    *(({"head_dim": 64, "partial_rotary_factor": bad}, None,
       rf"^`partial_rotary_factor` must be in \(0, 1\], got {bad}\.$") for bad in (0, 1.5)),
])
def test_what_it_cannot_reproduce_raises_naming_the_key(config, layer_type, pattern):
    with pytest.raises(HFRopeConfigError, match=pattern) as caught:
        RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
    assert isinstance(caught.value, ValueError)


def test_layout_override_and_constructor_arguments():
    layer = RotaryEmbedding.from_hf_config({"model_type": "mistral4", "head_dim": 64}, layout="interleave",
                                           max_length=16, name="q_rope")
    assert (layer.layout, layer.max_length, layer.name) == ("interleave", 16, "q_rope")
    clone = RotaryEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


@pytest.mark.parametrize("read", [hf_rotary_kwargs, hf_layer_types])
def test_a_config_that_is_not_a_dict_names_its_type(read):
    message = r"^`config` must be a dict \(a Hugging Face config\.json\), got list\.$"
    with pytest.raises(TypeError, match=message):
        read([{"head_dim": 64}])


def test_where_the_original_context_length_comes_from():
    """A top-level `original_max_position_embeddings` wins over the RoPE dict's (flat configs only),
    then Phi-3's class default 4096, then `max_position_embeddings`; 1 is a valid length."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    flat = {"head_dim": 8, "original_max_position_embeddings": 8192, "rope_scaling": yarn}
    assert hf_rotary_kwargs(flat)["original_length"] == 8192
    nested = {"head_dim": 8, "original_max_position_embeddings": 8192,
              "rope_parameters": {"full_attention": yarn, "sliding_attention": {"rope_type": "default"}}}
    assert hf_rotary_kwargs(nested, "full_attention")["original_length"] == 2048
    for rope in ({"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0] * 4,
                  "long_factor": [1.0] * 4},
                 {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}):
        per_type = {**nested, "rope_parameters": {**nested["rope_parameters"], "full_attention": {
            **rope, "original_max_position_embeddings": 2048}}}
        assert hf_rotary_kwargs(per_type, "full_attention")["original_length"] == 2048
    phi3 = {"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 8,
            "max_position_embeddings": 32768,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}}
    options = hf_rotary_kwargs(phi3)
    assert (options["original_length"], options["scaling_factor"]) == (4096, 8.0)
    phi3_llama3 = {**phi3, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0}}
    assert hf_rotary_kwargs(phi3_llama3)["original_length"] == 4096
    llama3 = {"model_type": "llama", "head_dim": 8, "max_position_embeddings": 4096, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}}
    assert hf_rotary_kwargs(llama3)["original_length"] == 4096
    one = {"head_dim": 8, "rope_scaling": {**yarn, "original_max_position_embeddings": 1}}
    assert hf_rotary_kwargs(one)["original_length"] == 1


@pytest.mark.parametrize("rope", [
    {"type": "linear"},
    {"type": "longrope", "original_max_position_embeddings": 16, "short_factor": [1.0] * 4,
     "long_factor": [1.0] * 4},
])
def test_a_factor_at_its_minimum_is_accepted(rope):
    options = hf_rotary_kwargs({"head_dim": 8, "rope_scaling": {**rope, "factor": 1.0}})
    assert (options["scaling"], options["scaling_factor"]) == (rope["type"], 1.0)


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.5, 2.0, 40.0])
def test_yarn_attention_factor_without_and_with_extension(factor):
    """transformers' `get_mscale`: 1 for a factor <= 1, else 0.1 ln s + 1."""
    assert rotary_attention_factor("yarn", factor) == pytest.approx(_mscale(factor), rel=1e-15)


SCALINGS = "('linear', 'ntk', 'dynamic', 'yarn', 'yarn-turns', 'longrope', 'llama3')"


@pytest.mark.parametrize("args, kwargs, message", [
    (("xpos",), {}, f"`scaling` must be one of (None, {SCALINGS[1:-1]}), got scaling='xpos'."),
    ((None, 2.0), {}, f"`scaling_factor=2.0` needs a `scaling` (one of {SCALINGS}); with scaling=None it "
                      "must be 1.0."),
    ((None,), {"scaling_factor": 2.0}, f"`scaling_factor=2.0` needs a `scaling` (one of {SCALINGS}); with "
                                       "scaling=None it must be 1.0."),
    (("yarn",), {}, "scaling='yarn' needs `original_length`, the context length the model was trained with."),
    (("yarn",), {"original_length": 0}, "`original_length` must be >= 1, got original_length=0."),
    (("yarn-turns",), {"original_length": 64, "beta_slow": 40.0},
     "`beta_slow` and `beta_fast` must satisfy 0 < beta_slow < beta_fast, got beta_slow=40.0 and "
     "beta_fast=32.0."),
    (("yarn",), {"original_length": 64, "beta_slow": 32.5},  # the default beta_fast is 32
     "`beta_slow` and `beta_fast` must satisfy 0 < beta_slow < beta_fast, got beta_slow=32.5 and "
     "beta_fast=32.0."),
    (("llama3",), {"original_length": 64, "low_freq_factor": 4.5},  # the default high_freq_factor is 4
     "`low_freq_factor` and `high_freq_factor` must satisfy 0 < low_freq_factor <= high_freq_factor, got "
     "low_freq_factor=4.5 and high_freq_factor=4.0."),
    (("yarn",), {"original_length": 64, "beta_slow": 0.0},
     "`beta_slow` and `beta_fast` must satisfy 0 < beta_slow < beta_fast, got beta_slow=0.0 and "
     "beta_fast=32.0."),
    (("yarn",), {"original_length": 64, "beta_slow": 32.0},
     "`beta_slow` and `beta_fast` must satisfy 0 < beta_slow < beta_fast, got beta_slow=32.0 and "
     "beta_fast=32.0."),
    ((None,), {"mscale": "a"}, "`mscale` must be a number or None, got mscale='a'."),
    ((None,), {"mscale_all_dim": "a"}, "`mscale_all_dim` must be a number or None, got mscale_all_dim='a'."),
    ((None,), {"attention_factor": "x"}, "`attention_factor` must be a number > 0 or None, got "
                                         "attention_factor='x'."),
    ((None,), {"attention_factor": 0.0}, "`attention_factor` must be a number > 0 or None, got "
                                         "attention_factor=0.0."),
    (("llama3",), {"original_length": 64, "low_freq_factor": 0.0},
     "`low_freq_factor` and `high_freq_factor` must satisfy 0 < low_freq_factor <= high_freq_factor, got "
     "low_freq_factor=0.0 and high_freq_factor=4.0."),
    (("longrope",), {"original_length": 64, "short_factor": [1.0]},
     "scaling='longrope' needs `long_factor`, one factor per rotated pair."),
    (("longrope",), {"original_length": 64, "short_factor": [float("inf")], "long_factor": [1.0]},
     "`short_factor` must be a list of finite numbers > 0, got short_factor=[inf]."),
    (("longrope",), {"original_length": 64, "short_factor": [1.0], "long_factor": [0.0]},
     "`long_factor` must be a list of finite numbers > 0, got long_factor=[0.0]."),
    (("longrope",), {"original_length": 64, "short_factor": [[1.0, 2.0]], "long_factor": [1.0]},
     "`short_factor` must be a list of finite numbers > 0, got short_factor=[[1.0, 2.0]]."),
])
def test_check_scaling_names_the_argument_and_its_value(args, kwargs, message):
    with pytest.raises(ValueError) as error:
        check_scaling(*args, **kwargs)
    assert str(error.value) == message


def test_check_scaling_defaults_allow_what_their_bounds_allow():
    check_scaling(None)  # a factor of 1 by default
    check_scaling("yarn", original_length=64, beta_fast=1.5)  # the default beta_slow is 1
    check_scaling("llama3", original_length=64, high_freq_factor=1.5)  # the default low_freq_factor is 1
    check_scaling("llama3", original_length=64, low_freq_factor=4.0)  # equal bounds (Llama 4)
    check_scaling(None, attention_factor=0.5)  # any factor > 0, below 1 too


def test_yarn_attention_factor_of_mscale_alone_or_with_mscale_all_dim():
    # transformers: the ratio only when both are set (DeepSeek-V2/V3); either alone is ignored
    assert rotary_attention_factor("yarn", 40.0, mscale=0.707) == _mscale(40.0)
    assert rotary_attention_factor("yarn", 40.0, mscale_all_dim=0.707) == _mscale(40.0)
    assert rotary_attention_factor("yarn", 40.0, mscale=1.0, mscale_all_dim=0.707) == pytest.approx(
        _mscale(40.0, 1.0) / _mscale(40.0, 0.707), rel=1e-15)
    assert rotary_attention_factor("yarn", 40.0, mscale=0.707, mscale_all_dim=0.707) == 1.0


def test_the_attention_factor_defaults_to_no_scaling():
    assert rotary_attention_factor() == 1.0
    assert rotary_attention_factor("yarn") == 1.0  # factor 1: no extension, no temperature
    assert rotary_attention_factor("longrope", original_length=4096) == 1.0


@pytest.mark.parametrize("factor", [1.5, 2.0, 32.0])
def test_longrope_attention_factor_past_a_factor_of_one(factor):
    # Phi-3: sqrt(1 + ln(s) / ln(L)) for any s > 1
    expected = math.sqrt(1.0 + math.log(factor) / math.log(4096))
    got = rotary_attention_factor("longrope", factor, original_length=4096)
    assert got == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("config, partial", [
    ({"model_type": "gptj", "n_embd": 64, "n_head": 2, "rotary_dim": 2}, 2 / 32),  # the smallest width
    ({"model_type": "gptj", "n_embd": 64, "n_head": 2, "rotary_dim": 32}, 1.0),  # the whole head
    ({"head_dim": 64, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}, 0.25),
    ({"head_dim": 64, "partial_rotary_factor": 0.5,  # the RoPE dict's wins over the config's
      "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}, 0.25),
    ({"head_dim": 64, "partial_rotary_factor": 1}, 1.0),
])
def test_rotated_width_at_its_bounds_and_sources(config, partial):
    assert hf_rotary_kwargs(config)["partial_rotary_factor"] == partial


@pytest.mark.parametrize("config", [{"model_type": "deepseek_v3", "qk_rope_head_dim": 2}, {"head_dim": 2}])
def test_the_smallest_head_is_one_pair(config):
    assert hf_rotary_kwargs(config)["head_dim"] == 2


def test_gpt_neox_base_from_rotary_emb_base():
    config = {"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 2, "rotary_emb_base": 1e5}
    options = hf_rotary_kwargs(config)
    assert (options["max_wavelength"], options["partial_rotary_factor"]) == (1e5, 0.25)


@pytest.mark.parametrize("outer, base", [
    ({"head_dim": 8, "rope_scaling": {"type": "linear", "factor": 2.0}}, 10000.0),
    ({"head_dim": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}, 1e5),
    ({"head_dim": 8, "rope_theta": 1e5}, 1e5),
    ({"hidden_size": 64, "num_attention_heads": 8}, 10000.0),
])
def test_a_config_with_rope_keys_of_its_own_is_read_not_its_text_config(outer, base):
    options = hf_rotary_kwargs({**outer, "text_config": {"head_dim": 16, "rope_theta": 3e4}})
    assert (options["head_dim"], options["max_wavelength"]) == (8, base)


@pytest.mark.parametrize("theta, expected", [({}, 10000.0), ({"rope_theta": 5e5}, 5e5)])
def test_nested_rope_parameters_take_the_config_base_or_10000(theta, expected):
    config = {"head_dim": 8, **theta, "rope_parameters": {"full_attention": {"rope_type": "default"},
                                                          "sliding_attention": {"rope_type": "default"}}}
    for layer_type in ("full_attention", "sliding_attention"):
        assert hf_rotary_kwargs(config, layer_type)["max_wavelength"] == expected


def test_gemma3_legacy_base_keys_per_attention_type():
    config = {"model_type": "gemma3_text", "head_dim": 8, "rope_theta": 2e6, "rope_local_base_freq": 5e4}
    assert hf_rotary_kwargs(config, "full_attention")["max_wavelength"] == 2e6
    assert hf_rotary_kwargs(config, "sliding_attention")["max_wavelength"] == 5e4


@pytest.mark.parametrize("embedding", ["rope", "rotary"])
def test_position_embedding_type_naming_rope_is_read(embedding):
    options = hf_rotary_kwargs({"head_dim": 8, "rope_theta": 5e5, "position_embedding_type": embedding})
    assert (options["head_dim"], options["max_wavelength"]) == (8, 5e5)


def test_a_base_just_above_one_is_read():
    assert hf_rotary_kwargs({"head_dim": 8, "rope_theta": 1.5})["max_wavelength"] == 1.5


_BASE = {"max_wavelength": 10000.0, "layout": "half", "partial_rotary_factor": 1.0, "head_dim": 8}


@pytest.mark.parametrize("rope, expected", [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 16,
      "beta_slow": 2, "truncate": False, "mscale": 0.8, "mscale_all_dim": 0.6, "attention_factor": 1.3},
     {"scaling": "yarn", "scaling_factor": 4.0, "original_length": 16, "beta_fast": 16.0, "beta_slow": 2.0,
      "truncate": False, "mscale": 0.8, "mscale_all_dim": 0.6, "attention_factor": 1.3}),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": None},
     {"scaling": "yarn", "scaling_factor": 4.0, "original_length": 16, "beta_fast": 32.0, "beta_slow": 1.0,
      "truncate": True, "mscale": None, "mscale_all_dim": None, "attention_factor": None}),
    ({"type": "longrope", "factor": 2.0, "original_max_position_embeddings": 16, "attention_factor": 1.2,
      "short_factor": [1, 1.5, 2, 3], "long_factor": [2, 3, 4, 5]},
     {"scaling": "longrope", "scaling_factor": 2.0, "original_length": 16, "attention_factor": 1.2,
      "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 4.0, 5.0]}),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16, "low_freq_factor": 2,
      "high_freq_factor": 3},
     {"scaling": "llama3", "scaling_factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 3.0,
      "original_length": 16}),
])
def test_every_rope_setting_is_carried_into_the_options(rope, expected):
    """The whole options dict: a setting dropped or defaulted on the way would show here."""
    assert hf_rotary_kwargs({"head_dim": 8, "rope_scaling": rope}) == {**_BASE, **expected}


def test_longrope_factor_lists_count_the_rotated_pairs_only():
    rope = {"type": "longrope", "factor": 2.0, "original_max_position_embeddings": 16,
            "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 4.0, 5.0]}
    options = hf_rotary_kwargs({"head_dim": 16, "partial_rotary_factor": 0.5, "rope_scaling": rope})
    assert (options["partial_rotary_factor"], options["short_factor"]) == (0.5, [1.0, 1.5, 2.0, 3.0])


def test_rotary_frequencies_defaults():
    """base 10000, factor 1, YaRN's betas 32 and 1, Llama 3.1's bounds 1 and 4, when not given."""
    np.testing.assert_allclose(rotary_frequencies(8), _inv(10000.0, 8), rtol=1e-15)
    np.testing.assert_allclose(rotary_frequencies(8, scaling="linear"), _inv(10000.0, 8), rtol=1e-15)
    yarn = rotary_frequencies(64, scaling="yarn", scaling_factor=4.0, original_length=4096)
    np.testing.assert_allclose(yarn, _yarn(10000.0, 64, 4.0, 4096), rtol=1e-12)
    np.testing.assert_allclose(rotary_frequencies(64, 5e5, scaling="llama3", scaling_factor=8.0,
                                                  original_length=8192),
                               _llama3(5e5, 64, 8.0, 8192, 1.0, 4.0), rtol=1e-12)


def test_rotary_frequencies_of_the_smallest_and_odd_widths():
    np.testing.assert_allclose(rotary_frequencies(2, 100.0), [1.0], rtol=0)
    with pytest.raises(ValueError, match=r"^`dim` must be >= 2, got dim=1\.$"):
        rotary_frequencies(1)
    with pytest.raises(ValueError, match=r"^The rotated dimension must be even, got dim=3\.$"):
        rotary_frequencies(3)


def test_yarn_turns_keeps_the_pairs_past_beta_fast_and_interpolates_those_below_beta_slow():
    # L = 4096: pair 0 turns about 652 times over the context (> 32), pair 7 about 0.2 times (< 1)
    f = _inv(10000.0, 16)
    turns = 4096 * f / (2 * math.pi)
    gamma = np.clip((turns - 1.0) / (32.0 - 1.0), 0.0, 1.0)
    assert gamma[0] == gamma[2] == 1.0 and 0.0 < gamma[3] < 1.0 and gamma[-1] == 0.0
    got = rotary_frequencies(16, scaling="yarn-turns", scaling_factor=4.0, original_length=4096)
    np.testing.assert_allclose(got, (1 - gamma) * f / 4.0 + gamma * f, rtol=1e-13)
    assert got[0] == f[0] and got[-1] == f[-1] / 4.0


@pytest.mark.parametrize("low, high", [(1.0, 1.5), (2.0, 4.0)])
def test_llama3_bounds_other_than_one_and_four(low, high):
    # (1, 1.5): one pair (wavelength about 6686) between L / 1.5 and L, blended over a width of 0.5;
    # (2, 4): the pairs longer than L / 2 (not L * 2) are interpolated
    f = _inv(5e5, 64)
    wavelength = 2 * math.pi / f
    assert ((wavelength >= 8192 / high) & (wavelength <= 8192 / low)).sum() >= 1
    assert ((wavelength > 8192 / low) & (wavelength <= 8192 * low)).sum() >= (low > 1)
    got = rotary_frequencies(64, 5e5, scaling="llama3", scaling_factor=8.0, original_length=8192,
                             low_freq_factor=low, high_freq_factor=high)
    np.testing.assert_allclose(got, _llama3(5e5, 64, 8.0, 8192, low, high), rtol=1e-12)


@pytest.mark.parametrize("scaling", ["ntk", "dynamic"])
def test_the_ntk_scalings_need_two_pairs_the_others_take_one(scaling):
    # the NTK base's exponent dim / (dim - 2) has no value at dim = 2
    with pytest.raises(ValueError) as error:
        rotary_frequencies(2, scaling=scaling, scaling_factor=2.0, original_length=16)
    assert str(error.value) == f"scaling={scaling!r} needs a rotary dimension >= 4, got 2."
    assert rotary_frequencies(4, 100.0, scaling=scaling, scaling_factor=2.0, original_length=16).shape == (2,)
    linear = rotary_frequencies(2, 100.0, scaling="linear", scaling_factor=2.0)
    np.testing.assert_allclose(linear, [0.5], rtol=0)



@pytest.mark.parametrize("options, pattern", [
    ({"scaling": "yarn", "beta_slow": 40.0},
     r"^`beta_slow` and `beta_fast` must satisfy 0 < beta_slow < beta_fast, got beta_slow=40\.0 and "
     r"beta_fast=32\.0\.$"),
    ({"scaling": "llama3", "low_freq_factor": 5.0},
     r"^`low_freq_factor` and `high_freq_factor` must satisfy 0 < low_freq_factor <= high_freq_factor, "
     r"got low_freq_factor=5\.0 and high_freq_factor=4\.0\.$"),
    ({"scaling": "llama3", "high_freq_factor": 0.5},
     r"^`low_freq_factor` and `high_freq_factor` must satisfy 0 < low_freq_factor <= high_freq_factor, "
     r"got low_freq_factor=1\.0 and high_freq_factor=0\.5\.$"),
    ({"scaling": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 4},
     r"^`short_factor` must have one factor per rotated pair \(4\), got 3\.$"),
])
def test_rotary_frequencies_checks_every_scaling_argument(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        rotary_frequencies(8, scaling_factor=2.0, original_length=64, **options)
