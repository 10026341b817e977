"""Training: determinism, resume after a killed process, atomic checkpoints, tf.distribute."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from checkpoint_files import truncate_checkpoint
from stacks import once_on_keras3
from tiny_lm import TINY_TRAINER_MODEL

from keras_posenc.app import checkpoints, train_config, train_strategy
from keras_posenc.app import dataset as data
from keras_posenc.app.checkpoints import list_checkpoints
from keras_posenc.app.train import TrainConfig, train
from keras_posenc.backend import keras

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# mutmut's trampolines (`make mutation`) add frames between `train` and its warnings' stacklevel.
UNDER_MUTMUT = "mutmut" in sys.modules
TINY = {**TINY_TRAINER_MODEL, "steps": 6, "warmup_steps": 4, "checkpoint_every": 2}


def _weights(out):
    return keras.models.load_model(os.path.join(out, "model.keras"), compile=False).get_weights()


def _subprocess_env():
    path = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=path)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A short run that learns: the artifacts and report of a real training."""
    out = str(tmp_path_factory.mktemp("trained"))
    config = TrainConfig(corpus=corpus, out=out, **dict(TINY, steps=90, batch_size=16, dropout=0.0,
                                                         warmup_steps=20, lr_scale=2.0, checkpoint_every=30))
    return out, train(config)


