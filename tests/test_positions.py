"""position_ids: left padding, packed segments, decode offsets; eager, tf.function and XLA."""

import numpy as np
import pytest
import tensorflow as tf
from layer_test_helper import requires_tf

from keras_posenc import position_ids

# Written against TensorFlow tensors and graphs; the JAX backend runs tests/test_keras3_backends.py.
pytestmark = requires_tf

SIGNATURE = [tf.TensorSpec([None, None], tf.bool), tf.TensorSpec([None, None], tf.int32),
             tf.TensorSpec([None], tf.int32)]


def reference_ids(mask, segments=None, offset=0):
    """A plain loop: count real tokens per row, restarting at every segment change."""
    mask = np.asarray(mask, bool)
    segments = np.zeros(mask.shape, int) if segments is None else np.asarray(segments)
    offsets = np.broadcast_to(np.asarray(offset), (mask.shape[0],))
    ids = np.zeros(mask.shape, np.int32)
    for b in range(mask.shape[0]):
        count = 0
        for t in range(mask.shape[1]):
            if t > 0 and segments[b, t] != segments[b, t - 1]:
                count = 0
            if mask[b, t]:
                ids[b, t] = offsets[b] + count
                count += 1
    return ids


def all_modes():
    """position_ids called eagerly, in a dynamic-shape tf.function, and compiled with XLA."""
    def call(mask, segments, offset):
        return position_ids(mask, segment_ids=segments, offset=offset)

    graph = tf.function(call, input_signature=SIGNATURE)
    xla = tf.function(call, input_signature=SIGNATURE, jit_compile=True)
    return {"eager": call, "graph": graph, "xla": xla}


MODES = all_modes()


@pytest.mark.parametrize("mode", list(MODES))
def test_random_masks_segments_offsets_match_the_loop(mode):
    rng = np.random.RandomState(0)
    for batch, length in [(3, 9), (1, 1), (5, 17)]:
        mask = rng.rand(batch, length) > 0.3
        segments = np.cumsum(rng.rand(batch, length) > 0.7, axis=1).astype(np.int32)
        offset = rng.randint(0, 5, size=batch).astype(np.int32)
        got = MODES[mode](tf.constant(mask), tf.constant(segments), tf.constant(offset))
        np.testing.assert_array_equal(got.numpy(), reference_ids(mask, segments, offset))


@pytest.mark.parametrize("mode", list(MODES))
def test_left_padded_row_numbers_like_the_unpadded_row(mode):
    fn = MODES[mode]
    zeros = tf.zeros([1, 4], tf.int32)
    unpadded = fn(tf.ones([1, 4], tf.bool), zeros, tf.zeros([1], tf.int32))
    padded = fn(tf.constant([[False, False, False, True, True, True, True]]),
                tf.zeros([1, 7], tf.int32), tf.zeros([1], tf.int32))
    assert unpadded.numpy().tolist() == [[0, 1, 2, 3]]
    assert padded.numpy().tolist() == [[0, 0, 0, 0, 1, 2, 3]]


@pytest.mark.parametrize("mode", list(MODES))
def test_packed_row_numbers_each_segment_like_its_own_row(mode):
    fn = MODES[mode]
    # Two sequences (3 and 4 tokens) packed into one right-padded row.
    mask = tf.constant([[True] * 7 + [False] * 2])
    segments = tf.constant([[1, 1, 1, 2, 2, 2, 2, 3, 3]])
    packed = fn(mask, segments, tf.zeros([1], tf.int32)).numpy()[0]
    first = fn(tf.ones([1, 3], tf.bool), tf.zeros([1, 3], tf.int32), tf.zeros([1], tf.int32)).numpy()[0]
    second = fn(tf.ones([1, 4], tf.bool), tf.zeros([1, 4], tf.int32), tf.zeros([1], tf.int32)).numpy()[0]
    np.testing.assert_array_equal(packed[:7], np.concatenate([first, second]))
    assert packed[7:].tolist() == [0, 0]


@pytest.mark.parametrize("mode", list(MODES))
def test_step_by_step_decoding_with_offset_equals_the_full_pass(mode):
    fn = MODES[mode]
    mask = np.array([[False, False, True, True, True, True], [True, True, True, True, True, True]])
    full = fn(tf.constant(mask), tf.zeros([2, 6], tf.int32), tf.zeros([2], tf.int32)).numpy()
    # Row 0 starts after its padding; each step feeds one token with the count decoded so far.
    decoded = np.zeros([2], np.int32)
    for t in range(6):
        step = fn(tf.constant(mask[:, t:t + 1]), tf.zeros([2, 1], tf.int32), tf.constant(decoded)).numpy()
        np.testing.assert_array_equal(step[:, 0][mask[:, t]], full[:, t][mask[:, t]])
        decoded += mask[:, t]


def test_scalar_offset_and_int_masks():
    assert position_ids(tf.constant([[0, 1, 1]]), offset=5).numpy().tolist() == [[0, 5, 6]]
    assert position_ids(np.array([[1.0, 0.0, 2.0]])).numpy().tolist() == [[0, 0, 1]]
    ids = position_ids(tf.ones([2, 3]))
    assert ids.dtype == tf.int32 and ids.numpy().tolist() == [[0, 1, 2]] * 2


def test_empty_and_all_padding():
    assert position_ids(tf.zeros([2, 0], tf.bool)).shape == (2, 0)
    assert position_ids(tf.zeros([0, 3], tf.bool)).shape == (0, 3)
    assert position_ids(tf.zeros([1, 4], tf.bool)).numpy().tolist() == [[0, 0, 0, 0]]


@pytest.mark.parametrize("call, error, match", [
    (lambda: position_ids(tf.ones([2, 3, 1])), ValueError, r"`mask` must have rank 2.*\(2, 3, 1\)"),
    (lambda: position_ids(tf.ones([1, 3]), offset=-1), ValueError, "`offset` must be >= 0, got offset=-1"),
    (lambda: position_ids(tf.ones([1, 3]), offset=1.5), TypeError, "`offset`.*float32"),
    (lambda: position_ids(tf.ones([1, 3]), offset=tf.zeros([1, 1], tf.int32)), ValueError,
     r"`offset`.*\(1, 1\)"),
    (lambda: position_ids(tf.ones([2, 3]), offset=tf.constant([0, 1, 2])), ValueError,
     "must have 2 entries, got 3"),
    (lambda: position_ids(tf.ones([1, 3]), offset=tf.constant([-4])), ValueError, "offset=.*-4"),
    (lambda: position_ids(tf.ones([1, 3]), segment_ids=tf.ones([1, 3])), TypeError,
     "`segment_ids` must be integers, got dtype float32"),
    (lambda: position_ids(tf.ones([1, 3]), segment_ids=tf.ones([1, 2], tf.int32)), ValueError,
     r"`segment_ids` shape \[1 2\] must equal the mask shape \[1 3\]"),
])
def test_bad_arguments_eager(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bad_runtime_values_in_tf_function():
    fn = MODES["graph"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="`offset` must be >= 0, got offset=.*-3"):
        fn(tf.ones([1, 3], tf.bool), tf.zeros([1, 3], tf.int32), tf.constant([-3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must have 1 entries, got 2"):
        fn(tf.ones([1, 3], tf.bool), tf.zeros([1, 3], tf.int32), tf.constant([0, 0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`segment_ids` shape"):
        fn(tf.ones([1, 3], tf.bool), tf.zeros([1, 2], tf.int32), tf.constant([0]))
