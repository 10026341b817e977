"""RoPE and ALiBi models on every export target: constants only (no SIN/COS), parity with Keras."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from stacks import once_on_keras2

from keras_posenc import EncoderLayer, export
from keras_posenc.backend import keras
from keras_posenc.export import formulation, formulations, gl
from keras_posenc.export.shader_ops import rotation_constants
from keras_posenc.layers import RotaryEmbedding
from keras_posenc.models import CausalLM

LENGTH = 10
# A full row, a left-padded row and a right-padded row.
ROWS = np.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
                 [0, 0, 0, 5, 6, 7, 8, 9, 10, 11],
                 [5, 6, 7, 8, 0, 0, 0, 0, 0, 0]], np.int32)
MODELS = {
    "rope": {"position": "rope"},
    "rope-yarn-interleave": {"position": "rope", "position_config": {
        "layout": "interleave", "scaling": "yarn", "scaling_factor": 2.0, "original_length": 8}},
    "alibi": {"position": "alibi"},
    # The shipped YaRN (pair-index ramp, mscale ratio) on half of each head, and Llama 3.1's scaling.
    "rope-yarn-partial": {"position": "rope", "position_config": {
        "scaling": "yarn", "scaling_factor": 4.0, "original_length": 8, "mscale": 1.0, "mscale_all_dim": 0.5,
        "partial_rotary_factor": 0.5}},
    "rope-llama3": {"position": "rope", "position_config": {
        "scaling": "llama3", "scaling_factor": 4.0, "original_length": 64, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0}},
}

# Llama 3.1's scaling changes only the frozen tables' values: the graph is rope's, which runs on both.
EXPORTED = [pytest.param(name, marks=once_on_keras2("the scaling changes only the frozen tables' values; "
                                                    "rope runs on both"))
            if name == "rope-llama3" else name for name in sorted(MODELS)]


def _model(name):
    keras.utils.set_random_seed(0)
    model = CausalLM({"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 20,
                      "max_length": 16, **MODELS[name]})
    model.build_on_dummy()
    return model


@pytest.mark.parametrize("target", ["gpu", "gl", "cpu"])
@pytest.mark.parametrize("name", EXPORTED)
def test_tflite_targets_freeze_positions_and_match_keras(name, target):
    model = _model(name)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
    ops = export.op_counts(flat)
    assert not {"SIN", "COS"} & set(ops), ops
    if target in ("gpu", "gl"):
        assert not {"CUMSUM", "GATHER"} & set(ops), ops
        assert export.gpu_incompatible_ops(flat, backend="webgpu" if target == "gpu" else "gl") == []
    # The gpu/gl targets run batch 1: every row separately.
    parity = max(export.check_parity(model, flat, row[None]) for row in ROWS)
    assert parity <= 1e-5, parity


@pytest.mark.parametrize("name", EXPORTED)
def test_tensorrt_onnx_matches_keras(name):
    _edge_onnx_site_on_path()
    pytest.importorskip("tf2onnx")
    pytest.importorskip("onnxruntime")
    model = _model(name)
    onnx = export.to_onnx(model, sequence_length=LENGTH)
    assert max(export.check_onnx_parity(model, onnx, row[None]) for row in ROWS) <= 1e-4


@pytest.mark.parametrize("config", [{}, {"layout": "interleave", "scaling": "yarn", "scaling_factor": 4.0,
                                         "original_length": 8},
                                    MODELS["rope-yarn-partial"]["position_config"],
                                    {"layout": "interleave", "partial_rotary_factor": 0.5}])
def test_export_rotation_constants_reproduce_the_layer(config):
    layer = EncoderLayer(d_model=16, num_heads=2, dff=8, position="rope", position_config=config)
    cos, sin, turn = rotation_constants(layer.attention, LENGTH)
    q = np.random.default_rng(0).normal(size=[1, LENGTH, 8]).astype(np.float32)
    expected = RotaryEmbedding(**config)(q).numpy()
    np.testing.assert_allclose(q * cos + (q @ turn) * sin, expected, atol=1e-6)


@pytest.mark.parametrize("target", ["cpu", "gl"])
@pytest.mark.parametrize("scaling", [
    {"scaling": "dynamic", "scaling_factor": 2.0, "original_length": 4},
    {"scaling": "longrope", "scaling_factor": 4.0, "original_length": 4, "short_factor": [1.0, 1.2, 1.5, 2.0],
     "long_factor": [1.0, 3.0, 6.0, 9.0]}], ids=lambda s: s["scaling"])
def test_length_dependent_scalings_export_the_tables_of_the_sequence_length(scaling, target):
    keras.utils.set_random_seed(0)
    model = CausalLM({"num_layers": 1, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 20,
                      "max_length": 16, "position": "rope", "position_config": scaling})
    model.build_on_dummy()
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
    assert not {"SIN", "COS"} & set(export.op_counts(flat))
    assert export.check_parity(model, flat, ROWS[:1]) <= 1e-5  # a full row: the Keras call length is T too
    report = export.export_report(model, flat, ROWS[:1], target=target)
    assert len(report["rope_notes"]) == 1 and f"exported length {LENGTH}" in report["rope_notes"][0]
    assert report["rope_notes"][0] in export.format_report(report)


def test_gl_rejects_explicit_position_ids_with_rope():
    model = _model("rope")
    with pytest.raises(ValueError, match="explicit position_ids are not supported"):
        context = formulation.ExportContext(export.target_of("gl"), formulations.FORMULATIONS)
        gl.encoder(context, model.encoder, tf.zeros([1, LENGTH]), position_ids=tf.range(LENGTH)[None])


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _edge_onnx_site_on_path():
    """tf2onnx + onnxruntime of `make test-edge` (tests/edge/runtime/bootstrap.sh), when bootstrapped."""
    edge_dir = os.path.join(ROOT, "tests", "edge")
    if edge_dir not in sys.path:
        sys.path.insert(0, edge_dir)
    from runtime import runtimes

    site = runtimes.onnx_site()
    if os.path.isfile(os.path.join(site, ".stamp")) and site not in sys.path:
        sys.path.append(site)
