"""The `tf.distribute` strategy of a training run, and whether XLA compiles its steps.

`make_strategy` turns `--strategy` (`STRATEGIES`) into a
`tf.distribute.Strategy`; `use_jit_compile` turns `--jit-compile`
(`JIT_COMPILE`) into a yes or no for that strategy and this machine.

Example:

>>> strategy = make_strategy("default")
>>> strategy.num_replicas_in_sync, use_jit_compile("off", strategy)
(1, False)
"""

import os

import tensorflow as tf

from keras_posenc.validation import check_choice

__all__ = ["JIT_COMPILE", "STRATEGIES", "make_strategy", "use_jit_compile"]

STRATEGIES = ("default", "mirrored", "multiworker")
JIT_COMPILE = ("auto", "on", "off")


def make_strategy(name):
    """`default`, `mirrored` (all local devices) or `multiworker` (reads TF_CONFIG).

    Args:
        name: one of `STRATEGIES`.

    Returns:
        a `tf.distribute.Strategy`: the default (current) strategy,
        `MirroredStrategy` or `MultiWorkerMirroredStrategy`.

    Raises:
        ValueError: unknown `name`, or `"multiworker"` without `TF_CONFIG`.

    Example:

    >>> make_strategy("default").num_replicas_in_sync
    1
    >>> make_strategy("tpu")
    Traceback (most recent call last):
    ...
    ValueError: `strategy` must be one of ('default', 'mirrored', 'multiworker'), got strategy='tpu'.

    References:
        - TensorFlow, "Distributed training with TensorFlow",
          https://www.tensorflow.org/guide/distributed_training.
        - TensorFlow, "Multi-worker training with Keras" (`TF_CONFIG`),
          https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras.
    """
    check_choice("strategy", name, STRATEGIES)
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multiworker":
        if not os.environ.get("TF_CONFIG"):
            raise ValueError("strategy='multiworker' needs the TF_CONFIG environment variable "
                             "describing the cluster and this worker's task.")
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def use_jit_compile(setting, strategy):
    """Whether the train and eval steps are XLA-compiled, for `setting` in `JIT_COMPILE`.

    `"auto"` is on for one replica on a GPU and off otherwise. On CPUs XLA
    does not pay for itself here: compiling the steps once per bucket length
    costs more than the runs save (benchmarks/RESULTS.md, `bench_train.py`).
    XLA compiles a step onto one device, so it needs one replica.

    Args:
        setting: one of `JIT_COMPILE` (`--jit-compile`).
        strategy: the run's `tf.distribute.Strategy` (`make_strategy`).

    Returns:
        bool, whether to pass `jit_compile=True` to the step functions.

    Raises:
        ValueError: unknown `setting`, or `"on"` with more than one replica.

    Example:

    >>> use_jit_compile("off", tf.distribute.get_strategy())
    False
    """
    check_choice("jit_compile", setting, JIT_COMPILE)
    replicas = strategy.num_replicas_in_sync
    if setting == "on" and replicas > 1:
        raise ValueError(f"jit_compile='on' (--jit-compile on) needs one replica, got {replicas}: XLA "
                         "compiles the step onto one device, and the replicas' variables live on several. "
                         "Use --jit-compile off or auto.")
    if setting == "auto":
        return replicas == 1 and bool(tf.config.list_logical_devices("GPU"))
    return setting == "on"
