"""Nothing of a run is lost: bad input, a second run, a signal, a full or read-only disk, a bad file.

Every case runs the command line as a user would (`cli.main`, or a subprocess where a signal or a
second process is the point) and asserts the exit status, the one-line message without a
traceback, and that the earlier run's files are byte-identical afterwards (sha256 of every file).
The disk-full and read-only cases mount a small tmpfs (root only; skipped elsewhere with the
reason), unmounted again after each test.
"""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from checkpoint_files import truncate_checkpoint
from stacks import once_on_keras2

from keras_posenc.app import checkpoints, cli, train_logs
from keras_posenc.app import dataset as data
from keras_posenc.app import train as train_lib
from keras_posenc.app.checkpoints import list_checkpoints
from keras_posenc.app.run_lock import LOCK_FILE, RunLockedError, run_lock
from keras_posenc.backend import is_tensorflow

pytestmark = pytest.mark.skipif(not is_tensorflow(), reason="the trainer and the CLI run on TensorFlow")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--batch-size", "4", "--num-layers", "1", "--d-model", "16", "--num-heads", "2", "--dff", "32",
         "--max-length", "16", "--vocab-size", "150", "--warmup-steps", "2", "--checkpoint-every", "2",
         "--dropout", "0.1", "--quiet"]
STEPS = 4


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _snapshot(folder):
    """sha256 of every file under `folder`, by relative path."""
    digests = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digests[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return digests


def _error_line(err):
    """The one `keras-posenc: error:` line of a command's stderr (warnings may precede it)."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert lines and all(line.startswith("keras-posenc: ") for line in lines), err
    errors = [line for line in lines if line.startswith("keras-posenc: error: ")]
    assert len(errors) == 1, err
    return errors[0]


@pytest.fixture(scope="module")
def earlier_run(corpus, tmp_path_factory):
    """A finished run (checkpoints at steps 2 and 4) and its report; tests work on copies of it."""
    out = str(tmp_path_factory.mktemp("earlier") / "run")
    assert cli.main(["train", "--corpus", corpus, "--out", out, "--steps", str(STEPS)] + FLAGS) == 0
    with open(os.path.join(out, "report.json")) as f:
        return out, json.load(f)


@pytest.fixture
def run_copy(earlier_run, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(earlier_run[0], out)
    return out


def _train(corpus, out, *extra):
    return cli.main(["train", "--corpus", corpus, "--out", out] + FLAGS + list(extra))


# 1. Validation before the run folder is touched ------------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--d-model", "30", "--num-heads", "4"],
     "`d_model` must be divisible by `num_heads`, got d_model=30 and num_heads=4."),
    (["--eval-fraction", "1.5"], "`eval_fraction` (--eval-fraction) must be in (0, 1), got 1.5."),
    (["--lr-scale", "0"], "`lr_scale` (--lr-scale) must be > 0, got 0.0."),
    (["--format", "tsv"], "line 1 has no tab"),
    (["--resume", "--d-model", "24", "--dff", "48"],
     "different model config (d_model: checkpoint 16 vs now 24; dff: checkpoint 32 vs now 48)"),
], ids=["heads", "eval-fraction", "lr-scale", "corpus", "resume-config"])
def test_a_bad_setting_into_an_earlier_run_changes_nothing(corpus, run_copy, extra, message, capsys):
    before = _snapshot(run_copy)
    assert _train(corpus, run_copy, *extra) == 2
    assert message in _error_line(capsys.readouterr().err)
    assert _snapshot(run_copy) == before


def test_a_missing_corpus_changes_nothing_in_train_or_ablate(run_copy, capsys):
    before = _snapshot(run_copy)
    assert cli.main(["train", "--corpus", "missing.txt", "--out", run_copy] + FLAGS) == 2
    assert "Corpus file not found" in _error_line(capsys.readouterr().err)
    assert cli.main(["ablate", "--quick", "--corpus", "missing.txt", "--out", run_copy]) == 2
    assert "missing.txt" in _error_line(capsys.readouterr().err)
    assert _snapshot(run_copy) == before


# 2. One writer per run folder --------------------------------------------------------------------
HOLDER = ("import sys; from keras_posenc.app.run_lock import run_lock; lock = run_lock(sys.argv[1]); "
          "lock.__enter__(); print('locked', flush=True); sys.stdin.read()")


def _holder(folder):
    process = subprocess.Popen([sys.executable, "-c", HOLDER, folder], env=_env(), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


@once_on_keras2("the run lock is the package's own file lock; test_sigterm_during_training_saves_a_"
                "checkpoint_and_exits_143 has a second run refused by a running one on both stacks")
def test_a_second_run_refuses_and_a_killed_holder_is_taken_over(corpus, earlier_run, run_copy, capsys):
    before = _snapshot(run_copy)
    holder = _holder(run_copy)
    try:
        for argv in (["train", "--corpus", corpus, "--out", run_copy] + FLAGS,
                     ["demo", "--out", run_copy, "--steps", "2"],
                     ["ablate", "--quick", "--out", run_copy]):
            assert cli.main(argv) == 2, argv
            line = _error_line(capsys.readouterr().err)
            assert line == (f"keras-posenc: error: {run_copy} is in use by another keras-posenc run (pid "
                            f"{holder.pid}, lock file {os.path.join(run_copy, LOCK_FILE)}): wait for it to "
                            "end or pick another --out."), argv
        lock_digest = hashlib.sha256(str(holder.pid).encode()).hexdigest()
        assert _snapshot(run_copy) == {**before, LOCK_FILE: lock_digest}
    finally:
        holder.kill()  # SIGKILL: the lock file stays, with the dead holder's pid in it
        holder.wait()
    assert open(os.path.join(run_copy, LOCK_FILE)).read() == str(holder.pid)

    # The next run takes the lock over, says what it replaces, and trains the same run again.
    assert _train(corpus, run_copy, "--steps", str(STEPS)) == 0
    captured = capsys.readouterr()
    assert (f"keras-posenc: warning: took over the lock of {run_copy} from pid {holder.pid}, which is no "
            "longer running") in captured.err
    replaced = (f"Replacing the earlier run in {run_copy} (a fresh run; --resume would continue it): "
                "checkpoints/ (steps 2, 4), logs/, model.keras, spm.model, report.json, loss.png.")
    assert replaced in captured.out.splitlines()
    with open(os.path.join(run_copy, "report.json")) as f:
        assert json.load(f)["losses"] == earlier_run[1]["losses"]  # bit-identical rerun
    assert not os.path.exists(os.path.join(run_copy, LOCK_FILE))


def test_the_lock_without_flock_goes_by_the_pid_in_the_file(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    folder = str(tmp_path / "run")
    os.makedirs(folder)
    lock_path = os.path.join(folder, LOCK_FILE)
    with open(lock_path, "w") as f:
        f.write(str(os.getppid()))  # a live process
    with pytest.raises(RunLockedError, match=rf"in use by another keras-posenc run \(pid {os.getppid()},"):
        with run_lock(folder):
            pass
    gone = subprocess.Popen(["true"])
    gone.wait()
    with open(lock_path, "w") as f:
        f.write(str(gone.pid))
    with pytest.warns(UserWarning, match=rf"took over the lock of .* from pid {gone.pid}"):
        with run_lock(folder) as lock:
            assert open(lock.path).read() == str(os.getpid())
    assert os.listdir(folder) == []


# 3 and 5. Atomic files; a full disk, a read-only folder -------------------------------------------
@pytest.fixture
def tmpfs(tmp_path):
    """A 24 MB tmpfs (root only), unmounted after the test."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: the disk-full cases need a small tmpfs")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}): the disk-full cases need root")
    try:
        yield str(mount_point)
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)  # a writer still holds a file


