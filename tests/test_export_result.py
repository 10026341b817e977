"""ExportResult without a conversion: its pass/fail rule at the boundaries, its files and its lines.

Every export (window, prefill/decode, .litertlm) ends in `ExportResult.failures()` (the CLI's exit
status) and `ExportResult.save()` (what a user gets on disk), so both are checked here on results
built by hand, with the exact messages and the bytes written.
"""

import hashlib
import json
import os

import numpy as np
import pytest

from keras_posenc.export import contract, kinds
from keras_posenc.export.result import EXPORT_TOLERANCE, MIN_GENERATION_AGREEMENT, Built, ExportResult


def _result(report=None, *, target="cpu", quantize=None, embedding="graph", models=(b"TFL3-model",),
            lines=(), metadata=None, host_table=None, kind=kinds.WINDOW, description="held", names=()):
    return ExportResult(target=target, quantize=quantize, embedding=embedding, models=tuple(models),
                        report=dict(report or {"parity": 0.0}), lines=list(lines),
                        metadata=dict(metadata or {"target": target}), description=description,
                        host_table=host_table, kind=kind, names=names)


def test_the_documented_tolerances_and_agreement():
    assert EXPORT_TOLERANCE == {None: 1e-4, "float16": 2e-2, "int8": None, "int4": None}
    assert MIN_GENERATION_AGREEMENT == 0.95


@pytest.mark.parametrize("quantize, parity, passes", [
    (None, 1e-4, True), (None, 1.0001e-4, False),
    ("float16", 2e-2, True), ("float16", 2.0001e-2, False), ("float16", 1e-3, True),
    # int8 and int4 (and the alias) are gated by the held-out loss, not the parity
    ("int8", 5.0, True), ("dynamic_int8", 5.0, True), ("int4", 50.0, True),
])
def test_parity_against_the_precision_s_tolerance_at_its_boundary(quantize, parity, passes):
    failed = _result({"parity": parity}, quantize=quantize).failures()
    if passes:
        assert failed == []
    else:
        tolerance = EXPORT_TOLERANCE[quantize]
        assert failed == [f"FAILED: parity {parity:.3g} exceeds the tolerance {tolerance:g}."]


def test_an_explicit_tolerance_replaces_the_default_both_ways():
    result = _result({"parity": 0.01})
    assert result.failures(tolerance=0.01) == []
    assert result.failures(tolerance=0.005) == ["FAILED: parity 0.01 exceeds the tolerance 0.005."]
    assert _result({"parity": 3.0}, quantize="int8").failures(tolerance=1.0) == [
        "FAILED: parity 3 exceeds the tolerance 1."]
    # tolerance=0 is a tolerance, not "the default"
    assert _result({"parity": 1e-6}).failures(tolerance=0.0) == [
        "FAILED: parity 1e-06 exceeds the tolerance 0."]


def test_a_nan_parity_fails():
    assert _result({"parity": float("nan")}).failures() == [
        "FAILED: parity nan exceeds the tolerance 0.0001."]


def test_an_unknown_quantize_value_is_named():
    with pytest.raises(ValueError, match=r"got quantize='int2'"):
        _result(quantize="int2").failures()


def _quality(loss_float, loss_quantized, **extra):
    return {"loss_float": loss_float, "loss_quantized": loss_quantized,
            "loss_increase": loss_quantized / loss_float - 1.0, **extra}


def test_held_out_loss_at_and_over_the_limit():
    at_limit = _quality(4.0, 4.04)
    at_limit["loss_increase"] = 0.01
    assert _result({"parity": 2.0, "quality": at_limit, "max_loss_increase": 0.01},
                   quantize="int8").failures() == []
    over = _quality(3.8284, 3.8709)
    failed = _result({"parity": 2.0, "quality": over, "max_loss_increase": 0.01}, quantize="int4").failures()
    assert failed == ["FAILED: the quantized file raises the held-out cross-entropy by 1.11% "
                      "(3.8284 -> 3.8709), over the limit 1.00%."]
    nan = dict(over, loss_increase=float("nan"))
    nan_report = {"parity": 2.0, "quality": nan, "max_loss_increase": 0.5}
    assert len(_result(nan_report, quantize="int8").failures()) == 1


