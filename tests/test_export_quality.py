"""A quantized export's quality on held-out text: cross-entropy against the float32 file, greedy agreement."""

import json

import numpy as np
import pytest
from tiny_lm import tiny_lm

from keras_posenc import export
from keras_posenc.backend import keras, ops
from keras_posenc.export.quality import next_token_cross_entropy
from keras_posenc.export.result import ExportResult

LENGTH = 12
VOCAB = 120


def reference_cross_entropy(logits, token_ids, pad_id):
    """Token by token in float64, with an explicit log-sum-exp."""
    losses = []
    for row, ids in zip(np.asarray(logits, np.float64), token_ids):
        for t in range(len(ids) - 1):
            if ids[t + 1] != pad_id:
                shifted = row[t] - row[t].max()
                losses.append(np.log(np.exp(shifted).sum()) - shifted[ids[t + 1]])
    return float(np.mean(losses)), len(losses)


def test_next_token_cross_entropy_counts_real_targets_only():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal([3, 5, 7]) * 4
    ids = np.array([[2, 3, 4, 0, 0], [2, 6, 1, 5, 3], [2, 0, 0, 0, 0]])
    loss, count = next_token_cross_entropy(logits, ids, pad_id=0)
    expected, expected_count = reference_cross_entropy(logits, ids, 0)
    assert count == expected_count == 2 + 4
    assert loss == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="no real next token"):
        next_token_cross_entropy(logits[2:], ids[2:], pad_id=0)


def _lm(seed=8):
    return tiny_lm(VOCAB, seed)


def _held_out_rows(rows=6, seed=1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, size=[rows, LENGTH]).astype(np.int32)
    for row, length in zip(ids, rng.integers(4, LENGTH + 1, size=rows)):
        row[length:] = 0
    return ids


@pytest.fixture(scope="module")
def lm():
    return _lm()


def test_a_quantized_export_reports_its_held_out_loss_against_float32(lm, tmp_path):
    rows = _held_out_rows()
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="dynamic_int8",
                                     eval_token_ids=rows)
    quality = result.report["quality"]
    # The float32 file's loss is the Keras model's on the same rows.
    keras_logits = ops.convert_to_numpy(lm(rows, training=False))
    expected, count = reference_cross_entropy(keras_logits, rows, pad_id=0)
    assert quality["tokens"] == count and quality["rows"] == len(rows)
    assert quality["loss_float"] == pytest.approx(expected, rel=1e-5)
    assert quality["loss_increase"] == pytest.approx(quality["loss_quantized"] / quality["loss_float"] - 1)
    assert 0.0 < quality["max_abs_diff"] < 1.0  # int8 weights (tensors of 1024 values and more) move logits
    assert 0.5 <= quality["agreement"] <= 1.0
    assert any(line.startswith(f"Held-out text ({len(rows)} rows, {count} next tokens): cross-entropy ")
               for line in result.lines)
    assert result.failures() == [] or quality["loss_increase"] > 0.01
    result.save(str(tmp_path / "m.tflite"))
    saved = json.load(open(tmp_path / "m.tflite.json"))
    assert saved["quality"] == pytest.approx(quality)


def test_without_held_out_rows_the_loss_is_not_measured_and_says_so(lm):
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="dynamic_int8")
    assert result.report["quality"] is None and "quality" not in result.metadata
    assert any("Held-out loss of the quantized file: not measured" in line for line in result.lines)
    float32 = export.export_and_check(lm, sequence_length=LENGTH, target="cpu",
                                      eval_token_ids=_held_out_rows())
    assert "quality" not in float32.report  # nothing quantized, nothing to compare


def test_the_loss_rule_fails_an_increase_above_the_limit_only():
    quality = {"rows": 2, "tokens": 10, "loss_float": 4.0, "loss_quantized": 4.08, "loss_increase": 0.02,
               "agreement": 0.9, "max_abs_diff": 0.1}

    def failures(limit, increase=0.02):
        report = {"parity": 0.1, "quality": dict(quality, loss_increase=increase), "max_loss_increase": limit}
        return ExportResult("cpu", "dynamic_int8", "graph", (b"",), report, [], {}).failures()

    assert failures(0.01) == ["FAILED: the quantized file raises the held-out cross-entropy by 2.00% "
                              "(4.0000 -> 4.0800), over the limit 1.00%."]
    assert failures(0.02) == [] and failures(0.03) == []
    assert failures(0.0, increase=-0.001) == []  # a loss that falls passes any limit
    with pytest.raises(ValueError, match=r"`max_loss_increase` must be >= 0, got max_loss_increase=-0.1"):
        export.export_and_check(_lm(), sequence_length=LENGTH, target="cpu", quantize="float16",
                                max_loss_increase=-0.1)


