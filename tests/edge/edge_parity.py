"""`keras_posenc.export.parity` on ONNX files: `check_onnx_parity`, `run_onnx`, `onnx_input_names`.

Each figure is recomputed from the file run here in an `onnxruntime.InferenceSession` of this test,
fed by input name as many rows a call as the file's batch, against the Keras model in float64
(tests/test_export_parity.py does the same for the TFLite functions). A float16 file, whose error
depends on the rows and positions fed, so that real tokens and padding positions tell apart.
"""

import os
import sys
import warnings

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from test_export_parity import (  # noqa: E402
    INPUT_IDS,
    INPUT_ROLES,
    LANGUAGES,
    LENGTH,
    POSITIONS,
    SEGMENTS,
    VOCAB,
    _embedding_model,
    _keras,
    _real_and_every,
    _sparse_rows,
)
from tiny_lm import tiny_lm  # noqa: E402

from keras_posenc import export  # noqa: E402
from keras_posenc.export import parity, runners, targets  # noqa: E402


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(VOCAB, seed=5)


@pytest.fixture(scope="module")
def host_onnx(edge, lm):
    """float16 weights (no calibration rows: only int8 calibrates), batch 2, `embedding="host"`: inputs
    `token_ids` and `embeddings`."""
    return export.to_onnx(lm, sequence_length=LENGTH, batch_size=2, embedding="host", quantize="float16")


@pytest.fixture(scope="module")
def inputs_model():
    return _embedding_model(num_languages=2, language_shape=(None,), takes=("segment_ids", "position_ids"))


@pytest.fixture(scope="module")
def inputs_onnx(edge, inputs_model):
    return export.to_onnx(inputs_model, sequence_length=LENGTH)


def _session(flat):
    import onnxruntime

    return onnxruntime.InferenceSession(bytes(flat), providers=["CPUExecutionProvider"])


def _onnx_run(flat, arrays):
    """The file's first output, by input name, as many rows a call as its batch, float64."""
    session = _session(flat)
    batch = int(session.get_inputs()[0].shape[0])
    outputs = []
    for start in range(0, len(arrays["token_ids"]), batch):
        feeds = {}
        for detail in session.get_inputs():
            dtype = np.float32 if detail.type == "tensor(float)" else np.int32
            feeds[detail.name] = np.asarray(arrays[detail.name][start:start + batch], dtype)
        outputs.extend(session.run(None, feeds)[0])
    return np.asarray(outputs, np.float64)


def _host(lm, rows, table=None):
    table = export.host_embedding_table(lm) if table is None else table
    return {"token_ids": rows, "embeddings": table[rows]}


def _rows(count, seed=2):
    rows = np.random.default_rng(seed).integers(1, VOCAB, size=(count, LENGTH)).astype(np.int32)
    rows[::2, LENGTH - 4:] = 0
    return rows


def test_onnx_parity_is_the_largest_difference_on_real_tokens_and_with_padding(lm, host_onnx):
    rows = _sparse_rows()
    real, every = _real_and_every(_onnx_run(host_onnx, _host(lm, rows)), _keras(lm, rows), rows)
    assert every > 1.002 * real > 0  # the padding positions err more: leaving them out shows (Keras 3: 0.6%)
    assert export.check_onnx_parity(lm, host_onnx, rows) == pytest.approx(real, rel=1e-5)
    assert export.check_onnx_parity(lm, host_onnx, rows.astype(np.int64).tolist(),
                                    ignore_padding=False) == pytest.approx(every, rel=1e-5)
    spec = export.ModelSpec.of(lm, LENGTH, 1)
    got = parity.parity(spec, host_onnx, rows, file_format=targets.ONNX)
    assert got == pytest.approx((real, every), rel=1e-5)


def test_onnx_parity_feeds_the_table_given(lm, host_onnx):
    """A float16-rounded table (a quantized export's): its rows, not the model's, are fed."""
    rows = _sparse_rows()
    table = export.host_embedding_table(lm).astype(np.float16).astype(np.float64)
    expected = _keras(lm, rows)
    own = _real_and_every(_onnx_run(host_onnx, _host(lm, rows, table)), expected, rows)
    models = _real_and_every(_onnx_run(host_onnx, _host(lm, rows)), expected, rows)
    assert own[0] != pytest.approx(models[0], rel=1e-3)  # the table makes a difference
    spec = export.ModelSpec.of(lm, LENGTH, 1)
    got = parity.parity(spec, host_onnx, rows, file_format=targets.ONNX, table=table)
    assert got == pytest.approx(own, rel=1e-5)


