"""The window kind: one file of a fixed window `[batch, T]`, converted, checked against Keras and costed.

`build_window` is the window's part of the one export pass (`pipeline.export`, `export_and_check`):
inspect the model (`ModelSpec`), convert it for the target (`conversion`), run the parity once
(one Keras pass, one runtime pass: real tokens and padding both), decode a `.tflite` once for the
op histogram, GPU verdicts and cost (an ONNX file: its cost), and gather the runtime metadata.
"""

import numpy as np

from keras_posenc.export.conversion import EMBEDDINGS, convert_onnx, convert_tflite, onnx_opset
from keras_posenc.export.cost import onnx_cost
from keras_posenc.export.flatbuffer import TfliteFile
from keras_posenc.export.host_table import dequantized_table
from keras_posenc.export.kinds import WINDOW
from keras_posenc.export.model_spec import ModelSpec, default_embedding, host_embedding_table
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
from keras_posenc.export.quality import format_quality, quantization_quality
from keras_posenc.export.quantization import interpreter_for, recipe_for, stored_host_table
from keras_posenc.export.result import Built
from keras_posenc.export.targets import ONNX, TFLITE, target_of
from keras_posenc.validation import check_choice

__all__ = ["build_window"]


def build_window(model, *, target, precision, litert_python=None, sequence_length, batch_size=1,
                 embedding=None, token_ids=None, language_ids=None, eval_token_ids=None):
    """The window export of `model`, checked: a `Built` for the pass (arguments as `export_and_check`)."""
    target = target_of(target)
    recipe = recipe_for(target, precision, WINDOW, litert_python=litert_python)
    spec = ModelSpec.of(model, sequence_length, batch_size)
    token_ids, language_ids = _parity_batch(spec, token_ids, language_ids)
    embedding = embedding or default_embedding(model, target)
    check_choice("embedding", embedding, EMBEDDINGS)
    stored = stored_host_table(host_embedding_table(model), recipe) if embedding == "host" else None
    rows = None if stored is None else dequantized_table(stored)
    exported = _CONVERTERS[target.file_format](spec, target, embedding, precision, recipe, litert_python,
                                               token_ids)
    with interpreter_for(recipe, litert_python) as interpreter:
        report, lines = _CHECKS[target.file_format](spec, target, exported, token_ids, language_ids, rows,
                                                    recipe, interpreter)
    quality = None
    if recipe is not None:
        quality = _quantization_quality(spec, target, embedding, exported, eval_token_ids, rows, recipe,
                                        litert_python)
    notes = []
    if stored is not None:
        notes.append(f"Embedding: host ({_table_words(stored)}); the runner feeds the rows of "
                     f"{_table_name(stored)}[token_ids] as `embeddings` (export/jetson/run_tflite.py and "
                     "run_tensorrt.py do)")
    metadata = dict(spec_metadata(spec, quantize=precision, target=target, embedding=embedding),
                    cost=report["cost"])
    description = (f"target {target.name}, quantize={precision or 'none'}, batch {batch_size} x length "
                   f"{sequence_length}")
    return Built(target.name, precision, embedding, (exported,), report, lines, metadata, description,
                 stored, kind=WINDOW, recipe=recipe, quality=quality, format_quality=_quality_line,
                 notes=tuple(notes))


def _convert_tflite(spec, target, embedding, precision, recipe, litert_python, calibration=None):
    return convert_tflite(spec, target=target, quantize=precision, embedding=embedding,
                          litert_python=litert_python)


def _convert_onnx(spec, target, embedding, precision, recipe, litert_python, calibration=None):
    return convert_onnx(spec, embedding=embedding, recipe=recipe, calibration=calibration)


_CONVERTERS = {TFLITE: _convert_tflite, ONNX: _convert_onnx}


def _check_tflite(spec, target, exported, token_ids, language_ids, rows, recipe, interpreter):
    tflite = TfliteFile(exported)
    report = report_of(spec, tflite, parity(spec, tflite, token_ids, language_ids, table=rows,
                                            interpreter=interpreter), target=target)
    return report, format_report(report)


def _check_onnx(spec, target, exported, token_ids, language_ids, rows, recipe, interpreter):
    parities = parity(spec, exported, token_ids, language_ids, file_format=ONNX, table=rows)
    report = {"parity": parities[0], "parity_all": parities[1], "verdicts": {},
              "cost": cost_summary(onnx_cost(exported), weight_bytes(spec.model)),
              "file_bytes": len(exported)}
    lines = [f"ONNX opset {onnx_opset(exported)}, static shapes, int32 ids (trtexec --onnx=FILE"
             f"{'' if recipe else ' --fp16'})",
             f"Parity onnxruntime vs Keras: max abs diff {parities[0]:.3g} on real tokens",
             format_cost(report["cost"])]
    return report, lines


_CHECKS = {TFLITE: _check_tflite, ONNX: _check_onnx}


def _table_words(stored):
    if isinstance(stored, dict):
        return f"int{int(stored['bits'])} rows, {int(stored['block'])} values a scale"
    return f"{stored.dtype} rows"


def _table_name(stored):
    return "FILE.embeddings.npz" if isinstance(stored, dict) else "FILE.embeddings.npy"


def _quantization_quality(spec, target, embedding, quantized, eval_token_ids, rows, recipe, litert_python):
    """The quantized file against a float32 export of the same target on held-out rows, or None.

    The float32 file is fed the float32 table's rows, the quantized one its own (dequantized).
    """
    if eval_token_ids is None:
        return None
    eval_token_ids, eval_language_ids = _parity_batch(spec, eval_token_ids, None)
    reference = _CONVERTERS[target.file_format](spec, target, embedding, None, None, litert_python)
    with interpreter_for(recipe, litert_python) as interpreter:
        return quantization_quality(spec, reference, quantized, eval_token_ids, eval_language_ids,
                                    file_format=target.file_format, quantized_table=rows,
                                    interpreter=interpreter)


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
