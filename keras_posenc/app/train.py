"""Training of a causal next-token language model or a translator (checkpoints, tf.distribute).

The model is `models.CausalLM` (a causal `Encoder` followed by
`Dense(vocab_size)`), or with `task="translate"` a
`seq2seq.Seq2SeqTransformer` whose kept weights are those of the best dev
BLEU (`dev_scoring`), trained with masked sparse cross-entropy (padding
ignored; label-smoothed for the translator) and `models.transformer_adam` (Adam(0.9, 0.98, 1e-9) on
`WarmupSchedule`). `train(TrainConfig(...))` writes to `out`:
`model.keras`, `spm.model`, `report.json`, `loss.png`, TensorBoard logs in
`logs/` and checkpoints in `checkpoints/`.

Checkpoints: `tf.train.CheckpointManager` saves the model, the optimizer
(its step drives the learning-rate schedule), the dropout generators and the
`tf.data` iterator of the training batches. The manager names a checkpoint
in its state file only after all its files are written, so a crash never
leaves a half-written checkpoint that a resume would read; it also rotates
old ones. An unreadable newest checkpoint (a truncated file) is skipped on
`--resume` for the one before it. Only the chief (`strategy.extended.should_checkpoint`) keeps
them; other workers save into a scratch folder, because a save runs
collectives. `checkpoints/config.json` holds the model config, compared on
`--resume`. A resumed run continues at the same step, learning rate and
data position: the iterator state is restored, not replayed, so a resume
costs the same at step 200 and at step 20,000.

Example: training runs for seconds to minutes, so it is exercised by
`tests/test_train.py` (artifacts, determinism, resume after a killed
process, atomic checkpoints, mirrored and multi-worker strategies) rather
than by a doctest. From the command line (`keras_posenc.app.cli`)::

    keras-posenc train --corpus corpus.txt --out runs/lm --steps 200 --num-layers 1 --d-model 32
    keras-posenc train --corpus corpus.txt --out runs/lm --steps 400 --resume  # continue to step 400

References:
    - TensorFlow, "Training checkpoints" (`tf.train.CheckpointManager`),
      https://www.tensorflow.org/guide/checkpoint.
    - TensorFlow, "tf.data: checkpointing", https://www.tensorflow.org/guide/data#checkpointing.
    - TensorFlow, "Custom training with tf.distribute.Strategy" (`strategy.run`),
      https://www.tensorflow.org/tutorials/distribute/custom_training.
"""

import contextlib
import dataclasses
import errno
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings

import numpy as np
import tensorflow as tf

from keras_posenc.app import dataset as data_lib
from keras_posenc.app import translation_data
from keras_posenc.app._plotting import pyplot, save_figure
from keras_posenc.app.dev_scoring import DEV_SCORES_FILE, DevScoring
from keras_posenc.app.run_folder import MODEL_FILE, REPORT_FILE, TOKENIZER_FILE
from keras_posenc.app.run_lock import run_lock
from keras_posenc.backend import dropout_state, keras, make_deterministic, save_model
from keras_posenc.files import FileWriteError, describe_write_error, is_disk_full, write_bytes, write_json
from keras_posenc.layers.encoder import NAMED_POSITIONS, named_position
from keras_posenc.models import CausalLM, transformer_adam
from keras_posenc.schedules import WarmupSchedule
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.tables import TABLE_KINDS
from keras_posenc.validation import check_choice, check_positive_ints

__all__ = ["JIT_COMPILE", "REPLACED_BY_A_FRESH_RUN", "STRATEGIES", "StepLog", "TASKS", "TrainConfig",
           "TrainingInterrupted", "default_warmup_steps", "list_checkpoints", "make_strategy", "train"]

STRATEGIES = ("default", "mirrored", "multiworker")
# lm: a causal LM (CausalLM); translate: an encoder-decoder translator (Seq2SeqTransformer) over pairs.
TASKS = ("lm", "translate")
# `position` when none is given: RoPE for the translator (3.2 test BLEU above sinusoidal at the
# benchmark's size and budget, benchmarks/RESULTS.md "Translation"), the sinusoidal table for the LM.
DEFAULT_POSITIONS = {"lm": "sinusoidal", "translate": "rope"}
JIT_COMPILE = ("auto", "on", "off")
_CONFIG_FILE = "config.json"
_SCHEDULE_FILE = "schedule.json"
# What a fresh run (no --resume) writes into `out`, so what it replaces of an earlier run there. It
# removes them only once the new model is built, just before its first step; anything else in `out`
# (an export, inspect/, the user's files) is kept.
REPLACED_BY_A_FRESH_RUN = ("checkpoints", "logs", MODEL_FILE, TOKENIZER_FILE, REPORT_FILE, "loss.png")


