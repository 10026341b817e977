"""Parity and reports: the exported file against the Keras model, on real token batches."""

import numpy as np
import tensorflow as tf

from keras_posenc.export.cost import graph_cost
from keras_posenc.export.flatbuffer import check_flatbuffer, decoded, input_names, op_counts
from keras_posenc.export.kinds import WINDOW
from keras_posenc.export.model_spec import (
    HOST_EMBEDDINGS,
    ModelSpec,
    host_embedding_table,
    role_of,
    rope_notes,
)
from keras_posenc.export.runners import run_file
from keras_posenc.export.targets import DEFAULT_TARGET, ONNX, TFLITE, target_of
from keras_posenc.export.verdicts import gpu_incompatible_ops, verdict_line

__all__ = ["check_onnx_parity", "check_parity", "cost_summary", "export_report", "format_cost",
           "format_report", "parity", "report_of", "runtime_metadata", "sample_batch", "sample_token_batch",
           "spec_metadata", "weight_bytes"]

def check_parity(model, tflite_bytes, token_ids, language_ids=None, *, position_ids=None, segment_ids=None,
                 ignore_padding=True):
    """Max absolute difference between the Keras model and the TFLite interpreter.

    Rows are fed through the interpreter in chunks of its fixed batch size;
    the Keras model runs on the whole batch with `training=False`.

    Padding positions are left out of the comparison by default (when the
    output is per token): Keras attention masks with an additive -1e9, so a
    padding query, which may attend to nothing, gets a softmax decided by how
    its scores round next to 1e9 (one float32 step there is 64). Its output
    is arbitrary in every implementation and ignored downstream.

    Args:
        model: the Keras model that was exported.
        tflite_bytes: the flatbuffer from `to_tflite`.
        token_ids: int array `[n, sequence_length]`, n a multiple of the
            exported batch size.
        language_ids: int array `[n]` or `[n, sequence_length]` for models
            with per-language scaling.
        position_ids, segment_ids: int arrays `[n, sequence_length]` for
            models that take them as inputs.
        ignore_padding: bool, compare real-token positions only.

    Returns:
        The max abs difference as a Python float.

    Example:

    >>> from keras_posenc.backend import keras
    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> from keras_posenc.export import to_tflite
    >>> flat = to_tflite(model, sequence_length=4, target="cpu", batch_size=2)
    >>> batch = np.array([[5, 6, 7, 0], [0, 0, 8, 9], [3, 0, 0, 0], [1, 2, 3, 4]], np.int32)
    >>> check_parity(model, flat, batch) < 1e-5  # 4 rows: two interpreter calls of 2
    True
    """
    check_flatbuffer(tflite_bytes)
    spec = ModelSpec.of(model, _checked_ids(token_ids).shape[1], 1)
    real, every = parity(spec, tflite_bytes, token_ids, language_ids, position_ids=position_ids,
                         segment_ids=segment_ids)
    return real if ignore_padding else every


def check_onnx_parity(model, onnx_bytes, token_ids, language_ids=None, *, position_ids=None,
                      segment_ids=None, ignore_padding=True):
    """Max abs difference between the Keras model and onnxruntime on real tokens (see `check_parity`)."""
    spec = ModelSpec.of(model, _checked_ids(token_ids).shape[1], 1)
    real, every = parity(spec, onnx_bytes, token_ids, language_ids, position_ids=position_ids,
                         segment_ids=segment_ids, file_format=ONNX)
    return real if ignore_padding else every


