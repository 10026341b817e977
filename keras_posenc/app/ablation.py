"""Position-encoding ablation and length extrapolation (`keras-posenc ablate`).

`run_ablation` compares position encodings on this package's layers, and
how far each carries a model past its training length:

- every variant of `VARIANTS` trains the same causal Transformer LM
  (`keras_posenc.Encoder` + a softmax head) with the same data order, budget
  and seeds;
- held-out next-token loss is measured at the training length T and at 2T
  and 4T. Formula variants evaluate the same trained model on longer inputs
  (`overflow="extend"`); a learned table has no rows past T, so it reports
  "cannot extrapolate" instead of a number;
- attention focus: the mean last-layer attention weight by query-key
  distance `i - j` on held-out text;
- `write_report` writes `ablation.md` (mean ± std over seeds), `ablation.json`
  and three PNGs (loss curves, extrapolation, attention focus).

Data: every training example is T+1 tokens of consecutive corpus lines (the
line starting at each training line, then the following ones), so every
position 0..T-1 is trained equally often; `<s>` is at position 0. Held-out
windows are built the same way from a contiguous block at the end of the
corpus, with the same starting lines at every evaluated length. With a
causal mask, positions below T then get the same loss at T, 2T and 4T for
every variant whose encoding of a position does not depend on the evaluated
length, so any difference comes from the positions past T. That is not true
of `rope-ntk`, `rope-yarn` and `rope-llama3`: evaluated at L > T with the
scaling factor L / T, they change the rotation of every position, those
below T included.

Runs are deterministic for a given seed (`keras.utils.set_random_seed` and
op determinism); the seed also fixes the order of training examples, which
is the same for every variant.

Example:

>>> sorted(VARIANTS)[:3]
['alibi', 'integer', 'integer-raw']
>>> variant_kwargs("integer", AblationConfig(max_length=32))
{'position': 'integer', 'scale': 0.03125}
>>> uniform_attention_by_distance(2).tolist()  # row 0: [1], row 1: [1/2, 1/2]
[0.75, 0.5]

A whole ablation trains many models, so it is exercised by
`tests/test_ablation.py` rather than by a doctest::

    keras-posenc ablate --quick --out runs/ablation-quick   # tiny model
    keras-posenc ablate --out runs/ablation

References:
    - `docs/articles-behind-the-tools.md`: the source articles' comparison
      and extrapolation claims that this ablation re-measures.
    - Press et al., "Train Short, Test Long: Attention with Linear Biases
      Enables Input Length Extrapolation", ICLR 2022,
      https://arxiv.org/abs/2108.12409 (evaluating past the training
      length).
"""

import dataclasses
import hashlib
import json
import os
import time

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from keras_posenc.app import dataset as data
from keras_posenc.app import diagnostics
from keras_posenc.app._plotting import pyplot, save_figure
from keras_posenc.app.train_logs import StepLog
from keras_posenc.backend import keras, make_deterministic
from keras_posenc.files import write_text
from keras_posenc.models import CausalLM, transformer_adam
from keras_posenc.validation import check_positive_ints

__all__ = [
    "CANNOT_EXTRAPOLATE", "QUICK", "VARIANTS", "AblationConfig", "AblationData", "build_model",
    "check_config", "joined_windows", "markdown_table", "position_losses", "prepare_data", "run_ablation",
    "run_one", "uniform_attention_by_distance", "variant_kwargs", "write_report",
]

CANNOT_EXTRAPOLATE = "cannot extrapolate"

