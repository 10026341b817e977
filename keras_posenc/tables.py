"""Sinusoidal position tables, computed in float64 numpy.

This module is pure numpy: it knows nothing about TensorFlow. Layers turn its
tables into constants.
"""

import numpy as np

from keras_posenc.validation import check_base, check_choice, check_positive_int, check_stored_dims

__all__ = [
    "DEFAULT_STORED_DIMS",
    "LAYOUTS",
    "TABLE_KINDS",
    "column_frequencies",
    "compressed_table",
    "factorization_block",
    "interpolation_nodes",
    "interpolation_weights",
    "inverse_frequencies",
    "resize_table_2d",
    "resolve_stored_dims",
    "sinusoidal_table",
    "sinusoidal_table_2d",
    "table_constants",
    "table_error_report",
    "table_nbytes",
]

LAYOUTS = ("interleave", "concat")


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
    check_positive_int("depth", depth)
    check_base(base)
    pairs = np.arange((depth + 1) // 2, dtype=np.float64)
    return np.power(np.float64(base), -2.0 * pairs / depth)


def column_frequencies(depth, base=10000.0, layout="interleave"):
    """Frequency and phase kind of every column.

    Args:
        depth: int >= 1, the embedding width.
        base: float > 1, the wavelength scale.
        layout: "interleave" or "concat" (see `sinusoidal_table`).

    Returns:
        `(freq, is_sin)`: float64 `[depth]` frequencies and a bool `[depth]`
        array that is True for sine columns and False for cosine columns.
        `PE[p, j] = sin(p * freq[j])` where `is_sin[j]`, else
        `cos(p * freq[j])`.

    Example:

    >>> freq, is_sin = column_frequencies(4)
    >>> freq.tolist(), is_sin.tolist()
    ([1.0, 1.0, 0.01, 0.01], [True, False, True, False])
    >>> column_frequencies(4, layout="concat")[1].tolist()
    [True, True, False, False]

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 3.5.
    """
    check_choice("layout", layout, LAYOUTS)
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
    check_positive_int("length", length, minimum=0)
    check_positive_int("depth", depth)
    check_positive_int("start", start, minimum=0)
    freq, is_sin = column_frequencies(depth, base, layout)
    positions = np.arange(start, start + length, dtype=np.float64)[:, None]
    angles = positions * freq[None, :]
    table = np.where(is_sin[None, :], np.sin(angles), np.cos(angles))
    return table.astype(dtype)


# Compressed tables ------------------------------------------------------------
#
# A layer stores the arrays of `table_constants(kind, ...)` and rebuilds rows
# from them in-graph with gather/mul/add/sub only; `compressed_table` is the
# same rebuild in numpy (same float32 arithmetic), used by tests and benchmarks.

TABLE_KINDS = ("full", "interpolated", "factorized")
DEFAULT_STORED_DIMS = 64


def resolve_stored_dims(stored_dims, depth):
    """The number of stored columns of an interpolated table of width `depth`.

    An explicit value is validated (even, `2 <= stored_dims <= depth`) and
    returned. `None` means `DEFAULT_STORED_DIMS` (64), lowered to
    `depth` rounded up to even when the model is narrower: the table is then
    stored whole and is exact (no compression), instead of failing for small
    models that never asked for a particular value.

    Args:
        stored_dims: None or an even int, `2 <= stored_dims <= depth`.
        depth: int >= 1, the table width.

    Returns:
        An int.

    Example:

    >>> resolve_stored_dims(None, 512), resolve_stored_dims(None, 15), resolve_stored_dims(16, 512)
    (64, 16, 16)
    """
    check_positive_int("depth", depth)
    if stored_dims is None:
        return min(DEFAULT_STORED_DIMS, depth + depth % 2)
    check_stored_dims(stored_dims, depth)
    return int(stored_dims)


def interpolation_nodes(pairs, stored_pairs):
    """Indices of the frequency pairs that an interpolated table stores.

    Nodes are evenly spaced over the pair index, with the first (highest
    frequency) and last (lowest frequency) pair always included, so nothing
    is extrapolated: `node[k] = (k * (pairs - 1)) // (stored_pairs - 1)`.
    Frequencies are geometric in the pair index, so this is even spacing in
    log-frequency. Pair `i` lies between nodes `k(i)` and `k(i) + 1` with
    `k(i) = min(((i + 1) * (stored_pairs - 1) - 1) // (pairs - 1), stored_pairs - 2)`.
    Layers evaluate both formulas in-graph, so no index array is stored.

    Args:
        pairs: int >= 1, the number of frequency pairs, `ceil(depth / 2)`.
        stored_pairs: int, `1 <= stored_pairs <= pairs`.

    Returns:
        An int64 array `[stored_pairs]` of increasing pair indices.

    Example:

    >>> interpolation_nodes(10, 4).tolist()
    [0, 3, 6, 9]
    """
    check_positive_int("pairs", pairs)
    check_positive_int("stored_pairs", stored_pairs)
    if stored_pairs > pairs:
        raise ValueError(f"`stored_pairs` must be <= pairs={pairs}, got stored_pairs={stored_pairs}.")
    if stored_pairs == 1:
        return np.zeros([1], np.int64)
    return (np.arange(stored_pairs) * (pairs - 1)) // (stored_pairs - 1)


def interpolation_weights(pairs, stored_pairs):
    """`(lower, alpha)` for every pair: pair `i` is `(1 - alpha) * node[lower] + alpha * node[lower + 1]`.

    With a single stored pair every pair copies it (`lower = 0`, `alpha = 0`;
    the upper node is then node 0 too).

    Args:
        pairs: int >= 1, the number of frequency pairs.
        stored_pairs: int, `1 <= stored_pairs <= pairs`.

    Returns:
        `lower`: int64 `[pairs]`, index into the nodes; `alpha`: float32
        `[pairs]` in [0, 1]: 0 at stored pairs, except 1 at the last one
        (the upper node of the last interval). Rows are rebuilt as
        `(1 - alpha) * lo + alpha * hi`, exact at every stored pair.

    Example:

    >>> lower, alpha = interpolation_weights(4, 2)  # nodes are pairs 0 and 3
    >>> lower.tolist(), [round(float(a), 4) for a in alpha]
    ([0, 0, 0, 0], [0.0, 0.3333, 0.6667, 1.0])
    """
    nodes = interpolation_nodes(pairs, stored_pairs)
    i = np.arange(pairs)
    if stored_pairs == 1:
        return np.zeros([pairs], np.int64), np.zeros([pairs], np.float32)
    lower = np.minimum(((i + 1) * (stored_pairs - 1) - 1) // (pairs - 1), stored_pairs - 2)
    lo, hi = nodes[lower], nodes[lower + 1]
    alpha = ((i - lo).astype(np.float32) / (hi - lo).astype(np.float32)).astype(np.float32)
    return lower, alpha


def factorization_block(length):
    """Fine-table size `B = ceil(sqrt(length))` of a factorized table (>= 1).

    Args:
        length: int >= 1, the number of table rows.

    Returns:
        An int: position `p` is rebuilt from coarse row `p // B` and fine
        row `p % B`.

    Example:

    >>> factorization_block(512), factorization_block(16)
    (23, 4)
    """
    check_positive_int("length", length)
    return max(1, int(np.ceil(np.sqrt(length))))


def _pair_sin_cos(positions, depth, base):
    """float64 `sin` and `cos` `[len(positions), ceil(depth / 2)]` of every frequency pair."""
    angles = np.asarray(positions, np.float64)[:, None] * inverse_frequencies(depth, base)[None, :]
    return np.sin(angles), np.cos(angles)


def table_constants(kind, length, depth, *, stored_dims=None, base=10000.0, layout="interleave"):
    """The float32 arrays a layer stores for a table kind; nothing else is stored.

    Kinds:
        "full": `table` `[length, depth]`, the whole table.
        "interpolated": `stored` `[length, 2K]`, the sines (first K columns)
            and cosines (last K) of the `K = stored_dims / 2` node pairs of
            `interpolation_nodes`.
        "factorized": with `B = factorization_block(length)` and
            `A = ceil(length / B)`, `coarse` `[A, 2P]` = sin|cos of the angles
            `a * B * w` and `fine` `[B, 2P]` = sin|cos of `b * w`, for the
            `P = ceil(depth / 2)` frequencies `w`.

    Args:
        kind: one of `TABLE_KINDS`.
        length: int >= 1, the number of table rows.
        depth: int >= 1, the table width.
        stored_dims: interpolated only; see `resolve_stored_dims`.
        base: float > 1, wavelength scale.
        layout: "interleave" or "concat".

    Returns:
        A dict name -> float32 numpy array.

    Example:

    >>> {name: a.shape for name, a in table_constants("factorized", 100, 16).items()}
    {'coarse': (10, 16), 'fine': (10, 16)}
    >>> {name: a.shape for name, a in table_constants("interpolated", 100, 16, stored_dims=4).items()}
    {'stored': (100, 4)}
    """
    check_choice("table", kind, TABLE_KINDS)
    check_choice("layout", layout, LAYOUTS)
    check_positive_int("length", length)
    check_positive_int("depth", depth)
    if kind == "full":
        return {"table": sinusoidal_table(length, depth, base=base, layout=layout, dtype=np.float32)}
    pairs = (depth + 1) // 2
    if kind == "interpolated":
        stored_pairs = resolve_stored_dims(stored_dims, depth) // 2
        nodes = interpolation_nodes(pairs, stored_pairs)
        sin, cos = _pair_sin_cos(np.arange(length), depth, base)
        return {"stored": np.concatenate([sin[:, nodes], cos[:, nodes]], axis=1).astype(np.float32)}
    block = factorization_block(length)
    coarse_rows = -(-length // block)
    coarse = np.concatenate(_pair_sin_cos(np.arange(coarse_rows) * block, depth, base), axis=1)
    fine = np.concatenate(_pair_sin_cos(np.arange(block), depth, base), axis=1)
    return {"coarse": coarse.astype(np.float32), "fine": fine.astype(np.float32)}


def table_nbytes(kind, length, depth, *, stored_dims=None, base=10000.0, layout="interleave"):
    """Bytes of the constants a layer stores for this table kind.

    Args:
        kind, length, depth, stored_dims, base, layout: as in `table_constants`.

    Returns:
        An int.

    Example:

    >>> table_nbytes("full", 512, 512), table_nbytes("factorized", 512, 512)
    (1048576, 94208)
    """
    arrays = table_constants(kind, length, depth, stored_dims=stored_dims, base=base, layout=layout)
    return int(sum(a.nbytes for a in arrays.values()))


def pair_columns(depth, layout):
    """`(pair, is_cos)` of every output column of a `depth`-wide sinusoidal table.

    Column `c` holds sin (is_cos 0) or cos (is_cos 1) of frequency pair `pair[c]`: alternating
    in the "interleave" layout, all sines then all cosines in "concat".

    >>> [a.tolist() for a in pair_columns(4, "interleave")], [a.tolist() for a in pair_columns(4, "concat")]
    ([[0, 0, 1, 1], [0, 1, 0, 1]], [[0, 1, 0, 1], [0, 0, 1, 1]])
    """
    pairs = (depth + 1) // 2
    cols = np.arange(depth)
    if layout == "interleave":
        return cols // 2, cols % 2
    return np.where(cols < pairs, cols, cols - pairs), (cols >= pairs).astype(np.int64)


def compressed_table(kind, length, depth, *, stored_dims=None, base=10000.0, layout="interleave"):
    """The table a layer rebuilds from `table_constants`, in the same float32 arithmetic.

    Interpolated table (`stored_dims` columns, default 64):
        Linear interpolation along the pair index between the stored node
        pairs of `interpolation_nodes` (sines from sines, cosines from
        cosines). Even node spacing over the pair index (= log-frequency,
        both ends stored so nothing is extrapolated) was measured to leave
        the most columns accurate among placements with density
        `~ w ** g`, g in [0, 1] (denser at high frequency only helps the
        few extra stored pairs, while the columns between them stay wrong).
        The error of column pair `i` at position `p` is about
        `h**2 / 8 * (p * w_i * 2 ln(base) / depth)**2` for node spacing `h`:
        small where `p * w_i` is small, hopeless where the angle changes by
        more than ~1 rad between neighbouring pairs. Measured against the
        float64 table (length 512, depth 512, 64 stored dims, 12.5% of
        the bytes): max abs error 2.0, RMS 0.49 overall. By column band:
        0-191 (the highest frequencies) max 2.0, RMS 0.69-0.84, i.e. no
        information left at large positions; 192-255 max 1.24; 256-319
        max 0.24; 320-383 max 0.028; 384-447 max 0.0047; 448-511 max
        0.0015. At (2048, 768) columns 0-479 have max error 1.85-2.0.
        Stored columns are exact, and so is every column at positions
        small enough that `p * w` barely changes between nodes. The
        high-frequency half cannot be recovered by any placement of 32
        pairs: use `"factorized"` when accuracy matters; it is smaller
        and exact.

    Factorized table:
        Angle addition, `p = a * B + b`:
        `sin(p w) = sin(aBw) cos(bw) + cos(aBw) sin(bw)` and
        `cos(p w) = cos(aBw) cos(bw) - sin(aBw) sin(bw)`, from float32
        coarse and fine tables. Max abs error against float64 is below
        3e-7 (float32 rounding of the factors, two products and a sum).

    Args:
        kind: one of `TABLE_KINDS`.
        length, depth, base, layout: as in `sinusoidal_table`.
        stored_dims: interpolated only; see `resolve_stored_dims`.

    Returns:
        float32 `[length, depth]`.

    Example:

    >>> exact = sinusoidal_table(100, 16, dtype=np.float64)
    >>> approx = compressed_table("factorized", 100, 16)
    >>> bool(np.abs(approx - exact).max() < 1e-6)
    True
    >>> approx = compressed_table("interpolated", 100, 16, stored_dims=8)
    >>> bool(np.allclose(approx[:, [0, 1, 14, 15]], exact[:, [0, 1, 14, 15]], atol=1e-7))  # stored pairs
    True
    """
    consts = table_constants(kind, length, depth, stored_dims=stored_dims, base=base, layout=layout)
    if kind == "full":
        return consts["table"]
    pairs = (depth + 1) // 2
    pair, is_cos = pair_columns(depth, layout)
    if kind == "interpolated":
        stored = consts["stored"]
        stored_pairs = stored.shape[1] // 2
        lower, alpha = interpolation_weights(pairs, stored_pairs)
        upper = np.minimum(lower + 1, stored_pairs - 1)
        lo = stored[:, is_cos * stored_pairs + lower[pair]]
        hi = stored[:, is_cos * stored_pairs + upper[pair]]
        return (lo * (np.float32(1) - alpha[pair]) + hi * alpha[pair]).astype(np.float32)
    block = consts["fine"].shape[0]
    positions = np.arange(length)
    coarse, fine = consts["coarse"][positions // block], consts["fine"][positions % block]
    cs, cc, fs, fc = coarse[:, :pairs], coarse[:, pairs:], fine[:, :pairs], fine[:, pairs:]
    sin_cos = np.concatenate([cs * fc + cc * fs, cc * fc - cs * fs], axis=1)
    return sin_cos[:, is_cos * pairs + pair].astype(np.float32)


def table_error_report(kind, length, depth, *, stored_dims=None, base=10000.0, layout="interleave",
                       num_bands=8):
    """Memory and accuracy of a table kind against the float64 full table.

    Args:
        kind, length, depth, stored_dims, base, layout: as in `compressed_table`.
        num_bands: int >= 1, the columns are split into this many contiguous
            bands of frequency pairs (band 0 = highest frequencies).

    Returns:
        A dict with `kind`, `stored_bytes` (the layer's constants),
        `full_bytes` (the float32 `[length, depth]` table), `fraction`
        (their ratio), `max_abs_error`, `rms_error`, `column_max_error`
        (float64 `[depth]`) and `bands`: a list of dicts with `pairs`
        (first, last), `columns` (the interleaved-layout column range),
        `max_abs_error` and `rms_error`.

    Example:

    >>> report = table_error_report("factorized", 512, 512)
    >>> report["fraction"] < 1 / 8, report["max_abs_error"] < 1e-6
    (True, True)
    """
    check_positive_int("num_bands", num_bands)
    approx = compressed_table(kind, length, depth, stored_dims=stored_dims, base=base, layout=layout)
    exact = sinusoidal_table(length, depth, base=base, layout=layout, dtype=np.float64)
    error = approx.astype(np.float64) - exact
    stored = table_nbytes(kind, length, depth, stored_dims=stored_dims, base=base, layout=layout)
    full = length * depth * 4
    pair, _ = pair_columns(depth, layout)
    pairs = (depth + 1) // 2
    bands = []
    for first, stop in _bands(pairs, num_bands):
        cols = (pair >= first) & (pair < stop)
        band = error[:, cols]
        bands.append({"pairs": (first, stop - 1), "columns": (2 * first, min(2 * stop, depth) - 1),
                      "max_abs_error": float(np.abs(band).max()),
                      "rms_error": float(np.sqrt(np.mean(band ** 2)))})
    return {"kind": kind, "stored_bytes": stored, "full_bytes": full, "fraction": stored / full,
            "max_abs_error": float(np.abs(error).max()), "rms_error": float(np.sqrt(np.mean(error ** 2))),
            "column_max_error": np.abs(error).max(axis=0), "bands": bands}


def _bands(pairs, num_bands):
    edges = np.linspace(0, pairs, min(num_bands, pairs) + 1).round().astype(int)
    return [(int(edges[k]), int(edges[k + 1])) for k in range(len(edges) - 1)]


# 2-D tables for patch grids ---------------------------------------------------


def sinusoidal_table_2d(height, width, depth, *, cls_token=False, base=10000.0, dtype="float32"):
    """The 2-D sin-cos table of a `height x width` patch grid, in MAE's layout.

    Token `r * width + c` (row-major) is the patch in row `r`, column `c`.
    The first `depth / 2` channels encode the column `c` and the last
    `depth / 2` the row `r`; within each half the first quarter of the
    channels is `sin(x * w_k)` and the second `cos(x * w_k)`, with
    `w_k = base ** (-k / (depth / 4))`, `k = 0 .. depth/4 - 1`. With
    `cls_token`, a row of zeros for the class token comes first.

    Args:
        height: int >= 1, patch rows.
        width: int >= 1, patch columns.
        depth: int, a positive multiple of 4 (the model width).
        cls_token: bool, prepend an all-zero row.
        base: float > 1, wavelength scale.
        dtype: numpy dtype of the result (computed in float64).

    Returns:
        A numpy array `[height * width (+ 1), depth]`.

    Example:

    >>> table = sinusoidal_table_2d(2, 3, 4, dtype="float64")
    >>> table.shape
    (6, 4)
    >>> table[4].round(4).tolist()  # row 1, column 1: [sin 1, cos 1, sin 1, cos 1]
    [0.8415, 0.5403, 0.8415, 0.5403]
    >>> sinusoidal_table_2d(2, 3, 4, cls_token=True)[0].tolist()
    [0.0, 0.0, 0.0, 0.0]

    References:
        - [He et al., 2021](https://arxiv.org/abs/2111.06377), "Masked
          Autoencoders Are Scalable Vision Learners" (MAE,
          `util/pos_embed.py`).
    """
    check_positive_int("height", height)
    check_positive_int("width", width)
    check_positive_int("depth", depth, minimum=4)
    if depth % 4:
        raise ValueError(f"`depth` must be a multiple of 4 (sin and cos of rows and of columns), "
                         f"got depth={depth}.")
    check_base(base)
    quarter = depth // 4
    frequencies = float(base) ** (-np.arange(quarter, dtype=np.float64) / quarter)
    rows, columns = np.divmod(np.arange(height * width, dtype=np.float64), width)

    def half(coordinate):
        angles = coordinate[:, None] * frequencies[None, :]
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    table = np.concatenate([half(columns), half(rows)], axis=1)
    if cls_token:
        table = np.concatenate([np.zeros([1, depth]), table], axis=0)
    return table.astype(dtype)


def _cubic_weights(fraction, a=-0.75):
    """Weights of the 4 taps at offsets -1, 0, 1, 2 of the cubic convolution kernel (Keys, 1981)."""
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(fraction + 1), near(fraction), near(1 - fraction), far(2 - fraction)], axis=-1)


def _bicubic_matrix(size, new_size):
    """`[new_size, size]` matrix of 1-D bicubic resampling (half-pixel centres, edges clamped)."""
    centres = (np.arange(new_size, dtype=np.float64) + 0.5) * (size / new_size) - 0.5
    left = np.floor(centres)
    weights = _cubic_weights(centres - left)
    matrix = np.zeros([new_size, size])
    for tap in range(4):
        source = np.clip(left.astype(int) - 1 + tap, 0, size - 1)
        np.add.at(matrix, (np.arange(new_size), source), weights[:, tap])
    return matrix


def resize_table_2d(table, height, width, new_height, new_width, *, cls_token=False):
    """Resamples a `[height * width (+1), depth]` grid table to a new grid, bicubically.

    For fine-tuning at another image or patch size: each channel is treated
    as a `height x width` image and resized with bicubic convolution
    (`a = -0.75`, half-pixel centres, edge rows and columns repeated), the
    resampling of `torch.nn.functional.interpolate(mode="bicubic",
    align_corners=False)` that MAE's `interpolate_pos_embed` uses. A class
    token row (`cls_token=True`) is kept as it is. Works for learned tables
    as well as for `sinusoidal_table_2d`.

    Args:
        table: array `[height * width, depth]`, or `[1 + height * width,
            depth]` with `cls_token`; tokens in row-major order.
        height, width: int >= 1, the grid of `table`.
        new_height, new_width: int >= 1, the new grid.
        cls_token: bool, the first row is a class token.

    Returns:
        A float64 numpy array `[new_height * new_width (+1), depth]`.

    Example:

    >>> table = sinusoidal_table_2d(4, 4, 8)
    >>> bool(np.allclose(resize_table_2d(table, 4, 4, 4, 4), table))  # same grid: unchanged
    True
    >>> resize_table_2d(table, 4, 4, 6, 5).shape
    (30, 8)

    References:
        - [He et al., 2021](https://arxiv.org/abs/2111.06377), MAE
          (`util/pos_embed.py`, `interpolate_pos_embed`).
        - Keys, "Cubic convolution interpolation for digital image
          processing", IEEE TASSP 29(6), 1981.
    """
    for name, value in (("height", height), ("width", width), ("new_height", new_height),
                        ("new_width", new_width)):
        check_positive_int(name, value)
    table = np.asarray(table, np.float64)
    expected = height * width + int(bool(cls_token))
    if table.ndim != 2 or table.shape[0] != expected:
        raise ValueError(f"`table` must have shape [{expected}, depth] for a {height}x{width} grid"
                         f"{' plus a cls row' if cls_token else ''}, got shape {table.shape}.")
    head, grid = (table[:1], table[1:]) if cls_token else (table[:0], table)
    grid = grid.reshape(height, width, -1)
    rows, columns = _bicubic_matrix(height, new_height), _bicubic_matrix(width, new_width)
    resized = np.einsum("Rr,rcd,Cc->RCd", rows, grid, columns).reshape(new_height * new_width, -1)
    return np.concatenate([head, resized], axis=0)
