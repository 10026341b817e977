"""The translator export (`export_translation`): encode + cached decode files that translate as Keras does.

A tiny `Seq2SeqTransformer` per position kind is exported for `cpu`, `gpu` and `gl` (TensorFlow's
interpreter; `gpu` and `gl` of shader-only ops, `gl` one file per signature) and `tensorrt` (the
ONNX pair, onnxruntime);
the package's own search over the files (`translator.translate_with`) must give `translate`'s ids,
greedy and with beams, for sources of every length up to the file's, and the logits must equal the
model's teacher-forced ones.
"""

import json
import os

import numpy as np
import onnx
import pytest
import tensorflow as tf
from stacks import once_on_keras2

from keras_posenc.backend import keras
from keras_posenc.export import contract, kinds, pipeline, translation_export, translator
from keras_posenc.export.conversion import ONNX_OPSET
from keras_posenc.export.flatbuffer import op_counts
from keras_posenc.export.result import ExportResult
from keras_posenc.export.runners import TranslatorSession
from keras_posenc.export.targets import ONNX, TARGETS, TFLITE
from keras_posenc.models import CausalLM
from keras_posenc.seq2seq import Seq2SeqTransformer

SOURCE_LENGTH, CACHE_LENGTH, VOCAB = 10, 12, 48


def _model(**options):
    """A tiny translator with sharp distributions (its head scaled up), so that greedy and beams pick
    real tokens and some sentences end early."""
    keras.utils.set_random_seed(3)  # the same weights in every run
    model = Seq2SeqTransformer(num_layers=2, d_model=16, num_heads=2, dff=32, vocab_size=VOCAB, max_length=16,
                               dropout=0.0, **options)
    model.build_on_dummy()
    if model.head is not None:
        model.head.kernel.assign(np.asarray(model.head.kernel) * 8.0)
        bias = np.asarray(model.head.bias).copy()
        bias[model.eos_id] -= 4.0  # translations of a few tokens, not the empty one
        model.head.bias.assign(bias)
    return model


def _sources(model, count=4, seed=0):
    rng = np.random.default_rng(seed)
    lengths = [1, 4, SOURCE_LENGTH - 1, 6][:count]
    return [list(map(int, rng.integers(5, VOCAB, n))) + [model.eos_id] for n in lengths]


# Each target with RoPE (the default) and one other position kind: the cpu file runs the model's own
# step, the gpu and gl files the shader graphs, which handle additive and ALiBi positions themselves.
CASES = [("cpu", {}), ("cpu", {"position": "alibi"}), ("gpu", {}), ("gpu", {"position": "sinusoidal"}),
         ("gl", {}), ("gl", {"position": "alibi"})]


@pytest.fixture(scope="module", params=CASES, ids=[f"{t}-{o.get('position', 'rope')}" for t, o in CASES])
def case(request):
    """`(model, (encode, decode) flatbuffers)`: one file twice, or `gl`'s pair."""
    target, options = request.param
    model = _model(**options)
    flat = translator.to_tflite_translator(model, source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH,
                                           target=target)
    return model, (flat if isinstance(flat, tuple) else (flat, flat))


@pytest.mark.parametrize("beam_size", [1, pytest.param(3, marks=once_on_keras2(
    "the beam search over the file is NumPy (translate_with); translate's beams run on both stacks in "
    "test_seq2seq.py, and Keras 3 checks this file's greedy ids, logits and decode_beams"))])
def test_the_tflite_file_translates_as_translate(case, beam_size):
    model, files = case
    session = TranslatorSession(files, TFLITE)
    lengths = []
    for row in _sources(model):
        keras_ids = model.translate(np.array([row]), CACHE_LENGTH - 1, beam_size=beam_size).ids[0].tolist()
        file_ids = translator.translate_with(session, row, bos_id=model.bos_id, eos_id=model.eos_id,
                                             pad_id=model.pad_id, max_new_tokens=CACHE_LENGTH - 1,
                                             beam_size=beam_size).ids[0].tolist()
        assert file_ids == keras_ids
        lengths.append(len(keras_ids))
    assert max(lengths) > 0  # real translations, not the empty one


def test_the_files_logits_are_the_models_teacher_forced_logits(case):
    model, files = case
    session = TranslatorSession(files, TFLITE)
    same, parity, tokens = translation_export.check_parity(model, session, _sources(model), CACHE_LENGTH - 1)
    assert same and parity < 1e-4 and tokens >= 4


