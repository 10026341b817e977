"""ZeroPositionEmbedding: the all-zero control, a model without positions."""

from keras_posenc.backend import keras, ops
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase

__all__ = ["ZeroPositionEmbedding"]


@keras.utils.register_keras_serializable(package="keras_posenc")
class ZeroPositionEmbedding(PositionEmbeddingBase):
    """Adds nothing: the "all-zero PE" control of a position ablation.

    The output equals the input exactly, so a model built with it has no
    position information at all: without a causal mask, self-attention is
    permutation-equivariant and permuting the input tokens permutes the
    outputs. (With a causal mask the model can still infer positions from
    how many tokens each query sees.)

    The layer keeps the interface of the other position layers (mask
    pass-through, `max_length` and `overflow` checks, `position_ids`
    validation) so it can be swapped in by name. It has no weights, so a
    per-language scale would have nothing to scale: `num_languages` is
    rejected.

    Args:
        max_length: int >= 1, longest sequence accepted with
            `overflow="error"`.
        zero_padding: accepted for interface compatibility (the embedding is
            zero everywhere).
        dropout: accepted for interface compatibility (dropout of zero is
            zero).
        overflow: "error" or "extend" (accept any length).
        **kwargs: standard layer arguments.

    Call arguments:
        inputs: float tensor `[batch, length, depth]`.
        position_ids: optional int tensor `[batch, length]` or `[length]`
            (validated, otherwise unused).
        mask: optional bool tensor `[batch, length]`, passed through.
        training: unused.

    Example:

    >>> import numpy as np
    >>> layer = ZeroPositionEmbedding(max_length=8)
    >>> x = np.random.default_rng(0).normal(size=[2, 3, 4]).astype("float32")
    >>> bool((ops.convert_to_numpy(layer(x)) == x).all())
    True
    >>> layer.trainable_weights
    []

    References:
        - [Haviv et al., 2022](https://arxiv.org/abs/2203.16634) (causal
          language models without positional encodings).
    """

    can_extend = True

    def __init__(self, max_length=2048, *, zero_padding=True, num_languages=None, dropout=0.0,
                 overflow="error", **kwargs):
        if num_languages is not None:
            raise ValueError(
                f"`num_languages` has no effect on ZeroPositionEmbedding (there is no embedding to "
                f"scale), got num_languages={num_languages!r}. Pass num_languages=None.")
        super().__init__(max_length, zero_padding=zero_padding, num_languages=None,
                         dropout=dropout, overflow=overflow, **kwargs)

    def _build_table(self, depth):
        pass

    def _table_rows(self, ids):
        return ops.zeros_like(ops.cast(ids, "float32"))[..., None] * ops.zeros([self.depth], "float32")

    def _table_prefix(self, length):
        return self._table_rows(ops.arange(length, dtype="int32"))

    _computed_rows = _table_rows

    def get_config(self):
        config = super().get_config()
        config.pop("num_languages")
        return config
