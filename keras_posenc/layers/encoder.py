"""Encoder: token and position embedding followed by a stack of EncoderLayers."""

from keras_posenc.backend import keras, ops, static_call, weight_name_scope
from keras_posenc.layers._shape_preserving import input_shape_of
from keras_posenc.layers.encoder_layer import (
    ATTENTION_POSITIONS,
    EncoderLayer,
    merge_attention_masks,
    static_or_dynamic_length,
)
from keras_posenc.layers.token_and_position_embedding import POSITION_LAYERS, TokenAndPositionEmbedding
from keras_posenc.positions import position_ids as derive_position_ids
from keras_posenc.validation import check_choice, check_epsilon, check_positive_int, check_rate

__all__ = ["ENCODER_POSITIONS", "NAMED_POSITIONS", "Encoder", "EncoderLayer", "embedding_kwargs",
           "named_position", "split_position"]

# Every `position` an Encoder takes: the additive embedding layers, then the ones inside attention.
ENCODER_POSITIONS = tuple(POSITION_LAYERS) + ATTENTION_POSITIONS
# The `--position` choices of the commands: every Encoder position plus RoPE with a scaling.
NAMED_POSITIONS = ENCODER_POSITIONS + ("rope-ntk", "rope-yarn", "rope-llama3")


def named_position(name, max_length, *, scaling_factor=4.0):
    """`(position, position_config)` of `Encoder` for a `--position` name of the commands.

    "rope-ntk", "rope-yarn" and "rope-llama3" are RoPE with NTK-aware,
    YaRN or Llama 3.1 scaling by `scaling_factor`, the last two with
    `max_length` (the training length) as the original context; every
    other name is an `Encoder` position with no options.

    Args:
        name: one of `NAMED_POSITIONS`.
        max_length: int, the training length.
        scaling_factor: float >= 1, the RoPE scaling factor.

    Returns:
        A pair `(str, dict)`.

    Example:

    >>> named_position("rope-yarn", 64)
    ('rope', {'scaling': 'yarn', 'scaling_factor': 4.0, 'original_length': 64})
    >>> named_position("alibi", 64)
    ('alibi', {})
    """
    check_choice("position", name, NAMED_POSITIONS)
    if name == "rope-ntk":
        return "rope", {"scaling": "ntk", "scaling_factor": float(scaling_factor)}
    if name in ("rope-yarn", "rope-llama3"):
        return "rope", {"scaling": name[len("rope-"):], "scaling_factor": float(scaling_factor),
                        "original_length": max_length}
    return name, {}


def split_position(position, position_config, max_length):
    """Where a stack's position acts: `((embedding position, its config), (attention position, its config))`.

    An additive position lives in the token embedding and the attention has
    none; "rope" and "alibi" live in the attention and the embedding adds no
    position (it keeps `overflow`). RoPE gets a `max_length`-row table unless
    `overflow="extend"`.

    Example:

    >>> split_position("rope", {"overflow": "extend"}, 64)
    (('none', {'overflow': 'extend'}), ('rope', {'max_length': None}))
    >>> split_position("learned", {"num_languages": 2}, 64)
    (('learned', {'num_languages': 2}), (None, None))
    """
    if position not in ATTENTION_POSITIONS:
        return (position, position_config), (None, None)
    layer_config = dict(position_config)
    overflow = layer_config.pop("overflow", "error")
    if position == "rope":
        layer_config.setdefault("max_length", None if overflow == "extend" else max_length)
    return ("none", {"overflow": overflow}), (position, layer_config)


def embedding_kwargs(position_config):
    """`TokenAndPositionEmbedding` keyword arguments for a stack's position config.

    The config's keys go flat (the position layer's options and the
    embedding's own, such as `scale_embeddings`), except `dropout`, which is
    the position layer's own dropout: it goes in `position_config`, since a
    flat `dropout` is the embedding's dropout on the sum.

    Example:

    >>> embedding_kwargs({"table": "full", "dropout": 0.1})
    {'table': 'full', 'position_config': {'dropout': 0.1}}
    >>> embedding_kwargs({"scale_embeddings": False})
    {'scale_embeddings': False}
    """
    kwargs = dict(position_config)
    if "dropout" in kwargs:
        kwargs["position_config"] = {"dropout": kwargs.pop("dropout")}
    return kwargs