# name -> (description, Encoder position kwargs as a function of the config).
VARIANTS = {
    "sinusoidal": ("sin/cos, full table", lambda c: {"position": "sinusoidal", "table": "full"}),
    "sinusoidal-factorized": ("sin/cos, factorized table (exact)",
                              lambda c: {"position": "sinusoidal", "table": "factorized"}),
    "sinusoidal-interpolated": ("sin/cos, interpolated table (d_model/4 stored dims)",
                                lambda c: {"position": "sinusoidal", "table": "interpolated",
                                           "stored_dims": max(2, c.d_model // 8 * 2)}),
    "learned": ("learned table (T rows)", lambda c: {"position": "learned"}),
    "integer": ("increasing integer p/T on every dim",
                lambda c: {"position": "integer", "scale": 1.0 / c.max_length}),
    "integer-raw": ("raw increasing integer p on every dim (the article's)",
                    lambda c: {"position": "integer", "scale": 1.0}),
    "none": ("all-zero (no position signal)", lambda c: {"position": "none"}),
    "rope": ("RoPE: rotary queries and keys", lambda c: {"position": "rope"}),
    "rope-ntk": ("RoPE, NTK-aware base x (L/T)^(d/(d-2)) when evaluated at L > T",
                 lambda c: {"position": "rope", "scaling": "ntk"}),
    "rope-yarn": ("RoPE, YaRN (pair-index ramp, beta 32/1) with s = L/T when evaluated at L > T",
                  lambda c: {"position": "rope", "scaling": "yarn", "original_length": c.max_length}),
    "rope-llama3": ("RoPE, Llama 3.1 scaling (freq factors 1 and 4) with s = L/T when evaluated at L > T",
                    lambda c: {"position": "rope", "scaling": "llama3", "original_length": c.max_length}),
    "alibi": ("ALiBi: linear biases on attention logits", lambda c: {"position": "alibi"}),
}

# Variants trained as plain RoPE (a scaling factor of 1 is the identity) and evaluated at a length
# L > T with the scaling factor L / T, without fine-tuning: the scalings' use as published.
_SCALED_AT_EVALUATION = ("ntk", "yarn", "llama3")


@dataclasses.dataclass(frozen=True)
class AblationConfig:
    """Model, data and budget shared by every variant.

    Attributes:
        max_length: training length T (model input tokens).
        eval_multiples: evaluated lengths as multiples of T.
        steps: optimizer steps per run.
        batch_size: sequences per step.
        seeds: one run per seed and variant.
        variants: names from `VARIANTS`.
        num_layers, d_model, num_heads, dff, dropout: the encoder.
        vocab_size: SentencePiece vocabulary.
        warmup_steps, lr_scale: the training CLI's `WarmupSchedule` for Adam.
        eval_fraction: share of corpus lines (a contiguous block at the end)
            held out.
        max_train_lines: use at most this many training lines (None: all).
        max_eval_windows: held-out windows per evaluated length.
        curve_every: steps per point of the training-loss curve.
        run_eagerly: train without tracing a graph (faster for a handful of
            steps, as in `QUICK`).
        causal: use the causal mask (a proper next-token LM). False trains
            the article's unmasked encoder on the same next-token targets: the
            answer at position i is the input at position i+1, so the task
            becomes "find your right neighbour", which needs positions.

    Raises:
        ValueError: a size is not a positive int, or `variants`, `seeds` or
            `eval_multiples` is empty or invalid.

    Example:

    >>> AblationConfig(max_length=16).eval_lengths
    [16, 32, 64]
    >>> AblationConfig(variants=("rotary",))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `variants` must be a non-empty subset of (...), got variants=('rotary',).
    """

    max_length: int = 32
    eval_multiples: tuple = (1, 2, 4)
    steps: int = 700
    batch_size: int = 32
    seeds: tuple = (0, 1, 2)
    variants: tuple = tuple(VARIANTS)
    num_layers: int = 2
    d_model: int = 64
    num_heads: int = 4
    dff: int = 256
    dropout: float = 0.1
    vocab_size: int = 512
    warmup_steps: int = 100
    lr_scale: float = 1.0
    eval_fraction: float = 0.1
    max_train_lines: int = None
    max_eval_windows: int = 256
    curve_every: int = 25
    run_eagerly: bool = False
    causal: bool = True

    def __post_init__(self):
        check_positive_ints((name, getattr(self, name)) for name in (
            "max_length", "steps", "batch_size", "num_layers", "d_model", "num_heads", "dff",
            "max_eval_windows", "curve_every", "warmup_steps"))
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise ValueError(f"`variants` must be a non-empty subset of {tuple(VARIANTS)}, "
                             f"got variants={tuple(self.variants)!r}.")
        if not self.seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in self.seeds):
            raise ValueError(f"`seeds` must be a non-empty list of ints, got seeds={self.seeds!r}.")
        if not self.eval_multiples or any(not isinstance(m, int) or m < 1 for m in self.eval_multiples):
            raise ValueError(f"`eval_multiples` must be positive ints, got {self.eval_multiples!r}.")

    @property
    def eval_lengths(self):
        """The evaluated lengths in tokens: `max_length` times each of `eval_multiples`."""
        return [self.max_length * m for m in self.eval_multiples]


QUICK = AblationConfig(max_length=8, steps=4, batch_size=4, seeds=(0, 1), num_layers=1, d_model=8,
                       num_heads=2, dff=16, vocab_size=100, max_train_lines=200, max_eval_windows=4,
                       curve_every=2, warmup_steps=2, run_eagerly=True)


def variant_kwargs(name, config):
    """Encoder position kwargs of variant `name` under `config`.

    Args:
        name: str, a key of `VARIANTS`.
        config: an `AblationConfig` (some variants depend on `max_length`
            or `d_model`).

    Returns:
        dict, the position keyword arguments of `keras_posenc.Encoder`.

    Example:

    >>> variant_kwargs("sinusoidal-interpolated", AblationConfig(d_model=64))
    {'position': 'sinusoidal', 'table': 'interpolated', 'stored_dims': 16}
    """
    return VARIANTS[name][1](config)


def _extrapolates(name, config):
    return variant_kwargs(name, config)["position"] != "learned"


# Data -------------------------------------------------------------------------------------------
def _piece_counts(lines, sp_model):
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    return [len(ids) for ids in processor.EncodeAsIds(lines)]


def joined_windows(lines, counts, min_tokens, max_windows=None):
    """Texts of consecutive lines starting at each line, each at least `min_tokens` pieces long.

    Lines are joined with a space (SentencePiece tokenizes each word with its
    leading space either way). Starts whose chain runs out of lines are
    dropped. At most `max_windows` texts, from evenly spaced starts.

    Args:
        lines: list of str, consecutive corpus lines.
        counts: list of int, the SentencePiece piece count of each line.
        min_tokens: int, the least number of pieces in a window.
        max_windows: int or None, the most windows returned.

    Returns:
        list of str, one window per usable start line.

    Example:

    >>> joined_windows(["a b", "c", "d e f"], [2, 1, 3], min_tokens=3)
    ['a b c', 'c d e f', 'd e f']
    >>> joined_windows(["a b", "c", "d e f"], [2, 1, 3], min_tokens=3, max_windows=2)
    ['a b c', 'd e f']
    """
    texts = []
    for start in range(len(lines)):
        total, end = 0, start
        while total < min_tokens and end < len(lines):
            total += counts[end]
            end += 1
        if total >= min_tokens:
            texts.append(" ".join(lines[start:end]))
    if max_windows is not None and len(texts) > max_windows:
        picks = np.linspace(0, len(texts) - 1, max_windows).round().astype(int)
        texts = [texts[i] for i in picks]
    return texts


@dataclasses.dataclass
class AblationData:
    """Tokenized windows: `train` `[N, T + 1]` and `eval` `[M, max eval length + 1]` int32.

    Returned by `prepare_data`; every row starts with `<s>` and has no
    padding.

    Attributes:
        sp_model: bytes, the SentencePiece model trained on the training
            lines.
        train: int32 array `[N, T + 1]`, training windows.
        eval: int32 array `[M, max(eval_lengths) + 1]`, held-out windows.
        vocab_size: int, the SentencePiece vocabulary size.
        corpus_lines: int, non-blank lines in the corpus.
        train_lines: int, lines used for training.
        eval_lines: int, held-out lines.
    """

    sp_model: bytes
    train: np.ndarray
    eval: np.ndarray
    vocab_size: int
    corpus_lines: int
    train_lines: int
    eval_lines: int


def _tokenized(texts, sp_model, length):
    """`[len(texts), length + 1]` ids: `<s>` then the first `length` pieces (via `data.lm_dataset`)."""
    ds = data.lm_dataset(texts, sp_model, max_length=length, batch_size=len(texts), add_bos=True,
                         add_eos=False, bucket_lengths=None, shuffle=False)
    features, labels = next(iter(ds))
    tokens = np.concatenate([features["token_ids"].numpy(), labels.numpy()[:, -1:]], axis=1)
    assert tokens.shape == (len(texts), length + 1) and not np.any(tokens == data.PAD_ID), tokens.shape
    return tokens.astype(np.int32)


def prepare_data(corpus, config):
    """Reads the corpus, trains SentencePiece on the training lines, tokenizes the windows.

    The last `eval_fraction` of the lines is held out (a contiguous block);
    training and held-out windows are built with `joined_windows`.

    Args:
        corpus: str, a plain-text corpus file.
        config: an `AblationConfig`.

    Returns:
        an `AblationData`.

    Raises:
        CorpusError: the corpus is missing or empty, or too small for
            windows of the configured lengths.

    Example: see `tests/test_ablation.py::test_too_small_corpus_is_a_clear_error`
    and `run_ablation`, which calls it on the whole corpus.
    """
    lines = data.read_text_corpus(corpus)
    n_eval = max(1, round(len(lines) * config.eval_fraction))
    train_lines, eval_lines = lines[:-n_eval], lines[-n_eval:]
    if config.max_train_lines is not None:
        train_lines = train_lines[:config.max_train_lines]
    sp_model = data.train_sentencepiece(train_lines, config.vocab_size)
    # Margin of 2 pieces: joining can merge a piece at a line boundary.
    need = config.max_length + 3
    train_texts = joined_windows(train_lines, _piece_counts(train_lines, sp_model), need)
    longest = max(config.eval_lengths)
    eval_texts = joined_windows(eval_lines, _piece_counts(eval_lines, sp_model), longest + 3,
                                config.max_eval_windows)
    if not train_texts or not eval_texts:
        raise data.CorpusError(
            f"Corpus {os.fspath(corpus)!r} is too small for the ablation: it needs consecutive lines "
            f"of at least {need} pieces for training and {longest + 3} for evaluation.")
    return AblationData(sp_model, _tokenized(train_texts, sp_model, config.max_length),
                        _tokenized(eval_texts, sp_model, longest), data.sentencepiece_vocab_size(sp_model),
                        len(lines), len(train_lines), len(eval_lines))


def _train_dataset(tokens, batch_size, seed):
    ds = tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:]))
    ds = ds.shuffle(len(tokens), seed=seed, reshuffle_each_iteration=True).repeat()
    return ds.batch(batch_size, drop_remainder=True).prefetch(2)


