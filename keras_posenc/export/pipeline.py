"""One export pass, window or prefill/decode: convert, check, cost, metadata, each once; one `ExportResult`.

`export_and_check` (a fixed window) and `export_generation` (prefill + decode with the key/value
cache) run the same steps: inspect the model (`ModelSpec`), rebuild and formulate it for the
target and convert (`conversion`, `generator`), check the file against Keras (`parity`,
`generator.check_generator_parity`), cost it (`cost`), and gather the runtime metadata; both
return an `ExportResult` (`result`), whose `failures()` is the pass/fail rule and whose
`save(out)` writes the files.
"""

import numpy as np

from keras_posenc.export import contract, generator
from keras_posenc.export.conversion import (
    EMBEDDINGS,
    ModelSpec,
    convert_onnx,
    convert_tflite,
    default_embedding,
    host_embedding_table,
    onnx_opset,
)
from keras_posenc.export.cost import onnx_cost
from keras_posenc.export.flatbuffer import TfliteFile
from keras_posenc.export.host_table import dequantized_table
from keras_posenc.export.parity import (
    cost_summary,
    format_cost,
    format_report,
    parity,
    report_of,
    sample_batch,
    spec_metadata,
    weight_bytes,
)
from keras_posenc.export.quality import DEFAULT_MAX_LOSS_INCREASE, format_quality, quantization_quality
from keras_posenc.export.quantization import interpreter_for, precision_of, recipe_for, stored_host_table
from keras_posenc.export.result import EXPORT_TOLERANCE, ExportResult
from keras_posenc.export.targets import target_of
from keras_posenc.validation import check_choice

__all__ = ["EXPORT_TOLERANCE", "ExportResult", "export_and_check", "export_generation"]

# The prefill/decode export: the same steps, in `generator` (conversion of two signatures).
export_generation = generator.export_generation


def export_and_check(model, *, sequence_length, target="gpu", batch_size=1, quantize=None, embedding=None,
                     token_ids=None, language_ids=None, eval_token_ids=None,
                     max_loss_increase=DEFAULT_MAX_LOSS_INCREASE, litert_python=None):
    """Exports `model` and checks the file, every analysis once.

    Builds the `ModelSpec` once, converts (`to_tflite`, or `to_onnx` for
    target "tensorrt"), decodes the flatbuffer once for the op histogram,
    GPU verdicts and cost, runs the parity once (one Keras pass, one
    interpreter pass: real tokens and padding both), and derives the runtime
    metadata.

    Args:
        model: a built Keras model with keras_posenc layers.
        sequence_length, target, batch_size, quantize: as in `to_tflite`.
        embedding: "host", "graph" or None (`default_embedding`).
        token_ids: optional int `[n, sequence_length]` for the parity
            (default: `sample_token_batch` rows, 4 per exported batch row).
        language_ids: optional, as in `check_parity` (default: zeros when the
            model needs them).
        eval_token_ids: optional int `[n, sequence_length]` of held-out text
            (right-padded with the model's pad id). With `quantize`, the
            quantized file is run against a float32 export of the same
            target on these rows (`quality.quantization_quality`): the
            report's `quality` holds the cross-entropies, greedy agreement
            and logit error, and `failures()` fails a loss increase above
            `max_loss_increase`. Without them, the quality is not measured
            (the report says so).
        max_loss_increase: float >= 0, the largest relative rise of the
            held-out cross-entropy a quantized file may cost (default 1 %).
        litert_python: the Python with LiteRT Quantizer (int4; default
            `litert_python.runtime_python`). Its files are checked by
            ai-edge-litert's interpreter (TFLite 2.12's computes them wrong).

    Returns:
        An `ExportResult`. With `quantize`, the host table of an
        `embedding="host"` export is stored in the same precision and the
        checks feed its dequantized rows, as the kit does.

    Raises:
        ValueError: as `to_tflite`, a `token_ids` of another shape, a
            quantization the target's runtime cannot run (before converting),
            or `embedding="host"` with target "cpu".

    Example:

    >>> from keras_posenc.backend import keras
    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> result = export_and_check(model, sequence_length=6, target="cpu")
    >>> result.parity < 1e-5, result.failures(), result.metadata["inputs"], "GATHER" in result.report["ops"]
    (True, [], ['token_ids'], True)
    """
    target = target_of(target)
    if not max_loss_increase >= 0:
        raise ValueError(f"`max_loss_increase` must be >= 0, got max_loss_increase={max_loss_increase!r}.")
    precision = precision_of(quantize)
    recipe = recipe_for(target, precision, "window", litert_python=litert_python)
    spec = ModelSpec.of(model, sequence_length, batch_size)
    token_ids, language_ids = _parity_batch(spec, token_ids, language_ids)
    embedding = embedding or ("graph" if target.file_format == "onnx" else default_embedding(model, target))
    check_choice("embedding", embedding, EMBEDDINGS)
    stored = stored_host_table(host_embedding_table(model), recipe) if embedding == "host" else None
    rows = None if stored is None else dequantized_table(stored)
    if target.file_format == "onnx":
        exported = convert_onnx(spec, embedding=embedding, recipe=recipe, calibration=token_ids)
        parities = parity(spec, exported, token_ids, language_ids, runtime="onnx", table=rows)
        report = {"parity": parities[0], "parity_all": parities[1], "verdicts": {},
                  "cost": cost_summary(onnx_cost(exported), weight_bytes(model)), "file_bytes": len(exported)}
        lines = [f"ONNX opset {onnx_opset(exported)}, static shapes, int32 ids (trtexec --onnx=FILE"
                 f"{'' if recipe else ' --fp16'})",
                 f"Parity onnxruntime vs Keras: max abs diff {parities[0]:.3g} on real tokens",
                 format_cost(report["cost"])]
        runtime = "onnx"
    else:
        exported = convert_tflite(spec, target=target, quantize=precision, embedding=embedding,
                                  litert_python=litert_python)
        with interpreter_for(recipe, litert_python) as interpreter:
            tflite = TfliteFile(exported)
            report = report_of(spec, tflite, parity(spec, tflite, token_ids, language_ids, table=rows,
                                                    interpreter=interpreter), target=target)
        lines = format_report(report)
        runtime = "tflite"
    if recipe is not None:
        lines.insert(0, f"Quantized by {recipe.tool}: {recipe.weights}")
        report["quality"] = _quantization_quality(spec, target, embedding, exported, eval_token_ids, runtime,
                                                  rows, recipe, litert_python)
        report["max_loss_increase"] = max_loss_increase
        lines.append(_quality_line(report["quality"], max_loss_increase))
    if stored is not None:
        lines.append(f"Embedding: host ({_table_words(stored)}); the runner feeds the rows of "
                     f"{_table_name(stored)}[token_ids] as `embeddings` (export/jetson/run_tflite.py and "
                     "run_tensorrt.py do)")
    metadata = dict(spec_metadata(spec, quantize=precision, target=target, embedding=embedding),
                    cost=report["cost"])
    if recipe is not None:
        metadata[contract.KEYS["quantization"]] = recipe.describe()
    if report.get("quality") is not None:
        metadata[contract.KEYS["quality"]] = report["quality"]
    description = (f"target {target.name}, quantize={precision or 'none'}, batch {batch_size} x length "
                   f"{sequence_length}")
    return ExportResult(target.name, precision, embedding, (exported,), report, lines, metadata, description,
                        stored)


