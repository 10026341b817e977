"""Conversion: a Keras model with keras_posenc layers -> a TFLite flatbuffer or an ONNX model.

`to_tflite` rebuilds the model with fixed input shapes under the float32 policy (`model_spec`), copies its
weights, binds the formulation of the chosen target to each keras_posenc layer
(`keras_posenc.export.emitters`, `keras_posenc.export.gl`), freezes every position table and
language scale as a constant and converts with `TFLITE_BUILTINS` only: Flex (`SELECT_TF_OPS`)
ops never run on a GPU and need the full TensorFlow runtime on the device. `to_onnx` does the
same for the `tensorrt` target through tf2onnx.

Targets (`TARGETS`):

- `gpu` (default): the LiteRT GPU accelerator (WebGPU/Vulkan, JetPack 6) and the OpenCL GPU
  delegate. int32 inputs, cast once to float (ids above 2048 split into digits by FLOOR_DIV
  first, exact in float16); the lookups of `gl` (one-hot products by constant weights instead of
  GATHER, no STRIDED_SLICE or CUMSUM): the token lookup costs `T * vocab * d_model`
  multiply-adds with `embedding="graph"`, none with `embedding="host"` (the runner feeds the
  looked-up rows), the price of keeping every op on the GPU (a LiteRT GPU run of the
  one-hot/EQUAL/CUMSUM graph gave wrong logits on lavapipe). Attention by BATCH_MATMUL and
  LayerNorm by MEAN, which this accelerator runs and GL does not (`keras_posenc.export.gpu`).
  Finite and close to float32 in the accelerator's float16 mode. Any batch size.
- `gl`: the classic GPU delegate's OpenGL ES backend (Jetson with tflite-runtime): the same
  graph with float32 inputs (GL has no CAST shader), see `keras_posenc.export.gl`. Batch 1.
- `cpu`: XNNPACK, GATHER lookups (the smallest compute).
- `tensorrt`: ONNX (opset 17), static shapes, int32 ids, for `trtexec --onnx`.
"""


import numpy as np
import tensorflow as tf

from keras_posenc.backend import static_function
from keras_posenc.export import contract, onnx_graph
from keras_posenc.export.formulation import ExportContext
from keras_posenc.export.formulations import FORMULATIONS
from keras_posenc.export.kinds import WINDOW
from keras_posenc.export.model_spec import (
    HOST_EMBEDDINGS,
    ModelSpec,
    all_layers,
    host_embedding_table,
    rebuild,
    traced,
)
from keras_posenc.export.onnx_tools import import_tf2onnx
from keras_posenc.export.quantization import QUANTIZE_MODES, quantize_onnx, quantize_tflite, recipe_for
from keras_posenc.export.targets import DEFAULT_TARGET, TARGETS, TFLITE, target_of
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.validation import check_choice, check_positive_int

__all__ = ["EMBEDDINGS", "ONNX_OPSET", "QUANTIZE_MODES", "check_batch_size", "convert_onnx", "convert_tflite",
           "keep_batch_matmul", "onnx_opset", "to_onnx", "to_tflite"]

EMBEDDINGS = ("graph", "host")
ONNX_OPSET = 17


