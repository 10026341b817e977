"""The position layers on every backend: Keras 2 (TF 2.12) and Keras 3 with TensorFlow or JAX.

Only numpy inputs and `keras_posenc.backend` here, so the same file runs under `KERAS_BACKEND=jax`
(see `make test-keras3`). Expected values are computed independently in numpy float64.
"""

import math

import numpy as np
import pytest
from layer_test_helper import run_layer_test, to_numpy

from keras_posenc import position_ids
from keras_posenc.backend import backend_name, dtype_name, is_keras3, keras, ops
from keras_posenc.layers import (
    IntegerPositionEmbedding,
    LearnedPositionEmbedding,
    SinusoidalPositionEmbedding,
    TokenAndPositionEmbedding,
    ZeroPositionEmbedding,
)

DEPTH = 8


def formula(ids, depth=DEPTH, base=10000.0, layout="interleave"):
    """PE rows of integer positions `ids` (any shape), float64, written from the paper."""
    ids = np.asarray(ids, np.float64)
    pair = np.arange((depth + 1) // 2)
    angles = ids[..., None] / base ** (2.0 * pair / depth)
    sin, cos = np.sin(angles), np.cos(angles)
    if layout == "concat":
        return np.concatenate([sin, cos], -1)[..., :depth]
    out = np.empty(ids.shape + (2 * len(pair),))
    out[..., 0::2], out[..., 1::2] = sin, cos
    return out[..., :depth]


def x_of(batch, length, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, length, DEPTH)).astype("float32")


def test_backend_is_the_one_asked_for():
    import os

    assert is_keras3() == keras.__version__.startswith("3.")
    assert backend_name() == (os.environ.get("KERAS_BACKEND", "tensorflow") if is_keras3() else "tensorflow")


@pytest.mark.parametrize("layout", ["interleave", "concat"])
def test_table_values_are_exact(layout):
    layer = SinusoidalPositionEmbedding(max_length=64, layout=layout)
    out = to_numpy(layer(np.zeros([1, 64, DEPTH], "float32")))
    np.testing.assert_array_equal(out[0], formula(np.arange(64), layout=layout).astype(np.float32))


@pytest.mark.parametrize("kind", ["factorized", "interpolated"])
def test_compressed_tables_rebuild_the_same_rows_on_every_backend(kind):
    from keras_posenc import tables

    layer = SinusoidalPositionEmbedding(max_length=50, table=kind, stored_dims=4)
    out = to_numpy(layer(np.zeros([1, 50, DEPTH], "float32")))[0]
    np.testing.assert_allclose(out, tables.compressed_table(kind, 50, DEPTH, stored_dims=4), atol=3e-7)
    if kind == "factorized":
        np.testing.assert_allclose(out, formula(np.arange(50)), atol=3e-7)


def test_per_sample_ids_and_zero_padding_are_exact():
    layer = SinusoidalPositionEmbedding(max_length=16)
    x = x_of(2, 6)
    mask = np.array([[False, False, True, True, True, True], [True, True, True, False, False, False]])
    out = to_numpy(layer(x, mask=mask))
    ids = np.array([[0, 0, 0, 1, 2, 3], [0, 1, 2, 0, 0, 0]])
    expected = x + formula(ids).astype(np.float32) * mask[..., None]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out[~mask], x[~mask])  # padding: exactly no encoding
    np.testing.assert_array_equal(to_numpy(position_ids(mask)), ids)


def test_left_padding_packing_and_offset_equal_the_plain_rows():
    layer = SinusoidalPositionEmbedding(max_length=16)
    x = x_of(1, 5, seed=1)
    plain = to_numpy(layer(x, mask=np.ones([1, 5], bool)))
    padded_x = np.concatenate([x_of(1, 3, seed=2), x], axis=1)
    left = to_numpy(layer(padded_x, mask=np.array([[False] * 3 + [True] * 5])))
    np.testing.assert_array_equal(left[:, 3:], plain)
    packed_mask = np.ones([1, 8], bool)
    segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2]])
    packed_x = np.concatenate([x, x[:, :3]], axis=1)
    packed = to_numpy(layer(packed_x, position_ids=position_ids(packed_mask, segment_ids=segments),
                            mask=packed_mask))
    np.testing.assert_array_equal(packed[:, :5], plain)
    np.testing.assert_array_equal(packed[:, 5:], plain[:, :3])
    for t in range(5):  # one token at a time with a decode offset
        ids = position_ids(np.ones([1, 1], bool), offset=np.array([t], np.int32))
        step = to_numpy(layer(x[:, t:t + 1], position_ids=ids, mask=np.ones([1, 1], bool)))
        np.testing.assert_array_equal(step[:, 0], plain[:, t])


