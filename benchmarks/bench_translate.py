"""Translation quality and training speed: our encoder-decoder and LM against keras-hub's seq2seq.

On the en->de corpus of `make corpus` (Debian gettext UI messages, split by
package: `train.tsv`, `dev.tsv`, `test.tsv`), at one model size and one
training budget (d_model 128, 4 heads, dff 512, dropout 0.1, a 4000-piece
joint SentencePiece vocabulary, 4000 steps of 64 pairs, max_length 64 per
side), over several seeds:

1. `ours`: this package's `Seq2SeqTransformer` (2 encoder + 2 decoder
   layers), trained by `train(TrainConfig(task="translate", ...))` with its
   defaults (RoPE in the self-attention of both stacks, label smoothing 0.1,
   separate source and target embeddings, dev BLEU on the first 300 dev pairs
   every 1000 steps, best weights kept), translated with beam 4 (`--alpha`,
   default `translate`'s length penalty) and greedily;
2. `lm`: this package's decoder-only LM (`task="lm"`, `corpus_format="tsv"`:
   `<s> source <sep> target </s>`) with the layer count whose parameter count
   is closest to `ours` (`--lm-layers auto`), max_length 2 x 64 (it reads both
   sides in one sequence), final weights, translated by `translate_sentences`
   (beam 4 and greedy);
3. `keras-hub`: keras-io's "English-to-Spanish translation with KerasHub"
   model: `keras_hub.layers.TokenAndPositionEmbedding` (learned positions) +
   `TransformerEncoder` layers for the source, `TokenAndPositionEmbedding` +
   `TransformerDecoder` layers (causal self-attention, cross-attention to the
   encoder outputs, padding masks of both sides) + `Dense(vocab)` for the
   target: separate embeddings, no tying, no label smoothing, as keras-io.
   It reads the same SentencePiece ids and the same `translation_dataset`
   batches (the seed's tokenizer file of run 1, its training split, its batch
   order), trains with the same loss normalisation (`TokenLossTraining`:
   cross-entropy summed over the non-pad labels / their count), the same
   optimizer (`transformer_adam(128, warmup)`, the warmup `train` used), the
   same steps, step function (`train_steps.TrainSteps`) and dev-BLEU checkpoint
   selection as `ours`; decoded greedily as keras-io does (the decoder re-run
   over the whole prefix at every step, in a `tf.function`), stopping at
   `</s>`. Departures from keras-io, for equal training: 2 + 2 layers instead
   of 1 + 1, dropout 0.1 inside the layers (keras-io: 0) and no Dropout(0.5)
   before the head, logits with `from_logits=True` instead of a softmax layer.

Scores: sacrebleu BLEU and chrF (`corpus_scores`) of the test pairs, mean and
standard deviation over the seeds. Throughput: after the runs, a timing phase
in this process builds fresh `ours` and `keras-hub` models, warms both up, then
alternates them over the same cached batches (`--timing-rounds` rounds of
`--timing-steps` steps each, the order flipped every round) and reports real
target tokens per second (wall clock and per CPU-second of the process) and
the per-round ratio ours / keras-hub.

Trained runs (model, tokenizer, report, hypotheses) go under `--out` (git-ignored
`.cache/bench_translate/` by default); `--reuse` skips a training run whose
`report.json` was written with the same settings (for the keras-hub peer: the
same data, tokenizer, batches, steps, optimizer and dev selection; ours' model
choices do not retrain it). `--timing-only` runs the timing phase alone. Every number goes to the JSON
(`--json`, default `benchmarks/results/translate/<date>.json`).

Run from the repository root, in the Keras 3 environment (keras-hub):

    KERAS_BACKEND=tensorflow .venv-keras3/bin/python benchmarks/bench_translate.py [--seeds 0 1]
        [--steps 4000] [--out .cache/bench_translate] [--corpus-dir .cache/corpus/debian_po_en_de]
    KERAS_BACKEND=tensorflow .venv-keras3/bin/python benchmarks/bench_translate.py --quick   # minutes
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_posenc.app import dataset as data_lib  # noqa: E402
from keras_posenc.app.checkpoints import list_checkpoints  # noqa: E402
from keras_posenc.app.train import TrainConfig, train  # noqa: E402
from keras_posenc.app.train_steps import TrainSteps  # noqa: E402
from keras_posenc.app.translation import (  # noqa: E402
    DEFAULT_LENGTH_PENALTY,
    corpus_scores,
    load_translator,
    translate_sentences,
)
from keras_posenc.app.translation_data import source_ids  # noqa: E402
from keras_posenc.backend import keras, keras_version, make_deterministic  # noqa: E402
from keras_posenc.models import TokenLossTraining, transformer_adam  # noqa: E402
from keras_posenc.special_ids import BOS_ID, EOS_ID, NUM_RESERVED_IDS, PAD_ID  # noqa: E402

SIZE = {"d_model": 128, "num_heads": 4, "dff": 512, "dropout": 0.1, "vocab_size": 4000, "batch_size": 64}
NUM_LAYERS, MAX_LENGTH = 2, 64
BEAM, DECODE_BATCH = 4, 32


# Configs and runs -------------------------------------------------------------------------------------
def _rel(path):
    """`path` relative to the repository (what the committed JSON holds)."""
    return os.path.relpath(os.path.abspath(path), REPO)


def _config(task, seed, args, lm_layers=None):
    corpus = os.path.join(args.corpus_dir, "train.tsv")
    common = dict(SIZE, corpus=corpus, corpus_format="tsv", steps=args.steps, seed=seed,
                  checkpoint_every=args.checkpoint_every, verbose=0)
    if task == "translate":
        return TrainConfig(task="translate", dev_corpus=os.path.join(args.corpus_dir, "dev.tsv"),
                           dev_sentences=args.dev_sentences, num_layers=NUM_LAYERS, max_length=MAX_LENGTH,
                           out=os.path.join(args.out, f"seed{seed}", "seq2seq"), **common)
    # One sequence holds both sides: 2 x 64 positions hold what the seq2seq reads.
    return TrainConfig(task="lm", num_layers=lm_layers, max_length=2 * MAX_LENGTH,
                       out=os.path.join(args.out, f"seed{seed}", f"lm{lm_layers}"), **common)


def _settings(train_config):
    return {k: v for k, v in json.loads(json.dumps(train_config)).items() if k != "resume"}


def _train_or_reuse(cfg, reuse):
    """`train(cfg)`'s report; with `reuse`, the stored one when `out` holds a run of the same settings.

    With `reuse`, a run that was stopped (SIGTERM: `train` saves a checkpoint first) is resumed
    from its newest checkpoint; its report's `start_step` then says where it resumed.
    """
    path = os.path.join(cfg.out, "report.json")
    wanted = _settings(dataclasses.asdict(cfg))
    if reuse and os.path.isfile(path) and os.path.isfile(os.path.join(cfg.out, "model.keras")):
        with open(path) as f:
            report = json.load(f)
        if _settings(report.get("train_config", {})) == wanted:
            print(f"  reusing {_rel(cfg.out)}", flush=True)
            return report
    if reuse and list_checkpoints(os.path.join(cfg.out, "checkpoints")):
        cfg = dataclasses.replace(cfg, resume=True)  # `train` checks the checkpoint's model config
        print(f"  resuming {_rel(cfg.out)}", flush=True)
    start = time.perf_counter()
    report = train(cfg)
    print(f"  trained {_rel(cfg.out)} in {time.perf_counter() - start:.0f} s", flush=True)
    return report


def _parameter_count(cfg):
    model = cfg.build_model(SIZE["vocab_size"], name="count")
    model.build_on_dummy()
    return int(model.count_params())


def _lm_layers(setting, target):
    """The LM layer count: `setting`, or with "auto" the one whose parameter count is closest to `target`."""
    counts = {}
    for layers in range(1, 9):
        cfg = TrainConfig(task="lm", corpus_format="tsv", num_layers=layers, max_length=2 * MAX_LENGTH,
                          **{k: SIZE[k] for k in ("d_model", "num_heads", "dff", "dropout")})
        counts[layers] = _parameter_count(cfg)
    chosen = min(counts, key=lambda n: abs(counts[n] - target)) if setting == "auto" else int(setting)
    return chosen, counts


# The keras-hub peer -----------------------------------------------------------------------------------
class HubSeq2Seq(TokenLossTraining, keras.Model):
    """keras-io's KerasHub translator: keras-hub embeddings, encoder and decoder layers, a Dense head.

    Trained by `TokenLossTraining` on `token_loss_sums` (plain cross-entropy
    of the non-pad labels, no label smoothing), like the package's models.
    """

    def __init__(self, vocab_size, max_length, d_model, num_layers, num_heads, dff, dropout, **kwargs):
        import keras_hub

        super().__init__(**kwargs)
        self.d_model = d_model
        self.source_embedding = keras_hub.layers.TokenAndPositionEmbedding(
            vocabulary_size=vocab_size, sequence_length=max_length, embedding_dim=d_model,
            name="source_embedding")
        self.encoder_layers = [keras_hub.layers.TransformerEncoder(intermediate_dim=dff, num_heads=num_heads,
                                                                   dropout=dropout, name=f"encoder_{i}")
                               for i in range(num_layers)]
        self.target_embedding = keras_hub.layers.TokenAndPositionEmbedding(
            vocabulary_size=vocab_size, sequence_length=max_length, embedding_dim=d_model,
            name="target_embedding")
        self.decoder_layers = [keras_hub.layers.TransformerDecoder(intermediate_dim=dff, num_heads=num_heads,
                                                                   dropout=dropout, name=f"decoder_{i}")
                               for i in range(num_layers)]
        self.head = keras.layers.Dense(vocab_size, name="head")
        self.eval_loss = keras.metrics.Mean(name="loss")
        self.distribute_reduction_method = "sum"

    def encode(self, source_ids, training=False):
        mask = tf.not_equal(source_ids, PAD_ID)
        x = self.source_embedding(source_ids)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=mask, training=training)
        return x, mask

    def decode(self, target_ids, encoder_outputs, source_mask, training=False):
        x = self.target_embedding(target_ids)
        target_mask = tf.not_equal(target_ids, PAD_ID)
        for layer in self.decoder_layers:
            x = layer(x, encoder_outputs, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask,
                      training=training)
        return tf.cast(self.head(x), tf.float32)

    def call(self, inputs, training=None):
        outputs, mask = self.encode(inputs["source_ids"], training=training)
        return self.decode(inputs["target_ids"], outputs, mask, training=training)

    def token_loss_sums(self, data, training=False):
        features, labels = data
        logits = self(features, training=training)
        losses = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        real = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
        return tf.reduce_sum(losses * real), tf.reduce_sum(real)

    def build_on_dummy(self):
        ids = np.full([1, 2], NUM_RESERVED_IDS, np.int32)
        self({"source_ids": ids, "target_ids": ids}, training=False)


# What ours' run settings say about the peer's training: its data, tokenizer, batches, steps, optimizer
# and dev selection. Ours' own model choices (positions, label smoothing, ...) leave the peer as it is.
_HUB_TRAIN_FIELDS = ("corpus", "dev_corpus", "dev_sentences", "out", "corpus_format", "skip_bad_lines",
                     "vocab_size", "add_bos", "add_eos", "eval_fraction", "max_length", "num_layers",
                     "d_model", "num_heads", "dff", "dropout", "steps", "batch_size", "warmup_steps",
                     "lr_scale", "seed", "checkpoint_every", "strategy", "jit_compile")


def _hub_settings(settings):
    """The part of a peer run's `settings` that decides its training (for `--reuse`)."""
    train_config = settings.get("train_config", {})
    return {"train_config": {k: train_config.get(k) for k in _HUB_TRAIN_FIELDS},
            "warmup_steps": settings.get("warmup_steps")}


