"""The Keras-2 `ops` shim lists exactly the `keras.ops` names the package uses."""

import pathlib
import re

import pytest

from keras_posenc import backend

PACKAGE = pathlib.Path(backend.__file__).parent
REPO = PACKAGE.parent


def _used_names():
    used = set()
    for folder in (PACKAGE, REPO / "benchmarks"):
        for path in folder.rglob("*.py"):
            text = path.read_text()
            if path.name == "backend.py" or re.search(r"from keras_posenc\.backend import .*\bops\b", text):
                used |= set(re.findall(r"\bops\.([a-z_]+)\b", text))
    return used


@pytest.mark.skipif(backend.is_keras3(), reason="the shim exists on Keras 2 only")
def test_keras2_ops_shim_has_every_used_name_and_no_other():
    shim = set(vars(backend.ops))
    used = _used_names()
    assert sorted(used - shim) == [], "ops names used but missing from the Keras-2 shim"
    assert sorted(shim - used) == [], "Keras-2 shim names no module uses"


def test_make_deterministic_seeds_keras_and_numpy():
    import numpy as np

    backend.make_deterministic(7)
    first = np.random.rand(3)
    layer = backend.keras.layers.Dense(4, kernel_initializer="glorot_uniform")
    layer.build([None, 3])
    kernel = backend.ops.convert_to_numpy(layer.kernel)
    backend.make_deterministic(7)
    np.testing.assert_array_equal(np.random.rand(3), first)
    again = backend.keras.layers.Dense(4, kernel_initializer="glorot_uniform")
    again.build([None, 3])
    np.testing.assert_array_equal(backend.ops.convert_to_numpy(again.kernel), kernel)