# Model ------------------------------------------------------------------------------------------
def _encoder_config(config, vocab_size, name, *, max_length=None):
    """`Encoder` kwargs of variant `name`; formula variants get `overflow="extend"`."""
    kwargs = variant_kwargs(name, config)
    if kwargs["position"] != "learned":
        kwargs["overflow"] = "extend"
    return dict(num_layers=config.num_layers, d_model=config.d_model, num_heads=config.num_heads,
                dff=config.dff, vocab_size=vocab_size, max_length=max_length or config.max_length,
                dropout=config.dropout, pad_id=data.PAD_ID, **kwargs)


def check_config(config):
    """Checks the model of every variant of `config` with its layers' own validation (builds nothing).

    `keras-posenc ablate` calls it before it touches `--out`, so a bad setting (`d_model` not
    divisible by `num_heads`, ...) fails at once, not after the first variants have trained.

    Raises:
        ValueError: naming the setting.

    Example:

    >>> import dataclasses
    >>> check_config(dataclasses.replace(QUICK, d_model=9, variants=("rope",)))
    Traceback (most recent call last):
    ...
    ValueError: `d_model` must be divisible by `num_heads`, got d_model=9 and num_heads=2.
    """
    for name in config.variants:
        CausalLM(_encoder_config(config, config.vocab_size, name), causal=config.causal, name="config_check")


