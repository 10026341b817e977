"""The `keras-posenc` command line: `demo`, `train`, `inspect`, `export`, `ablate`.

Each subcommand is a pair `_add_<name>_parser(subparsers)` (its flags) and
`_run_<name>(args) -> int` (its work), registered in `_SUBCOMMANDS`.

Exit status: 0 on success, 1 when `export` fails its parity or GPU check,
2 on a usage or input error (the message goes to stderr, no traceback).

Example:

>>> main(["train", "--corpus", "missing.txt"])  # prints the error to stderr
2

From a shell (each subcommand has `--help`)::

    keras-posenc demo                                    # train + export a small LM, runs/demo/
    keras-posenc train --corpus corpus.txt --out runs/lm --steps 500
    keras-posenc inspect runs/lm/model.keras
    keras-posenc export runs/lm/model.keras --out runs/lm/model.tflite --sequence-length 64
    keras-posenc ablate --quick

The subcommands that train or convert models are exercised by
`tests/test_cli.py`, `tests/test_ablation.py` and `tests/test_export.py`.
"""

import argparse
import os
import sys

__all__ = ["ABLATE_OUT", "DEMO_OUT", "DEMO_SETTINGS", "EXPORT_TOLERANCE", "build_parser", "main"]

DEMO_OUT = os.path.join("runs", "demo")
# Small enough to finish in well under 5 minutes on 2 CPU cores, big enough to beat a unigram model.
DEMO_SETTINGS = {
    "vocab_size": 1000, "max_length": 48, "steps": 1000, "batch_size": 32, "num_layers": 2, "d_model": 64,
    "num_heads": 4, "dff": 128, "dropout": 0.0, "warmup_steps": 150, "lr_scale": 1.0,
    "checkpoint_every": 250, "log_every": 10,
}


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


def _add_model_flags(parser, defaults):
    from keras_posenc.layers.token_and_position_embedding import POSITION_LAYERS
    from keras_posenc.tables import TABLE_KINDS

    group = parser.add_argument_group("model")
    group.add_argument("--num-layers", type=_positive_int, default=defaults["num_layers"])
    group.add_argument("--d-model", type=_positive_int, default=defaults["d_model"])
    group.add_argument("--num-heads", type=_positive_int, default=defaults["num_heads"])
    group.add_argument("--dff", type=_positive_int, default=defaults["dff"], help="feed-forward width")
    group.add_argument("--dropout", type=float, default=defaults["dropout"])
    group.add_argument("--norm-first", action="store_true", help="pre-LN blocks")
    group.add_argument("--position", choices=sorted(POSITION_LAYERS), default="sinusoidal",
                       help="position embedding kind")
    group.add_argument("--table", choices=TABLE_KINDS, default="full",
                       help="sinusoidal table storage (only for --position sinusoidal)")
    group.add_argument("--max-length", type=_positive_int, default=defaults["max_length"],
                       help="longest input sequence in tokens (independent of --vocab-size)")


def _add_training_flags(parser, defaults):
    group = parser.add_argument_group("training")
    group.add_argument("--vocab-size", type=_positive_int, default=defaults["vocab_size"],
                       help="SentencePiece vocabulary size")
    group.add_argument("--steps", type=_positive_int, default=defaults["steps"], help="total optimizer steps")
    group.add_argument("--batch-size", type=_positive_int, default=defaults["batch_size"],
                       help="global batch size (split across replicas)")
    group.add_argument("--warmup-steps", type=_positive_int, default=defaults["warmup_steps"])
    group.add_argument("--lr-scale", type=float, default=defaults["lr_scale"],
                       help="factor on the warmup schedule")
    group.add_argument("--seed", type=int, default=0, help="makes the run deterministic")
    group.add_argument("--checkpoint-every", type=_positive_int, default=defaults["checkpoint_every"])
    group.add_argument("--log-every", type=_positive_int, default=defaults["log_every"],
                       help="TensorBoard logging interval in steps")
    group.add_argument("--strategy", choices=("default", "mirrored", "multiworker"), default="default",
                       help="tf.distribute strategy; multiworker reads TF_CONFIG")
    group.add_argument("--no-bos", action="store_true", help="do not start sequences with <s>")
    group.add_argument("--no-eos", action="store_true", help="do not end sequences with </s>")
    group.add_argument("--quiet", action="store_true", help="no progress bar")


