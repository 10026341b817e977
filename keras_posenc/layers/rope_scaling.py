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

__all__ = ["DYNAMIC_SCALINGS", "HF_ROPE_TYPES", "ROTARY_SCALINGS", "check_scaling", "hf_rotary_kwargs",
           "rotary_attention_factor", "rotary_frequencies"]

ROTARY_SCALINGS = (None, "linear", "ntk", "dynamic", "yarn", "yarn-turns", "longrope", "llama3")
# Scalings whose frequencies depend on the length of the call (max(position_ids) + 1).
DYNAMIC_SCALINGS = ("dynamic", "longrope")
# Hugging Face `rope_type` -> `scaling`.
HF_ROPE_TYPES = {"default": None, "linear": "linear", "dynamic": "dynamic", "yarn": "yarn",
                 "longrope": "longrope", "llama3": "llama3"}
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
                                    and 0 < low_freq_factor < high_freq_factor):
        raise ValueError(f"`low_freq_factor` and `high_freq_factor` must satisfy 0 < low_freq_factor < "
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
        blend = (original_length / wavelengths - low_freq_factor) / (high_freq_factor - low_freq_factor)
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


def _field(config, key, where="rope_scaling"):
    if config.get(key) is None:
        raise ValueError(f"The Hugging Face config has no `{where}['{key}']`, which its rope type needs.")
    return config[key]


def _factor(rope, key="factor"):
    factor = _field(rope, key)
    if not _is_number(factor) or factor < 1.0:
        raise ValueError(f"`rope_scaling['{key}']` must be a number >= 1, got {factor!r}.")
    return float(factor)


def hf_rotary_kwargs(config):
    """`RotaryEmbedding` keyword arguments (and `head_dim`) of a Hugging Face model's `config.json` dict.

    Reads `rope_theta` (or GPT-NeoX's `rotary_emb_base`; default 10000),
    `head_dim` (else DeepSeek's `qk_rope_head_dim`, else `hidden_size //
    num_attention_heads`), `partial_rotary_factor` (or GPT-NeoX's
    `rotary_pct`; default 1), `max_position_embeddings`, a top-level
    `original_max_position_embeddings` (Phi-3) and `rope_scaling` (or
    `rope_parameters`, whose `rope_theta` and `partial_rotary_factor` take
    precedence) with `rope_type` or its older alias `type`.

    Raises:
        TypeError: `config` is not a dict.
        ValueError: an unknown rope type, a missing field, or a factor < 1,
            naming the field.

    Example:

    >>> llama2 = {"hidden_size": 4096, "num_attention_heads": 32,
    ...           "rope_scaling": {"type": "linear", "factor": 2.0}}
    >>> hf_rotary_kwargs(llama2)  # doctest: +NORMALIZE_WHITESPACE
    {'max_wavelength': 10000.0, 'layout': 'half', 'partial_rotary_factor': 1.0, 'head_dim': 128,
     'scaling': 'linear', 'scaling_factor': 2.0}
    """
    if not isinstance(config, dict):
        raise TypeError(f"`config` must be a dict (a Hugging Face config.json), got {type(config).__name__}.")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"`rope_scaling` must be a dict, got {rope!r}.")
    theta = rope.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    head_dim = config.get("head_dim") or config.get("qk_rope_head_dim")
    if head_dim is None:
        head_dim = _field(config, "hidden_size", "config") // _field(config, "num_attention_heads", "config")
    partial = config.get("partial_rotary_factor", config.get("rotary_pct", 1.0))
    partial = rope.get("partial_rotary_factor", partial)
    if not _is_number(partial) or not 0 < partial <= 1:
        raise ValueError(f"`partial_rotary_factor` must be in (0, 1], got {partial!r}.")
    kwargs = {"max_wavelength": float(theta), "layout": "half", "partial_rotary_factor": float(partial),
              "head_dim": int(head_dim)}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in HF_ROPE_TYPES:
        raise ValueError(f"`rope_scaling['rope_type']`={rope_type!r} is not supported; supported: "
                         f"{sorted(HF_ROPE_TYPES)}.")
    scaling = HF_ROPE_TYPES[rope_type]
    if scaling is None:
        return kwargs
    kwargs["scaling"] = scaling
    if scaling == "linear":
        kwargs["scaling_factor"] = _factor(rope)
    elif scaling == "dynamic":
        kwargs.update(scaling_factor=_factor(rope),
                      original_length=int(_field(config, "max_position_embeddings", "config")))
    elif scaling == "yarn":
        original = rope.get("original_max_position_embeddings") or _field(
            config, "max_position_embeddings", "config")
        kwargs.update(scaling_factor=_factor(rope), original_length=int(original),
                      beta_fast=float(rope.get("beta_fast") or 32.0),
                      beta_slow=float(rope.get("beta_slow") or 1.0),
                      truncate=bool(rope.get("truncate", True)), mscale=rope.get("mscale"),
                      mscale_all_dim=rope.get("mscale_all_dim"),
                      attention_factor=rope.get("attention_factor"))
    elif scaling == "longrope":
        original = config.get("original_max_position_embeddings")
        original = original or rope.get("original_max_position_embeddings")
        if original is not None:  # Phi-3: the extension is max_position_embeddings / original
            factor = _field(config, "max_position_embeddings", "config") / original
            if factor < 1.0:
                raise ValueError(f"`max_position_embeddings / original_max_position_embeddings` must be "
                                 f">= 1 for longrope, got {factor!r}.")
        else:
            original = _field(config, "max_position_embeddings", "config")
            factor = _factor(rope) if rope.get("factor") is not None else 1.0
        kwargs.update(scaling_factor=float(factor), original_length=int(original),
                      short_factor=[float(v) for v in _field(rope, "short_factor")],
                      long_factor=[float(v) for v in _field(rope, "long_factor")],
                      attention_factor=rope.get("attention_factor"))
    elif scaling == "llama3":
        kwargs.update(scaling_factor=_factor(rope), low_freq_factor=float(_field(rope, "low_freq_factor")),
                      high_freq_factor=float(_field(rope, "high_freq_factor")),
                      original_length=int(_field(rope, "original_max_position_embeddings")))
    return kwargs
