"""Reading a TFLite file (keras_posenc/export/flatbuffer.py): its ops, inputs and analyzer report.

The files are converted from small tf.functions; where the converter cannot produce a case (a
custom op, a file written before the schema's 32-bit op codes, an op with an omitted input in the
middle), the converted file is edited with TensorFlow's flatbuffer utilities and written again.
The expected values are read off each function: its ops, shapes, constants and input names.
"""

import copy

import numpy as np
import pytest

from keras_posenc.export.flatbuffer import (
    Operator,
    TfliteFile,
    analyzer_report,
    check_flatbuffer,
    decoded,
    input_names,
    op_counts,
    operators,
)

WEIGHTS = np.arange(6, dtype=np.float32).reshape(3, 2)


def convert(function, *specs):
    """The TFLite file of `function` over inputs `specs` = ((shape, dtype name, input name), ...)."""
    import tensorflow as tf

    signature = [tf.TensorSpec(shape, dtype, name=name) for shape, dtype, name in specs]
    concrete = tf.function(function, input_signature=signature).get_concrete_function()
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete]).convert()


def edited(flat, edit):
    """`flat` with `edit(model)` applied to its decoded flatbuffer object, written again."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flat))
    edit(model)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


@pytest.fixture(scope="module")
def add_file():
    """x[3] + 1.0: ADD(T#0 input, T#1 the scalar constant) -> T#2."""
    return convert(lambda x: x + 1.0, ([3], "float32", "ids"))


@pytest.fixture(scope="module")
def matmul_file():
    """x[1, 3] @ W[3, 2]: FULLY_CONNECTED with W stored transposed, [2, 3], and no bias (-1)."""
    import tensorflow as tf

    return convert(lambda x: tf.matmul(x, tf.constant(WEIGHTS)), ([1, 3], "float32", "x"))


@pytest.fixture(scope="module")
def gather_file():
    """gather(x, [2, 0]) + positions: GATHER runs before ADD; an int32 constant, two named inputs."""
    import tensorflow as tf

    return convert(lambda ids, positions: tf.gather(ids, [2, 0]) + positions,
                   ([3], "float32", "ids"), ([2], "float32", "positions"))


# check_flatbuffer ------------------------------------------------------------------------------

def test_check_flatbuffer_names_the_type_of_what_is_not_bytes():
    with pytest.raises(TypeError) as error:
        check_flatbuffer("TFL3 model")
    assert str(error.value) == "`tflite_bytes` must be bytes, got str."
    with pytest.raises(TypeError) as error:
        check_flatbuffer([0] * 8)
    assert str(error.value) == "`tflite_bytes` must be bytes, got list."


@pytest.mark.parametrize("data", [b"\x00" * 32, b"\x00\x00\x00\x00TFL", b"TFL3\x00\x00\x00\x00",
                                  b"\x00\x00\x00\x00TFL2", b"\x00\x00\x00TFL3\x00", b""])
def test_check_flatbuffer_refuses_bytes_without_the_identifier_at_offset_4(data):
    with pytest.raises(ValueError) as error:
        check_flatbuffer(data)
    assert str(error.value) == "`tflite_bytes` is not a TFLite flatbuffer (no 'TFL3' identifier)."
    with pytest.raises(ValueError) as error:
        check_flatbuffer(bytearray(data))
    assert str(error.value) == "`tflite_bytes` is not a TFLite flatbuffer (no 'TFL3' identifier)."


def test_check_flatbuffer_accepts_the_identifier_at_offset_4_bytes_bytearray_and_a_decoded_file(add_file):
    assert check_flatbuffer(b"\x00\x00\x00\x00TFL3") is None  # the shortest: 8 bytes
    assert check_flatbuffer(bytearray(b"\x10\x00\x00\x00TFL3\x00\x00")) is None
    assert check_flatbuffer(add_file) is None
    assert check_flatbuffer(TfliteFile(add_file)) is None


# operators and op_counts -----------------------------------------------------------------------

def test_operators_of_an_add_with_a_scalar_constant(add_file):
    assert operators(add_file) == [
        Operator("ADD", 1, [((3,), False, "FLOAT32"), ((), True, "FLOAT32")], [((3,), False, "FLOAT32")],
                 [0, 1], [2])]


def test_operators_of_a_matmul_show_the_constant_weights_and_the_omitted_bias(matmul_file):
    (op,) = operators(matmul_file)
    assert op == Operator("FULLY_CONNECTED", 1,
                          [((1, 3), False, "FLOAT32"), ((2, 3), True, "FLOAT32"), (None, False, None)],
                          [((1, 2), False, "FLOAT32")], [0, 1, -1], [2])


def test_operators_in_execution_order_and_their_counts_sorted_by_name(gather_file):
    ops = operators(gather_file)
    assert [op.name for op in ops] == ["GATHER", "ADD"]
    gather, add = ops
    assert gather.inputs == [((3,), False, "FLOAT32"), ((2,), True, "INT32")]
    assert gather.outputs == [((2,), False, "FLOAT32")]
    assert add.inputs[1] == ((2,), False, "FLOAT32")  # `positions`, an input: no data
    assert (gather.input_tensors, gather.output_tensors) == ([0, 2], [3])  # ids, then the constant
    assert (add.input_tensors, add.output_tensors) == ([3, 1], [4])  # GATHER's result, positions
    assert list(op_counts(gather_file).items()) == [("ADD", 1), ("GATHER", 1)]


def test_op_counts_counts_repeated_ops():
    import tensorflow as tf

    flat = convert(lambda x, y: tf.gather(x * y, [1]) * tf.gather(x, [0]) * tf.gather(y, [2]),
                   ([3], "float32", "x"), ([3], "float32", "y"))
    assert op_counts(flat) == {"GATHER": 3, "MUL": 3}
    assert list(op_counts(flat)) == ["GATHER", "MUL"]


def test_operators_of_every_subgraph_main_first():
    """A while loop: WHILE in the main graph, its condition and body as subgraphs of their own."""
    import tensorflow as tf

    def loop(x):
        return tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0), (tf.constant(0), x))[1]

    flat = convert(loop, ([2], "float32", "x"))
    names = [op.name for op in operators(flat)]
    assert names[0] == "WHILE"
    assert sorted(names[1:]) == ["ADD", "LESS", "MUL"]
    assert op_counts(flat) == {"ADD": 1, "LESS": 1, "MUL": 1, "WHILE": 1}


