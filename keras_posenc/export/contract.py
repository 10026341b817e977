"""The file contract of every export: tensor names, `FILE.json` keys and file names, defined once.

`keras-posenc export --out FILE` writes the model file(s), `FILE.json` (the runtime metadata,
with the size and sha256 of every file written) and `FILE.contract.json`: this module's names as
JSON (`document()`), which the device kit (export/jetson/) reads instead of repeating them. The kit
refuses a file without its contract (one exported before the contract existed): export it again.
"""

import hashlib
import os

__all__ = ["BEAM_SIGNATURE", "CONTRACT_SUFFIX", "EMBEDDINGS_QUANTIZED_SUFFIX", "EMBEDDINGS_SUFFIX", "KEYS",
           "LITERTLM_SUFFIX", "METADATA_SUFFIX", "SIGNATURES", "TENSORS", "TRANSLATE_SIGNATURES", "VERSION",
           "contract_path", "cross_name", "document", "embeddings_path", "file_record", "kv_cache_name",
           "metadata_path", "model_paths", "past_name", "present_name", "present_to_past",
           "translate_signatures"]

VERSION = 1

# Tensor names of the exported files.
TENSORS = {
    "token_ids": "token_ids",  # [batch, T] window input; [1, P] prefill input
    "language_ids": "language_ids",
    "position_ids": "position_ids",
    "segment_ids": "segment_ids",
    "embeddings": "embeddings",  # the looked-up rows table[ids] of an `embedding="host"` file
    "token_id": "token_id",  # [1, 1] decode input
    "position": "position",  # [1] decode input: the token's slot and position
    "logits": "logits",  # the output: [batch, T, V] of a window ONNX file, [1, P, V] prefill, [1, V] decode
    "past_prefix": "past_",  # past_key_<i>, past_value_<i>: the cache going in
    "present_prefix": "present_",  # present_key_<i>, present_value_<i>: the cache coming out
    # the prefill/decode model of a `.litertlm` bundle (LiteRT-LM's executor contract)
    "tokens": "tokens",  # int32 [1, T]: prefill [1, P], decode [1, 1]
    "input_pos": "input_pos",  # int32 [T]: the tokens' positions; input_pos[0] is the first slot written
    "kv_cache_k_prefix": "kv_cache_k_",  # kv_cache_k_<i>: [1, heads, C, head_dim], in and out, same name
    "kv_cache_v_prefix": "kv_cache_v_",
    # a translator (`--translate`): `encode` once per sentence, then `decode` per target token
    "source_ids": "source_ids",  # int32 [1, S]: `pieces </s>`, right-padded with pad_id
    "source_mask": "source_mask",  # float32 [1, S]: 1 at real source tokens; encode's output, decode's input
    "cross_prefix": "cross_",  # cross_key_<i>, cross_value_<i>: [1, S, heads, head_dim], encode -> decode
}

# The keys of FILE.json.
KEYS = {name: name for name in (
    # every export
    "kind", "target", "accelerators", "input_dtype", "vocab_size", "pad_id", "embedding", "embedding_table",
    "files", "bytes", "sha256",
    # a quantized export: its recipe ({"precision", "tool", "weights", "runtime"}) and measured quality
    "quantization",
    # a window export
    "sequence_length", "batch_size", "num_languages", "inputs", "quantize", "cost", "quality",
    # a prefill/decode export
    "prompt_length", "cache_length", "num_layers", "bos_id", "eos_id", "unk_id", "special_ids",
    "cache_bytes", "prefill_multiply_adds", "decode_multiply_adds", "signature_files",
    # a .litertlm bundle
    "format", "max_num_tokens",
    # a translator: the source window, the caches' shapes and translate's length-penalty exponent
    "source_length", "cache_shape", "cross_shape", "length_penalty", "beam_rows")}

KINDS = {"window": "window", "prefill_decode": "prefill_decode", "translate": "translate"}
SIGNATURES = ("prefill", "decode")
TRANSLATE_SIGNATURES = ("encode", "decode")
# A translator's optional third signature: `decode` over `beam_rows` rows at once (the hypotheses of
# one sentence's beam search), the cross-attention inputs still those of the one sentence.
BEAM_SIGNATURE = "decode_beams"
METADATA_SUFFIX = ".json"
CONTRACT_SUFFIX = ".contract.json"
EMBEDDINGS_SUFFIX = ".embeddings.npy"  # float32 (or float16 with --quantize float16)
# int8 / int4 rows: `codes`, `scales`, `bits`, `block` (keras_posenc.export.host_table)
EMBEDDINGS_QUANTIZED_SUFFIX = ".embeddings.npz"
LITERTLM_SUFFIX = ".litertlm"


