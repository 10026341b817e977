"""The `keras-posenc export` command: a trained model to TFLite, ONNX, a LiteRT-LM bundle or a genai folder.

`export_command` is a window export (fixed input length,
`export.export_and_check`), also the last step of `demo`; `--generate`
exports prefill and decode with a key/value cache (`export.export_generation`),
as a LiteRT-LM bundle (`--format litertlm`) or an onnxruntime-genai folder
(`--format genai`); `--translate` exports a translator's encode and cached
decode (`cli_export_translate`). Every form prints the files it wrote, its report and
its failed checks through one printer; the exit status is 1 when a check
fails.

Example: an export converts a model, so it is exercised by
`tests/test_export.py`, `tests/test_export_generator.py`,
`tests/test_export_litertlm.py` and `tests/test_export_genai.py` (with
stand-ins: `tests/test_cli_arguments.py`)::

    keras-posenc export runs/lm/model.keras --out runs/lm/model.tflite --sequence-length 64
    keras-posenc export runs/lm/model.keras --out runs/lm/gen.tflite --generate --cache-length 64
    keras-posenc export runs/de/model.keras --out runs/de/de.tflite --translate --target cpu
"""

import os

from keras_posenc.app import run_folder
from keras_posenc.app.cli_flags import CommandError, nonnegative_float, positive_int

__all__ = ["add_export_parser", "export_command", "run_export", "save_and_print"]