def test_run_writes_artifacts_and_beats_unigram(trained):
    out, report = trained
    for name in ("model.keras", "spm.model", "report.json", "loss.png"):
        assert os.path.isfile(os.path.join(out, name)), name
    assert os.listdir(os.path.join(out, "logs"))  # TensorBoard event files
    assert open(os.path.join(out, "loss.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    on_disk = json.load(open(os.path.join(out, "report.json")))
    assert on_disk["steps"] == 90 and len(on_disk["losses"]) == 90
    assert on_disk["eval_perplexity"] == pytest.approx(np.exp(on_disk["eval_loss"]))
    assert on_disk["tokens_per_second"] > 0
    assert np.mean(report["losses"][-10:]) < np.mean(report["losses"][:10]) - 0.5
    assert report["eval_loss"] < report["unigram_eval_loss"] and report["beats_unigram"] is True
    assert [s for s, _ in list_checkpoints(os.path.join(out, "checkpoints"))] == [30, 60, 90]


def test_train_and_eval_steps_trace_once_and_see_one_batch_shape_per_bucket(trained):
    _, report = trained
    assert report["bucket_lengths"] == data.default_bucket_lengths(TINY["max_length"]) == [8, 16]
    assert report["traces"] == {"train": 1, "eval": 1}
    # At most one shape per bucket (so at most that many XLA compiles): the eval's last, short batch
    # is filled up to the batch size.
    assert 1 <= report["batch_shapes"]["train"] <= 2 and 1 <= report["batch_shapes"]["eval"] <= 2


def test_xla_runs_are_bit_identical_and_resume_exactly(corpus, tmp_path):
    xla = dict(TINY, jit_compile="on", dropout=0.1, max_length=32)
    first = train(TrainConfig(corpus=corpus, out=str(tmp_path / "a"), **xla))
    assert first["jit_compile"] is True and first["traces"] == {"train": 1, "eval": 1}
    assert first["bucket_lengths"] == [8, 16, 32]
    assert 1 <= first["batch_shapes"]["train"] <= 3 and 1 <= first["batch_shapes"]["eval"] <= 3
    out = str(tmp_path / "resumed")
    again = train(TrainConfig(corpus=corpus, out=out, **dict(xla, steps=4)))
    assert again["losses"] == first["losses"][:4]  # a second run's steps, bit for bit
    resumed = train(TrainConfig(corpus=corpus, out=out, resume=True, **xla))
    assert resumed["start_step"] == 4 and resumed["losses"] == first["losses"][4:]
    assert resumed["eval_loss"] == first["eval_loss"]
    for got, want in zip(_weights(out), _weights(str(tmp_path / "a"))):
        np.testing.assert_array_equal(got, want)


def test_jit_compile_on_needs_one_replica():
    class TwoReplicas:
        num_replicas_in_sync = 2

    with pytest.raises(ValueError, match=r"jit_compile='on' \(--jit-compile on\) needs one replica, got 2"):
        train_strategy.use_jit_compile("on", TwoReplicas())
    assert train_strategy.use_jit_compile("auto", TwoReplicas()) is False
    with pytest.raises(ValueError, match=r"`jit_compile` must be one of \('auto', 'on', 'off'\), got"):
        train_strategy.use_jit_compile("yes", TwoReplicas())


@once_on_keras3("the seed's plumbing is the package's; on Keras 2, test_resume_after_killed_process_matches_"
                "uninterrupted_run and test_xla_runs_are_bit_identical_and_resume_exactly repeat runs bit "
                "for bit")
def test_same_seed_gives_bit_identical_losses(corpus, tmp_path):
    runs = [train(TrainConfig(corpus=corpus, out=str(tmp_path / f"r{i}"), seed=seed, dropout=0.1, **TINY))
            for i, seed in enumerate((5, 5, 6))]
    assert runs[0]["losses"] == runs[1]["losses"]  # exact float equality
    assert runs[0]["losses"] != runs[2]["losses"]
    assert runs[0]["eval_loss"] == runs[1]["eval_loss"]


def test_resume_after_killed_process_matches_uninterrupted_run(corpus, tmp_path):
    steps = 40
    flags = ["--corpus", corpus, "--batch-size", "4", "--num-layers", "1", "--d-model", "16", "--num-heads",
             "2", "--dff", "32", "--max-length", "16", "--vocab-size", "150", "--warmup-steps", "4",
             "--checkpoint-every", "2", "--dropout", "0.1", "--quiet"]
    interrupted = str(tmp_path / "interrupted")
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_posenc.app.cli", "train", "--out", interrupted, "--steps", str(steps)]
        + flags, env=_subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt_dir = os.path.join(interrupted, "checkpoints")
    try:
        deadline = time.monotonic() + 120
        while not list_checkpoints(ckpt_dir) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, "the run ended before it could be interrupted"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    resumed_from = list_checkpoints(ckpt_dir)[-1][0]
    assert 2 <= resumed_from < steps
    assert not os.path.exists(os.path.join(interrupted, "model.keras"))

    from keras_posenc.app.cli import main

    assert main(["train", "--out", interrupted, "--steps", str(steps), "--resume"] + flags) == 0
    report = json.load(open(os.path.join(interrupted, "report.json")))
    assert report["start_step"] == resumed_from and report["steps"] == steps
    assert len(report["losses"]) == steps - resumed_from

    reference = str(tmp_path / "reference")
    expected = train(TrainConfig(corpus=corpus, out=reference, **dict(TINY, steps=steps, dropout=0.1)))
    assert report["losses"] == expected["losses"][resumed_from:]
    for got, want in zip(_weights(interrupted), _weights(reference)):
        np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def four_steps(corpus, tmp_path_factory):
    """The folder of a finished 4-step run (checkpoints at 2 and 4); tests resume copies of it."""
    out = str(tmp_path_factory.mktemp("four_steps") / "run")
    train(TrainConfig(corpus=corpus, out=out, **dict(TINY, steps=4)))
    return out


def _copy_of(run, tmp_path):
    return shutil.copytree(run, str(tmp_path / "run"))


def test_files_of_an_interrupted_save_are_ignored(corpus, four_steps, tmp_path):
    out = _copy_of(four_steps, tmp_path)
    ckpt_dir = os.path.join(out, "checkpoints")
    assert [s for s, _ in list_checkpoints(ckpt_dir)] == [2, 4]
    # A save killed half-way leaves its temporary shards, or an index the state file never named.
    os.makedirs(os.path.join(ckpt_dir, "ckpt-6_temp"))
    open(os.path.join(ckpt_dir, "ckpt-6_temp", "part-00000-of-00001.data-00000-of-00001"), "w").write("half")
    open(os.path.join(ckpt_dir, "ckpt-8.index"), "w").write("garbage")
    assert [s for s, _ in list_checkpoints(ckpt_dir)] == [2, 4]
    report = train(TrainConfig(corpus=corpus, out=out, resume=True, **dict(TINY, steps=6)))
    assert report["start_step"] == 4 and report["steps"] == 6


def test_a_save_that_fails_half_way_leaves_the_previous_checkpoint_the_latest(tmp_path, monkeypatch):
    import tensorflow as tf

    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=step)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=3, step_counter=step)
    step.assign(2)
    manager.save(checkpoint_number=2)

    def failing_write(self, prefix, **kwargs):
        open(prefix + ".index", "w").write("half")
        raise OSError("disk full")

    monkeypatch.setattr(tf.train.Checkpoint, "_write", failing_write)
    step.assign(4)
    with pytest.raises(OSError, match="disk full"):
        manager.save(checkpoint_number=4)
    assert [n for n, _ in list_checkpoints(str(tmp_path))] == [2]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")


