"""The trainer without a training run: its settings, their messages, signals, checkpoints, the plot.

Each check is what a user meets before or around a run: the message that names a bad flag (and
that nothing was written), the model config a setting gives, a checkpoint write error in one line,
what a signal does, the loss plot's content.
"""

import dataclasses
import importlib
import json
import os
import signal

import numpy as np
import pytest
from tiny_lm import TINY_TRAINER_MODEL

from keras_posenc.backend import is_tensorflow

pytestmark = pytest.mark.skipif(not is_tensorflow(), reason="the trainer runs on TensorFlow")


def _train_lib():
    from keras_posenc.app import train as train_lib

    return train_lib


def _app(module):
    """A module of `keras_posenc.app` (imported in the tests: the trainer runs on TensorFlow only)."""
    return importlib.import_module(f"keras_posenc.app.{module}")


@pytest.mark.parametrize("overrides,message", [
    ({"steps": 0}, "`steps` must be a positive int, got steps=0."),
    ({"batch_size": 0}, "`batch_size` must be a positive int, got batch_size=0."),
    ({"checkpoint_every": 0}, "`checkpoint_every` must be a positive int, got checkpoint_every=0."),
    ({"keep_checkpoints": 0}, "`keep_checkpoints` must be a positive int, got keep_checkpoints=0."),
    ({"log_every": 0}, "`log_every` must be a positive int, got log_every=0."),
    ({"max_length": 0}, "`max_length` must be a positive int, got max_length=0."),
    ({"vocab_size": 0}, "`vocab_size` must be a positive int, got vocab_size=0."),
    ({"warmup_steps": 0}, "`warmup_steps` must be a positive int, got warmup_steps=0."),
    ({"corpus_format": "csv"}, "`format` must be one of ('text', 'tsv'), got format='csv'."),
    ({"corpus": None, "corpus_format": "tsv"}, "`format` (--format) 'tsv' needs a `corpus` (--corpus PATH): "
                                               "the embedded corpus is plain text."),
    ({"strategy": "tpu"}, "`strategy` must be one of ('default', 'mirrored', 'multiworker'), got "
                          "strategy='tpu'."),
    ({"jit_compile": "yes"}, "`jit_compile` must be one of ('auto', 'on', 'off'), got jit_compile='yes'."),
    ({"eval_fraction": 0.0}, "`eval_fraction` (--eval-fraction) must be in (0, 1), got 0.0."),
    ({"eval_fraction": 1.0}, "`eval_fraction` (--eval-fraction) must be in (0, 1), got 1.0."),
    ({"lr_scale": 0.0}, "`lr_scale` (--lr-scale) must be > 0, got 0.0."),
    ({"d_model": 30}, "`d_model` must be divisible by `num_heads`, got d_model=30 and num_heads=4."),
])
def test_a_bad_setting_is_named_before_anything_is_written(tmp_path, overrides, message):
    train_lib = _train_lib()
    out = tmp_path / "out"
    config = train_lib.TrainConfig(**{"corpus": str(tmp_path / "missing.txt"), "out": str(out), **overrides})
    with pytest.raises(ValueError) as error:
        train_lib.train(config)
    assert str(error.value) == message
    assert not out.exists()


def test_the_bounds_of_the_settings_are_allowed(tmp_path):
    # Every flag at its smallest value passes the checks: the run then stops at the missing corpus.
    from keras_posenc.app.dataset import CorpusError

    train_lib = _train_lib()
    ones = {name: 1 for name in ("steps", "batch_size", "checkpoint_every", "keep_checkpoints", "log_every",
                                 "warmup_steps", "num_heads")}
    with pytest.raises(CorpusError, match="Corpus file not found"):
        train_lib.train(train_lib.TrainConfig(corpus=str(tmp_path / "missing.txt"), out=str(tmp_path / "out"),
                                              eval_fraction=1e-9, lr_scale=1e-9, vocab_size=6, max_length=1,
                                              **ones))


def test_a_batch_that_the_replicas_cannot_share_is_refused(tmp_path, monkeypatch):
    train_lib = _train_lib()

    class TwoReplicas:
        num_replicas_in_sync = 2

    monkeypatch.setattr(train_lib, "make_strategy", lambda name: TwoReplicas())
    with pytest.raises(ValueError) as error:
        train_lib.train(train_lib.TrainConfig(out=str(tmp_path / "out"), batch_size=3))
    assert str(error.value) == "`batch_size` must be a multiple of the 2 replicas, got batch_size=3."
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("position,table,corpus_format,expected", [
    ("sinusoidal", "factorized", "text", {"position": "sinusoidal", "table": "factorized"}),
    ("learned", "factorized", "tsv", {"position": "learned", "num_languages": 2}),
    ("rope-yarn", "full", "text", {"position": "rope", "scaling": "yarn", "scaling_factor": 4.0,
                                   "original_length": 24}),
])
def test_model_config_of_the_settings(position, table, corpus_format, expected):
    train_lib = _train_lib()
    config = train_lib.TrainConfig(position=position, table=table, corpus_format=corpus_format,
                                   num_layers=3, d_model=24, num_heads=3, dff=40, max_length=24, dropout=0.2,
                                   norm_first=True)
    assert config.model_config(vocab_size=77) == {
        "num_layers": 3, "d_model": 24, "num_heads": 3, "dff": 40, "vocab_size": 77, "max_length": 24,
        "dropout": 0.2, "norm_first": True, "pad_id": 0, **expected}


