"""The `.litertlm` export: the model in LiteRT-LM's contract, fed the way its engine feeds it, equals Keras.

The engine itself runs in `make test-edge` (tests/edge/edge_litertlm.py); here the file runs on
TensorFlow's interpreter through `litertlm.EngineFeeder` (chunked prefill from `input_pos`, the
held-back last token, zero padding, a second turn), and the bad inputs are refused by name.
"""

import collections
import functools
import os

import numpy as np
import pytest
from litert_stand_in import executable
from stacks import once_on_keras2, once_on_keras3
from tflite_files import assert_same_graph

from keras_posenc import special_ids
from keras_posenc.app import cli
from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import contract, litert_python, litertlm, litertlm_bundle, pipeline
from keras_posenc.export.flatbuffer import TfliteFile, op_counts
from keras_posenc.layers.rope_scaling import ROTARY_SCALINGS
from keras_posenc.models import CausalLM

BASE = {"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 40,
        "dropout": 0.0}
ROPE = {None: {}, "linear": {"scaling_factor": 2.0}, "ntk": {"scaling_factor": 2.0},
        "dynamic": {"scaling_factor": 2.0, "original_length": 16},
        "yarn": {"scaling_factor": 2.0, "original_length": 16},
        "yarn-turns": {"scaling_factor": 2.0, "original_length": 16},
        "longrope": {"scaling_factor": 2.0, "original_length": 16, "short_factor": [1.0, 1.0, 1.2, 1.5],
                     "long_factor": [1.0, 1.5, 2.0, 3.0]},  # one factor per rotated pair (head_dim 8)
        "llama3": {"scaling_factor": 2.0, "original_length": 16}}
POSITIONS = {
    "sinusoidal-full": {"position": "sinusoidal"},
    "sinusoidal-factorized": {"position": "sinusoidal", "table": "factorized"},
    "sinusoidal-interpolated": {"position": "sinusoidal", "table": "interpolated"},
    "learned": {"position": "learned"},
    "alibi": {"position": "alibi"},
    **{f"rope-{scaling or 'plain'}": {"position": "rope", "scaling": scaling, **ROPE[scaling]}
       for scaling in ROTARY_SCALINGS},
}


def save(model, path):
    model.save(path) if is_keras3() else model.save(path, save_format="keras_v3")


def _model(**config):
    keras.utils.set_random_seed(3)
    model = CausalLM({**BASE, **config})
    model.build_on_dummy()
    return model


def test_the_rope_table_covers_every_scaling():
    assert set(ROPE) == set(ROTARY_SCALINGS)


FIRST = [2, 9, 17, 5, 11, 30, 7, 21, 13, 6]  # 9 tokens prefilled in 3 chunks of 4, the 10th decoded
SECOND = [8, 19, 25]
# Kinds whose files differ from another kind's only in constants: the position tables are frozen
# (a gathered table for the table kinds, cos/sin tables for the RoPE scalings), so the converter sees
# the graph of the kind named here. The named kind runs on both stacks; each kind of this table runs
# once (on Keras 3 if in ONCE_ON_KERAS3, else on Keras 2) and checks there that its file has the named
# kind's ops and size.
SAME_GRAPH_AS = {"sinusoidal-factorized": "sinusoidal-full", "sinusoidal-interpolated": "sinusoidal-full",
                 "learned": "sinusoidal-full",
                 **{f"rope-{scaling}": "rope-plain" for scaling in ROTARY_SCALINGS if scaling}}
ONCE_ON_KERAS3 = ("sinusoidal-factorized", "rope-linear", "rope-longrope", "rope-yarn")


@functools.lru_cache(maxsize=None)
def _model_and_keras_turns(name):
    """The model of position kind `name` and its Keras tokens for FIRST, then for SECOND after FIRST's
    answer (the same for the CPU and the GPU file, so made once)."""
    model = _model(**POSITIONS[name])
    keras_first = model.generate(FIRST, 8).ids[0].tolist()
    return model, [keras_first, model.generate(FIRST + keras_first + SECOND, 8).ids[0].tolist()]


