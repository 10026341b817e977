"""Sinusoidal position tables, computed in float64 numpy.

This module is pure numpy: it knows nothing about TensorFlow. Layers turn its
tables into constants.
"""

import numpy as np

LAYOUTS = ("interleave", "concat")


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be an int, got {value!r} of type {type(value).__name__}.")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {name}={value}.")


def check_layout(layout):
    """Raises ValueError unless `layout` is one of `LAYOUTS`."""
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {LAYOUTS}, got layout={layout!r}.")


def check_base(base):
    """Raises ValueError unless `base` is a finite number > 1."""
    if isinstance(base, bool) or not isinstance(base, (int, float, np.number)):
        raise TypeError(f"`base` must be a number, got base={base!r}.")
    if not np.isfinite(base) or base <= 1:
        raise ValueError(f"`base` must be a finite number > 1, got base={base!r}.")


def inverse_frequencies(depth, base=10000.0):
    """Angular frequency of every column pair, in float64.

    Pair `i` (columns `2i` and `2i+1` in the interleaved layout) turns at
    `base ** (-2i / depth)` radians per position. An odd depth has one more
    sine column than cosine columns, so there are `ceil(depth / 2)` pairs.

    Args:
        depth: int >= 1, the embedding width.
        base: float > 1, the wavelength scale (10000 in the paper).

    Returns:
        A float64 array of shape `[ceil(depth / 2)]`.

    Example:

    >>> inverse_frequencies(4).tolist()
    [1.0, 0.01]
    """
    _check_int("depth", depth, 1)
    check_base(base)
    pairs = np.arange((depth + 1) // 2, dtype=np.float64)
    return np.power(np.float64(base), -2.0 * pairs / depth)


def column_frequencies(depth, base=10000.0, layout="interleave"):
    """Frequency and phase kind of every column.

    Returns:
        `(freq, is_sin)`: float64 `[depth]` frequencies and a bool `[depth]`
        array that is True for sine columns and False for cosine columns.
        `PE[p, j] = sin(p * freq[j])` where `is_sin[j]`, else
        `cos(p * freq[j])`.
    """
    check_layout(layout)
    inv = inverse_frequencies(depth, base)
    if layout == "interleave":
        cols = np.arange(depth)
        return inv[cols // 2], cols % 2 == 0
    n_cos = depth // 2
    freq = np.concatenate([inv, inv[:n_cos]])
    is_sin = np.arange(depth) < inv.shape[0]
    return freq, is_sin


def sinusoidal_table(length, depth, *, base=10000.0, layout="interleave", start=0,
                     dtype="float32"):
    """The sinusoidal position table of "Attention Is All You Need".

    Row `p` encodes position `start + p`. Angles and their sines are computed
    in float64 and only the result is cast to `dtype`, so a float32 table is
    correctly rounded at every position (computing the angle in float32 is
    already off by ~5e-4 at position 8192).

    Layouts:
        "interleave" (the paper, keras-hub, tensor2tensor's "interleaved"
        variant): column `j` uses `w = base ** (-2 * (j // 2) / depth)`;
        even columns are `sin(p * w)`, odd columns `cos(p * w)`.
        "concat" (the TensorFlow text tutorial): the first `ceil(depth / 2)`
        columns are sines and the rest cosines of the same frequencies.
        Both are defined for every depth >= 1; an odd depth gets one more sine
        than cosine column.

    Args:
        length: int >= 0, number of rows.
        depth: int >= 1, number of columns (the model width).
        base: float > 1, wavelength scale.
        layout: "interleave" or "concat".
        start: int >= 0, the position of row 0.
        dtype: numpy dtype of the result.

    Returns:
        A numpy array of shape `[length, depth]`.

    Example:

    >>> table = sinusoidal_table(3, 4)
    >>> table[0].tolist()
    [0.0, 1.0, 0.0, 1.0]
    >>> round(float(table[1, 0]), 6) == round(float(np.sin(1.0)), 6)
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.5.
    """
    _check_int("length", length, 0)
    _check_int("depth", depth, 1)
    _check_int("start", start, 0)
    freq, is_sin = column_frequencies(depth, base, layout)
    positions = np.arange(start, start + length, dtype=np.float64)[:, None]
    angles = positions * freq[None, :]
    table = np.where(is_sin[None, :], np.sin(angles), np.cos(angles))
    return table.astype(dtype)
