"""`export_litertlm`'s steps around the bundle's model, each checked without LiteRT-LM and mostly without TF.

LiteRT-LM's builder and engine run in their own Python (`litertlm_runtime.py`); here a stand-in
LiteRT Python (a script) records what it is asked and answers as that script does, so the spec
each step sends, the bundle's bytes and every engine outcome (same text, other text, not
installed, failed, timed out) are matched whole. The greedy checks run on a stand-in bigram
language model: its next-token logits are a table row of the last id, as a `CausalLM` (`generate`)
and as the interpreter class `EngineFeeder` runs, so every token, text and quality number is
known. One tiny real `CausalLM` (a zero head kernel: its logits are the head's bias, a near-tie
between two letters) is exported end to end, converted once per configuration.
tests/test_export_litertlm.py and tests/edge/edge_litertlm.py run real bundles on the engine.
"""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from keras_posenc import special_ids
from keras_posenc.app import dataset as data
from keras_posenc.backend import keras
from keras_posenc.export import contract, generation_export, kinds, litertlm, litertlm_bundle, pipeline
from keras_posenc.export.cost import graph_cost
from keras_posenc.export.litert_python import INSTALL_HINT
from keras_posenc.export.quality import format_generation_quality
from keras_posenc.export.quantization import recipes_of
from keras_posenc.export.targets import TARGETS

BOS, EOS, UNK, SEP = special_ids.BOS_ID, special_ids.EOS_ID, special_ids.UNK_ID, 4
LINES = ["the cat sat on the mat", "a dog ran to the old house by the river", "big red bus"] * 5
VOCAB = 24  # a character model of LINES: the 5 reserved ids, then one piece per character
# the pieces after the reserved ids: ▁ t e a h o r b d s g i n u c l m v y
SPACE, T, E, A, H, O, R, B, D, S, G, I, N, U, C, L, M, V, Y = range(5, VOCAB)  # noqa: E741


@pytest.fixture(scope="module")
def sp_model():
    return data.train_sentencepiece(LINES, vocab_size=VOCAB, model_type="char")


def _processor(sp_model):
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    return processor


def test_the_tokenizer_is_one_piece_per_character(sp_model):
    processor = _processor(sp_model)
    assert [processor.IdToPiece(i) for i in range(5, VOCAB)] == list("▁tea" "horbdsgin" "uclmvy")
    assert processor.IdToPiece(SEP) == "<sep>" and not processor.IsControl(SEP)  # shown by sentencepiece


# The stand-in LiteRT Python ---------------------------------------------------------------------
STAND_IN = """#!{python}
import json, os, sys

here = os.path.dirname(os.path.abspath(sys.argv[0]))
script, command, spec_path = sys.argv[1:]
with open(spec_path) as f:
    spec = json.load(f)
answer_path = os.path.join(here, command + ".json")
answer = {{}}
if os.path.exists(answer_path):
    with open(answer_path) as f:
        answer = json.load(f)
record = {{"script": script, "command": command, "spec": spec, "marker": os.environ.get("STAND_IN_MARKER")}}
if answer.get("exit"):
    result = None
elif command == "pack":
    record["folder"] = sorted(os.listdir(os.path.dirname(spec["out"])))
    with open(spec["tflite"], "rb") as f:
        model = f.read()
    with open(spec["spm"], "rb") as f:
        tokenizer = f.read()
    with open(spec["out"], "wb") as f:
        f.write(b"LITERTLM|" + model + b"|" + tokenizer)
    result = {{"out": spec["out"]}}
elif command == "generate":
    with open(spec["bundle"], "rb") as f:
        record["bundle"] = f.read().decode("latin-1")
    result = {{"turns": answer.get("turns", spec["turns"]),
              "benchmark": [{{"sessions": len(spec["turns"])}}]}}
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\\n")
sys.stderr.write(answer.get("stderr", "stand-in engine: " + command + "\\n"))
if answer.get("exit"):
    sys.exit(answer["exit"])
print("a log line first")
print(json.dumps(result))
"""


def stand_in_python(folder, **answers):
    """A LiteRT Python in `folder` (this interpreter running STAND_IN): `pack` writes `LITERTLM|model|spm`,
    `generate` answers `answers["generate"]["turns"]`, else echoes the turns; a command whose answer has
    `exit` writes its `stderr` and exits so; each call is recorded (`calls`)."""
    for command, answer in answers.items():
        (folder / f"{command}.json").write_text(json.dumps(answer))
    path = folder / "python"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def calls(folder):
    path = folder / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def timeouts(monkeypatch):
    """The `timeout` of each process the test starts (`subprocess.run`, run as it is)."""
    seen, run = [], subprocess.run

    def recording(*args, **kwargs):
        seen.append(kwargs.get("timeout"))
        return run(*args, **kwargs)

    monkeypatch.setattr(subprocess, "run", recording)
    return seen


def _runtime_script(call):
    assert os.path.basename(call["script"]) == "litertlm_runtime.py" and os.path.isfile(call["script"])
    return call["command"]


def test_the_bundle_is_what_the_builder_packs_from_the_model_the_tokenizer_and_the_ids(tmp_path, timeouts):
    python = stand_in_python(tmp_path)
    bundle = litertlm_bundle.pack_bundle(b"MODEL", b"SPM", cache_length=np.int64(48), pad_id=np.int64(7),
                                         activation="fp16", python=python)
    assert bundle == b"LITERTLM|MODEL|SPM"
    [call] = calls(tmp_path)
    assert _runtime_script(call) == "pack"
    folder = os.path.dirname(call["spec"]["out"])
    assert call["spec"] == {"tflite": os.path.join(folder, "model.tflite"),
                            "spm": os.path.join(folder, "spm.model"),
                            "out": os.path.join(folder, "out.litertlm"), "start_id": BOS, "stop_ids": [EOS],
                            "pad_id": 7, "max_num_tokens": 48, "activation": "fp16"}
    assert call["folder"] == ["model.tflite", "spm.model"]  # the builder's inputs, its output not yet
    assert os.path.basename(folder).startswith("keras_posenc_litertlm_") and not os.path.exists(folder)
    litertlm_bundle.pack_bundle(b"M", b"S", cache_length=8, pad_id=0, activation="fp32", python=python,
                                timeout=30)
    assert timeouts == [600, 30]  # ten minutes unless told


def test_a_failing_builder_is_a_runtime_error_with_its_last_lines(tmp_path):
    python = stand_in_python(tmp_path, pack={"exit": 3, "stderr": "one\ntwo\nthree\nfour\n"})
    with pytest.raises(RuntimeError) as error:
        litertlm_bundle.pack_bundle(b"M", b"S", cache_length=8, pad_id=0, activation="fp32", python=python)
    assert str(error.value) == "LiteRT `pack` failed (exit 3): two | three | four"


