"""The LiteRT Python at work (keras_posenc/export/litert_python.py): its interpreter and its quantizer.

A small two-signature model (a matmul with an int32 side output, and a shift) runs in ai-edge-litert's
interpreter in the edge cache's LiteRT Python through `RemoteRuntime`; its details, signatures and
outputs must be those of TensorFlow's own interpreter here, and the outputs those of numpy. LiteRT
Quantizer's `quantize` script quantizes a FULLY_CONNECTED to int8 weights through `run_script`.
"""

import os
import sys

import numpy as np
import pytest

from keras_posenc.export.flatbuffer import operators
from keras_posenc.export.litert_python import RemoteRuntime, run_script

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from two_signature_model import IDS, WEIGHTS, V, X, two_signature_tflite  # noqa: E402


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return two_signature_tflite(tmp_path_factory.mktemp("saved"))


@pytest.fixture(scope="module")
def reference(model_file):
    import tensorflow as tf

    return tf.lite.Interpreter(model_content=model_file)


@pytest.fixture
def runtime(edge):
    with RemoteRuntime(edge.litertlm_python()) as runtime:
        yield runtime


def _plain(details):
    return [(d["name"], d["index"], d["shape"].tolist(), d["shape"].dtype, d["dtype"]) for d in details]


def test_details_and_signatures_are_those_of_tensorflows_interpreter(runtime, model_file, reference):
    interpreter = runtime.interpreter(model_content=model_file)
    interpreter.allocate_tensors()
    assert _plain(interpreter.get_input_details()) == _plain(reference.get_input_details())
    assert _plain(interpreter.get_output_details()) == _plain(reference.get_output_details())
    assert [(d["name"], d["dtype"]) for d in interpreter.get_input_details()] == [
        ("project_ids:0", np.int32), ("project_x:0", np.float32)]
    assert interpreter.get_signature_list() == reference.get_signature_list() == {
        "project": {"inputs": ["ids", "x"], "outputs": ["twice", "y"]},
        "shift": {"inputs": ["v"], "outputs": ["shifted"]}}
    for key in ("project", "shift"):
        runner, expected = interpreter.get_signature_runner(key), reference.get_signature_runner(key)
        for mine, theirs in ((runner.get_input_details(), expected.get_input_details()),
                             (runner.get_output_details(), expected.get_output_details())):
            assert list(mine) == list(theirs)
            assert _plain(mine.values()) == _plain(theirs.values())


def test_invoke_by_tensor_index(runtime, model_file):
    interpreter = runtime.interpreter(model_content=model_file)
    ids, x = interpreter.get_input_details()
    twice, y = interpreter.get_output_details()
    with pytest.raises(KeyError):
        interpreter.get_tensor(y["index"])  # no outputs before an invoke
    interpreter.set_tensor(x["index"], X)
    interpreter.set_tensor(ids["index"], IDS)
    interpreter.invoke()
    np.testing.assert_allclose(interpreter.get_tensor(y["index"]), X @ WEIGHTS, rtol=1e-6)
    assert interpreter.get_tensor(y["index"]).dtype == np.float32
    np.testing.assert_array_equal(interpreter.get_tensor(twice["index"]), [6, -8])
    assert interpreter.get_tensor(twice["index"]).dtype == np.int32
    interpreter.set_tensor(x["index"], 2 * X)  # fed again: the new value
    interpreter.invoke()
    np.testing.assert_allclose(interpreter.get_tensor(y["index"]), 2 * X @ WEIGHTS, rtol=1e-6)
    np.testing.assert_array_equal(interpreter.get_tensor(twice["index"]), [6, -8])  # ids kept
    assert sorted(os.listdir(runtime.folder.name)) == ["1-model.tflite"]  # feeds and results removed


def test_signature_runners_by_name(runtime, model_file):
    interpreter = runtime.interpreter(model_content=model_file)
    outputs = interpreter.get_signature_runner("project")(x=X, ids=IDS)
    assert sorted(outputs) == ["twice", "y"]
    np.testing.assert_allclose(outputs["y"], X @ WEIGHTS, rtol=1e-6)
    np.testing.assert_array_equal(outputs["twice"], 2 * IDS)
    shifted = interpreter.get_signature_runner("shift")(v=V)
    assert list(shifted) == ["shifted"]
    np.testing.assert_array_equal(shifted["shifted"], V + 1)
    with pytest.raises(KeyError):
        interpreter.get_signature_runner("serving_default")


