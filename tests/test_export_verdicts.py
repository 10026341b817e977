"""Per-backend GPU verdicts (keras_posenc/export/verdicts.py) on small TFLite files built by hand.

Each file holds one or a few ops, converted from a tf.function (and, where the converter cannot
produce a case, edited afterwards with TensorFlow's flatbuffer utilities: an op version, a tensor
type, a constant turned into a runtime tensor). The expected verdicts follow the rules of the GPU
runtimes as verdicts.py documents them:

- "opencl"/"webgpu": the GPU parser's op list and its highest op versions, plus what TF 2.12's
  analyzer warns about (TF 2.21's analyzer prints no warnings); "webgpu" runs SELECT_V2 under
  its own rule.
- "gl": a shader for each op, float tensors only (DEQUANTIZE exempt), MEAN over height and width
  only, no broadcast of two runtime tensors in SUB, MUL only where one input covers the other,
  and the parser's broadcast rules for ADD and MUL.

tests/edge/ checks the same verdicts against the runtimes themselves.
"""

import re

import numpy as np
import pytest

from keras_posenc.export import verdicts
from keras_posenc.export.flatbuffer import TfliteFile, analyzer_report, operators

WEBGPU = "LiteRT GPU accelerator (ai-edge-litert CompiledModel; WebGPU over Vulkan, JetPack 6)"
OPENCL = "OpenCL GPU delegate (Android; JetPack 6 through LiteRT)"
GL = "OpenGL ES (Jetson + tflite-runtime)"
NOT_ACCELERATED = "NOT fully accelerated; runs on the CPU: "


def tflite(function, *specs, float16=False, int8=False):
    """The TFLite file of `function` over inputs `specs` = ((shape, dtype name), ...)."""
    import tensorflow as tf

    signature = [tf.TensorSpec(shape, dtype) for shape, dtype in specs]
    concrete = tf.function(function, input_signature=signature).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    if float16:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    if int8:  # full integer quantization of the ops, float input and output
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: (
            [np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape) for shape, _ in specs]
            for _ in range(4))
    return converter.convert()


def edited(flat, edit):
    """`flat` with `edit(model)` applied to its decoded flatbuffer object."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flat))
    edit(model)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def op_named(model, name):
    from tensorflow.lite.tools import flatbuffer_utils

    graph = model.subgraphs[0]
    return [op for op in graph.operators if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) == name]


def with_version(name, version):
    def edit(model):
        from tensorflow.lite.tools import flatbuffer_utils

        for index, code in enumerate(model.operatorCodes):
            if flatbuffer_utils.opcode_to_name(model, index) == name:
                code.version = version
    return edit


def with_tensor_type(name, position, tensor_type, output=False):
    """The `position`-th input (or output) tensor of each `name` op made of `tensor_type` (schema enum)."""
    def edit(model):
        for op in op_named(model, name):
            tensors = op.outputs if output else op.inputs
            model.subgraphs[0].tensors[tensors[position]].type = tensor_type
    return edit


def unfolded(model):
    """Each DEQUANTIZE's input made a runtime tensor (no data): the delegates cannot fold it."""
    for op in op_named(model, "DEQUANTIZE"):
        model.subgraphs[0].tensors[op.inputs[0]].buffer = 0


FLOAT32, INT32 = 0, 2  # tflite schema TensorType


class WithoutAnalyzerWarnings(TfliteFile):
    """The file as TF 2.21's analyzer reads it: the op listing without GPU-compatibility warnings.

    On TF 2.12 the analyzer applies part of the same rules itself; this isolates the verdict's own.
    """

    @property
    def analyzer_report(self):
        return "\n".join(line for line in super().analyzer_report.splitlines() if "WARNING" not in line)


def gpu_warnings(flat):
    return [line for line in analyzer_report(flat).splitlines() if "GPU COMPATIBILITY WARNING" in line]


def verdict(flat, backend):
    return verdicts.gpu_incompatible_ops(flat, backend)