def test_the_engine_is_asked_for_each_session_with_the_options_and_its_log_comes_back(tmp_path, monkeypatch,
                                                                                       timeouts):
    python = stand_in_python(tmp_path)
    (tmp_path / "b.litertlm").write_bytes(b"BUNDLE")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAND_IN_MARKER", "this process's")
    sessions = [["the cat"], ["a dog", "ran"]]
    texts, benchmarks, log = litertlm_bundle.engine_texts("b.litertlm", sessions, 5, python=python)
    assert (texts, benchmarks, log) == (sessions, [{"sessions": 2}], "stand-in engine: generate\n")
    texts, _, _ = litertlm_bundle.engine_texts("b.litertlm", sessions, 3, backend="gpu", python=python,
                                               benchmark=True, threads=2, timeout=30,
                                               env={"STAND_IN_MARKER": "given"})
    first, second = calls(tmp_path)
    assert _runtime_script(first) == "generate" and first["bundle"] == "BUNDLE"
    path = os.path.join(os.getcwd(), "b.litertlm")  # absolute: the engine's process may run elsewhere
    assert first["spec"] == {"bundle": path, "backend": "cpu", "turns": sessions, "max_new_tokens": 5,
                             "benchmark": False, "threads": None}
    assert second["spec"] == {"bundle": path, "backend": "gpu", "turns": sessions, "max_new_tokens": 3,
                              "benchmark": True, "threads": 2}
    assert [first["marker"], second["marker"]] == ["this process's", "given"]
    assert timeouts == [600, 30]


# A stand-in bigram language model ------------------------------------------------------------------
def bigram_table(best, runner_up=None, margin=0.3, vocab=VOCAB):
    """Next-token logits per last id: `best[id]` at 2.0, `runner_up[id]` `margin` below, the rest 0
    (ids missing from `best` prefer EOS)."""
    table = np.zeros([vocab, vocab], np.float32)
    for last in range(vocab):
        table[last, best.get(last, EOS)] = 2.0
        if runner_up and last in runner_up:
            table[last, runner_up[last]] = 2.0 - margin
    return table


class BigramLM:
    """A stand-in `CausalLM` whose next-token logits are `table[last id]`: `generate` is greedy, never
    picks `pad_id`, and after `stop_id` gives `pad_id` (as `CausalLM.generate`); each prompt is kept."""

    def __init__(self, table, pad_id=0):
        self.table = np.asarray(table, np.float32)
        self.encoder = types.SimpleNamespace(pad_id=pad_id, vocab_size=len(self.table))
        self.prompts = []

    def generate(self, prompt_ids, max_new_tokens, stop_id=None):
        self.prompts.append(list(prompt_ids))
        ids, last = [], prompt_ids[-1]
        for _ in range(max_new_tokens):
            if stop_id is not None and stop_id in ids:
                ids.append(self.encoder.pad_id)
                continue
            logits = self.table[last].astype(np.float64)
            logits[self.encoder.pad_id] = -np.inf
            last = int(np.argmax(logits))
            ids.append(last)
        return types.SimpleNamespace(ids=np.array([ids]))


def interpreter_of(files, sessions=None, prompt_length=4, cache_length=40):
    """The interpreter class of stand-in bundle models: `files[flat]` is a bigram table, run in LiteRT-LM's
    contract (`prefill` writes its chunk, `decode` answers the table's row of the fed id). Each
    interpreter appends `(flat, the ids it was fed in order)` to `sessions`."""

    class Runner:
        def __init__(self, key, owner):
            self.key, self.owner = key, owner

        def get_input_details(self):
            return {litertlm.TOKENS: {"shape": np.array([1, prompt_length])},
                    litertlm.INPUT_POS: {"shape": np.array([prompt_length])},
                    "kv_cache_k_0": {"shape": np.array([1, 1, cache_length, 1])}}

        def __call__(self, tokens, input_pos, kv_cache_k_0):
            cache = np.array(kv_cache_k_0)
            for column, (token, position) in enumerate(zip(tokens[0], input_pos)):
                if column == 0 or position != 0:  # the padding is at position 0
                    cache[0, 0, position, 0] = token
                    self.owner.fed.append(int(token))
            if self.key == "prefill":
                return {"kv_cache_k_0": cache}
            return {litertlm.LOGITS: self.owner.table[int(tokens[0, 0])][None, None], "kv_cache_k_0": cache}

    class Interpreter:
        def __init__(self, model_content):
            self.table, self.fed = files[model_content], []
            if sessions is not None:
                sessions.append((model_content, self.fed))

        def get_signature_runner(self, key):
            return Runner(key, self)

    return Interpreter


# keras_texts, probe_texts, check_probes -----------------------------------------------------------
def test_keras_texts_continue_the_whole_session_and_show_text_and_unknown_pieces(sp_model):
    # the cat -> h e EOS (then padding); a dog, and big -> o n UNK SEP ▁ a
    model = BigramLM(bigram_table({T: H, H: E, E: EOS, G: O, O: N, N: UNK, UNK: SEP, SEP: SPACE, SPACE: A}))
    texts, ids = litertlm_bundle.keras_texts(model, sp_model, [["the cat", "a dog"], ["big"]], 6)
    the_cat = [BOS, SPACE, T, H, E, SPACE, C, A, T]
    assert model.prompts == [the_cat, the_cat + [H, E, EOS] + [SPACE, A, SPACE, D, O, G],
                             [BOS, SPACE, B, I, G]]
    assert ids == [[[H, E, EOS], [O, N, UNK, SEP, SPACE, A]], [[O, N, UNK, SEP, SPACE, A]]]  # cut after EOS
    assert texts == [["he", "on ⁇  a"], ["on ⁇  a"]]  # UNK and ▁ shown, <sep> and EOS not


