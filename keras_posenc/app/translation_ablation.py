"""Seed 002's translation claims re-measured in BLEU (`keras-posenc ablate --task translate`).

Seed 002 argues for each of its position-encoding choices with a BLEU
result on WMT en->de. `run_translation_ablation` trains the package's
`Seq2SeqTransformer` with the seed's setup (sinusoidal positions added to
the embeddings, post-LN, per-language position scale) once per arm of
`ARMS` and seed, on the English->German corpus of `make corpus` (Debian's
gettext catalogues, split by package), and scores every arm on the test
packages with sacrebleu (BLEU, chrF). Each claim of `CLAIMS` is the paired
difference of two arms, seed by seed, against the number the seed reports.

Every arm has the same data order, budget and seeds. Training pairs are
cut to those whose two sides have at most `train_length_cap` SentencePiece
pieces, so the test sentences longer than that (claim f) are past every
trained position; the model's tables have `max_length` rows. Decoding is
greedy over the whole prefix at every step (no cache), the one search that
is also right for the arm whose layer normalization spans positions.

Example:

>>> sorted(ARMS)[:3]
['base', 'compressed', 'learned']
>>> [claim.key for claim in CLAIMS]
['padding', 'norm-axis', 'pe-dropout', 'compressed', 'language-scale', 'learned-long']
>>> shuffle_words(["a b c d e", "one two"], fraction=1.0, seed=0)[1]  # too short to shuffle
'one two'

A whole ablation trains many models, so it is exercised by
`tests/test_translation_ablation.py` rather than by a doctest::

    keras-posenc ablate --task translate --quick --out runs/ablation-translate-quick
    keras-posenc ablate --task translate --out runs/ablation-translate

References:
    - `../shared/seeds` article 002, sections 3.2 to 6.3 (the claims).
    - Vaswani et al., "Attention Is All You Need", 2017,
      https://arxiv.org/abs/1706.03762.
    - Post, "A Call for Clarity in Reporting BLEU Scores", WMT 2018
      (sacrebleu), https://aclanthology.org/W18-6319/.
"""

import dataclasses
import hashlib
import json
import os
import random
import time

import numpy as np

from keras_posenc.app import dataset as data_lib
from keras_posenc.app._plotting import pyplot, save_figure
from keras_posenc.app.train_logs import StepLog
from keras_posenc.app.translation import corpus_scores
from keras_posenc.app.translation_data import pad_rows, source_ids, translation_dataset
from keras_posenc.backend import inference_function, keras, make_deterministic, ops, static_call
from keras_posenc.files import write_text
from keras_posenc.layers.attention_masks import merge_attention_masks
from keras_posenc.models import transformer_adam
from keras_posenc.seq2seq import SOURCE_LANGUAGE, Seq2SeqTransformer
from keras_posenc.special_ids import BOS_ID, EOS_ID, PAD_ID
from keras_posenc.validation import check_positive_ints

__all__ = ["ARMS", "CLAIMS", "QUICK", "SPLITS", "Claim", "TranslationAblationConfig",
           "attention_on_padding", "build_model", "check_corpus_dir", "greedy_translate", "markdown_table",
           "run_translation_ablation", "shuffle_words", "verdict", "write_report"]

