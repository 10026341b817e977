"""A `.keras` file saved on the TensorFlow backend loads on JAX with the same outputs.

Each backend runs in its own subprocess (the backend is fixed when Keras is imported).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_posenc.backend import is_keras3, is_tensorflow

# Both backends run in subprocesses, whatever the suite's own: `make test`'s KERAS_BACKEND=tensorflow
# run runs it; its jax run (which takes every tests/test_keras3_*.py) would repeat it as it is.
pytestmark = pytest.mark.skipif(not (is_keras3() and is_tensorflow()),
                                reason="one .keras file for two backends is Keras 3; its tensorflow run")

SAVE = r"""
import sys
import numpy as np
from keras_posenc.backend import backend_name, keras
from keras_posenc.layers import LearnedPositionEmbedding, TokenAndPositionEmbedding
assert backend_name() == "tensorflow"
keras.utils.set_random_seed(1)
tokens = keras.Input((None,), dtype="int32")
x = TokenAndPositionEmbedding(50, 16, 12, position_config={"table": "factorized"}, dropout=0.0)(tokens)
x = LearnedPositionEmbedding(12, name="learned")(x)
x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
model = keras.Model(tokens, keras.layers.Dense(50)(x))
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
ids = np.array([[0, 0, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0]], np.int32)
model.fit(ids, np.roll(ids, -1, 1), epochs=3, verbose=0)
model.save(sys.argv[1])
np.save(sys.argv[2], np.asarray(model(ids)))
"""

LOAD = r"""
import json, sys
import numpy as np
from keras_posenc.backend import backend_name, keras
import keras_posenc.layers  # registers the classes
assert backend_name() == "jax"
model = keras.models.load_model(sys.argv[1])
ids = np.array([[0, 0, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0]], np.int32)
out = np.asarray(model(ids))
diff = float(np.abs(out - np.load(sys.argv[2])).max())
print(json.dumps({"max_abs_diff": diff, "shape": list(out.shape)}))
"""


def _run(code, backend, *args):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                            timeout=600, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_saved_on_tensorflow_loads_on_jax_with_equal_outputs(tmp_path):
    model_path, outputs_path = str(tmp_path / "model.keras"), str(tmp_path / "tf_outputs.npy")
    _run(SAVE, "tensorflow", model_path, outputs_path)
    report = json.loads(_run(LOAD, "jax", model_path, outputs_path).strip().splitlines()[-1])
    assert report["shape"] == [2, 6, 50]
    assert report["max_abs_diff"] <= 1e-5, report
    assert np.isfinite(report["max_abs_diff"])