def _with_t_as_control(sp_model):
    """The tokenizer with its piece "t" (the first ordinary one after "▁") made a control piece."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sp_model)
    proto.pieces[T].type = sentencepiece_model_pb2.ModelProto.SentencePiece.CONTROL
    return proto.SerializeToString()


# The ordinary pieces: t e a h o r b d s g i n u c l m v y ("▁" decodes to nothing), every 7th taken.
@pytest.mark.parametrize("args,expected", [
    ((8, 48, 8), [["tdlh"], ["hiybcagvrue"], ["ntdl", "ntdl"]]),  # room 30: P + 3 = 11 pieces, P / 2 = 4
    ((8, 20, 3), [["tdl"], ["hiybca"], ["ntd", "ntd"]]),  # room 12: 12 / 2 = 6 pieces, 12 / 4 = 3
    ((4, 40, 4), [["td"], ["hiybcag"], ["nt", "nt"]]),  # room 30: 7 pieces, 2
    ((8, 14, 3), [["t"], ["hiy"], ["n", "n"]]),  # room 6: 3 pieces, 1
    ((2, 64, 8), [["t"], ["hiybc"], ["n", "n"]]),  # P = 2: 5 pieces, 1
    ((8, 4, 8), [["t"], ["h"], ["n", "n"]]),  # no room at all: one piece each
])
def test_the_default_probes_are_ordinary_pieces_sized_to_the_cache(sp_model, args, expected):
    assert litertlm_bundle.probe_texts(sp_model, *args) == expected


def test_no_default_probe_is_empty_when_a_prompt_is_one_piece(sp_model):
    # "▁" is the first ordinary id: taken alone it decoded to "" and the export refused its own probe
    for prompt_length in range(1, 10):
        for cache_length in range(4, 40):
            sessions = litertlm_bundle.probe_texts(sp_model, prompt_length, cache_length, 4)
            assert all(turn for turns in sessions for turn in turns), (prompt_length, cache_length, sessions)


@pytest.mark.parametrize("args,expected", [
    ((8, 48, 8), [["esmr"], ["onesmruagvb"], ["uagv", "chiy"]]),  # e a h o r b d s g i n u c l m v y
    ((8, 14, 3), [["e"], ["one"], ["u", "c"]]),
    ((8, 4, 8), [["e"], ["o"], ["u", "c"]]),
])
def test_the_probes_skip_control_pieces_after_the_reserved_ids(sp_model, args, expected):
    assert litertlm_bundle.probe_texts(_with_t_as_control(sp_model), *args) == expected


def test_a_probe_that_does_not_fit_is_refused_by_its_first_prompt(sp_model):
    # BOS + 8 pieces + 2 new = 11 slots; a second turn adds its pieces and 2 more
    litertlm_bundle.check_probes(sp_model, [["the cat"]], 11, 2)  # exactly full: fits
    with pytest.raises(ValueError) as error:
        litertlm_bundle.check_probes(sp_model, [["the cat"]], 10, 2)
    assert str(error.value) == ("the probe prompt 'the cat' needs 11 cache slots (BOS, its pieces and 2 new "
                                "tokens per turn); the bundle has cache_length=10.")
    litertlm_bundle.check_probes(sp_model, [["big"], ["the cat", "a dog"]], 19, 2)
    with pytest.raises(ValueError) as error:
        litertlm_bundle.check_probes(sp_model, [["big"], ["the cat", "a dog"]], 18, 3)
    assert str(error.value) == ("the probe prompt 'the cat' needs 21 cache slots (BOS, its pieces and 3 new "
                                "tokens per turn); the bundle has cache_length=18.")


@pytest.mark.parametrize("session", [[], [""], ["the cat", ""], ["the cat", 7]])
def test_a_probe_session_is_a_list_of_non_empty_prompts(sp_model, session):
    with pytest.raises(ValueError) as error:
        litertlm_bundle.check_probes(sp_model, [["big"], session], 64, 2)
    assert str(error.value) == f"a probe session is a list of non-empty prompts, got {session!r}."


# feeder_texts, near_greedy ------------------------------------------------------------------------
# the cat -> h e EOS (i 0.3 below e); a dog -> o n (UNK 0.3 below n), then SEP (UNK 0.3 below it,
# and the pick where SEP is the pad id), a h
CHAIN = bigram_table({T: H, H: E, E: EOS, G: O, O: N, N: SEP, SEP: A, UNK: A, A: H, I: EOS},
                     runner_up={H: I, O: UNK, N: UNK})


def test_the_feeder_texts_are_the_file_s_greedy_turns_fed_as_the_engine_feeds_them(sp_model):
    sessions = []
    interpreter = interpreter_of({b"chain": CHAIN}, sessions)
    texts = litertlm_bundle.feeder_texts(b"chain", sp_model, [["the cat", "a dog"], ["big"]], 5, 0,
                                         interpreter=interpreter)
    assert texts == [["he", "onah"], ["onah"]]  # SEP shown as nothing; the first turn stops at EOS
    the_cat = [BOS, SPACE, T, H, E, SPACE, C, A, T]
    assert sessions == [(b"chain", the_cat + [H, E, EOS, SPACE, A, SPACE, D, O, G, O, N, SEP, A]),
                        (b"chain", [BOS, SPACE, B, I, G, O, N, SEP, A])]
    spaced = bigram_table({G: O, O: SPACE, SPACE: A})  # big -> o ▁ a EOS
    assert litertlm_bundle.feeder_texts(b"spaced", sp_model, [["big"]], 5, 0,
                                        interpreter=interpreter_of({b"spaced": spaced})) == [["o a"]]
    # SEP as the pad id is never picked: its runner-up UNK, shown
    assert litertlm_bundle.feeder_texts(b"chain", sp_model, [["big"]], 5, SEP, interpreter=interpreter) == [
        ["on ⁇ ah"]]


def _near(sp_model, texts, sessions=(("the cat", "a dog"),), near_tie=0.5, max_new_tokens=5, pad_id=0):
    return litertlm_bundle.near_greedy(b"chain", sp_model, [list(turns) for turns in sessions], texts,
                                       max_new_tokens, pad_id, near_tie=near_tie,
                                       interpreter=interpreter_of({b"chain": CHAIN}))


def test_near_greedy_passes_the_greedy_text_and_flips_only_within_the_near_tie(sp_model):
    assert _near(sp_model, [["he", "onah"]], near_tie=0.0)
    assert _near(sp_model, [["he", "o ⁇ ahe"]], near_tie=0.3)  # UNK 0.3 below n: then a, h, e
    assert not _near(sp_model, [["he", "o ⁇ ahe"]], near_tie=0.29)
    assert _near(sp_model, [["he", "o ⁇ ahe"]])  # ENGINE_NEAR_TIE by default
    assert _near(sp_model, [["hi", "onah"]], near_tie=0.3)  # i 0.3 below e, then EOS
    assert not _near(sp_model, [["hi", "onah"]], near_tie=0.29)
    assert not _near(sp_model, [["h", "onah"]], near_tie=1.0)  # after h, EOS is 2 below e
    assert not _near(sp_model, [["he", "onax"]])
    assert _near(sp_model, [["", "onah"]], sessions=[["the", "a dog"]], near_tie=0.0)  # e: EOS at once


def test_near_greedy_needs_every_session_and_turn(sp_model):
    assert not _near(sp_model, [["he"]])  # a turn missing
    assert not _near(sp_model, [["he", "onah", "onah"]])  # a turn too many
    assert not _near(sp_model, [["he", "onah"], ["onah"]])  # a session too many
    assert _near(sp_model, [["he", "onah"], ["onah"]], sessions=[["the cat", "a dog"], ["big"]])
    assert not _near(sp_model, [["he", "onah"]], sessions=[["the cat", "a dog"], ["big"]])


def test_near_greedy_replays_each_turn_after_the_chosen_ones(sp_model):
    # max 2 tokens: "he" stops without EOS; the second turn after it: o n
    assert _near(sp_model, [["he", "on"]], max_new_tokens=2, near_tie=0.0)
    assert not _near(sp_model, [["he", "o"]], max_new_tokens=2)  # it goes on to n (nothing near EOS)
    assert not _near(sp_model, [["he", "onah"]], max_new_tokens=2)  # 2 tokens make "on" only
    # with SEP the pad id: the second turn's third token is UNK, then a
    assert _near(sp_model, [["he", "on ⁇ ah"]], pad_id=SEP, near_tie=0.0)


def test_a_near_tie_flip_adds_text_and_a_finished_turn_must_end_there(sp_model):
    processor = _processor(sp_model)
    step = np.full(VOCAB, -10.0)
    step[[T, SEP, EOS, A, B]] = [1.0, 0.95, 0.9, 0.8, 0.5]

    def pick(near_tie, new, text):
        return litertlm_bundle._followed_pick(processor, step, near_tie, new, text)

    assert pick(0.0, [], "t") == T and pick(0.0, [H], "ht") == T  # the best, where it keeps to the text
    assert pick(0.2, [], "a") == A and pick(0.19, [], "a") is None  # SEP adds nothing, EOS is no flip
    assert pick(0.5, [], "b") == B and pick(0.5, [H], "hb") == B
    assert pick(0.1, [A], "a") == EOS and pick(0.09, [A], "a") is None  # done: EOS must be near
    step[SEP] = 1.5  # done, EOS not near: the best may add nothing
    assert pick(0.1, [A], "a") == SEP
    step[EOS] = 2.0  # EOS the best: it is never a token of the text
    assert pick(0.0, [], "t") is None and pick(1.0, [], "t") == T


def test_of_near_tokens_that_continue_the_text_the_flip_is_the_highest_then_the_lowest_id():
    processor = _processor(data.train_sentencepiece(LINES, vocab_size=30))  # pieces of several characters
    a, at = processor.PieceToId("a"), processor.PieceToId("at")
    assert at < a
    step = np.full(processor.GetPieceSize(), -10.0)
    step[[EOS, a, at]] = [1.1, 1.0, 0.9]  # EOS the best: it is no token of the text

    def pick(new, text):
        return litertlm_bundle._followed_pick(processor, step, 0.5, new, text)

    assert pick([], "at") == a
    step[at] = 1.0
    assert pick([], "at") == at


# bundle_quality -----------------------------------------------------------------------------------
def test_the_quality_of_a_quantized_file_against_the_float32_one(sp_model):
    float_table = bigram_table({i: (i + 1 - 5) % 19 + 5 for i in range(5, VOCAB)})  # each id: the next one
    quantized = float_table.copy()
    quantized[D, :] = float_table[D] * 0.5  # d -> s still, the rest of its row halved
    quantized[M, M + 1] = 1.0
    quantized[M, A] = 1.5  # m -> a instead of v
    sessions = []
    interpreter = interpreter_of({b"float": float_table, b"quantized": quantized}, sessions, cache_length=14)
    model = BigramLM(float_table)
    quality = litertlm_bundle.bundle_quality(model, b"float", b"quantized", interpreter=interpreter,
                                             max_new_tokens=16)
    # 4 prompts (BOS and 4 ordinary ids), 14 // 2 - 1 = 6 greedy tokens each
    prompts = [[BOS, A, C, R, V], [BOS, G, E, U, O], [BOS, V, S, T, N], [BOS, O, M, D, SPACE]]
    assert [fed[:5] for flat, fed in sessions[1:4]] == [prompts[0]] * 3
    assert [fed[:5] for flat, fed in sessions[1::3]] == prompts
    assert quality == {"prompts": 4, "greedy_tokens": 6, "same_greedy_tokens": False,
                       "generation_agreement": 23 / 24}



def _cross_entropy_terms(table, texts):
    """Per next token of `texts`: -log softmax(table[id])[next id], the row, and the next id."""
    terms = []
    for text in texts:
        for last, following in zip(text[:-1], text[1:]):
            row = table[last].astype(np.float64)
            terms.append((np.log(np.exp(row - row.max()).sum()) + row.max() - row[following], row, following))
    return terms


def test_the_held_out_cross_entropy_is_each_file_s_decode_fed_one_token_a_step():
    float_table = bigram_table({i: (i + 1 - 5) % 19 + 5 for i in range(5, VOCAB)}, margin=1.0,
                               runner_up={i: (i + 2 - 5) % 19 + 5 for i in range(5, VOCAB)})
    quantized = float_table.copy()
    quantized[T, A] = 2.5  # t -> a (float32: e, a 1.0)
    quantized[O] += 0.25
    interpreter = interpreter_of({b"float": float_table, b"quantized": quantized}, cache_length=6)
    rows = [[BOS, T, E, 0, A, H], [BOS, O, 0, 0, 0, 0], [T, O], [BOS], [BOS, T, E, A, H, O, R, B], [D, S]]
    kept = [[BOS, T, E, A, H], [BOS, O], [T, O], [BOS, T, E, A, H, O]]  # padding out, at most C, >1 token
    quality = litertlm_bundle.bundle_quality(BigramLM(float_table), b"float", b"quantized", np.array(
        [row + [0] * (8 - len(row)) for row in rows]), interpreter=interpreter, rows=5)
    float_terms = _cross_entropy_terms(float_table, kept)
    quantized_terms = _cross_entropy_terms(quantized, kept)
    loss_float = np.mean([loss for loss, _, _ in float_terms])
    loss_quantized = np.mean([loss for loss, _, _ in quantized_terms])
    assert quality["rows"] == 4 and quality["tokens"] == 4 + 1 + 1 + 5 == len(float_terms)
    assert quality["loss_float"] == pytest.approx(loss_float, rel=1e-12)
    assert quality["loss_quantized"] == pytest.approx(loss_quantized, rel=1e-12)
    assert quality["loss_increase"] == pytest.approx(loss_quantized / loss_float - 1.0, rel=1e-9)
    assert quality["agreement"] == 8 / 11  # t -> e in float32, a quantized: 3 of the 11 steps
    assert quality["max_abs_diff"] == 1.5  # a after t
    assert set(quality) == {"prompts", "greedy_tokens", "same_greedy_tokens", "generation_agreement", "rows",
                            "tokens", "loss_float", "loss_quantized", "loss_increase", "agreement",
                            "max_abs_diff"}


def test_the_quality_by_default_4_prompts_16_tokens_and_32_held_out_rows():
    table = bigram_table({i: (i + 1 - 5) % 19 + 5 for i in range(5, VOCAB)})
    interpreter = interpreter_of({b"float": table, b"quantized": table}, cache_length=40)
    quality = litertlm_bundle.bundle_quality(BigramLM(table), b"float", b"quantized", [[BOS, T, E]] * 33,
                                             interpreter=interpreter)
    assert [quality[key] for key in ("prompts", "greedy_tokens", "rows", "tokens")] == [4, 16, 32, 64]
    same = [quality[key] for key in ("same_greedy_tokens", "generation_agreement", "agreement")]
    assert same == [True, 1, 1]


def test_the_quality_s_greedy_runs_never_pick_the_model_s_pad_id():
    # every id goes on with the next one, but after r the pad id (SEP here) is best, b 0.5 below it
    table = bigram_table({i: (i + 1 - 5) % 19 + 5 for i in range(5, VOCAB)}, runner_up={R: B}, margin=0.5)
    table[R, SEP] = 2.5
    sessions = []
    interpreter = interpreter_of({b"float": table, b"quantized": table.copy()}, sessions, cache_length=40)
    quality = litertlm_bundle.bundle_quality(BigramLM(table, pad_id=SEP), b"float", b"quantized",
                                             interpreter=interpreter)
    assert (quality["same_greedy_tokens"], quality["generation_agreement"]) == (True, 1.0)
    runs = [fed[5:] for _, fed in sessions[1:]]  # after BOS and the prompt's 4 ids
    assert all(SEP not in run for run in runs) and all(run[run.index(R) + 1] == B for run in runs)


def test_the_quality_prompts_of_a_vocabulary_of_reserved_ids_only():
    table = bigram_table({}, vocab=5)  # every id prefers EOS
    sessions = []
    interpreter = interpreter_of({b"float": table, b"quantized": table}, sessions, cache_length=8)
    quality = litertlm_bundle.bundle_quality(BigramLM(table), b"float", b"quantized", interpreter=interpreter,
                                             prompts=2, max_new_tokens=5)
    assert quality == {"prompts": 2, "greedy_tokens": 3, "same_greedy_tokens": True,  # 8 // 2 - 1 tokens
                       "generation_agreement": 1.0}
    assert [fed for _, fed in sessions[1::3]] == [[BOS, 3, 4, 0, 1, EOS, EOS], [BOS, 0, 1, 2, 3, EOS, EOS]]
    sessions.clear()
    quality = litertlm_bundle.bundle_quality(BigramLM(table), b"float", b"quantized", interpreter=interpreter,
                                             prompts=1, max_new_tokens=0)
    assert quality["greedy_tokens"] == 1 and [fed for _, fed in sessions[1:]] == [[BOS, 3, 4, 0, 1]] * 3


# _emulated_check: the file against Keras, fed as the engine feeds it ----------------------------
@pytest.mark.parametrize("prompt_length,cache_length,check_tokens,prompt,second,tokens", [
    (4, 24, 16, [BOS, O, D, I, C, V, T], [I, M, E], 4),  # P + 3 = 7 ids, then 3; (24 - 16) // 2 tokens
    (4, 30, 3, [BOS, O, D, I, C, V, T], [I, M, E], 3),
    (8, 12, 16, [BOS, O, D, I], [I, M], 1),  # 12 // 3 = 4 ids; (12 - 10) // 2 = 1 token
    (8, 2, 16, [BOS], [I], 1),
])
def test_the_emulated_check_feeds_a_long_prompt_then_a_second_turn(prompt_length, cache_length, check_tokens,
                                                                  prompt, second, tokens):
    table = bigram_table({i: (i + 1 - 5) % 19 + 5 for i in range(5, VOCAB)})
    model, sessions = BigramLM(table), []
    interpreter = interpreter_of({b"same": table}, sessions, prompt_length, 40)
    assert litertlm_bundle._emulated_check(model, b"same", prompt_length, cache_length, check_tokens,
                                           interpreter) == (True, 2 * tokens)
    asked = list(model.prompts)
    first_turn = model.generate(prompt, tokens).ids[0].tolist()
    assert asked == [prompt, prompt + first_turn + second]
    second_turn = model.generate(asked[1], tokens).ids[0].tolist()
    assert [fed for _, fed in sessions] == [(asked[1] + second_turn)[:-1]]  # the last pick is held back


def test_the_emulated_check_never_picks_the_model_s_pad_id():
    # every id goes on with the next one, but after t the pad id (SEP here) is best, e 0.5 below it
    table = bigram_table({i: (i + 1 - 5) % 19 + 5 for i in range(5, VOCAB)})
    table[T, SEP] = 2.5
    sessions = []
    interpreter = interpreter_of({b"same": table}, sessions)
    assert litertlm_bundle._emulated_check(BigramLM(table, pad_id=SEP), b"same", 4, 24, 16, interpreter) == (
        True, 8)
    [(_, fed)] = sessions
    assert SEP not in fed and fed[fed.index(T, 1) + 1] == E


def test_the_emulated_check_of_a_vocabulary_of_reserved_ids_only():
    table = bigram_table({}, vocab=5)
    model, sessions = BigramLM(table), []
    interpreter = interpreter_of({b"same": table}, sessions)
    assert litertlm_bundle._emulated_check(model, b"same", 4, 24, 2, interpreter)
    assert model.prompts[0] == [BOS, 0, 3, 1, 4, 2, 0]


def test_the_emulated_check_fails_a_file_that_generates_other_tokens():
    table = bigram_table({i: (i + 1 - 5) % 19 + 5 for i in range(5, VOCAB)})
    other_first = table.copy()
    other_first[T, E], other_first[T, H] = 0.0, 2.0  # the first turn's last prompt id, t, goes on with h
    other_second = table.copy()
    other_second[A, H], other_second[A, B] = 0.0, 2.0  # the second turn's last id, a
    for other in (other_first, other_second):
        interpreter = interpreter_of({b"other": other}, None, 4, 40)
        checked = litertlm_bundle._emulated_check(BigramLM(table), b"other", 4, 24, 16, interpreter)
        assert checked == (False, 8)


# _engine_check: LiteRT-LM's engine against the expected texts -------------------------------------
ENGINE_LINE = ("LiteRT-LM Engine (cpu) greedy text over 2 sessions, 3 turns (a prompt longer than the "
               "prefill, a second turn): ")


def _engine_check(sp_model, folder, target="cpu", env=None, **kwargs):
    model = BigramLM(CHAIN)
    python = stand_in_python(folder, **kwargs.pop("answers", {}))
    return litertlm_bundle._engine_check(model, sp_model, b"BUNDLE", [["the cat", "a dog"], ["big"]], 5,
                                         TARGETS[target], python, env, **kwargs)


def test_the_engine_s_text_is_compared_with_keras_by_default(sp_model, tmp_path):
    check = _engine_check(sp_model, tmp_path, answers={"generate": {"turns": [["he", "onah"], ["onah"]]}})
    texts = [["he", "onah"], ["onah"]]
    assert check == {"same_text": True, "texts": texts, "keras": texts,
                     "line": ENGINE_LINE + "same text as CausalLM.generate"}
    [call] = calls(tmp_path)
    assert call["bundle"] == "BUNDLE" and os.path.basename(call["spec"]["bundle"]) == "check.litertlm"
    folder = os.path.dirname(call["spec"]["bundle"])
    assert os.path.basename(folder).startswith("keras_posenc_litertlm_") and not os.path.exists(folder)
    assert call["spec"]["backend"] == "cpu" and call["spec"]["max_new_tokens"] == 5
    assert call["spec"]["turns"] == [["the cat", "a dog"], ["big"]]


def test_another_engine_text_differs_unless_it_is_near_greedy(sp_model, tmp_path):
    other = {"generate": {"turns": [["he", "o ⁇ ahe"], ["onah"]]}}
    check = _engine_check(sp_model, tmp_path, answers=other)
    assert (check["same_text"], check["line"]) == (False, ENGINE_LINE + "TEXT DIFFERS from CausalLM.generate")
    asked = []

    def near(texts, answer):
        asked.append(texts)
        return answer

    expected = [["he", "onah"], ["onah"]]
    check = _engine_check(sp_model, tmp_path, answers=other, expected=expected, near=lambda t: near(t, False))
    assert check == {"same_text": False, "texts": [["he", "o ⁇ ahe"], ["onah"]], "keras": expected,
                     "line": ENGINE_LINE + "TEXT DIFFERS from its model on LiteRT's interpreter"}
    check = _engine_check(sp_model, tmp_path, answers=other, expected=expected, near=lambda t: near(t, True))
    assert (check["same_text"], check["line"]) == (True, ENGINE_LINE + "same text as its model on LiteRT's "
                                                   "interpreter through near-ties (best logits within 0.5)")
    assert asked == [[["he", "o ⁇ ahe"], ["onah"]]] * 2
    check = _engine_check(sp_model, tmp_path, answers={"generate": {"turns": expected}}, expected=expected,
                          near=lambda t: near(t, True))
    assert (check["same_text"], check["line"]) == (True, ENGINE_LINE + "same text as its model on LiteRT's "
                                                   "interpreter")
    assert len(asked) == 2  # the same text: no near-tie search


def test_an_engine_that_is_not_installed_is_said_so(sp_model, tmp_path):
    stderr = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'litert_lm'\n"
    check = _engine_check(sp_model, tmp_path, answers={"generate": {"exit": 1, "stderr": stderr}})
    assert check == {"same_text": None, "texts": None, "keras": [["he", "onah"], ["onah"]],
                     "line": f"LiteRT-LM Engine: engine not installed: {INSTALL_HINT}"}


def test_an_engine_that_fails_or_hangs_fails_the_check_with_why(sp_model, tmp_path, monkeypatch):
    check = _engine_check(sp_model, tmp_path, "gpu", answers={"generate": {"exit": 2, "stderr": "no GPU\n"}})
    assert check == {"same_text": False, "texts": None, "keras": [["he", "onah"], ["onah"]],
                     "line": "LiteRT-LM Engine (gpu): FAILED to run the bundle: LiteRT `generate` failed "
                             "(exit 2): no GPU"}
    assert calls(tmp_path)[0]["spec"]["backend"] == "gpu"

    def hangs(command, **kwargs):
        raise subprocess.TimeoutExpired("engine", kwargs["timeout"])

    monkeypatch.setattr(subprocess, "run", hangs)
    check = _engine_check(sp_model, tmp_path)
    assert (check["same_text"], check["texts"], check["line"]) == (
        False, None, "LiteRT-LM Engine (cpu): FAILED to run the bundle: Command 'engine' timed out after 600 "
                     "seconds")


def test_the_engine_runs_in_the_given_environment(sp_model, tmp_path, monkeypatch):
    monkeypatch.setenv("STAND_IN_MARKER", "this process's")
    _engine_check(sp_model, tmp_path)
    _engine_check(sp_model, tmp_path, env={"STAND_IN_MARKER": "the engine's"})
    assert [call["marker"] for call in calls(tmp_path)] == ["this process's", "the engine's"]


# export_litertlm end to end on a tiny CausalLM -----------------------------------------------------
PROMPT, CACHE, NEW = 4, 24, 3


@pytest.fixture(scope="module")
def lm():
    """A built `CausalLM` over the tokenizer's ids whose logits are its head's bias (a zero kernel): a,
    then b 0.2 below (a near-tie), the rest far below."""
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(3)
    model = CausalLM({"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": VOCAB,
                      "max_length": 64, "dropout": 0.0})
    model.build_on_dummy()
    kernel, _ = model.head.get_weights()
    bias = np.full(VOCAB, -4.0, np.float32)
    bias[A], bias[B] = 1.0, 0.8
    model.head.set_weights([np.zeros_like(kernel), bias])
    return model


@pytest.fixture(scope="module")
def conversions():
    return {}


@pytest.fixture
def converted_once(monkeypatch, conversions):
    """`to_litertlm_tflite` converting each model, precision and options once per module (the file is the
    same; the LiteRT Python is read by LiteRT Quantizer's int4 only, which is not kept)."""
    convert = litertlm.to_litertlm_tflite

    def once(model, *, quantize=None, litert_python=None, **options):
        key = (model, quantize, tuple(sorted(options.items())))
        if key not in conversions:
            conversions[key] = convert(model, quantize=quantize, litert_python=litert_python, **options)
        return conversions[key]

    monkeypatch.setattr(litertlm, "to_litertlm_tflite", once)
    return once


def _costs(flat):
    return [graph_cost(flat, signature=key)["multiply_adds"] for key in contract.SIGNATURES]


def test_a_float32_bundle_is_packed_checked_and_described(lm, sp_model, tmp_path, converted_once):
    probes = litertlm_bundle.probe_texts(sp_model, PROMPT, CACHE, NEW)
    keras, _ = litertlm_bundle.keras_texts(lm, sp_model, probes, NEW)
    assert keras == [["aaa"]] * 2 + [["aaa", "aaa"]]
    python = stand_in_python(tmp_path, generate={"turns": keras})
    result = pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE,
                                      max_new_tokens=NEW, python=python, check_tokens=2,
                                             engine_env={"STAND_IN_MARKER": "engine env"}, target="cpu")
    flat = converted_once(lm, prompt_length=PROMPT, cache_length=CACHE, target="cpu")
    assert (result.target, result.quantize, result.embedding, result.kind) == ("cpu", None, "graph",
                                                                                kinds.LITERTLM)
    assert result.model_paths("out.litertlm") == ["out.litertlm"]
    assert result.models == (b"LITERTLM|" + flat + b"|" + sp_model,)
    pack, generate = calls(tmp_path)
    assert pack["spec"]["activation"] == "fp32" and pack["spec"]["max_num_tokens"] == CACHE
    assert pack["spec"]["pad_id"] == 0 and generate["marker"] == "engine env"
    assert generate["spec"]["turns"] == probes and generate["spec"]["max_new_tokens"] == NEW
    prefill, decode = _costs(flat)
    metadata = generation_export.generator_metadata(lm, prompt_length=PROMPT, cache_length=CACHE,
                                                    target="cpu")
    assert result.metadata == {**metadata, "format": "litertlm", "max_num_tokens": CACHE,
                               "embedding": "graph", "input_dtype": "int32", "quantize": None,
                               "prefill_multiply_adds": prefill, "decode_multiply_adds": decode}
    # the emulated check: 7 ids, then 2 + 2 tokens
    assert result.report == {"same_tokens": True, "parity": 0.0, "tokens_checked": 4, "verdicts": {},
                             "engine_same_text": True,
                             "engine": {"same_text": True, "texts": keras, "keras": keras, "line": (
                                 "LiteRT-LM Engine (cpu) greedy text over 3 sessions, 4 turns (a prompt "
                                 "longer than the prefill, a second turn): same text as CausalLM.generate")}}
    assert result.lines == [
        f"Multiply-adds: prefill of 4 tokens {prefill:,}, one decode step {decode:,}; cache "
        f"{metadata['cache_bytes']:,} bytes",
        "Greedy parity, fed as LiteRT-LM feeds it (chunked prefill, second turn), 4 tokens: same tokens as "
        "CausalLM.generate",
        result.report["engine"]["line"]]
    assert result.description == ("LiteRT-LM bundle, target cpu: prefill [1, 4], decode [1, 1], "
                                  "max_num_tokens 24")
    assert result.failures() == []


