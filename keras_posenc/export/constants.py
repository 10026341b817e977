"""The constants of one export: position tables read once, and the attention structure of a trace.

`Frozen(layer)` reads a position layer's table and language scales once (float64 -> float32);
`static_structure` derives the constant `[T, T]` attention structure (causal mask, constant
segment ids and attention mask) that the formulations turn into constants of the file.
"""

import numpy as np
import tensorflow as tf

__all__ = ["Frozen", "exclusive_count_matrix", "static_structure"]


class Frozen:
    """The constants of one position layer, read once from its trained weights (float64 -> float32)."""

    def __init__(self, layer):
        with tf.init_scope():  # eager, also while a graph is being traced
            self.table = np.asarray(layer.table_prefix(layer.max_length), np.float32)
            self.scales = (np.asarray(layer.language_scale.numpy(), np.float32)
                           if layer.num_languages is not None else None)


def static_structure(length, segment_ids=None, attention_mask=None, use_causal_mask=False):
    """Constant attention structure `[T, T]` (bool) and same-run matrix for position ids, or None.

    Returns `(allowed, runs)`: `allowed[q, k]` from the causal mask, constant segment ids and a
    constant attention mask; `runs[j, i]` True when key j lies in the same contiguous segment run
    as i (for position ids that restart per segment). Raises ValueError for non-constant
    segment ids or attention masks with more than one row (the caller decides what to do).
    """
    allowed = np.ones([length, length], bool)
    runs = np.ones([length, length], bool)
    if use_causal_mask:
        allowed &= np.tril(np.ones([length, length], bool))
    if segment_ids is not None:
        segments = tf.get_static_value(segment_ids)
        if segments is None:
            raise ValueError("segment_ids are not constant")
        segments = np.asarray(segments).reshape(-1, length)
        if len(segments) != 1 and not (segments == segments[:1]).all():
            raise ValueError("segment_ids differ between rows")
        segments = segments[0]
        allowed &= segments[:, None] == segments[None, :]
        starts = np.concatenate([[1], segments[1:] != segments[:-1]])
        ordinal = np.cumsum(starts)
        runs = ordinal[:, None] == ordinal[None, :]
    if attention_mask is not None:
        given = tf.get_static_value(attention_mask)
        if given is None:
            raise ValueError("attention_mask is not constant")
        given = np.asarray(given, bool).reshape(-1, length, length)
        if len(given) != 1:
            raise ValueError("attention_mask differs between rows")
        allowed &= given[0]
    return allowed, runs


def exclusive_count_matrix(runs):
    """`[T, T]` float32 M with M[j, i] = 1 when j < i in the same run: ids = real @ M."""
    length = len(runs)
    before = np.arange(length)[:, None] < np.arange(length)[None, :]
    return (before & runs.T).astype(np.float32)