def test_a_file_has_no_decode_beams_unless_asked_for(case):
    _, files = case
    signatures = [set(tf.lite.Interpreter(model_content=flat).get_signature_list()) for flat in set(files)]
    assert set().union(*signatures) == {"encode", "decode"}


def test_the_encoder_outputs_mark_the_real_source_tokens(case):
    model, files = case
    session = TranslatorSession(files, TFLITE)
    row = np.full([1, SOURCE_LENGTH], model.pad_id, np.int32)
    row[0, :3] = [7, 8, model.eos_id]
    outputs = session.run(translator.ENCODE, {contract.TENSORS["source_ids"]: row})
    assert outputs[contract.TENSORS["source_mask"]].tolist() == [[1.0] * 3 + [0.0] * (SOURCE_LENGTH - 3)]
    encoded, _ = model.encode(row)
    keys, values = model.cross_key_values(encoded)[1]
    # At the real tokens (the padding's rows are masked wherever they are read).
    for kind, expected in (("key", keys), ("value", values)):
        np.testing.assert_allclose(outputs[contract.cross_name(kind, 1)][:, :3], np.asarray(expected)[:, :3],
                                   atol=1e-5)


def test_the_onnx_pair_translates_as_translate():
    model = _model()
    protos = translator.to_onnx_translator(model, source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH)
    assert len(protos) == 2  # encode, decode: no decode_beams unless asked for
    for proto in protos:
        opsets = [o.version for o in onnx.load_from_string(proto).opset_import if o.domain in ("", "ai.onnx")]
        assert opsets == [ONNX_OPSET]
    session = TranslatorSession(protos, ONNX)
    for beam_size in (1, 2):
        for row in _sources(model, seed=1):
            keras_ids = model.translate(np.array([row]), 8, beam_size=beam_size).ids[0].tolist()
            assert translator.translate_with(session, row, bos_id=model.bos_id, eos_id=model.eos_id,
                                             pad_id=model.pad_id, max_new_tokens=8,
                                             beam_size=beam_size).ids[0].tolist() == keras_ids


@pytest.fixture(scope="module")
def exported():
    """`exported(target)`: `(_model(), pipeline.export_translation of it)` with the target's default
    beam rows, made once per target for the tests of this module that read it."""
    results = {}

    def export(target):
        if target not in results:
            model = _model()
            results[target] = model, pipeline.export_translation(model, source_length=SOURCE_LENGTH,
                                                                  cache_length=CACHE_LENGTH, target=target)
        return results[target]

    return export


@pytest.mark.parametrize("target, suffix, signature_files, beam_rows", [
    ("cpu", ".tflite", {"encode": "de.tflite", "decode": "de.tflite", "decode_beams": "de.tflite"}, 4),
    ("gl", ".tflite", {"encode": "de.encode.tflite", "decode": "de.decode.tflite"}, 0),
    ("tensorrt", ".onnx", {"encode": "de.encode.onnx", "decode": "de.decode.onnx",
                           "decode_beams": "de.decode_beams.onnx"}, 4),
])
def test_the_saved_files_and_what_the_kit_reads(exported, tmp_path, target, suffix, signature_files,
                                                beam_rows):
    names = list(dict.fromkeys(signature_files.values()))
    model, result = exported(target)
    assert result.kind is kinds.TRANSLATE and result.failures() == []
    assert result.report["same_tokens"] and result.parity < 1e-4
    out = str(tmp_path / ("de" + suffix))
    paths = result.save(out)
    beside = ["de" + suffix + ".json", "de" + suffix + ".contract.json"]
    assert [os.path.basename(p) for p in paths] == names + beside
    metadata = json.loads((tmp_path / ("de" + suffix + ".json")).read_text())
    head_dim = 16 // 2
    assert metadata["kind"] == "translate" and metadata["target"] == target
    assert metadata["signature_files"] == signature_files and metadata["beam_rows"] == beam_rows
    assert metadata["cache_shape"] == [1, CACHE_LENGTH, 2, head_dim]
    assert metadata["cross_shape"] == [1, SOURCE_LENGTH, 2, head_dim]
    assert metadata["cache_bytes"] == 2 * 2 * CACHE_LENGTH * 16 * 4
    assert (metadata["bos_id"], metadata["eos_id"], metadata["pad_id"]) == (model.bos_id, model.eos_id,
                                                                            model.pad_id)
    assert metadata["length_penalty"] == 1.0 and metadata["source_length"] == SOURCE_LENGTH
    assert set(metadata["files"]) == set(names)


