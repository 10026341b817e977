"""graph_cost on small TFLite files whose figures are counted by hand.

Each file holds one op kind with known shapes, so its multiply-adds are one formula: output
elements x the contracted size (FULLY_CONNECTED, BATCH_MATMUL with or without an adjoint, CONV_2D),
x the window (DEPTHWISE_CONV_2D), one per output element (MUL). No TensorFlow op runs at import
(mutmut forks the test process, and a started TF runtime does not survive a fork).
"""

import numpy as np
import pytest

from keras_posenc.export.cost import graph_cost


def _tflite(*functions, module=None):
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [function.get_concrete_function() for function in functions], module)
    return converter.convert()


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


@pytest.mark.parametrize("transpose_b", [False, True])
def test_batch_matmul_with_and_without_an_adjoint(transpose_b):
    import tensorflow as tf

    second = _spec(2, 6, 3) if transpose_b else _spec(2, 3, 6)
    product = tf.function(lambda a, b: tf.matmul(a, b, transpose_b=transpose_b),
                          input_signature=[_spec(2, 4, 3), second])
    cost = graph_cost(_tflite(product))
    assert cost["multiply_adds"] == 2 * 4 * 6 * 3
    assert (cost["largest_tensor_bytes"], cost["largest_tensor_shape"]) == (2 * 4 * 6 * 4, [2, 4, 6])


def test_batch_matmul_with_a_long_contraction():
    import tensorflow as tf

    # K = 50 is larger than M and N: K is recovered from the shapes, not from the output's
    product = tf.function(lambda a, b: tf.matmul(a, b), input_signature=[_spec(3, 2, 50), _spec(3, 50, 7)])
    cost = graph_cost(_tflite(product))
    assert cost["multiply_adds"] == 3 * 2 * 7 * 50
    assert cost["largest_tensor_shape"] == [3, 50, 7]  # an input is the largest tensor


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
