"""Quantized exports: which quantizer, with which recipe, for each target, file kind and precision.

`--quantize float16 | int8 | int4` (`dynamic_int8` is the older name of int8). Every
quantization is done by a maintained quantizer, chosen per target by measurement
(benchmarks/RESULTS.md, "Quantized exports"); `RECIPES` is the one table of those choices, and a
combination a runtime cannot run is refused there, by `recipe_for`, before anything is converted:

- TFLite files, float16 and int8: the TFLite converter (`Optimize.DEFAULT`; float16 weights, or
  int8 dynamic-range weights, float32 activations: per output channel for CONV_2D; per tensor for
  FULLY_CONNECTED and the token table on TF 2.12, per channel on TF 2.21 except on `gl`, whose
  delegate refuses that op version). LiteRT's GPU accelerator runs the int8 `gpu` file fully on
  the GPU and the GL delegate the `gl` file (both dequantize the weights), XNNPACK runs them with
  integer kernels, and TFLite 2.12 (Jetson's tflite-runtime) computes the `cpu` file right (not
  the shader graphs of `gpu`/`gl`: `Recipe.runtime`). LiteRT Quantizer's int8 files were larger
  (a float scale and an int64 zero point per output channel: +12 bytes a row of the demo's
  64-wide head, 0.35-0.39x of float32 where the converter's are 0.31-0.34x) and TFLite 2.12
  computes them wrong.
- TFLite files, int4: LiteRT Quantizer (the only quantizer with 4-bit weights): FULLY_CONNECTED
  weights in blocks of 32 (XNNPACK's blockwise kernels) and the token table's EMBEDDING_LOOKUP
  per row on `cpu`; per output channel on `gpu` (LiteRT's GPU accelerator runs 4-bit
  CONV_2D/FULLY_CONNECTED). Its files need LiteRT 2.x (ai-edge-litert, or TensorFlow >= 2.21's
  interpreter): TFLite 2.12 does not run 4-bit weights. The GL delegate refuses them
  ("TfLiteGpuDelegate failed to prepare"): int4 on `gl` is refused.
- ONNX (`tensorrt`): onnxruntime's float16 conversion (float32 inputs and outputs kept) and its
  static QDQ int8 quantization (TensorRT's explicit-quantization format, calibrated on real rows).
  Its 4-bit quantizer (weight-only QDQ) quantizes MatMul weights only, so int4 is refused there.

The host embedding table of an `embedding="host"` export takes the same precision
(`keras_posenc.export.host_table`).
"""

import contextlib
import dataclasses
import os
import tempfile

import numpy as np
import tensorflow as tf

from keras_posenc.export import host_table, onnx_graph
from keras_posenc.export.kinds import LITERTLM, PREFILL_DECODE, TRANSLATE, WINDOW, kind_of
from keras_posenc.export.litert_python import INSTALL_HINT, RemoteRuntime, run_script, runtime_python
from keras_posenc.export.targets import TARGETS, target_of

__all__ = ["ALIASES", "LITERT_QUANTIZER", "ONNXRUNTIME", "PRECISIONS", "QUANTIZE_MODES",
           "RECIPES", "Recipe", "TFLITE_CONVERTER", "interpreter_for", "precision_of", "quantize_onnx",
           "quantize_tflite", "recipe_for", "recipes_of", "stored_host_table"]

PRECISIONS = ("float16", "int8", "int4")
ALIASES = {"dynamic_int8": "int8"}
QUANTIZE_MODES = (None, *PRECISIONS, *ALIASES)

