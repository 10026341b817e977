"""Positions a user gets without giving them: a cached `Encoder` call numbers its chunk from
`cache_index` (a decode step continues the prompt's positions, it does not restart at 0), and a
learned position table starts at the documented width (truncated normal, stddev 0.02)."""

import numpy as np
import pytest

from keras_posenc import Encoder
from keras_posenc import layers as L
from keras_posenc.backend import keras


def encoder(position):
    keras.utils.set_random_seed(0)
    model = Encoder(
        num_layers=2,
        d_model=16,
        num_heads=2,
        dff=32,
        vocab_size=20,
        max_length=16,
        dropout=0.0,
        position=position,
    )
    model(np.ones([1, 4], np.int32))
    return model


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rope"])
def test_a_cached_call_without_position_ids_continues_the_positions(position):
    """Prefill 3 tokens, then one token at a time without `position_ids`: each step's output is the
    full causal call's at that position (a step numbered from 0 would give another output)."""
    model = encoder(position)
    if position == "learned":  # rows far apart, so that a wrong row shows
        table = model.embedding.position_embedding.position_table
        table.assign(np.random.default_rng(1).normal(size=table.shape).astype("float32"))
    tokens = np.array([[3, 7, 5, 9, 4, 11]], np.int32)
    full = np.asarray(model(tokens, use_causal_mask=True))
    cache = np.zeros(model.cache_shape(1, 8), np.float32)
    out, cache = model(tokens[:, :3], cache=cache, cache_index=0)
    np.testing.assert_allclose(np.asarray(out), full[:, :3], atol=1e-5)
    for t in range(3, 6):
        out, cache = model(tokens[:, t : t + 1], cache=cache, cache_index=t)
        np.testing.assert_allclose(np.asarray(out)[:, 0], full[:, t], atol=1e-5, err_msg=f"step {t}")
    given = model(tokens[:, 5:6], cache=cache, cache_index=5, position_ids=np.array([[5]], np.int32))[0]
    np.testing.assert_allclose(np.asarray(given)[:, 0], full[:, 5], atol=1e-5)


@pytest.mark.parametrize(
    "make",
    [
        lambda: L.LearnedPositionEmbedding(max_length=512),
        lambda: (
            L.TokenAndPositionEmbedding(
                vocab_size=10, d_model=64, max_length=512, position="learned"
            ).position_embedding
        ),
    ],
    ids=["LearnedPositionEmbedding", "TokenAndPositionEmbedding"],
)
def test_a_learned_table_starts_at_the_documented_width(make):
    """Truncated normal with stddev 0.02 (BERT's): values within 2 stddev, their spread about 0.88 of it."""
    keras.utils.set_random_seed(0)
    layer = make()
    layer.build((None, 512, 64))
    values = np.asarray(layer.position_table)
    assert values.shape == (512, 64)
    assert np.abs(values).max() <= 0.04 + 1e-7
    assert 0.0165 < values.std() < 0.0190  # 0.02 * 0.88, the spread of a normal cut at 2 stddev
    assert abs(values.mean()) < 1e-3
