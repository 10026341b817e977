"""Shared call logic of every additive position-embedding layer.

Subclasses say how to produce the float32 rows of their table (`_table_rows`
for given ids, `_table_prefix` for positions 0..T-1, `_computed_rows` for
positions past the table); this base handles position ids, padding, Keras
masks, language scaling, dropout, argument checks, the `overflow="extend"`
dispatch and the cast to the compute dtype. It is written with
`keras_posenc.backend.ops`, so it runs on Keras 2 (TF 2.12) and on Keras 3
with the TensorFlow or JAX backend.
"""

import numpy as np

from keras_posenc.backend import (
    add_rows,
    dtype_name,
    eager_scope,
    keras,
    no_autocast,
    ops,
    static_call,
    static_int,
)
from keras_posenc.layers._shape_preserving import ShapePreserving, input_shape_of
from keras_posenc.positions import running_count
from keras_posenc.validation import (
    check,
    check_choice,
    check_equal_dims,
    check_positive_int,
    check_rate,
    with_checks,
)

__all__ = ["OVERFLOW_MODES", "PositionEmbeddingBase"]

OVERFLOW_MODES = ("error", "extend")


def _missing_hook(layer, hook):
    return (f"{type(layer).__name__} subclasses PositionEmbeddingBase without defining `{hook}`; "
            "use SinusoidalPositionEmbedding or LearnedPositionEmbedding, or define the three hooks.")


def _int_max(x):
    """max of an int32 tensor; -2**31 when it is empty (as `tf.reduce_max`), on every backend."""
    return ops.max(x, initial=-2**31)


def _int_min(x):
    """min of an int32 tensor; 2**31 - 1 when it is empty."""
    return ops.min(x, initial=2**31 - 1)


