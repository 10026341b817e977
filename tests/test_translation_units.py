"""The translation modules one function at a time, on a tiny tokenizer and untrained tiny models.

The teacher-forced pipeline and the source rows (`translation_data`), the dev scoring of
`train --task translate` (`dev_scoring`) and text in and out of a translator (`translation`;
`export --translate`'s flags and dev set are tests/test_cli_export_translate.py's). Expected values
are made here from the tokenizer, numpy and sacrebleu, never by the functions under test; nothing trains, so
the file runs in seconds (it is what `make mutation` runs for these modules).
"""

import io
import json
import sys
import types

import numpy as np
import pytest
import sacrebleu
import sentencepiece as spm
import tensorflow as tf
from stacks import once_on_keras2
from user_checks import ascii_locale

from keras_posenc.app import dev_scoring, translation, translation_data
from keras_posenc.app.dataset import CorpusError, train_sentencepiece
from keras_posenc.backend import keras, ops, save_model
from keras_posenc.models import CausalLM
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.special_ids import BOS_ID, EOS_ID, NUM_RESERVED_IDS, PAD_ID, SEP_ID

SENTENCES = ["the cat sat on the mat", "the dog sat on the log", "a bird flew over the house",
             "die katze sitzt auf der matte", "der hund sitzt auf dem baumstamm",
             "ein vogel flog ueber das haus", "a cat", "ein hund"]


@pytest.fixture(scope="module")
def sp_model():
    return train_sentencepiece(SENTENCES * 4, 40)


@pytest.fixture(scope="module")
def processor(sp_model):
    return spm.SentencePieceProcessor(model_proto=sp_model)


def _padded(rows, width=None):
    width = width or max(len(row) for row in rows)
    return np.array([list(row) + [PAD_ID] * (width - len(row)) for row in rows], np.int32)


def _batches(ds):
    return [(features["source_ids"].numpy(), features["target_ids"].numpy(), labels.numpy())
            for features, labels in ds]


# translation_data --------------------------------------------------------------------------------
def test_pairs_are_framed_source_eos_bos_target_and_target_eos_each_cut_to_max_length(sp_model, processor):
    pairs = [(SENTENCES[0], SENTENCES[3]), (SENTENCES[6], SENTENCES[7]), (SENTENCES[2], SENTENCES[6])]
    [(sources, targets, labels)] = _batches(translation_data.translation_dataset(
        pairs, sp_model, max_length=9, batch_size=3, shuffle=False, bucket_lengths=None))
    source_pieces = [processor.encode(source)[:8] for source, _ in pairs]
    target_pieces = [processor.encode(target)[:8] for _, target in pairs]
    assert max(len(processor.encode(s)) for pair in pairs for s in pair) > 9  # some are cut
    np.testing.assert_array_equal(sources, _padded([ids + [EOS_ID] for ids in source_pieces]))
    np.testing.assert_array_equal(targets, _padded([[BOS_ID] + ids for ids in target_pieces]))
    np.testing.assert_array_equal(labels, _padded([ids + [EOS_ID] for ids in target_pieces]))
    assert sources.dtype == targets.dtype == labels.dtype == np.int32


def test_pairs_are_bucketed_by_their_longer_side(sp_model, processor):
    short, long = SENTENCES[7], SENTENCES[4]  # 4 and over 16 pieces
    assert len(processor.encode(short)) + 1 <= 6 and len(processor.encode(long)) + 1 > 12
    pairs = [(short, short), (long, short), (short, long)]
    batches = _batches(translation_data.translation_dataset(
        pairs, sp_model, max_length=12, batch_size=2, shuffle=False, bucket_lengths=[6, 12]))
    shapes = sorted((len(sources), sources.shape[1], targets.shape[1], labels.shape[1])
                    for sources, targets, labels in batches)
    assert shapes == [(1, 6, 6, 6), (2, 12, 12, 12)]
    # The default buckets of max_length 24 are 8, 16 and 24: the short pair alone is padded to 8.
    [(sources, targets, labels)] = _batches(translation_data.translation_dataset(
        pairs[:1], sp_model, max_length=24, batch_size=2, shuffle=False))
    ids = processor.encode(short)
    np.testing.assert_array_equal(sources, _padded([ids + [EOS_ID]], 8))
    np.testing.assert_array_equal(targets, _padded([[BOS_ID] + ids], 8))
    np.testing.assert_array_equal(labels, _padded([ids + [EOS_ID]], 8))


def test_a_short_last_batch_is_kept_filled_or_dropped(sp_model):
    pairs = [(s, s) for s in SENTENCES[:3]]

    def build(**flags):
        return _batches(translation_data.translation_dataset(pairs, sp_model, max_length=8, batch_size=2,
                                                             shuffle=False, bucket_lengths=None, **flags))

    kept = build()
    assert [len(s) for s, _, _ in kept] == [2, 1]
    filled = build(fill_batches=True)
    assert [len(s) for s, _, _ in filled] == [2, 2]
    for got, want in zip(filled[1], kept[1]):
        np.testing.assert_array_equal(got, np.concatenate([want, np.zeros_like(want)]))
    assert [len(s) for s, _, _ in build(drop_remainder=True)] == [2]
    # Without repeat the dataset ends; with it, it goes on.
    assert len(build()) == 2
    ds = translation_data.translation_dataset(pairs, sp_model, max_length=8, batch_size=2, shuffle=False,
                                              bucket_lengths=None, repeat=True)
    assert len(_batches(ds.take(5))) == 5