def _table_words(stored):
    if isinstance(stored, dict):
        return f"int{int(stored['bits'])} rows, {int(stored['block'])} values a scale"
    return f"{stored.dtype} rows"


def _table_name(stored):
    return "FILE.embeddings.npz" if isinstance(stored, dict) else "FILE.embeddings.npy"


def _quantization_quality(spec, target, embedding, quantized, eval_token_ids, runtime, rows, recipe,
                          litert_python):
    """The quantized file against a float32 export of the same target on held-out rows, or None.

    The float32 file is fed the float32 table's rows, the quantized one its own (dequantized).
    """
    if eval_token_ids is None:
        return None
    eval_token_ids, eval_language_ids = _parity_batch(spec, eval_token_ids, None)
    if runtime == "onnx":
        reference = convert_onnx(spec, embedding=embedding)
        return quantization_quality(spec, reference, quantized, eval_token_ids, eval_language_ids,
                                    runtime="onnx", quantized_table=rows)
    reference = convert_tflite(spec, target=target, quantize=None, embedding=embedding)
    with interpreter_for(recipe, litert_python) as interpreter:
        return quantization_quality(spec, reference, quantized, eval_token_ids, eval_language_ids,
                                    quantized_table=rows, interpreter=interpreter)


def _quality_line(quality, max_loss_increase):
    if quality is None:
        return ("Held-out loss of the quantized file: not measured (pass eval_token_ids; the CLI reads the "
                "run's eval split or --eval-corpus; a model whose output is not next-token logits has none)")
    return format_quality(quality, max_loss_increase)


def _parity_batch(spec, token_ids, language_ids):
    """The parity batch: the given ids (shape checked) or a sample, and language ids when needed."""
    if token_ids is None:
        return sample_batch(spec, rows=4 * spec.batch_size)
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or token_ids.shape[1] != spec.sequence_length:
        raise ValueError(f"`token_ids` must be an int array [n, {spec.sequence_length}], "
                         f"got shape {token_ids.shape}.")
    if language_ids is None and spec.needs_languages:
        shape = token_ids.shape if spec.language_rank == 2 else token_ids.shape[:1]
        language_ids = np.zeros(shape, np.int32)
    return token_ids.astype(np.int32), language_ids