class PositionEmbeddingBase(ShapePreserving, keras.layers.Layer):
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
    - `overflow="extend"`: rows past `max_length` come from `_computed_rows`;
    - argument checks (`ValueError`/`TypeError` in eager mode on every
      backend, `InvalidArgumentError` with the same text inside a
      `tf.function`; under `jax.jit` see `keras_posenc.validation`).

    `call` traces to a plain graph on every backend: no `cond`, no nested
    compiled function, no captured tensor (tables are NumPy arrays, made
    constants of each traced graph), position ids from a mask by a 0/1
    triangular matmul (`keras_posenc.positions.running_count`), not a
    cumulative sum: Keras's own `model.export` (SavedModel, ONNX, LiteRT)
    takes it as it is. In Keras 3 TensorFlow graphs the gather and the add of
    a masked call are marked as one XLA cluster (`backend.add_rows`), so the
    gathered rows are not written to memory and read back.

    A subclass implements `_build_table(depth)`, `_table_rows(ids)` (float32
    rows `[..., depth]` for int32 ids) and `_table_prefix(length)` (rows of
    positions 0..length-1), optionally `_constant_table()` (a NumPy array).
    Tables are held as NumPy arrays and made tensors where they are used. A subclass that
    sets `can_extend = True` also implements `_computed_rows(ids)`, the rows
    of any positions by formula: the one hook behind `overflow="extend"`.

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

    >>> import numpy as np
    >>> from keras_posenc.backend import ops
    >>> class RampPositionEmbedding(PositionEmbeddingBase):
    ...     def _build_table(self, depth):
    ...         self._ramp = np.repeat(np.arange(self.max_length, dtype="float32")[:, None], depth, 1)
    ...     def _table_rows(self, ids):
    ...         return ops.take(ops.convert_to_tensor(self._ramp), ids, axis=0)
    ...     def _table_prefix(self, length):
    ...         return ops.convert_to_tensor(self._ramp)[:length]
    >>> layer = RampPositionEmbedding(max_length=4)
    >>> ops.convert_to_numpy(layer(np.zeros([1, 3, 2]))[0]).tolist()
    [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    >>> mask = np.array([[False, True, True]])  # left padding
    >>> ops.convert_to_numpy(layer(np.zeros([1, 3, 2]), mask=mask)[0]).tolist()
    [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    >>> layer(np.zeros([1, 5, 2]))
    Traceback (most recent call last):
        ...
    ValueError: ...Sequence length 5 exceeds max_length=4 of RampPositionEmbedding...

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.5.
    """

    can_extend = False

    def __init__(self, max_length=2048, *, zero_padding=True, num_languages=None, dropout=0.0,
                 overflow="error", **kwargs):
        # Configs saved before the layers traced to plain graphs have `fuse_min_tokens` (an XLA-fused
        # gather + add): the whole model compiled with XLA fuses them now, so it is read and dropped.
        kwargs.pop("fuse_min_tokens", None)
        super().__init__(**kwargs)
        check_positive_int("max_length", max_length)
        check_choice("overflow", overflow, OVERFLOW_MODES)
        if overflow == "extend" and not self.can_extend:
            raise ValueError(
                f"`overflow='extend'` is not possible for {type(self).__name__}: its table has no "
                f"rows beyond max_length={max_length}. Use overflow='error'.")
        if num_languages is not None:
            check_positive_int("num_languages", num_languages)
        check_rate("dropout", dropout)
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
        """float32 rows `[..., depth]` for int32 position ids inside the table."""
        raise TypeError(_missing_hook(self, "_table_rows"))

    def _table_prefix(self, length):
        """float32 rows `[length, depth]` for positions 0..length-1 (length <= max_length)."""
        raise TypeError(_missing_hook(self, "_table_prefix"))

    def table_prefix(self, length):
        """float32 rows `[length, depth]` of positions 0..length-1 (length <= max_length): what an
        exporter freezes as a constant of the file."""
        return self._table_prefix(length)

    def _computed_rows(self, ids):
        """float32 rows `[..., depth]` of any positions, by formula (`can_extend` subclasses)."""
        raise TypeError(_missing_hook(self, "_computed_rows"))

    def _constant_table(self):
        """The float32 NumPy `[max_length, depth]` table if rows are plain lookups in it, else None.

        When a subclass returns its table here, masked calls gather from a
        copy shifted down by one row under an all-zero row 0, which padding
        positions point at: zeroing the padding then costs nothing, where a
        multiply would be one more pass over `[batch, length, depth]`.
        """

    # The overflow="extend" dispatch: the only place that picks stored or computed rows. Positions
    # inside the table always get their stored row, whatever else is in the batch: a lossy table
    # ("interpolated") differs from the formula, and a token's value must not depend on its batch.
    # Both are computed and one is selected per position (no `cond`: a plain graph).
    def _rows_of(self, ids):
        if self.overflow != "extend":
            return self._table_rows(ids)
        stored = self._table_rows(ops.minimum(ids, self.max_length - 1))
        return ops.where((ids < self.max_length)[..., None], stored, self._computed_rows(ids))

    def _prefix_of(self, length):
        if self.overflow != "extend":
            return self._table_prefix(length)
        static = static_int(length)
        if static is not None and static <= self.max_length:
            return self._table_prefix(static)
        return self._rows_of(ops.arange(length, dtype="int32"))

    def _lookup(self):
        """The lookup table (zero row 0, then the table) as a constant tensor.

        In the compute dtype (fewer bytes to gather, no cast at the add) unless
        the language scale needs float32 rows first.
        """
        dtype = "float32" if self.num_languages is not None else self.compute_dtype
        return ops.cast(ops.convert_to_tensor(self._lookup_table), dtype)

    # Keras API --------------------------------------------------------------
    def build(self, input_shape=None, **shapes):
        input_shape = input_shape_of(self, input_shape, shapes)
        if len(input_shape) != 3:
            raise ValueError(
                f"`inputs` must have rank 3 [batch, length, depth], got shape {input_shape}.")
        depth = input_shape[-1]
        if depth is None:
            raise ValueError(f"The last dimension of `inputs` must be known, got shape {input_shape}.")
        self.depth = int(depth)
        with eager_scope():  # concrete values, not tensors of the graph or trace that builds the layer
            self._build_table(self.depth)
            table = self._constant_table()
            self._lookup_table = None
            if table is not None:
                # NumPy: a constant of each traced graph, never a captured tensor (graph exporters
                # such as tf2onnx turn those into inputs). Row 0 is the all-zero row of padding.
                self._lookup_table = np.concatenate(
                    [np.zeros([1, self.depth], np.float32), np.asarray(table, np.float32)], 0)
        if self.num_languages is not None:
            self.language_scale = self.add_weight(
                name="language_scale", shape=[self.num_languages], initializer="ones",
                trainable=True, **no_autocast())
        self._dropout_layer.build(input_shape)
        super().build(input_shape)

    @static_call
    def call(self, inputs, position_ids=None, language_ids=None, mask=None, training=None):
        if len(inputs.shape) != 3:
            raise ValueError(
                f"`inputs` must have rank 3 [batch, length, depth], got shape {tuple(inputs.shape)}.")
        shape = ops.shape(inputs)
        batch, length = shape[0], shape[1]
        if mask is not None:
            mask = self._validated_mask(mask, inputs)
        zero_padding = self.zero_padding and mask is not None
        lookup_only = zero_padding and self._lookup_only(language_ids, training)
        if position_ids is not None:
            ids = self._validated_position_ids(position_ids, inputs)
            if lookup_only:
                return add_rows(inputs, self._lookup(), ops.where(mask, ids + 1, 0))
            pe = self._masked_rows(ids + 1, mask) if zero_padding else self._rows(ids)
        elif mask is not None:
            # Inclusive count of real tokens so far: a real token at position p (as
            # `position_ids(mask)` numbers it) holds p + 1, and each row ends on its length.
            counts = running_count(mask)
            counts = with_checks(counts, self._length_checks(_int_max(counts)))
            if lookup_only:
                return add_rows(inputs, self._lookup(), ops.where(mask, counts, 0))
            if zero_padding:
                pe = self._masked_rows(counts, mask)
            else:
                pe = self._rows(ops.where(mask, counts - 1, 0))
        else:
            length = with_checks(length, self._length_checks(length))
            if self._lookup_table is not None and self.overflow == "error":
                pe = self._lookup()[1:length + 1][None]
            else:
                pe = self._prefix_of(length)[None]
        if language_ids is not None or self.num_languages is not None:
            pe = ops.cast(pe, "float32") * self._language_scale(language_ids, batch, length)
        pe = ops.cast(pe, self.compute_dtype)
        if self.dropout > 0:
            pe = self._dropout_layer(pe, training=training)
        return inputs + pe

    def _lookup_only(self, language_ids, training):
        """True when the output is just `inputs + lookup_table[ids]`: one gather and one add."""
        no_dropout = self.dropout == 0 or training is None or training is False
        return (self._lookup_table is not None and self.overflow == "error"
                and self.num_languages is None and language_ids is None and no_dropout)

    def _rows(self, ids):
        """Table rows of `ids`, from the lookup table that masked calls use too when possible."""
        if self._lookup_table is not None and self.overflow == "error":
            return ops.take(self._lookup(), ids + 1, axis=0)
        return self._rows_of(ids)

    def _masked_rows(self, ids_plus_one, mask):
        """Table rows of positions `ids_plus_one - 1`, exactly zero where `mask` is False."""
        if self._lookup_table is not None and self.overflow == "error":
            return ops.take(self._lookup(), ops.where(mask, ids_plus_one, 0), axis=0)
        # No lookup table, or "extend" (positions past the table are computed, not gathered).
        rows = self._rows_of(ops.where(mask, ids_plus_one - 1, 0))
        return rows * ops.cast(mask, rows.dtype)[:, :, None]

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
        static = static_int(length)
        if static is not None:
            if static > self.max_length:
                raise ValueError(
                    f"Sequence length {static} exceeds max_length={self.max_length} of "
                    f"{type(self).__name__} '{self.name}' (overflow='error').")
            return []
        return check(length <= self.max_length,
                     "Sequence length {} exceeds max_length=" + str(self.max_length) + " of "
                     + type(self).__name__ + " '" + self.name + "' (overflow='error').", length)

    def _validated_mask(self, mask, inputs):
        mask = ops.convert_to_tensor(mask)
        expected = tuple(inputs.shape[:2])
        if len(mask.shape) != 2:
            raise ValueError(f"`mask` must have shape [batch, length] = {expected}, "
                             f"got shape {tuple(mask.shape)}.")
        checks = check_equal_dims("`mask` must have shape [batch, length] = {}, got shape {}.",
                                  list(ops.shape(inputs)[:2]), list(ops.shape(mask)))
        return with_checks(ops.cast(mask, "bool"), checks)

    def _validated_position_ids(self, ids, inputs):
        ids = ops.convert_to_tensor(ids)
        dtype = dtype_name(ids)
        if "int" not in dtype:
            raise TypeError(f"`position_ids` must be an integer tensor, got dtype {dtype}.")
        if len(ids.shape) not in (1, 2):
            raise ValueError(f"`position_ids` must have shape [batch, length] or [length], "
                             f"got shape {tuple(ids.shape)}.")
        ids = ops.cast(ids, "int32")
        if len(ids.shape) == 1:
            ids = ids[None]
        upper = None if self.overflow == "extend" else self.max_length
        low, high = _int_min(ids), _int_max(ids)
        range_text = "[0, inf)" if upper is None else f"[0, max_length={upper})"
        template = "`position_ids` must be in " + range_text + ", got min {} and max {}."
        in_range = low >= 0 if upper is None else ops.logical_and(low >= 0, high < upper)
        in_range = ops.logical_or(ops.equal(ops.size(ids), 0), in_range)
        checks = check(in_range, template, low, high)
        ids_length, inputs_length = ops.shape(ids)[1], ops.shape(inputs)[1]
        checks += check_equal_dims("`position_ids` length {} must equal the inputs length {}.",
                                   ids_length, inputs_length)
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
        language_ids = ops.convert_to_tensor(language_ids)
        dtype = dtype_name(language_ids)
        if "int" not in dtype:
            raise TypeError(f"`language_ids` must be an integer tensor, got dtype {dtype}.")
        rank = len(language_ids.shape)
        if rank not in (1, 2):
            raise ValueError(f"`language_ids` must have shape [batch] or [batch, length], "
                             f"got shape {tuple(language_ids.shape)}.")
        language_ids = ops.cast(language_ids, "int32")
        low, high = _int_min(language_ids), _int_max(language_ids)
        in_range = ops.logical_or(
            ops.equal(ops.size(language_ids), 0),
            ops.logical_and(low >= 0, high < self.num_languages))
        checks = check(in_range, "`language_ids` must be in [0, num_languages="
                       + str(self.num_languages) + "), got min {} and max {}.", low, high)
        checks += check_equal_dims(f"`language_ids` of rank {rank} must have shape {{}}, got shape {{}}.",
                                   [batch, length][:rank], list(ops.shape(language_ids)))
        scale = ops.cast(ops.take(self.language_scale, with_checks(language_ids, checks), axis=0), "float32")
        if rank == 1:
            return scale[:, None, None]
        return scale[:, :, None]
