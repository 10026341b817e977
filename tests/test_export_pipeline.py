"""`export_and_check` on the TFLite targets: what one call hands back (ONNX: tests/edge/edge_pipeline.py).

A tiny language model and a tiny embedding model, converted in well under a second each, so that
`make mutation MODULE=keras_posenc/export/pipeline.py` can run these per mutant. Each number a
report carries is recomputed here from the file itself, run by TFLite's interpreter, and the Keras
model, in float64.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_export_quality import reference_cross_entropy
from tiny_lm import tiny_lm, two_language_lm

from keras_posenc import export
from keras_posenc.backend import keras, ops
from keras_posenc.export import window_export
from keras_posenc.export.conversion import EMBEDDINGS
from keras_posenc.export.parity import sample_batch
from keras_posenc.export.targets import TARGETS
from keras_posenc.layers import TokenAndPositionEmbedding

LENGTH = 12
VOCAB = 64
INT8_WEIGHTS = ("int8 weights (dynamic range: per channel for CONV_2D, per tensor or channel for "
                "FULLY_CONNECTED as the converter chooses), float32 activations")


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(VOCAB, seed=5)


def _rows(rows=8, seed=2):
    """Held-out rows: every other row right-padded by 3."""
    ids = np.random.default_rng(seed).integers(5, VOCAB, size=[rows, LENGTH]).astype(np.int32)
    ids[::2, LENGTH - 3:] = 0
    return ids


def _run(flat, ids, table=None, languages=None):
    """The file's outputs, as many rows a call as its batch, float64."""
    interpreter = tf.lite.Interpreter(model_content=flat)
    interpreter.allocate_tensors()
    inputs = {detail["name"]: detail for detail in interpreter.get_input_details()}
    batch = int(interpreter.get_input_details()[0]["shape"][0])
    outputs = []
    for row in range(0, len(ids), batch):
        rows = slice(row, row + batch)
        for name, detail in inputs.items():
            if "embeddings" in name:
                value = table[ids[rows]].astype(np.float32)
            elif "language" in name:
                value = languages[rows]
            else:
                value = ids[rows]
            interpreter.set_tensor(detail["index"], value.astype(detail["dtype"]))
        interpreter.invoke()
        outputs.extend(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    return np.asarray(outputs, np.float64)


def _keras(model, ids, **kwargs):
    return np.asarray(ops.convert_to_numpy(model(ids, training=False, **kwargs)), np.float64)


# Arguments --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-0.01, float("nan")])
def test_a_negative_or_nan_loss_limit_is_refused_naming_it(lm, value):
    with pytest.raises(ValueError) as error:
        export.export_and_check(lm, sequence_length=LENGTH, target="cpu", max_loss_increase=value)
    assert str(error.value) == f"`max_loss_increase` must be >= 0, got max_loss_increase={value!r}."


@pytest.mark.parametrize("shape", [(LENGTH,), (2, LENGTH - 1), (2, LENGTH, 1)])
@pytest.mark.parametrize("argument", ["token_ids", "eval_token_ids"])
def test_rows_of_another_shape_are_refused_naming_the_shape(lm, shape, argument):
    rows = np.ones(shape, np.int32)
    with pytest.raises(ValueError) as error:
        export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8", **{argument: rows})
    assert str(error.value) == f"`token_ids` must be an int array [n, {LENGTH}], got shape {shape}."


def test_an_unknown_embedding_is_refused_naming_the_choices(lm):
    with pytest.raises(ValueError) as error:
        export.export_and_check(lm, sequence_length=LENGTH, target="gpu", embedding="table")
    assert str(error.value) == f"`embedding` must be one of {EMBEDDINGS}, got embedding='table'."


# A float32 export -------------------------------------------------------------------------------
@pytest.mark.parametrize("target, embedding", [("cpu", "graph"), ("gpu", "host"), ("gl", "host")])
def test_the_default_embedding_of_each_target_and_what_the_result_holds(lm, target, embedding):
    result = export.export_and_check(lm, sequence_length=LENGTH, target=target)
    assert (result.target, result.quantize, result.embedding) == (target, None, embedding)
    assert len(result.models) == 1 and result.models[0][4:8] == b"TFL3"
    assert result.description == f"target {target}, quantize=none, batch 1 x length {LENGTH}"
    assert result.lines[0] == "Op histogram:" and result.failures() == []
    assert result.report["target"] == target
    assert len(result.report["verdict_lines"]) == len(TARGETS[target].backends)
    assert result.metadata["cost"] == result.report["cost"]
    assert result.metadata["embedding"] == embedding and result.metadata["quantize"] is None
    assert "quantization" not in result.metadata and "quality" not in result.metadata
    assert "quality" not in result.report and "max_loss_increase" not in result.report
    table = export.host_embedding_table(lm)
    if embedding == "host":
        np.testing.assert_array_equal(result.host_table, table)
        assert result.host_table.dtype == np.float32
        assert result.lines[-1] == (
            "Embedding: host (float32 rows); the runner feeds the rows of FILE.embeddings.npy[token_ids] as "
            "`embeddings` (export/jetson/run_tflite.py and run_tensorrt.py do)")
        assert result.metadata["inputs"] == ["token_ids", "embeddings"]
    else:
        assert result.host_table is None and not any(line.startswith("Embedding") for line in result.lines)
        assert result.metadata["inputs"] == ["token_ids"]
    rows = _rows()
    assert _run(result.exported, rows, table) == pytest.approx(_keras(lm, rows), abs=1e-4)


def test_the_default_target_is_gpu(lm):
    result = export.export_and_check(lm, sequence_length=LENGTH)
    assert (result.target, result.embedding, result.metadata["target"]) == ("gpu", "host", "gpu")


def test_the_graph_embedding_can_be_asked_for_on_a_gpu_target(lm):
    result = export.export_and_check(lm, sequence_length=LENGTH, target="gpu", embedding="graph")
    assert result.embedding == "graph" and result.host_table is None
    assert result.metadata["inputs"] == ["token_ids"]


def test_the_parity_is_measured_on_the_given_rows(lm):
    """int8 weights: the parity depends on the rows; int64 ids are taken as int32."""
    rows = _rows(rows=3, seed=11).astype(np.int64)
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8",
                                     token_ids=rows)
    difference = np.abs(_run(result.exported, rows) - _keras(lm, rows.astype(np.int32)))
    expected = difference[rows != 0].max()
    assert result.parity == pytest.approx(expected, rel=1e-4)
    assert result.report["parity_all"] == pytest.approx(difference.max(), rel=1e-4)
    sampled = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8")
    assert abs(sampled.parity - expected) > 1e-3 * expected  # the rows decide the figure


