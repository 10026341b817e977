"""Corpora, SentencePiece training and the tf.data LM pipeline."""

import math
import os
import re

import numpy as np
import pytest
import sentencepiece as spm

from keras_posenc.app import dataset as data

TEXTS = [
    "the cat sat on the mat",
    "a dog ran in the park and barked at the birds",
    "positions tell the model where each word is",
    "short",
    "the quick brown fox jumps over the lazy dog again and again",
] * 8


@pytest.fixture(scope="module")
def sp_model():
    return data.train_sentencepiece(TEXTS, vocab_size=40)


def _processor(sp_model):
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    return processor


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# Corpora ------------------------------------------------------------------------------------
def test_default_corpus_is_real_english_with_licence():
    path = data.default_corpus_path()
    lines = data.read_text_corpus(path)
    assert len(lines) > 5000 and os.path.getsize(path) > 400_000
    words = " ".join(lines).lower().split()
    # Real English: "the" is the most frequent word and a few function words are frequent.
    top = [w for w, _ in sorted(((w, words.count(w)) for w in {"the", "a", "is", "of", "to"}),
                                key=lambda kv: -kv[1])]
    assert top[0] == "the" and words.count("the") / len(words) > 0.04
    folder = os.path.dirname(path)
    assert "PYTHON SOFTWARE FOUNDATION LICENSE" in open(os.path.join(folder, "LICENSE-PSF.txt")).read()


def test_read_text_corpus_strips_and_skips_blank_lines(tmp_path):
    path = _write(tmp_path, "c.txt", "  first line \n\n\t\nsecond\n")
    assert data.read_text_corpus(path) == ["first line", "second"]


def test_missing_and_empty_corpus_are_clear_errors(tmp_path):
    with pytest.raises(data.CorpusError, match=r"Corpus file not found: corpus='.*nope\.txt'"):
        data.read_text_corpus(str(tmp_path / "nope.txt"))
    with pytest.raises(data.CorpusError, match="is empty: it has no non-blank line"):
        data.read_text_corpus(_write(tmp_path, "e.txt", "\n  \n"))
    with pytest.raises(data.CorpusError, match="is empty"):
        data.read_tsv_corpus(_write(tmp_path, "e.tsv", "\n"))


def test_tsv_bad_line_reports_line_number_unless_skipped(tmp_path):
    path = _write(tmp_path, "p.tsv", "hello\thallo\n\nno tab here\ncat\tKatze\na\tb\tc\n")
    with pytest.raises(data.CorpusError, match=r"line 3 has no tab.*'no tab here'.*--skip-bad-lines"):
        data.read_tsv_corpus(path)
    assert data.read_tsv_corpus(path, skip_bad_lines=True) == [("hello", "hallo"), ("cat", "Katze")]
    with pytest.raises(data.CorpusError, match="line 5 has 2 tabs"):
        data.read_tsv_corpus(_write(tmp_path, "q.tsv", "hello\thallo\n\n\ncat\tKatze\na\tb\tc\n"))
    with pytest.raises(ValueError, match="`corpus_format` must be one of"):
        data.load_corpus(path, "csv")


def test_split_is_deterministic_disjoint_and_complete():
    examples = [f"s{i}" for i in range(50)]
    train_a, eval_a = data.split_corpus(examples, 0.1, seed=3)
    train_b, eval_b = data.split_corpus(examples, 0.1, seed=3)
    assert (train_a, eval_a) == (train_b, eval_b) and len(eval_a) == 5
    assert sorted(train_a + eval_a) == sorted(examples)
    assert data.split_corpus(examples, 0.1, seed=4)[1] != eval_a


# SentencePiece ------------------------------------------------------------------------------
def test_sentencepiece_reserved_ids_and_determinism(sp_model):
    processor = _processor(sp_model)
    assert [processor.IdToPiece(i) for i in range(5)] == ["<pad>", "<unk>", "<s>", "</s>", "<sep>"]
    assert processor.GetPieceSize() == 40 == data.sentencepiece_vocab_size(sp_model)
    assert data.train_sentencepiece(TEXTS, vocab_size=40) == sp_model