@pytest.mark.parametrize("target, precision", [
    ("cpu", "float16"),
    pytest.param("gl", "float16", marks=once_on_keras2("the converter's float16 weights over the gl pair, "
                                                       "which Keras 3's gl case converts")),
    pytest.param("tensorrt", "int8", marks=once_on_keras2("onnxruntime's quantizer over the ONNX pair, which "
                                                          "Keras 3's test of the pair converts"))])
def test_a_quantized_file_is_scored_against_float32(target, precision, monkeypatch):
    """Scored in BLEU against the float32 file; the ONNX int8 files calibrated, each on its own
    signature's float32 runs."""
    model = _model()
    seen, calibrated = [], []

    def score(translations):
        seen.append(translations)
        return {"bleu": 30.0 - len(seen), "chrf": 50.0}

    quantize_onnx = translator.quantize_onnx

    def recorded(proto, recipe, calibration=()):
        names = sorted(i.name for i in onnx.load_from_string(proto).graph.input)
        calibrated.append((names, [sorted(feeds) for feeds in calibration]))
        return quantize_onnx(proto, recipe, calibration)

    monkeypatch.setattr(translator, "quantize_onnx", recorded)
    check_sources, quality_sources = _sources(model, count=2), _sources(model, count=3)
    result = pipeline.export_translation(model, source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH,
                                         target=target, quantize=precision, score=score,
                                         beam_rows=0 if target == "gl" else 2,
                                         check_sources=check_sources, quality_sources=quality_sources)
    if target == "tensorrt":
        assert len(result.models) == len(calibrated) == 3  # encode, decode, decode_beams
        for proto, (names, feeds) in zip(result.models, calibrated):
            ops = {node.op_type for node in onnx.load_from_string(proto).graph.node}
            assert {"QuantizeLinear", "DequantizeLinear"} <= ops
            assert feeds and all(fed == names for fed in feeds)  # each file's own inputs, real runs
        assert len(calibrated[0][1]) == 2 * len(check_sources)  # a greedy and a beam search each
    else:
        assert calibrated == []
        # float16 weights, each dequantized once, in every file (gl: encode and decode)
        assert len(result.models) == (2 if target == "gl" else 1)
        assert all(op_counts(flat).get("DEQUANTIZE", 0) > 0 for flat in result.models)
    quality = result.report["quality"]
    assert len(seen) == 2 and all(len(translations) == 3 for translations in seen)
    assert quality["bleu_float"] == 29.0 and quality["bleu_quantized"] == 28.0 and quality["bleu_drop"] == 1.0
    assert quality["sentences"] == 3 and 0.0 <= quality["generation_agreement"] <= 1.0
    assert result.failures() == []  # a drop of exactly the limit passes
    assert any(line.startswith("Quality against float32 (3 sentences") and "BLEU 29.00 -> 28.00" in line
               for line in result.lines)
    assert result.metadata["quantization"]["precision"] == precision


@pytest.mark.parametrize("drop, failed", [(0.99, False), (1.0, False), (1.01, True)])
def test_the_bleu_gate_at_its_boundary(drop, failed):
    quality = {"bleu_float": 20.0, "bleu_quantized": 20.0 - drop, "bleu_drop": drop,
               "generation_agreement": 1.0}
    report = {"same_tokens": True, "parity": 0.0, "quality": quality, "max_bleu_drop": 1.0}
    result = ExportResult("cpu", "int8", "graph", (b"",), report, [], {}, kind=kinds.TRANSLATE)
    lines = result.failures()
    assert bool(lines) is failed
    if failed:
        assert lines == [f"FAILED: the quantized translator loses {drop:.2f} BLEU against float32's "
                         f"(20.00 -> {20.0 - drop:.2f}), over the limit 1."]