def _only_the_recipe_s_interpreter(monkeypatch):
    """`interpreter_for` as the recipe's interpreter class (TensorFlow's, as for every recipe that runs in
    this process), recording `(recipe, python)` of each; any other interpreter refuses to run."""
    import contextlib

    import tensorflow as tf

    opened, interpreter = [], tf.lite.Interpreter

    @contextlib.contextmanager
    def interpreter_for(recipe, litert_python=None):
        opened.append((recipe, litert_python))
        yield interpreter

    def refused(*args, **kwargs):
        raise AssertionError("a file of the recipe ran in another interpreter")

    monkeypatch.setattr(litertlm_bundle, "interpreter_for", interpreter_for)
    monkeypatch.setattr(tf.lite, "Interpreter", refused)
    return opened


def test_a_float16_bundle_is_checked_against_its_own_model_through_near_ties(lm, sp_model, tmp_path,
                                                                            converted_once, monkeypatch):
    probes = [["the cat", "a dog"]]
    python = stand_in_python(tmp_path, generate={"turns": [["aba", "aab"]]})  # b 0.2 below a: near-ties
    flat = converted_once(lm, quantize="float16", prompt_length=PROMPT, cache_length=CACHE, target="cpu")
    assert litertlm_bundle.feeder_texts(flat, sp_model, probes, NEW, 0) == [["aaa", "aaa"]]
    eval_ids = [[BOS, A, A, B, A, 0], [BOS, B, A, A, 0, 0]]
    float_flat = converted_once(lm, prompt_length=PROMPT, cache_length=CACHE, target="cpu")
    recipe = recipes_of("cpu", "litertlm")["float16"]
    with monkeypatch.context() as patched:
        opened = _only_the_recipe_s_interpreter(patched)
        result = pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE,
                                          probes=probes, max_new_tokens=NEW, python=python,
                                                 check_tokens=2, activation="fp16", quantize="float16",
                                                 eval_token_ids=eval_ids, max_loss_increase=0.03,
                                                 target="cpu")
    assert opened == [(recipe, python)] * 2  # the checks, then the near-tie search: each file ran in it
    assert result.models == (b"LITERTLM|" + flat + b"|" + sp_model,) and result.quantize == "float16"
    assert calls(tmp_path)[0]["spec"]["activation"] == "fp16"
    quality = litertlm_bundle.bundle_quality(lm, float_flat, flat, eval_ids)
    assert quality["rows"] == 2 and quality["same_greedy_tokens"] is True
    engine = {"same_text": True, "texts": [["aba", "aab"]], "keras": [["aaa", "aaa"]],
              "line": "LiteRT-LM Engine (cpu) greedy text over 1 sessions, 2 turns (a prompt longer than the "
                      "prefill, a second turn): same text as its model on LiteRT's interpreter through "
                      "near-ties (best logits within 0.5)"}
    assert result.report == {"same_tokens": True, "parity": 0.0, "tokens_checked": 4, "verdicts": {},
                             "engine_same_text": True, "engine": engine, "quality": quality,
                             "max_loss_increase": 0.03}
    prefill, decode = _costs(flat)
    metadata = generation_export.generator_metadata(lm, prompt_length=PROMPT, cache_length=CACHE,
                                                    target="cpu")
    assert result.metadata == {**metadata, "format": "litertlm", "max_num_tokens": CACHE,
                               "embedding": "graph", "input_dtype": "int32", "quantize": "float16",
                               "prefill_multiply_adds": prefill, "decode_multiply_adds": decode,
                               "quantization": recipe.describe(), "quality": quality}
    assert result.lines[0] == (f"Quantized by {recipe.tool}: {recipe.weights}; the model is {len(flat):,} "
                               "bytes of the bundle")
    assert result.lines[3:] == [engine["line"], format_generation_quality(quality, 0.03)]
    assert result.description == ("LiteRT-LM bundle, target cpu: prefill [1, 4], decode [1, 1], "
                                  "max_num_tokens 24, float16 weights")


