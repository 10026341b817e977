"""The attention projections start at the same scale on Keras 2 and on every Keras 3 backend.

Keras 3.15's `EinsumDense` changed the Glorot fans of `MultiHeadAttention`'s rank-3 kernels
(3.2 times the initial scale at d_model 64 with 4 heads), and the same 300-step run ended 0.6
nats worse on Keras 3 than on Keras 2 (benchmarks/RESULTS.md). The limits here are computed in
numpy float64 from the convolution fans Keras 2 uses; numpy inputs only, so the file also runs
under `KERAS_BACKEND=jax`.
"""

import numpy as np
import pytest

from keras_posenc import EncoderLayer
from keras_posenc.backend import keras


def _receptive_field_glorot_limit(shape):
    receptive = float(np.prod(shape[:-2], dtype=np.float64))
    return np.sqrt(6.0 / ((shape[-2] + shape[-1]) * receptive))


@pytest.mark.parametrize("d_model, num_heads", [(64, 4), (32, 8)])
def test_attention_kernels_use_the_fans_of_keras_2(d_model, num_heads):
    keras.utils.set_random_seed(0)
    layer = EncoderLayer(d_model=d_model, num_heads=num_heads, dff=16, dropout=0.0)
    layer(np.zeros((1, 3, d_model), "float32"))
    kernels = {getattr(w, "path", w.name).split("/")[-2]: np.asarray(w.numpy(), np.float64)
               for w in layer.attention.weights if "kernel" in getattr(w, "path", w.name)}
    assert sorted(kernels) == ["attention_output", "key", "query", "value"]
    head_dim = d_model // num_heads
    for name, kernel in kernels.items():
        expected_shape = (num_heads, head_dim, d_model) if name == "attention_output" else \
            (d_model, num_heads, head_dim)
        assert kernel.shape == expected_shape, name
        limit = _receptive_field_glorot_limit(kernel.shape)
        # Uniform on [-limit, limit]: >= 1,024 draws reach past 0.95 * limit, and the std is limit / sqrt(3).
        assert 0.95 * limit < np.abs(kernel).max() <= limit * (1 + 1e-6), (name, np.abs(kernel).max(), limit)
        assert kernel.std() == pytest.approx(limit / np.sqrt(3.0), rel=0.06), name