TFLITE_CONVERTER = "TFLite converter"
LITERT_QUANTIZER = "LiteRT Quantizer 0.11"
ONNXRUNTIME = "onnxruntime.quantization"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one precision is made for one target and file kind.

    Attributes:
        precision: "float16", "int8" or "int4".
        tool: the quantizer (`TFLITE_CONVERTER`, `LITERT_QUANTIZER`, `ONNXRUNTIME`).
        weights: what the file stores, in words (reports and FILE.json).
        configs: LiteRT Quantizer's dynamic configs `((op, bits, granularity), ...)`.
        host_bits: the host embedding table's precision: 16 (float16), 8, 4, or None (float32).
        runtime: what runs the file correctly: "tflite" (TFLite 2.12 and later), "litert"
            (LiteRT 2.x: ai-edge-litert, TensorFlow >= 2.21), "onnxruntime".
        dense_per_tensor: bool, FULLY_CONNECTED weights get one scale (TF 2.12's converter
            always does; TF 2.21's gives one per output channel, an op version the GL delegate
            refuses: "FULLY_CONNECTED: Max version supported: 9. Requested version 12.").
    """

    precision: str
    tool: str
    weights: str
    configs: tuple = ()
    host_bits: object = None
    runtime: str = "tflite"
    dense_per_tensor: bool = False

    def configure(self, converter):
        """Sets the TFLite converter's options for a `TFLITE_CONVERTER` recipe (else nothing)."""
        if self.tool != TFLITE_CONVERTER:
            return
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if self.precision == "float16":
            converter.target_spec.supported_types = [tf.float16]
        switch = "_experimental_disable_per_channel_quantization_for_dense_layers"  # TF >= 2.13, private
        if self.dense_per_tensor and hasattr(converter, switch):
            converter._experimental_disable_per_channel_quantization_for_dense_layers = True

    @property
    def needs_litert_python(self):
        """LiteRT Quantizer makes the file, or only LiteRT 2.x checks it and this Python lacks it."""
        return self.tool == LITERT_QUANTIZER or (self.runtime == "litert" and not _litert_in_process())

    def describe(self):
        """`{"precision", "tool", "weights", "runtime"}`: what FILE.json records of the recipe."""
        return {"precision": self.precision, "tool": self.tool, "weights": self.weights,
                "runtime": self.runtime}


_FLOAT16 = Recipe("float16", TFLITE_CONVERTER, "float16 weights, float32 compute", host_bits=16)
_INT8 = Recipe("int8", TFLITE_CONVERTER, "int8 weights (dynamic range: per channel for CONV_2D, per tensor "
                                         "or channel for FULLY_CONNECTED as the converter chooses), float32 "
                                         "activations", host_bits=8)
# The same recipe on the shader graphs of `gpu` and `gl`: the GPU delegates run them, but TFLite
# 2.12's CPU kernels compute some of their hybrid CONV_2D wrong (logits of 1e14 for the demo's
# `gl` window and `gpu` prefill/decode files, where LiteRT 2.x agrees with float32 to 0.3).
_INT8_SHADER = dataclasses.replace(_INT8, runtime="litert")
_INT8_GL = dataclasses.replace(_INT8_SHADER, dense_per_tensor=True)
_INT4_CPU = Recipe("int4", LITERT_QUANTIZER, "int4 weights: FULLY_CONNECTED in blocks of 32, the token table "
                                             "(EMBEDDING_LOOKUP) per row; float32 activations",
                   configs=(("FULLY_CONNECTED", 4, "BLOCKWISE_32"), ("EMBEDDING_LOOKUP", 4, "CHANNELWISE")),
                   host_bits=4, runtime="litert")
_INT4_GPU = Recipe("int4", LITERT_QUANTIZER, "int4 weights per output channel (CONV_2D, FULLY_CONNECTED); "
                                             "float32 activations",
                   configs=(("FULLY_CONNECTED", 4, "CHANNELWISE"), ("CONV_2D", 4, "CHANNELWISE")),
                   host_bits=4, runtime="litert")
_ONNX_FLOAT16 = Recipe("float16", ONNXRUNTIME, "float16 weights and compute, float32 inputs and outputs",
                       host_bits=16, runtime="onnxruntime")
