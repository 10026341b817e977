"""`train --task translate` and `keras-posenc translate`: a tiny train -> translate -> score run, and errors.

Trained on the committed slice of the Debian en->de corpus (keras_posenc/app/data/); the scores are
checked against sacrebleu run independently on the files the command wrote.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sacrebleu
from stacks import once_on_keras2

from keras_posenc.app import cli, translation
from keras_posenc.app.dev_scoring import DEV_SCORES_FILE
from keras_posenc.backend import keras
from keras_posenc.seq2seq import Seq2SeqTransformer

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "debian_po_en_de")
TRAIN = os.path.join(DATA, "debian_po_en_de_train_slice.tsv")
DEV = os.path.join(DATA, "debian_po_en_de_dev_slice.tsv")
TEST = os.path.join(DATA, "debian_po_en_de_test_slice.tsv")
TINY = ["--steps", "90", "--checkpoint-every", "30", "--batch-size", "32", "--num-layers", "1",
        "--d-model", "32", "--num-heads", "2", "--dff", "64", "--max-length", "24", "--vocab-size", "300",
        "--dropout", "0.0", "--quiet"]
TRANSLATE = ["train", "--task", "translate", "--format", "tsv", "--corpus", TRAIN, "--dev-corpus", DEV,
             "--dev-sentences", "40"]


def _pairs(path, count):
    with open(path, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f][:count]


@pytest.fixture(scope="module")
def test_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("test_set")
    pairs = _pairs(TEST, 40)
    source, reference = folder / "test.en", folder / "test.de"
    source.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    reference.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return str(source), str(reference)


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("translate_run"))
    code = cli.main(TRANSLATE + ["--out", out] + TINY)
    assert code == 0
    return out


def _translate(run, source, output, *extra):
    return cli.main(["translate", run, "--input", source, "--output", output, *extra])


def test_train_translate_writes_a_translator_and_dev_scores(translate_run):
    report = json.load(open(os.path.join(translate_run, "report.json")))
    assert report["task"] == "translate"
    assert [entry["step"] for entry in report["dev_history"]] == [30, 60, 90]
    best = max(report["dev_history"], key=lambda entry: (entry["bleu"], entry["chrf"]))
    assert (report["dev_best_step"], report["dev_bleu"], report["dev_chrf"]) == \
        (best["step"], best["bleu"], best["chrf"])
    assert report["dev_sentences"] == 40 and report["dev_corpus"] == os.path.basename(DEV)
    assert report["dev_bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.")
    assert report["eval_loss"] < report["unigram_eval_loss"]
    stored = json.load(open(os.path.join(translate_run, "checkpoints", DEV_SCORES_FILE)))
    assert stored == {"history": report["dev_history"], "best": best}
    model = keras.models.load_model(os.path.join(translate_run, "model.keras"), compile=False)
    assert isinstance(model, Seq2SeqTransformer)
    assert (model.num_layers, model.d_model, model.vocab_size) == (1, 32, 300)


def test_the_kept_model_scores_the_reported_dev_bleu(translate_run):
    run = translation.load_translator(translate_run)
    pairs = _pairs(DEV, 40)
    hypotheses, _ = translation.translate_sentences(run, [s for s, _ in pairs], beam_size=1)
    report = json.load(open(os.path.join(translate_run, "report.json")))
    bleu = sacrebleu.corpus_bleu(hypotheses, [[t for _, t in pairs]]).score
    chrf = sacrebleu.corpus_chrf(hypotheses, [[t for _, t in pairs]]).score
    assert (bleu, chrf) == pytest.approx((report["dev_bleu"], report["dev_chrf"]), abs=1e-9)


@pytest.mark.parametrize("beam", ["1", "4"])
def test_translate_scores_equal_sacrebleu_on_the_written_output(translate_run, test_files, tmp_path, capsys,
                                                                beam):
    source, reference = test_files
    output = str(tmp_path / "test.hyp")
    assert _translate(translate_run, source, output, "--reference", reference, "--beam-size", beam,
                      "--json") == 0
    result = json.loads(capsys.readouterr().out)
    hypotheses = open(output, encoding="utf-8").read().splitlines()
    references = open(reference, encoding="utf-8").read().splitlines()
    assert len(hypotheses) == len(references) == result["sentences"] == 40
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score, abs=1e-9)
    assert result["beam_size"] == int(beam) and result["model"] == "Seq2SeqTransformer"
    assert result["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.")


def test_the_scores_print_as_lines_and_stdout_carries_only_translations(translate_run, test_files, capsys):
    source, reference = test_files
    assert _translate(translate_run, source, "-", "--reference", reference, "--beam-size", "2") == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 40
    lines = captured.err.splitlines()
    assert lines[0].startswith("BLEU ") and "tok:13a" in lines[0]
    assert lines[1].startswith("chrF ")
    assert lines[2].startswith("translated 40 sentences in ") and "beam 2, Seq2SeqTransformer" in lines[2]


def test_batching_order_and_empty_lines_change_no_translation(translate_run, test_files, tmp_path):
    source, _ = test_files
    sentences = open(source, encoding="utf-8").read().splitlines()[:12]
    run = translation.load_translator(translate_run)
    alone = [translation.translate_sentences(run, [s], beam_size=3)[0][0] for s in sentences]
    batched, _ = translation.translate_sentences(run, sentences, beam_size=3, batch_size=5)
    assert batched == alone
    with_blank = tmp_path / "blank.en"
    with_blank.write_text("\n".join(sentences[:3] + [""] + sentences[3:6]) + "\n", encoding="utf-8")
    output = tmp_path / "blank.hyp"
    assert _translate(translate_run, str(with_blank), str(output), "--beam-size", "3") == 0
    assert output.read_text(encoding="utf-8").splitlines() == alone[:3] + [""] + alone[3:6]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lm_run"))
    code = cli.main(["train", "--format", "tsv", "--corpus", TRAIN, "--out", out] + TINY)
    assert code == 0
    return out


def test_a_decoder_only_tsv_lm_translates_through_the_same_command(lm_run, test_files, tmp_path, capsys):
    source, reference = test_files
    output = str(tmp_path / "lm.hyp")
    assert _translate(lm_run, source, output, "--reference", reference, "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "CausalLM" and result["sentences"] == 40
    hypotheses = open(output, encoding="utf-8").read().splitlines()
    references = open(reference, encoding="utf-8").read().splitlines()
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
    # Left-padded batches of prefixes give what each prefix gives alone.
    run = translation.load_translator(lm_run)
    sentences = open(source, encoding="utf-8").read().splitlines()[:6]
    alone = [translation.translate_sentences(run, [s], beam_size=2)[0][0] for s in sentences]
    assert translation.translate_sentences(run, sentences, beam_size=2, batch_size=6)[0] == alone


@once_on_keras2("argument and file checks run before any model code; the commands run on both stacks above")
def test_translate_errors_are_one_line_and_write_nothing(translate_run, test_files, tmp_path, capsys):
    source, reference = test_files
    short = tmp_path / "short.de"
    short.write_text("eins\nzwei\n", encoding="utf-8")
    output = tmp_path / "never.hyp"
    cases = [
        ((translate_run, source, str(output), "--reference", str(short)),
         "has 2 lines but the input has 40: give one reference per input line"),
        ((translate_run, source, source), "would overwrite an input: give another file"),
        ((translate_run, str(tmp_path / "missing.en"), str(output)), "no input file at"),
        ((str(tmp_path / "no_run"), source, str(output)), "no model at"),
    ]
    for arguments, message in cases:
        assert _translate(*arguments) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not output.exists()
    assert open(source, encoding="utf-8").read().count("\n") == 40  # the input is untouched


@once_on_keras2("flag defaults are the same on both stacks")
def test_the_command_line_length_penalty_is_translate_sentences_default():
    # cli.py keeps the literal (it imports translation only when a command runs): the two must agree.
    args = cli.build_parser().parse_args(["translate", "run", "--input", "in.txt"])
    assert args.alpha == translation.DEFAULT_LENGTH_PENALTY == 1.0


@once_on_keras2("flag checks run before any model code")
def test_train_translate_flag_errors(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert cli.main(["train", "--task", "translate", "--corpus", TRAIN, "--out", out]) == 2
    assert "'translate' trains on pairs: give --format tsv" in capsys.readouterr().err
    assert cli.main(["train", "--dev-corpus", DEV, "--out", out]) == 2
    assert "--dev-corpus) is scored in BLEU by --task translate only" in capsys.readouterr().err
    assert not os.path.exists(out)


@once_on_keras2("loading and refusing a model file is the same on both stacks")
def test_a_text_lm_is_refused_by_name(tmp_path, capsys):
    out = str(tmp_path / "text_run")
    assert cli.main(["train", "--out", out, "--steps", "2", "--max-length", "16", "--d-model", "16",
                     "--num-heads", "2", "--dff", "16", "--num-layers", "1", "--vocab-size", "200",
                     "--quiet"]) == 0
    capsys.readouterr()
    source = tmp_path / "in.en"
    source.write_text("Open file\n", encoding="utf-8")
    assert _translate(out, str(source), str(tmp_path / "out.de")) == 2
    assert "holds no translator" in capsys.readouterr().err


def test_dev_scoring_keeps_the_best_weights_across_a_resume(translate_run, tmp_path):
    """A resumed run that never beats the earlier best keeps the earlier best's weights (checkpoints/)."""
    import shutil

    out = str(tmp_path / "resumed")
    shutil.copytree(translate_run, out)
    scores_path = os.path.join(out, "checkpoints", DEV_SCORES_FILE)
    stored = json.load(open(scores_path))
    stored["best"] = {"step": 30, "bleu": 1e9, "chrf": 1e9}  # unbeatable: the kept weights must stay
    json.dump(stored, open(scores_path, "w"))
    before = keras.models.load_model(os.path.join(out, "model.keras"), compile=False).get_weights()
    os.remove(os.path.join(out, "model.keras"))  # as a run stopped before its end: checkpoints/ must serve
    longer = [flag if flag != "90" else "120" for flag in TINY]  # --steps 120
    assert cli.main(TRANSLATE + ["--out", out, "--resume"] + longer) == 0
    report = json.load(open(os.path.join(out, "report.json")))
    assert [entry["step"] for entry in report["dev_history"]] == [30, 60, 90, 120]
    assert report["dev_best_step"] == 30 and report["start_step"] == 90
    after = keras.models.load_model(os.path.join(out, "model.keras"), compile=False).get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


