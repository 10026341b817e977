"""What a training run records of its steps: the per-step log, TensorBoard scalars and the loss plot.

`StepLog` keeps every step's loss and token count and the training time
(the numbers of `report.json`); `ScalarLog` writes the loss and the learning
rate for TensorBoard (`logs/`); `plot_losses` draws `loss.png`. Both logs are
Keras callbacks, run by `train_steps.fit` (and by the ablations' Keras `fit`).

Example:

>>> log = StepLog()
>>> log.on_train_begin()
>>> log.on_train_batch_end(0, {"loss": 2.5, "tokens": 12})
>>> log.on_train_end()
>>> log.losses, log.tokens
([2.5], 12)
"""

import time

import numpy as np
import tensorflow as tf

from keras_posenc.app._plotting import pyplot, save_figure
from keras_posenc.backend import keras

__all__ = ["ScalarLog", "StepLog", "plot_losses"]


class ScalarLog(keras.callbacks.Callback):
    """Writes the training loss and learning rate for TensorBoard every `every` optimizer steps.

    At step `n` (after `n` updates): the loss of the `n`-th batch and the learning rate of the `n`-th
    update, `schedule(n - 1)` (the optimizer's schedule takes the number of updates already done).
    Not `optimizer.learning_rate`: Keras 2 gives the last update's rate there, Keras 3 the next one's.

    Args:
        logdir: str, the TensorBoard folder (`<out>/logs`).
        every: int, steps between two writes.
        optimizer: the run's optimizer (its `iterations` is the step).
        schedule: the optimizer's learning-rate schedule (`WarmupSchedule`).
    """

    def __init__(self, logdir, every, optimizer, schedule):
        super().__init__()
        self.writer, self.every, self.optimizer = tf.summary.create_file_writer(logdir), every, optimizer
        self.schedule = schedule

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.optimizer.iterations.numpy())
        if step % self.every == 0:
            with self.writer.as_default(step=step):
                tf.summary.scalar("loss", float(logs["loss"]))
                tf.summary.scalar("learning_rate", float(self.schedule(step - 1)))

    def on_train_end(self, logs=None):
        self.writer.flush()


class StepLog(keras.callbacks.Callback):
    """Records the loss and the token count of every step, and the training time.

    A Keras callback for a model whose `train_step` returns `loss` and
    `tokens` (`CausalLM`). After `fit`, `losses` is the list of per-step
    losses, `tokens` the number of real tokens trained on and `seconds` the
    wall time of `fit`.

    Example:

    >>> log = StepLog()
    >>> log.on_train_begin()
    >>> log.on_train_batch_end(0, {"loss": 2.5, "tokens": 12})
    >>> log.on_train_batch_end(1, {"loss": 2.25, "tokens": 10})
    >>> log.on_train_end()
    >>> log.losses, log.tokens, log.seconds >= 0
    ([2.5, 2.25], 22, True)
    """

    def __init__(self):
        super().__init__()
        self.losses, self.tokens, self.seconds = [], 0, 0.0

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        self.tokens += int(logs["tokens"])

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self._start


def plot_losses(losses, path, start_step=0, *, eval_loss=None, unigram_loss=None):
    """Saves the per-step training loss (and its moving average) as a PNG; returns the path.

    Args:
        losses: list of float, the loss of each step (`StepLog.losses`).
        path: str, the PNG to write (atomically).
        start_step: int, the optimizer step before the first loss (a resumed run's start).
        eval_loss: optional float, the held-out loss, drawn as a line.
        unigram_loss: optional float, the unigram baseline, drawn as a line; the title warns
            when `eval_loss` is not below it.

    Returns:
        str, `path`.
    """
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.arange(start_step + 1, start_step + len(losses) + 1)
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="train loss (per step)")
    if len(losses) >= 10:
        window = max(2, len(losses) // 20)
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, lw=2, label=f"train loss ({window}-step mean)")
    if eval_loss is not None:
        ax.axhline(eval_loss, color="C2", ls="--", label=f"eval loss {eval_loss:.3f}")
    if unigram_loss is not None:
        ax.axhline(unigram_loss, color="C3", ls=":", label=f"unigram baseline {unigram_loss:.3f}")
    if eval_loss is not None and unigram_loss is not None and not eval_loss < unigram_loss:
        ax.set_title("eval loss is NOT below the unigram baseline", color="C3")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.legend()
    return save_figure(fig, path)