def _hub_model(seed, warmup_steps):
    make_deterministic(seed)
    model = HubSeq2Seq(SIZE["vocab_size"], MAX_LENGTH, SIZE["d_model"], NUM_LAYERS, SIZE["num_heads"],
                       SIZE["dff"], SIZE["dropout"], name="keras_hub_seq2seq")
    model.build_on_dummy()
    optimizer = transformer_adam(SIZE["d_model"], warmup_steps)
    optimizer.build(model.trainable_variables)
    model.compile(optimizer=optimizer)
    return model


class HubTranslator:
    """Greedy decoding of a `HubSeq2Seq` as keras-io's: the decoder re-run over the prefix at every step."""

    def __init__(self, model, processor):
        self.model, self.processor = model, processor
        width = model.d_model
        self.encode = tf.function(lambda source: model.encode(source, training=False),
                                  input_signature=[tf.TensorSpec([None, None], tf.int32)])
        forbidden = np.zeros([SIZE["vocab_size"]], np.float32)
        forbidden[[PAD_ID, BOS_ID]] = -np.inf  # as the package's beam search: never pad or <s>
        forbidden = tf.constant(forbidden)

        def step(prefix, outputs, mask):
            logits = model.decode(prefix, outputs, mask, training=False)[:, -1]
            return tf.argmax(logits + forbidden, axis=-1, output_type=tf.int32)

        self.step = tf.function(step, input_signature=[tf.TensorSpec([None, None], tf.int32),
                                                       tf.TensorSpec([None, None, width], tf.float32),
                                                       tf.TensorSpec([None, None], tf.bool)])

    def _batch(self, rows):
        width = max(len(row) for row in rows)
        source = np.full([len(rows), width], PAD_ID, np.int32)
        for i, row in enumerate(rows):
            source[i, :len(row)] = row
        outputs, mask = self.encode(tf.constant(source))
        prefix = np.full([len(rows), 1], BOS_ID, np.int32)
        done = np.zeros([len(rows)], bool)
        for _ in range(MAX_LENGTH - 1):  # the package's default max_new_tokens: max_length - 1
            token = self.step(tf.constant(prefix), outputs, mask).numpy()
            token[done] = PAD_ID
            prefix = np.concatenate([prefix, token[:, None]], axis=1)
            done |= token == EOS_ID
            if done.all():
                break
        texts = []
        for row in prefix[:, 1:]:
            ids = list(row)
            ids = ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids
            texts.append(self.processor.decode([int(t) for t in ids if t >= NUM_RESERVED_IDS]))
        return texts

    def translate(self, sentences, batch_size=DECODE_BATCH):
        rows = source_ids(self.processor, sentences, MAX_LENGTH)
        order = sorted(range(len(rows)), key=lambda i: (len(rows[i]), i))
        outputs = [None] * len(rows)
        start = time.perf_counter()
        for first in range(0, len(order), batch_size):
            chosen = order[first:first + batch_size]
            for i, text in zip(chosen, self._batch([rows[i] for i in chosen])):
                outputs[i] = text
        return outputs, time.perf_counter() - start