def build_model(config, vocab_size, name, *, max_length=None):
    """The training CLI's language model (`models.CausalLM`) with variant `name`'s position layer.

    Formula variants get `overflow="extend"`, so the trained model accepts
    inputs longer than `config.max_length`.

    Args:
        config: an `AblationConfig` (its `causal` is the model's).
        vocab_size: int, the tokenizer's vocabulary size.
        name: str, a key of `VARIANTS`.
        max_length: int, the encoder's `max_length` (default
            `config.max_length`).

    Returns:
        a built `CausalLM` named `lm_<name>`.

    Example:

    >>> model = build_model(QUICK, vocab_size=100, name="sinusoidal")
    >>> model.name, model.encoder_config["overflow"], model(tf.constant([[2] * 20])).shape
    ('lm_sinusoidal', 'extend', TensorShape([1, 20, 100]))
    """
    model = CausalLM(_encoder_config(config, vocab_size, name, max_length=max_length), causal=config.causal,
                     name=f"lm_{name}")
    model.build_on_dummy()
    return model


def _eval_model(model, config, vocab_size, name, length):
    if length > config.max_length and variant_kwargs(name, config).get("scaling") in _SCALED_AT_EVALUATION:
        encoder_config = {**_encoder_config(config, vocab_size, name),
                          "scaling_factor": length / config.max_length}
        clone = CausalLM(encoder_config, causal=config.causal, name=f"lm_{name}_x{length}")
        clone.build_on_dummy()
        clone.set_weights(model.get_weights())
        return clone
    # "extend" on an interpolated table computes exact sin/cos rows for the whole batch, which is
    # not the table the model was trained with; a table built for `length` rows keeps its rows.
    if length <= config.max_length or variant_kwargs(name, config).get("table") != "interpolated":
        return model
    clone = build_model(config, vocab_size, name, max_length=length)
    clone.set_weights(model.get_weights())
    return clone