@pytest.mark.parametrize("batch", [1, 2])
def test_without_rows_the_parity_runs_four_sampled_rows_per_batch_row(batch, monkeypatch):
    """`sample_token_batch` rows (seed 0), 4 per exported batch row."""
    lm = tiny_lm(VOCAB, seed=11)
    counts = []

    def counted(spec, **kwargs):
        counts.append(kwargs.get("rows"))
        return sample_batch(spec, **kwargs)

    monkeypatch.setattr(window_export, "sample_batch", counted)
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8",
                                     batch_size=batch)
    assert counts == [4 * batch]
    assert result.description == f"target cpu, quantize=int8, batch {batch} x length {LENGTH}"
    assert result.metadata["batch_size"] == batch

    def parity_of(count):
        rows, _ = export.sample_token_batch(lm, LENGTH, rows=count)
        return np.abs(_run(result.exported, rows) - _keras(lm, rows))[rows != 0].max()

    assert result.parity == pytest.approx(parity_of(4 * batch), rel=1e-4)


@pytest.mark.parametrize("language_shape", [(), (None,)])
def test_language_ids_default_to_zeros_of_the_models_rank(language_shape):
    """Given rows and no language ids: language 0, per sample ([n]) or per token ([n, T])."""
    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    languages = keras.Input(shape=language_shape, dtype="int32", name="language_ids")
    layer = TokenAndPositionEmbedding(40, 16, 16, dropout=0.0, num_languages=2)
    model = keras.Model([ids, languages], layer(ids, language_ids=languages))
    [scale] = [weight for weight in model.weights if "language_scale" in weight.name]
    scale.assign([1.0, 0.25])
    rows = np.random.default_rng(4).integers(1, 40, size=[3, LENGTH]).astype(np.int32)
    result = export.export_and_check(model, sequence_length=LENGTH, target="cpu", token_ids=rows)
    assert result.parity < 1e-5 and result.metadata["num_languages"] == 2
    assert result.metadata["inputs"] == ["token_ids", "language_ids"]