def test_vocab_size_larger_than_corpus_allows_is_a_clear_error():
    with pytest.raises(ValueError, match=r"vocab_size=5000 is larger than this corpus allows: .* at most "
                                         r"vocab_size=\d+"):
        data.train_sentencepiece(TEXTS, vocab_size=5000)
    with pytest.raises(ValueError, match=r"vocab_size=10 is too small for this corpus"):
        data.train_sentencepiece(TEXTS, vocab_size=10)
    with pytest.raises(ValueError, match=r"`vocab_size` must be an int > 5"):
        data.train_sentencepiece(TEXTS, vocab_size=3)


# Pipeline -----------------------------------------------------------------------------------
def _rows(ds):
    """Every (tokens, labels, positions, languages) row without padding, in order."""
    rows = []
    for features, labels in ds:
        for i in range(labels.shape[0]):
            n = int(np.sum(labels[i].numpy() != 0))
            lang = features.get("language_ids")
            rows.append((features["token_ids"][i, :n].numpy().tolist(), labels[i, :n].numpy().tolist(),
                         features["position_ids"][i].numpy().tolist(),
                         None if lang is None else lang[i, :n].numpy().tolist(),
                         features["token_ids"][i, n:].numpy().tolist()))
    return rows


def test_text_rows_are_bos_pieces_eos_shifted_by_one(sp_model):
    processor = _processor(sp_model)
    texts = TEXTS[:5]
    ds = data.lm_dataset(texts, sp_model, max_length=64, batch_size=5, shuffle=False, bucket_lengths=None)
    for text, (tokens, labels, positions, languages, padding) in zip(texts, _rows(ds)):
        full = [data.BOS_ID] + processor.EncodeAsIds(text) + [data.EOS_ID]
        assert tokens == full[:-1] and labels == full[1:]
        assert tokens[0] == data.BOS_ID  # <s> stays first (002's move-to-end workaround is not used)
        assert positions == list(range(len(tokens))) + [0] * len(padding)
        assert languages is None and set(padding) <= {data.PAD_ID}


def test_bos_eos_options_and_truncation(sp_model):
    processor = _processor(sp_model)
    text = TEXTS[4]
    pieces = processor.EncodeAsIds(text)
    ds = data.lm_dataset([text], sp_model, max_length=64, batch_size=1, shuffle=False, add_bos=False,
                         add_eos=False)
    tokens, labels = _rows(ds)[0][:2]
    assert tokens == pieces[:-1] and labels == pieces[1:]
    ds = data.lm_dataset([text], sp_model, max_length=4, batch_size=1, shuffle=False)
    tokens, labels = _rows(ds)[0][:2]
    assert tokens == [data.BOS_ID] + pieces[:3] and labels == pieces[:4]


def test_tsv_pairs_get_sep_and_language_ids(sp_model):
    processor = _processor(sp_model)
    pair = ("the cat sat", "the dog ran")
    ds = data.lm_dataset([pair], sp_model, max_length=64, batch_size=1, shuffle=False)
    tokens, labels, _, languages, _ = _rows(ds)[0]
    source, target = processor.EncodeAsIds(pair[0]), processor.EncodeAsIds(pair[1])
    full = [data.BOS_ID] + source + [data.SEP_ID] + target + [data.EOS_ID]
    assert tokens == full[:-1] and labels == full[1:]
    # Language of each input token: 0 for <s>, source and <sep>; 1 for the target side.
    assert languages == [0] * (len(source) + 2) + [1] * len(target)


def test_bucketing_pads_each_batch_to_its_bucket_length_with_zero(sp_model):
    ds = data.lm_dataset(TEXTS, sp_model, max_length=64, batch_size=4, shuffle=True, seed=1,
                         bucket_lengths=[12, 6, 64])
    seen, shapes = 0, set()
    for features, labels in ds:
        lengths = np.sum(labels.numpy() != 0, axis=1)
        width = labels.shape[1]
        shorter = {6: 0, 12: 6, 64: 12}[width]  # rows longer than the next shorter bucket only
        assert np.all((lengths > shorter) & (lengths <= width)), (width, lengths)
        assert features["token_ids"].shape == labels.shape == features["position_ids"].shape
        assert np.all((features["token_ids"].numpy() == 0) == (labels.numpy() == 0))
        seen += labels.shape[0]
        shapes.add(tuple(labels.shape))
    assert seen == len(TEXTS)
    assert {width for _, width in shapes} <= {6, 12, 64}