def test_custom_op_named_by_its_custom_code(add_file):
    def custom(model):
        code = model.operatorCodes[0]
        code.builtinCode = code.deprecatedBuiltinCode = 32  # BuiltinOperator.CUSTOM
        code.customCode = "FlexMyAdd"

    assert [(op.name, op.version) for op in operators(edited(add_file, custom))] == [("FlexMyAdd", 1)]


def test_custom_op_of_a_file_from_before_the_32_bit_op_codes(add_file):
    """Older writers set only `deprecated_builtin_code`; `builtin_code` then reads 0 (ADD)."""
    def old_custom(model):
        code = model.operatorCodes[0]
        code.builtinCode, code.deprecatedBuiltinCode, code.customCode = 0, 32, "MyAdd"

    assert [op.name for op in operators(edited(add_file, old_custom))] == ["MyAdd"]


def test_an_op_past_code_127_and_the_written_op_version(add_file):
    """Codes past 127 are in `builtin_code` alone (`deprecated_builtin_code` holds 127)."""
    def gelu(model):
        code = model.operatorCodes[0]
        code.builtinCode, code.deprecatedBuiltinCode, code.version = 150, 127, 3  # GELU

    assert [(op.name, op.version) for op in operators(edited(add_file, gelu))] == [("GELU", 3)]


def test_omitted_inputs_anywhere_empty_buffers_and_tensors_without_shape(matmul_file):
    def edit(model):
        graph = model.subgraphs[0]
        op = graph.operators[0]
        op.inputs = np.array([-1, 0, 1], np.int32)  # the first input omitted, the others after it
        graph.tensors[0].shape = None
        model.buffers[graph.tensors[2].buffer].data = np.zeros(0, np.uint8)  # present, empty

    (op,) = operators(edited(matmul_file, edit))
    assert op.inputs == [(None, False, None), ((), False, "FLOAT32"), ((2, 3), True, "FLOAT32")]
    assert op.input_tensors == [-1, 0, 1]
    assert op.outputs == [((1, 2), False, "FLOAT32")]


def test_ops_without_inputs_or_outputs_and_subgraphs_without_ops(add_file):
    def edit(model):
        graph = model.subgraphs[0]
        empty = copy.deepcopy(graph)
        empty.operators = None
        empty.tensors = None
        graph.operators[0].inputs = None
        graph.operators[0].outputs = None
        model.subgraphs.append(empty)

    assert operators(edited(add_file, edit)) == [Operator("ADD", 1, [], [], [], [])]


