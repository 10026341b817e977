"""TFLite export for edge GPUs: frozen tables, builtin ops only, GPU-delegate check, parity.

`to_tflite` rebuilds a trained model with fixed input shapes under the float32
policy, copies its weights, freezes every position table (and every variable)
into constants and converts with `TFLITE_BUILTINS` only: Flex (`SELECT_TF_OPS`)
is never used, because Flex ops never run on the GPU delegate and need the
full TensorFlow runtime on the device.

With `gpu_friendly=True` the keras_posenc layers of the rebuilt model trace an
export formulation that the TFLite GPU delegate accepts:

- the token lookup `embeddings[ids]` becomes `one_hot(ids, vocab) @ embeddings`
  (EQUAL + CAST + FULLY_CONNECTED) instead of GATHER, which the delegate rejects;
- per-sample position ids come from the mask with CUMSUM and MUL (no SELECT),
  and the position rows are `one_hot(ids, T) @ table[:T]`, so only the first
  T rows of the table are stored, whatever the table kind;
- padding is zeroed with MUL by the mask, and the per-language scale is
  `sum(one_hot(language_ids, L) * scales)`.

Trade-off of the one-hot token lookup: GATHER reads `T * d_model` numbers,
the one-hot product does `T * vocab * d_model` multiply-adds and holds a
`[batch, T, vocab]` float intermediate (T=128, vocab=8000: 131M MACs and
4 MB). The file size does not change (the same `[vocab, d_model]` matrix is
stored). On a GPU the matmul is cheap next to keeping the graph on the GPU;
on a CPU-only target export with `gpu_friendly=False` (GATHER).

See `to_tflite` for an example of the whole flow (export, op check, parity).
"""

import contextlib
import io
import math
import os
import re

import numpy as np
import tensorflow as tf
from tensorflow import keras

from keras_posenc import encoder as _encoder  # noqa: F401  (registers Encoder for load_model)
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.validation import check_positive_int

__all__ = [
    "GPU_DELEGATE_OPS",
    "QUANTIZE_MODES",
    "analyzer_report",
    "check_parity",
    "export_report",
    "format_report",
    "gpu_incompatible_ops",
    "load_model",
    "op_counts",
    "run_interpreter",
    "runtime_metadata",
    "sample_token_batch",
    "to_tflite",
    "weight_bytes",
]

QUANTIZE_MODES = (None, "float16", "dynamic_int8")

# Builtin ops the TFLite 2.12 GPU delegate implements (tensorflow/lite/tools/versioning/
# gpu_compatibility.cc). Shape limits of individual ops are left to the analyzer.
GPU_DELEGATE_OPS = frozenset("""
ABS ADD AVERAGE_POOL_2D BATCH_MATMUL CAST CONCATENATION CONV_2D COS CUMSUM DENSIFY DEPTH_TO_SPACE
DEPTHWISE_CONV_2D DEQUANTIZE DIV ELU EQUAL EXP FLOOR FLOOR_DIV FLOOR_MOD FULLY_CONNECTED GREATER
GREATER_EQUAL HARD_SWISH LEAKY_RELU LESS LESS_EQUAL LOG LOGICAL_AND LOGISTIC LSTM MAXIMUM MAX_POOL_2D
MEAN MINIMUM MIRROR_PAD MUL NEG NOT_EQUAL ONE_HOT PACK PAD PADV2 POW PRELU QUANTIZE REDUCE_MAX
REDUCE_MIN REDUCE_PROD RELU RELU6 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR RSQRT
SIN SLICE SOFTMAX SPACE_TO_DEPTH SPLIT SPLIT_V SQRT SQUARE SQUARED_DIFFERENCE STRIDED_SLICE SUB SUM
TANH TILE TRANSPOSE TRANSPOSE_CONV
""".split())

_ANALYZER_OP = re.compile(r"^\s*Op#\d+\s+([A-Z0-9_]+)\(")
_ANALYZER_WARNING = "GPU COMPATIBILITY WARNING"
_ANALYZER_SUMMARY = re.compile(r"Subgraph#\d+ has GPU delegate compatibility issues")


