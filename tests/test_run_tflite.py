"""export/jetson/run_tflite.py, the Jetson kit's runner, run as a subprocess on CPU."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_posenc import export
from keras_posenc.backend import keras
from keras_posenc.layers import TokenAndPositionEmbedding

RUNNER = os.path.join(os.path.dirname(__file__), os.pardir, "export", "jetson", "run_tflite.py")


def run(*args):
    return subprocess.run([sys.executable, RUNNER, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, TokenAndPositionEmbedding(30, 8, max_length=16)(ids))
    folder = tmp_path_factory.mktemp("kit")
    path = str(folder / "model.tflite")
    with open(path, "wb") as f:
        f.write(export.to_tflite(model, sequence_length=6))
    with open(path + ".json", "w") as f:
        json.dump(export.runtime_metadata(model, 6), f)
    token_ids = np.array([[5, 6, 7, 8, 0, 0]], np.int32)
    np.save(folder / "ids.npy", token_ids)
    return path, str(folder / "ids.npy"), model(token_ids).numpy()


def test_given_token_ids_give_the_keras_checksum(exported):
    path, ids_path, expected = exported
    result = run(path, "--token-ids", ids_path, "--iterations", "5", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["output_shape"] == [1, 6, 8]
    assert summary["checksum"] == pytest.approx(float(expected.astype(np.float64).sum()), abs=1e-4)
    assert summary["mean_abs"] == pytest.approx(float(np.abs(expected).mean()), abs=1e-6)
    assert 0 < summary["p50_ms"] <= summary["p90_ms"] <= summary["p99_ms"]
    assert summary["runtime"] in ("tflite_runtime", "ai_edge_litert.CompiledModel", "tensorflow")
    assert summary["accelerator"] == "cpu"


def test_random_ids_from_the_metadata_and_text_output(exported):
    path, _, _ = exported
    result = run(path, "--iterations", "3", "--seed", "1")
    assert result.returncode == 0, result.stderr
    assert "p50" in result.stdout and "p90" in result.stdout and "p99" in result.stdout
    assert "checksum (sum)" in result.stdout


def test_gpu_without_litert_needs_a_delegate(exported):
    path, _, _ = exported
    result = run(path, "--accelerator", "gpu", "--runtime", "interpreter")
    assert result.returncode != 0
    assert "--accelerator gpu without ai-edge-litert needs --delegate libtensorflowlite_gpu_delegate.so" \
        in result.stderr


def test_bad_input_is_reported(exported, tmp_path):
    path, _, _ = exported
    missing = run(str(tmp_path / "none.tflite"))
    assert missing.returncode != 0 and "model file not found" in missing.stderr
    np.save(tmp_path / "wrong.npy", np.zeros([2, 6], np.int32))
    wrong = run(path, "--token-ids", str(tmp_path / "wrong.npy"))
    assert wrong.returncode != 0 and "needs shape (1, 6), got (2, 6)" in wrong.stderr


def test_run_tensorrt_says_what_it_needs(exported, tmp_path):
    runner = os.path.join(os.path.dirname(RUNNER), "run_tensorrt.py")
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"not used: TensorRT is checked first")
    result = subprocess.run([sys.executable, runner, str(onnx)], capture_output=True, text=True, timeout=120)
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert result.returncode != 0
        assert "No TensorRT Python API: it ships with JetPack" in result.stderr
    else:
        assert result.returncode != 0 and "could not parse" in result.stdout + result.stderr
    missing = subprocess.run([sys.executable, runner, str(tmp_path / "none.onnx")], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode != 0 and "model file not found" in missing.stderr


def test_host_embedding_file_reads_its_table_beside_it(tmp_path):
    """`--embedding host`: the runner feeds table[ids] from MODEL.tflite.embeddings.npy."""
    keras.utils.set_random_seed(1)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, TokenAndPositionEmbedding(3000, 8, max_length=16)(ids))
    path = str(tmp_path / "host.tflite")
    with open(path, "wb") as f:
        f.write(export.to_tflite(model, sequence_length=6, embedding="host"))
    metadata = export.runtime_metadata(model, 6, embedding="host",
                                       embedding_table="host.tflite.embeddings.npy")
    with open(path + ".json", "w") as f:
        json.dump(metadata, f)
    token_ids = np.array([[2999, 2049, 7, 8, 0, 0]], np.int32)
    np.save(tmp_path / "ids.npy", token_ids)
    missing = run(path, "--token-ids", str(tmp_path / "ids.npy"), "--iterations", "1")
    assert missing.returncode != 0 and "copy host.tflite.embeddings.npy" in missing.stderr
    np.save(path + ".embeddings.npy", export.host_embedding_table(model))
    result = run(path, "--token-ids", str(tmp_path / "ids.npy"), "--iterations", "2", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    expected = model(token_ids).numpy().astype(np.float64)
    assert summary["checksum"] == pytest.approx(float(expected.sum()), abs=1e-4)