def test_extend_computes_rows_past_the_table():
    layer = SinusoidalPositionEmbedding(max_length=4, overflow="extend")
    out = to_numpy(layer(np.zeros([1, 10, DEPTH], "float32")))[0]
    # float64 angles where the backend has float64 (JAX without x64: float32, ~1e-6 here).
    np.testing.assert_allclose(out, formula(np.arange(10)), atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_tables_stay_float32_and_are_rounded_once_under_mixed_precision(policy):
    compute = policy.split("_")[1]
    layer = SinusoidalPositionEmbedding(max_length=4096, dtype=policy)
    out = to_numpy(layer(np.zeros([1, 4096, DEPTH], "float32")))
    assert dtype_name(layer(np.zeros([1, 2, DEPTH], "float32"))) == compute
    assert dtype_name(layer._table) == "float32"
    # One rounding of the float32 table (not angles computed in low precision).
    expected = to_numpy(ops.cast(formula(np.arange(4096)).astype(np.float32), compute))
    np.testing.assert_array_equal(out[0].astype(np.float32), expected.astype(np.float32))
    learned = LearnedPositionEmbedding(max_length=8, dtype=policy)
    assert dtype_name(learned(np.zeros([1, 3, DEPTH], "float32"))) == compute
    assert dtype_name(learned.position_table) == "float32"
    languages = SinusoidalPositionEmbedding(max_length=8, num_languages=2, dtype=policy)
    languages(np.zeros([1, 3, DEPTH], "float32"), language_ids=np.array([1]))
    assert dtype_name(languages.language_scale) == "float32"


def test_bad_arguments_raise_typed_errors_in_eager_mode():
    layer = SinusoidalPositionEmbedding(max_length=8)
    with pytest.raises(ValueError, match=r"Sequence length 9 exceeds max_length=8"):
        layer(np.zeros([1, 9, DEPTH], "float32"))
    with pytest.raises(ValueError,
                       match=r"`position_ids` must be in \[0, max_length=8\), got min 0 and max 8"):
        layer(np.zeros([1, 3, DEPTH], "float32"), position_ids=np.array([[0, 8, 2]]))
    with pytest.raises(TypeError, match="`position_ids` must be an integer tensor, got dtype float32"):
        layer(np.zeros([1, 3, DEPTH], "float32"), position_ids=np.zeros([1, 3], "float32"))
    with pytest.raises(ValueError, match=r"Sequence length 9 exceeds max_length=8"):
        layer(np.zeros([1, 12, DEPTH], "float32"), mask=np.array([[False] * 3 + [True] * 9]))
    with pytest.raises(ValueError, match="`offset` must be >= 0, got offset=-1"):
        position_ids(np.ones([1, 2]), offset=-1)
    with pytest.raises(ValueError, match=r"`offset` must be >= 0, got offset=\[0 -2\]"):
        position_ids(np.ones([2, 2]), offset=np.array([0, -2], np.int32))
    with pytest.raises(ValueError, match="must be a float in"):
        SinusoidalPositionEmbedding(max_length=8, dropout=1.5)


def test_a_compiled_predict_rejects_a_length_past_the_table():
    """JAX: the length is static under jit, so the eager `ValueError` is raised while tracing.
    TensorFlow: the graph's assertion raises `InvalidArgumentError` with the same text."""
    inputs = keras.Input((None, DEPTH))
    model = keras.Model(inputs, SinusoidalPositionEmbedding(max_length=16)(inputs))
    jax = backend_name() == "jax"
    model.compile(jit_compile=jax)
    assert to_numpy(model.predict(np.zeros([2, 12, DEPTH], "float32"), verbose=0)).shape == (2, 12, DEPTH)
    if jax:
        error = ValueError
    else:
        import tensorflow as tf

        error = tf.errors.InvalidArgumentError
    with pytest.raises(error, match="Sequence length 20 exceeds max_length=16"):
        model.predict(np.zeros([2, 20, DEPTH], "float32"), verbose=0)


class RecordMask(keras.layers.Layer):
    """Returns its input's Keras mask as a float tensor (0 where masked)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        return ops.cast(mask, "float32")

    def compute_mask(self, inputs, mask=None):
        return None


def test_keras_mask_is_emitted_symbolically_and_reaches_the_next_layers():
    tokens = keras.Input((None,), dtype="int32")
    embedded = TokenAndPositionEmbedding(50, DEPTH, 16)(tokens)
    shifted = SinusoidalPositionEmbedding(max_length=16, name="second")(embedded)  # mask passes through
    model = keras.Model(tokens, RecordMask()(shifted))
    ids = np.array([[0, 0, 5, 6], [7, 8, 9, 0]])
    np.testing.assert_array_equal(to_numpy(model(ids)), (ids != 0).astype(np.float32))


def test_token_and_position_embedding_values_and_position_config():
    layer = TokenAndPositionEmbedding(50, DEPTH, 16, dropout=0.0,
                                      position_config={"table": "factorized", "dropout": 0.25})
    ids = np.array([[0, 3, 4, 0], [5, 6, 7, 8]])
    out = to_numpy(layer(ids))
    table = to_numpy(layer.token_embedding.embeddings)
    pos = np.array([[0, 0, 1, 0], [0, 1, 2, 3]])
    expected = table[ids] * math.sqrt(DEPTH) + formula(pos) * (ids != 0)[..., None]
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert layer.position_embedding.dropout == 0.25 and layer.position_embedding.table == "factorized"
    config = layer.get_config()
    assert config["position_config"] == {"table": "factorized", "dropout": 0.25}
    assert TokenAndPositionEmbedding.from_config(config).position_embedding.dropout == 0.25
    flat = TokenAndPositionEmbedding(50, DEPTH, 16, table="factorized", name="flat")
    assert flat.name == "flat" and flat.position_config == {"table": "factorized"}
    with pytest.raises(ValueError, match=r"both in `position_config` and as keyword arguments"):
        TokenAndPositionEmbedding(50, DEPTH, 16, table="full", position_config={"table": "full"})


CONTRACT_CASES = {
    "sinusoidal": (SinusoidalPositionEmbedding, {"max_length": 12, "table": "factorized", "num_languages": 2},
                   {"inputs": x_of(2, 7), "language_ids": np.array([0, 1], np.int32),
                    "mask": np.array([[True] * 5 + [False] * 2, [False] * 3 + [True] * 4])}),
    "learned": (LearnedPositionEmbedding, {"max_length": 12},
                {"inputs": x_of(2, 7),
                 "position_ids": np.array([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 2, 3, 4]])}),
    "integer": (IntegerPositionEmbedding, {"max_length": 12, "overflow": "extend"}, {"inputs": x_of(2, 7)}),
    "zero": (ZeroPositionEmbedding, {"max_length": 12}, {"inputs": x_of(2, 7)}),
    "token_and_position": (TokenAndPositionEmbedding,
                           {"vocab_size": 30, "d_model": DEPTH, "max_length": 12, "position": "learned"},
                           {"inputs": np.array([[0, 0, 3, 4, 5], [6, 7, 8, 0, 0]], np.int32)}),
}


@pytest.mark.parametrize("case", sorted(CONTRACT_CASES))
def test_keras_contract_config_keras_file_fit_and_mixed_precision(case, tmp_path):
    layer_cls, kwargs, inputs = CONTRACT_CASES[case]
    run_layer_test(layer_cls, kwargs, inputs, tmp_dir=tmp_path)


@pytest.mark.skipif(backend_name() == "tensorflow", reason="the applications run on the TensorFlow backend")
def test_cli_applications_say_in_one_line_that_they_need_tensorflow(capsys):
    from keras_posenc.app import cli

    for command in (["demo"], ["train", "--steps", "1"], ["inspect", "model.tflite"], ["ablate", "--quick"]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"keras-posenc: error: `{command[0]}` needs KERAS_BACKEND=tensorflow "
                       f"(this process runs Keras on {backend_name()})."], err
