"""LearnedPositionEmbedding: same call semantics as the sinusoidal layer, a trainable table."""

import numpy as np
import pytest
import tensorflow as tf
from layer_test_helper import requires_tf, run_layer_test

from keras_posenc.layers import LearnedPositionEmbedding

# Written against TensorFlow tensors and graphs; the JAX backend runs tests/test_keras3_backends.py.
pytestmark = requires_tf

DEPTH = 4


def mask():
    """Rows of 3 real tokens, right- and left-padded (a tensor made per test: no TF op at import)."""
    return tf.constant([[True, True, True, False, False], [False, False, True, True, True]])


def random_x(batch, length, seed=0):
    return tf.constant(np.random.RandomState(seed).standard_normal((batch, length, DEPTH)), tf.float32)


def built_layer(**kwargs):
    layer = LearnedPositionEmbedding(max_length=8, **kwargs)
    layer.build([None, None, DEPTH])
    table = np.random.RandomState(1).standard_normal((8, DEPTH)).astype(np.float32)
    layer.position_table.assign(table)
    return layer, table


def test_layer_contract_plain(tmp_path):
    run_layer_test(LearnedPositionEmbedding, {"max_length": 8}, random_x(2, 5),
                   expected_output_shape=(2, 5, DEPTH), expected_num_trainable_weights=1, tmp_dir=tmp_path)


def test_layer_contract_with_mask_and_languages(tmp_path):
    run_layer_test(LearnedPositionEmbedding, {"max_length": 8, "num_languages": 3},
                   {"inputs": random_x(2, 5), "mask": mask(), "language_ids": tf.constant([2, 0])},
                   expected_num_trainable_weights=2, tmp_dir=tmp_path)


def test_layer_contract_with_position_ids(tmp_path):
    ids = tf.constant([[7, 6, 5, 4, 3], [0, 1, 0, 1, 0]])
    run_layer_test(LearnedPositionEmbedding, {"max_length": 8},
                   {"inputs": random_x(2, 5), "position_ids": ids}, tmp_dir=tmp_path)


def test_rows_follow_the_per_sample_ids_and_padding_is_zero():
    layer, table = built_layer()
    x = random_x(2, 5)
    out = layer(x, mask=mask()).numpy() - x.numpy()
    np.testing.assert_allclose(out[0], np.concatenate([table[:3], np.zeros([2, DEPTH])]), atol=1e-6)
    np.testing.assert_allclose(out[1], np.concatenate([np.zeros([2, DEPTH]), table[:3]]), atol=1e-6)
    np.testing.assert_allclose(layer(x).numpy() - x.numpy(), np.broadcast_to(table[:5], (2, 5, DEPTH)),
                               atol=1e-6)
    ids = tf.constant([[4, 0, 7, 7, 1]])
    np.testing.assert_allclose(layer(tf.zeros([1, 5, DEPTH]), position_ids=ids)[0], table[[4, 0, 7, 7, 1]])


def test_graph_mode_and_xla_agree_with_eager():
    layer, _ = built_layer()
    x = random_x(2, 5)
    signature = [tf.TensorSpec([None, None, DEPTH]), tf.TensorSpec([None, None], tf.bool)]
    eager = layer(x, mask=mask()).numpy()
    for jit in (False, True):
        fn = tf.function(lambda x, m: layer(x, mask=m), input_signature=signature, jit_compile=jit)
        np.testing.assert_allclose(fn(x, mask()).numpy(), eager, atol=1e-6)


def test_gradient_reaches_only_the_rows_of_real_tokens():
    layer, _ = built_layer()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(random_x(2, 5), mask=mask()))
    grad = tf.convert_to_tensor(tape.gradient(loss, layer.position_table)).numpy()
    # Each row has 3 real tokens at positions 0..2: rows 0-2 get 2 tokens each, the rest nothing.
    np.testing.assert_allclose(grad[:3], 2.0)
    np.testing.assert_array_equal(grad[3:], 0.0)


def test_extend_is_refused_and_long_sequences_raise():
    with pytest.raises(ValueError, match="`overflow='extend'` is not possible for LearnedPositionEmbedding"):
        LearnedPositionEmbedding(max_length=8, overflow="extend")
    layer = LearnedPositionEmbedding(max_length=4)
    with pytest.raises(ValueError, match="Sequence length 5 exceeds max_length=4"):
        layer(tf.zeros([1, 5, DEPTH]))
    signature = [tf.TensorSpec([None, None, DEPTH]), tf.TensorSpec([None, None], tf.int32)]
    fn = tf.function(lambda x, ids: layer(x, position_ids=ids), input_signature=signature)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`position_ids` must be in \[0, max_length=4"):
        fn(tf.zeros([1, 2, DEPTH]), tf.constant([[0, 4]]))


def test_mixed_float16_keeps_a_float32_table():
    layer = LearnedPositionEmbedding(max_length=8, dtype="mixed_float16")
    out = layer(tf.zeros([1, 3, DEPTH], tf.float16), mask=tf.constant([[False, True, True]]))
    assert out.dtype == tf.float16 and layer.position_table.dtype == tf.float32
    expected = np.concatenate([np.zeros([1, DEPTH]), layer.position_table.numpy()[:2]])
    np.testing.assert_allclose(out.numpy()[0], expected, atol=1e-3)


def test_base_class_without_hooks_fails_clearly():
    from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase

    class Incomplete(PositionEmbeddingBase):
        pass

    def missing(name, hook):
        return (f"{name} subclasses PositionEmbeddingBase without defining `{hook}`; use "
                "SinusoidalPositionEmbedding or LearnedPositionEmbedding, or define the three hooks.")

    with pytest.raises(TypeError) as error:
        Incomplete(max_length=4)(tf.zeros([1, 2, 3]))
    assert missing("Incomplete", "_build_table") in str(error.value)  # Keras may add the layer's name

    class TableOnly(PositionEmbeddingBase):  # a table, but not the rows of it
        def _build_table(self, depth):
            pass

    with pytest.raises(TypeError) as error:
        TableOnly(max_length=4)(tf.zeros([1, 2, 3]))
    assert missing("TableOnly", "_table_prefix") in str(error.value)
    with pytest.raises(TypeError) as error:
        TableOnly(max_length=4)(tf.zeros([1, 2, 3]), mask=tf.constant([[False, True]]))
    assert missing("TableOnly", "_table_rows") in str(error.value)

    class Extendable(TableOnly):  # rows in the table, none computed past it
        can_extend = True

        def _table_rows(self, ids):
            return tf.zeros(tf.concat([tf.shape(ids), [3]], 0))

    with pytest.raises(TypeError) as error:
        Extendable(max_length=4, overflow="extend")(tf.zeros([1, 2, 3]), position_ids=tf.constant([[0, 5]]))
    assert missing("Extendable", "_computed_rows") in str(error.value)


def test_each_missing_hook_called_directly_names_itself():
    from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase

    class Incomplete(PositionEmbeddingBase):
        pass

    layer = Incomplete(max_length=4)
    for hook, argument in (("_build_table", 3), ("_table_rows", np.array([[0, 1]], np.int32)),
                           ("_table_prefix", 2), ("_computed_rows", np.array([[5]], np.int32))):
        with pytest.raises(TypeError) as error:
            getattr(layer, hook)(argument)  # as a subclass's own code calls it, outside a layer call
        assert str(error.value) == (
            f"Incomplete subclasses PositionEmbeddingBase without defining `{hook}`; use "
            "SinusoidalPositionEmbedding or LearnedPositionEmbedding, or define the three hooks.")
