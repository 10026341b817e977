"""The host embedding table of a quantized export: rows in the export's precision, looked up by the kit.

An `embedding="host"` file takes the looked-up rows `table[token_ids]` instead of ids; the table
lives beside the file and, for vocab 32k and d_model 512, is 64 MB in float32: more than the rest
of a small model. A quantized export stores it in its own precision:

- float32 / float16: `FILE.embeddings.npy`, the table itself (float16 for `--quantize float16`);
- int8 / int4: `FILE.embeddings.npz` with `codes`, `scales` and `bits`/`block`: symmetric codes
  in [-127, 127] (int8, one scale per row) or [-7, 7] (int4, one scale per block of `block`
  values of a row, two codes a byte, low nibble first). A row block `r[i:i + block]` is
  `codes * scale` with `scale = max|r[i:i + block]| / 127` (or `/ 7`); an all-zero block has
  scale 1 and codes 0.

`dequantize_rows(stored, ids)` is what the kit does (export/jetson/kit_embeddings.py, the same
formula): only the looked-up rows are dequantized, so the device keeps the compact table in
memory.
"""

import numpy as np

__all__ = ["HOST_TABLE_FORMATS", "dequantize_rows", "dequantized_table", "quantize_table", "table_bytes"]

# bits -> (largest code, values per scale; None: the whole row)
HOST_TABLE_FORMATS = {8: (127, None), 4: (7, 32)}


def quantize_table(table, bits):
    """The `FILE.embeddings.npz` arrays of a float table: `{"codes", "scales", "bits", "block"}`.

    Args:
        table: float array `[vocab, d_model]`.
        bits: 8 or 4 (`HOST_TABLE_FORMATS`).

    Returns:
        dict of numpy arrays: `codes` (int8 `[vocab, d_model]` for 8 bits; uint8
        `[vocab, d_model / 2]`, two codes a byte, for 4), `scales` (float32 `[vocab, blocks]`),
        `bits` and `block` (int32 scalars; `block` is d_model for 8 bits).

    Raises:
        ValueError: `bits` is not 8 or 4, or d_model is not a multiple of the int4 block.

    Example:

    >>> stored = quantize_table(np.array([[0.5, -1.0, 0.25]]), bits=8)
    >>> stored["codes"].tolist(), stored["scales"].tolist()
    ([[64, -127, 32]], [[0.007874015718698502]])
    """
    if bits not in HOST_TABLE_FORMATS:
        raise ValueError(f"`bits` must be one of {tuple(HOST_TABLE_FORMATS)}, got bits={bits!r}.")
    table = np.asarray(table, np.float64)
    vocab, width = table.shape
    largest, block = HOST_TABLE_FORMATS[bits]
    block = block or width
    if width % block:
        raise ValueError(f"int{bits} host rows take blocks of {block} values: d_model={width} is not a "
                         "multiple of it.")
    blocks = table.reshape(vocab, width // block, block)
    peak = np.abs(blocks).max(axis=-1)
    scales = np.where(peak > 0, peak / largest, 1.0).astype(np.float32)
    codes = np.clip(np.rint(blocks / scales[..., None].astype(np.float64)), -largest, largest)
    codes = codes.reshape(vocab, width).astype(np.int8)
    if bits == 4:
        nibbles = (codes & 0xF).astype(np.uint8)
        codes = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8)
    return {"codes": codes, "scales": scales, "bits": np.int32(bits), "block": np.int32(block)}


def dequantize_rows(stored, ids):
    """float32 rows `table[ids]` of a stored table (`quantize_table`'s dict, or a float array).

    Example:

    >>> stored = quantize_table(np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]]), bits=8)
    >>> dequantize_rows(stored, np.array([[1, 0]])).astype(np.float64).round(3).tolist()
    [[[0.0, 0.0, 0.0], [0.504, -1.0, 0.252]]]
    """
    ids = np.asarray(ids)
    if not isinstance(stored, dict) and not hasattr(stored, "files"):
        return np.asarray(stored)[ids].astype(np.float32)
    bits, block = int(stored["bits"]), int(stored["block"])
    codes = np.asarray(stored["codes"])[ids]
    if bits == 4:
        low = (codes & 0xF).astype(np.int8)
        high = (codes >> 4).astype(np.int8)
        nibbles = np.stack([low, high], axis=-1).reshape(*codes.shape[:-1], -1)
        codes = np.where(nibbles > 7, nibbles - 16, nibbles)
    scales = np.asarray(stored["scales"], np.float32)[ids]
    width = codes.shape[-1]
    rows = codes.astype(np.float32).reshape(*codes.shape[:-1], width // block, block) * scales[..., None]
    return rows.reshape(*codes.shape[:-1], width)


def dequantized_table(stored):
    """The whole float32 table the kit would see (every row dequantized)."""
    vocab = np.asarray(stored["scales"] if isinstance(stored, dict) else stored).shape[0]
    return dequantize_rows(stored, np.arange(vocab))


def table_bytes(stored):
    """Bytes of the stored arrays (codes and scales, or the float table)."""
    if isinstance(stored, dict):
        return int(sum(np.asarray(value).nbytes for value in stored.values()))
    return int(np.asarray(stored).nbytes)
