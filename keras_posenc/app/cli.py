"""The `keras-posenc` command line: `demo`, `train`, `generate`, `translate`, `inspect`, `export`, `ablate`.

Each subcommand is a pair `_add_<name>_parser(subparsers)` (its flags) and
`_run_<name>(args) -> int` (its work), registered in `_SUBCOMMANDS`. The
flags of `train` and `demo` are generated from the fields of
`train.TrainConfig` (name, type, default, help and choices in one place);
`demo` and `export` share `_export_command`, which prints `export.export_and_check`.

Exit status: 0 on success, 1 when `export` fails its parity or GPU check,
2 on a usage or input error, a file that cannot be written (full disk,
read-only folder) or a run folder that another run holds (the message goes
to stderr, one line, no traceback); 128 + the signal when SIGTERM or SIGINT
stopped training (after it saved a checkpoint).

Output: the command's own lines only. TensorFlow's, XLA's and TFLite's log
lines and the libraries' Python warnings are dropped unless a subcommand gets
`--verbose` (`keras_posenc._startup` sets this up before TensorFlow loads).

Example:

>>> main(["train", "--corpus", "missing.txt"])  # prints the error to stderr
2

From a shell (each subcommand has `--help`)::

    keras-posenc demo                                    # train + export a small LM, runs/demo/
    keras-posenc train --corpus corpus.txt --out runs/lm --steps 500
    keras-posenc generate runs/lm --prompt "The module" --max-new-tokens 20
    keras-posenc train --task translate --format tsv --corpus pairs.tsv --out runs/mt --steps 4000
    keras-posenc translate runs/mt --input test.en --output test.hyp --reference test.de
    keras-posenc inspect runs/lm/model.keras
    keras-posenc export runs/lm/model.keras --out runs/lm/model.tflite --sequence-length 64
    keras-posenc ablate --quick

The subcommands that train or convert models are exercised by
`tests/test_cli.py`, `tests/test_ablation.py` and `tests/test_export.py`.
"""

import argparse
import dataclasses
import os
import sys
import warnings

from keras_posenc import _startup
from keras_posenc.app import run_folder

__all__ = ["ABLATE_OUT", "DEMO_OUT", "DEMO_SETTINGS", "build_parser",
           "main"]

DEMO_OUT = os.path.join("runs", "demo")
# The modules of the `app` extra (setup.cfg): the layers run without them, the command does not.
APP_EXTRA_MODULES = ("sentencepiece", "tensorflow_text", "matplotlib", "sacrebleu")
# The demo's `TrainConfig` fields: small enough to finish in well under 5 minutes on 2 CPU cores, big
# enough to beat a unigram model.
DEMO_SETTINGS = {
    "out": DEMO_OUT, "vocab_size": 1000, "max_length": 48, "steps": 1000, "batch_size": 32, "num_layers": 2,
    "d_model": 64, "num_heads": 4, "dff": 128, "dropout": 0.0, "warmup_steps": 150, "lr_scale": 1.0,
    "checkpoint_every": 250, "log_every": 10,
}


DEMO_PROMPT = "The module"
DEMO_NEW_TOKENS = 16


class _Error(Exception):
    """A user error: printed without a traceback."""


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonnegative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


_FLAG_TYPES = {int: _positive_int, float: float, str: str}


def _add_config_flags(parser, config, names=None):
    """Adds a flag for each field of the dataclass `config` whose metadata has a help text.

    Names, types, choices and help come from the fields (`train._option`);
    defaults are `config`'s values, shown in `--help`. A bool field, or a
    field with `const` metadata, is a switch; `dest` is the field name.

    Args:
        parser: an `argparse.ArgumentParser`.
        config: a dataclass instance (e.g. `TrainConfig()`), the defaults.
        names: optional collection of field names to add (default: all).
    """
    groups = {}
    for field in dataclasses.fields(config):
        meta = field.metadata
        if "help" not in meta or (names is not None and field.name not in names):
            continue
        if meta["group"] not in groups:
            groups[meta["group"]] = parser.add_argument_group(meta["group"])
        # A field declared None is resolved by the config itself (`position` by `task`): left None here.
        default = None if field.default is None else getattr(config, field.name)
        flag = meta["flag"] or "--" + field.name.replace("_", "-")
        options = {"dest": field.name, "default": default, "help": meta["help"]}
        if field.type is bool or meta.get("const") is not None:
            const = meta.get("const") if meta.get("const") is not None else not default
            options.update(action="store_const", const=const, help=meta["help"] + " (default: off)")
        else:
            options["type"] = meta["type"] or _FLAG_TYPES[field.type]
            if meta["choices"]:
                options["choices"] = list(meta["choices"])
            if default is not None:  # a None default is explained by the help text itself
                options["help"] += f" (default: {default})"
        groups[meta["group"]].add_argument(flag, **options)