def test_shuffling_is_the_default_seeded_and_new_each_epoch(sp_model):
    pairs = [(f"{a} {b}", b) for a in SENTENCES[:4] for b in SENTENCES[4:]]

    def orders(epochs=1, **flags):
        ds = translation_data.translation_dataset(pairs, sp_model, max_length=40, batch_size=len(pairs),
                                                  bucket_lengths=None, **flags)
        if epochs > 1:
            ds = ds.take(epochs)
        return [[tuple(row) for row in labels] for _, _, labels in _batches(ds)]

    [unshuffled] = orders(shuffle=False)
    [default] = orders()
    assert default != unshuffled and sorted(default) == sorted(unshuffled)
    assert orders(shuffle=True, seed=0) == [default]
    assert orders(seed=1) != [default]
    first, second = orders(epochs=2, repeat=True)
    assert first == default and second != first and sorted(second) == sorted(first)


NO_PAIRS = "A translation corpus holds (source, target) pairs: train --task translate needs --format tsv."


@pytest.mark.parametrize("pairs, message", [
    ([], "Cannot build a translation dataset from an empty list of pairs."),
    ([["a cat", "ein hund"]], NO_PAIRS),
    ([("a cat", "ein hund", "x")], NO_PAIRS),
])
def test_what_is_no_list_of_pairs_is_refused(sp_model, pairs, message):
    with pytest.raises(CorpusError) as error:
        translation_data.translation_dataset(pairs, sp_model, max_length=8, batch_size=2)
    assert str(error.value) == message


@pytest.mark.parametrize("settings, message", [
    ({"max_length": 0, "batch_size": 2}, "`max_length` must be a positive int, got max_length=0."),
    ({"max_length": 8, "batch_size": 0}, "`batch_size` must be a positive int, got batch_size=0."),
    ({"max_length": 8, "batch_size": 2, "bucket_lengths": [4]},
     "The longest of `bucket_lengths` must be at least max_length=8 so that every row fits a bucket, got "
     "bucket_lengths=[4]."),
])
def test_bad_sizes_are_refused_by_name(sp_model, settings, message):
    with pytest.raises(ValueError) as error:
        translation_data.translation_dataset([("a cat", "ein hund")], sp_model, **settings)
    assert str(error.value) == message


def test_source_ids_are_the_pieces_cut_before_an_end_token(processor):
    rows = translation_data.source_ids(processor, iter([SENTENCES[0], SENTENCES[6]]), 6)
    ids = [processor.encode(SENTENCES[0]), processor.encode(SENTENCES[6])]
    assert len(ids[0]) > 5 and len(ids[1]) < 5
    assert [row.tolist() for row in rows] == [ids[0][:5] + [EOS_ID], ids[1] + [EOS_ID]]
    assert all(row.dtype == np.int32 for row in rows)


def test_pad_rows_pads_right_by_default_or_left():
    rows = [[5, 6, 7, 3], [8, 3], [9, 10, 3]]
    right, left = translation_data.pad_rows(rows), translation_data.pad_rows(rows, left=True)
    np.testing.assert_array_equal(right, [[5, 6, 7, 3], [8, 3, 0, 0], [9, 10, 3, 0]])
    np.testing.assert_array_equal(left, [[5, 6, 7, 3], [0, 0, 8, 3], [0, 9, 10, 3]])
    assert right.dtype == left.dtype == np.int32


# dev_scoring -------------------------------------------------------------------------------------
TINY = {"num_layers": 1, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 12,
        "dropout": 0.0}
DEV_SOURCES = SENTENCES[:4]


@pytest.fixture(scope="module")
def seq2seq():
    model = Seq2SeqTransformer(**TINY)
    model.build_on_dummy()
    return model


def _random_weights(model, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=w.shape).astype("float32") for w in model.get_weights()]


def _emitting(model, token):
    """Weights with which the model emits `token` at every step whatever the source: all zero but the
    output bias."""
    weights = [np.zeros_like(w) for w in model.get_weights()]
    [head_bias] = [w for w in weights if w.shape == (TINY["vocab_size"],)]
    head_bias[token] = 10.0
    return weights


def _repeated(processor, piece):
    """The text of a translation that is `piece` at each of the tiny model's 11 steps."""
    return processor.decode([processor.piece_to_id(piece)] * (TINY["max_length"] - 1))


class _Optimizer:
    def __init__(self):
        self.iterations = tf.Variable(0, dtype=tf.int64)


