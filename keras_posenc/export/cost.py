"""What an exported graph costs: multiply-adds, constant bytes and the largest intermediate tensor.

Read from the file itself (the TFLite flatbuffer's tensor shapes, the ONNX graph's inferred
shapes), so the figures of the `cpu`, `gpu`, `gl` and `tensorrt` exports of one model compare
directly:

- multiply-adds: FULLY_CONNECTED and CONV_2D (output elements x the contracted size),
  DEPTHWISE_CONV_2D (x the window), BATCH_MATMUL (x the contracted size) and MUL (one per
  output element); the ONNX ops MatMul, Gemm, Conv and Mul likewise. Additions, activations and
  the softmax are not counted: they are linear in the tensor sizes;
- constant bytes: every constant tensor (weights, position tables, masks, one-hot classes);
  `export_report` subtracts the model's weight bytes to name what the formulation adds;
- the largest intermediate: the biggest tensor computed at run time (bytes and shape), what a
  runtime must hold in memory at once.
"""

import numpy as np
from tensorflow.lite.tools import flatbuffer_utils

from keras_posenc.export.flatbuffer import decoded

__all__ = ["graph_cost", "onnx_cost"]

_ITEM_BYTES = {"FLOAT32": 4, "FLOAT16": 2, "INT32": 4, "INT64": 8, "INT8": 1, "UINT8": 1, "BOOL": 1,
               "INT16": 2, "FLOAT64": 8}


def _elements(shape):
    return int(np.prod(shape, dtype=np.int64))


def _multiply_adds(name, inputs, output):
    """Multiply-adds of one op from its input and output shapes (0 for the ops not counted)."""
    if name == "FULLY_CONNECTED":  # weights [units, input features]; the input is read as [-1, features]
        return _elements(output) * int(inputs[1][-1])
    if name in ("MatMul", "Gemm"):  # contracted: the first input's last axis (Gemm without transA)
        return _elements(output) * int(inputs[0][-1])
    if name == "BATCH_MATMUL":
        return _batch_matmul(inputs[0], inputs[1], output)
    if name in ("CONV_2D", "Conv"):  # TFLite filter [out, h, w, in]; ONNX [out, in, h, w]
        return _elements(output) * _elements(inputs[1][1:])
    if name == "DEPTHWISE_CONV_2D":  # filter [1, h, w, channels]
        return _elements(output) * _elements(inputs[1][1:3])
    if name in ("MUL", "Mul"):
        return _elements(output)
    return 0


def _batch_matmul(first, second, output):
    """out x K for [..., M, K] x [..., K, N] (either adjoint): K^2 = (M K)(K N) / (M N)."""
    rows, columns = int(output[-2]), int(output[-1])
    squared = int(first[-2]) * int(first[-1]) * int(second[-2]) * int(second[-1]) // max(1, rows * columns)
    return _elements(output) * int(round(squared ** 0.5))


def graph_cost(tflite_bytes, signature=None):
    """Multiply-adds, constant bytes and the largest intermediate tensor of a TFLite file.

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).
        signature: optional signature key (e.g. "decode" of a prefill/decode file): count that
            signature's subgraph only; default every subgraph.

    Returns:
        A dict: `multiply_adds` (int), `constant_bytes` (int, each constant
        buffer once), `largest_tensor_bytes` (int) and `largest_tensor_shape`
        (list) of the largest tensor computed at run time (inputs included).

    Example:

    >>> import tensorflow as tf
    >>> dense = tf.function(lambda x: tf.matmul(x, tf.ones([3, 5])) * 2.0,
    ...                     input_signature=[tf.TensorSpec([4, 3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([dense.get_concrete_function()]).convert()
    >>> cost = graph_cost(flat)  # 4 x 5 outputs x 3 (FULLY_CONNECTED), MUL folded into the weights
    >>> cost["multiply_adds"], cost["largest_tensor_shape"], cost["largest_tensor_bytes"]
    (60, [4, 5], 80)
    """
    model = decoded(tflite_bytes).model
    names = [flatbuffer_utils.opcode_to_name(model, index) for index in range(len(model.operatorCodes))]
    multiply_adds, constants, largest, largest_shape = 0, set(), 0, []
    constant_bytes = 0
    graphs = model.subgraphs
    if signature is not None:
        keys = {definition.signatureKey.decode(): definition.subgraphIndex
                for definition in model.signatureDefs or []}
        if signature not in keys:
            raise ValueError(f"`signature`={signature!r} is not in the file; it has {sorted(keys)}.")
        graphs = [model.subgraphs[keys[signature]]]
    for graph in graphs:
        tensors = graph.tensors or []

        def shape(index, tensors=tensors):
            if index < 0:
                return None
            value = tensors[index].shape
            return [int(n) for n in value] if value is not None else []

        for index, tensor in enumerate(tensors):
            data = model.buffers[tensor.buffer].data
            if data is not None and len(data):
                if tensor.buffer not in constants:
                    constants.add(tensor.buffer)
                    constant_bytes += len(data)
                continue
            item = _ITEM_BYTES.get(flatbuffer_utils.type_to_name(tensor.type).upper(), 4)
            size = _elements(shape(index)) * item
            if size > largest:
                largest, largest_shape = size, shape(index)
        for op in graph.operators or []:
            inputs = [shape(i) for i in (op.inputs if op.inputs is not None else [])]
            output = shape(op.outputs[0])
            multiply_adds += _multiply_adds(names[op.opcodeIndex], inputs, output)
    return {"multiply_adds": int(multiply_adds), "constant_bytes": int(constant_bytes),
            "largest_tensor_bytes": int(largest), "largest_tensor_shape": largest_shape}


def onnx_cost(onnx_bytes):
    """The same figures as `graph_cost` for an ONNX model (shapes from ONNX shape inference).

    Args:
        onnx_bytes: a serialized ONNX `ModelProto` (from `to_onnx`).

    Returns:
        The dict of `graph_cost`.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.shape_inference.infer_shapes(onnx.load_from_string(bytes(onnx_bytes)))
    graph = model.graph
    shapes, sizes = {}, {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        kind = value.type.tensor_type
        dims = [d.dim_value for d in kind.shape.dim]
        shapes[value.name] = dims
        item = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type)).itemsize
        sizes[value.name] = _elements(dims) * item
    constant_bytes = 0
    for initializer in graph.initializer:
        array = numpy_helper.to_array(initializer)
        shapes[initializer.name] = list(array.shape)
        constant_bytes += array.nbytes
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    array = numpy_helper.to_array(attribute.t)
                    shapes[node.output[0]] = list(array.shape)
                    constant_bytes += array.nbytes
    multiply_adds = 0
    for node in graph.node:
        inputs = [shapes.get(name) for name in node.input]
        output = shapes.get(node.output[0])
        if output is None or any(shape is None for shape in inputs[:2]):  # not inferred: not counted
            continue
        multiply_adds += _multiply_adds(node.op_type, inputs, output)
    runtime = {name: size for name, size in sizes.items()
               if name not in {initializer.name for initializer in graph.initializer}}
    name = max(runtime, key=runtime.get)  # a graph has outputs
    return {"multiply_adds": int(multiply_adds), "constant_bytes": int(constant_bytes),
            "largest_tensor_bytes": int(runtime[name]), "largest_tensor_shape": shapes[name]}