@pytest.mark.parametrize("flags,expected", [
    ([], "sinusoidal"),
    (["--task", "translate"], "rope"),
    (["--task", "translate", "--position", "sinusoidal"], "sinusoidal"),
    (["--task", "lm", "--position", "alibi"], "alibi"),
])
def test_the_position_default_follows_the_task(flags, expected):
    from keras_posenc.app import cli
    from keras_posenc.app.cli_flags import config_from_flags

    args = cli.build_parser().parse_args(["train", *flags])
    config = config_from_flags(args, _train_lib().TrainConfig())
    assert config.position == expected
    assert dataclasses.asdict(config)["position"] == expected  # what report.json and a resume compare
    if "translate" in flags:
        assert config.model_config(vocab_size=50)["position"] == expected


def test_the_fields_name_their_flags():
    # keras_posenc.app.cli_flags builds `keras-posenc train`'s flags from this metadata.
    train_lib = _train_lib()
    fields = {field.name: field for field in dataclasses.fields(train_lib.TrainConfig)}
    assert all(set(field.metadata) == {"group", "help", "flag", "choices", "type", "const"}
               for field in fields.values())
    assert dict(fields["corpus_format"].metadata) == {
        "group": "data", "help": "text: one document or sentence per line; tsv: source<TAB>target",
        "flag": "--format", "choices": ("text", "tsv"), "type": None, "const": None}
    assert (fields["add_bos"].default, fields["add_bos"].metadata["flag"]) == (True, "--no-bos")
    assert (fields["verbose"].metadata["flag"], fields["verbose"].metadata["const"]) == ("--quiet", 0)
    assert fields["seed"].metadata["type"] is int and fields["steps"].metadata["group"] == "training"
    assert fields["jit_compile"].metadata["choices"] == ("auto", "on", "off")


def test_default_warmup_is_half_the_steps_within_1_and_4000():
    train_config = _app("train_config")
    assert [train_config.default_warmup_steps(n) for n in (1, 2, 3, 301, 7999, 8000, 8002, 10**6)] == \
        [1, 1, 1, 150, 3999, 4000, 4000, 4000]


def test_strategies_and_xla_settings(monkeypatch):
    import tensorflow as tf

    train_strategy = _app("train_strategy")
    assert isinstance(train_strategy.make_strategy("mirrored"), tf.distribute.MirroredStrategy)
    assert train_strategy.make_strategy("default") is tf.distribute.get_strategy()
    monkeypatch.setenv("TF_CONFIG", "")
    with pytest.raises(ValueError) as error:
        train_strategy.make_strategy("multiworker")
    assert str(error.value) == ("strategy='multiworker' needs the TF_CONFIG environment variable describing "
                                "the cluster and this worker's task.")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1"]},
                                                "task": {"type": "worker", "index": 0}}))
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", lambda: "the cluster's strategy")
    assert train_strategy.make_strategy("multiworker") == "the cluster's strategy"
    one = tf.distribute.get_strategy()
    assert train_strategy.use_jit_compile("on", one) is True
    assert train_strategy.use_jit_compile("off", one) is False
    assert train_strategy.use_jit_compile("auto", one) is bool(tf.config.list_logical_devices("GPU"))

    class TwoReplicas:
        num_replicas_in_sync = 2

    # `auto` is on for one replica on a GPU only.
    for devices, replicas, expected in (([], one, False), (["a GPU"], one, True),
                                        (["a GPU"], TwoReplicas(), False)):
        monkeypatch.setattr(tf.config, "list_logical_devices",
                            lambda kind, devices=devices: devices if kind == "GPU" else ["a CPU"])
        assert train_strategy.use_jit_compile("auto", replicas) is expected

    with pytest.raises(ValueError) as error:
        train_strategy.use_jit_compile("on", TwoReplicas())
    assert str(error.value) == (
        "jit_compile='on' (--jit-compile on) needs one replica, got 2: XLA compiles the step onto one "
        "device, and the replicas' variables live on several. Use --jit-compile off or auto.")


def test_a_resume_names_every_setting_that_differs(tmp_path):
    checkpoints = _app("checkpoints")
    folder = str(tmp_path)
    with pytest.raises(ValueError) as error:
        checkpoints.check_checkpoint_config(folder, {"d_model": 16})
    assert str(error.value) == f"Cannot resume from {folder}: it has no config.json with the model config."
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"d_model": 16, "dff": 32, "table": "full"}, f)
    checkpoints.check_checkpoint_config(folder, {"d_model": 16, "dff": 32, "table": "full"})
    with pytest.raises(ValueError) as error:
        checkpoints.check_checkpoint_config(folder, {"d_model": 24, "dff": 32, "norm_first": True})
    assert str(error.value) == (
        f"Cannot resume from {folder}: it was trained with a different model config (d_model: checkpoint 16 "
        "vs now 24; norm_first: checkpoint None vs now True; table: checkpoint 'full' vs now None). Use the "
        "same flags, or a new --out without --resume.")