def _train_config(args, **overrides):
    from keras_posenc.train import TrainConfig

    config = TrainConfig(
        corpus=getattr(args, "corpus", None), out=args.out, corpus_format=getattr(args, "format", "text"),
        skip_bad_lines=getattr(args, "skip_bad_lines", False), vocab_size=args.vocab_size,
        max_length=args.max_length, add_bos=not args.no_bos, add_eos=not args.no_eos, steps=args.steps,
        batch_size=args.batch_size, num_layers=args.num_layers, d_model=args.d_model,
        num_heads=args.num_heads, dff=args.dff, dropout=args.dropout, norm_first=args.norm_first,
        position=args.position, table=args.table, warmup_steps=args.warmup_steps, lr_scale=args.lr_scale,
        seed=args.seed, checkpoint_every=args.checkpoint_every, log_every=args.log_every,
        resume=getattr(args, "resume", False), strategy=args.strategy, verbose=0 if args.quiet else 1)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _print_summary(report, out):
    print(f"steps: {report['steps']}  final train loss: {report['final_train_loss']}")
    print(f"eval loss: {report['eval_loss']:.4f} (perplexity {report['eval_perplexity']:.1f})")
    print(f"unigram baseline on the same eval split: {report['unigram_eval_loss']:.4f} "
          f"(perplexity {report['unigram_eval_perplexity']:.1f})")
    if report["tokens_per_second"]:
        print(f"throughput: {report['tokens_per_second']:.0f} tokens/s")
    print("artifacts:")
    for name in ("model.keras", "spm.model", "report.json", "loss.png", "logs", "checkpoints"):
        print(f"  {os.path.join(out, name)}")