def to_tflite(model, *, sequence_length, target=DEFAULT_TARGET, batch_size=1, quantize=None,
              embedding="graph", litert_python=None):
    """Converts a Keras model built on keras_posenc layers to a TFLite flatbuffer for `target`.

    The model is rebuilt with fixed input shapes `[batch_size, sequence_length]`
    and float32 compute (a `mixed_float16` model converts only with Flex ops
    otherwise), the weights are copied, and the traced graph is converted with
    builtin ops only. Position tables of every kind end up as constants.

    Inputs of the model: the token ids `[batch, length]` first (int32; float32
    for `target="gl"`); when a position layer has `num_languages`, the
    language ids (`[batch]` or `[batch, length]`) second. A functional model
    takes them as a list, a subclassed model as
    `model(token_ids, language_ids=...)`.

    Args:
        model: a `keras.Model` or layer containing keras_posenc layers, built
            with keras and keras_posenc layers only.
        sequence_length: int, the fixed length; at most the model's
            `max_length`.
        target: one of `TARGETS` ("gpu", "gl", "cpu"; "tensorrt" is
            `to_onnx`), see the module docstring.
        batch_size: int, the fixed batch size (1 for `target="gl"`).
        quantize: None (float32), "float16" (float16 weights, float32 compute),
            "int8" (int8 weights, float activations; "dynamic_int8" is its older name) or
            "int4" (4-bit weights; not on `gl`): the recipe of
            `keras_posenc.export.quantization.RECIPES` for the target.
        embedding: "graph" (the file looks the token ids up) or "host" (gpu and
            gl: the file takes the rows `host_embedding_table(model)[token_ids]`
            as a float32 input `embeddings` `[batch, T, d_model]`, after its
            other inputs; the token ids still come first, for the padding mask).
            `default_embedding` says which is faster on a GPU.
        litert_python: the Python with LiteRT Quantizer, for int4 (default
            `litert_python.runtime_python`).

    Returns:
        The `.tflite` flatbuffer as bytes.

    Raises:
        TypeError: `model` is not a Keras layer or model, or a size is not an
            int.
        ValueError: the model is not built, has no keras_posenc position layer
            or layers of other packages, `sequence_length` exceeds its
            `max_length`, `target` or `quantize` is unknown or refused for the
            target, or conversion with builtin ops fails.

    Example:

    >>> from keras_posenc.backend import keras
    >>> from keras_posenc.export import gpu_incompatible_ops, op_counts, check_parity
    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> flat = to_tflite(model, sequence_length=6)
    >>> gpu_incompatible_ops(flat, backend="webgpu")  # no GATHER, no Flex
    []
    >>> "GATHER" in op_counts(to_tflite(model, sequence_length=6, target="cpu"))
    True
    >>> batch = np.array([[5, 6, 7, 0, 0, 0]], np.int32)
    >>> check_parity(model, flat, batch) < 1e-5
    True
    >>> to_tflite(model, sequence_length=32)
    Traceback (most recent call last):
        ...
    ValueError: `sequence_length`=32 exceeds the model's max_length=16.

    References:
        - [LiteRT GPU acceleration](https://ai.google.dev/edge/litert/performance/gpu).
        - [Select TensorFlow operators (Flex)](https://www.tensorflow.org/lite/guide/ops_select):
          why builtin ops only.
        - [Post-training quantization](https://www.tensorflow.org/lite/performance/post_training_quantization):
          the `quantize` modes.
    """
    spec = ModelSpec.of(model, sequence_length, batch_size)
    return convert_tflite(spec, target=target, quantize=quantize, embedding=embedding,
                          litert_python=litert_python)


def convert_tflite(spec, *, target=DEFAULT_TARGET, quantize=None, embedding="graph", litert_python=None):
    """`to_tflite` for a `ModelSpec` (its model, sequence length and batch size)."""
    model = spec.model
    target = target_of(target)
    if target.file_format is not TFLITE:
        raise ValueError(f"target={target.name!r} exports {target.file_format.name.upper()}: use "
                         "to_onnx(model, sequence_length=...).")
    recipe = recipe_for(target, quantize, WINDOW, litert_python=litert_python)
    check_batch_size(spec.batch_size, target)
    check_choice("embedding", embedding, EMBEDDINGS)
    if embedding == "host":
        if not target.host_embedding:
            raise ValueError(f"`embedding='host'` is for the gpu and gl targets (their lookup is a one-hot "
                             f"product) and tensorrt (to_onnx); target={target.name!r} GATHERs: use "
                             "embedding='graph'.")
        host_embedding_table(model)  # ValueError without a token table
    context = ExportContext(target, FORMULATIONS)
    clone = rebuild(model, spec, context)
    signature = spec.signature(target.input_dtype)
    call = traced(spec.caller(clone), context, host_embeddings=embedding == "host")
    if embedding == "host":
        signature = signature + [_host_embeddings_spec(clone, spec)]
    function = static_function(call, input_signature=signature)
    # Without a trackable object the converter freezes the function's variables itself (both
    # stacks' converters) and imports that graph directly, instead of saving and reloading a
    # SavedModel that also holds the clone's variables (about 1 GB less peak memory at d_model 512,
    # 6 layers, T = 512). Freezing it here first as well would import the graph twice.
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if target.keep_batch_matmul:
        keep_batch_matmul(converter)
    if recipe is not None:
        recipe.configure(converter)
    try:
        flat = converter.convert()
    except Exception as error:  # the converter raises its own ConverterError type
        raise ValueError(
            f"TFLite conversion with builtin ops only failed for model '{model.name}': {error}") from error
    return quantize_tflite(flat, recipe, litert_python=litert_python)


def keep_batch_matmul(converter):
    """Makes a `TFLiteConverter` keep BATCH_MATMUL, which it would unroll into per-head FULLY_CONNECTED."""
    if hasattr(converter, "unfold_batchmatmul"):
        converter.unfold_batchmatmul = False
    else:  # TF 2.12: the same switch, private
        converter._experimental_disable_batchmatmul_unfold = True