def _train_hub(cfg, ours_report, sp_model, train_examples, dev_pairs, reuse):
    """Trains the keras-hub peer as `train` trains ours: same batches, optimizer, steps, dev selection."""
    import sentencepiece as spm

    out = os.path.join(os.path.dirname(cfg.out), "keras_hub")
    os.makedirs(out, exist_ok=True)
    weights_path, report_path = os.path.join(out, "model.weights.h5"), os.path.join(out, "report.json")
    settings = {"train_config": ours_report["train_config"], "warmup_steps": ours_report["warmup_steps"]}
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    model = _hub_model(cfg.seed, ours_report["warmup_steps"])
    translator = HubTranslator(model, processor)
    if reuse and os.path.isfile(report_path) and os.path.isfile(weights_path):
        with open(report_path) as f:
            report = json.load(f)
        if _hub_settings(report.get("settings", {})) == _hub_settings(json.loads(json.dumps(settings))):
            model.load_weights(weights_path)
            print(f"  reusing {_rel(out)}", flush=True)
            return model, translator, report
    train_ds = cfg.dataset(train_examples, sp_model, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed,
                           repeat=True, drop_remainder=True)
    steps_fn = TrainSteps(model, tf.distribute.get_strategy(), train_ds.element_spec,
                          ours_report["jit_compile"])
    batches = iter(train_ds)
    sources, references = [s for s, _ in dev_pairs], [r for _, r in dev_pairs]
    losses, tokens, seconds, dev_seconds, history = [], 0, 0.0, 0.0, []
    best, best_weights = None, None
    wall = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        start = time.perf_counter()
        logs = steps_fn.train(next(batches))
        losses.append(float(logs["loss"].numpy()))
        tokens += int(logs["tokens"].numpy())
        seconds += time.perf_counter() - start
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            start = time.perf_counter()
            hypotheses, _ = translator.translate(sources, batch_size=64)
            scores = corpus_scores(hypotheses, references)
            entry = {"step": step, "bleu": scores["bleu"], "chrf": scores["chrf"]}
            history.append(entry)
            if best is None or (entry["bleu"], entry["chrf"]) > (best["bleu"], best["chrf"]):
                best, best_weights = entry, model.get_weights()
            dev_seconds += time.perf_counter() - start
    model.set_weights(best_weights)
    model.save_weights(weights_path)
    report = {"settings": settings, "steps": cfg.steps, "final_train_loss": losses[-1],
              "train_seconds": seconds, "tokens_per_second": tokens / seconds, "dev_history": history,
              "dev_bleu": best["bleu"], "dev_chrf": best["chrf"], "dev_best_step": best["step"],
              "dev_seconds": dev_seconds, "wall_seconds": time.perf_counter() - wall}
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"  trained {_rel(out)} in {report['wall_seconds']:.0f} s", flush=True)
    return model, translator, report