def _fill(folder):
    """Writes a file into `folder` until its file system is full."""
    with open(os.path.join(folder, "filler"), "wb", buffering=0) as f:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                continue


def _assert_no_temporary_files(folder):
    leftovers = [os.path.join(root, name) for root, dirs, files in os.walk(folder) for name in files + dirs
                 if name.startswith(".tmp-") or name.endswith("_temp")]
    assert leftovers == []


@pytest.mark.parametrize("where", ["checkpoint", "model"])
def test_a_full_disk_is_one_line_and_keeps_the_earlier_run(corpus, earlier_run, tmpfs, where, monkeypatch,
                                                           capsys):
    out = os.path.join(tmpfs, "run")
    shutil.copytree(earlier_run[0], out)
    before = _snapshot(out)
    if where == "checkpoint":
        original = checkpoints.CheckpointCallback._write

        def write(self):
            _fill(tmpfs)
            original(self)

        monkeypatch.setattr(checkpoints.CheckpointCallback, "_write", write)
        failed = os.path.join(out, "checkpoints", "ckpt-5")
    else:
        from keras_posenc.backend import save_model

        def save(model, path):
            _fill(tmpfs)
            save_model(model, path)

        monkeypatch.setattr(train_lib, "save_model", save)
        failed = os.path.join(out, "model.keras")
    assert _train(corpus, out, "--resume", "--steps", str(STEPS + 1)) == 2
    line = _error_line(capsys.readouterr().err)
    assert re.fullmatch(rf"keras-posenc: error: cannot write {re.escape(failed)}: No space left on device "
                        rf"\(0\.0 MB free in {re.escape(os.path.dirname(failed))}\)", line), line
    after = _snapshot(out)
    if where == "checkpoint":
        assert after == {**before, **{k: v for k, v in after.items() if k.startswith("logs")}}
    else:  # the step-5 checkpoint was written before the disk filled
        assert {k: after[k] for k in before if not k.startswith("checkpoints")} == \
            {k: v for k, v in before.items() if not k.startswith("checkpoints")}
        assert [step for step, _ in list_checkpoints(os.path.join(out, "checkpoints"))] == [2, 4, 5]
    _assert_no_temporary_files(out)
    assert not os.path.exists(os.path.join(out, LOCK_FILE))


