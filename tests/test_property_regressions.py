"""The shrunk counterexamples of the property tests (tests/test_properties*.py), as plain tests.

Each one failed before the fix named in its docstring. Backend-agnostic: runs on Keras 2 and on
Keras 3 with TensorFlow and JAX.
"""

import numpy as np
import pytest
from layer_test_helper import requires_tf, to_numpy

from keras_posenc.layers import RotaryEmbedding, SinusoidalPositionEmbedding


def test_extend_keeps_stored_rows_inside_the_table_when_a_batch_overflows():
    """overflow="extend" with a lossy (interpolated) table: a packed row whose second sequence
    reaches past max_length used the formula for every position, so the first sequence's tokens
    differed from the same tokens alone by 0.25. Positions inside the table now always get the
    stored rows."""
    layer = SinusoidalPositionEmbedding(2, base=2.0, table="interpolated", stored_dims=2, overflow="extend",
                                        zero_padding=False)
    x = np.zeros([1, 5, 3], "float32")
    packed = to_numpy(layer(x, position_ids=np.array([[0, 1, 0, 1, 2]], "int32")))[0]
    alone = to_numpy(layer(x[:, :2]))[0]
    np.testing.assert_array_equal(packed[:2], alone)
    np.testing.assert_array_equal(packed[2:4], alone)
    # Position 2 is past the table: the formula (interleaved sin/cos of 2 * base ** (-2k / depth)).
    angles = 2.0 / 2.0 ** (2.0 * np.arange(2) / 3)
    np.testing.assert_allclose(packed[4], [np.sin(angles[0]), np.cos(angles[0]), np.sin(angles[1])],
                               rtol=0, atol=1e-6)
    # The prefix of a longer row: the same stored rows, then the formula.
    np.testing.assert_array_equal(to_numpy(layer(np.zeros([1, 3, 3], "float32")))[0], packed[2:])


def test_rope_with_tables_takes_a_row_with_no_tokens():
    """The bare counterpart of an all-padding row is empty: RotaryEmbedding(max_length=...) raised
    "Cannot compute the min of an empty tensor" on Keras 3 (TensorFlow and JAX) while checking the
    ids' range, though the check itself allows empty ids. Fixed: min/max with an initial value."""
    layer = RotaryEmbedding(2.0, max_length=60)
    y = layer(np.zeros([1, 0, 4], "float32"), offset=np.zeros([1], "int32"))
    assert tuple(y.shape) == (1, 0, 4)
    assert tuple(layer(np.zeros([2, 0, 2, 4], "float32"), mask=np.zeros([2, 0], bool)).shape) == (2, 0, 2, 4)


@requires_tf
def test_export_checks_the_length_against_a_rope_table_too():
    """A model whose shortest table is a RotaryEmbedding's cos/sin (max_length=3, after an
    embedding of 8 rows): to_tflite(sequence_length=4) failed deep inside the traced layer instead
    of saying which length the model takes. The exporter now counts RoPE tables."""
    from keras_posenc.backend import keras
    from keras_posenc.export import to_tflite
    from keras_posenc.layers import TokenAndPositionEmbedding

    ids = keras.Input(shape=(None,), dtype="int32")
    hidden = RotaryEmbedding(max_length=3)(TokenAndPositionEmbedding(5, 4, 8, dropout=0.0)(ids))
    model = keras.Model(ids, hidden)
    for target in ("cpu", "gpu"):
        with pytest.raises(ValueError, match=r"`sequence_length`=4 exceeds the model's max_length=3\."):
            to_tflite(model, sequence_length=4, target=target)
    assert len(to_tflite(model, sequence_length=3, target="cpu")) > 0