# Public API -------------------------------------------------------------------------------
def to_tflite(model, *, sequence_length, batch_size=1, quantize=None, gpu_friendly=True):
    """Converts a Keras model built on keras_posenc layers to a TFLite flatbuffer.

    The model is rebuilt with fixed input shapes `[batch_size, sequence_length]`
    and float32 compute (a `mixed_float16` model converts only with Flex ops
    otherwise), the weights are copied, and the traced graph is converted with
    builtin ops only. Position tables of every kind end up as constants.

    Inputs of the model: the token ids `[batch, length]` (int32) first; when a
    position layer has `num_languages`, the language ids (`[batch]` or
    `[batch, length]`) second. A functional model takes them as a list, a
    subclassed model as `model(token_ids, language_ids=...)`.

    Args:
        model: a `keras.Model` or layer containing keras_posenc layers, built
            with keras and keras_posenc layers only.
        sequence_length: int, the fixed length; at most the model's
            `max_length`.
        batch_size: int, the fixed batch size (1 for the GPU delegate).
        quantize: None (float32), "float16" (float16 weights, float32 compute)
            or "dynamic_int8" (int8 weights, dynamic-range kernels on CPU).
        gpu_friendly: bool, replace ops the GPU delegate rejects (see the
            module docstring for the trade-off).

    Returns:
        The `.tflite` flatbuffer as bytes.

    Raises:
        TypeError: `model` is not a Keras layer or model, or a size is not an
            int.
        ValueError: the model is not built, has no keras_posenc position layer
            or layers of other packages, `sequence_length` exceeds its
            `max_length`, `quantize` is unknown, or conversion with builtin
            ops fails.

    Example:

    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> flat = to_tflite(model, sequence_length=6)
    >>> gpu_incompatible_ops(flat)  # no GATHER, no Flex: the GPU delegate runs every op
    []
    >>> sorted(op_counts(flat))
    ['ADD', 'CAST', 'CUMSUM', 'EQUAL', 'FULLY_CONNECTED', 'MUL', 'NOT_EQUAL', 'RESHAPE', 'SUB']
    >>> batch = np.array([[5, 6, 7, 0, 0, 0]], np.int32)
    >>> check_parity(model, flat, batch) < 1e-5
    True
    >>> to_tflite(model, sequence_length=32)
    Traceback (most recent call last):
        ...
    ValueError: `sequence_length`=32 exceeds the model's max_length=16.

    References:
        - [TensorFlow Lite GPU delegate](https://www.tensorflow.org/lite/performance/gpu).
        - [Select TensorFlow operators (Flex)](https://www.tensorflow.org/lite/guide/ops_select):
          why builtin ops only.
        - [Post-training quantization](https://www.tensorflow.org/lite/performance/post_training_quantization):
          the `quantize` modes.
    """
    spec = _ModelSpec.of(model, sequence_length, batch_size)
    if quantize not in QUANTIZE_MODES:
        raise ValueError(f"`quantize` must be one of {QUANTIZE_MODES}, got quantize={quantize!r}.")
    clone = _rebuild(model, spec)
    if gpu_friendly:
        _use_export_layers(clone)
    function = tf.function(spec.caller(clone), input_signature=spec.signature())
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()], clone)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize is not None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    try:
        return converter.convert()
    except Exception as error:  # the converter raises its own ConverterError type
        raise ValueError(
            f"TFLite conversion with builtin ops only failed for model '{model.name}': {error}") from error


