"""The quantization recipes as the exporter applies them: converter options, messages, host rows.

Nothing here converts a model: the TFLite converter is configured and read back, the refusals are
matched whole, and the host rows are compared with `host_table`'s own encoding
(tests/test_export_quantization.py converts and runs the files).
"""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from litert_stand_in import executable

from keras_posenc.backend import is_keras3
from keras_posenc.export import host_table, quantization
from keras_posenc.export.kinds import KINDS
from keras_posenc.export.litert_python import INSTALL_HINT
from keras_posenc.export.targets import TARGETS

DENSE_SWITCH = "_experimental_disable_per_channel_quantization_for_dense_layers"


def _converter():
    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def double(x):
        return 2.0 * x

    return tf.lite.TFLiteConverter.from_concrete_functions([double.get_concrete_function()])


def _recipe(target, precision, kind="window"):
    return quantization.RECIPES[(TARGETS[target], KINDS[kind])][precision]


# The converter's options --------------------------------------------------------------------
def test_float16_sets_the_default_optimization_and_float16_types():
    converter = _converter()
    _recipe("cpu", "float16").configure(converter)
    assert converter.optimizations == [tf.lite.Optimize.DEFAULT]
    assert converter.target_spec.supported_types == [tf.float16]


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_int8_sets_the_default_optimization_only(target):
    converter = _converter()
    before = getattr(converter, DENSE_SWITCH, None)
    _recipe(target, "int8").configure(converter)
    assert converter.optimizations == [tf.lite.Optimize.DEFAULT]
    assert converter.target_spec.supported_types == set()  # dynamic range: int8 weights
    assert getattr(converter, DENSE_SWITCH, None) == before  # per channel where the converter can


def test_gl_int8_asks_for_one_scale_per_dense_kernel_where_the_converter_has_the_switch():
    converter = _converter()
    has_switch = hasattr(converter, DENSE_SWITCH)
    assert has_switch == is_keras3()  # TF 2.21 has it; TF 2.12 is per tensor already
    _recipe("gl", "int8").configure(converter)
    assert converter.optimizations == [tf.lite.Optimize.DEFAULT]
    assert hasattr(converter, DENSE_SWITCH) == has_switch  # not added where TF would not read it
    if has_switch:
        assert getattr(converter, DENSE_SWITCH) is True


@pytest.mark.parametrize("target, per_tensor", [("gl", True), ("cpu", False), ("gpu", False)])
def test_a_converter_with_the_dense_switch_gets_it_set_for_gl_only(target, per_tensor):
    """As TF >= 2.13's converter has it (set here on TF 2.12's too): only the gl recipe turns it on."""
    converter = _converter()
    setattr(converter, DENSE_SWITCH, False)
    _recipe(target, "int8").configure(converter)
    assert getattr(converter, DENSE_SWITCH) is per_tensor


@pytest.mark.parametrize("key", [("cpu", "window"), ("gpu", "window"), ("tensorrt", "window")])
def test_recipes_of_other_tools_leave_the_converter_as_it_was(key):
    recipe = _recipe(key[0], "int4" if key[0] != "tensorrt" else "int8", key[1])
    converter = _converter()
    recipe.configure(converter)
    assert converter.optimizations == set() and converter.target_spec.supported_types == set()