def to_onnx(model, *, sequence_length, batch_size=1, opset=ONNX_OPSET, embedding="graph", quantize=None,
            calibration=None):
    """Converts the model to ONNX for TensorRT (`target="tensorrt"`): static shapes, int32 ids.

    Uses tf2onnx 1.17.0 and onnxruntime, which both locks install (TF 2.12's on Python 3.10+:
    `onnx_tools`). On Keras 3 the model's variables are read by the traced function, and tf2onnx
    folds them into initializers.

    Args:
        model, sequence_length, batch_size: as in `to_tflite`.
        opset: int >= 17, the ONNX opset.
        embedding: "graph" (GATHER from the token table in the file) or "host"
            (the file takes `host_embedding_table(model)[token_ids]` as a
            float32 input `embeddings` `[batch, T, d_model]` after its int32
            inputs, and holds no token table; export/jetson/run_tensorrt.py feeds it).
        quantize: None, "float16", "int8" or "int4" (`quantization.RECIPES["tensorrt"]`).
        calibration: int8: int token rows `[n, sequence_length]` of real text whose activations
            set the QDQ scales (`export_and_check` passes its parity rows).

    Returns:
        The serialized ONNX `ModelProto` as bytes: constants folded (no shape arithmetic left),
        the output named `logits` (`contract.TENSORS`) with its static shape (`onnx_graph.finish`).

    Raises:
        tool_env.ToolEnvironmentError: tf2onnx (or onnxruntime) is not installed (one line:
            `onnx_tools.missing_message`).
        ValueError: as in `to_tflite`, or `opset` < 17.
    """
    spec = ModelSpec.of(model, sequence_length, batch_size)
    recipe = recipe_for(TARGETS["tensorrt"], quantize, WINDOW)
    return convert_onnx(spec, opset=opset, embedding=embedding, recipe=recipe, calibration=calibration)


def convert_onnx(spec, *, opset=ONNX_OPSET, embedding="graph", recipe=None, calibration=None):
    """`to_onnx` for a `ModelSpec`; `recipe`: the `quantization.Recipe` of its precision, or None."""
    check_positive_int("opset", opset, minimum=17)
    check_choice("embedding", embedding, EMBEDDINGS)
    if embedding == "host":
        host_embedding_table(spec.model)  # ValueError without a token table
    tf2onnx = import_tf2onnx()  # with onnxruntime, which folds the constants and checks the file
    context = ExportContext(target_of("tensorrt"), FORMULATIONS)
    clone = rebuild(spec.model, spec, context)
    signature = spec.signature(context.target.input_dtype)
    call = traced(spec.caller(clone), context, host_embeddings=embedding == "host")
    if embedding == "host":
        signature = signature + [_host_embeddings_spec(clone, spec)]
    function = static_function(call, input_signature=signature)
    proto, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=opset)
    # tf2onnx names the output after its TensorFlow tensor (`Identity:0`): the contract's name.
    names = [contract.TENSORS["logits"]] if len(proto.graph.output) == 1 else None
    folded = onnx_graph.finish(proto.SerializeToString(), names)
    # Only int8's activation scales are calibrated; float16 rounds the weights.
    calibrated = recipe is not None and recipe.precision == "int8"
    feeds = _calibration_feeds(spec, calibration, embedding) if calibrated else ()
    return quantize_onnx(folded, recipe, feeds)


def _calibration_feeds(spec, token_ids, embedding):
    """One feed dict per exported batch of `token_ids`, by the ONNX input names (int8's calibration)."""
    if token_ids is None:
        raise ValueError("an int8 ONNX export needs `calibration`: int token rows [n, sequence_length] of "
                         "real text, whose activations set the QDQ scales.")
    token_ids, language_ids = np.asarray(token_ids, np.int32), None
    if spec.needs_languages:
        shape = token_ids.shape if spec.language_rank == 2 else token_ids.shape[:1]
        language_ids = np.zeros(shape, np.int32)
    arrays = dict(zip(spec.roles, spec.feeds(token_ids, language_ids=language_ids)))
    if embedding == "host":
        arrays[HOST_EMBEDDINGS] = host_embedding_table(spec.model)[arrays["token_ids"]]
    rows = (len(token_ids) // spec.batch_size) * spec.batch_size
    return [{name: array[start:start + spec.batch_size] for name, array in arrays.items()}
            for start in range(0, rows, spec.batch_size)]


def onnx_opset(model_bytes):
    """The default-domain opset of a serialized ONNX model."""
    import onnx

    model = onnx.load_from_string(bytes(model_bytes))
    return next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))


def _host_embeddings_spec(clone, spec):
    """The last input of an `embedding="host"` file: the looked-up rows, read by the gl/gpu formulation."""
    layers = [layer for layer in all_layers(clone) if isinstance(layer, TokenAndPositionEmbedding)]
    return tf.TensorSpec([spec.batch_size, spec.sequence_length, layers[0].d_model], tf.float32,
                         name=HOST_EMBEDDINGS)


def check_batch_size(batch_size, target):
    """ValueError when `target` runs a smaller batch than `batch_size`."""
    if target.max_batch is not None and batch_size > target.max_batch:
        raise ValueError(f"target={target.name!r} exports batch {target.max_batch} only (the GL delegate "
                         f"takes the first axis of every tensor for the batch), got batch_size={batch_size}.")