def test_filled_batches_have_one_shape_per_bucket_and_the_same_rows(sp_model):
    kwargs = dict(max_length=64, batch_size=3, shuffle=False, bucket_lengths=[6, 12, 64])
    plain = list(data.lm_dataset(TEXTS, sp_model, **kwargs))
    filled = list(data.lm_dataset(TEXTS, sp_model, fill_batches=True, **kwargs))
    assert len(plain) == len(filled)
    assert {tuple(labels.shape) for _, labels in filled} <= {(3, 6), (3, 12), (3, 64)}
    assert any(labels.shape[0] < 3 for _, labels in plain)  # the fill had something to do
    for (features, labels), (filled_features, filled_labels) in zip(plain, filled):
        rows = labels.shape[0]
        np.testing.assert_array_equal(filled_labels[:rows], labels)
        for name in features:
            np.testing.assert_array_equal(filled_features[name][:rows], features[name])
        assert not np.any(filled_labels[rows:]) and not np.any(filled_features["token_ids"][rows:])


def test_default_bucket_lengths_end_at_max_length():
    assert data.default_bucket_lengths(48) == [8, 16, 32, 48]
    assert data.default_bucket_lengths(128) == [8, 16, 32, 64, 128]
    assert data.default_bucket_lengths(8) == [8] and data.default_bucket_lengths(9) == [8, 9]


def test_shuffle_order_is_fixed_by_seed(sp_model):
    def order(seed):
        ds = data.lm_dataset(TEXTS[:5], sp_model, max_length=64, batch_size=1, shuffle=True, seed=seed,
                             bucket_lengths=None)
        return [row[0] for row in _rows(ds)]

    assert order(7) == order(7)
    assert sorted(order(7)) == sorted(order(8))
    assert any(order(s) != order(7) for s in (8, 9, 10))


def test_unigram_cross_entropy_matches_numpy(sp_model):
    train_ds = data.lm_dataset(TEXTS[:5], sp_model, max_length=64, batch_size=2, shuffle=False)
    eval_ds = data.lm_dataset(TEXTS[5:7], sp_model, max_length=64, batch_size=2, shuffle=False)
    counts = np.ones(40)
    counts[0] = 0
    for row in _rows(train_ds):
        for token in row[1]:
            counts[token] += 1
    expected = [-math.log(counts[t] / counts.sum()) for row in _rows(eval_ds) for t in row[1]]
    assert data.unigram_cross_entropy(train_ds, eval_ds, 40) == pytest.approx(np.mean(expected), rel=1e-12)


def test_pipeline_argument_errors(sp_model):
    with pytest.raises(ValueError, match="`max_length` must be a positive int, got max_length=0"):
        data.lm_dataset(TEXTS, sp_model, max_length=0, batch_size=2)
    with pytest.raises(data.CorpusError, match="empty list"):
        data.lm_dataset([], sp_model, max_length=8, batch_size=2)
    with pytest.raises(ValueError, match=r"longest of `bucket_lengths` must be at least max_length=8 .* "
                                         r"got bucket_lengths=\[4, 6\]"):
        data.lm_dataset(TEXTS, sp_model, max_length=8, batch_size=2, bucket_lengths=[4, 6])
    with pytest.raises(ValueError, match=r"list of positive ints, got bucket_lengths=\[0, 8\]"):
        data.lm_dataset(TEXTS, sp_model, max_length=8, batch_size=2, bucket_lengths=[0, 8])


def test_shipped_parallel_corpus_is_clean_unique_and_licensed():
    import re

    pairs = data.load_corpus(data.parallel_corpus_path(), "tsv")
    assert len(pairs) == 1200
    assert len({source for source, _ in pairs}) == len(pairs)
    placeholder = re.compile(r"%\(|%[sd]\b|\{\d*\}|<[a-z/]")
    for source, target in pairs:
        assert source.strip() == source and target.strip() == target and source and target
        assert not placeholder.search(source) and not placeholder.search(target), (source, target)
    licence_path = os.path.join(os.path.dirname(data.parallel_corpus_path()), "LICENSE-PO-CORPUS.txt")
    licences = open(licence_path, encoding="utf-8").read()
    for wheel in ("Django-4.2.16", "wagtail-6.2", "sphinx-7.4.7", "django_cms-4.1.2", "django_oscar-3.2.4"):
        assert f"{wheel}-py" in licences, wheel
    assert licences.count("Redistribution and use in source and binary forms") >= 5


