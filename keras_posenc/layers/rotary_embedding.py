"""RotaryEmbedding: rotary position embedding (RoPE) of queries and keys, with RoPE scalings."""

import math

import numpy as np

from keras_posenc.backend import backend_name, is_tensorflow, keras, ops
from keras_posenc.layers._shape_preserving import ShapePreserving
from keras_posenc.positions import position_ids as derive_position_ids
from keras_posenc.validation import check, check_base, check_choice, check_positive_int, with_checks

__all__ = ["ROTARY_LAYOUTS", "ROTARY_SCALINGS", "RotaryEmbedding", "apply_rotary", "rotary_attention_factor",
           "rotary_cos_sin", "rotary_frequencies", "rotary_embedding"]

ROTARY_LAYOUTS = ("half", "interleave")
ROTARY_SCALINGS = (None, "linear", "ntk", "yarn")


def _check_scaling(dim, scaling, scaling_factor, original_length, beta_fast, beta_slow):
    check_choice("scaling", scaling, ROTARY_SCALINGS)
    if isinstance(scaling_factor, bool) or not isinstance(scaling_factor, (int, float)) or not (
            math.isfinite(scaling_factor) and scaling_factor >= 1.0):
        raise ValueError(f"`scaling_factor` must be a float >= 1, got scaling_factor={scaling_factor!r}.")
    if scaling is None and scaling_factor != 1.0:
        raise ValueError(f"`scaling_factor={scaling_factor!r}` needs a `scaling` ('linear', 'ntk' or "
                         "'yarn'); with scaling=None it must be 1.0.")
    if scaling == "yarn":
        if original_length is None:
            raise ValueError("scaling='yarn' needs `original_length`, the context length the model "
                             "was trained with.")
        check_positive_int("original_length", original_length)
        if not 0 < beta_slow < beta_fast:
            raise ValueError(f"`beta_slow` and `beta_fast` must satisfy 0 < beta_slow < beta_fast, got "
                             f"beta_slow={beta_slow!r} and beta_fast={beta_fast!r}.")
    if dim is not None and scaling == "ntk" and dim < 4:
        raise ValueError(f"scaling='ntk' needs a rotary dimension >= 4, got {dim}.")


def rotary_frequencies(dim, max_wavelength=10000.0, *, scaling=None, scaling_factor=1.0,
                       original_length=None, beta_fast=32.0, beta_slow=1.0):
    """The angular frequency of every rotated pair, float64: pair `k` turns by `p * f_k` at position `p`.

    Unscaled, `f_k = max_wavelength ** (-2k / dim)` (Su et al.). With a
    scaling factor `s`:

    - "linear" (position interpolation, Chen et al.): positions are divided
      by `s`, i.e. `f_k / s`;
    - "ntk" (NTK-aware, bloc97): the base becomes
      `max_wavelength * s ** (dim / (dim - 2))`, which leaves the fastest
      pair as it is and slows the slowest one by exactly `s`;
    - "yarn" (Peng et al., "NTK-by-parts", section 3.2): with wavelength `l_k = 2 pi / f_k` and
      `r_k = original_length / l_k` turns over the training context, the ramp
      `g = clip((r_k - beta_slow) / (beta_fast - beta_slow), 0, 1)` gives
      `(1 - g) * f_k / s + g * f_k`: pairs that turn more than `beta_fast`
      times keep their frequency, pairs that turn less than `beta_slow`
      times are interpolated like "linear", and the ones between are blended.

    Args:
        dim: even int >= 2, the rotated width (the head dimension).
        max_wavelength: float > 1, the base.
        scaling: None, "linear", "ntk" or "yarn".
        scaling_factor: float >= 1, the context extension `s`.
        original_length: int, the training context length (YaRN only).
        beta_fast, beta_slow: floats, YaRN's ramp bounds (32 and 1 in the
            paper for LLaMA).

    Returns:
        A float64 numpy array `[dim // 2]`.

    Example:

    >>> rotary_frequencies(4).tolist()
    [1.0, 0.01]
    >>> rotary_frequencies(4, scaling="linear", scaling_factor=2.0).tolist()
    [0.5, 0.005]
    >>> rotary_frequencies(4, scaling="ntk", scaling_factor=4.0).tolist()  # base 10000 * 4**2
    [1.0, 0.0025]

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
    """
    check_positive_int("dim", dim, minimum=2)
    if dim % 2:
        raise ValueError(f"The rotated dimension must be even, got dim={dim}.")
    check_base(max_wavelength)
    _check_scaling(dim, scaling, scaling_factor, original_length, beta_fast, beta_slow)
    s = float(scaling_factor)
    base = float(max_wavelength)
    if scaling == "ntk":
        base = base * s ** (dim / (dim - 2))
    frequencies = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    if scaling == "linear":
        return frequencies / s
    if scaling == "yarn":
        turns = original_length * frequencies / (2 * math.pi)
        ramp = np.clip((turns - beta_slow) / (beta_fast - beta_slow), 0.0, 1.0)
        return (1.0 - ramp) * frequencies / s + ramp * frequencies
    return frequencies


