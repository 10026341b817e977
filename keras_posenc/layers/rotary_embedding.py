"""RotaryEmbedding: rotary position embedding (RoPE) of queries and keys, with RoPE scalings."""

import numpy as np

from keras_posenc.backend import dtype_name, is_tensorflow, is_tracer, keras, ops, static_call
from keras_posenc.layers._shape_preserving import ShapePreserving, input_shape_of
from keras_posenc.layers.rope_scaling import (
    DYNAMIC_SCALINGS,
    ROTARY_SCALINGS,
    HFRopeConfigError,
    check_scaling,
    hf_layer_types,
    hf_rotary_kwargs,
    rotary_attention_factor,
    rotary_frequencies,
)
from keras_posenc.positions import position_ids as derive_position_ids
from keras_posenc.validation import check, check_base, check_choice, check_positive_int, with_checks

__all__ = ["ROTARY_LAYOUTS", "ROTARY_SCALINGS", "RotaryEmbedding", "apply_rotary", "rotary_attention_factor",
           "rotary_cos_sin", "rotary_frequencies", "rotary_embedding"]

ROTARY_LAYOUTS = ("half", "interleave")


def rotary_cos_sin(position_ids, frequencies):
    """float32 cos and sin `[..., dim // 2]` of `position_ids * frequencies`, angles in float64.

    The angles are computed in float64: by TensorFlow, or by NumPy for NumPy
    inputs and concrete tensors of other backends. A float32 angle is already
    off by ~5e-4 at position 8192; only ids traced by a JAX `jit` (a model
    compiled on JAX without `max_length`) get float32 angles.

    Args:
        position_ids: int array or tensor, any shape.
        frequencies: float64 array `[dim // 2]` (`rotary_frequencies`).

    Returns:
        A pair of float32 tensors (NumPy arrays for NumPy inputs).

    Example:

    >>> cos, sin = rotary_cos_sin(np.array([0, 1]), np.array([1.0, 0.5]))
    >>> cos.dtype, cos.astype(np.float64).round(4).tolist(), sin.astype(np.float64).round(4).tolist()
    (dtype('float32'), [[1.0, 1.0], [0.5403, 0.8776]], [[0.0, 0.0], [0.8415, 0.4794]])
    """
    frequencies = np.asarray(frequencies, np.float64)
    if isinstance(position_ids, (np.ndarray, list, tuple, int)):
        angles = np.asarray(position_ids, np.float64)[..., None] * frequencies
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    if is_tensorflow():
        angles = ops.cast(position_ids, "float64")[..., None] * ops.convert_to_tensor(frequencies)
        return ops.cast(ops.cos(angles), "float32"), ops.cast(ops.sin(angles), "float32")
    if not is_tracer(position_ids):
        cos, sin = rotary_cos_sin(ops.convert_to_numpy(position_ids), frequencies)
        return ops.convert_to_tensor(cos), ops.convert_to_tensor(sin)
    frequencies = ops.convert_to_tensor(frequencies.astype(np.float32))
    angles = ops.cast(position_ids, "float32")[..., None] * frequencies
    return ops.cos(angles), ops.sin(angles)


def _concrete(tensor):
    """The values of `tensor` as NumPy when they are known now (eager), else None (a traced graph)."""
    if is_tensorflow():
        import tensorflow as tf

        return tensor.numpy() if tf.executing_eagerly() and hasattr(tensor, "numpy") else None
    return None if is_tracer(tensor) else ops.convert_to_numpy(tensor)


def _traced_cos_sin(ids, frequencies):
    """cos and sin of `ids * frequencies` for a frequency tensor (float64 on TensorFlow)."""
    dtype = "float64" if is_tensorflow() else "float32"
    angles = ops.cast(ids, dtype)[..., None] * ops.cast(frequencies, dtype)
    return ops.cast(ops.cos(angles), "float32"), ops.cast(ops.sin(angles), "float32")