@pytest.mark.parametrize("call, message", [
    (lambda m: translation_export.check_translation(CausalLM({"num_layers": 1, "d_model": 8, "num_heads": 2,
                                                              "dff": 16, "vocab_size": 20, "max_length": 8}),
                                                     4, 4, "cpu"),
     "A translator export (--translate) needs a keras_posenc Seq2SeqTransformer"),
    (lambda m: translation_export.check_translation(m, 4, 4, "npu"),
     "A translator export supports target in ('cpu', 'gpu', 'gl', 'tensorrt'), got target='npu'."),
    (lambda m: translation_export.check_translation(m, 4, 4, 3),
     "A translator export supports target in ('cpu', 'gpu', 'gl', 'tensorrt'), got target=3."),
    (lambda m: translation_export.check_translation(m, 17, 4, "cpu"),
     "`source_length` must be an int in [2, max_length=16], got source_length=17."),
    (lambda m: translation_export.check_translation(m, 16, 1, "cpu"),
     "`cache_length` must be an int in [2, max_length=16], got cache_length=1."),
    (lambda m: pipeline.export_translation(m, source_length=4, cache_length=6, target="cpu",
                                           max_new_tokens=7),
     "`max_new_tokens` must be an int in [1, 6] (the cache length and the model's max_length - 1), got "
     "max_new_tokens=7."),
    (lambda m: pipeline.export_translation(m, source_length=4, cache_length=6, target="cpu", quantize="int4"),
     "int4"),
])
def test_refusals_name_the_argument_and_value(call, message):
    model = _model()
    with pytest.raises(ValueError) as error:
        call(model)
    assert message in str(error.value)


def test_the_gpu_targets_refuse_positions_past_float16s_integers():
    model = Seq2SeqTransformer(num_layers=1, d_model=8, num_heads=2, dff=16, vocab_size=20, max_length=2050)
    assert translation_export.check_translation(model, 2048, 2048, "gl").name == "gl"
    with pytest.raises(ValueError, match=r"target='gpu' takes `cache_length` up to 2048 \(the GPU compares "
                                         r"positions as float16 integers\), got cache_length=2049\."):
        translation_export.check_translation(model, 8, 2049, "gpu")
    assert translation_export.check_translation(model, 2049, 2049, "cpu").name == "cpu"


def test_the_boundary_lengths_export():
    model = _model()
    assert translation_export.check_translation(model, 16, 16, "cpu").name == "cpu"
    assert translation_export.check_translation(model, 2, 2, "tensorrt").name == "tensorrt"
    for name in translation_export.TRANSLATOR_TARGETS:  # a Target as well as its name
        assert translation_export.check_translation(model, 4, 4, TARGETS[name]) is TARGETS[name]


@pytest.mark.parametrize("target, backends, dtype", [("gpu", ("webgpu", "opencl"), "int32"),
                                                     ("gl", ("gl", "webgpu"), "float32")])
def test_the_gpu_files_run_every_op_on_their_gpu_backends_and_read_ids_past_2048(target, backends, dtype):
    model = Seq2SeqTransformer(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=2300, max_length=16,
                               dropout=0.0)
    model.build_on_dummy()
    result = pipeline.export_translation(model, source_length=8, cache_length=8, target=target,
                                         check_sources=[[2200, 2299, 7, model.eos_id], [2100, model.eos_id]])
    assert [result.report["verdicts"][backend] for backend in backends] == [[], []]
    assert result.failures(require_gpu=True) == [] and result.report["same_tokens"]
    assert result.metadata["input_dtype"] == dtype and result.metadata["accelerators"][0] == "gpu"
    ops = set().union(*(op_counts(flat) for flat in result.models))
    # No lookup and no cache write by index; BATCH_MATMUL only where the target's GPU runs it.
    refused = {"GATHER", "EMBEDDING_LOOKUP", "DYNAMIC_UPDATE_SLICE"}
    if target == "gl":
        refused.add("BATCH_MATMUL")
    assert not ops & refused, ops


@pytest.mark.parametrize("index", [0, 5, CACHE_LENGTH - 1])
def test_write_by_update_slice_writes_the_chunk_and_keeps_every_other_slot(index):
    rng = np.random.default_rng(index)
    cache = rng.normal(size=[3, CACHE_LENGTH, 2, 4]).astype(np.float32)
    chunk = rng.normal(size=[3, 1, 2, 4]).astype(np.float32)
    written = translator.write_by_update_slice(tf.constant(cache), tf.constant(chunk), tf.constant(index))
    expected = cache.copy()
    expected[:, index] = chunk[:, 0]
    np.testing.assert_array_equal(written.numpy(), expected)


