"""LearnedPositionEmbedding: a trainable table with the sinusoidal layer's semantics."""

from keras_posenc.backend import keras, no_autocast, ops
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase

__all__ = ["LearnedPositionEmbedding"]


@keras.utils.register_keras_serializable(package="keras_posenc")
class LearnedPositionEmbedding(PositionEmbeddingBase):
    """Adds a trainable `[max_length, depth]` position table to the inputs.

    Call semantics match `SinusoidalPositionEmbedding`: per-sample position ids
    derived from the mask (left padding, packed rows), zeroed padding, mask
    pass-through, optional per-language scale and dropout. A learned table has
    no rows past `max_length`, so only `overflow="error"` is accepted.

    The table variable is in the policy's variable dtype: float32 under
    `float32`, `mixed_float16` and `mixed_bfloat16` (rows gathered in
    float32, cast to the compute dtype at the add), bfloat16 under
    `bfloat16`.

    Args:
        max_length: int >= 1, number of trainable rows.
        initializer: initializer of the table (default: truncated normal with
            stddev 0.02, as in BERT).
        zero_padding: bool, zero the embedding where the mask is False.
        num_languages: optional int, learn a scale per language (init 1.0).
        dropout: float in [0, 1), dropout on the position embedding.
        overflow: only "error".
        **kwargs: standard layer arguments.

    Call arguments:
        inputs: float tensor `[batch, length, depth]`.
        position_ids: optional int tensor `[batch, length]` or `[length]`.
        language_ids: int tensor `[batch]` or `[batch, length]` when
            `num_languages` is set.
        mask: optional bool tensor `[batch, length]`.
        training: bool, enables dropout.

    Example:

    >>> import numpy as np
    >>> layer = LearnedPositionEmbedding(max_length=8)
    >>> y = layer(np.zeros([2, 3, 4], "float32"))
    >>> tuple(y.shape)
    (2, 3, 4)
    >>> [tuple(w.shape) for w in layer.trainable_weights]
    [(8, 4)]

    References:
        - [Devlin et al., 2019](https://arxiv.org/abs/1810.04805) (learned
          absolute positions in BERT).
    """

    def __init__(self, max_length=2048, *, initializer=None, zero_padding=True, num_languages=None,
                 dropout=0.0, overflow="error", **kwargs):
        super().__init__(max_length, zero_padding=zero_padding, num_languages=num_languages,
                         dropout=dropout, overflow=overflow, **kwargs)
        if initializer is None:
            initializer = keras.initializers.TruncatedNormal(stddev=0.02)
        self.initializer = keras.initializers.get(initializer)

    def _build_table(self, depth):
        self.position_table = self.add_weight(
            name="position_table", shape=[self.max_length, depth], initializer=self.initializer,
            trainable=True, **no_autocast())

    def _table_rows(self, ids):
        return ops.cast(ops.take(self.position_table, ids, axis=0), "float32")

    def _table_prefix(self, length):
        return ops.cast(self.position_table[:length], "float32")

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        return config
