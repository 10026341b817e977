"""SinusoidalPositionEmbedding: the fixed sin/cos table, padding-aware."""

import numpy as np
import tensorflow as tf
from tensorflow import keras

from keras_posenc import tables
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase, check_choice

TABLE_KINDS = ("full",)


@keras.utils.register_keras_serializable(package="keras_posenc")
class SinusoidalPositionEmbedding(PositionEmbeddingBase):
    """Adds the sinusoidal position encoding to a `[batch, length, depth]` input.

    The table is computed once in float64 numpy (`keras_posenc.sinusoidal_table`),
    stored as a float32 constant (never a weight, so no gradient reaches it and
    nothing is trained) and cast to the compute dtype only at the add, so
    `mixed_float16` models keep a correctly rounded encoding.

    Position ids come from, in this order: `position_ids` if given; else the
    Keras mask or `mask=` (each row's real tokens are numbered 0, 1, ... so a
    left-padded batch needs nothing special); else 0..length-1. With
    `zero_padding=True` the encoding is exactly 0 at padding positions, and the
    mask passes through to the next layer.

    Args:
        max_length: int >= 1, number of table rows (positions 0..max_length-1).
        base: float > 1, wavelength scale; 10000 in the paper.
        layout: "interleave" (the paper's sin/cos pairs) or "concat" (all sines
            then all cosines, as in the TensorFlow text tutorial).
        table: "full", the whole `[max_length, depth]` table as a constant.
        zero_padding: bool, zero the encoding where the mask is False.
        num_languages: optional int; if set, a learnable scale per language
            (initialised to exactly 1.0) multiplies the encoding.
        dropout: float in [0, 1), dropout applied to the encoding only.
        overflow: "error" raises when a position reaches `max_length`;
            "extend" computes such rows on the fly in float64 (for training or
            evaluation beyond the table; exported models need positions inside
            the table).
        **kwargs: standard layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[batch, length, depth]`.
        position_ids: optional int tensor `[batch, length]` or `[length]`.
        language_ids: int tensor `[batch]` or `[batch, length]`; required
            exactly when `num_languages` is set.
        mask: optional bool tensor `[batch, length]`, True for real tokens.
            Filled in by Keras from the previous layer's mask.
        training: bool, enables dropout.

    Example:

    >>> layer = SinusoidalPositionEmbedding(max_length=16)
    >>> x = tf.zeros([2, 4, 6])
    >>> mask = tf.constant([[True, True, True, True], [False, False, True, True]])
    >>> y = layer(x, mask=mask)
    >>> y.shape
    TensorShape([2, 4, 6])
    >>> y[1, 0].numpy().tolist()  # padding gets no encoding
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    >>> bool(tf.reduce_all(y[1, 2:] == y[0, :2]))  # left padding = no padding
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.5.
    """

    can_extend = True

    def __init__(self, max_length=2048, *, base=10000.0, layout="interleave", table="full",
                 zero_padding=True, num_languages=None, dropout=0.0, overflow="error", **kwargs):
        super().__init__(max_length, zero_padding=zero_padding, num_languages=num_languages,
                         dropout=dropout, overflow=overflow, **kwargs)
        tables.check_base(base)
        tables.check_layout(layout)
        check_choice("table", table, TABLE_KINDS)
        self.base = float(base)
        self.layout = layout
        self.table = table

    def _build_table(self, depth):
        values = tables.sinusoidal_table(self.max_length, depth, base=self.base,
                                         layout=self.layout, dtype=np.float32)
        self._table = tf.constant(values)
        freq, is_sin = tables.column_frequencies(depth, self.base, self.layout)
        self._freq64 = tf.constant(freq, tf.float64)
        self._is_sin = tf.constant(is_sin)

    def _computed_rows(self, ids):
        angles = tf.cast(ids, tf.float64)[..., None] * self._freq64
        return tf.cast(tf.where(self._is_sin, tf.sin(angles), tf.cos(angles)), tf.float32)

    def _table_rows(self, ids):
        if self.overflow == "extend":
            return tf.cond(tf.reduce_all(ids < self.max_length),
                           lambda: tf.gather(self._table, ids),
                           lambda: self._computed_rows(ids))
        return tf.gather(self._table, ids)

    def _table_prefix(self, length):
        if self.overflow == "extend":
            return tf.cond(length <= self.max_length,
                           lambda: self._table[:length],
                           lambda: self._computed_rows(tf.range(length)))
        return self._table[:length]

    def get_config(self):
        config = super().get_config()
        config.update({"base": self.base, "layout": self.layout, "table": self.table})
        return config
