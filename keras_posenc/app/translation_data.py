"""tf.data pipelines for the encoder-decoder translator: `(source, target)` pairs as teacher-forced batches.

Framing (Vaswani et al.'s, as in tensor2tensor and fairseq): the source is
`pieces </s>`, the decoder input `<s> pieces`, the labels `pieces </s>`
(the decoder input shifted by one). Each side is cut to `max_length`.

Example:

>>> from keras_posenc.app.dataset import train_sentencepiece
>>> pairs = [("the cat sat on the mat", "the dog sat on the log")] * 20
>>> sp_model = train_sentencepiece([s for pair in pairs for s in pair], vocab_size=20)
>>> features, labels = next(iter(translation_dataset(pairs[:2], sp_model, max_length=8, batch_size=2,
...                                                  shuffle=False, bucket_lengths=None)))
>>> sorted(features)
['source_ids', 'target_ids']
>>> targets = features["target_ids"].numpy()
>>> int(targets[0, 0]) == BOS_ID, bool((targets[:, 1:] == labels.numpy()[:, :-1]).all())
(True, True)
"""

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from keras_posenc.app.dataset import CorpusError, check_bucket_lengths, pad_batches
from keras_posenc.special_ids import BOS_ID, EOS_ID, PAD_ID
from keras_posenc.validation import check_positive_ints

__all__ = ["pad_rows", "source_ids", "translation_dataset"]


def translation_dataset(pairs, sp_model, *, max_length, batch_size, bucket_lengths="auto", fill_batches=False,
                        shuffle=True, seed=0, repeat=False, drop_remainder=False):
    """Teacher-forced batches `({"source_ids", "target_ids"}, labels)` of `(source, target)` pairs.

    Tokenized once, when the pipeline is built
    (`tensorflow_text.SentencepieceTokenizer`). Batches group pairs by the
    longer of their two sides and pad both sides with `PAD_ID` to the
    bucket's length, so they come in a few fixed shapes.

    Args:
        pairs: list of `(source, target)` strings.
        sp_model: serialized SentencePiece model (bytes), the joint vocabulary.
        max_length: int, the longest source and target in tokens.
        batch_size: int, pairs per batch.
        bucket_lengths: as `keras_posenc.app.dataset.lm_dataset`'s.
        fill_batches: bool, pad a bucket's last, short batch with all-padding
            pairs (no labels) up to `batch_size`.
        shuffle: bool, shuffle (seeded, reshuffled each epoch).
        seed: int.
        repeat: bool, repeat forever.
        drop_remainder: bool, drop each bucket's last, short batch.

    Returns:
        A dataset of `({"source_ids", "target_ids"}, labels)`, int32
        `[batch, length]` each.

    Raises:
        CorpusError: no pairs, or examples that are not pairs.
    """
    check_positive_ints([("max_length", max_length), ("batch_size", batch_size)])
    lengths = check_bucket_lengths(bucket_lengths, max_length)
    if not pairs:
        raise CorpusError("Cannot build a translation dataset from an empty list of pairs.")
    if not all(isinstance(pair, tuple) and len(pair) == 2 for pair in pairs):
        raise CorpusError("A translation corpus holds (source, target) pairs: train --task translate needs "
                          "--format tsv.")
    tokenizer = tf_text.SentencepieceTokenizer(model=sp_model, out_type=tf.int32)
    sources, targets = zip(*pairs)
    pieces = (tokenizer.tokenize(tf.constant(sources, tf.string)),
              tokenizer.tokenize(tf.constant(targets, tf.string)))
    eos, bos = tf.constant([EOS_ID], tf.int32), tf.constant([BOS_ID], tf.int32)

    def frame(source, target):
        source = tf.concat([source[:max_length - 1], eos], axis=0)
        target = target[:max_length - 1]
        return ({"source_ids": source, "target_ids": tf.concat([bos, target], axis=0)},
                tf.concat([target, eos], axis=0))

    ds = tf.data.Dataset.from_tensor_slices(pieces)
    if shuffle:
        ds = ds.shuffle(len(pairs), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.map(frame, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    padded_shapes = ({"source_ids": [None], "target_ids": [None]}, [None])

    def longer_side(features, labels):
        return tf.maximum(tf.size(features["source_ids"]), tf.size(labels))

    ds = pad_batches(ds, longer_side, padded_shapes, batch_size=batch_size, bucket_lengths=lengths,
                     fill_batches=fill_batches, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)


def source_ids(sp_model, sentences, max_length):
    """Sources as the translator reads them: `pieces </s>`, cut to `max_length`, right-padded int32 rows.

    Args:
        sp_model: a `sentencepiece.SentencePieceProcessor`.
        sentences: list of str.
        max_length: int.

    Returns:
        list of int32 numpy arrays (one per sentence, unpadded).

    Example:

    >>> import sentencepiece as spm
    >>> from keras_posenc.app.dataset import train_sentencepiece
    >>> sp_model = train_sentencepiece(["the cat sat on the mat", "the dog sat on the log"] * 20, 20)
    >>> rows = source_ids(spm.SentencePieceProcessor(model_proto=sp_model), ["the cat", "the dog sat"], 3)
    >>> [int(row[-1]) == EOS_ID for row in rows], [len(row) <= 3 for row in rows]
    ([True, True], [True, True])
    """
    rows = []
    for ids in sp_model.encode(list(sentences)):
        rows.append(np.asarray(list(ids[:max_length - 1]) + [EOS_ID], np.int32))
    return rows


def pad_rows(rows, left=False):
    """`rows` (int sequences) as one int32 array `[n, longest]`, padded with `PAD_ID` on the right or left.

    Example:

    >>> pad_rows([[5, 6, 3], [7, 3]]).tolist(), pad_rows([[5, 6, 3], [7, 3]], left=True).tolist()
    ([[5, 6, 3], [7, 3, 0]], [[5, 6, 3], [0, 7, 3]])
    """
    width = max(len(row) for row in rows)
    out = np.full([len(rows), width], PAD_ID, np.int32)
    for i, row in enumerate(rows):
        if left:
            out[i, width - len(row):] = row
        else:
            out[i, :len(row)] = row
    return out