def _entry(step, hypotheses, references):
    return {"step": step, "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}


def test_dev_scoring_scores_every_checkpoint_and_keeps_the_best_bleus_weights(seq2seq, sp_model, processor,
                                                                              tmp_path):
    run = translation.TranslationRun(seq2seq, sp_model)
    for seed in range(1, 20):  # random weights whose beam search finds other translations than greedy's
        greedy = _random_weights(seq2seq, seed)
        seq2seq.set_weights(greedy)
        references, _ = translation.translate_sentences(run, DEV_SOURCES, beam_size=1)
        if translation.translate_sentences(run, DEV_SOURCES, beam_size=2)[0] != references:
            break  # so the scoring must be greedy to score 100
    else:
        pytest.fail("no seed in 1-19 gives weights whose beam and greedy translations differ")
    optimizer, scores_path = _Optimizer(), tmp_path / "checkpoints" / dev_scoring.DEV_SCORES_FILE
    scores_path.parent.mkdir()
    scoring = dev_scoring.DevScoring(seq2seq, sp_model, list(zip(DEV_SOURCES, references)), 2, optimizer,
                                     str(scores_path), batch_size=3)
    cat = _repeated(processor, "▁cat")
    for step, weights in [(1, _emitting(seq2seq, EOS_ID)), (2, _emitting(seq2seq, EOS_ID)), (3, greedy),
                          (4, greedy), (5, _emitting(seq2seq, processor.piece_to_id("▁cat"))), (6, None)]:
        if weights is not None:
            seq2seq.set_weights(weights)
        optimizer.iterations.assign(step)
        scoring.on_train_batch_end(step - 1)
    history = [_entry(2, [""] * 4, references), _entry(4, references, references),
               _entry(6, [cat] * 4, references)]
    assert history[1]["bleu"] == pytest.approx(100.0) and history[1]["chrf"] == 100.0
    assert scoring.history == history and scoring.best == history[1]
    bleu = sacrebleu.BLEU()
    bleu.corpus_score(references, [references])
    assert scoring.signature == str(bleu.get_signature())
    assert scores_path.read_text() == json.dumps({"history": history, "best": history[1]}, indent=1)
    with np.load(tmp_path / "checkpoints" / "dev_best_weights.npz") as stored:
        assert sorted(stored.files) == sorted(f"w{i}" for i in range(len(greedy)))
        assert all(np.array_equal(stored[f"w{i}"], w) for i, w in enumerate(greedy))
    # The end scores step 6 once (it was scored) and puts the best weights back.
    assert scoring.keep_best() == history[1]
    assert scoring.history == history
    assert all(np.array_equal(a, b) for a, b in zip(seq2seq.get_weights(), greedy))


class _Clock:
    """A `time` whose perf_counter returns the given readings in turn."""

    def __init__(self, *readings):
        self.readings = list(readings)

    def perf_counter(self):
        return self.readings.pop(0)


def test_chrf_breaks_a_bleu_tie_an_exact_tie_keeps_the_earlier_and_a_worker_writes_nothing(
        seq2seq, sp_model, processor, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dev_scoring, "time", _Clock(1.0, 1.5, 2.0, 4.0, 10.0, 10.25))
    references = ["a cat", "a mat sat"]
    optimizer = _Optimizer()
    scoring = dev_scoring.DevScoring(seq2seq, sp_model, list(zip(SENTENCES[:2], references)), 1, optimizer)
    letters = _emitting(seq2seq, processor.piece_to_id("a"))
    for step, weights in [(1, _emitting(seq2seq, EOS_ID)), (2, letters), (3, letters)]:
        seq2seq.set_weights(weights)
        optimizer.iterations.assign(step)
        scoring.on_train_batch_end(step - 1)
    text = _repeated(processor, "a")
    history = [_entry(1, ["", ""], references), _entry(2, [text] * 2, references),
               _entry(3, [text] * 2, references)]
    assert history[0]["bleu"] == history[1]["bleu"] == 0.0 and history[0]["chrf"] < history[1]["chrf"]
    assert scoring.history == history and scoring.best == history[1]
    assert scoring.seconds == 2.75  # 0.5 + 2.0 + 0.25
    assert scoring.score() == history[2]  # step 3 again: its entry, not scored twice
    seq2seq.set_weights(_emitting(seq2seq, EOS_ID))
    assert scoring.keep_best() == history[1]  # step 3 was scored: no new scoring, the clock is not read
    assert all(np.array_equal(a, b) for a, b in zip(seq2seq.get_weights(), letters))
    assert scoring.history == history and scoring.seconds == 2.75
    assert list(tmp_path.iterdir()) == []


def _resumed(tmp_path, stored_weights):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    best = {"step": 30, "bleu": 1e9, "chrf": 1e9}
    earlier = {"history": [{"step": 20, "bleu": 1.0, "chrf": 2.0}, best], "best": best}
    (checkpoints / dev_scoring.DEV_SCORES_FILE).write_text(json.dumps(earlier))
    if stored_weights is not None:
        np.savez(checkpoints / "dev_best_weights.npz", **{f"w{i}": w for i, w in enumerate(stored_weights)})
    return str(checkpoints / dev_scoring.DEV_SCORES_FILE), earlier


def test_a_resumed_run_that_never_beats_the_earlier_best_ends_with_its_stored_weights(seq2seq, sp_model,
                                                                                       tmp_path):
    stored = _random_weights(seq2seq, 5)
    scores_path, earlier = _resumed(tmp_path, stored)
    optimizer = _Optimizer()
    optimizer.iterations.assign(40)
    seq2seq.set_weights(_emitting(seq2seq, EOS_ID))
    pairs = list(zip(SENTENCES[:2], ["a cat", "ein hund"]))
    scoring = dev_scoring.DevScoring(seq2seq, sp_model, pairs, 10, optimizer, scores_path)
    assert (scoring.history, scoring.best) == (earlier["history"], earlier["best"])
    assert scoring.best_weights is None
    assert scoring.keep_best() == earlier["best"]
    assert all(np.array_equal(a, b) for a, b in zip(seq2seq.get_weights(), stored))
    history = earlier["history"] + [_entry(40, ["", ""], ["a cat", "ein hund"])]
    with open(scores_path) as f:
        assert json.load(f) == {"history": history, "best": earlier["best"]}


def test_a_resumed_best_without_its_weights_file_is_one_sentence_naming_the_file(seq2seq, sp_model, tmp_path):
    scores_path, _ = _resumed(tmp_path, None)
    optimizer = _Optimizer()
    optimizer.iterations.assign(40)
    seq2seq.set_weights(_emitting(seq2seq, EOS_ID))
    scoring = dev_scoring.DevScoring(seq2seq, sp_model, [("a cat", "ein hund")], 10, optimizer, scores_path)
    with pytest.raises(ValueError) as error:
        scoring.keep_best()
    path = str(tmp_path / "checkpoints" / "dev_best_weights.npz")
    assert str(error.value) == (f"the best dev score (step 30) has no saved weights ({path}): resume from a "
                                "run that wrote them.")


# translation -------------------------------------------------------------------------------------
# Heavy dropout, which translating must leave off.
LM_CONFIG = {"num_layers": 1, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 16,
             "dropout": 0.5, "num_languages": 2}


@pytest.fixture(scope="module")
def lm():
    model = CausalLM(LM_CONFIG)
    model.build_on_dummy()
    return model


def _source_row(processor, sentence, max_length=TINY["max_length"]):
    return processor.encode(sentence)[:max_length - 1] + [EOS_ID]


def _alone(model, processor, sentence, **search):
    """What the model translates the sentence into alone, as text (the ids from `model.translate`)."""
    [ids] = model.translate(np.array([_source_row(processor, sentence)]), **search).ids
    return processor.decode([int(t) for t in ids if t >= NUM_RESERVED_IDS]), len(ids)


def _lm_greedy(model, prefix, steps):
    """Greedy decoding by full forward passes (no cache): language 0 for the prefix, 1 after it."""
    ids, new = list(prefix), []
    for _ in range(steps):
        languages = [[0] * len(prefix) + [1] * len(new)]
        logits = ops.convert_to_numpy(model(np.array([ids]), language_ids=np.array(languages),
                                            training=False))[0, -1]
        logits[[PAD_ID, BOS_ID, SEP_ID]] = -np.inf
        token = int(np.argmax(logits))
        if token == EOS_ID:
            break
        ids.append(token)
        new.append(token)
    return new


def test_a_run_knows_its_kind_and_its_longest_source(seq2seq, lm, sp_model, processor):
    run = translation.TranslationRun(seq2seq, sp_model)
    assert (run.kind, run.max_length, run.model, run.sp_model) == ("seq2seq", 12, seq2seq, sp_model)
    assert run.processor.encode(SENTENCES[0]) == processor.encode(SENTENCES[0])
    run = translation.TranslationRun(lm, sp_model)
    assert (run.kind, run.max_length, run.model) == ("lm", 16, lm)


def test_seq2seq_translations_come_in_input_order_each_as_alone(seq2seq, sp_model, processor, monkeypatch):
    seq2seq.set_weights(_random_weights(seq2seq, 1))
    run = translation.TranslationRun(seq2seq, sp_model)
    sentences = [SENTENCES[0], SENTENCES[6], SENTENCES[2]]  # batched shortest first: [1, 0], [2]
    calls = []
    monkeypatch.setattr(translation, "time", _Clock(3.0, 5.5))
    texts, stats = translation.translate_sentences(run, sentences, beam_size=2, batch_size=2,
                                                   progress=lambda *done: calls.append(done))
    monkeypatch.undo()
    expected = [_alone(seq2seq, processor, s, beam_size=2) for s in sentences]
    assert texts == [text for text, _ in expected]
    assert stats == {"sentences": 3, "tokens": sum(n + 1 for _, n in expected), "seconds": 2.5}
    assert calls == [(2, 3), (3, 3)]
    # At most max_new_tokens target tokens.
    texts, _ = translation.translate_sentences(run, sentences, beam_size=1, max_new_tokens=3)
    assert texts == [_alone(seq2seq, processor, s, beam_size=1, max_new_tokens=3)[0] for s in sentences]


def test_sentences_are_batched_32_at_a_time_by_length_then_input_order(processor):
    """Batches of similar length (sorted by source length, ties in input order), 32 by default."""
    sentences = [SENTENCES[(5 * i) % len(SENTENCES)] for i in range(40)]
    batches, calls = [], []

    def translate(source, max_new_tokens, *, beam_size, alpha):
        batches.append([row[row != PAD_ID].tolist() for row in np.asarray(source)])
        return types.SimpleNamespace(ids=[np.array([row[0]]) for row in np.asarray(source)])

    run = types.SimpleNamespace(kind="seq2seq", processor=processor, max_length=TINY["max_length"],
                                model=types.SimpleNamespace(translate=translate))
    texts, _ = translation.translate_sentences(run, sentences, progress=lambda *done: calls.append(done))
    rows = [processor.encode(s)[:TINY["max_length"] - 1] + [EOS_ID] for s in sentences]
    order = sorted(range(40), key=lambda i: (len(rows[i]), i))
    assert batches == [[rows[i] for i in order[:32]], [rows[i] for i in order[32:]]]
    assert len({len(rows[i]) for i in order}) > 2 and order != sorted(order)
    assert calls == [(32, 40), (40, 40)]
    assert texts == [processor.decode([row[0]]) for row in rows]


@once_on_keras2("a default argument of translate_sentences; the beam search it passes the size to runs on "
                "both stacks in test_seq2seq.py")
def test_the_default_beam_is_4(seq2seq, sp_model, processor):
    run = translation.TranslationRun(seq2seq, sp_model)
    for seed in range(1, 20):  # weights whose beams of 4 and 5 find other translations
        seq2seq.set_weights(_random_weights(seq2seq, seed))
        four = [_alone(seq2seq, processor, s, beam_size=4)[0] for s in SENTENCES]
        if [_alone(seq2seq, processor, s, beam_size=5)[0] for s in SENTENCES] != four:
            break
    else:
        pytest.fail("no seed in 1-19 gives weights whose beams of 4 and 5 differ")
    assert translation.translate_sentences(run, SENTENCES)[0] == four


def _preferring(model, *tokens):
    """Weights with which the model's next-token scores are the same at every step: `tokens` first,
    each e (in log probability) above the next, all others 10 below the last."""
    weights = [np.zeros_like(w) for w in model.get_weights()]
    [head_bias] = [w for w in weights if w.shape == (TINY["vocab_size"],)]
    head_bias[:] = -10.0
    for rank, token in enumerate(tokens):
        head_bias[token] = -rank
    return weights


def test_the_length_penalty_is_the_one_given(seq2seq, sp_model, processor):
    # Ending (</s>) is second best at every step: without a length penalty the beam keeps the shortest.
    seq2seq.set_weights(_preferring(seq2seq, processor.piece_to_id("▁cat"), EOS_ID))
    run = translation.TranslationRun(seq2seq, sp_model)
    short, long = (_alone(seq2seq, processor, SENTENCES[0], beam_size=2, alpha=alpha)[0]
                   for alpha in (0.0, 1.0))
    assert short != long
    assert translation.translate_sentences(run, SENTENCES[:1], beam_size=2, alpha=0.0)[0] == [short]
    assert translation.translate_sentences(run, SENTENCES[:1], beam_size=2)[0] == [long]


def test_reserved_ids_are_left_out_of_the_text_and_counted_as_tokens(seq2seq, sp_model, processor):
    run = translation.TranslationRun(seq2seq, sp_model)
    seq2seq.set_weights(_emitting(seq2seq, NUM_RESERVED_IDS))  # the first piece
    texts, stats = translation.translate_sentences(run, SENTENCES[:2], beam_size=1)
    assert texts == [processor.decode([NUM_RESERVED_IDS] * 11)] * 2 and texts[0]
    assert stats["tokens"] == 2 * 12  # 11 each and the end
    seq2seq.set_weights(_emitting(seq2seq, SEP_ID))
    texts, stats = translation.translate_sentences(run, SENTENCES[:2], beam_size=1)
    assert texts == ["", ""] and stats["tokens"] == 24


@pytest.mark.parametrize("batch_size", [0, True, 2.0])
def test_a_batch_size_that_is_no_positive_int_is_refused(seq2seq, sp_model, batch_size):
    run = translation.TranslationRun(seq2seq, sp_model)
    with pytest.raises(ValueError) as error:
        translation.translate_sentences(run, SENTENCES[:1], batch_size=batch_size)
    assert str(error.value) == f"`batch_size` must be an int >= 1, got batch_size={batch_size!r}."


def test_a_decoder_only_lm_continues_its_prefix_as_full_forward_passes_do(lm, sp_model, processor):
    lm.set_weights(_random_weights(lm, 1))
    run = translation.TranslationRun(lm, sp_model)
    sentences = [SENTENCES[0], SENTENCES[6], SENTENCES[7], SENTENCES[2]]  # some prefixes left-padded
    assert len({len(processor.encode(s)[:6]) for s in sentences}) > 1
    # The default room: half of max_length 16 for the translation, the source cut to 16 - 2 - 8.
    texts, stats = translation.translate_sentences(run, sentences, beam_size=1, batch_size=4)
    expected = [_lm_greedy(lm, [BOS_ID] + processor.encode(s)[:6] + [SEP_ID], 8) for s in sentences]
    assert texts == [processor.decode([t for t in ids if t >= NUM_RESERVED_IDS]) for ids in expected]
    assert stats["tokens"] == sum(len(ids) + 1 for ids in expected)
    # The longest translation that leaves room for one source token.
    texts, _ = translation.translate_sentences(run, sentences[:2], beam_size=1, max_new_tokens=13)
    expected = [_lm_greedy(lm, [BOS_ID] + processor.encode(s)[:1] + [SEP_ID], 13) for s in sentences[:2]]
    assert texts == [processor.decode([t for t in ids if t >= NUM_RESERVED_IDS]) for ids in expected]
    # Left-padded beams in a batch give what each prefix gives alone.
    alone = [translation.translate_sentences(run, [s], beam_size=3)[0][0] for s in sentences]
    assert translation.translate_sentences(run, sentences, beam_size=3, batch_size=4)[0] == alone


def test_a_decoder_only_lms_search_scores_each_row_by_its_own_log_probabilities(lm, processor):
    """Each row's total log-probability is its own tokens' under full forward passes (a log-softmax over
    the whole batch would shift every row by the others' logits)."""
    lm.set_weights(_random_weights(lm, 1))
    prefixes = [[BOS_ID] + processor.encode(s)[:6] + [SEP_ID] for s in (SENTENCES[0], SENTENCES[6])]
    result = translation._lm_search(lm, [np.array(p, np.int32) for p in prefixes], 4, beam_size=1, alpha=1.0)
    for prefix, ids, got in zip(prefixes, result.ids, result.log_probs):
        tokens = [int(t) for t in ids] + ([EOS_ID] if len(ids) < 4 else [])
        sequence, total = list(prefix), 0.0
        for token in tokens:
            languages = [[0] * len(prefix) + [1] * (len(sequence) - len(prefix))]
            logits = ops.convert_to_numpy(lm(np.array([sequence]), language_ids=np.array(languages),
                                             training=False))[0, -1].astype(np.float64)
            total += logits[token] - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            sequence.append(token)
        assert got == pytest.approx(total, abs=1e-4)


def test_a_decoder_only_lm_never_emits_padding_start_or_separator(lm, sp_model, processor):
    lm.set_weights(_preferring(lm, BOS_ID, SEP_ID, PAD_ID, processor.piece_to_id("▁cat")))
    run = translation.TranslationRun(lm, sp_model)
    texts, _ = translation.translate_sentences(run, SENTENCES[:1], beam_size=2, max_new_tokens=4)
    assert texts == [processor.decode([processor.piece_to_id("▁cat")] * 4)]


def test_a_translation_too_long_for_a_decoder_only_lm_is_refused(lm, sp_model):
    run = translation.TranslationRun(lm, sp_model)
    with pytest.raises(ValueError) as error:
        translation.translate_sentences(run, SENTENCES[:1], max_new_tokens=14)
    assert str(error.value) == ("`max_new_tokens`=14 leaves no room for a source within the decoder-only "
                                "model's max_length=16 (<s>, the source, <sep>, the translation).")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, sp_model):
    """A translation run's folder: a tiny translator with random weights (seed 1) and its tokenizer."""
    folder = tmp_path_factory.mktemp("translation_run")
    model = Seq2SeqTransformer(**TINY)
    model.build_on_dummy()
    model.set_weights(_random_weights(model, 1))
    save_model(model, str(folder / "model.keras"))
    (folder / "spm.model").write_bytes(sp_model)
    return folder