def test_parallel_corpus_builder_reads_po_entries_and_strips_placeholders():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                        "make_parallel_corpus.py")
    spec = importlib.util.spec_from_file_location("make_parallel_corpus", path)
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)

    text = ('msgid ""\nmsgstr "Content-Type: text/plain"\n\n'
            '#, python-format\nmsgid "Delete %(name)s"\nmsgstr "%(name)s löschen"\n\n'
            '#, fuzzy\nmsgid "Close"\nmsgstr "Schließen"\n\n'
            'msgid "%(count)s"\nmsgstr "%(count)s"\n\n'
            'msgid "One item"\nmsgid_plural "%(n)s items"\n'
            'msgstr[0] "Ein Eintrag"\nmsgstr[1] "%(n)s Einträge"\n')
    entries = builder.po_entries(text)
    assert entries == [("Delete %(name)s", "%(name)s löschen", False), ("Close", "Schließen", True),
                       ("%(count)s", "%(count)s", False), ("One item", "Ein Eintrag", False)]
    assert [builder.clean(s) for s, _, _ in entries] == ["Delete", "Close", "", "One item"]


# Messages in full, bounds, settings ------------------------------------------------------------
def _tsv_error(path, number, reason, line):
    return (f"TSV corpus {path!r} line {number} {reason}; expected 'source<TAB>target': {line!r}. Fix the "
            "line or pass skip_bad_lines=True (--skip-bad-lines).")


@pytest.mark.parametrize("line,reason", [
    ("hello\t", "has an empty side"), ("\thallo", "has an empty side"), ("  \t hallo", "has an empty side"),
    ("hello \t  ", "has an empty side"), ("no tab here", "has no tab"), ("a\tb\tc\td", "has 3 tabs"),
])
def test_tsv_lines_with_an_empty_side_or_other_tabs_are_named_or_skipped(tmp_path, line, reason):
    path = _write(tmp_path, "p.tsv", f"cat\tKatze\n\n{line}\n dog \t Hund \n")
    with pytest.raises(data.CorpusError) as error:
        data.read_tsv_corpus(path)
    assert str(error.value) == _tsv_error(path, 3, reason, line)
    assert data.read_tsv_corpus(path, skip_bad_lines=True) == [("cat", "Katze"), ("dog", "Hund")]
    assert data.load_corpus(path, "tsv", skip_bad_lines=True) == [("cat", "Katze"), ("dog", "Hund")]


def test_corpus_messages_in_full(tmp_path):
    long_line = "x" * 80
    path = _write(tmp_path, "long.tsv", long_line + "\n")
    with pytest.raises(data.CorpusError) as error:
        data.read_tsv_corpus(path)
    assert str(error.value) == _tsv_error(path, 1, "has no tab", "x" * 60)  # the line cut at 60
    with pytest.raises(data.CorpusError) as error:
        data.read_tsv_corpus(path, skip_bad_lines=True)
    assert str(error.value) == f"TSV corpus {path!r} is empty: it has no 'source<TAB>target' line."
    blank = _write(tmp_path, "blank.txt", " \n\t\n")
    with pytest.raises(data.CorpusError) as error:
        data.read_text_corpus(blank)
    assert str(error.value) == f"Corpus {blank!r} is empty: it has no non-blank line."
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(data.CorpusError) as error:
        data.load_corpus(missing)
    assert str(error.value) == f"Corpus file not found: corpus={missing!r}."
    with pytest.raises(TypeError) as error:
        data.read_text_corpus(3)
    assert str(error.value) == "`corpus` must be a file path, got corpus=3."
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(data.CorpusError) as error:
        data.read_text_corpus(latin)  # an os.PathLike path
    assert str(error.value).startswith(f"Corpus {str(latin)!r} is not UTF-8 text: 'utf-8' codec can't")
    with pytest.raises(ValueError) as error:
        data.load_corpus(path, "csv")
    assert str(error.value) == "`corpus_format` must be one of ('text', 'tsv'), got corpus_format='csv'."


def test_text_format_is_the_default_and_reads_tabs_as_text(tmp_path):
    path = _write(tmp_path, "p.tsv", "hello\thallo\n")
    assert data.load_corpus(path) == ["hello\thallo"]
    assert data.load_corpus(tmp_path / "p.tsv", "tsv") == [("hello", "hallo")]


