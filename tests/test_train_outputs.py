"""A short run's outputs checked in full: the report, every file, the checkpoints and the logs.

Three runs of `train` on the small corpus (seconds each) serve the whole module: a fresh run of 5
steps that saves every 2 (5 is not a multiple of 2: the last step is saved too), its resume to
step 7, and an uninterrupted 7-step run into a copy of the first run's folder. Every setting
differs from its default, so a setting the trainer drops shows. The report's numbers are checked
against independent computations: the held-out loss from the saved model in float64 numpy, the
add-one unigram baseline from the tokenizer's ids, the TensorBoard scalars against the per-step
losses and the warmup schedule's formula.
"""

import contextlib
import dataclasses
import io
import json
import math
import os
import shutil
import types

import numpy as np
import pytest
from tiny_lm import TINY_TRAINER_MODEL

from keras_posenc.backend import is_tensorflow

pytestmark = pytest.mark.skipif(not is_tensorflow(), reason="the trainer runs on TensorFlow")

SETTINGS = {**TINY_TRAINER_MODEL, "warmup_steps": 3, "lr_scale": 1.5, "seed": 3, "eval_fraction": 0.1,
            "checkpoint_every": 2, "keep_checkpoints": 2, "log_every": 2, "dropout": 0.1, "add_eos": False}


def _config(corpus, out, **overrides):
    from keras_posenc.app.train import TrainConfig

    return TrainConfig(corpus=corpus, out=str(out), **{**SETTINGS, **overrides})


def _three_runs(corpus, root):
    from keras_posenc.app.checkpoints import list_checkpoints
    from keras_posenc.app.train import train

    run, reference = root / "run", root / "reference"
    first = train(_config(corpus, run, steps=5))
    first_checkpoints = [step for step, _ in list_checkpoints(str(run / "checkpoints"))]
    shutil.copytree(run, reference)
    (reference / "notes.txt").write_text("mine")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        resumed = train(_config(corpus, run, steps=7, resume=True, verbose=1))
        replaced = train(_config(corpus, reference, steps=7))
    shutil.copytree(run, root / "finished")
    finished = train(_config(corpus, root / "finished", steps=7, resume=True))  # nothing left to train
    return {"run": str(run), "reference": str(reference), "first": first, "resumed": resumed,
            "replaced": replaced, "finished": finished, "first_checkpoints": first_checkpoints,
            "printed": printed.getvalue()}


def _split(corpus):
    from keras_posenc.app import dataset as data

    return data.split_corpus(data.read_text_corpus(corpus), SETTINGS["eval_fraction"], seed=SETTINGS["seed"])


def _processor(out):
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.Load(os.path.join(out, "spm.model"))
    return processor


def _framed(processor, text):
    """`<s>` + pieces (no `</s>`: add_eos=False), cut to max_length + 1 tokens."""
    return ([2] + processor.EncodeAsIds(text))[:SETTINGS["max_length"] + 1]


def _check_the_last_step_is_saved_when_the_steps_are_not_a_multiple_of_the_interval(runs):
    from keras_posenc.app.checkpoints import list_checkpoints

    # Saves at 2 and 4, then at the end (5); keep_checkpoints=2 keeps the newest two.
    assert runs["first_checkpoints"] == [4, 5]
    assert [step for step, _ in list_checkpoints(os.path.join(runs["run"], "checkpoints"))] == [6, 7]
    assert runs["resumed"]["start_step"] == 5 and runs["resumed"]["steps"] == 7