# Quantized exports ------------------------------------------------------------------------------
def test_a_quantized_export_names_its_recipe_first_and_says_when_the_loss_is_not_measured(lm):
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8",
                                     max_loss_increase=0.0)
    assert result.quantize == "int8" and result.metadata["quantize"] == "int8"
    assert result.description == f"target cpu, quantize=int8, batch 1 x length {LENGTH}"
    assert result.lines[0] == f"Quantized by TFLite converter: {INT8_WEIGHTS}"
    assert result.metadata["quantization"] == {"precision": "int8", "tool": "TFLite converter",
                                               "weights": INT8_WEIGHTS, "runtime": "tflite"}
    assert result.report["quality"] is None and "quality" not in result.metadata
    assert result.report["max_loss_increase"] == 0.0 and result.failures() == []
    assert result.lines[-1] == (
        "Held-out loss of the quantized file: not measured (pass eval_token_ids; the CLI reads the run's "
        "eval split or --eval-corpus; a model whose output is not next-token logits has none)")


def test_the_held_out_loss_of_both_files_and_the_limit_applied(lm):
    """The float32 file's loss is the Keras model's; the quantized one's is its own file's."""
    rows = _rows()
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8",
                                     eval_token_ids=rows, max_loss_increase=0.5)
    quality = result.report["quality"]
    keras_loss, count = reference_cross_entropy(_keras(lm, rows), rows, pad_id=0)
    file_loss, _ = reference_cross_entropy(_run(result.exported, rows), rows, pad_id=0)
    assert (quality["rows"], quality["tokens"], count) == (8, 4 * 11 + 4 * 8, 76)
    assert quality["loss_float"] == pytest.approx(keras_loss, rel=1e-5)
    float32_file = export.export_and_check(lm, sequence_length=LENGTH, target="cpu").exported
    float32_loss, _ = reference_cross_entropy(_run(float32_file, rows), rows, pad_id=0)
    assert quality["loss_float"] == pytest.approx(float32_loss, rel=1e-10)  # the same target's file
    assert quality["loss_quantized"] == pytest.approx(file_loss, rel=1e-6)
    assert file_loss != pytest.approx(keras_loss, rel=1e-7)
    assert result.metadata["quality"] == quality and result.report["max_loss_increase"] == 0.5
    assert result.lines[-1].startswith("Held-out text (8 rows, 76 next tokens): cross-entropy ")
    assert result.lines[-1].endswith(f"limit +50.00%); greedy agreement {100 * quality['agreement']:.1f}%; "
                                     f"max abs logit diff {quality['max_abs_diff']:.3g}")
    assert result.failures() == []
    # A limit of 0 fails any rise: the first held-out rows on which the int8 file's loss rises.
    risen = next(candidate for candidate in (_rows(seed=seed) for seed in range(2, 12))
                 if reference_cross_entropy(_run(result.exported, candidate), candidate, pad_id=0)[0]
                 > reference_cross_entropy(_run(float32_file, candidate), candidate, pad_id=0)[0])
    strict = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8",
                                     eval_token_ids=risen, max_loss_increase=0.0)
    assert strict.report["quality"]["loss_increase"] > 0
    assert len(strict.failures()) == 1 and "held-out cross-entropy" in strict.failures()[0]


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_a_float16_host_table_is_stored_and_fed_to_the_quantized_file(lm, target):
    rows = _rows(rows=4, seed=9)
    result = export.export_and_check(lm, sequence_length=LENGTH, target=target, quantize="float16",
                                     eval_token_ids=rows, token_ids=rows)
    table = export.host_embedding_table(lm)
    assert result.embedding == "host" and result.host_table.dtype == np.float16
    np.testing.assert_array_equal(result.host_table, table.astype(np.float16))
    assert result.lines[0] == "Quantized by TFLite converter: float16 weights, float32 compute"
    assert result.lines[-1].startswith("Embedding: host (float16 rows); the runner feeds the rows of "
                                       "FILE.embeddings.npy[token_ids]")
    assert result.lines[-2].startswith("Held-out text (4 rows, ")
    quality = result.report["quality"]
    own, _ = reference_cross_entropy(_run(result.exported, rows, result.host_table), rows, pad_id=0)
    float32_rows, _ = reference_cross_entropy(_run(result.exported, rows, table), rows, pad_id=0)
    assert own != pytest.approx(float32_rows, rel=1e-9)  # the float16 rows make a difference (~6e-8)
    assert quality["loss_quantized"] == pytest.approx(own, rel=1e-10)
    keras_loss, _ = reference_cross_entropy(_keras(lm, rows), rows, pad_id=0)
    assert quality["loss_float"] == pytest.approx(keras_loss, rel=1e-5)
    # The parity is measured with the file's own rows too.
    real = rows != 0
    own_parity = np.abs(_run(result.exported, rows, result.host_table) - _keras(lm, rows))[real].max()
    float32_parity = np.abs(_run(result.exported, rows, table) - _keras(lm, rows))[real].max()
    assert result.parity == pytest.approx(own_parity, rel=1e-4)
    assert float32_parity != pytest.approx(own_parity, rel=1e-3)


