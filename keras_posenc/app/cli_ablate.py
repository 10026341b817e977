"""The `keras-posenc ablate` command: the position-encoding ablation, or seed 002's translation claims.

`--task lm` (default) runs `ablation.run_ablation` (every position variant,
several seeds, length extrapolation); `--task translate` runs
`translation_ablation.run_translation_ablation` on the corpus of
`make corpus`. Both write their report into one folder under its lock and
print their table.

Example: an ablation trains for minutes to hours, so it is exercised by
`tests/test_ablation.py` and `tests/test_translation_ablation.py` (with
stand-ins: `tests/test_cli_arguments.py`)::

    keras-posenc ablate --quick
    keras-posenc ablate --task translate --arms rope sinusoidal --seeds 1
"""

import os

from keras_posenc.app.cli_flags import CommandError, positive_int

__all__ = ["ABLATE_OUT", "ABLATE_TRANSLATE_OUT", "TRANSLATION_CORPUS_DIR", "add_ablate_parser", "run_ablate"]

ABLATE_OUT = os.path.join("runs", "ablation")
ABLATE_TRANSLATE_OUT = os.path.join("runs", "ablation-translate")
TRANSLATION_CORPUS_DIR = os.path.join(".cache", "corpus", "debian_po_en_de")
_LM_ONLY_ABLATE_FLAGS = (("corpus", "--corpus"), ("variants", "--variants"),
                         ("no_causal_mask", "--no-causal-mask"))


def add_ablate_parser(subparsers):
    """Adds `ablate` and its flags (the defaults of both tasks' configs) to `subparsers`."""
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
    parser.add_argument("--steps", type=positive_int,
                        help=f"optimizer steps per run (default: {full.steps}, --task translate "
                             f"{translate_full.steps}; --quick {quick.steps}, --task translate "
                             f"{translate_quick.steps})")
    parser.add_argument("--seeds", type=positive_int, help=f"number of seeds 0, 1, ..., N-1 (default: "
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


def run_ablate(args):
    """`keras-posenc ablate`: runs the task's ablation, writes its report, prints its table; status 0.

    Raises:
        CommandError: a flag of the other task.
    """
    if args.task == "translate":
        return _run_translation_ablation(args)
    if args.arms:
        raise CommandError("--arms is for --task translate.")
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
            raise CommandError(f"{flag} is for --task lm; --task translate reads --corpus-dir.")
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