def _check_a_resume_continues_bit_exactly_and_says_where(runs):
    from keras_posenc.backend import keras

    resumed, reference = runs["resumed"], runs["replaced"]
    assert resumed["losses"] == reference["losses"][5:] and len(reference["losses"]) == 7
    assert resumed["eval_loss"] == reference["eval_loss"]
    checkpoint = os.path.join(runs["run"], "checkpoints", "ckpt-5")
    assert f"Resuming from {checkpoint} at step 5.\n" in runs["printed"]
    assert "2/2" in runs["printed"]  # verbose=1: Keras's progress bar of its 2 steps (the fresh run is quiet)
    assert "7/7" not in runs["printed"]
    weights = [keras.models.load_model(os.path.join(runs[name], "model.keras"), compile=False).get_weights()
               for name in ("run", "reference")]
    for got, want in zip(*weights):
        np.testing.assert_array_equal(got, want)


def _check_a_resume_of_a_finished_run_trains_nothing_and_reports_it(runs):
    finished, resumed = runs["finished"], runs["resumed"]
    assert (finished["start_step"], finished["steps"], finished["losses"], finished["final_train_loss"],
            finished["tokens_per_second"]) == (7, 7, [], None, None)
    assert finished["eval_loss"] == resumed["eval_loss"]


def _check_a_fresh_run_names_what_it_replaces_and_keeps_the_rest(runs):
    reference = runs["reference"]
    assert (f"Replacing the earlier run in {reference} (a fresh run; --resume would continue it): "
            "checkpoints/ (steps 4, 5), logs/, model.keras, spm.model, report.json, loss.png.\n"
            in runs["printed"])
    assert runs["replaced"]["start_step"] == 0
    assert open(os.path.join(reference, "notes.txt")).read() == "mine"


def _check_the_report_is_written_as_returned_with_every_field(runs, corpus):
    from keras_posenc.app.train import TrainConfig

    report = runs["first"]
    with open(os.path.join(runs["run"], "report.json")) as f:
        assert json.load(f) == runs["resumed"]
    with open(os.path.join(runs["reference"], "report.json")) as f:
        assert json.load(f) == runs["replaced"]
    train_examples, eval_examples = _split(corpus)
    config = _config(corpus, runs["run"], steps=5)
    assert report["corpus"] == "small.txt" and report["corpus_format"] == "text"
    assert (report["train_examples"], report["eval_examples"]) == (len(train_examples), len(eval_examples))
    assert report["vocab_size"] == 150 and report["warmup_steps"] == 3
    assert (report["start_step"], report["steps"], len(report["losses"])) == (0, 5, 5)
    assert report["final_train_loss"] == report["losses"][-1]
    assert report["eval_perplexity"] == math.exp(report["eval_loss"])
    assert report["unigram_eval_perplexity"] == math.exp(report["unigram_eval_loss"])
    assert report["beats_unigram"] == (report["eval_loss"] < report["unigram_eval_loss"])
    assert report["num_replicas"] == 1 and report["jit_compile"] is False
    assert report["bucket_lengths"] == [8, 16] and report["traces"] == {"train": 1, "eval": 1}
    assert report["model_config"] == config.model_config(150)
    assert report["train_config"] == dataclasses.asdict(config)
    assert report["train_config"] == dataclasses.asdict(TrainConfig(**report["train_config"]))
    assert report["loss_plot"] == os.path.join(runs["run"], "loss.png")
    assert report["train_seconds"] > 0
    assert set(report) == {
        "corpus", "corpus_format", "train_examples", "eval_examples", "vocab_size", "start_step", "steps",
        "losses", "final_train_loss", "eval_loss", "eval_perplexity", "unigram_eval_loss",
        "unigram_eval_perplexity", "train_seconds", "tokens_per_second", "num_replicas", "jit_compile",
        "bucket_lengths", "traces", "batch_shapes", "model_config", "train_config", "warmup_steps",
        "beats_unigram", "loss_plot", "task"}
    assert report["task"] == "lm"  # `--task translate` adds the dev scores (tests/test_translate.py)