_ONNX_INT8 = Recipe("int8", ONNXRUNTIME, "int8 QDQ: weights per channel (MatMul, Gemm), the token table "
                                         "(Gather) per tensor, activations per tensor, calibrated on the "
                                         "parity rows", host_bits=8,
                    runtime="onnxruntime")
_ONNX_INT4 = ("onnxruntime's 4-bit quantizer (weight-only QDQ, TensorRT's int4 form) takes MatMul weights "
              "only: the Gemm kernels and the token table (Gather) stay float32, and the demo's file is "
              "0.68x of float32; use --quantize int8")

_GL_INT4 = ("the GL delegate does not run 4-bit weights (TfLiteGpuDelegate \"failed to prepare\" on "
            "LiteRT Quantizer's int4 files): use --quantize int8 on gl, or --target gpu")
_NO_INT4_CPU_GENERATION = ("LiteRT Quantizer's int4 prefill/decode file does not run (TFLite "
                           "\"fully_connected.cc: input->type != kTfLiteFloat32 (INT8 != FLOAT32)\"): use "
                           "--quantize int8, or the int4 .litertlm bundle (--format litertlm)")
_NO_INT4_GPU_GENERATION = ("LiteRT Quantizer's int4 weights break the shader prefill/decode graph's constant "
                           "matrices (prefill logits of 1e7 on LiteRT 2.3): use --quantize int8")
_NO_INT4_TRANSLATOR = ("LiteRT Quantizer's int4 FULLY_CONNECTED weights do not run in TFLite's "
                       "interpreter (\"input->type != kTfLiteFloat32\", as the int4 prefill/decode file): "
                       "use --quantize int8")

# {(Target, Kind): {precision: Recipe, or why the runtime cannot run it}}; a missing key: not available.
RECIPES = {
    (TARGETS["cpu"], WINDOW): {"float16": _FLOAT16, "int8": _INT8, "int4": _INT4_CPU},
    (TARGETS["gpu"], WINDOW): {"float16": _FLOAT16, "int8": _INT8_SHADER, "int4": _INT4_GPU},
    (TARGETS["gl"], WINDOW): {"float16": _FLOAT16, "int8": _INT8_GL, "int4": _GL_INT4},
    (TARGETS["tensorrt"], WINDOW): {"float16": _ONNX_FLOAT16, "int8": _ONNX_INT8, "int4": _ONNX_INT4},
    (TARGETS["cpu"], PREFILL_DECODE): {"float16": _FLOAT16, "int8": _INT8, "int4": _NO_INT4_CPU_GENERATION},
    (TARGETS["gpu"], PREFILL_DECODE): {"float16": _FLOAT16, "int8": _INT8_SHADER,
                                       "int4": _NO_INT4_GPU_GENERATION},
    (TARGETS["gl"], PREFILL_DECODE): {"float16": _FLOAT16, "int8": _INT8_GL, "int4": _GL_INT4},
    (TARGETS["tensorrt"], PREFILL_DECODE): {"float16": _ONNX_FLOAT16, "int8": _ONNX_INT8, "int4": _ONNX_INT4},
    (TARGETS["cpu"], LITERTLM): {"float16": _FLOAT16, "int8": _INT8, "int4": _INT4_CPU},
    (TARGETS["gpu"], LITERTLM): {"float16": _FLOAT16, "int8": _INT8_SHADER, "int4": _NO_INT4_GPU_GENERATION},
    (TARGETS["cpu"], TRANSLATE): {"float16": _FLOAT16, "int8": _INT8, "int4": _NO_INT4_TRANSLATOR},
    (TARGETS["gpu"], TRANSLATE): {"float16": _FLOAT16, "int8": _INT8_SHADER, "int4": _NO_INT4_GPU_GENERATION},
    (TARGETS["gl"], TRANSLATE): {"float16": _FLOAT16, "int8": _INT8_GL, "int4": _GL_INT4},
    (TARGETS["tensorrt"], TRANSLATE): {"float16": _ONNX_FLOAT16, "int8": _ONNX_INT8, "int4": _ONNX_INT4},
}