@functools.lru_cache(maxsize=None)
def _engine_file(name, target):
    return litertlm.to_litertlm_tflite(_model_and_keras_turns(name)[0], prompt_length=4, cache_length=36,
                                       target=target)


def _kinds(names, same_graph_as, on_keras3=()):
    """`names` as parameters: each kind of `same_graph_as` once, on Keras 3 if in `on_keras3`."""
    def once(name):
        kind = same_graph_as[name]
        stack = once_on_keras3 if name in on_keras3 else once_on_keras2
        return stack(f"its file is {kind}'s graph with other constants (checked here), and {kind} runs "
                     "on both")

    return [pytest.param(name, marks=once(name)) if name in same_graph_as else name for name in names]


def _generates_the_keras_tokens(name, target, same_graph_as):
    flat = _engine_file(name, target)
    if name in same_graph_as:
        assert_same_graph(flat, _engine_file(same_graph_as[name], target))
    turns = _model_and_keras_turns(name)[1]
    assert litertlm.engine_greedy(litertlm.EngineFeeder(flat), [FIRST, SECOND], 8) == turns


@pytest.mark.parametrize("name", _kinds(sorted(POSITIONS), SAME_GRAPH_AS, ONCE_ON_KERAS3))
def test_fed_as_the_engine_feeds_it_every_position_kind_generates_the_keras_tokens(name):
    _generates_the_keras_tokens(name, "cpu", SAME_GRAPH_AS)


GPU_SAME_GRAPH_AS = {"learned": "sinusoidal-factorized", "sinusoidal-full": "sinusoidal-factorized",
                     "rope-llama3": "rope-yarn"}


GPU_KINDS = ["sinusoidal-full", "sinusoidal-factorized", "learned", "alibi", "rope-plain", "rope-yarn",
             "rope-llama3"]


@pytest.mark.parametrize("name", _kinds(GPU_KINDS, GPU_SAME_GRAPH_AS, on_keras3=("learned",)))
def test_the_gpu_file_fed_as_the_engine_feeds_it_generates_the_keras_tokens(name):
    _generates_the_keras_tokens(name, "gpu", GPU_SAME_GRAPH_AS)


def test_the_gpu_file_holds_only_shader_ops_and_no_transpose():
    flat = litertlm.to_litertlm_tflite(_model(position="rope"), prompt_length=4, cache_length=16,
                                       target="gpu")
    ops = set(op_counts(flat))
    assert not ops & {"GATHER", "GATHER_ND", "TRANSPOSE", "SELECT", "SELECT_V2", "EQUAL"}, ops


def test_the_file_is_in_the_engine_contract():
    model = _model(position="rope")
    flat = litertlm.to_litertlm_tflite(model, prompt_length=6, cache_length=20, target="cpu")
    import tensorflow as tf

    interpreter = tf.lite.Interpreter(model_content=flat)
    signatures = interpreter.get_signature_list()
    caches = litertlm.kv_cache_names(2)
    assert caches == ["kv_cache_k_0", "kv_cache_v_0", "kv_cache_k_1", "kv_cache_v_1"]
    assert sorted(signatures["prefill"]["inputs"]) == sorted(["tokens", "input_pos"] + caches)
    assert sorted(signatures["prefill"]["outputs"]) == sorted(caches)  # in place: the same names
    assert sorted(signatures["decode"]["outputs"]) == sorted(["logits"] + caches)
    prefill = interpreter.get_signature_runner("prefill").get_input_details()
    decode = interpreter.get_signature_runner("decode")
    assert list(prefill["tokens"]["shape"]) == [1, 6] and list(prefill["input_pos"]["shape"]) == [6]
    assert list(prefill["kv_cache_k_0"]["shape"]) == [1, 2, 20, 8]  # [1, heads, C, head_dim]
    assert list(decode.get_output_details()["logits"]["shape"]) == [1, 1, 40]


def _signature_ops(flat, key):
    """The op names of one signature's subgraph and how often each occurs."""
    flat = TfliteFile(flat)
    sizes = [len(graph.operators or []) for graph in flat.model.subgraphs]
    [index] = [signature.subgraphIndex for signature in flat.model.signatureDefs
               if signature.signatureKey.decode() == key]
    start = sum(sizes[:index])
    return collections.Counter(op.name for op in flat.operators[start:start + sizes[index]])