def add_export_parser(subparsers):
    """Adds `export` and its flags (window and `--generate` forms) to `subparsers`."""
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
    parser.add_argument("--sequence-length", type=positive_int,
                        help="fixed input length, at most the model's max_length (default: none; required "
                             "without --generate)")
    parser.add_argument("--batch-size", type=positive_int, default=1,
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
    parser.add_argument("--max-loss-increase", type=nonnegative_float, default=0.01,
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
    generation.add_argument("--cache-length", type=positive_int,
                            help="cache slots: prompt + generated tokens, at most max_length (default: none; "
                                 "required with --generate; --translate: the model's max_length - 1)")
    generation.add_argument("--prompt-length", type=positive_int,
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
    translation = parser.add_argument_group(
        "translation", "a Seq2SeqTransformer (train --task translate) as an `encode` signature (the "
                       "source to every decoder layer's cross-attention keys and values) and the cached "
                       "`decode` step, for export/jetson/run_translate.py (--target cpu: one file; tensorrt: "
                       "STEM.encode.onnx and STEM.decode.onnx); --cache-length: target tokens at most "
                       "(default: the model's max_length - 1, as translate)")
    translation.add_argument("--translate", action="store_true", help="export a translator (default: off)")
    translation.add_argument("--source-length", type=positive_int,
                             help="source ids per sentence (pieces and </s>), right-padded (default: the "
                                  "model's max_length)")
    translation.add_argument("--max-bleu-drop", type=nonnegative_float, default=1.0,
                             help="with --quantize: fail when the quantized file's greedy BLEU on the "
                                  "run's dev pairs (or --eval-corpus TSV) is lower than float32's by more "
                                  "than this (default: %(default)s)")
    translation.add_argument("--beam-rows", type=int, default=None,
                             help="rows of the decode_beams signature (a beam search's hypotheses in one "
                                  "call; 0: none) (default: 4, translate's beam, on cpu and tensorrt; none "
                                  "on gpu and gl, batch 1)")
    translation.add_argument("--dev-sentences", type=positive_int, default=200,
                             help="with --quantize: dev pairs both files translate (default: %(default)s)")


def export_command(model_path, out, sequence_length, *, batch_size=1, quantize=None, target=None,
                   require_gpu=False, tolerance=None, token_ids=None, embedding=None, eval_corpus=None,
                   max_loss_increase=0.01, litert_python=None):
    """`keras-posenc export` (and the end of `demo`): `export.export_and_check`, printed; the exit status.

    `target`: default `export.DEFAULT_TARGET`.
    `token_ids`: optional path of an int `.npy` `[n, sequence_length]` for the parity; default
    corpus sentences tokenized with `spm.model` beside the model, else a synthetic padded batch.
    Writes `out`, `out.json`, the contract and, with `embedding="host"`, `out.embeddings.npy`.
    With `quantize`, the held-out cross-entropy against a float32 export (`run_folder.eval_token_ids`).

    Returns:
        int, the exit status: 0, or 1 when a check fails.

    Raises:
        CommandError: an option the target or the model refuses (printed as one line).
    """
    import numpy as np

    from keras_posenc import export

    target = export.DEFAULT_TARGET if target is None else target
    model = export.load_model(model_path)
    if embedding == "host" and not export.target_of(target).host_embedding:
        raise CommandError(_host_embedding_refusal(target, lambda t: t.host_embedding))
    if token_ids is not None:
        ids = np.load(token_ids)
        if ids.ndim != 2 or ids.shape[1] != sequence_length:
            raise CommandError(
                f"--token-ids must hold an int array [n, {sequence_length}], got shape {ids.shape}.")
    else:
        ids = run_folder.corpus_token_ids(model_path, sequence_length, rows=4 * batch_size)
    if eval_corpus is not None and quantize is None:
        raise CommandError("--eval-corpus measures a quantized file: it needs --quantize.")
    export.recipe_for(target, quantize, export.WINDOW, litert_python=litert_python)  # refused before it runs
    eval_ids = (run_folder.eval_token_ids(model_path, sequence_length, eval_corpus)
               if quantize is not None else None)
    result = export.export_and_check(model, sequence_length=sequence_length, target=target,
                                     batch_size=batch_size, quantize=quantize, embedding=embedding,
                                     token_ids=ids, eval_token_ids=eval_ids,
                                     max_loss_increase=max_loss_increase, litert_python=litert_python)
    return save_and_print(result, out, tolerance=tolerance, require_gpu=require_gpu)


def save_and_print(result, out, *, tolerance=None, require_gpu=False):
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


# `--generate --format`: the export kind each value writes (`keras_posenc.export.kinds`).
GENERATE_KINDS = {"tflite": "prefill_decode", "litertlm": "litertlm", "genai": "genai"}


def run_export(args):
    """`keras-posenc export`: the window export or, with `--generate`, the generation export; the exit status.

    Raises:
        CommandError: flags that do not go together, or an option the target or the model refuses.
    """
    from keras_posenc import export

    kind = export.kind_of(GENERATE_KINDS[args.format])
    if args.translate:
        from keras_posenc.app.cli_export_translate import export_translator

        if kind is not export.PREFILL_DECODE:  # --format given: a --generate form
            raise CommandError(f"--translate writes its own files and takes no --format {args.format}.")
        return export_translator(args, save_and_print)
    given = [flag for flag, value in (("--spm", args.spm), ("--probe-prompt", args.probe_prompts)) if value]
    bundled = [name for name, bundles in GENERATE_KINDS.items() if export.kind_of(bundles).tokenizer]
    if not kind.tokenizer and given:
        raise CommandError(f"{', '.join(given)} is for --format {' or '.join(bundled)}.")
    if kind.tokenizer and not args.generate:
        raise CommandError(f"--format {args.format} is {kind.description}: add --generate --cache-length C.")
    if not kind.takes_target and args.target is not None:
        raise CommandError(f"--format {args.format} runs on {kind.own_runtime} and takes no --target, got "
                           f"--target {args.target}.")
    if kind.takes_target and args.target is None:
        args.target = export.DEFAULT_TARGET
    if args.generate:
        return _export_generator(args, kind)
    if args.sequence_length is None:
        raise CommandError("export needs --sequence-length (or --generate with --cache-length).")
    return export_command(args.model, args.out, args.sequence_length, batch_size=args.batch_size,
                          quantize=args.quantize, target=args.target, require_gpu=args.require_gpu,
                          tolerance=args.tolerance, token_ids=args.token_ids, embedding=args.embedding,
                          eval_corpus=args.eval_corpus, max_loss_increase=args.max_loss_increase,
                          litert_python=args.litert_python)


def _export_generator(args, kind):
    if args.cache_length is None:
        raise CommandError("--generate needs --cache-length C (prompt + generated tokens).")
    given = (("--sequence-length", args.sequence_length), ("--token-ids", args.token_ids))
    ignored = [flag for flag, value in given if value is not None]
    if ignored or args.batch_size != 1:
        raise CommandError("--generate exports batch 1 and takes no "
                           f"{', '.join(ignored) or '--batch-size'}.")
    if args.require_gpu:
        raise CommandError(
            "--require-gpu checks a window export's ops; the --generate graphs of gpu and gl hold "
            "GPU ops only (the shader graphs): drop --require-gpu.")
    if args.eval_corpus is not None and args.quantize is None:
        raise CommandError("--eval-corpus measures a quantized file: it needs --quantize.")
    prompt_length = args.prompt_length or max(1, args.cache_length // 2)
    return _GENERATE_COMMANDS[args.format](args, kind, prompt_length)


def _checked_model(args, kind):
    """The model of a --generate export to a target, after the refusals that need no conversion."""
    from keras_posenc import export

    export.recipe_for(args.target, args.quantize, kind, litert_python=args.litert_python)
    model = export.load_model(args.model)
    longest = export.longest_sequence(model)
    if longest is not None and args.cache_length > longest:
        raise CommandError(
            f"--cache-length {args.cache_length} exceeds the model's max_length={longest} (the "
            "cache holds the prompt and every generated token).")
    if args.embedding == "host" and not export.target_of(args.target).generation_host_embedding:
        raise CommandError(_host_embedding_refusal(args.target, lambda t: t.generation_host_embedding))
    return model


def _eval_ids(args):
    return (run_folder.eval_token_ids(args.model, args.cache_length, args.eval_corpus)
            if args.quantize is not None else None)


def _export_prefill_decode(args, kind, prompt_length):
    """`--generate` (`--format tflite`): `export.export_generation`, printed; the exit status."""
    from keras_posenc import export

    model = _checked_model(args, kind)
    eval_ids = _eval_ids(args)
    result = export.export_generation(model, prompt_length=prompt_length, cache_length=args.cache_length,
                                      target=args.target, embedding=args.embedding, quantize=args.quantize,
                                      eval_token_ids=eval_ids, max_loss_increase=args.max_loss_increase,
                                      litert_python=args.litert_python)
    return save_and_print(result, args.out, tolerance=args.tolerance)


def _sp_model(args):
    """The run's SentencePiece model that a bundle's or folder's files hold."""
    if not os.path.isfile(args.model):
        raise CommandError(f"--format {args.format} needs a .keras file with its tokenizer, got "
                           f"{args.model!r}.")
    _, spm_path = run_folder.resolve_run(args.model, args.spm)
    with open(spm_path, "rb") as f:
        return f.read()


def _probes(args):
    return [[prompt] for prompt in args.probe_prompts] if args.probe_prompts else None


def _export_litertlm(args, kind, prompt_length):
    """`--generate --format litertlm`: `export.export_litertlm`, printed; the exit status."""
    from keras_posenc import export

    if args.embedding is not None:
        raise CommandError("--format litertlm looks tokens up in the file and takes no --embedding.")
    model = _checked_model(args, kind)
    sp_model = _sp_model(args)
    try:
        result = export.export_litertlm(model, sp_model, prompt_length=prompt_length,
                                        cache_length=args.cache_length, target=args.target,
                                        probes=_probes(args), python=args.litert_python,
                                        quantize=args.quantize, eval_token_ids=_eval_ids(args),
                                        max_loss_increase=args.max_loss_increase)
    except RuntimeError as error:  # the builder's process failed: its last lines are in the message
        raise CommandError(str(error)) from error
    return save_and_print(result, args.out, tolerance=args.tolerance)


def _export_genai(args, kind, prompt_length):
    """`--generate --format genai`: `export.export_genai` into the folder `--out`, printed; exit status."""
    from keras_posenc import export
    from keras_posenc.app import dataset as data_lib

    refused = [flag for flag, value in (("--quantize", args.quantize), ("--embedding", args.embedding),
                                        ("--tolerance", args.tolerance)) if value is not None]
    if refused:
        raise CommandError(
            f"--format genai writes float32 weights with the lookup in the file, checked token for "
            f"token: it takes no {', '.join(refused)}.")
    export.check_folder(kind, args.out)  # before the model is read
    sp_model = _sp_model(args)
    model = export.load_model(args.model)
    texts = data_lib.read_text_corpus(data_lib.default_corpus_path())[:run_folder.EVAL_ROWS]
    try:
        result = export.export_genai(model, sp_model, cache_length=args.cache_length,
                                     prompt_length=prompt_length, check_texts=texts, probes=_probes(args))
    except ImportError as error:  # tokenizers: the message says how to install it
        raise CommandError(str(error)) from error
    return save_and_print(result, args.out)


# The --generate export of each --format.
_GENERATE_COMMANDS = {"tflite": _export_prefill_decode, "litertlm": _export_litertlm, "genai": _export_genai}
