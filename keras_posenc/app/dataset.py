"""Corpora, SentencePiece training and tf.data pipelines for a causal LM.

A corpus is either plain text (one document or sentence per line) or TSV
parallel pairs (`source<TAB>target`). Pairs are trained as one sequence
`[<s>] source <sep> target [</s>]` whose `language_ids` are 0 on the source
side (up to and including `<sep>`) and 1 on the target side, so a model built
with `num_languages=2` learns a position scale per language.

Token ids are fixed: 0 `<pad>`, 1 `<unk>`, 2 `<s>`, 3 `</s>`, 4 `<sep>`.
BOS and EOS are explicit options of the pipeline; `<s>` stays at the start of
the sequence: it is a real token at position 0, and the first word is at
position 1.

Example:

>>> texts = ["the cat sat on the mat", "the dog sat on the log"] * 20
>>> sp_model = train_sentencepiece(texts, vocab_size=20)
>>> ds = lm_dataset(texts, sp_model, max_length=8, batch_size=4, shuffle=False)
>>> features, labels = next(iter(ds))
>>> sorted(features)
['position_ids', 'token_ids']
>>> int(features["token_ids"][0, 0]) == BOS_ID
True

References:
    - Kudo & Richardson, "SentencePiece: A simple and language independent
      subword tokenizer and detokenizer for Neural Text Processing", EMNLP
      2018 demo, https://arxiv.org/abs/1808.06226.
    - `docs/source-article-faults.md`, item 5 (why `<s>` is not moved to
      the end of the sequence).
"""

import io
import os
import random
import re

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

from keras_posenc.positions import position_ids as derive_position_ids
from keras_posenc.special_ids import BOS_ID, EOS_ID, NUM_RESERVED_IDS, PAD_ID, SEP_ID, UNK_ID
from keras_posenc.validation import check_choice, check_positive_ints

__all__ = [
    "BOS_ID", "EOS_ID", "FORMATS", "NUM_RESERVED_IDS", "PAD_ID", "SEP_ID", "SEP_PIECE", "UNK_ID",
    "CorpusError", "check_bucket_lengths", "corpus_texts", "decode", "default_bucket_lengths",
    "default_corpus_path",
    "lm_dataset", "load_corpus", "pad_batches", "parallel_corpus_path", "read_text_corpus", "read_tsv_corpus",
    "sentencepiece_vocab_size", "split_corpus", "train_sentencepiece", "unigram_cross_entropy",
]

SEP_PIECE = "<sep>"
FORMATS = ("text", "tsv")


class CorpusError(ValueError):
    """A corpus file is missing, empty or malformed.

    A `ValueError`, so callers that catch bad input generally (the CLI exits
    with status 2) also catch it.

    Example:

    >>> issubclass(CorpusError, ValueError)
    True
    """


def default_corpus_path():
    """Path of the embedded English corpus (Python documentation prose, PSF licence).

    The file is `keras_posenc/app/data/python_docs_en.txt`, one sentence per
    line, rebuilt by `tools/make_corpus.py`.

    Returns:
        str, an absolute path.

    Example:

    >>> os.path.basename(default_corpus_path())
    'python_docs_en.txt'
    >>> len(read_text_corpus(default_corpus_path())) > 1000
    True
    """
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "python_docs_en.txt")


def parallel_corpus_path():
    """Path of the embedded English -> German sample corpus (1,200 `source<TAB>target` pairs, BSD).

    The file is `keras_posenc/app/data/po_en_de_slice.tsv`: user-interface
    messages and their human German translations from the gettext `.po`
    files of Django, Wagtail, Sphinx, django CMS and Oscar, a slice of the
    corpus that `tools/make_parallel_corpus.py` builds (licences
    in `LICENSE-PO-CORPUS.txt`).

    Returns:
        str, an absolute path.

    Example:

    >>> pairs = load_corpus(parallel_corpus_path(), "tsv")
    >>> len(pairs), all(source and target for source, target in pairs)
    (1200, True)
    """
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "po_en_de_slice.tsv")


def _read_lines(path):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`corpus` must be a file path, got corpus={path!r}.")
    if not os.path.isfile(path):
        raise CorpusError(f"Corpus file not found: corpus={os.fspath(path)!r}.")
    with open(path, encoding="utf-8") as f:
        try:
            return f.read().splitlines()
        except UnicodeDecodeError as err:
            raise CorpusError(f"Corpus {os.fspath(path)!r} is not UTF-8 text: {err}.") from None