def test_the_gpu_prefill_is_one_parallel_step_whose_ops_do_not_grow_with_the_chunk():
    model = _model(position="alibi")  # 2 layers, 2 heads
    flats = {length: litertlm.to_litertlm_tflite(model, prompt_length=length, cache_length=32, target="gpu")
             for length in (8, 16)}
    prefill = {length: _signature_ops(flat, "prefill") for length, flat in flats.items()}
    decode = _signature_ops(flats[8], "decode")
    assert decode == _signature_ops(flats[16], "decode")
    # The prefill returns no logits: the last layer's attention output is pruned, its keys and values
    # are written. Layer 0 repeats the cache's keys and values over the queries: one doubling more for 16.
    assert prefill[16].pop("CONCATENATION") - prefill[8].pop("CONCATENATION") == 2
    assert prefill[8] == prefill[16]
    assert prefill[8]["SOFTMAX"] == 2 and decode["SOFTMAX"] == 2 * 2  # one per head, not per token
    # The written slots (shared by the layers), each layer's key and value writes, layer 0's attention sum.
    assert prefill[8]["AVERAGE_POOL_2D"] == 1 + 2 * 2 + 1 and "AVERAGE_POOL_2D" in decode
    assert not {"FULLY_CONNECTED", "BATCH_MATMUL"} & set(prefill[8])
    assert prefill[8]["CONV_2D"] <= decode["CONV_2D"] + 1


def test_a_gpu_chunk_running_past_the_cache_writes_nothing_there_and_decodes_the_keras_token():
    model = _model(position="rope")
    feeder = litertlm.EngineFeeder(litertlm.to_litertlm_tflite(model, prompt_length=4, cache_length=10,
                                                               target="gpu"))
    ids = [2, 9, 17, 5, 11, 30, 7, 21, 13, 6]  # chunks at 0, 4 and 8: the last one's padding at 9..11
    assert litertlm.engine_greedy(feeder, [ids], 1) == [model.generate(ids, 1).ids[0].tolist()]
    assert feeder.step == 10


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_a_prefill_from_an_offset_leaves_the_earlier_slots_bit_for_bit(target):
    model = _model(position="alibi")
    feeder = litertlm.EngineFeeder(litertlm.to_litertlm_tflite(model, prompt_length=4, cache_length=16,
                                                               target=target))
    feeder.prefill([2, 9, 17, 5, 11, 30])  # slots 0..4 written, 30 held back
    before = {name: value.copy() for name, value in feeder.cache.items()}
    feeder.prefill([7, 21])  # slots 5, 6 (30, 7), 21 held back
    for name, value in feeder.cache.items():
        np.testing.assert_array_equal(value[:, :, :5], before[name][:, :, :5])
        assert np.abs(value[:, :, 5:7]).max() > 0
    assert feeder.step == 7


@pytest.mark.parametrize("kwargs,config,match", [
    ({"prompt_length": 8, "cache_length": 4}, {}, "`prompt_length`=8 exceeds `cache_length`=4"),
    ({"prompt_length": 4, "cache_length": 41}, {}, "max_length=40"),
    ({"prompt_length": 4, "cache_length": 8, "target": "gl"}, {}, r"supports target in \('gpu', 'cpu'\)"),
    ({"prompt_length": 4, "cache_length": 8, "target": "tensorrt"}, {}, "got target='tensorrt'"),
    ({"prompt_length": 4, "cache_length": 8}, {"num_languages": 2}, "num_languages"),
])
def test_bad_bundles_are_rejected(kwargs, config, match):
    model = CausalLM({**BASE, **config})
    model.build_on_dummy()
    with pytest.raises(ValueError, match=match):
        litertlm.to_litertlm_tflite(model, **kwargs)


def test_a_model_without_a_causal_lm_head_is_rejected():
    inputs = keras.Input(shape=(None,), dtype="int32")
    plain = keras.Model(inputs, keras.layers.Embedding(40, 8)(inputs))
    with pytest.raises(ValueError, match="needs a keras_posenc CausalLM, got Functional"):
        litertlm.to_litertlm_tflite(plain, prompt_length=4, cache_length=8, target="cpu")
    unmasked = CausalLM(BASE, causal=False)
    unmasked.build_on_dummy()
    with pytest.raises(ValueError, match="causal=False"):
        litertlm.to_litertlm_tflite(unmasked, prompt_length=4, cache_length=8, target="cpu")


