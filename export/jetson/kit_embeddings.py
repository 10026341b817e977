"""The token table of an `--embedding host` export, as the runners feed its rows (numpy only).

`keras-posenc export` writes it beside the model in the export's precision: `FILE.embeddings.npy`
(float32, or float16 with `--quantize float16`) or, with `--quantize int8 | int4`,
`FILE.embeddings.npz` holding `codes`, `scales`, `bits` and `block`: a row block
`r[i:i + block]` is `codes * scale` (int8 codes, one scale a row; int4 codes two a byte, low
nibble first, one scale per `block` values). Only the rows looked up are dequantized: the device
keeps the compact table in memory.

Kept beside run_tflite.py and run_generate.py (copy them together).
"""

import os

import numpy as np
from kit_contract import fail


class HostTable:
    """The table named in FILE.json (checked against its size and sha256); `rows(ids)` is `table[ids]`."""

    def __init__(self, export):
        name = export["embedding_table"]
        path = export.path(name)
        if not os.path.isfile(path):
            fail(f"{export.model} takes looked-up `embeddings` (exported with --embedding host): copy "
                 f"{name} from `keras-posenc export` beside it.")
        export.verify(path)
        if path.endswith(".npz"):
            with np.load(path) as stored:
                self.codes, self.scales = stored["codes"], stored["scales"].astype(np.float32)
                self.bits, self.block = int(stored["bits"]), int(stored["block"])
            self.table = None
        else:
            self.table, self.bits = np.load(path), None
        self.vocab = len(self.table if self.table is not None else self.codes)

    def rows(self, ids):
        """float32 `table[ids]`; one line and exit status 1 for ids outside the vocabulary."""
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            fail(f"Token ids must lie in [0, {self.vocab}), got ids from {ids.min()} to {ids.max()}.")
        if self.table is not None:
            return self.table[ids].astype(np.float32)
        codes = self.codes[ids]
        if self.bits == 4:
            nibbles = np.stack([codes & 0xF, codes >> 4], axis=-1)
            nibbles = nibbles.reshape(*codes.shape[:-1], -1).astype(np.int8)
            codes = np.where(nibbles > 7, nibbles - 16, nibbles)
        width = codes.shape[-1]
        blocks = codes.astype(np.float32).reshape(*codes.shape[:-1], width // self.block, self.block)
        return (blocks * self.scales[ids][..., None]).reshape(*codes.shape[:-1], width)
