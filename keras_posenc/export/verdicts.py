"""Per-backend verdicts: which ops of a TFLite file a GPU runtime would not run on the GPU.

Three backends, each judged from the op support of its own runtime:

- `"opencl"` and `"webgpu"`: the GPU delegate's common TFLite parser
  (`tensorflow/lite/delegates/gpu/common/model_builder.cc`), which the OpenCL delegate and the
  LiteRT GPU accelerator (`libLiteRtWebGpuAccelerator.so` in ai-edge-litert 2.3) share: its op
  list (mirrored by TFLite 2.12's `tensorflow/lite/tools/versioning/gpu_compatibility.cc`, which
  `tf.lite.experimental.Analyzer` runs) and the highest version of each op it parses
  (`_PARSER_MAX_VERSION`; LiteRT 2.3 says e.g. "STRIDED_SLICE: Max version supported: 2.
  Requested version 3").
- `"gl"`: the OpenGL ES backend of the classic delegate (Jetson with tflite-runtime), whose
  shader registry is `tensorflow/lite/delegates/gpu/gl/kernels/registry.cc` (`GL_SHADER_OPS`):
  the parser accepts more ops than GL has shaders for, and the delegate then fails in Prepare
  ("No shader implementation for transpose") and drops the whole graph to the CPU. Op limits of
  the GL kernels: float tensors only (the delegate says "OP is supported, but tensor type/shape
  isn't compatible" for an int32 ADD or RESHAPE), MEAN over height and width only
  (`gl/kernels/mean.cc`), a MUL of two runtime tensors only when one is at least the other in
  every dimension (`gl/kernels/mul.cc`), no SUB of two runtime tensors that broadcast.

The webgpu/opencl verdict uses TFLite 2.12's op list, which is older than LiteRT 2.3's parser:
it may name an op that LiteRT accepts (SELECT_V2), never the reverse for the ops our exports
contain (tests/edge checks each verdict against the runtime's own messages).

`tests/edge/` runs these verdicts against the running runtimes (LiteRT on Mesa lavapipe, the GL
delegate of mediapipe on Mesa llvmpipe): a file with an empty verdict must be fully accelerated
there, and each flagged op must be named by the runtime's own messages.
"""

import re

import tensorflow as tf  # noqa: F401  (the docstring examples build files with it)

from keras_posenc.export.flatbuffer import analyzer_report, decoded

__all__ = ["BACKENDS", "GL_SHADER_OPS", "GPU_PARSER_OPS", "analyzer_report", "gpu_incompatible_ops",
           "verdict_line"]

BACKENDS = {
    "webgpu": "LiteRT GPU accelerator (ai-edge-litert CompiledModel; WebGPU over Vulkan, JetPack 6)",
    "opencl": "OpenCL GPU delegate (Android; JetPack 6 through LiteRT)",
    "gl": "OpenGL ES (Jetson + tflite-runtime)",
}

# Ops the GPU delegate's parser takes (TFLite 2.12 tensorflow/lite/tools/versioning/
# gpu_compatibility.cc, the same list as delegates/gpu/common/model_builder.cc).
GPU_PARSER_OPS = frozenset("""
ABS ADD AVERAGE_POOL_2D BATCH_MATMUL CAST CONCATENATION CONV_2D COS CUMSUM DENSIFY DEPTH_TO_SPACE
DEPTHWISE_CONV_2D DEQUANTIZE DIV ELU EQUAL EXP FLOOR FLOOR_DIV FLOOR_MOD FULLY_CONNECTED GREATER
GREATER_EQUAL HARD_SWISH LEAKY_RELU LESS LESS_EQUAL LOG LOGICAL_AND LOGISTIC LSTM MAXIMUM MAX_POOL_2D
MEAN MINIMUM MIRROR_PAD MUL NEG NOT_EQUAL ONE_HOT PACK PAD PADV2 POW PRELU QUANTIZE REDUCE_MAX
REDUCE_MIN REDUCE_PROD RELU RELU6 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR RSQRT
SIN SLICE SOFTMAX SPACE_TO_DEPTH SPLIT SPLIT_V SQRT SQUARE SQUARED_DIFFERENCE STRIDED_SLICE SUB SUM
TANH TILE TRANSPOSE TRANSPOSE_CONV
""".split())

# The parser's `CheckMaxSupportedOpVersion` limits that the converter's output can exceed
# (delegates/gpu/common/model_builder.cc; confirmed by LiteRT 2.3's own message).
_PARSER_MAX_VERSION = {"STRIDED_SLICE": 2}