def test_list_checkpoints_reads_steps_of_complete_checkpoints_only(tmp_path):
    import tensorflow as tf

    checkpoints = _app("checkpoints")
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(tmp_path), max_to_keep=5,
                                         step_counter=step)
    for value in (3, 12, 100):
        step.assign(value)
        manager.save(checkpoint_number=value)
    os.remove(os.path.join(str(tmp_path), "ckpt-12.index"))  # a checkpoint whose files are gone
    assert checkpoints.list_checkpoints(str(tmp_path)) == [(3, os.path.join(str(tmp_path), "ckpt-3")),
                                                           (100, os.path.join(str(tmp_path), "ckpt-100"))]


def test_an_unknown_checkpoint_write_error_is_its_type_and_first_line(tmp_path):
    import tensorflow as tf

    checkpoints = _app("checkpoints")
    folder = str(tmp_path)
    error = tf.errors.InternalError(None, None, "{{node SaveV2}} the device broke\nsecond line")
    written = checkpoints._checkpoint_write_error(folder, 3, error)
    assert written.errno == 5 and written.strerror.startswith(
        f"cannot write {folder}/ckpt-3: InternalError: the device broke (")
    os_error = checkpoints._checkpoint_write_error(folder, 3, OSError(13, "Permission denied"))
    assert os_error.errno == 13 and "/ckpt-3: Permission denied (" in os_error.strerror
    blank = checkpoints._checkpoint_write_error(folder, 3, tf.errors.InternalError(None, None, ""))
    assert blank.errno == 5 and f"{folder}/ckpt-3: InternalError:  (" in blank.strerror


@pytest.mark.parametrize("kind,text,errno_,reason", [
    ("UnknownError", "{{node SaveV2}} open failed: Permission denied", 13, "Permission denied"),
    ("PermissionDeniedError", "{{node SaveV2}} the folder is not yours", 13, "Permission denied"),
    ("UnknownError", "{{node SaveV2}} Read-only file system", 30, "Read-only file system"),
    ("UnknownError", "{{node SaveV2}} permission denied? read-only file system?", 5,
     "UnknownError: permission denied? read-only file system?"),  # the known reasons match as written
])
def test_tensorflows_file_errors_are_named_by_their_type_or_their_text(tmp_path, kind, text, errno_, reason):
    import tensorflow as tf

    checkpoints = _app("checkpoints")
    error = getattr(tf.errors, kind)(None, None, text)
    written = checkpoints._checkpoint_write_error(str(tmp_path), 8, error)
    assert written.errno == errno_
    assert written.strerror.startswith(f"cannot write {tmp_path}/ckpt-8: {reason} (")


def test_an_unreadable_checkpoint_is_named_by_the_errors_type_and_first_line():
    import tensorflow as tf

    first_line = _app("checkpoints")._first_line
    error = tf.errors.DataLossError(None, None, "{{function_node __inference}} {{node RestoreV2}} Checksum "
                                                "does not match\nstored 1, computed 2")
    assert first_line(error) == "DataLossError: Checksum does not match"
    truncated = IndexError("Read less bytes than requested")
    assert first_line(truncated) == "IndexError: Read less bytes than requested"
    assert first_line(IndexError()) == "IndexError: "  # no message: the type alone


def test_the_checkpoint_folders_json_is_sorted_and_indented_for_a_diff(tmp_path):
    # config.json and schedule.json of two runs compare line by line
    path = str(tmp_path / "config.json")
    _app("checkpoints").write_json_atomically(path, {"vocab_size": 150, "d_model": 16, "heads": [2, 4]})
    with open(path) as f:
        assert f.read() == '{\n "d_model": 16,\n "heads": [\n  2,\n  4\n ],\n "vocab_size": 150\n}'


def test_training_interrupted_names_the_signal_step_and_checkpoint():
    stop_on_signal = _app("stop_on_signal")
    prefix = "runs/x/checkpoints/ckpt-12"
    stopped = stop_on_signal.TrainingInterrupted(signal.SIGTERM, 12, prefix)
    assert (stopped.signum, stopped.step, stopped.checkpoint) == (signal.SIGTERM, 12, prefix)
    assert str(stopped) == ("stopped by SIGTERM at step 12: saved the checkpoint runs/x/checkpoints/ckpt-12; "
                            "continue with --resume.")


@pytest.fixture
def sigterm_recorded():
    """SIGTERM recorded by a handler of the test's own (a runner's handler would end the test run)."""
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    yield received
    signal.signal(signal.SIGTERM, previous)


def test_a_first_signal_is_recorded_a_second_acts_and_the_handlers_come_back(python_sigint_handler,
                                                                              sigterm_recorded):
    stop_on_signal = _app("stop_on_signal")
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    with stop_on_signal.StopOnSignal() as stop:
        assert stop.active and stop.received is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == signal.SIGTERM and sigterm_recorded == []  # recorded, not passed on
        with pytest.raises(KeyboardInterrupt):  # the second one: SIGINT's own handler, at once
            os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == signal.SIGTERM
    assert {signum: signal.getsignal(signum) for signum in before} == before
    with stop_on_signal.StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == signal.SIGINT
    assert {signum: signal.getsignal(signum) for signum in before} == before
    with stop_on_signal.StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the second: to the handler from before, at once
        assert stop.received == signal.SIGTERM and sigterm_recorded == [signal.SIGTERM]
        assert {signum: signal.getsignal(signum) for signum in before} == before
    with stop_on_signal.StopOnSignal(active=False) as stop:
        assert not stop.active and signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]


