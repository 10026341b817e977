"""DecoderLayer: one Transformer decoder block (causal self-attention, cross-attention, feed-forward)."""

from keras_posenc.backend import (
    attention_kernel_initializer,
    keras,
    static_call,
    weight_name_scope,
    without_keras_mask,
)
from keras_posenc.layers._shape_preserving import ShapePreserving, input_shape_of
from keras_posenc.layers.attention_masks import merge_attention_masks, static_or_dynamic_length
from keras_posenc.layers.encoder_layer import (
    block_config,
    check_block_arguments,
    feed_forward_block,
    residual_block,
    self_attention_block,
)
from keras_posenc.layers.positional_attention import PositionalAttention

__all__ = ["DecoderLayer"]


@keras.utils.register_keras_serializable(package="keras_posenc")
class DecoderLayer(ShapePreserving, keras.layers.Layer):
    """One Transformer decoder block: causal self-attention, cross-attention, feed-forward.

    The block of Vaswani et al.'s decoder: the target attends causally to
    itself, then to the encoder's outputs (only to real source tokens, by
    `encoder_mask`), then a feed-forward net. Each sublayer is wrapped in
    dropout, a residual connection and `LayerNormalization`, post-LN (the
    paper, default) or pre-LN (`norm_first=True`), as in `EncoderLayer`.

    Positions: with `position="rope"` or `"alibi"` the self-attention is a
    `PositionalAttention` that takes them from `position_ids` (or from the
    Keras mask); cross-attention has no position term, as in the paper (the
    source positions are already in the encoder's outputs).

    Cross-attention is computed from keys and values of the encoder outputs
    (`cross_key_value`), so that a decoder step reuses them: one projection
    per sentence, not one per generated token. `call` and `cached_step` run
    the same cross-attention code.

    Args:
        d_model: int, model width.
        num_heads: int, attention heads; `d_model` must be divisible by it.
        dff: int, hidden width of the feed-forward net.
        dropout: float in [0, 1), on attention probabilities and on each
            sublayer output.
        norm_first: bool, pre-LN instead of post-LN.
        activation: activation of the feed-forward hidden layer.
        epsilon: float > 0, LayerNormalization epsilon.
        position: None (positions added to the embeddings), "rope" or
            "alibi" (in the self-attention).
        position_config: optional dict, `RotaryEmbedding`'s keyword
            arguments for "rope".
        **kwargs: standard layer arguments (`name`, `dtype`, ...).

    Call arguments:
        x: float `[batch, target_length, d_model]`, the target embeddings.
        encoder_outputs: float `[batch, source_length, d_model]`.
        mask: optional bool `[batch, target_length]`, True for real target
            tokens (filled in by Keras from the target embedding).
        encoder_mask: optional bool `[batch, source_length]`, True for real
            source tokens; padding is never attended to.
        position_ids: optional int `[batch, target_length]`, for "rope" and
            "alibi".
        training: bool, enables dropout.
        return_attention_scores: bool, also return the self- and
            cross-attention probabilities (`[batch, heads, target_length,
            target_length]`, `[batch, heads, target_length, source_length]`).

    Returns:
        `[batch, target_length, d_model]`, or `(outputs, self_scores,
        cross_scores)`.

    Example:

    >>> import numpy as np
    >>> from keras_posenc.backend import ops
    >>> layer = DecoderLayer(d_model=8, num_heads=2, dff=16)
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=[2, 4, 8]).astype("float32")
    >>> source = rng.normal(size=[2, 6, 8]).astype("float32")
    >>> source_mask = np.array([[True] * 6, [True, True, True, False, False, False]])
    >>> y, _, cross = layer(x, source, encoder_mask=source_mask, return_attention_scores=True)
    >>> tuple(y.shape), float(ops.convert_to_numpy(cross)[1, :, :, 3:].max())  # no source padding
    ((2, 4, 8), 0.0)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.1.
        - [Xiong et al., 2020](https://arxiv.org/abs/2002.04745), pre-LN.
        - keras-hub's `TransformerDecoder`, the keras-io translation example.
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
        head_dim = d_model // num_heads
        self.self_attention = PositionalAttention(
            num_heads, head_dim, dropout=self.dropout, position=position, position_config=position_config,
            kernel_initializer=attention_kernel_initializer(), dtype=policy, name="self_attention")
        self.position = position
        self.position_config = dict(self.self_attention.position_config)
        self.cross_attention = PositionalAttention(
            num_heads, head_dim, dropout=self.dropout, kernel_initializer=attention_kernel_initializer(),
            dtype=policy, name="cross_attention")
        self.self_attention_norm = self._norm("self_attention_norm")
        self.cross_attention_norm = self._norm("cross_attention_norm")
        self.ffn_norm = self._norm("ffn_norm")
        self.self_attention_dropout = keras.layers.Dropout(self.dropout, dtype=policy)
        self.cross_attention_dropout = keras.layers.Dropout(self.dropout, dtype=policy)
        self.ffn_dropout = keras.layers.Dropout(self.dropout, dtype=policy)
        self.ffn_hidden = keras.layers.Dense(dff, activation=self.activation, dtype=policy, name="ffn_hidden")
        self.ffn_output = keras.layers.Dense(d_model, dtype=policy, name="ffn_output")

    def _norm(self, name):
        return keras.layers.LayerNormalization(axis=-1, epsilon=self.epsilon, dtype=self.dtype_policy,
                                               name=name)

    def build(self, x_shape=None, encoder_outputs_shape=None, **shapes):
        input_shape = input_shape_of(self, x_shape, shapes)
        self._check_shape("x", input_shape)
        encoder_shape = tuple(encoder_outputs_shape) if encoder_outputs_shape is not None else input_shape
        hidden_shape = input_shape[:-1] + (self.dff,)
        # Each sublayer in its own name scope: unique weight names for the legacy h5 format.
        with weight_name_scope(self.self_attention.name):
            self.self_attention.build(input_shape, input_shape)
        with weight_name_scope(self.cross_attention.name):
            self.cross_attention.build(input_shape, encoder_shape)
        for layer, shape in ((self.self_attention_norm, input_shape),
                             (self.cross_attention_norm, input_shape), (self.ffn_hidden, input_shape),
                             (self.ffn_output, hidden_shape), (self.ffn_norm, input_shape)):
            with weight_name_scope(layer.name):
                layer.build(shape)
        super().build(input_shape)

    def _check_shape(self, name, shape):
        if len(shape) != 3 or shape[-1] != self.d_model:
            raise ValueError(f"`{name}` must have shape [batch, length, d_model={self.d_model}], "
                             f"got shape {tuple(shape)}.")

    @static_call
    def call(self, x, encoder_outputs, mask=None, encoder_mask=None, position_ids=None, training=None,
             return_attention_scores=False):
        self._check_shape("x", tuple(x.shape))
        self._check_shape("encoder_outputs", tuple(encoder_outputs.shape))
        merged = merge_attention_masks(static_or_dynamic_length(x), mask=mask, use_causal_mask=True)
        x = without_keras_mask(x)
        scores = [] if return_attention_scores else None
        x = self_attention_block(x, self.self_attention, self.self_attention_dropout,
                                 self.self_attention_norm, self.norm_first, attention_mask=merged, mask=mask,
                                 position_ids=position_ids, training=training, scores=scores)
        keys, values = self.cross_key_value(encoder_outputs)
        x = self._cross_attention_block(x, keys, values, encoder_mask, training, scores)
        x = feed_forward_block(self, x, training)
        if return_attention_scores:
            return x, scores[0], scores[1]
        return x

    def cross_key_value(self, encoder_outputs):
        """The cross-attention's keys and values: two `[batch, source_length, heads, head_dim]`.

        Computed once per sentence; every decoder step reads them.
        """
        encoder_outputs = without_keras_mask(encoder_outputs)
        attention = self.cross_attention
        return attention.key_dense(encoder_outputs), attention.value_dense(encoder_outputs)

    def _cross_attention_block(self, x, keys, values, encoder_mask, training, scores=None):
        def cross_attend(h):
            h, weights = self.cross_attention.attend_projected(h, keys, values, key_mask=encoder_mask,
                                                               training=training)
            if scores is not None:
                scores.append(weights)
            return self.cross_attention_dropout(h, training=training)

        return residual_block(x, cross_attend, self.cross_attention_norm, self.norm_first)

    def cached_step(self, x, key_cache, value_cache, cache_index, position_ids, cross_keys, cross_values,
                    encoder_mask=None, write_cache=None):
        """One incremental step: self-attention over the cache, cross-attention over precomputed keys.

        The self-attention cache works as `EncoderLayer.cached_step`'s (slot
        `s` holds the target token of step `s`); the cross-attention reads
        `cross_keys` / `cross_values` (`cross_key_value`), computed once per
        sentence.

        Args:
            x: float `[batch, length, d_model]`, the chunk starting at slot `cache_index`.
            key_cache, value_cache: float `[batch, cache_length, num_heads, head_dim]`.
            cache_index: int scalar (tensor).
            position_ids: int `[batch, length]`.
            cross_keys, cross_values: float `[batch, source_length, num_heads, head_dim]`.
            encoder_mask: optional bool `[batch, source_length]`.
            write_cache: optional, how the self-attention cache is written
                (`PositionalAttention.cached_attention`).

        Returns:
            `(outputs, key_cache, value_cache)`.
        """
        if position_ids is None or cache_index is None:
            raise ValueError("cached decoding needs `cache_index` and `position_ids` (int [batch, length]).")
        x = without_keras_mask(x)
        caches = []

        def self_attend(h):
            h, key, value, _ = self.self_attention.cached_attention(h, key_cache, value_cache, cache_index,
                                                                    position_ids, write_cache=write_cache)
            caches.extend((key, value))
            return h

        x = residual_block(x, self_attend, self.self_attention_norm, self.norm_first)
        x = self._cross_attention_block(x, cross_keys, cross_values, encoder_mask, training=False)
        x = feed_forward_block(self, x, training=False)
        return (x, *caches)

    def get_config(self):
        config = super().get_config()
        config.update(block_config(self))
        return config