@pytest.mark.parametrize("count,fraction,held_out", [(10, 0.04, 1), (10, 0.25, 2), (10, 0.35, 4), (3, 0.5, 2),
                                                     (2, 0.999, 2), (50, 0.1, 5)])
def test_split_holds_out_the_rounded_share_of_a_seeded_shuffle(count, fraction, held_out):
    import random

    examples = [f"s{i}" for i in range(count)]
    order = list(range(count))
    random.Random(5).shuffle(order)
    assert data.split_corpus(examples, fraction, seed=5) == ([examples[i] for i in order[held_out:]],
                                                             [examples[i] for i in order[:held_out]])


def test_split_messages_in_full():
    for fraction in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError) as error:
            data.split_corpus(["a", "b"], fraction)
        assert str(error.value) == f"`eval_fraction` must be in (0, 1), got eval_fraction={fraction!r}."
    with pytest.raises(data.CorpusError) as error:
        data.split_corpus(["a"], 0.5)
    assert str(error.value) == ("A corpus needs at least 2 examples to hold one out for evaluation, got 1.")
    train, held_out = data.split_corpus(["a", "b"])  # the default share rounds to 0: one held out
    assert len(held_out) == 1 and sorted(train + held_out) == ["a", "b"]


def test_the_tokenizer_keeps_its_settings(sp_model):
    from sentencepiece import sentencepiece_model_pb2

    def spec(model):
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(model)
        return proto.trainer_spec

    default = spec(sp_model)
    assert (default.model_type, default.vocab_size, default.num_threads, default.shuffle_input_sentence) == (
        sentencepiece_model_pb2.TrainerSpec.UNIGRAM, 40, 1, False)
    assert default.character_coverage == pytest.approx(0.9995)
    assert (default.pad_id, default.unk_id, default.bos_id, default.eos_id) == (0, 1, 2, 3)
    assert list(default.user_defined_symbols) == ["<sep>"]
    bpe = spec(data.train_sentencepiece(TEXTS, vocab_size=40, model_type="bpe", character_coverage=0.98))
    assert bpe.model_type == sentencepiece_model_pb2.TrainerSpec.BPE
    assert bpe.character_coverage == pytest.approx(0.98)
    # Blank sentences are left out: the same model as without them.
    assert data.train_sentencepiece(["", "  "] + TEXTS + ["\t"], vocab_size=40) == sp_model


def test_tokenizer_messages_in_full():
    for vocab_size in (5, True, 40.0, "40"):
        with pytest.raises(ValueError) as error:
            data.train_sentencepiece(TEXTS, vocab_size=vocab_size)
        assert str(error.value) == ("`vocab_size` must be an int > 5 (the reserved ids <pad> <unk> <s> </s> "
                                    f"<sep>), got vocab_size={vocab_size!r}.")
    with pytest.raises(ValueError, match="vocab_size=6 is too small for this corpus"):  # past the int check
        data.train_sentencepiece(TEXTS, vocab_size=6)
    with pytest.raises(data.CorpusError) as error:
        data.train_sentencepiece(["", " "], vocab_size=40)
    assert str(error.value) == "Cannot train SentencePiece on an empty corpus."
    with pytest.raises(ValueError) as error:
        data.train_sentencepiece(TEXTS, vocab_size=5000)
    found = re.fullmatch(r"vocab_size=5000 is larger than this corpus allows: its 40 sentences support at "
                         r"most vocab_size=(\d+) SentencePiece pieces\. Use a smaller --vocab-size or a "
                         r"bigger corpus\.", str(error.value))
    largest = int(found[1])  # the maximum named is a size that trains
    assert data.sentencepiece_vocab_size(data.train_sentencepiece(TEXTS, largest)) == largest
    with pytest.raises(ValueError) as error:
        data.train_sentencepiece(TEXTS, vocab_size=10)
    found = re.fullmatch(r"vocab_size=10 is too small for this corpus: its characters \(at "
                         r"character_coverage=0\.9995\) and the reserved pieces need at least "
                         r"vocab_size=(\d+)\. Use a larger --vocab-size\.", str(error.value))
    smallest = int(found[1])
    assert data.sentencepiece_vocab_size(data.train_sentencepiece(TEXTS, smallest)) == smallest
    with pytest.raises(ValueError) as error:
        data.train_sentencepiece(TEXTS, vocab_size=40, character_coverage=2.0)
    assert str(error.value).startswith(
        "SentencePiece training failed for vocab_size=40, model_type='unigram': ")