def _run_folder(tmp_path):
    """A run folder as `train` leaves it: model.keras, spm.model and report.json (embedded corpus)."""
    from keras_posenc.app import dataset as data
    from keras_posenc.models import CausalLM

    texts = data.read_text_corpus(data.default_corpus_path())
    sp_model = data.train_sentencepiece(texts[:400], VOCAB)
    (tmp_path / "spm.model").write_bytes(sp_model)
    keras.utils.set_random_seed(3)
    model = CausalLM(dict(num_layers=1, d_model=32, num_heads=2, dff=64, vocab_size=VOCAB, max_length=16,
                          dropout=0.0), name="lm")
    model.build_on_dummy()
    model.save(str(tmp_path / "model.keras"), save_format="keras_v3")
    config = {"corpus": None, "corpus_format": "text", "eval_fraction": 0.05, "seed": 0,
              "skip_bad_lines": False}
    (tmp_path / "report.json").write_text(json.dumps({"train_config": config}))
    held_out = data.split_corpus(texts, 0.05, seed=0)[1]
    return model, held_out


def test_export_command_measures_the_runs_eval_split_and_applies_the_limit(tmp_path, capsys):
    from keras_posenc.app import cli, run_folder

    model, held_out = _run_folder(tmp_path)
    out = str(tmp_path / "q.tflite")
    argv = ["export", str(tmp_path / "model.keras"), "--out", out, "--sequence-length", str(LENGTH),
            "--target", "cpu", "--quantize", "dynamic_int8", "--max-loss-increase", "0"]
    status = cli.main(argv)
    printed = capsys.readouterr().out
    quality = json.load(open(out + ".json"))["quality"]
    assert quality["rows"] == min(len(held_out), run_folder.EVAL_ROWS)
    assert f"Held-out text ({quality['rows']} rows, {quality['tokens']} next tokens)" in printed
    # With a zero limit the status follows the sign of the measured increase, and the printed rule says why.
    assert status == (1 if quality["loss_increase"] > 0 else 0)
    assert ("FAILED: the quantized file raises the held-out cross-entropy" in printed) == (status == 1)
    # --eval-corpus: these lines instead of the split.
    corpus = tmp_path / "eval.txt"
    corpus.write_text("\n".join(held_out[:3]) + "\n")
    assert cli.main(argv[:-2] + ["--eval-corpus", str(corpus)]) == 0 or quality["loss_increase"] > 0.01
    assert json.load(open(out + ".json"))["quality"]["rows"] == 3
    capsys.readouterr()
    # Bad input: one line, exit 2.
    assert cli.main(argv[:-4] + ["--eval-corpus", str(corpus)]) == 2
    assert "--eval-corpus measures a quantized file: it needs --quantize." in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        cli.main(argv[:-1] + ["-0.5"])
    assert stop.value.code == 2
    assert "expected a number >= 0, got '-0.5'" in capsys.readouterr().err


