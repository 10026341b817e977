"""The held-out quality of a quantized ONNX export, against both files run by onnxruntime directly.

`export_and_check(..., target="tensorrt", quantize="int8", embedding="host")` measures the int8 file
fed its own int8 host rows (dequantized) against the float32 file fed the float32 rows; here each
file runs row by row in an `onnxruntime.InferenceSession` of its own, and the losses, agreement
and logit error are recomputed from those logits.
"""

import os
import sys

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from tiny_lm import tiny_lm  # noqa: E402

from keras_posenc import export  # noqa: E402
from keras_posenc.export.host_table import dequantized_table  # noqa: E402
from keras_posenc.export.quality import next_token_cross_entropy  # noqa: E402

LENGTH = 12
VOCAB = 120


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(VOCAB, seed=8)


def _rows():
    rng = np.random.default_rng(6)
    ids = rng.integers(5, VOCAB, size=[5, LENGTH]).astype(np.int32)
    ids[1, 7:] = 0
    ids[3, 4:] = 0
    return ids


def _onnx_logits(flat, token_ids, table):
    """The file's logits, one row a call: token ids (for the padding mask) and their rows of `table`."""
    import onnxruntime

    session = onnxruntime.InferenceSession(bytes(flat), providers=["CPUExecutionProvider"])
    assert [given.name for given in session.get_inputs()] == ["token_ids", "embeddings"]
    return np.concatenate([session.run(None, {"token_ids": ids[None], "embeddings": table[ids][None]})[0]
                           for ids in token_ids]).astype(np.float64)


def test_int8_onnx_quality_with_host_rows_against_onnxruntime(lm):
    rows = _rows()
    float32 = export.export_and_check(lm, sequence_length=LENGTH, target="tensorrt", embedding="host")
    int8 = export.export_and_check(lm, sequence_length=LENGTH, target="tensorrt", embedding="host",
                                   quantize="int8", eval_token_ids=rows)
    assert isinstance(int8.host_table, dict)  # int8 rows with their scales
    float_logits = _onnx_logits(float32.exported, rows, dequantized_table(float32.host_table))
    int8_logits = _onnx_logits(int8.exported, rows, dequantized_table(int8.host_table))
    quality = int8.report["quality"]
    loss_float, count = next_token_cross_entropy(float_logits, rows, 0)
    loss_int8, _ = next_token_cross_entropy(int8_logits, rows, 0)
    real = rows != 0
    assert (quality["rows"], quality["tokens"]) == (5, count)
    assert quality["loss_float"] == pytest.approx(loss_float, rel=1e-6)
    assert quality["loss_quantized"] == pytest.approx(loss_int8, rel=1e-6)
    same = float_logits.argmax(-1) == int8_logits.argmax(-1)
    assert quality["agreement"] == pytest.approx(same[real].mean())
    assert quality["max_abs_diff"] == pytest.approx(np.abs(int8_logits - float_logits)[real].max(), rel=1e-5)
    assert quality["max_abs_diff"] > 0
