"""EncoderLayer: one Transformer encoder block (self-attention + feed-forward)."""

import contextlib

import numpy as np

from keras_posenc.backend import dtype_name, is_keras3, is_tensorflow, keras, ops
from keras_posenc.layers._shape_preserving import ShapePreserving
from keras_posenc.layers.alibi import MASKED_BIAS, alibi_bias, alibi_slopes
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.positions import position_ids as derive_position_ids
from keras_posenc.validation import (
    check,
    check_choice,
    check_epsilon,
    check_positive_int,
    check_rate,
    with_checks,
)

__all__ = ["ATTENTION_POSITIONS", "EncoderLayer", "merge_attention_masks", "static_or_dynamic_length"]

# Position encodings that act inside the attention rather than on the embeddings.
ATTENTION_POSITIONS = ("rope", "alibi")
# Keyword arguments of `RotaryEmbedding` that a "rope" layer's `position_config` may hold.
_ROPE_KEYS = ("max_wavelength", "layout", "scaling", "scaling_factor", "max_length", "original_length",
              "beta_fast", "beta_slow", "truncate", "mscale", "mscale_all_dim", "attention_factor",
              "low_freq_factor", "high_freq_factor", "short_factor", "long_factor", "partial_rotary_factor",
              "head_dim")


def static_or_dynamic_length(tensor):
    """Axis 1 of `tensor`: a Python int when known while tracing, else a scalar tensor.

    A static length lets `merge_attention_masks` check mask shapes while
    tracing and keeps the causal mask a constant.

    Args:
        tensor: a tensor of rank >= 2, `[batch, length, ...]`.

    Returns:
        An int, or an int32 scalar tensor when the length is unknown.

    Example:

    >>> static_or_dynamic_length(ops.zeros([2, 5]))
    5
    """
    return ops.shape(tensor)[1]


def merge_attention_masks(length, mask=None, attention_mask=None, use_causal_mask=False,
                          segment_ids=None):
    """Combines every kind of mask into one boolean attention mask.

    Entry `[b, i, j]` is True when query `i` may attend to key `j`: key `j`
    is a real token (`mask`), `attention_mask` allows it, `j <= i` when
    causal, and both lie in the same segment when `segment_ids` are given
    (packed rows attend block-diagonally). Padding masks keys only, as in
    keras-hub: no real token ever attends to padding, and the rows of
    padding queries (whose outputs are ignored downstream) need no masking.
    With padding as the only mask the result is then `[B, 1, T]`, which
    broadcasts inside the attention instead of materialising `[B, T, T]`
    (the saving is measured in benchmarks/RESULTS.md). An all-padding row masks
    every key; attention stays finite (Keras adds a large negative number,
    not -inf, before the softmax).

    Args:
        length: int scalar (tensor), the sequence length T.
        mask: optional bool `[B, T]`, True for real tokens.
        attention_mask: optional bool/int `[B, T, T]`, `[B, 1, T]` or `[T, T]`.
        use_causal_mask: bool, forbid attending to later positions.
        segment_ids: optional int `[B, T]`.

    Returns:
        A bool tensor `[B or 1, T, T]` (`[B, 1, T]` for padding alone), or
        None when nothing is masked.

    Example:

    >>> def as_ints(merged):
    ...     return ops.convert_to_numpy(merged)[0].astype(int).tolist()
    >>> mask = ops.convert_to_tensor([[True, True, False]])
    >>> as_ints(merge_attention_masks(3, mask=mask, use_causal_mask=True))
    [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    >>> tuple(merge_attention_masks(3, mask=mask).shape)
    (1, 1, 3)
    >>> as_ints(merge_attention_masks(3, segment_ids=ops.convert_to_tensor([[1, 1, 2]])))
    [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    >>> merge_attention_masks(3) is None
    True

    References:
        - [Krell et al., 2021](https://arxiv.org/abs/2107.02027) (block-diagonal
          attention for packed sequences).
    """
    parts = []
    if mask is not None:
        mask = ops.cast(mask, "bool")
        parts.append(mask[:, None, :])  # keys only: see the docstring
    if attention_mask is not None:
        parts.append(_checked_attention_mask(attention_mask, length))
    if use_causal_mask:
        positions = ops.arange(length)
        parts.append((positions[:, None] >= positions[None, :])[None])
    if segment_ids is not None:
        segment_ids = ops.convert_to_tensor(segment_ids)
        if "float" in dtype_name(segment_ids):
            raise TypeError(f"`segment_ids` must be integers, got dtype {dtype_name(segment_ids)}.")
        parts.append(ops.equal(segment_ids[:, :, None], segment_ids[:, None, :]))
    if not parts:
        return None
    merged = parts[0]
    for part in parts[1:]:
        merged = ops.logical_and(merged, part)
    return merged