def test_decode_drops_padding_and_specials_and_keeps_unknown(sp_model):
    processor = _processor(sp_model)
    ids = processor.EncodeAsIds("the cat sat")
    assert data.decode(sp_model, [data.PAD_ID, data.BOS_ID] + ids[:2] + [data.SEP_ID] + ids[2:]
                       + [data.EOS_ID, data.PAD_ID]) == "the cat sat"
    assert data.decode(sp_model, np.array([data.UNK_ID] + ids)) == processor.DecodeIds([data.UNK_ID] + ids)


@pytest.mark.parametrize("max_length,expected", [(1, [1]), (7, [7]), (8, [8]), (9, [8, 9]), (16, [8, 16]),
                                                 (17, [8, 16, 17]), (100, [8, 16, 32, 64, 100])])
def test_default_bucket_lengths_double_from_8_below_max_length(max_length, expected):
    assert data.default_bucket_lengths(max_length) == expected


def test_bucket_lengths_are_checked_sorted_and_deduplicated(sp_model):
    # Rows of 7 and 16 labels (the texts' lengths are 17, 34, 39, 7 and 45 tokens, cut at 16).
    def widths(bucket_lengths):
        return {labels.shape[1] for _, labels in data.lm_dataset(
            TEXTS, sp_model, max_length=16, batch_size=40, shuffle=False, bucket_lengths=bucket_lengths)}

    assert widths([16, 7, 16, 7]) == widths([7, 16]) == {7, 16}
    assert widths("auto") == widths([8, 16]) == {8, 16}
    for bucket_lengths in ([], [True, 16], [2.0, 16], [-1, 16]):
        with pytest.raises(ValueError) as error:
            data.lm_dataset(TEXTS, sp_model, max_length=16, batch_size=2, bucket_lengths=bucket_lengths)
        assert str(error.value) == ("`bucket_lengths` must be 'auto', None or a list of positive ints, got "
                                    f"bucket_lengths={bucket_lengths!r}.")
    with pytest.raises(ValueError) as error:
        data.lm_dataset(TEXTS, sp_model, max_length=16, batch_size=2, bucket_lengths=[15, 4])
    assert str(error.value) == ("The longest of `bucket_lengths` must be at least max_length=16 so that "
                                "every row fits a bucket, got bucket_lengths=[15, 4].")
    with pytest.raises(data.CorpusError) as error:
        data.lm_dataset([], sp_model, max_length=16, batch_size=2)
    assert str(error.value) == "Cannot build a dataset from an empty list of examples."
    with pytest.raises(ValueError) as error:
        data.lm_dataset(TEXTS, sp_model, max_length=16, batch_size=0)
    assert str(error.value) == "`batch_size` must be a positive int, got batch_size=0."


# Defaults and edges a caller relies on ---------------------------------------------------------
def _label_rows(dataset):
    return [row.tolist() for _, labels in dataset for row in labels.numpy()]


def test_lm_dataset_shuffles_by_default_with_seed_0(sp_model):
    examples = [f"{word} {i}" for i, word in enumerate(["cat", "dog", "fox", "owl"] * 6)]
    kwargs = dict(max_length=16, batch_size=4, bucket_lengths=None)
    default = _label_rows(data.lm_dataset(examples, sp_model, **kwargs))
    assert default == _label_rows(data.lm_dataset(examples, sp_model, shuffle=True, seed=0, **kwargs))
    assert default != _label_rows(data.lm_dataset(examples, sp_model, shuffle=False, **kwargs))
    assert default != _label_rows(data.lm_dataset(examples, sp_model, shuffle=True, seed=1, **kwargs))


def test_bucket_lengths_of_one_token_are_positive():
    assert data.lm_dataset(TEXTS[:4], data.train_sentencepiece(TEXTS, vocab_size=40), max_length=16,
                           batch_size=2, bucket_lengths=[1, 16]) is not None
    with pytest.raises(ValueError, match=r"got bucket_lengths=\[0, 16\]"):
        data.lm_dataset(TEXTS[:4], b"", max_length=16, batch_size=2, bucket_lengths=[0, 16])


def test_split_corpus_default_seed_is_0():
    examples = [f"line {i}" for i in range(40)]
    assert data.split_corpus(examples) == data.split_corpus(examples, 0.1, seed=0)
    assert data.split_corpus(examples) != data.split_corpus(examples, 0.1, seed=1)


