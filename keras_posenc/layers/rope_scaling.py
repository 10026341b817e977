"""RoPE frequencies and attention factors of every scaling, and Hugging Face `rope_scaling` configs.

The formulas follow the published papers and, where the papers leave a
choice open, the code that ships the checkpoints (Hugging Face
`transformers`, the YaRN authors' code, llama.cpp): all of them agree on
YaRN's ramp over the *pair index* between the floor and ceiling of the
correction dimensions, which is not the ramp in turns that eq. 18 of the
YaRN paper prints (kept as "yarn-turns").
"""

import math

import numpy as np

from keras_posenc.validation import check_base, check_choice, check_positive_int

__all__ = ["DYNAMIC_SCALINGS", "HF_ROPE_TYPES", "ROTARY_SCALINGS", "HFRopeConfigError", "check_scaling",
           "hf_layer_types", "hf_rotary_kwargs", "rotary_attention_factor", "rotary_frequencies"]

ROTARY_SCALINGS = (None, "linear", "ntk", "dynamic", "yarn", "yarn-turns", "longrope", "llama3")
# Scalings whose frequencies depend on the length of the call (max(position_ids) + 1).
DYNAMIC_SCALINGS = ("dynamic", "longrope")
_NEEDS_ORIGINAL = ("dynamic", "yarn", "yarn-turns", "longrope", "llama3")


def _is_number(value):
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check_scaling(scaling, scaling_factor=1.0, original_length=None, beta_fast=32.0, beta_slow=1.0, *,
                  low_freq_factor=1.0, high_freq_factor=4.0, short_factor=None, long_factor=None,
                  mscale=None, mscale_all_dim=None, attention_factor=None, pairs=None):
    """Raises ValueError naming the argument when a scaling's parameters are missing or out of range.

    `pairs` (the number of rotated pairs, when known) also checks the
    length of LongRoPE's factor lists.
    """
    check_choice("scaling", scaling, ROTARY_SCALINGS)
    if not _is_number(scaling_factor) or scaling_factor < 1.0:
        raise ValueError(f"`scaling_factor` must be a float >= 1, got scaling_factor={scaling_factor!r}.")
    if scaling is None and scaling_factor != 1.0:
        raise ValueError(f"`scaling_factor={scaling_factor!r}` needs a `scaling` (one of "
                         f"{ROTARY_SCALINGS[1:]}); with scaling=None it must be 1.0.")
    if scaling in _NEEDS_ORIGINAL:
        if original_length is None:
            raise ValueError(f"scaling={scaling!r} needs `original_length`, the context length the model "
                             "was trained with.")
        check_positive_int("original_length", original_length)
    if scaling in ("yarn", "yarn-turns") and not (_is_number(beta_slow) and _is_number(beta_fast)
                                                  and 0 < beta_slow < beta_fast):
        raise ValueError(f"`beta_slow` and `beta_fast` must satisfy 0 < beta_slow < beta_fast, got "
                         f"beta_slow={beta_slow!r} and beta_fast={beta_fast!r}.")
    for name, value in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if value is not None and not _is_number(value):
            raise ValueError(f"`{name}` must be a number or None, got {name}={value!r}.")
    if attention_factor is not None and not (_is_number(attention_factor) and attention_factor > 0):
        raise ValueError(f"`attention_factor` must be a number > 0 or None, got "
                         f"attention_factor={attention_factor!r}.")
    if scaling == "llama3" and not (_is_number(low_freq_factor) and _is_number(high_freq_factor)
                                    and 0 < low_freq_factor <= high_freq_factor):
        raise ValueError(f"`low_freq_factor` and `high_freq_factor` must satisfy 0 < low_freq_factor <= "
                         f"high_freq_factor, got low_freq_factor={low_freq_factor!r} and "
                         f"high_freq_factor={high_freq_factor!r}.")
    if scaling == "longrope":
        for name, factors in (("short_factor", short_factor), ("long_factor", long_factor)):
            if factors is None:
                raise ValueError(f"scaling='longrope' needs `{name}`, one factor per rotated pair.")
            values = np.asarray(factors, np.float64)
            if values.ndim != 1 or not np.all(np.isfinite(values)) or not np.all(values > 0):
                raise ValueError(f"`{name}` must be a list of finite numbers > 0, got {name}={factors!r}.")
            if pairs is not None and len(values) != pairs:
                raise ValueError(f"`{name}` must have one factor per rotated pair ({pairs}), got "
                                 f"{len(values)}.")


