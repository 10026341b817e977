"""Per-sample position ids from a padding mask, segments and a decode offset."""

from keras_posenc.backend import dtype_name, ops, static_int
from keras_posenc.validation import check, check_equal_dims, with_checks

__all__ = ["position_ids", "running_count"]


def position_ids(mask, *, segment_ids=None, offset=0):
    """Numbers the real tokens of every row, whatever the padding.

    Real tokens (mask True) get `offset, offset + 1, ...` in order, so a
    left-padded row numbers its first real token `offset`, exactly like the
    same row without padding. Padding positions get 0. With `segment_ids`,
    numbering restarts wherever the segment id changes along the row, so a
    packed row of several sequences numbers each of them from `offset`.

    Everything is vectorised over the batch (0/1 triangular matmuls, see
    `running_count`, and one segment sum; no loop, no cumulative sum), works
    with unknown batch and length inside `tf.function`, and compiles under
    XLA and `jax.jit` (Keras 3 `ops` only).

    Args:
        mask: bool or int tensor `[B, T]`, true/non-zero for real tokens.
        segment_ids: optional int tensor `[B, T]`; a new sequence starts
            wherever the value differs from the previous position.
        offset: int scalar or int `[B]` tensor, the position of each row's
            first real token (the number of tokens already decoded when
            decoding step by step with a cache).

    Returns:
        An int32 tensor `[B, T]` of the Keras backend.

    Raises:
        ValueError: `mask`, `segment_ids` or `offset` has the wrong shape, or
            `offset` is negative (`InvalidArgumentError` in a graph).
        TypeError: `segment_ids` or `offset` is not an integer tensor.

    Example:

    >>> import numpy as np
    >>> from keras_posenc.backend import ops
    >>> mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    >>> ops.convert_to_numpy(position_ids(mask)).tolist()
    [[0, 0, 0, 1, 2], [0, 1, 2, 3, 0]]
    >>> segments = np.array([[1, 1, 1, 2, 2]])
    >>> ops.convert_to_numpy(position_ids(np.ones([1, 5]), segment_ids=segments)).tolist()
    [[0, 1, 2, 0, 1]]
    >>> ops.convert_to_numpy(position_ids(np.ones([1, 2]), offset=7)).tolist()
    [[7, 8]]
    >>> position_ids(np.ones([1, 2]), offset=-1)
    Traceback (most recent call last):
        ...
    ValueError: `offset` must be >= 0, got offset=-1.

    References:
        - [Krell et al., 2021](https://arxiv.org/abs/2107.02027), "Efficient
          sequence packing without cross-contamination" (position ids that
          restart per packed sequence).
    """
    mask = ops.convert_to_tensor(mask)
    if len(mask.shape) != 2:
        raise ValueError(f"`mask` must have rank 2 [batch, length], got shape {_shape(mask)}.")
    is_real = mask if dtype_name(mask) == "bool" else ops.not_equal(mask, ops.zeros((), mask.dtype))
    real = ops.cast(is_real, "int32")
    before = running_count(is_real, exclusive=True)  # real tokens so far
    if segment_ids is not None:
        before = before - _real_tokens_in_earlier_segments(real, before, segment_ids)
    offset = _as_offset(offset, ops.shape(real)[0])
    if offset is not None:
        before = before + offset
    return ops.where(is_real, before, ops.zeros_like(before))