def test_checkpoints_hold_the_data_iterator(trained):
    import tensorflow as tf

    out, _ = trained
    _, prefix = list_checkpoints(os.path.join(out, "checkpoints"))[-1]
    keys = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    assert any(key.startswith("data/") for key in keys), sorted(keys)[:10]


def test_resume_with_another_model_config_names_each_difference(corpus, trained):
    out, _ = trained
    with pytest.raises(ValueError, match=r"different model config \(d_model: checkpoint 16 vs now 24; "
                                         r"dff: checkpoint 32 vs now 48\)"):
        train(TrainConfig(corpus=corpus, out=out, resume=True, **dict(TINY, d_model=24, dff=48, dropout=0.0)))


# Eval loss of a 2-replica run against one device after 6 steps: see the mirrored test.
EVAL_RTOL = 5e-3
# Their training losses: the same noise, smaller after fewer updates (see there).
LOSS_RTOL = 1e-4
MIRRORED_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from keras_posenc.app.train import TrainConfig, train
    corpus, out, tiny = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    mirrored = train(TrainConfig(corpus=corpus, out=out + "/mirrored", strategy="mirrored", **tiny))
    # 5 examples in batches of 4: the last batch's one row goes to replica 0, replica 1 gets none.
    import numpy as np
    from keras_posenc.models import CausalLM
    from keras_posenc.app.train_steps import TrainSteps, evaluate
    rng = np.random.default_rng(0)
    features = rng.integers(1, 30, (5, 6)).astype(np.int32)
    labels = rng.integers(0, 30, (5, 6)).astype(np.int32)
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = CausalLM(dict(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=30, max_length=16))
        model.build_on_dummy()
    ragged = tf.data.Dataset.from_tensor_slices((features, labels)).batch(4)
    ragged_eval = evaluate(TrainSteps(model, strategy, ragged.element_spec, jit_compile=False), ragged)
    logits = model(tf.constant(features)).numpy().astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    print(json.dumps([mirrored["losses"], mirrored["num_replicas"], mirrored["eval_loss"], ragged_eval,
                      -picked[labels != 0].mean()]))
