"""A quantized export's quality on held-out text: cross-entropy against the float32 file, greedy agreement."""

import json

import numpy as np
import pytest

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
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(seed)
    model = CausalLM(dict(num_layers=1, d_model=32, num_heads=2, dff=64, vocab_size=VOCAB, max_length=16,
                          dropout=0.0), name="lm")
    model.build_on_dummy()
    return model


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
    from keras_posenc.app import cli

    model, held_out = _run_folder(tmp_path)
    out = str(tmp_path / "q.tflite")
    argv = ["export", str(tmp_path / "model.keras"), "--out", out, "--sequence-length", str(LENGTH),
            "--target", "cpu", "--quantize", "dynamic_int8", "--max-loss-increase", "0"]
    status = cli.main(argv)
    printed = capsys.readouterr().out
    quality = json.load(open(out + ".json"))["quality"]
    assert quality["rows"] == min(len(held_out), cli.EVAL_ROWS)
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