# The backends ---------------------------------------------------------------------------------
def test_unknown_backend_is_refused_before_reading_the_file():
    message = "`backend` must be one of ('webgpu', 'opencl', 'gl'), got backend='vulkan'."
    with pytest.raises(ValueError, match=re.escape(message)):
        verdicts.gpu_incompatible_ops(b"not a flatbuffer", "vulkan")
    flat = tflite(lambda x: x + 1.0, ([2, 3], "float32"))
    with pytest.raises(ValueError, match=re.escape(message)):
        verdicts.verdict_line(flat, "vulkan")
    with pytest.raises(ValueError, match=re.escape("got backend='GL'")):
        verdicts.gpu_incompatible_ops(flat, "GL")


def test_backends_name_their_runtimes():
    assert verdicts.BACKENDS == {"webgpu": WEBGPU, "opencl": OPENCL, "gl": GL}


def test_transpose_runs_on_the_gpu_parsers_but_has_no_gl_shader():
    import tensorflow as tf

    flat = tflite(lambda x: tf.transpose(x) + 1.0, ([2, 3], "float32"))
    assert sorted(op.name for op in operators(flat)) == ["ADD", "TRANSPOSE"]  # TF 2.21 adds first
    assert verdict(flat, "webgpu") == [] and verdict(flat, "opencl") == []
    assert verdicts.gpu_incompatible_ops(flat) == []
    assert verdict(flat, "gl") == ["TRANSPOSE"]
    assert verdicts.gl_limit_reasons(flat) == {}
    assert verdicts.verdict_line(flat, "webgpu") == f"{WEBGPU}: all 2 ops run on the GPU"
    assert verdicts.verdict_line(flat, "opencl") == f"{OPENCL}: all 2 ops run on the GPU"
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}TRANSPOSE"


def test_a_file_with_gl_shaders_only():
    flat = tflite(lambda x: x * 2.0 + 1.0, ([2, 3], "float32"))
    assert verdict(flat, "gl") == []
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: all 2 ops have shaders"


def test_default_backend_is_opencl():
    # A float SELECT_V2 with a scalar branch: LiteRT's accelerator runs it, the op list has no SELECT_V2.
    import tensorflow as tf

    flat = tflite(lambda x: tf.where(x > 0, x, 0.0), ([1, 4, 6], "float32"))
    assert verdicts.gpu_incompatible_ops(flat) == ["SELECT_V2"] == verdict(flat, "opencl")
    assert verdict(flat, "webgpu") == []
    assert verdicts.verdict_line(flat, "opencl") == f"{OPENCL}: {NOT_ACCELERATED}SELECT_V2"
    assert verdicts.verdict_line(flat, "webgpu") == f"{WEBGPU}: all 2 ops run on the GPU"
    assert verdict(flat, "gl") == ["GREATER", "SELECT_V2"]
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}GREATER, SELECT_V2"


def test_ops_off_the_parser_list_are_named_on_every_backend():
    # GATHER of runtime ids: TF 2.12's analyzer warns about it too; its summary line names no op.
    import tensorflow as tf

    flat = tflite(lambda x, ids: tf.gather(x, ids) + 1.0, ([6, 4], "float32"), ([3], "int32"))
    assert [op.name for op in operators(flat)] == ["GATHER", "ADD"]
    for backend in ("opencl", "webgpu", "gl"):
        assert verdict(flat, backend) == ["GATHER"]
    assert verdicts.verdict_line(flat, "webgpu") == f"{WEBGPU}: {NOT_ACCELERATED}GATHER"
    # GATHER reads an int32 tensor, but it has no shader: named without a reason.
    assert verdicts.gl_limit_reasons(flat) == {}
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}GATHER"


# Op versions -----------------------------------------------------------------------------------
@pytest.mark.parametrize("version, flagged", [(1, False), (2, False), (3, True), (4, True)])
def test_strided_slice_above_the_parsers_version_2_is_refused(version, flagged):
    # A 3-D slice (TF 2.12's analyzer takes 3-D and 4-D ones); LiteRT 2.3: "STRIDED_SLICE: Max version
    # supported: 2. Requested version 3".
    flat = edited(tflite(lambda x: x[:, 1:3, :] * 2.0, ([1, 4, 6], "float32")),
                  with_version("STRIDED_SLICE", version))
    assert [(op.name, op.version) for op in operators(flat)] == [("STRIDED_SLICE", version), ("MUL", 1)]
    expected = ["STRIDED_SLICE"] if flagged else []
    assert verdict(flat, "opencl") == expected == verdict(flat, "webgpu")
    assert verdict(flat, "gl") == ["STRIDED_SLICE"]  # no GL shader at any version