def parity(spec, exported, token_ids, language_ids=None, *, position_ids=None, segment_ids=None,
           file_format=TFLITE, table=None, interpreter=None):
    """`(max abs diff on real tokens, max abs diff everywhere)`: one Keras pass, one runtime pass.

    Args:
        spec: the `ModelSpec` of the exported model (`spec.model` is run).
        exported: the `.tflite` flatbuffer (bytes or `TfliteFile`) or, with
            `file_format=ONNX`, the ONNX model.
        token_ids, language_ids, position_ids, segment_ids: as in
            `check_parity`.
        file_format: the `FileFormat` of `exported` (`run_file` runs it).
        table: the float32 token table whose rows an `embedding="host"` file is fed (default
            `host_embedding_table(spec.model)`; a quantized export's dequantized table).
        interpreter: the interpreter class of `run_interpreter` (default `interpreter_class()`).

    Returns:
        Two Python floats.
    """
    token_ids = _checked_ids(token_ids)
    feeds = spec.feeds(token_ids, language_ids=language_ids, position_ids=position_ids,
                       segment_ids=segment_ids)
    expected = np.asarray(spec.caller(spec.model)(*[tf.constant(f) for f in feeds]), np.float64)
    got = run_file(spec, exported, feeds, file_format=file_format, table=table, interpreter=interpreter)
    difference = np.abs(got.astype(np.float64).reshape(expected.shape) - expected)
    every = float(np.max(difference)) if difference.size else 0.0
    if spec.pad_id is not None and difference.shape[:2] == token_ids.shape:
        difference = difference[token_ids != spec.pad_id]
    return (float(np.max(difference)) if difference.size else 0.0), every


def _checked_ids(token_ids):
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or not np.issubdtype(token_ids.dtype, np.integer):
        raise ValueError(f"`token_ids` must be an int array [batch, length], got shape {token_ids.shape} "
                         f"and dtype {token_ids.dtype}.")
    return token_ids


def weight_bytes(model):
    """Bytes of all trainable and non-trainable weights of `model`, at their stored dtype.

    Args:
        model: a built Keras model or layer.

    Returns:
        An int.

    Example:

    >>> from keras_posenc.backend import keras
    >>> weight_bytes(keras.Sequential([keras.layers.Dense(3, input_shape=(4,))]))  # (4 * 3 + 3) * 4
    60
    """
    return int(sum(np.asarray(w).nbytes for w in model.get_weights()))



def sample_token_batch(model, sequence_length, *, rows=4, seed=0):
    """A padded batch of token ids for parity checks: full, half, one-token and left-padded rows.

    Ids are drawn from `[0, vocab_size)` without the pad id; language ids (if
    the model needs them) cycle through the languages.

    Args:
        model: a built Keras model with keras_posenc layers.
        sequence_length: int >= 1, the row length.
        rows: int, number of rows.
        seed: int, seed of the random ids.

    Returns:
        `(token_ids, language_ids or None)` as int32 numpy arrays.

    Example:

    >>> from keras_posenc.backend import keras
    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> tokens, languages = sample_token_batch(model, 6)
    >>> (tokens != 0).astype(int).tolist(), languages
    ([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1]], None)
    """
    return sample_batch(ModelSpec.of(model, sequence_length, 1), rows=rows, seed=seed)