def test_onnx_language_position_and_segment_ids_reach_the_file(inputs_model, inputs_onnx):
    arrays = dict(zip(INPUT_ROLES, (INPUT_IDS, LANGUAGES, SEGMENTS, POSITIONS)))
    expected = _keras(inputs_model, INPUT_IDS, LANGUAGES, SEGMENTS, POSITIONS)
    real, every = _real_and_every(_onnx_run(inputs_onnx, arrays), expected, INPUT_IDS)
    kwargs = dict(position_ids=POSITIONS, segment_ids=SEGMENTS)
    got = export.check_onnx_parity(inputs_model, inputs_onnx, INPUT_IDS, LANGUAGES, **kwargs)
    assert got == pytest.approx(real, rel=1e-4, abs=1e-9) and got <= 1e-5
    assert export.check_onnx_parity(inputs_model, inputs_onnx, INPUT_IDS, LANGUAGES, ignore_padding=False,
                                    **kwargs) == pytest.approx(every, rel=1e-4, abs=1e-9)
    for role, other in (("language_ids", 1 - LANGUAGES), ("position_ids", POSITIONS[::-1])):
        assert np.abs(_onnx_run(inputs_onnx, dict(arrays, **{role: other})) - expected).max() > 0.1, role
    for missing in ("language_ids", "position_ids", "segment_ids"):
        given = {"language_ids": LANGUAGES, **kwargs}
        del given[missing]
        with pytest.raises(ValueError) as error:
            export.check_onnx_parity(inputs_model, inputs_onnx, INPUT_IDS, **given)
        assert str(error.value) == f"Model '{inputs_model.name}' takes {INPUT_ROLES}: pass `{missing}`."


@pytest.mark.parametrize("ids", [np.ones(LENGTH, np.int32), np.ones((2, LENGTH, 1), np.int32),
                                 np.ones((2, LENGTH), np.float32)], ids=["1-D", "3-D", "float32"])
def test_onnx_token_ids_of_another_rank_or_dtype_are_refused_naming_them(lm, host_onnx, ids):
    with pytest.raises(ValueError) as error:
        export.check_onnx_parity(lm, host_onnx, ids)
    assert str(error.value) == (f"`token_ids` must be an int array [batch, length], got shape {ids.shape} "
                                f"and dtype {ids.dtype}.")


@pytest.fixture
def providers(monkeypatch):
    """The `providers` each `onnxruntime.InferenceSession` is made with, from now on."""
    import onnxruntime

    made = []

    class Recorded(onnxruntime.InferenceSession):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("providers"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Recorded)
    return made


def test_onnx_input_names_are_onnxruntime_s_on_the_cpu_without_a_warning(host_onnx, inputs_onnx, providers):
    """On the CPU provider: onnxruntime's default would put CUDA first where a GPU build is installed."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unknown execution provider warns and falls back
        assert runners.onnx_input_names(host_onnx) == ["token_ids", "embeddings"]
        assert runners.onnx_input_names(inputs_onnx) == INPUT_ROLES
    assert runners.onnx_input_names(host_onnx) == [detail.name for detail in _session(host_onnx).get_inputs()]
    assert providers == [["CPUExecutionProvider"]] * 4


def test_run_onnx_runs_chunks_of_the_file_s_batch_with_the_inputs_dtypes(lm, host_onnx, monkeypatch,
                                                                        providers):
    import onnxruntime

    rows = _rows(6)
    host = _host(lm, rows)
    expected = _onnx_run(host_onnx, host)
    calls = []
    run = onnxruntime.InferenceSession.run

    def counted(self, outputs, feeds, *args, **kwargs):
        calls.append({name: (value.shape, value.dtype) for name, value in feeds.items()})
        return run(self, outputs, feeds, *args, **kwargs)

    monkeypatch.setattr(onnxruntime.InferenceSession, "run", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # int64 ids and float64 rows: fed as the file's int32 and float32.
        got = export.run_onnx(host_onnx, [rows.astype(np.int64), host["embeddings"]])
    assert got.shape == (6, LENGTH, VOCAB)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert calls == [{"token_ids": ((2, LENGTH), np.int32), "embeddings": ((2, LENGTH, 32), np.float32)}] * 3
    assert providers == [["CPUExecutionProvider"]] * 2  # the test's own session, then run_onnx's
    # Roles in any order; without roles, the file's order.
    reordered = export.run_onnx(host_onnx, [host["embeddings"], rows], ["embeddings", "token_ids"])
    np.testing.assert_allclose(reordered, expected, rtol=1e-6, atol=1e-6)


def test_run_onnx_refuses_feeds_that_do_not_fit_naming_the_input(lm, host_onnx):
    rows = _rows(5)
    host = _host(lm, rows)
    with pytest.raises(ValueError) as error:
        export.run_onnx(host_onnx, [rows, host["embeddings"]])
    assert str(error.value) == (f"Input 'token_ids' of shape (5, {LENGTH}) does not fit the exported shape "
                                f"(2, {LENGTH}) (same length, batch a multiple of it).")
    with pytest.raises(ValueError) as error:
        export.run_onnx(host_onnx, [rows[:4]])
    assert str(error.value) == "The ONNX model has 2 inputs, got 1 arrays."
    with pytest.raises(ValueError) as error:
        export.run_onnx(host_onnx, [rows[:4], host["embeddings"][:4, :, :16]])
    assert str(error.value) == (f"Input 'embeddings' of shape (4, {LENGTH}, 16) does not fit the exported "
                                f"shape (2, {LENGTH}, 32) (same length, batch a multiple of it).")
    with pytest.raises(ValueError) as error:
        export.run_onnx(host_onnx, [rows[:2], _host(lm, _rows(4))["embeddings"]])
    assert str(error.value) == ("Input 'embeddings' has 4 rows, input 'token_ids' 2: every input needs one "
                                "row per token row.")