def test_a_bundle_s_model_generating_other_tokens_fails_the_emulated_check(lm, sp_model, tmp_path,
                                                                            converted_once, monkeypatch):
    # the file generates a a a; Keras, here, b b b
    monkeypatch.setattr(lm, "generate",
                        lambda prompt, n, **kwargs: types.SimpleNamespace(ids=np.array([[B] * n])))
    # the engine's text: the file's near-ties (b 0.2 below a), which pass for quantized bundles only
    python = stand_in_python(tmp_path, generate={"turns": [["abababab"]]})
    # by default 8 new tokens a turn and 16 checked a turn (a cache of 56 has room for them); on gpu
    result = pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=56,
                                             target="gpu", probes=[["big"]], python=python)
    flat = converted_once(lm, prompt_length=PROMPT, cache_length=56, target="gpu")  # the shader graphs
    assert result.models == (b"LITERTLM|" + flat + b"|" + sp_model,) and result.target == "gpu"
    pack, generate = calls(tmp_path)
    assert (pack["spec"]["activation"], generate["spec"]["backend"], generate["spec"]["max_new_tokens"]) == (
        "fp16", "gpu", 8)  # the gpu backend's default float16 activations
    assert (result.report["same_tokens"], result.report["parity"], result.report["engine_same_text"]) == (
        False, 1.0, False)
    assert result.lines[1:] == [
        "Greedy parity, fed as LiteRT-LM feeds it (chunked prefill, second turn), 32 tokens: TOKENS DIFFER "
        "from CausalLM.generate",
        "LiteRT-LM Engine (gpu) greedy text over 1 sessions, 1 turns (a prompt longer than the prefill, a "
        "second turn): TEXT DIFFERS from CausalLM.generate"]


