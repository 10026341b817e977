"""The `keras-posenc` commands that train: `train` and `demo`.

`train` trains per the flags, which `add_config_flags` makes from the fields
of `train_config.TrainConfig`, and prints the report's summary. `demo`
trains a small LM (`DEMO_SETTINGS`) on the embedded corpus, exports it to
TFLite (`cli_export.export_command`) and generates from it
(`cli_trained_run.print_generation`), all in one run folder under its lock.

Example: both train for seconds to minutes, so they are exercised by
`tests/test_cli.py` (with stand-ins: `tests/test_cli_arguments.py`)::

    keras-posenc demo --steps 200 --out runs/demo
    keras-posenc train --corpus corpus.txt --out runs/lm --steps 500
"""

import argparse
import os

from keras_posenc.app import run_folder
from keras_posenc.app.cli_export import export_command
from keras_posenc.app.cli_flags import CommandError, add_config_flags, config_from_flags
from keras_posenc.app.cli_trained_run import print_generation

__all__ = ["DEMO_NEW_TOKENS", "DEMO_OUT", "DEMO_PROMPT", "DEMO_SETTINGS", "add_demo_parser",
           "add_train_parser", "run_demo", "run_train"]

DEMO_OUT = os.path.join("runs", "demo")
# The demo's `TrainConfig` fields: small enough to finish in well under 5 minutes on 2 CPU cores, big
# enough to beat a unigram model.
DEMO_SETTINGS = {
    "out": DEMO_OUT, "vocab_size": 1000, "max_length": 48, "steps": 1000, "batch_size": 32, "num_layers": 2,
    "d_model": 64, "num_heads": 4, "dff": 128, "dropout": 0.0, "warmup_steps": 150, "lr_scale": 1.0,
    "checkpoint_every": 250, "log_every": 10,
}
# What the demo's generation continues, and for how many tokens.
DEMO_PROMPT = "The module"
DEMO_NEW_TOKENS = 16


def _print_summary(report, out):
    """The report's losses, throughput and files, and a warning when the model is no better than unigrams."""
    print(f"steps: {report['steps']}  final train loss: {report['final_train_loss']}")
    print(f"eval loss: {report['eval_loss']:.4f} (perplexity {report['eval_perplexity']:.1f})")
    print(f"unigram baseline on the same eval split: {report['unigram_eval_loss']:.4f} "
          f"(perplexity {report['unigram_eval_perplexity']:.1f})")
    if report["tokens_per_second"]:
        print(f"throughput: {report['tokens_per_second']:.0f} tokens/s")
    print("artifacts:")
    for name in (run_folder.MODEL_FILE, run_folder.TOKENIZER_FILE, run_folder.REPORT_FILE, "loss.png", "logs",
                 "checkpoints"):
        print(f"  {os.path.join(out, name)}")
    if not report["beats_unigram"]:
        print(f"WARNING: the eval loss {report['eval_loss']:.4f} is not below the unigram baseline "
              f"{report['unigram_eval_loss']:.4f}: the model predicts no better than word frequencies. "
              f"Train longer (--steps) or check --warmup-steps ({report['warmup_steps']}) and --lr-scale.")


def _demo_config():
    from keras_posenc.app.train import TrainConfig

    return TrainConfig(**DEMO_SETTINGS)


def add_demo_parser(subparsers):
    """Adds `demo` and its flags (`out`, `steps`, `seed`, `--quiet` of `DEMO_SETTINGS`) to `subparsers`."""
    parser = subparsers.add_parser(
        "demo", help="train a small LM on the embedded corpus (a few minutes on a CPU)",
        description="Trains a small causal LM on the embedded English corpus, writes the model, "
                    "tokenizer, report and loss plot, and exports the model to TFLite.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flags(parser, _demo_config(), names=("out", "steps", "seed", "verbose"))


def run_demo(args):
    """`keras-posenc demo`: trains, exports and generates under the run folder's lock; the exit status."""
    from keras_posenc.app.run_lock import run_lock

    config = config_from_flags(args, _demo_config())
    with run_lock(config.out):  # the training, the export and the generation write one folder
        return _demo(config)


def _demo(config):
    from keras_posenc.app.train import train

    print(f"Training a causal LM on the embedded corpus for {config.steps} steps; writing to {config.out}")
    report = train(config)
    _print_summary(report, config.out)
    print("Exporting the demo model to TFLite (float32, GPU target):")
    status = export_command(os.path.join(config.out, run_folder.MODEL_FILE),
                            os.path.join(config.out, "model.tflite"), config.max_length, require_gpu=True)
    print(f"Generating from the demo model (keras-posenc generate {config.out} --prompt {DEMO_PROMPT!r}):")
    print_generation(config.out, DEMO_PROMPT, max_new_tokens=DEMO_NEW_TOKENS)
    return status


def add_train_parser(subparsers):
    """Adds `train` and one flag per field of `TrainConfig` to `subparsers`."""
    from keras_posenc.app.train import TrainConfig

    parser = subparsers.add_parser(
        "train", help="train a causal LM on a text or TSV corpus, or a translator (--task translate)",
        description="Trains a causal next-token LM. A TSV corpus (source<TAB>target) is trained as "
                    "'source <sep> target' with language ids 0/1 and a position scale per language. "
                    "--task translate trains an encoder-decoder Transformer on the pairs instead and keeps "
                    "the weights of the best dev BLEU (scored at every checkpoint). "
                    "Without --warmup-steps the warmup is min(4000, max(1, steps // 2)).")
    add_config_flags(parser, TrainConfig())


def run_train(args):
    """`keras-posenc train`: trains per the flags and prints the summary; the exit status (0).

    Raises:
        CommandError: `--format tsv` without `--corpus`.
    """
    from keras_posenc.app.train import TrainConfig, train

    config = config_from_flags(args, TrainConfig())
    if config.corpus_format == "tsv" and config.corpus is None:
        raise CommandError("--format tsv needs --corpus PATH (the embedded corpus is plain text).")
    report = train(config)
    _print_summary(report, config.out)
    if report.get("dev_bleu") is not None:
        print(f"dev BLEU {report['dev_bleu']:.2f}, chrF {report['dev_chrf']:.2f} (greedy, "
              f"{report['dev_sentences']} pairs of the {report['dev_corpus']}; kept: step "
              f"{report['dev_best_step']}) {report['dev_bleu_signature']}")
    return 0