def _check_tokens_and_batch_shapes_are_those_of_the_seeded_pipeline(runs, corpus):
    # The trainer's batches: lm_dataset over the training split, shuffled with the run's seed,
    # batch_size rows, the bucket's last short batch dropped, with the run's framing.
    from keras_posenc.app import dataset as data

    report = runs["first"]
    train_examples, eval_examples = _split(corpus)
    with open(os.path.join(runs["run"], "spm.model"), "rb") as f:
        sp_model = f.read()
    framing = {"max_length": 16, "add_bos": True, "add_eos": False}
    batches = data.lm_dataset(train_examples, sp_model, batch_size=4, shuffle=True, seed=3, repeat=True,
                              drop_remainder=True, **framing).take(5)
    labels = [batch[1].numpy() for batch in batches]
    assert all(label.shape[0] == 4 for label in labels)
    tokens = sum(int((label != 0).sum()) for label in labels)
    assert report["tokens_per_second"] * report["train_seconds"] == pytest.approx(tokens, rel=1e-9)
    eval_ds = data.lm_dataset(eval_examples, sp_model, batch_size=4, shuffle=False, fill_batches=True,
                              **framing)
    assert report["batch_shapes"] == {"train": len({label.shape for label in labels}),
                                      "eval": len({tuple(batch[1].shape) for batch in eval_ds})}


