"""Training of a causal next-token language model or a translator (checkpoints, tf.distribute).

The model is `models.CausalLM` (a causal `Encoder` followed by
`Dense(vocab_size)`), or with `task="translate"` a
`seq2seq.Seq2SeqTransformer` whose kept weights are those of the best dev
BLEU (`dev_scoring`), trained with masked sparse cross-entropy (padding
ignored; label-smoothed for the translator) and `models.transformer_adam` (Adam(0.9, 0.98, 1e-9) on
`WarmupSchedule`). `train(TrainConfig(...))` writes to `out`:
`model.keras`, `spm.model`, `report.json`, `loss.png`, TensorBoard logs in
`logs/` and checkpoints in `checkpoints/`.

This module checks the settings, reads the data and runs the pieces in
order; each piece has its own module:

- `train_config`: `TrainConfig`, the settings (one field per flag);
- `train_strategy`: the `tf.distribute` strategy and whether XLA compiles the steps;
- `checkpoints`: saving, checking and restoring the checkpoints (`--resume`);
- `train_steps`: the train and eval steps (`TrainSteps`), the loop (`fit`) and `evaluate`;
- `train_logs`: the per-step log, the TensorBoard scalars and the loss plot;
- `stop_on_signal`: SIGTERM and SIGINT stop the run after a step and a checkpoint.

Only the chief (`strategy.extended.should_checkpoint`) keeps the
checkpoints; other workers save into a scratch folder, because a save runs
collectives.

Example: training runs for seconds to minutes, so it is exercised by
`tests/test_train.py` (artifacts, determinism, resume after a killed
process, atomic checkpoints, mirrored and multi-worker strategies) rather
than by a doctest. From the command line (`keras_posenc.app.cli`)::

    keras-posenc train --corpus corpus.txt --out runs/lm --steps 200 --num-layers 1 --d-model 32
    keras-posenc train --corpus corpus.txt --out runs/lm --steps 400 --resume  # continue to step 400

References:
    - TensorFlow, "Training checkpoints" (`tf.train.CheckpointManager`),
      https://www.tensorflow.org/guide/checkpoint.
    - TensorFlow, "Custom training with tf.distribute.Strategy" (`strategy.run`),
      https://www.tensorflow.org/tutorials/distribute/custom_training.
"""

import contextlib
import dataclasses
import json
import math
import os
import shutil
import tempfile
import warnings

import tensorflow as tf

from keras_posenc.app import dataset as data_lib
from keras_posenc.app.checkpoints import (
    CONFIG_FILE,
    SCHEDULE_FILE,
    CheckpointCallback,
    check_checkpoint_config,
    checkpoint_dir,
    list_checkpoints,
    restore_newest_readable,
    write_json_atomically,
)
from keras_posenc.app.dev_scoring import DEV_SCORES_FILE, DevScoring
from keras_posenc.app.run_folder import MODEL_FILE, REPORT_FILE, TOKENIZER_FILE
from keras_posenc.app.run_lock import run_lock
from keras_posenc.app.stop_on_signal import StopOnSignal, TrainingInterrupted
from keras_posenc.app.train_config import TASKS, TrainConfig, default_warmup_steps
from keras_posenc.app.train_logs import ScalarLog, StepLog, plot_losses
from keras_posenc.app.train_steps import TrainSteps, evaluate, fit
from keras_posenc.app.train_strategy import JIT_COMPILE, STRATEGIES, make_strategy, use_jit_compile
from keras_posenc.backend import dropout_state, make_deterministic, save_model
from keras_posenc.files import write_bytes, write_json
from keras_posenc.models import transformer_adam
from keras_posenc.schedules import WarmupSchedule
from keras_posenc.validation import check_choice, check_positive_ints

# `TrainConfig` and `TrainingInterrupted` live in their own modules; they are named here too because
# `train(TrainConfig(...))` takes the one and raises the other.
__all__ = ["REPLACED_BY_A_FRESH_RUN", "TrainConfig", "TrainingInterrupted", "train"]