def _saved(folder, model):
    folder.mkdir()
    save_model(model, str(folder / "model.keras"))
    return str(folder / "model.keras")


def test_a_run_folder_or_model_file_loads_as_its_translator(run_folder, lm, sp_model, tmp_path):
    run = translation.load_translator(str(run_folder))
    assert (run.kind, type(run.model).__name__, run.sp_model) == ("seq2seq", "Seq2SeqTransformer", sp_model)
    keras_file = _saved(tmp_path / "lm", lm)
    (tmp_path / "given.model").write_bytes(sp_model)
    run = translation.load_translator(keras_file, str(tmp_path / "given.model"))
    assert (run.kind, type(run.model).__name__, run.sp_model) == ("lm", "CausalLM", sp_model)


def _no_translator(model, tmp_path, name):
    path = _saved(tmp_path / name, model)
    with pytest.raises(ValueError) as error:
        translation.load_translator(path, str(tmp_path / "spm.model"))
    return str(error.value).replace(repr(path), "PATH")


NO_TRANSLATOR = ("PATH holds no translator: train one with `keras-posenc train --task translate` (or a "
                 "decoder-only LM with --format tsv), got a ")


def _lm_without_languages(**overrides):
    return {**{k: v for k, v in LM_CONFIG.items() if k != "num_languages"}, **overrides}