def test_what_file_json_records_of_each_recipe():
    assert _recipe("cpu", "float16").describe() == {
        "precision": "float16", "tool": "TFLite converter", "weights": "float16 weights, float32 compute",
        "runtime": "tflite"}
    assert _recipe("cpu", "int8").describe() == {
        "precision": "int8", "tool": "TFLite converter",
        "weights": "int8 weights (dynamic range: per channel for CONV_2D, per tensor or channel for "
                   "FULLY_CONNECTED as the converter chooses), float32 activations",
        "runtime": "tflite"}
    assert _recipe("gpu", "int8").describe()["runtime"] == "litert"
    assert _recipe("gl", "int8").describe() == _recipe("gpu", "int8").describe()
    assert _recipe("cpu", "int4").describe() == {
        "precision": "int4", "tool": "LiteRT Quantizer 0.11",
        "weights": "int4 weights: FULLY_CONNECTED in blocks of 32, the token table (EMBEDDING_LOOKUP) per "
                   "row; float32 activations",
        "runtime": "litert"}
    assert _recipe("gpu", "int4").describe() == {
        "precision": "int4", "tool": "LiteRT Quantizer 0.11",
        "weights": "int4 weights per output channel (CONV_2D, FULLY_CONNECTED); float32 activations",
        "runtime": "litert"}
    assert _recipe("tensorrt", "float16").describe() == {
        "precision": "float16", "tool": "onnxruntime.quantization",
        "weights": "float16 weights and compute, float32 inputs and outputs", "runtime": "onnxruntime"}
    assert _recipe("tensorrt", "int8").describe() == {
        "precision": "int8", "tool": "onnxruntime.quantization",
        "weights": "int8 QDQ: weights per channel (MatMul, Gemm), the token table (Gather) per tensor, "
                   "activations per tensor, calibrated on the parity rows", "runtime": "onnxruntime"}


def test_the_quantizer_configs_and_which_kinds_share_a_recipe():
    assert _recipe("cpu", "int4").configs == (("FULLY_CONNECTED", 4, "BLOCKWISE_32"),
                                              ("EMBEDDING_LOOKUP", 4, "CHANNELWISE"))
    assert _recipe("gpu", "int4").configs == (("FULLY_CONNECTED", 4, "CHANNELWISE"),
                                              ("CONV_2D", 4, "CHANNELWISE"))
    assert [recipe.dense_per_tensor for recipe in (_recipe("cpu", "int8"), _recipe("gpu", "int8"),
                                                   _recipe("gl", "int8"))] == [False, False, True]
    for target in ("cpu", "gpu", "gl"):
        for precision in ("float16", "int8"):
            assert _recipe(target, precision, "prefill_decode") is _recipe(target, precision)
    assert _recipe("cpu", "int4", "litertlm") is _recipe("cpu", "int4")
    assert _recipe("gpu", "int8", "litertlm") is _recipe("gpu", "int8")


# Who runs the file -----------------------------------------------------------------------------
@pytest.mark.parametrize("in_process", [True, False])
def test_only_a_litert_file_without_litert_here_needs_the_litert_python(monkeypatch, in_process):
    monkeypatch.setattr(quantization, "_litert_in_process", lambda: in_process)
    assert _recipe("cpu", "int4").needs_litert_python  # the quantizer runs there in any case
    assert _recipe("gpu", "int8").needs_litert_python is (not in_process)
    assert not _recipe("cpu", "int8").needs_litert_python
    assert not _recipe("tensorrt", "int8").needs_litert_python


def test_a_stand_in_ai_edge_litert_counts_as_litert_in_process(monkeypatch):
    import types

    package = types.ModuleType("ai_edge_litert")
    package.interpreter = types.ModuleType("ai_edge_litert.interpreter")
    monkeypatch.setitem(sys.modules, "ai_edge_litert", package)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", package.interpreter)
    assert quantization._litert_in_process() is True


def test_litert_is_in_process_exactly_where_ai_edge_litert_imports():
    try:
        import ai_edge_litert.interpreter  # noqa: F401
        importable = True
    except ImportError:
        importable = False
    assert quantization._litert_in_process() is importable


def test_a_litert_checked_recipe_without_litert_names_the_checker(no_litert_python_variables):
    no_litert_python_variables.setattr(quantization, "_litert_in_process", lambda: False)
    no_litert_python_variables.setattr(quantization, "runtime_python", lambda python, module: None)
    with pytest.raises(ValueError) as error:
        quantization.recipe_for("gpu", "int8")
    assert str(error.value) == (
        "--quantize int8 on target='gpu' is checked by ai-edge-litert's interpreter (TFLite 2.12 computes it "
        f"wrong), which is not installed here: {INSTALL_HINT}.")
    with pytest.raises(ValueError) as error:
        quantization.recipe_for("cpu", "int4", "litertlm")
    assert str(error.value) == (f"--quantize int4 on target='cpu' is made by LiteRT Quantizer 0.11, which is "
                                f"not installed here: {INSTALL_HINT}.")