def test_tensorflows_disk_full_error_at_a_checkpoint_is_one_line(corpus, run_copy, monkeypatch, capsys):
    """The same case without a tmpfs (any user): TensorFlow's own error type and message."""
    import tensorflow as tf

    def full(self, checkpoint_number=None, **kwargs):
        temp = os.path.join(self.directory, f"ckpt-{checkpoint_number}_temp")
        os.makedirs(temp)
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{{{{function_node __wrapped__SaveV2}}}} {temp}/part-00000-of-00001.data-00000-of-"
            "00001.tempstate1; No space left on device [Op:SaveV2]")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", full)
    before = _snapshot(run_copy)
    assert _train(corpus, run_copy, "--resume", "--steps", str(STEPS + 1)) == 2
    failed = os.path.join(run_copy, "checkpoints", "ckpt-5")
    line = _error_line(capsys.readouterr().err)
    assert re.fullmatch(rf"keras-posenc: error: cannot write {re.escape(failed)}: No space left on device "
                        rf"\([0-9.]+ MB free in {re.escape(os.path.dirname(failed))}\)", line), line
    after = _snapshot(run_copy)
    assert after == {**before, **{k: v for k, v in after.items() if k.startswith("logs")}}
    _assert_no_temporary_files(run_copy)


def test_a_read_only_out_fails_before_the_tokenizer_is_trained(corpus, earlier_run, tmp_path, monkeypatch,
                                                               capsys):
    out = str(tmp_path / "ro" / "run")
    os.makedirs(os.path.dirname(out))
    if os.geteuid() == 0:  # root writes through permission bits: only a read-only mount stops it
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", os.path.dirname(out)],
                                 capture_output=True, text=True)
        if mounted.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        shutil.copytree(earlier_run[0], out)
        if os.geteuid() == 0:
            subprocess.run(["mount", "-o", "remount,ro", os.path.dirname(out)], check=True)
            reason = "Read-only file system"
        else:
            os.chmod(out, 0o555)
            reason = "Permission denied"
        before = _snapshot(out)

        def trained(*args, **kwargs):
            raise AssertionError("the tokenizer was trained before the folder was found read-only")

        monkeypatch.setattr(data, "train_sentencepiece", trained)
        assert _train(corpus, out, "--steps", "2") == 2
        line = _error_line(capsys.readouterr().err)
        assert re.fullmatch(rf"keras-posenc: error: cannot write {re.escape(os.path.join(out, LOCK_FILE))}: "
                            rf"{reason} \([0-9.]+ MB free in {re.escape(out)}\)", line), line
        assert _snapshot(out) == before
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", os.path.dirname(out)], capture_output=True)
        else:
            os.chmod(out, 0o755)


def test_a_failed_model_save_leaves_the_previous_file(tmp_path, monkeypatch):
    from keras_posenc.backend import keras, save_model
    from keras_posenc.models import CausalLM

    model = CausalLM({"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 20,
                      "max_length": 8})
    model.build_on_dummy()
    path = str(tmp_path / "model.keras")
    save_model(model, path)
    before = _snapshot(str(tmp_path))

    def half_then_fail(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"PK\x03\x04 half a zip")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(type(model), "save", half_then_fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        save_model(model, path)
    assert _snapshot(str(tmp_path)) == before
    monkeypatch.undo()
    loaded = keras.models.load_model(path, compile=False)
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)