@pytest.fixture(scope="module")
def language_lm():
    return two_language_lm(VOCAB)


def test_given_language_ids_are_the_ones_checked(language_lm):
    """int8 weights: the parity shows which language ids were fed."""
    model, rows = language_lm, _rows(rows=3, seed=5)
    ones = np.ones_like(rows)
    result = export.export_and_check(model, sequence_length=LENGTH, target="cpu", quantize="int8",
                                     token_ids=rows, language_ids=ones)

    def parity_with(languages):
        keras_outputs = _keras(model, rows, language_ids=languages)
        return np.abs(_run(result.exported, rows, languages=languages) - keras_outputs)[rows != 0].max()

    assert result.parity == pytest.approx(parity_with(ones), rel=1e-4)
    assert parity_with(0 * ones) != pytest.approx(result.parity, rel=1e-3)


def test_a_language_model_s_held_out_loss_is_measured_in_language_0(language_lm):
    model, rows = language_lm, _rows()
    result = export.export_and_check(model, sequence_length=LENGTH, target="cpu", quantize="int8",
                                     eval_token_ids=rows)
    zeros = np.zeros_like(rows)
    expected, _ = reference_cross_entropy(_keras(model, rows, language_ids=zeros), rows, pad_id=0)
    other, _ = reference_cross_entropy(_keras(model, rows, language_ids=zeros + 1), rows, pad_id=0)
    assert result.report["quality"]["loss_float"] == pytest.approx(expected, rel=1e-5)
    assert other != pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("target", ["gpu", "gl"])
def test_a_float16_file_with_the_graph_lookup_is_measured_against_the_same_kind_of_file(lm, target):
    rows = _rows(rows=4, seed=9)
    result = export.export_and_check(lm, sequence_length=LENGTH, target=target, quantize="float16",
                                     embedding="graph", eval_token_ids=rows)
    assert result.embedding == "graph" and result.host_table is None
    assert not any(line.startswith("Embedding") for line in result.lines)
    float32_file = export.export_and_check(lm, sequence_length=LENGTH, target=target,
                                           embedding="graph").exported
    float32_loss, _ = reference_cross_entropy(_run(float32_file, rows), rows, pad_id=0)
    assert result.report["quality"]["loss_float"] == pytest.approx(float32_loss, rel=1e-10)
