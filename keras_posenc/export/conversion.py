"""Conversion: a Keras model with keras_posenc layers -> a TFLite flatbuffer or an ONNX model.

`to_tflite` rebuilds the model with fixed input shapes under the float32 policy, copies its
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

import contextlib
import math
import os

import numpy as np
import tensorflow as tf

from keras_posenc import models as _models  # noqa: F401  (registers Encoder and CausalLM for load_model)
from keras_posenc.backend import is_functional, keras, model_input_names
from keras_posenc.export import contract, onnx_graph
from keras_posenc.export.formulation import ExportContext, formulate
from keras_posenc.export.formulations import FORMULATIONS
from keras_posenc.export.onnx_tools import import_tf2onnx
from keras_posenc.export.quantization import QUANTIZE_MODES, quantize_onnx, quantize_tflite, recipe_for
from keras_posenc.export.targets import TARGETS, target_of
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.layers.rope_scaling import DYNAMIC_SCALINGS
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.validation import check_choice, check_positive_int

__all__ = ["EMBEDDINGS", "HOST_EMBEDDINGS", "ONNX_OPSET", "QUANTIZE_MODES", "TARGETS", "ModelSpec",
           "convert_onnx", "convert_tflite", "default_embedding", "host_embedding_table", "load_model",
           "longest_sequence", "onnx_opset", "rebuild", "to_onnx", "to_tflite"]

EMBEDDINGS = ("graph", "host")
ONNX_OPSET = 17


def default_embedding(model, target):
    """The faster token lookup on a GPU: "host" for the gpu and gl targets of a model with a token table.

    The cost model: `embedding="graph"` looks a token up as a one-hot row times the table on the
    GPU, `T * vocab * d_model` multiply-adds (2.1 G at T = 512, vocab 8000, d_model 512: a
    sixth of the whole encoder's); `embedding="host"` moves `T * d_model` floats instead of T
    ids to the GPU (1 MiB at that size) and costs the GPU nothing. The `cpu` and `tensorrt`
    targets GATHER, which costs `T * d_model` copies: "graph" (`Target.default_embedding`).
    """
    return target_of(target).default_embedding(
        any(isinstance(layer, TokenAndPositionEmbedding) for layer in _all_layers(model)))


def to_tflite(model, *, sequence_length, target="gpu", batch_size=1, quantize=None, embedding="graph",
              litert_python=None):
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


def convert_tflite(spec, *, target="gpu", quantize=None, embedding="graph", litert_python=None):
    """`to_tflite` for a `ModelSpec` (its model, sequence length and batch size)."""
    model = spec.model
    target = target_of(target)
    if target.file_format != "tflite":
        raise ValueError(f"target={target.name!r} exports {target.file_format.upper()}: use "
                         "to_onnx(model, sequence_length=...).")
    recipe = recipe_for(target, quantize, "window", litert_python=litert_python)
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
    function = tf.function(call, input_signature=signature)
    # A frozen function reads no variable: without a trackable object the converter imports the
    # frozen graph directly, instead of saving and reloading a SavedModel that also holds the
    # clone's variables (about 1 GB less peak memory at d_model 512, 6 layers, T = 512).
    converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen_function(function)])
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
    return convert_onnx(spec, opset=opset, embedding=embedding, recipe=recipe_for("tensorrt", quantize),
                        calibration=calibration)


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
    function = tf.function(call, input_signature=signature)
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
    layers = [layer for layer in _all_layers(clone) if isinstance(layer, TokenAndPositionEmbedding)]
    return tf.TensorSpec([spec.batch_size, spec.sequence_length, layers[0].d_model], tf.float32,
                         name=HOST_EMBEDDINGS)


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
        model = keras.models.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for corrupt or foreign files
        raise ValueError(f"Could not load a Keras model from {path!r}: {type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}. Is it a model saved by "
                         "keras_posenc, with every custom layer registered?") from error
    if isinstance(model, Seq2SeqTransformer):
        raise ValueError(f"{path!r} holds an encoder-decoder translator (Seq2SeqTransformer): the export "
                         "targets take decoder-only and window models; translate it with `keras-posenc "
                         "translate` (Keras) for now.")
    return model



ROLES = tuple(contract.TENSORS[role] for role in ("token_ids", "language_ids", "position_ids", "segment_ids"))


# The input of a file exported with `embedding="host"`: the looked-up token rows [batch, T, d_model].
HOST_EMBEDDINGS = contract.TENSORS["embeddings"]


def role_of(name):
    """The input role (`ROLES`, or `HOST_EMBEDDINGS`) a tensor name stands for; token ids by default."""
    if HOST_EMBEDDINGS in name:
        return HOST_EMBEDDINGS
    return next((role for role in ROLES[1:] if role in name), "token_ids")


def host_embedding_table(model):
    """The token table that an `embedding="host"` file reads its rows from, `sqrt(d_model)` included.

    float32 `[vocab_size, d_model]`: the runner feeds `table[token_ids]` as the `embeddings` input.

    Raises:
        ValueError: the model has no token embedding (`TokenAndPositionEmbedding`).
    """
    layers = [layer for layer in _all_layers(model) if isinstance(layer, TokenAndPositionEmbedding)]
    if not layers:
        raise ValueError(f"`embedding='host'` needs a token embedding, and model '{model.name}' has no "
                         "TokenAndPositionEmbedding: export it with embedding='graph'.")
    layer = layers[0]
    table = np.asarray(layer.token_embedding.embeddings.numpy(), np.float32)
    return table * np.float32(math.sqrt(layer.d_model)) if layer.scale_embeddings else table


class ModelSpec:
    """What the exporter needs to know about a model: its inputs (by role) and the fixed shapes.

    A functional model's inputs are recognised by their names (`keras.Input(name="position_ids")`,
    `"segment_ids"`, `"language_ids"`); the first input is the token ids, and an unnamed second
    input of a model with `num_languages` is the language ids. Subclassed models take token ids
    and, with `num_languages`, `language_ids=`.
    """

    def __init__(self, model, sequence_length, batch_size, position_layers, roles, ranks, pad_id=None,
                 vocab_size=None):
        self.model = model
        self.pad_id = pad_id
        self.vocab_size = vocab_size
        self.sequence_length = sequence_length
        self.batch_size = batch_size
        self.position_layers = position_layers
        self.roles = roles
        self.ranks = ranks
        self.needs_languages = "language_ids" in roles
        self.language_rank = ranks[roles.index("language_ids")] if self.needs_languages else None
        self.functional = is_functional(model)

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
        shortest = longest_sequence(model)
        if sequence_length > shortest:
            raise ValueError(
                f"`sequence_length`={sequence_length} exceeds the model's max_length={shortest}.")
        needs_languages = any(layer.num_languages is not None for layer in positions)
        roles, ranks = ["token_ids"], [2]
        if is_functional(model):
            input_names = model_input_names(model)
            for index, tensor in enumerate(model.inputs[1:], start=1):
                role = role_of(input_names[index])
                if role == "token_ids" and index == 1 and needs_languages:
                    role = "language_ids"
                if role == "token_ids" or role in roles:
                    raise ValueError(f"Model '{model.name}': input {index} ('{input_names[index]}') is "
                                     f"not one of {ROLES[1:]}; name the inputs with keras.Input(name=...).")
                roles.append(role)
                ranks.append(len(tensor.shape))
            if needs_languages and "language_ids" not in roles:
                raise ValueError(f"Model '{model.name}' scales positions per language: it must take "
                                 f"[token_ids, language_ids] as inputs, got {len(model.inputs)} inputs.")
        elif needs_languages:
            roles.append("language_ids")
            ranks.append(2)  # subclassed models get per-token language ids, the general case
        embeddings = [layer for layer in layers if isinstance(layer, TokenAndPositionEmbedding)]
        return cls(model, sequence_length, batch_size, positions, roles, ranks,
                   pad_id=embeddings[0].pad_id if embeddings else None,
                   vocab_size=embeddings[0].vocab_size if embeddings else None)

    def signature(self, dtype=tf.int32):
        """Input specs in the model's input order; float32 for the gl target."""
        return [tf.TensorSpec([self.batch_size, self.sequence_length][:rank], dtype, name=role)
                for role, rank in zip(self.roles, self.ranks)]

    def caller(self, model):
        """`call(*inputs)` in the order of `roles`, with training=False."""
        functional = is_functional(model)

        def call(*inputs):
            if len(inputs) == 1:
                return model(inputs[0], training=False)
            if functional:
                return model(list(inputs), training=False)
            return model(inputs[0], language_ids=inputs[1], training=False)

        return call

    def feeds(self, token_ids, **others):
        """The arrays of `token_ids` and `others` (by role) in input order; ValueError if one is missing."""
        arrays = {"token_ids": token_ids, **others}
        missing = [role for role in self.roles if arrays.get(role) is None]
        if missing:
            raise ValueError(f"Model '{self.model.name}' takes {list(self.roles)}: pass "
                             + ", ".join(f"`{role}`" for role in missing) + ".")
        return [np.asarray(arrays[role]).astype(np.int32) for role in self.roles]


