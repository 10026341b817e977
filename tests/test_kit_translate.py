"""The device kit's translator (export/jetson/run_translate.py) in this process: its search gives the ids
of keras_posenc.beam_search on the same log-probabilities; run over a Seq2SeqTransformer's own encode
and decode steps (stand-ins for the exported signatures, with the file's names and cache shapes) it
gives `Seq2SeqTransformer.translate`'s ids and `keras-posenc translate`'s text; its command line
refuses what it cannot run in one line, and its output file appears whole or not at all. The kit on
real exported files and runtimes is tests/edge/edge_kit_translate.py."""

import argparse
import hashlib
import json
import os
import sys
import zlib

import numpy as np
import pytest
import sentencepiece as spm
from stacks import once_on_keras2
from user_checks import ascii_locale, assert_lowest_accepted, refuses

from keras_posenc.app.dataset import NUM_RESERVED_IDS, train_sentencepiece
from keras_posenc.app.translation import TranslationRun, translate_sentences
from keras_posenc.app.translation_data import source_ids
from keras_posenc.backend import inference_function, keras, ops
from keras_posenc.beam_search import beam_search
from keras_posenc.export import contract
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "export", "jetson"))
import kit_contract  # noqa: E402  (the kit's modules import each other by name, as on the device)
import run_translate  # noqa: E402

pytestmark = once_on_keras2("the kit is NumPy over the files' outputs, the same on both stacks; the model it "
                            "is checked against translates on both stacks in test_seq2seq.py and "
                            "test_export_translation.py")

FORBIDDEN = (PAD_ID, BOS_ID)
SENTENCES = ["the cat sat on the mat", "a dog ran to the old house", "the bird sang", "old mats and cats",
             "the house by the river is small", "a cat and a dog"]


# --- the search against keras_posenc.beam_search ------------------------------------------------------


def table_log_probs(prefix, seed, vocab=12):
    """Log-probabilities of the token after `prefix`: a random row picked by the prefix and the seed,
    rounded to 0.5 so that scores tie, with the end token likelier as the prefix grows."""
    key = zlib.crc32(f"{seed}:{list(prefix)}".encode())
    logits = np.round(np.random.default_rng(key).normal(scale=1.5, size=vocab) * 2) / 2
    logits[EOS_ID] += 0.4 * len(prefix) - 1.0
    return logits - np.log(np.sum(np.exp(logits)))


def package_ids(seed, beam_size, alpha, max_new_tokens, rounds=None):
    """keras_posenc.beam_search's best hypothesis over `table_log_probs` (a batch of one row); each
    step's call appended to `rounds`."""
    def step(tokens, prefixes):
        if rounds is not None:
            rounds.append(len(tokens))
        prefixes = [prefix + (int(token),) for prefix, token in zip(prefixes, tokens)]
        return np.stack([table_log_probs(prefix, seed) for prefix in prefixes]), prefixes

    def reorder(prefixes, rows):
        return [prefixes[row] for row in rows]

    result = beam_search(table_log_probs((), seed)[None], [()], step, reorder, beam_size=beam_size,
                         max_new_tokens=max_new_tokens, end_id=EOS_ID, alpha=alpha, forbidden_ids=FORBIDDEN)
    return result.ids[0].tolist()


def kit_ids(seed, beam_size, alpha, max_new_tokens, calls=None):
    """The kit's search over the same table: each hypothesis' state is its prefix."""
    def step(token, prefix):
        prefix = prefix + (token,)
        if calls is not None:
            calls.append(prefix)
        return table_log_probs(prefix, seed), prefix

    return run_translate.beam_search(table_log_probs((), seed), (), step, beam_size=beam_size,
                                     max_new_tokens=max_new_tokens, end_id=EOS_ID, alpha=alpha,
                                     forbidden_ids=FORBIDDEN)


@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
def test_the_kit_search_gives_the_package_s_ids(beam_size, alpha):
    lengths = set()
    for seed in range(40):
        for max_new_tokens in (1, 3, 9):
            expected = package_ids(seed, beam_size, alpha, max_new_tokens)
            assert kit_ids(seed, beam_size, alpha, max_new_tokens) == expected, (seed, max_new_tokens)
            lengths.add(len(expected))
    assert {0, 1, 2, 3} <= lengths  # ended early and ran to the limit, in many lengths


@pytest.mark.parametrize("beam_size", [2, 4, 8])
def test_the_kit_search_stops_at_the_package_s_step(beam_size):
    """A beam stops once `beam_size` hypotheses are finished and no live one can beat the worst of
    them (the package's rule): the kit steps as many rounds as keras_posenc.beam_search, and a beam of
    8 (16 candidates, more than the 10 allowed tokens at the first step) still finds its ids."""
    early = 0
    for seed in range(40):
        for alpha in (0.0, 0.6, 1.0):
            rounds, calls = [], []
            expected = package_ids(seed, beam_size, alpha, 9, rounds)
            assert kit_ids(seed, beam_size, alpha, 9, calls) == expected, (seed, alpha)
            assert len({len(prefix) for prefix in calls}) == len(rounds), (seed, alpha)
            early += len(rounds) < 8 and len(expected) < len(rounds)  # stopped with hypotheses still live
    assert early >= 5


def test_a_beam_stops_when_the_best_live_score_ties_the_worst_finished_one():
    """Exact scores (alpha 0: no length penalty): after the second step the best live hypothesis
    scores -2, as the worst of the two finished; it cannot beat it, so both searches stop there."""
    table = {(): {EOS_ID: -1.0, 4: -1.0, 5: -1.0}, (4,): {EOS_ID: -1.0, 4: -1.0, 5: -5.0},
             (5,): {EOS_ID: -1.0, 4: -1.5, 5: -5.0}}

    def log_probs(prefix):
        row = np.full(6, -50.0)
        row[[EOS_ID, 4, 5]] = -1.0, -3.0, -3.0
        for token, value in table.get(tuple(prefix), {}).items():
            row[token] = value
        return row

    rounds = []

    def package_step(tokens, prefixes):
        rounds.append(len(tokens))
        prefixes = [prefix + (int(token),) for prefix, token in zip(prefixes, tokens)]
        return np.stack([log_probs(prefix) for prefix in prefixes]), prefixes

    expected = beam_search(log_probs(())[None], [()], package_step, lambda p, rows: [p[r] for r in rows],
                           beam_size=2, max_new_tokens=3, end_id=EOS_ID, alpha=0.0,
                           forbidden_ids=FORBIDDEN).ids[0].tolist()
    calls = []
    ids = run_translate.beam_search(log_probs(()), (), lambda token, prefix: (
        calls.append(prefix + (token,)) or (log_probs(prefix + (token,)), prefix + (token,))),
        beam_size=2, max_new_tokens=3, end_id=EOS_ID, alpha=0.0, forbidden_ids=FORBIDDEN)
    assert ids == expected == [] and rounds == [2] and calls == [(4,), (5,)]


def test_the_search_cases_tell_the_beam_sizes_and_penalties_apart():
    """The cases above can fail: beam search finds other ids than greedy, alpha changes the winner."""
    def differing(a, b):
        return sum(package_ids(seed, *a, 9) != package_ids(seed, *b, 9) for seed in range(40))

    assert differing((1, 1.0), (4, 1.0)) >= 5
    assert differing((4, 0.0), (4, 2.0)) >= 5
    assert differing((2, 0.6), (4, 0.6)) >= 2