def _option(default, group, help, *, flag=None, choices=None, type=None, const=None):
    """A config field and its command-line flag: the one place for its name, default and help.

    `keras_posenc.app.cli` builds the flags of `keras-posenc train` from these
    fields: the flag is `--<name with dashes>` unless `flag` is given; a
    bool field is a switch that flips its default (`--norm-first`,
    `--no-bos`), a field with `const` a switch that sets it (`--quiet`
    sets `verbose` to 0); an int field takes a positive int unless `type`
    says otherwise.
    """
    metadata = {"group": group, "help": help, "flag": flag, "choices": choices, "type": type, "const": const}
    return dataclasses.field(default=default, metadata=metadata)


def default_warmup_steps(steps):
    """The warmup used when none is given: `min(4000, max(1, steps // 2))`.

    Half the run, at most the paper's 4000. The schedule peaks at
    `d_model**-0.5 * warmup**-0.5`, so a warmup of a small fraction of a short
    run gives a peak learning rate that Adam overshoots with; half the run
    keeps the peak moderate and still leaves warmup and decays.

    Args:
        steps: int, the run's total optimizer steps.

    Returns:
        int >= 1.

    Example:

    >>> default_warmup_steps(300), default_warmup_steps(1), default_warmup_steps(100_000)
    (150, 1, 4000)
    """
    return min(4000, max(1, steps // 2))


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs. `corpus=None` is the embedded corpus.

    The fields are the flags of `keras-posenc train` (`--vocab-size` is
    `vocab_size`, `--format` is `corpus_format`, `--no-bos` is
    `add_bos=False`, `--quiet` is `verbose=0`); each field's metadata holds
    its help text and choices.

    Args:
        task: one of `TASKS`: `"lm"` trains `CausalLM`, `"translate"` a
            `Seq2SeqTransformer` on the pairs of a TSV corpus.
        corpus: str or None, the corpus file (None: `data.default_corpus_path()`).
        dev_corpus: str or None, translate: the TSV pairs whose BLEU picks the
            kept weights (None: the held-out split).
        dev_sentences: int, translate: how many dev pairs are scored.
        label_smoothing: float in [0, 1), translate: on the training loss.
        share_embeddings: bool, translate: one embedding for both sides and
            the softmax tied to it (default: separate tables and softmax).
        out: str, output folder.
        corpus_format: `"text"` or `"tsv"` (pairs, trained with
            `num_languages=2`; needs `corpus`: the embedded one is text).
        skip_bad_lines: bool, skip malformed TSV lines.
        vocab_size: int, SentencePiece vocabulary size.
        max_length: int, longest model input in tokens.
        add_bos: bool, start every sequence with `<s>`.
        add_eos: bool, end every sequence with `</s>`.
        eval_fraction: float, share of examples held out for evaluation.
        steps: int, total optimizer steps (a resumed run continues to it).
        batch_size: int, global batch size (split across replicas).
        num_layers: int, encoder layers.
        d_model: int, model width.
        num_heads: int, attention heads.
        dff: int, feed-forward width.
        dropout: float, dropout rate.
        norm_first: bool, pre-LN blocks.
        position: str, one of `encoder.NAMED_POSITIONS` (`"sinusoidal"`,
            `"learned"`, `"rope"`, `"rope-ntk"`, `"alibi"`, ...); None is
            the task's `DEFAULT_POSITIONS` entry (`"rope"` for translate,
            `"sinusoidal"` for lm).
        table: str, sinusoidal table storage (only for `"sinusoidal"`).
        warmup_steps: int or None, `WarmupSchedule` warmup; None derives it
            from `steps` (`default_warmup_steps`) or, on resume, takes the
            checkpoint's.
        lr_scale: float, factor on the schedule.
        seed: int, seed of the split, data order, initialization and dropout.
        checkpoint_every: int, steps between checkpoints.
        keep_checkpoints: int, how many checkpoints to keep.
        log_every: int, TensorBoard logging interval in steps.
        resume: bool, continue from the latest checkpoint in `out`.
        strategy: one of `STRATEGIES`.
        jit_compile: one of `JIT_COMPILE`: XLA-compile the train and eval
            steps (`"on"`, one replica only), not (`"off"`), or `"auto"`:
            on for one GPU, off on CPUs.
        verbose: int, 0 for no progress bar.

    Example:

    >>> config = TrainConfig(corpus_format="tsv", d_model=32).model_config(vocab_size=100)
    >>> config["d_model"], config["vocab_size"], config["num_languages"], config["table"]
    (32, 100, 2, 'full')
    """

    task: str = _option("lm", "data", "lm: a causal next-token LM; translate: an encoder-decoder translator "
                        "of the pairs of a --format tsv corpus", choices=TASKS)
    corpus: str = _option(None, "data", "corpus file (default: the embedded English corpus)")
    dev_corpus: str = _option(None, "data", "--task translate: TSV pairs whose BLEU picks the kept model "
                              "(default: the held-out split of --corpus)")
    dev_sentences: int = _option(500, "data", "--task translate: dev pairs translated (greedy) at each "
                                 "checkpoint, the first N")
    out: str = _option("runs/train", "data", "output folder")
    corpus_format: str = _option("text", "data", "text: one document or sentence per line; "
                                 "tsv: source<TAB>target", flag="--format", choices=data_lib.FORMATS)
    skip_bad_lines: bool = _option(False, "data", "skip TSV lines without exactly one tab")
    vocab_size: int = _option(2000, "data", "SentencePiece vocabulary size")
    add_bos: bool = _option(True, "data", "do not start sequences with <s>", flag="--no-bos")
    add_eos: bool = _option(True, "data", "do not end sequences with </s>", flag="--no-eos")
    eval_fraction: float = _option(0.05, "data", "share of examples held out for evaluation")
    max_length: int = _option(64, "model", "longest input sequence in tokens (independent of --vocab-size)")
    num_layers: int = _option(2, "model", "encoder layers (--task translate: encoder and decoder layers "
                              "each)")
    d_model: int = _option(64, "model", "model width")
    num_heads: int = _option(4, "model", "attention heads")
    dff: int = _option(256, "model", "feed-forward width")
    dropout: float = _option(0.1, "model", "dropout rate")
    norm_first: bool = _option(False, "model", "pre-LN blocks")
    label_smoothing: float = _option(0.1, "model", "--task translate: label smoothing of the training loss")
    share_embeddings: bool = _option(False, "model", "--task translate: one embedding for source and target "
                                     "and the softmax tied to it (Vaswani et al., section 3.4)")
    position: str = _option(None, "model", "position encoding (default: sinusoidal; --task translate: rope)",
                            choices=NAMED_POSITIONS)
    table: str = _option("full", "model", "sinusoidal table storage (only for --position sinusoidal)",
                         choices=TABLE_KINDS)
    steps: int = _option(1000, "training", "total optimizer steps (a resumed run continues to it)")
    batch_size: int = _option(32, "training", "global batch size (split across replicas)")
    warmup_steps: int = _option(None, "training", "learning-rate warmup steps (default: "
                                "min(4000, max(1, steps // 2)), so short runs leave warmup)")
    lr_scale: float = _option(1.0, "training", "factor on the warmup schedule")
    seed: int = _option(0, "training", "seed of the split, data order, initialization and dropout",
                        type=int)
    checkpoint_every: int = _option(100, "training", "steps between checkpoints")
    keep_checkpoints: int = _option(3, "training", "how many checkpoints to keep")
    log_every: int = _option(10, "training", "TensorBoard logging interval in steps")
    resume: bool = _option(False, "training", "continue from the latest checkpoint in --out")
    strategy: str = _option("default", "training", "tf.distribute strategy; multiworker reads TF_CONFIG",
                            choices=STRATEGIES)
    jit_compile: str = _option("auto", "training", "XLA-compile the train and eval steps (one compile per "
                               "bucket length); auto: on for one GPU, off on CPUs, where compiling costs "
                               "more than it saves", choices=JIT_COMPILE)
    verbose: int = _option(1, "training", "no progress bar", flag="--quiet", const=0)

    def __post_init__(self):
        if self.position is None:
            self.position = DEFAULT_POSITIONS.get(self.task, DEFAULT_POSITIONS["lm"])

    def model_config(self, vocab_size):
        """The model's keyword arguments; a checkpoint only fits this exact config.

        Args:
            vocab_size: int, the trained tokenizer's vocabulary size.

        Returns:
            dict: the `encoder_config` of `CausalLM` (`task="lm"`), or the
            keyword arguments of `Seq2SeqTransformer` (`task="translate"`).
        """
        position, position_config = named_position(self.position, self.max_length)
        if position == "sinusoidal":
            position_config["table"] = self.table
        config = {
            "num_layers": self.num_layers, "d_model": self.d_model, "num_heads": self.num_heads,
            "dff": self.dff, "vocab_size": vocab_size, "max_length": self.max_length, "dropout": self.dropout,
            "norm_first": self.norm_first, "pad_id": data_lib.PAD_ID, "position": position,
        }
        if self.task == "translate":
            return {**config, "position_config": position_config, "language_scale": True,
                    "share_embeddings": self.share_embeddings, "tie_output": self.share_embeddings,
                    "label_smoothing": self.label_smoothing, "bos_id": data_lib.BOS_ID,
                    "eos_id": data_lib.EOS_ID}
        config.update(position_config)
        if self.corpus_format == "tsv":
            config["num_languages"] = 2
        return config

    def build_model(self, vocab_size, name=None):
        """The run's model (not built): `CausalLM` or `Seq2SeqTransformer` of `model_config(vocab_size)`."""
        config = self.model_config(vocab_size)
        if self.task == "translate":
            return Seq2SeqTransformer(**config, name=name or "seq2seq_transformer")
        return CausalLM(config, name=name or "causal_lm")

    def dataset(self, examples, sp_model, **options):
        """The run's tf.data pipeline of `examples`: `lm_dataset` or `translation_dataset`."""
        if self.task == "translate":
            return translation_data.translation_dataset(examples, sp_model, max_length=self.max_length,
                                                        **options)
        return data_lib.lm_dataset(examples, sp_model, max_length=self.max_length, add_bos=self.add_bos,
                                   add_eos=self.add_eos, **options)


# Checkpoints -------------------------------------------------------------------------------
def _checkpoint_dir(out):
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


def _write_json_atomically(path, content):
    write_json(path, content, indent=1, sort_keys=True)


def _check_checkpoint_config(directory, expected):
    """Raises ValueError naming every setting where the checkpoints differ from `expected`."""
    path = os.path.join(directory, _CONFIG_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"Cannot resume from {directory}: it has no {_CONFIG_FILE} with the model config.")
    with open(path) as f:
        stored = json.load(f)
    keys = sorted(set(stored) | set(expected))
    diffs = [f"{k}: checkpoint {stored.get(k)!r} vs now {expected.get(k)!r}"
             for k in keys if stored.get(k) != expected.get(k)]
    if diffs:
        raise ValueError(f"Cannot resume from {directory}: it was trained with a different model config ("
                         + "; ".join(diffs) + "). Use the same flags, or a new --out without --resume.")


class _CheckpointCallback(keras.callbacks.Callback):
    """Saves through `manager` every `every` optimizer steps and at the end."""

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


class _ScalarLog(keras.callbacks.Callback):
    """Writes the training loss and learning rate for TensorBoard every `every` optimizer steps.

    At step `n` (after `n` updates): the loss of the `n`-th batch and the learning rate of the `n`-th
    update, `schedule(n - 1)` (the optimizer's schedule takes the number of updates already done).
    Not `optimizer.learning_rate`: Keras 2 gives the last update's rate there, Keras 3 the next one's.
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


# Strategy ----------------------------------------------------------------------------------
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


# Training ----------------------------------------------------------------------------------
def _use_jit_compile(setting, strategy):
    """Whether the train and eval steps are XLA-compiled, for `setting` in `JIT_COMPILE`.

    `"auto"` is on for one replica on a GPU and off otherwise. On CPUs XLA
    does not pay for itself here: compiling the steps once per bucket length
    costs more than the runs save (benchmarks/RESULTS.md, `bench_train.py`).
    XLA compiles a step onto one device, so it needs one replica.

    Example:

    >>> _use_jit_compile("off", tf.distribute.get_strategy())
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


def _check_flags(cfg):
    """Every flag, before the run folder is touched (ValueError naming the flag)."""
    check_positive_ints((name, getattr(cfg, name)) for name in (
        "steps", "batch_size", "checkpoint_every", "keep_checkpoints", "log_every", "max_length",
        "vocab_size"))
    if cfg.warmup_steps is not None:
        check_positive_ints([("warmup_steps", cfg.warmup_steps)])
    check_choice("format", cfg.corpus_format, data_lib.FORMATS)
    if cfg.corpus is None and cfg.corpus_format != "text":
        raise ValueError(f"`format` (--format) {cfg.corpus_format!r} needs a `corpus` (--corpus PATH): the "
                         "embedded corpus is plain text.")
    check_choice("task", cfg.task, TASKS)
    if cfg.task == "translate" and cfg.corpus_format != "tsv":
        raise ValueError("`task` (--task) 'translate' trains on pairs: give --format tsv and --corpus PATH "
                         "(source<TAB>target lines).")
    if cfg.dev_corpus is not None and cfg.task != "translate":
        raise ValueError("`dev_corpus` (--dev-corpus) is scored in BLEU by --task translate only.")
    check_positive_ints([("dev_sentences", cfg.dev_sentences)])
    check_choice("strategy", cfg.strategy, STRATEGIES)
    check_choice("jit_compile", cfg.jit_compile, JIT_COMPILE)
    if not 0.0 < cfg.eval_fraction < 1.0:
        raise ValueError(f"`eval_fraction` (--eval-fraction) must be in (0, 1), got {cfg.eval_fraction}.")
    if not cfg.lr_scale > 0.0:
        raise ValueError(f"`lr_scale` (--lr-scale) must be > 0, got {cfg.lr_scale}.")


def _check_model_config(cfg):
    """The model config, checked by the layers themselves before the run folder is touched.

    The run's model is constructed (not built: no weights), so `d_model` not divisible by
    `num_heads`, a bad `dff`, length, position, table or label-smoothing setting fails here, not
    after the tokenizer was trained or an earlier run replaced.
    """
    cfg.build_model(cfg.vocab_size, name="config_check")


def _warmup_steps(cfg, ckpt_dir):
    """The run's warmup: explicit, else the checkpoint's on resume, else `default_warmup_steps`."""
    path = os.path.join(ckpt_dir, _SCHEDULE_FILE)
    if cfg.warmup_steps is not None:
        if cfg.warmup_steps >= cfg.steps:
            warnings.warn(f"--warmup-steps {cfg.warmup_steps} >= --steps {cfg.steps}: the learning rate "
                          "never leaves warmup and the run may learn little. Leave --warmup-steps out to "
                          f"use {default_warmup_steps(cfg.steps)} (half the steps).", stacklevel=4)
        return cfg.warmup_steps
    if cfg.resume and os.path.isfile(path):  # resuming with more --steps keeps the schedule it started with
        with open(path) as f:
            return json.load(f)["warmup_steps"]
    return default_warmup_steps(cfg.steps)


def _load_data(cfg):
    """`(corpus path, training examples, held-out examples, dev pairs)`; reads only (before the lock).

    The dev pairs (translate only, else None) are the first `dev_sentences` of `dev_corpus`, or of
    the held-out split.
    """
    corpus = cfg.corpus or data_lib.default_corpus_path()
    corpus_format = "text" if cfg.corpus is None else cfg.corpus_format
    examples = data_lib.load_corpus(corpus, corpus_format, skip_bad_lines=cfg.skip_bad_lines)
    train_examples, eval_examples = data_lib.split_corpus(examples, cfg.eval_fraction, seed=cfg.seed)
    dev_pairs = None
    if cfg.task == "translate":
        dev_pairs = eval_examples
        if cfg.dev_corpus is not None:
            dev_pairs = data_lib.load_corpus(cfg.dev_corpus, "tsv", skip_bad_lines=cfg.skip_bad_lines)
        dev_pairs = dev_pairs[:cfg.dev_sentences]
    return corpus, train_examples, eval_examples, dev_pairs


def _tokenizer(cfg, train_examples):
    """`(serialized SentencePiece model, whether it is new)`: the run's own on resume, else trained now.

    Trained in memory: `spm.model` is written only when training starts (`_start_fresh`).
    """
    spm_path = os.path.join(cfg.out, TOKENIZER_FILE)
    if cfg.resume and os.path.isfile(spm_path):
        with open(spm_path, "rb") as f:
            return f.read(), False
    return data_lib.train_sentencepiece(data_lib.corpus_texts(train_examples), cfg.vocab_size), True


def _start_fresh(out):
    """Removes what a fresh run replaces of an earlier run in `out` (`REPLACED_BY_A_FRESH_RUN`).

    Prints one line naming what was there, so nothing goes without a word. Called once the new
    model is built and checked, just before the run writes its own files.
    """
    found = [name for name in REPLACED_BY_A_FRESH_RUN if os.path.lexists(os.path.join(out, name))]
    if not found:
        return
    steps = ", ".join(str(step) for step, _ in list_checkpoints(_checkpoint_dir(out)))
    shown = [name + "/" if os.path.isdir(os.path.join(out, name)) else name for name in found]
    shown = [f"{name} (steps {steps})" if name == "checkpoints/" and steps else name for name in shown]
    print(f"Replacing the earlier run in {out} (a fresh run; --resume would continue it): "
          f"{', '.join(shown)}.")
    for name in found:
        path = os.path.join(out, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


class TrainingInterrupted(Exception):
    """SIGTERM or SIGINT stopped training; the last step's checkpoint was saved first.

    Attributes:
        signum: int, the signal.
        step: int, the optimizer step of the saved checkpoint.
        checkpoint: str, its prefix (what `tf.train.Checkpoint.restore` takes).
    """

    def __init__(self, signum, step, checkpoint):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}: saved the checkpoint "
                         f"{checkpoint}; continue with --resume.")