def _interpreter_logits(flat, rows):
    """Each row through TensorFlow's own interpreter, one call per row, float64."""
    import tensorflow as tf

    interpreter = tf.lite.Interpreter(model_content=flat)
    interpreter.allocate_tensors()
    (ids,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    logits = []
    for row in rows:
        interpreter.set_tensor(ids["index"], row[None].astype(np.int32))
        interpreter.invoke()
        logits.append(interpreter.get_tensor(out["index"])[0].astype(np.float64))
    return np.stack(logits)


def test_quantization_quality_against_both_files_run_row_by_row(lm):
    from keras_posenc.export.model_spec import ModelSpec
    from keras_posenc.export.quality import quantization_quality

    rows = _held_out_rows(rows=5, seed=4)
    float_file = export.export_and_check(lm, sequence_length=LENGTH, target="cpu").exported
    int8_file = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8").exported
    quality = quantization_quality(ModelSpec.of(lm, LENGTH, 1), float_file, int8_file, rows)
    expected_float = _interpreter_logits(float_file, rows)
    expected_quantized = _interpreter_logits(int8_file, rows)
    real = rows != 0
    loss_float, count = reference_cross_entropy(expected_float, rows, 0)
    loss_quantized, _ = reference_cross_entropy(expected_quantized, rows, 0)
    same = expected_float.argmax(-1) == expected_quantized.argmax(-1)
    assert set(quality) == {"rows", "tokens", "loss_float", "loss_quantized", "loss_increase", "agreement",
                            "max_abs_diff"}
    assert (quality["rows"], quality["tokens"]) == (5, count)
    assert quality["loss_float"] == pytest.approx(loss_float, rel=1e-9)
    assert quality["loss_quantized"] == pytest.approx(loss_quantized, rel=1e-9)
    assert quality["loss_increase"] == pytest.approx(loss_quantized / loss_float - 1.0, rel=1e-9, abs=1e-12)
    assert quality["agreement"] == pytest.approx(same[real].mean(), abs=1e-12)
    # the logit error over real positions only: padding positions may differ more
    assert quality["max_abs_diff"] == pytest.approx(np.abs(expected_quantized - expected_float)[real].max(),
                                                    rel=1e-9)
    assert quality["max_abs_diff"] > 0
    with pytest.raises(ValueError) as error:
        quantization_quality(ModelSpec.of(lm, LENGTH, 1), float_file, int8_file, rows[:, :-1])
    assert str(error.value) == f"`token_ids` must be an int array [n, {LENGTH}], got shape (5, {LENGTH - 1})."
    with pytest.raises(ValueError, match=r"got shape \(12,\)"):
        quantization_quality(ModelSpec.of(lm, LENGTH, 1), float_file, int8_file, rows[0])


def test_which_outputs_are_next_token_logits():
    from types import SimpleNamespace

    from keras_posenc.export.quality import outputs_next_token_logits

    spec = SimpleNamespace(vocab_size=120, pad_id=0)
    assert outputs_next_token_logits(spec, (2, 12, 120))
    assert outputs_next_token_logits(spec, [1, 5, np.int64(120)])
    assert not outputs_next_token_logits(spec, (2, 12, 64))  # an encoder's hidden states
    assert not outputs_next_token_logits(spec, (2, 120))
    assert not outputs_next_token_logits(spec, (2, 3, 12, 120))
    assert not outputs_next_token_logits(SimpleNamespace(vocab_size=None, pad_id=0), (2, 12, 120))
    assert not outputs_next_token_logits(SimpleNamespace(vocab_size=120, pad_id=None), (2, 12, 120))


def test_cross_entropy_of_large_logits_and_of_every_dtype():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal([2, 6, 9]) * 400).astype(np.float32)  # exp overflows without the shift
    ids = rng.integers(1, 9, size=[2, 6]).astype(np.int16)
    loss, count = next_token_cross_entropy(logits, ids, pad_id=0)
    expected, expected_count = reference_cross_entropy(logits, ids, 0)
    assert np.isfinite(loss) and count == expected_count == 10
    assert loss == pytest.approx(expected, rel=1e-12)
    # a pad id other than 0 is the one left out
    ids[0, 3:] = 7
    loss, count = next_token_cross_entropy(logits, ids, pad_id=7)
    assert (loss, count) == pytest.approx(reference_cross_entropy(logits, ids, 7), rel=1e-12)
    # the first position is never a target: a padded first token does not hide the next one
    assert next_token_cross_entropy(logits[:1, :2], np.array([[0, 5]]), pad_id=0) == pytest.approx(
        reference_cross_entropy(logits[:1, :2], [[0, 5]], 0), rel=1e-12)
    with pytest.raises(ValueError) as error:
        next_token_cross_entropy(logits[:1], np.array([[5, 0, 0, 0, 0, 0]]), pad_id=0)
    assert str(error.value) == ("The held-out rows have no real next token (all padding after the first "
                                "position).")


_QUALITY = {"rows": 256, "tokens": 6766, "loss_float": 3.82841, "loss_quantized": 3.87094,
            "loss_increase": 0.011108, "agreement": 0.78125, "max_abs_diff": 4.5871}


def test_the_quality_lines():
    from keras_posenc.export.quality import format_generation_quality, format_quality

    assert format_quality(_QUALITY, 0.01) == (
        "Held-out text (256 rows, 6766 next tokens): cross-entropy 3.8709 quantized vs 3.8284 float32 "
        "(+1.11%, limit +1.00%); greedy agreement 78.1%; max abs logit diff 4.59")
    generation = {"prompts": 4, "greedy_tokens": 16, "same_greedy_tokens": False,
                  "generation_agreement": 0.984375}
    assert format_generation_quality(generation, 0.01) == (
        "Greedy generation on 4 prompts x 16 tokens: TOKENS DIFFER from the float32 file; fed float32's "
        "tokens, it picks the same token at 98.4% of the steps")
    same = dict(generation, same_greedy_tokens=True, generation_agreement=1.0, **_QUALITY)
    assert format_generation_quality(same, 0.02) == (
        "Greedy generation on 4 prompts x 16 tokens: same tokens as the float32 file; fed float32's "
        "tokens, it picks the same token at 100.0% of the steps; " + format_quality(_QUALITY, 0.02))