# Ops with a shader in the OpenGL ES backend (tensorflow/lite/delegates/gpu/gl/kernels/registry.cc,
# by TFLite op name). DEQUANTIZE of constant float16 weights is folded by the delegate, and PACK is
# parsed into RESHAPE + CONCAT (common/model_builder.cc): both run on GL (tests/edge).
GL_SHADER_OPS = frozenset("""
ABS ADD AVERAGE_POOL_2D CONCATENATION CONV_2D COS DEPTHWISE_CONV_2D DEQUANTIZE DIV ELU EXP
FULLY_CONNECTED HARD_SWISH LEAKY_RELU LOG LOGISTIC MAXIMUM MAX_POOL_2D MEAN MINIMUM MUL NEG PACK PAD POW
PRELU RELU RELU6 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR RSQRT SIN SLICE SOFTMAX
SPACE_TO_DEPTH SQRT SQUARE SQUARED_DIFFERENCE SUB TANH TILE TRANSPOSE_CONV
""".split())

_ANALYZER_OP = re.compile(r"^\s*Op#(\d+)\s+([A-Z0-9_]+)\(")
_FLOAT_TYPES = ("float32", "float16")
_ANALYZER_WARNING = "GPU COMPATIBILITY WARNING"
_ANALYZER_SUMMARY = re.compile(r"Subgraph#\d+ has GPU delegate compatibility issues")


def _gl_limits(op, folded=frozenset()):
    """Why the GL backend refuses this instance of a supported op, or None.

    `folded`: tensors that the delegate folds into constants (DEQUANTIZE of float16 weights).
    """
    inputs = [(shape, constant or tensor in folded, dtype)
              for (shape, constant, dtype), tensor in zip(op.inputs, op.input_tensors)]
    runtime = [shape for shape, constant, _ in inputs if shape is not None and not constant]
    tensors = [dtype for shape, constant, dtype in inputs + op.outputs if shape is not None and not constant]
    if op.name != "DEQUANTIZE" and any(dtype.lower() not in _FLOAT_TYPES for dtype in tensors):
        return "int or bool tensors"
    if op.name == "MEAN":
        # The last axis is the GPU's channel axis, which the GL MEAN shader cannot reduce.
        source, result = op.inputs[0][0], op.outputs[0][0]
        reduced = not result or not source or (len(result) == len(source) and result[-1] != source[-1])
        return "over channels" if reduced or len(result) < len(source) else None
    if op.name in ("ADD", "MUL"):
        limit = _broadcast_limit(op)
        if limit:
            return limit
    if op.name in ("MUL", "SUB") and len(runtime) == 2 and runtime[0] != runtime[1]:
        first, second = runtime
        if len(first) == len(second):
            dominates = (all(a >= b for a, b in zip(first, second)) or
                         all(b >= a for a, b in zip(first, second)))
        else:
            dominates = False
        if op.name == "SUB" or not dominates:
            return "broadcasts two runtime tensors"
    return None


def _broadcast_limit(op):
    """The delegate parser's broadcast rules for ADD and MUL, constant inputs included.

    From `CheckGpuDelegateCompatibility` (tensorflow/lite/tools/versioning/gpu_compatibility.cc),
    which the GL delegate applies without its "enhanced broadcast" flag: a MUL of equal ranks
    needs one input at least the other in every dimension ("MUL requires one tensor that not less
    than second in all dimensions"); inputs of different ranks, both above 1, broadcast only 3-D
    or [1, 1] or [b, c] into 4-D ("Doesn't support broadcasting"). TF 2.21's converter leaves
    such ops in Keras 3 graphs (a [1, T] mask times a constant [1, T, T]; LayerNormalization's
    [1, T, 1] times [1, 1, D]).
    """
    shapes = [shape for shape, _, _ in op.inputs[:2]]
    if len(shapes) != 2 or any(shape is None for shape in shapes):
        return None
    first, second = shapes
    if len(first) == len(second):
        if op.name == "MUL" and any(a < b for a, b in zip(first, second)) and any(
                b < a for a, b in zip(first, second)):
            return "neither input covers the other"
        return None
    if len(first) > 1 and len(second) > 1:
        longer, shorter = (first, second) if len(first) > len(second) else (second, first)
        allowed = len(longer) == 4 and (
            (len(shorter) == 3 and longer[0] == 1)
            or (len(shorter) == 2 and longer[0] == 1 and tuple(shorter) == (1, 1))
            or (len(shorter) == 2 and longer[0] == shorter[0] and longer[3] == shorter[1]))
        if not allowed:
            return "broadcasts across ranks"
    return None