def test_greedy_is_one_step_per_token_and_beams_step_only_live_hypotheses():
    calls = []
    ids = kit_ids(3, 1, 1.0, 9, calls)
    assert len(calls) == min(len(ids), 8)  # no step after the end token or the last token
    calls.clear()
    kit_ids(3, 4, 1.0, 9, calls)
    assert len(set(calls)) == len(calls)  # each live hypothesis stepped once, none for a dead beam slot
    for length in range(1, 9):
        assert len([prefix for prefix in calls if len(prefix) == length]) <= 4


def test_the_kit_s_helpers():
    assert run_translate.length_penalty(7, 0.6) == pytest.approx(1.515717, abs=1e-6)
    assert run_translate.length_penalty(7, 0.0) == 1.0
    assert run_translate.top(np.array([1.0, 3.0, 3.0, 2.0]), 3).tolist() == [1, 2, 3]  # ties: lower first
    assert run_translate.top(np.array([1.0, 2.0]), 5).tolist() == [1, 0]
    logits = np.array([1.0, 2.0, 3.0], np.float32)
    expected = np.log(np.exp(logits.astype(np.float64)) / np.exp(logits.astype(np.float64)).sum())
    np.testing.assert_allclose(run_translate.log_softmax(logits), expected, rtol=0, atol=1e-15)
    assert run_translate.log_softmax(logits).dtype == np.float64
    forbidden = run_translate.forbid(np.zeros(4), (0, 2))
    assert forbidden.tolist() == [-np.inf, 0.0, -np.inf, 0.0]


def reference_top(scores, count):
    """The `count` largest scores' indices by a full sort: score descending, then index ascending."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:count]


@pytest.mark.parametrize("seed", range(40))
def test_top_is_a_full_sort_s_first_ids(seed):
    # A beam's candidates: `beams * vocab` scores, many far below the best, some tied, forbidden ids
    # at -inf, with gaps from 0 (ties at the k-th place) to past every gap near_best tries.
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 300))
    scale = [0.01, 1.0, 30.0, 1e7][seed % 4]
    scores = np.round(rng.normal(scale=scale, size=size) * 4) / 4
    scores[rng.random(size) < 0.2] = -np.inf
    if seed % 5 == 0:
        scores[:] = -np.inf
        scores[rng.integers(size)] = -3.0
    for count in (1, 2, 8, size, size + 3):
        expected = reference_top(scores.tolist(), count)
        assert run_translate.top(scores, count).tolist() == expected, (seed, count)


def test_near_best_keeps_every_score_that_reaches_the_k_th():
    scores = np.array([-1.0, -2.9, -3.5, -3.5, -20.0, -np.inf, -3.5, -100.0])
    # The gap 2 holds two scores, 8 five: the third largest (-3.5) and all its ties; 32 six, 128 seven.
    assert run_translate.near_best(scores, 2).tolist() == [0, 1]
    assert run_translate.near_best(scores, 3).tolist() == [0, 1, 2, 3, 6]
    assert run_translate.near_best(scores, 6).tolist() == [0, 1, 2, 3, 4, 6]
    assert run_translate.near_best(scores, 7).tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert run_translate.near_best(scores, 8).tolist() == list(range(8))  # not enough finite ones: all
    assert run_translate.near_best(np.full(3, -np.inf), 1).tolist() == [0, 1, 2]


def test_log_softmax_and_forbid_keep_float64_and_large_logits_finite():
    # Logits near 1000 (a head scaled up): shifted by their max they stay finite, as float64 sums them.
    logits = np.array([1000.0, 999.0, 996.5], np.float32)
    shifted = logits.astype(np.float64) - 1000.0
    expected = shifted - np.log(np.sum(np.exp(shifted)))
    np.testing.assert_allclose(run_translate.log_softmax(logits), expected, rtol=0, atol=1e-15)
    given = np.array([-1.5, -0.25, -3.0], np.float32)
    forbidden = run_translate.forbid(given, (1,))
    assert forbidden.dtype == np.float64 and forbidden.tolist() == [-1.5, -np.inf, -3.0]
    assert given.tolist() == [-1.5, -0.25, -3.0]  # a copy: the caller's array is left as it was


def test_log_softmax_of_rows_is_each_row_s():
    rows = np.random.default_rng(0).normal(scale=4, size=(3, 50)).astype(np.float32)
    together = run_translate.log_softmax(rows)
    assert together.shape == (3, 50) and together.dtype == np.float64
    for row, expected in zip(rows, together):
        np.testing.assert_array_equal(run_translate.log_softmax(row), expected)


# --- the translate loop over a Seq2SeqTransformer's own steps -----------------------------------------


def translate_export(model, source_length, cache_length, folder=None, name="de.tflite", beam_rows=0):
    """The `kit_contract.Export` of a translator of `model` (FILE.json as the exporter writes it; with
    `beam_rows`, a `decode_beams` signature of that many rows)."""
    head_dim = model.d_model // model.num_heads
    metadata = {
        "kind": "translate", "target": "cpu", "accelerators": ["cpu"], "input_dtype": "int32",
        "vocab_size": model.vocab_size, "num_layers": model.num_layers, "pad_id": PAD_ID, "bos_id": BOS_ID,
        "eos_id": EOS_ID, "unk_id": UNK_ID, "special_ids": list(range(NUM_RESERVED_IDS)),
        "source_length": source_length, "cache_length": cache_length,
        "cache_shape": [1, cache_length, model.num_heads, head_dim],
        "cross_shape": [1, source_length, model.num_heads, head_dim], "length_penalty": 1.0,
        "embedding": "graph", "signature_files": {"encode": name, "decode": name}}
    if beam_rows:
        metadata["beam_rows"] = beam_rows
        metadata["signature_files"][contract.BEAM_SIGNATURE] = name
    model_path = os.path.join(folder or "", name)
    return kit_contract.Export(model_path, contract.document(), metadata)


class ModelSession:
    """The encode/decode signatures of a translator, computed by the Keras model's own cached steps
    (`encode`, `cross_cache`, `decode_step`), named and shaped as the exported file's."""

    name, fully_accelerated, table = "keras", None, None

    def __init__(self, model, meta):
        self.model, self.layers = model, range(model.num_layers)
        self.calls = []

        def encode(source):
            outputs, mask = model.encode(source)
            return model.cross_cache(outputs), mask

        self.encoder = inference_function(model, encode)
        self.decoder = inference_function(model, model.decode_step)

    def input_names(self, signature):
        assert signature in ("decode", contract.BEAM_SIGNATURE)
        names = [contract.TENSORS["token_id"], contract.TENSORS["position"], contract.TENSORS["source_mask"]]
        for i in self.layers:
            names += [contract.past_name(kind, i) for kind in ("key", "value")]
            names += [contract.cross_name(kind, i) for kind in ("key", "value")]
        return names

    def run(self, signature, feeds):
        self.calls.append(signature)
        if signature == "encode":
            return self.encode(feeds)
        if signature == contract.BEAM_SIGNATURE:  # K rows, each with its cache and its sentence's source
            rows = len(feeds["token_id"])
            assert all(len(value) == rows for name, value in feeds.items() if name != "position")
        return self.decode(feeds)

    def encode(self, feeds):
        source = np.asarray(feeds["source_ids"])
        assert source.dtype == np.int32 and source.shape[0] == 1
        cross, mask = self.encoder(ops.convert_to_tensor(source))
        cross = ops.convert_to_numpy(cross)  # [1, layers, 2, S, heads, head_dim]
        named = {contract.TENSORS["source_mask"]: ops.convert_to_numpy(mask).astype(np.float32)}
        for i in self.layers:
            named[contract.cross_name("key", i)] = cross[:, i, 0]
            named[contract.cross_name("value", i)] = cross[:, i, 1]
        return named

    def decode(self, feeds):
        assert set(feeds) == set(self.input_names("decode"))
        # as onnxruntime, which refuses an input of another dtype (the kit's TFLite sessions cast)
        assert np.asarray(feeds["token_id"]).dtype == np.int32, feeds["token_id"].dtype
        assert np.asarray(feeds["position"]).dtype == np.int32, feeds["position"].dtype
        assert all(np.asarray(feeds[name]).dtype == np.float32 for name in feeds if name.startswith("past_"))
        cache = np.stack([np.stack([feeds[contract.past_name(kind, i)] for kind in ("key", "value")], axis=1)
                          for i in self.layers], axis=1)
        cross = np.stack([np.stack([feeds[contract.cross_name(kind, i)] for kind in ("key", "value")], axis=1)
                          for i in self.layers], axis=1)
        logits, cache = self.decoder(
            ops.convert_to_tensor(np.asarray(feeds["token_id"], np.int32)), ops.convert_to_tensor(cache),
            ops.convert_to_tensor(np.int32(feeds["position"][0])), ops.convert_to_tensor(cross),
            ops.convert_to_tensor(feeds["source_mask"] > 0.5))
        cache = ops.convert_to_numpy(cache)
        named = {contract.TENSORS["logits"]: ops.convert_to_numpy(logits)[:, -1]}
        for i in self.layers:
            named[contract.present_name("key", i)] = cache[:, i, 0]
            named[contract.present_name("value", i)] = cache[:, i, 1]
        return named


