"""The `keras-posenc` command line: train on TSV pairs, inspect, demo flags, clear errors."""

import argparse
import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from stacks import once_on_keras2

from keras_posenc.app import cli, cli_train
from keras_posenc.app import dataset as data
from keras_posenc.app import train as train_lib
from keras_posenc.app.cli_flags import config_from_flags
from keras_posenc.app.train import TrainConfig
from keras_posenc.app.train_strategy import JIT_COMPILE, STRATEGIES
from keras_posenc.backend import keras
from keras_posenc.export import TARGETS
from keras_posenc.layers.encoder import NAMED_POSITIONS
from keras_posenc.tables import TABLE_KINDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
    assert args.out == os.path.join("runs", "demo") and args.steps == cli_train.DEMO_SETTINGS["steps"]
    assert cli_train.DEMO_SETTINGS["d_model"] <= 64 and cli_train.DEMO_SETTINGS["num_layers"] <= 2
    assert os.path.isfile(data.default_corpus_path())


def test_train_flags_map_to_the_config(tmp_path):
    args = cli.build_parser().parse_args(
        ["train", "--corpus", "c.tsv", "--format", "tsv", "--position", "learned", "--table", "factorized",
         "--no-bos", "--strategy", "mirrored", "--seed", "7", "--out", str(tmp_path), "--resume", "--quiet"])
    config = config_from_flags(args, TrainConfig())
    assert (config.corpus, config.corpus_format, config.position, config.table) == (
        "c.tsv", "tsv", "learned", "factorized")
    assert (config.add_bos, config.add_eos, config.strategy, config.seed, config.resume, config.verbose) == (
        False, True, "mirrored", 7, True, 0)
    assert config_from_flags(cli.build_parser().parse_args(["train"]), TrainConfig()) == TrainConfig()


def _actions(argv):
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in subparsers.choices[argv]._actions if a.dest != "help"}


def test_every_config_field_is_a_flag_with_the_modules_own_choices():
    actions = _actions("train")
    for command in ("train", "demo", "export", "inspect", "ablate"):  # shown before TensorFlow loads
        assert _actions(command)["runtime_logs"].option_strings == ["--verbose"]
    del actions["runtime_logs"]
    assert set(actions) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert actions["jit_compile"].choices == list(JIT_COMPILE) == ["auto", "on", "off"]
    assert actions["position"].choices == list(NAMED_POSITIONS)
    assert actions["table"].choices == list(TABLE_KINDS)
    assert actions["corpus_format"].choices == list(data.FORMATS)
    assert actions["strategy"].choices == list(STRATEGIES)
    assert _actions("export")["target"].choices == TARGETS
    demo = _actions("demo")
    assert set(demo) == {"out", "steps", "seed", "verbose", "runtime_logs"}
    assert demo["out"].default == cli_train.DEMO_OUT
    assert demo["steps"].default == cli_train.DEMO_SETTINGS["steps"]


def _help_entries(text):
    """`{flag: its help text}` of an argparse help listing (continuation lines joined)."""
    entries, flag = {}, None
    for line in text.splitlines():
        match = re.match(r"^  (--?[\w-]+)", line)
        if match:
            flag = match.group(1)
            entries[flag] = line
        elif flag and line.startswith("    "):
            entries[flag] += " " + line.strip()
        else:
            flag = None
    return {flag: " ".join(entry.split()) for flag, entry in entries.items()}