# Scoring ----------------------------------------------------------------------------------------------
def _bleu_details(hypotheses, references):
    """sacrebleu's n-gram precisions, brevity penalty and lengths of a corpus BLEU (as `corpus_scores`')."""
    import sacrebleu

    bleu = sacrebleu.BLEU().corpus_score(hypotheses, [references])
    return {"precisions": [round(p, 2) for p in bleu.precisions], "bp": round(bleu.bp, 4),
            "length_ratio": round(bleu.sys_len / bleu.ref_len, 4), "hyp_len": bleu.sys_len,
            "ref_len": bleu.ref_len, "empty": sum(1 for h in hypotheses if not h.strip())}


def _run_dirs(result):
    """`{model key: run folder name}` of a results JSON."""
    return {"ours": "seq2seq", "lm": f"lm{result['setup']['lm_layers']}", "keras-hub": "keras_hub"}


def _rescore(json_path, out, corpus_dir):
    """Adds `bleu_details` from the stored hypotheses to a results JSON (of a run before they were kept)."""
    with open(json_path) as f:
        result = json.load(f)
    test_pairs = data_lib.load_corpus(os.path.join(corpus_dir, "test.tsv"), "tsv")
    for seed, systems in result["per_seed"].items():
        for key, folder in _run_dirs(result).items():
            for search, scores in systems[key]["test"].items():
                path = os.path.join(out, f"seed{seed}", folder, f"test.{search}.txt")
                with open(path, encoding="utf-8") as f:
                    hypotheses = f.read().split("\n")[:-1]  # one line each (not splitlines: U+2028)
                references = [r for _, r in test_pairs[:len(hypotheses)]]
                again = corpus_scores(hypotheses, references)
                assert abs(again["bleu"] - scores["bleu"]) < 1e-9, "not the hypotheses of this JSON"
                scores["bleu_details"] = _bleu_details(hypotheses, references)
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    _print_lengths(result)


