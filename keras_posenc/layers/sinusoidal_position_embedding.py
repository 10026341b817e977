"""SinusoidalPositionEmbedding: the fixed sin/cos table, padding-aware."""

import math

import numpy as np

from keras_posenc import tables
from keras_posenc.backend import keras, ops, widest_float
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.validation import check_base, check_choice, check_stored_dims

__all__ = ["SinusoidalPositionEmbedding"]


@keras.utils.register_keras_serializable(package="keras_posenc")
class SinusoidalPositionEmbedding(PositionEmbeddingBase):
    """Adds the sinusoidal position encoding to a `[batch, length, depth]` input.

    The table is computed once in float64 numpy (`keras_posenc.sinusoidal_table`),
    stored as a float32 constant (never a weight, so no gradient reaches it and
    nothing is trained) and cast to the compute dtype only at the add, so
    `mixed_float16` and `mixed_bfloat16` models keep a correctly rounded
    encoding. Runs on Keras 2 and on Keras 3 (TensorFlow and JAX backends).

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
        table: which constants the layer stores (never weights; a SavedModel
            holds exactly these):
            "full": the `[max_length, depth]` float32 table.
            "factorized": exact to float32 rounding (max abs error < 3e-7)
                with about `2 * sqrt(max_length) / max_length` of the bytes
                (9% at max_length 512): rows are rebuilt by angle addition
                from a coarse table of positions `a * B` and a fine table of
                positions `b < B`, `B = ceil(sqrt(max_length))`.
            "interpolated": stores `stored_dims` columns (sin/cos of evenly
                spaced frequency pairs) and interpolates the others
                linearly along the dimension axis. Lossy: with 64 of 512
                columns the high-frequency half of the columns is wrong by
                up to 2.0 at large positions (see
                `keras_posenc.tables.compressed_table` for the error per
                band). Prefer "factorized".
            The compressed kinds rebuild rows in-graph with gather, mul,
            add and sub only (no sin/cos, no float64). A TFLite converter
            folds a rebuild that depends on no input (positions 0..T-1 at a
            fixed T) into a `[T, depth]` constant; rows gathered by
            `position_ids` stay compressed.
        stored_dims: even int, `2 <= stored_dims <= depth`, the columns an
            "interpolated" table stores. Default (None): 64, or the whole
            width when the input depth is below 64. Ignored by other kinds.
        zero_padding: bool, zero the encoding where the mask is False.
        num_languages: optional int; if set, a learnable scale per language
            (initialised to exactly 1.0) multiplies the encoding.
        dropout: float in [0, 1), dropout applied to the encoding only.
        overflow: "error" raises when a position reaches `max_length`;
            "extend" computes such rows on the fly in float64 (for training or
            evaluation beyond the table; exported models need positions inside
            the table). On JAX without `jax_enable_x64` the angles of such
            rows are float32 (error about `position * 6e-8` radians).
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
    >>> x = np.zeros([2, 4, 6], "float32")
    >>> mask = np.array([[True, True, True, True], [False, False, True, True]])
    >>> y = ops.convert_to_numpy(layer(x, mask=mask))
    >>> y.shape
    (2, 4, 6)
    >>> y[1, 0].tolist()  # padding gets no encoding
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    >>> bool((y[1, 2:] == y[0, :2]).all())  # left padding = no padding
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.5.
    """

    can_extend = True

    def __init__(self, max_length=2048, *, base=10000.0, layout="interleave", table="full",
                 stored_dims=None, zero_padding=True, num_languages=None, dropout=0.0,
                 overflow="error", **kwargs):
        super().__init__(max_length, zero_padding=zero_padding, num_languages=num_languages,
                         dropout=dropout, overflow=overflow, **kwargs)
        check_base(base)
        check_choice("layout", layout, tables.LAYOUTS)
        check_choice("table", table, tables.TABLE_KINDS)
        check_stored_dims(stored_dims)
        self.base = float(base)
        self.layout = layout
        self.table = table
        self.stored_dims = None if stored_dims is None else int(stored_dims)

    def _build_table(self, depth):
        arrays = tables.table_constants(self.table, self.max_length, depth, stored_dims=self.stored_dims,
                                        base=self.base, layout=self.layout)
        self._table_names = tuple(sorted(arrays))
        self._table_shapes = {name: values.shape for name, values in arrays.items()}
        # NumPy arrays, made constants where they are used: never a captured tensor of a trace.
        for name, values in arrays.items():
            setattr(self, "_" + name, np.asarray(values, np.float32))
        self._pairs = (depth + 1) // 2
        pair, is_cos = tables.pair_columns(depth, self.layout)
        self._is_cos = is_cos.astype(np.int32)
        self._frequencies = self.base ** (-2.0 * pair.astype(np.float64) / depth)
        if self.table == "factorized" and self.layout == "interleave":
            self._sin_cos_columns = (is_cos * self._pairs + pair).astype(np.int32)
        if self.table == "interpolated":
            self._interpolation_constants(pair, is_cos)

    @property
    def table_nbytes(self):
        """Bytes of the constants this built layer stores for its table."""
        return sum(math.prod(self._table_shapes[name]) * 4 for name in self._table_names)

    def _interpolation_constants(self, pair, is_cos):
        # Same arithmetic as tables.compressed_table("interpolated") (the node formula of
        # tables.interpolation_nodes), on the column constants, so no index array is stored
        # as a table and nothing but gathers, muls and adds runs per call.
        pairs, stored_pairs = self._pairs, self._table_shapes["stored"][1] // 2
        if stored_pairs == 1:
            lower = upper = np.zeros_like(pair)
            alpha = np.zeros([self.depth], np.float32)
        else:
            lower = np.minimum(((pair + 1) * (stored_pairs - 1) - 1) // (pairs - 1), stored_pairs - 2)
            upper = lower + 1
            lo_node = lower * (pairs - 1) // (stored_pairs - 1)
            hi_node = upper * (pairs - 1) // (stored_pairs - 1)
            alpha = (pair - lo_node).astype(np.float32) / (hi_node - lo_node).astype(np.float32)
        self._lower_columns = (is_cos * stored_pairs + lower).astype(np.int32)
        self._upper_columns = (is_cos * stored_pairs + upper).astype(np.int32)
        self._alpha = np.asarray(alpha, np.float32)

    def _interpolated_rows(self, ids):
        rows = ops.take(ops.convert_to_tensor(self._stored), ids, axis=0)
        lo = ops.take(rows, ops.convert_to_tensor(self._lower_columns), axis=-1)
        hi = ops.take(rows, ops.convert_to_tensor(self._upper_columns), axis=-1)
        alpha = ops.convert_to_tensor(self._alpha)
        return lo * (1.0 - alpha) + hi * alpha

    def _factorized_rows(self, ids):
        # sin(p w) and cos(p w) by angle addition, p = a * block + b.
        pairs, block = self._pairs, self._table_shapes["fine"][0]
        coarse_index = ids // block
        coarse = ops.take(ops.convert_to_tensor(self._coarse), coarse_index, axis=0)
        fine = ops.take(ops.convert_to_tensor(self._fine), ids - coarse_index * block, axis=0)
        cs, cc = coarse[..., :pairs], coarse[..., pairs:]
        fs, fc = fine[..., :pairs], fine[..., pairs:]
        sin_cos = ops.concatenate([cs * fc + cc * fs, cc * fc - cs * fs], axis=-1)
        if self.layout == "concat":
            return sin_cos[..., :self.depth] if self.depth % 2 == 0 else ops.concatenate(
                [sin_cos[..., :pairs], sin_cos[..., pairs:pairs + self.depth // 2]], axis=-1)
        return ops.take(sin_cos, ops.convert_to_tensor(self._sin_cos_columns), axis=-1)

    def _rebuilt_rows(self, ids):
        if self.table == "interpolated":
            return self._interpolated_rows(ids)
        return self._factorized_rows(ids)

    def _table_rows(self, ids):
        if self.table == "full":
            return ops.take(ops.convert_to_tensor(self._table), ids, axis=0)
        # Rebuild whichever is fewer rows: one per id, or the whole table once and gather from it
        # (big batches). Both give the same values. The static shape decides; an unknown one takes
        # the whole table, whose cost is bounded by the table's size.
        dims = tuple(ids.shape)
        if None not in dims and math.prod(dims) <= self.max_length:
            return self._rebuilt_rows(ids)
        return ops.take(self._rebuilt_rows(ops.arange(self.max_length, dtype="int32")), ids, axis=0)

    def _table_prefix(self, length):
        if self.table == "full":
            return ops.convert_to_tensor(self._table)[:length]
        return self._rebuilt_rows(ops.arange(length, dtype="int32"))

    def _computed_rows(self, ids):
        # Positions past the table ("extend"): float64 angles where the backend has float64,
        # computed in-graph (nothing stored).
        dtype = widest_float()
        angles = ops.cast(ids, dtype)[..., None] * ops.convert_to_tensor(self._frequencies, dtype)
        is_sin = ops.convert_to_tensor(self._is_cos == 0)
        return ops.cast(ops.where(is_sin, ops.sin(angles), ops.cos(angles)), "float32")

    def _constant_table(self):
        return self._table if self.table == "full" else None

    def get_config(self):
        config = super().get_config()
        config.update({"base": self.base, "layout": self.layout, "table": self.table,
                       "stored_dims": self.stored_dims})
        return config
