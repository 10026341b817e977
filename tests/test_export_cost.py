"""graph_cost on small TFLite files whose figures are counted by hand.

Each file holds one op kind with known shapes, so its multiply-adds are one formula: output
elements x the contracted size (FULLY_CONNECTED, BATCH_MATMUL with or without an adjoint, CONV_2D),
x the window (DEPTHWISE_CONV_2D), one per output element (MUL). No TensorFlow op runs at import
(mutmut forks the test process, and a started TF runtime does not survive a fork).
"""

import numpy as np
import pytest

from keras_posenc.export import conversion
from keras_posenc.export.cost import graph_cost


def _tflite(*functions, module=None, keep_batch_matmul=False):
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [function.get_concrete_function() for function in functions], module)
    if keep_batch_matmul:
        conversion.keep_batch_matmul(converter)
    return converter.convert()


def _ops(flat):
    from keras_posenc.export.flatbuffer import decoded

    return sorted({op.name for op in decoded(flat).operators})


def _spec(*shape):
    import tensorflow as tf

    return tf.TensorSpec(shape, tf.float32)


def _constant(*shape):
    import tensorflow as tf

    return tf.constant(np.random.default_rng(len(shape)).normal(size=shape).astype(np.float32))


def test_fully_connected():
    import tensorflow as tf

    weights = _constant(3, 5)
    dense = tf.function(lambda x: tf.matmul(x, weights), input_signature=[_spec(4, 3)])
    # [4, 5] outputs x 3 contracted; the 3 x 5 float32 weights; the output is the largest tensor
    assert graph_cost(_tflite(dense)) == {"multiply_adds": 4 * 5 * 3, "constant_bytes": 3 * 5 * 4,
                                          "largest_tensor_bytes": 4 * 5 * 4, "largest_tensor_shape": [4, 5]}


def test_fully_connected_reads_its_input_as_rows_of_the_weights_features():
    from keras_posenc.export.cost import _multiply_adds

    # TFLite's FULLY_CONNECTED flattens a [2, 6] input into [4, 3] rows for [5, 3] weights
    assert _multiply_adds("FULLY_CONNECTED", [[2, 6], [5, 3], None], [4, 5]) == 4 * 5 * 3
    assert _multiply_adds("MatMul", [[2, 6], [6, 5]], [2, 5]) == 2 * 5 * 6
    assert _multiply_adds("SOFTMAX", [[2, 6]], [2, 6]) == 0


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("adjoint", [(False, False), (False, True), (True, False)])
def test_batch_matmul_kept_or_unrolled_with_either_adjoint(keep, adjoint):
    import tensorflow as tf

    first = _spec(2, 3, 4) if adjoint[0] else _spec(2, 4, 3)
    second = _spec(2, 6, 3) if adjoint[1] else _spec(2, 3, 6)
    product = tf.function(lambda a, b: tf.matmul(a, b, transpose_a=adjoint[0], transpose_b=adjoint[1]),
                          input_signature=[first, second])
    flat = _tflite(product, keep_batch_matmul=keep)
    assert "BATCH_MATMUL" in _ops(flat) or not keep  # TF 2.21 keeps it either way; TF 2.12 unrolls it
    cost = graph_cost(flat)
    assert cost["multiply_adds"] == 2 * 4 * 6 * 3
    assert (cost["largest_tensor_bytes"], cost["largest_tensor_shape"]) == (2 * 4 * 6 * 4, [2, 4, 6])


@pytest.mark.parametrize("shapes, contracted", [
    (((3, 2, 50), (3, 50, 7)), 50),  # K larger than M and N: recovered from the shapes
    (((4, 1, 16), (4, 16, 1)), 16),  # one query against one key (a decode step's score): M = N = 1
])
def test_batch_matmul_contractions(shapes, contracted):
    import tensorflow as tf

    product = tf.function(lambda a, b: tf.matmul(a, b),
                          input_signature=[_spec(*shapes[0]), _spec(*shapes[1])])
    flat = _tflite(product, keep_batch_matmul=True)
    assert "BATCH_MATMUL" in _ops(flat)
    rows, columns = shapes[0][1], shapes[1][2]
    assert graph_cost(flat)["multiply_adds"] == shapes[0][0] * rows * columns * contracted


