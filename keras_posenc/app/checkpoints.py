"""The checkpoints of a training run: where they are, how they are saved, checked and restored.

`tf.train.CheckpointManager` saves the model, the optimizer (its step drives
the learning-rate schedule), the dropout generators and the `tf.data`
iterator of the training batches. The manager names a checkpoint in its state
file only after all its files are written, so a crash never leaves a
half-written checkpoint that a resume would read; it also rotates old ones.
An unreadable newest checkpoint (a truncated file) is skipped on `--resume`
for the one before it (`restore_newest_readable`). `checkpoints/config.json`
holds the model config, compared on `--resume` (`check_checkpoint_config`),
and `checkpoints/schedule.json` the warmup the run started with. A resumed
run continues at the same step, learning rate and data position: the
iterator state is restored, not replayed, so a resume costs the same at step
200 and at step 20,000.

Example:

>>> import tempfile
>>> out = tempfile.mkdtemp()
>>> list_checkpoints(checkpoint_dir(out))  # no run there yet
[]

References:
    - TensorFlow, "Training checkpoints" (`tf.train.CheckpointManager`),
      https://www.tensorflow.org/guide/checkpoint.
    - TensorFlow, "tf.data: checkpointing", https://www.tensorflow.org/guide/data#checkpointing.
"""

import errno
import json
import os
import shutil
import warnings

import tensorflow as tf

from keras_posenc.backend import dropout_state, keras
from keras_posenc.files import FileWriteError, describe_write_error, is_disk_full, write_json

__all__ = ["CONFIG_FILE", "CheckpointCallback", "SCHEDULE_FILE", "check_checkpoint_config", "checkpoint_dir",
           "list_checkpoints", "restore_newest_readable", "write_json_atomically"]

CONFIG_FILE = "config.json"
SCHEDULE_FILE = "schedule.json"


def checkpoint_dir(out):
    """The checkpoint folder of the run folder `out`: `<out>/checkpoints`."""
    return os.path.join(out, "checkpoints")


def list_checkpoints(directory):
    """`[(step, prefix)]` of the complete checkpoints in `directory`, oldest first.

    Reads the state file of `tf.train.CheckpointManager`, which names a
    checkpoint only after all its files are written, so the files of a save
    that a crash interrupted are never listed.

    Args:
        directory: str, a checkpoint folder (`<out>/checkpoints`); it need
            not exist.

    Returns:
        list of `(int step, str prefix)` sorted by step; `prefix` is what
        `tf.train.Checkpoint.restore` takes.

    Example:

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> list_checkpoints(directory), list_checkpoints(os.path.join(directory, "missing"))
    ([], [])
    >>> step = tf.Variable(0, dtype=tf.int64)
    >>> manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), directory, max_to_keep=2,
    ...                                      step_counter=step)
    >>> for _ in range(3):
    ...     _ = step.assign_add(5)
    ...     _ = manager.save(checkpoint_number=step)
    >>> [(n, os.path.basename(prefix)) for n, prefix in list_checkpoints(directory)]
    [(10, 'ckpt-10'), (15, 'ckpt-15')]
    """
    state = tf.train.get_checkpoint_state(directory) if os.path.isdir(directory) else None
    if state is None:
        return []
    found = [(int(prefix.rsplit("-", 1)[1]), prefix) for prefix in state.all_model_checkpoint_paths
             if os.path.isfile(prefix + ".index")]
    return sorted(found)


def write_json_atomically(path, content):
    """Writes `content` as JSON to `path` (atomically, keys sorted): `config.json`, `schedule.json`."""
    write_json(path, content, indent=1, sort_keys=True)


def check_checkpoint_config(directory, expected):
    """Checks that the checkpoints in `directory` were trained with the model config `expected`.

    Args:
        directory: str, a checkpoint folder with `CONFIG_FILE`.
        expected: dict, this run's model config (`TrainConfig.model_config`).

    Raises:
        ValueError: no `CONFIG_FILE`, or a config that differs (naming every setting that does).
    """
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"Cannot resume from {directory}: it has no {CONFIG_FILE} with the model config.")
    with open(path) as f:
        stored = json.load(f)
    keys = sorted(set(stored) | set(expected))
    diffs = [f"{k}: checkpoint {stored.get(k)!r} vs now {expected.get(k)!r}"
             for k in keys if stored.get(k) != expected.get(k)]
    if diffs:
        raise ValueError(f"Cannot resume from {directory}: it was trained with a different model config ("
                         + "; ".join(diffs) + "). Use the same flags, or a new --out without --resume.")


class CheckpointCallback(keras.callbacks.Callback):
    """Saves through `manager` every `every` optimizer steps and at the end.

    Args:
        manager: a `tf.train.CheckpointManager`; each save is numbered by the optimizer step.
        every: int, optimizer steps between saves.
        optimizer: the run's optimizer (its `iterations` is the step).

    Raises:
        FileWriteError: a save fails (full disk, read-only folder); the message names the
            checkpoint, the reason and the free space.
    """

    def __init__(self, manager, every, optimizer):
        super().__init__()
        self.manager, self.every, self.optimizer = manager, every, optimizer
        self.last_written = None

    def _write(self):
        step = int(self.optimizer.iterations.numpy())
        if step != self.last_written:
            try:
                self.manager.save(checkpoint_number=step)
            except (tf.errors.OpError, OSError) as error:
                raise _checkpoint_write_error(self.manager.directory, step, error) from error
            self.last_written = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.optimizer.iterations.numpy()) % self.every == 0:
            self._write()

    def on_train_end(self, logs=None):
        self._write()