def sample_batch(spec, *, rows=4, seed=0):
    """`sample_token_batch` for a `ModelSpec` (its `sequence_length`)."""
    sequence_length = spec.sequence_length
    rng = np.random.default_rng(seed)
    vocab = spec.vocab_size or 2
    pad = spec.pad_id if spec.pad_id is not None else -1
    ids = rng.integers(0, vocab - 1, size=(rows, sequence_length))
    ids = np.where(ids >= pad, ids + 1, ids) if pad >= 0 else ids
    if pad >= 0:
        lengths = [sequence_length, max(1, sequence_length // 2), 1, max(1, sequence_length - 2)]
        for row in range(rows):
            real = lengths[row % len(lengths)]
            if row % len(lengths) == 3:  # left padding
                ids[row, :sequence_length - real] = pad
            else:
                ids[row, real:] = pad
    languages = None
    if spec.needs_languages:
        count = min(layer.num_languages for layer in spec.position_layers if layer.num_languages)
        languages = np.arange(rows) % count
        if spec.language_rank == 2:
            languages = np.repeat(languages[:, None], sequence_length, axis=1)
        languages = languages.astype(np.int32)
    return ids.astype(np.int32), languages



def runtime_metadata(model, sequence_length, batch_size=1, *, quantize=None, target=DEFAULT_TARGET,
                     embedding="graph", embedding_table=None):
    """What a runtime-only runner needs to feed the exported model (`export/jetson/run_tflite.py` reads it).

    Args:
        model, sequence_length, batch_size, quantize, target, embedding: as in
            `to_tflite`.
        embedding_table: for `embedding="host"`, the `.npy` file (name beside
            the model) that holds `host_embedding_table(model)`.

    Returns:
        A JSON-ready dict: fixed shapes, vocab size, pad id, number of
        languages and the export options.

    Example:

    >>> from keras_posenc.backend import keras
    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> runtime_metadata(model, 6)  # doctest: +NORMALIZE_WHITESPACE
    {'kind': 'window', 'sequence_length': 6, 'batch_size': 1, 'vocab_size': 50, 'pad_id': 0,
     'num_languages': None, 'inputs': ['token_ids'], 'input_dtype': 'int32', 'quantize': None,
     'target': 'gpu', 'accelerators': ['gpu', 'cpu'], 'embedding': 'graph'}
    """
    return spec_metadata(ModelSpec.of(model, sequence_length, batch_size), quantize=quantize, target=target,
                         embedding=embedding, embedding_table=embedding_table)


def spec_metadata(spec, *, quantize=None, target=DEFAULT_TARGET, embedding="graph", embedding_table=None):
    """`runtime_metadata` for a `ModelSpec` (its sequence length and batch size)."""
    languages = [layer.num_languages for layer in spec.position_layers if layer.num_languages]
    return {
        "kind": WINDOW.contract_kind,
        "sequence_length": spec.sequence_length,
        "batch_size": spec.batch_size,
        "vocab_size": spec.vocab_size,
        "pad_id": spec.pad_id,
        "num_languages": min(languages) if languages else None,
        "inputs": [s.name for s in spec.signature()] + ([HOST_EMBEDDINGS] if embedding == "host" else []),
        "input_dtype": target_of(target).input_dtype,
        "quantize": quantize,
        "target": target_of(target).name,
        "accelerators": list(target_of(target).runs_on),
        "embedding": embedding,
        **({"embedding_table": embedding_table} if embedding == "host" else {}),
    }



def export_report(model, tflite_bytes, token_ids, language_ids=None, *, target=DEFAULT_TARGET):
    """Everything the `keras-posenc export` command prints, as a dict.

    Args:
        model: the Keras model that was exported.
        tflite_bytes: the flatbuffer from `to_tflite`.
        token_ids, language_ids: a batch for `check_parity`.
        target: the target it was exported for (decides which verdicts).

    Returns:
        A dict with keys `target`, `ops` (histogram), `verdicts` ({backend:
        sorted ops it does not run}), `verdict_lines`, `flex_ops`, `parity` (max
        abs diff on real tokens), `parity_all` (padding included),
        `file_bytes`, `weight_bytes`, `size_ratio`, `cost` (`cost_summary`),
        `rope_notes` (RoPE scalings frozen at the exported length).

    Example:

    >>> from keras_posenc.export import to_tflite
    >>> from keras_posenc.backend import keras
    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> flat = to_tflite(model, sequence_length=4)
    >>> report = export_report(model, flat, np.array([[5, 6, 0, 0]], np.int32))
    >>> report["verdicts"]["webgpu"], report["flex_ops"], report["parity"] < 1e-5, report["weight_bytes"]
    ([], [], True, 1600)
    """
    spec = ModelSpec.of(model, _checked_ids(token_ids).shape[1], 1)
    tflite = decoded(tflite_bytes)
    return report_of(spec, tflite, parity(spec, tflite, token_ids, language_ids), target=target)


def report_of(spec, tflite, parities, *, target=DEFAULT_TARGET):
    """The `export_report` dict of a decoded file (`TfliteFile`) and its `parity` pair."""
    ops = op_counts(tflite)
    backends = target_of(target).backends
    weights = weight_bytes(spec.model)
    return {
        "cost": cost_summary(graph_cost(tflite), weights_in_file(spec.model, tflite, weights)),
        "target": target_of(target).name,
        "ops": ops,
        "verdicts": {backend: gpu_incompatible_ops(tflite, backend) for backend in backends},
        "verdict_lines": [verdict_line(tflite, backend) for backend in backends],
        "flex_ops": sorted(name for name in ops if name.startswith("Flex")),
        "parity": parities[0],
        "parity_all": parities[1],
        "file_bytes": len(tflite),
        "weight_bytes": weights,
        "size_ratio": len(tflite) / max(1, weights),
        "rope_notes": rope_notes(spec.model, spec.sequence_length),
    }


def weights_in_file(model, tflite_bytes, weights=None):
    """The model's weight bytes that the file holds: all of them, less the token table of a host file."""
    weights = weight_bytes(model) if weights is None else weights
    if any(role_of(name) == HOST_EMBEDDINGS for name in input_names(tflite_bytes)):
        weights -= host_embedding_table(model).nbytes
    return weights


def cost_summary(cost, weights):
    """`keras_posenc.export.cost` figures plus the constant bytes beyond the model's weight bytes.

    Example:

    >>> cost_summary({"multiply_adds": 10, "constant_bytes": 1500, "largest_tensor_bytes": 8,
    ...               "largest_tensor_shape": [1, 2]}, 1000)["non_weight_constant_bytes"]
    500
    """
    return dict(cost, non_weight_constant_bytes=max(0, int(cost["constant_bytes"]) - int(weights)))


def format_cost(cost):
    """One line: multiply-adds, constants beyond the weights, the largest intermediate tensor.

    Example:

    >>> print(format_cost({"multiply_adds": 2.5e9, "non_weight_constant_bytes": 3 * 2 ** 20,
    ...                    "largest_tensor_bytes": 2 ** 26, "largest_tensor_shape": [1, 512, 512, 64]}))
    ... # doctest: +NORMALIZE_WHITESPACE
    Cost: 2.500 G multiply-adds; constants beyond the weights 3.00 MiB; largest intermediate
    [1, 512, 512, 64] 64.00 MiB
    """
    return (f"Cost: {cost['multiply_adds'] / 1e9:.3f} G multiply-adds; constants beyond the weights "
            f"{cost['non_weight_constant_bytes'] / 2 ** 20:.2f} MiB; largest intermediate "
            f"{list(cost['largest_tensor_shape'])} {cost['largest_tensor_bytes'] / 2 ** 20:.2f} MiB")


def format_report(report):
    """Human-readable lines of an `export_report` dict: ops, one verdict per backend, parity, size.

    Example:

    >>> report = {"target": "gpu", "ops": {"ADD": 1, "FULLY_CONNECTED": 2},
    ...           "verdict_lines": ["OpenGL ES (Jetson + tflite-runtime): all 3 ops have shaders"],
    ...           "parity": 0.0, "parity_all": 0.0, "file_bytes": 6328, "weight_bytes": 1600,
    ...           "size_ratio": 3.955}
    >>> for line in format_report(report)[3:5]:
    ...     print(line)
    Target gpu; GPU verdicts, per backend:
      OpenGL ES (Jetson + tflite-runtime): all 3 ops have shaders
    """
    lines = ["Op histogram:"]
    lines += [f"  {name:<24}{count}" for name, count in report["ops"].items()]
    lines.append(f"Target {report['target']}; GPU verdicts, per backend:")
    lines += [f"  {line}" for line in report["verdict_lines"]]
    lines.append(f"Parity vs Keras: max abs diff {report['parity']:.3g} on real tokens "
                 f"({report['parity_all']:.3g} with padding positions)")
    lines.append(f"File size: {report['file_bytes']} bytes = {report['size_ratio']:.3f} x the weight bytes "
                 f"({report['weight_bytes']}); frozen position tables and graph count toward the file")
    if "cost" in report:
        lines.append(format_cost(report["cost"]))
    lines += report.get("rope_notes", [])
    return lines


