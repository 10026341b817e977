"""Shared call logic of every additive position-embedding layer.

Subclasses say how to produce the float32 rows of their table (`_table_rows`
for given ids, `_table_prefix` for positions 0..T-1); this base handles
position ids, padding, Keras masks, language scaling, dropout, argument checks
and the cast to the compute dtype.
"""

import tensorflow as tf
from tensorflow import keras

from keras_posenc.validation import check, check_choice, check_positive_int, with_checks

__all__ = ["OVERFLOW_MODES", "PositionEmbeddingBase"]

OVERFLOW_MODES = ("error", "extend")


def _missing_hook(layer, hook):
    return (f"{type(layer).__name__} subclasses PositionEmbeddingBase without defining `{hook}`; "
            "use SinusoidalPositionEmbedding or LearnedPositionEmbedding, or define the three hooks.")


# Below this many tokens the XLA launch costs more than the memory pass it saves.
_FUSE_MIN_TOKENS = 4096


@tf.function(jit_compile=True)
def _add_rows_fused(inputs, table, ids):
    return inputs + tf.gather(table, ids)


def _add_rows(inputs, table, ids):
    """`inputs + table[ids]`, as one XLA kernel for large batches.

    Unfused, the gather writes the `[batch, length, depth]` rows to memory and
    the add reads them back: about 1.2x the time of a bare broadcast add of
    a `[length, depth]` table on CPU at B32 T512. Fused, the rows go straight
    into the sum (about 1.07x). The values are the same either way: one
    gather and one add.
    """
    return tf.cond(tf.size(ids) >= _FUSE_MIN_TOKENS,
                   lambda: _add_rows_fused(inputs, table, ids),
                   lambda: inputs + tf.gather(table, ids))