def test_ops_without_a_version_limit_are_taken_at_any_version():
    flat = edited(tflite(lambda x: x * 2.0 + 1.0, ([1, 4, 6], "float32")), with_version("MUL", 9))
    assert [(op.name, op.version) for op in operators(flat)] == [("MUL", 9), ("ADD", 1)]
    assert verdict(flat, "opencl") == [] == verdict(flat, "webgpu")
    assert verdict(flat, "gl") == []


# GL: tensor types ------------------------------------------------------------------------------
@pytest.mark.parametrize("build, op", [
    (lambda: tflite(lambda x: x + 1, ([2, 3], "int32")), "ADD"),
    (lambda: tflite(lambda x: x * 3, ([2, 3], "int32")), "MUL"),
    (lambda: tflite(lambda x: __import__("tensorflow").reshape(x, [3, 2]), ([2, 3], "bool")), "RESHAPE"),
    # Float inputs, an int32 output (edited): the output counts too.
    (lambda: edited(tflite(lambda a, b: a + b, ([2, 3], "float32"), ([2, 3], "float32")),
                    with_tensor_type("ADD", 0, INT32, output=True)), "ADD"),
    # An int32 runtime input (edited) next to a float one.
    (lambda: edited(tflite(lambda a, b: a + b, ([2, 3], "float32"), ([2, 3], "float32")),
                    with_tensor_type("ADD", 1, INT32)), "ADD"),
])
def test_gl_refuses_int_and_bool_tensors(build, op):
    flat = build()
    assert [o.name for o in operators(flat)] == [op]
    assert verdict(flat, "gl") == [op]
    assert verdicts.gl_limit_reasons(flat) == {op: "int or bool tensors"}
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}{op} (int or bool tensors)"
    assert verdict(flat, "opencl") == [] == verdict(flat, "webgpu")


def test_gl_takes_float_ops_with_int_constants():
    # RESHAPE's shape is an int32 constant: only runtime tensors must be float.
    import tensorflow as tf

    flat = tflite(lambda x: tf.reshape(x, [3, 2]), ([2, 3], "float32"))
    assert operators(flat)[0].inputs[1] == ((2,), True, "INT32")
    assert verdict(flat, "gl") == []
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: all 1 ops have shaders"


def test_gl_takes_a_fully_connected_without_bias():
    # The omitted bias is an absent tensor (index -1), neither runtime nor of any type.
    weights = np.arange(32, dtype=np.float32).reshape(8, 4) / 7

    import tensorflow as tf

    flat = tflite(lambda x: tf.matmul(x, weights), ([2, 8], "float32"))
    assert operators(flat)[0].inputs[2] == (None, False, None)
    assert verdict(flat, "gl") == [] == verdict(flat, "opencl")


def test_int8_model_on_gl_dequantize_is_exempt_from_the_float_rule():
    # Full integer quantization: QUANTIZE (no shader), int8 MUL and ADD, and DEQUANTIZE of an int8
    # runtime tensor back to float, which GL runs.
    flat = tflite(lambda x: x * 2.0 + x, ([1, 4, 6], "float32"), int8=True)
    ops = operators(flat)
    assert [op.name for op in ops] == ["QUANTIZE", "MUL", "ADD", "DEQUANTIZE"]
    assert ops[-1].inputs[0][1:] == (False, "INT8")
    assert verdict(flat, "gl") == ["ADD", "MUL", "QUANTIZE"]
    assert verdicts.gl_limit_reasons(flat) == {"MUL": "int or bool tensors", "ADD": "int or bool tensors"}
    assert verdicts.verdict_line(flat, "gl") == (
        f"{GL}: {NOT_ACCELERATED}ADD (int or bool tensors), MUL (int or bool tensors), QUANTIZE")
    assert verdict(flat, "opencl") == [] == verdict(flat, "webgpu")
    assert verdicts.verdict_line(flat, "opencl") == f"{OPENCL}: all 4 ops run on the GPU"


