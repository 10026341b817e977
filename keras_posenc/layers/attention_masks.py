"""Attention masks: every kind of mask merged into one boolean mask for the attention."""

import numpy as np

from keras_posenc.backend import dtype_name, is_tensorflow, ops
from keras_posenc.validation import check, with_checks

__all__ = ["merge_attention_masks", "static_or_dynamic_length"]


def static_or_dynamic_length(tensor):
    """Axis 1 of `tensor`: a Python int when known while tracing, else a scalar tensor.

    A static length lets `merge_attention_masks` check mask shapes while
    tracing and keeps the causal mask a constant.

    Args:
        tensor: a tensor of rank >= 2, `[batch, length, ...]`.

    Returns:
        An int, or an int32 scalar tensor when the length is unknown.

    Example:

    >>> static_or_dynamic_length(ops.zeros([2, 5]))
    5
    """
    return ops.shape(tensor)[1]


def merge_attention_masks(length, mask=None, attention_mask=None, use_causal_mask=False,
                          segment_ids=None):
    """Combines every kind of mask into one boolean attention mask.

    Entry `[b, i, j]` is True when query `i` may attend to key `j`: key `j`
    is a real token (`mask`), `attention_mask` allows it, `j <= i` when
    causal, and both lie in the same segment when `segment_ids` are given
    (packed rows attend block-diagonally). Padding masks keys only, as in
    keras-hub: no real token ever attends to padding, and the rows of
    padding queries (whose outputs are ignored downstream) need no masking.
    With padding as the only mask the result is then `[B, 1, T]`, which
    broadcasts inside the attention instead of materialising `[B, T, T]`
    (the saving is measured in benchmarks/RESULTS.md). An all-padding row masks
    every key; attention stays finite (Keras adds a large negative number,
    not -inf, before the softmax).

    Args:
        length: int scalar (tensor), the sequence length T.
        mask: optional bool `[B, T]`, True for real tokens.
        attention_mask: optional bool/int `[B, T, T]`, `[B, 1, T]` or `[T, T]`.
        use_causal_mask: bool, forbid attending to later positions.
        segment_ids: optional int `[B, T]`.

    Returns:
        A bool tensor `[B or 1, T, T]` (`[B, 1, T]` for padding alone), or
        None when nothing is masked.

    Example:

    >>> def as_ints(merged):
    ...     return ops.convert_to_numpy(merged)[0].astype(int).tolist()
    >>> mask = ops.convert_to_tensor([[True, True, False]])
    >>> as_ints(merge_attention_masks(3, mask=mask, use_causal_mask=True))
    [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    >>> tuple(merge_attention_masks(3, mask=mask).shape)
    (1, 1, 3)
    >>> as_ints(merge_attention_masks(3, segment_ids=ops.convert_to_tensor([[1, 1, 2]])))
    [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    >>> merge_attention_masks(3) is None
    True

    References:
        - [Krell et al., 2021](https://arxiv.org/abs/2107.02027) (block-diagonal
          attention for packed sequences).
    """
    parts = []
    if mask is not None:
        mask = ops.cast(mask, "bool")
        parts.append(mask[:, None, :])  # keys only: see the docstring
    if attention_mask is not None:
        parts.append(_checked_attention_mask(attention_mask, length))
    if use_causal_mask:
        positions = ops.arange(length)
        parts.append((positions[:, None] >= positions[None, :])[None])
    if segment_ids is not None:
        segment_ids = ops.convert_to_tensor(segment_ids)
        if "float" in dtype_name(segment_ids):
            raise TypeError(f"`segment_ids` must be integers, got dtype {dtype_name(segment_ids)}.")
        parts.append(ops.equal(segment_ids[:, :, None], segment_ids[:, None, :]))
    if not parts:
        return None
    merged = parts[0]
    for part in parts[1:]:
        merged = ops.logical_and(merged, part)
    return merged


def _checked_attention_mask(attention_mask, length):
    """`attention_mask` as bool `[batch or 1, length or 1, length]`, its shape checked."""
    attention_mask = ops.convert_to_tensor(attention_mask)
    shape = tuple(attention_mask.shape)
    if len(shape) not in (2, 3):
        raise ValueError(f"`attention_mask` must have shape [batch, length, length] or "
                         f"[length, length], got shape {attention_mask.shape}.")
    attention_mask = ops.cast(attention_mask, "bool")
    if len(shape) == 2:
        attention_mask = attention_mask[None]
    # [batch, 1, length] (keys only, what padding alone merges to) is accepted too.
    static_length = length if isinstance(length, (int, np.integer)) else None
    queries, keys = tuple(attention_mask.shape)[1:]
    if static_length is not None and (queries not in (None, 1, static_length)
                                      or keys not in (None, static_length)):
        raise ValueError(f"`attention_mask` must have shape [batch, length, length] with length "
                         f"{static_length}, got shape {attention_mask.shape}.")
    if static_length is not None and None not in (queries, keys) or not is_tensorflow():
        return attention_mask
    import tensorflow as tf  # a shape known only when the graph runs: TensorFlow only

    dynamic = tf.shape(attention_mask)
    fits = tf.logical_and(tf.equal(dynamic[2], length),
                          tf.logical_or(tf.equal(dynamic[1], length), tf.equal(dynamic[1], 1)))
    checks = check(fits, "`attention_mask` must have shape [batch, length, length] with length {}, "
                   "got shape {}.", length, dynamic)
    return with_checks(attention_mask, checks)