def precision_of(quantize):
    """The precision a `quantize` value names (None: float32); ValueError naming the choices.

    Example:

    >>> precision_of("dynamic_int8"), precision_of(None)
    ('int8', None)
    >>> precision_of("int2")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
        ...
    ValueError: `quantize` must be one of (None, 'float16', 'int8', 'int4', 'dynamic_int8'),
    got quantize='int2'.
    """
    if quantize not in QUANTIZE_MODES:
        raise ValueError(f"`quantize` must be one of {QUANTIZE_MODES}, got quantize={quantize!r}.")
    return ALIASES.get(quantize, quantize)


def recipes_of(target, kind):
    """`RECIPES[(target, kind)]` for a target and a kind given as objects or names; None where a
    `kind` export of `target` has no recipes (the kind makes no file of that target).

    >>> recipes_of("gl", "window")["int8"].precision, recipes_of("tensorrt", "litertlm")
    ('int8', None)
    """
    return RECIPES.get((target_of(target), kind_of(kind)))


def recipe_for(target, quantize, kind=WINDOW, *, litert_python=None):
    """The `Recipe` of `quantize` for `target` and `kind` (objects or names), None for float32.

    Refused combinations raise before any conversion: a precision the target's runtime cannot
    run, or a LiteRT Quantizer recipe without the LiteRT Python (`litert_python.INSTALL_HINT`).

    Raises:
        ValueError: naming the target, the precision and why.
    """
    precision = precision_of(quantize)
    if precision is None:
        return None
    target, kind = target_of(target), kind_of(kind)
    name = target.name
    recipes = recipes_of(target, kind)
    if recipes is None:
        raise ValueError(f"--quantize {quantize} is not available for a {kind.name} export of "
                         f"target={name!r}.")
    recipe = recipes[precision]
    if isinstance(recipe, str):
        raise ValueError(f"--quantize {quantize} is refused for target={name!r}: {recipe}.")
    if recipe.needs_litert_python and runtime_python(litert_python, module="litert_quantizer") is None:
        needs = (f"is made by {recipe.tool}" if recipe.tool == LITERT_QUANTIZER else
                 "is checked by ai-edge-litert's interpreter (TFLite 2.12 computes it wrong)")
        raise ValueError(f"--quantize {quantize} on target={name!r} {needs}, which is not installed here: "
                         f"{INSTALL_HINT}.")
    return recipe


def quantize_tflite(flat, recipe, *, litert_python=None, timeout=900):
    """A float32 `.tflite` quantized by `recipe` (LiteRT Quantizer recipes; others return `flat`).

    LiteRT Quantizer runs in the LiteRT Python (`litert_runtime.py quantize`), which also puts
    every buffer inside the flatbuffer and shares identical buffers.

    Raises:
        RuntimeError: the quantizer failed (its last log lines in the message).
    """
    if recipe is None or recipe.tool != LITERT_QUANTIZER:
        return flat
    python = runtime_python(litert_python, module="litert_quantizer")
    with tempfile.TemporaryDirectory(prefix="keras_posenc_quantize_") as folder:
        source, out = os.path.join(folder, "float.tflite"), os.path.join(folder, "quantized.tflite")
        with open(source, "wb") as f:
            f.write(bytes(flat))
        run_script(python, "litert_runtime.py", "quantize",
                   {"model": source, "out": out, "configs": [list(c) for c in recipe.configs]}, timeout)
        with open(out, "rb") as f:
            return f.read()


def stored_host_table(table, recipe):
    """The host token table as an export of `recipe` stores it (float32 without a recipe).

    float16 exports keep float16 rows; int8 and int4 exports the int rows of
    `host_table.quantize_table`.
    """
    bits = None if recipe is None else recipe.host_bits
    if bits is None:
        return np.asarray(table, np.float32)
    if bits == 16:
        return np.asarray(table, np.float16)
    return host_table.quantize_table(table, bits)