# 4. Resume that survives a bad checkpoint; signals --------------------------------------------------
def test_resume_after_a_truncated_newest_checkpoint_continues_from_the_previous(corpus, earlier_run, run_copy,
                                                                                  capsys):
    ckpt_dir = os.path.join(run_copy, "checkpoints")
    truncate_checkpoint(os.path.join(ckpt_dir, "ckpt-4"))
    assert _train(corpus, run_copy, "--resume", "--steps", str(STEPS)) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (f"keras-posenc: warning: the newest checkpoint {ckpt_dir}/ckpt-4 is unreadable: ckpt-4 "
            "(IndexError: Read less bytes than requested); resuming from the previous readable one, "
            f"{ckpt_dir}/ckpt-2 (step 2).") in err
    with open(os.path.join(run_copy, "report.json")) as f:
        report = json.load(f)
    assert report["start_step"] == 2 and report["losses"] == earlier_run[1]["losses"][2:]  # exact


def test_resume_with_no_readable_checkpoint_names_the_folder(corpus, run_copy, capsys):
    ckpt_dir = os.path.join(run_copy, "checkpoints")
    for step in (2, 4):
        truncate_checkpoint(os.path.join(ckpt_dir, f"ckpt-{step}"))
    before = _snapshot(run_copy)
    assert _train(corpus, run_copy, "--resume", "--steps", "6") == 2
    assert _error_line(capsys.readouterr().err) == (
        f"keras-posenc: error: Cannot resume from {ckpt_dir}: none of its 2 checkpoints is readable (ckpt-4 "
        "(IndexError: Read less bytes than requested); ckpt-2 (IndexError: Read less bytes than requested)). "
        "Start a fresh run (without --resume) or use another --out.")
    assert _snapshot(run_copy) == before


def test_sigint_saves_a_checkpoint_then_exits_130_and_resumes_exactly(corpus, earlier_run, tmp_path,
                                                                      monkeypatch, capsys,
                                                                      python_sigint_handler):
    original = train_logs.StepLog.on_train_batch_end

    def interrupt_after_step_3(self, batch, logs=None):
        original(self, batch, logs)
        if len(self.losses) == 3:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(train_logs.StepLog, "on_train_batch_end", interrupt_after_step_3)
    out = str(tmp_path / "run")
    assert _train(corpus, out, "--steps", "100") == 128 + signal.SIGINT
    ckpt = os.path.join(out, "checkpoints", "ckpt-3")
    assert capsys.readouterr().err.strip() == (f"keras-posenc: stopped by SIGINT at step 3: saved the "
                                               f"checkpoint {ckpt}; continue with --resume.")
    assert [step for step, _ in list_checkpoints(os.path.join(out, "checkpoints"))] == [2, 3]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    monkeypatch.undo()
    assert _train(corpus, out, "--resume", "--steps", str(STEPS)) == 0
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    assert report["start_step"] == 3 and report["losses"] == earlier_run[1]["losses"][3:]


def test_sigterm_during_training_saves_a_checkpoint_and_exits_143(corpus, tmp_path, capsys):
    out = str(tmp_path / "run")
    process = subprocess.Popen([sys.executable, "-m", "keras_posenc.app.cli", "train", "--corpus", corpus,
                                "--out", out, "--steps", "100000"] + FLAGS,
                               env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while (not list_checkpoints(os.path.join(out, "checkpoints")) and process.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before the signal"
        # A second run into the folder refuses at once, naming the running one.
        assert _train(corpus, out, "--steps", "2") == 2
        line = _error_line(capsys.readouterr().err)
        assert f"{out} is in use by another keras-posenc run (pid {process.pid}," in line
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(r"keras-posenc: stopped by SIGTERM at step (\d+): saved the checkpoint (.*); "
                         r"continue with --resume\.", last)
    assert match, last
    step = int(match.group(1))
    assert 2 <= step < 100000
    assert match.group(2) == os.path.join(out, "checkpoints", f"ckpt-{step}")
    assert list_checkpoints(os.path.join(out, "checkpoints"))[-1] == (step, match.group(2))
    assert not os.path.exists(os.path.join(out, LOCK_FILE))
    assert not os.path.exists(os.path.join(out, "model.keras"))


# 6. An unreadable model file is named ---------------------------------------------------------------
@pytest.mark.parametrize("command", ["generate", "inspect"])
def test_a_corrupt_model_file_is_named(earlier_run, tmp_path, command, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(os.path.join(earlier_run[0], "spm.model"), folder)
    model = folder / "model.keras"
    model.write_bytes(np.random.default_rng(0).bytes(4096))
    before = _snapshot(str(folder))
    argv = ["generate", str(folder), "--prompt", "x"] if command == "generate" else ["inspect", str(model)]
    assert cli.main(argv) == 2
    line = _error_line(capsys.readouterr().err)
    assert line.startswith(f"keras-posenc: error: cannot load a Keras model from '{model}': "), line
    assert _snapshot(str(folder)) == before
