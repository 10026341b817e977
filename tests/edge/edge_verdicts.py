"""The verdicts against the runtimes' own messages, and `keras-posenc export --target ...` end to end."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from stacks import once_on_keras2, once_on_keras3

from keras_posenc import export
from keras_posenc.backend import is_keras3, keras
from keras_posenc.layers import TokenAndPositionEmbedding
from keras_posenc.models import CausalLM

LENGTH = 48


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A demo-size causal LM saved as `.keras`, as `keras-posenc demo` writes it."""
    keras.utils.set_random_seed(5)
    model = CausalLM(dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000, max_length=LENGTH,
                          dropout=0.0), name="demo")
    model.build_on_dummy()
    folder = tmp_path_factory.mktemp("demo")
    path = str(folder / "model.keras")
    model.save(path) if is_keras3() else model.save(path, save_format="keras_v3")
    ids, _ = export.sample_token_batch(model, LENGTH, seed=1)
    return model, path, folder, ids


# The command's flags reach the export the Python API makes, and edge_targets.py runs every target's
# files from both converters on the runtimes: each command run below (a subprocess that imports the
# stack and exports) runs on one stack, gpu on Keras 3 (LiteRT's current converter), gl and tensorrt on
# Keras 2 (the Jetson path the TF 2.12 image trains for).
CLI_ONCE = ("the command's path is the package's; edge_targets.py runs this target's files from both "
            "converters")


def cli(*argv):
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "keras_posenc.app.cli", *argv], capture_output=True,
                          text=True, timeout=900, env=environment)


@once_on_keras3(CLI_ONCE)
def test_cli_gpu_target_is_fully_accelerated_by_litert(edge, demo):
    model, path, folder, ids = demo
    out = str(folder / "m_gpu.tflite")
    result = cli("export", path, "--out", out, "--sequence-length", str(LENGTH), "--target", "gpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all" in result.stdout and "ops run on the GPU" in result.stdout
    # The CLI's default for gpu: --embedding host, the rows looked up from the table beside the file.
    table = np.load(out + ".embeddings.npy")
    feeds = {"token_ids": ids[3:4], "embeddings": table[ids[3:4]]}  # left padded
    gpu = edge.run_litert(out, feeds, accelerator="gpu")
    cpu = edge.run_litert(out, feeds, accelerator="cpu")
    assert gpu.returncode == 0 and gpu.info["fully_accelerated"], gpu.log[-3000:]
    assert np.max(np.abs(gpu.output - cpu.output)) <= 1e-4


@once_on_keras2(CLI_ONCE)
def test_cli_gl_target_runs_both_layers_on_gl(edge, demo):
    model, path, folder, ids = demo
    out = str(folder / "m_gl.tflite")
    result = cli("export", path, "--out", out, "--sequence-length", str(LENGTH), "--target", "gl",
                 "--require-gpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OpenGL ES (Jetson + tflite-runtime): all" in result.stdout
    table = np.load(out + ".embeddings.npy")
    feeds = {"token_ids": ids[1:2].astype(np.float32), "embeddings": table[ids[1:2]]}
    gl = edge.run_gl(out, feeds)
    cpu = edge.run_gl(out, feeds, cpu=True)
    assert gl.returncode == 0 and edge.refusals(gl.log) == [], gl.log[-3000:]
    assert np.max(np.abs(gl.output - cpu.output)) <= 1e-3 and np.any(gl.output != 0)
    # Both encoder layers are in the one GL graph: every op of the file, attention included.
    ops = export.op_counts(open(out, "rb").read())
    assert ops["SOFTMAX"] == 2 * 4  # two layers x four heads


@once_on_keras2(CLI_ONCE)
def test_cli_tensorrt_target_writes_onnx_with_parity(edge, demo):
    model, path, folder, ids = demo
    out = str(folder / "m.onnx")
    environment_path = os.pathsep.join([edge.onnx_site()] + sys.path)
    result = subprocess.run([sys.executable, "-m", "keras_posenc.app.cli", "export", path, "--out", out,
                             "--sequence-length", str(LENGTH), "--target", "tensorrt"], capture_output=True,
                            text=True, timeout=900,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=environment_path))
    assert result.returncode == 0, result.stdout + result.stderr
    parity = float(result.stdout.split("max abs diff ")[1].split()[0])
    assert parity <= 1e-4
    assert open(out, "rb").read(4) != b"\x1c\x00\x00\x00"  # ONNX protobuf, not a TFLite flatbuffer


def test_cpu_target_verdict_names_what_the_gl_delegate_refuses(edge, demo, tflite_file):
    model, _, _, ids = demo
    flat = export.to_tflite(model, sequence_length=LENGTH, target="cpu")
    path = tflite_file("cpu", flat)
    verdict = set(export.gpu_incompatible_ops(flat, "gl"))
    run = edge.run_gl(path, {"token_ids": ids[3:4].astype(np.float32)})
    refused = edge.refused_ops(run.log) & set(export.op_counts(flat))
    assert run.returncode != 0 or edge.refusals(run.log)  # not fully on GL
    assert refused and refused <= verdict, (refused, verdict, edge.refusals(run.log))


# Ops the GL delegate's parser claims but has no shader for: each alone, in float32.
CLAIMED_WITHOUT_SHADER = {
    "TRANSPOSE": lambda x: tf.transpose(tf.reshape(x, [1, 4, 6]), [0, 2, 1]),
    "MEAN": lambda x: tf.reduce_mean(tf.reshape(x, [1, 4, 6]), axis=-1, keepdims=True),
    "SPLIT": lambda x: tf.concat(tf.split(tf.reshape(x, [1, 4, 6]), 2, axis=-1)[::-1], -1) * 2.0,
    "CUMSUM": lambda x: tf.cumsum(tf.reshape(x, [1, 4, 6]), axis=1),
}


@pytest.mark.parametrize("name", sorted(CLAIMED_WITHOUT_SHADER))
def test_ops_outside_the_gl_shader_list_do_not_run_on_gl(edge, name, tflite_file):
    function = tf.function(CLAIMED_WITHOUT_SHADER[name], input_signature=[tf.TensorSpec([1, 24], tf.float32)])
    flat = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()]).convert()
    assert name in export.op_counts(flat)
    assert name in export.gpu_incompatible_ops(flat, "gl")
    path = tflite_file(name, flat)
    run = edge.run_gl(path, {"token_ids": np.arange(24, dtype=np.float32)[None]})
    assert run.returncode != 0 or edge.refusals(run.log), run.log[-2000:]


