"""IntegerPositionEmbedding: the scaled position index added to every dimension."""

import math

import numpy as np

from keras_posenc.backend import keras, ops, widest_float
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase

__all__ = ["IntegerPositionEmbedding"]


def _resolve_scale(scale, max_length):
    if scale is None:
        return 1.0 / max_length
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.number)):
        raise TypeError(f"`scale` must be a number or None, got scale={scale!r}.")
    if not math.isfinite(scale):
        raise ValueError(f"`scale` must be finite, got scale={scale!r}.")
    return float(scale)


@keras.utils.register_keras_serializable(package="keras_posenc")
class IntegerPositionEmbedding(PositionEmbeddingBase):
    """Adds `position * scale` to every dimension of the inputs.

    The "increasing integer" control of a position-encoding ablation:
    `PE[p, j] = p * scale` for every column `j`. It carries position
    information in one direction only (a single scalar shared by all
    dimensions), so attention can use it only
    through the bias it puts on dot products, not as a distinct code per
    position.

    `scale` defaults to `1 / max_length`, which keeps positions inside the
    table in `[0, 1)`, the range of the token embeddings. The raw index
    (`scale=1.0`) adds up to `max_length - 1` to every dimension, which
    dwarfs the token signal. The formula is defined for every
    position, so `overflow="extend"` computes rows past `max_length` (values
    then exceed 1).

    Call semantics match `SinusoidalPositionEmbedding`: per-sample ids from
    the mask (left padding works), zero at padding, mask pass-through,
    optional language scale and dropout. Rows are computed in float64 and
    stored as a float32 constant (no weights).

    Args:
        max_length: int >= 1, number of precomputed rows.
        scale: float or None, multiplier of the position index; None means
            `1 / max_length`. `scale=0.0` adds exactly nothing.
        zero_padding: bool, zero the embedding where the mask is False.
        num_languages: optional int, learn a scale per language (init 1.0).
        dropout: float in [0, 1), dropout on the position embedding.
        overflow: "error" or "extend" (compute rows past `max_length`).
        **kwargs: standard layer arguments.

    Call arguments:
        inputs: float tensor `[batch, length, depth]`.
        position_ids: optional int tensor `[batch, length]` or `[length]`.
        language_ids: int tensor `[batch]` or `[batch, length]` when
            `num_languages` is set.
        mask: optional bool tensor `[batch, length]`.
        training: bool, enables dropout.

    Example:

    >>> layer = IntegerPositionEmbedding(max_length=4)
    >>> ops.convert_to_numpy(layer(np.zeros([1, 3, 2]))[0]).tolist()
    [[0.0, 0.0], [0.25, 0.25], [0.5, 0.5]]
    >>> mask = np.array([[False, True, True]])
    >>> ops.convert_to_numpy(layer(np.zeros([1, 3, 2]), mask=mask)[0]).tolist()
    [[0.0, 0.0], [0.0, 0.0], [0.25, 0.25]]

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.5
          (why a bounded, per-dimension code is preferred).
    """

    can_extend = True

    def __init__(self, max_length=2048, *, scale=None, zero_padding=True, num_languages=None,
                 dropout=0.0, overflow="error", **kwargs):
        super().__init__(max_length, zero_padding=zero_padding, num_languages=num_languages,
                         dropout=dropout, overflow=overflow, **kwargs)
        self.effective_scale = _resolve_scale(scale, max_length)
        self.scale = None if scale is None else float(scale)

    def _build_table(self, depth):
        rows = np.arange(self.max_length, dtype=np.float64) * self.effective_scale
        self._table = np.repeat(rows[:, None], depth, axis=1).astype(np.float32)  # a constant where used

    def _computed_rows(self, ids):
        values = ops.cast(ops.cast(ids, widest_float()) * self.effective_scale, "float32")
        return values[..., None] * ops.ones([self.depth], "float32")

    def _table_rows(self, ids):
        return ops.take(ops.convert_to_tensor(self._table), ids, axis=0)

    def _table_prefix(self, length):
        return ops.convert_to_tensor(self._table)[:length]

    def get_config(self):
        config = super().get_config()
        config["scale"] = self.scale
        return config