def op_counts(tflite_bytes):
    """Histogram of the operators of a TFLite flatbuffer, read from the flatbuffer itself.

    Builtin ops are named as in the TFLite schema (`FULLY_CONNECTED`); custom
    ops by their custom code (Flex ops are `FlexXxx`).

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).

    Returns:
        A dict `{op name: count}` sorted by name.

    Example:

    >>> add = tf.function(lambda x: tf.gather(x, [2, 0]) + 1.0,
    ...                   input_signature=[tf.TensorSpec([3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert()
    >>> op_counts(flat)
    {'ADD': 1, 'GATHER': 1}

    References:
        - [The TFLite flatbuffer schema](https://github.com/tensorflow/tensorflow/blob/v2.12.0/tensorflow/lite/schema/schema.fbs).
    """
    counts = {}
    for name in _op_sequence(tflite_bytes):
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def gpu_incompatible_ops(tflite_bytes):
    """Ops of a TFLite model that the GPU delegate would not run; `[]` when it is delegate-ready.

    Two independent checks, united: TFLite's own analyzer
    (`tf.lite.experimental.Analyzer.analyze(..., gpu_compatibility=True)`),
    whose warnings are attributed to the op printed before them, and an
    op-level check of every operator against `GPU_DELEGATE_OPS` (custom and
    Flex ops are always incompatible), which does not depend on the
    analyzer's wording.

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).

    Returns:
        Sorted list of distinct op names.

    Example:

    >>> add = tf.function(lambda x: tf.gather(x, [2, 0]) + 1.0,
    ...                   input_signature=[tf.TensorSpec([3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert()
    >>> gpu_incompatible_ops(flat)
    ['GATHER']

    References:
        - [TFLite Model Analyzer](https://www.tensorflow.org/lite/guide/model_analyzer),
          GPU delegate compatibility.
        - TFLite 2.12 `tensorflow/lite/tools/versioning/gpu_compatibility.cc`
          (the source of `GPU_DELEGATE_OPS`).
    """
    flagged = {name for name in _op_sequence(tflite_bytes) if name not in GPU_DELEGATE_OPS}
    report = analyzer_report(tflite_bytes)
    current = None
    for line in report.splitlines():
        match = _ANALYZER_OP.match(line)
        if match:
            current = match.group(1)
        elif _ANALYZER_WARNING in line and not _ANALYZER_SUMMARY.search(line):
            flagged.add(current or "UNKNOWN")
    return sorted(flagged)


def analyzer_report(tflite_bytes):
    """The text TFLite's analyzer prints for the model, with GPU-compatibility warnings.

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).

    Returns:
        The report as a string.

    Example:

    >>> add = tf.function(lambda x: tf.gather(x, [2, 0]) + 1.0,
    ...                   input_signature=[tf.TensorSpec([3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert()
    >>> "GPU COMPATIBILITY WARNING: Not supported op GATHER" in analyzer_report(flat)
    True

    References:
        - [TFLite Model Analyzer](https://www.tensorflow.org/lite/guide/model_analyzer).
    """
    _check_flatbuffer(tflite_bytes)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        tf.lite.experimental.Analyzer.analyze(model_content=bytes(tflite_bytes), gpu_compatibility=True)
    return buffer.getvalue()