class _StopOnSignal:
    """While active, SIGTERM and SIGINT ask the training loop to stop after its current step.

    The loop then saves a checkpoint and `train` raises `TrainingInterrupted`. A second signal of
    either kind acts at once (the previous handlers are put back and the signal raised again).
    A signal the process ignores (`nohup`, a shell's background job) stays ignored.
    Signal handlers exist only in the main thread; elsewhere this does nothing.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, active=True):
        self.active = active and threading.current_thread() is threading.main_thread()
        self.received = None
        self._previous = {}

    def __enter__(self):
        if self.active:
            self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS
                              if signal.getsignal(signum) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc):
        self._restore()

    def _restore(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        if self.received is not None:
            self._restore()
            signal.raise_signal(signum)
            return
        self.received = signum


def train(cfg):
    """Trains per `cfg` and returns the report (also written to `out/report.json`).

    Reads and splits the corpus, trains SentencePiece on the training split
    (or reuses `out/spm.model` on resume), trains the task's model under the
    strategy (`train_step` per replica, Keras callbacks), evaluates on the held-out split against an
    add-one unigram baseline, and writes `model.keras`, `spm.model`,
    `report.json`, `loss.png`, `logs/` and `checkpoints/` to `cfg.out`
    (workers other than the chief write no artifacts). Runs are
    deterministic for a given seed.

    Nothing of an earlier run is lost: the flags, the model config and the
    corpus are checked before `cfg.out` is touched; the chief holds the
    folder's lock (`run_lock`) for the whole run; a fresh run replaces
    `REPLACED_BY_A_FRESH_RUN` of an earlier run only once its model is built
    (one printed line says what); every file is written atomically. A resume
    whose newest checkpoint is unreadable continues from the newest readable
    one, with a warning. SIGTERM or SIGINT during training ends the step,
    saves a checkpoint and raises `TrainingInterrupted`.

    Args:
        cfg: a `TrainConfig`.

    Returns:
        dict, the report: `steps`, `start_step`, per-step `losses`,
        `final_train_loss`, `eval_loss` / `eval_perplexity`,
        `unigram_eval_loss` / `unigram_eval_perplexity`, `vocab_size`,
        `train_examples`, `eval_examples`, `train_seconds`,
        `tokens_per_second`, `num_replicas`, `jit_compile` (what `auto`
        chose), `bucket_lengths`, `traces` (how often the train and eval
        steps traced: once each), `batch_shapes` (how many batch shapes
        each step saw: at most one per bucket length, so at most that many
        XLA compiles), `model_config`, `train_config`, `task`
        and (on the chief) `loss_plot`; with `task="translate"` also
        `dev_bleu`, `dev_chrf` (sacrebleu, greedy, of the kept weights),
        `dev_best_step`, `dev_bleu_signature` and `dev_history`.

    Raises:
        ValueError: a bad setting, `resume` without a (readable) checkpoint,
            or a checkpoint trained with a different model config.
        CorpusError: a missing, empty or malformed corpus.
        RunLockedError: another run holds `cfg.out`.
        FileWriteError: a file cannot be written (full disk, read-only
            folder): the message names the path and the free space.
        TrainingInterrupted: SIGTERM or SIGINT, after the checkpoint was saved.

    Example: see `tests/test_train.py` (a 90-step run that beats the
    unigram baseline, bit-identical reruns, resume after a killed process).
    From the command line::

        keras-posenc train --corpus corpus.txt --out runs/lm --steps 200 --quiet
        python -c "import json; print(json.load(open('runs/lm/report.json'))['eval_loss'])"
    """
    _check_flags(cfg)
    strategy = make_strategy(cfg.strategy)  # before any other TF op: collectives are set up at startup
    _check_model_config(cfg)
    if cfg.batch_size % strategy.num_replicas_in_sync:
        raise ValueError(f"`batch_size` must be a multiple of the {strategy.num_replicas_in_sync} replicas, "
                         f"got batch_size={cfg.batch_size}.")
    jit_compile = _use_jit_compile(cfg.jit_compile, strategy)
    chief = strategy.extended.should_checkpoint
    data = _load_data(cfg)
    with run_lock(cfg.out) if chief else contextlib.nullcontext():
        return _train(cfg, strategy, chief, jit_compile, *data)


def _train(cfg, strategy, chief, jit_compile, corpus, train_examples, eval_examples, dev_pairs):
    """`train` once the flags, the model config and the corpus are checked and `cfg.out` is locked."""
    make_deterministic(cfg.seed)
    ckpt_dir = _checkpoint_dir(cfg.out)
    checkpoints = list_checkpoints(ckpt_dir)
    if cfg.resume and not checkpoints:
        raise ValueError(f"--resume was given but {ckpt_dir} holds no complete checkpoint to resume from.")
    sp_model, new_tokenizer = _tokenizer(cfg, train_examples)
    vocab_size = data_lib.sentencepiece_vocab_size(sp_model)
    model_config = cfg.model_config(vocab_size)
    if cfg.resume:
        _check_checkpoint_config(ckpt_dir, model_config)
    warmup_steps = _warmup_steps(cfg, ckpt_dir)

    train_ds = cfg.dataset(train_examples, sp_model, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed,
                           repeat=True, drop_remainder=True)
    batches = iter(train_ds)  # global batches; checkpointed, so a resume continues where it stopped
    with strategy.scope():
        model = cfg.build_model(vocab_size)
        model.build_on_dummy()
        optimizer = transformer_adam(cfg.d_model, warmup_steps, scale=cfg.lr_scale)
        optimizer.build(model.trainable_variables)
        model.compile(optimizer=optimizer)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                         dropout_rng=dropout_state(model), data=batches)

    def new_checkpoint():  # a fresh iterator: a failed restore may have left the old one half-set
        batches = iter(train_ds)
        with strategy.scope():
            return batches, tf.train.Checkpoint(model=model, optimizer=optimizer,
                                                dropout_rng=dropout_state(model), data=batches)

    start_step = 0
    if cfg.resume:
        path, batches, checkpoint = _restore_newest_readable(checkpoints, ckpt_dir, (batches, checkpoint),
                                                             new_checkpoint, model, optimizer)
        start_step = int(optimizer.iterations.numpy())
        if cfg.verbose:
            print(f"Resuming from {path} at step {start_step}.")
    # Training really starts: only now does a fresh run replace an earlier one in cfg.out.
    if chief and not cfg.resume:
        _start_fresh(cfg.out)
    if chief and new_tokenizer:
        write_bytes(os.path.join(cfg.out, TOKENIZER_FILE), sp_model)
    if chief and not cfg.resume:
        os.makedirs(ckpt_dir, exist_ok=True)
        _write_json_atomically(os.path.join(ckpt_dir, _CONFIG_FILE), model_config)
        _write_json_atomically(os.path.join(ckpt_dir, _SCHEDULE_FILE), {"warmup_steps": warmup_steps})

    # Every worker takes part in a save (it runs collectives); only the chief's copy is kept. The
    # other workers also keep their logs in that scratch folder: the run folder is the chief's.
    save_dir = ckpt_dir if chief else tempfile.mkdtemp(prefix="worker-ckpt-")
    manager = tf.train.CheckpointManager(checkpoint, save_dir, max_to_keep=cfg.keep_checkpoints,
                                         step_counter=optimizer.iterations)
    step_log = StepLog()
    callbacks = [step_log, _CheckpointCallback(manager, cfg.checkpoint_every, optimizer),
                 _ScalarLog(os.path.join(cfg.out if chief else save_dir, "logs"), cfg.log_every, optimizer,
                            WarmupSchedule(cfg.d_model, warmup_steps, scale=cfg.lr_scale))]
    dev = None
    if cfg.task == "translate":
        dev = DevScoring(model, sp_model, dev_pairs, cfg.checkpoint_every, optimizer,
                         os.path.join(ckpt_dir, DEV_SCORES_FILE) if chief else None)
        callbacks.append(dev)
    steps_fn = _Steps(model, strategy, train_ds.element_spec, jit_compile)
    # A signal stops a multi-worker run at once: its final save would need every worker.
    stop = _StopOnSignal(active=not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))
    try:
        with stop:
            _fit(steps_fn, batches, cfg.steps - start_step, callbacks, cfg.verbose, stop=stop)
    finally:
        if not chief:
            shutil.rmtree(save_dir, ignore_errors=True)
    if stop.received is not None:
        raise TrainingInterrupted(stop.received, int(optimizer.iterations.numpy()), manager.latest_checkpoint)

    model_path = os.path.join(cfg.out, MODEL_FILE)
    if dev is not None:  # the kept weights: the best dev BLEU's
        dev.keep_best()
    # Short last batches are filled with padding rows: every eval batch has one of the bucket shapes.
    eval_ds = cfg.dataset(eval_examples, sp_model, batch_size=cfg.batch_size, shuffle=False,
                          fill_batches=True)
    eval_loss = _evaluate(steps_fn, eval_ds)
    unigram_train_ds = cfg.dataset(train_examples, sp_model, batch_size=256, shuffle=False)
    unigram_loss = data_lib.unigram_cross_entropy(unigram_train_ds, eval_ds, vocab_size)

    if chief:
        save_model(model, model_path)
    else:
        # Saving under MultiWorkerMirroredStrategy runs collectives: every worker must save, and
        # only the chief's copy is kept. A worker that skips it leaves the chief hanging.
        with tempfile.TemporaryDirectory() as scratch:
            save_model(model, os.path.join(scratch, MODEL_FILE))
    train_seconds = step_log.seconds - (dev.seconds if dev is not None else 0.0)  # dev scoring left out
    report = {
        "corpus": os.path.basename(corpus),
        "corpus_format": cfg.corpus_format if cfg.corpus else "text",
        "train_examples": len(train_examples),
        "eval_examples": len(eval_examples),
        "vocab_size": vocab_size,
        "start_step": start_step,
        "steps": int(optimizer.iterations.numpy()),
        "losses": step_log.losses,
        "final_train_loss": step_log.losses[-1] if step_log.losses else None,
        "eval_loss": eval_loss,
        "eval_perplexity": math.exp(eval_loss),
        "unigram_eval_loss": unigram_loss,
        "unigram_eval_perplexity": math.exp(unigram_loss),
        "task": cfg.task,
        "train_seconds": train_seconds,
        "tokens_per_second": step_log.tokens / train_seconds if train_seconds else None,
        "num_replicas": strategy.num_replicas_in_sync,
        "jit_compile": jit_compile,
        "bucket_lengths": data_lib.default_bucket_lengths(cfg.max_length),
        "traces": dict(steps_fn.traces),
        "batch_shapes": {name: len(shapes) for name, shapes in steps_fn.shapes.items()},
        "model_config": model_config,
        "train_config": dataclasses.asdict(cfg),
        "warmup_steps": warmup_steps,
        "beats_unigram": bool(eval_loss < unigram_loss),
    }
    if dev is not None:
        report.update({
            "dev_corpus": os.path.basename(cfg.dev_corpus) if cfg.dev_corpus else "held-out split",
            "dev_sentences": len(dev_pairs), "dev_bleu": dev.best["bleu"], "dev_chrf": dev.best["chrf"],
            "dev_best_step": dev.best["step"], "dev_search": "greedy", "dev_bleu_signature": dev.signature,
            "dev_history": dev.history,
        })
    if chief:
        report["loss_plot"] = _plot_losses(step_log.losses, os.path.join(cfg.out, "loss.png"), start_step,
                                           eval_loss=eval_loss, unigram_loss=unigram_loss)
        write_json(os.path.join(cfg.out, REPORT_FILE), report)
    return report


class _Steps:
    """The train and eval step functions of one run, each traced once.

    Both take a global batch of `data.lm_dataset`, whose signature leaves the
    batch and length dimensions open, so each function traces once for the
    whole run. Batches come in one shape per bucket length (`[batch_size, L]`),
    so with `jit_compile` XLA compiles each function at most once per bucket.
    `traces` counts the traces (the Python body of a `tf.function` runs only
    when it traces) and `shapes` the distinct batch shapes each function saw.
    """

    def __init__(self, model, strategy, element_spec, jit_compile):
        self.model, self.strategy = model, strategy
        self.traces = {"train": 0, "eval": 0}
        self.shapes = {"train": set(), "eval": set()}
        signature = [element_spec]
        self._train = tf.function(self._train_step, jit_compile=jit_compile, input_signature=signature)
        self._eval = tf.function(self._eval_step, jit_compile=jit_compile, input_signature=signature)

    def train(self, batch):
        self.shapes["train"].add(tuple(batch[1].shape))
        return self._train(batch)

    def eval(self, batch):
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


def _restore_newest_readable(checkpoints, directory, first, new_checkpoint, model, optimizer):
    """Restores the newest readable checkpoint of `checkpoints`; returns `(prefix, batches, checkpoint)`.

    A checkpoint whose files are truncated or corrupt (TensorFlow raises `IndexError: Read less
    bytes than requested` or a `tf.errors.OpError`) is skipped for the one before it, with a
    warning that names both. `first` is the `(batches, checkpoint)` to try first; every later try
    gets a fresh pair from `new_checkpoint()`.

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


