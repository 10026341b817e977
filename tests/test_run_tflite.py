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
    export.export_and_check(model, sequence_length=6).save(path)
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
    export.export_and_check(model, sequence_length=6, embedding="host").save(path)
    token_ids = np.array([[2999, 2049, 7, 8, 0, 0]], np.int32)
    np.save(tmp_path / "ids.npy", token_ids)
    os.rename(path + ".embeddings.npy", tmp_path / "table.npy")
    missing = run(path, "--token-ids", str(tmp_path / "ids.npy"), "--iterations", "1")
    assert missing.returncode != 0 and "copy host.tflite.embeddings.npy" in missing.stderr
    os.rename(tmp_path / "table.npy", path + ".embeddings.npy")
    result = run(path, "--token-ids", str(tmp_path / "ids.npy"), "--iterations", "2", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    expected = model(token_ids).numpy().astype(np.float64)
    assert summary["checksum"] == pytest.approx(float(expected.sum()), abs=1e-4)


# The kit checks what it opens (the FILE.json record, the contract) ---------------------------
def _copy_export(exported, folder):
    import shutil

    path = exported[0]
    for suffix in ("", ".json", ".contract.json", ".embeddings.npy"):
        shutil.copy(path + suffix, folder / ("model.tflite" + suffix))
    return str(folder / "model.tflite")


def _one_line_error(result, *needles):
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(needle in lines[0] for needle in needles), lines[0]


def test_the_export_records_size_and_sha256_and_writes_the_contract(exported):
    import hashlib

    path = exported[0]
    with open(path + ".json") as f:
        metadata = json.load(f)
    # The gpu default for a model with a token table: host embeddings, the table beside the file.
    names = ["model.tflite", "model.tflite.embeddings.npy"]
    assert sorted(metadata["files"]) == names
    for name, suffix in zip(names, ("", ".embeddings.npy")):
        content = open(path + suffix, "rb").read()
        digest = hashlib.sha256(content).hexdigest()
        assert metadata["files"][name] == {"bytes": len(content), "sha256": digest}
    with open(path + ".contract.json") as f:
        contract = json.load(f)
    assert contract == export.contract.document()
    assert contract["tensors"]["token_ids"] == "token_ids" and contract["keys"]["vocab_size"] in metadata


def test_a_truncated_or_replaced_file_is_one_line_and_no_crash(exported, tmp_path):
    path = _copy_export(exported, tmp_path)
    content = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(content[:len(content) // 2])
    _one_line_error(run(path, "--iterations", "1"), "model.tflite", "truncated or replaced")
    with open(path, "wb") as f:  # same size, another file
        f.write(content[:-1] + bytes([content[-1] ^ 1]))
    _one_line_error(run(path, "--iterations", "1"), "sha256", "differs")
    with open(path, "wb") as f:  # same size, not a flatbuffer at all
        f.write(b"\x00" * len(content))
    _one_line_error(run(path, "--iterations", "1"), "not a TFLite file", "TFL3")


def test_a_file_without_its_contract_is_refused_with_what_to_do(exported, tmp_path):
    path = _copy_export(exported, tmp_path)
    os.remove(path + ".contract.json")
    _one_line_error(run(path, "--iterations", "1"), "model.tflite.contract.json", "export the model again")


def test_a_cpu_file_on_the_gpu_is_refused_naming_the_gpu_target(tmp_path):
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, TokenAndPositionEmbedding(30, 8, max_length=16)(ids))
    path = str(tmp_path / "cpu.tflite")
    export.export_and_check(model, sequence_length=6, target="cpu").save(path)
    _one_line_error(run(path, "--accelerator", "gpu", "--iterations", "1"), "--target cpu", "--target gpu")
    assert run(path, "--iterations", "1").returncode == 0  # the CPU it was made for


def test_json_output_is_json_only_whatever_the_runtime_prints(exported):
    path, ids_path, _ = exported
    result = run(path, "--token-ids", ids_path, "--iterations", "2", "--json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)  # the whole of stdout: one object, no runtime line before it
    assert result.stdout.count("\n") == 1


def test_native_prints_on_fd_1_go_to_stderr_under_json():
    # What LiteRT's C++ does ("INFO: Failed to load OpenCL library ..." written to file descriptor 1).
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from kit_contract import stdout_to_stderr\n"
            "with stdout_to_stderr(True):\n    os.write(1, b'INFO: native\\n'); print('python line')\n"
            "print('{\"ok\": 1}')")
    done = subprocess.run([sys.executable, "-c", code, os.path.dirname(RUNNER)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": 1}
    assert "INFO: native" in done.stderr and "python line" in done.stderr