@once_on_keras2("the refusal reads the loaded model's class, the same on both stacks")
def test_export_refuses_a_translator_in_one_line(translate_run, tmp_path, capsys):
    out = tmp_path / "model.tflite"
    code = cli.main(["export", os.path.join(translate_run, "model.keras"), "--out", str(out),
                     "--sequence-length", "16"])
    err = capsys.readouterr().err
    assert code == 2 and "holds an encoder-decoder translator (Seq2SeqTransformer): export it with " \
        "`keras-posenc export MODEL --translate`." in err
    assert err.count("\n") == 1 and not out.exists()


def test_export_translate_writes_files_that_translate_as_the_model(translate_run, tmp_path, capsys):
    out = tmp_path / "de.tflite"
    code = cli.main(["export", os.path.join(translate_run, "model.keras"), "--translate", "--target", "cpu",
                     "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "Greedy parity over" in printed and "tokens of 8 sources: same tokens as" in printed
    metadata = json.loads((tmp_path / "de.tflite.json").read_text())
    assert metadata["kind"] == "translate"
    assert (metadata["source_length"], metadata["cache_length"]) == (24, 23)  # max_length, translate's limit
    assert metadata["signature_files"] == dict.fromkeys(("encode", "decode", "decode_beams"), "de.tflite")
    assert metadata["beam_rows"] == 4


def test_export_translate_quantized_is_scored_in_bleu_on_the_dev_pairs(translate_run, tmp_path, capsys):
    code = cli.main(["export", os.path.join(translate_run, "model.keras"), "--translate", "--target", "cpu",
                     "--quantize", "int8", "--dev-sentences", "12", "--out", str(tmp_path / "de.tflite")])
    printed = capsys.readouterr().out
    [line] = [line for line in printed.splitlines() if line.startswith("Quality against float32")]
    assert "(12 sentences, greedy)" in line and "BLEU" in line and "chrF" in line
    quality = json.loads((tmp_path / "de.tflite.json").read_text())["quality"]
    assert code == (1 if quality["bleu_drop"] > 1.0 else 0)


@pytest.mark.parametrize("flags, message", [
    (["--generate"], "--translate exports batch 1 encode/decode files and takes no --generate."),
    (["--sequence-length", "8"], "takes no --sequence-length."),
    (["--target", "gl", "--quantize", "int4"], "the GL delegate does not run 4-bit weights"),
    (["--eval-corpus", "x.tsv"], "--eval-corpus measures a quantized file: it needs --quantize."),
])
def test_export_translate_refusals_are_one_line(translate_run, tmp_path, capsys, flags, message):
    out = tmp_path / "de.tflite"
    code = cli.main(["export", os.path.join(translate_run, "model.keras"), "--translate", "--out", str(out),
                     *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and not out.exists()


MIRRORED_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from keras_posenc.app.train import TrainConfig, train
    config = json.loads(sys.argv[1])
    report = train(TrainConfig(strategy="mirrored", **config))
    print(json.dumps([report["losses"], report["num_replicas"], report["dev_history"]]))
""")


@once_on_keras2("the mirrored step is `--task lm`'s, run on both stacks by tests/test_train.py; this checks "
                "the translator's model and dev scoring under it")
def test_a_mirrored_translate_run_equals_one_device(tmp_path):
    """Two replicas (two logical CPUs) train the translator as one device does, dev scoring included."""
    from keras_posenc.app.train import TrainConfig, train

    config = {"task": "translate", "corpus_format": "tsv", "corpus": TRAIN, "dev_corpus": DEV,
              "dev_sentences": 20, "steps": 6, "checkpoint_every": 3, "batch_size": 8, "num_layers": 1,
              "d_model": 16, "num_heads": 2, "dff": 32, "max_length": 16, "vocab_size": 300, "dropout": 0.0,
              "lr_scale": 4.0, "verbose": 0}
    single = train(TrainConfig(out=str(tmp_path / "one"), **config))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", MIRRORED_SCRIPT,
                             json.dumps({**config, "out": str(tmp_path / "mirrored")})],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    losses, replicas, history = json.loads(result.stdout.strip().splitlines()[-1])
    assert replicas == 2
    # Float summation order is the only difference (see tests/test_train.py's mirrored test).
    np.testing.assert_allclose(losses, single["losses"], rtol=1e-4)
    assert single["losses"][0] != single["losses"][-1]
    steps = [entry["step"] for entry in single["dev_history"]]
    assert [entry["step"] for entry in history] == steps == [3, 6]



@once_on_keras2("file checks of the dev scoring, the same on both stacks")
def test_a_resume_whose_best_weights_are_gone_says_so(translate_run, tmp_path, capsys):
    import shutil

    out = str(tmp_path / "resumed")
    shutil.copytree(translate_run, out)
    scores_path = os.path.join(out, "checkpoints", DEV_SCORES_FILE)
    stored = json.load(open(scores_path))
    stored["best"] = {"step": 30, "bleu": 1e9, "chrf": 1e9}
    json.dump(stored, open(scores_path, "w"))
    os.remove(os.path.join(out, "checkpoints", "dev_best_weights.npz"))
    longer = [flag if flag != "90" else "120" for flag in TINY]
    assert cli.main(TRANSLATE + ["--out", out, "--resume"] + longer) == 2
    err = capsys.readouterr().err
    assert "the best dev score (step 30) has no saved weights" in err and err.count("\n") == 1