# demo ---------------------------------------------------------------------------------------
def _add_demo_parser(subparsers):
    parser = subparsers.add_parser(
        "demo", help="train a small LM on the embedded corpus (a few minutes on a CPU)",
        description="Trains a small causal LM on the embedded English corpus and writes the model, "
                    "tokenizer, report and loss plot.")
    parser.add_argument("--out", default=DEMO_OUT, help=f"output folder (default {DEMO_OUT})")
    parser.add_argument("--steps", type=_positive_int, default=DEMO_SETTINGS["steps"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _run_demo(args):
    from keras_posenc.train import TrainConfig, train

    settings = dict(DEMO_SETTINGS, steps=args.steps)
    config = TrainConfig(corpus=None, out=args.out, seed=args.seed, verbose=0 if args.quiet else 1,
                         **settings)
    print(f"Training a causal LM on the embedded corpus for {config.steps} steps; writing to {args.out}")
    report = train(config)
    _print_summary(report, args.out)
    print("Exporting the demo model to TFLite (float32, GPU-friendly):")
    return _run_export(argparse.Namespace(
        model=os.path.join(args.out, "model.keras"), out=os.path.join(args.out, "model.tflite"),
        sequence_length=DEMO_SETTINGS["max_length"], batch_size=1, quantize=None, target="gpu",
        require_gpu=True, tolerance=None, token_ids=None))


# train --------------------------------------------------------------------------------------
def _add_train_parser(subparsers):
    from keras_posenc.train import TrainConfig

    defaults = {f.name: f.default for f in __import__("dataclasses").fields(TrainConfig)}
    parser = subparsers.add_parser(
        "train", help="train a causal LM on a text or TSV corpus",
        description="Trains a causal next-token LM. A TSV corpus (source<TAB>target) is trained as "
                    "'source <sep> target' with language ids 0/1 and a position scale per language.")
    parser.add_argument("--corpus", help="corpus file (default: the embedded English corpus)")
    parser.add_argument("--format", choices=("text", "tsv"), default="text",
                        help="text: one document or sentence per line; tsv: source<TAB>target")
    parser.add_argument("--skip-bad-lines", action="store_true", help="skip TSV lines without one tab")
    parser.add_argument("--out", default=defaults["out"], help="output folder")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    _add_model_flags(parser, defaults)
    _add_training_flags(parser, defaults)


def _run_train(args):
    from keras_posenc.train import train

    if args.format == "tsv" and args.corpus is None:
        raise _Error("--format tsv needs --corpus PATH (the embedded corpus is plain text).")
    report = train(_train_config(args))
    _print_summary(report, args.out)
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
                        help="probe sentence (repeatable; default: sentences of the embedded corpus)")


def _run_inspect(args):
    from keras_posenc import diagnostics

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


def _add_ablate_parser(subparsers):
    from keras_posenc.ablation import VARIANTS

    parser = subparsers.add_parser(
        "ablate", help="position-encoding ablation and length extrapolation (article 000 §4.2)",
        description="Trains the same causal LM with every position variant and several seeds, "
                    "evaluates held-out loss at the training length and at 2x and 4x, and writes "
                    "ablation.md, ablation.json, loss_curves.png, extrapolation.png and "
                    "attention_focus.png. The default run takes about 10 minutes on 2 CPU cores; "
                    "--quick trains a tiny model for a few steps (seconds; for tests).")
    parser.add_argument("--corpus", help="plain-text corpus (default: the embedded English corpus)")
    parser.add_argument("--steps", type=_positive_int, help="optimizer steps per run")
    parser.add_argument("--seeds", type=_positive_int, help="number of seeds (0, 1, ..., N-1)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), help="subset of the variants")
    parser.add_argument("--out", default=ABLATE_OUT, help=f"output folder (default {ABLATE_OUT})")
    parser.add_argument("--quick", action="store_true", help="tiny model, 4 steps, 2 seeds")
    parser.add_argument("--no-causal-mask", action="store_true",
                        help="train the unmasked encoder of article 000 on next-token targets "
                             "(the target is visible in the input: a copy task that needs positions)")


def _run_ablate(args):
    import dataclasses

    from keras_posenc import ablation

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
    command = " ".join(["keras-posenc ablate"]
                       + (["--quick"] if args.quick else [])
                       + ([f"--corpus {args.corpus}"] if args.corpus else [])
                       + ([f"--steps {args.steps}"] if args.steps else [])
                       + ([f"--seeds {args.seeds}"] if args.seeds else [])
                       + ([f"--variants {' '.join(args.variants)}"] if args.variants else [])
                       + (["--no-causal-mask"] if args.no_causal_mask else [])
                       + [f"--out {args.out}"])
    print(f"Ablation: {len(config.variants)} variants x {len(config.seeds)} seeds, {config.steps} steps "
          f"each; writing to {args.out}")
    results = ablation.run_ablation(args.corpus, config)
    paths = ablation.write_report(results, args.out, command=command)
    print(ablation.markdown_table(results))
    print(f"total time: {results['elapsed_seconds']} s")
    print("artifacts:")
    for path in paths.values():
        print(f"  {path}")
    return 0


# export -------------------------------------------------------------------------------------
# Parity that `export` requires, per quantize mode (None: report only).
EXPORT_TOLERANCE = {None: 1e-4, "float16": 2e-2, "dynamic_int8": None}


def _add_export_parser(subparsers):
    parser = subparsers.add_parser(
        "export", help="convert a trained model to TFLite for edge GPUs (builtin ops only)",
        description="Rebuilds the model with fixed input shapes under float32, freezes the position "
                    "tables as constants, converts with TFLite builtin ops only (never Flex) and prints "
                    "the op histogram, the GPU-delegate verdict, the parity against Keras on a real "
                    "token batch and the file size against the weight bytes. Exit status 1 when the "
                    "parity exceeds the tolerance or, with --require-gpu, when the target's GPU backend "
                    "does not run every op. export/README.md takes the file to a Jetson.")
    parser.add_argument("model", help="trained model (.keras, .h5 or SavedModel folder)")
    parser.add_argument("--out", required=True,
                        help="output .tflite file (FILE.json with its input shapes is written beside)")
    parser.add_argument("--sequence-length", type=_positive_int, required=True,
                        help="fixed input length, at most the model's max_length")
    parser.add_argument("--batch-size", type=_positive_int, default=1,
                        help="fixed batch (1 for the GPU delegate)")
    parser.add_argument("--quantize", choices=("float16", "dynamic_int8"),
                        help="float16 weights (GPU) or int8 dynamic-range weights (CPU)")
    parser.add_argument("--target", choices=("gpu", "gl", "cpu", "tensorrt"), default="gpu",
                        help="gpu: LiteRT GPU accelerator / OpenCL delegate; gl: OpenGL ES delegate (float "
                             "inputs); cpu: XNNPACK with GATHER; tensorrt: ONNX for trtexec (default gpu)")
    parser.add_argument("--require-gpu", action="store_true",
                        help="fail when the GPU delegate would reject an op")
    parser.add_argument("--tolerance", type=float,
                        help="max abs parity on real tokens (default 1e-4; float16 2e-2; int8 report only)")
    parser.add_argument("--token-ids", help="int .npy [n, sequence-length] for the parity check (default: "
                                            "corpus sentences tokenized with spm.model beside the model, "
                                            "else a synthetic padded batch)")


def _export_parity_batch(args, model):
    import numpy as np

    from keras_posenc import export

    rows = 4 * args.batch_size
    spm_path = os.path.join(os.path.dirname(os.path.abspath(args.model)), "spm.model")
    if args.token_ids:
        token_ids = np.load(args.token_ids)
        if token_ids.ndim != 2 or token_ids.shape[1] != args.sequence_length:
            raise _Error(f"--token-ids must hold an int array [n, {args.sequence_length}], "
                         f"got shape {token_ids.shape}.")
    elif os.path.isfile(spm_path):
        from keras_posenc import data as data_lib
        from keras_posenc.diagnostics import probe_batch

        with open(spm_path, "rb") as f:
            sp_model = f.read()
        texts = data_lib.read_text_corpus(data_lib.default_corpus_path())[:rows]
        token_ids, _ = probe_batch(sp_model, texts, args.sequence_length)
        token_ids = token_ids.numpy()[:, :args.sequence_length]
        token_ids = np.pad(token_ids, ((0, 0), (0, args.sequence_length - token_ids.shape[1])),
                           constant_values=data_lib.PAD_ID)
    else:
        return export.sample_token_batch(model, args.sequence_length, rows=rows)
    _, languages = export.sample_token_batch(model, args.sequence_length, rows=len(token_ids))
    return token_ids.astype(np.int32), None if languages is None else np.zeros_like(languages)


def _run_export(args):
    import json

    from keras_posenc import export, models  # noqa: F401  models registers CausalLM for loading

    model = export.load_model(args.model)
    quantize = args.quantize
    token_ids, language_ids = _export_parity_batch(args, model)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.target == "tensorrt":
        flat = export.to_onnx(model, sequence_length=args.sequence_length, batch_size=args.batch_size)
        parity = export.check_onnx_parity(model, flat, token_ids, language_ids)
        report = {"parity": parity, "verdicts": {}}
        lines = [f"ONNX opset {export.ONNX_OPSET}, static shapes, int32 ids "
                 f"(trtexec --onnx={args.out} --fp16)",
                 f"Parity onnxruntime vs Keras: max abs diff {parity:.3g} on real tokens"]
    else:
        flat = export.to_tflite(model, sequence_length=args.sequence_length, target=args.target,
                                batch_size=args.batch_size, quantize=quantize)
        report = export.export_report(model, flat, token_ids, language_ids, target=args.target)
        lines = export.format_report(report)
    with open(args.out, "wb") as f:
        f.write(flat)
    with open(args.out + ".json", "w") as f:
        json.dump(export.runtime_metadata(model, args.sequence_length, args.batch_size, quantize=quantize,
                                          target=args.target), f, indent=1)
    print(f"Wrote {args.out} ({len(flat)} bytes, target {args.target}, quantize={quantize or 'none'}, "
          f"batch {args.batch_size} x length {args.sequence_length}) and {args.out}.json")
    for line in lines:
        print(line)
    status = 0
    tolerance = args.tolerance if args.tolerance is not None else EXPORT_TOLERANCE[quantize]
    if tolerance is not None and not report["parity"] <= tolerance:
        print(f"FAILED: parity {report['parity']:.3g} exceeds the tolerance {tolerance:g}.")
        status = 1
    backend = export.TARGET_BACKENDS[args.target][0] if report["verdicts"] else None
    if args.require_gpu and backend and report["verdicts"][backend]:
        print(f"FAILED: --require-gpu and {export.BACKENDS[backend]} does not run "
              + ", ".join(report["verdicts"][backend]))
        status = 1
    return status


_SUBCOMMANDS = {
    "demo": (_add_demo_parser, _run_demo),
    "train": (_add_train_parser, _run_train),
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
    >>> args.command, args.steps, args.position, args.format
    ('train', 5, 'learned', 'text')
    """
    parser = argparse.ArgumentParser(prog="keras-posenc", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_parser, _ in _SUBCOMMANDS.values():
        add_parser(subparsers)
    return parser


def main(argv=None):
    """Runs `keras-posenc` with `argv` (default: the process arguments); returns the exit code.

    User errors (`ValueError`, `OSError`, a bad flag combination) are
    printed to stderr as `keras-posenc: error: ...` and give status 2;
    argparse errors exit with status 2 through `SystemExit`.

    Args:
        argv: list of str, the arguments after the program name (None:
            `sys.argv[1:]`).

    Returns:
        int, the exit status: 0 success, 1 failed export check, 2 error.

    Example:

    >>> main(["train", "--format", "tsv"])  # the embedded corpus is not TSV; message on stderr
    2
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _SUBCOMMANDS[args.command][1](args)
    except (_Error, ValueError, OSError) as err:
        print(f"keras-posenc: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
