"""Compressed position tables: "interpolated" (lossy, bounded) and "factorized" (exact).

References are the float64 table of `sinusoidal_table`, or closed forms
written here in numpy float64.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
from layer_test_helper import requires_tf, run_layer_test, saved_model_output
from tensorflow.core.protobuf import saved_model_pb2

from keras_posenc import tables
from keras_posenc.backend import keras
from keras_posenc.layers import SinusoidalPositionEmbedding

# Written against TensorFlow tensors and graphs; the JAX backend runs tests/test_keras3_backends.py.
pytestmark = requires_tf

SHAPES = [(50, 7), (100, 33), (130, 64), (512, 512)]  # (length, depth), odd depths included
LAYOUTS = ["interleave", "concat"]


def exact(length, depth, layout="interleave"):
    return tables.sinusoidal_table(length, depth, layout=layout, dtype=np.float64)


def interpolation_bound(length, depth, stored_dims, layout="interleave", base=10000.0):
    """A priori bound on the linear-interpolation error, per position and column.

    Column pair i is f(u) = sin or cos of theta(u) = p * base ** (-2u / depth) at u = i.
    With c = 2 ln(base) / depth, |f''(u)| <= c**2 * theta * (theta + 1), largest at the
    lower node u_lo; linear interpolation between nodes h apart errs by at most
    h**2 / 8 * max |f''|, and never by more than 2 (both values are in [-1, 1]).
    """
    pairs = (depth + 1) // 2
    nodes = tables.interpolation_nodes(pairs, stored_dims // 2)
    lower = np.searchsorted(nodes, np.arange(pairs), side="right") - 1
    lower = np.minimum(lower, len(nodes) - 2)
    lo, hi = nodes[lower], nodes[lower + 1]
    c = 2 * np.log(base) / depth
    theta = np.arange(length)[:, None] * base ** (-2.0 * lo / depth)[None, :]
    bound = np.minimum(2.0, (hi - lo) ** 2 / 8 * c ** 2 * theta * (theta + 1))
    pair_of_column = tables.pair_columns(depth, layout)[0]
    return bound[:, pair_of_column]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("length,depth", SHAPES)
def test_full_and_factorized_match_float64_table(length, depth, layout):
    reference = exact(length, depth, layout)
    full = tables.compressed_table("full", length, depth, layout=layout)
    factorized = tables.compressed_table("factorized", length, depth, layout=layout)
    assert np.abs(full - reference).max() <= 6e-8  # float32 rounding
    assert np.abs(factorized - reference).max() <= 3e-7  # documented bound


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("length,depth,stored_dims", [(50, 7, 4), (100, 33, 10), (130, 64, 16),
                                                      (512, 512, 64), (64, 20, 20)])
def test_interpolated_within_its_bound(length, depth, stored_dims, layout):
    reference = exact(length, depth, layout)
    approx = tables.compressed_table("interpolated", length, depth, stored_dims=stored_dims, layout=layout)
    error = np.abs(approx - reference)
    assert np.all(error <= interpolation_bound(length, depth, stored_dims, layout) + 3e-7)
    # Stored pairs are exact columns of the table.
    pair = tables.pair_columns(depth, layout)[0]
    stored = np.isin(pair, tables.interpolation_nodes((depth + 1) // 2, stored_dims // 2))
    np.testing.assert_array_equal(approx[:, stored], reference[:, stored].astype(np.float32))
    if stored_dims >= depth:
        assert error.max() <= 6e-8


def test_interpolated_error_per_band_is_as_documented():
    report = tables.table_error_report("interpolated", 512, 512, num_bands=8)
    band_max = [band["max_abs_error"] for band in report["bands"]]
    assert [band["columns"] for band in report["bands"]][:2] == [(0, 63), (64, 127)]
    # Docstring of tables.compressed_table: 0-191 max 2.0; 192-255 1.24; 256-319 0.24;
    # 320-383 0.028; 384-447 0.0047; 448-511 0.0015.
    assert min(band_max[:3]) > 1.99
    np.testing.assert_allclose(band_max[3:], [1.24, 0.24, 0.028, 0.0047, 0.0015], rtol=0.05)
    assert abs(report["max_abs_error"] - 2.0) < 0.01 and abs(report["rms_error"] - 0.49) < 0.01
    assert report["stored_bytes"] == 512 * 64 * 4 and report["fraction"] == 1 / 8


def test_factorized_report_bytes_and_error():
    report = tables.table_error_report("factorized", 512, 512)
    block = tables.factorization_block(512)
    assert block == 23
    assert report["stored_bytes"] == (23 + 23) * 256 * 2 * 4  # coarse + fine, sin and cos
    assert report["fraction"] <= 1 / 8 and report["max_abs_error"] <= 1e-6
    assert report["stored_bytes"] < tables.table_nbytes("interpolated", 512, 512)


def test_interpolation_nodes_and_weights():
    for pairs, stored in [(256, 32), (17, 3), (5, 5), (9, 2)]:
        nodes = tables.interpolation_nodes(pairs, stored)
        assert nodes[0] == 0 and nodes[-1] == pairs - 1 and np.all(np.diff(nodes) >= 1)
        assert len(nodes) == stored
        lower, alpha = tables.interpolation_weights(pairs, stored)
        i = np.arange(pairs)
        assert np.all((nodes[lower] <= i) & (i <= nodes[lower + 1]))
        np.testing.assert_allclose((1 - alpha) * nodes[lower] + alpha * nodes[lower + 1], i, atol=1e-5)
        assert np.all(alpha[nodes[:-1]] == 0) and alpha[-1] == (1 if stored > 1 else 0)
    approx = tables.compressed_table("interpolated", 40, 512)  # 64 stored dims, 6 bands
    reference = exact(40, 512)
    stored = np.repeat(tables.interpolation_nodes(256, 32) * 2, 2) + np.tile([0, 1], 32)
    assert np.array_equal(approx[:, stored], reference[:, stored].astype(np.float32))


@pytest.mark.parametrize("stored_dims,error,match", [
    (0, ValueError, "stored_dims=0"), (1, ValueError, "stored_dims=1"),
    (7, ValueError, "even.*stored_dims=7"), (2.0, TypeError, "stored_dims=2.0"),
    (True, TypeError, "stored_dims=True")])
def test_bad_stored_dims(stored_dims, error, match):
    with pytest.raises(error, match=match):
        SinusoidalPositionEmbedding(16, table="interpolated", stored_dims=stored_dims)
    with pytest.raises(error, match=match):
        tables.table_constants("interpolated", 16, 8, stored_dims=stored_dims)


def test_stored_dims_above_depth_and_unknown_kind():
    layer = SinusoidalPositionEmbedding(16, table="interpolated", stored_dims=10)
    with pytest.raises(ValueError, match="stored_dims.*<= depth=8, got stored_dims=10"):
        layer(tf.zeros([1, 4, 8]))
    with pytest.raises(ValueError, match=r"`table` must be one of .*got table='compressed'"):
        SinusoidalPositionEmbedding(16, table="compressed")
    with pytest.raises(ValueError, match="table='Full'"):
        tables.compressed_table("Full", 4, 4)


def test_default_stored_dims_on_narrow_inputs_stores_whole_width():
    layer = SinusoidalPositionEmbedding(16, table="interpolated")
    out = layer(tf.zeros([1, 16, 6]))[0].numpy()
    assert layer.table_nbytes == 16 * 6 * 4
    assert np.abs(out - exact(16, 6)).max() <= 6e-8
    assert tables.resolve_stored_dims(None, 512) == 64 and tables.resolve_stored_dims(None, 7) == 8


@pytest.mark.parametrize("kind", ["full", "interpolated", "factorized"])
def test_layer_contract_every_kind(kind, tmp_path):
    rng = np.random.RandomState(1)
    mask = tf.constant([[True] * 5 + [False] * 2, [False] * 3 + [True] * 4])
    inputs = {"inputs": tf.constant(rng.normal(size=[2, 7, 7]), tf.float32), "mask": mask,
              "language_ids": tf.constant([[0] * 7, [1] * 7])}
    output = run_layer_test(SinusoidalPositionEmbedding,
                            {"max_length": 12, "table": kind, "stored_dims": 4, "num_languages": 2},
                            inputs, tmp_dir=tmp_path, expected_output_shape=(2, 7, 7))
    reference = tables.compressed_table(kind, 12, 7, stored_dims=4)
    pe = output.numpy() - inputs["inputs"].numpy()
    np.testing.assert_allclose(pe[0, :5], reference[:5], atol=1e-6)
    np.testing.assert_allclose(pe[1, 3:], reference[:4], atol=1e-6)  # per-sample ids, left padding
    assert np.all(pe[0, 5:] == 0) and np.all(pe[1, :3] == 0)  # padding zeroed


def _saved_constant_bytes(path):
    model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        model.ParseFromString(f.read())
    graph = model.meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    # Distinct contents: Keras 2's SavedModel traces several functions of the layer, each holding the
    # same constants (a table is a NumPy array made a constant of each traced graph).
    return sum(len(c) for c in {n.attr["value"].tensor.tensor_content for n in nodes if n.op == "Const"})


@pytest.mark.parametrize("kind", ["full", "interpolated", "factorized"])
def test_saved_model_holds_only_the_compressed_constants(kind, tmp_path):
    inputs = keras.Input([None, 128])
    layer = SinusoidalPositionEmbedding(256, table=kind)
    model = keras.Model(inputs, layer(inputs))
    x = tf.random.normal([2, 256, 128], seed=3)
    restored = saved_model_output(model, x, str(tmp_path))
    assert np.array_equal(np.asarray(restored), model(x).numpy())
    expected = {"full": 256 * 128 * 4, "interpolated": 256 * 64 * 4, "factorized": (16 + 16) * 128 * 4}
    assert layer.table_nbytes == expected[kind] == tables.table_nbytes(kind, 256, 128)
    saved = _saved_constant_bytes(str(tmp_path))
    # The table constants, plus at most three [depth] column vectors (the interpolation's two
    # column indices and weights; the factorized interleave order) and small shapes.
    assert expected[kind] <= saved <= expected[kind] + 3 * 128 * 4 + 1024


def test_factorized_layer_equals_full_layer():
    kwargs = {"max_length": 2048, "num_languages": 2}
    full = SinusoidalPositionEmbedding(table="full", **kwargs)
    factorized = SinusoidalPositionEmbedding(table="factorized", **kwargs)
    x = tf.random.normal([2, 2048, 30], seed=0)
    ids = tf.constant(np.random.RandomState(0).permutation(4096).reshape(2, 2048) % 2048)
    mask = tf.sequence_mask([2048, 1000], 2048)
    for call in [{}, {"position_ids": ids}, {"mask": mask}]:
        a = full(x, language_ids=tf.constant([0, 1]), **call)
        b = factorized(x, language_ids=tf.constant([0, 1]), **call)
        assert float(tf.reduce_max(tf.abs(a - b))) <= 1e-6


@pytest.mark.parametrize("kind", ["interpolated", "factorized"])
def test_extend_past_the_table_and_graph_mode(kind):
    layer = SinusoidalPositionEmbedding(32, table=kind, stored_dims=8, overflow="extend")
    ids = tf.constant([[0, 31, 32, 100, 5000]])
    x = tf.zeros([1, 5, 8])
    out = tf.function(lambda x, ids: layer(x, position_ids=ids))(x, ids).numpy()[0]
    reference = exact(5001, 8)[[0, 31, 32, 100, 5000]]
    approx = tables.compressed_table(kind, 32, 8, stored_dims=8)
    # Rows past the table are computed (float64 angles, float32 result); inside it they
    # are the stored kind's rows. One call sees all rows computed once an id passes the table.
    np.testing.assert_allclose(out, reference, atol=1e-6)
    inside = layer(x[:, :2], position_ids=ids[:, :2]).numpy()[0]
    np.testing.assert_allclose(inside, approx[[0, 31]], atol=1e-7)
    with pytest.raises(ValueError, match="max_length=32"):
        SinusoidalPositionEmbedding(32, table=kind, stored_dims=8)(x, position_ids=ids)


def test_factorized_mixed_float16_matches_float64_table():
    layer = SinusoidalPositionEmbedding(1024, table="factorized", dtype="mixed_float16")
    out = layer(tf.zeros([1, 1024, 16], tf.float16))
    assert out.dtype == tf.float16
    # Rebuilt in float32 and cast once: the float16 rounding of the exact table, nothing more.
    assert np.abs(out.numpy()[0].astype(np.float64) - exact(1024, 16)).max() <= 2.5e-4


def test_get_config_has_table_and_stored_dims():
    layer = SinusoidalPositionEmbedding(8, table="interpolated", stored_dims=4)
    config = layer.get_config()
    assert config["table"] == "interpolated" and config["stored_dims"] == 4
    assert SinusoidalPositionEmbedding.from_config(config).stored_dims == 4


@pytest.mark.parametrize("kind", ["interpolated", "factorized"])
def test_rows_per_id_and_rebuilt_whole_table_agree(kind):
    # Few ids: rows rebuilt per id; more ids than table rows: the table is rebuilt once and gathered;
    # unknown batch: a tf.cond picks one. All must give the same, bitwise.
    layer = SinusoidalPositionEmbedding(12, table=kind, stored_dims=4)
    ids = tf.constant(np.random.RandomState(2).randint(0, 12, [3, 5]), tf.int32)
    x = tf.zeros([3, 5, 9])
    many = layer(x, position_ids=ids).numpy()  # 15 ids > 12 rows
    few = np.stack([layer(x[:1], position_ids=ids[i:i + 1]).numpy()[0] for i in range(3)])
    dynamic = tf.function(lambda x, ids: layer(x, position_ids=ids),
                          input_signature=[tf.TensorSpec([None, 5, 9]), tf.TensorSpec([None, 5], tf.int32)])
    assert np.array_equal(many, few)
    assert np.array_equal(dynamic(x, ids).numpy(), many) and np.array_equal(dynamic(x[:1], ids[:1]), few[:1])
    np.testing.assert_array_equal(many, tables.compressed_table(kind, 12, 9, stored_dims=4)[ids.numpy()])
