"""`import keras_posenc` and its layers need only TensorFlow/Keras and numpy (no `app` extra)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP_MODULES = ("sentencepiece", "tensorflow_text", "matplotlib", "sacrebleu")

# A finder that makes the `app` extra's modules absent, as in an environment without them.
_PROGRAM = """
import importlib.abc, json, sys
BLOCKED = {blocked!r}

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent())
{body}
print(json.dumps({{"loaded": sorted(m for m in BLOCKED if m in sys.modules), "result": result}}))
"""


def _run(body, blocked=APP_MODULES):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    program = _PROGRAM.format(blocked=tuple(blocked), body=body)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_layers_import_and_run_without_the_app_extra():
    body = """
import numpy as np
import keras_posenc
from keras_posenc.backend import ops
from keras_posenc.layers import SinusoidalPositionEmbedding
y = SinusoidalPositionEmbedding(max_length=8)(np.zeros([1, 3, 4], "float32"))
result = ops.convert_to_numpy(y)[0, 1].tolist()
"""
    out = _run(body)
    assert out["loaded"] == []
    # Row 1 of the interleaved table: sin(1), cos(1), sin(1e-2), cos(1e-2) (base 10000, depth 4).
    assert out["result"] == pytest.approx([0.8414709848, 0.5403023059, 0.0099998333, 0.9999500004],
                                          abs=1e-6)


def test_the_blocking_finder_does_block():
    """Not vacuous: the same finder makes a direct import of the extra's module fail."""
    out = _run("""
try:
    import sentencepiece  # noqa: F401
    result = "imported"
except ModuleNotFoundError as error:
    result = str(error)
""")
    assert out["result"] == "No module named 'sentencepiece'"


def test_sentencepiece_still_loads_before_tensorflow_when_installed():
    """The TF 2.12 load-order fix (sentencepiece <= 0.2.0 crashes when TensorFlow came first)."""
    pytest.importorskip("sentencepiece")
    out = _run("""
import keras_posenc
order = [m for m in sys.modules if m in ("sentencepiece", "tensorflow")]
result = order
""", blocked=())
    assert out["result"] == ["sentencepiece", "tensorflow"]



def test_the_command_without_the_app_extra_says_what_to_install_in_one_line(tmp_path):
    out_dir = str(tmp_path / "run")
    out = _run(f"""
import contextlib, io, os
from keras_posenc.app import cli
stderr = io.StringIO()
with contextlib.redirect_stderr(stderr):
    code = cli.main(["train", "--steps", "1", "--out", {out_dir!r}])
result = [code, stderr.getvalue(), os.path.exists({out_dir!r})]
""")
    code, stderr, made_out = out["result"]
    assert code == 2
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith(
        "keras-posenc: error: the command needs the application's dependencies (No module named")
    assert "pip install 'keras-posenc[app]'" in stderr
    assert not made_out