@contextlib.contextmanager
def interpreter_for(recipe, litert_python=None):
    """The interpreter class that runs `recipe`'s files correctly (a context: a server may be started).

    None (the default interpreter) unless the recipe needs LiteRT 2.x and this Python has only
    TensorFlow's older interpreter: then ai-edge-litert's `Interpreter` in the LiteRT Python
    (`litert_python.RemoteRuntime`).
    """
    if recipe is None or recipe.runtime != "litert" or _litert_in_process():
        yield None
        return
    with RemoteRuntime(runtime_python(litert_python, module="litert_quantizer")) as runtime:
        yield runtime.interpreter


def _litert_in_process():
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except ImportError:
        return False
    return True


def quantize_onnx(model_bytes, recipe, calibration=()):
    """A float32 ONNX model in `recipe`'s precision (None: as it is), by onnxruntime's tools.

    float16: `onnxruntime.transformers.float16` (float32 inputs and outputs kept). int8:
    `quant_pre_process` (constant folding: the attention kernels become Gemm initializers), then
    `quantize_static` in QDQ form (int8 weights per channel, the token table per tensor: onnxruntime
    quantizes a Gather's table as it does an activation; activations per tensor, symmetric),
    calibrated on `calibration`, with short tensor names (`_short_names`). A MatMul of two
    activations (attention's scores and context) is quantized too: in QDQ form onnxruntime reads
    no `MatMulConstBOnly` (only its QOperator form does), and TensorRT runs such a MatMul in int8.

    Args:
        model_bytes: the serialized float32 `ModelProto`.
        recipe: an ONNX `Recipe` of `RECIPES`, or None.
        calibration: int8 only: feed dicts `{input name: array}` of real rows, which calibrate the
            activations' scales.

    Returns:
        The serialized model.
    """
    if recipe is None:
        return model_bytes
    import onnx

    model = onnx.load_from_string(bytes(model_bytes))
    if recipe.precision == "float16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        return convert_float_to_float16(model, keep_io_types=True).SerializeToString()
    from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_static

    with tempfile.TemporaryDirectory(prefix="keras_posenc_quantize_") as folder:
        source, folded, out = (os.path.join(folder, name)
                               for name in ("float.onnx", "folded.onnx", "int8.onnx"))
        onnx.save(model, source)
        quant_pre_process(source, folded, skip_symbolic_shape=True)
        quantize_static(folded, out, _Calibration(calibration), quant_format=QuantFormat.QDQ,
                        per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QInt8,
                        op_types_to_quantize=["MatMul", "Gemm", "Gather"],
                        extra_options={"ActivationSymmetric": True})
        quantized = onnx.load(out)
    # quant_pre_process's onnxruntime pass declares onnxruntime's own domains, which no node uses.
    return onnx_graph.drop_unused_domains(_short_names(quantized)).SerializeToString()


def _short_names(model):
    """`model` with every value and node named by its index (`v12`, `n7`); inputs and outputs keep theirs.

    onnxruntime's quantizer names each tensor it adds after the float tensor it quantizes (a
    third of the int8 demo file was names); runtimes read none of them.
    """
    graph = model.graph
    kept = {value.name for value in list(graph.input) + list(graph.output)}
    names = {}

    def short(name):
        if not name or name in kept:
            return name
        return names.setdefault(name, f"v{len(names)}")

    for initializer in graph.initializer:
        initializer.name = short(initializer.name)
    for index, node in enumerate(graph.node):
        node.name = f"n{index}"
        node.input[:] = [short(name) for name in node.input]
        node.output[:] = [short(name) for name in node.output]
    for value in graph.value_info:
        value.name = short(value.name)
    return model


class _Calibration:
    """onnxruntime's `CalibrationDataReader` over a list of feed dicts."""

    def __init__(self, feeds):
        self.feeds = iter(list(feeds))

    def get_next(self):
        return next(self.feeds, None)