def _check_eval_loss_is_the_saved_models_cross_entropy_on_the_held_out_split(runs, corpus):
    from keras_posenc.backend import keras, ops

    model = keras.models.load_model(os.path.join(runs["reference"], "model.keras"), compile=False)
    processor = _processor(runs["reference"])
    total, count = 0.0, 0
    for text in _split(corpus)[1]:
        tokens = _framed(processor, text)
        logits = ops.convert_to_numpy(model(np.array([tokens[:-1]], np.int32)))[0].astype(np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        total -= log_probs[np.arange(len(tokens) - 1), tokens[1:]].sum()
        count += len(tokens) - 1
    assert runs["replaced"]["eval_loss"] == pytest.approx(total / count, rel=1e-5)


def _check_unigram_baseline_is_add_one_counts_of_the_training_labels(runs, corpus):
    processor = _processor(runs["run"])
    train_examples, eval_examples = _split(corpus)
    counts = np.ones(150)
    counts[0] = 0  # <pad> is never a label
    for text in train_examples:
        np.add.at(counts, _framed(processor, text)[1:], 1)
    log_p = np.log(counts[1:] / counts.sum())
    labels = np.concatenate([_framed(processor, text)[1:] for text in eval_examples])
    expected = -log_p[labels - 1].mean()
    assert runs["first"]["unigram_eval_loss"] == pytest.approx(expected, rel=1e-12)


def _check_the_run_folder_holds_the_tokenizer_config_and_schedule(runs, corpus):
    from keras_posenc.app import dataset as data

    out = runs["run"]
    with open(os.path.join(out, "spm.model"), "rb") as f:
        assert f.read() == data.train_sentencepiece(data.corpus_texts(_split(corpus)[0]), 150)
    with open(os.path.join(out, "checkpoints", "config.json")) as f:
        assert json.load(f) == runs["first"]["model_config"]
    with open(os.path.join(out, "checkpoints", "schedule.json")) as f:
        assert json.load(f) == {"warmup_steps": 3}
    with open(os.path.join(out, "loss.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _check_tensorboard_scalars_every_log_interval(runs):
    import tensorflow as tf

    def scalars(out):
        found = {}
        folder = os.path.join(out, "logs")
        for name in sorted(os.listdir(folder)):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
                for value in event.summary.value:
                    found.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
        return found

    def schedule(step):  # WarmupSchedule's formula, n = step + 1 (the updates done so far + 1)
        n = step + 1
        return 1.5 * 16 ** -0.5 * min(n ** -0.5, n * 3 ** -1.5)

    losses = runs["replaced"]["losses"]
    logged = scalars(runs["reference"])
    assert sorted(logged) == ["learning_rate", "loss"]
    assert sorted(logged["loss"]) == sorted(logged["learning_rate"]) == [2, 4, 6]
    for step in (2, 4, 6):
        assert logged["loss"][step] == pytest.approx(losses[step - 1], rel=1e-6)
        assert logged["learning_rate"][step] == pytest.approx(schedule(step - 1), rel=1e-6)
    # The resumed run logs in the same folder, from where it went on.
    assert sorted(scalars(runs["run"])["loss"]) == [2, 4, 6]


def _check_the_saved_model_carries_the_runs_optimizer_and_schedule(runs):
    import zipfile

    configs = []
    for folder in (runs["run"], runs["reference"]):
        with zipfile.ZipFile(os.path.join(folder, "model.keras")) as archive:
            configs.append(json.loads(archive.read("config.json")))
    # Each run's model has the name the exporter's messages use.
    assert [config["config"]["name"] for config in configs] == ["causal_lm"] * 2
    optimizer = configs[0]["compile_config"]["optimizer"]["config"]
    assert (optimizer["beta_1"], optimizer["beta_2"], optimizer["epsilon"]) == (0.9, 0.98, 1e-9)
    assert optimizer["learning_rate"]["config"] == {"d_model": 16, "warmup_steps": 3, "scale": 1.5}


def _check_the_loss_plot_starts_at_the_runs_first_step_and_draws_its_baselines(runs, plotted):
    # What each baseline line shows: tests/test_train_settings.py draws a plot from these arguments.
    assert [(args[2], kwargs["eval_loss"], kwargs["unigram_loss"]) for args, kwargs in plotted] == [
        (runs[name]["start_step"], runs[name]["eval_loss"], runs[name]["unigram_eval_loss"])
        for name in ("first", "resumed", "replaced", "finished")]
    assert [args[2] for args, _ in plotted] == [0, 5, 0, 7]


def test_a_short_run_its_resume_and_a_fresh_run_over_it(corpus, tmp_path, monkeypatch):
    # One test over the three runs, not one per check on a shared fixture: mutmut credits a module
    # fixture's work to the first test that uses it, so a mutant of the trainer would run that test
    # only, and not the checks of the others.
    from keras_posenc.app import train as train_lib

    plotted, plot = [], train_lib.plot_losses
    monkeypatch.setattr(train_lib, "plot_losses",
                        lambda *args, **kwargs: plotted.append((args, kwargs)) or plot(*args, **kwargs))
    runs = _three_runs(corpus, tmp_path)
    _check_the_loss_plot_starts_at_the_runs_first_step_and_draws_its_baselines(runs, plotted)
    _check_the_last_step_is_saved_when_the_steps_are_not_a_multiple_of_the_interval(runs)
    _check_a_resume_continues_bit_exactly_and_says_where(runs)
    _check_a_resume_of_a_finished_run_trains_nothing_and_reports_it(runs)
    _check_a_fresh_run_names_what_it_replaces_and_keeps_the_rest(runs)
    _check_the_report_is_written_as_returned_with_every_field(runs, corpus)
    _check_tokens_and_batch_shapes_are_those_of_the_seeded_pipeline(runs, corpus)
    _check_eval_loss_is_the_saved_models_cross_entropy_on_the_held_out_split(runs, corpus)
    _check_unigram_baseline_is_add_one_counts_of_the_training_labels(runs, corpus)
    _check_the_run_folder_holds_the_tokenizer_config_and_schedule(runs, corpus)
    _check_tensorboard_scalars_every_log_interval(runs)
    _check_the_saved_model_carries_the_runs_optimizer_and_schedule(runs)


class _WorkerStrategy:
    """The default strategy as a worker of a cluster sees it: one that does not checkpoint."""

    def __init__(self, strategy):
        self._strategy = strategy
        self.extended = types.SimpleNamespace(should_checkpoint=False)

    def __getattr__(self, name):
        return getattr(self._strategy, name)


def test_a_worker_trains_while_the_chief_holds_the_run_folder_and_writes_nothing_there(corpus, tmp_path,
                                                                                      monkeypatch):
    # Under MultiWorkerMirroredStrategy every worker runs `train`; only the chief (the strategy's
    # `should_checkpoint`) may lock, write or replace anything in `out`: a worker runs while the
    # chief holds the folder. It saves its checkpoints, logs and model (every worker takes part in
    # a save) into scratch folders that are gone when its run ends.
    import tempfile

    import tensorflow as tf

    from keras_posenc.app import train as train_lib
    from keras_posenc.app.run_lock import RunLockedError

    def held_by_the_chief(folder):
        raise RunLockedError(f"{folder} is held by the chief")

    worker = _WorkerStrategy(tf.distribute.get_strategy())
    monkeypatch.setattr(train_lib, "make_strategy", lambda name: worker)
    monkeypatch.setattr(train_lib, "run_lock", held_by_the_chief)

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    earlier = {"spm.model": "earlier tokenizer", "report.json": "earlier report", "notes.txt": "mine",
               "checkpoints/checkpoint": "earlier checkpoint"}
    for name, text in earlier.items():
        (out / name).write_text(text)
    scratch = []
    make_scratch = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *args, **kwargs: scratch.append(
        make_scratch(*args, **kwargs)) or scratch[-1])
    elsewhere = tmp_path / "working_directory"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = _config(corpus, out, steps=4)
    report = train_lib.train(cfg)
    assert (report["steps"], len(report["losses"])) == (4, 4)
    files = {str(path.relative_to(out)): path.read_text() for path in out.rglob("*") if path.is_file()}
    assert files == earlier
    assert scratch and not [path for path in scratch if os.path.exists(path)]
    assert list(elsewhere.iterdir()) == []


def test_the_report_names_the_corpus_its_format_and_split_and_xla_compiles_when_asked(corpus, tmp_path,
                                                                                       monkeypatch):
    # Without --corpus the embedded default is read as text; a given corpus is read (and reported)
    # in its format, a malformed line skipped when asked, and split by the run's eval_fraction.
    # With --jit-compile on the steps really are XLA-compiled (TensorFlow returns their HLO), and
    # with it off they are not.
    from keras_posenc.app import train as train_lib

    lines = [line for line in open(corpus, encoding="utf-8").read().splitlines() if line][:200]
    default = tmp_path / "default.txt"
    default.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(train_lib.data_lib, "default_corpus_path", lambda: str(default))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(lines[::2], lines[1::2])) + "no tab here\n",
                     encoding="utf-8")
    made, make_steps = [], train_lib.TrainSteps
    monkeypatch.setattr(train_lib, "TrainSteps", lambda *args: made.append(make_steps(*args)) or made[-1])
    short = {"steps": 2, "warmup_steps": 1}
    embedded_config = dataclasses.replace(_config(corpus, tmp_path / "default", **short), corpus=None)
    embedded = train_lib.train(embedded_config)
    paired = train_lib.train(_config(str(pairs), tmp_path / "paired", corpus_format="tsv",
                                     skip_bad_lines=True, eval_fraction=0.25, jit_compile="on", **short))
    for report, expected in ((embedded, ("default.txt", "text", 180, 20, False)),
                             (paired, ("pairs.tsv", "tsv", 75, 25, True))):
        assert (report["corpus"], report["corpus_format"], report["train_examples"], report["eval_examples"],
                report["jit_compile"]) == expected

    import tensorflow as tf

    def batch(function):  # ones for each tensor of the step's signature
        return tf.nest.map_structure(lambda spec: tf.ones([4, 8], spec.dtype), function.input_signature[0])

    for function in (made[1]._train, made[1]._eval):
        assert function.experimental_get_compiler_ir(batch(function))(stage="hlo").startswith("HloModule")
    with pytest.raises(ValueError, match="jit_compile=True"):
        made[0]._train.experimental_get_compiler_ir(batch(made[0]._train))