def running_count(flags, *, exclusive=False):
    """For every position of a `[B, T]` 0/1 tensor: how many ones come before it along the row.

    A cumulative sum in int32, exact. With a length `T` known while tracing
    (every `jax.jit`, a static `input_signature`, an exported file) it is a
    log-step scan: `ceil(log2(T))` shifted adds (slice, concat, add), plain ops
    on every backend and edge runtime, where a cumulative sum is not a GPU
    op (LiteRT's CUMSUM). With an unknown `T` (a dynamic-shape
    `tf.function`) it is one `cumsum`, the cheapest there.

    Args:
        flags: bool or 0/1 int tensor `[B, T]`.
        exclusive: bool, count the ones strictly before (True) or up to and
            including (False) each position.

    Returns:
        An int32 tensor `[B, T]`.

    Example:

    >>> import numpy as np
    >>> from keras_posenc.backend import ops
    >>> flags = np.array([[0, 1, 1, 0, 1]])
    >>> ops.convert_to_numpy(running_count(flags)).tolist()
    [[0, 1, 2, 2, 3]]
    >>> ops.convert_to_numpy(running_count(flags, exclusive=True)).tolist()
    [[0, 0, 1, 2, 2]]
    """
    flags = ops.cast(ops.convert_to_tensor(flags), "int32")
    length = static_int(flags.shape[1])
    if length is None:
        counts = ops.cumsum(flags, axis=1)
    else:
        counts, shift = flags, 1
        while shift < length:  # Hillis-Steele: after the step of `shift`, windows of 2 * shift
            shifted = ops.concatenate([ops.zeros_like(counts[:, :shift]), counts[:, :length - shift]], axis=1)
            counts = counts + shifted
            shift *= 2
    return counts - flags if exclusive else counts


def _shape(x):
    """A static shape as the messages print it: `(2, None, 3)`."""
    return tuple(x.shape)


def _as_offset(offset, batch):
    """The validated offset, broadcastable to [batch, length]; None for a known 0."""
    offset = ops.convert_to_tensor(offset)
    dtype = dtype_name(offset)
    if "float" in dtype or dtype == "bool":
        raise TypeError(f"`offset` must be an integer scalar or [batch] tensor, got dtype {dtype}.")
    offset = ops.cast(offset, "int32")
    if len(offset.shape) > 1:
        raise ValueError(f"`offset` must be a scalar or have shape [batch], got shape {_shape(offset)}.")
    static = static_int(offset) if len(offset.shape) == 0 else None
    if static is not None:
        # Known while tracing: checked here, and no ops at all for the usual offset=0.
        if static < 0:
            raise ValueError(f"`offset` must be >= 0, got offset={static}.")
        return None if static == 0 else offset
    checks = check(ops.all(offset >= 0), "`offset` must be >= 0, got offset={}.", offset)
    if len(offset.shape) == 1:
        checks += check(ops.equal(ops.size(offset), batch),
                        "`offset` of shape [batch] must have {} entries, got {}.", batch, ops.size(offset))
        return with_checks(offset[:, None], checks)
    return with_checks(offset, checks)


def _real_tokens_in_earlier_segments(real, before, segment_ids):
    """For every position: how many real tokens precede its segment in the row.

    `before` is the exclusive count of real tokens of the row; the count at a
    segment's first position is what precedes the whole segment.
    """
    segment_ids = ops.convert_to_tensor(segment_ids)
    if "float" in dtype_name(segment_ids):
        raise TypeError(f"`segment_ids` must be integers, got dtype {dtype_name(segment_ids)}.")
    if len(segment_ids.shape) != 2:
        raise ValueError(
            f"`segment_ids` must have rank 2 [batch, length], got shape {_shape(segment_ids)}.")
    seg_shape, real_shape = ops.shape(segment_ids), ops.shape(real)
    checks = check_equal_dims("`segment_ids` shape {} must equal the mask shape {}.",
                              list(seg_shape), list(real_shape))
    segment_ids = with_checks(ops.cast(segment_ids, "int32"), checks)
    batch, length = real_shape
    changes = ops.cast(ops.not_equal(segment_ids[:, 1:], segment_ids[:, :-1]), "int32")
    starts = ops.concatenate([ops.ones_like(segment_ids[:, :1]), changes], axis=1)
    # Ordinal of each position's segment within its row: 0, 0, 1, 1, 1, 2, ...
    ordinal = running_count(starts) - 1
    flat = ordinal + ops.arange(batch, dtype="int32")[:, None] * length
    # One start per segment: the segment sum of `starts * before` is `before` at the segment's start.
    at_start = ops.segment_sum(ops.reshape(starts * before, [-1]), ops.reshape(flat, [-1]),
                               num_segments=batch * length)
    return ops.take_along_axis(ops.reshape(at_start, ops.shape(real)), ordinal, axis=1)