def _print_lengths(result):
    print("\n| system | hypothesis / reference length (mean over seeds) | brevity penalty | "
          "1-4-gram precisions (seed " + str(next(iter(result["per_seed"]))) + ") |")
    print("|---|---:|---:|---|")
    for row in result["table"]:
        details = [systems[row["model"]]["test"][row["search"]]["bleu_details"]
                   for systems in result["per_seed"].values()]
        ratio = statistics.mean(d["length_ratio"] for d in details)
        bp = statistics.mean(d["bp"] for d in details)
        print(f"| {row['system']} | {ratio:.3f} | {bp:.3f} | "
              f"{' / '.join(f'{p:.1f}' for p in details[0]['precisions'])} |")


def _score(name, hypotheses, references, seconds, out_dir):
    with open(os.path.join(out_dir, f"test.{name}.txt"), "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in hypotheses)
    scores = corpus_scores(hypotheses, references)
    scores["decode_seconds"] = seconds
    scores["bleu_details"] = _bleu_details(hypotheses, references)
    print(f"    {name}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} "
          f"({scores['sentences']} sentences, {seconds:.0f} s)", flush=True)
    return scores


def _score_package_run(run_dir, sources, references, alpha):
    run = load_translator(run_dir)
    results = {}
    for label, beam in (("beam4", BEAM), ("greedy", 1)):
        hypotheses, stats = translate_sentences(run, sources, beam_size=beam, alpha=alpha,
                                                batch_size=DECODE_BATCH)
        results[label] = _score(label, hypotheses, references, stats["seconds"], run_dir)
    return results


# Throughput -------------------------------------------------------------------------------------------
def _clocks():
    return time.perf_counter(), time.process_time()


def _timing(args, cfg, sp_model, train_examples, warmup_steps, jit_compile):
    """Tokens/s of the train steps of fresh `ours` and `keras-hub` models, alternating on the same batches."""
    print("timing phase (alternating train steps, same batches)", flush=True)
    ds = cfg.dataset(train_examples, sp_model, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed,
                     repeat=True, drop_remainder=True)
    batches = list(ds.take(args.timing_warmup + args.timing_steps))
    warm, timed = batches[:args.timing_warmup], batches[args.timing_warmup:]
    tokens = sum(int(np.count_nonzero(labels.numpy() != PAD_ID)) for _, labels in timed)
    make_deterministic(cfg.seed)
    ours = cfg.build_model(SIZE["vocab_size"])
    ours.build_on_dummy()
    optimizer = transformer_adam(SIZE["d_model"], warmup_steps)
    optimizer.build(ours.trainable_variables)
    ours.compile(optimizer=optimizer)
    strategy = tf.distribute.get_strategy()
    steps = {"ours": TrainSteps(ours, strategy, ds.element_spec, jit_compile),
             "keras-hub": TrainSteps(_hub_model(cfg.seed, warmup_steps), strategy, ds.element_spec,
                                     jit_compile)}
    for name in steps:
        for batch in warm:
            steps[name].train(batch)["loss"].numpy()
    rounds = []
    for index in range(args.timing_rounds):
        order = list(steps) if index % 2 == 0 else list(reversed(list(steps)))
        result = {}
        for name in order:
            start = _clocks()
            for batch in timed:
                steps[name].train(batch)["loss"].numpy()  # as `train` does: the logs reach the callbacks
            wall, cpu = (now - then for now, then in zip(_clocks(), start))
            result[name] = {"tokens_per_second": tokens / wall, "tokens_per_cpu_second": tokens / cpu}
        result["ratio"] = result["ours"]["tokens_per_second"] / result["keras-hub"]["tokens_per_second"]
        result["ratio_cpu"] = (result["ours"]["tokens_per_cpu_second"]
                               / result["keras-hub"]["tokens_per_cpu_second"])
        rounds.append(result)
        print(f"  round {index + 1}: ours {result['ours']['tokens_per_second']:.0f} tokens/s, keras-hub "
              f"{result['keras-hub']['tokens_per_second']:.0f} tokens/s, ratio {result['ratio']:.3f} "
              f"(CPU time {result['ratio_cpu']:.3f})", flush=True)
    summary = {"batches": len(timed), "tokens_per_round": tokens, "rounds": rounds}
    for name in steps:
        summary[name] = {key: statistics.median(r[name][key] for r in rounds)
                         for key in ("tokens_per_second", "tokens_per_cpu_second")}
    for key in ("ratio", "ratio_cpu"):
        values = [r[key] for r in rounds]
        summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return summary


# Report -----------------------------------------------------------------------------------------------
def _throughput_line(timing):
    ratio, ratio_cpu = timing["ratio"], timing["ratio_cpu"]
    return (f"throughput ours / keras-hub (alternating, {len(timing['rounds'])} rounds x "
            f"{timing['batches']} steps): {ratio['median']:.3f} (min {ratio['min']:.3f}, "
            f"max {ratio['max']:.3f}); "
            f"per CPU-second {ratio_cpu['median']:.3f} ({ratio_cpu['min']:.3f}-{ratio_cpu['max']:.3f})")


def _mean_std(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _pm(values):
    mean, std = _mean_std(values)
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"


def _git():
    def run(*command):
        result = subprocess.run(["git", *command], cwd=REPO, capture_output=True, text=True, check=False)
        return result.stdout.strip()

    return {"commit": run("rev-parse", "HEAD"),
            "uncommitted_package_files": run("status", "--porcelain", "keras_posenc").splitlines()}


def _versions():
    import keras_hub
    import sacrebleu
    import sentencepiece

    return {"python": platform.python_version(), "tensorflow": tf.__version__,
            "keras": keras_version(),
            "keras_hub": keras_hub.__version__, "sacrebleu": sacrebleu.__version__,
            "sentencepiece": sentencepiece.__version__, "cpus": os.cpu_count()}


def _timing_only(args):
    """The timing phase alone, on the first seed's run (its tokenizer, split and warmup); JSON to `--json`."""
    cfg = _config("translate", args.seeds[0], args)
    with open(os.path.join(cfg.out, "report.json")) as f:
        report = json.load(f)
    with open(os.path.join(cfg.out, "spm.model"), "rb") as f:
        sp_model = f.read()
    train_examples, _ = data_lib.split_corpus(data_lib.load_corpus(cfg.corpus, "tsv"), cfg.eval_fraction,
                                              seed=cfg.seed)
    timing = _timing(args, cfg, sp_model, train_examples, report["warmup_steps"], report["jit_compile"])
    print(_throughput_line(timing), flush=True)
    json_path = args.json or os.path.join(args.out, "timing.json")
    with open(json_path, "w") as f:
        json.dump({"git": _git(), "versions": _versions(), "seed": cfg.seed, "timing": timing}, f, indent=1)
    print(f"wrote {_rel(json_path)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--out", default=os.path.join(REPO, ".cache", "bench_translate"),
                        help="folder of the trained runs (git-ignored)")
    parser.add_argument("--corpus-dir", default=os.path.join(REPO, ".cache", "corpus", "debian_po_en_de"))
    parser.add_argument("--json", default=None, help="results file (default: benchmarks/results/translate/"
                        "<date>.json; with --quick: <out>/quick.json)")
    parser.add_argument("--lm-layers", default="auto", help="decoder-only LM layers (auto: closest "
                        "parameter count to ours)")
    parser.add_argument("--test-sentences", type=int, default=None,
                        help="the first N test pairs (default: all)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_LENGTH_PENALTY,
                        help="beam search's length penalty (GNMT's alpha; default: `translate`'s, "
                        f"{DEFAULT_LENGTH_PENALTY}; Vaswani et al. used 0.6)")
    parser.add_argument("--dev-sentences", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--timing-rounds", type=int, default=3)
    parser.add_argument("--timing-steps", type=int, default=100)
    parser.add_argument("--timing-warmup", type=int, default=30)
    parser.add_argument("--reuse", action="store_true", help="reuse trained runs of the same settings")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 steps, 1 seed, 100 test "
                        "sentences, 50 dev sentences, 1 timing round of 20 steps")
    parser.add_argument("--timing-only", action="store_true", help="only the alternating timing phase, "
                        "on the tokenizer and training split of the first seed's trained run under --out")
    parser.add_argument("--rescore", metavar="JSON", help="only add BLEU's length details from the stored "
                        "hypotheses under --out to this results JSON")
    args = parser.parse_args()
    if args.timing_only:
        _timing_only(args)
        return
    if args.rescore:
        _rescore(args.rescore, args.out, args.corpus_dir)
        return
    if args.quick:
        args.steps, args.seeds, args.test_sentences, args.dev_sentences = 200, args.seeds[:1], 100, 50
        args.checkpoint_every, args.timing_rounds, args.timing_steps, args.timing_warmup = 100, 1, 20, 10
        args.out = os.path.join(args.out, "quick")
    json_path = args.json or (os.path.join(args.out, "quick.json") if args.quick else os.path.join(
        REPO, "benchmarks", "results", "translate", f"{datetime.date.today().isoformat()}.json"))
    started, git_at_start = time.perf_counter(), _git()

    test_pairs = data_lib.load_corpus(os.path.join(args.corpus_dir, "test.tsv"), "tsv")
    test_pairs = test_pairs[:args.test_sentences] if args.test_sentences else test_pairs
    sources, references = [s for s, _ in test_pairs], [r for _, r in test_pairs]
    ours_params = _parameter_count(_config("translate", 0, args))
    lm_layers, lm_counts = _lm_layers(args.lm_layers, ours_params)
    print(f"parameters: ours {ours_params}, decoder-only LM {lm_counts[lm_layers]} ({lm_layers} layers)",
          flush=True)

    # The seq2seq and its peer first (the target's numbers), then the LMs, then the timing phase.
    per_seed, hub_params, timing_inputs = {}, None, None
    for seed in args.seeds:
        print(f"seed {seed}: ours and keras-hub", flush=True)
        cfg = _config("translate", seed, args)
        ours_report = _train_or_reuse(cfg, args.reuse)
        with open(os.path.join(cfg.out, "spm.model"), "rb") as f:
            sp_model = f.read()
        examples = data_lib.load_corpus(cfg.corpus, "tsv")
        train_examples, _ = data_lib.split_corpus(examples, cfg.eval_fraction, seed=seed)
        assert len(train_examples) == ours_report["train_examples"], "not the training split `train` used"
        dev_pairs = data_lib.load_corpus(cfg.dev_corpus, "tsv")[:cfg.dev_sentences]
        hub, translator, hub_report = _train_hub(cfg, ours_report, sp_model, train_examples, dev_pairs,
                                                 args.reuse)
        hub_params = int(hub.count_params())
        if timing_inputs is None:
            timing_inputs = (cfg, sp_model, train_examples, ours_report["warmup_steps"],
                             ours_report["jit_compile"])
        print("  ours (Seq2SeqTransformer)", flush=True)
        ours_scores = _score_package_run(cfg.out, sources, references, args.alpha)
        print("  keras-hub seq2seq", flush=True)
        hypotheses, seconds = translator.translate(sources)
        hub_scores = {"greedy": _score("greedy", hypotheses, references, seconds,
                                       os.path.join(os.path.dirname(cfg.out), "keras_hub"))}
        per_seed[seed] = {
            "train_examples": len(train_examples), "warmup_steps": ours_report["warmup_steps"],
            "ours": {"test": ours_scores, "resumed_at_step": ours_report["start_step"],
                     **{k: ours_report[k] for k in (
                         "tokens_per_second", "final_train_loss", "eval_loss", "dev_bleu", "dev_chrf",
                         "dev_best_step", "dev_history", "train_seconds")}},
            "keras-hub": {"test": hub_scores, **{k: hub_report[k] for k in (
                "tokens_per_second", "final_train_loss", "dev_bleu", "dev_chrf", "dev_best_step",
                "dev_history", "train_seconds")}},
        }
        del hub, translator
    for seed in args.seeds:
        print(f"seed {seed}: decoder-only LM ({lm_layers} layers)", flush=True)
        cfg, lm_cfg = _config("translate", seed, args), _config("lm", seed, args, lm_layers)
        lm_report = _train_or_reuse(lm_cfg, args.reuse)
        with open(os.path.join(cfg.out, "spm.model"), "rb") as f, \
                open(os.path.join(lm_cfg.out, "spm.model"), "rb") as g:
            per_seed[seed]["same_tokenizer_for_lm"] = f.read() == g.read()
        per_seed[seed]["lm"] = {"test": _score_package_run(lm_cfg.out, sources, references, args.alpha),
                                "resumed_at_step": lm_report["start_step"],
                                **{k: lm_report[k] for k in ("tokens_per_second", "final_train_loss",
                                                             "eval_loss", "train_seconds")}}

    timing = _timing(args, *timing_inputs)

    systems = [("ours", "beam4", "ours: Seq2SeqTransformer, beam 4"),
               ("ours", "greedy", "ours: Seq2SeqTransformer, greedy"),
               ("lm", "beam4", f"ours: decoder-only LM ({lm_layers} layers), beam 4"),
               ("lm", "greedy", f"ours: decoder-only LM ({lm_layers} layers), greedy"),
               ("keras-hub", "greedy", "keras-hub seq2seq (keras-io), greedy")]
    seeds = list(per_seed)
    rows = []
    for key, search, label in systems:
        bleu = [per_seed[s][key]["test"][search]["bleu"] for s in seeds]
        chrf = [per_seed[s][key]["test"][search]["chrf"] for s in seeds]
        rows.append({"system": label, "model": key, "search": search, "bleu": bleu, "chrf": chrf,
                     "bleu_mean": _mean_std(bleu)[0], "bleu_std": _mean_std(bleu)[1],
                     "chrf_mean": _mean_std(chrf)[0], "chrf_std": _mean_std(chrf)[1],
                     "test_sentences": per_seed[seeds[0]][key]["test"][search]["sentences"],
                     "train_tokens_per_second_run": statistics.mean(per_seed[s][key]["tokens_per_second"]
                                                                    for s in seeds),
                     "train_tokens_per_second_alternating": timing[key]["tokens_per_second"]
                     if key in timing else None})

    def paired(search):
        """Per-seed differences ours (with `search`) minus keras-hub (greedy): same seed, tokenizer, data."""
        diff = {metric: [per_seed[s]["ours"]["test"][search][metric]
                         - per_seed[s]["keras-hub"]["test"]["greedy"][metric] for s in seeds]
                for metric in ("bleu", "chrf")}
        return {**diff, **{f"{metric}_mean": statistics.mean(diff[metric]) for metric in diff}}

    target = {"ours_beam4_vs_hub_greedy": paired("beam4"), "ours_greedy_vs_hub_greedy": paired("greedy"),
              "throughput_ratio": timing["ratio"], "throughput_ratio_cpu": timing["ratio_cpu"]}
    for key in ("ours_beam4_vs_hub_greedy", "ours_greedy_vs_hub_greedy"):
        entry = target[key]
        entry["holds"] = bool(entry["bleu_mean"] >= 1.0 and entry["chrf_mean"] >= 0.0
                              and timing["ratio"]["median"] >= 1.0)

    print()
    print("| system | BLEU mean ± std | chrF mean ± std | BLEU per seed | chrF per seed | test sentences "
          "| train tokens/s (alternating) | train tokens/s (whole run) |")
    print("|---|---:|---:|---|---|---:|---:|---:|")
    for row in rows:
        alternating = row["train_tokens_per_second_alternating"]
        bleu, chrf = (", ".join(f"{v:.2f}" for v in row[metric]) for metric in ("bleu", "chrf"))
        print(f"| {row['system']} | {_pm(row['bleu'])} | {_pm(row['chrf'])} | {bleu} | {chrf} | "
              f"{row['test_sentences']} | {f'{alternating:.0f}' if alternating else '—'} | "
              f"{row['train_tokens_per_second_run']:.0f} |")
    print("\n" + _throughput_line(timing))
    for key in ("ours_beam4_vs_hub_greedy", "ours_greedy_vs_hub_greedy"):
        entry = target[key]
        per_seed_bleu = ", ".join(f"{v:+.2f}" for v in entry["bleu"])
        print(f"{key}: BLEU {entry['bleu_mean']:+.2f} (per seed {per_seed_bleu}), "
              f"chrF {entry['chrf_mean']:+.2f}; target (>= +1.0 BLEU, chrF not lower, ratio >= 1.0) "
              f"{'holds' if entry['holds'] else 'does NOT hold'}")
    print(f"parameters: ours {ours_params}, decoder-only LM {lm_counts[lm_layers]} ({lm_layers} layers), "
          f"keras-hub {hub_params}")

    result = {
        "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv[1:]),
        "arguments": {k: (_rel(v) if k in ("out", "corpus_dir", "json") and v else v)
                      for k, v in vars(args).items()},
        "git": {"at_start": git_at_start, "at_end": _git()}, "versions": _versions(),
        "setup": {**SIZE, "num_layers": NUM_LAYERS, "max_length": MAX_LENGTH, "lm_max_length": 2 * MAX_LENGTH,
                  "lm_layers": lm_layers, "beam": BEAM, "alpha": args.alpha, "decode_batch": DECODE_BATCH},
        "parameters": {"ours": ours_params, "lm": lm_counts[lm_layers], "lm_by_layers": lm_counts,
                       "keras-hub": hub_params},
        "table": rows, "per_seed": per_seed, "timing": timing, "target": target,
        "wall_seconds": time.perf_counter() - started,
    }
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    _print_lengths(result)
    print(f"wrote {_rel(json_path)} (wall time {result['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