def test_held_out_loss_is_not_checked_without_a_limit_or_a_loss():
    over = _quality(1.0, 2.0)
    assert _result({"parity": 0.0, "quality": over}, quantize="int8").failures() == []
    no_limit = {"parity": 0.0, "quality": over, "max_loss_increase": None}
    assert _result(no_limit, quantize="int8").failures() == []
    no_loss = {"generation_agreement": 1.0}
    assert _result({"parity": 0.0, "quality": no_loss, "max_loss_increase": 0.01},
                   quantize="int8").failures() == []


def _generation(same_tokens, agreement=None, **report):
    report = {"parity": 0.0, "same_tokens": same_tokens, "tokens_checked": 12, **report}
    if agreement is not None:
        report["quality"] = {"generation_agreement": agreement}
    return report


def _generation_result(report, **options):
    return _result(report, kind=kinds.PREFILL_DECODE, **options)


def test_generation_tokens_float32():
    assert _generation_result(_generation(True)).failures() == []
    assert _generation_result(_generation(False)).failures() == [
        "FAILED: the file does not generate what the model generates (greedy tokens differ from "
        "CausalLM.generate)."]


def test_generation_agreement_of_a_quantized_file_at_its_boundary():
    assert _generation_result(_generation(False, 0.95), quantize="int8").failures() == []
    assert _generation_result(_generation(False, 1.0), quantize="int8").failures() == []
    assert _generation_result(_generation(False, 0.9499), quantize="int8").failures() == [
        "FAILED: the quantized file's greedy tokens differ from float32's, and fed float32's tokens it "
        "picks the same token at 95.0% of the steps (at least 95% needed)."]
    assert _generation_result(_generation(False, 0.5), quantize="int8").failures() == [
        "FAILED: the quantized file's greedy tokens differ from float32's, and fed float32's tokens it "
        "picks the same token at 50.0% of the steps (at least 95% needed)."]
    assert len(_generation_result(_generation(False, float("nan")), quantize="int8").failures()) == 1
    # the same tokens need no agreement
    assert _generation_result(_generation(True, 0.1), quantize="int8").failures() == []


def test_the_kind_decides_whether_greedy_tokens_are_checked():
    assert not _result({"parity": 0.0}).generation
    assert _generation_result(_generation(True)).generation
    assert _generation_result(_generation(False)).generation
    # a window result's report with the key of a generation is still a window's
    assert not _result(_generation(False)).generation and _result(_generation(False)).failures() == []
    assert _result(_generation(False), kind=kinds.GENAI).failures() == [
        "FAILED: the decoder, fed as onnxruntime-genai feeds it, does not generate what the model generates "
        "(greedy tokens differ from CausalLM.generate)."]
    assert _result(_generation(True, tokenizer_same_ids=False), kind=kinds.GENAI).failures() == [
        "FAILED: tokenizer.json does not give SentencePiece's ids."]
    assert _result(_generation(True, tokenizer_same_ids=True), kind=kinds.GENAI).failures() == []


def test_the_engine_s_text():
    message = ("FAILED: LiteRT-LM's engine does not generate the text CausalLM.generate generates "
               "(a quantized bundle: its model on LiteRT's interpreter), or did not run the bundle.")
    assert _generation_result(_generation(True, engine_same_text=False)).failures() == [message]
    assert _generation_result(_generation(True, engine_same_text=True)).failures() == []
    assert _generation_result(_generation(True, engine_same_text=None)).failures() == []


def test_every_failed_check_is_named_in_order():
    report = _generation(False, engine_same_text=False, parity=1.0, verdicts={"gl": ["CUMSUM"], "webgpu": []})
    failed = _generation_result(report, target="gl").failures(require_gpu=True)
    assert failed == [
        "FAILED: the file does not generate what the model generates (greedy tokens differ from "
        "CausalLM.generate).",
        "FAILED: LiteRT-LM's engine does not generate the text CausalLM.generate generates "
        "(a quantized bundle: its model on LiteRT's interpreter), or did not run the bundle.",
        "FAILED: parity 1 exceeds the tolerance 0.0001.",
        "FAILED: --require-gpu and OpenGL ES (Jetson + tflite-runtime) does not run CUMSUM"]