@pytest.mark.parametrize("command", ["train", "demo", "export", "ablate", "inspect", "generate"])
def test_help_shows_every_default(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    entries = _help_entries(capsys.readouterr().out)
    optional = [a for a in _actions(command).values() if a.option_strings and not a.required]
    assert {a.option_strings[0] for a in optional} <= set(entries)
    for action in optional:
        assert "(default: " in entries[action.option_strings[0]], entries[action.option_strings[0]]
    if command == "train":
        assert entries["--warmup-steps"].endswith("learning-rate warmup steps (default: min(4000, max(1, "
                                                  "steps // 2)), so short runs leave warmup)")
        assert entries["--d-model"] == "--d-model D_MODEL model width (default: 64)"
        assert entries["--no-bos"] == "--no-bos do not start sequences with <s> (default: off)"


def _env_with_tensorflows_own_log_level():
    """This environment without TF_CPP_MIN_LOG_LEVEL, the checkout first on the path."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"]])
def test_help_prints_no_tensorflow_log_line(argv):
    env = _env_with_tensorflows_own_log_level()
    result = subprocess.run([sys.executable, "-m", "keras_posenc.app.cli"] + argv, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "keras-posenc" in result.stdout
    assert result.stderr == ""


def test_importing_the_library_leaves_tensorflows_log_level_as_it_was():
    env = _env_with_tensorflows_own_log_level()
    code = "import os, {}; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))"
    levels = [subprocess.run([sys.executable, "-c", code.format(module)], env=env, capture_output=True,
                             text=True, timeout=120).stdout.strip()
              for module in ("tensorflow", "keras_posenc")]
    assert levels[0] == levels[1] != "2"


def test_train_and_export_print_no_runtime_log_line(tsv_corpus, tmp_path):
    """The command's stderr holds its own lines only: no TensorFlow, absl, XLA or TFLite line, no
    library warning (TF 2.21 on a machine without a GPU driver logs `failed call to cuInit`, its
    tf.data logs `use_unbounded_threadpool` lines, TFLite an XNNPACK `INFO` line)."""
    env = _env_with_tensorflows_own_log_level()
    out = str(tmp_path / "run")
    flags = [f for f in TINY_FLAGS]
    flags[flags.index("--steps") + 1] = "2"
    flags[flags.index("--warmup-steps") + 1] = "2"  # the package's own warning still shows
    command = [sys.executable, "-m", "keras_posenc.app.cli"]
    train = subprocess.run(command + ["train", "--corpus", tsv_corpus, "--format", "tsv", "--skip-bad-lines",
                                      "--vocab-size", "60", "--out", out] + flags,
                           env=env, capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr[-3000:]
    assert train.stderr.splitlines() == [
        "keras-posenc: warning: --warmup-steps 2 >= --steps 2: the learning rate never leaves warmup and the "
        "run may learn little. Leave --warmup-steps out to use 1 (half the steps)."]
    export = subprocess.run(command + ["export", os.path.join(out, "model.keras"), "--out",
                                       str(tmp_path / "m.tflite"), "--sequence-length", "8"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert export.returncode == 0 and "Parity vs Keras" in export.stdout, export.stderr[-3000:]
    assert export.stderr == ""
    generate = subprocess.run(command + ["generate", out, "--prompt", "the cat", "--max-new-tokens", "3",
                                         "--language", "1"],
                              env=env, capture_output=True, text=True, timeout=300)
    assert generate.returncode == 0 and "time to first token" in generate.stdout, generate.stderr[-3000:]
    assert generate.stderr == ""


def test_demo_trains_the_demo_config_and_calls_the_exporter(monkeypatch, tmp_path, capsys):
    calls = {}

    def fake_train(config):
        calls["config"] = config
        return {"steps": config.steps, "final_train_loss": 1.0, "eval_loss": 2.0, "eval_perplexity": 7.4,
                "unigram_eval_loss": 3.0, "unigram_eval_perplexity": 20.1, "tokens_per_second": None,
                "beats_unigram": True, "warmup_steps": config.warmup_steps}

    def fake_export(model_path, out, sequence_length, **options):
        calls["export"] = (model_path, out, sequence_length, options)
        return 0

    def fake_generation(run, prompt, **generation):
        calls["generate"] = (run, prompt, generation)

    monkeypatch.setattr(train_lib, "train", fake_train)
    monkeypatch.setattr(cli_train, "export_command", fake_export)
    monkeypatch.setattr(cli_train, "print_generation", fake_generation)
    out = str(tmp_path / "demo")
    assert cli.main(["demo", "--out", out, "--steps", "7", "--quiet"]) == 0
    expected = dataclasses.replace(TrainConfig(**cli_train.DEMO_SETTINGS), out=out, steps=7, verbose=0)
    assert calls["config"] == expected
    assert calls["export"] == (os.path.join(out, "model.keras"), os.path.join(out, "model.tflite"),
                               cli_train.DEMO_SETTINGS["max_length"], {"require_gpu": True})
    assert calls["generate"] == (out, cli_train.DEMO_PROMPT, {"max_new_tokens": cli_train.DEMO_NEW_TOKENS})
    assert all("argparse.Namespace" not in inspect.getsource(module) for module in (cli, cli_train))


@once_on_keras2("the comparison and the warning are the report's, plain Python over train()'s losses; the "
                "training that makes them runs on both stacks in test_train.py")
def test_a_run_that_does_not_beat_the_unigram_baseline_is_flagged(tsv_corpus, tmp_path, capsys):
    flags = [f for f in TINY_FLAGS]
    flags[flags.index("--steps") + 1] = "1"
    flags[flags.index("--lr-scale") + 1] = "0.001"
    code = cli.main(["train", "--corpus", tsv_corpus, "--format", "tsv", "--skip-bad-lines", "--vocab-size",
                     "60", "--out", str(tmp_path)] + flags)
    assert code == 0
    report = json.load(open(tmp_path / "report.json"))
    assert report["beats_unigram"] is False and report["eval_loss"] >= report["unigram_eval_loss"]
    out = capsys.readouterr().out
    assert "WARNING: the eval loss" in out and "is not below the unigram baseline" in out


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


@once_on_keras2("the training image's stack; test_train's run_writes_artifacts_and_beats_unigram "
                "checks that a Keras 3 run learns")
def test_default_flags_learn_in_300_steps_on_the_shipped_parallel_corpus(tmp_path, capsys):
    """Acceptance: `train --corpus <pairs>.tsv --format tsv --steps 300`, every other flag at its default."""
    out = str(tmp_path / "run")
    assert cli.main(["train", "--corpus", data.parallel_corpus_path(), "--format", "tsv", "--steps", "300",
                     "--out", out, "--quiet"]) == 0
    report = json.load(open(os.path.join(out, "report.json")))
    assert report["warmup_steps"] == 150 and report["train_config"]["warmup_steps"] is None
    assert report["beats_unigram"]
    assert report["eval_loss"] < report["unigram_eval_loss"] - 0.15, (report["eval_loss"],
                                                                      report["unigram_eval_loss"])
    assert "WARNING" not in capsys.readouterr().out


@pytest.mark.parametrize("raised, code, line", [
    ("tf", 2, "keras-posenc: error: DataLossError: corrupt record at 12 in x.tfrecord"),
    ("disk", 2, "keras-posenc: error: ResourceExhaustedError: x; No space left on device"),
    ("write", 2, "keras-posenc: error: cannot write x/report.json: Read-only file system (0.0 MB free in x)"),
    ("interrupt", 130, "keras-posenc: interrupted (SIGINT)."),
])
def test_failures_below_a_command_are_one_line_without_a_traceback(raised, code, line, monkeypatch, capsys):
    import errno

    import tensorflow as tf

    from keras_posenc.files import FileWriteError

    errors = {
        "tf": tf.errors.DataLossError(None, None, "{{function_node __wrapped__X}} corrupt record at 12\n"
                                                  "in x.tfrecord"),
        "disk": tf.errors.ResourceExhaustedError(None, None, "x; No space left on device"),
        "write": FileWriteError(errno.EROFS, "cannot write x/report.json: Read-only file system (0.0 MB free "
                                             "in x)"),
        "interrupt": KeyboardInterrupt(),
    }

    def fail(config):
        raise errors[raised]

    monkeypatch.setattr(train_lib, "train", fail)
    assert cli.main(["train", "--out", "unused"]) == code
    captured = capsys.readouterr()
    assert captured.err == line + "\n" and "Traceback" not in captured.err