def apply_rotary(x, cos, sin, layout="half"):
    """Rotates every pair of features of `x` by the angles whose cos and sin are given.

    Layouts, for `dim` features and `h = dim // 2` pairs:

    - "half" (GPT-NeoX, keras-hub, Hugging Face LLaMA): pair `k` is
      features `(k, k + h)`;
    - "interleave" (RoFormer, GPT-J): pair `k` is features `(2k, 2k + 1)`.

    A pair `(a, b)` becomes `(a cos - b sin, b cos + a sin)`.

    Args:
        x: float tensor `[..., dim]`.
        cos, sin: float tensors broadcastable to `[..., dim // 2]`.
        layout: "half" or "interleave".

    Returns:
        A tensor like `x`.

    Example:

    >>> x = ops.convert_to_tensor([[1.0, 0.0, 0.0, 1.0]])
    >>> c = ops.convert_to_tensor([[0.0, 1.0]]); s = ops.convert_to_tensor([[1.0, 0.0]])
    >>> ops.convert_to_numpy(apply_rotary(x, c, s, "half")).tolist()  # pair 0 turns by 90 degrees
    [[0.0, 0.0, 1.0, 1.0]]
    >>> ops.convert_to_numpy(apply_rotary(x, c, s, "interleave")).tolist()
    [[0.0, 1.0, 0.0, 1.0]]

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864), section 3.4.2
          (the interleaved pairs).
        - [Black et al., 2022](https://arxiv.org/abs/2204.06745), GPT-NeoX-20B
          (the half-split pairs).
    """
    check_choice("layout", layout, ROTARY_LAYOUTS)
    dim = x.shape[-1]
    half = dim // 2
    shape = ops.shape(x)
    if layout == "half":
        first, second = x[..., :half], x[..., half:]
        # stack + reshape rather than concatenate: XLA fuses it into one loop (1.5-2x faster on JAX).
        rotated = ops.stack([first * cos - second * sin, second * cos + first * sin], axis=-2)
        return ops.reshape(rotated, shape)
    pairs = ops.reshape(x, tuple(shape[:-1]) + (half, 2))
    first, second = pairs[..., 0], pairs[..., 1]
    rotated = ops.stack([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return ops.reshape(rotated, shape)


def _as_ids(position_ids):
    ids = ops.convert_to_tensor(position_ids)
    dtype = dtype_name(ids)
    if "int" not in dtype:
        raise TypeError(f"`position_ids` must be an integer tensor, got dtype {dtype}.")
    if len(ids.shape) not in (1, 2):
        raise ValueError(f"`position_ids` must have shape [batch, length] or [length], "
                         f"got shape {ids.shape}.")
    ids = ops.cast(ids, "int32")
    return ids[None] if len(ids.shape) == 1 else ids


def _rotate_half_tf(x, cos, sin):
    """TensorFlow, "half" layout: `x * [cos, cos] + swap_halves(x) * [-sin, sin]`, the halves swapped
    by one REVERSE of `[..., 2, dim / 2]`: four passes over `x` where slicing takes six (TensorFlow
    runs every op on its own, unfused)."""
    import tensorflow as tf

    join = np.concatenate if isinstance(cos, np.ndarray) else tf.concat
    full_cos, full_sin = join([cos, cos], axis=-1), join([-sin, sin], axis=-1)
    shape = tf.shape(x)
    pairs = tf.reshape(x, tf.concat([shape[:-1], [2, x.shape[-1] // 2]], axis=0))
    return x * full_cos + tf.reshape(tf.reverse(pairs, axis=[-2]), shape) * full_sin


def _rotate(inputs, cos, sin, layout, rotary_dim, portable=False):
    """Rotation in float32 of the first `rotary_dim` features (cos/sin stay float32 under mixed
    precision, the attention factor already in them), the rest passed through; cast back.

    `portable`: only ops that every export converter maps (no REVERSE)."""
    if len(inputs.shape) == 4:  # [batch, length, heads, head_dim]
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x = ops.cast(inputs, "float32")
    part = x if rotary_dim == x.shape[-1] else x[..., :rotary_dim]
    if layout == "half" and is_tensorflow() and not portable:
        rotated = _rotate_half_tf(part, cos, sin)
    else:
        rotated = apply_rotary(part, ops.convert_to_tensor(cos), ops.convert_to_tensor(sin), layout)
    if rotary_dim < x.shape[-1]:
        rotated = ops.concatenate([rotated, x[..., rotary_dim:]], axis=-1)
    return ops.cast(rotated, inputs.dtype)


def _check_rank(inputs):
    if len(inputs.shape) not in (3, 4) or inputs.shape[-1] is None or inputs.shape[-1] % 2:
        raise ValueError("`inputs` must have shape [batch, length, heads, head_dim] or [batch, length, dim] "
                         f"with an even, known last dimension, got shape {inputs.shape}.")


def _is_zero(offset):
    return offset is None or (isinstance(offset, int) and offset == 0)


def rotary_embedding(inputs, position_ids, *, max_wavelength=10000.0, layout="half", **options):
    """RoPE as a plain function: `inputs` rotated by the angles of `position_ids`.

    The function form of `RotaryEmbedding` (which see for the arguments),
    with explicit position ids and angles computed on the fly.

    Args:
        inputs: float tensor `[batch, length, heads, head_dim]` or
            `[batch, length, dim]`.
        position_ids: int tensor `[batch, length]` or `[length]`.
        max_wavelength, layout, **options: as in `RotaryEmbedding`
            (`scaling`, `scaling_factor`, `original_length`, ...).

    Returns:
        A tensor of the shape and dtype of `inputs`.

    Example:

    >>> x = ops.ones([1, 3, 2])
    >>> y = rotary_embedding(x, ops.convert_to_tensor([[0, 1, 2]]))
    >>> [round(float(v), 4) for v in ops.convert_to_numpy(y)[0, 1]]  # (1, 1) turned by 1 radian
    [-0.3012, 1.3818]

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864), "RoFormer".
    """
    inputs = ops.convert_to_tensor(inputs)
    _check_rank(inputs)
    layer = RotaryEmbedding(max_wavelength, layout=layout, **options)
    return layer(inputs, position_ids=_as_ids(position_ids))


@keras.utils.register_keras_serializable(package="keras_posenc")
class RotaryEmbedding(ShapePreserving, keras.layers.Layer):
    """Rotary position embedding (RoPE), applied to queries and keys.

    Every pair of features of a token at position `p` is turned by the
    angle `p * f_k` (`rotary_frequencies`), so the dot product of a query at
    `i` and a key at `j` depends on the positions only through `i - j`. The
    layer has no weights. With `partial_rotary_factor < 1` only the first
    `int(head_dim * partial_rotary_factor)` features of each head are
    rotated (GPT-NeoX, Phi); the rest pass through unchanged. cos and sin
    are multiplied by `attention_factor` (YaRN's temperature, LongRoPE's
    scale), as Hugging Face does.

    Position ids come from, in this order: `position_ids` if given; else the
    Keras mask or `mask=` (each row's real tokens numbered `offset,
    offset + 1, ...`, so left padding needs nothing special, restarting at
    every change of `segment_ids` in packed rows); else `offset + 0 ..
    length - 1`, for which one table of the static length is broadcast over
    the batch (no gather). Padding positions get position 0 (no rotation).

    "dynamic" and "longrope" scale by the length of the call, `max(position
    ids) + 1` over the batch, as Hugging Face's dynamic update does (without
    its memory of the longest length seen so far: each call uses its own).
    `freeze(length)` fixes that length (an exporter freezes the sequence
    length it exports).

    The angles are computed in float64 and the cos/sin tables kept in
    float32: the rotation runs in float32 even under `mixed_float16` or
    `mixed_bfloat16`, and only the result is cast to the compute dtype.
    With `max_length`, the cos/sin tables of positions `0 .. max_length - 1`
    are constants gathered by id (an exported model holds no SIN/COS op);
    without it they are computed for the ids of every call (in float32 only
    inside a JAX `jit`; set `max_length` there).

    Args:
        max_wavelength: float > 1, the base of the frequencies (10000 in
            the paper; `rope_theta`).
        layout: "half" (pairs `(k, k + dim/2)`: GPT-NeoX, keras-hub,
            Hugging Face) or "interleave" (pairs `(2k, 2k + 1)`: RoFormer,
            GPT-J).
        scaling: one of `ROTARY_SCALINGS`: None, "linear", "ntk", "dynamic",
            "yarn", "yarn-turns", "longrope", "llama3" (see
            `rotary_frequencies` for each formula).
        scaling_factor: float >= 1, the context extension `s` of the
            scaling; 1.0 when `scaling` is None.
        max_length: optional int >= 1, the number of positions whose
            cos/sin tables are stored; positions must then be below it.
        original_length: int, the training context length; required by
            every scaling but "linear" and "ntk".
        beta_fast, beta_slow: YaRN's bounds in turns (32 and 1).
        truncate: YaRN: floor/ceil the correction dimensions (True).
        mscale, mscale_all_dim: YaRN's attention factor as DeepSeek sets it
            (see `rotary_attention_factor`).
        attention_factor: optional float overriding the scaling's factor on
            cos and sin.
        low_freq_factor, high_freq_factor: llama3's bounds (1 and 4).
        short_factor, long_factor: LongRoPE's per-pair factors (lists of
            `rotary_dim // 2` floats).
        partial_rotary_factor: float in (0, 1], the share of each head's
            features that is rotated.
        head_dim: optional int, the head dimension, for
            `inverse_frequencies` before the layer is built.
        **kwargs: standard layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[batch, length, heads, head_dim]` or
            `[batch, length, dim]`, with an even last dimension.
        position_ids: optional int tensor `[batch, length]` or `[length]`.
        mask: optional bool tensor `[batch, length]`, True for real tokens.
        segment_ids: optional int tensor `[batch, length]`: positions
            restart where it changes (packed rows); used with the mask.
        offset: int scalar or `[batch]`, the position of the first real
            token (decoding with a cache); added to `position_ids` when
            those are given.

    Attributes:
        attention_factor: the float by which cos and sin are multiplied.
        inverse_frequencies: float64 numpy `[rotary_dim // 2]`, the
            frequencies at the original context (needs `head_dim` or a
            built layer).

    Example:

    >>> layer = RotaryEmbedding()
    >>> q = ops.ones([2, 4, 2, 8])  # [batch, length, heads, head_dim]
    >>> mask = ops.convert_to_tensor([[True] * 4, [False, False, True, True]])
    >>> y = ops.convert_to_numpy(layer(q, mask=mask))
    >>> y.shape
    (2, 4, 2, 8)
    >>> bool(np.allclose(y[1, 2:], y[0, :2]))  # left padding = no padding
    True
    >>> qwen = RotaryEmbedding.from_hf_config({"head_dim": 128, "rope_theta": 1e6, "rope_scaling": {
    ...     "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})
    >>> round(qwen.attention_factor, 6), qwen.inverse_frequencies.shape
    (1.138629, (64,))

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864), "RoFormer:
          Enhanced transformer with rotary position embedding".
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071), "YaRN".
    """

    def __init__(self, max_wavelength=10000.0, *, layout="half", scaling=None, scaling_factor=1.0,
                 max_length=None, original_length=None, beta_fast=32.0, beta_slow=1.0, truncate=True,
                 mscale=None, mscale_all_dim=None, attention_factor=None, low_freq_factor=1.0,
                 high_freq_factor=4.0, short_factor=None, long_factor=None, partial_rotary_factor=1.0,
                 head_dim=None, **kwargs):
        super().__init__(**kwargs)
        check_base(max_wavelength)
        check_choice("layout", layout, ROTARY_LAYOUTS)
        check_scaling(scaling, scaling_factor, original_length, beta_fast, beta_slow,
                      low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
                      short_factor=short_factor, long_factor=long_factor, mscale=mscale,
                      mscale_all_dim=mscale_all_dim, attention_factor=attention_factor)
        if max_length is not None:
            check_positive_int("max_length", max_length)
        if isinstance(partial_rotary_factor, bool) or not isinstance(partial_rotary_factor, (int, float)) \
                or not 0 < partial_rotary_factor <= 1:
            raise ValueError(f"`partial_rotary_factor` must be in (0, 1], got "
                             f"partial_rotary_factor={partial_rotary_factor!r}.")
        self.max_wavelength = float(max_wavelength)
        self.layout = layout
        self.scaling = scaling
        self.scaling_factor = float(scaling_factor)
        self.max_length = max_length
        self.original_length = original_length
        self.beta_fast = float(beta_fast)
        self.beta_slow = float(beta_slow)
        self.truncate = bool(truncate)
        self.mscale = mscale
        self.mscale_all_dim = mscale_all_dim
        self.low_freq_factor = float(low_freq_factor)
        self.high_freq_factor = float(high_freq_factor)
        self.short_factor = None if short_factor is None else [float(v) for v in short_factor]
        self.long_factor = None if long_factor is None else [float(v) for v in long_factor]
        self.partial_rotary_factor = float(partial_rotary_factor)
        self.head_dim = head_dim
        if head_dim is not None:
            check_positive_int("head_dim", head_dim, minimum=2)
            self.rotated_width(head_dim)
        self._attention_factor_setting = attention_factor
        self.attention_factor = rotary_attention_factor(
            scaling, self.scaling_factor, mscale=mscale, mscale_all_dim=mscale_all_dim,
            original_length=original_length, attention_factor=attention_factor)
        self._frozen_length = None
        self._prefix = None
        self.supports_masking = True

    @classmethod
    def from_hf_config(cls, config, layer_type=None, **kwargs):
        """The RoPE of a Hugging Face model from its `config.json` dict, as transformers builds it.

        Reads the rope type (default, linear, dynamic, yarn, longrope or its
        older name "su", llama3), the base, the rotated width (partial
        rotary, DeepSeek's `qk_rope_head_dim`), the attention factor, and the
        pairs the family rotates: "half" for Llama, Qwen, Mistral, Phi,
        Gemma, ..., "interleave" for DeepSeek-V2, GPT-J, GLM, Cohere, ... and
        DeepSeek-V3 unless `rope_interleave` is false (see
        `rope_scaling.hf_rotary_kwargs`). transformers' DeepSeek-V3 writes the
        rotated pairs back evens first, odds second; the layer keeps each
        pair in place: the same attention scores.

        Args:
            config: dict, a `config.json` (or a multimodal one with a
                `text_config`).
            layer_type: str, the attention type whose RoPE to build when the
                config has one per type (Gemma 3, ModernBERT:
                "full_attention", "sliding_attention"; see
                `from_hf_config_per_layer_type`).
            **kwargs: constructor arguments (`max_length`, `name`, ...);
                `layout` overrides the family's pairs.

        Raises:
            HFRopeConfigError (a ValueError): a RoPE this cannot reproduce (an
                unknown rope type, RoPE key or `model_type`, a missing field,
                a factor < 1, several RoPEs and no `layer_type`), naming the
                key and the value.
        """
        options = hf_rotary_kwargs(config, layer_type, layout=kwargs.pop("layout", None))
        return cls(**{**options, **kwargs})

    @classmethod
    def from_hf_config_per_layer_type(cls, config, **kwargs):
        """One `RotaryEmbedding` per attention type of a config with a RoPE per type, in a dict.

        `{"full_attention": ..., "sliding_attention": ...}` for Gemma 3 and
        ModernBERT (either config layout); `kwargs` go to every constructor
        (a `name` gets the type appended).

        Example:

        >>> gemma3 = {"model_type": "gemma3_text", "head_dim": 256, "rope_theta": 1e6,
        ...           "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
        >>> rotaries = RotaryEmbedding.from_hf_config_per_layer_type(gemma3)
        >>> {key: (r.max_wavelength, r.scaling) for key, r in rotaries.items()}
        {'full_attention': (1000000.0, 'linear'), 'sliding_attention': (10000.0, None)}

        Raises:
            HFRopeConfigError: the config has one RoPE for every layer (use
                `from_hf_config`), or as in `from_hf_config`.
        """
        types = hf_layer_types(config)
        if not types:
            raise HFRopeConfigError("The config has one RoPE for every layer (no `rope_parameters` per "
                                    "attention type): use RotaryEmbedding.from_hf_config.")
        name = kwargs.pop("name", None)
        return {layer_type: cls.from_hf_config(config, layer_type, **kwargs,
                                               **({} if name is None else {"name": f"{name}_{layer_type}"}))
                for layer_type in types}

    def rotated_width(self, head_dim):
        """The number of rotated features of a head of `head_dim`: `int(head_dim * partial_rotary_factor)`."""
        width = int(head_dim * self.partial_rotary_factor)
        if width < 2 or width % 2:
            raise ValueError(f"The rotated width int(head_dim * partial_rotary_factor) = int({head_dim} * "
                             f"{self.partial_rotary_factor}) = {width} must be even and >= 2.")
        return width

    def frequencies(self, dim, length=None):
        """The float64 frequencies `[rotated_width(dim) // 2]` for a head of `dim` features.

        `length`: the call length that "dynamic" and "longrope" scale by
        (None: the original context).
        """
        return rotary_frequencies(
            self.rotated_width(dim), self.max_wavelength, scaling=self.scaling,
            scaling_factor=self.scaling_factor, original_length=self.original_length,
            beta_fast=self.beta_fast, beta_slow=self.beta_slow, truncate=self.truncate,
            low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor,
            short_factor=self.short_factor, long_factor=self.long_factor, length=length)

    @property
    def inverse_frequencies(self):
        dim = self.head_dim if self.head_dim is not None else getattr(self, "dim", None)
        if dim is None:
            raise ValueError(f"RotaryEmbedding '{self.name}' does not know its head dimension yet: pass "
                             "`head_dim` or build it.")
        return self.frequencies(dim)

    def cos_sin_tables(self, length, dim):
        """NumPy float32 cos and sin `[length, rotated_width(dim) // 2]` of positions `0 .. length - 1`.

        What an exporter freezes as constants (angles computed in float64;
        without the attention factor). "dynamic" and "longrope" use the
        frequencies of a call of `length` positions (or of the `freeze`
        length).
        """
        call_length = self._frozen_length if self._frozen_length is not None else length
        return rotary_cos_sin(np.arange(length), self.frequencies(dim, call_length))

    def freeze(self, length):
        """Fixes the call length of "dynamic" and "longrope" to `length` (what an exporter does)."""
        check_positive_int("length", length)
        self._frozen_length = int(length)
        self._prefix = None
        if self.built:
            self._make_tables()

    def build(self, input_shape=None, **shapes):
        input_shape = input_shape_of(self, input_shape, shapes)
        dim = input_shape[-1]
        if len(input_shape) not in (3, 4) or dim is None or dim % 2:
            raise ValueError("`inputs` must have shape [batch, length, heads, head_dim] or "
                             f"[batch, length, dim] with an even, known last dimension, got shape "
                             f"{tuple(input_shape)}.")
        if self.head_dim is not None and dim != self.head_dim:
            raise ValueError(f"RotaryEmbedding '{self.name}' has head_dim={self.head_dim}, got inputs of "
                             f"shape {tuple(input_shape)}.")
        self.dim = int(dim)
        self.rotary_dim = self.rotated_width(self.dim)
        self._make_tables()
        super().build(input_shape)

    def _switches(self):
        """True when the frequencies depend on each call's length."""
        return self.scaling in DYNAMIC_SCALINGS and self._frozen_length is None

    def _scaled(self, cos, sin):
        factor = np.float32(self.attention_factor)
        return (cos, sin) if factor == 1 else (cos * factor, sin * factor)

    def _make_tables(self):
        # NumPy, made a tensor at each call: a constant inside every traced graph rather than a
        # captured eager tensor (which graph exporters such as tf2onnx turn into an input).
        self._frequencies = self.frequencies(self.dim, self._frozen_length)
        self._tables = self._long_tables = None
        if self.scaling == "longrope":
            self._long_frequencies = self.frequencies(self.dim, self.original_length + 1)
        if self.max_length is not None and not (self._switches() and self.scaling == "dynamic"):
            positions = np.arange(self.max_length)
            self._tables = self._scaled(*rotary_cos_sin(positions, self._frequencies))
            if self._switches():
                self._long_tables = self._scaled(*rotary_cos_sin(positions, self._long_frequencies))

    @static_call
    def call(self, inputs, position_ids=None, mask=None, segment_ids=None, offset=0):
        _check_rank(inputs)
        cos, sin = self._call_tables(inputs, position_ids, mask, segment_ids, offset)
        return _rotate(inputs, cos, sin, self.layout, self.rotary_dim, self._frozen_length is not None)

    def rotate_pair(self, query, key, position_ids=None):
        """`(layer(query, position_ids=...), layer(key, position_ids=...))`, the angles looked up once.

        Self-attention rotates its queries and keys by the same positions:
        one table lookup (and one range check) serves both.

        Args:
            query, key: float tensors `[batch, length, heads, head_dim]` of
                one length.
            position_ids: optional int `[batch, length]` or `[length]`;
                default `0 .. length - 1`.

        Returns:
            The rotated `(query, key)`.
        """
        _check_rank(query)
        _check_rank(key)
        if not self.built:
            self.build(query.shape)
        cos, sin = self._call_tables(query, position_ids, None, None, 0)
        frozen = self._frozen_length is not None
        return tuple(_rotate(x, cos, sin, self.layout, self.rotary_dim, frozen) for x in (query, key))

    def _call_tables(self, inputs, position_ids, mask, segment_ids, offset):
        length = inputs.shape[1]
        if position_ids is None and mask is None and _is_zero(offset) and isinstance(length, int):
            return self._prefix_tables(length)  # ids 0..T-1: one table broadcast over the batch
        if position_ids is not None:
            ids = _as_ids(position_ids)
            if not _is_zero(offset):
                ids = ids + ops.cast(ops.reshape(ops.convert_to_tensor(offset), (-1, 1)), "int32")
        elif mask is not None:
            ids = derive_position_ids(mask, segment_ids=segment_ids, offset=offset)
        else:
            ids = derive_position_ids(ops.ones((1, ops.shape(inputs)[1]), "bool"), offset=offset)
        return self._cos_sin(ids)

    def _prefix_tables(self, length):
        """float32 cos and sin `[1, length, rotary_dim // 2]` of positions `0 .. length - 1`, cached."""
        if self.max_length is not None and length > self.max_length:
            raise ValueError(f"Position ids must be in [0, max_length={self.max_length}) of RotaryEmbedding "
                             f"'{self.name}', got min 0 and max {length - 1}.")
        if self._prefix is None or self._prefix[0] != length:
            if self._tables is not None and not self._switches():
                cos, sin = (table[:length] for table in self._tables)
            else:
                call_length = length if self._switches() else self._frozen_length
                cos, sin = self._scaled(*rotary_cos_sin(np.arange(length),
                                                        self.frequencies(self.dim, call_length)))
            self._prefix = (length, cos[None], sin[None])
        return self._prefix[1:]

    def _checked(self, ids):
        if self.max_length is None:
            return ids
        # ValueError in eager mode, InvalidArgumentError in a TF graph (see `validation.check`).
        low, high = ops.min(ids, initial=2**31 - 1), ops.max(ids, initial=-2**31)  # empty ids: no error
        in_range = ops.logical_or(ops.equal(ops.size(ids), 0),
                                  ops.logical_and(low >= 0, high < self.max_length))
        return with_checks(ids, check(in_range, "Position ids must be in [0, max_length="
                                      + str(self.max_length) + ") of RotaryEmbedding '" + self.name
                                      + "', got min {} and max {}.", low, high))

    def _cos_sin(self, ids):
        ids = self._checked(ids)
        if self._switches():
            return self._switched_cos_sin(ids)
        if self._tables is None:
            return self._scaled_tensors(*rotary_cos_sin(ids, self._frequencies))
        cos, sin = (ops.convert_to_tensor(table) for table in self._tables)
        return ops.take(cos, ids, axis=0), ops.take(sin, ids, axis=0)

    def _scaled_tensors(self, cos, sin):
        if self.attention_factor == 1.0:
            return cos, sin
        return cos * self.attention_factor, sin * self.attention_factor

    def _switched_cos_sin(self, ids):
        """cos and sin for "dynamic" and "longrope": frequencies of the call length max(ids) + 1."""
        values = _concrete(ids)
        if values is not None:
            length = int(values.max()) + 1 if values.size else 0
            cos, sin = self._scaled(*rotary_cos_sin(values, self.frequencies(self.dim, length)))
            return ops.convert_to_tensor(cos), ops.convert_to_tensor(sin)
        length = ops.max(ids) + 1
        if self.scaling == "longrope":
            longer = length > self.original_length
            if self._tables is not None:
                cos, sin = (ops.where(longer, ops.convert_to_tensor(long), ops.convert_to_tensor(short))
                            for long, short in zip(self._long_tables, self._tables))
                return ops.take(cos, ids, axis=0), ops.take(sin, ids, axis=0)
            frequencies = ops.where(longer, ops.convert_to_tensor(self._long_frequencies),
                                    ops.convert_to_tensor(self._frequencies))
        else:  # dynamic NTK: base * (s n / L - (s - 1)) ** (d / (d - 2)), n = max(length, L)
            dtype = "float64" if is_tensorflow() else "float32"
            d, s, original = self.rotary_dim, self.scaling_factor, float(self.original_length)
            n = ops.maximum(ops.cast(length, dtype), original)
            base = self.max_wavelength * ops.power(s * n / original - (s - 1.0), d / (d - 2))
            exponents = ops.convert_to_tensor(np.arange(0, d, 2, dtype=np.float64) / d, dtype)
            frequencies = ops.power(base, -exponents)
        return self._scaled_tensors(*_traced_cos_sin(ids, frequencies))

    def get_config(self):
        config = super().get_config()
        config.update({
            "max_wavelength": self.max_wavelength,
            "layout": self.layout,
            "scaling": self.scaling,
            "scaling_factor": self.scaling_factor,
            "max_length": self.max_length,
            "original_length": self.original_length,
            "beta_fast": self.beta_fast,
            "beta_slow": self.beta_slow,
            "truncate": self.truncate,
            "mscale": self.mscale,
            "mscale_all_dim": self.mscale_all_dim,
            "attention_factor": self._attention_factor_setting,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "short_factor": self.short_factor,
            "long_factor": self.long_factor,
            "partial_rotary_factor": self.partial_rotary_factor,
            "head_dim": self.head_dim,
        })
        return config