def _checked_attention_mask(attention_mask, length):
    """`attention_mask` as bool `[batch or 1, length or 1, length]`, its shape checked."""
    attention_mask = ops.convert_to_tensor(attention_mask)
    shape = tuple(attention_mask.shape)
    if len(shape) not in (2, 3):
        raise ValueError(f"`attention_mask` must have shape [batch, length, length] or "
                         f"[length, length], got shape {attention_mask.shape}.")
    attention_mask = ops.cast(attention_mask, "bool")
    if len(shape) == 2:
        attention_mask = attention_mask[None]
    # [batch, 1, length] (keys only, what padding alone merges to) is accepted too.
    static_length = length if isinstance(length, (int, np.integer)) else None
    queries, keys = tuple(attention_mask.shape)[1:]
    if static_length is not None and (queries not in (None, 1, static_length)
                                      or keys not in (None, static_length)):
        raise ValueError(f"`attention_mask` must have shape [batch, length, length] with length "
                         f"{static_length}, got shape {attention_mask.shape}.")
    if static_length is not None and None not in (queries, keys) or not is_tensorflow():
        return attention_mask
    import tensorflow as tf  # a shape known only when the graph runs: TensorFlow only

    dynamic = tf.shape(attention_mask)
    fits = tf.logical_and(tf.equal(dynamic[2], length),
                          tf.logical_or(tf.equal(dynamic[1], length), tf.equal(dynamic[1], 1)))
    checks = check(fits, "`attention_mask` must have shape [batch, length, length] with length {}, "
                   "got shape {}.", length, dynamic)
    return with_checks(attention_mask, checks)


def _weight_scope(name):
    """Keras 2: a name scope, so that weight names are unique as the legacy h5 format requires."""
    if is_keras3():
        return contextlib.nullcontext()
    import tensorflow as tf

    return tf.name_scope(name)


def _without_keras_mask(x):
    """A new tensor equal to `x` that carries no Keras mask (attention sees the merged mask only)."""
    if is_keras3():
        return ops.copy(x)
    import tensorflow as tf

    return tf.identity(x)


