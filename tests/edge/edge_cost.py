"""onnx_cost on ONNX graphs built node by node (onnx's helper, from the edge onnx-site), counted by hand."""

import numpy as np
import onnx  # from the edge onnx-site (tests/edge/conftest.py puts it on the path)
from onnx import TensorProto, helper, numpy_helper

from keras_posenc.export.cost import onnx_cost


def _model(nodes, inputs, outputs, initializers=()):
    def value(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    graph = helper.make_graph(nodes, "costed", [value(n, s) for n, s in inputs],
                              [value(n, s) for n, s in outputs],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_matmul_with_a_weight_and_a_mul():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Mul", ["h", "h"], ["y"])]
    flat = _model(nodes, [("x", [4, 3])], [("y", [4, 5])], [("w", np.ones((3, 5)))])
    assert onnx_cost(flat) == {"multiply_adds": 4 * 5 * 3 + 4 * 5, "constant_bytes": 3 * 5 * 4,
                               "largest_tensor_bytes": 4 * 5 * 4, "largest_tensor_shape": [4, 5]}


def test_gemm_and_a_batched_matmul():
    nodes = [helper.make_node("Gemm", ["a", "b"], ["g"]), helper.make_node("MatMul", ["p", "q"], ["r"])]
    flat = _model(nodes, [("a", [4, 3]), ("b", [3, 5]), ("p", [2, 4, 3]), ("q", [2, 3, 6])],
                  [("g", [4, 5]), ("r", [2, 4, 6])])
    cost = onnx_cost(flat)
    assert cost["multiply_adds"] == 4 * 5 * 3 + 2 * 4 * 6 * 3
    assert (cost["largest_tensor_bytes"], cost["largest_tensor_shape"]) == (2 * 4 * 6 * 4, [2, 4, 6])
    assert cost["constant_bytes"] == 0


def test_conv_and_a_constant_node():
    table = numpy_helper.from_array(np.arange(10, dtype=np.float32), "table")
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Constant", [], ["t"], value=table),
             helper.make_node("Mul", ["c", "s"], ["y"]),
             helper.make_node("Identity", ["t"], ["u"])]
    flat = _model(nodes, [("x", [1, 3, 8, 8]), ("s", [1, 4, 8, 8])], [("y", [1, 4, 8, 8]), ("u", [10])],
                  [("k", np.ones((4, 3, 3, 3)))])
    cost = onnx_cost(flat)
    assert cost["multiply_adds"] == (4 * 8 * 8) * (3 * 3 * 3) + 4 * 8 * 8
    assert cost["constant_bytes"] == 4 * 3 * 3 * 3 * 4 + 10 * 4
    # the kernel (432 bytes) is a constant, so the largest run-time tensor is a [1, 4, 8, 8] one
    assert (cost["largest_tensor_bytes"], cost["largest_tensor_shape"]) == (4 * 8 * 8 * 4, [1, 4, 8, 8])


def test_constants_of_every_initializer_and_a_constant_weight():
    weight = numpy_helper.from_array(np.ones((3, 2), np.float32), "weight")
    nodes = [helper.make_node("Constant", [], ["w"], value=weight),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("MatMul", ["hb", "second"], ["y"])]
    flat = _model(nodes, [("x", [4, 3])], [("y", [4, 5])],
                  [("bias", np.zeros(2)), ("second", np.ones((2, 5)))])
    cost = onnx_cost(flat)
    # the Constant's shape is known, so its MatMul counts: 4 x 2 x 3, then 4 x 5 x 2
    assert cost["multiply_adds"] == 4 * 2 * 3 + 4 * 5 * 2
    assert cost["constant_bytes"] == (3 * 2 + 2 + 2 * 5) * 4


def test_the_largest_tensor_by_bytes_not_by_name():
    nodes = [helper.make_node("MatMul", ["a_big", "w"], ["z_small"])]
    flat = _model(nodes, [("a_big", [16, 8])], [("z_small", [16, 1])], [("w", np.ones((8, 1)))])
    cost = onnx_cost(flat)
    assert (cost["largest_tensor_bytes"], cost["largest_tensor_shape"]) == (16 * 8 * 4, [16, 8])


def test_a_node_of_unknown_shape_is_skipped_and_the_rest_counted():
    # an op of a domain that ONNX shape inference does not know: its output has no shape
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="example.custom"),
             helper.make_node("MatMul", ["m", "w"], ["y"]),
             helper.make_node("MatMul", ["x", "w"], ["z"])]
    graph = helper.make_graph(nodes, "costed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 5])],
                              [numpy_helper.from_array(np.ones((3, 5), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("example.custom", 1)])
    assert onnx_cost(model.SerializeToString())["multiply_adds"] == 4 * 5 * 3