def test_a_text_lm_is_refused_as_one(sp_model, tmp_path):
    (tmp_path / "spm.model").write_bytes(sp_model)
    model = CausalLM(_lm_without_languages())
    model.build_on_dummy()
    assert _no_translator(model, tmp_path, "lm") == NO_TRANSLATOR + "CausalLM trained on plain text."


@pytest.mark.parametrize("languages, causal, kind", [
    (3, True, "CausalLM of 3 languages (a translating LM has 2: source and target)."),
    (2, False, "CausalLM without the causal mask (causal=False)."),
])
def test_a_decoder_only_lm_translates_only_with_two_languages_and_the_causal_mask(sp_model, tmp_path,
                                                                                  languages, causal, kind):
    (tmp_path / "spm.model").write_bytes(sp_model)
    model = CausalLM(_lm_without_languages(num_languages=languages), causal=causal)
    model.build_on_dummy()
    assert _no_translator(model, tmp_path, "lm") == NO_TRANSLATOR + kind


def test_a_keras_model_of_another_kind_is_refused_by_class(sp_model, tmp_path):
    (tmp_path / "spm.model").write_bytes(sp_model)
    inputs = keras.Input([4])
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    assert _no_translator(model, tmp_path, "other") == NO_TRANSLATOR + "Functional."