def test_an_int4_bundle_is_quantized_in_the_litert_python(lm, sp_model, tmp_path, converted_once,
                                                          no_litert_python_variables):
    python = stand_in_python(tmp_path, quantize={"exit": 3, "stderr": "stand-in quantizer\n"})
    with pytest.raises(RuntimeError) as error:
        pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE, probes=[["big"]],
                                 max_new_tokens=NEW, python=python, quantize="int4", target="cpu")
    assert str(error.value) == "LiteRT `quantize` failed (exit 3): stand-in quantizer"
    [call] = calls(tmp_path)
    assert os.path.basename(call["script"]) == "litert_runtime.py" and call["command"] == "quantize"


# export_litertlm's refusals, before any conversion -------------------------------------------------
@pytest.fixture
def no_conversion(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("converted")

    monkeypatch.setattr(litertlm, "to_litertlm_tflite", refused)


@pytest.mark.parametrize("value", [-0.01, float("nan")])
def test_a_negative_loss_limit_is_refused(lm, sp_model, tmp_path, no_conversion, value):
    with pytest.raises(ValueError) as error:
        pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE,
                                 python=stand_in_python(tmp_path), max_loss_increase=value, target="cpu")
    assert str(error.value) == f"`max_loss_increase` must be >= 0, got max_loss_increase={value!r}."