def _train_config(args, defaults):
    """The `TrainConfig` of parsed flags: `defaults` with every field that has a flag in `args`."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(defaults) if hasattr(args, f.name)}
    return dataclasses.replace(defaults, **values)


def _print_summary(report, out):
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


# demo ---------------------------------------------------------------------------------------
def _demo_config():
    from keras_posenc.app.train import TrainConfig

    return TrainConfig(**DEMO_SETTINGS)


def _add_demo_parser(subparsers):
    parser = subparsers.add_parser(
        "demo", help="train a small LM on the embedded corpus (a few minutes on a CPU)",
        description="Trains a small causal LM on the embedded English corpus, writes the model, "
                    "tokenizer, report and loss plot, and exports the model to TFLite.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_config_flags(parser, _demo_config(), names=("out", "steps", "seed", "verbose"))


def _run_demo(args):
    from keras_posenc.app.run_lock import run_lock

    config = _train_config(args, _demo_config())
    with run_lock(config.out):  # the training, the export and the generation write one folder
        return _demo(config)


def _demo(config):
    from keras_posenc.app.train import train

    print(f"Training a causal LM on the embedded corpus for {config.steps} steps; writing to {config.out}")
    report = train(config)
    _print_summary(report, config.out)
    print("Exporting the demo model to TFLite (float32, GPU target):")
    status = _export_command(os.path.join(config.out, run_folder.MODEL_FILE),
                             os.path.join(config.out, "model.tflite"), config.max_length, require_gpu=True)
    print(f"Generating from the demo model (keras-posenc generate {config.out} --prompt {DEMO_PROMPT!r}):")
    _print_generation(config.out, DEMO_PROMPT, max_new_tokens=DEMO_NEW_TOKENS)
    return status


def _print_generation(run, prompt, spm=None, as_json=False, **generation):
    from keras_posenc.app import text_generation

    model, sp_model = text_generation.load_run(run, spm)
    result = text_generation.generate_text(model, sp_model, prompt, **generation)
    print(text_generation.format_result(prompt, result, as_json=as_json))


# generate -----------------------------------------------------------------------------------
def _add_run_argument(parser):
    """The positional RUN_DIR_OR_MODEL of the commands that read a trained run (generate, translate)."""
    parser.add_argument("run", metavar="RUN_DIR_OR_MODEL",
                        help="a run folder (model.keras + spm.model), or a .keras file with spm.model "
                             "beside it")


def _add_generate_parser(subparsers):
    from keras_posenc.generation import SAMPLERS

    parser = subparsers.add_parser(
        "generate", help="generate text from a trained model (KV cache)",
        description="Continues a prompt with a model trained by `keras-posenc train`, using the run's "
                    "SentencePiece tokenizer: one prefill, then one cached decode step per token. Prints "
                    "the text, then the time to first token and the decode tokens/s.")
    _add_run_argument(parser)
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=_positive_int, default=32,
                        help="tokens to generate (default: %(default)s)")
    parser.add_argument("--sampler", choices=SAMPLERS, default="greedy", help="(default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    parser.add_argument("--top-k", type=_positive_int, default=None, dest="k",
                        help="k of --sampler top_k (default: none)")
    parser.add_argument("--top-p", type=float, default=None, dest="p",
                        help="p of --sampler top_p (default: none)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampler (default: none, random)")
    parser.add_argument("--language", type=int, default=None, dest="language_ids",
                        help="language id of every token, for models with a position scale per language "
                             "(TSV runs: 0 source, 1 target) (default: none)")
    parser.add_argument("--spm", help="SentencePiece model (default: spm.model beside the model)")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object {"ids", "text", "ttft_ms", "decode_tokens_per_s"} '
                             "(default: off)")


def _run_generate(args):
    _print_generation(args.run, args.prompt, spm=args.spm, as_json=args.json,
                      max_new_tokens=args.max_new_tokens, sampler=args.sampler, temperature=args.temperature,
                      k=args.k, p=args.p, seed=args.seed, language_ids=args.language_ids)
    return 0


# translate ----------------------------------------------------------------------------------
def _add_translate_parser(subparsers):
    parser = subparsers.add_parser(
        "translate", help="translate sentences with a trained run (beam search); BLEU/chrF with --reference",
        description="Translates one sentence per line with a run of `keras-posenc train --task translate` "
                    "(or a decoder-only run trained with --format tsv, which continues '<s> source <sep>'): "
                    "batched beam search over a key/value cache, GNMT's length penalty; beam 1 is greedy. "
                    "With --reference, prints sacrebleu's BLEU and chrF and their signatures. Translations "
                    "go to --output; with --output - (stdout) the score and timing lines go to stderr.")
    _add_run_argument(parser)
    parser.add_argument("--input", required=True, help="source sentences, one per line; - reads stdin")
    parser.add_argument("--output", default="-", help="translations, one per line, written atomically; "
                                                      "- is stdout (default: -)")
    parser.add_argument("--beam-size", type=_positive_int, default=4, help="beams; 1 is greedy (default: 4)")
    parser.add_argument("--length-penalty", type=_nonnegative_float, default=1.0, dest="alpha",
                        help="alpha of GNMT's length penalty ((5 + length) / 6) ** alpha (default: 1.0)")
    parser.add_argument("--batch-size", type=_positive_int, default=32,
                        help="sentences per batch, sorted by length (default: 32)")
    parser.add_argument("--max-new-tokens", type=_positive_int, default=None,
                        help="target tokens at most (default: what the model's max length leaves)")
    parser.add_argument("--reference", help="reference translations, one per input line: print BLEU and chrF")
    parser.add_argument("--spm", help="SentencePiece model (default: spm.model beside the model)")
    parser.add_argument("--json", action="store_true",
                        help="print the scores and timing as one JSON object (default: off)")


def _run_translate(args):
    from keras_posenc.app import translation

    result = translation.translate_file(
        args.run, args.input, args.output, reference_path=args.reference, spm_path=args.spm,
        beam_size=args.beam_size, alpha=args.alpha, batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens)
    print(translation.format_summary(result, as_json=args.json),
          file=sys.stderr if args.output == "-" else sys.stdout)
    return 0


# train --------------------------------------------------------------------------------------
def _add_train_parser(subparsers):
    from keras_posenc.app.train import TrainConfig

    parser = subparsers.add_parser(
        "train", help="train a causal LM on a text or TSV corpus, or a translator (--task translate)",
        description="Trains a causal next-token LM. A TSV corpus (source<TAB>target) is trained as "
                    "'source <sep> target' with language ids 0/1 and a position scale per language. "
                    "--task translate trains an encoder-decoder Transformer on the pairs instead and keeps "
                    "the weights of the best dev BLEU (scored at every checkpoint). "
                    "Without --warmup-steps the warmup is min(4000, max(1, steps // 2)).")
    _add_config_flags(parser, TrainConfig())


def _run_train(args):
    from keras_posenc.app.train import TrainConfig, train

    config = _train_config(args, TrainConfig())
    if config.corpus_format == "tsv" and config.corpus is None:
        raise _Error("--format tsv needs --corpus PATH (the embedded corpus is plain text).")
    report = train(config)
    _print_summary(report, config.out)
    if report.get("dev_bleu") is not None:
        print(f"dev BLEU {report['dev_bleu']:.2f}, chrF {report['dev_chrf']:.2f} (greedy, "
              f"{report['dev_sentences']} pairs of the {report['dev_corpus']}; kept: step "
              f"{report['dev_best_step']}) {report['dev_bleu_signature']}")
    return 0


# inspect ------------------------------------------------------------------------------------
def _add_inspect_parser(subparsers):
    parser = subparsers.add_parser(
        "inspect", help="position-embedding diagnostics of a trained model",
        description="PE value-range check, PE heatmap, positional-contribution ratio and attention "
                    "focus by distance of a model saved by `train` (model.keras).")
    parser.add_argument("model", help="path of model.keras (spm.model beside it is used for text)")
    parser.add_argument("--out", help="folder for the PNGs and inspect.json (default: beside the model)")
    parser.add_argument("--text", action="append",
                        help="probe sentence, repeatable (default: sentences of the embedded corpus)")


def _run_inspect(args):
    from keras_posenc.app import diagnostics

    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.model)), "inspect")
    result = diagnostics.inspect_model(args.model, out, texts=args.text)
    summary = result["summary"]
    pe = summary["pe_range"]
    print(f"PE value range: min {pe['min']:.4f}, max {pe['max']:.4f} (bound {pe['bound']}): "
          + ("ok" if pe["ok"] else "OUT OF RANGE"))
    print(f"positional-contribution ratio (first attention, with vs without PE): "
          f"{summary['positional_contribution_ratio']:.3f}")
    for i, weights in enumerate(summary["attention_by_distance"]):
        shown = " ".join("-" if w is None else f"{w:.3f}" for w in weights[:9])
        print(f"layer {i} mean attention at distance 0..8: {shown}")
    print("artifacts:")
    for path in result["artifacts"]:
        print(f"  {path}")
    return 0


# ablate -------------------------------------------------------------------------------------
ABLATE_OUT = os.path.join("runs", "ablation")
ABLATE_TRANSLATE_OUT = os.path.join("runs", "ablation-translate")
TRANSLATION_CORPUS_DIR = os.path.join(".cache", "corpus", "debian_po_en_de")
_LM_ONLY_ABLATE_FLAGS = (("corpus", "--corpus"), ("variants", "--variants"),
                         ("no_causal_mask", "--no-causal-mask"))


def _add_ablate_parser(subparsers):
    from keras_posenc.app import ablation, translation_ablation

    parser = subparsers.add_parser(
        "ablate", help="position-encoding ablation and length extrapolation; seed 002's claims in BLEU",
        description="--task lm (default): trains the same causal LM with every position variant and "
                    "several seeds, evaluates held-out loss at the training length and at 2x and 4x, and "
                    "writes ablation.md, ablation.json, loss_curves.png, extrapolation.png and "
                    "attention_focus.png (about 10 minutes on 2 CPU cores). --task translate: trains the "
                    "encoder-decoder translator once per arm of seed 002's six claims and seed on the "
                    "corpus of `make corpus`, and writes translation_ablation.md, translation_ablation.json, "
                    "bleu_by_length.png and claims.png (about 2 hours on 2 CPU cores). --quick trains a tiny "
                    "model for a few steps (seconds to minutes; for tests).")
    parser.add_argument("--task", choices=("lm", "translate"), default="lm",
                        help="what to ablate: position variants of the LM, or seed 002's translation claims "
                             "(default: lm)")
    parser.add_argument("--corpus",
                        help="--task lm: plain-text corpus (default: the embedded English corpus)")
    parser.add_argument("--corpus-dir", default=TRANSLATION_CORPUS_DIR,
                        help=f"--task translate: folder with train.tsv and test.tsv (default: "
                             f"{TRANSLATION_CORPUS_DIR}, from `make corpus`)")
    full, quick = ablation.AblationConfig(), ablation.QUICK
    translate_full = translation_ablation.TranslationAblationConfig()
    translate_quick = translation_ablation.QUICK
    parser.add_argument("--steps", type=_positive_int,
                        help=f"optimizer steps per run (default: {full.steps}, --task translate "
                             f"{translate_full.steps}; --quick {quick.steps}, --task translate "
                             f"{translate_quick.steps})")
    parser.add_argument("--seeds", type=_positive_int, help=f"number of seeds 0, 1, ..., N-1 (default: "
                                                            f"{len(full.seeds)}; --quick {len(quick.seeds)})")
    parser.add_argument("--variants", "--position", nargs="+", choices=list(ablation.VARIANTS),
                        help="--task lm: subset of the variants, e.g. rope rope-ntk rope-yarn alibi "
                             "(default: all)")
    parser.add_argument("--arms", nargs="+", choices=list(translation_ablation.ARMS),
                        help="--task translate: subset of the arms (default: all; a claim is reported when "
                             "both of its arms ran)")
    parser.add_argument("--out", help=f"output folder (default: {ABLATE_OUT}, --task translate "
                                      f"{ABLATE_TRANSLATE_OUT})")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny model, {quick.steps} steps (--task translate {translate_quick.steps}, "
                             f"{translate_quick.max_test_sentences} test pairs), {len(quick.seeds)} seeds "
                             "(default: off)")
    parser.add_argument("--no-causal-mask", action="store_true",
                        help="--task lm: train the unmasked encoder of article 000 on next-token targets "
                             "(the target is visible in the input: a copy task that needs positions) "
                             "(default: off)")


def _run_ablate(args):
    if args.task == "translate":
        return _run_translation_ablation(args)
    if args.arms:
        raise _Error("--arms is for --task translate.")
    import dataclasses

    from keras_posenc.app import ablation

    out = args.out or ABLATE_OUT
    config = ablation.QUICK if args.quick else ablation.AblationConfig()
    overrides = {}
    if args.steps:
        overrides["steps"] = args.steps
    if args.seeds:
        overrides["seeds"] = tuple(range(args.seeds))
    if args.variants:
        overrides["variants"] = tuple(args.variants)
    if args.no_causal_mask:
        overrides["causal"] = False
    config = dataclasses.replace(config, **overrides)
    ablation.check_config(config)
    command = " ".join(["keras-posenc ablate"]
                       + (["--quick"] if args.quick else [])
                       + ([f"--corpus {args.corpus}"] if args.corpus else [])
                       + ([f"--steps {args.steps}"] if args.steps else [])
                       + ([f"--seeds {args.seeds}"] if args.seeds else [])
                       + ([f"--variants {' '.join(args.variants)}"] if args.variants else [])
                       + (["--no-causal-mask"] if args.no_causal_mask else [])
                       + [f"--out {out}"])
    from keras_posenc.app.run_lock import run_lock

    with run_lock(out):
        print(f"Ablation: {len(config.variants)} variants x {len(config.seeds)} seeds, {config.steps} steps "
              f"each; writing to {out}")
        results = ablation.run_ablation(args.corpus, config)
        paths = ablation.write_report(results, out, command=command)
    return _print_ablation(ablation.markdown_table(results), results, paths)


def _print_ablation(table, results, paths):
    """The end of `ablate` (either task): the table, the total time and the files written; status 0."""
    print(table)
    print(f"total time: {results['elapsed_seconds']} s")
    print("artifacts:")
    for path in paths.values():
        print(f"  {path}")
    return 0


def _run_translation_ablation(args):
    import dataclasses

    from keras_posenc.app import translation_ablation
    from keras_posenc.app.run_lock import run_lock

    for name, flag in _LM_ONLY_ABLATE_FLAGS:
        if getattr(args, name):
            raise _Error(f"{flag} is for --task lm; --task translate reads --corpus-dir.")
    translation_ablation.check_corpus_dir(args.corpus_dir)
    out = args.out or ABLATE_TRANSLATE_OUT
    config = translation_ablation.QUICK if args.quick else translation_ablation.TranslationAblationConfig()
    overrides = {key: value for key, value in (("steps", args.steps),
                                                ("seeds", args.seeds and tuple(range(args.seeds))),
                                                ("arms", args.arms and tuple(args.arms))) if value}
    config = dataclasses.replace(config, **overrides)
    command = " ".join(["keras-posenc ablate --task translate"]
                       + (["--quick"] if args.quick else [])
                       + ([f"--corpus-dir {args.corpus_dir}"]
                          if args.corpus_dir != TRANSLATION_CORPUS_DIR else [])
                       + ([f"--steps {args.steps}"] if args.steps else [])
                       + ([f"--seeds {args.seeds}"] if args.seeds else [])
                       + ([f"--arms {' '.join(args.arms)}"] if args.arms else [])
                       + [f"--out {out}"])
    with run_lock(out):
        print(f"Translation ablation: {len(config.arms)} arms x {len(config.seeds)} seeds, "
              f"{config.steps} steps each; writing to {out}")
        results = translation_ablation.run_translation_ablation(
            args.corpus_dir, config, out_dir=os.path.join(out, "translations"))
        paths = translation_ablation.write_report(results, out, command=command)
    return _print_ablation(translation_ablation.markdown_table(results), results, paths)


# export -------------------------------------------------------------------------------------


def _add_export_parser(subparsers):
    from keras_posenc.export import QUANTIZE_MODES, TARGETS

    parser = subparsers.add_parser(
        "export", help="convert a trained model to TFLite for edge GPUs (builtin ops only)",
        description="Rebuilds the model with fixed input shapes under float32, freezes the position "
                    "tables as constants, converts with TFLite builtin ops only (never Flex) and prints "
                    "the op histogram, the GPU-delegate verdict, the parity against Keras on a real "
                    "token batch and the file size against the weight bytes. Exit status 1 when the "
                    "parity exceeds the tolerance or, with --require-gpu, when the target's GPU backend "
                    "does not run every op. export/jetson/README.md takes the file to a Jetson.")
    parser.add_argument("model", help="trained model (.keras, .h5 or SavedModel folder)")
    parser.add_argument("--out", required=True,
                        help="output .tflite file (FILE.json with its input shapes is written beside)")
    parser.add_argument("--sequence-length", type=_positive_int,
                        help="fixed input length, at most the model's max_length (default: none; required "
                             "without --generate)")
    parser.add_argument("--batch-size", type=_positive_int, default=1,
                        help="fixed batch (gpu, cpu, tensorrt; gl runs batch 1 only) (default: 1)")
    parser.add_argument("--quantize", choices=[mode for mode in QUANTIZE_MODES if mode],
                        help="float16, int8 or int4 weights (dynamic_int8: the older name of int8), made "
                             "by the quantizer measured best for the target (keras_posenc/export/"
                             "quantization.py; int4: LiteRT Quantizer, not on gl) and checked on held-out "
                             "text (default: none, float32)")
    parser.add_argument("--target", choices=TARGETS, default=None,
                        help="gpu: LiteRT GPU accelerator / OpenCL delegate; gl: OpenGL ES delegate (float "
                             "inputs); cpu: XNNPACK with GATHER; tensorrt: ONNX for trtexec (default: gpu)")
    parser.add_argument("--embedding", choices=("host", "graph"),
                        help="gpu/gl/tensorrt: host = the file takes the looked-up rows table[ids] as "
                             "float input `embeddings` (the kit reads them from FILE.embeddings.npy), graph "
                             "= the lookup in the file (gpu/gl: a one-hot product on the GPU, T x vocab x "
                             "d_model multiply-adds; tensorrt: GATHER) (default: host for gpu/gl models "
                             "with a token table, the faster on a GPU; graph otherwise)")
    parser.add_argument("--require-gpu", action="store_true",
                        help="fail when the GPU delegate would reject an op (default: off; window "
                             "exports only)")
    parser.add_argument("--tolerance", type=float,
                        help="max abs parity on real tokens (default: 1e-4; float16 2e-2; int8 report only)")
    parser.add_argument("--token-ids", help="int .npy [n, sequence-length] for the parity check (default: "
                                            "corpus sentences tokenized with spm.model beside the model, "
                                            "else a synthetic padded batch)")
    parser.add_argument("--eval-corpus",
                        help="with --quantize: a text file (one sentence per line) of held-out text on which "
                             "the quantized file's cross-entropy is compared with a float32 export's "
                             "(default: the run's eval split, read from report.json and spm.model beside the "
                             "model; without them the loss is not measured)")
    parser.add_argument("--max-loss-increase", type=_nonnegative_float, default=0.01,
                        help="with --quantize: fail when the held-out cross-entropy rises by more than this "
                             "fraction over the float32 file's (default: 0.01, 1%%)")
    parser.add_argument("--litert-python", "--litertlm-python", dest="litert_python",
                        help="a Python with LiteRT's tools (litert-lm-builder, litert-lm-api 0.18.1, "
                             "litert-quantizer 0.11.0): --format litertlm, --quantize int4, and the checks "
                             "of files only LiteRT 2.x computes right (default: "
                             "$KERAS_POSENC_LITERT_PYTHON, else this one if it has them, else one that "
                             "keras-posenc creates on first use in $KERAS_POSENC_HOME)")
    generation = parser.add_argument_group(
        "generation", "one file with prefill and decode signatures and the key/value cache as inputs and "
                      "outputs, for export/jetson/run_generate.py (CausalLM; --target gl: "
                      "STEM.prefill.tflite and STEM.decode.tflite, tensorrt: STEM.prefill.onnx and "
                      "STEM.decode.onnx)")
    generation.add_argument("--generate", action="store_true", help="export prefill + decode (default: off)")
    generation.add_argument("--cache-length", type=_positive_int,
                            help="cache slots: prompt + generated tokens, at most max_length (default: none; "
                                 "required with --generate)")
    generation.add_argument("--prompt-length", type=_positive_int,
                            help="prefill length P, prompts are right-padded to it (default: "
                                 "cache-length // 2)")
    generation.add_argument("--format", choices=("tflite", "litertlm", "genai"), default="tflite",
                            help="tflite: the prefill/decode file of run_generate.py; litertlm: a bundle for "
                                 "LiteRT-LM's Engine and `litert-lm` (model in its contract, spm.model, "
                                 "LlmMetadata; --target cpu or gpu), checked on the engine; genai: --out is "
                                 "a folder for onnxruntime-genai (one decoder ONNX, genai_config.json, "
                                 "tokenizer.json from spm.model; no --target), checked fed as it feeds it "
                                 "(default: %(default)s)")
    generation.add_argument("--spm", help="--format litertlm / genai: the SentencePiece model to bundle "
                                          "(default: spm.model beside the model)")
    generation.add_argument("--probe-prompt", action="append", dest="probe_prompts",
                            help="--format litertlm / genai: a prompt of the check, repeatable (default: "
                                 "texts of the vocabulary, one longer than the prefill, and a second turn)")


def _export_command(model_path, out, sequence_length, *, batch_size=1, quantize=None, target="gpu",
                    require_gpu=False, tolerance=None, token_ids=None, embedding=None, eval_corpus=None,
                    max_loss_increase=0.01, litert_python=None):
    """`keras-posenc export` (and the end of `demo`): `export.export_and_check`, printed; the exit status.

    `token_ids`: optional path of an int `.npy` `[n, sequence_length]` for the parity; default
    corpus sentences tokenized with `spm.model` beside the model, else a synthetic padded batch.
    Writes `out`, `out.json`, the contract and, with `embedding="host"`, `out.embeddings.npy`.
    With `quantize`, the held-out cross-entropy against a float32 export (`run_folder.eval_token_ids`).
    """
    import numpy as np

    from keras_posenc import export

    model = export.load_model(model_path)
    if embedding == "host" and not export.target_of(target).host_embedding:
        raise _Error(_host_embedding_refusal(target, lambda t: t.host_embedding))
    if token_ids is not None:
        ids = np.load(token_ids)
        if ids.ndim != 2 or ids.shape[1] != sequence_length:
            raise _Error(f"--token-ids must hold an int array [n, {sequence_length}], got shape {ids.shape}.")
    else:
        ids = run_folder.corpus_token_ids(model_path, sequence_length, rows=4 * batch_size)
    if eval_corpus is not None and quantize is None:
        raise _Error("--eval-corpus measures a quantized file: it needs --quantize.")
    export.recipe_for(target, quantize, "window", litert_python=litert_python)  # refused before anything runs
    eval_ids = (run_folder.eval_token_ids(model_path, sequence_length, eval_corpus)
               if quantize is not None else None)
    result = export.export_and_check(model, sequence_length=sequence_length, target=target,
                                     batch_size=batch_size, quantize=quantize, embedding=embedding,
                                     token_ids=ids, eval_token_ids=eval_ids,
                                     max_loss_increase=max_loss_increase, litert_python=litert_python)
    return _save_and_print(result, out, tolerance=tolerance, require_gpu=require_gpu)


def _save_and_print(result, out, *, tolerance=None, require_gpu=False):
    """The one printer of `export` (window and --generate): files, report, failed checks; the exit status."""
    paths = result.save(out)
    print(result.headline(paths))
    for line in result.report_lines(out):
        print(line)
    failures = result.failures(tolerance=tolerance, require_gpu=require_gpu)
    for line in failures:
        print(line)
    return 1 if failures else 0


def _host_embedding_refusal(target, allows):
    from keras_posenc.export import TARGETS

    names = [t.name for t in TARGETS.values() if allows(t)]
    return (f"--embedding host is for the {', '.join(names[:-1])} and {names[-1]} targets; {target} "
            "GATHERs its lookups in the file.")


# The --generate formats beside tflite: what each writes.
_FORMATS = {"litertlm": "a prefill/decode bundle", "genai": "an onnxruntime-genai decoder folder"}


def _run_export(args):
    given = [flag for flag, value in (("--spm", args.spm), ("--probe-prompt", args.probe_prompts)) if value]
    if args.format not in _FORMATS and given:
        raise _Error(f"{', '.join(given)} is for --format {' or '.join(_FORMATS)}.")
    if args.format in _FORMATS and not args.generate:
        raise _Error(f"--format {args.format} is {_FORMATS[args.format]}: add --generate --cache-length C.")
    if args.format == "genai":
        if args.target is not None:
            raise _Error(f"--format genai runs on onnxruntime-genai's CPU provider and takes no --target, "
                         f"got --target {args.target}.")
    elif args.target is None:
        args.target = "gpu"
    if args.generate:
        return _export_generator(args)
    if args.sequence_length is None:
        raise _Error("export needs --sequence-length (or --generate with --cache-length).")
    return _export_command(args.model, args.out, args.sequence_length, batch_size=args.batch_size,
                           quantize=args.quantize, target=args.target, require_gpu=args.require_gpu,
                           tolerance=args.tolerance, token_ids=args.token_ids, embedding=args.embedding,
                           eval_corpus=args.eval_corpus, max_loss_increase=args.max_loss_increase,
                           litert_python=args.litert_python)


def _export_generator(args):
    from keras_posenc import export

    if args.cache_length is None:
        raise _Error("--generate needs --cache-length C (prompt + generated tokens).")
    given = (("--sequence-length", args.sequence_length), ("--token-ids", args.token_ids))
    ignored = [flag for flag, value in given if value is not None]
    if ignored or args.batch_size != 1:
        raise _Error("--generate exports batch 1 and takes no "
                     f"{', '.join(ignored) or '--batch-size'}.")
    if args.require_gpu:
        raise _Error("--require-gpu checks a window export's ops; the --generate graphs of gpu and gl hold "
                     "GPU ops only (the shader graphs): drop --require-gpu.")
    if args.eval_corpus is not None and args.quantize is None:
        raise _Error("--eval-corpus measures a quantized file: it needs --quantize.")
    prompt_length = args.prompt_length or max(1, args.cache_length // 2)
    if args.format == "genai":
        return _export_genai(args, prompt_length)
    kind = "litertlm" if args.format == "litertlm" else "prefill_decode"
    export.recipe_for(args.target, args.quantize, kind, litert_python=args.litert_python)
    model = export.load_model(args.model)
    longest = export.longest_sequence(model)
    if longest is not None and args.cache_length > longest:
        raise _Error(f"--cache-length {args.cache_length} exceeds the model's max_length={longest} (the "
                     "cache holds the prompt and every generated token).")
    if args.embedding == "host" and not export.target_of(args.target).generation_host_embedding:
        raise _Error(_host_embedding_refusal(args.target, lambda t: t.generation_host_embedding))
    eval_ids = (run_folder.eval_token_ids(args.model, args.cache_length, args.eval_corpus)
                if args.quantize is not None else None)
    if args.format == "litertlm":
        return _export_litertlm(args, model, prompt_length, eval_ids)
    result = export.export_generation(model, prompt_length=prompt_length, cache_length=args.cache_length,
                                      target=args.target, embedding=args.embedding, quantize=args.quantize,
                                      eval_token_ids=eval_ids, max_loss_increase=args.max_loss_increase,
                                      litert_python=args.litert_python)
    return _save_and_print(result, args.out, tolerance=args.tolerance)


def _export_litertlm(args, model, prompt_length, eval_ids=None):
    """`--generate --format litertlm`: `export.export_litertlm`, printed; the exit status."""
    from keras_posenc import export

    if args.embedding is not None:
        raise _Error("--format litertlm looks tokens up in the file and takes no --embedding.")
    if not os.path.isfile(args.model):
        raise _Error(f"--format litertlm needs a .keras file with its tokenizer, got {args.model!r}.")
    _, spm_path = run_folder.resolve_run(args.model, args.spm)
    with open(spm_path, "rb") as f:
        sp_model = f.read()
    probes = [[prompt] for prompt in args.probe_prompts] if args.probe_prompts else None
    try:
        result = export.export_litertlm(model, sp_model, prompt_length=prompt_length,
                                        cache_length=args.cache_length, target=args.target,
                                        probes=probes, python=args.litert_python,
                                        quantize=args.quantize, eval_token_ids=eval_ids,
                                        max_loss_increase=args.max_loss_increase)
    except RuntimeError as error:  # the builder's process failed: its last lines are in the message
        raise _Error(str(error)) from error
    return _save_and_print(result, args.out, tolerance=args.tolerance)


def _export_genai(args, prompt_length):
    """`--generate --format genai`: `export.export_genai` into the folder `--out`, printed; exit status."""
    from keras_posenc import export
    from keras_posenc.app import dataset as data_lib

    refused = [flag for flag, value in (("--quantize", args.quantize), ("--embedding", args.embedding),
                                        ("--tolerance", args.tolerance)) if value is not None]
    if refused:
        raise _Error(f"--format genai writes float32 weights with the lookup in the file, checked token for "
                     f"token: it takes no {', '.join(refused)}.")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise _Error(f"--format genai writes a folder: --out {args.out} is a file.")
    if not os.path.isfile(args.model):
        raise _Error(f"--format genai needs a .keras file with its tokenizer, got {args.model!r}.")
    _, spm_path = run_folder.resolve_run(args.model, args.spm)
    with open(spm_path, "rb") as f:
        sp_model = f.read()
    model = export.load_model(args.model)
    probes = [[prompt] for prompt in args.probe_prompts] if args.probe_prompts else None
    texts = data_lib.read_text_corpus(data_lib.default_corpus_path())[:run_folder.EVAL_ROWS]
    try:
        result = export.export_genai(model, sp_model, cache_length=args.cache_length,
                                     prompt_length=prompt_length, check_texts=texts, probes=probes)
    except ImportError as error:  # tokenizers: the message says how to install it
        raise _Error(str(error)) from error
    return _save_and_print(result, args.out)


_SUBCOMMANDS = {
    "demo": (_add_demo_parser, _run_demo),
    "train": (_add_train_parser, _run_train),
    "generate": (_add_generate_parser, _run_generate),
    "translate": (_add_translate_parser, _run_translate),
    "inspect": (_add_inspect_parser, _run_inspect),
    "export": (_add_export_parser, _run_export),
    "ablate": (_add_ablate_parser, _run_ablate),
}


def build_parser():
    """The `argparse` parser of `keras-posenc` with every subcommand.

    Returns:
        an `argparse.ArgumentParser`; `parse_args` gives a namespace whose
        `command` names the subcommand.

    Example:

    >>> args = build_parser().parse_args(["train", "--steps", "5", "--position", "learned"])
    >>> args.command, args.steps, args.position, args.corpus_format
    ('train', 5, 'learned', 'text')
    """
    parser = argparse.ArgumentParser(prog="keras-posenc", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_parser, _ in _SUBCOMMANDS.values():
        add_parser(subparsers)
    for subparser in subparsers.choices.values():
        subparser.add_argument(_startup.VERBOSE_FLAG, dest="runtime_logs", action="store_true",
                               help="also show TensorFlow's, XLA's and TFLite's log lines and the "
                                    "libraries' warnings (default: off)")
    return parser


def _warning_printer(show_library_warnings):
    def show(message, category, filename, lineno, file=None, line=None):
        if show_library_warnings or _startup.is_package_warning(filename):
            print(f"keras-posenc: warning: {message}", file=sys.stderr)

    return show


def main(argv=None):
    """Runs `keras-posenc` with `argv` (default: the process arguments); returns the exit code.

    User errors (`ValueError`, `OSError`, a bad flag combination, a module
    of the `app` extra that is not installed), write
    errors (`files.FileWriteError`, TensorFlow's file errors), a run folder
    held by another run (`RunLockedError`) are printed to stderr as one line
    `keras-posenc: error: ...` and give status 2; argparse errors exit with
    status 2 through `SystemExit`. Training stopped by SIGTERM or SIGINT
    prints one line and gives 128 + the signal.

    Args:
        argv: list of str, the arguments after the program name (None:
            `sys.argv[1:]`).

    Returns:
        int, the exit status: 0 success, 1 failed export check, 2 error.

    Example:

    >>> main(["train", "--format", "tsv"])  # the embedded corpus is not TSV; message on stderr
    2
    """
    try:
        return _main(argv)
    except ModuleNotFoundError as err:  # the parser's defaults already need the application's modules
        if (err.name or "").split(".")[0] not in APP_EXTRA_MODULES:
            raise
        print(f"keras-posenc: error: the command needs the application's dependencies ({err}): "
              "pip install 'keras-posenc[app]'.", file=sys.stderr)
        return 2


def _main(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    from keras_posenc.backend import backend_name, is_tensorflow

    if not is_tensorflow():  # tf.data, tf.distribute, checkpoints and TFLite are TensorFlow's
        print(f"keras-posenc: error: `{args.command}` needs KERAS_BACKEND=tensorflow "
              f"(this process runs Keras on {backend_name()}).", file=sys.stderr)
        return 2
    import tensorflow as tf

    from keras_posenc.app.run_lock import RunLockedError
    from keras_posenc.app.train import TrainingInterrupted

    previous, warnings.showwarning = warnings.showwarning, _warning_printer(args.runtime_logs)
    try:
        return _SUBCOMMANDS[args.command][1](args)
    except TrainingInterrupted as err:
        print(f"keras-posenc: {err}", file=sys.stderr)
        return 128 + err.signum
    except KeyboardInterrupt:
        print("keras-posenc: interrupted (SIGINT).", file=sys.stderr)
        return 128 + 2
    except (_Error, ValueError, OSError, RunLockedError) as err:
        print(f"keras-posenc: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except tf.errors.OpError as err:  # a file TensorFlow reads or writes (full disk, corrupt file)
        print(f"keras-posenc: error: {type(err).__name__}: {_one_line(err)}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = previous


def _one_line(error):
    """The message of `error` on one line (TensorFlow's start with the op's node name: dropped)."""
    from keras_posenc.files import FileWriteError

    text = error.strerror if isinstance(error, FileWriteError) else str(error)  # without "[Errno 28]"
    if text.startswith("{{function_node"):
        text = text.split("}}", 1)[-1]
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