def check_parity(model, tflite_bytes, token_ids, language_ids=None, *, ignore_padding=True):
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
        ignore_padding: bool, compare real-token positions only.

    Returns:
        The max abs difference as a Python float.

    Example:

    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> flat = to_tflite(model, sequence_length=4, batch_size=2)
    >>> batch = np.array([[5, 6, 7, 0], [0, 0, 8, 9], [3, 0, 0, 0], [1, 2, 3, 4]], np.int32)
    >>> check_parity(model, flat, batch) < 1e-5  # 4 rows: two interpreter calls of 2
    True
    """
    _check_flatbuffer(tflite_bytes)
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or not np.issubdtype(token_ids.dtype, np.integer):
        raise ValueError(f"`token_ids` must be an int array [batch, length], got shape {token_ids.shape} "
                         f"and dtype {token_ids.dtype}.")
    spec = _ModelSpec.of(model, token_ids.shape[1], 1)
    if spec.needs_languages and language_ids is None:
        raise ValueError("The model scales positions per language: pass `language_ids`.")
    feeds = [token_ids.astype(np.int32)]
    if spec.needs_languages:
        feeds.append(np.asarray(language_ids).astype(np.int32))
    expected = np.asarray(spec.caller(model)(*[tf.constant(f) for f in feeds]), np.float64)
    got = run_interpreter(tflite_bytes, feeds).astype(np.float64)
    difference = np.abs(got - expected)
    if ignore_padding and spec.pad_id is not None and difference.shape[:2] == token_ids.shape:
        difference = difference[token_ids != spec.pad_id]
    return float(np.max(difference)) if difference.size else 0.0


def run_interpreter(tflite_bytes, feeds):
    """Runs the TFLite model on `feeds` (one array per input), in chunks of its batch size.

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).
        feeds: a list of numpy arrays, token ids first and language ids
            second; each of the exported shape except the first axis, which
            is a multiple of the exported batch size.

    Returns:
        A numpy array: the model's first output for all rows, concatenated.

    Example:

    >>> double = tf.function(lambda x: x * 2.0, input_signature=[tf.TensorSpec([1, 3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([double.get_concrete_function()]).convert()
    >>> run_interpreter(flat, [np.arange(6, dtype=np.float32).reshape(2, 3)]).tolist()
    [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    """
    interpreter = tf.lite.Interpreter(model_content=bytes(tflite_bytes))
    interpreter.allocate_tensors()
    # Token ids first, language ids second, whatever order the converter gave the inputs.
    inputs = sorted(interpreter.get_input_details(), key=lambda detail: "language_ids" in detail["name"])
    if len(inputs) != len(feeds):
        raise ValueError(f"The TFLite model has {len(inputs)} inputs, got {len(feeds)} arrays.")
    rows = int(inputs[0]["shape"][0])
    for detail, feed in zip(inputs, feeds):
        if tuple(detail["shape"][1:]) != feed.shape[1:] or len(feed) % rows:
            raise ValueError(f"Input '{detail['name']}' of shape {feed.shape} does not fit the exported "
                             f"shape {tuple(detail['shape'])} (same length, batch a multiple of it).")
    output = interpreter.get_output_details()[0]["index"]
    got = []
    for start in range(0, len(feeds[0]), rows):
        for detail, feed in zip(inputs, feeds):
            interpreter.set_tensor(detail["index"], feed[start:start + rows])
        interpreter.invoke()
        got.append(interpreter.get_tensor(output))
    return np.concatenate(got)


def weight_bytes(model):
    """Bytes of all trainable and non-trainable weights of `model`, at their stored dtype.

    Args:
        model: a built Keras model or layer.

    Returns:
        An int.

    Example:

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

    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> tokens, languages = sample_token_batch(model, 6)
    >>> (tokens != 0).astype(int).tolist(), languages
    ([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1]], None)
    """
    spec = _ModelSpec.of(model, sequence_length, 1)
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


def runtime_metadata(model, sequence_length, batch_size=1, *, quantize=None, gpu_friendly=True):
    """What a runtime-only runner needs to feed the exported model (`export/run_tflite.py` reads it).

    Args:
        model, sequence_length, batch_size, quantize, gpu_friendly: as in
            `to_tflite`.

    Returns:
        A JSON-ready dict: fixed shapes, vocab size, pad id, number of
        languages and the export options.

    Example:

    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> runtime_metadata(model, 6)  # doctest: +NORMALIZE_WHITESPACE
    {'sequence_length': 6, 'batch_size': 1, 'vocab_size': 50, 'pad_id': 0, 'num_languages': None,
     'inputs': ['token_ids'], 'quantize': None, 'gpu_friendly': True}
    """
    spec = _ModelSpec.of(model, sequence_length, batch_size)
    languages = [layer.num_languages for layer in spec.position_layers if layer.num_languages]
    return {
        "sequence_length": sequence_length,
        "batch_size": batch_size,
        "vocab_size": spec.vocab_size,
        "pad_id": spec.pad_id,
        "num_languages": min(languages) if languages else None,
        "inputs": [s.name for s in spec.signature()],
        "quantize": quantize,
        "gpu_friendly": gpu_friendly,
    }


def load_model(path):
    """Loads a `.keras`/`.h5` file or SavedModel directory with the keras_posenc layers registered.

    Args:
        path: path of the file or SavedModel directory.

    Returns:
        The `keras.Model`, not compiled.

    Raises:
        FileNotFoundError: nothing at `path`.
        ValueError: the file is not a loadable Keras model (corrupt, or it
            uses a custom layer that is not registered).

    Example:

    >>> load_model("no_such_model.keras")
    Traceback (most recent call last):
        ...
    FileNotFoundError: Model file not found: 'no_such_model.keras'.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"Model file not found: {path!r}.")
    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for corrupt or foreign files
        raise ValueError(f"Could not load a Keras model from {path!r}: {type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}. Is it a model saved by "
                         "keras_posenc, with every custom layer registered?") from error


def export_report(model, tflite_bytes, token_ids, language_ids=None):
    """Everything the `keras-posenc export` command prints, as a dict.

    Args:
        model: the Keras model that was exported.
        tflite_bytes: the flatbuffer from `to_tflite`.
        token_ids, language_ids: a batch for `check_parity`.

    Returns:
        A dict with keys `ops` (histogram), `gpu_incompatible` (list),
        `transpose_ops`, `flex_ops` (list), `parity` (max abs diff on real
        tokens), `parity_all` (padding included), `file_bytes`,
        `weight_bytes`, `size_ratio`.

    Example:

    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> flat = to_tflite(model, sequence_length=4)
    >>> report = export_report(model, flat, np.array([[5, 6, 0, 0]], np.int32))
    >>> report["gpu_incompatible"], report["flex_ops"], report["parity"] < 1e-5, report["weight_bytes"]
    ([], [], True, 1600)
    """
    ops = op_counts(tflite_bytes)
    return {
        "ops": ops,
        "gpu_incompatible": gpu_incompatible_ops(tflite_bytes),
        "transpose_ops": ops.get("TRANSPOSE", 0),
        "flex_ops": sorted(name for name in ops if name.startswith("Flex")),
        "parity": check_parity(model, tflite_bytes, token_ids, language_ids),
        "parity_all": check_parity(model, tflite_bytes, token_ids, language_ids, ignore_padding=False),
        "file_bytes": len(tflite_bytes),
        "weight_bytes": weight_bytes(model),
        "size_ratio": len(tflite_bytes) / max(1, weight_bytes(model)),
    }


def format_report(report):
    """Human-readable lines of an `export_report` dict.

    Args:
        report: a dict from `export_report`.

    Returns:
        A list of strings, one per line.

    Example:

    >>> report = {"ops": {"ADD": 1, "FULLY_CONNECTED": 2}, "gpu_incompatible": [], "transpose_ops": 0,
    ...           "parity": 0.0, "parity_all": 0.0, "file_bytes": 6328, "weight_bytes": 1600,
    ...           "size_ratio": 3.955}
    >>> for line in format_report(report)[:4]:
    ...     print(line)
    Op histogram:
      ADD                     1
      FULLY_CONNECTED         2
    GPU delegate: compatible (TFLite analyzer and op-level check found no rejected op)
    """
    lines = ["Op histogram:"]
    lines += [f"  {name:<24}{count}" for name, count in report["ops"].items()]
    if report["gpu_incompatible"]:
        lines.append("GPU delegate: NOT compatible; ops it rejects: " + ", ".join(report["gpu_incompatible"]))
    else:
        lines.append("GPU delegate: compatible (TFLite analyzer and op-level check found no rejected op)")
    lines.append(f"TRANSPOSE ops: {report['transpose_ops']} "
                 "(no shader on the OpenGL ES backend; see export/README.md)")
    lines.append(f"Parity vs Keras: max abs diff {report['parity']:.3g} on real tokens "
                 f"({report['parity_all']:.3g} with padding positions)")
    lines.append(f"File size: {report['file_bytes']} bytes = {report['size_ratio']:.3f} x the weight bytes "
                 f"({report['weight_bytes']}); frozen position tables and graph count toward the file")
    return lines


# Model inspection and rebuild ---------------------------------------------------------------
class _ModelSpec:
    """What the exporter needs to know about a model: its inputs and the fixed shapes."""

    def __init__(self, model, sequence_length, batch_size, position_layers, needs_languages,
                 language_rank):
        self.model = model
        self.sequence_length = sequence_length
        self.batch_size = batch_size
        self.position_layers = position_layers
        self.needs_languages = needs_languages
        self.language_rank = language_rank
        self.functional = bool(getattr(model, "_is_graph_network", False))

    @classmethod
    def of(cls, model, sequence_length, batch_size):
        if not isinstance(model, keras.layers.Layer):
            raise TypeError(f"`model` must be a keras Model or Layer, got {type(model).__name__}.")
        check_positive_int("sequence_length", sequence_length)
        check_positive_int("batch_size", batch_size)
        if not model.built:
            raise ValueError(f"Model '{model.name}' is not built: call it on a batch or load a trained "
                             "model.")
        layers = _all_layers(model)
        unknown = [layer for layer in layers if not _is_known(layer)]
        if unknown:
            names = ", ".join(f"'{layer.name}' ({type(layer).__module__}.{type(layer).__name__})"
                              for layer in unknown)
            raise ValueError(f"Model '{model.name}' contains layers the exporter does not know: {names}. "
                             "Only keras built-in layers and keras_posenc layers can be exported.")
        positions = [layer for layer in layers if isinstance(layer, PositionEmbeddingBase)]
        if not positions:
            raise ValueError(f"Model '{model.name}' contains no keras_posenc position layer "
                             "(TokenAndPositionEmbedding, SinusoidalPositionEmbedding, ...): "
                             "nothing to export with this tool.")
        longest = min(layer.max_length for layer in positions)
        if sequence_length > longest:
            raise ValueError(f"`sequence_length`={sequence_length} exceeds the model's max_length={longest}.")
        needs_languages = any(layer.num_languages is not None for layer in positions)
        language_rank = 2  # subclassed models get per-token language ids, the general case
        if needs_languages and getattr(model, "_is_graph_network", False):
            if len(model.inputs) != 2:
                raise ValueError(f"Model '{model.name}' scales positions per language: it must take "
                                 f"[token_ids, language_ids] as inputs, got {len(model.inputs)} inputs.")
            language_rank = model.inputs[1].shape.rank
        spec = cls(model, sequence_length, batch_size, positions, needs_languages, language_rank)
        embeddings = [layer for layer in layers if isinstance(layer, TokenAndPositionEmbedding)]
        spec.pad_id = embeddings[0].pad_id if embeddings else None
        spec.vocab_size = embeddings[0].vocab_size if embeddings else None
        return spec

    def signature(self):
        specs = [tf.TensorSpec([self.batch_size, self.sequence_length], tf.int32, name="token_ids")]
        if self.needs_languages:
            shape = [self.batch_size, self.sequence_length][:self.language_rank]
            specs.append(tf.TensorSpec(shape, tf.int32, name="language_ids"))
        return specs

    def caller(self, model):
        functional = bool(getattr(model, "_is_graph_network", False))

        def call(token_ids, language_ids=None):
            if language_ids is None:
                return model(token_ids, training=False)
            if functional:
                return model([token_ids, language_ids], training=False)
            return model(token_ids, language_ids=language_ids, training=False)

        return call


def _all_layers(model):
    return [model] + [m for m in model.submodules if isinstance(m, keras.layers.Layer)]


def _is_known(layer):
    module = type(layer).__module__
    return module.split(".")[0] in ("keras", "keras_posenc") or module.startswith("tensorflow.python.keras")


@contextlib.contextmanager
def _float32_policy():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _float32_config(config):
    config = dict(config)
    if "dtype" in config:
        config["dtype"] = "float32"
    return config


def _rebuild(model, spec):
    """Same architecture and weights, fixed input shapes, float32 compute."""
    with _float32_policy():
        if spec.functional:
            inputs = [keras.Input(batch_size=s.shape[0], shape=s.shape[1:], dtype=s.dtype)
                      for s in spec.signature()]
            clone = keras.models.clone_model(
                model, input_tensors=inputs,
                clone_function=lambda layer: type(layer).from_config(_float32_config(layer.get_config())))
        else:
            clone = type(model).from_config(_float32_config(model.get_config()))
            spec.caller(clone)(*[tf.zeros(s.shape, s.dtype) for s in spec.signature()])
    weights = model.get_weights()
    clone_shapes = [w.shape for w in clone.get_weights()]
    if clone_shapes != [w.shape for w in weights]:
        raise ValueError(f"Could not rebuild model '{model.name}' from its config: the rebuilt weights "
                         "differ in number or shape; does every custom layer have a complete get_config?")
    clone.set_weights([np.asarray(w, np.float32) if w.dtype == np.float16 else w for w in weights])
    for layer in _all_layers(clone):
        if isinstance(layer, PositionEmbeddingBase):
            layer.overflow = "error"  # exported positions stay inside the table
    return clone


# Export formulation of the keras_posenc layers ---------------------------------------------------
class _ExportPositionEmbedding:
    """Mixin: the position layer's call with ops the GPU delegate runs (no GATHER or SELECT)."""

    def call(self, inputs, position_ids=None, language_ids=None, mask=None, training=None):
        length = inputs.shape[1]
        if position_ids is not None:
            table = self._table_prefix(self.max_length)
            pe = tf.matmul(_one_hot(position_ids, self.max_length), table)
            pe = tf.broadcast_to(pe, tf.shape(inputs))
        elif mask is not None:
            real = tf.cast(mask, tf.float32)
            # Inclusive cumsum minus the token itself, times the mask: real tokens 0, 1, ...
            # whatever the left padding; padding 0. Exact in float32 for any length < 2**24.
            ids = (tf.cumsum(real, axis=1) - real) * real
            pe = tf.matmul(_one_hot(ids, length), self._table_prefix(length))
        else:
            pe = self._table_prefix(length)[None]
        if self.zero_padding and mask is not None:
            pe = pe * _with_unit_axis(tf.cast(mask, tf.float32))
        if self.num_languages is not None:
            # MUL + SUM, not a matmul: the converter rewrites a 2-D one-hot matmul as EMBEDDING_LOOKUP.
            scales = tf.reduce_sum(_one_hot(language_ids, self.num_languages) * self.language_scale, axis=-1)
            per_row = language_ids.shape.rank == 1
            pe = pe * (tf.reshape(scales, [-1, 1, 1]) if per_row else _with_unit_axis(scales))
        return inputs + tf.cast(pe, inputs.dtype)


class _ExportTokenAndPositionEmbedding:
    """Mixin: the token lookup as one_hot(ids) @ embeddings (FULLY_CONNECTED, no GATHER)."""

    def call(self, token_ids, position_ids=None, language_ids=None, segment_ids=None, training=None):
        mask = tf.not_equal(token_ids, self.pad_id)
        x = tf.matmul(_one_hot(token_ids, self.vocab_size), self.token_embedding.embeddings)
        if self.scale_embeddings:
            x = x * math.sqrt(self.d_model)
        return self.position_embedding(x, position_ids=position_ids, language_ids=language_ids,
                                       mask=mask, training=False)


def _one_hot(ids, depth):
    """float32 one-hot rows as EQUAL + CAST.

    Not `tf.one_hot`: float16 quantization turns its on/off scalars into
    DEQUANTIZE outputs, and the GPU delegate needs them constant.
    """
    classes = tf.range(depth, dtype=ids.dtype)
    return tf.cast(tf.equal(_with_unit_axis(ids), classes), tf.float32)


def _with_unit_axis(tensor):
    # A static reshape, not tensor[..., None]: the GPU delegate's STRIDED_SLICE takes 3-D and 4-D only.
    return tf.reshape(tensor, tensor.shape.as_list() + [1])


_EXPORT_MIXINS = ((TokenAndPositionEmbedding, _ExportTokenAndPositionEmbedding),
                  (PositionEmbeddingBase, _ExportPositionEmbedding))
_EXPORT_CLASSES = {}


def _use_export_layers(model):
    """Switches the keras_posenc layers of a rebuilt (throw-away) model to their export call."""
    for layer in _all_layers(model):
        for base, mixin in _EXPORT_MIXINS:
            if isinstance(layer, base) and not isinstance(layer, mixin):
                cls = type(layer)
                if cls not in _EXPORT_CLASSES:
                    _EXPORT_CLASSES[cls] = type(f"Export{cls.__name__}", (mixin, cls), {})
                layer.__class__ = _EXPORT_CLASSES[cls]
                break


# Flatbuffer reading ---------------------------------------------------------------------------
def _check_flatbuffer(tflite_bytes):
    if not isinstance(tflite_bytes, (bytes, bytearray)):
        raise TypeError(f"`tflite_bytes` must be bytes, got {type(tflite_bytes).__name__}.")
    if len(tflite_bytes) < 8 or bytes(tflite_bytes[4:8]) != b"TFL3":
        raise ValueError("`tflite_bytes` is not a TFLite flatbuffer (no 'TFL3' identifier).")


def _op_sequence(tflite_bytes):
    """Op names of every operator of every subgraph, in execution order."""
    from tensorflow.lite.python import schema_py_generated as schema

    _check_flatbuffer(tflite_bytes)
    flat = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(bytes(tflite_bytes), 0))
    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    codes = []
    for code in flat.operatorCodes:
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        if builtin == schema.BuiltinOperator.CUSTOM:
            custom = code.customCode
            codes.append(custom.decode() if isinstance(custom, bytes) else str(custom))
        else:
            codes.append(names.get(builtin, f"BUILTIN_{builtin}"))
    return [codes[op.opcodeIndex] for graph in flat.subgraphs for op in (graph.operators or [])]