def test_corpus_scores_are_sacrebleus_with_its_signatures():
    hypotheses, references = ["the cat sat on a mat", "a dog"], ["the cat sat on the mat", "the dog"]
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    expected = {"bleu": bleu.corpus_score(hypotheses, [references]).score,
                "chrf": chrf.corpus_score(hypotheses, [references]).score,
                "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
                "sentences": 2}
    assert translation.corpus_scores(hypotheses, references) == expected
    assert 0 < expected["bleu"] < 100 and 0 < expected["chrf"] < 100
    with pytest.raises(ValueError) as error:
        translation.corpus_scores(hypotheses, references[:1])
    assert str(error.value) == ("2 translations but 1 references: the reference file must have one line per "
                                "input line.")


class _Terminal:
    """stderr on a terminal: what was written shows once flushed."""

    def __init__(self, tty=True):
        self.tty, self.pending, self.shown = tty, "", ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.pending += text

    def flush(self):
        self.shown, self.pending = self.shown + self.pending, ""


def test_progress_redraws_one_line_on_a_terminal_only(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(translation.sys, "stderr", terminal)
    monkeypatch.setattr(translation, "time", _Clock(100.0, 100.0, 102.0, 104.0))
    progress = translation.stderr_progress("scored")
    progress(1, 4)
    assert terminal.shown == "\rscored 1/4 sentences (1000000000.0/s)"  # no time yet: 1 per nanosecond
    progress(3, 4)
    assert terminal.shown.endswith("\rscored 3/4 sentences (1.5/s)")
    progress(4, 4)
    assert terminal.shown.endswith("\rscored 4/4 sentences (1.0/s)\n")
    not_a_terminal = _Terminal(tty=False)
    monkeypatch.setattr(translation.sys, "stderr", not_a_terminal)
    monkeypatch.setattr(translation, "time", _Clock(0.0))
    progress = translation.stderr_progress()
    progress(1, 1)
    assert (not_a_terminal.pending, not_a_terminal.shown) == ("", "")
    monkeypatch.setattr(translation.sys, "stderr", terminal)
    monkeypatch.setattr(translation, "time", _Clock(0.0, 2.0))
    translation.stderr_progress()(1, 2)
    assert terminal.shown.endswith("\rtranslated 1/2 sentences (0.5/s)")


def _translated_file(seq2seq, processor, lines, **search):
    """The lines as the run folder's model translates them each alone, and the tokens it generates."""
    seq2seq.set_weights(_random_weights(seq2seq, 1))  # the run folder's weights
    translated = [_alone(seq2seq, processor, line, **search) if line.strip() else ("", -1) for line in lines]
    return [text for text, _ in translated], sum(length + 1 for _, length in translated)


def test_translate_file_writes_one_line_per_input_line_and_scores_them(run_folder, seq2seq, processor,
                                                                       tmp_path, monkeypatch):
    lines = [SENTENCES[0], "", SENTENCES[6], " "]
    references = ["the cat sat", "", "a cat", "x"]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(references), encoding="utf-8")
    monkeypatch.setattr(translation, "time", _Clock(0.0, 10.0, 14.0))  # progress, start, end
    result = translation.translate_file(str(run_folder), str(tmp_path / "in.txt"), str(tmp_path / "out.txt"),
                                        reference_path=str(tmp_path / "ref.txt"), batch_size=1)
    texts, tokens = _translated_file(seq2seq, processor, lines, beam_size=4, alpha=1.0)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "".join(text + "\n" for text in texts)
    assert result == {"sentences": 4, "seconds": 4.0, "sentences_per_second": 0.5,
                      "tokens_per_second": tokens / 4.0, "beam_size": 4, "length_penalty": 1.0,
                      "model": "Seq2SeqTransformer", **translation.corpus_scores(texts, references)}