def test_a_gpu_int8_bundle_is_checked_by_the_litert_python_s_interpreter(lm, sp_model, tmp_path,
                                                                         no_conversion,
                                                                         no_litert_python_variables):
    monkeypatch = no_litert_python_variables
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)  # LiteRT 2.x's interpreter: not here
    monkeypatch.setitem(sys.modules, "litert_quantizer", None)
    with pytest.raises(ValueError) as error:  # the recipe is accepted with the given Python: on to the probes
        pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE, target="gpu",
                                        quantize="int8", probes=[["the cat sat on the mat"]],
                                        max_new_tokens=8, python=stand_in_python(tmp_path))
    assert str(error.value).startswith("the probe prompt 'the cat sat on the mat' needs 32 cache slots")


def test_an_int4_gpu_bundle_is_refused_by_its_litertlm_recipe(lm, sp_model, tmp_path, no_conversion):
    with pytest.raises(ValueError) as error:  # int4 gpu window files exist; int4 gpu bundles do not
        pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE,
                                 target="gpu", quantize="int4", probes=[["the cat sat on the mat"]],
                                        max_new_tokens=8, python=stand_in_python(tmp_path))
    assert str(error.value) == ("--quantize int4 is refused for target='gpu': LiteRT Quantizer's int4 "
                                "weights break the shader prefill/decode graph's constant matrices (prefill "
                                "logits of 1e7 on LiteRT 2.3): use --quantize int8.")


