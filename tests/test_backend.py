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


@pytest.mark.skipif(backend.is_keras3(), reason="Keras 2 runs AutoGraph over layer calls; Keras 3 never does")
def test_static_call_has_keras2_trace_the_call_as_written():
    import numpy as np
    import tensorflow as tf

    keras = backend.keras

    class Branching(keras.layers.Layer):
        def call(self, x):
            if tf.reduce_sum(x) > 0:  # tensor-dependent: AutoGraph turns it into a tf.cond
                return x + 1.0
            return x - 1.0

    class StaticBranching(Branching):
        call = backend.static_call(Branching.call)

    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(keras.Sequential([Branching()]).predict(x, verbose=0), x + 1.0)
    with pytest.raises(TypeError, match="symbolic `tf.Tensor` as a Python `bool`"):
        keras.Sequential([StaticBranching()]).predict(x, verbose=0)


def test_a_static_call_gets_the_mask_and_training_flag_from_keras_when_it_takes_them():
    import numpy as np

    keras = backend.keras
    calls = []

    class Recorder(keras.layers.Layer):
        @backend.static_call
        def call(self, x, mask=None, training=None):
            calls.append((mask, training))
            return x

    class Plain(keras.layers.Layer):  # takes neither: Keras must not pass them
        @backend.static_call
        def call(self, x):
            return x

    ids = keras.Input((3,), dtype="int32")
    outputs = Plain()(Recorder()(keras.layers.Embedding(5, 2, mask_zero=True)(ids)))
    keras.Model(ids, outputs)(np.array([[1, 2, 0]], np.int32), training=True)
    mask, training = calls[-1]  # the eager call (the first one built the functional model)
    assert backend.ops.convert_to_numpy(mask).tolist() == [[True, True, False]]
    assert training is True


@pytest.mark.skipif(backend.is_keras3(), reason="static_call leaves Keras 3's calls as they are")
def test_every_layer_and_model_of_the_package_has_a_static_call():
    import inspect

    import keras_posenc
    import keras_posenc.app.translation_ablation  # noqa: F401 - registers its layer

    registered = {name: cls for name, cls in backend.keras.utils.get_custom_objects().items()
                  if name.startswith("keras_posenc>") and isinstance(cls, type)
                  and issubclass(cls, backend.keras.layers.Layer)}
    assert {"keras_posenc>Encoder", "keras_posenc>Seq2SeqTransformer"} <= set(registered)
    own_calls = {name: cls.call for name, cls in registered.items()
                 if cls.call.__module__.startswith(keras_posenc.__name__)}
    assert len(own_calls) >= 12
    assert [name for name, call in own_calls.items() if inspect.unwrap(call) is call] == []
