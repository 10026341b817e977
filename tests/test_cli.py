"""The `keras-posenc` command line: train on TSV pairs, inspect, demo flags, clear errors."""

import json
import os

import numpy as np
import pytest
from tensorflow import keras

from keras_posenc import cli, data

PAIRS = [("the house is small", "das Haus ist klein"), ("the cat sleeps", "die Katze schläft"),
         ("I read a book", "ich lese ein Buch"), ("the water is cold", "das Wasser ist kalt"),
         ("we eat bread", "wir essen Brot"), ("the dog runs fast", "der Hund läuft schnell"),
         ("she drinks tea", "sie trinkt Tee"), ("the sun is warm", "die Sonne ist warm")] * 5
TINY_FLAGS = ["--steps", "6", "--batch-size", "4", "--num-layers", "1", "--d-model", "16", "--num-heads", "2",
              "--dff", "32", "--max-length", "24", "--warmup-steps", "4", "--checkpoint-every", "3",
              "--dropout", "0.0", "--lr-scale", "4", "--quiet"]


@pytest.fixture(scope="module")
def tsv_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("tsv") / "en_de.tsv"
    lines = [f"{s}\t{t}" for s, t in PAIRS]
    lines.insert(3, "a line without any tab")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tsv_run(tsv_corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tsv_run"))
    code = cli.main(["train", "--corpus", tsv_corpus, "--format", "tsv", "--skip-bad-lines",
                     "--vocab-size", "60", "--out", out] + TINY_FLAGS)
    assert code == 0
    return out


def test_tsv_training_uses_language_ids_and_two_scales(tsv_run, capsys):
    report = json.load(open(os.path.join(tsv_run, "report.json")))
    assert report["model_config"]["num_languages"] == 2
    assert report["train_examples"] + report["eval_examples"] == len(PAIRS)  # the bad line was skipped
    model = keras.models.load_model(os.path.join(tsv_run, "model.keras"), compile=False)
    scale = model.encoder.embedding.position_embedding.language_scale.numpy()
    assert scale.shape == (2,) and np.all(scale != 1.0)  # both language scales were trained


def test_tsv_line_without_tab_names_the_line(tsv_corpus, tmp_path, capsys):
    code = cli.main(["train", "--corpus", tsv_corpus, "--format", "tsv", "--out", str(tmp_path)] + TINY_FLAGS)
    assert code == 2
    assert "line 4 has no tab" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["train", "--corpus", "no/such/file.txt"], "Corpus file not found: corpus='no/such/file.txt'"),
    (["train", "--format", "tsv"], "--format tsv needs --corpus PATH"),
    (["train", "--corpus", "{empty}"], "is empty"),
    (["train", "--resume"], "--resume was given but"),
    (["train", "--vocab-size", "99999", "--corpus", "{small}"], "vocab_size=99999 is larger than this corpus "
                                                                 "allows"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, message, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "small.txt").write_text("one short line\nand another one\nand a third\n")
    argv = [a.format(empty=tmp_path / "empty.txt", small=tmp_path / "small.txt") for a in argv]
    assert cli.main(argv + ["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-posenc: error: ") and message in err


def test_argument_errors_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--steps", "0"])
    assert exit_info.value.code == 2
    assert "expected a positive integer, got '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["train", "--position", "rotary"])


def test_demo_defaults_use_the_embedded_corpus_and_a_small_model():
    args = cli.build_parser().parse_args(["demo"])
    assert args.out == os.path.join("runs", "demo") and args.steps == cli.DEMO_SETTINGS["steps"]
    assert cli.DEMO_SETTINGS["d_model"] <= 64 and cli.DEMO_SETTINGS["num_layers"] <= 2
    assert os.path.isfile(data.default_corpus_path())


def test_train_flags_map_to_the_config(tmp_path):
    args = cli.build_parser().parse_args(
        ["train", "--corpus", "c.tsv", "--format", "tsv", "--position", "learned", "--table", "factorized",
         "--no-bos", "--strategy", "mirrored", "--seed", "7", "--out", str(tmp_path), "--resume"])
    config = cli._train_config(args)
    assert (config.corpus, config.corpus_format, config.position, config.table) == (
        "c.tsv", "tsv", "learned", "factorized")
    assert (config.add_bos, config.add_eos, config.strategy, config.seed, config.resume) == (
        False, True, "mirrored", 7, True)


def test_inspect_prints_diagnostics_and_writes_plots(tsv_run, capsys):
    out = os.path.join(tsv_run, "inspect_out")
    assert cli.main(["inspect", os.path.join(tsv_run, "model.keras"), "--out", out,
                     "--text", "the house is small", "--text", "we eat bread"]) == 0
    printed = capsys.readouterr().out
    assert "PE value range" in printed and "positional-contribution ratio" in printed
    for name in ("pe_heatmap.png", "attention_by_distance.png", "inspect.json"):
        assert os.path.isfile(os.path.join(out, name))
    summary = json.load(open(os.path.join(out, "inspect.json")))
    assert summary["pe_range"]["ok"] and summary["probe_sentences"] == 2