def _train(model, dataset, config):
    """`keras fit` with the training CLI's optimizer; returns the loss of every step."""
    optimizer = transformer_adam(config.d_model, config.warmup_steps, scale=config.lr_scale)
    model.compile(optimizer=optimizer, run_eagerly=config.run_eagerly)
    step_log = StepLog()
    model.fit(dataset, epochs=1, steps_per_epoch=config.steps, callbacks=[step_log], verbose=0)
    return step_log.losses


def position_losses(model, tokens, batch_size):
    """Mean next-token cross-entropy at every position `[length]` (nats) over windows `tokens`.

    Args:
        model: a `CausalLM`-like model returning logits.
        tokens: int array `[n, length + 1]`, windows without padding; the
            model reads `[:, :-1]` and predicts `[:, 1:]`.
        batch_size: int, windows per forward pass.

    Returns:
        float64 numpy array `[length]`.

    Example: an untrained model with zero weights predicts uniformly, so
    every position costs `log(vocab_size)`.

    >>> model = build_model(QUICK, vocab_size=100, name="none")
    >>> model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    >>> losses = position_losses(model, np.full([3, 5], 7, np.int32), batch_size=2)
    >>> losses.shape, bool(np.allclose(losses, np.log(100)))
    ((4,), True)
    """
    total = 0.0
    for start in range(0, len(tokens), batch_size):
        batch = tokens[start:start + batch_size]
        logits = model(batch[:, :-1], training=False)
        loss = keras.losses.sparse_categorical_crossentropy(batch[:, 1:], logits, from_logits=True)
        total = total + tf.reduce_sum(tf.cast(loss, tf.float64), axis=0).numpy()
    return total / len(tokens)


def uniform_attention_by_distance(length):
    """The same statistic for uniform causal attention (row i puts 1/(i+1) on each key).

    The baseline of `diagnostics.attention_by_distance`: entry `d` is the
    mean of `1 / (i + 1)` over the queries `i >= d`.

    Args:
        length: int, the sequence length T.

    Returns:
        float64 numpy array `[length]`.

    Example:

    >>> np.round(uniform_attention_by_distance(3), 4).tolist()  # [(1 + 1/2 + 1/3)/3, (1/2 + 1/3)/2, 1/3]
    [0.6111, 0.4167, 0.3333]
    """
    return np.array([np.mean(1.0 / (np.arange(d, length) + 1.0)) for d in range(length)])


