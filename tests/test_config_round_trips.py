"""Every layer's and model's `get_config` holds each constructor argument it was given, key by key,
non-default values included, and `from_config` of it rebuilds the same config (a saved model reloads
the layer the user built: tests/user_checks.py). The round trips of saved files compare outputs
elsewhere (test_keras_export.py, the layer tests); here a key dropped where it changes no output of
the saved model (YaRN's `truncate` at a short length) is caught too."""

import numpy as np
import pytest
from user_checks import assert_arguments_covered, assert_config_round_trip

from keras_posenc import Encoder, EncoderLayer
from keras_posenc import layers as L
from keras_posenc.backend import keras
from keras_posenc.models import CausalLM
from keras_posenc.seq2seq import Seq2SeqTransformer


def initializer(stddev):
    return keras.initializers.RandomNormal(mean=0.1, stddev=stddev, seed=3)


ROPE = {
    "max_wavelength": 500.0,
    "layout": "interleave",
    "scaling": "yarn",
    "scaling_factor": 4.0,
    "original_length": 32,
    "beta_fast": 16.0,
    "beta_slow": 2.0,
    "truncate": False,
}

CASES = {
    L.RotaryEmbedding: [
        dict(
            ROPE,
            max_length=128,
            mscale=0.8,
            mscale_all_dim=0.5,
            attention_factor=1.3,
            partial_rotary_factor=0.5,
            head_dim=16,
        ),
        dict(
            scaling="llama3",
            scaling_factor=8.0,
            original_length=64,
            low_freq_factor=2.0,
            high_freq_factor=8.0,
            max_wavelength=50000.0,
        ),
        dict(
            scaling="longrope",
            scaling_factor=2.0,
            original_length=64,
            max_length=128,
            head_dim=8,
            short_factor=[1.0, 1.5, 2.0, 2.5],
            long_factor=[2.0, 3.0, 4.0, 5.0],
        ),
    ],
    L.LearnedPositionEmbedding: [
        dict(
            max_length=17,
            initializer=initializer(0.3),
            zero_padding=False,
            num_languages=3,
            dropout=0.25,
            overflow="error",
        ),
    ],
    L.SinusoidalPositionEmbedding: [
        dict(
            max_length=19,
            base=500.0,
            layout="concat",
            table="interpolated",
            stored_dims=4,
            zero_padding=False,
            num_languages=2,
            dropout=0.2,
            overflow="extend",
        ),
        dict(max_length=20, table="factorized"),
    ],
    L.IntegerPositionEmbedding: [
        dict(max_length=21, scale=0.5, zero_padding=False, num_languages=2, dropout=0.1, overflow="extend"),
    ],
    L.ZeroPositionEmbedding: [
        dict(max_length=22, zero_padding=False, dropout=0.3, overflow="extend"),
    ],
    L.SinusoidalPositionEmbedding2D: [
        dict(height=3, width=5, cls_token=True, base=300.0),
    ],
    L.TokenAndPositionEmbedding: [
        dict(
            vocab_size=30,
            d_model=8,
            max_length=12,
            pad_id=1,
            scale_embeddings=False,
            position="learned",
            dropout=0.2,
            embeddings_initializer=initializer(0.4),
            position_config={"num_languages": 2, "zero_padding": False},
        ),
    ],
    L.PositionalAttention: [
        dict(num_heads=2, key_dim=4, position="rope", position_config=dict(ROPE)),
        dict(num_heads=2, key_dim=4, position="alibi"),
    ],
    EncoderLayer: [
        dict(
            d_model=8,
            num_heads=2,
            dff=12,
            dropout=0.2,
            norm_first=True,
            activation="gelu",
            epsilon=1e-5,
            position="rope",
            position_config=dict(ROPE),
        ),
    ],
    L.DecoderLayer: [
        dict(
            d_model=8,
            num_heads=2,
            dff=12,
            dropout=0.2,
            norm_first=True,
            activation="gelu",
            epsilon=1e-5,
            position="rope",
            position_config=dict(ROPE),
        ),
    ],
    Encoder: [
        dict(
            num_layers=2,
            d_model=8,
            num_heads=2,
            dff=12,
            vocab_size=30,
            max_length=12,
            dropout=0.2,
            norm_first=True,
            activation="gelu",
            epsilon=1e-5,
            pad_id=1,
            position="rope",
            position_config=dict(ROPE),
        ),
        dict(
            num_layers=1,
            d_model=8,
            num_heads=2,
            dff=12,
            vocab_size=30,
            max_length=12,
            position="learned",
            position_config={"num_languages": 2, "zero_padding": False},
        ),
    ],
    Seq2SeqTransformer: [
        dict(
            num_layers=2,
            d_model=8,
            num_heads=2,
            dff=12,
            vocab_size=30,
            max_length=12,
            dropout=0.2,
            norm_first=True,
            activation="gelu",
            epsilon=1e-5,
            pad_id=1,
            bos_id=4,
            eos_id=5,
            position="rope",
            position_config=dict(ROPE),
            language_scale=False,
            share_embeddings=True,
            tie_output=True,
            label_smoothing=0.05,
        ),
        dict(num_layers=1, d_model=8, num_heads=2, dff=12, vocab_size=30, max_length=12,
             position="sinusoidal", position_config={"table": "factorized"}),
    ],
    CausalLM: [
        dict(
            encoder_config=dict(
                num_layers=1,
                d_model=8,
                num_heads=2,
                dff=12,
                vocab_size=30,
                max_length=12,
                position="rope",
                position_config=dict(ROPE),
            ),
            causal=False,
        ),
    ],
}

# Arguments whose one accepted value is the default.
ONE_VALUE = {
    L.LearnedPositionEmbedding: ("overflow",),  # a learned table has no rows past max_length: "error" only
    L.ZeroPositionEmbedding: ("num_languages",),  # no embedding to scale: None only
}

CASE_IDS = [(cls, i) for cls, cases in CASES.items() for i in range(len(cases))]


@pytest.mark.parametrize("cls, index", CASE_IDS, ids=[f"{cls.__name__}-{i}" for cls, i in CASE_IDS])
def test_get_config_holds_every_argument_and_round_trips(cls, index):
    assert_config_round_trip(cls, **CASES[cls][index])


@pytest.mark.parametrize("cls", list(CASES), ids=[cls.__name__ for cls in CASES])
def test_every_constructor_argument_has_a_non_default_case(cls):
    """A constructor argument added later needs a case here, or its `get_config` is not checked."""
    assert_arguments_covered(cls, CASES[cls], exempt=ONE_VALUE.get(cls, ()))


def test_yarn_truncate_changes_the_frequencies_it_saves():
    """`truncate` is no key that only a config holds: the reloaded layer computes other frequencies."""
    given = assert_config_round_trip(L.RotaryEmbedding, **dict(ROPE, truncate=False, max_length=128))
    other = L.RotaryEmbedding(**dict(ROPE, truncate=True, max_length=128))
    x = np.random.default_rng(0).normal(size=[1, 128, 2, 16]).astype("float32")
    assert not np.allclose(np.asarray(given(x)), np.asarray(other(x)))