# GL: MEAN ------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis, keepdims, refused", [
    ([1, 4, 5, 3], [1, 2], True, False),   # height and width
    ([1, 4, 5, 3], 1, True, False),        # height alone
    ([1, 4, 5, 3], 2, True, False),        # width alone
    ([1, 4, 3], 1, True, False),           # 3-D: the middle axis
    ([1, 4, 5, 3], -1, True, True),        # channels
    ([1, 4, 5, 3], [2, 3], True, True),    # width and channels
    ([1, 4, 3], -1, True, True),
    ([1, 4, 5, 3], [1, 2], False, True),   # height and width, dropped: the channels move
    ([1, 4, 5, 3], None, False, True),     # everything, to a scalar
])
def test_gl_mean_reduces_height_and_width_only(shape, axis, keepdims, refused):
    import tensorflow as tf

    flat = tflite(lambda x: tf.reduce_mean(x, axis, keepdims=keepdims), (shape, "float32"))
    assert [op.name for op in operators(flat)] == ["MEAN"]
    assert verdict(flat, "gl") == (["MEAN"] if refused else [])
    assert verdicts.gl_limit_reasons(flat) == ({"MEAN": "over channels"} if refused else {})
    if refused:
        assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}MEAN (over channels)"
    assert verdict(flat, "opencl") == [] == verdict(flat, "webgpu")


# GL: two runtime tensors -------------------------------------------------------------------------
@pytest.mark.parametrize("op, first, second, reason", [
    ("MUL", [1, 4, 5, 3], [1, 4, 1, 3], None),   # the first covers the second
    ("MUL", [1, 4, 1, 3], [1, 4, 5, 3], None),   # the second covers the first
    ("MUL", [1, 4, 5, 3], [1, 4, 5, 3], None),
    ("MUL", [1, 1, 5, 3], [1, 4, 1, 3], "neither input covers the other"),
    ("MUL", [1, 4, 5, 3], [3], "broadcasts two runtime tensors"),    # across ranks, parser allows it
    ("MUL", [3], [1, 4, 5, 3], "broadcasts two runtime tensors"),
    ("MUL", [1, 4, 5, 3], [4, 5, 3], "broadcasts two runtime tensors"),
    ("SUB", [1, 4, 5, 3], [1, 4, 1, 3], "broadcasts two runtime tensors"),
    ("SUB", [1, 4, 1, 3], [1, 4, 5, 3], "broadcasts two runtime tensors"),
    ("SUB", [1, 4, 5, 3], [3], "broadcasts two runtime tensors"),
    ("SUB", [1, 4, 5, 3], [1, 4, 5, 3], None),
    ("ADD", [1, 4, 1, 3], [1, 1, 5, 3], None),   # ADD broadcasts both ways
    ("ADD", [1, 4, 5, 3], [3], None),
])
def test_gl_broadcast_of_two_runtime_tensors(op, first, second, reason):
    function = {"MUL": lambda a, b: a * b, "SUB": lambda a, b: a - b, "ADD": lambda a, b: a + b}[op]
    flat = tflite(function, (first, "float32"), (second, "float32"))
    assert [(o.name, [shape for shape, _, _ in o.inputs]) for o in operators(flat)] == [
        (op, [tuple(first), tuple(second)])]
    assert verdict(flat, "gl") == ([op] if reason else [])
    assert verdicts.gl_limit_reasons(flat) == ({op: reason} if reason else {})
    if reason:
        assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}{op} ({reason})"
    else:
        assert verdicts.verdict_line(flat, "gl") == f"{GL}: all 1 ops have shaders"


