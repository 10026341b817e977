"""The Jetson kit's runner (export/jetson/run_tflite.py) on ai-edge-litert: GPU-only on lavapipe,
as on JetPack 6."""

import json
import os
import subprocess
import sys

import numpy as np

from keras_posenc import export
from keras_posenc.backend import keras
from keras_posenc.models import CausalLM

RUNNER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "export", "jetson", "run_tflite.py")


def run(edge, python, *args):
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        env = edge._environment(scratch)
        result = subprocess.run([python, RUNNER, *args], capture_output=True, text=True, timeout=600, env=env)
    return result


def causal_lm(**config):
    """A built, seeded `CausalLM` without dropout."""
    keras.utils.set_random_seed(3)
    model = CausalLM(dict(config, dropout=0.0), name="lm")
    model.build_on_dummy()
    return model


def test_runner_gpu_checksum_equals_the_training_machine(edge, tmp_path):
    model = causal_lm(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=500, max_length=32)
    path = str(tmp_path / "model.tflite")
    export.export_and_check(model, sequence_length=32, embedding="graph").save(path)
    litert = os.path.join(edge.CACHE, "venv-litert", "bin", "python")
    on_gpu = run(edge, litert, path, "--accelerator", "gpu", "--iterations", "3", "--json")
    assert on_gpu.returncode == 0, on_gpu.stderr[-3000:]
    gpu = json.loads(on_gpu.stdout.strip().splitlines()[-1])
    assert gpu["runtime"] == "ai_edge_litert.CompiledModel" and gpu["fully_accelerated"] is True
    here = run(edge, sys.executable, path, "--runtime", "interpreter", "--iterations", "3", "--json")
    assert here.returncode == 0, here.stderr[-3000:]
    cpu = json.loads(here.stdout.strip().splitlines()[-1])
    assert gpu["output_shape"] == cpu["output_shape"] == [1, 32, 500]
    assert abs(gpu["checksum"] - cpu["checksum"]) <= 1e-4 * max(1.0, abs(cpu["checksum"])) + 1e-2
    assert np.isclose(gpu["mean_abs"], cpu["mean_abs"], rtol=1e-5)


def test_runner_refuses_a_file_not_fully_accelerated(edge, tmp_path):
    model = causal_lm(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=50, max_length=16)
    path = str(tmp_path / "cpu.tflite")
    export.export_and_check(model, sequence_length=16, target="cpu").save(path)
    litert = os.path.join(edge.CACHE, "venv-litert", "bin", "python")
    # The kit refuses a cpu file before the GPU sees it, naming the target to export instead.
    result = run(edge, litert, path, "--accelerator", "gpu", "--iterations", "1", "--vocab-size", "50")
    assert result.returncode == 1 and "--target gpu" in result.stderr
    assert "Traceback" not in result.stderr
    # LiteRT's own GPU-only compile refuses it too (the FILE.json list of accelerators edited away).
    with open(path + ".json") as f:
        metadata = json.load(f)
    with open(path + ".json", "w") as f:
        json.dump(dict(metadata, accelerators=["gpu", "cpu"]), f)
    result = run(edge, litert, path, "--accelerator", "gpu", "--iterations", "1", "--vocab-size", "50")
    assert result.returncode != 0
    assert "GPU compilation failed" in result.stderr and "not accelerated" in result.stderr