# Runs -------------------------------------------------------------------------------------------
def run_one(config, prepared, name, seed):
    """Trains variant `name` with `seed` and evaluates it; returns a JSON-ready dict.

    Args:
        config: an `AblationConfig`.
        prepared: the `AblationData` of the corpus.
        name: str, a key of `VARIANTS`.
        seed: int, seeds initialization, dropout and the data order.

    Returns:
        dict with `seed`, per-step `losses`, the training `curve`,
        `train_loss`, `train_seconds`, held-out loss per evaluated length in
        `eval` (`CANNOT_EXTRAPOLATE` past T for a learned table), the loss
        past T in `beyond_train_length`, per-position `position_losses`, and
        `attention_by_distance` (last layer; None without the causal mask).

    Example: training takes seconds, so this is exercised through
    `run_ablation` by `tests/test_ablation.py` (the `quick_run` fixture).
    """
    keras.utils.set_random_seed(seed)
    model = build_model(config, prepared.vocab_size, name)
    start = time.perf_counter()
    losses = _train(model, _train_dataset(prepared.train, config.batch_size, seed), config)
    train_seconds = time.perf_counter() - start
    every = config.curve_every
    curve = [[min(i + every, len(losses)), float(np.mean(losses[i:i + every]))]
             for i in range(0, len(losses), every)]
    result = {"seed": seed, "losses": [float(v) for v in losses], "curve": curve,
              "train_loss": curve[-1][1],
              "train_seconds": round(train_seconds, 2), "eval": {}, "beyond_train_length": {},
              "position_losses": {}}
    t = config.max_length
    for length in config.eval_lengths:
        key = str(length)
        if length > t and not _extrapolates(name, config):
            result["eval"][key] = result["beyond_train_length"][key] = CANNOT_EXTRAPOLATE
            continue
        evaluated = _eval_model(model, config, prepared.vocab_size, name, length)
        losses = position_losses(evaluated, prepared.eval[:, :length + 1], config.batch_size * 2)
        result["eval"][key] = float(np.mean(losses))
        if length > t:
            result["beyond_train_length"][key] = float(np.mean(losses[t:]))
        result["position_losses"][key] = [float(v) for v in losses]
    result["attention_by_distance"] = None  # the statistic assumes the causal mask
    if config.causal:
        per_layer = diagnostics.attention_by_distance(model.encoder, tf.constant(prepared.eval[:, :t]))
        result["attention_by_distance_per_layer"] = [[float(v) for v in layer] for layer in per_layer]
        result["attention_by_distance"] = result["attention_by_distance_per_layer"][-1]
    return result


def _mean_std(values):
    values = np.asarray(values, np.float64)
    std = float(np.std(values, ddof=1)) if values.size > 1 else 0.0
    return [float(np.mean(values)), std]


def _summarize(runs, config):
    """Mean and sample std (ddof=1) over seeds of every reported number."""
    summary = {"train_loss": _mean_std([r["train_loss"] for r in runs]), "eval": {},
               "beyond_train_length": {}}
    for section in ("eval", "beyond_train_length"):
        for key in runs[0][section]:
            values = [r[section][key] for r in runs]
            summary[section][key] = (CANNOT_EXTRAPOLATE if values[0] == CANNOT_EXTRAPOLATE
                                     else _mean_std(values))
    summary["attention_by_distance"] = (None if runs[0]["attention_by_distance"] is None else
                                        np.mean([r["attention_by_distance"] for r in runs], 0).tolist())
    return summary