@pytest.mark.parametrize("op", ["SUB", "MUL"])
def test_gl_broadcast_of_a_constant_is_not_two_runtime_tensors(op):
    constant = np.float32([1.0, 2.0, 3.0])
    function = (lambda a: a - constant) if op == "SUB" else (lambda a: a * constant)
    flat = tflite(function, ([1, 4, 5, 3], "float32"))
    assert [o.name for o in operators(flat)] == [op]
    assert verdict(flat, "gl") == []


# GL: the parser's broadcast rules for ADD and MUL (constants included) ----------------------------------
@pytest.mark.parametrize("op, shape, other, runtime, refused", [
    # 3-D into 4-D: batch 1 only
    ("MUL", [1, 4, 5, 3], [4, 5, 3], False, False),
    ("MUL", [2, 4, 5, 3], [4, 5, 3], False, True),
    ("ADD", [1, 4, 5, 3], [4, 5, 3], True, False),
    ("ADD", [4, 5, 3], [1, 4, 5, 3], True, False),
    ("ADD", [2, 4, 5, 3], [4, 5, 3], True, True),
    ("ADD", [4, 5, 3], [2, 4, 5, 3], True, True),
    # [1, 1] into 4-D: batch 1 only
    ("ADD", [1, 4, 5, 3], [1, 1], True, False),
    ("ADD", [1, 1], [1, 4, 5, 3], True, False),
    ("ADD", [1, 4, 5, 3], [1, 1], False, False),
    ("ADD", [2, 4, 5, 3], [1, 1], True, True),
    # [b, c] into 4-D [b, h, w, c]
    ("MUL", [1, 4, 5, 3], [1, 3], False, False),
    ("ADD", [1, 4, 5, 3], [1, 3], True, False),
    ("ADD", [1, 3], [1, 4, 5, 3], True, False),
    ("MUL", [2, 4, 5, 3], [1, 3], False, True),   # batch 2 against 1
    ("ADD", [2, 4, 5, 3], [1, 3], True, True),
    ("ADD", [1, 4, 5, 1], [1, 3], True, True),   # channels 1 against 3
    ("ADD", [1, 3], [1, 4, 5, 1], True, True),
    ("ADD", [1, 4, 5, 3], [5, 3], False, True),   # [w, c] is not [b, c]
    # other ranks
    ("ADD", [1, 4], [1, 4, 4], True, True),
    ("ADD", [1, 4, 4], [1, 4], True, True),
    ("MUL", [1, 4], [1, 4, 4], False, True),
    ("ADD", [1, 4, 4], [4, 4], False, True),
    # a rank-1 or scalar input broadcasts anywhere
    ("ADD", [1, 4, 5, 3], [3], False, False),
    ("MUL", [1, 4, 5, 3], [3], False, False),
    ("ADD", [2, 4, 4], [4], True, False),
])
def test_gl_add_and_mul_follow_the_parsers_broadcast_rules(op, shape, other, runtime, refused):
    values = np.arange(1, np.prod(other) + 1, dtype=np.float32).reshape(other) / 8 + 1
    combine = (lambda a, b: a * b) if op == "MUL" else (lambda a, b: a + b)
    if runtime:
        flat = tflite(combine, (shape, "float32"), (other, "float32"))
    else:
        flat = tflite(lambda a: combine(a, values), (shape, "float32"))
    shapes = [(o.name, [s for s, _, _ in o.inputs]) for o in operators(flat)]
    assert shapes == [(op, [tuple(shape), tuple(other)])]
    assert verdict(flat, "gl") == ([op] if refused else [])
    assert verdicts.gl_limit_reasons(flat) == ({op: "broadcasts across ranks"} if refused else {})


def test_gl_mul_by_a_constant_that_neither_covers():
    # "MUL requires one tensor that not less than second in all dimensions": for constants too.
    values = np.arange(1, 6, dtype=np.float32).reshape(1, 1, 5)
    flat = tflite(lambda a: a * values, ([1, 4, 1], "float32"))
    assert verdicts.gl_limit_reasons(flat) == {"MUL": "neither input covers the other"}
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}MUL (neither input covers the other)"
    # ADD has no such rule.
    flat = tflite(lambda a: a + values, ([1, 4, 1], "float32"))
    assert verdict(flat, "gl") == []