""")


# The run the two-replica runs (mirrored, multi-worker) are compared with: the same settings on one device.
ONE_DEVICE = dict(TINY, dropout=0.0, lr_scale=4.0)


@pytest.fixture(scope="module")
def one_device(corpus, tmp_path_factory):
    return train(TrainConfig(corpus=corpus, out=str(tmp_path_factory.mktemp("one_device")), **ONE_DEVICE))


def test_mirrored_strategy_on_two_devices_matches_single_device(corpus, one_device, tmp_path):
    command = [sys.executable, "-c", MIRRORED_SCRIPT, corpus, str(tmp_path), json.dumps(ONE_DEVICE)]
    result = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    last_line = result.stdout.strip().splitlines()[-1]
    mirrored, replicas, mirrored_eval, ragged, ragged_expected = json.loads(last_line)
    single, single_eval = one_device["losses"], one_device["eval_loss"]
    assert replicas == 2
    # The only difference from one device is float summation order: each replica's half-batch gradient,
    # then their sum. The training losses of these 6 steps agree to 3e-7 relative on Keras 2 and to 1.3e-5
    # (the last step) on Keras 3 here: `LOSS_RTOL`. The eval loss after them does not, by an amount that
    # depends on the CPU: Adam (epsilon 1e-9, peak learning rate 0.5 here) turns the rounding noise of
    # gradients that are zero in exact arithmetic (the attention key bias: softmax ignores a shift of all
    # keys) into steps of about the learning rate. Measured: 1.3e-7 (Keras 2) and 8.2e-6 (Keras 3)
    # relative where this test was written, 7.5e-4 (Keras 3) on an Intel Xeon with AVX-512; the same half-
    # batch reordering on one device moves it by 7e-7 to 2.9e-4 over seeds 0-4. Training on half of each
    # batch (batch 2 for 4, as a mirrored step that lost one replica) moves it by 2.3e-2 (Keras 2) and
    # 3.5e-2 (Keras 3): `EVAL_RTOL` sits between.
    np.testing.assert_allclose(mirrored, single, rtol=LOSS_RTOL)
    assert single[0] != single[-1]  # the weights did change between steps
    assert mirrored_eval == pytest.approx(single_eval, rel=EVAL_RTOL)
    assert ragged == pytest.approx(ragged_expected, rel=1e-6)


def test_strategy_and_config_errors(corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="needs the TF_CONFIG environment variable"):
        train_strategy.make_strategy("multiworker")
    with pytest.raises(ValueError, match=r"`strategy` must be one of .* got strategy='tpu'"):
        train_strategy.make_strategy("tpu")
    with pytest.raises(ValueError, match="`steps` must be a positive int, got steps=0"):
        train(TrainConfig(corpus=corpus, out=str(tmp_path), **dict(TINY, steps=0)))


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_multiworker_on_localhost_matches_single_device(corpus, one_device, tmp_path):
    cluster = {"worker": [f"localhost:{port}" for port in _free_ports(2)]}
    out = str(tmp_path / "multi")
    flags = ["--corpus", corpus, "--out", out, "--strategy", "multiworker", "--quiet",
             "--steps", str(ONE_DEVICE["steps"]), "--batch-size", str(ONE_DEVICE["batch_size"]),
             "--num-layers", "1", "--d-model", "16", "--num-heads", "2", "--dff", "32",
             "--max-length", "16", "--vocab-size", "150", "--warmup-steps", "4", "--dropout", "0",
             "--lr-scale", "4", "--checkpoint-every", "2"]
    workers = [
        subprocess.Popen([sys.executable, "-m", "keras_posenc.app.cli", "train"] + flags,
                         env=dict(_subprocess_env(), TF_CONFIG=json.dumps(
                             {"cluster": cluster, "task": {"type": "worker", "index": index}})),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for index in range(2)]
    for worker in workers:
        _, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr[-3000:]
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)  # written by the chief (worker 0) only
    assert report["num_replicas"] == 2
    # Same float summation order as the mirrored test, same bounds (see there).
    np.testing.assert_allclose(report["losses"], one_device["losses"], rtol=LOSS_RTOL)
    assert report["eval_loss"] == pytest.approx(one_device["eval_loss"], rel=EVAL_RTOL)
    assert [step for step, _ in list_checkpoints(os.path.join(out, "checkpoints"))] == [2, 4, 6]


def test_warmup_defaults_to_half_the_steps_and_a_resume_keeps_it(corpus, tmp_path):
    out = str(tmp_path / "run")
    first = train(TrainConfig(corpus=corpus, out=out, **dict(TINY, steps=8, warmup_steps=None)))
    assert first["warmup_steps"] == train_config.default_warmup_steps(8) == 4
    resumed = train(TrainConfig(corpus=corpus, out=out, resume=True,
                                **dict(TINY, steps=16, warmup_steps=None)))
    assert resumed["start_step"] == 8 and resumed["warmup_steps"] == 4  # not 16 // 2: same schedule


def test_explicit_warmup_not_below_the_steps_warns(corpus, tmp_path):
    message = r"--warmup-steps 6 >= --steps 6: the learning rate never leaves"
    with pytest.warns(UserWarning, match=message) as caught:
        train(TrainConfig(corpus=corpus, out=str(tmp_path), **dict(TINY, warmup_steps=6)))
    # The warning points at the caller's `train(...)` line.
    assert UNDER_MUTMUT or [w.filename for w in caught if "--warmup-steps" in str(w.message)] == [__file__]


def test_a_checkpoint_of_another_pipeline_resumes_model_and_optimizer(corpus, four_steps, tmp_path,
                                                                      monkeypatch):
    """A checkpoint from an earlier input pipeline (e.g. before the buckets) is not lost: the model,
    optimizer and step resume, the batches start afresh, and a warning says so."""
    out = _copy_of(four_steps, tmp_path)
    original = data.lm_dataset
    monkeypatch.setattr(data, "lm_dataset", lambda *a, **k: original(*a, **k).shuffle(4, seed=1))
    with pytest.warns(UserWarning, match="holds the state of another input pipeline"):
        report = train(TrainConfig(corpus=corpus, out=out, resume=True, **dict(TINY, steps=6)))
    # start_step is the restored optimizer's step count (train checks it against the checkpoint's).
    assert report["start_step"] == 4 and report["steps"] == 6
    # A truncated newest checkpoint: the run resumes from the one before, and the warning points at
    # the caller's `train(...)` line.
    newest = os.path.join(out, "checkpoints", "ckpt-6")
    truncate_checkpoint(newest)
    with pytest.warns(UserWarning, match=f"the newest checkpoint {newest} is unreadable") as caught:
        report = train(TrainConfig(corpus=corpus, out=out, resume=True, **dict(TINY, steps=6)))
    assert report["start_step"] == 4
    assert UNDER_MUTMUT or [w.filename for w in caught if "is unreadable" in str(w.message)] == [__file__]


def test_checkpoint_write_errors_are_one_line_naming_the_checkpoint(tmp_path):
    import tensorflow as tf

    folder = str(tmp_path)
    os.makedirs(os.path.join(folder, "ckpt-7_temp"))
    cases = [
        (tf.errors.ResourceExhaustedError(None, None, "{{function_node __wrapped__SaveV2}} x.tempstate1; "
                                          "No space left on device [Op:SaveV2]"), "No space left on device"),
        (tf.errors.PermissionDeniedError(None, None, "x; Permission denied"), "Permission denied"),
        (tf.errors.FailedPreconditionError(None, None, "x; Read-only file system"), "Read-only file system"),
        (tf.errors.UnknownError(None, None, "{{function_node SaveV2}} something\nelse"),
         "UnknownError: something"),
        (OSError(28, "No space left on device"), "No space left on device"),
    ]
    for error, reason in cases:
        written = checkpoints._checkpoint_write_error(folder, 7, error)
        assert isinstance(written, OSError)
        free = written.strerror.rsplit("(", 1)[1]
        assert written.strerror == f"cannot write {folder}/ckpt-7: {reason} ({free}", error
        assert re.fullmatch(rf"[0-9.]+ MB free in {re.escape(folder)}\)", free)
    assert os.listdir(folder) == []  # the save's temporary folder is removed