def test_a_signal_the_process_ignores_stays_ignored(sigterm_recorded):
    """Started with `nohup` or as a shell's background job: SIGINT stays ignored, SIGTERM stops."""
    stop_on_signal = _app("stop_on_signal")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_signal.StopOnSignal() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.received is None
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.received == signal.SIGTERM and sigterm_recorded == []
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_step_log_sums_tokens_and_keeps_every_loss(monkeypatch):
    train_logs = _app("train_logs")
    log = train_logs.StepLog()
    assert (log.losses, log.tokens, log.seconds) == ([], 0, 0.0)
    monkeypatch.setattr(train_logs.time, "perf_counter", iter([100.0, 103.5]).__next__)
    log.on_train_begin()
    for loss, tokens in ((3.5, 7), (3.25, 9), (3.0, 11)):
        log.on_train_batch_end(0, {"loss": np.float32(loss), "tokens": np.int32(tokens)})
    log.on_train_end()
    assert log.losses == [3.5, 3.25, 3.0] and log.tokens == 27 and log.seconds == 3.5


class _ReplicaContext:
    def __init__(self, replicas, replica):
        self.num_replicas_in_sync, self.replica_id_in_sync_group = replicas, replica


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_each_replica_takes_its_share_of_a_global_batch_in_order(monkeypatch, replicas):
    """`ceil(rows / replicas)` rows each, the last replicas fewer (or none); together every row once,
    in order. The rows are longer or shorter than the batch is deep: the share counts rows only."""
    import tensorflow as tf

    train_steps = _app("train_steps")
    for rows in range(1, 10):
        features = np.arange(rows * 3, dtype=np.int32).reshape(rows, 3)
        labels = np.arange(rows * 2, dtype=np.int32).reshape(rows, 2)
        shares = []
        for replica in range(replicas):
            context = _ReplicaContext(replicas, replica)
            monkeypatch.setattr(tf.distribute, "get_replica_context", lambda context=context: context)
            share = train_steps._replica_slice((tf.constant(features), tf.constant(labels)))
            shares.append([t.numpy() for t in share])
        size = -(-rows // replicas)
        assert [len(f) for f, _ in shares] == [max(0, min(size, rows - r * size)) for r in range(replicas)]
        np.testing.assert_array_equal(np.concatenate([f for f, _ in shares]), features)
        np.testing.assert_array_equal(np.concatenate([y for _, y in shares]), labels)


def _plotted(monkeypatch, tmp_path, losses, **kwargs):
    """The figure `plot_losses` saves: its axes' lines, labels and title, and the PNG's size."""
    train_logs = _app("train_logs")
    figures = []
    save = train_logs.save_figure

    def recording(fig, path):
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(train_logs, "save_figure", recording)
    path = str(tmp_path / "loss.png")
    assert train_logs.plot_losses(losses, path, **kwargs) == path
    with open(path, "rb") as f:
        header = f.read(24)
    from matplotlib.colors import to_hex

    (axes,) = figures[0].axes
    lines = [(line.get_label(), list(line.get_xdata()), list(line.get_ydata()), line.get_linewidth(),
              line.get_alpha(), to_hex(line.get_color()), line.get_linestyle()) for line in axes.get_lines()]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    size = (int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big"))
    return lines, legend, axes, size


def test_loss_plot_with_its_moving_mean_and_baselines(monkeypatch, tmp_path):
    losses = [10.0 - 0.25 * i for i in range(24)]
    lines, legend, axes, size = _plotted(monkeypatch, tmp_path, losses, start_step=6, eval_loss=4.0,
                                         unigram_loss=5.25)
    steps = list(range(7, 31))
    mean = list(np.convolve(losses, np.ones(2) / 2, mode="valid"))  # window max(2, 24 // 20) = 2
    assert lines == [
        ("train loss (per step)", steps, losses, 0.8, 0.5, "#1f77b4", "-"),  # matplotlib's C0 ...
        ("train loss (2-step mean)", steps[1:], mean, 2.0, None, "#ff7f0e", "-"),  # C1
        ("eval loss 4.000", [0, 1], [4.0, 4.0], 1.5, None, "#2ca02c", "--"),  # C2
        ("unigram baseline 5.250", [0, 1], [5.25, 5.25], 1.5, None, "#d62728", ":")]  # C3
    assert legend == [line[0] for line in lines]
    assert (axes.get_xlabel(), axes.get_ylabel(), axes.get_title()) == (
        "step", "cross-entropy (nats / token)", "")
    assert size == (700, 400)


def test_loss_plot_of_a_short_run_and_one_that_does_not_beat_the_baseline(monkeypatch, tmp_path):
    from matplotlib.colors import to_hex

    lines, legend, axes, _ = _plotted(monkeypatch, tmp_path, [3.0] * 9, eval_loss=5.0, unigram_loss=5.0)
    assert [line[0] for line in lines] == ["train loss (per step)", "eval loss 5.000",
                                           "unigram baseline 5.000"]
    assert lines[0][1] == list(range(1, 10))
    assert axes.get_title() == "eval loss is NOT below the unigram baseline"
    assert to_hex(axes.title.get_color()) == "#d62728"  # C3
    lines, _, _, _ = _plotted(monkeypatch, tmp_path, [3.0 - i / 100 for i in range(100)])
    assert [line[0] for line in lines] == ["train loss (per step)", "train loss (5-step mean)"]
    lines, _, axes, _ = _plotted(monkeypatch, tmp_path, [3.0] * 10, unigram_loss=5.0)
    assert [line[0] for line in lines] == ["train loss (per step)", "train loss (2-step mean)",
                                           "unigram baseline 5.000"]
    assert axes.get_title() == ""


def _cfg(tmp_path, **overrides):
    settings = {"corpus": "corpus.txt", "out": str(tmp_path), "steps": 10, **overrides}
    return _train_lib().TrainConfig(**settings)


def test_a_resumed_run_keeps_its_own_tokenizer(tmp_path, monkeypatch):
    """On resume the run folder's `spm.model` is read back (not new); else one is trained (new)."""
    train_lib = _train_lib()
    trained = []
    monkeypatch.setattr(train_lib.data_lib, "train_sentencepiece",
                        lambda texts, vocab_size: trained.append(vocab_size) or b"trained")
    (tmp_path / "spm.model").write_bytes(b"the run's own")
    assert train_lib._tokenizer(_cfg(tmp_path, resume=True), []) == (b"the run's own", False)
    assert trained == []
    assert train_lib._tokenizer(_cfg(tmp_path), []) == (b"trained", True)
    assert train_lib._tokenizer(_cfg(tmp_path / "empty", resume=True), []) == (b"trained", True)
    assert trained == [_cfg(tmp_path).vocab_size] * 2


def test_a_resume_with_no_checkpoint_names_the_folder_and_writes_nothing(corpus, tmp_path):
    out = tmp_path / "empty"
    with pytest.raises(ValueError) as raised:
        _train_lib().train(_cfg(out, corpus=corpus, resume=True, **TINY_TRAINER_MODEL))
    assert str(raised.value) == (f"--resume was given but {out / 'checkpoints'} holds no complete checkpoint "
                                 "to resume from.")
    assert sorted(path.name for path in tmp_path.rglob("*") if path.is_file()) == []


class _BatchesSeen(Exception):
    """Ends a run at its first step, once the batches the steps would get are recorded."""


# Past the first epoch of the 300-line corpus's training split (about 60 batches of 4).
STEPS_PAST_AN_EPOCH = 100


def test_the_steps_get_the_split_in_the_runs_seeded_shuffle_repeated_past_an_epoch(corpus, tmp_path,
                                                                                     monkeypatch):
    from keras_posenc.app import dataset as data
    from keras_posenc.backend import make_deterministic

    train_lib = _train_lib()
    seen = []

    def record(steps_fn, batches, steps, callbacks, verbose, stop=None):
        seen.extend(next(batches) for _ in range(steps))
        raise _BatchesSeen

    monkeypatch.setattr(train_lib, "fit", record)
    cfg = _cfg(tmp_path, corpus=corpus, steps=STEPS_PAST_AN_EPOCH, seed=5, **TINY_TRAINER_MODEL)
    with pytest.raises(_BatchesSeen):
        train_lib.train(cfg)

    train_examples, _ = data.split_corpus(data.read_text_corpus(corpus), cfg.eval_fraction, seed=5)
    sp_model = (tmp_path / "spm.model").read_bytes()

    def pipeline(**kwargs):
        make_deterministic(5)  # the global seed the run set: TensorFlow's shuffle combines both
        return data.lm_dataset(train_examples, sp_model, batch_size=4, max_length=16, drop_remainder=True,
                               **kwargs)

    one_epoch = len(list(pipeline(shuffle=True, seed=5)))
    assert 0 < one_epoch < STEPS_PAST_AN_EPOCH
    expected = list(pipeline(shuffle=True, seed=5, repeat=True).take(STEPS_PAST_AN_EPOCH))
    in_corpus_order = list(pipeline(shuffle=False).take(one_epoch))
    other_seed = list(pipeline(shuffle=True, seed=6).take(one_epoch))

    def ids(batches):
        return [(features["token_ids"].numpy().tolist(), labels.numpy().tolist())
                for features, labels in batches]

    assert ids(seen) == ids(expected)
    assert ids(seen[:one_epoch]) != ids(in_corpus_order)
    assert ids(seen[:one_epoch]) != ids(other_seed)


def test_the_warmup_is_explicit_else_the_checkpoints_on_resume_else_half_the_steps(tmp_path):
    train_lib = _train_lib()
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    assert train_lib._warmup_steps(_cfg(tmp_path), str(folder)) == 5  # no schedule file: half of 10
    (folder / "schedule.json").write_text(json.dumps({"warmup_steps": 7}))
    assert train_lib._warmup_steps(_cfg(tmp_path, resume=True), str(folder)) == 7  # the run's own
    assert train_lib._warmup_steps(_cfg(tmp_path, resume=True, steps=40), str(folder)) == 7
    assert train_lib._warmup_steps(_cfg(tmp_path), str(folder)) == 5  # a fresh run: its own steps
    assert train_lib._warmup_steps(_cfg(tmp_path, resume=True, warmup_steps=3), str(folder)) == 3
    assert train_lib._warmup_steps(_cfg(tmp_path, resume=True), str(tmp_path / "none")) == 5


def test_an_explicit_warmup_warns_from_the_number_of_steps_on(tmp_path, recwarn):
    train_lib = _train_lib()
    assert train_lib._warmup_steps(_cfg(tmp_path, warmup_steps=9), str(tmp_path)) == 9
    assert not recwarn.list  # one step below: no warning
    for warmup in (10, 11):
        with pytest.warns(UserWarning) as caught:
            assert train_lib._warmup_steps(_cfg(tmp_path, warmup_steps=warmup), str(tmp_path)) == warmup
        assert [str(w.message) for w in caught] == [
            f"--warmup-steps {warmup} >= --steps 10: the learning rate never leaves warmup and the run may "
            "learn little. Leave --warmup-steps out to use 5 (half the steps)."]


class _Tensor:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


class _ScriptedSteps:
    """Stands in for `_Steps`: each train step's loss and token count, each eval batch's sums."""

    model = "the model"

    def __init__(self):
        self.fed = []

    def train(self, batch):
        self.fed.append(batch)
        return {"loss": _Tensor(10.0 - batch), "tokens": _Tensor(batch)}

    def eval(self, batch):
        return batch


class _Recorder:
    def __init__(self, stop=None, at=None):
        self.calls, self.stop, self.at = [], stop, at

    def set_model(self, model):
        self.calls.append(("set_model", model))

    def on_train_begin(self):
        self.calls.append(("begin",))

    def on_train_batch_end(self, batch, logs):
        self.calls.append(("batch", batch, logs))
        if self.stop is not None and batch == self.at:
            self.stop.received = signal.SIGTERM

    def on_train_end(self, logs):
        self.calls.append(("end", logs))


def test_fit_runs_the_steps_in_order_and_tells_every_callback():
    train_steps = _app("train_steps")
    steps, first, second = _ScriptedSteps(), _Recorder(), _Recorder()
    train_steps.fit(steps, iter([3, 4, 5, 6]), 3, [first, second], verbose=0)
    assert steps.fed == [3, 4, 5]
    expected = [("set_model", "the model"), ("begin",), ("batch", 0, {"loss": 7.0, "tokens": 3}),
                ("batch", 1, {"loss": 6.0, "tokens": 4}), ("batch", 2, {"loss": 5.0, "tokens": 5}),
                ("end", {"loss": 5.0, "tokens": 5})]
    assert first.calls == second.calls == expected


def test_fit_of_no_steps_touches_nothing_and_a_signal_ends_it_after_its_step(capsys):
    stop_on_signal = _app("stop_on_signal")
    train_steps = _app("train_steps")
    steps, recorder = _ScriptedSteps(), _Recorder()
    train_steps.fit(steps, iter([1, 2]), 0, [recorder], verbose=1)  # a resume already at its steps
    train_steps.fit(steps, iter([1, 2]), -2, [recorder], verbose=1)
    assert steps.fed == [] and recorder.calls == [] and capsys.readouterr().out == ""
    stop = stop_on_signal.StopOnSignal(active=False)
    recorder = _Recorder(stop=stop, at=1)
    train_steps.fit(steps, iter([1, 2, 3, 4]), 4, [recorder], verbose=0, stop=stop)
    assert steps.fed == [1, 2]  # the step in progress ends, then the loop; the callbacks still end
    assert recorder.calls[-1] == ("end", {"loss": 8.0, "tokens": 2})


def test_fit_shows_a_progress_bar_only_when_verbose(capsys):
    train_steps = _app("train_steps")
    train_steps.fit(_ScriptedSteps(), iter([1, 2]), 2, [], verbose=0)
    assert capsys.readouterr().out == ""
    train_steps.fit(_ScriptedSteps(), iter([1, 2]), 2, [], verbose=1)
    shown = capsys.readouterr().out
    assert "1/2" in shown and "loss: 9.0000" in shown and "2/2" in shown  # the first step: 10 - 1
    train_steps.fit(_ScriptedSteps(), iter([1, 2]), 2, [], verbose=2)  # Keras's one line at the end
    shown = capsys.readouterr().out
    assert "1/2" not in shown and shown.count("2/2") == 1


def test_evaluate_is_the_sum_of_losses_over_the_sum_of_labels():
    train_steps = _app("train_steps")
    steps = _ScriptedSteps()
    assert train_steps.evaluate(steps, [(6.0, 4.0), (3.0, 2.0)]) == 1.5  # 9 / 6, not the mean of 1.5s
    assert train_steps.evaluate(steps, [(7.0, 4.0), (2.0, 1.0)]) == 9.0 / 5.0
    assert train_steps.evaluate(steps, []) == 0.0  # no batch: no division by zero
    assert train_steps.evaluate(steps, [(0.25, 0.5)]) == 0.25  # fewer than one label counts as one


class _SummingModel:
    """Stands in for the model in `_Steps`: a train step's loss is the sum of its labels, an eval
    batch's sums are that sum and the label count."""

    def train_step(self, batch):
        import tensorflow as tf

        return {"loss": tf.reduce_sum(tf.cast(batch[1], tf.float32))}

    def token_loss_sums(self, batch):
        import tensorflow as tf

        return tf.reduce_sum(tf.cast(batch[1], tf.float32)), tf.cast(tf.size(batch[1]), tf.float32)


def _steps(model, jit_compile=False):
    """`TrainSteps` on the default strategy for (features, labels) batches of any shape."""
    import tensorflow as tf

    spec = (tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32))
    return _app("train_steps").TrainSteps(model, tf.distribute.get_strategy(), spec, jit_compile=jit_compile)


def test_the_steps_trace_once_and_record_every_batch_shape_they_see():
    """The report's `traces` and `batch_shapes`: one trace per function for batches of any shape,
    and the distinct label shapes each function saw (bucket lengths and a short last batch)."""
    steps = _steps(_SummingModel())
    shapes = [(4, 8), (4, 16), (4, 8), (2, 16)]
    batches = [(np.zeros(shape, np.int32), np.full(shape, 3, np.int32)) for shape in shapes]
    sums = [[float(value) for value in steps.eval(batch)] for batch in batches]
    assert sums == [[96.0, 32.0], [192.0, 64.0], [96.0, 32.0], [96.0, 32.0]]
    assert [float(steps.train(batch)["loss"]) for batch in batches[:2]] == [96.0, 192.0]
    assert steps.shapes == {"train": {(4, 8), (4, 16)}, "eval": {(4, 8), (4, 16), (2, 16)}}
    assert steps.traces == {"train": 1, "eval": 1}


class _HostOpModel(_SummingModel):
    """A model whose steps run a host (NumPy) op, which XLA cannot compile."""

    def train_step(self, batch):
        import tensorflow as tf

        return {"loss": tf.numpy_function(lambda labels: np.float32(labels.sum()), [batch[1]], tf.float32)}

    def token_loss_sums(self, batch):
        loss = self.train_step(batch)["loss"]
        return loss, loss


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_steps_compile_with_xla_exactly_when_asked(jit_compile):
    import tensorflow as tf

    steps = _steps(_HostOpModel(), jit_compile)
    batch = (np.zeros([2, 4], np.int32), np.ones([2, 4], np.int32))
    for step in (steps.train, steps.eval):
        if jit_compile:  # XLA refuses the host op
            with pytest.raises(tf.errors.OpError, match="unsupported operations when trying to compile"):
                step(batch)
        else:
            assert float(tf.nest.flatten(step(batch))[0]) == 8.0


def _dropout_model():
    from keras_posenc.backend import keras

    model = keras.Sequential([keras.Input([2]), keras.layers.Dense(3), keras.layers.Dropout(0.5, seed=1)])
    model(np.ones([1, 2], np.float32), training=True)  # the dropout's random state exists now
    return model


def _state_variable(state):
    """A dropout state's variable: a `tf.random.Generator`'s (Keras 2), or the variable (Keras 3)."""
    import tensorflow as tf

    return state.state if isinstance(state, tf.random.Generator) else state


def test_a_checkpoint_of_another_input_pipeline_restores_all_but_the_batches(tmp_path):
    """A checkpoint whose saved `tf.data` iterator belongs to another pipeline: the model, the
    optimizer's step and the dropout state are restored, the batches are not (False), with a warning."""
    import tensorflow as tf

    from keras_posenc.backend import dropout_state, keras, make_deterministic

    checkpoints = _app("checkpoints")
    make_deterministic(7)
    saved, saved_optimizer = _dropout_model(), keras.optimizers.Adam()
    saved_optimizer.iterations.assign(7)
    saved_state = dropout_state(saved)
    for variable in map(_state_variable, saved_state):
        variable.assign(tf.fill(tf.shape(variable), tf.constant(5, variable.dtype)))
    path = tf.train.Checkpoint(model=saved, optimizer=saved_optimizer, dropout_rng=saved_state,
                               data=iter(tf.data.Dataset.range(8))).save(str(tmp_path / "ckpt"))

    model, optimizer = _dropout_model(), keras.optimizers.Adam()
    state = dropout_state(model)
    assert state and len(state) == len(saved_state)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, dropout_rng=state,
                                     data=iter(tf.data.Dataset.range(8).shuffle(4, seed=1)))
    with pytest.warns(UserWarning) as caught:
        assert checkpoints._restore(checkpoint, path, model, optimizer) is False
    assert [str(w.message) for w in caught if "pipeline" in str(w.message)] == [
        f"{path} holds the state of another input pipeline (written by an earlier keras-posenc): resumed "
        "the model, optimizer and dropout state; the batches restart from a fresh shuffle of the corpus, "
        "so the data order differs from an uninterrupted run."]
    for got, want in zip(model.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert int(optimizer.iterations.numpy()) == 7
    for got, want in zip(map(_state_variable, state), map(_state_variable, saved_state)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert (got.numpy() == 5).all()
    # The same pipeline: everything restored, no warning.
    same = tf.train.Checkpoint(model=model, optimizer=optimizer, dropout_rng=state,
                               data=iter(tf.data.Dataset.range(8)))
    assert checkpoints._restore(same, path, model, optimizer) is True


class _Manager:
    directory = "runs/x/checkpoints"

    def __init__(self, fail=None):
        self.saved, self.fail = [], fail

    def save(self, checkpoint_number):
        if self.fail is not None:
            raise self.fail
        self.saved.append(checkpoint_number)


class _Optimizer:
    def __init__(self):
        self.iterations = _Tensor(0)


def test_the_checkpoint_callback_saves_every_interval_and_the_last_step_once():
    checkpoints = _app("checkpoints")
    manager, optimizer = _Manager(), _Optimizer()
    callback = checkpoints.CheckpointCallback(manager, 3, optimizer)
    for step in range(1, 8):
        optimizer.iterations.value = step
        callback.on_train_batch_end(step - 1)
    callback.on_train_end()
    assert manager.saved == [3, 6, 7]
    callback.on_train_end()  # the same step again: not saved twice
    optimizer.iterations.value = 9
    callback.on_train_batch_end(8)  # a multiple of 3 already saved is written once
    callback.on_train_batch_end(8)
    assert manager.saved == [3, 6, 7, 9] and callback.last_written == 9


def test_a_failed_checkpoint_save_is_a_file_write_error_naming_the_checkpoint(tmp_path):
    import errno

    checkpoints = _app("checkpoints")
    optimizer = _Optimizer()
    optimizer.iterations.value = 4
    manager = _Manager(fail=OSError(errno.EACCES, "Permission denied"))
    manager.directory = str(tmp_path)
    callback = checkpoints.CheckpointCallback(manager, 2, optimizer)
    with pytest.raises(OSError) as error:
        callback.on_train_end()
    assert error.value.errno == errno.EACCES and f"{tmp_path}/ckpt-4" in str(error.value)
    assert callback.last_written is None


class _Checkpoint:
    """Stands in for `tf.train.Checkpoint`: restoring a prefix sets the optimizer's step, or fails."""

    def __init__(self, optimizer, steps, failures=()):
        self.optimizer, self.steps, self.failures, self.restored = optimizer, steps, failures, []

    def restore(self, path):
        self.restored.append(path)
        if path in self.failures:
            raise IndexError("Read less bytes than requested\nat offset 0")
        self.optimizer.iterations.value = self.steps[path]
        return self

    def assert_existing_objects_matched(self):
        return self


def test_a_checkpoint_holding_another_step_than_its_name_is_refused():
    checkpoints = _app("checkpoints")
    optimizer = _Optimizer()
    checkpoint = _Checkpoint(optimizer, {"run/ckpt-4": 5})
    with pytest.raises(ValueError) as error:
        checkpoints.restore_newest_readable([(4, "run/ckpt-4")], "run", ("batches", checkpoint), None,
                                            "model", optimizer)
    assert str(error.value) == "Checkpoint run/ckpt-4 holds optimizer step 5, not 4."


def test_an_unreadable_newest_checkpoint_gives_way_to_the_one_before_with_a_warning():
    checkpoints = _app("checkpoints")
    optimizer = _Optimizer()
    first = _Checkpoint(optimizer, {}, failures=("run/ckpt-6",))
    second = _Checkpoint(optimizer, {"run/ckpt-4": 4})
    with pytest.warns(UserWarning) as caught:
        found = checkpoints.restore_newest_readable([(4, "run/ckpt-4"), (6, "run/ckpt-6")], "run",
                                                    ("batches", first), lambda: ("fresh", second), "model",
                                                    optimizer)
    assert found == ("run/ckpt-4", "fresh", second) and first.restored == ["run/ckpt-6"]
    assert [str(w.message) for w in caught] == [
        "the newest checkpoint run/ckpt-6 is unreadable: ckpt-6 (IndexError: Read less bytes than "
        "requested); resuming from the previous readable one, run/ckpt-4 (step 4)."]
    # Three checkpoints, the newest two unreadable: the warning names the newest and both errors.
    third = _Checkpoint(optimizer, {"run/ckpt-4": 4}, failures=("run/ckpt-6",))
    tries = iter([("second", third), ("third", second)])
    newest = _Checkpoint(optimizer, {}, failures=("run/ckpt-8",))
    with pytest.warns(UserWarning) as caught:
        found = checkpoints.restore_newest_readable([(4, "run/ckpt-4"), (6, "run/ckpt-6"), (8, "run/ckpt-8")],
                                                    "run", ("batches", newest), lambda: next(tries), "model",
                                                    optimizer)
    assert found == ("run/ckpt-4", "third", second)
    assert [str(w.message) for w in caught] == [
        "the newest checkpoint run/ckpt-8 is unreadable: ckpt-8 (IndexError: Read less bytes than "
        "requested); ckpt-6 (IndexError: Read less bytes than requested); resuming from the previous "
        "readable one, run/ckpt-4 (step 4)."]
    with pytest.raises(ValueError) as error:
        checkpoints.restore_newest_readable([(6, "run/ckpt-6")], "run", ("batches", first), None, "model",
                                            optimizer)
    assert str(error.value) == ("Cannot resume from run: none of its 1 checkpoints is readable (ckpt-6 "
                                "(IndexError: Read less bytes than requested)). Start a fresh run (without "
                                "--resume) or use another --out.")