def translate_signatures(beam_rows):
    """A translator's signatures, in file order: `encode`, `decode`, and with `beam_rows` `decode_beams`.

    Example:

    >>> translate_signatures(0), translate_signatures(4)
    (('encode', 'decode'), ('encode', 'decode', 'decode_beams'))
    """
    return TRANSLATE_SIGNATURES + ((BEAM_SIGNATURE,) if beam_rows else ())


def past_name(kind, layer):
    """`past_key_0`, `past_value_3`: the cache inputs of a decode step."""
    return f"{TENSORS['past_prefix']}{kind}_{layer}"


def present_name(kind, layer):
    """`present_key_0`: the cache outputs of a call."""
    return f"{TENSORS['present_prefix']}{kind}_{layer}"


def present_to_past(name):
    """A call's cache output name as the next decode step's input name."""
    return TENSORS["past_prefix"] + name[len(TENSORS["present_prefix"]):]


def cross_name(kind, layer):
    """`cross_key_0`, `cross_value_1`: a decoder layer's cross-attention keys or values (a translator)."""
    return f"{TENSORS['cross_prefix']}{kind}_{layer}"


def kv_cache_name(kind, layer):
    """`kv_cache_k_0`, `kv_cache_v_3`: a cache buffer of a `.litertlm` model ("key" or "value")."""
    return f"{TENSORS['kv_cache_k_prefix' if kind == 'key' else 'kv_cache_v_prefix']}{layer}"


def metadata_path(out):
    return out + METADATA_SUFFIX


def contract_path(out):
    return out + CONTRACT_SUFFIX


def embeddings_path(out, quantized=False):
    """The host table beside an export to `out`: `.embeddings.npy`, or `.embeddings.npz` for int rows."""
    return out + (EMBEDDINGS_QUANTIZED_SUFFIX if quantized else EMBEDDINGS_SUFFIX)


def model_paths(out, suffix, per_signature, signatures=SIGNATURES):
    """The model files of an export to `out`: `[out]`, or `STEM.<signature>.SUFFIX` for each signature.

    Example:

    >>> model_paths("run/gen.tflite", ".tflite", per_signature=True)
    ['run/gen.prefill.tflite', 'run/gen.decode.tflite']
    >>> model_paths("run/de.onnx", ".onnx", per_signature=True, signatures=TRANSLATE_SIGNATURES)
    ['run/de.encode.onnx', 'run/de.decode.onnx']
    """
    if not per_signature:
        return [out]
    stem = out[:-len(suffix)] if out.endswith(suffix) else out
    return [f"{stem}.{signature}{suffix}" for signature in signatures]


def file_record(path):
    """`{"bytes": size, "sha256": hex digest}` of a written file (what the kit checks before loading)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {KEYS["bytes"]: os.path.getsize(path), KEYS["sha256"]: digest.hexdigest()}


def document():
    """The contract as a JSON-ready dict: what `FILE.contract.json` holds.

    Example:

    >>> doc = document()
    >>> doc["version"], doc["tensors"]["past_prefix"], doc["files"]["metadata_suffix"]
    (1, 'past_', '.json')
    """
    return {"version": VERSION, "tensors": dict(TENSORS), "keys": dict(KEYS), "kinds": dict(KINDS),
            "signatures": list(SIGNATURES), "translate_signatures": list(TRANSLATE_SIGNATURES),
            "beam_signature": BEAM_SIGNATURE,
            "files": {"metadata_suffix": METADATA_SUFFIX, "contract_suffix": CONTRACT_SUFFIX,
                      "embeddings_suffix": EMBEDDINGS_SUFFIX,
                      "embeddings_quantized_suffix": EMBEDDINGS_QUANTIZED_SUFFIX,
                      "litertlm_suffix": LITERTLM_SUFFIX,
                      "tflite_identifier": "TFL3",
                      "tflite_identifier_offset": 4}}