def longest_sequence(model):
    """The longest sequence `model` takes: the shortest of its position tables (RoPE cos/sin included).

    Keras refuses a longer row in any of them. None without a keras_posenc position layer.
    """
    layers = _all_layers(model)
    lengths = [layer.max_length for layer in layers if isinstance(layer, PositionEmbeddingBase)]
    lengths += [layer.max_length for layer in layers
                if isinstance(layer, RotaryEmbedding) and layer.max_length is not None]
    return min(lengths) if lengths else None


def frozen_function(function):
    """The concrete function of `function` with every variable it reads folded in as a constant.

    The converter freezes the variables of a Keras 2 model itself; a Keras 3 model's variables
    are not tracked by the function, so they would stay VAR_HANDLE/READ_VARIABLE ops that the
    runtime never initialises (garbage outputs, and no GPU runs them). Frozen here for both.
    """
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    return convert_variables_to_constants_v2(function.get_concrete_function())


def _all_layers(model):
    # _flatten_layers: Keras 2 and Keras 3 (a Keras 3 model is no tf.Module: no `submodules`); a
    # Keras 3 op of a functional graph (`x + y` is an `ops.Add`) is no layer and has neither.
    flatten = getattr(model, "_flatten_layers", None)
    layers = flatten(include_self=False) if flatten is not None else []
    return [model] + [m for m in layers if isinstance(m, keras.layers.Layer)]


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


