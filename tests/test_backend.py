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
            imports = re.findall(r"from keras_posenc\.backend import (\([^)]*\)|[^\n]*)", text)
            if path.name == "backend.py" or any(re.search(r"\bops\b", names) for names in imports):
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


@pytest.mark.skipif(not backend.is_tensorflow(), reason="the XLA mark is a TensorFlow graph attribute")
def test_add_rows_marks_one_xla_cluster_in_graphs_and_gives_the_plain_values():
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    table = rng.standard_normal([9, 4]).astype(np.float32)
    ids = rng.integers(0, 9, size=[3, 5]).astype(np.int32)
    x = rng.standard_normal([3, 5, 4]).astype(np.float32)
    signature = [tf.TensorSpec([None, None, 4], tf.float32), tf.TensorSpec([None, None], tf.int32)]
    traced = tf.function(lambda x, ids: backend.add_rows(x, table, ids), input_signature=signature)
    expected = x + table[ids]
    np.testing.assert_array_equal(backend.ops.convert_to_numpy(backend.add_rows(x, table, ids)), expected)
    for _ in range(3):  # the cluster is compiled once a shape repeats: the compiled values too
        np.testing.assert_array_equal(traced(x, ids).numpy(), expected)
    nodes = traced.get_concrete_function().graph.as_graph_def().node
    marked = sorted(node.op for node in nodes if node.attr["_XlaCompile"].b and node.op != "Const")
    assert marked == ["AddV2", "GatherV2"]
    calls = {"If", "StatelessIf", "PartitionedCall", "StatefulPartitionedCall"}
    assert not calls & {node.op for node in nodes}
