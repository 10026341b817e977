"""Per-sample position ids from a padding mask, segments and a decode offset."""

import tensorflow as tf

from keras_posenc.validation import check, with_checks

__all__ = ["position_ids"]


def position_ids(mask, *, segment_ids=None, offset=0):
    """Numbers the real tokens of every row, whatever the padding.

    Real tokens (mask True) get `offset, offset + 1, ...` in order, so a
    left-padded row numbers its first real token `offset`, exactly like the
    same row without padding. Padding positions get 0. With `segment_ids`,
    numbering restarts wherever the segment id changes along the row, so a
    packed row of several sequences numbers each of them from `offset`.

    Everything is vectorised over the batch (cumulative sums and one segment
    sum, no loop), works with unknown batch and length inside `tf.function`,
    and compiles under XLA.

    Args:
        mask: bool or int tensor `[B, T]`, true/non-zero for real tokens.
        segment_ids: optional int tensor `[B, T]`; a new sequence starts
            wherever the value differs from the previous position.
        offset: int scalar or int `[B]` tensor, the position of each row's
            first real token (the number of tokens already decoded when
            decoding step by step with a cache).

    Returns:
        An int32 tensor `[B, T]`.

    Raises:
        ValueError: `mask`, `segment_ids` or `offset` has the wrong shape, or
            `offset` is negative (`InvalidArgumentError` in a graph).
        TypeError: `segment_ids` or `offset` is not an integer tensor.

    Example:

    >>> mask = tf.constant([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    >>> position_ids(mask).numpy().tolist()
    [[0, 0, 0, 1, 2], [0, 1, 2, 3, 0]]
    >>> segments = tf.constant([[1, 1, 1, 2, 2]])
    >>> position_ids(tf.ones([1, 5]), segment_ids=segments).numpy().tolist()
    [[0, 1, 2, 0, 1]]
    >>> position_ids(tf.ones([1, 2]), offset=7).numpy().tolist()
    [[7, 8]]
    >>> position_ids(tf.ones([1, 2]), offset=-1)
    Traceback (most recent call last):
        ...
    ValueError: `offset` must be >= 0, got offset=-1.

    References:
        - [Krell et al., 2021](https://arxiv.org/abs/2107.02027), "Efficient
          sequence packing without cross-contamination" (position ids that
          restart per packed sequence).
    """
    mask = tf.convert_to_tensor(mask)
    if mask.shape.rank is not None and mask.shape.rank != 2:
        raise ValueError(f"`mask` must have rank 2 [batch, length], got shape {mask.shape}.")
    is_real = mask if mask.dtype == tf.bool else tf.cast(mask, tf.bool)
    real = tf.cast(is_real, tf.int32)
    before = tf.cumsum(real, axis=1, exclusive=True)
    if segment_ids is not None:
        before = before - _real_tokens_in_earlier_segments(real, segment_ids)
    offset = _as_offset(offset, tf.shape(real)[0])
    if offset is not None:
        before = before + offset
    return tf.where(is_real, before, 0)


def _as_offset(offset, batch):
    """The validated offset, broadcastable to [batch, length]; None for a known 0."""
    offset = tf.convert_to_tensor(offset)
    if offset.dtype.is_floating or offset.dtype == tf.bool:
        raise TypeError(
            f"`offset` must be an integer scalar or [batch] tensor, got dtype {offset.dtype.name}.")
    offset = tf.cast(offset, tf.int32)
    if offset.shape.rank is not None and offset.shape.rank > 1:
        raise ValueError(f"`offset` must be a scalar or have shape [batch], got shape {offset.shape}.")
    static = tf.get_static_value(offset)
    if offset.shape.rank == 0 and static is not None:
        # Known while tracing: checked here, and no ops at all for the usual offset=0.
        if static < 0:
            raise ValueError(f"`offset` must be >= 0, got offset={static}.")
        return None if static == 0 else offset
    checks = check(tf.reduce_all(offset >= 0), "`offset` must be >= 0, got offset={}.", offset)
    if offset.shape.rank == 1:
        checks += check(tf.equal(tf.size(offset), batch),
                        "`offset` of shape [batch] must have {} entries, got {}.", batch, tf.size(offset))
        return with_checks(offset[:, None], checks)
    return with_checks(offset, checks)


def _real_tokens_in_earlier_segments(real, segment_ids):
    """For every position: how many real tokens precede its segment in the row."""
    segment_ids = tf.convert_to_tensor(segment_ids)
    if segment_ids.dtype.is_floating:
        raise TypeError(f"`segment_ids` must be integers, got dtype {segment_ids.dtype.name}.")
    if segment_ids.shape.rank is not None and segment_ids.shape.rank != 2:
        raise ValueError(f"`segment_ids` must have rank 2 [batch, length], got shape {segment_ids.shape}.")
    checks = check(tf.reduce_all(tf.equal(tf.shape(segment_ids), tf.shape(real))),
                   "`segment_ids` shape {} must equal the mask shape {}.",
                   tf.shape(segment_ids), tf.shape(real))
    segment_ids = with_checks(tf.cast(segment_ids, tf.int32), checks)
    batch, length = tf.shape(real)[0], tf.shape(real)[1]
    starts = tf.concat(
        [tf.ones([batch, 1], tf.int32),
         tf.cast(tf.not_equal(segment_ids[:, 1:], segment_ids[:, :-1]), tf.int32)],
        axis=1)[:, :length]
    # Ordinal of each position's segment within its row: 0, 0, 1, 1, 1, 2, ...
    ordinal = tf.cumsum(starts, axis=1) - 1
    flat = ordinal + tf.range(batch)[:, None] * length
    per_segment = tf.math.unsorted_segment_sum(real, flat, batch * length)
    per_segment = tf.reshape(per_segment, [batch, length])
    earlier = tf.cumsum(per_segment, axis=1, exclusive=True)
    return tf.gather(earlier, ordinal, batch_dims=1)
