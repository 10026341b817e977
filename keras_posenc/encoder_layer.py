"""EncoderLayer: one Transformer encoder block (self-attention + feed-forward)."""

import tensorflow as tf
from tensorflow import keras

from keras_posenc.validation import check, check_epsilon, check_positive_int, check_rate, with_checks

__all__ = ["EncoderLayer", "merge_attention_masks", "static_or_dynamic_length"]


def static_or_dynamic_length(tensor):
    """Axis 1 of `tensor`: a Python int when known while tracing, else a scalar tensor.

    A static length lets `merge_attention_masks` check mask shapes while
    tracing and keeps the causal mask a constant.

    Args:
        tensor: a tensor of rank >= 2, `[batch, length, ...]`.

    Returns:
        An int, or an int32 scalar tensor when the length is unknown.

    Example:

    >>> static_or_dynamic_length(tf.zeros([2, 5]))
    5
    """
    return tensor.shape[1] if tensor.shape[1] is not None else tf.shape(tensor)[1]


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
    (about 1.5% of a CPU train step at B32 T128). An all-padding row masks
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

    >>> mask = tf.constant([[True, True, False]])
    >>> merge_attention_masks(3, mask=mask, use_causal_mask=True)[0].numpy().astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    >>> merge_attention_masks(3, mask=mask).shape
    TensorShape([1, 1, 3])
    >>> segments = tf.constant([[1, 1, 2]])
    >>> merge_attention_masks(3, segment_ids=segments)[0].numpy().astype(int).tolist()
    [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    >>> merge_attention_masks(3) is None
    True

    References:
        - [Krell et al., 2021](https://arxiv.org/abs/2107.02027) (block-diagonal
          attention for packed sequences).
    """
    parts = []
    if mask is not None:
        mask = tf.cast(mask, tf.bool)
        parts.append(mask[:, None, :])  # keys only: see the docstring
    if attention_mask is not None:
        attention_mask = tf.convert_to_tensor(attention_mask)
        if attention_mask.shape.rank not in (None, 2, 3):
            raise ValueError(f"`attention_mask` must have shape [batch, length, length] or "
                             f"[length, length], got shape {attention_mask.shape}.")
        attention_mask = tf.cast(attention_mask, tf.bool)
        if attention_mask.shape.rank == 2:
            attention_mask = attention_mask[None]
        # [batch, 1, length] (keys only, what padding alone merges to) is accepted too.
        static_length = tf.get_static_value(length)
        queries, keys = attention_mask.shape[1:]
        if static_length is not None and (queries not in (None, 1, static_length)
                                          or keys not in (None, static_length)):
            raise ValueError(f"`attention_mask` must have shape [batch, length, length] with length "
                             f"{static_length}, got shape {attention_mask.shape}.")
        dynamic = tf.shape(attention_mask)
        fits = tf.logical_and(tf.equal(dynamic[2], length),
                              tf.logical_or(tf.equal(dynamic[1], length), tf.equal(dynamic[1], 1)))
        checks = check(fits, "`attention_mask` must have shape [batch, length, length] with length {}, "
                       "got shape {}.", length, dynamic)
        parts.append(with_checks(attention_mask, checks))
    if use_causal_mask:
        positions = tf.range(length)
        parts.append((positions[:, None] >= positions[None, :])[None])
    if segment_ids is not None:
        segment_ids = tf.convert_to_tensor(segment_ids)
        if segment_ids.dtype.is_floating:
            raise TypeError(f"`segment_ids` must be integers, got dtype {segment_ids.dtype.name}.")
        parts.append(tf.equal(segment_ids[:, :, None], segment_ids[:, None, :]))
    if not parts:
        return None
    merged = parts[0]
    for part in parts[1:]:
        merged = tf.logical_and(merged, part)
    return merged


@keras.utils.register_keras_serializable(package="keras_posenc")
class EncoderLayer(keras.layers.Layer):
    """One Transformer encoder block: self-attention, then a feed-forward net.

    Each sublayer is wrapped in dropout, a residual connection and
    `LayerNormalization(axis=-1)`. Post-LN (the paper, default):
    `x = LN(x + dropout(sublayer(x)))`. Pre-LN (`norm_first=True`):
    `x = x + dropout(sublayer(LN(x)))`, which trains more stably without
    warmup but leaves the output un-normalised (`Encoder` then adds a final
    LayerNormalization).

    All masks are merged explicitly into one boolean `[B, T, T]` attention
    mask before calling `MultiHeadAttention` (query and key padding from the
    Keras mask, `attention_mask`, the causal mask), instead of relying on the
    implicit mask handling of `MultiHeadAttention`, which differs between
    Keras versions. Padding queries attend to nothing; their outputs stay
    finite and the Keras mask is passed on unchanged.

    Args:
        d_model: int, model width (input and output last dimension).
        num_heads: int, attention heads; `d_model` must be divisible by it.
        dff: int, hidden width of the feed-forward net.
        dropout: float in [0, 1), on attention probabilities and on each
            sublayer output.
        norm_first: bool, pre-LN instead of post-LN.
        activation: activation of the feed-forward hidden layer.
        epsilon: float > 0, LayerNormalization epsilon.
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
        training: bool, enables dropout.

    Example:

    >>> layer = EncoderLayer(d_model=8, num_heads=2, dff=16)
    >>> x = tf.random.normal([2, 5, 8])
    >>> mask = tf.constant([[True] * 5, [True, True, True, False, False]])
    >>> y = layer(x, mask=mask)
    >>> y.shape
    TensorShape([2, 5, 8])
    >>> bool(tf.reduce_all(tf.math.is_finite(y)))
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.1.
        - [Xiong et al., 2020](https://arxiv.org/abs/2002.04745), pre-LN.
    """

    def __init__(self, d_model, num_heads, dff, *, dropout=0.1, norm_first=False, activation="relu",
                 epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("dff", dff)
        if d_model % num_heads:
            raise ValueError(f"`d_model` must be divisible by `num_heads`, got d_model={d_model} and "
                             f"num_heads={num_heads}.")
        check_rate("dropout", dropout)
        check_epsilon(epsilon)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.activation = keras.activations.get(activation)
        self.epsilon = float(epsilon)
        self.supports_masking = True
        policy = self.dtype_policy
        self.attention = keras.layers.MultiHeadAttention(
            num_heads, d_model // num_heads, dropout=self.dropout, dtype=policy, name="attention")
        self.attention_norm = keras.layers.LayerNormalization(
            axis=-1, epsilon=self.epsilon, dtype=policy, name="attention_norm")
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=policy)
        self.ffn_hidden = keras.layers.Dense(dff, activation=self.activation, dtype=policy, name="ffn_hidden")
        self.ffn_output = keras.layers.Dense(d_model, dtype=policy, name="ffn_output")
        self.ffn_norm = keras.layers.LayerNormalization(
            axis=-1, epsilon=self.epsilon, dtype=policy, name="ffn_norm")
        self.ffn_dropout = keras.layers.Dropout(self.dropout, dtype=policy)

    def build(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if input_shape.rank != 3 or input_shape[-1] != self.d_model:
            raise ValueError(f"`x` must have shape [batch, length, d_model={self.d_model}], "
                             f"got shape {input_shape}.")
        hidden_shape = input_shape[:-1].concatenate([self.dff])
        # Each sublayer is built inside its own name scope so weight names are unique
        # ("attention_norm/gamma", "ffn_norm/gamma"), as the legacy h5 format requires.
        with tf.name_scope(self.attention.name):
            self.attention._build_from_signature(input_shape, input_shape)
        for layer, shape in ((self.attention_norm, input_shape), (self.ffn_hidden, input_shape),
                             (self.ffn_output, hidden_shape), (self.ffn_norm, input_shape)):
            with tf.name_scope(layer.name):
                layer.build(shape)
        super().build(input_shape)

    def call(self, x, mask=None, attention_mask=None, use_causal_mask=False, training=None):
        if x.shape.rank != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"`x` must have shape [batch, length, d_model={self.d_model}], "
                             f"got shape {x.shape}.")
        merged = merge_attention_masks(static_or_dynamic_length(x), mask=mask, attention_mask=attention_mask,
                                       use_causal_mask=use_causal_mask)
        # A fresh tensor without `_keras_mask`, so MultiHeadAttention sees only `merged_mask`.
        x = tf.identity(x)
        residual = x
        if self.norm_first:
            x = self.attention_norm(x)
        x = self.attention(x, x, attention_mask=merged, training=training)
        x = residual + self.attention_dropout(x, training=training)
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

    def compute_mask(self, x, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return tf.TensorShape(input_shape)

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
        })
        return config