@keras.utils.register_keras_serializable(package="keras_posenc")
class Encoder(keras.layers.Layer):
    """A Transformer encoder over token ids.

    `TokenAndPositionEmbedding`, then `num_layers` `EncoderLayer`s, then,
    for pre-LN stacks only, a final `LayerNormalization` (post-LN blocks
    already end normalised).

    Positions: an additive kind of
    `keras_posenc.layers.token_and_position_embedding.POSITION_LAYERS` is
    added to the token embeddings; "rope" (rotary queries and keys) and
    "alibi" (linear biases on the attention logits) act inside every
    `EncoderLayer` instead, with per-sample position ids (from
    `position_ids`, or numbered over the real tokens of each row, restarting
    at every segment), so left padding and packing are exact there too.

    Masks: padding (`token_ids == pad_id`) masks keys (a padding query's
    output is finite and ignored) and the Keras mask is emitted for later
    layers. `attention_mask` and
    `use_causal_mask` are merged in. With `segment_ids` (several sequences
    packed in one row), position ids restart at each segment and attention is
    block-diagonal: a token attends only to tokens of its own segment, so a
    packed row computes exactly what its sequences would compute alone. The
    merged mask is built once and shared by all layers.

    Args:
        num_layers: int, number of encoder blocks.
        d_model: int, model width.
        num_heads: int, attention heads.
        dff: int, feed-forward hidden width.
        vocab_size: int, number of token ids.
        max_length: int, longest sequence (rows of the position table).
        dropout: float in [0, 1), used by the embedding and every block.
        norm_first: bool, pre-LN blocks plus a final LayerNormalization.
        activation: feed-forward activation.
        epsilon: float > 0, LayerNormalization epsilon.
        pad_id: int, the padding token id.
        position: one of `ENCODER_POSITIONS`: "sinusoidal", "learned",
            "integer", "none" (additive), "rope" or "alibi" (in attention).
        position_config: optional dict of the position's options: keyword
            arguments of the additive position layer (for example `table`,
            `num_languages`, `overflow`, `dropout`), or of
            `keras_posenc.layers.RotaryEmbedding` for "rope". With "rope"
            and "alibi", `overflow="extend"` accepts sequences longer than
            `max_length` (RoPE angles are then computed for every call
            instead of gathered from a `max_length`-row table).
        **position_kwargs: the same options given flat (merged into
            `position_config`).

    Call arguments:
        token_ids: int tensor `[batch, length]`.
        position_ids: optional int `[batch, length]`.
        language_ids: int `[batch]` or `[batch, length]`, required exactly
            when `num_languages` is given.
        segment_ids: optional int `[batch, length]` for packed rows.
        attention_mask: optional bool `[batch, length, length]`.
        use_causal_mask: bool, forbid attention to later positions.
        training: bool, enables dropout.

    Returns:
        A float tensor `[batch, length, d_model]` carrying the padding mask.

    Example:

    >>> encoder = Encoder(num_layers=2, d_model=8, num_heads=2, dff=16, vocab_size=50,
    ...                   max_length=16)
    >>> ids = ops.convert_to_tensor([[5, 6, 7, 0], [0, 8, 9, 4]])
    >>> tuple(encoder(ids).shape)
    (2, 4, 8)
    >>> ops.convert_to_numpy(encoder.compute_mask(ids)).tolist()  # the mask it emits
    [[True, True, True, False], [False, True, True, True]]
    >>> rope = Encoder(num_layers=1, d_model=8, num_heads=2, dff=16, vocab_size=50, max_length=16,
    ...                position="rope", position_config={"scaling": "ntk", "scaling_factor": 2.0})
    >>> tuple(rope(ids).shape)
    (2, 4, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864), RoPE.
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409), ALiBi.
    """

    def __init__(self, num_layers, d_model, num_heads, dff, vocab_size, max_length, *, dropout=0.1,
                 norm_first=False, activation="relu", epsilon=1e-6, pad_id=0, position="sinusoidal",
                 position_config=None, **position_kwargs):
        layer_kwargs = {k: position_kwargs.pop(k) for k in ("name", "dtype", "trainable")
                        if k in position_kwargs}
        super().__init__(**layer_kwargs)
        check_positive_int("num_layers", num_layers)
        check_choice("position", position, ENCODER_POSITIONS)
        position_config = {**(position_config or {}), **position_kwargs}
        check_rate("dropout", dropout)
        check_epsilon(epsilon)
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.activation = keras.activations.get(activation)
        self.epsilon = float(epsilon)
        self.pad_id = pad_id
        self.position = position
        self.position_config = position_config
        self.supports_masking = True
        policy = self.dtype_policy
        (embedding_position, embedding_config), (layer_position, layer_config) = split_position(
            position, position_config, max_length)
        self.embedding = TokenAndPositionEmbedding(
            vocab_size, d_model, max_length, pad_id=pad_id, position=embedding_position, dropout=self.dropout,
            dtype=policy, name="embedding", **embedding_kwargs(embedding_config))
        self.encoder_layers = [
            EncoderLayer(d_model, num_heads, dff, dropout=self.dropout, norm_first=self.norm_first,
                         activation=self.activation, epsilon=self.epsilon, position=layer_position,
                         position_config=layer_config, dtype=policy, name=f"encoder_layer_{i}")
            for i in range(num_layers)
        ]
        self.final_norm = None
        if self.norm_first:
            self.final_norm = keras.layers.LayerNormalization(
                axis=-1, epsilon=self.epsilon, dtype=policy, name="final_norm")

    def build(self, input_shape=None, **shapes):
        input_shape = input_shape_of(self, input_shape, shapes)
        hidden_shape = input_shape + (self.d_model,)
        sublayers = [(self.embedding, input_shape)] + [(layer, hidden_shape) for layer in self.encoder_layers]
        if self.final_norm is not None:
            sublayers.append((self.final_norm, hidden_shape))
        for layer, shape in sublayers:
            with weight_name_scope(layer.name):  # unique weight names for the legacy h5 format
                layer.build(shape)
        super().build(input_shape)

    @static_call
    def call(self, token_ids, position_ids=None, language_ids=None, segment_ids=None, attention_mask=None,
             use_causal_mask=False, training=None, cache=None, cache_index=None):
        if cache is not None:
            return self._call_with_cache(token_ids, position_ids, language_ids, segment_ids, attention_mask,
                                         cache, cache_index)
        padding_mask = ops.not_equal(token_ids, self.pad_id)
        in_attention = self.position in ATTENTION_POSITIONS
        if in_attention and position_ids is None:
            position_ids = derive_position_ids(padding_mask, segment_ids=segment_ids)
        x = self.embedding(token_ids, position_ids=None if in_attention else position_ids,
                           language_ids=language_ids, segment_ids=segment_ids, training=training)
        merged = merge_attention_masks(static_or_dynamic_length(token_ids), mask=padding_mask,
                                       attention_mask=attention_mask, use_causal_mask=use_causal_mask,
                                       segment_ids=segment_ids)
        layer_ids = position_ids if in_attention else None
        for layer in self.encoder_layers:
            # mask=None: the padding mask is already inside `merged`.
            x = layer(x, mask=None, attention_mask=merged, position_ids=layer_ids, training=training)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x

    def _call_with_cache(self, token_ids, position_ids, language_ids, segment_ids, attention_mask, cache,
                         cache_index):
        if segment_ids is not None or attention_mask is not None:
            raise ValueError("`segment_ids` and `attention_mask` cannot be combined with `cache`.")
        if len(cache.shape) != 6 or cache.shape[1] != self.num_layers:
            raise ValueError(f"`cache` must have shape [batch, num_layers={self.num_layers}, 2, "
                             f"cache_length, num_heads, head_dim], got shape {tuple(cache.shape)}.")
        keys = [cache[:, i, 0] for i in range(self.num_layers)]
        values = [cache[:, i, 1] for i in range(self.num_layers)]
        x, keys, values = self.cached_step(token_ids, keys, values, cache_index, position_ids=position_ids,
                                           language_ids=language_ids)
        return x, ops.stack([ops.stack(pair, axis=1) for pair in zip(keys, values)], axis=1)

    def cached_step(self, token_ids, key_caches, value_caches, cache_index, position_ids=None,
                    language_ids=None, embeddings=None):
        """Causal decoding of one chunk against per-layer key and value caches.

        What `call(..., cache=, cache_index=)` runs, with the cache as one
        `[batch, cache_length, num_heads, head_dim]` tensor per layer and
        kind (the layout the exported prefill/decode files take); see
        `EncoderLayer.cached_step` for the slots.

        Args:
            token_ids: int `[batch, length]`, the chunk starting at slot `cache_index`.
            key_caches, value_caches: lists of `num_layers` float tensors.
            cache_index: int scalar (tensor).
            position_ids: optional int `[batch, length]`; default: the chunk's
                real tokens numbered from `cache_index` (rows with no padding
                before the chunk).
            language_ids: as in `call`.
            embeddings: optional float `[batch, length, d_model]`, the chunk's rows as
                `self.embedding` would give them (an export computes them with its target's
                lookup); default: `self.embedding(token_ids, ...)`.

        Returns:
            `(outputs [batch, length, d_model], key_caches, value_caches)`.
        """
        if cache_index is None:
            raise ValueError("`cache` needs `cache_index`, the slot of the chunk's first token.")
        if position_ids is None:
            position_ids = derive_position_ids(ops.not_equal(token_ids, self.pad_id), offset=cache_index)
        x = embeddings
        if x is None:
            in_attention = self.position in ATTENTION_POSITIONS
            x = self.embedding(token_ids, position_ids=None if in_attention else position_ids,
                               language_ids=language_ids, training=False)
        keys, values = [], []
        for layer, key_cache, value_cache in zip(self.encoder_layers, key_caches, value_caches):
            x, key_cache, value_cache, _ = layer.cached_step(x, key_cache, value_cache, cache_index,
                                                             position_ids)
            keys.append(key_cache)
            values.append(value_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, keys, values

    def cache_shape(self, batch_size, cache_length):
        """The shape of an empty key/value cache: `[batch, num_layers, 2, cache_length, heads, head_dim]`."""
        return (batch_size, self.num_layers, 2, cache_length, self.num_heads, self.d_model // self.num_heads)

    def compute_mask(self, token_ids, mask=None):
        return ops.not_equal(token_ids, self.pad_id)  # keras ops: token_ids may be a Keras 3 KerasTensor

    def compute_output_shape(self, input_shape=None, **shapes):
        return input_shape_of(self, input_shape, shapes) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_layers": self.num_layers,
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "dff": self.dff,
            "vocab_size": self.vocab_size,
            "max_length": self.max_length,
            "dropout": self.dropout,
            "norm_first": self.norm_first,
            "activation": keras.activations.serialize(self.activation),
            "epsilon": self.epsilon,
            "pad_id": self.pad_id,
            "position": self.position,
            "position_config": dict(self.position_config),
        })
        return config
