"""Keras's own ONNX export of models built from every public layer, run by onnxruntime.

Keras 3 (TensorFlow backend): `model.export(format="onnx")` (tf2onnx 1.17.0 of the edge cache).
Keras 2: its equivalent, `tf2onnx.convert.from_keras` (tf2onnx 1.16.1). Both with a static
`input_signature`; parity with Keras <= 1e-4 on left-padded batches. The models are those of
tests/test_keras_export.py (SavedModel and LiteRT).
"""

import os
import sys

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from keras_export_models import MODELS, feed_by_name, input_signature  # noqa: E402
from layer_test_helper import to_numpy  # noqa: E402

from keras_posenc.backend import backend_name, is_keras3  # noqa: E402

TOLERANCE = 1e-4
pytestmark = pytest.mark.skipif(backend_name() != "tensorflow",
                                reason="Keras's ONNX export of a JAX model needs jax2onnx (not in the lock)")


@pytest.fixture(scope="module")
def onnxruntime():
    try:
        import onnxruntime
        import tf2onnx  # noqa: F401
    except ImportError as error:
        pytest.fail(f"tf2onnx/onnxruntime are not in the edge cache ({error}): run `make test-edge` first.")
    return onnxruntime


def _onnx_file(model, path):
    if is_keras3():
        model.export(path, format="onnx", verbose=False, input_signature=input_signature(model))
        return path
    import tf2onnx

    tf2onnx.convert.from_keras(model, input_signature=list(input_signature(model)[0].values()),
                               opset=17, output_path=path)
    return path


@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_export_runs_in_onnxruntime_and_matches_keras(onnxruntime, name, tmp_path):
    model, feeds = MODELS[name]()
    expected = to_numpy(model(feeds))
    path = _onnx_file(model, os.path.join(str(tmp_path), f"{name}.onnx"))
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    details = [{"name": i.name, "index": i.name} for i in session.get_inputs()]
    (output,) = session.run(None, feed_by_name(details, feeds))
    np.testing.assert_allclose(output, expected, rtol=0, atol=TOLERANCE)