def test_the_feeder_refuses_a_prompt_that_does_not_fit():
    feeder = litertlm.EngineFeeder(litertlm.to_litertlm_tflite(_model(), prompt_length=4, cache_length=8,
                                                               target="cpu"))
    with pytest.raises(ValueError, match="9 tokens do not fit in cache_length=8"):
        feeder.prefill(list(range(5, 14)))


def _spm(tmp_path, corpus, vocab_size=100):
    from keras_posenc.app import dataset as data

    lines = data.read_text_corpus(corpus)
    return data.train_sentencepiece(lines, vocab_size=vocab_size)


def test_a_probe_prompt_that_does_not_fit_is_refused_by_name(tmp_path, corpus):
    sp_model = _spm(tmp_path, corpus)
    with pytest.raises(ValueError, match=r"the probe prompt 'the cat sat on the mat' needs \d+ cache slots"):
        litertlm_bundle.check_probes(sp_model, [["the cat sat on the mat"]], 8, 4)
    litertlm_bundle.check_probes(sp_model, [["the cat"]], 40, 4)  # fits: no error
    with pytest.raises(ValueError, match="a probe session is a list of non-empty prompts"):
        litertlm_bundle.check_probes(sp_model, [[""]], 40, 4)


def test_the_default_probes_include_a_chunked_prefill_and_a_second_turn(tmp_path, corpus):
    sp_model = _spm(tmp_path, corpus)
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    sessions = litertlm_bundle.probe_texts(sp_model, 8, 48, 8)
    lengths = [[1 + len(processor.EncodeAsIds(text)) for text in turns] for turns in sessions]
    assert max(turns[0] for turns in lengths) > 8  # one prompt is prefilled in two chunks
    assert max(len(turns) for turns in sessions) == 2
    litertlm_bundle.check_probes(sp_model, sessions, 48, 8)


def test_without_the_builder_the_bundle_is_refused_with_the_install_line(no_litert_python_variables):
    if litert_python.runtime_python() is not None:
        pytest.skip("litert-lm-builder is importable in this Python")
    with pytest.raises(ValueError, match="litert-lm-builder, which is not installed here: .*pip install "
                                         "litert-lm-api==0.18.1 litert-lm-builder==0.18.1 litert-quantizer"):
        pipeline.export_litertlm(_model(), b"", prompt_length=4, cache_length=8, target="cpu")
    with pytest.raises(ValueError, match="'/no/such/python' is not an executable file"):
        litert_python.runtime_python("/no/such/python")


@pytest.mark.parametrize("variable", ["KERAS_POSENC_LITERT_PYTHON", "KERAS_POSENC_LITERTLM_PYTHON"])
def test_the_litert_python_comes_from_either_variable(no_litert_python_variables, tmp_path, variable):
    python = executable(tmp_path / "python")
    no_litert_python_variables.setenv(variable, python)
    assert litert_python.runtime_python() == python
    assert litert_python.runtime_python("/bin/sh") == "/bin/sh"  # an explicit one first


@pytest.mark.parametrize("flags,match", [
    (["--format", "litertlm"], "--format litertlm is a prefill/decode bundle: add --generate"),
    (["--sequence-length", "8", "--spm", "x.model"], "--spm is for --format litertlm"),
    (["--generate", "--cache-length", "41", "--format", "litertlm", "--target", "cpu"], "max_length=40"),
    (["--generate", "--cache-length", "16", "--format", "litertlm", "--target", "cpu", "--embedding",
      "graph"], "takes no --embedding"),
    (["--generate", "--cache-length", "16", "--format", "litertlm", "--target", "cpu", "--spm", "no.model"],
     "no SentencePiece model at 'no.model'"),
])
def test_the_command_refuses_bad_litertlm_exports_in_one_line(tmp_path, capsys, flags, match):
    path = str(tmp_path / "model.keras")
    save(_model(), path)
    out = str(tmp_path / "gen.litertlm")
    assert cli.main(["export", path, "--out", out] + flags) == 2
    error = capsys.readouterr().err
    assert error.startswith("keras-posenc: error: ") and match in error and "Traceback" not in error
    assert len(error.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]  # nothing written