def keras_attention_mask_export():
    """A padding-masked Keras MultiHeadAttention block, exported with the default target at length 8."""
    keras.utils.set_random_seed(2)
    ids = keras.Input(shape=(None,), dtype="int32")
    x = TokenAndPositionEmbedding(40, 16, 16, dropout=0.0)(ids)
    model = keras.Model(ids, x + keras.layers.MultiHeadAttention(2, 8)(x, x))
    return export.to_tflite(model, sequence_length=8)


@pytest.mark.skipif(is_keras3(), reason="Keras 2's MultiHeadAttention mask (STRIDED_SLICE v3); Keras 3's "
                    "is checked by test_keras3_mask_select_v2_runs_on_litert_as_the_verdict_says")
def test_keras_mask_strided_slice_v3_is_refused_by_litert_as_the_verdict_says(edge, tflite_file):
    flat = keras_attention_mask_export()
    assert "STRIDED_SLICE" in export.gpu_incompatible_ops(flat, "webgpu")
    path = tflite_file("keras_mask", flat)
    feeds = {"token_ids": np.array([[3, 4, 5, 0, 0, 0, 0, 0]], np.int32)}
    assert edge.run_litert(path, feeds, accelerator="gpu").returncode != 0  # GPU only: refused
    mixed = edge.run_litert(path, feeds, accelerator="gpu", allow_cpu=True)
    assert "STRIDED_SLICE: Max version supported: 2. Requested version 3." in mixed.log
    assert not mixed.info["fully_accelerated"]


@pytest.mark.skipif(not is_keras3(), reason="Keras 3's MultiHeadAttention masks with SELECT_V2")
def test_keras3_mask_select_v2_runs_on_litert_as_the_verdict_says(edge, tflite_file):
    flat = keras_attention_mask_export()
    assert "SELECT_V2" in export.op_counts(flat)
    assert export.gpu_incompatible_ops(flat, "webgpu") == []
    path = tflite_file("keras_mask", flat)
    feeds = {"token_ids": np.array([[3, 4, 5, 0, 0, 0, 0, 0]], np.int32)}
    on_gpu = edge.run_litert(path, feeds, accelerator="gpu")
    on_cpu = edge.run_litert(path, feeds, accelerator="cpu")
    assert on_gpu.returncode == 0 and on_gpu.info["fully_accelerated"], on_gpu.log[-2000:]
    assert np.max(np.abs(on_gpu.output - on_cpu.output)) <= 1e-4
