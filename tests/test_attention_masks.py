"""merge_attention_masks against a numpy formula, its shape checks and their messages, static and traced."""

import itertools

import numpy as np
import pytest
from layer_test_helper import error_message, to_numpy

from keras_posenc.backend import is_tensorflow, ops
from keras_posenc.layers.attention_masks import merge_attention_masks, static_or_dynamic_length

T = 4
PADDING = np.array([[True, True, True, False], [False, True, True, True]])
SEGMENTS = np.array([[1, 1, 2, 2], [0, 3, 3, 4]], np.int32)
RNG = np.random.default_rng(0)
ATTENTION_MASKS = {
    "full": RNG.random([2, T, T]) > 0.4,
    "shared": RNG.random([T, T]) > 0.4,
    "keys": RNG.random([2, 1, T]) > 0.4,
    "ints": (RNG.random([2, T, T]) > 0.4).astype(np.int32),
}


def expected_mask(mask, attention_mask, causal, segment_ids):
    """Entry [b, i, j]: key j is real, allowed, not after i when causal, and in i's segment."""
    allowed = np.ones([2, T, T], bool)
    if mask is not None:
        allowed &= mask[:, None, :]
    if attention_mask is not None:
        allowed &= np.broadcast_to(attention_mask.astype(bool), [2, T, T])
    if causal:
        allowed &= np.tril(np.ones([T, T], bool))[None]
    if segment_ids is not None:
        allowed &= segment_ids[:, :, None] == segment_ids[:, None, :]
    return allowed


@pytest.mark.parametrize("mask,attention,causal,segments",
                         list(itertools.product([None, PADDING], [None, *ATTENTION_MASKS], [False, True],
                                                [None, SEGMENTS])))
def test_every_combination_equals_the_numpy_formula(mask, attention, causal, segments):
    attention_mask = None if attention is None else ATTENTION_MASKS[attention]
    merged = merge_attention_masks(T, mask=mask, attention_mask=attention_mask, use_causal_mask=causal,
                                   segment_ids=segments)
    if mask is None and attention is None and not causal and segments is None:
        assert merged is None
        return
    got = to_numpy(merged)
    assert got.dtype == bool
    np.testing.assert_array_equal(np.broadcast_to(got, [2, T, T]),
                                  expected_mask(mask, attention_mask, causal, segments))
    if attention is None and not causal and segments is None:
        assert got.shape == (2, 1, T)  # padding alone stays keys-only


def test_the_length_is_static_where_known():
    assert static_or_dynamic_length(ops.zeros([2, 5, 3])) == 5


def refusal(shape):
    return error_message(lambda: merge_attention_masks(T, attention_mask=np.ones(shape, bool)))


def test_a_mask_of_the_wrong_rank_or_length_is_refused_by_name():
    for shape in ([T], [1, 2, T, T]):
        assert refusal(shape) == (
            "`attention_mask` must have shape [batch, length, length] or [length, length], "
            f"got shape {tuple(shape)}.")
    for shape in ([2, 3, T], [2, T, 3], [T, T + 1]):
        message = refusal(shape)
        expected = (1, *shape) if len(shape) == 2 else tuple(shape)
        assert message == ("`attention_mask` must have shape [batch, length, length] with length 4, "
                           f"got shape {expected}.")
    assert error_message(lambda: merge_attention_masks(T, segment_ids=np.zeros([1, T], np.float32))) == (
        "`segment_ids` must be integers, got dtype float32.")


@pytest.mark.skipif(not is_tensorflow(), reason="a length known only when the graph runs: TensorFlow only")
def test_a_length_known_only_when_the_graph_runs_is_checked_then():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32),
                                  tf.TensorSpec([None, None, None], tf.bool)])
    def merged(x, attention_mask):
        return merge_attention_masks(tf.shape(x)[1], attention_mask=attention_mask, use_causal_mask=True)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def merged_with_a_constant(x):  # the mask's shape is static, the length is not
        return merge_attention_masks(tf.shape(x)[1], attention_mask=ATTENTION_MASKS["shared"])

    for attention in ("full", "keys"):
        got = merged(tf.zeros([2, T]), ATTENTION_MASKS[attention]).numpy()
        np.testing.assert_array_equal(np.broadcast_to(got, [2, T, T]),
                                      expected_mask(None, ATTENTION_MASKS[attention], True, None))
    np.testing.assert_array_equal(merged_with_a_constant(tf.zeros([1, T])).numpy()[0],
                                  ATTENTION_MASKS["shared"])
    for length, mask in ((T + 1, ATTENTION_MASKS["full"]), (T, np.ones([2, 3, T], bool))):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"`attention_mask` must have shape \[batch, length, length\] with length "
                                 f"{length}, got shape"):
            merged(tf.zeros([2, length]), mask)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"with length {T + 1}, got shape"):
        merged_with_a_constant(tf.zeros([1, T + 1]))


@pytest.mark.skipif(not is_tensorflow(), reason="graph ops: TensorFlow only")
def test_shapes_known_while_tracing_add_no_run_time_check_to_the_graph():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([2, T], tf.float32), tf.TensorSpec([2, T, T], tf.bool)])
    def merged(x, attention_mask):
        return merge_attention_masks(static_or_dynamic_length(x), attention_mask=attention_mask,
                                     use_causal_mask=True)

    ops_of_the_graph = {op.type for op in merged.get_concrete_function().graph.get_operations()}
    assert "Assert" not in ops_of_the_graph and "Shape" not in ops_of_the_graph
    np.testing.assert_array_equal(merged(tf.zeros([2, T]), ATTENTION_MASKS["full"]).numpy(),
                                  expected_mask(None, ATTENTION_MASKS["full"], True, None))
