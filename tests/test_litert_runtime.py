"""The interpreter server of the LiteRT Python (keras_posenc/export/litert_runtime.py), run here.

The script runs in the LiteRT Python, with ai-edge-litert's `Interpreter`; here its functions run
in this process with TensorFlow's `tf.lite.Interpreter` in that module's place (the same class,
from before LiteRT left TensorFlow): the requests and answers of `serve`, the details as JSON,
the arrays through `.npz` files, the errors as answers. The expected outputs are numpy's.
tests/edge/edge_litert_python.py runs the script itself in the real LiteRT Python.
"""

import io
import json
import os
import sys
import types

import numpy as np
import pytest
from two_signature_model import IDS, WEIGHTS, V, X, two_signature_tflite

from keras_posenc.export import litert_runtime

PROJECT_INPUTS = [{"name": "project_ids:0", "index": 0, "shape": [2], "dtype": "int32"},
                  {"name": "project_x:0", "index": 1, "shape": [1, 3], "dtype": "float32"}]
PROJECT_OUTPUTS = [{"name": "PartitionedCall:0", "index": 4, "shape": [2], "dtype": "int32"},
                   {"name": "PartitionedCall:1", "index": 5, "shape": [1, 2], "dtype": "float32"}]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    flat = two_signature_tflite(folder)
    path = folder / "model.tflite"
    path.write_bytes(flat)
    return str(path)


@pytest.fixture
def litert(monkeypatch):
    """`ai_edge_litert.interpreter.Interpreter` is TensorFlow's interpreter in this process."""
    import tensorflow as tf

    package = types.ModuleType("ai_edge_litert")
    module = types.ModuleType("ai_edge_litert.interpreter")
    module.Interpreter = tf.lite.Interpreter
    package.interpreter = module
    monkeypatch.setitem(sys.modules, "ai_edge_litert", package)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", module)


def _feeds(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_details_as_json_values():
    details = [{"name": "x", "index": np.int64(3), "shape": np.array([1, 4], np.int32), "dtype": np.float32,
                "quantization": (0.0, 0)},
               {"name": "ids", "index": 0, "shape": np.array([], np.int32), "dtype": np.dtype("int8")}]
    described = litert_runtime._details(details)
    assert described == [{"name": "x", "index": 3, "shape": [1, 4], "dtype": "float32"},
                         {"name": "ids", "index": 0, "shape": [], "dtype": "int8"}]
    assert type(described[0]["index"]) is int and all(type(n) is int for n in described[0]["shape"])
    assert json.loads(json.dumps(described)) == described


def test_open_answers_the_details_and_signatures(litert, model_path):
    interpreters = []
    answer = litert_runtime._handle({"op": "open", "path": model_path}, interpreters)
    assert answer == {
        "id": 0, "inputs": PROJECT_INPUTS, "outputs": PROJECT_OUTPUTS,
        "signatures": {
            "project": {"inputs": {"ids": PROJECT_INPUTS[0], "x": PROJECT_INPUTS[1]},
                        "outputs": {"twice": PROJECT_OUTPUTS[0], "y": PROJECT_OUTPUTS[1]}},
            "shift": {"inputs": {"v": {"name": "shift_v:0", "index": 0, "shape": [4], "dtype": "float32"}},
                      "outputs": {"shifted": {"name": "PartitionedCall_1:0", "index": 2, "shape": [4],
                                              "dtype": "float32"}}}}}
    assert json.loads(json.dumps(answer)) == answer
    assert len(interpreters) == 1
    again = litert_runtime._handle({"op": "open", "path": model_path}, interpreters)
    assert again["id"] == 1 and len(interpreters) == 2


def test_invoke_by_index_then_signature_by_name(litert, model_path, tmp_path):
    interpreters = []
    litert_runtime._handle({"op": "open", "path": model_path}, interpreters)
    result = str(tmp_path / "result.npz")
    feeds = _feeds(tmp_path / "feeds.npz", **{"0": IDS, "1": X})
    answer = litert_runtime._handle({"op": "invoke", "id": 0, "result": result, "feeds": feeds}, interpreters)
    assert answer == {"outputs": ["4", "5"]}
    with np.load(result) as outputs:
        assert sorted(outputs.files) == ["4", "5"]
        np.testing.assert_array_equal(outputs["4"], 2 * IDS)
        np.testing.assert_allclose(outputs["5"], X @ WEIGHTS, rtol=1e-6)
    answer = litert_runtime._handle({"op": "signature", "id": 0, "key": "shift", "result": result,
                                     "feeds": _feeds(tmp_path / "feeds.npz", v=V)}, interpreters)
    assert answer == {"outputs": ["shifted"]}
    with np.load(result) as outputs:
        np.testing.assert_array_equal(outputs["shifted"], V + 1)


def test_requests_go_to_the_interpreter_they_name(litert, model_path, tmp_path):
    import tensorflow as tf

    times3 = tf.function(lambda v: v * 3.0, input_signature=[tf.TensorSpec([4], tf.float32)])
    other = tmp_path / "times3.tflite"
    other.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([times3.get_concrete_function()]).convert())
    interpreters = []
    litert_runtime._handle({"op": "open", "path": model_path}, interpreters)
    assert litert_runtime._handle({"op": "open", "path": str(other)}, interpreters)["signatures"] == {}
    result = str(tmp_path / "result.npz")
    answer = litert_runtime._handle({"op": "invoke", "id": 1, "result": result,
                                     "feeds": _feeds(tmp_path / "feeds.npz", **{"0": V})}, interpreters)
    with np.load(result) as outputs:
        np.testing.assert_array_equal(outputs[answer["outputs"][0]], 3 * V)
    litert_runtime._handle({"op": "signature", "id": 0, "key": "project", "result": result,
                            "feeds": _feeds(tmp_path / "feeds.npz", x=X, ids=IDS)}, interpreters)
    with np.load(result) as outputs:
        np.testing.assert_allclose(outputs["y"], X @ WEIGHTS, rtol=1e-6)