def test_convolutions():
    import tensorflow as tf

    kernel = _constant(3, 3, 3, 4)
    conv = tf.function(lambda x: tf.nn.conv2d(x, kernel, 1, "SAME"), input_signature=[_spec(1, 8, 8, 3)])
    cost = graph_cost(_tflite(conv))
    assert cost["multiply_adds"] == (8 * 8 * 4) * (3 * 3 * 3)
    assert cost["constant_bytes"] == (3 * 3 * 3 * 4 + 4) * 4  # the kernel and the converter's zero bias
    assert (cost["largest_tensor_bytes"], cost["largest_tensor_shape"]) == (8 * 8 * 4 * 4, [1, 8, 8, 4])
    window = _constant(3, 3, 3, 1)
    depthwise = tf.function(lambda x: tf.nn.depthwise_conv2d(x, window, [1, 1, 1, 1], "SAME"),
                            input_signature=[_spec(1, 8, 8, 3)])
    cost = graph_cost(_tflite(depthwise))
    assert cost["multiply_adds"] == (8 * 8 * 3) * (3 * 3)
    assert cost["constant_bytes"] == (3 * 3 * 3 + 3) * 4


def test_mul_counts_its_outputs_and_add_nothing():
    import tensorflow as tf

    function = tf.function(lambda x, y: x * y + x - y, input_signature=[_spec(4, 5), _spec(4, 5)])
    assert graph_cost(_tflite(function)) == {"multiply_adds": 20, "constant_bytes": 0,
                                             "largest_tensor_bytes": 80, "largest_tensor_shape": [4, 5]}


def test_integer_and_half_tensors_count_their_own_bytes():
    import tensorflow as tf

    ids = tf.function(lambda x: tf.cast(x, tf.int32) * 3, input_signature=[_spec(2, 10)])
    cost = graph_cost(_tflite(ids))
    assert (cost["largest_tensor_bytes"], cost["largest_tensor_shape"]) == (80, [2, 10])
    wide = tf.function(lambda x: tf.cast(x, tf.int8), input_signature=[tf.TensorSpec([3, 7], tf.int32)])
    assert graph_cost(_tflite(wide))["largest_tensor_bytes"] == 3 * 7 * 4  # the int32 input, not int8's 21


def _two_signatures():
    import tensorflow as tf

    weights = _constant(3, 5)

    class TwoCalls(tf.Module):
        @tf.function(input_signature=[_spec(4, 3)])
        def small(self, x):
            return {"y": tf.matmul(x, weights)}

        @tf.function(input_signature=[_spec(2, 4, 3), _spec(2, 3, 6)])
        def big(self, a, b):
            return {"z": tf.matmul(a, b)}

    module = TwoCalls()
    return _tflite(module.small, module.big, module=module)


def test_a_signature_counts_its_own_subgraph():
    flat = _two_signatures()
    small, big, whole = graph_cost(flat, "small"), graph_cost(flat, "big"), graph_cost(flat)
    assert small == {"multiply_adds": 60, "constant_bytes": 60, "largest_tensor_bytes": 80,
                     "largest_tensor_shape": [4, 5]}
    assert (big["multiply_adds"], big["largest_tensor_shape"]) == (144, [2, 4, 6])
    assert whole["multiply_adds"] == 60 + 144
    assert whole["constant_bytes"] == small["constant_bytes"] + big["constant_bytes"]
    assert (whole["largest_tensor_bytes"], whole["largest_tensor_shape"]) == (192, [2, 4, 6])


def test_an_unknown_signature_is_named_with_the_file_s():
    with pytest.raises(ValueError) as error:
        graph_cost(_two_signatures(), "decode")
    assert str(error.value) == "`signature`='decode' is not in the file; it has ['big', 'small']."


def test_a_buffer_shared_by_two_constants_counts_once():
    import tensorflow as tf
    from tensorflow.lite.tools import flatbuffer_utils

    first, second = _constant(3, 5), _constant(3, 5) * 2.0
    dense = tf.function(lambda x: tf.matmul(x, first) + tf.matmul(x, second), input_signature=[_spec(4, 3)])
    flat = _tflite(dense)
    assert graph_cost(flat)["constant_bytes"] == 2 * 3 * 5 * 4
    # point the second weight's tensor at the first one's buffer (as a deduplicating writer does)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flat))
    buffers = model.buffers
    weights = [t for t in model.subgraphs[0].tensors
               if buffers[t.buffer].data is not None and len(buffers[t.buffer].data) == 3 * 5 * 4]
    assert len(weights) == 2
    weights[1].buffer = weights[0].buffer
    shared = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    assert graph_cost(shared)["constant_bytes"] == 3 * 5 * 4


def test_the_largest_tensor_counts_bytes_of_its_own_type():
    import tensorflow as tf

    # int8 [100] in (100 bytes), three of them out as float32 (12 bytes): the int8 input is the largest
    head = tf.function(lambda x: tf.cast(x[:3], tf.float32) * 2.0,
                       input_signature=[tf.TensorSpec([100], tf.int8)])
    cost = graph_cost(_tflite(head))
    assert (cost["largest_tensor_bytes"], cost["largest_tensor_shape"]) == (100, [100])