def test_a_probe_that_does_not_fit_is_refused_before_the_conversion(lm, sp_model, tmp_path, no_conversion):
    with pytest.raises(ValueError) as error:  # a zero loss limit is a limit
        pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE,
                                 max_new_tokens=12, probes=[["the cat sat"]],
                                        python=stand_in_python(tmp_path), max_loss_increase=0.0, target="cpu")
    assert str(error.value) == ("the probe prompt 'the cat sat' needs 25 cache slots (BOS, its pieces and 12 "
                                "new tokens per turn); the bundle has cache_length=24.")


def test_without_the_builder_the_bundle_is_refused_with_the_install_line(lm, sp_model, no_conversion,
                                                                         no_litert_python_variables):
    monkeypatch = no_litert_python_variables
    monkeypatch.setitem(sys.modules, "litert_lm_builder", None)  # not importable here
    with pytest.raises(ValueError) as error:
        pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE, target="cpu")
    assert str(error.value) == ("a .litertlm bundle is built with litert-lm-builder, which is not installed "
                                f"here: {INSTALL_HINT}.")


def test_a_target_without_a_litertlm_backend_is_refused_first(lm, sp_model, no_conversion):
    """Before the LiteRT Python is looked for (a missing one is not what is wrong)."""
    with pytest.raises(ValueError) as error:
        pipeline.export_litertlm(lm, sp_model, prompt_length=PROMPT, cache_length=CACHE, target="gl",
                                 python="/no/such/python")
    assert str(error.value) == "A .litertlm bundle supports target in ('gpu', 'cpu'), got target='gl'."
