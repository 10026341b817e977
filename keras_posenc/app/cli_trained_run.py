"""The `keras-posenc` commands that read a trained run: `generate`, `translate` and `inspect`.

Each takes a run folder of `keras-posenc train` (or the `.keras` file in
it) and prints what its library function returns: `generate` a continued
prompt (`text_generation`), `translate` translations and their scores
(`translation`), `inspect` the position-embedding diagnostics
(`diagnostics`). The work is imported when the command runs, so `--help`
shows before TensorFlow loads.

Example: the commands need a trained run, so they are exercised by
`tests/test_cli_generate.py`, `tests/test_translate.py` and
`tests/test_cli.py`::

    keras-posenc generate runs/lm --prompt "The module" --max-new-tokens 20
    keras-posenc translate runs/mt --input test.en --output test.hyp --reference test.de
    keras-posenc inspect runs/lm/model.keras
"""

import os
import sys

from keras_posenc.app.cli_flags import add_run_argument, nonnegative_float, positive_int

__all__ = ["add_generate_parser", "add_inspect_parser", "add_translate_parser", "print_generation",
           "run_generate", "run_inspect", "run_translate"]


def print_generation(run, prompt, spm=None, as_json=False, **generation):
    """Prints the continuation of `prompt` by the run `run` (`text_generation.generate_text`).

    Args:
        run: str, a run folder or the `.keras` file in it.
        prompt: str, the text to continue.
        spm: optional str, the SentencePiece model (default: `spm.model` beside the model).
        as_json: bool, print one JSON object instead of the text and its timing.
        **generation: the keyword arguments of `text_generation.generate_text`.
    """
    from keras_posenc.app import text_generation

    model, sp_model = text_generation.load_run(run, spm)
    result = text_generation.generate_text(model, sp_model, prompt, **generation)
    print(text_generation.format_result(prompt, result, as_json=as_json))


def add_generate_parser(subparsers):
    """Adds `generate` and its flags to `subparsers`."""
    from keras_posenc.generation import SAMPLERS

    parser = subparsers.add_parser(
        "generate", help="generate text from a trained model (KV cache)",
        description="Continues a prompt with a model trained by `keras-posenc train`, using the run's "
                    "SentencePiece tokenizer: one prefill, then one cached decode step per token. Prints "
                    "the text, then the time to first token and the decode tokens/s.")
    add_run_argument(parser)
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=positive_int, default=32,
                        help="tokens to generate (default: %(default)s)")
    parser.add_argument("--sampler", choices=SAMPLERS, default="greedy", help="(default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    parser.add_argument("--top-k", type=positive_int, default=None, dest="k",
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


def run_generate(args):
    """`keras-posenc generate`: prints the continuation of `--prompt`; the exit status (0)."""
    print_generation(args.run, args.prompt, spm=args.spm, as_json=args.json,
                     max_new_tokens=args.max_new_tokens, sampler=args.sampler, temperature=args.temperature,
                     k=args.k, p=args.p, seed=args.seed, language_ids=args.language_ids)
    return 0


def add_translate_parser(subparsers):
    """Adds `translate` and its flags to `subparsers`."""
    parser = subparsers.add_parser(
        "translate", help="translate sentences with a trained run (beam search); BLEU/chrF with --reference",
        description="Translates one sentence per line with a run of `keras-posenc train --task translate` "
                    "(or a decoder-only run trained with --format tsv, which continues '<s> source <sep>'): "
                    "batched beam search over a key/value cache, GNMT's length penalty; beam 1 is greedy. "
                    "With --reference, prints sacrebleu's BLEU and chrF and their signatures. Translations "
                    "go to --output; with --output - (stdout) the score and timing lines go to stderr.")
    add_run_argument(parser)
    parser.add_argument("--input", required=True, help="source sentences, one per line; - reads stdin")
    parser.add_argument("--output", default="-", help="translations, one per line, written atomically; "
                                                      "- is stdout (default: -)")
    parser.add_argument("--beam-size", type=positive_int, default=4, help="beams; 1 is greedy (default: 4)")
    parser.add_argument("--length-penalty", type=nonnegative_float, default=1.0, dest="alpha",
                        help="alpha of GNMT's length penalty ((5 + length) / 6) ** alpha (default: 1.0)")
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="sentences per batch, sorted by length (default: 32)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None,
                        help="target tokens at most (default: what the model's max length leaves)")
    parser.add_argument("--reference", help="reference translations, one per input line: print BLEU and chrF")
    parser.add_argument("--spm", help="SentencePiece model (default: spm.model beside the model)")
    parser.add_argument("--json", action="store_true",
                        help="print the scores and timing as one JSON object (default: off)")


def run_translate(args):
    """`keras-posenc translate`: writes the translations, prints the scores and timing; exit status 0."""
    from keras_posenc.app import translation

    result = translation.translate_file(
        args.run, args.input, args.output, reference_path=args.reference, spm_path=args.spm,
        beam_size=args.beam_size, alpha=args.alpha, batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens)
    print(translation.format_summary(result, as_json=args.json),
          file=sys.stderr if args.output == "-" else sys.stdout)
    return 0


def add_inspect_parser(subparsers):
    """Adds `inspect` and its flags to `subparsers`."""
    parser = subparsers.add_parser(
        "inspect", help="position-embedding diagnostics of a trained model",
        description="PE value-range check, PE heatmap, positional-contribution ratio and attention "
                    "focus by distance of a model saved by `train` (model.keras).")
    parser.add_argument("model", help="path of model.keras (spm.model beside it is used for text)")
    parser.add_argument("--out", help="folder for the PNGs and inspect.json (default: beside the model)")
    parser.add_argument("--text", action="append",
                        help="probe sentence, repeatable (default: sentences of the embedded corpus)")


def run_inspect(args):
    """`keras-posenc inspect`: writes the plots and `inspect.json`, prints the summary; exit status 0."""
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