@pytest.fixture(scope="module")
def translator_model():
    """A tiny translator with sharp distributions (its head scaled up) whose end token ends some
    sentences early and lets the others run to the limit; its SentencePiece model."""
    sp_model = train_sentencepiece(SENTENCES * 4, vocab_size=32)
    keras.utils.set_random_seed(5)
    model = Seq2SeqTransformer(num_layers=2, d_model=16, num_heads=2, dff=32, vocab_size=32, max_length=12,
                               dropout=0.0)
    model.build_on_dummy()
    model.head.kernel.assign(model.head.kernel.numpy() * 8.0)
    bias = model.head.bias.numpy()
    bias[EOS_ID] += 2.0
    model.head.bias.assign(bias)
    return model, sp_model


def test_the_kit_translates_what_the_model_translates(translator_model):
    """Beam 1, 2 and 4 at several alphas: the ids of `Seq2SeqTransformer.translate`, sentence by sentence."""
    model, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(model, source_length=model.max_length, cache_length=9)
    session = ModelSession(model, meta)
    translator = run_translate.Translator(session, meta)
    forgetful = Forgetful(session, meta)
    lengths, expected_ids, forgotten = [], [], []
    for beam_size, alpha in ((1, 1.0), (2, 0.6), (4, 1.0), (4, 0.0)):
        for pieces in processor.encode(SENTENCES):
            row = translator.source_row(pieces)
            assert row.shape == (1, model.max_length) and row.dtype == np.int32
            ids, ttft = translator.translate(pieces, beam_size=beam_size, alpha=alpha, max_new_tokens=7)
            expected = model.translate(row, 7, beam_size=beam_size, alpha=alpha).ids[0].tolist()
            assert ids == expected, (pieces, beam_size, alpha)
            assert ttft >= 0
            lengths.append(len(ids))
            expected_ids.append(expected)
            forgotten.append(forgetful.translate(pieces, beam_size=beam_size, alpha=alpha,
                                                 max_new_tokens=7)[0])
    assert min(lengths) < 7 == max(lengths), lengths  # ended early, and ran to the limit
    assert session.calls.count("encode") == 2 * 4 * len(SENTENCES)
    assert forgotten != expected_ids  # the ids depend on each hypothesis' own cache: without it they differ


@pytest.mark.parametrize("beam_size", [2, 3, 4])
def test_a_beam_search_steps_its_hypotheses_in_one_decode_beams_call(translator_model, beam_size):
    """With `decode_beams` (4 rows) every step of a beam of 2 to 4 hypotheses is one call, rows past them
    padded, and the ids are still `translate`'s; one hypothesis (the first step) calls `decode`."""
    model, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(model, source_length=model.max_length, cache_length=9, beam_rows=4)
    session = ModelSession(model, meta)
    translator = run_translate.Translator(session, meta)
    assert translator.beam_rows == 4
    lengths = []
    for pieces in processor.encode(SENTENCES):
        session.calls.clear()
        ids, _ = translator.translate(pieces, beam_size=beam_size, alpha=1.0, max_new_tokens=7)
        row = translator.source_row(pieces)
        assert ids == model.translate(row, 7, beam_size=beam_size, alpha=1.0).ids[0].tolist(), pieces
        assert session.calls[:2] == ["encode", "decode"]
        assert set(session.calls[2:]) <= {contract.BEAM_SIGNATURE}
        lengths.append(len(ids))
    assert max(lengths) > 0


def test_the_time_to_first_token_is_read_on_the_clock_given(translator_model):
    model, sp_model = translator_model
    pieces = spm.SentencePieceProcessor(model_proto=sp_model).encode(SENTENCES[0])
    meta = translate_export(model, source_length=model.max_length, cache_length=9)
    translator = run_translate.Translator(ModelSession(model, meta), meta)
    ticks = iter([10.0, 10.25])
    ids, ttft = translator.translate(pieces, beam_size=2, alpha=1.0, max_new_tokens=7,
                                     clock=lambda: next(ticks))
    expected = model.translate(translator.source_row(pieces), 7, beam_size=2).ids[0].tolist()
    assert ttft == 0.25 and ids == expected


def test_one_sentences_source_is_repeated_over_the_rows_once(translator_model):
    """The rows of one sentence's beam read its `encode` outputs repeated over `decode_beams`' rows,
    made once per sentence and reused at each step; several sentences' rows are stacked."""
    model, _ = translator_model
    meta = translate_export(model, source_length=model.max_length, cache_length=9, beam_rows=4)
    translator = run_translate.Translator(ModelSession(model, meta), meta)
    one, other = (translator.encode(np.full([1, model.max_length], token, np.int32)) for token in (5, 6))
    tiled = translator._sources([one, one])
    assert translator._sources([one, one, one]) is tiled
    assert all(np.array_equal(tiled[name], np.repeat(one[name], 4, axis=0)) for name in one)
    assert translator._sources([other, other]) is not tiled
    stacked = translator._sources([one, other])
    for name in one:
        np.testing.assert_array_equal(stacked[name], np.concatenate(
            [one[name], other[name]] + [np.zeros_like(one[name])] * 2))


