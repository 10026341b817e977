"""EncoderLayer: one Transformer encoder block (self-attention + feed-forward)."""

from keras_posenc.backend import (
    attention_kernel_initializer,
    keras,
    ops,
    static_call,
    weight_name_scope,
    without_keras_mask,
)
from keras_posenc.layers._shape_preserving import ShapePreserving, input_shape_of
from keras_posenc.layers.attention_masks import merge_attention_masks, static_or_dynamic_length
from keras_posenc.layers.positional_attention import ATTENTION_POSITIONS, PositionalAttention
from keras_posenc.positions import position_ids as derive_position_ids
from keras_posenc.validation import check_epsilon, check_positive_int, check_rate

__all__ = ["ATTENTION_POSITIONS", "EncoderLayer", "block_config", "check_block_arguments",
           "feed_forward_block", "merge_attention_masks", "residual_block", "self_attention_block",
           "static_or_dynamic_length"]


def residual_block(x, sublayer, norm, norm_first):
    """One residual sublayer: pre-LN `x + sublayer(norm(x))` or post-LN `norm(x + sublayer(x))`.

    Args:
        x: the block's input.
        sublayer: a function of one tensor (attention or feed-forward, with its dropout).
        norm: a function of one tensor (the sublayer's LayerNormalization).
        norm_first: bool, pre-LN.

    Example:

    >>> residual_block(3.0, lambda h: 2 * h, lambda h: h + 100, norm_first=True)
    209.0
    >>> residual_block(3.0, lambda h: 2 * h, lambda h: h + 100, norm_first=False)
    109.0
    """
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


def check_block_arguments(d_model, num_heads, dff, dropout, epsilon):
    """Checks the arguments of a Transformer block (`EncoderLayer`, `DecoderLayer`), naming a bad one."""
    check_positive_int("d_model", d_model)
    check_positive_int("num_heads", num_heads)
    check_positive_int("dff", dff)
    if d_model % num_heads:
        raise ValueError(f"`d_model` must be divisible by `num_heads`, got d_model={d_model} and "
                         f"num_heads={num_heads}.")
    check_rate("dropout", dropout)
    check_epsilon(epsilon)


def block_config(layer):
    """The constructor arguments of a Transformer block (`EncoderLayer`, `DecoderLayer`), for `get_config`."""
    return {
        "d_model": layer.d_model,
        "num_heads": layer.num_heads,
        "dff": layer.dff,
        "dropout": layer.dropout,
        "norm_first": layer.norm_first,
        "activation": keras.activations.serialize(layer.activation),
        "epsilon": layer.epsilon,
        "position": layer.position,
        "position_config": dict(layer.position_config),
    }


def self_attention_block(x, attention, dropout, norm, norm_first, *, attention_mask, mask, position_ids,
                         training, scores=None):
    """A block's self-attention sublayer: `residual_block` around `attention` and its dropout.

    A `PositionalAttention` with RoPE or ALiBi gets `position_ids`, else ids
    numbered over the real tokens of the Keras `mask`. With a list `scores`,
    the attention probabilities are appended to it.
    """
    arguments = {}
    if attention.position is not None:
        if position_ids is None and mask is not None:
            position_ids = derive_position_ids(mask)
        arguments["position_ids"] = position_ids

    def attend(h):
        if scores is not None:
            h, weights = attention(h, h, attention_mask=attention_mask, training=training,
                                   return_attention_scores=True, **arguments)
            scores.append(weights)
        else:
            h = attention(h, h, attention_mask=attention_mask, training=training, **arguments)
        return dropout(h, training=training)

    return residual_block(x, attend, norm, norm_first)


def feed_forward_block(block, x, training):
    """A block's feed-forward sublayer: `ffn_hidden`, `ffn_output`, `ffn_dropout` of `block`, residual."""
    def feed_forward(h):
        return block.ffn_dropout(block.ffn_output(block.ffn_hidden(h)), training=training)

    return residual_block(x, feed_forward, block.ffn_norm, block.norm_first)


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

    Positions inside the attention (`position="rope"` or `"alibi"`, the
    attention being a `keras_posenc.layers.PositionalAttention`): the
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

    >>> import numpy as np
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
        check_block_arguments(d_model, num_heads, dff, dropout, epsilon)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.activation = keras.activations.get(activation)
        self.epsilon = float(epsilon)
        self.supports_masking = True
        policy = self.dtype_policy
        self.attention = PositionalAttention(
            num_heads, d_model // num_heads, dropout=self.dropout, position=position,
            position_config=position_config, kernel_initializer=attention_kernel_initializer(), dtype=policy,
            name="attention")
        self.position = position
        self.position_config = dict(self.attention.position_config)
        self.attention_norm = keras.layers.LayerNormalization(
            axis=-1, epsilon=self.epsilon, dtype=policy, name="attention_norm")
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=policy)
        self.ffn_hidden = keras.layers.Dense(dff, activation=self.activation, dtype=policy, name="ffn_hidden")
        self.ffn_output = keras.layers.Dense(d_model, dtype=policy, name="ffn_output")
        self.ffn_norm = keras.layers.LayerNormalization(
            axis=-1, epsilon=self.epsilon, dtype=policy, name="ffn_norm")
        self.ffn_dropout = keras.layers.Dropout(self.dropout, dtype=policy)

    @property
    def rotary(self):
        """The attention's `RotaryEmbedding` (position="rope"), else None."""
        return self.attention.rotary

    @property
    def slopes(self):
        """The attention's ALiBi slopes (position="alibi"), else None."""
        return self.attention.slopes

    def build(self, input_shape=None, **shapes):
        input_shape = input_shape_of(self, input_shape, shapes)
        if len(input_shape) != 3 or input_shape[-1] != self.d_model:
            raise ValueError(f"`x` must have shape [batch, length, d_model={self.d_model}], "
                             f"got shape {input_shape}.")
        hidden_shape = input_shape[:-1] + (self.dff,)
        # Each sublayer is built inside its own name scope so weight names are unique
        # ("attention_norm/gamma", "ffn_norm/gamma"), as the legacy h5 format requires.
        with weight_name_scope(self.attention.name):
            self.attention.build(input_shape, input_shape)
        for layer, shape in ((self.attention_norm, input_shape), (self.ffn_hidden, input_shape),
                             (self.ffn_output, hidden_shape), (self.ffn_norm, input_shape)):
            with weight_name_scope(layer.name):
                layer.build(shape)
        super().build(input_shape)

    @static_call
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
        x = without_keras_mask(x)
        scores = [] if return_attention_scores else None
        x = self_attention_block(x, self.attention, self.attention_dropout, self.attention_norm,
                                 self.norm_first, attention_mask=merged, mask=mask, position_ids=position_ids,
                                 training=training, scores=scores)
        x = feed_forward_block(self, x, training)
        if return_attention_scores:
            return x, scores[0]
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
        x = without_keras_mask(x)
        caches = []

        def attend(h):
            h, *state = self.attention.cached_attention(h, key_cache, value_cache, cache_index, position_ids)
            caches.extend(state)
            return h

        x = residual_block(x, attend, self.attention_norm, self.norm_first)
        x = feed_forward_block(self, x, training=False)
        return (x, *caches)

    def get_config(self):
        config = super().get_config()
        config.update(block_config(self))
        return config
