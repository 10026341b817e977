"""The training loop of `keras-posenc train`: the step functions, the loop and the evaluation.

`TrainSteps` holds the train and eval steps of one run as `tf.function`s
under a `tf.distribute` strategy, each replica on its slice of the host's
global batch; `fit` runs the train step with Keras callbacks on a plain,
checkpointable `tf.data` iterator; `evaluate` gives the mean held-out
cross-entropy. `train.train` uses them, and the benchmarks time the same step
(`benchmarks/bench_train.py`, `benchmarks/bench_translate.py`).

Example: the steps need a model and its dataset, so they are exercised by
`tests/test_train.py` (the traces and XLA compiles, the evaluation under one
and several replicas) rather than by a doctest::

    steps = TrainSteps(model, tf.distribute.get_strategy(), dataset.element_spec, jit_compile=False)
    fit(steps, iter(dataset.repeat()), 100, callbacks=[train_logs.StepLog()], verbose=0)
    loss = evaluate(steps, eval_dataset)

References:
    - TensorFlow, "Custom training with tf.distribute.Strategy" (`strategy.run`),
      https://www.tensorflow.org/tutorials/distribute/custom_training.
"""

import tensorflow as tf

from keras_posenc.backend import keras, static_function

__all__ = ["TrainSteps", "evaluate", "fit"]


class TrainSteps:
    """The train and eval step functions of one run, each traced once.

    Both take a global batch of `data.lm_dataset`, whose signature leaves the
    batch and length dimensions open, so each function traces once for the
    whole run. Batches come in one shape per bucket length (`[batch_size, L]`),
    so with `jit_compile` XLA compiles each function at most once per bucket.
    `traces` counts the traces (the Python body of a `tf.function` runs only
    when it traces) and `shapes` the distinct batch shapes each function saw.

    Args:
        model: a model with `train_step(batch)` (a dict with `loss` and
            `tokens`) and `token_loss_sums(batch)` (the summed loss and the
            label count), as `CausalLM` and `Seq2SeqTransformer`; compiled
            and built under `strategy`'s scope.
        strategy: the `tf.distribute.Strategy` the model was built under.
        element_spec: the `element_spec` of the run's dataset: the steps'
            input signature.
        jit_compile: bool, XLA-compile both steps (`train_strategy.use_jit_compile`).

    Attributes:
        traces: dict, `{"train": n, "eval": n}`, how often each step traced.
        shapes: dict, `{"train": set, "eval": set}`, the batch shapes each step saw.
    """

    def __init__(self, model, strategy, element_spec, jit_compile):
        self.model, self.strategy = model, strategy
        self.traces = {"train": 0, "eval": 0}
        self.shapes = {"train": set(), "eval": set()}
        signature = [element_spec]
        self._train = static_function(self._train_step, jit_compile=jit_compile, input_signature=signature)
        self._eval = static_function(self._eval_step, jit_compile=jit_compile, input_signature=signature)

    def train(self, batch):
        """One optimizer step on a global batch; returns its logs summed over replicas (`loss`, `tokens`)."""
        self.shapes["train"].add(tuple(batch[1].shape))
        return self._train(batch)

    def eval(self, batch):
        """`[loss sum, label count]` of a global batch, summed over replicas; no update."""
        self.shapes["eval"].add(tuple(batch[1].shape))
        return self._eval(batch)

    def _sum_over_replicas(self, values):
        return tf.nest.map_structure(
            lambda v: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None), values)

    def _train_step(self, batch):
        self.traces["train"] += 1
        outputs = self.strategy.run(lambda b: self.model.train_step(_replica_slice(b)), args=(batch,))
        return self._sum_over_replicas(outputs)

    def _eval_step(self, batch):
        self.traces["eval"] += 1
        sums = self.strategy.run(lambda b: self.model.token_loss_sums(_replica_slice(b)), args=(batch,))
        return self._sum_over_replicas(list(sums))


def fit(steps_fn, batches, steps, callbacks, verbose, stop=None):
    """Runs `steps` training steps on the global batches of the iterator `batches`.

    With a `StopOnSignal` `stop`, a signal ends the loop after the current step; the callbacks'
    `on_train_end` still runs (the checkpoint callback saves that step).

    Keras `fit` would make its own iterator, which cannot be checkpointed
    under a distribution strategy. Here every replica takes its slice of the
    host's global batch, so the iterator is a plain `tf.data` iterator that
    `tf.train.Checkpoint` saves with the model.

    Args:
        steps_fn: a `TrainSteps`.
        batches: an iterator of global batches (`iter(dataset)`).
        steps: int, how many steps to run (none when `<= 0`).
        callbacks: list of `keras.callbacks.Callback`; each gets
            `set_model`, `on_train_begin`, `on_train_batch_end` with the
            step's logs, and `on_train_end`.
        verbose: int, 0 for no progress bar.
        stop: optional `stop_on_signal.StopOnSignal`.
    """
    if steps <= 0:
        return
    progress = keras.utils.Progbar(steps, verbose=verbose) if verbose else None
    for callback in callbacks:
        callback.set_model(steps_fn.model)
        callback.on_train_begin()
    logs = {}
    for batch in range(steps):
        logs = {k: v.numpy() for k, v in steps_fn.train(next(batches)).items()}
        for callback in callbacks:
            callback.on_train_batch_end(batch, logs)
        if progress:
            progress.update(batch + 1, [("loss", logs["loss"])])
        if stop is not None and stop.received is not None:
            break
    for callback in callbacks:
        callback.on_train_end(logs)


def _replica_slice(batch):
    """This replica's rows of a global batch: `ceil(rows / replicas)` each, the last ones fewer."""
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    size = (tf.shape(batch[1])[0] + replicas - 1) // replicas
    start = context.replica_id_in_sync_group * size
    return tf.nest.map_structure(lambda t: t[start:start + size], batch)


def evaluate(steps_fn, dataset):
    """The mean cross-entropy over the real labels of `dataset`, each replica on its slice of each batch.

    Like `fit`, every worker reads the same global batches, so every worker
    gets the same result. Keras 3's `evaluate` cannot run this model under
    `MultiWorkerMirroredStrategy` (it fails converting the distributed dict
    inputs to a tensor); the sums here are reduced over replicas per batch and
    added up in float64, independent of the Keras version.

    Args:
        steps_fn: a `TrainSteps`.
        dataset: a `tf.data.Dataset` of global batches with the steps' element spec.

    Returns:
        float, nats per real label (0.0 for a dataset without labels).
    """
    total, count = 0.0, 0.0
    for batch in dataset:
        batch_sum, batch_count = steps_fn.eval(batch)
        total, count = total + float(batch_sum), count + float(batch_count)
    return total / max(count, 1.0)