def test_translate_file_reads_stdin_and_writes_stdout(run_folder, seq2seq, processor, tmp_path, monkeypatch,
                                                      capsys):
    monkeypatch.setattr(translation.sys, "stdin", io.StringIO(f"{SENTENCES[6]}\n{SENTENCES[7]}\n"))
    monkeypatch.setattr(translation, "time", _Clock(0.0, 3.0, 3.0))  # no time: no rates
    result = translation.translate_file(str(run_folder), "-", "-", beam_size=1, alpha=0.5)
    texts, _ = _translated_file(seq2seq, processor, SENTENCES[6:8], beam_size=1, alpha=0.5)
    assert capsys.readouterr().out == f"{texts[0]}\n{texts[1]}\n"
    assert result == {"sentences": 2, "seconds": 0.0, "sentences_per_second": None, "tokens_per_second": None,
                      "beam_size": 1, "length_penalty": 0.5, "model": "Seq2SeqTransformer"}
    assert list(tmp_path.iterdir()) == []


def test_translate_file_refuses_bad_files_before_writing_anything(run_folder, tmp_path):
    source, reference, output = tmp_path / "in.txt", tmp_path / "ref.txt", str(tmp_path / "out.txt")
    source.write_text("a cat\nein hund\n", encoding="utf-8")
    reference.write_text("eine katze\n", encoding="utf-8")
    no_run = str(tmp_path / "no_run")  # the file checks come first

    def refusal(error_type, *args, **kwargs):
        with pytest.raises(error_type) as error:
            translation.translate_file(*args, **kwargs)
        return str(error.value)

    assert refusal(ValueError, no_run, str(source), str(source)) == (
        f"--output {str(source)!r} would overwrite an input: give another file")
    assert refusal(ValueError, no_run, str(source), str(reference), reference_path=str(reference)) == (
        f"--output {str(reference)!r} would overwrite an input: give another file")
    assert refusal(ValueError, no_run, "-", output, reference_path="-") == (
        "--input and --reference cannot both read stdin")
    assert refusal(ValueError, str(run_folder), str(source), output, reference_path=str(reference)) == (
        f"the reference {str(reference)!r} has 1 lines but the input has 2: give one reference per input "
        "line")
    missing = str(tmp_path / "missing.txt")
    assert refusal(FileNotFoundError, str(run_folder), missing, output) == f"no input file at {missing!r}"
    assert refusal(FileNotFoundError, str(run_folder), str(source), output, reference_path=missing) == (
        f"no reference file at {missing!r}")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("ein Bär\n".encode("latin-1"))
    assert refusal(ValueError, str(run_folder), str(latin), output) == (
        f"the input file {str(latin)!r} is not UTF-8 text: invalid continuation byte at byte 5")
    assert not (tmp_path / "out.txt").exists()