def _yarn_ramp(frequencies, dim, base, scaling_factor, original_length, beta_fast, beta_slow, truncate):
    """The share of each pair that keeps its own frequency (1) rather than `f / s` (0), by pair index.

    Pair `k` completes `original_length * f_k / (2 pi)` turns over the
    training context; solving `turns = beta` for `k` gives the correction
    dimension `dim * ln(L / (2 pi beta)) / (2 ln base)`. The ramp falls
    linearly in `k` from 1 at the beta_fast dimension to 0 at the beta_slow
    one (floored and ceiled when `truncate`), both clamped to [0, dim - 1].
    """
    def correction_dim(turns):
        return dim * math.log(original_length / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the references' guard against a zero-width ramp
    interpolated = np.clip((np.arange(len(frequencies), dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    return 1.0 - interpolated


def rotary_frequencies(dim, max_wavelength=10000.0, *, scaling=None, scaling_factor=1.0,
                       original_length=None, beta_fast=32.0, beta_slow=1.0, truncate=True,
                       low_freq_factor=1.0, high_freq_factor=4.0, short_factor=None, long_factor=None,
                       length=None):
    """The angular frequency of every rotated pair, float64: pair `k` turns by `p * f_k` at position `p`.

    Unscaled, `f_k = max_wavelength ** (-2k / dim)` (Su et al.). With a
    scaling factor `s` and the training context `L` (`original_length`):

    - "linear" (position interpolation, Chen et al.): `f_k / s`;
    - "ntk" (NTK-aware, bloc97): the base becomes
      `max_wavelength * s ** (dim / (dim - 2))`, which leaves the fastest
      pair as it is and slows the slowest one by exactly `s`;
    - "dynamic" (dynamic NTK, emozilla; Hugging Face's "dynamic"): the NTK
      base with `s' = s * n / L - (s - 1)` for a call of length
      `n = max(length, L)`, so positions inside `L` are not scaled;
    - "yarn" (Peng et al., "NTK-by-parts", as implemented by the YaRN
      authors, Hugging Face and llama.cpp): `(1 - g_k) f_k / s + g_k f_k`
      with a ramp `g_k` linear in the *pair index* `k`: 1 up to the
      dimension where a pair turns `beta_fast` times over `L`, 0 from the
      one where it turns `beta_slow` times (`truncate`: floor and ceiling of
      those dimensions, the references' default);
    - "yarn-turns": the same blend with eq. 18 of the YaRN paper as printed,
      a ramp linear in the number of turns `r_k = L f_k / (2 pi)`,
      `g = clip((r_k - beta_slow) / (beta_fast - beta_slow), 0, 1)`. No
      released checkpoint uses it; it keeps more pairs interpolated;
    - "longrope" (Ding et al., Phi-3): `f_k / short_factor[k]` for calls of
      length up to `L`, `f_k / long_factor[k]` beyond;
    - "llama3" (Llama 3.1): pairs whose wavelength exceeds
      `L / low_freq_factor` get `f_k / s`, those below
      `L / high_freq_factor` keep `f_k`, the ones between are blended by
      `g = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)`.

    Args:
        dim: even int >= 2, the rotated width.
        max_wavelength: float > 1, the base (`rope_theta`).
        scaling: one of `ROTARY_SCALINGS`.
        scaling_factor: float >= 1, the context extension `s`.
        original_length: int, the training context `L` (every scaling but
            "linear" and "ntk").
        beta_fast, beta_slow: YaRN's bounds in turns (32 and 1).
        truncate: YaRN: floor/ceil the correction dimensions (True).
        low_freq_factor, high_freq_factor: llama3's bounds (1 and 4).
        short_factor, long_factor: LongRoPE's per-pair factors.
        length: the length of the call, for "dynamic" and "longrope"
            (None: `original_length`).

    Returns:
        A float64 numpy array `[dim // 2]`.

    Example:

    >>> rotary_frequencies(4).tolist()
    [1.0, 0.01]
    >>> rotary_frequencies(4, scaling="linear", scaling_factor=2.0).tolist()
    [0.5, 0.005]
    >>> rotary_frequencies(4, scaling="ntk", scaling_factor=4.0).tolist()  # base 10000 * 4**2
    [1.0, 0.0025]
    >>> f = rotary_frequencies(8, scaling="yarn", scaling_factor=4.0, original_length=4096)
    >>> (f / rotary_frequencies(8)).tolist()  # ramp from pair 1 (floor 1.31) to 3 (ceil 2.81)
    [1.0, 1.0, 0.625, 0.25]

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864), "RoFormer",
          eq. 15.
        - [Chen et al., 2023](https://arxiv.org/abs/2306.15595), "Extending
          context window of large language models via positional
          interpolation".
        - bloc97, "NTK-Aware Scaled RoPE", 2023,
          https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071), "YaRN:
          Efficient context window extension of large language models",
          section 3.
        - [Ding et al., 2024](https://arxiv.org/abs/2402.13753), "LongRoPE".
        - [Llama Team, 2024](https://arxiv.org/abs/2407.21783), "The Llama 3
          herd of models".
    """
    check_positive_int("dim", dim, minimum=2)
    if dim % 2:
        raise ValueError(f"The rotated dimension must be even, got dim={dim}.")
    check_base(max_wavelength)
    check_scaling(scaling, scaling_factor, original_length, beta_fast, beta_slow,
                  low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
                  short_factor=short_factor, long_factor=long_factor, pairs=dim // 2)
    if scaling in ("ntk", "dynamic") and dim < 4:
        raise ValueError(f"scaling={scaling!r} needs a rotary dimension >= 4, got {dim}.")
    s = float(scaling_factor)
    base = float(max_wavelength)
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    if scaling == "ntk":
        base = base * s ** (dim / (dim - 2))
    if scaling == "dynamic":
        n = max(original_length, int(length) if length is not None else original_length)
        base = base * (s * n / original_length - (s - 1.0)) ** (dim / (dim - 2))
    frequencies = base ** -exponents
    if scaling == "linear":
        return frequencies / s
    if scaling == "yarn":
        keep = _yarn_ramp(frequencies, dim, base, s, original_length, beta_fast, beta_slow, truncate)
        return (1.0 - keep) * frequencies / s + keep * frequencies
    if scaling == "yarn-turns":
        turns = original_length * frequencies / (2 * math.pi)
        keep = np.clip((turns - beta_slow) / (beta_fast - beta_slow), 0.0, 1.0)
        return (1.0 - keep) * frequencies / s + keep * frequencies
    if scaling == "longrope":
        long = length is not None and int(length) > original_length
        return frequencies / np.asarray(long_factor if long else short_factor, np.float64)
    if scaling == "llama3":
        wavelengths = 2 * math.pi / frequencies
        # equal bounds (Llama 4): no pair in between, only the step at L / low_freq_factor
        width = max(high_freq_factor - low_freq_factor, 1e-12)
        blend = np.clip((original_length / wavelengths - low_freq_factor) / width, 0.0, 1.0)
        blended = (1.0 - blend) * frequencies / s + blend * frequencies
        out = np.where(wavelengths > original_length / low_freq_factor, frequencies / s, frequencies)
        between = (wavelengths >= original_length / high_freq_factor) & (
            wavelengths <= original_length / low_freq_factor)
        return np.where(between, blended, out)
    return frequencies


def _mscale(scaling_factor, mscale=1.0):
    return 1.0 if scaling_factor <= 1.0 else 0.1 * mscale * math.log(scaling_factor) + 1.0


def rotary_attention_factor(scaling=None, scaling_factor=1.0, *, mscale=None, mscale_all_dim=None,
                            original_length=None, attention_factor=None):
    """The factor on cos and sin (so on queries and keys) of a scaling; 1.0 for most.

    - "yarn" and "yarn-turns": `0.1 ln(s) + 1` (YaRN's `sqrt(1 / t)`); with
      both `mscale` and `mscale_all_dim` (DeepSeek-V2/V3) the ratio
      `(0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1)`, as in
      Hugging Face (which ignores `mscale` alone);
    - "longrope": `sqrt(1 + ln(s) / ln(original_length))` for `s > 1`;
    - `attention_factor`, when given, overrides both.

    Example:

    >>> round(rotary_attention_factor("yarn", 4.0), 6)
    1.138629
    >>> rotary_attention_factor("yarn", 40.0, mscale=0.707, mscale_all_dim=0.707)
    1.0
    >>> rotary_attention_factor("ntk", 4.0)
    1.0

    References:
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071), section 3.4
          (the attention temperature).
    """
    if attention_factor is not None:
        return float(attention_factor)
    if scaling in ("yarn", "yarn-turns"):
        if mscale and mscale_all_dim:
            return float(_mscale(scaling_factor, mscale) / _mscale(scaling_factor, mscale_all_dim))
        return _mscale(scaling_factor)
    if scaling == "longrope" and scaling_factor > 1.0:
        return math.sqrt(1.0 + math.log(scaling_factor) / math.log(original_length))
    return 1.0


class HFRopeConfigError(ValueError):
    """A Hugging Face `config.json` whose RoPE `from_hf_config` cannot reproduce; names the key."""


# Which features each family's rotary pairs (transformers 5 modeling code): "half" rotates
# (k, k + d/2) (`rotate_half`), "interleave" rotates (2k, 2k + 1) (`rotate_every_two`, complex
# multiplication, `repeat_interleave` of the angles).
_HALF_FAMILIES = frozenset({
    "apertus", "arcee", "bitnet", "dots1", "exaone4", "falcon", "gemma", "gemma2", "gemma3_text", "glm4_moe",
    "gpt_neox", "gpt_oss", "granite", "granitemoe", "hunyuan_v1_dense", "llama", "ministral", "mistral",
    "mixtral", "modernbert", "nemotron", "olmo", "olmo2", "olmoe", "persimmon", "phi", "phi3", "phimoe",
    "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "stablelm", "starcoder2"})
_INTERLEAVED_FAMILIES = frozenset({
    "codegen", "cohere", "cohere2", "deepseek_v2", "ernie4_5", "ernie4_5_moe", "glm", "glm4", "gptj",
    "helium", "llama4_text"})
# Families with a `rope_interleave` flag (default true): interleaved pairs when it is truthy.
_INTERLEAVE_FLAG_FAMILIES = frozenset({"deepseek_v3", "glm4_moe_lite"})
# Multi-head latent attention: only `qk_rope_head_dim` features of a head are rotated.
_LATENT_FAMILIES = frozenset({"deepseek_v2", "deepseek_v3", "glm4_moe_lite"})
# Families whose rotated width is an absolute `rotary_dim` and whose base is fixed at 10000.
_ROTARY_DIM_FAMILIES = frozenset({"codegen", "gptj"})
# Families with one RoPE per attention type: (layer type, legacy base key, default base), and the
# types a flat legacy `rope_scaling` applies to.
_PER_TYPE_FAMILIES = {
    "gemma3_text": ((("full_attention", "rope_theta", 1e6),
                     ("sliding_attention", "rope_local_base_freq", 1e4)), ("full_attention",)),
    "modernbert": ((("full_attention", "global_rope_theta", 160000.0),
                    ("sliding_attention", "local_rope_theta", 1e4)), ("full_attention", "sliding_attention")),
}
_DEFAULT_PARTIAL = {"gpt_neox": 0.25}
# The `model_type` of a multimodal config's `text_config` when it does not say.
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
_DEFAULT_HEAD_DIM = {"gemma": 256, "gemma2": 256, "gemma3_text": 256}
# Phi-3's config class defaults `original_max_position_embeddings` to 4096.
_DEFAULT_ORIGINAL = {"phi3": 4096}

# Hugging Face `rope_type` -> `scaling`; "su" is the name older Phi-3 configs give LongRoPE.
HF_ROPE_TYPES = {"default": None, "linear": "linear", "dynamic": "dynamic", "yarn": "yarn",
                 "longrope": "longrope", "su": "longrope", "llama3": "llama3"}
_ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"},
    "longrope": {"factor", "original_max_position_embeddings", "attention_factor", "short_factor",
                 "long_factor", "short_mscale", "long_mscale"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
}
_COMMON_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
_KNOWN_KEYS = set().union(_COMMON_KEYS, *_ROPE_KEYS.values())


def _fail(message):
    raise HFRopeConfigError(message)


def _field(config, key, where="rope_parameters"):
    if config.get(key) is None:
        _fail(f"The Hugging Face config has no `{where}['{key}']`, which its RoPE needs.")
    return config[key]


def _number(value, key, where="rope_parameters", minimum=None):
    if not _is_number(value) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum:g}"
        _fail(f"`{where}['{key}']` must be a number{bound}, got {value!r}.")
    return float(value)


def _required(rope, key, where, minimum=None):
    return _number(_field(rope, key, where), key, where, minimum)


def _text_config(config):
    """The language model's part of a multimodal config (`text_config`), else the config itself."""
    text = config.get("text_config")
    if isinstance(text, dict) and not any(key in config for key in ("rope_scaling", "rope_parameters",
                                                                    "rope_theta", "num_attention_heads")):
        outer = config.get("model_type")
        return {"model_type": _TEXT_MODEL_TYPES.get(outer, outer), **text}
    return config


def _nested_keys(rope, config):
    """The attention types `rope` is nested under (transformers 5: `{"full_attention": {...}, ...}`)."""
    declared = config.get("layer_types")
    nested = [key for key, value in rope.items()
              if isinstance(value, dict) or (value is None and declared and key in declared)]
    if not nested:
        return []
    for key, value in rope.items():
        if key not in nested:
            _fail(f"`rope_parameters` mixes per-attention-type dicts ({sorted(nested)}) with a flat key: "
                  f"`rope_parameters['{key}']`={value!r}.")
    if declared:
        for key in nested:
            if key not in declared:
                _fail(f"`rope_parameters['{key}']` names no attention type of `layer_types` "
                      f"({sorted(set(declared))}).")
    return nested


def _rope_dicts(config, model_type):
    """{attention type: RoPE dict, or None for a layer without RoPE} when the config has one RoPE per
    attention type, else {None: the one RoPE dict}; `rope_theta` filled in as transformers does."""
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    for key in ("rope_scaling", "rope_parameters"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            _fail(f"`{key}` must be a dict, got {config[key]!r}.")
    rope = dict(rope or {})
    nested = _nested_keys(rope, config)
    theta = config.get("rope_theta", config.get("rotary_emb_base"))
    if model_type in _PER_TYPE_FAMILIES:
        types, scaled = _PER_TYPE_FAMILIES[model_type]
        params = config.get("rope_parameters")
        per_type = {key: dict(value) for key, value in params.items()} if isinstance(params, dict) and \
            _nested_keys(params, config) else {}
        flat = rope if not nested else None  # an older flat `rope_scaling`: the scaled types get it
        for layer_type, base_key, default in types:
            entry = per_type.get(layer_type) or {"rope_type": "default"}
            if flat and layer_type in scaled:
                entry.update(flat)
            entry.setdefault("rope_theta", config.get(base_key, default))
            per_type[layer_type] = entry
        return per_type
    if nested:
        out = {}
        for key in nested:
            out[key] = None if rope[key] is None else dict(rope[key])
            if out[key] is not None:
                out[key].setdefault("rope_theta", theta if theta is not None else 10000.0)
        return out
    rope.setdefault("rope_theta", theta if theta is not None else 10000.0)
    return {None: rope}


def hf_layer_types(config):
    """The attention types of a Hugging Face config that have a RoPE of their own, or () for one RoPE.

    transformers 5 saves `rope_parameters` nested per attention type when
    they differ (Gemma 3: `{"full_attention": {...}, "sliding_attention":
    {...}}`); Gemma 3 and ModernBERT configs in the older layout
    (`rope_local_base_freq`, `global_rope_theta`/`local_rope_theta`) have
    two too. Types whose entry is None (layers without RoPE) are left out.

    Example:

    >>> hf_layer_types({"model_type": "gemma3_text", "head_dim": 256, "rope_theta": 1e6})
    ('full_attention', 'sliding_attention')
    >>> hf_layer_types({"head_dim": 128, "rope_theta": 5e5})
    ()
    """
    if not isinstance(config, dict):
        raise TypeError(f"`config` must be a dict (a Hugging Face config.json), got {type(config).__name__}.")
    config = _text_config(config)
    dicts = _rope_dicts(config, config.get("model_type"))
    return () if None in dicts else tuple(sorted(key for key, value in dicts.items() if value is not None))


def _layout(config, model_type):
    if model_type is None:
        return "half"
    if model_type in _INTERLEAVE_FLAG_FAMILIES:
        flag = config.get("rope_interleave", True)
        if flag is not None and not isinstance(flag, bool):
            _fail(f"`rope_interleave` must be true, false or null, got {flag!r}.")
        return "interleave" if flag else "half"
    if model_type in _INTERLEAVED_FAMILIES:
        return "interleave"
    if model_type in _HALF_FAMILIES:
        return "half"
    _fail(f"`model_type`={model_type!r} is not a RoPE family from_hf_config knows, so which features its "
          "rotary pairs is not known: pass layout='half' (pairs (k, k + d/2), rotate_half) or "
          "layout='interleave' (pairs (2k, 2k + 1)).")


def _head_dim(config, model_type):
    if model_type in _LATENT_FAMILIES or (model_type is None and config.get("qk_rope_head_dim")):
        return int(_number(_field(config, "qk_rope_head_dim", "config"), "qk_rope_head_dim", "config", 2))
    if config.get("head_dim") is not None:
        return int(_number(config["head_dim"], "head_dim", "config", 2))
    if model_type in _DEFAULT_HEAD_DIM:  # the config class's default (Gemma 3's sparse text_config)
        return _DEFAULT_HEAD_DIM[model_type]
    hidden = config.get("hidden_size", config.get("n_embd"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    if hidden is None:
        _field(config, "hidden_size", "config")
    if heads is None:
        _field(config, "num_attention_heads", "config")
    return int(hidden) // int(heads)


def _partial(config, rope, model_type, head_dim):
    if model_type in _ROTARY_DIM_FAMILIES:
        width = config.get("rotary_dim", 64)  # the config classes' default
        if isinstance(width, bool) or not isinstance(width, int) or not 2 <= width <= head_dim:
            _fail(f"`config['rotary_dim']` must be an int in [2, head_dim={head_dim}], got {width!r}.")
        return width / head_dim
    partial = rope.get("partial_rotary_factor")
    for key in ("partial_rotary_factor", "rotary_pct"):
        if partial is None:
            partial = config.get(key)
    if partial is None:
        partial = _DEFAULT_PARTIAL.get(model_type, 1.0)
    if not _is_number(partial) or not 0 < partial <= 1:
        _fail(f"`partial_rotary_factor` must be in (0, 1], got {partial!r}.")
    return float(partial)


def _original(config, rope, nested, model_type):
    """transformers' `original_max_position_embeddings`: a top-level one wins (Phi-3), then the RoPE
    dict's, then `max_position_embeddings`."""
    top = None if nested else config.get("original_max_position_embeddings",
                                         _DEFAULT_ORIGINAL.get(model_type))
    original = top if top is not None else rope.get("original_max_position_embeddings")
    if original is None:
        original = _field(config, "max_position_embeddings", "config")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        _fail(f"`original_max_position_embeddings` must be an int >= 1, got {original!r}.")
    return original


def hf_rotary_kwargs(config, layer_type=None, *, layout=None):
    """`RotaryEmbedding` keyword arguments (and `head_dim`) of a Hugging Face model's `config.json` dict.

    Follows what transformers 5 does with the same dict:

    - the language model's part of a multimodal config (`text_config`);
    - `rope_scaling` (older configs) or `rope_parameters` with
      `rope_type` or its older alias `type`: default, linear, dynamic, yarn,
      longrope (also older Phi-3's "su", and "yarn" on Phi-3), llama3;
    - one RoPE per attention type (`rope_parameters` nested per type, and
      Gemma 3's and ModernBERT's older base keys): pick it with
      `layer_type` (`hf_layer_types` lists them);
    - the base: the RoPE dict's `rope_theta`, the config's `rope_theta`,
      GPT-NeoX's `rotary_emb_base`, the family's default (10000, Gemma 3
      1e6 / 1e4, ModernBERT 160000 / 1e4);
    - the pairs from `model_type`: "half" (Llama, Mistral, Qwen, Phi, Gemma,
      Falcon, GPT-NeoX, ModernBERT, ...) or "interleave" (DeepSeek-V2, GPT-J,
      CodeGen, Cohere, GLM, Llama 4, ...; DeepSeek-V3 by `rope_interleave`,
      default true); "half" without a `model_type`; `layout` overrides;
    - the rotated width: DeepSeek's `qk_rope_head_dim`, else `head_dim`,
      else `hidden_size // num_attention_heads`, times
      `partial_rotary_factor` (the RoPE dict's, the config's, GPT-NeoX's
      `rotary_pct`, default 0.25 there) or GPT-J's `rotary_dim`;
    - the attention factor on cos and sin: YaRN's `attention_factor`, else
      `mscale`/`mscale_all_dim` (DeepSeek), else `0.1 ln s + 1`; LongRoPE's
      `attention_factor`, else `sqrt(1 + ln s / ln L)` (Phi-3.5-MoE's equal
      `short_mscale`/`long_mscale` taken as it). DeepSeek's attention also
      multiplies its softmax scale by `(0.1 mscale_all_dim ln s + 1)^2`;
      that is the attention layer's, not the rotary's. Which layers rotate at
      all (Llama 4's, SmolLM3's and Cohere 2's layers without RoPE) is the
      model's business too.

    Args:
        config: dict, a `config.json`.
        layer_type: str, the attention type (e.g. "sliding_attention") when
            the config has one RoPE per type; optional otherwise.
        layout: optional "half" or "interleave", overriding the family's.

    Raises:
        TypeError: `config` is not a dict.
        HFRopeConfigError (a ValueError): a RoPE this cannot reproduce (an
            unknown rope type, RoPE key or `model_type`, a missing field, a
            factor < 1, no `layer_type` where the config has several RoPEs),
            naming the key and the value.

    Example:

    >>> llama2 = {"hidden_size": 4096, "num_attention_heads": 32,
    ...           "rope_scaling": {"type": "linear", "factor": 2.0}}
    >>> hf_rotary_kwargs(llama2)  # doctest: +NORMALIZE_WHITESPACE
    {'max_wavelength': 10000.0, 'layout': 'half', 'partial_rotary_factor': 1.0, 'head_dim': 128,
     'scaling': 'linear', 'scaling_factor': 2.0}
    >>> hf_rotary_kwargs({"model_type": "deepseek_v2", "qk_rope_head_dim": 64})["layout"]
    'interleave'
    """
    if not isinstance(config, dict):
        raise TypeError(f"`config` must be a dict (a Hugging Face config.json), got {type(config).__name__}.")
    config = _text_config(config)
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        _fail(f"`model_type` must be a string, got {model_type!r}.")
    if config.get("alibi"):
        _fail(f"`alibi`={config['alibi']!r}: this model has ALiBi biases, not RoPE.")
    embedding = config.get("position_embedding_type")
    if embedding not in (None, "rope", "rotary"):
        _fail(f"`position_embedding_type`={embedding!r}: this model has no RoPE.")
    dicts = _rope_dicts(config, model_type)
    nested = None not in dicts
    if nested:
        if layer_type is None:
            _fail(f"The config has one RoPE per attention type ({sorted(dicts)}): pass `layer_type` (or use "
                  "RotaryEmbedding.from_hf_config_per_layer_type).")
        if layer_type not in dicts:
            _fail(f"`layer_type`={layer_type!r} is not an attention type of the config's RoPE "
                  f"({sorted(dicts)}).")
        if dicts[layer_type] is None:
            _fail(f"`rope_parameters['{layer_type}']` is null: layers of type {layer_type!r} have no RoPE.")
        rope = dicts[layer_type]
    else:
        declared = config.get("layer_types")
        if layer_type is not None and declared and layer_type not in declared:
            _fail(f"`layer_type`={layer_type!r} is not in the config's `layer_types` "
                  f"({sorted(set(declared))}).")
        rope = dicts[None]
    where = f"rope_parameters['{layer_type}']" if nested else "rope_scaling"
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if model_type == "phi3" and rope_type == "yarn":
        rope_type = "longrope"  # transformers' Phi-3 reads an older "yarn" as LongRoPE too
    if rope_type not in HF_ROPE_TYPES:
        _fail(f"`{where}['rope_type']`={rope_type!r} is not supported; supported: {sorted(HF_ROPE_TYPES)}.")
    rope_type = "longrope" if rope_type == "su" else rope_type
    for key, value in rope.items():
        if key not in _KNOWN_KEYS:
            _fail(f"`{where}['{key}']`={value!r} is a RoPE setting from_hf_config does not know (rope_type "
                  f"{rope_type!r} reads {sorted(_COMMON_KEYS | _ROPE_KEYS[rope_type])}).")
    head_dim = _head_dim(config, model_type)
    if model_type in _ROTARY_DIM_FAMILIES:
        theta = 10000.0  # GPT-J and CodeGen: a fixed base
    else:
        theta = _number(rope["rope_theta"], "rope_theta", where, 1.0)
    layout = layout if layout is not None else _layout(config, model_type)
    kwargs = {"max_wavelength": theta, "layout": layout,
              "partial_rotary_factor": _partial(config, rope, model_type, head_dim), "head_dim": head_dim}
    scaling = HF_ROPE_TYPES[rope_type]
    if scaling is None:
        return kwargs
    kwargs["scaling"] = scaling
    if scaling in ("linear", "dynamic"):
        kwargs["scaling_factor"] = _required(rope, "factor", where, 1.0)
        if scaling == "dynamic":
            kwargs["original_length"] = int(_field(config, "max_position_embeddings", "config"))
    elif scaling == "yarn":
        original = _original(config, rope, nested, model_type)
        factor = rope.get("factor")
        if factor is None:  # DeepSeek-V3 and others: the ratio of the two lengths
            factor = _field(config, "max_position_embeddings", "config") / original
        kwargs.update(scaling_factor=_number(factor, "factor", where, 1.0), original_length=original,
                      beta_fast=float(rope.get("beta_fast") or 32.0),
                      beta_slow=float(rope.get("beta_slow") or 1.0),
                      truncate=bool(rope.get("truncate", True)), mscale=rope.get("mscale"),
                      mscale_all_dim=rope.get("mscale_all_dim"),
                      attention_factor=rope.get("attention_factor"))
    elif scaling == "longrope":
        original = _original(config, rope, nested, model_type)
        factor = rope.get("factor")
        if factor is None:  # Phi-3: the extension is max_position_embeddings / original
            factor = _field(config, "max_position_embeddings", "config") / original
        attention = rope.get("attention_factor")
        mscales = rope.get("short_mscale"), rope.get("long_mscale")
        if attention is None and mscales != (None, None):
            if mscales[0] != mscales[1]:
                _fail(f"`{where}['short_mscale']`={mscales[0]!r} and `['long_mscale']`={mscales[1]!r} "
                      "differ: an attention factor that switches with the call length is not supported.")
            attention = _number(mscales[0], "short_mscale", where)
        pairs = int(head_dim * kwargs["partial_rotary_factor"]) // 2
        for key in ("short_factor", "long_factor"):
            factors = _field(rope, key, where)
            if not isinstance(factors, (list, tuple)) or len(factors) != pairs:
                _fail(f"`{where}['{key}']` must be a list of one factor per rotated pair ({pairs}), got "
                      f"{factors!r}.")
            kwargs[key] = [_number(v, key, where) for v in factors]
        kwargs.update(scaling_factor=_number(factor, "factor", where, 1.0), original_length=original,
                      attention_factor=attention)
    elif scaling == "llama3":
        kwargs.update(scaling_factor=_required(rope, "factor", where, 1.0),
                      low_freq_factor=_required(rope, "low_freq_factor", where),
                      high_freq_factor=_required(rope, "high_freq_factor", where),
                      original_length=_original(config, rope, nested, model_type))
    return kwargs
