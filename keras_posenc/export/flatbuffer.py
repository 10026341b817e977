"""Reading a TFLite flatbuffer: its operators, with their names and versions.

Read with TensorFlow's own flatbuffer utilities (`tensorflow.lite.tools.flatbuffer_utils`,
which parse with the generated schema and name ops with `schema_util`), not by hand.
"""

import collections
import contextlib
import io

import tensorflow as tf
from tensorflow.lite.tools import flatbuffer_utils

__all__ = ["TfliteFile", "analyzer_report", "check_flatbuffer", "decoded", "input_names", "op_counts",
           "operators"]

Operator = collections.namedtuple("Operator", ["name", "version", "inputs", "outputs", "input_tensors",
                                               "output_tensors"])


def check_flatbuffer(tflite_bytes):
    """Raises TypeError/ValueError unless `tflite_bytes` is a TFLite flatbuffer.

    Example:

    >>> check_flatbuffer(b"\\x00" * 32)
    Traceback (most recent call last):
        ...
    ValueError: `tflite_bytes` is not a TFLite flatbuffer (no 'TFL3' identifier).
    """
    if isinstance(tflite_bytes, TfliteFile):
        return
    if not isinstance(tflite_bytes, (bytes, bytearray)):
        raise TypeError(f"`tflite_bytes` must be bytes, got {type(tflite_bytes).__name__}.")
    if len(tflite_bytes) < 8 or bytes(tflite_bytes[4:8]) != b"TFL3":
        raise ValueError("`tflite_bytes` is not a TFLite flatbuffer (no 'TFL3' identifier).")


def operators(tflite_bytes):
    """Every operator of every subgraph, in execution order, with its op version and tensor shapes.

    Builtin ops are named as in the TFLite schema (`FULLY_CONNECTED`); custom
    ops by their custom code (Flex ops are `FlexXxx`).

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).

    Returns:
        A list of `Operator(name, version, inputs, outputs, input_tensors,
        output_tensors)`; `inputs` and `outputs` are lists of
        `(shape tuple, is_constant, dtype name)` (shape None for an omitted
        optional input), `input_tensors` and `output_tensors` the tensor
        indices.

    Example:

    >>> import tensorflow as tf
    >>> add = tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert()
    >>> [(op.name, op.version) for op in operators(flat)]
    [('ADD', 1)]
    """
    return decoded(tflite_bytes).operators


def op_counts(tflite_bytes):
    """Histogram of the operators of a TFLite flatbuffer, read from the flatbuffer itself.

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).

    Returns:
        A dict `{op name: count}` sorted by name.

    Example:

    >>> import tensorflow as tf
    >>> add = tf.function(lambda x: tf.gather(x, [2, 0]) + 1.0,
    ...                   input_signature=[tf.TensorSpec([3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert()
    >>> op_counts(flat)
    {'ADD': 1, 'GATHER': 1}

    References:
        - [The TFLite flatbuffer schema](https://github.com/tensorflow/tensorflow/blob/v2.12.0/tensorflow/lite/schema/schema.fbs).
    """
    counts = collections.Counter(op.name for op in operators(tflite_bytes))
    return dict(sorted(counts.items()))


def input_names(tflite_bytes):
    """The names of the model's inputs (first subgraph), in the file's order.

    Example:

    >>> import tensorflow as tf
    >>> add = tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([3], tf.float32, name="ids")])
    >>> input_names(tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert())
    ['ids']
    """
    return list(decoded(tflite_bytes).input_names)


class TfliteFile:
    """A TFLite flatbuffer decoded once, for every reader of one export (ops, verdicts, cost, inputs).

    The functions of `keras_posenc.export` that take `tflite_bytes` take a `TfliteFile` too.

    Attributes:
        bytes: the flatbuffer.
        model: the decoded schema object (`flatbuffer_utils`).
        operators: the `Operator`s of every subgraph, in execution order.
        input_names: the names of the first subgraph's inputs.
        analyzer_report: the TFLite analyzer's printout, computed on first use.

    Example:

    >>> import tensorflow as tf
    >>> add = tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([3], tf.float32, name="ids")])
    >>> converter = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()])
    >>> flat = TfliteFile(converter.convert())
    >>> [op.name for op in flat.operators], flat.input_names, decoded(flat) is flat
    (['ADD'], ['ids'], True)
    """

    def __init__(self, tflite_bytes):
        check_flatbuffer(tflite_bytes)
        self.bytes = bytes(tflite_bytes)
        self.model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_bytes))
        self.operators = _operators(self.model)
        graph = self.model.subgraphs[0]
        names = [graph.tensors[index].name for index in graph.inputs]
        self.input_names = [name.decode() if isinstance(name, bytes) else str(name) for name in names]
        self._analyzer_report = None

    def __len__(self):
        return len(self.bytes)

    @property
    def analyzer_report(self):
        if self._analyzer_report is None:
            self._analyzer_report = analyzer_report(self.bytes)
        return self._analyzer_report


def decoded(tflite):
    """`tflite` as a `TfliteFile`: decoded now from bytes, or the given one."""
    return tflite if isinstance(tflite, TfliteFile) else TfliteFile(tflite)


def _operators(model):
    """The `Operator`s of a decoded flatbuffer object."""
    codes = []
    for code in model.operatorCodes:
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        name = flatbuffer_utils.opcode_to_name(model, model.operatorCodes.index(code))
        if builtin == flatbuffer_utils.schema_fb.BuiltinOperator.CUSTOM:
            custom = code.customCode
            name = custom.decode() if isinstance(custom, bytes) else str(custom)
        codes.append((name, code.version))
    result = []
    for graph in model.subgraphs:
        tensors = graph.tensors or []

        def describe(indices, tensors=tensors):
            described = []
            for index in (indices if indices is not None else []):
                if index < 0:
                    described.append((None, False, None))
                    continue
                tensor = tensors[index]
                constant = bool(model.buffers[tensor.buffer].data is not None and
                                len(model.buffers[tensor.buffer].data))
                shape = tuple(int(n) for n in tensor.shape) if tensor.shape is not None else ()
                described.append((shape, constant, flatbuffer_utils.type_to_name(tensor.type)))
            return described

        for op in graph.operators or []:
            name, version = codes[op.opcodeIndex]
            result.append(Operator(name, version, describe(op.inputs), describe(op.outputs),
                                   [int(i) for i in (op.inputs if op.inputs is not None else [])],
                                   [int(i) for i in (op.outputs if op.outputs is not None else [])]))
    return result


def analyzer_report(tflite_bytes):
    """The text the installed TFLite analyzer prints for the model, with GPU-compatibility warnings.

    TF 2.12's analyzer warns about ops its GPU parser lacks ("Not supported op GATHER"); TF 2.21's
    prints the listing but no such warning, even for GATHER, TOPK_V2 or REVERSE_V2 (measured),
    so there the verdicts rest on the parser lists of `gpu_incompatible_ops` alone.

    Example:

    >>> add = tf.function(lambda x: tf.gather(x, [2, 0]) + 1.0,
    ...                   input_signature=[tf.TensorSpec([3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert()
    >>> "Op#0 GATHER(T#0, T#1[2, 0])" in analyzer_report(flat)
    True
    """
    if isinstance(tflite_bytes, TfliteFile):
        return tflite_bytes.analyzer_report
    check_flatbuffer(tflite_bytes)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        tf.lite.experimental.Analyzer.analyze(model_content=bytes(tflite_bytes), gpu_compatibility=True)
    return buffer.getvalue()