def test_interpreters_of_one_server_are_kept_apart(runtime, model_file, tmp_path):
    """One from bytes, one from a file of the caller's; each runs its own model."""
    import tensorflow as tf

    add = tf.function(lambda v: v * 3.0, input_signature=[tf.TensorSpec([4], tf.float32, name="v")])
    path = tmp_path / "times3.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()]).convert())
    first = runtime.interpreter(model_content=bytearray(model_file))
    second = runtime.interpreter(model_path=str(path))
    assert (first.id, second.id) == (0, 1)
    assert os.listdir(runtime.folder.name) == ["1-model.tflite"]  # the file given is read where it is
    (v,) = second.get_input_details()
    second.set_tensor(v["index"], V)
    second.invoke()
    np.testing.assert_array_equal(second.get_tensor(second.get_output_details()[0]["index"]), V * 3)
    np.testing.assert_array_equal(first.get_signature_runner("shift")(v=V)["shifted"], V + 1)


def test_the_details_are_the_callers_copies(runtime, model_file):
    interpreter = runtime.interpreter(model_content=model_file)
    details = interpreter.get_input_details()
    details.clear()
    interpreter.get_output_details().clear()
    assert len(interpreter.get_input_details()) == len(interpreter.get_output_details()) == 2
    signatures = interpreter.get_signature_list()
    signatures["project"]["inputs"].append("other")
    assert interpreter.get_signature_list()["project"]["inputs"] == ["ids", "x"]


def test_the_runtimes_errors_reach_the_caller(runtime, model_file, tmp_path):
    missing = str(tmp_path / "missing.tflite")
    with pytest.raises(RuntimeError) as error:
        runtime.interpreter(model_path=missing)
    assert str(error.value).startswith(f"LiteRT's interpreter: ValueError: Could not open '{missing}'.")
    interpreter = runtime.interpreter(model_content=model_file)  # the server goes on
    with pytest.raises(RuntimeError) as error:
        interpreter.get_signature_runner("project")(x=X)
    assert str(error.value) == ("LiteRT's interpreter: ValueError: Invalid number of inputs provided for "
                                "running a SignatureDef, expected 2 vs provided 1")
    outputs = interpreter.get_signature_runner("project")(x=X, ids=IDS)
    np.testing.assert_array_equal(outputs["twice"], 2 * IDS)


def test_close_ends_the_server_and_removes_its_files(edge, model_file):
    runtime = RemoteRuntime(edge.litertlm_python())
    interpreter = runtime.interpreter(model_content=model_file)
    np.testing.assert_array_equal(interpreter.get_signature_runner("shift")(v=V)["shifted"], V + 1)
    folder = runtime.folder.name
    runtime.close()
    assert runtime.process.returncode == 0
    assert not os.path.exists(folder)


def _weight_scales(flat):
    """The number of quantization scales of the FULLY_CONNECTED weights."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flat))
    graph = model.subgraphs[0]
    (op,) = [op for op in graph.operators
             if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) == "FULLY_CONNECTED"]
    return len(graph.tensors[op.inputs[1]].quantization.scale)


@pytest.mark.parametrize("granularity,scales", [("CHANNELWISE", 16), ("TENSORWISE", 1)])
def test_the_quantize_script_writes_int8_weights(edge, tmp_path, granularity, scales):
    """LiteRT Quantizer, dynamic int8: the weights become INT8 with a scale per output channel (or one
    for the tensor), the results stay close."""
    import tensorflow as tf

    weights = np.linspace(-1.0, 1.0, 64 * 16, dtype=np.float32).reshape(64, 16)
    dense = tf.function(lambda x: tf.matmul(x, tf.constant(weights)),
                        input_signature=[tf.TensorSpec([1, 64], tf.float32, name="x")])
    source, out = tmp_path / "float.tflite", tmp_path / "int8.tflite"
    source.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([dense.get_concrete_function()]).convert())
    result, log = run_script(edge.litertlm_python(), "litert_runtime.py", "quantize",
                             {"model": str(source), "out": str(out),
                              "configs": [["FULLY_CONNECTED", 8, granularity]]}, timeout=300)
    assert result == {"out": str(out), "bytes": out.stat().st_size, "shared": 0}
    assert isinstance(log, str)
    flat = out.read_bytes()
    (op,) = [op for op in operators(flat) if op.name == "FULLY_CONNECTED"]
    assert op.inputs[1] == ((16, 64), True, "INT8")
    assert _weight_scales(flat) == scales
    assert out.stat().st_size < source.stat().st_size / 2
    with RemoteRuntime(edge.litertlm_python()) as runtime:
        interpreter = runtime.interpreter(model_content=flat)
        x = np.linspace(-2.0, 2.0, 64, dtype=np.float32)[None]
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_allclose(got, x @ weights, atol=0.05 * np.abs(x @ weights).max())