def test_the_contract_names_the_litertlm_tensors():
    doc = contract.document()
    assert doc["tensors"]["input_pos"] == "input_pos" and doc["files"]["litertlm_suffix"] == ".litertlm"
    assert contract.kv_cache_name("value", 3) == "kv_cache_v_3"


def test_a_near_tie_flip_is_to_a_token_that_adds_text_and_a_finished_turn_ends_there(tmp_path, corpus):
    """Control ids decode to nothing: near the best, they must not stand in for the token a runtime picked."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(_spm(tmp_path, corpus))
    ordinary = range(special_ids.NUM_RESERVED_IDS, processor.GetPieceSize())
    words = {i: processor.DecodeIds([i]) for i in ordinary}
    best, flip = next((a, b) for a in words for b in words if len(words[a]) > 1 and len(words[b]) > 1
                      and not (words[a].startswith(words[b]) or words[b].startswith(words[a])))
    step = np.full(processor.GetPieceSize(), -10.0)
    step[[best, special_ids.PAD_ID, special_ids.EOS_ID, flip]] = [1.0, 0.9, 0.85, 0.8]

    def pick(near_tie, new, text):
        return litertlm_bundle._followed_pick(processor, step, near_tie, new, text)

    assert pick(0.0, [], words[best]) == best
    assert pick(0.25, [], words[flip]) == flip and pick(0.15, [], words[flip]) is None
    assert pick(0.25, [flip], words[flip]) == special_ids.EOS_ID  # the runtime stopped after its turn
    assert pick(0.1, [flip], words[flip]) is None


def test_near_greedy_takes_another_runtime_s_pick_only_at_a_near_tie(tmp_path, corpus):
    """A one-token turn of the second-best token passes when its logit is within `near_tie` of the best."""
    import sentencepiece as spm

    sp_model = _spm(tmp_path, corpus)
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    model = _model(vocab_size=100)
    flat = litertlm.to_litertlm_tflite(model, prompt_length=4, cache_length=36, target="cpu")
    sessions = [["the cat sat"]]
    own = litertlm_bundle.feeder_texts(flat, sp_model, sessions, 6, pad_id=0)
    assert litertlm_bundle.near_greedy(flat, sp_model, sessions, own, 6, pad_id=0, near_tie=0.0)
    assert not litertlm_bundle.near_greedy(flat, sp_model, sessions, [own[0] + ["more"]], 6, pad_id=0)
    logits = []
    ids = [[special_ids.BOS_ID] + processor.EncodeAsIds(sessions[0][0])]
    (best,), = litertlm.engine_greedy(litertlm.EngineFeeder(flat), ids, 1, pad_id=0, logits=logits)
    step = logits[0][0]
    order = [int(i) for i in np.argsort(-step, kind="stable")]
    assert order[0] == best
    text = processor.DecodeIds([best])

    def shown(token):  # what a token adds to a turn's text; control ids add nothing
        return litertlm_bundle._decode(processor, [token])

    def stands_apart(rank):  # neither the best nor a token ranked above it could begin its text
        piece = shown(order[rank])
        return (order[rank] >= special_ids.NUM_RESERVED_IDS and piece
                and not (piece.startswith(text) or text.startswith(piece))
                and not any(shown(above) and piece.startswith(shown(above)) for above in order[1:rank]))

    other = order[next(rank for rank in range(1, len(order)) if stands_apart(rank))]
    margin = step[best] - step[other]

    def near(texts, near_tie):
        return litertlm_bundle.near_greedy(flat, sp_model, sessions, texts, 1, pad_id=0, near_tie=near_tie)

    turn = [[processor.DecodeIds([other])]]
    assert near(turn, margin + 1e-6) and not near(turn, margin - 1e-6)
    assert near([[text]], 0.0) and not near([[text, "a second turn"]], 1e9)