class PositionEmbeddingBase(keras.layers.Layer):
    """Adds a position embedding to `[batch, length, depth]` inputs.

    The shared base of every position layer of the package; not used
    directly (it has no table): use `SinusoidalPositionEmbedding`,
    `LearnedPositionEmbedding`, `IntegerPositionEmbedding` or
    `ZeroPositionEmbedding`. It handles everything but the table:

    - position ids: `position_ids` if given; else each row's real tokens
      (mask True) are numbered 0, 1, ... so left padding needs nothing
      special; else 0..length-1;
    - padding: with `zero_padding` and a mask, the embedding is exactly 0 at
      padding positions; the Keras mask passes through to the next layer;
    - an optional learned scale per language, dropout on the embedding, the
      cast to the compute dtype at the add;
    - argument checks (`ValueError`/`TypeError` in eager mode,
      `InvalidArgumentError` with the same text inside a `tf.function`).

    A subclass implements `_build_table(depth)`, `_table_rows(ids)` (float32
    rows `[..., depth]` for int32 ids) and `_table_prefix(length)` (rows of
    positions 0..length-1), optionally `_constant_table()`, and sets
    `can_extend = True` when it can compute rows past `max_length`.

    Args:
        max_length: int >= 1, number of table rows (positions
            0..max_length-1).
        zero_padding: bool, zero the embedding where the mask is False.
        num_languages: optional int >= 1; if set, a learnable scale per
            language (initialised to 1.0) multiplies the embedding.
        dropout: float in [0, 1), dropout applied to the embedding only.
        overflow: one of `OVERFLOW_MODES`: "error" raises when a position
            reaches `max_length`; "extend" (subclasses with
            `can_extend = True` only) computes such rows.
        **kwargs: standard layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[batch, length, depth]`.
        position_ids: optional int tensor `[batch, length]` or `[length]`,
            in `[0, max_length)` with `overflow="error"`.
        language_ids: int tensor `[batch]` or `[batch, length]` in
            `[0, num_languages)`; required exactly when `num_languages` is
            set.
        mask: optional bool tensor `[batch, length]`, True for real tokens.
            Filled in by Keras from the previous layer's mask.
        training: bool, enables dropout.

    Example:

    A minimal subclass whose row `p` is `p` in every column:

    >>> class RampPositionEmbedding(PositionEmbeddingBase):
    ...     def _build_table(self, depth):
    ...         self._ramp = tf.range(self.max_length, dtype=tf.float32)[:, None] * tf.ones([depth])
    ...     def _table_rows(self, ids):
    ...         return tf.gather(self._ramp, ids)
    ...     def _table_prefix(self, length):
    ...         return self._ramp[:length]
    >>> layer = RampPositionEmbedding(max_length=4)
    >>> layer(tf.zeros([1, 3, 2]))[0].numpy().tolist()
    [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    >>> mask = tf.constant([[False, True, True]])  # left padding
    >>> layer(tf.zeros([1, 3, 2]), mask=mask)[0].numpy().tolist()
    [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    >>> layer(tf.zeros([1, 5, 2]))
    Traceback (most recent call last):
        ...
    ValueError: ...Sequence length 5 exceeds max_length=4 of RampPositionEmbedding...

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.5.
    """

    can_extend = False

    def __init__(self, max_length=2048, *, zero_padding=True, num_languages=None, dropout=0.0,
                 overflow="error", **kwargs):
        super().__init__(**kwargs)
        check_positive_int("max_length", max_length)
        check_choice("overflow", overflow, OVERFLOW_MODES)
        if overflow == "extend" and not self.can_extend:
            raise ValueError(
                f"`overflow='extend'` is not possible for {type(self).__name__}: its table has no "
                f"rows beyond max_length={max_length}. Use overflow='error'.")
        if num_languages is not None:
            check_positive_int("num_languages", num_languages)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"`dropout` must be a float in [0, 1), got dropout={dropout!r}.")
        self.max_length = max_length
        self.zero_padding = bool(zero_padding)
        self.num_languages = num_languages
        self.dropout = float(dropout)
        self.overflow = overflow
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    # Subclass hooks ---------------------------------------------------------
    def _build_table(self, depth):
        """Creates the table for inputs of width `depth`."""
        raise TypeError(_missing_hook(self, "_build_table"))

    def _table_rows(self, ids):
        """float32 rows `[..., depth]` for int32 position ids."""
        raise TypeError(_missing_hook(self, "_table_rows"))

    def _table_prefix(self, length):
        """float32 rows `[length, depth]` for positions 0..length-1."""
        raise TypeError(_missing_hook(self, "_table_prefix"))

    def _constant_table(self):
        """The float32 `[max_length, depth]` table if rows are plain lookups in a constant, else None.

        When a subclass returns its table here, masked calls gather from a
        copy shifted down by one row under an all-zero row 0, which padding
        positions point at: zeroing the padding then costs nothing, where a
        multiply would be one more pass over `[batch, length, depth]`.
        """

    # Keras API --------------------------------------------------------------
    def build(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if input_shape.rank != 3:
            raise ValueError(
                f"`inputs` must have rank 3 [batch, length, depth], got shape {input_shape}.")
        depth = input_shape[-1]
        if depth is None:
            raise ValueError(f"The last dimension of `inputs` must be known, got shape {input_shape}.")
        self.depth = int(depth)
        self._build_table(self.depth)
        self._lookup_table = None
        table = self._constant_table()
        if table is not None:
            # Stored in the compute dtype (fewer bytes to gather, no cast at the add) unless the
            # language scale needs float32 rows first.
            dtype = tf.float32 if self.num_languages is not None else self.compute_dtype
            zero_row = tf.zeros([1, self.depth], tf.float32)
            self._lookup_table = tf.cast(tf.concat([zero_row, tf.cast(table, tf.float32)], 0), dtype)
        if self.num_languages is not None:
            self.language_scale = self.add_weight(
                name="language_scale", shape=[self.num_languages], initializer="ones",
                dtype=tf.float32, trainable=True, experimental_autocast=False)
        self._dropout_layer.build(input_shape)
        super().build(input_shape)

    def call(self, inputs, position_ids=None, language_ids=None, mask=None, training=None):
        if inputs.shape.rank != 3:
            raise ValueError(
                f"`inputs` must have rank 3 [batch, length, depth], got shape {inputs.shape}.")
        shape = tf.shape(inputs)
        batch, length = shape[0], shape[1]
        if mask is not None:
            mask = self._validated_mask(mask, inputs)
        zero_padding = self.zero_padding and mask is not None
        fused = zero_padding and self._fusable(language_ids, training)
        if position_ids is not None:
            ids = self._validated_position_ids(position_ids, inputs)
            if fused:
                return _add_rows(inputs, self._lookup_table, tf.where(mask, ids + 1, 0))
            pe = self._masked_rows(ids + 1, mask) if zero_padding else self._rows(ids)
        elif mask is not None:
            # Inclusive count of real tokens so far: a real token at position p (as
            # `position_ids(mask)` numbers it) holds p + 1, and each row ends on its length.
            counts = tf.cumsum(tf.cast(mask, tf.int32), axis=1)
            counts = with_checks(counts, self._length_checks(tf.reduce_max(counts)))
            if fused:
                return _add_rows(inputs, self._lookup_table, tf.where(mask, counts, 0))
            if zero_padding:
                pe = self._masked_rows(counts, mask)
            else:
                pe = self._rows(tf.where(mask, counts - 1, 0))
        else:
            length = with_checks(length, self._length_checks(length))
            if self._lookup_table is not None and self.overflow == "error":
                pe = self._lookup_table[1:length + 1][None]
            else:
                pe = self._table_prefix(length)[None]
        if language_ids is not None or self.num_languages is not None:
            pe = pe * self._language_scale(language_ids, batch, length)
        pe = tf.cast(pe, self.compute_dtype)
        if self.dropout > 0:
            pe = self._dropout_layer(pe, training=training)
        return inputs + pe

    def _fusable(self, language_ids, training):
        """True when the output is just `inputs + lookup_table[ids]` (see `_add_rows`)."""
        no_dropout = self.dropout == 0 or training is None or training is False
        return (self._lookup_table is not None and self.overflow == "error"
                and self.num_languages is None and language_ids is None and no_dropout
                and self._lookup_table.dtype == self.compute_dtype)

    def _rows(self, ids):
        """Table rows of `ids`, from the one constant that masked calls use too when possible.

        Serving every path from `_lookup_table` keeps a traced or saved model
        to a single copy of the table, whichever paths it was traced with.
        """
        if self._lookup_table is not None and self.overflow == "error":
            return tf.gather(self._lookup_table, ids + 1)
        return self._table_rows(ids)

    def _masked_rows(self, ids_plus_one, mask):
        """Table rows of positions `ids_plus_one - 1`, exactly zero where `mask` is False."""
        def multiplied():
            rows = self._table_rows(tf.where(mask, ids_plus_one - 1, 0))
            return rows * tf.cast(mask, rows.dtype)[:, :, None]

        if self._lookup_table is None:
            return multiplied()

        def gathered():
            return tf.gather(self._lookup_table, tf.where(mask, ids_plus_one, 0))

        if self.overflow == "error":
            return gathered()
        # "extend": positions past the table are computed, not gathered.
        return tf.cond(tf.reduce_max(ids_plus_one) <= self.max_length, gathered,
                       lambda: tf.cast(multiplied(), self._lookup_table.dtype))

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return tf.TensorShape(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({
            "max_length": self.max_length,
            "zero_padding": self.zero_padding,
            "num_languages": self.num_languages,
            "dropout": self.dropout,
            "overflow": self.overflow,
        })
        return config

    # Validation -------------------------------------------------------------
    def _length_checks(self, length):
        if self.overflow == "extend":
            return []
        static = tf.get_static_value(length)
        if static is not None and static > self.max_length:
            raise ValueError(
                f"Sequence length {static} exceeds max_length={self.max_length} of "
                f"{type(self).__name__} '{self.name}' (overflow='error').")
        return check(length <= self.max_length,
                     "Sequence length {} exceeds max_length=" + str(self.max_length) + " of "
                     + type(self).__name__ + " '" + self.name + "' (overflow='error').", length)

    def _validated_mask(self, mask, inputs):
        mask = tf.convert_to_tensor(mask)
        if mask.shape.rank is not None and mask.shape.rank != 2:
            raise ValueError(f"`mask` must have shape [batch, length] = {inputs.shape[:2]}, "
                             f"got shape {mask.shape}.")
        if mask.shape.is_fully_defined() and inputs.shape[:2].is_fully_defined():
            if mask.shape != inputs.shape[:2]:
                raise ValueError(f"`mask` must have shape [batch, length] = {inputs.shape[:2]}, "
                                 f"got shape {mask.shape}.")
            return tf.cast(mask, tf.bool)
        checks = check(tf.reduce_all(tf.equal(tf.shape(mask), tf.shape(inputs)[:2])),
                       "`mask` must have shape [batch, length] = {}, got shape {}.",
                       tf.shape(inputs)[:2], tf.shape(mask))
        return with_checks(tf.cast(mask, tf.bool), checks)

    def _validated_position_ids(self, ids, inputs):
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise TypeError(f"`position_ids` must be an integer tensor, got dtype {ids.dtype.name}.")
        if ids.shape.rank not in (None, 1, 2):
            raise ValueError(f"`position_ids` must have shape [batch, length] or [length], "
                             f"got shape {ids.shape}.")
        ids = tf.cast(ids, tf.int32)
        if ids.shape.rank == 1:
            ids = ids[None]
        upper = None if self.overflow == "extend" else self.max_length
        low, high = tf.reduce_min(ids), tf.reduce_max(ids)
        range_text = "[0, inf)" if upper is None else f"[0, max_length={upper})"
        template = "`position_ids` must be in " + range_text + ", got min {} and max {}."
        in_range = low >= 0 if upper is None else tf.logical_and(low >= 0, high < upper)
        in_range = tf.logical_or(tf.equal(tf.size(ids), 0), in_range)
        checks = check(in_range, template, low, high)
        checks += check(tf.reduce_all(tf.equal(tf.shape(ids)[1], tf.shape(inputs)[1])),
                        "`position_ids` length {} must equal the inputs length {}.",
                        tf.shape(ids)[1], tf.shape(inputs)[1])
        return with_checks(ids, checks)

    def _language_scale(self, language_ids, batch, length):
        if self.num_languages is None:
            raise ValueError(
                f"`language_ids` was given but {type(self).__name__} '{self.name}' was built with "
                "num_languages=None; pass num_languages=N to learn a scale per language.")
        if language_ids is None:
            raise ValueError(
                f"{type(self).__name__} '{self.name}' has num_languages={self.num_languages}: "
                "pass `language_ids` of shape [batch] or [batch, length].")
        language_ids = tf.convert_to_tensor(language_ids)
        if not language_ids.dtype.is_integer:
            raise TypeError(
                f"`language_ids` must be an integer tensor, got dtype {language_ids.dtype.name}.")
        if language_ids.shape.rank not in (None, 1, 2):
            raise ValueError(f"`language_ids` must have shape [batch] or [batch, length], "
                             f"got shape {language_ids.shape}.")
        language_ids = tf.cast(language_ids, tf.int32)
        in_range = tf.logical_or(
            tf.equal(tf.size(language_ids), 0),
            tf.logical_and(tf.reduce_min(language_ids) >= 0,
                           tf.reduce_max(language_ids) < self.num_languages))
        checks = check(in_range, "`language_ids` must be in [0, num_languages="
                       + str(self.num_languages) + "), got min {} and max {}.",
                       tf.reduce_min(language_ids), tf.reduce_max(language_ids))
        expected = tf.stack([batch, length])[:language_ids.shape.rank or 2]
        checks += check(tf.reduce_all(tf.equal(tf.shape(language_ids), expected)),
                        "`language_ids` must have shape [batch] or [batch, length] = {}, got shape {}.",
                        tf.stack([batch, length]), tf.shape(language_ids))
        scale = tf.gather(self.language_scale, with_checks(language_ids, checks))
        if language_ids.shape.rank == 1:
            return scale[:, None, None]
        return scale[:, :, None]