def _checkpoint_write_error(directory, step, error):
    """`FileWriteError` for a failed checkpoint save: the checkpoint's path, the reason, the free space.

    TensorFlow reports a full disk as `ResourceExhaustedError` ("...; No space left on device") and
    other file-system failures as other `tf.errors`; the message becomes one line. The save's
    temporary folder (`ckpt-N_temp`) is removed: the manager never named it, and it holds space.
    """
    prefix = os.path.join(directory, f"ckpt-{step}")
    shutil.rmtree(prefix + "_temp", ignore_errors=True)
    text = str(error)
    if is_disk_full(error):
        code, reason = errno.ENOSPC, "No space left on device"
    elif isinstance(error, OSError) and error.strerror:
        code, reason = error.errno, error.strerror
    elif isinstance(error, tf.errors.PermissionDeniedError) or "Permission denied" in text:
        code, reason = errno.EACCES, "Permission denied"
    elif "Read-only file system" in text:
        code, reason = errno.EROFS, "Read-only file system"
    else:
        code = errno.EIO
        reason = f"{type(error).__name__}: " + (text.split("}}")[-1].strip().splitlines() or [""])[0]
    return FileWriteError(code, describe_write_error(prefix, OSError(code, reason)))


def restore_newest_readable(checkpoints, directory, first, new_checkpoint, model, optimizer):
    """Restores the newest readable checkpoint of `checkpoints`; returns `(prefix, batches, checkpoint)`.

    A checkpoint whose files are truncated or corrupt (TensorFlow raises `IndexError: Read less
    bytes than requested` or a `tf.errors.OpError`) is skipped for the one before it, with a
    warning that names both. `first` is the `(batches, checkpoint)` to try first; every later try
    gets a fresh pair from `new_checkpoint()`.

    Args:
        checkpoints: the `list_checkpoints` of `directory`, oldest first.
        directory: str, the checkpoint folder (for the messages).
        first: `(batches, checkpoint)`, the iterator and the `tf.train.Checkpoint` that holds it.
        new_checkpoint: callable returning a fresh `(batches, checkpoint)`.
        model: the run's model (restored alone when the pipeline state does not fit).
        optimizer: the run's optimizer.

    Returns:
        `(prefix, batches, checkpoint)`: the restored checkpoint and the pair it restored into.

    Raises:
        ValueError: no checkpoint in `directory` is readable, or one holds another optimizer step
            than its name says.
    """
    skipped = []
    batches, checkpoint = first
    for step, path in reversed(checkpoints):
        if skipped:
            batches, checkpoint = new_checkpoint()
        try:
            if not _restore(checkpoint, path, model, optimizer):
                batches, checkpoint = new_checkpoint()
        except (IndexError, tf.errors.OpError) as error:
            skipped.append(f"{os.path.basename(path)} ({_first_line(error)})")
            continue
        restored = int(optimizer.iterations.numpy())
        if restored != step:
            raise ValueError(f"Checkpoint {path} holds optimizer step {restored}, not {step}.")
        if skipped:
            warnings.warn(f"the newest checkpoint {checkpoints[-1][1]} is unreadable: {'; '.join(skipped)}; "
                          f"resuming from the previous readable one, {path} (step {step}).", stacklevel=4)
        return path, batches, checkpoint
    raise ValueError(f"Cannot resume from {directory}: none of its {len(checkpoints)} checkpoints is "
                     f"readable ({'; '.join(skipped)}). Start a fresh run (without --resume) or use another "
                     "--out.")


def _first_line(error):
    text = str(error).split("}}")[-1].strip()  # TensorFlow prefixes the op's node name
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def _restore(checkpoint, path, model, optimizer):
    """Restores `path`; a checkpoint whose input-pipeline state no longer fits the pipeline keeps the rest.

    The saved `tf.data` iterator only restores into the same pipeline definition. A checkpoint
    written by an earlier version of the pipeline (before static-shape buckets, for example) then
    still restores the model, the optimizer and the dropout generators, and the batches start from
    a fresh shuffle of the corpus, with a warning: the run goes on, only its data order differs
    from an uninterrupted run's.

    Returns:
        True when everything was restored, False when the input pipeline starts afresh (the caller
        then makes a new iterator).
    """
    try:
        checkpoint.restore(path).assert_existing_objects_matched()
        return True
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as error:
        if "dataset iterator" not in str(error):
            raise
        partial = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                      dropout_rng=dropout_state(model))
        partial.restore(path).expect_partial()
        warnings.warn(f"{path} holds the state of another input pipeline (written by an earlier "
                      "keras-posenc): resumed the model, optimizer and dropout state; the batches "
                      "restart from a fresh shuffle of the corpus, so the data order differs from an "
                      "uninterrupted run.")
        return False