def test_quality_prompts_take_the_first_real_tokens_of_the_first_rows():
    from keras_posenc.export.quality import quality_prompts

    rows = np.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
                     [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                     [3, 0, 4, 0, 0, 0, 0, 0, 0, 0],
                     [9, 9, 0, 0, 0, 0, 0, 0, 0, 0],
                     [1, 2, 0, 0, 0, 0, 0, 0, 0, 0]])
    assert quality_prompts(None, 0, 8) == []
    # at most 8 tokens, the first 4 rows, empty rows dropped, padding inside a row skipped
    assert quality_prompts(rows, 0, 16) == [[5, 6, 7, 8, 9, 10, 11, 12], [3, 4], [9, 9]]
    assert quality_prompts(rows, 0, 3) == [[5, 6, 7], [3, 4], [9, 9]]
    assert quality_prompts(rows, 0, 16, count=5, length=2) == [[5, 6], [3, 4], [9, 9], [1, 2]]
    assert quality_prompts(rows, 9, 16, count=4, length=3) == [[5, 6, 7], [0, 0, 0], [3, 0, 4], [0, 0, 0]]
    assert all(type(token) is int for prompt in quality_prompts(rows, 0, 8) for token in prompt)


def test_the_given_interpreter_runs_both_files(lm):
    import tensorflow as tf

    from keras_posenc.export.model_spec import ModelSpec
    from keras_posenc.export.quality import quantization_quality

    ran = []

    class Recording(tf.lite.Interpreter):
        def __init__(self, model_content):
            ran.append(len(model_content))
            super().__init__(model_content=model_content)

    float_file = export.export_and_check(lm, sequence_length=LENGTH, target="cpu").exported
    int8_file = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8").exported
    quantization_quality(ModelSpec.of(lm, LENGTH, 1), float_file, int8_file, _held_out_rows(rows=2),
                         interpreter=Recording)
    assert sorted(set(ran)) == sorted({len(float_file), len(int8_file)})


def test_language_ids_reach_both_files():
    from keras_posenc.export.model_spec import ModelSpec
    from keras_posenc.export.quality import quantization_quality
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(4)
    model = CausalLM(dict(num_layers=1, d_model=32, num_heads=2, dff=64, vocab_size=VOCAB, max_length=16,
                          dropout=0.0, num_languages=2), name="lm")
    model.build_on_dummy()
    scales = [weight for weight in model.weights if "language_scale" in weight.name]
    assert len(scales) == 1
    scales[0].assign([1.0, 0.25])
    rows = _held_out_rows(rows=3)
    languages = np.repeat(np.array([[1], [0], [1]], np.int32), LENGTH, axis=1)  # the file takes [1, T]
    float_file = export.export_and_check(model, sequence_length=LENGTH, target="cpu").exported
    int8_file = export.export_and_check(model, sequence_length=LENGTH, target="cpu", quantize="int8").exported
    quality = quantization_quality(ModelSpec.of(model, LENGTH, 1), float_file, int8_file, rows, languages)
    keras_logits = ops.convert_to_numpy(model(rows, language_ids=languages, training=False))
    expected, _ = reference_cross_entropy(keras_logits, rows, pad_id=0)
    other, _ = reference_cross_entropy(ops.convert_to_numpy(model(rows, language_ids=1 - languages,
                                                                  training=False)), rows, pad_id=0)
    assert abs(expected - other) > 1e-3  # the languages differ
    assert quality["loss_float"] == pytest.approx(expected, rel=1e-5)


def test_a_host_table_file_is_fed_its_own_rows(lm):
    import tensorflow as tf

    from keras_posenc.export.model_spec import host_embedding_table

    rows = _held_out_rows(rows=4, seed=9)
    result = export.export_and_check(lm, sequence_length=LENGTH, target="gpu", quantize="float16",
                                     eval_token_ids=rows)
    assert result.embedding == "host" and result.host_table.dtype == np.float16
    float_file = export.export_and_check(lm, sequence_length=LENGTH, target="gpu").exported

    def logits(flat, table):
        interpreter = tf.lite.Interpreter(model_content=flat)
        interpreter.allocate_tensors()
        inputs = {detail["name"]: detail["index"] for detail in interpreter.get_input_details()}
        assert set(inputs) == {"token_ids", "embeddings"}
        out = []
        for ids in rows:
            interpreter.set_tensor(inputs["token_ids"], ids[None])
            interpreter.set_tensor(inputs["embeddings"], table[ids][None].astype(np.float32))
            interpreter.invoke()
            out.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"])[0])
        return np.asarray(out, np.float64)

    float_table = host_embedding_table(lm)
    expected_float, _ = reference_cross_entropy(logits(float_file, float_table), rows, 0)
    # the float16 file reads the float16 rows it ships with, not the float32 table
    fed_own, _ = reference_cross_entropy(logits(result.exported, result.host_table), rows, 0)
    fed_float32, _ = reference_cross_entropy(logits(result.exported, float_table), rows, 0)
    assert fed_own != fed_float32
    quality = result.report["quality"]
    assert quality["loss_float"] == pytest.approx(expected_float, rel=1e-9)
    assert quality["loss_quantized"] == pytest.approx(fed_own, rel=1e-9)