def read_text_corpus(path):
    """Non-blank lines of a plain-text corpus, stripped.

    Args:
        path: str or `os.PathLike`, a UTF-8 text file, one document or
            sentence per line.

    Returns:
        list of str, the stripped non-blank lines in file order.

    Raises:
        TypeError: `path` is not a path.
        CorpusError: the file is missing, not UTF-8 or has no non-blank line.

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "corpus.txt")
    >>> with open(path, "w") as f:
    ...     _ = f.write("  the cat sat \\n\\n the dog ran\\n")
    >>> read_text_corpus(path)
    ['the cat sat', 'the dog ran']
    """
    lines = [line.strip() for line in _read_lines(path)]
    lines = [line for line in lines if line]
    if not lines:
        raise CorpusError(f"Corpus {os.fspath(path)!r} is empty: it has no non-blank line.")
    return lines


def read_tsv_corpus(path, *, skip_bad_lines=False):
    """`(source, target)` pairs of a `source<TAB>target` corpus.

    Blank lines are ignored. A line without a tab, with more than one tab or
    with an empty side is an error naming its line number, unless
    `skip_bad_lines` is true.

    Args:
        path: str or `os.PathLike`, a UTF-8 file of `source<TAB>target` lines.
        skip_bad_lines: bool, skip malformed lines instead of raising.

    Returns:
        list of `(source, target)` tuples of stripped str.

    Raises:
        TypeError: `path` is not a path.
        CorpusError: missing file, malformed line, or no valid pair.

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "pairs.tsv")
    >>> with open(path, "w") as f:
    ...     _ = f.write("hello\\thallo\\nno tab here\\ncat\\tKatze\\n")
    >>> read_tsv_corpus(path, skip_bad_lines=True)
    [('hello', 'hallo'), ('cat', 'Katze')]
    >>> read_tsv_corpus(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_posenc.app.dataset.CorpusError: TSV corpus '...pairs.tsv' line 2 has no tab; ...
    """
    pairs = []
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) == 2 and parts[0].strip() and parts[1].strip():
            pairs.append((parts[0].strip(), parts[1].strip()))
        elif not skip_bad_lines:
            reason = "has no tab" if len(parts) == 1 else (
                f"has {len(parts) - 1} tabs" if len(parts) > 2 else "has an empty side")
            raise CorpusError(
                f"TSV corpus {os.fspath(path)!r} line {number} {reason}; expected 'source<TAB>target': "
                f"{line[:60]!r}. Fix the line or pass skip_bad_lines=True (--skip-bad-lines).")
    if not pairs:
        raise CorpusError(f"TSV corpus {os.fspath(path)!r} is empty: it has no 'source<TAB>target' line.")
    return pairs


def load_corpus(path, corpus_format="text", *, skip_bad_lines=False):
    """Reads a corpus: a list of strings (`"text"`) or of pairs (`"tsv"`).

    Args:
        path: str or `os.PathLike`, the corpus file.
        corpus_format: `"text"` (`read_text_corpus`) or `"tsv"`
            (`read_tsv_corpus`).
        skip_bad_lines: bool, for `"tsv"`: skip malformed lines.

    Returns:
        list of str (`"text"`) or of `(source, target)` tuples (`"tsv"`).

    Raises:
        ValueError: `corpus_format` is not one of `FORMATS`.
        CorpusError: see `read_text_corpus` and `read_tsv_corpus`.

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "pairs.tsv")
    >>> with open(path, "w") as f:
    ...     _ = f.write("hello\\thallo\\n")
    >>> load_corpus(path, "tsv"), load_corpus(path, "text")
    ([('hello', 'hallo')], ['hello\\thallo'])
    """
    check_choice("corpus_format", corpus_format, FORMATS)
    if corpus_format == "tsv":
        return read_tsv_corpus(path, skip_bad_lines=skip_bad_lines)
    return read_text_corpus(path)


