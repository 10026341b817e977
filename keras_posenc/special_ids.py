"""The reserved token ids of the package's SentencePiece vocabularies.

`keras-posenc train` reserves the first ids of every vocabulary it builds; the exporter writes them
into `FILE.json` so the device kit can detokenize and stop without the training code.

Example:

>>> PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID, NUM_RESERVED_IDS
(0, 1, 2, 3, 4, 5)
"""

__all__ = ["BOS_ID", "EOS_ID", "NUM_RESERVED_IDS", "PAD_ID", "SEP_ID", "UNK_ID"]

PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID = 0, 1, 2, 3, 4
NUM_RESERVED_IDS = 5
