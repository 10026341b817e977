"""The exports whose tools live outside TensorFlow, from the venv of docs/install.md's install alone.

`keras-posenc export --target tensorrt` (tf2onnx, onnxruntime), `--generate --format litertlm`
(LiteRT-LM's builder and engine) and `--quantize int8 --target gpu` (checked by LiteRT 2.x's
interpreter) run as a user runs them: the command in a fresh process of this venv, with no
`KERAS_POSENC_LITERT_PYTHON`, no `PYTHONPATH` and none of the edge caches. The Keras 3 lock holds
every tool; on TF 2.12 the LiteRT Python is created on first use, here in
`.edge-cache/keras-posenc-home` (so only the first run of `make test-edge` downloads it).
"""

import os
import subprocess
import sys

import pytest
from runtime import runtimes

# The trainer's tiny model: a real run folder (model.keras beside spm.model) in seconds.
TRAIN = ["train", "--steps", "6", "--batch-size", "4", "--num-layers", "1", "--d-model", "16", "--num-heads",
         "2", "--dff", "32", "--max-length", "24", "--warmup-steps", "4", "--dropout", "0.0", "--quiet"]
EXPORTS = {
    "tensorrt": (["--sequence-length", "16", "--target", "tensorrt"], "w.onnx"),
    "litertlm": (["--generate", "--cache-length", "24", "--format", "litertlm", "--target", "cpu"],
                 "b.litertlm"),
    "int8-gpu": (["--sequence-length", "16", "--quantize", "int8", "--target", "gpu"], "q.tflite"),
}
HOME = os.path.join(runtimes.CACHE, "keras-posenc-home")


def command(*argv, cwd):
    """`keras-posenc ARGV` in a fresh process of this venv, as a user's shell runs it."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "KERAS_POSENC_LITERT_PYTHON", "KERAS_POSENC_LITERTLM_PYTHON",
                          "KERAS_POSENC_NO_TOOL_INSTALL")}
    env.update(KERAS_POSENC_HOME=HOME, KERAS_BACKEND="tensorflow")
    return subprocess.run([sys.executable, "-m", "keras_posenc.app.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=3000)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    done = command(*TRAIN, "--out", str(folder), cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.mark.parametrize("name", list(EXPORTS))
def test_the_export_succeeds_from_the_venv_alone(run_folder, name):
    flags, out = EXPORTS[name]
    done = command("export", "model.keras", *flags, "--out", out, cwd=run_folder)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith(f"Wrote {out}") and os.path.getsize(run_folder / out) > 0
    # A line of its own for the LiteRT Python created on first use (TF 2.12), none otherwise.
    lines = [line for line in done.stderr.splitlines() if line.startswith("keras-posenc: creating")]
    assert all(line.startswith("keras-posenc: creating the environment of LiteRT's tools") for line in lines)
    assert len(lines) <= 1
