"""One export pass: conversion, report, parity and runtime metadata, each once (`export_and_check`)."""

import dataclasses
import json
import os

import numpy as np

from keras_posenc.export.conversion import (
    EMBEDDINGS,
    ONNX_OPSET,
    ModelSpec,
    convert_onnx,
    convert_tflite,
    default_embedding,
    host_embedding_table,
)
from keras_posenc.export.cost import onnx_cost
from keras_posenc.export.flatbuffer import TfliteFile
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
from keras_posenc.export.targets import target_of
from keras_posenc.export.verdicts import BACKENDS
from keras_posenc.validation import check_choice

__all__ = ["EXPORT_TOLERANCE", "ExportResult", "export_and_check"]

# The largest parity error accepted per `quantize` mode (int8 weights: reported, not checked).
EXPORT_TOLERANCE = {None: 1e-4, "float16": 2e-2, "dynamic_int8": None}


@dataclasses.dataclass
class ExportResult:
    """What one `export_and_check` produced and measured.

    Attributes:
        exported: bytes, the `.tflite` flatbuffer (or the ONNX model for
            target "tensorrt").
        target, quantize, embedding: the export options ("graph" or "host").
        report: the `export_report` dict (ONNX: `parity`, `parity_all`,
            `cost`, empty `verdicts`).
        lines: the report as printable lines.
        metadata: the runtime metadata (`runtime_metadata`, with `cost`).
        host_table: float32 `[vocab, d_model]` for `embedding="host"`, else
            None.
    """

    exported: bytes
    target: str
    quantize: object
    embedding: str
    report: dict
    lines: list
    metadata: dict
    host_table: object = None

    @property
    def parity(self):
        return self.report["parity"]

    def failures(self, *, tolerance=None, require_gpu=False):
        """Lines naming each failed check: parity over `tolerance` (default `EXPORT_TOLERANCE`), and
        with `require_gpu` ops that the target's GPU backend does not run; `[]` when all hold."""
        failed = []
        tolerance = tolerance if tolerance is not None else EXPORT_TOLERANCE[self.quantize]
        if tolerance is not None and not self.parity <= tolerance:
            failed.append(f"FAILED: parity {self.parity:.3g} exceeds the tolerance {tolerance:g}.")
        verdicts = self.report["verdicts"]
        backend = target_of(self.target).backends[0] if verdicts else None
        if require_gpu and backend and verdicts[backend]:
            failed.append(f"FAILED: --require-gpu and {BACKENDS[backend]} does not run "
                          + ", ".join(verdicts[backend]))
        return failed

    def save(self, out):
        """Writes `out`, `out.json` (the metadata) and, for `embedding="host"`, `out.embeddings.npy`.

        Returns:
            The paths written.
        """
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        paths = [out, out + ".json"]
        metadata = dict(self.metadata)
        if self.host_table is not None:
            paths.append(out + ".embeddings.npy")
            np.save(paths[-1], self.host_table)
            metadata["embedding_table"] = os.path.basename(paths[-1])
        with open(out, "wb") as f:
            f.write(self.exported)
        with open(paths[1], "w") as f:
            json.dump(metadata, f, indent=1)
        return paths


def export_and_check(model, *, sequence_length, target="gpu", batch_size=1, quantize=None, embedding=None,
                     token_ids=None, language_ids=None):
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

    Returns:
        An `ExportResult`.

    Raises:
        ValueError: as `to_tflite`, a `token_ids` of another shape, or
            `embedding="host"` with target "cpu".

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
    spec = ModelSpec.of(model, sequence_length, batch_size)
    token_ids, language_ids = _parity_batch(spec, token_ids, language_ids)
    if target.file_format == "onnx":
        embedding = embedding or "graph"
        exported = convert_onnx(spec, embedding=embedding)
        parities = parity(spec, exported, token_ids, language_ids, runtime="onnx")
        report = {"parity": parities[0], "parity_all": parities[1], "verdicts": {},
                  "cost": cost_summary(onnx_cost(exported), weight_bytes(model))}
        lines = [f"ONNX opset {ONNX_OPSET}, static shapes, int32 ids (trtexec --onnx=FILE --fp16)",
                 f"Parity onnxruntime vs Keras: max abs diff {parities[0]:.3g} on real tokens",
                 format_cost(report["cost"])]
    else:
        embedding = embedding or default_embedding(model, target)
        check_choice("embedding", embedding, EMBEDDINGS)
        exported = convert_tflite(spec, target=target, quantize=quantize, embedding=embedding)
        tflite = TfliteFile(exported)
        report = report_of(spec, tflite, parity(spec, tflite, token_ids, language_ids), target=target)
        lines = format_report(report)
    host_table = host_embedding_table(model) if embedding == "host" else None
    if host_table is not None:
        lines.append("Embedding: host; the runner feeds FILE.embeddings.npy[token_ids] as `embeddings` "
                     "(export/jetson/run_tflite.py and run_tensorrt.py do)")
    metadata = dict(spec_metadata(spec, quantize=quantize, target=target, embedding=embedding),
                    cost=report["cost"])
    return ExportResult(exported, target.name, quantize, embedding, report, lines, metadata, host_table)


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