def test_load_corpus_keeps_bad_tsv_lines_an_error_by_default(tmp_path):
    path = _write(tmp_path, "pairs.tsv", "hello\thallo\nno tab here\n")
    with pytest.raises(data.CorpusError):
        data.load_corpus(path, "tsv")
    assert data.load_corpus(path, "tsv", skip_bad_lines=True) == [("hello", "hallo")]


def test_corpus_texts_takes_both_sides_of_pairs_in_order():
    assert data.corpus_texts(["a cat", ("hello", "hallo"), "b"]) == ["a cat", "hello", "hallo", "b"]
    assert data.corpus_texts([]) == []


def test_sentencepiece_training_prints_nothing(capfd):
    data.train_sentencepiece(TEXTS, vocab_size=40)
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("", "")


def _labels_dataset(rows):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((tf.zeros([len(rows)]), tf.constant(rows, tf.int32))).batch(2)


def test_unigram_cross_entropy_of_unseen_and_single_eval_tokens():
    pad = data.PAD_ID
    train = _labels_dataset([[5, 5, 6, pad]])
    # add-one counts over ids 1..6 (pad excluded): id 4 never seen in training has count 1 of 9
    assert data.unigram_cross_entropy(train, _labels_dataset([[4, pad]]), vocab_size=7) == pytest.approx(
        math.log(9), rel=1e-12)
    # one eval token is enough
    assert data.unigram_cross_entropy(train, _labels_dataset([[5]]), vocab_size=7) == pytest.approx(
        math.log(3), rel=1e-12)
    with pytest.raises(data.CorpusError) as error:
        data.unigram_cross_entropy(train, _labels_dataset([[pad, pad]]), vocab_size=7)
    assert str(error.value) == "The evaluation split has no tokens."


def test_truncated_pairs_keep_one_language_id_per_token(sp_model):
    pairs = [(TEXTS[4], TEXTS[1])] * 3
    ds = data.lm_dataset(pairs, sp_model, max_length=10, batch_size=3, shuffle=False, bucket_lengths=None)
    features, labels = next(iter(ds))
    assert features["token_ids"].shape == features["language_ids"].shape == labels.shape == (3, 10)
    # the source alone is longer than 10 pieces: every kept token is on the source side
    assert features["language_ids"].numpy().tolist() == [[0] * 10] * 3
    long_pairs = [("short", TEXTS[4])] * 3
    features, labels = next(iter(data.lm_dataset(long_pairs, sp_model, max_length=10, batch_size=3,
                                                 shuffle=False, bucket_lengths=None)))
    languages = features["language_ids"].numpy()
    assert languages.shape == (3, 10) and languages[0, -1] == 1 and languages[0, 0] == 0


def test_repeat_reshuffles_each_pass(sp_model):
    examples = [f"{word} {i}" for i, word in enumerate(["cat", "dog", "fox", "owl"] * 4)]
    ds = data.lm_dataset(examples, sp_model, max_length=16, batch_size=16, bucket_lengths=None, repeat=True)
    passes = [[row.tolist() for row in labels.numpy()] for _, labels in ds.take(2)]
    assert sorted(passes[0]) == sorted(passes[1])
    assert passes[0] != passes[1]


def test_rows_of_one_label_are_kept_and_rows_of_none_dropped(sp_model):
    eos = data.EOS_ID
    one = data.lm_dataset([""], sp_model, max_length=8, batch_size=4, shuffle=False, bucket_lengths=None)
    assert _label_rows(one) == [[eos]]
    none = data.lm_dataset(["", TEXTS[0]], sp_model, max_length=8, batch_size=4, shuffle=False,
                           bucket_lengths=None, add_eos=False)
    assert len(_label_rows(none)) == 1


@pytest.mark.parametrize("bucket_lengths", [None, [16]])
def test_drop_remainder_drops_the_last_partial_batch(sp_model, bucket_lengths):
    examples = [f"the cat {i}" for i in range(5)]

    def batches(drop):
        ds = data.lm_dataset(examples, sp_model, max_length=16, batch_size=2, shuffle=False,
                             bucket_lengths=bucket_lengths, drop_remainder=drop)
        return [int(labels.shape[0]) for _, labels in ds]

    assert batches(False) == [2, 2, 1]
    assert batches(True) == [2, 2]
