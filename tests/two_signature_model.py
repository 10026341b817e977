"""The two-signature TFLite file that the LiteRT Python's tests run (tests/test_litert_runtime.py here,
tests/edge/edge_litert_python.py in the real LiteRT Python).

Signatures `project` (x[1, 3], ids[2] -> y = x @ WEIGHTS, twice = 2 ids) and `shift` (v[4] -> v + 1),
with inputs and values whose expected outputs numpy gives.
"""

import os

import numpy as np

WEIGHTS = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5
X = np.array([[0.5, -1.0, 2.0]], np.float32)
IDS = np.array([3, -4], np.int32)
V = np.array([0.0, 1.5, -2.0, 7.0], np.float32)


def two_signature_tflite(folder):
    """The flatbuffer, converted from a SavedModel written under `folder` (TensorFlow imported here)."""
    import tensorflow as tf

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 3], tf.float32, name="x"),
                                      tf.TensorSpec([2], tf.int32, name="ids")])
        def project(self, x, ids):
            return {"y": tf.matmul(x, tf.constant(WEIGHTS)), "twice": ids * 2}

        @tf.function(input_signature=[tf.TensorSpec([4], tf.float32, name="v")])
        def shift(self, v):
            return {"shifted": v + 1.0}

    model = Model()
    saved = os.path.join(str(folder), "saved")
    tf.saved_model.save(model, saved, signatures={"project": model.project, "shift": model.shift})
    return tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=["project", "shift"]).convert()