def test_operators_and_counts_of_a_decoded_file(gather_file):
    flat = TfliteFile(gather_file)
    assert operators(flat) is flat.operators
    assert op_counts(flat) == {"ADD": 1, "GATHER": 1}


# input_names, TfliteFile, decoded ---------------------------------------------------------------

def test_input_names_in_the_files_order(gather_file, add_file):
    assert input_names(gather_file) == ["ids", "positions"]
    assert input_names(add_file) == ["ids"]
    flat = TfliteFile(gather_file)
    assert input_names(flat) == ["ids", "positions"]
    names = input_names(flat)
    names.append("other")  # a copy: the file's own list stays
    assert flat.input_names == ["ids", "positions"]


def test_tflite_file_from_a_bytearray(gather_file):
    flat = TfliteFile(bytearray(gather_file))
    assert type(flat.bytes) is bytes and flat.bytes == gather_file
    assert len(flat) == len(gather_file)
    assert [op.name for op in flat.operators] == ["GATHER", "ADD"]
    assert flat.input_names == ["ids", "positions"]
    assert [op.builtinCode for op in flat.model.operatorCodes] == [36, 0]  # GATHER, ADD
    assert decoded(flat) is flat
    again = decoded(gather_file)
    assert isinstance(again, TfliteFile) and again.bytes == gather_file
    assert again.operators == flat.operators


def test_tflite_file_refuses_what_is_not_a_flatbuffer():
    with pytest.raises(ValueError) as error:
        TfliteFile(b"\x00" * 32)
    assert str(error.value) == "`tflite_bytes` is not a TFLite flatbuffer (no 'TFL3' identifier)."
    with pytest.raises(TypeError) as error:
        decoded(None)
    assert str(error.value) == "`tflite_bytes` must be bytes, got NoneType."


# analyzer_report --------------------------------------------------------------------------------

def test_analyzer_report_lists_ops_and_tensors_with_the_gpu_check_and_prints_nothing(add_file, capsys):
    report = analyzer_report(add_file)
    assert report.startswith("=== TFLite ModelAnalyzer ===\n")
    assert "Subgraph#0 main(T#0) -> [T#2]\n  Op#0 ADD(T#0, T#1) -> [T#2]\n" in report
    assert "T#0(ids) shape:[3], type:FLOAT32\n" in report
    assert "Your model looks compatible with GPU delegate" in report  # the GPU check ran
    assert capsys.readouterr().out == ""
    assert analyzer_report(bytearray(add_file)) == report


def test_analyzer_report_of_what_is_not_a_flatbuffer():
    with pytest.raises(ValueError) as error:
        analyzer_report(b"\x00\x00\x00\x00TFL2")
    assert str(error.value) == "`tflite_bytes` is not a TFLite flatbuffer (no 'TFL3' identifier)."
    with pytest.raises(TypeError) as error:
        analyzer_report("model.tflite")
    assert str(error.value) == "`tflite_bytes` must be bytes, got str."


def test_a_decoded_file_runs_the_analyzer_once_on_first_use(gather_file, monkeypatch):
    import tensorflow as tf

    calls = []
    analyze = tf.lite.experimental.Analyzer.analyze

    def counted(**kwargs):
        calls.append(kwargs["model_content"])
        return analyze(**kwargs)

    monkeypatch.setattr(tf.lite.experimental.Analyzer, "analyze", counted)
    flat = TfliteFile(gather_file)
    assert calls == []
    report = flat.analyzer_report
    assert "  Op#0 GATHER(T#0, T#2[2, 0]) -> [T#3]\n" in report
    assert "  Op#1 ADD(T#3, T#1) -> [T#4]\n" in report
    assert calls == [gather_file]
    assert analyzer_report(flat) is report
    assert flat.analyzer_report is report
    assert calls == [gather_file]
    assert analyzer_report(gather_file) == report
    assert calls == [gather_file, gather_file]



def test_an_unnamed_input_and_a_custom_op_without_its_code_still_decode(gather_file):
    """Both strings are optional in the schema: absent, they read as 'None'."""
    def edit(model):
        model.subgraphs[0].tensors[1].name = None
        code = model.operatorCodes[1]
        code.builtinCode = code.deprecatedBuiltinCode = 32  # BuiltinOperator.CUSTOM
        code.customCode = None

    flat = TfliteFile(edited(gather_file, edit))
    assert flat.input_names == ["ids", "None"]
    assert [op.name for op in flat.operators] == ["GATHER", "None"]