def test_gl_limit_reasons_keep_the_first_reason_of_each_op():
    import tensorflow as tf

    def function(a, b, c):
        product = a * b                                          # [1, 4, 5, 3]: neither covers the other
        scaled = product * c                                     # [5, 3] into 4-D: across ranks
        pooled = tf.reduce_mean(scaled, [1, 2], keepdims=True)   # height and width
        return tf.reduce_mean(pooled, -1, keepdims=True), tf.transpose(product)   # channels

    flat = tflite(function, ([1, 4, 1, 3], "float32"), ([1, 1, 5, 3], "float32"), ([5, 3], "float32"))
    ops = [(op.name, [shape for shape, _, _ in op.inputs]) for op in operators(flat)]
    assert [op for op in ops if op[0] == "MUL"] == [("MUL", [(1, 4, 1, 3), (1, 1, 5, 3)]),
                                                    ("MUL", [(1, 4, 5, 3), (5, 3)])]
    assert [shapes[0] for name, shapes in ops if name == "MEAN"] == [(1, 4, 5, 3), (1, 1, 1, 3)]
    reasons = {"MUL": "neither input covers the other", "MEAN": "over channels"}
    assert verdicts.gl_limit_reasons(flat) == reasons
    assert verdict(flat, "gl") == ["MEAN", "MUL", "TRANSPOSE"]
    assert verdicts.verdict_line(flat, "gl") == (
        f"{GL}: {NOT_ACCELERATED}MEAN (over channels), MUL (neither input covers the other), TRANSPOSE")


# webgpu: SELECT_V2 -----------------------------------------------------------------------------------
C24 = np.arange(24, dtype=np.float32).reshape(4, 6) + 1


def _where(condition_shape, *branches):
    """tf.where(x > 0, ...) over x of `condition_shape`; branches: "x", a runtime shape, or an array."""
    import tensorflow as tf

    runtime = [b for b in branches if isinstance(b, list)]

    def function(x, *inputs):
        inputs = list(inputs)
        picked = [x if isinstance(b, str) else inputs.pop(0) if isinstance(b, list) else b for b in branches]
        return tf.where(x > 0, *picked)

    return tflite(function, (condition_shape, "float32"), *[(shape, "float32") for shape in runtime])


SELECTS = {
    "scalar constant": (lambda: _where([1, 4, 6], "x", np.float32(0)), True),
    "runtime scalar": (lambda: _where([1, 4, 6], "x", []), True),
    "runtime [1]": (lambda: _where([1, 4, 6], "x", [1]), True),
    "constant [1]": (lambda: _where([1, 4, 6], "x", np.float32([3])), True),
    "constant of the output's 3-D shape": (lambda: _where([1, 4, 6], C24[None], np.float32(0)), True),
    "runtime [6]": (lambda: _where([1, 4, 6], "x", [6]), False),
    "runtime [6] first": (lambda: _where([1, 4, 6], [6], "x"), False),
    "runtime [1, 1, 6]": (lambda: _where([1, 4, 6], "x", [1, 1, 6]), False),
    "runtime [1, 6]": (lambda: _where([4, 6], "x", [1, 6]), False),
    "runtime [2]": (lambda: _where([1, 4, 2], "x", [2]), False),
    "constant row [1, 6]": (lambda: _where([4, 6], "x", C24[:1]), False),
    "constant 2-D of the output's shape": (lambda: _where([4, 6], C24, np.float32(0)), False),
    "constant 2-D second": (lambda: _where([4, 6], np.float32(0), C24), False),
    "int32 branches": (lambda: tflite(lambda x: __import__("tensorflow").where(x > 0, x, 0),
                                      ([1, 4, 6], "int32")), False),
    "float condition": (lambda: edited(_where([1, 4, 6], "x", np.float32(0)),
                                       with_tensor_type("SELECT_V2", 0, FLOAT32)), True),
    "int32 condition": (lambda: edited(_where([1, 4, 6], "x", np.float32(0)),
                                       with_tensor_type("SELECT_V2", 0, INT32)), False),
}