def _select_v2_supported(op):
    """Whether the LiteRT GPU accelerator runs this SELECT_V2 (TFLite 2.12's parser has no SELECT_V2).

    The rule of `CheckSelectV2GpuDelegateCompatibility` in the newer gpu_compatibility.cc: a bool
    or float condition, float branches each either of the output's shape or a scalar (a constant
    branch not 2-D). LiteRT 2.3 on lavapipe fully accelerates the Keras 3 attention mask's
    SELECT_V2 (bool [1, H, T, T], scores, scalar -inf) with GPU == CPU (tests/edge); an int32
    SELECT_V2 (the `cpu` target's position lookup) is refused.
    """
    if len(op.inputs) != 3 or len(op.outputs) != 1 or any(shape is None for shape, _, _ in op.inputs):
        return False
    (_, _, condition), *branches = op.inputs
    output = op.outputs[0][0]
    if condition.lower() not in ("bool",) + _FLOAT_TYPES:
        return False
    for shape, constant, dtype in branches:
        if dtype.lower() not in _FLOAT_TYPES:
            return False
        if shape and tuple(shape) != tuple(output) and (len(shape) > 1 or shape[0] > 1):
            return False
        if constant and len(shape) == 2:
            return False
    return True


def gpu_incompatible_ops(tflite_bytes, backend="opencl"):
    """Ops of a TFLite model that `backend` would not run on the GPU; `[]` when it runs every op.

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).
        backend: one of `BACKENDS`: "opencl", "webgpu" (the LiteRT GPU
            accelerator) or "gl" (the OpenGL ES backend).

    Returns:
        Sorted list of distinct op names (custom and Flex ops always count).

    Example:

    >>> add = tf.function(lambda x: tf.transpose(x) + 1.0,
    ...                   input_signature=[tf.TensorSpec([2, 3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert()
    >>> gpu_incompatible_ops(flat, backend="webgpu"), gpu_incompatible_ops(flat, backend="gl")
    ([], ['TRANSPOSE'])
    """
    if backend not in BACKENDS:
        raise ValueError(f"`backend` must be one of {tuple(BACKENDS)}, got backend={backend!r}.")
    tflite = decoded(tflite_bytes)
    flagged = set()
    folded = _folded_tensors(tflite.operators)
    for op in tflite.operators:
        if backend == "gl":
            if op.name not in GL_SHADER_OPS or _gl_limits(op, folded):
                flagged.add(op.name)
        elif backend == "webgpu" and op.name == "SELECT_V2":
            if not _select_v2_supported(op):
                flagged.add(op.name)
        elif op.name not in GPU_PARSER_OPS or op.version > _PARSER_MAX_VERSION.get(op.name, op.version):
            flagged.add(op.name)
    if backend != "gl":
        readers = {index for index, op in enumerate(tflite.operators) if folded & set(op.input_tensors)}
        current = index = None
        # The analyzer's own GPU check (TF 2.12 warns about ops its parser lacks) is C++ that the
        # flatbuffer does not record: its printout is the only place to read it from.
        for line in tflite.analyzer_report.splitlines():
            match = _ANALYZER_OP.match(line)
            if match:
                index, current = int(match.group(1)), match.group(2)
            elif _ANALYZER_WARNING in line and not _ANALYZER_SUMMARY.search(line):
                if index in readers and "runtime input" in line:
                    continue
                flagged.add(current or "UNKNOWN")
    return sorted(flagged)


def _folded_tensors(ops):
    """Outputs of DEQUANTIZE ops of constant (float16) weights.

    The delegates fold those DEQUANTIZE ops into constant weights (float16 models are a
    documented GPU path); TFLite 2.12's analyzer counts their outputs as runtime inputs instead
    ("Expected 1 or 2 input tensor(s), but node has 3 runtime inputs"). LiteRT 2.3 on lavapipe
    runs such a file fully accelerated (tests/edge).
    """
    return {tensor for op in ops if op.name == "DEQUANTIZE" and all(c for _, c, _ in op.inputs)
            for tensor in op.output_tensors}


def gl_limit_reasons(tflite_bytes):
    """`{op name: reason}` for supported GL ops refused by a shader limit (MEAN axis, broadcasts)."""
    reasons = {}
    ops = decoded(tflite_bytes).operators
    folded = _folded_tensors(ops)
    for op in ops:
        if op.name in GL_SHADER_OPS and _gl_limits(op, folded):
            reasons.setdefault(op.name, _gl_limits(op, folded))
    return reasons


def verdict_line(tflite_bytes, backend):
    """One line naming the backend: all N ops accelerated, or the ops it does not run.

    Example:

    >>> add = tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([2, 3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert()
    >>> verdict_line(flat, "gl")
    'OpenGL ES (Jetson + tflite-runtime): all 1 ops have shaders'
    """
    tflite = decoded(tflite_bytes)
    missing = gpu_incompatible_ops(tflite, backend)
    count = len(tflite.operators)
    if not missing:
        what = "have shaders" if backend == "gl" else "run on the GPU"
        return f"{BACKENDS[backend]}: all {count} ops {what}"
    reasons = gl_limit_reasons(tflite) if backend == "gl" else {}
    named = ", ".join(f"{name} ({reasons[name]})" if name in reasons else name for name in missing)
    return f"{BACKENDS[backend]}: NOT fully accelerated; runs on the CPU: {named}"