def test_the_litert_python_asked_for_is_the_quantizer_s(no_litert_python_variables, tmp_path):
    asked = []

    def runtime_python(python, module):
        asked.append((python, module))
        return python

    no_litert_python_variables.setattr(quantization, "runtime_python", runtime_python)
    assert quantization.recipe_for("cpu", "int4", litert_python="given") is _recipe("cpu", "int4")
    assert asked == [("given", "litert_quantizer")]


@pytest.mark.parametrize("target,kind", [("tensorrt", "litertlm"), ("gl", "litertlm"), ("cpu", "genai")])
def test_a_kind_the_target_has_no_file_of_is_named(target, kind):
    with pytest.raises(ValueError) as error:
        quantization.recipe_for(target, "int8", kind)
    assert str(error.value) == f"--quantize int8 is not available for a {kind} export of target={target!r}."


def test_an_unknown_kind_or_target_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"`kind` must be one of \('window', 'prefill_decode', 'litertlm', "
                                         r"'genai', 'translate'\), got kind='bundle'\."):
        quantization.recipe_for("cpu", "int8", "bundle")
    with pytest.raises(ValueError, match=r"`target` must be one of .*, got target='npu'\."):
        quantization.recipe_for("npu", "int8")
    assert quantization.recipe_for("npu", None, "bundle") is None  # float32 needs no recipe


def test_a_target_object_is_read_by_its_name():
    from keras_posenc.export.targets import TARGETS

    assert quantization.recipe_for(TARGETS["cpu"], "float16") is _recipe("cpu", "float16")
    with pytest.raises(ValueError) as error:
        quantization.recipe_for(TARGETS["gl"], "int4")
    assert str(error.value).startswith("--quantize int4 is refused for target='gl': the GL delegate does not "
                                       "run 4-bit weights")


def test_interpreters_the_recipes_run_on(monkeypatch, tmp_path):
    with quantization.interpreter_for(None) as interpreter:
        assert interpreter is None
    with quantization.interpreter_for(_recipe("cpu", "int8")) as interpreter:
        assert interpreter is None  # TFLite's own
    monkeypatch.setattr(quantization, "_litert_in_process", lambda: True)
    with quantization.interpreter_for(_recipe("gpu", "int8")) as interpreter:
        assert interpreter is None  # ai-edge-litert imports here: TFLite's and LiteRT's are one


def test_without_litert_here_the_litert_python_serves_the_interpreter(no_litert_python_variables, tmp_path):
    """A stand-in LiteRT Python records how it was started: `litert_runtime.py serve`."""
    no_litert_python_variables.setattr(quantization, "_litert_in_process", lambda: False)
    started = tmp_path / "argv"
    python = executable(tmp_path / "python", f"#!/bin/sh\necho \"$@\" > {started}\nexec cat > /dev/null\n")
    with quantization.interpreter_for(_recipe("gpu", "int8"), litert_python=python) as interpreter:
        runtime = interpreter.__self__
        assert interpreter.__name__ == "interpreter"
        process = runtime.process
    assert process.wait(timeout=30) == 0  # closed with the context: the server's stdin ends
    script, command = started.read_text().split()
    assert (os.path.basename(script), command) == ("litert_runtime.py", "serve")


# Files and host rows ------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", [None, "cpu-int8", "cpu-float16", "tensorrt-int8"])
def test_only_litert_quantizer_recipes_change_a_converted_file(recipe):
    if recipe is not None:
        target, precision = recipe.split("-")
        recipe = _recipe(target, precision)
    flat = b"TFL3 converted bytes"
    assert quantization.quantize_tflite(flat, recipe) is flat