@pytest.mark.parametrize("target, verdicts, expected", [
    # the target's own backend decides: gpu's is webgpu, gl's is gl
    ("gpu", {"webgpu": ["GATHER", "SELECT_V2"], "opencl": [], "gl": []},
     "FAILED: --require-gpu and LiteRT GPU accelerator (ai-edge-litert CompiledModel; WebGPU over Vulkan, "
     "JetPack 6) does not run GATHER, SELECT_V2"),
    ("gpu", {"webgpu": [], "opencl": ["GATHER"], "gl": ["GATHER"]}, None),
    ("gl", {"gl": [], "webgpu": ["CUMSUM"]}, None),
    ("cpu", {"gl": ["CUMSUM"], "webgpu": []},
     "FAILED: --require-gpu and OpenGL ES (Jetson + tflite-runtime) does not run CUMSUM"),
])
def test_require_gpu_reads_the_target_s_own_backend(target, verdicts, expected):
    result = _result({"parity": 0.0, "verdicts": verdicts}, target=target)
    assert result.failures() == []
    assert result.failures(require_gpu=True) == ([expected] if expected else [])


def test_require_gpu_without_verdicts_or_backends():
    assert _result({"parity": 0.0}, target="gpu").failures(require_gpu=True) == []
    assert _result({"parity": 0.0, "verdicts": {}}, target="tensorrt").failures(require_gpu=True) == []


def test_exported_is_the_file_or_the_pair():
    assert _result(models=(b"one",)).exported == b"one"
    assert _result(models=(b"p", b"d")).exported == (b"p", b"d")
    assert _result({"parity": 0.25}).parity == 0.25


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def test_save_one_file_with_its_metadata_and_contract(tmp_path):
    out = str(tmp_path / "new" / "model.tflite")
    model = b"TFL3" + bytes(range(200))
    result = _result(models=(model,), metadata={"target": "cpu", "vocab_size": 7})
    paths = result.save(out)
    assert paths == [out, out + ".json", out + ".contract.json"]
    assert open(out, "rb").read() == model
    metadata = json.load(open(out + ".json"))
    assert metadata == {"target": "cpu", "vocab_size": 7,
                        "files": {"model.tflite": {"bytes": 204, "sha256": _sha(model)}}}
    assert json.load(open(out + ".contract.json")) == contract.document()
    assert result.metadata == {"target": "cpu", "vocab_size": 7}  # the result's own dict is not changed
    assert sorted(os.listdir(tmp_path / "new")) == ["model.tflite", "model.tflite.contract.json",
                                                     "model.tflite.json"]


def test_save_a_float_host_table(tmp_path):
    out = str(tmp_path / "model.tflite")
    table = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    paths = _result(host_table=table, embedding="host").save(out)
    assert paths == [out, out + ".embeddings.npy", out + ".json", out + ".contract.json"]
    np.testing.assert_array_equal(np.load(out + ".embeddings.npy"), table)
    metadata = json.load(open(out + ".json"))
    assert metadata["embedding_table"] == "model.tflite.embeddings.npy"
    assert set(metadata["files"]) == {"model.tflite", "model.tflite.embeddings.npy"}
    table_bytes = open(out + ".embeddings.npy", "rb").read()
    assert metadata["files"]["model.tflite.embeddings.npy"] == {"bytes": len(table_bytes),
                                                                 "sha256": _sha(table_bytes)}


def test_save_an_int_host_table(tmp_path):
    out = str(tmp_path / "model.tflite")
    table = {"rows": np.array([[1, -2], [3, 4]], np.int8), "scales": np.array([0.5, 0.25], np.float32)}
    paths = _result(host_table=table, embedding="host").save(out)
    assert paths[1] == out + ".embeddings.npz"
    assert not os.path.exists(out + ".embeddings.npy")
    with np.load(out + ".embeddings.npz") as saved:
        assert sorted(saved.files) == ["rows", "scales"]
        np.testing.assert_array_equal(saved["rows"], table["rows"])
        np.testing.assert_array_equal(saved["scales"], table["scales"])
    assert json.load(open(out + ".json"))["embedding_table"] == "model.tflite.embeddings.npz"


