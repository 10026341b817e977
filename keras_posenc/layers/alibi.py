"""ALiBi: per-head slopes and the additive attention bias they give."""

import math

import numpy as np

from keras_posenc.backend import ops
from keras_posenc.validation import check_positive_int

__all__ = ["MASKED_BIAS", "alibi_bias", "alibi_slopes"]

# What a disallowed key gets: the additive mask value of Keras' attention softmax.
MASKED_BIAS = -1e9


def alibi_slopes(num_heads):
    """The per-head ALiBi slopes of Press et al., float64.

    For a power of two `n`, head `h` (0-based) gets `2 ** (-8 * (h + 1) / n)`:
    a geometric sequence from `2 ** (-8 / n)` to `2 ** -8`. For other head
    counts, the `2 ** floor(log2 n)` slopes of the nearest lower power of two
    come first, followed by every other slope (the 1st, 3rd, ...) of twice
    that power of two until there are `n`.

    Args:
        num_heads: int >= 1.

    Returns:
        A float64 numpy array `[num_heads]`.

    Example:

    >>> (1 / alibi_slopes(8)).tolist()
    [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
    >>> np.log2(alibi_slopes(6)).tolist()
    [-2.0, -4.0, -6.0, -8.0, -1.0, -3.0]

    References:
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409), "Train
          Short, Test Long: Attention with Linear Biases Enables Input Length
          Extrapolation", section 3 and the reference code's `get_slopes`.
    """
    check_positive_int("num_heads", num_heads)
    power = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = 2.0 ** (-8.0 * np.arange(1, power + 1, dtype=np.float64) / power)
    if power == num_heads:
        return slopes
    finer = 2.0 ** (-8.0 * np.arange(1, 2 * power + 1, dtype=np.float64) / (2 * power))
    return np.concatenate([slopes, finer[0::2][:num_heads - power]])


def alibi_bias(slopes, position_ids, allowed=None, dtype="float32"):
    """The ALiBi attention bias per sample, with every mask folded in.

    Entry `[b, h, i, j]` is `-slopes[h] * |p_j - p_i|`, with `p` the
    position ids of row `b`. Under a causal mask (`j <= i`) this is
    Press et al.'s `slopes[h] * (j - i)`; without one it is the symmetric
    form used by bidirectional encoders. Because it uses position ids, not
    indices, a left-padded row gets exactly the bias of the same row without
    padding on its real tokens, and packed sequences restart their distances.
    Where `allowed` is False the entry is `MASKED_BIAS` instead, so one
    additive tensor carries ALiBi and the padding, causal and segment masks.

    Args:
        slopes: float array `[heads]` (`alibi_slopes(heads)`).
        position_ids: int tensor `[batch, length]`.
        allowed: optional bool tensor broadcastable to `[batch, length,
            length]` (`merge_attention_masks`), True where query `i` may attend
            to key `j`.
        dtype: dtype of the result.

    Returns:
        A tensor `[batch, heads, length, length]`.

    Example:

    >>> ids = ops.convert_to_tensor([[0, 1, 2]])
    >>> bias = alibi_bias(alibi_slopes(2), ids)  # slopes 1/16, 1/256
    >>> (ops.convert_to_numpy(bias)[0, 0] * 16).tolist()
    [[0.0, -1.0, -2.0], [-1.0, 0.0, -1.0], [-2.0, -1.0, 0.0]]

    References:
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409), section 3.
    """
    positions = ops.cast(position_ids, "float32")
    distance = ops.abs(positions[:, None, :] - positions[:, :, None])  # [batch, query, key]
    slopes = ops.convert_to_tensor(np.asarray(slopes, np.float32).reshape(1, -1, 1, 1))
    bias = 0.0 - slopes * distance[:, None]  # +0.0, not -0.0, on the diagonal
    if allowed is not None:
        allowed = ops.cast(allowed, "bool")
        if len(allowed.shape) == 3:
            allowed = allowed[:, None]
        bias = ops.where(allowed, bias, ops.convert_to_tensor(MASKED_BIAS, bias.dtype))
    return ops.cast(bias, dtype)