def test_the_cpu_decode_writes_by_update_slice_what_the_one_hot_product_writes(exported):
    """The cpu file's decode step (one DYNAMIC_UPDATE_SLICE per layer, kind and decode signature; no
    one-hot write) computes the layer's one-hot step bit for bit; `tensorrt` keeps the one-hot write."""
    model, result = exported("cpu")
    clone = translator.float32_clone(model, CACHE_LENGTH)
    rng = np.random.default_rng(0)
    signatures = [translator.TranslatorSignatures(clone, SOURCE_LENGTH, CACHE_LENGTH, write_cache=write)
                  for write in (None, translator.write_by_update_slice)]
    feeds = [tf.constant([[7], [9]], tf.int32), tf.constant([4], tf.int32)]
    for spec in signatures[0].decode_signature(rows=2)[2:]:
        feeds.append(tf.constant(rng.normal(size=spec.shape).astype(np.float32)))
    feeds[-1] = tf.constant((rng.random(feeds[-1].shape) < 0.7).astype(np.float32))
    one_hot, update_slice = (module.decode_function(rows=2)(*feeds) for module in signatures)
    assert sorted(one_hot) == sorted(update_slice)
    for name in one_hot:
        np.testing.assert_array_equal(update_slice[name].numpy(), one_hot[name].numpy(), err_msg=name)
    (flat,) = result.models
    ops = op_counts(flat)
    assert ops["DYNAMIC_UPDATE_SLICE"] == 2 * model.num_layers * 2 and "ONE_HOT" not in ops, ops
    assert sorted(tf.lite.Interpreter(model_content=flat).get_signature_list()) == [
        "decode", "decode_beams", "encode"]


@pytest.mark.parametrize("target", ["cpu", "tensorrt"])
def test_decode_beams_steps_a_beam_in_one_call_and_gives_translates_ids(exported, target, tmp_path):
    model, result = exported(target)
    rows = translation_export.DEFAULT_BEAM_ROWS
    assert result.report["same_beam_tokens"] is True and result.failures() == []
    assert result.metadata["beam_rows"] == rows and len(result.models) == (3 if target == "tensorrt" else 1)
    files = result.models if target == "tensorrt" else result.models * 3
    session = TranslatorSession(files, ONNX if target == "tensorrt" else TFLITE)
    assert session.beam_rows == rows
    calls = []
    run = session.run
    session.run = lambda signature, feeds: calls.append(signature) or run(signature, feeds)
    lengths = []
    for beam_size in (2, rows, rows + 1):  # padded rows, full rows, more beams than rows (one decode each)
        for row in _sources(model, seed=2):
            keras_ids = model.translate(np.array([row]), 10, beam_size=beam_size).ids[0].tolist()
            assert translator.translate_with(session, row, bos_id=model.bos_id, eos_id=model.eos_id,
                                             pad_id=model.pad_id, max_new_tokens=10,
                                             beam_size=beam_size).ids[0].tolist() == keras_ids
            lengths.append(len(keras_ids))
    assert max(lengths) > 0 and contract.BEAM_SIGNATURE in calls
    out = str(tmp_path / ("de" + (".onnx" if target == "tensorrt" else ".tflite")))
    result.save(out)
    named = json.loads(open(out + ".json").read())["signature_files"]
    assert set(named) == {"encode", "decode", "decode_beams"}
    if target == "tensorrt":
        assert named["decode_beams"] == "de.decode_beams.onnx"


def test_the_gpu_targets_have_no_decode_beams_by_default_and_refuse_one():
    model = _model()
    target = translation_export.target_of("gl")
    assert translation_export.beam_rows_of(target, None) == 0
    assert translation_export.beam_rows_of(translation_export.target_of("cpu"), None) == 4
    with pytest.raises(ValueError, match=r"`beam_rows` is for the cpu and tensorrt targets .*got beam_rows=2 "
                                         r"with target='gl'\."):
        translation_export.beam_rows_of(target, 2)
    for bad in (1, -1, True, 2.0):
        with pytest.raises(ValueError, match=r"`beam_rows` must be 0 \(no decode_beams\) or an int >= 2"):
            translation_export.beam_rows_of(translation_export.target_of("cpu"), bad)
    assert model is not None