def test_quantize_tflite_runs_litert_runtime_quantize_with_the_recipe_s_configs(no_litert_python_variables,
                                                                                 tmp_path):
    """A stand-in LiteRT Python copies the spec it gets and writes the "quantized" file it names."""
    spec_copy = tmp_path / "spec.json"
    python = executable(tmp_path / "python", "#!/bin/sh\n"
                        f"cp \"$3\" {spec_copy}\n"
                        "out=$(sed 's/.*\"out\": \"\\([^\"]*\\)\".*/\\1/' \"$3\")\n"
                        "printf 'quantized' > \"$out\"\n"
                        "echo '{}'\n")
    result = quantization.quantize_tflite(b"float file", _recipe("cpu", "int4"), litert_python=python)
    assert result == b"quantized"
    spec = json.loads(spec_copy.read_text())
    assert spec["configs"] == [["FULLY_CONNECTED", 4, "BLOCKWISE_32"], ["EMBEDDING_LOOKUP", 4, "CHANNELWISE"]]
    assert os.path.basename(spec["model"]) == "float.tflite"
    assert os.path.basename(spec["out"]) == "quantized.tflite"
    assert not os.path.exists(spec["model"])  # the temporary folder is gone


@pytest.fixture
def recorded_runs(no_litert_python_variables):
    """`quantization.run_script` replaced by one that records its call and writes the file it names."""
    runs = []

    def run_script(python, script, command, spec, timeout=600):
        runs.append({"python": python, "script": script, "command": command, "timeout": timeout, **spec,
                     "model_bytes": open(spec["model"], "rb").read()})
        with open(spec["out"], "wb") as f:
            f.write(b"quantized by " + str(python).encode())
        return {}, ""

    no_litert_python_variables.setattr(quantization, "run_script", run_script)
    return runs


def test_int4_runs_litert_runtime_quantize_in_the_given_python_with_a_timeout(recorded_runs, tmp_path):
    flat = quantization.quantize_tflite(b"float file", _recipe("gpu", "int4"), litert_python=sys.executable)
    assert flat == b"quantized by " + sys.executable.encode()
    [run] = recorded_runs
    assert (run["python"], run["script"], run["command"], run["timeout"]) == (
        sys.executable, "litert_runtime.py", "quantize", 900)
    assert run["model_bytes"] == b"float file"
    assert run["configs"] == [["FULLY_CONNECTED", 4, "CHANNELWISE"], ["CONV_2D", 4, "CHANNELWISE"]]
    folder = os.path.dirname(run["model"])
    assert os.path.dirname(run["out"]) == folder and os.path.isabs(folder) and not os.path.exists(folder)
    quantization.quantize_tflite(b"float file", _recipe("cpu", "int4"), litert_python=sys.executable,
                                 timeout=30)
    assert recorded_runs[1]["timeout"] == 30


def test_without_a_given_python_the_one_that_imports_litert_quantizer_runs_it(recorded_runs, monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "litert_quantizer", types.ModuleType("litert_quantizer"))
    quantization.quantize_tflite(b"float file", _recipe("cpu", "int4"))
    assert recorded_runs[0]["python"] == sys.executable


def test_the_host_rows_an_export_stores_per_recipe():
    table = np.random.default_rng(0).normal(size=(5, 64)) * 3.0
    plain = quantization.stored_host_table(table, None)
    assert plain.dtype == np.float32 and np.array_equal(plain, table.astype(np.float32))
    half = quantization.stored_host_table(table, _recipe("gpu", "float16"))
    assert half.dtype == np.float16 and np.array_equal(half, table.astype(np.float16))
    onnx_half = quantization.stored_host_table(table, _recipe("tensorrt", "float16"))
    assert onnx_half.dtype == np.float16
    for recipe, bits in ((_recipe("cpu", "int8"), 8), (_recipe("tensorrt", "int8"), 8),
                         (_recipe("cpu", "int4"), 4)):
        stored = quantization.stored_host_table(table, recipe)
        expected = host_table.quantize_table(table, bits)
        assert sorted(stored) == sorted(expected) and int(stored["bits"]) == bits
        for name in expected:
            np.testing.assert_array_equal(stored[name], expected[name])