def split_corpus(examples, eval_fraction=0.1, *, seed=0):
    """Deterministic shuffled `(train, eval)` split; eval gets at least one example.

    Args:
        examples: list of examples (strings or pairs), at least 2.
        eval_fraction: float in (0, 1), share of examples held out (rounded,
            at least one).
        seed: int, seed of the shuffle; the same seed gives the same split.

    Returns:
        `(train, eval)`, two disjoint lists that together hold every example.

    Raises:
        ValueError: `eval_fraction` is outside (0, 1).
        CorpusError: fewer than 2 examples.

    Example:

    >>> train, held_out = split_corpus(list("abcdefghij"), eval_fraction=0.2)
    >>> len(train), len(held_out), sorted(train + held_out) == list("abcdefghij")
    (8, 2, True)
    >>> split_corpus(list("abcdefghij"), eval_fraction=0.2) == (train, held_out)
    True
    """
    if not 0 < eval_fraction < 1:
        raise ValueError(f"`eval_fraction` must be in (0, 1), got eval_fraction={eval_fraction!r}.")
    if len(examples) < 2:
        raise CorpusError(f"A corpus needs at least 2 examples to hold one out for evaluation, "
                          f"got {len(examples)}.")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_eval = max(1, round(len(examples) * eval_fraction))
    return [examples[i] for i in order[n_eval:]], [examples[i] for i in order[:n_eval]]


def corpus_texts(examples):
    """The sentences to train a tokenizer on: texts, or both sides of pairs.

    Args:
        examples: list of str and/or `(source, target)` tuples.

    Returns:
        list of str, in order, both sides of every pair.

    Example:

    >>> corpus_texts(["a cat", ("hello", "hallo")])
    ['a cat', 'hello', 'hallo']
    """
    texts = []
    for example in examples:
        texts.extend(example if isinstance(example, tuple) else (example,))
    return texts


