"""Diagnostics: PE value range, heatmap, positional contribution, attention by distance."""

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import Encoder, sinusoidal_table
from keras_posenc.app import diagnostics
from keras_posenc.backend import keras
from keras_posenc.layers import SinusoidalPositionEmbedding


def _encoder(position="sinusoidal", **kwargs):
    keras.utils.set_random_seed(1)
    encoder = Encoder(num_layers=2, d_model=8, num_heads=2, dff=16, vocab_size=30, max_length=12,
                      dropout=0.0, position=position, **kwargs)
    encoder(tf.constant([[2, 5, 6]]))
    return encoder


TOKENS = tf.constant([[2, 5, 6, 7, 8, 9], [2, 11, 12, 13, 0, 0]])


def test_position_table_is_the_sinusoidal_table():
    table = diagnostics.position_table(SinusoidalPositionEmbedding(max_length=20), depth=6)
    np.testing.assert_allclose(table, sinusoidal_table(20, 6, dtype="float64"), atol=1e-6)


def test_pe_value_range_flags_values_outside_the_bound():
    good = diagnostics.pe_value_range(sinusoidal_table(64, 16, dtype="float64"))
    assert good["ok"] and good["min"] == pytest.approx(-1, abs=1e-3) and good["max"] == pytest.approx(1)
    # A raw-index "table" (the position itself as the value) is out of range.
    raw = np.arange(64, dtype=np.float64)[:, None] * np.ones([1, 16])
    bad = diagnostics.pe_value_range(raw)
    assert not bad["ok"] and bad["max"] == 63.0


def test_heatmap_is_a_png(tmp_path):
    path = diagnostics.plot_pe_heatmap(sinusoidal_table(32, 8), str(tmp_path / "pe.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_positional_contribution_is_zero_without_pe_and_positive_with_it():
    assert diagnostics.positional_contribution(_encoder("none"), TOKENS) == 0.0
    ratio = diagnostics.positional_contribution(_encoder("sinusoidal"), TOKENS)
    assert 0.0 < ratio < 10.0


def test_attention_by_distance_accounts_for_every_query():
    encoder = _encoder()
    tokens = TOKENS[:1]  # one fully real row of length T = 6
    length = tokens.shape[1]
    per_layer = diagnostics.attention_by_distance(encoder, tokens)
    assert len(per_layer) == 2
    counts = length - np.arange(length)  # causal pairs at distance d: T - d
    for weights in per_layer:
        assert weights.shape == (length,)
        # Each query's weights over keys j <= i sum to 1, so sum_d mean_d * count_d = T queries.
        assert np.sum(weights * counts) == pytest.approx(length, rel=1e-5)
        assert np.all(np.isfinite(weights)) and np.all(weights > 0)


def test_attention_by_distance_ignores_padding():
    per_layer = diagnostics.attention_by_distance(_encoder(), TOKENS[1:])  # 4 real tokens, 2 pads
    weights = per_layer[0]
    assert np.all(np.isnan(weights[4:]))  # no real query-key pair that far apart
    counts = 4 - np.arange(4)
    assert np.sum(weights[:4] * counts) == pytest.approx(4, rel=1e-5)
