"""What a TFLite file holds, read with TensorFlow's interpreter, for the export tests."""

import tensorflow as tf

from keras_posenc.export.flatbuffer import op_counts


def tensor_dtypes(flat):
    """The dtypes of a TFLite file's tensors (float16 or int8 among them when its weights are)."""
    return {detail["dtype"] for detail in tf.lite.Interpreter(model_content=flat).get_tensor_details()}


def assert_same_graph(flat, other):
    """`flat` is `other`'s graph with other constants: the same ops, and as many bytes."""
    assert op_counts(flat) == op_counts(other)
    assert len(flat) == len(other)