@keras.utils.register_keras_serializable(package="keras_posenc")
class EncoderLayer(ShapePreserving, keras.layers.Layer):
    """One Transformer encoder block: self-attention, then a feed-forward net.

    Each sublayer is wrapped in dropout, a residual connection and
    `LayerNormalization(axis=-1)`. Post-LN (the paper, default):
    `x = LN(x + dropout(sublayer(x)))`. Pre-LN (`norm_first=True`):
    `x = x + dropout(sublayer(LN(x)))`, which trains more stably without
    warmup but leaves the output un-normalised (`Encoder` then adds a final
    LayerNormalization).

    Masks are merged explicitly (`merge_attention_masks`) before the
    attention, instead of relying on the implicit mask handling of
    `MultiHeadAttention`, which differs between Keras versions. The Keras
    mask (padding) masks keys only, so the merged mask is `[B, 1, T]` when
    padding is the only mask and `[B, T, T]` with `attention_mask` or the
    causal mask. A padding query may attend to every real key; its output is
    finite, ignored downstream, and the Keras mask is passed on unchanged.

    Positions inside the attention (`position="rope"` or `"alibi"`): the
    token embeddings then carry no position signal, and each query and key
    gets its position from `position_ids` (or, without them, from the Keras
    mask: real tokens numbered 0, 1, ... so left padding changes nothing).

    - "rope": queries and keys of every head are rotated by
      `RotaryEmbedding(**position_config)` before their dot product.
    - "alibi": `-slope_h * |p_j - p_i|` is added to the logits of head `h`
      (`keras_posenc.layers.alibi.alibi_bias`), merged with the masks into one
      additive bias; with the causal mask this is Press et al.'s
      `slope_h * (j - i)`.

    With either, the softmax runs in float32 also under mixed precision.

    Args:
        d_model: int, model width (input and output last dimension).
        num_heads: int, attention heads; `d_model` must be divisible by it.
        dff: int, hidden width of the feed-forward net.
        dropout: float in [0, 1), on attention probabilities and on each
            sublayer output.
        norm_first: bool, pre-LN instead of post-LN.
        activation: activation of the feed-forward hidden layer.
        epsilon: float > 0, LayerNormalization epsilon.
        position: None (positions are added to the embeddings before this
            layer), "rope" or "alibi".
        position_config: optional dict; for "rope" the keyword arguments of
            `keras_posenc.layers.RotaryEmbedding` (`max_wavelength`,
            `layout`, `scaling`, `scaling_factor`, `max_length`,
            `original_length`, `beta_fast`, `beta_slow`); unused otherwise.
        **kwargs: standard layer arguments (`name`, `dtype`, ...).

    Call arguments:
        x: float tensor `[batch, length, d_model]`.
        mask: optional bool `[batch, length]`, True for real tokens; filled in
            by Keras from the previous layer (for example
            `TokenAndPositionEmbedding`).
        attention_mask: optional bool `[batch, length, length]` (or
            `[batch, 1, length]` for keys only, or `[length, length]`), True
            where query `i` may attend to key `j`.
        use_causal_mask: bool, forbid attention to later positions.
        position_ids: optional int `[batch, length]` or `[length]`, the
            positions used by "rope" and "alibi".
        training: bool, enables dropout.
        return_attention_scores: bool, also return the attention
            probabilities `[batch, num_heads, length, length]` (before
            dropout), as keras-hub's `TransformerEncoder` does.

    Returns:
        `[batch, length, d_model]`, or `(outputs, attention_scores)` with
        `return_attention_scores=True`.

    Example:

    >>> layer = EncoderLayer(d_model=8, num_heads=2, dff=16)
    >>> x = np.random.default_rng(0).normal(size=[2, 5, 8]).astype("float32")
    >>> mask = np.array([[True] * 5, [True, True, True, False, False]])
    >>> y = ops.convert_to_numpy(layer(x, mask=mask))
    >>> y.shape, bool(np.isfinite(y).all())
    ((2, 5, 8), True)
    >>> rope = EncoderLayer(d_model=8, num_heads=2, dff=16, position="rope")
    >>> y, scores = rope(x, mask=mask, return_attention_scores=True)
    >>> scores = ops.convert_to_numpy(scores)
    >>> scores.shape, float(scores[1, :, :, 3:].max())  # no attention to padding keys
    ((2, 2, 5, 5), 0.0)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.1.
        - [Xiong et al., 2020](https://arxiv.org/abs/2002.04745), pre-LN.
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864), RoPE.
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409), ALiBi.
    """

    def __init__(self, d_model, num_heads, dff, *, dropout=0.1, norm_first=False, activation="relu",
                 epsilon=1e-6, position=None, position_config=None, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("dff", dff)
        if d_model % num_heads:
            raise ValueError(f"`d_model` must be divisible by `num_heads`, got d_model={d_model} and "
                             f"num_heads={num_heads}.")
        check_rate("dropout", dropout)
        check_epsilon(epsilon)
        if position is not None:
            check_choice("position", position, ATTENTION_POSITIONS + (None,))
        position_config = dict(position_config or {})
        allowed_keys = _ROPE_KEYS if position == "rope" else ()
        unknown = sorted(set(position_config) - set(allowed_keys))
        if unknown:
            raise ValueError(f"`position_config` of position={position!r} takes {allowed_keys}, got "
                             f"unknown keys {unknown}.")
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.activation = keras.activations.get(activation)
        self.epsilon = float(epsilon)
        self.position = position
        self.position_config = position_config
        self.supports_masking = True
        policy = self.dtype_policy
        self.attention = keras.layers.MultiHeadAttention(
            num_heads, d_model // num_heads, dropout=self.dropout, dtype=policy, name="attention")
        self.rotary = None
        if position == "rope":
            self.rotary = RotaryEmbedding(**position_config, dtype=policy, name="rotary")
        self.slopes = alibi_slopes(num_heads) if position == "alibi" else None
        self.attention_norm = keras.layers.LayerNormalization(
            axis=-1, epsilon=self.epsilon, dtype=policy, name="attention_norm")
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=policy)
        self.ffn_hidden = keras.layers.Dense(dff, activation=self.activation, dtype=policy, name="ffn_hidden")
        self.ffn_output = keras.layers.Dense(d_model, dtype=policy, name="ffn_output")
        self.ffn_norm = keras.layers.LayerNormalization(
            axis=-1, epsilon=self.epsilon, dtype=policy, name="ffn_norm")
        self.ffn_dropout = keras.layers.Dropout(self.dropout, dtype=policy)

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        if len(input_shape) != 3 or input_shape[-1] != self.d_model:
            raise ValueError(f"`x` must have shape [batch, length, d_model={self.d_model}], "
                             f"got shape {input_shape}.")
        hidden_shape = input_shape[:-1] + (self.dff,)
        # Each sublayer is built inside its own name scope so weight names are unique
        # ("attention_norm/gamma", "ffn_norm/gamma"), as the legacy h5 format requires.
        with _weight_scope(self.attention.name):
            if hasattr(self.attention, "_build_from_signature"):  # Keras 2
                self.attention._build_from_signature(input_shape, input_shape)
            else:
                self.attention.build(input_shape, input_shape)
        if self.rotary is not None:
            self.rotary.build(input_shape[:-1] + (self.num_heads, self.d_model // self.num_heads))
        for layer, shape in ((self.attention_norm, input_shape), (self.ffn_hidden, input_shape),
                             (self.ffn_output, hidden_shape), (self.ffn_norm, input_shape)):
            with _weight_scope(layer.name):
                layer.build(shape)
        super().build(input_shape)

    def call(self, x, mask=None, attention_mask=None, use_causal_mask=False, position_ids=None,
             training=None, return_attention_scores=False, cache=None, cache_index=None):
        if len(x.shape) != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"`x` must have shape [batch, length, d_model={self.d_model}], "
                             f"got shape {x.shape}.")
        if cache is not None:
            if attention_mask is not None:
                raise ValueError("`attention_mask` cannot be combined with `cache`: cached attention is "
                                 "causal over the cache, with padding given by `position_ids`.")
            heads, head_dim = self.num_heads, self.d_model // self.num_heads
            if len(cache.shape) != 5 or (cache.shape[1], *cache.shape[3:]) != (2, heads, head_dim):
                raise ValueError(f"`cache` must have shape [batch, 2, cache_length, num_heads={heads}, "
                                 f"head_dim={head_dim}], got shape {tuple(cache.shape)}.")
            x, key_cache, value_cache, scores = self.cached_step(x, cache[:, 0], cache[:, 1], cache_index,
                                                                 position_ids)
            new_cache = ops.stack([key_cache, value_cache], axis=1)
            return (x, new_cache, scores) if return_attention_scores else (x, new_cache)
        merged = merge_attention_masks(static_or_dynamic_length(x), mask=mask, attention_mask=attention_mask,
                                       use_causal_mask=use_causal_mask)
        # A fresh tensor without `_keras_mask`, so the attention sees only `merged`.
        x = _without_keras_mask(x)
        residual = x
        if self.norm_first:
            x = self.attention_norm(x)
        scores = None
        if self.position is None and return_attention_scores:
            x, scores = self.attention(x, x, attention_mask=merged, training=training,
                                       return_attention_scores=True)
        elif self.position is None:
            x = self.attention(x, x, attention_mask=merged, training=training)
        else:
            plain = position_ids is None and mask is None  # ids 0..T-1: RoPE broadcasts one table
            if position_ids is None:
                real = ops.ones(ops.shape(x)[:2], "bool") if mask is None else mask
                position_ids = derive_position_ids(real)
            x, scores = self._positional_attention(x, merged, position_ids, training, plain)
        x = self._finish_block(residual, x, training)
        if return_attention_scores:
            return x, scores
        return x

    def _finish_block(self, residual, attended, training):
        """The attention residual and norm, then the feed-forward sublayer with its own."""
        x = residual + self.attention_dropout(attended, training=training)
        if not self.norm_first:
            x = self.attention_norm(x)
        residual = x
        if self.norm_first:
            x = self.ffn_norm(x)
        x = self.ffn_output(self.ffn_hidden(x))
        x = residual + self.ffn_dropout(x, training=training)
        if not self.norm_first:
            x = self.ffn_norm(x)
        return x

    def cached_step(self, x, key_cache, value_cache, cache_index, position_ids):
        """One incremental step: writes this chunk's keys and values into the caches, attends over them.

        The caches' slots are consecutive positions of each row: slot `s`
        holds the token decoded at step `s`, a left-padded row's padding
        first. A query at slot `s` with position id `p` (the count of real
        tokens before it) therefore sees exactly the slots `s - p .. s`, its
        own row's real tokens up to itself: causal attention without padding,
        derived from the ids alone, with no mask to carry between steps. The
        ALiBi distance of two real tokens is their slot distance.

        Args:
            x: float `[batch, length, d_model]`, the chunk starting at slot
                `cache_index`.
            key_cache, value_cache: float `[batch, cache_length, num_heads,
                head_dim]`.
            cache_index: int scalar (tensor).
            position_ids: int `[batch, length]`.

        Returns:
            `(outputs, key_cache, value_cache, attention_scores)`.
        """
        if position_ids is None or cache_index is None:
            raise ValueError("cached attention needs `cache_index` and `position_ids` (int [batch, "
                             "length]).")
        x = _without_keras_mask(x)
        residual = x
        if self.norm_first:
            x = self.attention_norm(x)
        attention = self.attention
        query, key, value = attention._query_dense(x), attention._key_dense(x), attention._value_dense(x)
        position_ids = ops.cast(position_ids, "int32")
        if self.rotary is not None:
            query = self.rotary(query, position_ids=position_ids)
            key = self.rotary(key, position_ids=position_ids)
        cache_length = ops.shape(key_cache)[1]
        query_slots = ops.cast(cache_index, "int32") + ops.arange(ops.shape(x)[1], dtype="int32")
        # Writing by a one-hot product keeps every other slot bit for bit (x * 1 + 0).
        write = ops.cast(ops.equal(query_slots[:, None], ops.arange(cache_length, dtype="int32")[None]),
                         key_cache.dtype)  # [length, cache_length]
        keep = (1.0 - ops.sum(write, axis=0))[None, :, None, None]
        key_cache = key_cache * keep + ops.einsum("sc,bshd->bchd", write, ops.cast(key, key_cache.dtype))
        value_cache = value_cache * keep + ops.einsum("sc,bshd->bchd", write,
                                                      ops.cast(value, value_cache.dtype))
        logits = ops.einsum("bqhd,bkhd->bhqk", ops.cast(query, "float32"), ops.cast(key_cache, "float32"))
        logits = logits * (1.0 / float(self.d_model // self.num_heads) ** 0.5)
        key_slots = ops.arange(cache_length, dtype="int32")[None, None, :]
        first_real = (query_slots[None, :] - position_ids)[:, :, None]
        allowed = ops.logical_and(key_slots <= query_slots[None, :, None], key_slots >= first_real)
        allowed = ops.expand_dims(allowed, 1)  # [batch, 1, length, cache_length]
        if self.slopes is not None:
            distance = ops.cast(query_slots[:, None] - key_slots[0], "float32")
            logits = logits - ops.convert_to_tensor(self.slopes, "float32")[:, None, None] * distance[None]
        logits = ops.where(allowed, logits, MASKED_BIAS)
        scores = ops.softmax(logits, axis=-1)
        output = ops.einsum("bhqk,bkhd->bqhd", ops.cast(scores, self.compute_dtype),
                            ops.cast(value_cache, self.compute_dtype))
        x = self._finish_block(residual, attention._output_dense(output), training=False)
        return x, key_cache, value_cache, ops.cast(scores, self.compute_dtype)

    def _positional_attention(self, x, allowed, position_ids, training, plain=False):
        """Multi-head self-attention with RoPE on queries and keys or the ALiBi bias on the logits.

        Uses the projections of `self.attention` (same weights and names as
        the plain path); the logits, bias and softmax are float32.
        """
        attention = self.attention
        query = attention._query_dense(x)  # [batch, length, heads, head_dim]
        key = attention._key_dense(x)
        value = attention._value_dense(x)
        if self.rotary is not None:
            ids = None if plain else position_ids
            query = self.rotary(query, position_ids=ids)
            key = self.rotary(key, position_ids=ids)
        head_dim = self.d_model // self.num_heads
        logits = ops.einsum("bqhd,bkhd->bhqk", ops.cast(query, "float32"), ops.cast(key, "float32"))
        logits = logits * (1.0 / float(head_dim) ** 0.5)
        if self.slopes is not None:
            ids = ops.cast(position_ids, "int32")
            ids = ids[None] if len(ids.shape) == 1 else ids
            logits = logits + alibi_bias(self.slopes, ids, allowed)
        elif allowed is not None:
            logits = ops.where(ops.expand_dims(allowed, 1), logits, MASKED_BIAS)
        scores = ops.softmax(logits, axis=-1)
        probabilities = attention._dropout_layer(ops.cast(scores, self.compute_dtype), training=training)
        output = ops.einsum("bhqk,bkhd->bqhd", probabilities, value)
        return attention._output_dense(output), ops.cast(scores, self.compute_dtype)

    # Constants for exporters ----------------------------------------------------------------
    # RoPE logits and ALiBi biases depend on positions only through differences. The per-sample
    # ids of a left-padded row are 0..T-1 shifted by the padding, and those of a packed row are
    # shifted once per segment, across which attention is masked: constants for positions
    # 0..T-1 give every real token the outputs of the per-sample ids.
    def export_rotation(self, length):
        """RoPE of one head as constants: `q_rotated = q * cos + (q @ turn) * sin`, or None.

        Args:
            length: int, the exported sequence length T.

        Returns:
            None without RoPE, else float32 numpy `(cos, sin, turn)`: `cos` and
            `sin` `[T, head_dim]` of positions `0 .. T-1` in the layer's layout
            (the scaling's attention factor included; "dynamic" and "longrope"
            with the frequencies of a call of length T), `turn`
            `[head_dim, head_dim]` the signed permutation taking each pair
            `(a, b)` to `(-b, a)`. Features past the rotated width (partial
            rotary) get cos 1, sin 0 and no turn: they pass through.

        Example:

        >>> layer = EncoderLayer(d_model=8, num_heads=2, dff=16, position="rope")
        >>> cos, sin, turn = layer.export_rotation(3)
        >>> cos.shape, turn[2].tolist()  # half layout, head_dim 4: pair (0, 2) -> (-x2, x0)
        ((3, 4), [-1.0, 0.0, 0.0, 0.0])
        """
        if self.rotary is None:
            return None
        head_dim = self.d_model // self.num_heads
        width = self.rotary.rotated_width(head_dim)
        cos, sin = self.rotary.cos_sin_tables(length, head_dim)
        half = width // 2
        if self.rotary.layout == "half":
            pairs = [(k, k + half) for k in range(half)]
            columns = np.arange(width) % half
        else:
            pairs = [(2 * k, 2 * k + 1) for k in range(half)]
            columns = np.arange(width) // 2
        turn = np.zeros([head_dim, head_dim], np.float32)
        for a, b in pairs:
            turn[b, a], turn[a, b] = -1.0, 1.0
        factor = np.float32(self.rotary.attention_factor)
        full_cos = np.ones([length, head_dim], np.float32)
        full_sin = np.zeros([length, head_dim], np.float32)
        full_cos[:, :width], full_sin[:, :width] = cos[:, columns] * factor, sin[:, columns] * factor
        return full_cos, full_sin, turn

    def export_attention_bias(self, length):
        """The ALiBi bias of positions `0 .. T-1` as a float32 `[num_heads, T, T]` constant, or None.

        Example:

        >>> layer = EncoderLayer(d_model=8, num_heads=2, dff=16, position="alibi")
        >>> (layer.export_attention_bias(3)[0] * 16).tolist()  # slope 1/16
        [[0.0, -1.0, -2.0], [-1.0, 0.0, -1.0], [-2.0, -1.0, 0.0]]
        """
        if self.slopes is None:
            return None
        positions = np.arange(length, dtype=np.float64)
        distance = np.abs(positions[None, :] - positions[:, None])
        return (0.0 - self.slopes[:, None, None] * distance).astype(np.float32)

    def get_config(self):
        config = super().get_config()
        config.update({
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "dff": self.dff,
            "dropout": self.dropout,
            "norm_first": self.norm_first,
            "activation": keras.activations.serialize(self.activation),
            "epsilon": self.epsilon,
            "position": self.position,
            "position_config": dict(self.position_config),
        })
        return config