def check_batch_size(batch_size, target):
    """ValueError when `target` runs a smaller batch than `batch_size`."""
    if target.max_batch is not None and batch_size > target.max_batch:
        raise ValueError(f"target={target.name!r} exports batch {target.max_batch} only (the GL delegate "
                         f"takes the first axis of every tensor for the batch), got batch_size={batch_size}.")


def rebuild(model, spec, context=None):
    """Same architecture and weights, fixed input shapes, float32 compute, the formulations of `context`.

    The float32 clone of each layer is built from its config; with an `ExportContext`, a
    functional model is cloned with its formulated layers wrapped (`formulation.formulate`), any
    other model is built by one call of its own and then wrapped; without one, the plain clone
    (int32 inputs). The formulations read the weights when traced inside `context.tracing()`
    (after `set_weights`): the trained values, frozen as constants.
    """
    dtype = context.target.input_dtype if context is not None else tf.int32

    def clone_layer(layer):
        return type(layer).from_config(_float32_config(layer.get_config()))

    with _float32_policy():
        if spec.functional:
            inputs = [keras.Input(batch_size=s.shape[0], shape=s.shape[1:], dtype=s.dtype)
                      for s in spec.signature(dtype)]
            if not isinstance(model.input, (list, tuple)):
                inputs = inputs[0]  # Keras 3 wants the structure of model.input
            clone = formulate(model, context, input_tensors=inputs, clone_layer=clone_layer)
        else:
            clone = clone_layer(model)
            spec.caller(clone)(*[tf.zeros(s.shape, s.dtype) for s in spec.signature(tf.int32)])
    weights = model.get_weights()
    clone_shapes = [w.shape for w in clone.get_weights()]
    if clone_shapes != [w.shape for w in weights]:
        raise ValueError(f"Could not rebuild model '{model.name}' from its config: the rebuilt weights "
                         "differ in number or shape; does every custom layer have a complete get_config?")
    clone.set_weights([np.asarray(w, np.float32) if w.dtype == np.float16 else w for w in weights])
    for layer in _all_layers(clone):
        if isinstance(layer, RotaryEmbedding):
            layer.freeze(spec.sequence_length)  # "dynamic"/"longrope": the tables of length T
    if not spec.functional and context is not None:
        clone = formulate(clone, context)
    return clone


def traced(call, context, host_embeddings=False):
    """`call` run inside one trace of `context` (with `host_embeddings`: the rows as the last input)."""
    def run(*inputs):
        rows = inputs[-1] if host_embeddings else None
        with context.tracing(host_rows=rows):
            return call(*(inputs[:-1] if host_embeddings else inputs))

    return run


def rope_notes(model, sequence_length):
    """One line per RoPE layer whose scaling depends on the call length: what the export froze."""
    return [f"RoPE '{layer.name}' (scaling={layer.scaling!r}): cos/sin frozen for calls of the exported "
            f"length {sequence_length} (max(position_ids) + 1 = {sequence_length}); the Keras layer "
            "switches frequencies by each call's length" for layer in _all_layers(model)
            if isinstance(layer, RotaryEmbedding) and layer.scaling in DYNAMIC_SCALINGS]


