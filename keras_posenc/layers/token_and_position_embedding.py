"""TokenAndPositionEmbedding: token lookup plus any position embedding."""

import math

from keras_posenc.backend import dtype_name, keras, ops, static_call
from keras_posenc.layers._shape_preserving import input_shape_of
from keras_posenc.layers.integer_position_embedding import IntegerPositionEmbedding
from keras_posenc.layers.learned_position_embedding import LearnedPositionEmbedding
from keras_posenc.layers.sinusoidal_position_embedding import SinusoidalPositionEmbedding
from keras_posenc.layers.zero_position_embedding import ZeroPositionEmbedding
from keras_posenc.positions import position_ids as derive_position_ids
from keras_posenc.validation import check_choice, check_positive_int

__all__ = ["POSITION_LAYERS", "TokenAndPositionEmbedding"]

# Keyword arguments of keras.layers.Layer itself (they configure this layer, not the position one).
_LAYER_KWARGS = ("name", "dtype", "trainable", "autocast")

POSITION_LAYERS = {
    "sinusoidal": SinusoidalPositionEmbedding,
    "learned": LearnedPositionEmbedding,
    "integer": IntegerPositionEmbedding,
    "none": ZeroPositionEmbedding,
}


@keras.utils.register_keras_serializable(package="keras_posenc")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Embeds token ids and adds a position embedding.

    `output = dropout(embed(ids) * sqrt(d_model) + PE)`, where the sqrt scale
    (section 3.4 of the paper) is optional and PE is any of the package's
    position layers, chosen by name. The layer emits the Keras mask
    `token_ids != pad_id`, which the position layer uses to number each row's
    real tokens (left padding works) and zero PE at padding, and which later
    layers (attention) receive automatically.

    Args:
        vocab_size: int, number of token ids.
        d_model: int, embedding width.
        max_length: int, longest sequence (rows of the position table).
        pad_id: int, the padding token id (masked out).
        scale_embeddings: bool, multiply token embeddings by sqrt(d_model).
        position: name of the position embedding, one of
            `POSITION_LAYERS` ("sinusoidal", "learned", "integer", "none").
        dropout: float, dropout on the sum.
        embeddings_initializer: initializer of the token table.
        position_config: optional dict of keyword arguments of the position
            layer (for example `table`, `layout`, `num_languages`,
            `overflow`, and its own `dropout`, which applies to the position
            embedding only).
        **position_kwargs: the same keyword arguments given flat (kept for
            compatibility; `name`, `dtype`, `trainable` configure this
            layer, and `dropout` is the dropout on the sum: use
            `position_config` for the position layer's own).

    Call arguments:
        token_ids: int tensor `[batch, length]`.
        position_ids: optional int tensor `[batch, length]`.
        language_ids: int tensor `[batch]` or `[batch, length]` when
            `num_languages` is given.
        segment_ids: optional int tensor `[batch, length]` for packed rows:
            positions restart at every segment change.
        training: bool, enables dropout.

    Example:

    >>> import numpy as np
    >>> layer = TokenAndPositionEmbedding(vocab_size=100, d_model=8, max_length=16,
    ...                                   position_config={"table": "factorized"})
    >>> y = layer(np.array([[5, 6, 7, 0], [0, 0, 5, 6]]))
    >>> tuple(y.shape)
    (2, 4, 8)
    >>> ops.convert_to_numpy(layer.compute_mask(np.array([[5, 6, 7, 0]]))).tolist()
    [[True, True, True, False]]

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), sections 3.4-3.5.
    """

    def __init__(self, vocab_size, d_model, max_length, *, pad_id=0, scale_embeddings=True,
                 position="sinusoidal", dropout=0.1, embeddings_initializer="uniform",
                 position_config=None, **position_kwargs):
        layer_kwargs = {k: position_kwargs.pop(k) for k in _LAYER_KWARGS if k in position_kwargs}
        super().__init__(**layer_kwargs)
        if position_config is not None and not isinstance(position_config, dict):
            raise TypeError(f"`position_config` must be a dict or None, got "
                            f"position_config={position_config!r}.")
        both = sorted(set(position_config or {}) & set(position_kwargs))
        if both:
            raise ValueError(f"Position arguments {both} were given both in `position_config` and "
                             "as keyword arguments; give each once.")
        position_config = {**(position_config or {}), **position_kwargs}
        reserved = sorted(set(position_config) & {"max_length", "name", "dtype"})
        if reserved:
            raise ValueError(f"`position_config` may not set {reserved}: they come from this layer.")
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("d_model", d_model)
        check_positive_int("max_length", max_length)
        check_choice("position", position, POSITION_LAYERS)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
            raise ValueError(
                f"`pad_id` must be an int in [0, vocab_size={vocab_size}), got pad_id={pad_id!r}.")
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.max_length = max_length
        self.pad_id = pad_id
        self.scale_embeddings = bool(scale_embeddings)
        self.position = position
        self.dropout = float(dropout)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.position_config = dict(position_config)
        self.supports_masking = True
        self.token_embedding = keras.layers.Embedding(
            vocab_size, d_model, embeddings_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy, name="token_embedding")
        self.position_embedding = POSITION_LAYERS[position](
            max_length, dtype=self.dtype_policy, name="position_embedding", **position_config)
        self._dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    @property
    def position_kwargs(self):
        """The position layer's keyword arguments (an alias of `position_config`)."""
        return dict(self.position_config)

    def build(self, input_shape=None, **shapes):
        input_shape = input_shape_of(self, input_shape, shapes)
        self.token_embedding.build(input_shape)
        self.position_embedding.build(input_shape + (self.d_model,))
        super().build(input_shape)

    @static_call
    def call(self, token_ids, position_ids=None, language_ids=None, segment_ids=None, training=None):
        if len(token_ids.shape) != 2:
            raise ValueError(
                f"`token_ids` must have rank 2 [batch, length], got shape {tuple(token_ids.shape)}.")
        dtype = dtype_name(token_ids)
        if "int" not in dtype:
            raise TypeError(f"`token_ids` must be integers, got dtype {dtype}.")
        mask = ops.not_equal(token_ids, self.pad_id)
        x = self.token_embedding(token_ids)
        if self.scale_embeddings:
            x = x * ops.cast(math.sqrt(self.d_model), x.dtype)
        if position_ids is None and segment_ids is not None:
            position_ids = derive_position_ids(mask, segment_ids=segment_ids)
        x = self.position_embedding(x, position_ids=position_ids, language_ids=language_ids,
                                    mask=mask, training=training)
        return self._dropout_layer(x, training=training)

    def compute_mask(self, token_ids, mask=None):
        return ops.not_equal(token_ids, self.pad_id)

    def compute_output_shape(self, input_shape=None, **shapes):
        return input_shape_of(self, input_shape, shapes) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "max_length": self.max_length,
            "pad_id": self.pad_id,
            "scale_embeddings": self.scale_embeddings,
            "position": self.position,
            "dropout": self.dropout,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            "position_config": dict(self.position_config),
        })
        return config