def _fit(steps_fn, batches, steps, callbacks, verbose, stop=None):
    """Runs `steps` training steps on the global batches of the iterator `batches`.

    With a `_StopOnSignal` `stop`, a signal ends the loop after the current step; the callbacks'
    `on_train_end` still runs (the checkpoint callback saves that step).

    Keras `fit` would make its own iterator, which cannot be checkpointed
    under a distribution strategy. Here every replica takes its slice of the
    host's global batch, so the iterator is a plain `tf.data` iterator that
    `tf.train.Checkpoint` saves with the model.
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


def _evaluate(steps_fn, dataset):
    """The mean cross-entropy over the real labels of `dataset`, each replica on its slice of each batch.

    Like `_fit`, every worker reads the same global batches, so every worker
    gets the same result. Keras 3's `evaluate` cannot run this model under
    `MultiWorkerMirroredStrategy` (it fails converting the distributed dict
    inputs to a tensor); the sums here are reduced over replicas per batch and
    added up in float64, independent of the Keras version.
    """
    total, count = 0.0, 0.0
    for batch in dataset:
        batch_sum, batch_count = steps_fn.eval(batch)
        total, count = total + float(batch_sum), count + float(batch_count)
    return total / max(count, 1.0)


def _plot_losses(losses, path, start_step=0, *, eval_loss=None, unigram_loss=None):
    """Saves the per-step training loss (and its moving average) as a PNG; returns the path."""
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
