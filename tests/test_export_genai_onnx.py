"""`--format genai`'s decoder ONNX on onnxruntime's CPU provider, fed as onnxruntime-genai feeds it.

`to_genai_onnx`'s contract (names, dtypes, dims), `GenaiFeeder` and `feeder_turns` against the Keras
model's own full forward passes (a chunked prompt, decode steps, a second turn), the pad id never
picked, the cache's bound, and `build_genai`'s folder and report. A tiny random model, so the file
runs in seconds; tests/edge/edge_genai.py runs trained folders on onnxruntime-genai itself.
"""

import json

import numpy as np
import onnx
import onnxruntime
import pytest

from keras_posenc import special_ids
from keras_posenc.app.dataset import train_sentencepiece
from keras_posenc.export import genai, generator
from keras_posenc.export.conversion import ONNX_OPSET
from keras_posenc.export.kinds import GENAI
from keras_posenc.models import CausalLM

CONFIG = {"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 24}
CACHE = 16
HEAD_DIM = CONFIG["d_model"] // CONFIG["num_heads"]
TOLERANCE = 1e-4  # float32 ONNX kernels against Keras's, on logits of about 1


def _model(seed, bias=None):
    model = CausalLM(dict(CONFIG))
    model.build_on_dummy()
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    if bias is not None:
        model.head.bias.assign(bias)
    return model


@pytest.fixture(scope="module")
def model():
    return _model(0)


@pytest.fixture(scope="module")
def proto(model):
    return genai.to_genai_onnx(model, cache_length=CACHE)


def _keras_logits(model, ids):
    """The full forward pass's logits at every position, float64."""
    return np.asarray(model(np.array([ids], np.int32)), np.float64)[0]


def _greedy(logits, pad_id=special_ids.PAD_ID):
    logits = np.array(logits, np.float64)
    logits[pad_id] = -np.inf
    return int(np.argmax(logits))


def _dims(value):
    return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("chunk_size", [0, 1, 3, 4, 7, 20])
def test_chunked_prompts_and_decode_steps_give_the_full_passes_logits(model, proto, chunk_size):
    prompt = [special_ids.BOS_ID, 7, 12, 5, 30, 21, 9]
    feeder = genai.GenaiFeeder(proto, chunk_size)
    feeder.append(prompt)
    sequence = list(prompt)
    for _ in range(5):
        expected = _keras_logits(model, sequence)[-1]
        assert feeder.length == len(sequence)
        np.testing.assert_allclose(np.delete(feeder.logits, special_ids.PAD_ID),
                                   np.delete(expected, special_ids.PAD_ID), atol=TOLERANCE, rtol=0)
        token = feeder.step()
        assert token == _greedy(expected)
        feeder.append([token])
        sequence.append(token)


def test_the_decoder_has_onnxruntime_genais_names_dtypes_and_dims(proto):
    graph = onnx.load_from_string(proto)
    cache = [1, CONFIG["num_heads"], CACHE, HEAD_DIM]
    caches = [(i, kind) for i in range(CONFIG["num_layers"]) for kind in ("key", "value")]
    inputs = {value.name: (value.type.tensor_type.elem_type, _dims(value)) for value in graph.graph.input}
    outputs = {value.name: (value.type.tensor_type.elem_type, _dims(value)) for value in graph.graph.output}
    int64, float32 = onnx.TensorProto.INT64, onnx.TensorProto.FLOAT
    assert inputs == {"input_ids": (int64, [1, "sequence_length"]),
                      "attention_mask": (int64, [1, "total_sequence_length"]),
                      "position_ids": (int64, [1, "sequence_length"]),
                      **{f"past_key_values.{i}.{kind}": (float32, cache) for i, kind in caches}}
    assert [value.name for value in graph.graph.input][:3] == ["input_ids", "attention_mask", "position_ids"]
    assert outputs == {"logits": (float32, [1, "sequence_length", CONFIG["vocab_size"]]),
                       **{f"present.{i}.{kind}": (float32, cache) for i, kind in caches}}
    assert [value.name for value in graph.graph.output] == ["logits"] + [
        f"present.{i}.{kind}" for i, kind in caches]
    assert list(graph.graph.value_info) == []
    assert [opset.version for opset in graph.opset_import if opset.domain in ("", "ai.onnx")] == [ONNX_OPSET]


def test_the_pad_id_has_the_lowest_float32_logit_in_the_file(model, proto):
    session = onnxruntime.InferenceSession(proto, providers=["CPUExecutionProvider"])
    ids = [special_ids.BOS_ID, 5, 9, 11]
    feeds = {"input_ids": np.array([ids], np.int64), "position_ids": np.arange(4, dtype=np.int64)[None],
             "attention_mask": np.ones([1, 4], np.int64),
             **{i.name: np.zeros(i.shape, np.float32) for i in session.get_inputs()[3:]}}
    logits = session.run(["logits"], feeds)[0][0]
    expected = _keras_logits(model, ids)
    assert np.all(logits[:, special_ids.PAD_ID] == np.finfo(np.float32).min)
    others = [i for i in range(CONFIG["vocab_size"]) if i != special_ids.PAD_ID]
    np.testing.assert_allclose(logits[:, others], expected[:, others], atol=TOLERANCE, rtol=0)


def test_only_the_first_append_is_fed_in_chunks(proto, monkeypatch):
    feeder = genai.GenaiFeeder(proto, 3)
    calls = []
    run = feeder._run
    monkeypatch.setattr(feeder, "_run", lambda ids: calls.append(list(ids)) or run(ids))
    feeder.append(np.array([2, 7, 12, 5, 30, 21, 9]))
    feeder.append([4, 8, 15, 16])
    assert calls == [[2, 7, 12], [5, 30, 21], [9], [4, 8, 15, 16]]
    assert feeder.length == 11


def test_the_feeder_starts_from_zero_caches_at_slot_0(proto):
    feeder = genai.GenaiFeeder(proto, 4)
    assert (feeder.length, feeder.logits, feeder.cache_length, feeder.chunk_size) == (0, None, CACHE, 4)
    assert sorted(feeder.cache) == sorted(f"past_key_values.{i}.{kind}" for i in range(CONFIG["num_layers"])
                                          for kind in ("key", "value"))
    for value in feeder.cache.values():
        assert value.shape == (1, CONFIG["num_heads"], CACHE, HEAD_DIM) and value.dtype == np.float32
        assert not value.any()


def test_more_tokens_than_the_cache_holds_are_refused_by_count(proto):
    feeder = genai.GenaiFeeder(proto, 0)
    feeder.append([2] + [5] * 14)
    feeder.append([6])
    with pytest.raises(ValueError) as error:
        feeder.append([7])
    assert str(error.value) == f"17 tokens do not fit in cache_length={CACHE}."
    assert feeder.length == CACHE


def _reference_turns(model, turns, max_new_tokens):
    """Greedy ids of each turn from full forward passes over the whole conversation."""
    sequence, generated = [], []
    for ids in turns:
        sequence += list(ids)
        new = []
        while len(new) < max_new_tokens:
            new.append(_greedy(_keras_logits(model, sequence)[-1]))
            sequence.append(new[-1])
            if new[-1] == special_ids.EOS_ID:
                break
        generated.append(new)
    return generated


def test_a_second_turn_continues_the_conversation_as_full_passes_do(model, proto):
    turns = [[special_ids.BOS_ID, 7, 12, 5, 30], [21, 9, 14]]
    got = genai.feeder_turns(proto, 2, turns, 4)
    assert got == _reference_turns(model, turns, 4)
    assert [len(new) for new in got] == [4, 4]


def test_feeder_turns_feeds_the_first_turn_in_chunks_of_the_size_given(proto, monkeypatch):
    sizes = []
    run = genai.GenaiFeeder._run
    monkeypatch.setattr(genai.GenaiFeeder, "_run", lambda self, ids: sizes.append(len(ids)) or run(self, ids))
    genai.feeder_turns(proto, 3, [[special_ids.BOS_ID, 7, 12, 5, 30], [21, 9]], 2)
    # 5 prompt ids in chunks of 3; a step; the step's pick with the next turn's 2 ids at once; a step
    assert sizes == [3, 2, 1, 3, 1]


def test_eos_ends_a_turn_and_is_kept_and_pad_is_never_picked():
    bias = np.zeros([CONFIG["vocab_size"]], np.float32)
    bias[special_ids.PAD_ID], bias[special_ids.EOS_ID] = 1e4, 1e3  # pad first, then EOS, whatever the input
    eos_model = _model(1, bias)
    proto = genai.to_genai_onnx(eos_model, cache_length=CACHE)
    turns = [[special_ids.BOS_ID, 7, 12], [21, 9]]
    assert genai.feeder_turns(proto, 2, turns, 4) == [[special_ids.EOS_ID], [special_ids.EOS_ID]]
    # the feeder's own pad id is never picked either (EOS here: the next best after the file's pad)
    feeder = genai.GenaiFeeder(proto, 0, pad_id=special_ids.EOS_ID)
    feeder.append(turns[0])
    assert feeder.logits[special_ids.PAD_ID] == np.finfo(np.float32).min  # the lowest float, not -inf
    assert feeder.step() == _greedy(feeder.logits, special_ids.EOS_ID) not in (special_ids.EOS_ID,
                                                                               special_ids.PAD_ID)
    # and feeder_turns hands its pad id on: without EOS, each turn runs to max_new_tokens
    generated = genai.feeder_turns(proto, 2, turns, 3, pad_id=special_ids.EOS_ID)
    assert [len(new) for new in generated] == [3, 3] and special_ids.EOS_ID not in sum(generated, [])


def test_a_bad_opset_or_cache_length_is_refused_by_name(model):
    with pytest.raises(ValueError) as error:
        genai.to_genai_onnx(model, cache_length=CACHE, opset=ONNX_OPSET - 1)
    assert str(error.value) == f"`opset` must be >= {ONNX_OPSET}, got opset={ONNX_OPSET - 1}."
    with pytest.raises(ValueError, match=r"`cache_length`=25 exceeds the model's max_length=24"):
        genai.to_genai_onnx(model, cache_length=25)
    # the lower bound: one slot (a prompt of one token, nothing generated after it)
    one_slot = onnx.load_from_string(genai.to_genai_onnx(model, cache_length=1))
    assert {_dims(value)[2] for value in one_slot.graph.input if value.name.startswith("past_")} == {1}


# build_genai ------------------------------------------------------------------------------------
SENTENCES = ["the cat sat on the mat", "the dog sat on the log", "a bird flew over the house",
             "the old house stood near the river", "a small dog ran"]


@pytest.fixture(scope="module")
def sp_model():
    return train_sentencepiece(SENTENCES * 8, 32)  # a vocabulary inside the model's 40


def _build(model, sp_model, **settings):
    arguments = {"target": None, "precision": None, "sp_model": sp_model, "cache_length": CACHE,
                 "prompt_length": 4, "max_new_tokens": 3}
    return genai.build_genai(model, **{**arguments, **settings})


def test_build_genai_writes_the_four_files_checked_token_for_token(model, sp_model):
    probes = [["the cat"], ["a", "the"]]
    built = _build(model, sp_model, probes=probes, check_texts=["the river"])
    assert built.names == genai.FILES == ("model.onnx", "genai_config.json", "tokenizer.json",
                                          "tokenizer_config.json")
    files = dict(zip(built.names, built.models))
    assert json.loads(files["genai_config.json"]) == genai.genai_config(model, cache_length=CACHE,
                                                                         prompt_length=4)
    tokenizer_json, tokenizer_config = genai.tokenizer_files(sp_model, cache_length=CACHE)
    assert files["tokenizer.json"].decode() == tokenizer_json
    assert json.loads(files["tokenizer_config.json"]) == tokenizer_config
    assert tokenizer_config["model_max_length"] == CACHE
    feeder = genai.GenaiFeeder(files["model.onnx"], 4)
    feeder.append([special_ids.BOS_ID, 5, 9])
    np.testing.assert_allclose(np.delete(feeder.logits, 0), np.delete(_keras_logits(model, [2, 5, 9])[-1], 0),
                               atol=TOLERANCE, rtol=0)

    sessions = built.report["sessions"]
    assert sessions["decoder"] == sessions["keras"] and len(sessions["keras"]) == 2
    assert [len(session) for session in sessions["keras"]] == [1, 2]
    tokens = sum(len(new) for session in sessions["keras"] for new in session)
    assert {key: value for key, value in built.report.items() if key != "sessions"} == {
        "same_tokens": True, "parity": 0.0, "tokens_checked": tokens, "tokenizer_texts": 4,
        "tokenizer_same_ids": True}
    cache_bytes = generator.cache_bytes(model, CACHE)
    assert built.lines == [
        f"Decoder: input_ids [1, S], cache {CACHE} slots = {cache_bytes:,} bytes, prefill chunks of 4",
        f"Greedy ids fed as onnxruntime-genai feeds the folder, 2 sessions, 3 turns (a prompt longer than a "
        f"chunk, a second turn), {tokens} tokens: same ids as CausalLM.generate",
        "tokenizer.json on 4 texts: SentencePiece's ids"]
    assert built.description == ("onnxruntime-genai folder: decoder with a dynamic chunk, max_length 16, "
                                 "chunk_size 4")
    assert (built.target, built.quantize, built.embedding, built.kind, built.metadata) == (
        None, None, "graph", GENAI, {})


def test_build_genai_reports_ids_that_differ(model, sp_model, monkeypatch):
    monkeypatch.setattr(genai, "feeder_turns", lambda *args: [[0]])
    processor = genai._sentencepiece(sp_model)
    monkeypatch.setattr(genai, "_sentencepiece", lambda _: _Shifted(processor))
    built = _build(model, sp_model, probes=[["the cat"]])
    assert (built.report["same_tokens"], built.report["parity"], built.report["tokenizer_same_ids"]) == (
        False, 1.0, False)
    assert built.report["sessions"]["decoder"] == [[[0]]]
    assert built.lines[1].endswith(" tokens: IDS DIFFER from CausalLM.generate")
    assert built.lines[2] == "tokenizer.json on 1 texts: IDS DIFFER from SentencePiece's"


class _Shifted:
    def __init__(self, processor):
        self.processor = processor

    def EncodeAsIds(self, text):  # noqa: N802 (SentencePiece's name)
        return [i + 1 for i in self.processor.EncodeAsIds(text)]


def test_the_default_probes_are_litertlms(model, sp_model):
    built = _build(model, sp_model)
    from keras_posenc.export import litertlm_bundle

    probes = litertlm_bundle.probe_texts(sp_model, 4, CACHE, 3)
    assert [len(s) for s in built.report["sessions"]["keras"]] == [len(turns) for turns in probes]
    assert built.report["tokenizer_texts"] == sum(len(turns) for turns in probes)
    assert built.report["same_tokens"] and built.report["tokenizer_same_ids"]


@pytest.mark.parametrize("settings, message", [
    ({"precision": "int8"}, "An onnxruntime-genai folder has float32 weights: `quantize` must be None, got "
                            "quantize='int8'."),
    ({"max_new_tokens": 0}, "`max_new_tokens` must be >= 1, got max_new_tokens=0."),
    ({"prompt_length": 17}, None),
    ({"probes": [["the cat sat on the mat the dog sat on the log a bird flew"]]}, None),
])
def test_build_genai_refuses_before_converting(model, sp_model, settings, message, monkeypatch):
    monkeypatch.setattr(genai, "to_genai_onnx", lambda *args, **kwargs: pytest.fail("converted"))
    with pytest.raises(ValueError) as error:
        _build(model, sp_model, **settings)
    if message is not None:
        assert str(error.value) == message


def test_build_genai_feeds_the_turns_in_chunks_as_onnxruntime_genai_does(sp_model, monkeypatch):
    """The first turn with BOS, later ones without, the prefill chunk and the model's pad id."""
    padded = CausalLM({**CONFIG, "pad_id": 1})
    padded.build_on_dummy()
    bias = np.zeros([CONFIG["vocab_size"]], np.float32)
    bias[32:] = -1e4  # the tokenizer's 32 pieces only
    padded.head.bias.assign(bias)
    seen = []
    feeder_turns = genai.feeder_turns

    def spy(proto, chunk_size, turns, max_new_tokens, pad_id="left out"):
        seen.append((chunk_size, turns, max_new_tokens, pad_id))
        return feeder_turns(proto, chunk_size, turns, max_new_tokens, 1)

    monkeypatch.setattr(genai, "feeder_turns", spy)
    _build(padded, sp_model, probes=[["the", "a"]], prompt_length=3, max_new_tokens=2, opset=18)
    processor = genai._sentencepiece(sp_model)
    first, second = processor.EncodeAsIds("the"), processor.EncodeAsIds("a")
    assert seen == [(3, [[special_ids.BOS_ID] + first, second], 2, 1)]


def test_build_genai_converts_with_the_opset_given_and_writes_indented_json(model, sp_model):
    built = _build(model, sp_model, probes=[["the cat"]], opset=18)
    files = dict(zip(built.names, built.models))
    graph = onnx.load_from_string(files["model.onnx"])
    assert [opset.version for opset in graph.opset_import if opset.domain in ("", "ai.onnx")] == [18]
    config = genai.genai_config(model, cache_length=CACHE, prompt_length=4)
    _, tokenizer_config = genai.tokenizer_files(sp_model, cache_length=CACHE)
    assert files["genai_config.json"] == json.dumps(config, indent=1).encode()
    assert files["tokenizer_config.json"] == json.dumps(tokenizer_config, indent=1).encode()


def test_build_genai_generates_8_tokens_a_turn_by_default(sp_model):
    bias = np.zeros([CONFIG["vocab_size"]], np.float32)
    bias[special_ids.EOS_ID] = -1e4  # never ends early
    arguments = {"target": None, "precision": None, "sp_model": sp_model, "cache_length": 24,
                 "prompt_length": 4, "probes": [["the cat"]]}
    built = genai.build_genai(_model(2, bias), **arguments)
    assert [len(new) for new in built.report["sessions"]["keras"][0]] == [8]
    assert built.report["tokens_checked"] == 8 and built.report["same_tokens"]