def test_json_is_alone_on_stdout_whatever_the_runtime_prints(command, monkeypatch, capfd):
    run, folder = command
    made = run_translate.make_session

    def printing(args, meta):
        os.write(1, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")  # as native runtimes do
        return made(args, meta)

    monkeypatch.setattr(run_translate, "make_session", printing)
    assert run("--json") == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["sentences"] == 4 and "XNNPACK" in err


def test_lockstep_hands_each_search_its_own_steps_in_one_call_per_round():
    def search(name, counts):
        received = []
        for count in counts:
            received.append((yield [f"{name}{k}" for k in range(count)], [name] * count))
        return received

    calls = []

    def step_many(tokens, states):
        calls.append(list(tokens))
        return [(token, state) for token, state in zip(tokens, states)]

    searches = [search("a", [1, 2]), search("b", []), search("c", [2, 1, 3]), search("d", [3])]
    results = run_translate.lockstep(searches, step_many)
    assert results == [[[("a0", "a")], [("a0", "a"), ("a1", "a")]], [],
                       [[("c0", "c"), ("c1", "c")], [("c0", "c")], [("c0", "c"), ("c1", "c"), ("c2", "c")]],
                       [[("d0", "d"), ("d1", "d"), ("d2", "d")]]]
    assert calls == [["a0", "c0", "c1", "d0", "d1", "d2"], ["a0", "a1", "c0"], ["c0", "c1", "c2"]]


def test_more_hypotheses_than_rows_take_one_decode_beams_call_per_rows(translator_model):
    model, _ = translator_model
    meta = translate_export(model, source_length=model.max_length, cache_length=9, beam_rows=4)
    session = ModelSession(model, meta)
    translator = run_translate.Translator(session, meta)
    cross = translator.encode(np.full([1, model.max_length], 7, np.int32))
    states = [(0, cross, translator.empty)] * 6
    tokens = [model.bos_id, 5, 6, 7, 8, 9]
    session.calls.clear()
    together = translator.step_many(tokens, states)
    assert session.calls == [contract.BEAM_SIGNATURE, contract.BEAM_SIGNATURE]
    for (scores, _), token, state in zip(together, tokens, states):
        np.testing.assert_allclose(scores, translator.step(token, state)[0], atol=1e-5, rtol=0)


def test_without_a_decode_beams_file_the_rows_in_file_json_are_not_used(translator_model):
    model, _ = translator_model
    meta = translate_export(model, source_length=model.max_length, cache_length=9)
    meta.metadata["beam_rows"] = 4  # the signature is not among the files: nothing to call
    assert run_translate.Translator(ModelSession(model, meta), meta).beam_rows == 0


def test_the_search_never_picks_padding_or_the_start_token(translator_model):
    model, sp_model = translator_model
    keen = Seq2SeqTransformer.from_config(model.get_config())
    keen.build_on_dummy()
    keen.set_weights(model.get_weights())
    bias = keen.head.bias.numpy()
    bias[[PAD_ID, BOS_ID]] += 30.0  # above every other logit
    keen.head.bias.assign(bias)
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(keen, source_length=keen.max_length, cache_length=9)
    translator = run_translate.Translator(ModelSession(keen, meta), meta)
    pieces = processor.encode(SENTENCES[1])
    found = {}
    for beam_size in (1, 2):
        found[beam_size], _ = translator.translate(pieces, beam_size=beam_size, alpha=1.0, max_new_tokens=7)
        expected = keen.translate(translator.source_row(pieces), 7, beam_size=beam_size).ids[0].tolist()
        assert found[beam_size] == expected and not {PAD_ID, BOS_ID} & set(expected)
    assert len(found[1]) == 7  # greedy runs to the limit: 7 steps that could have picked them


def test_hypotheses_at_two_positions_are_not_stepped_in_one_call(translator_model):
    model, _ = translator_model
    meta = translate_export(model, source_length=model.max_length, cache_length=9, beam_rows=4)
    translator = run_translate.Translator(ModelSession(model, meta), meta)
    cross = translator.encode(np.full([1, model.max_length], model.pad_id, np.int32))
    states = [(1, cross, translator.empty), (2, cross, translator.empty)]
    with pytest.raises(ValueError) as error:
        translator.step_many([5, 6], states)
    assert str(error.value) == "decode_beams steps hypotheses at one position only."


@pytest.mark.parametrize("beam_size", [1, 2])
def test_sentences_in_lockstep_are_translated_as_one_by_one(translator_model, beam_size):
    """With `decode_beams` of 4 rows, 4 greedy sentences (2 with beams of 2) share every call, each
    row with its own sentence's source; every translation is still `translate`'s, in input order."""
    model, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(model, source_length=model.max_length, cache_length=9, beam_rows=4)
    session = ModelSession(model, meta)
    translator = run_translate.Translator(session, meta)
    assert translator.group_size(beam_size) == 1  # one sentence at a time by default
    translator.sentences_per_call = 8
    assert translator.group_size(beam_size) == 4 // beam_size
    lines = SENTENCES + [""] + SENTENCES[:3]
    texts, stats = run_translate.translate_lines(translator, processor, lines, beam_size=beam_size, alpha=1.0,
                                                 max_new_tokens=7)
    expected = []
    for line in lines:
        if not line:
            expected.append("")
            continue
        row = translator.source_row(processor.EncodeAsIds(line))
        ids = model.translate(row, 7, beam_size=beam_size, alpha=1.0).ids[0].tolist()
        expected.append(run_translate.text_of(processor, ids, meta["special_ids"]))
    assert texts == expected and stats["translated"] == len(lines) - 1
    calls = session.calls.count("decode") + session.calls.count(contract.BEAM_SIGNATURE)
    alone = ModelSession(model, meta)
    alone_meta = translate_export(model, source_length=model.max_length, cache_length=9)  # no decode_beams
    run_translate.translate_lines(run_translate.Translator(alone, alone_meta), processor, lines,
                                  beam_size=beam_size, alpha=1.0, max_new_tokens=7)
    assert alone.calls.count(contract.BEAM_SIGNATURE) == 0
    assert calls < 0.8 * alone.calls.count("decode"), (calls, alone.calls.count("decode"))


class Forgetful(run_translate.Translator):
    """A translator that feeds every decode step the empty cache (what a kit that lost its caches does)."""

    def step(self, token, state):
        position, cross, _ = state
        return super().step(token, (position, cross, self.empty))


def test_the_kit_s_text_is_keras_posenc_translate_s(translator_model):
    model, sp_model = translator_model
    run = TranslationRun(model, sp_model)
    expected, _ = translate_sentences(run, SENTENCES, beam_size=2, alpha=0.6, batch_size=1, max_new_tokens=7)
    meta = translate_export(model, source_length=model.max_length, cache_length=9)
    translator = run_translate.Translator(ModelSession(model, meta), meta)
    lines = SENTENCES[:3] + ["", "   "] + SENTENCES[3:]
    outputs, stats = run_translate.translate_lines(translator, run.processor, lines, beam_size=2, alpha=0.6,
                                                   max_new_tokens=7)
    assert outputs == expected[:3] + ["", ""] + expected[3:]
    assert stats["sentences"] == len(lines) and stats["translated"] == len(SENTENCES)
    assert stats["ttft"] > 0 and stats["seconds"] > 0 and stats["tokens"] >= len(SENTENCES)


def test_a_source_is_cut_to_the_file_s_length(translator_model):
    model, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(model, source_length=5, cache_length=4)
    translator = run_translate.Translator(ModelSession(model, meta), meta)
    pieces = processor.encode(SENTENCES[4])
    assert len(pieces) > 4
    expected = source_ids(processor, [SENTENCES[4]], 5)[0]  # what translate reads at max_length 5
    assert translator.source_row(pieces).tolist() == [expected.tolist()]
    assert translator.source_row(pieces[:2]).tolist() == [pieces[:2] + [EOS_ID, PAD_ID, PAD_ID]]
    assert sorted(translator.empty) == sorted(contract.past_name(kind, i) for i in range(2)
                                              for kind in ("key", "value"))
    assert all(cache.shape == (1, 4, 2, 8) and not cache.any() for cache in translator.empty.values())


def test_text_drops_every_special_id_as_translate_does(translator_model):
    _, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    words = processor.encode("the cat sat")
    ids = [UNK_ID] + words[:2] + [EOS_ID, 4, PAD_ID, BOS_ID] + words[2:]
    text = run_translate.text_of(processor, ids, range(NUM_RESERVED_IDS))
    assert text == processor.decode([i for i in ids if i >= NUM_RESERVED_IDS]) == "the cat sat"
    assert run_translate.text_of(processor, [UNK_ID], [0, 2, 3]) == processor.decode([UNK_ID]) != ""


# --- the command line -------------------------------------------------------------------------------


TFLITE = b"\x1c\x00\x00\x00TFL3" + bytes(40)


def write_translator(folder, model, **metadata):
    """A translator's files as the exporter writes them (a stand-in model file); its path."""
    meta = translate_export(model, source_length=model.max_length, cache_length=9, folder=str(folder))
    path = meta.model
    with open(path, "wb") as f:
        f.write(TFLITE)
    record = {"bytes": len(TFLITE), "sha256": hashlib.sha256(TFLITE).hexdigest()}
    with open(path + ".json", "w") as f:
        json.dump({**meta.metadata, "files": {os.path.basename(path): record}, **metadata}, f)
    with open(path + ".contract.json", "w") as f:
        json.dump(contract.document(), f)
    return path


@pytest.fixture
def command(tmp_path, translator_model, monkeypatch):
    """`(run(*flags) -> exit status, folder)`: run_translate.main on a stand-in file, the model's steps as
    its runtime, with spm.model and src.txt beside it."""
    model, sp_model = translator_model
    path = write_translator(tmp_path, model)
    (tmp_path / "spm.model").write_bytes(sp_model)
    (tmp_path / "src.txt").write_text("\n".join(SENTENCES[:2] + ["", SENTENCES[2]]) + "\n", encoding="utf-8")
    opened = []

    def session(args, meta):
        assert isinstance(meta, kit_contract.Export) and meta.model == args.model  # the file checked
        opened.append(args)
        return ModelSession(model, meta)

    monkeypatch.setattr(run_translate, "make_session", session)

    def run(*flags, model_path=path):
        argv = [model_path, "--spm", str(tmp_path / "spm.model"), "--input", str(tmp_path / "src.txt"),
                "--output", str(tmp_path / "hyp.txt"), *flags]
        return run_translate.main(argv)

    run.opened = opened
    return run, tmp_path


def exited(call):
    """The message of the SystemExit that `call()` raises (a string: one line, exit status 1)."""
    with pytest.raises(SystemExit) as raised:
        call()
    assert isinstance(raised.value.code, str) and "\n" not in raised.value.code, raised.value.code
    return raised.value.code


def test_main_writes_one_translation_per_line_and_prints_the_figures(command, translator_model, capsys):
    run, folder = command
    assert run("--beam-size", "2", "--max-new-tokens", "7") == 0
    printed = capsys.readouterr().out.splitlines()
    model, sp_model = translator_model
    expected, _ = translate_sentences(TranslationRun(model, sp_model), SENTENCES[:3], beam_size=2, alpha=1.0,
                                      batch_size=1, max_new_tokens=7)
    written = (folder / "hyp.txt").read_text(encoding="utf-8")
    assert written.split("\n") == expected[:2] + ["", expected[2], ""]
    assert printed[0] == "runtime: keras  accelerator: cpu  fully accelerated: None"
    assert printed[1].startswith("translated 3 of 4 lines in ") and printed[1].endswith(", beam 2, alpha 1.0")
    assert "sentences/s" in printed[1] and "target tokens/s" in printed[1]
    assert printed[2].startswith("mean time to first token ") and printed[3] == f"wrote {folder / 'hyp.txt'}"
    assert run("--json", "--beam-size", "1", "--alpha", "0.5") == 0
    shown = json.loads(capsys.readouterr().out)
    assert {"sentences", "tokens", "seconds", "sentences_per_s", "tokens_per_s", "ttft_ms", "runtime",
            "fully_accelerated"} <= set(shown)
    assert shown["sentences"] == 4 and shown["runtime"] == "keras" and shown["alpha"] == 0.5
    assert shown["ttft_ms"] > 0 and shown["tokens"] >= 3 and shown["tokens_per_s"] > 0
    assert [args.runtime for args in run.opened] == ["auto", "auto"]


def test_main_with_jobs_opens_a_session_per_job_and_writes_what_one_job_writes(command, capsys):
    run, folder = command
    assert run("--beam-size", "2", "--max-new-tokens", "7", "--json") == 0
    alone = (folder / "hyp.txt").read_text(encoding="utf-8")
    assert json.loads(capsys.readouterr().out)["jobs"] == 1 and len(run.opened) == 1
    (folder / "hyp.txt").unlink()
    assert run("--beam-size", "2", "--max-new-tokens", "7", "--jobs", "3", "--json") == 0
    assert (folder / "hyp.txt").read_text(encoding="utf-8") == alone
    shown = json.loads(capsys.readouterr().out)
    assert shown["jobs"] == 3 and shown["sentences"] == 4 and len(run.opened) == 4
    assert run("--beam-size", "2", "--max-new-tokens", "7", "--jobs", "2") == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(", beam 2, alpha 1.0, 2 jobs")


def test_jobs_translate_each_sentence_once_as_one_job_does(translator_model):
    model, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(model, source_length=model.max_length, cache_length=9, beam_rows=4)
    sessions = [ModelSession(model, meta) for _ in range(3)]
    translators = [run_translate.Translator(session, meta) for session in sessions]
    lines = SENTENCES + [""] + SENTENCES[:2]
    options = {"beam_size": 2, "alpha": 1.0, "max_new_tokens": 7}
    alone, _ = run_translate.translate_lines(translators[0], processor, lines, **options)
    for session in sessions:
        session.calls.clear()
    together, stats = run_translate.translate_lines(translators[0], processor, lines, helpers=translators[1:],
                                                    **options)
    assert together == alone and stats["translated"] == len(lines) - 1 and stats["sentences"] == len(lines)
    assert sum(session.calls.count("encode") for session in sessions) == len(lines) - 1


def test_the_run_s_figures_are_counted_on_the_clock_given(translator_model):
    model, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(model, source_length=model.max_length, cache_length=9)
    translator = run_translate.Translator(ModelSession(model, meta), meta)
    lines = [SENTENCES[0], "", SENTENCES[1]]
    ticks = iter([10.0, 11.0, 11.5, 12.0, 12.25, 15.0])  # the run, then each sentence's first token
    outputs, stats = run_translate.translate_lines(translator, processor, lines, beam_size=2, alpha=1.0,
                                                   max_new_tokens=7, clock=lambda: next(ticks))
    ids = [model.translate(translator.source_row(processor.encode(line)), 7, beam_size=2).ids[0].tolist()
           for line in lines if line]
    assert stats == {"sentences": 3, "translated": 2, "tokens": sum(len(i) + 1 for i in ids), "seconds": 5.0,
                     "ttft": 0.375}  # (0.5 + 0.25) / 2
    assert outputs[1] == "" and stats["tokens"] != 2 * len(ids)
    ticks = iter([1.0, 3.0])
    assert run_translate.translate_lines(translator, processor, ["", " "], beam_size=2, alpha=1.0,
                                         max_new_tokens=7, clock=lambda: next(ticks)) == (["", ""], {
        "sentences": 2, "translated": 0, "tokens": 0, "seconds": 2.0, "ttft": None})


def test_sentences_in_lockstep_are_grouped_by_length(translator_model, monkeypatch):
    """A group steps until its longest translation ends: sentences of similar length share one (ties
    in input order); one sentence at a time goes in the input's order."""
    model, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(model, source_length=model.max_length, cache_length=9, beam_rows=4)
    translator = run_translate.Translator(ModelSession(model, meta), meta)
    groups = []
    monkeypatch.setattr(translator, "translate_group", lambda sentences, **options: (
        groups.append([processor.decode(p) for p in sentences]) or ([[]] * len(sentences), 0.0)))
    lengths = {line: len(processor.encode(line)) for line in SENTENCES[:4]}
    translator.sentences_per_call = 2
    options = {"alpha": 1.0, "max_new_tokens": 7}
    run_translate.translate_lines(translator, processor, SENTENCES[:4], beam_size=2, **options)
    by_length = sorted(SENTENCES[:4], key=lambda line: (lengths[line], SENTENCES.index(line)))
    assert groups == [by_length[:2], by_length[2:]] and by_length != SENTENCES[:4]
    groups.clear()
    run_translate.translate_lines(translator, processor, SENTENCES[:4], beam_size=4, **options)
    assert groups == [[line] for line in SENTENCES[:4]]


def test_the_lockstep_group_is_what_decode_beams_holds_and_one_while_logits_are_kept(translator_model):
    model, _ = translator_model
    meta = translate_export(model, source_length=model.max_length, cache_length=9, beam_rows=4)
    translator = run_translate.Translator(ModelSession(model, meta), meta)
    translator.sentences_per_call = 4
    assert [translator.group_size(beam) for beam in (1, 2, 3, 4, 5)] == [4, 2, 1, 1, 1]
    translator.sentences_per_call = 3
    assert [translator.group_size(beam) for beam in (1, 2)] == [3, 2]
    translator.chosen = []
    assert [translator.group_size(beam) for beam in (1, 2)] == [1, 1]
    plain_meta = translate_export(model, model.max_length, 9)
    plain = run_translate.Translator(ModelSession(model, plain_meta), plain_meta)
    plain.sentences_per_call = 4
    assert plain.group_size(1) == 1


def test_a_job_s_failure_reaches_the_caller(translator_model):
    model, sp_model = translator_model
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    meta = translate_export(model, source_length=model.max_length, cache_length=9)

    class Failing(ModelSession):
        def run(self, signature, feeds):
            raise RuntimeError("the runtime failed")

    # The first sentence takes the first translator: the failing one.
    translators = [run_translate.Translator(Failing(model, meta), meta),
                   run_translate.Translator(ModelSession(model, meta), meta)]
    with pytest.raises(RuntimeError, match="the runtime failed"):
        run_translate.translate_lines(translators[0], processor, SENTENCES, beam_size=1, alpha=1.0,
                                      max_new_tokens=7, helpers=translators[1:])


@pytest.mark.parametrize("stats, rates", [
    ({"translated": 4, "tokens": 30, "seconds": 2.0, "ttft": 0.0125}, (2.0, 15.0, 12.5)),
    ({"translated": 3, "tokens": 12, "seconds": 0.5, "ttft": 0.002}, (6.0, 24.0, 2.0)),
    ({"translated": 0, "tokens": 0, "seconds": 0.5, "ttft": None}, (None, None, None)),
    ({"translated": 2, "tokens": 5, "seconds": 0.0, "ttft": 0.001}, (None, None, 1.0)),
])
def test_the_json_figures_are_the_run_s_rates(stats, rates):
    args = argparse.Namespace(accelerator="cpu", beam_size=4, jobs=2)
    session = type("Session", (), {"name": "tflite_runtime", "fully_accelerated": None})()
    shown = run_translate.report({"sentences": 5, **stats}, session, args, 0.6)
    assert (shown["sentences_per_s"], shown["tokens_per_s"]) == rates[:2]
    assert shown["ttft_ms"] == pytest.approx(rates[2], rel=1e-12) if rates[2] else shown["ttft_ms"] is None
    assert shown == {"sentences": 5, "tokens": stats["tokens"], "seconds": stats["seconds"],
                     "sentences_per_s": rates[0], "tokens_per_s": rates[1], "ttft_ms": shown["ttft_ms"],
                     "runtime": "tflite_runtime", "accelerator": "cpu", "fully_accelerated": None,
                     "beam_size": 4, "alpha": 0.6, "jobs": 2}


def test_main_defaults_alpha_and_the_length_to_the_file_s(command, monkeypatch, capsys):
    run, folder = command
    seen, translators = [], []
    def translate_lines(translator, processor, lines, **options):
        seen.append(options)
        translators.append(translator)
        return [], {"sentences": 0, "translated": 0, "tokens": 0, "seconds": 0.0, "ttft": None}

    monkeypatch.setattr(run_translate, "translate_lines", translate_lines)
    assert run() == 0
    assert seen == [{"beam_size": 4, "alpha": 1.0, "max_new_tokens": 9, "helpers": []}]
    assert (folder / "hyp.txt").read_text() == ""
    assert capsys.readouterr().out.splitlines()[1] == "translated 0 of 0 lines in 0.00 s, beam 4, alpha 1.0"
    assert (translators[0].chosen, translators[0].sentences_per_call) == (None, 1)
    assert run("--jobs", "3", "--sentences-per-call", "2") == 0
    main, helpers = translators[1], seen[1]["helpers"]
    assert len(helpers) == 2 and len({id(t.session) for t in [main] + helpers}) == 3
    assert [t.sentences_per_call for t in [main] + helpers] == [2, 2, 2]


def test_logits_keeps_the_greedy_steps_of_each_translated_line(command, translator_model):
    """`--logits FILE.npz`: per translated line, the logits of its greedy steps (the end token's
    included) as the model computes them teacher-forced on `<s>` and the translation."""
    run, folder = command
    model, sp_model = translator_model
    assert run("--beam-size", "1", "--max-new-tokens", "7", "--logits", str(folder / "steps.npz")) == 0
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    with np.load(folder / "steps.npz") as kept:
        assert sorted(kept.files) == ["line_0", "line_1", "line_3"]  # line 2 is empty
        for key, sentence in zip(("line_0", "line_1", "line_3"), SENTENCES):
            pieces = source_ids(processor, [sentence], model.max_length)[0]
            row = np.full([1, model.max_length], PAD_ID, np.int32)
            row[0, :len(pieces)] = pieces
            ids = model.translate(row, 7, beam_size=1).ids[0].tolist()
            fed = ids + [EOS_ID] if len(ids) < 7 else ids
            target = np.array([[BOS_ID] + fed[:-1]], np.int32)
            full = np.asarray(model({"source_ids": row, "target_ids": target}))[0]
            assert kept[key].shape == full.shape and kept[key].dtype == np.float32
            np.testing.assert_allclose(kept[key], full, atol=1e-5, rtol=0)


def test_the_flags_defaults_and_types(tmp_path):
    for name in ("spm.model", "src.txt"):
        (tmp_path / name).write_text("x\n")
    required = ["de.tflite", "--spm", str(tmp_path / "spm.model"), "--input", str(tmp_path / "src.txt"),
                "--output", str(tmp_path / "o.txt")]
    args = vars(run_translate.parse_args(required))
    assert {key: args[key] for key in ("beam_size", "alpha", "max_new_tokens", "accelerator", "delegate",
                                       "precision", "threads", "runtime", "sentences_per_call", "jobs",
                                       "json", "logits")} == {
        "beam_size": 4, "alpha": None, "max_new_tokens": None, "accelerator": "cpu", "delegate": None,
        "precision": "fp32", "threads": None, "runtime": "auto", "sentences_per_call": 1, "jobs": 1,
        "json": False, "logits": None}
    flags = ["--threads", "2", "--alpha", "0.5", "--precision", "fp16"]
    given = vars(run_translate.parse_args(required + flags))
    assert (given["threads"], given["alpha"], given["precision"]) == (2, 0.5, "fp16")

    def accepts(flag):
        return lambda value: not refuses(lambda: run_translate.parse_args(required + [flag, str(value)]))

    for flag in ("--beam-size", "--max-new-tokens", "--sentences-per-call", "--jobs"):
        assert_lowest_accepted(accepts(flag), 1)
    assert_lowest_accepted(accepts("--alpha"), 0)  # no length penalty: the plain log-probability


@pytest.mark.parametrize("flags, message", [
    (["--beam-size", "0"], "--beam-size must be >= 1, got 0."),
    (["--logits", "steps.npz"], "--logits writes the greedy steps' logits: it needs --beam-size 1, got 4."),
    (["--beam-size", "x"], "run_translate.py: argument --beam-size: invalid int value: 'x'"),
    (["--alpha", "-0.5"], "--alpha must be >= 0, got -0.5."),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0."),
    (["--max-new-tokens", "10"], "--max-new-tokens 10 needs 10 cache slots; the file has 9 (export with a "
                                 "larger --cache-length)."),
    (["--runtime", "onnxruntime"], "--runtime onnxruntime runs the STEM.onnx pair of --target tensorrt"),
    (["--runtime", "tensorrt"], "run_translate.py: argument --runtime: invalid choice: 'tensorrt'"),
    (["--accelerator", "gpu"], "was exported with --target cpu, which runs on cpu only"),
    (["--jobs", "0"], "--jobs must be >= 1, got 0."),
    (["--sentences-per-call", "0"], "--sentences-per-call must be >= 1, got 0."),
    (["--jobs", "2", "--accelerator", "gpu"],
     "--jobs 2 opens a session per job: it is for --accelerator cpu, not gpu (one GPU runs one session at "
     "a time)."),
    (["--jobs", "2", "--beam-size", "1", "--logits", "s.npz"],
     "--logits keeps the steps in the order they run: it needs --jobs 1, got 2."),
])
def test_argument_errors_are_one_line(command, monkeypatch, flags, message):
    run, folder = command
    monkeypatch.setattr(sys, "argv", ["run_translate.py"])
    assert message in exited(lambda: run(*flags))
    assert not (folder / "hyp.txt").exists()


def test_the_help_is_what_a_device_user_reads(monkeypatch, capsys):
    """`--help` word for word, the usage line's required flags included (tests/data/kit_help/; after a
    change to an option, regenerate it with `COLUMNS=100 python3 export/jetson/run_translate.py --help >
    tests/data/kit_help/run_translate.txt`)."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(sys, "argv", ["run_translate.py"])
    with pytest.raises(SystemExit) as raised:
        run_translate.parse_args(["--help"])
    assert raised.value.code == 0
    expected = open(os.path.join(os.path.dirname(__file__), "data", "kit_help", "run_translate.txt")).read()
    assert capsys.readouterr().out == expected


def test_missing_files_and_an_output_over_the_input_are_one_line(command, monkeypatch):
    run, folder = command
    monkeypatch.setattr(sys, "argv", ["run_translate.py"])
    model = str(folder / "de.tflite")
    src, spm_path = str(folder / "src.txt"), str(folder / "spm.model")
    main = run_translate.main
    assert exited(lambda: main([model, "--spm", "no.model", "--input", src, "--output", "o"])) == (
        "--spm no.model: file not found.")
    assert exited(lambda: main([model, "--spm", spm_path, "--input", "no.txt", "--output", "o"])) == (
        "--input no.txt: file not found.")
    assert exited(lambda: main([model, "--spm", spm_path, "--input", src, "--output", src])) == (
        f"--output {src} is the input: give another file.")
    assert exited(lambda: main([model, "--spm", spm_path, "--input", src, "--output", "nowhere/o.txt"])) == (
        "--output nowhere/o.txt: no such folder.")
    assert "the following arguments are required: --spm" in exited(lambda: main([model, "--input", src]))
    (folder / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert exited(lambda: main([model, "--spm", spm_path, "--input", str(folder / "latin1.txt"), "--output",
                                str(folder / "o.txt")])) == (
        f"--input {folder / 'latin1.txt'}: not UTF-8 text (invalid continuation byte at byte 3).")
    (folder / "bad.model").write_bytes(b"not a model")
    try:
        spm.SentencePieceProcessor().Load(str(folder / "bad.model"))
    except (OSError, RuntimeError) as error:
        reason = " ".join(str(error).split())
    assert exited(lambda: run_translate.load_pieces(str(folder / "bad.model"), None)) == (
        f"--spm {folder / 'bad.model'}: not a SentencePiece model ({reason}).")
    assert src == str(folder / "src.txt") and (folder / "src.txt").read_text().startswith(SENTENCES[0])


def test_another_kind_of_file_names_the_command_that_makes_a_translator(command, translator_model):
    run, folder = command
    model, _ = translator_model
    for name in ("generation", "window", "small"):
        (folder / name).mkdir()
    generation = write_translator(folder / "generation", model, kind="prefill_decode")
    assert exited(lambda: run(model_path=generation)) == (
        f"{generation} is not a translator (FILE.json kind 'prefill_decode', made by `keras-posenc export "
        "MODEL --generate`): export the Seq2SeqTransformer with `keras-posenc export MODEL --translate`.")
    window = write_translator(folder / "window", model, kind="window")
    assert "made by `keras-posenc export MODEL`)" in exited(lambda: run(model_path=window))
    with open(str(folder / "de.tflite"), "r+b") as f:
        f.write(b"\x00" * 8)
    assert "not a TFLite file" in exited(run)
    small = write_translator(folder / "small", model, vocab_size=30)
    assert exited(lambda: run(model_path=small)) == (
        f"--spm {folder / 'spm.model'} has 32 pieces, more than the file's vocabulary of 30: give the "
        "spm.model of the run that was exported.")


def test_a_contract_without_the_translator_signatures_is_one_line(command):
    run, folder = command
    path = str(folder / "de.tflite")
    document = contract.document()
    del document["translate_signatures"]
    (folder / "de.tflite.contract.json").write_text(json.dumps(document))
    assert exited(run) == f"{path}: its contract names no encode/decode signatures: export it again."


def test_an_onnx_pair_is_checked_as_onnx_files_not_as_tflite(tmp_path, translator_model):
    model, sp_model = translator_model
    metadata = translate_export(model, source_length=model.max_length, cache_length=9).metadata
    pair = {"encode": "de.encode.onnx", "decode": "de.decode.onnx"}
    records = {}
    for signature, name in pair.items():
        data = f"an ONNX protobuf for {signature}".encode()
        (tmp_path / name).write_bytes(data)
        records[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    path = str(tmp_path / "de.onnx")
    with open(path + ".json", "w") as f:
        json.dump({**metadata, "target": "tensorrt", "signature_files": pair, "files": records}, f)
    with open(path + ".contract.json", "w") as f:
        json.dump(contract.document(), f)
    (tmp_path / "spm.model").write_bytes(sp_model)
    (tmp_path / "src.txt").write_text(SENTENCES[0] + "\n", encoding="utf-8")
    args = run_translate.parse_args([path, "--spm", str(tmp_path / "spm.model"), "--input",
                                     str(tmp_path / "src.txt"), "--output", str(tmp_path / "o.txt")])
    meta, max_new_tokens, alpha = run_translate.open_translator(args)
    assert (sorted(meta.signature_files().values()), max_new_tokens, alpha) == (
        [str(tmp_path / "de.decode.onnx"), str(tmp_path / "de.encode.onnx")], 9, 1.0)


def test_the_runtime_flag_picks_the_runtime_and_fits_the_file(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(run_translate, "open_session", lambda args, meta: seen.append(args.runtime) or "s")
    args = run_translate.argparse.Namespace(model="de.tflite", runtime="tflite-runtime", delegate=None)
    assert run_translate.make_session(args, None) == "s" and seen == ["interpreter"]
    assert args.runtime == "tflite-runtime"  # the caller's arguments are left as they were
    run_translate.make_session(run_translate.argparse.Namespace(model="de.tflite", runtime="litert"), None)
    assert seen[-1] == "litert"
    onnx = run_translate.argparse.Namespace(model="de.onnx", runtime="litert")
    assert exited(lambda: run_translate.check_runtime(onnx)) == (
        "de.onnx is the ONNX pair of --target tensorrt: it runs on onnxruntime (--runtime auto or "
        "onnxruntime), not --runtime litert.")
    for runtime in ("auto", "onnxruntime"):
        run_translate.check_runtime(run_translate.argparse.Namespace(model="de.onnx", runtime=runtime))
    run_translate.check_runtime(run_translate.argparse.Namespace(model="de.tflite", runtime="tflite-runtime"))


def test_a_runtime_that_is_not_installed_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    onnx = run_translate.argparse.Namespace(model="de.onnx", runtime="onnxruntime")
    assert exited(lambda: run_translate.make_session(onnx, None)) == (
        "An .onnx pair needs onnxruntime (onnxruntime-gpu on a Jetson).")
    litert = run_translate.argparse.Namespace(model="de.tflite", runtime="litert", accelerator="cpu",
                                              threads=None, precision="fp32", delegate=None)
    export = kit_contract.Export("de.tflite", contract.document(), {})
    assert exited(lambda: run_translate.make_session(litert, export)) == (
        "--runtime litert: pip install ai-edge-litert")


# --- the output file ----------------------------------------------------------------------------------


def test_a_failed_run_leaves_the_old_output_and_no_temporary_file(command, monkeypatch):
    run, folder = command
    (folder / "hyp.txt").write_text("the old translations\n")
    before = sorted(os.listdir(folder))

    def failing(self, sentences, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_translate.Translator, "translate_group", failing)
    with pytest.raises(KeyboardInterrupt):
        run()
    assert (folder / "hyp.txt").read_text() == "the old translations\n"
    assert sorted(os.listdir(folder)) == before


def test_write_atomically_replaces_whole_files_or_leaves_them(tmp_path, monkeypatch):
    path = str(tmp_path / "hyp.txt")
    run_translate.write_atomically(path, "eins\nzwei\n")
    assert open(path, encoding="utf-8").read() == "eins\nzwei\n" and os.listdir(tmp_path) == ["hyp.txt"]
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask()  # not mkstemp's private 0600
    def full_disk(source, destination):
        raise OSError(28, "No space")

    monkeypatch.setattr(run_translate.os, "replace", full_disk)
    assert exited(lambda: run_translate.write_atomically(path, "drei\n")) == (
        f"--output {path}: cannot write it (No space).")
    assert open(path, encoding="utf-8").read() == "eins\nzwei\n" and os.listdir(tmp_path) == ["hyp.txt"]


def test_the_temporary_file_is_hidden_beside_the_output_and_named_after_it(tmp_path, monkeypatch):
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(run_translate.os, "replace",
                        lambda source, target: replaced.append(source) or real_replace(source, target))
    run_translate.write_atomically(str(tmp_path / "hyp.txt"), "eins\n")
    folder, name = os.path.split(replaced[0])
    assert folder == str(tmp_path) and name.startswith(".hyp.txt.") and name.endswith(".tmp"), replaced


def test_a_folder_that_takes_no_file_is_one_line(tmp_path, monkeypatch):
    def refused(**kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(run_translate.tempfile, "mkstemp", refused)
    path = str(tmp_path / "hyp.txt")
    assert exited(lambda: run_translate.write_atomically(path, "eins\n")) == (
        f"--output {path}: cannot write there (Permission denied).")
    assert os.listdir(tmp_path) == []


def test_input_that_cannot_be_read_is_one_line(tmp_path):
    missing, folder = str(tmp_path / "gone.txt"), str(tmp_path)
    assert exited(lambda: run_translate.read_lines(missing)) == f"--input {missing}: file not found."
    assert exited(lambda: run_translate.read_lines(folder)) == (
        f"--input {folder}: not readable (Is a directory).")


def test_text_is_read_and_written_as_utf8_whatever_the_locale(tmp_path):
    german = "Größe ändern\nÜber\n"
    (tmp_path / "src.txt").write_bytes(german.encode("utf-8"))
    with ascii_locale():
        assert run_translate.read_lines(str(tmp_path / "src.txt")) == ["Größe ändern", "Über"]
        run_translate.write_atomically(str(tmp_path / "hyp.txt"), german)
    assert (tmp_path / "hyp.txt").read_bytes() == german.encode("utf-8")


def umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