def train_sentencepiece(texts, vocab_size, *, model_type="unigram", character_coverage=0.9995):
    """Trains a SentencePiece model in memory and returns its serialized bytes.

    Ids 0-4 are `<pad>`, `<unk>`, `<s>`, `</s>`, `<sep>`. Training is
    single-threaded on the sentences in the given order, so it is
    deterministic. `vocab_size` is independent of any sequence length.

    Args:
        texts: iterable of str, the training sentences (blank ones ignored).
        vocab_size: int > `NUM_RESERVED_IDS`, pieces in the model, reserved
            ids included.
        model_type: str, SentencePiece `model_type` (`"unigram"`, `"bpe"`,
            `"char"` or `"word"`).
        character_coverage: float, share of characters the model covers.

    Returns:
        bytes, the serialized model (what `spm.model` files hold), usable by
        `sentencepiece.SentencePieceProcessor` and
        `tensorflow_text.SentencepieceTokenizer`.

    Raises:
        CorpusError: `texts` has no non-blank sentence.
        ValueError: `vocab_size` is not an int above the reserved ids, or
            exceeds what the corpus supports (the message gives the maximum).

    Example:

    >>> sp_model = train_sentencepiece(["the cat sat on the mat"] * 20, vocab_size=16)
    >>> sentencepiece_vocab_size(sp_model)
    16
    >>> processor = spm.SentencePieceProcessor()
    >>> processor.LoadFromSerializedProto(sp_model)
    True
    >>> [processor.IdToPiece(i) for i in range(NUM_RESERVED_IDS)]
    ['<pad>', '<unk>', '<s>', '</s>', '<sep>']

    References:
        - Kudo & Richardson 2018, https://arxiv.org/abs/1808.06226.
        - SentencePiece training options,
          https://github.com/google/sentencepiece/blob/master/doc/options.md.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= NUM_RESERVED_IDS:
        raise ValueError(f"`vocab_size` must be an int > {NUM_RESERVED_IDS} (the reserved ids "
                         f"<pad> <unk> <s> </s> <sep>), got vocab_size={vocab_size!r}.")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise CorpusError("Cannot train SentencePiece on an empty corpus.")
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=buffer, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            user_defined_symbols=[SEP_PIECE], num_threads=1, shuffle_input_sentence=False,
            minloglevel=2)
    except RuntimeError as err:
        found = re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", str(err))
        if found:
            raise ValueError(
                f"vocab_size={vocab_size} is larger than this corpus allows: its {len(texts)} sentences "
                f"support at most vocab_size={found.group(2)} SentencePiece pieces. Use a smaller "
                "--vocab-size or a bigger corpus.") from None
        found = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", str(err))
        if found:
            raise ValueError(
                f"vocab_size={vocab_size} is too small for this corpus: its characters (at "
                f"character_coverage={character_coverage}) and the reserved pieces need at least "
                f"vocab_size={found.group(2)}. Use a larger --vocab-size.") from None
        raise ValueError(f"SentencePiece training failed for vocab_size={vocab_size}, "
                         f"model_type={model_type!r}: {err}") from None
    return buffer.getvalue()


def sentencepiece_vocab_size(sp_model):
    """Number of pieces in a serialized SentencePiece model.

    Args:
        sp_model: bytes, a serialized SentencePiece model.

    Returns:
        int, the vocabulary size, reserved ids included.

    Example:

    >>> sentencepiece_vocab_size(train_sentencepiece(["the cat sat on the mat"] * 20, vocab_size=16))
    16
    """
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    return processor.GetPieceSize()


def decode(sp_model, ids):
    """Decodes token ids (pads and specials dropped) back to text.

    `<pad>`, `<s>`, `</s>` and `<sep>` are dropped; `<unk>` is kept.

    Args:
        sp_model: bytes, a serialized SentencePiece model.
        ids: iterable of ints (a list, a numpy array or a 1-D tensor).

    Returns:
        str, the decoded text.

    Example:

    >>> sp_model = train_sentencepiece(["the cat sat on the mat"] * 20, vocab_size=16)
    >>> processor = spm.SentencePieceProcessor()
    >>> processor.LoadFromSerializedProto(sp_model)
    True
    >>> ids = processor.EncodeAsIds("the cat sat")
    >>> decode(sp_model, [BOS_ID] + ids + [EOS_ID, PAD_ID, PAD_ID])
    'the cat sat'
    """
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    return processor.DecodeIds([int(i) for i in ids if int(i) >= NUM_RESERVED_IDS or int(i) == UNK_ID])


def default_bucket_lengths(max_length):
    """The lengths batches are padded to: powers of two from 8 below `max_length`, then `max_length`.

    A row of `n` tokens goes to the shortest bucket length `>= n`, so a
    training or evaluation step sees one of these few shapes and a
    `tf.function` traces (and XLA compiles) once per bucket.

    Args:
        max_length: int, the longest sequence.

    Returns:
        list of int, ascending, ending with `max_length`: the
        `bucket_lengths` that `lm_dataset` uses for `"auto"`.

    Example:

    >>> default_bucket_lengths(64), default_bucket_lengths(48), default_bucket_lengths(100)
    ([8, 16, 32, 64], [8, 16, 32, 48], [8, 16, 32, 64, 100])
    >>> default_bucket_lengths(4)
    [4]
    """
    lengths, edge = [], 8
    while edge < max_length:
        lengths.append(edge)
        edge *= 2
    return lengths + [max_length]


def check_bucket_lengths(bucket_lengths, max_length):
    """`bucket_lengths` sorted and validated: positive ints, the longest at least `max_length`."""
    if bucket_lengths == "auto":
        return default_bucket_lengths(max_length)
    if bucket_lengths is None:
        return None
    lengths = sorted(set(bucket_lengths))
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"`bucket_lengths` must be 'auto', None or a list of positive ints, "
                         f"got bucket_lengths={bucket_lengths!r}.")
    if lengths[-1] < max_length:
        raise ValueError(f"The longest of `bucket_lengths` must be at least max_length={max_length} so that "
                         f"every row fits a bucket, got bucket_lengths={bucket_lengths!r}.")
    return lengths


def pad_batches(ds, length, padded_shapes, *, batch_size, bucket_lengths, fill_batches, drop_remainder):
    """Batches of `(features, labels)` elements padded with `PAD_ID`: bucketed by `length`, or plain.

    With `bucket_lengths` (checked ones), an element goes to the shortest
    bucket it fits and is padded to that length, so batches come in a few
    fixed shapes; without, each batch is padded to its longest element. With
    `fill_batches` (and not `drop_remainder`), a short last batch gets
    all-padding rows up to `batch_size`.

    Args:
        ds: a dataset of `(features dict, labels)` of rank-1 int tensors.
        length: function of `(features, labels)`, the element's length.
        padded_shapes: `padded_batch`'s shapes of the elements.
        batch_size, bucket_lengths, fill_batches, drop_remainder: as `lm_dataset`'s.
    """
    padding_values = ({k: PAD_ID for k in padded_shapes[0]}, PAD_ID)
    if bucket_lengths:
        # Bucket i holds the rows shorter than boundaries[i] and pads them to boundaries[i] - 1; every
        # row is at most max_length <= bucket_lengths[-1] long, so the last, open bucket stays empty.
        ds = ds.bucket_by_sequence_length(
            length, [n + 1 for n in bucket_lengths], [batch_size] * (len(bucket_lengths) + 1),
            padded_shapes=padded_shapes, padding_values=padding_values, pad_to_bucket_boundary=True,
            drop_remainder=drop_remainder)
    else:
        ds = ds.padded_batch(batch_size, padded_shapes, padding_values, drop_remainder=drop_remainder)

    def fill(features, labels):
        missing = batch_size - tf.shape(labels)[0]
        return tf.nest.map_structure(
            lambda t: tf.pad(t, [[0, missing], [0, 0]], constant_values=PAD_ID), (features, labels))

    return ds.map(fill) if fill_batches and not drop_remainder else ds


def lm_dataset(examples, sp_model, *, max_length, batch_size, add_bos=True, add_eos=True,
               bucket_lengths="auto", fill_batches=False, shuffle=True, seed=0, repeat=False,
               drop_remainder=False):
    """A tf.data pipeline of next-token batches `(features, labels)`.

    The examples are tokenized once, when the pipeline is built, with
    `tensorflow_text.SentencepieceTokenizer`; each is then framed with
    optional `<s>` and `</s>` (pairs get `<sep>` between the sides),
    truncated to `max_length + 1` tokens and shifted: inputs are tokens
    `[:-1]`, labels tokens `[1:]`, both at most `max_length` long. Batches
    group rows of similar length (bucketing) and are padded with `PAD_ID`
    (0) to their bucket's length, so they come in a few fixed shapes.

    Args:
        examples: list of strings, or of `(source, target)` pairs.
        sp_model: serialized SentencePiece model (bytes).
        max_length: int, longest model input.
        batch_size: int, sequences per batch.
        add_bos: bool, start every sequence with `<s>`.
        add_eos: bool, end every sequence with `</s>`.
        bucket_lengths: `"auto"` (`default_bucket_lengths`), a list of
            lengths whose longest is at least `max_length` (a row goes to the
            shortest bucket it fits and is padded to that length), or None
            for no bucketing (pad to the longest row of the batch).
        fill_batches: bool, pad a bucket's last, short batch with all-padding
            rows up to `batch_size` (they carry no label), so that every batch
            has `batch_size` rows.
        shuffle: bool, shuffle the examples (seeded, reshuffled each epoch).
        seed: int, shuffle seed.
        repeat: bool, repeat forever.
        drop_remainder: bool, drop each bucket's last, short batch.

    Returns:
        A dataset of `({"token_ids", "position_ids"[, "language_ids"]}, labels)`,
        all int32 `[batch, length]`. `position_ids` come from the padding mask
        of each row; `language_ids` exist for pairs.

    Raises:
        ValueError: `max_length` or `batch_size` is not a positive int, or bad
            `bucket_lengths`.
        CorpusError: `examples` is empty.

    Example:

    >>> texts = ["the cat sat on the mat", "the dog sat on the log"] * 20
    >>> sp_model = train_sentencepiece(texts, vocab_size=20)
    >>> ds = lm_dataset(texts[:2], sp_model, max_length=6, batch_size=2, shuffle=False,
    ...                 bucket_lengths=None)
    >>> features, labels = next(iter(ds))
    >>> features["token_ids"].shape, labels.shape
    (TensorShape([2, 6]), TensorShape([2, 6]))
    >>> features["position_ids"][0].numpy().tolist()
    [0, 1, 2, 3, 4, 5]
    >>> bool(tf.reduce_all(features["token_ids"][:, 1:] == labels[:, :-1]))  # labels: inputs shifted
    True
    >>> ds = lm_dataset(texts[:3], sp_model, max_length=12, batch_size=2, shuffle=False,
    ...                 bucket_lengths=[4, 12], fill_batches=True)
    >>> [tuple(labels.shape) for _, labels in ds]  # every row is at most 12 long: one bucket
    [(2, 12), (2, 12)]

    References:
        - `tf.data.Dataset.bucket_by_sequence_length`,
          https://www.tensorflow.org/api_docs/python/tf/data/Dataset#bucket_by_sequence_length.
        - `tensorflow_text.SentencepieceTokenizer`,
          https://www.tensorflow.org/text/api_docs/python/text/SentencepieceTokenizer.
    """
    check_positive_ints([("max_length", max_length), ("batch_size", batch_size)])
    bucket_lengths = check_bucket_lengths(bucket_lengths, max_length)
    if not examples:
        raise CorpusError("Cannot build a dataset from an empty list of examples.")
    paired = isinstance(examples[0], tuple)
    # Tokenized here, once: a pipeline that runs the (stateful) tokenizer op per element is turned
    # into a sequential map under op determinism, and TF 2.21 logs an error line each time it does.
    tokenizer = tf_text.SentencepieceTokenizer(model=sp_model, out_type=tf.int32)
    columns = tuple(zip(*examples)) if paired else (list(examples),)
    pieces = tuple(tokenizer.tokenize(tf.constant(column, tf.string)) for column in columns)
    bos = tf.constant([BOS_ID] if add_bos else [], tf.int32)
    eos = tf.constant([EOS_ID] if add_eos else [], tf.int32)

    def frame(source, target=None):
        head = tf.concat([bos, source], axis=0)
        if target is None:
            tokens = tf.concat([head, eos], axis=0)
            languages = tf.zeros_like(tokens)
        else:
            head = tf.concat([head, [SEP_ID]], axis=0)
            tail = tf.concat([target, eos], axis=0)
            tokens = tf.concat([head, tail], axis=0)
            languages = tf.concat([tf.zeros_like(head), tf.ones_like(tail)], axis=0)
        tokens, languages = tokens[:max_length + 1], languages[:max_length + 1]
        features = {"token_ids": tokens[:-1]}
        if paired:
            features["language_ids"] = languages[:-1]
        return features, tokens[1:]

    ds = tf.data.Dataset.from_tensor_slices(pieces)
    if shuffle:
        ds = ds.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.map(frame, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.filter(lambda features, labels: tf.size(labels) > 0)
    feature_names = ["token_ids", "language_ids"] if paired else ["token_ids"]
    padded_shapes = ({k: [None] for k in feature_names}, [None])
    ds = pad_batches(ds, lambda features, labels: tf.size(labels), padded_shapes, batch_size=batch_size,
                     bucket_lengths=bucket_lengths, fill_batches=fill_batches, drop_remainder=drop_remainder)

    def add_positions(features, labels):
        features = dict(features)
        features["position_ids"] = derive_position_ids(tf.not_equal(features["token_ids"], PAD_ID))
        return features, labels

    return ds.map(add_positions).prefetch(tf.data.AUTOTUNE)


def unigram_cross_entropy(train_ds, eval_ds, vocab_size):
    """Mean per-token cross-entropy (nats) of an add-one unigram model.

    Token counts come from the labels of `train_ds`; the loss is measured on
    the labels of `eval_ds`, padding excluded: the baseline a language model
    must beat on the same split. Both datasets must be finite.

    Args:
        train_ds: finite dataset of `(features, labels)` (`lm_dataset`);
            only the labels are read.
        eval_ds: finite dataset of `(features, labels)` to measure on.
        vocab_size: int, number of token ids.

    Returns:
        float, nats per real eval token.

    Raises:
        CorpusError: `eval_ds` has no real token.

    Example: one training row `[5, 5, 6, <pad>]` with vocabulary 7 gives
    add-one counts 3 for id 5 out of 9 (ids 1-6, one each, plus the row), so
    an eval label 5 costs `-log(3/9) = log 3`.

    >>> train_ds = tf.data.Dataset.from_tensors((tf.zeros([1]), tf.constant([[5, 5, 6, PAD_ID]])))
    >>> eval_ds = tf.data.Dataset.from_tensors((tf.zeros([1]), tf.constant([[5, PAD_ID]])))
    >>> round(float(unigram_cross_entropy(train_ds, eval_ds, vocab_size=7)), 6)
    1.098612
    """
    import numpy as np

    counts = np.ones(vocab_size, np.float64)
    counts[PAD_ID] = 0.0
    for _, labels in train_ds:
        labels = labels.numpy().ravel()
        counts += np.bincount(labels[labels != PAD_ID], minlength=vocab_size)[:vocab_size]
    log_p = np.log(counts / counts.sum(), where=counts > 0, out=np.full(vocab_size, -np.inf))
    total, n = 0.0, 0
    for _, labels in eval_ds:
        labels = labels.numpy().ravel()
        labels = labels[labels != PAD_ID]
        total -= log_p[labels].sum()
        n += labels.size
    if n == 0:
        raise CorpusError("The evaluation split has no tokens.")
    return total / n