@pytest.mark.parametrize("case", list(SELECTS))
def test_webgpu_select_v2_rule(case):
    build, supported = SELECTS[case]
    flat = build()
    assert [op.name for op in operators(flat)][-1] == "SELECT_V2"
    expected = [] if supported else ["SELECT_V2"]
    # The rule alone (TF 2.21's analyzer prints no warnings) ...
    assert verdict(WithoutAnalyzerWarnings(flat), "webgpu") == expected
    # ... and with the installed analyzer, which (TF 2.12) warns about some refused ones itself.
    assert verdict(flat, "webgpu") == expected
    assert verdict(flat, "opencl") == ["SELECT_V2"]  # not on TF 2.12's op list
    line = verdicts.verdict_line(flat, "webgpu")
    count = len(operators(flat))
    assert line == (f"{WEBGPU}: all {count} ops run on the GPU" if supported
                    else f"{WEBGPU}: {NOT_ACCELERATED}SELECT_V2")


# float16 weights: DEQUANTIZE of constants folded ---------------------------------------------------------
FC_WEIGHTS = np.arange(32, dtype=np.float32).reshape(8, 4) / 7
FC_BIAS = np.float32([1, 2, 3, 4])


def test_float16_fully_connected_runs_everywhere():
    import tensorflow as tf

    flat = tflite(lambda x: tf.matmul(x, FC_WEIGHTS) + FC_BIAS, ([2, 8], "float32"), float16=True)
    ops = operators(flat)
    assert sorted(op.name for op in ops) == ["DEQUANTIZE", "DEQUANTIZE", "FULLY_CONNECTED"]
    assert all(op.inputs[0][1:] == (True, "FLOAT16") for op in ops if op.name == "DEQUANTIZE")
    # TF 2.12's analyzer counts the dequantized weights as runtime inputs ("FullyConnected doesn't
    # support more than 2 runtime inputs"); the delegates fold them into constants.
    for backend, what in (("webgpu", "run on the GPU"), ("opencl", "run on the GPU"), ("gl", "have shaders")):
        assert verdict(flat, backend) == []
        assert verdicts.verdict_line(flat, backend) == f"{verdicts.BACKENDS[backend]}: all 3 ops {what}"


def test_fully_connected_of_unfolded_dequantize_follows_the_analyzer():
    # The same file with the float16 weights made runtime tensors: nothing to fold, and TF 2.12's
    # analyzer refuses the three runtime inputs (TF 2.21's says nothing).
    import tensorflow as tf

    flat = edited(tflite(lambda x: tf.matmul(x, FC_WEIGHTS) + FC_BIAS, ([2, 8], "float32"), float16=True),
                  unfolded)
    assert [op.inputs[0][1] for op in operators(flat) if op.name == "DEQUANTIZE"] == [False, False]
    warned = any("runtime inputs" in line for line in gpu_warnings(flat))
    expected = ["FULLY_CONNECTED"] if warned else []
    assert verdict(flat, "opencl") == expected == verdict(flat, "webgpu")
    assert verdict(flat, "gl") == []


def test_float16_constant_of_a_sub_is_not_a_runtime_tensor():
    flat = tflite(lambda x: x - np.float32([1, 2, 3]), ([1, 4, 5, 3], "float32"), float16=True)
    assert [op.name for op in operators(flat)] == ["DEQUANTIZE", "SUB"]
    assert verdict(flat, "gl") == []
    assert verdicts.gl_limit_reasons(flat) == {}
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: all 2 ops have shaders"
    # Unfolded, the SUB broadcasts two runtime tensors.
    flat = edited(flat, unfolded)
    assert verdict(flat, "gl") == ["SUB"]
    assert verdicts.gl_limit_reasons(flat) == {"SUB": "broadcasts two runtime tensors"}
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}SUB (broadcasts two runtime tensors)"