def test_translate_file_reads_utf8_text_whatever_the_locale(run_folder, seq2seq, processor, tmp_path):
    lines = ["ein Bär sitzt auf der Matte", SENTENCES[6]]
    references = ["a bear sits on the mat", "ein Kätzchen"]
    source, reference = tmp_path / "in.txt", tmp_path / "ref.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    reference.write_text("".join(line + "\n" for line in references), encoding="utf-8")
    with ascii_locale():
        if not sys.flags.utf8_mode:  # (Python's UTF-8 mode reads UTF-8 in any locale)
            with pytest.raises(UnicodeDecodeError), open(source) as f:
                f.read()
        result = translation.translate_file(str(run_folder), str(source), str(tmp_path / "out.txt"),
                                            reference_path=str(reference), beam_size=1)
    texts, _ = _translated_file(seq2seq, processor, lines, beam_size=1)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "".join(text + "\n" for text in texts)
    assert result["bleu"] == translation.corpus_scores(texts, references)["bleu"]


def test_a_file_named_dash_is_neither_stdin_nor_stdout_to_the_overwrite_check(run_folder, seq2seq, processor,
                                                                             tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    texts, _ = _translated_file(seq2seq, processor, SENTENCES[6:8], beam_size=1)
    (tmp_path / "-").write_text(f"{SENTENCES[6]}\n", encoding="utf-8")
    translation.translate_file(str(run_folder), "./-", "-", beam_size=1)  # the file "-" to stdout
    assert capsys.readouterr().out == f"{texts[0]}\n"
    monkeypatch.setattr(translation.sys, "stdin", io.StringIO(f"{SENTENCES[7]}\n"))
    translation.translate_file(str(run_folder), "-", "./-", beam_size=1)  # stdin to the file "-"
    assert (tmp_path / "-").read_text(encoding="utf-8") == f"{texts[1]}\n"
    assert capsys.readouterr().out == ""


def test_translate_file_passes_its_tokenizer_length_penalty_and_longest_translation_on(seq2seq, sp_model,
                                                                                       processor, tmp_path):
    # Ending (</s>) is second best at every step: the length penalty decides between short and long.
    seq2seq.set_weights(_preferring(seq2seq, processor.piece_to_id("▁cat"), EOS_ID))
    model_path = _saved(tmp_path / "model", seq2seq)  # no spm.model beside it
    (tmp_path / "tokenizer.model").write_bytes(sp_model)
    (tmp_path / "in.txt").write_text(f"{SENTENCES[0]}\n", encoding="utf-8")

    def translated(**settings):
        translation.translate_file(model_path, str(tmp_path / "in.txt"), str(tmp_path / "out.txt"),
                                   spm_path=str(tmp_path / "tokenizer.model"), beam_size=2, **settings)
        return (tmp_path / "out.txt").read_text(encoding="utf-8")

    short, long, cut = (_alone(seq2seq, processor, SENTENCES[0], beam_size=2, **search)[0]
                        for search in ({"alpha": 0.0}, {"alpha": 1.0}, {"alpha": 1.0, "max_new_tokens": 3}))
    assert len({short, long, cut}) == 3
    assert translated() == long + "\n"
    assert translated(alpha=0.0) == short + "\n"
    assert translated(max_new_tokens=3) == cut + "\n"


def test_translate_file_shows_progress_by_batches_of_32_or_of_the_size_given(run_folder, seq2seq, processor,
                                                                            tmp_path, monkeypatch):
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in SENTENCES * 5), encoding="utf-8")
    terminal = _Terminal()
    monkeypatch.setattr(translation.sys, "stderr", terminal)

    def translated(*readings, **settings):  # the clock: progress, start, each batch, end
        monkeypatch.setattr(translation, "time", _Clock(*readings))
        terminal.shown = ""
        translation.translate_file(str(run_folder), str(tmp_path / "in.txt"), str(tmp_path / "out.txt"),
                                   beam_size=1, **settings)
        return terminal.shown

    assert translated(0.0, 0.0, 2.0, 4.0, 4.0) == (
        "\rtranslated 32/40 sentences (16.0/s)\rtranslated 40/40 sentences (10.0/s)\n")
    texts, _ = _translated_file(seq2seq, processor, SENTENCES, beam_size=1)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "".join(text + "\n" for text in texts * 5)
    assert translated(0.0, 0.0, 1.0, 2.0, 4.0, 4.0, batch_size=16) == (
        "\rtranslated 16/40 sentences (16.0/s)\rtranslated 32/40 sentences (16.0/s)"
        "\rtranslated 40/40 sentences (10.0/s)\n")


def test_the_summary_is_scores_then_timing_or_json():
    result = {"sentences": 3, "seconds": 2.25, "sentences_per_second": 1.3333, "tokens_per_second": 20.4,
              "beam_size": 4, "length_penalty": 1.0, "model": "Seq2SeqTransformer"}
    assert translation.format_summary(result) == (
        "translated 3 sentences in 2.2 s (1.3 sentences/s, 20 tokens/s), beam 4, Seq2SeqTransformer")
    scored = {**result, "bleu": 12.345, "chrf": 40.0, "bleu_signature": "nrefs:1|tok:13a",
              "chrf_signature": "nc:6"}
    assert translation.format_summary(scored).splitlines() == [
        "BLEU 12.35  nrefs:1|tok:13a", "chrF 40.00  nc:6",
        "translated 3 sentences in 2.2 s (1.3 sentences/s, 20 tokens/s), beam 4, Seq2SeqTransformer"]
    untimed = {**result, "seconds": 0.0, "sentences_per_second": None, "tokens_per_second": None}
    assert translation.format_summary(untimed) == ("translated 3 sentences in 0.0 s, beam 4, "
                                                   "Seq2SeqTransformer")
    assert translation.format_summary(scored, as_json=True) == json.dumps(scored)
