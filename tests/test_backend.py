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


@pytest.mark.skipif(not (backend.is_keras3() and backend.is_tensorflow()),
                    reason="the XLA mark is a TensorFlow graph attribute, left off on Keras 2")
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
    graph = traced.get_concrete_function().graph.as_graph_def()
    nodes = graph.node
    assert _marked_ops(graph) == ["AddV2", "GatherV2"]
    calls = {"If", "StatelessIf", "PartitionedCall", "StatefulPartitionedCall"}
    assert not calls & {node.op for node in nodes}


def _marked_ops(graph_def):
    """The ops of a graph and of its function library that carry an XLA mark."""
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return sorted(n.op for n in nodes if n.attr["_XlaCompile"].b and n.op != "Const")


@pytest.mark.skipif(backend.is_keras3(), reason="Keras 2 (TF 2.12): Keras 3 marks the gather and the add")
def test_a_keras2_training_step_carries_no_xla_mark_and_adds_the_plain_rows():
    # TF 2.12 grows a mark into the whole training step (forward, gradients, Adam's updates); that
    # step needs the count of distinct token ids at compile time and is compiled again, about 2 s,
    # each time a new count repeats (benchmarks/bench_train_step.py).
    import numpy as np
    import tensorflow as tf

    from keras_posenc.layers import SinusoidalPositionEmbedding

    keras = backend.keras
    embed = keras.layers.Embedding(50, 8, mask_zero=True)
    position = SinusoidalPositionEmbedding(max_length=16)
    head = keras.layers.Dense(50)
    optimizer = keras.optimizers.Adam(1e-2)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def step(ids):
        with tf.GradientTape() as tape:
            x = embed(ids)
            added = position(x, mask=embed.compute_mask(ids))
            logits = head(added)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(ids, logits, from_logits=True))
        variables = embed.trainable_variables + head.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return x, added

    ids = np.array([[3, 7, 9, 0, 0], [0, 0, 4, 4, 1]], np.int32)
    x, added = (t.numpy() for t in step(ids))
    counts = np.cumsum(ids != 0, axis=1) - 1
    table = position._lookup_table[1:]  # row 0 of the lookup table is padding's zero row
    expected = np.where((ids != 0)[..., None], x + table[np.maximum(counts, 0)], x)
    np.testing.assert_allclose(added, expected, rtol=0, atol=1e-6)
    assert _marked_ops(step.get_concrete_function().graph.as_graph_def()) == []