def test_float16_constant_of_a_mul_still_needs_one_input_to_cover_the_other():
    # The folded weights [1, 1, 5] times x [1, 4, 1]: TF 2.12's analyzer warns about this MUL (a
    # warning that is not about runtime inputs, so it stands although the MUL reads folded weights).
    values = np.arange(1, 6, dtype=np.float32).reshape(1, 1, 5)
    flat = tflite(lambda x: x * values, ([1, 4, 1], "float32"), float16=True)
    assert [op.name for op in operators(flat)] == ["DEQUANTIZE", "MUL"]
    assert verdict(flat, "gl") == ["MUL"]
    assert verdicts.gl_limit_reasons(flat) == {"MUL": "neither input covers the other"}
    warned = any("MUL requires" in line for line in gpu_warnings(flat))
    assert verdict(flat, "opencl") == (["MUL"] if warned else []) == verdict(flat, "webgpu")
    assert verdict(WithoutAnalyzerWarnings(flat), "opencl") == []
    # The GL reasons belong to the GL verdict only.
    assert verdicts.verdict_line(flat, "opencl") == (f"{OPENCL}: {NOT_ACCELERATED}MUL" if warned
                                                     else f"{OPENCL}: all 2 ops run on the GPU")


def test_float16_table_gathered_by_runtime_ids():
    import tensorflow as tf

    table = np.arange(24, dtype=np.float32).reshape(6, 4)
    flat = tflite(lambda ids: tf.gather(table, ids), ([3], "int32"), float16=True)
    assert [op.name for op in operators(flat)] == ["DEQUANTIZE", "GATHER"]
    for backend in ("opencl", "webgpu", "gl"):
        assert verdict(flat, backend) == ["GATHER"]


# The analyzer's warnings --------------------------------------------------------------------------
def test_analyzer_warnings_name_the_op_they_follow():
    # A 2-D STRIDED_SLICE: TF 2.12's analyzer warns "STRIDED_SLICE supports for 3 or 4 dimensional
    # tensors only"; the op list and version (1) alone take it.
    flat = tflite(lambda x: x[:, 1:3] * 2.0 + 1.0, ([2, 4], "float32"))
    assert [(op.name, op.version) for op in operators(flat)] == [("STRIDED_SLICE", 1), ("MUL", 1), ("ADD", 1)]
    warned = any("STRIDED_SLICE" in line for line in gpu_warnings(flat))
    expected = ["STRIDED_SLICE"] if warned else []
    assert verdict(flat, "opencl") == expected == verdict(flat, "webgpu")
    assert verdict(WithoutAnalyzerWarnings(flat), "opencl") == []
    assert verdict(flat, "gl") == ["STRIDED_SLICE"]
    if warned:
        assert verdicts.verdict_line(flat, "opencl") == f"{OPENCL}: {NOT_ACCELERATED}STRIDED_SLICE"


def test_analyzer_warnings_after_a_folded_fully_connected_still_count():
    # The float16 FULLY_CONNECTED's "runtime inputs" warning is passed over; the 2-D STRIDED_SLICE
    # after it is still refused by TF 2.12's analyzer.
    import tensorflow as tf

    flat = tflite(lambda x: (tf.matmul(x, FC_WEIGHTS) + FC_BIAS)[:, 1:3], ([2, 8], "float32"), float16=True)
    names = [op.name for op in operators(flat)]
    assert names[2:] == ["FULLY_CONNECTED", "STRIDED_SLICE"] and sorted(names[:2]) == ["DEQUANTIZE"] * 2
    warned = any("STRIDED_SLICE" in line for line in gpu_warnings(flat))
    assert verdict(flat, "opencl") == (["STRIDED_SLICE"] if warned else []) == verdict(flat, "webgpu")
    assert verdict(flat, "gl") == ["STRIDED_SLICE"]


def test_verdict_line_takes_a_decoded_file():
    import tensorflow as tf

    flat = TfliteFile(tflite(lambda x: tf.transpose(x) * 2.0, ([2, 3], "float32")))
    assert verdicts.verdict_line(flat, "gl") == f"{GL}: {NOT_ACCELERATED}TRANSPOSE"
    assert verdicts.verdict_line(flat, "webgpu") == f"{WEBGPU}: all 2 ops run on the GPU"
    assert verdicts.gpu_incompatible_ops(flat, "gl") == ["TRANSPOSE"]