# name -> (description, Seq2SeqTransformer keyword arguments as a function of the config).
ARMS = {
    "base": ("sin/cos full table added to the embeddings, zero at padding, per-language scale",
             lambda c: {}),
    "pad-not-zeroed": ("base, the position encoding kept at padding positions",
                       lambda c: {"position_config": {"zero_padding": False}}),
    "norm-over-positions": ("base, every LayerNormalization over the positions (axis -2)", lambda c: {}),
    "pe-dropout": ("base, dropout 0.1 on the position encoding",
                   lambda c: {"position_config": {"dropout": 0.1}}),
    "compressed": ("base, the interpolated table storing d_model / 8 of its dimensions",
                   lambda c: {"position_config": {"table": "interpolated", "stored_dims": c.d_model // 8}}),
    "no-language-scale": ("base without the per-language position scale",
                          lambda c: {"language_scale": False}),
    "learned": ("a learned position table instead of sin/cos", lambda c: {"position": "learned"}),
}

# A paired difference is an effect when every seed has its sign and its mean is at least this large:
# about the seed-to-seed standard deviation of the BLEU of one arm (docs/translation.md).
EFFECT_BLEU = 0.5


@dataclasses.dataclass(frozen=True)
class Claim:
    """One of seed 002's results as a paired difference of two arms.

    Attributes:
        key: short name.
        text: the claim.
        article: what the seed reports.
        article_effect: the seed's number as `treatment - control` (BLEU).
        treatment, control: arm names.
        metric: "test" (BLEU on the test packages), "long" (BLEU on the test
            sentences longer than the training cap) or "shuffled_drop" (BLEU
            with 10 % of the sources word-shuffled minus BLEU on the clean ones).
        note: why ours can differ, known before running.
    """

    key: str
    text: str
    article: str
    article_effect: float
    treatment: str
    control: str
    metric: str
    note: str


CLAIMS = (
    Claim("padding", "(a) position encoding zeroed at padding positions",
          "+1.8 BLEU; attention on padding 0.042 -> 0.003", 1.8, "base", "pad-not-zeroed", "test",
          "the encoder masks padding keys and the decoder masks padded source positions, so a padding "
          "position's encoding cannot reach a real token"),
    Claim("norm-axis", "(b) LayerNormalization over positions (axis -2) instead of features (axis -1)",
          "12.1 vs 27.9 BLEU", 12.1 - 27.9, "norm-over-positions", "base", "test",
          "in the decoder a statistic over positions also reads the future tokens of teacher forcing"),
    Claim("pe-dropout", "(c) dropout on the position encoding, 10 % of test sources word-shuffled",
          "BLEU drop 2.3 with dropout vs 8.7 without", -2.3 + 8.7, "pe-dropout", "base", "shuffled_drop",
          "shuffling 10 % of the sentences can cost at most about 10 % of the BLEU"),
    Claim("compressed", "(d) the compressed table (1/8 of the dimensions stored) instead of the full one",
          "-0.15 BLEU", -0.15, "compressed", "base", "test",
          "ours interpolates between stored frequencies correctly (the seed's indexing is wrong, "
          "DESIGN.md fault 1); 1/8 of d_model as the seed's 64 of 512"),
    Claim("language-scale", "(e) a learned position scale per language",
          "+0.9 BLEU on German", 0.9, "base", "no-language-scale", "test",
          "trained from the start, not fine-tuned; one direction (en->de), so no English-side score"),
    Claim("learned-long", "(f) a learned table instead of sin/cos, on sentences past the trained length",
          "-4.2 BLEU", -4.2, "learned", "base", "long",
          "the seed's long sentences are > 512 tokens; ours are past a training cap of a few dozen pieces"),
)


@dataclasses.dataclass(frozen=True)
class TranslationAblationConfig:
    """Model, data and budget shared by every arm.

    Attributes:
        arms: names from `ARMS`.
        seeds: one run per seed and arm.
        steps: optimizer steps per run.
        batch_size: pairs per step.
        warmup_steps: the training CLI's `WarmupSchedule` warmup.
        num_layers, d_model, num_heads, dff, dropout: the model (layers per stack).
        vocab_size: the joint SentencePiece vocabulary, trained once on the training split.
        max_length: rows of the position tables (longest source and target at test time).
        train_length_cap: training pairs have at most this many pieces on either side.
        shuffle_fraction: share of test sources word-shuffled for claim (c).
        max_test_sentences: score only the first N test pairs (None: all).
        decode_batch: sentences per decoding batch.
    """

    arms: tuple = tuple(ARMS)
    seeds: tuple = (0, 1, 2)
    steps: int = 2000
    batch_size: int = 64
    warmup_steps: int = 500
    num_layers: int = 2
    d_model: int = 128
    num_heads: int = 4
    dff: int = 512
    dropout: float = 0.1
    vocab_size: int = 4000
    max_length: int = 64
    train_length_cap: int = 20
    shuffle_fraction: float = 0.1
    max_test_sentences: int = None
    decode_batch: int = 64

    def __post_init__(self):
        if not self.arms or any(arm not in ARMS for arm in self.arms):
            raise ValueError(f"`arms` must be a non-empty subset of {tuple(ARMS)}, got arms={self.arms!r}.")
        if not self.seeds:
            raise ValueError(f"`seeds` must not be empty, got seeds={self.seeds!r}.")
        check_positive_ints([("steps", self.steps), ("batch_size", self.batch_size),
                             ("warmup_steps", self.warmup_steps), ("d_model", self.d_model),
                             ("max_length", self.max_length), ("train_length_cap", self.train_length_cap),
                             ("decode_batch", self.decode_batch)])
        if self.train_length_cap >= self.max_length:
            raise ValueError(f"`train_length_cap` must be below `max_length`={self.max_length}, "
                             f"got train_length_cap={self.train_length_cap}.")
        if not 0.0 <= self.shuffle_fraction <= 1.0:
            raise ValueError(f"`shuffle_fraction` must be in [0, 1], got {self.shuffle_fraction!r}.")


QUICK = TranslationAblationConfig(seeds=(0, 1), steps=40, batch_size=16, warmup_steps=20, num_layers=1,
                                  d_model=16, num_heads=2, dff=32, vocab_size=200, max_length=32,
                                  train_length_cap=12, max_test_sentences=60, decode_batch=32)


# Data -------------------------------------------------------------------------------------------------
SPLITS = ("train", "test")


def check_corpus_dir(corpus_dir):
    """Raises `CorpusError` (a ValueError) naming `corpus_dir` unless it holds `train.tsv` and `test.tsv`.

    `keras-posenc ablate --task translate` calls it before it touches `--out`.
    """
    for split in SPLITS:
        if not os.path.isfile(os.path.join(corpus_dir, f"{split}.tsv")):
            raise data_lib.CorpusError(f"--corpus-dir {corpus_dir} has no {split}.tsv: run `make corpus` "
                                       "(Debian's German catalogues) or give a folder with train.tsv and "
                                       "test.tsv.")


def _read_split(corpus_dir, split):
    path = os.path.join(corpus_dir, f"{split}.tsv")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return data_lib.load_corpus(path, "tsv"), digest


def shuffle_words(sentences, fraction, seed):
    """`sentences` with `fraction` of them word-shuffled, their first and last words kept (seed 002, 3.4).

    Only sentences of four or more words can change; the chosen ones are
    drawn among those, and each is reshuffled until its order differs.

    Args:
        sentences: list of str.
        fraction: float in [0, 1], share of all sentences to shuffle.
        seed: int.

    Returns:
        list of str, as many.
    """
    rng = random.Random(seed)
    candidates = [i for i, sentence in enumerate(sentences) if len(sentence.split()) >= 4]
    chosen = rng.sample(candidates, min(len(candidates), round(fraction * len(sentences))))
    shuffled = list(sentences)
    for i in chosen:
        words = sentences[i].split()
        middle = words[1:-1]
        while middle == words[1:-1] and len(set(middle)) > 1:
            rng.shuffle(middle)
        shuffled[i] = " ".join([words[0], *middle, words[-1]])
    return shuffled


# Models -----------------------------------------------------------------------------------------------
class _PositionAxisNormalization(keras.layers.Layer):
    """Seed 002's `LayerNormalization(axis=-2)`: statistics over positions, a scale and offset per feature."""

    def __init__(self, epsilon, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(input_shape[-1],), initializer="zeros")
        super().build(input_shape)

    @static_call
    def call(self, x):
        x32 = ops.cast(x, "float32")
        count = ops.cast(ops.shape(x)[-2], "float32")
        centered = x32 - ops.sum(x32, axis=-2, keepdims=True) / count
        variance = ops.sum(centered * centered, axis=-2, keepdims=True) / count
        normalized = centered * ops.rsqrt(variance + self.epsilon)
        return ops.cast(normalized * self.gamma + self.beta, x.dtype)


_NORMS = ("attention_norm", "self_attention_norm", "cross_attention_norm", "ffn_norm")


def build_model(config, vocab_size, arm):
    """The unbuilt `Seq2SeqTransformer` of `arm` (sinusoidal, post-LN, as seed 002)."""
    kwargs = {"position": "sinusoidal", "position_config": {}, **ARMS[arm][1](config)}
    model = Seq2SeqTransformer(config.num_layers, config.d_model, config.num_heads, config.dff, vocab_size,
                               config.max_length, dropout=config.dropout, **kwargs)
    if arm == "norm-over-positions":
        for layer in [*model.encoder.encoder_layers, *model.decoder_layers]:
            for name in _NORMS:
                norm = getattr(layer, name, None)
                if norm is not None:
                    setattr(layer, name, _PositionAxisNormalization(norm.epsilon, name=norm.name))
    return model


def _train(model, config, sp_model, pairs, seed):
    dataset = translation_dataset(pairs, sp_model, max_length=config.train_length_cap + 1,
                                  batch_size=config.batch_size, seed=seed, repeat=True, drop_remainder=True)
    model.compile(optimizer=transformer_adam(config.d_model, config.warmup_steps))
    log = StepLog()
    model.fit(dataset, epochs=1, steps_per_epoch=config.steps, callbacks=[log], verbose=0)
    return log


# Decoding and scores ------------------------------------------------------------------------------------
def greedy_translate(model, processor, sentences, batch_size=64, max_new_tokens=None):
    """Greedy translations, the decoder re-run over the whole prefix at every step.

    The same search as `Seq2SeqTransformer.translate(beam_size=1)` (the
    padding and start ids are never chosen), without its key/value cache.

    Args:
        model: a `Seq2SeqTransformer`.
        processor: its `sentencepiece.SentencePieceProcessor`.
        sentences: list of str.
        batch_size: int.
        max_new_tokens: int, tokens at most per translation, `</s>` included
            (default: twice the batch's longest source plus 10, at most
            `model.max_length - 1`).

    Returns:
        list of str, in the input's order.
    """
    def encode_source(ids):
        return model.encode(ids, training=False)

    def last_logits(tokens, outputs, mask):
        return model.decode(tokens, outputs, mask, training=False)[:, -1]

    encode, last = inference_function(model, encode_source), inference_function(model, last_logits)
    rows = source_ids(processor, sentences, model.max_length)
    order = np.argsort([len(row) for row in rows], kind="stable")
    out = [None] * len(rows)
    for start in range(0, len(rows), batch_size):
        chosen = order[start:start + batch_size]
        batch = pad_rows([rows[i] for i in chosen])
        width = batch.shape[1]
        outputs, mask = encode(batch)
        tokens = np.full((len(chosen), 1), BOS_ID, np.int32)
        done = np.zeros(len(chosen), bool)
        for _ in range(max_new_tokens or min(model.max_length - 1, 2 * width + 10)):
            logits = np.array(last(tokens, outputs, mask), np.float64)
            logits[:, [PAD_ID, BOS_ID]] = -np.inf  # never an output, as in `Seq2SeqTransformer.translate`
            step = np.where(done, PAD_ID, np.argmax(logits, axis=-1)).astype(np.int32)
            tokens = np.concatenate([tokens, step[:, None]], axis=1)
            done |= step == EOS_ID
            if done.all():
                break
        for j, i in enumerate(chosen):
            ids = tokens[j, 1:].tolist()
            out[i] = processor.decode(ids[:ids.index(EOS_ID)] if EOS_ID in ids else
                                      [t for t in ids if t != PAD_ID])
    return out


def attention_on_padding(model, batch):
    """Mean attention weight the encoder's real queries put on padding keys, per layer.

    Each layer's own attention (the model's padding mask included) on
    `batch`, int `[n, length]` right-padded with `PAD_ID`; averaged over
    heads and real queries; the sum of each query's weights over padding keys.

    Returns:
        list of float, one per encoder layer.
    """
    ids = ops.convert_to_tensor(batch, "int32")
    mask = ops.not_equal(ids, PAD_ID)
    languages = ops.full(ops.shape(ids), SOURCE_LANGUAGE, "int32") if model.language_scale else None
    x = model.encoder.embedding(ids, language_ids=languages, training=False)
    merged = merge_attention_masks(int(batch.shape[1]), mask=mask)
    real = np.asarray(batch) != PAD_ID
    per_layer = []
    for layer in model.encoder.encoder_layers:
        x, scores = layer(x, attention_mask=merged, training=False, return_attention_scores=True)
        weights = np.asarray(scores, np.float64).mean(axis=1)  # [n, query, key]
        on_padding = (weights * (~real)[:, None, :]).sum(axis=-1)
        per_layer.append(float(on_padding[real].mean()))
    return per_layer


def _bleu(hypotheses, references, keep=None):
    if keep is not None:
        hypotheses = [h for h, k in zip(hypotheses, keep) if k]
        references = [r for r, k in zip(references, keep) if k]
    if not references:
        return None
    scores = corpus_scores(hypotheses, references)
    return {"bleu": scores["bleu"], "chrf": scores["chrf"], "sentences": scores["sentences"]}


LENGTH_BUCKETS = ((1, 5), (6, 10), (11, 15), (16, 20), (21, 30), (31, None))


def _bucket_name(low, high):
    return f"{low}+" if high is None else f"{low}-{high}"


def _evaluate(model, processor, config, arm, test, lengths, out_dir, seed):
    sources, references = [s for s, _ in test], [t for _, t in test]
    hypotheses = greedy_translate(model, processor, sources, config.decode_batch)
    write_text(os.path.join(out_dir, f"{arm}.seed{seed}.txt"), "".join(h + "\n" for h in hypotheses))
    result = {"test": _bleu(hypotheses, references),
              "long": _bleu(hypotheses, references, lengths > config.train_length_cap),
              "by_length": {}}
    for low, high in LENGTH_BUCKETS:
        keep = (lengths >= low) & (lengths <= (high if high is not None else lengths.max()))
        scores = _bleu(hypotheses, references, keep)
        result["by_length"][_bucket_name(low, high)] = scores and scores["bleu"]
    if model.language_scale:  # the scale each side's embedding learned for its own language
        result["language_scale"] = {
            "source": float(np.asarray(model.encoder.embedding.position_embedding.language_scale)[0]),
            "target": float(np.asarray(model.target_embedding.position_embedding.language_scale)[1])}
    if any(claim.metric == "shuffled_drop" and arm in (claim.treatment, claim.control) for claim in CLAIMS):
        shuffled = greedy_translate(model, processor, shuffle_words(sources, config.shuffle_fraction, seed=0),
                                    config.decode_batch)
        result["shuffled"] = _bleu(shuffled, references)
    if any(claim.key == "padding" and arm in (claim.treatment, claim.control) for claim in CLAIMS):
        longest = np.argsort(-lengths, kind="stable")[:config.decode_batch][::-1]
        rows = source_ids(processor, [sources[i] for i in longest], config.max_length)
        result["attention_on_padding"] = attention_on_padding(model, pad_rows(rows))
        result["hypotheses_sha256"] = hashlib.sha256("\n".join(hypotheses).encode()).hexdigest()
    return result


# The claims ---------------------------------------------------------------------------------------------
def _metric(run, metric):
    if metric == "shuffled_drop":
        return run["shuffled"]["bleu"] - run["test"]["bleu"]
    return run[metric]["bleu"]


def _mean_std(values):
    values = np.asarray(values, np.float64)
    return [float(values.mean()), float(values.std(ddof=1)) if values.size > 1 else 0.0]


def verdict(claim, differences):
    """The verdict on `claim` from its paired differences (one per seed, treatment - control, BLEU).

    An effect is a mean of at least `EFFECT_BLEU` with every seed of its
    sign. A claim of a real difference (|article| >= `EFFECT_BLEU`) agrees
    when ours is an effect of the same sign; a claim of no real difference
    (the compressed table) agrees when ours is none.

    >>> claim = CLAIMS[3]  # the article: -0.15
    >>> verdict(claim, [0.1, -0.2, 0.05])
    'agrees: no effect beyond seed noise'
    >>> verdict(CLAIMS[0], [0.0, 0.0, 0.0])
    'does not agree: no difference in any seed'
    """
    differences = np.asarray(differences, np.float64)
    mean = float(differences.mean())
    if np.all(differences == 0):
        observed = 0
    elif abs(mean) >= EFFECT_BLEU and (np.all(differences > 0) or np.all(differences < 0)):
        observed = 1 if mean > 0 else -1
    else:
        observed = None
    if abs(claim.article_effect) < EFFECT_BLEU:
        if observed in (0, None):
            return "agrees: no effect beyond seed noise"
        return f"does not agree: an effect of {mean:+.2f} BLEU"
    if observed == 0:
        return "does not agree: no difference in any seed"
    if observed is None:
        return "does not agree: no effect beyond seed noise"
    if observed != np.sign(claim.article_effect):
        return "does not agree: the opposite sign"
    size = "smaller" if abs(mean) < abs(claim.article_effect) / 2 else (
        "larger" if abs(mean) > 2 * abs(claim.article_effect) else "a similar size")
    return f"agrees in sign ({size})"


def _claim_rows(arms, config):
    rows = []
    for claim in CLAIMS:
        if claim.treatment not in arms or claim.control not in arms:
            continue
        treatment = {r["seed"]: r for r in arms[claim.treatment]["runs"]}
        control = {r["seed"]: r for r in arms[claim.control]["runs"]}
        seeds = [s for s in config.seeds if s in treatment and s in control]
        differences = [_metric(treatment[s], claim.metric) - _metric(control[s], claim.metric) for s in seeds]
        row = {**dataclasses.asdict(claim), "differences": differences, "ours": _mean_std(differences),
               "treatment_value": _mean_std([_metric(treatment[s], claim.metric) for s in seeds]),
               "control_value": _mean_std([_metric(control[s], claim.metric) for s in seeds]),
               "verdict": verdict(claim, differences)}
        if claim.key == "padding":
            row["attention_on_padding"] = {
                arm: _mean_std([float(np.mean(r["attention_on_padding"])) for r in arms[arm]["runs"]])
                for arm in (claim.treatment, claim.control)}
            row["identical_translations"] = sum(
                treatment[s]["hypotheses_sha256"] == control[s]["hypotheses_sha256"] for s in seeds)
        if claim.key == "language-scale":
            runs = arms[claim.treatment]["runs"]
            row["learned_scales"] = {side: _mean_std([r["language_scale"][side] for r in runs])
                                     for side in ("source", "target")}
        rows.append(row)
    return rows


def run_translation_ablation(corpus_dir, config=TranslationAblationConfig(), *, out_dir, log=print):
    """Trains every arm with every seed, scores them, and returns the JSON-ready results.

    Args:
        corpus_dir: folder with `train.tsv` and `test.tsv` (`make corpus`).
        config: a `TranslationAblationConfig` (`QUICK` for a tiny run).
        out_dir: folder for each run's test translations (`<arm>.seed<N>.txt`).
        log: callable taking one str, called after every run.

    Returns:
        dict with `config`, `corpus` (file digests, pair counts), `arms`
        (per arm: `description`, `kwargs`, `runs`, `summary`), `claims` (per
        claim: the article's number, the paired `differences`, `ours` as mean
        and std, `verdict`) and `elapsed_seconds`.

    Raises:
        CorpusError: no corpus, or no training pair within the cap.
    """
    import sentencepiece as spm

    started = time.perf_counter()
    check_corpus_dir(corpus_dir)
    train_pairs, train_digest = _read_split(corpus_dir, "train")
    test, test_digest = _read_split(corpus_dir, "test")
    test = test[:config.max_test_sentences] if config.max_test_sentences else test
    make_deterministic()
    sp_model = data_lib.train_sentencepiece(data_lib.corpus_texts(train_pairs), config.vocab_size)
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    vocab_size = data_lib.sentencepiece_vocab_size(sp_model)
    cap = config.train_length_cap
    kept = [pair for pair, source, target in zip(train_pairs, processor.encode([s for s, _ in train_pairs]),
                                                  processor.encode([t for _, t in train_pairs]))
            if len(source) <= cap and len(target) <= cap]
    if not kept:
        raise data_lib.CorpusError(f"No training pair has at most train_length_cap={cap} pieces per side.")
    lengths = np.array([len(ids) for ids in processor.encode([s for s, _ in test])])
    os.makedirs(out_dir, exist_ok=True)
    results = {"config": dataclasses.asdict(config), "vocab_size": vocab_size,
               "corpus": {"train_sha256": train_digest, "test_sha256": test_digest,
                          "train_pairs": len(train_pairs),
                          "train_pairs_within_cap": len(kept), "test_pairs": len(test),
                          "test_pairs_past_cap": int((lengths > cap).sum())},
               "arms": {}}
    for arm in config.arms:
        runs = []
        for seed in config.seeds:
            keras.utils.set_random_seed(seed)
            model = build_model(config, vocab_size, arm)
            step_log = _train(model, config, sp_model, kept, seed)
            run = _evaluate(model, processor, config, arm, test, lengths, out_dir, seed)
            run.update(seed=seed, train_seconds=round(step_log.seconds, 1),
                       final_loss=float(np.mean(step_log.losses[-50:])))
            runs.append(run)
            log(f"{arm} seed {seed}: test BLEU {run['test']['bleu']:.2f}, chrF {run['test']['chrf']:.2f}, "
                f"past the cap {run['long']['bleu']:.2f} ({run['train_seconds']} s training)")
        results["arms"][arm] = {
            "description": ARMS[arm][0], "kwargs": ARMS[arm][1](config), "runs": runs,
            "summary": {"test": _mean_std([r["test"]["bleu"] for r in runs]),
                        "long": _mean_std([r["long"]["bleu"] for r in runs]),
                        "chrf": _mean_std([r["test"]["chrf"] for r in runs])}}
    results["claims"] = _claim_rows(results["arms"], config)
    results["elapsed_seconds"] = round(time.perf_counter() - started, 1)
    return results


# Report -------------------------------------------------------------------------------------------------
def _pm(pair, digits=2):
    return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def markdown_table(results):
    """The claims table and the arms table (markdown), from `run_translation_ablation`'s results."""
    seeds = len(results["config"]["seeds"])
    lines = [f"| claim | article | ours ({seeds} seeds, mean ± std of the paired difference) | per seed "
             "| verdict |",
             "|---|---|---|---|---|"]
    for row in results["claims"]:
        per_seed = ", ".join(f"{d:+.2f}" for d in row["differences"])
        extra = ""
        if row["key"] == "language-scale":
            scales = row["learned_scales"]
            extra = f"; learned scales: source {_pm(scales['source'])}, target {_pm(scales['target'])}"
        if row["key"] == "padding":
            attention = row["attention_on_padding"]
            extra = (f"; attention on padding {attention[row['control']][0]:.3g} -> "
                     f"{attention[row['treatment']][0]:.3g}; identical translations in "
                     f"{row['identical_translations']} of {len(row['differences'])} seeds")
        lines.append(f"| {row['text']} | {row['article']} | "
                     f"{row['ours'][0]:+.2f} ± {row['ours'][1]:.2f} BLEU "
                     f"({row['treatment']} {_pm(row['treatment_value'])} vs {row['control']} "
                     f"{_pm(row['control_value'])}){extra} | {per_seed} | {row['verdict']} |")
    lines += ["", "| arm | test BLEU | test chrF | BLEU past the training cap |", "|---|---|---|---|"]
    for arm, entry in results["arms"].items():
        summary = entry["summary"]
        lines.append(f"| {arm} | {_pm(summary['test'])} | {_pm(summary['chrf'])} | {_pm(summary['long'])} |")
    return "\n".join(lines)


def _plot_by_length(results, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    names = [_bucket_name(low, high) for low, high in LENGTH_BUCKETS]
    for arm, entry in results["arms"].items():
        means = [np.mean([r["by_length"][n] for r in entry["runs"]]) if all(
            r["by_length"][n] is not None for r in entry["runs"]) else np.nan for n in names]
        ax.plot(np.arange(len(names)), means, marker="o", label=arm,
                linewidth=2.5 if arm in ("base", "learned") else 1.2)
    cap = results["config"]["train_length_cap"]
    past = [i for i, (low, _) in enumerate(LENGTH_BUCKETS) if low > cap]
    ax.axvline((past[0] if past else len(names)) - 0.5, color="gray", linestyle="--",
               label=f"training cap ({cap} pieces)")
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels(names)
    ax.set_xlabel("source length (SentencePiece pieces)")
    ax.set_ylabel("test BLEU (mean over seeds)")
    ax.set_title("BLEU by source length")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _plot_claims(results, path):
    plt = pyplot()
    rows = results["claims"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["article_effect"] for r in rows], width=0.4, label="seed 002 (reported)")
    ax.bar(x + 0.2, [r["ours"][0] for r in rows], width=0.4, yerr=[r["ours"][1] for r in rows], capsize=3,
           label="ours (mean ± std over seeds)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([r["key"] for r in rows], rotation=20)
    ax.set_ylabel("BLEU, treatment - control")
    ax.set_title("Seed 002's claims")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def write_report(results, out_dir, command):
    """Writes `translation_ablation.md` and `.json`, `bleu_by_length.png`, `claims.png`; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in
             ("translation_ablation.md", "translation_ablation.json", "bleu_by_length.png", "claims.png")}
    write_text(paths["translation_ablation.json"],
               json.dumps({"command": command, **results}, indent=1) + "\n")
    write_text(paths["translation_ablation.md"],
               f"# Seed 002's claims in BLEU\n\nCommand: `{command}`\n\n{markdown_table(results)}\n\n"
               f"Total time: {results['elapsed_seconds']} s.\n")
    _plot_by_length(results, paths["bleu_by_length.png"])
    _plot_claims(results, paths["claims.png"])
    return paths