def test_save_one_file_per_signature(tmp_path):
    out = str(tmp_path / "gen.tflite")
    paths = _result(models=(b"prefill-bytes", b"decode-bytes!"), target="gl").save(out)
    prefill, decode = str(tmp_path / "gen.prefill.tflite"), str(tmp_path / "gen.decode.tflite")
    assert paths == [prefill, decode, out + ".json", out + ".contract.json"]
    assert open(prefill, "rb").read() == b"prefill-bytes"
    assert open(decode, "rb").read() == b"decode-bytes!"
    assert not os.path.exists(out)
    metadata = json.load(open(out + ".json"))
    assert metadata["signature_files"] == {"prefill": "gen.prefill.tflite", "decode": "gen.decode.tflite"}
    assert metadata["files"] == {"gen.prefill.tflite": {"bytes": 13, "sha256": _sha(b"prefill-bytes")},
                                 "gen.decode.tflite": {"bytes": 13, "sha256": _sha(b"decode-bytes!")}}


def test_one_file_has_no_signature_files(tmp_path):
    out = str(tmp_path / "gen.tflite")
    _result().save(out)
    assert "signature_files" not in json.load(open(out + ".json"))


def test_the_file_names_follow_the_target_and_the_suffix(tmp_path):
    assert _result(target="tensorrt").model_paths("m.onnx") == ["m.onnx"]
    assert _result(target="tensorrt", models=(b"p", b"d")).model_paths("g.onnx") == [
        "g.prefill.onnx", "g.decode.onnx"]
    assert _result(target="cpu", models=(b"p", b"d")).model_paths("g.onnx") == [
        "g.onnx.prefill.tflite", "g.onnx.decode.tflite"]
    assert _result(kind=kinds.LITERTLM, models=(b"p", b"d")).model_paths("b.litertlm") == [
        "b.prefill.litertlm", "b.decode.litertlm"]
    out = str(tmp_path / "bundle.litertlm")
    assert _result(kind=kinds.LITERTLM).save(out)[0] == out


def test_a_folder_kind_writes_its_files_into_the_folder_and_nothing_beside(tmp_path):
    out = tmp_path / "folder"
    result = _result(target=None, kind=kinds.GENAI, models=(b"onnx", b"{}"), names=("model.onnx", "c.json"))
    assert result.save(str(out)) == [str(out / "model.onnx"), str(out / "c.json")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]
    assert (out / "model.onnx").read_bytes() == b"onnx" and (out / "c.json").read_bytes() == b"{}"
    assert result.save(str(out)) == [str(out / "model.onnx"), str(out / "c.json")]  # again, into it
    (tmp_path / "file").write_bytes(b"mine")
    with pytest.raises(ValueError, match=r"--format genai writes a folder: --out .*file is a file\."):
        result.save(str(tmp_path / "file"))
    assert (tmp_path / "file").read_bytes() == b"mine"


def test_headline_sums_the_model_files():
    result = _result(models=(b"12345", b"678"), description="float32 weights")
    assert result.headline(["a.tflite", "b.tflite"]) == "Wrote a.tflite, b.tflite (8 bytes, float32 weights)"


def test_report_lines_put_the_file_names_in():
    lines = ["Copy FILE.embeddings.npy beside it", "or FILE.embeddings.npz (int rows)",
             "trtexec --onnx=FILE --fp16", "no placeholder: FILE stays", ""]
    result = _result(lines=lines)
    assert result.report_lines("runs/a/model.onnx") == [
        "Copy model.onnx.embeddings.npy beside it", "or model.onnx.embeddings.npz (int rows)",
        "trtexec --onnx=runs/a/model.onnx --fp16", "no placeholder: FILE stays", ""]
    assert result.lines == lines
    both = _result(lines=["FILE.embeddings.npy and FILE.embeddings.npy, --onnx=FILE"])
    assert both.report_lines("m.onnx") == ["m.onnx.embeddings.npy and m.onnx.embeddings.npy, --onnx=m.onnx"]


def test_a_build_s_result_is_the_export_result_of_its_own_fields():
    built = Built("gpu", "int8", "host", (b"a", b"b"), {"parity": 0.5}, ["line"], {"kind": "window"}, "held",
                  {"bits": 8}, kind=kinds.PREFILL_DECODE, names=("x",), recipe="recipe", quality={"q": 1},
                  format_quality=str, quantized_note="; note", notes=("after",))
    result = built.result()
    assert type(result) is ExportResult
    assert result == ExportResult("gpu", "int8", "host", (b"a", b"b"), {"parity": 0.5}, ["line"],
                                  {"kind": "window"}, "held", {"bits": 8}, kind=kinds.PREFILL_DECODE,
                                  names=("x",))
    assert not hasattr(result, "recipe") and not hasattr(result, "notes")
