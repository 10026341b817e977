"""The file contract (`FILE.contract.json`) and the targets: what a device kit and a user rely on.

A file exported today is read by kits copied to devices earlier: the contract's version 1 is pinned
here in full, so a renamed tensor or key shows up as a failing test, not as a kit that cannot find
`logits`. Version 1 grows only by additions (the translator's names), which an older kit ignores.
The targets' fields are checked through what they decide: file names, the default embedding, the
errors.
"""

import hashlib
import os

import pytest

from keras_posenc.export import contract, targets

_V1 = {
    "version": 1,
    "tensors": {"token_ids": "token_ids", "language_ids": "language_ids", "position_ids": "position_ids",
                "segment_ids": "segment_ids", "embeddings": "embeddings", "token_id": "token_id",
                "position": "position", "logits": "logits", "past_prefix": "past_",
                "present_prefix": "present_",
                "tokens": "tokens", "input_pos": "input_pos", "kv_cache_k_prefix": "kv_cache_k_",
                "kv_cache_v_prefix": "kv_cache_v_", "source_ids": "source_ids", "source_mask": "source_mask",
                "cross_prefix": "cross_"},
    "keys": {key: key for key in (
        "kind", "target", "accelerators", "input_dtype", "vocab_size", "pad_id", "embedding",
        "embedding_table", "files", "bytes", "sha256", "quantization", "sequence_length", "batch_size",
        "num_languages", "inputs",
        "quantize", "cost", "quality", "prompt_length", "cache_length", "num_layers", "bos_id", "eos_id",
        "unk_id", "special_ids", "cache_bytes", "prefill_multiply_adds", "decode_multiply_adds",
        "signature_files", "format", "max_num_tokens", "source_length", "cache_shape", "cross_shape",
        "length_penalty", "beam_rows")},
    "kinds": {"window": "window", "prefill_decode": "prefill_decode", "translate": "translate"},
    "signatures": ["prefill", "decode"],
    "translate_signatures": ["encode", "decode"],
    "beam_signature": "decode_beams",
    "files": {"metadata_suffix": ".json", "contract_suffix": ".contract.json",
              "embeddings_suffix": ".embeddings.npy", "embeddings_quantized_suffix": ".embeddings.npz",
              "litertlm_suffix": ".litertlm", "tflite_identifier": "TFL3", "tflite_identifier_offset": 4},
}


def test_the_contract_document_is_version_1_in_full():
    assert contract.document() == _V1


def test_the_document_is_a_copy():
    doc = contract.document()
    doc["tensors"]["logits"] = "changed"
    doc["signatures"].append("extra")
    assert contract.document() == _V1


def test_cache_names_of_a_decode_step_and_a_bundle():
    assert [contract.past_name(kind, 2) for kind in ("key", "value")] == ["past_key_2", "past_value_2"]
    assert [contract.present_name(kind, 0) for kind in ("key", "value")] == [
        "present_key_0", "present_value_0"]
    assert contract.present_to_past("present_value_11") == "past_value_11"
    assert contract.present_to_past(contract.present_name("key", 5)) == contract.past_name("key", 5)
    assert [contract.kv_cache_name(kind, 3) for kind in ("key", "value")] == ["kv_cache_k_3", "kv_cache_v_3"]
    assert [contract.cross_name(kind, 1) for kind in ("key", "value")] == ["cross_key_1", "cross_value_1"]


def test_the_files_beside_an_export():
    assert contract.metadata_path("runs/m.tflite") == "runs/m.tflite.json"
    assert contract.contract_path("runs/m.tflite") == "runs/m.tflite.contract.json"
    assert contract.embeddings_path("m.onnx") == "m.onnx.embeddings.npy"
    assert contract.embeddings_path("m.onnx", quantized=True) == "m.onnx.embeddings.npz"
    assert contract.embeddings_path("m.onnx", quantized=False) == "m.onnx.embeddings.npy"


@pytest.mark.parametrize("out, suffix, per_signature, expected", [
    ("run/gen.tflite", ".tflite", False, ["run/gen.tflite"]),
    ("run/gen.tflite", ".tflite", True, ["run/gen.prefill.tflite", "run/gen.decode.tflite"]),
    ("run/gen", ".onnx", True, ["run/gen.prefill.onnx", "run/gen.decode.onnx"]),
    ("a.tflite.b.onnx", ".onnx", True, ["a.tflite.b.prefill.onnx", "a.tflite.b.decode.onnx"]),
])
def test_model_paths(out, suffix, per_signature, expected):
    assert contract.model_paths(out, suffix, per_signature=per_signature) == expected


def test_a_translators_files_are_named_by_its_signatures():
    assert contract.model_paths("de.onnx", ".onnx", True, signatures=contract.TRANSLATE_SIGNATURES) == [
        "de.encode.onnx", "de.decode.onnx"]
    assert contract.model_paths("de.tflite", ".tflite", False, signatures=contract.TRANSLATE_SIGNATURES) == [
        "de.tflite"]


def test_file_record_of_a_file_over_one_read_block(tmp_path):
    data = os.urandom((1 << 20) * 2 + 12345)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert contract.file_record(str(path)) == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert contract.file_record(str(empty)) == {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest()}


def test_target_of_names_the_choices():
    with pytest.raises(ValueError) as error:
        targets.target_of("npu")
    assert str(error.value) == "`target` must be one of ('gpu', 'gl', 'cpu', 'tensorrt'), got target='npu'."
    with pytest.raises(ValueError, match="got target=None"):
        targets.target_of(None)


def test_target_of_a_target_is_itself():
    for name, target in targets.TARGETS.items():
        assert targets.target_of(name) is target
        assert targets.target_of(target) is target
        assert target.name == name


def test_suffixes_and_default_embeddings():
    assert {name: t.suffix for name, t in targets.TARGETS.items()} == {
        "gpu": ".tflite", "gl": ".tflite", "cpu": ".tflite", "tensorrt": ".onnx"}
    assert {name: t.default_embedding(True) for name, t in targets.TARGETS.items()} == {
        "gpu": "host", "gl": "host", "cpu": "graph", "tensorrt": "graph"}
    assert {t.default_embedding(False) for t in targets.TARGETS.values()} == {"graph"}
