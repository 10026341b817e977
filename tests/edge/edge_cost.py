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
