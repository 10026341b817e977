"""What a TFLite file holds, read with TensorFlow's interpreter, for the export tests."""

import tensorflow as tf


def tensor_dtypes(flat):
    """The dtypes of a TFLite file's tensors (float16 or int8 among them when its weights are)."""
    return {detail["dtype"] for detail in tf.lite.Interpreter(model_content=flat).get_tensor_details()}