def rotary_attention_factor(scaling=None, scaling_factor=1.0):
    """YaRN's factor on queries and keys: `0.1 ln(s) + 1` for "yarn" with `s > 1`, else 1.

    Multiplying both queries and keys by it divides the attention logits by
    YaRN's temperature `t`, `sqrt(1 / t) = 0.1 ln(s) + 1`.

    Example:

    >>> round(rotary_attention_factor("yarn", 4.0), 6)
    1.138629
    >>> rotary_attention_factor("ntk", 4.0)
    1.0

    References:
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071), section 3.4
          (the attention temperature).
    """
    if scaling != "yarn" or scaling_factor <= 1.0:
        return 1.0
    return 0.1 * math.log(scaling_factor) + 1.0


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
    if not _is_traced(position_ids):
        cos, sin = rotary_cos_sin(ops.convert_to_numpy(position_ids), frequencies)
        return ops.convert_to_tensor(cos), ops.convert_to_tensor(sin)
    frequencies = ops.convert_to_tensor(frequencies.astype(np.float32))
    angles = ops.cast(position_ids, "float32")[..., None] * frequencies
    return ops.cos(angles), ops.sin(angles)


def _is_traced(tensor):
    """True for a JAX tracer (inside `jit`), whose values NumPy cannot read."""
    if backend_name() != "jax":
        return False
    import jax

    return isinstance(tensor, jax.core.Tracer)


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
    if layout == "half":
        first, second = x[..., :half], x[..., half:]
        return ops.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    shape = ops.shape(x)
    pairs = ops.reshape(x, tuple(shape[:-1]) + (half, 2))
    first, second = pairs[..., 0], pairs[..., 1]
    rotated = ops.stack([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return ops.reshape(rotated, shape)


def _as_ids(position_ids):
    ids = ops.convert_to_tensor(position_ids)
    if "int" not in str(ids.dtype):
        raise TypeError(f"`position_ids` must be an integer tensor, got dtype {ids.dtype}.")
    if len(ids.shape) not in (1, 2):
        raise ValueError(f"`position_ids` must have shape [batch, length] or [length], "
                         f"got shape {ids.shape}.")
    ids = ops.cast(ids, "int32")
    return ids[None] if len(ids.shape) == 1 else ids


def _rotate(inputs, cos, sin, layout, factor):
    """Rotation in float32 (cos/sin stay float32 under mixed precision), cast back to the input dtype."""
    if len(inputs.shape) == 4:  # [batch, length, heads, head_dim]
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rotated = apply_rotary(ops.cast(inputs, "float32"), cos, sin, layout)
    if factor != 1.0:
        rotated = rotated * factor
    return ops.cast(rotated, inputs.dtype)


def _check_rank(inputs):
    if len(inputs.shape) not in (3, 4) or inputs.shape[-1] is None or inputs.shape[-1] % 2:
        raise ValueError("`inputs` must have shape [batch, length, heads, head_dim] or [batch, length, dim] "
                         f"with an even, known last dimension, got shape {inputs.shape}.")


def rotary_embedding(inputs, position_ids, *, max_wavelength=10000.0, layout="half", scaling=None,
                     scaling_factor=1.0, original_length=None, beta_fast=32.0, beta_slow=1.0):
    """RoPE as a plain function: `inputs` rotated by the angles of `position_ids`.

    The function form of `RotaryEmbedding` (which see for the arguments),
    with explicit position ids and angles computed on the fly.

    Args:
        inputs: float tensor `[batch, length, heads, head_dim]` or
            `[batch, length, dim]`.
        position_ids: int tensor `[batch, length]` or `[length]`.
        max_wavelength, layout, scaling, scaling_factor, original_length,
            beta_fast, beta_slow: as in `RotaryEmbedding`.

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
    frequencies = rotary_frequencies(inputs.shape[-1], max_wavelength, scaling=scaling,
                                     scaling_factor=scaling_factor, original_length=original_length,
                                     beta_fast=beta_fast, beta_slow=beta_slow)
    cos, sin = rotary_cos_sin(_as_ids(position_ids), frequencies)
    return _rotate(inputs, cos, sin, layout, rotary_attention_factor(scaling, scaling_factor))


@keras.utils.register_keras_serializable(package="keras_posenc")
class RotaryEmbedding(ShapePreserving, keras.layers.Layer):
    """Rotary position embedding (RoPE), applied to queries and keys.

    Every pair of features of a token at position `p` is turned by the
    angle `p * f_k` (`rotary_frequencies`), so the dot product of a query at
    `i` and a key at `j` depends on the positions only through `i - j`. The
    layer has no weights.

    Position ids come from, in this order: `position_ids` if given; else the
    Keras mask or `mask=` (each row's real tokens numbered `offset,
    offset + 1, ...`, so left padding needs nothing special, restarting at
    every change of `segment_ids` in packed rows); else `offset + 0 ..
    length - 1`. Padding positions get position 0 (no rotation).

    The angles are computed in float64 and the cos/sin tables kept in
    float32: the rotation runs in float32 even under `mixed_float16` or
    `mixed_bfloat16`, and only the result is cast to the compute dtype.
    With `max_length`, the cos/sin tables of positions `0 .. max_length - 1`
    are constants gathered by id (an exported model holds no SIN/COS op);
    without it they are computed for the ids of every call (in float32 only
    inside a JAX `jit`; set `max_length` there).

    Args:
        max_wavelength: float > 1, the base of the frequencies (10000 in
            the paper).
        layout: "half" (pairs `(k, k + dim/2)`: GPT-NeoX, keras-hub,
            Hugging Face LLaMA) or "interleave" (pairs `(2k, 2k + 1)`:
            RoFormer, GPT-J).
        scaling: None, "linear", "ntk" or "yarn" (see `rotary_frequencies`
            for each formula).
        scaling_factor: float >= 1, the context extension `s` of the
            scaling; 1.0 when `scaling` is None.
        max_length: optional int >= 1, the number of positions whose
            cos/sin tables are stored; positions must then be below it.
        original_length: int, the training context length; required by
            "yarn" (its ramp counts turns over this length).
        beta_fast, beta_slow: YaRN's ramp bounds in turns (32 and 1).
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
        attention_factor: YaRN's `0.1 ln(s) + 1` (1.0 otherwise), by which
            the output is multiplied, so that query-key logits are divided by
            YaRN's temperature.

    Example:

    >>> layer = RotaryEmbedding()
    >>> q = ops.ones([2, 4, 2, 8])  # [batch, length, heads, head_dim]
    >>> mask = ops.convert_to_tensor([[True] * 4, [False, False, True, True]])
    >>> y = ops.convert_to_numpy(layer(q, mask=mask))
    >>> y.shape
    (2, 4, 2, 8)
    >>> bool(np.allclose(y[1, 2:], y[0, :2]))  # left padding = no padding
    True

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864), "RoFormer:
          Enhanced transformer with rotary position embedding".
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071), "YaRN".
    """

    def __init__(self, max_wavelength=10000.0, *, layout="half", scaling=None, scaling_factor=1.0,
                 max_length=None, original_length=None, beta_fast=32.0, beta_slow=1.0, **kwargs):
        super().__init__(**kwargs)
        check_base(max_wavelength)
        check_choice("layout", layout, ROTARY_LAYOUTS)
        _check_scaling(None, scaling, scaling_factor, original_length, beta_fast, beta_slow)
        if max_length is not None:
            check_positive_int("max_length", max_length)
        self.max_wavelength = float(max_wavelength)
        self.layout = layout
        self.scaling = scaling
        self.scaling_factor = float(scaling_factor)
        self.max_length = max_length
        self.original_length = original_length
        self.beta_fast = float(beta_fast)
        self.beta_slow = float(beta_slow)
        self.attention_factor = rotary_attention_factor(scaling, self.scaling_factor)
        self.supports_masking = True

    def frequencies(self, dim):
        """The float64 frequencies `[dim // 2]` of this layer for a rotated width `dim`."""
        return rotary_frequencies(dim, self.max_wavelength, scaling=self.scaling,
                                  scaling_factor=self.scaling_factor, original_length=self.original_length,
                                  beta_fast=self.beta_fast, beta_slow=self.beta_slow)

    def cos_sin_tables(self, length, dim):
        """NumPy float32 cos and sin `[length, dim // 2]` of positions `0 .. length - 1`.

        What an exporter freezes as constants (angles computed in float64).
        """
        return rotary_cos_sin(np.arange(length), self.frequencies(dim))

    def build(self, input_shape):
        dim = input_shape[-1]
        if len(input_shape) not in (3, 4) or dim is None or dim % 2:
            raise ValueError("`inputs` must have shape [batch, length, heads, head_dim] or "
                             f"[batch, length, dim] with an even, known last dimension, got shape "
                             f"{tuple(input_shape)}.")
        self.dim = int(dim)
        self._frequencies = self.frequencies(self.dim)
        # NumPy, made a tensor at each call: a constant inside every traced graph rather than a
        # captured eager tensor (which graph exporters such as tf2onnx turn into an input).
        self._tables = None
        if self.max_length is not None:
            self._tables = self.cos_sin_tables(self.max_length, self.dim)
        super().build(input_shape)

    def call(self, inputs, position_ids=None, mask=None, segment_ids=None, offset=0):
        _check_rank(inputs)
        if position_ids is not None:
            ids = _as_ids(position_ids)
            if offset is not None and not (isinstance(offset, int) and offset == 0):
                ids = ids + ops.cast(ops.reshape(ops.convert_to_tensor(offset), (-1, 1)), "int32")
        elif mask is not None:
            ids = derive_position_ids(mask, segment_ids=segment_ids, offset=offset)
        else:
            length = ops.shape(inputs)[1]
            ids = derive_position_ids(ops.ones((1, length), "bool"), offset=offset)
        return _rotate(inputs, *self._cos_sin(ids), self.layout, self.attention_factor)

    def _cos_sin(self, ids):
        if self._tables is None:
            return rotary_cos_sin(ids, self._frequencies)
        # ValueError in eager mode, InvalidArgumentError in a TF graph (see `validation.check`).
        low, high = ops.min(ids, initial=2**31 - 1), ops.max(ids, initial=-2**31)  # empty ids: no error
        in_range = ops.logical_or(ops.equal(ops.size(ids), 0),
                                  ops.logical_and(low >= 0, high < self.max_length))
        ids = with_checks(ids, check(in_range, "Position ids must be in [0, max_length="
                                     + str(self.max_length) + ") of RotaryEmbedding '" + self.name
                                     + "', got min {} and max {}.", low, high))
        cos, sin = (ops.convert_to_tensor(table) for table in self._tables)
        return ops.take(cos, ids, axis=0), ops.take(sin, ids, axis=0)

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
        })
        return config