# What a fresh run (no --resume) writes into `out`, so what it replaces of an earlier run there. It
# removes them only once the new model is built, just before its first step; anything else in `out`
# (an export, inspect/, the user's files) is kept.
REPLACED_BY_A_FRESH_RUN = ("checkpoints", "logs", MODEL_FILE, TOKENIZER_FILE, REPORT_FILE, "loss.png")


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
    path = os.path.join(ckpt_dir, SCHEDULE_FILE)
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
    steps = ", ".join(str(step) for step, _ in list_checkpoints(checkpoint_dir(out)))
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
    jit_compile = use_jit_compile(cfg.jit_compile, strategy)
    chief = strategy.extended.should_checkpoint
    data = _load_data(cfg)
    with run_lock(cfg.out) if chief else contextlib.nullcontext():
        return _train(cfg, strategy, chief, jit_compile, *data)


def _train(cfg, strategy, chief, jit_compile, corpus, train_examples, eval_examples, dev_pairs):
    """`train` once the flags, the model config and the corpus are checked and `cfg.out` is locked."""
    make_deterministic(cfg.seed)
    ckpt_dir = checkpoint_dir(cfg.out)
    checkpoints = list_checkpoints(ckpt_dir)
    if cfg.resume and not checkpoints:
        raise ValueError(f"--resume was given but {ckpt_dir} holds no complete checkpoint to resume from.")
    sp_model, new_tokenizer = _tokenizer(cfg, train_examples)
    vocab_size = data_lib.sentencepiece_vocab_size(sp_model)
    model_config = cfg.model_config(vocab_size)
    if cfg.resume:
        check_checkpoint_config(ckpt_dir, model_config)
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
        path, batches, checkpoint = restore_newest_readable(checkpoints, ckpt_dir, (batches, checkpoint),
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
        write_json_atomically(os.path.join(ckpt_dir, CONFIG_FILE), model_config)
        write_json_atomically(os.path.join(ckpt_dir, SCHEDULE_FILE), {"warmup_steps": warmup_steps})

    # Every worker takes part in a save (it runs collectives); only the chief's copy is kept. The
    # other workers also keep their logs in that scratch folder: the run folder is the chief's.
    save_dir = ckpt_dir if chief else tempfile.mkdtemp(prefix="worker-ckpt-")
    manager = tf.train.CheckpointManager(checkpoint, save_dir, max_to_keep=cfg.keep_checkpoints,
                                         step_counter=optimizer.iterations)
    step_log = StepLog()
    callbacks = [step_log, CheckpointCallback(manager, cfg.checkpoint_every, optimizer),
                 ScalarLog(os.path.join(cfg.out if chief else save_dir, "logs"), cfg.log_every, optimizer,
                            WarmupSchedule(cfg.d_model, warmup_steps, scale=cfg.lr_scale))]
    dev = None
    if cfg.task == "translate":
        dev = DevScoring(model, sp_model, dev_pairs, cfg.checkpoint_every, optimizer,
                         os.path.join(ckpt_dir, DEV_SCORES_FILE) if chief else None)
        callbacks.append(dev)
    steps_fn = TrainSteps(model, strategy, train_ds.element_spec, jit_compile)
    # A signal stops a multi-worker run at once: its final save would need every worker.
    stop = StopOnSignal(active=not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))
    try:
        with stop:
            fit(steps_fn, batches, cfg.steps - start_step, callbacks, cfg.verbose, stop=stop)
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
    eval_loss = evaluate(steps_fn, eval_ds)
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
        report["loss_plot"] = plot_losses(step_log.losses, os.path.join(cfg.out, "loss.png"), start_step,
                                           eval_loss=eval_loss, unigram_loss=unigram_loss)
        write_json(os.path.join(cfg.out, REPORT_FILE), report)
    return report