def run_ablation(corpus=None, config=AblationConfig(), *, log=print):
    """Runs every variant with every seed; returns the JSON-ready results dict.

    Args:
        corpus: str or None, a plain-text corpus (None: the embedded one).
        config: an `AblationConfig` (`QUICK` for a tiny run).
        log: callable taking one str, called after every run.

    Returns:
        dict with `config`, `corpus` (name, sha256, line and window counts),
        `vocab_size`, `variants` (per variant: `description`, `kwargs`, the
        `runs` of `run_one` and their `summary`: mean and sample std over
        seeds), `uniform_attention_by_distance` and `elapsed_seconds`.

    Raises:
        CorpusError: the corpus is missing, empty or too small.

    Example: see `tests/test_ablation.py`, or from the command line::

        keras-posenc ablate --quick --out runs/ablation-quick

    References:
        - `docs/articles-behind-the-tools.md`.
    """
    corpus = corpus or data.default_corpus_path()
    started = time.perf_counter()
    make_deterministic()
    prepared = prepare_data(corpus, config)
    with open(corpus, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    results = {
        "config": dataclasses.asdict(config),
        "corpus": {"path": os.path.basename(os.fspath(corpus)), "sha256": digest,
                   "lines": prepared.corpus_lines, "train_lines": prepared.train_lines,
                   "eval_lines": prepared.eval_lines, "train_windows": len(prepared.train),
                   "eval_windows": len(prepared.eval)},
        "vocab_size": prepared.vocab_size,
        "variants": {},
    }
    for name in config.variants:
        runs = []
        for seed in config.seeds:
            run = run_one(config, prepared, name, seed)
            log(f"{name:24s} seed {seed}: train {run['train_loss']:.4f}  eval "
                + "  ".join(f"{k}:{v if isinstance(v, str) else round(v, 4)}" for k, v in run["eval"].items())
                + f"  ({run['train_seconds']:.1f} s)")
            runs.append(run)
        results["variants"][name] = {"description": VARIANTS[name][0],
                                     "kwargs": variant_kwargs(name, config),
                                     "runs": runs, "summary": _summarize(runs, config)}
    results["uniform_attention_by_distance"] = uniform_attention_by_distance(config.max_length).tolist()
    results["elapsed_seconds"] = round(time.perf_counter() - started, 1)
    return results


# Report -----------------------------------------------------------------------------------------
def _fmt(value, digits=3):
    if isinstance(value, str):
        return value
    mean, std = value
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(results):
    """The mean ± std table of `ablation.md`.

    Args:
        results: dict from `run_ablation` (only `config` and each variant's
            `summary` are read).

    Returns:
        str, a Markdown table: one row per variant; train loss, held-out
        loss at every evaluated length, and the loss of the positions past
        the training length.

    Example:

    >>> sinusoidal = {"train_loss": [2.0, 0.1], "eval": {"4": [2.5, 0.2], "8": [2.75, 0.25]},
    ...               "beyond_train_length": {"8": [3.0, 0.3]}}
    >>> learned = {"train_loss": [1.9, 0.1], "eval": {"4": [2.4, 0.2], "8": CANNOT_EXTRAPOLATE},
    ...            "beyond_train_length": {"8": CANNOT_EXTRAPOLATE}}
    >>> results = {"config": {"max_length": 4, "eval_multiples": [1, 2]},
    ...            "variants": {"sinusoidal": {"summary": sinusoidal}, "learned": {"summary": learned}}}
    >>> print(markdown_table(results))
    | variant | train loss | held-out @4 | held-out @8 | @8, positions ≥ 4 |
    |---|---|---|---|---|
    | `sinusoidal` | 2.000 ± 0.100 | 2.500 ± 0.200 | 2.750 ± 0.250 | 3.000 ± 0.300 |
    | `learned` | 1.900 ± 0.100 | 2.400 ± 0.200 | cannot extrapolate | cannot extrapolate |
    """
    config = results["config"]
    t = config["max_length"]
    lengths = [t * m for m in config["eval_multiples"]]
    head = ["variant", "train loss"] + [f"held-out @{n}" for n in lengths]
    head += [f"@{n}, positions ≥ {t}" for n in lengths if n > t]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, entry in results["variants"].items():
        s = entry["summary"]
        cells = [f"`{name}`", _fmt(s["train_loss"])] + [_fmt(s["eval"][str(n)]) for n in lengths]
        cells += [_fmt(s["beyond_train_length"][str(n)]) for n in lengths if n > t]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_report(results, out_dir, command=None):
    """Writes ablation.json, ablation.md and the three PNGs to `out_dir`; returns their paths.

    Each file is written atomically (`keras_posenc.files`): whole under its name, or not at all.

    Args:
        results: dict from `run_ablation`.
        out_dir: str, output folder (created if needed).
        command: str or None, the command line recorded in both reports.

    Returns:
        dict from file name (`"ablation.json"`, `"ablation.md"`,
        `"loss_curves.png"`, `"extrapolation.png"`, `"attention_focus.png"`)
        to its path.

    Example: see `tests/test_ablation.py::test_quick_cli_writes_every_file`,
    or from the command line::

        keras-posenc ablate --quick --out runs/ablation-quick
    """
    os.makedirs(out_dir, exist_ok=True)
    if command is not None:
        results = {**results, "command": command}
    paths = {name: os.path.join(out_dir, name) for name in (
        "ablation.json", "ablation.md", "loss_curves.png", "extrapolation.png", "attention_focus.png")}
    write_text(paths["ablation.json"], json.dumps(results, indent=1) + "\n")
    config = results["config"]
    lines = [
        "# Position-encoding ablation",
        "",
        f"Command: `{results.get('command', 'keras-posenc ablate')}`",
        "",
        (("Causal" if config.get("causal", True) else "UNMASKED (no causal mask, as in article 000)")
         + f" next-token LM, {config['num_layers']} layers, d_model {config['d_model']}, "
        f"{config['num_heads']} heads, dff {config['dff']}, dropout {config['dropout']}, "
        f"vocab {results['vocab_size']} (SentencePiece), T = {config['max_length']}, "
        f"{config['steps']} steps of batch {config['batch_size']}, Adam with the Transformer schedule "
        f"(warmup {config['warmup_steps']}, scale {config['lr_scale']}), "
        f"seeds {list(config['seeds'])}. Corpus `{results['corpus']['path']}` "
        f"({results['corpus']['train_lines']} training lines, {results['corpus']['eval_lines']} held-out "
        f"lines, {results['corpus']['eval_windows']} held-out windows)."),
        "",
        ("Cross-entropy in nats per token, mean ± sample std over seeds. Train loss: mean over the "
        f"last {config['curve_every']} steps (with dropout). Held-out @L: mean over all L positions "
        "of windows of L tokens; the positions-≥-T columns average only the positions past the "
        "training length."),
        "",
        markdown_table(results),
        "",
        f"Total time: {results['elapsed_seconds']} s.",
        "",
    ]
    write_text(paths["ablation.md"], "\n".join(lines))
    _plot_curves(results, paths["loss_curves.png"])
    _plot_extrapolation(results, paths["extrapolation.png"])
    _plot_attention(results, paths["attention_focus.png"])
    return paths


def _plot_curves(results, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, entry in results["variants"].items():
        curves = np.array([[point[1] for point in run["curve"]] for run in entry["runs"]])
        steps = [point[0] for point in entry["runs"][0]["curve"]]
        mean = curves.mean(0)
        ax.plot(steps, mean, label=name)
        if len(curves) > 1:
            std = curves.std(0, ddof=1)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title("Training loss, mean ± std over seeds")
    ax.legend()
    save_figure(fig, path, dpi=110)


def _plot_extrapolation(results, path):
    plt = pyplot()
    config = results["config"]
    t = config["max_length"]
    longest = str(t * max(config["eval_multiples"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, entry in results["variants"].items():
        lengths, means, stds = [], [], []
        for key, value in entry["summary"]["eval"].items():
            if not isinstance(value, str):
                lengths.append(int(key))
                means.append(value[0])
                stds.append(value[1])
        left.errorbar(lengths, means, yerr=stds, marker="o", capsize=3, label=name)
        per_position = [run["position_losses"].get(longest, run["position_losses"][str(t)])
                        for run in entry["runs"]]
        curve = np.mean(per_position, 0)
        right.plot(np.arange(len(curve)), curve, label=name, linewidth=1)
    left.set_xscale("log", base=2)
    left.set_xlabel("evaluated length (tokens)")
    left.set_ylabel("held-out loss (nats/token)")
    left.set_title("Held-out loss by length (learned: cannot extrapolate)")
    left.legend()
    right.axvline(t - 0.5, color="gray", linestyle="--", label=f"training length {t}")
    right.set_xlabel("position")
    right.set_ylabel("held-out loss at the position")
    right.set_title(f"Loss by position in {longest}-token windows")
    right.legend(fontsize=8)
    save_figure(fig, path, dpi=110)


def _plot_attention(results, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if not results["config"].get("causal", True):
        ax.text(0.5, 0.5, "not computed: attention focus by distance i - j\nassumes the causal mask",
                ha="center", va="center", transform=ax.transAxes)
    for name, entry in results["variants"].items():
        if entry["summary"]["attention_by_distance"] is not None:
            ax.plot(entry["summary"]["attention_by_distance"], marker=".", label=name)
    ax.plot(results["uniform_attention_by_distance"], color="black", linestyle=":",
            label="uniform causal attention")
    ax.set_yscale("log")
    ax.set_xlabel("query-key distance i - j")
    ax.set_ylabel("mean attention weight (last layer)")
    ax.set_title("Attention focus by distance, mean over heads, held-out windows and seeds")
    ax.legend()
    save_figure(fig, path, dpi=110)