def test_an_unknown_request_is_refused(litert, model_path, tmp_path):
    interpreters = []
    litert_runtime._handle({"op": "open", "path": model_path}, interpreters)
    with pytest.raises(ValueError) as error:
        litert_runtime._handle({"op": "frob", "id": 0, "result": str(tmp_path / "result.npz"),
                                "feeds": _feeds(tmp_path / "feeds.npz", v=V)}, interpreters)
    assert str(error.value) == "unknown request 'frob'"
    assert not (tmp_path / "result.npz").exists()


def test_serve_answers_a_line_for_each_request_until_close(litert, model_path, tmp_path, monkeypatch):
    result = str(tmp_path / "result.npz")
    requests = [{"op": "open", "path": model_path},
                {"op": "open", "path": str(tmp_path / "missing.tflite")},
                {"op": "signature", "id": 0, "key": "shift", "result": result,
                 "feeds": _feeds(tmp_path / "feeds.npz", v=V)},
                {"op": "frob", "id": 0, "feeds": _feeds(tmp_path / "feeds.npz", v=V)},
                {"op": "close"},
                {"op": "open", "path": model_path}]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(r) + "\n" for r in requests)))
    channel = io.StringIO()
    assert litert_runtime.serve(channel) is None
    answers = [json.loads(line) for line in channel.getvalue().splitlines()]
    assert len(answers) == 4  # nothing after "close"
    assert answers[0]["id"] == 0 and answers[0]["inputs"] == PROJECT_INPUTS
    assert answers[1] == {"error": f"ValueError: Could not open '{tmp_path / 'missing.tflite'}'."}
    assert answers[2] == {"outputs": ["shifted"]}
    assert answers[3] == {"error": "ValueError: unknown request 'frob'"}
    with np.load(result) as outputs:
        np.testing.assert_array_equal(outputs["shifted"], V + 1)


def test_serve_ends_with_its_input(litert, model_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"op": "open", "path": model_path}) + "\n"))
    channel = io.StringIO()
    litert_runtime.serve(channel)
    (line,) = channel.getvalue().splitlines()
    assert json.loads(line)["outputs"] == PROJECT_OUTPUTS


def streams(tmp_path, monkeypatch):
    """This process's stdout and stderr as files of their own, which `main` may redirect (set in the
    test itself: pytest sets its own before each test); `read()` gives what each file received."""
    out, err = open(tmp_path / "stdout", "w"), open(tmp_path / "stderr", "w")
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)

    def read():
        out.flush()
        err.flush()
        return (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()

    return read


@pytest.fixture
def chatty(litert, monkeypatch):
    """The interpreter prints a log line to stdout when it opens a model, as LiteRT's delegates do."""
    import tensorflow as tf

    class Interpreter(tf.lite.Interpreter):
        def __init__(self, *args, **kwargs):
            os.write(sys.stdout.fileno(), b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(sys.modules["ai_edge_litert.interpreter"], "Interpreter", Interpreter)


def test_main_serve_answers_on_its_own_channel_and_sends_the_runtime_log_to_stderr(
        chatty, model_path, tmp_path, monkeypatch):
    read = streams(tmp_path, monkeypatch)
    requests = [{"op": "open", "path": model_path}, {"op": "close"}]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(r) + "\n" for r in requests)))
    assert litert_runtime.main(["serve"]) == 0
    out, err = read()
    (line,) = out.splitlines()
    assert json.loads(line)["inputs"] == PROJECT_INPUTS
    assert err == "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"


def test_main_runs_a_command_on_its_spec_and_prints_one_json_line(tmp_path, monkeypatch):
    """The command's result, on the answer channel; what the quantizer prints, on stderr."""
    read = streams(tmp_path, monkeypatch)
    calls = []

    def quantize(spec):
        calls.append(spec)
        print("quantizing", spec["model"], flush=True)
        return {"out": spec["out"], "bytes": 1234, "shared": 2}

    monkeypatch.setattr(litert_runtime, "quantize", quantize)
    spec = {"model": "float.tflite", "out": "int8.tflite", "configs": [["FULLY_CONNECTED", 8, "CHANNELWISE"]]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert litert_runtime.main(["quantize", str(tmp_path / "spec.json")]) == 0
    assert calls == [spec]
    assert read() == ('{"out": "int8.tflite", "bytes": 1234, "shared": 2}\n', "quantizing float.tflite\n")


def test_main_refuses_an_unknown_command(tmp_path, monkeypatch):
    read = streams(tmp_path, monkeypatch)
    (tmp_path / "spec.json").write_text("{}")
    with pytest.raises(KeyError):
        litert_runtime.main(["pack", str(tmp_path / "spec.json")])
    assert read() == ("", "")
