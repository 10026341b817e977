"""`keras-posenc export MODEL --translate`: a translation run's model as encode and cached decode files.

The files (`export.export_translation`) are what `export/jetson/run_translate.py` runs. They are
checked on the run's own dev sentences where the run folder has them: greedy tokens equal to
`Seq2SeqTransformer.translate`'s and the logits' parity; a quantized file is also scored against
the float32 file in BLEU and chrF (sacrebleu) on the run's dev pairs (`--eval-corpus TSV`
instead), and fails past `--max-bleu-drop`.
"""

from keras_posenc.app import run_folder
from keras_posenc.app.cli_flags import CommandError
from keras_posenc.special_ids import NUM_RESERVED_IDS

__all__ = ["CHECK_SENTENCES", "export_translator"]

# Dev sentences whose greedy translations the float32 check compares with Keras's.
CHECK_SENTENCES = 8


def _refusals(args):
    given = [flag for flag, value in (
        ("--generate", args.generate), ("--sequence-length", args.sequence_length),
        ("--token-ids", args.token_ids), ("--embedding", args.embedding), ("--spm", args.spm),
        ("--probe-prompt", args.probe_prompts), ("--prompt-length", args.prompt_length)) if value]
    if args.batch_size != 1:
        given.append("--batch-size")
    if given:
        raise CommandError(f"--translate exports batch 1 encode/decode files and takes no "
                           f"{', '.join(given)}.")
    if args.eval_corpus is not None and args.quantize is None:
        raise CommandError("--eval-corpus measures a quantized file: it needs --quantize.")


def _dev_set(args, source_length):
    """`(check sources, quality sources, score)` from the run's dev pairs; `(None, None, None)` without
    them."""
    import sentencepiece as spm

    from keras_posenc.app import translation
    from keras_posenc.app.translation_data import source_ids

    sp_model = run_folder.read_tokenizer(args.model)
    if sp_model is None:
        if args.eval_corpus is not None:
            raise CommandError(f"--eval-corpus needs the run's {run_folder.TOKENIZER_FILE} beside the model.")
        return None, None, None
    try:
        pairs = run_folder.dev_pairs(args.model, args.eval_corpus)
    except ValueError as error:
        raise CommandError(str(error)) from error
    if not pairs:
        return None, None, None
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    pairs = pairs[:args.dev_sentences]
    rows = [row.tolist() for row in source_ids(processor, [source for source, _ in pairs], source_length)]
    references = [reference for _, reference in pairs]

    def score(translations):
        texts = [processor.decode([int(t) for t in ids if t >= NUM_RESERVED_IDS]) for ids in translations]
        return translation.corpus_scores(texts, references)

    return rows[:CHECK_SENTENCES], rows, score


def export_translator(args, save_and_print):
    """`export --translate`: `export.export_translation`, saved and printed by `save_and_print`
    (`cli_export`'s printer); the exit status.

    Raises:
        CommandError: flags that do not go together, a model that is no translator, a length the
            model refuses, or a precision the target's runtime cannot run.
    """
    from keras_posenc import export

    _refusals(args)
    target = args.target or export.DEFAULT_TARGET
    export.recipe_for(target, args.quantize, "translate", litert_python=args.litert_python)
    model = export.load_model(args.model, translator=True)
    source_length = args.source_length or model.max_length
    cache_length = args.cache_length or model.max_length - 1  # translate's longest output, `</s>` included
    check_sources, quality_sources, score = _dev_set(args, source_length)
    result = export.export_translation(
        model, source_length=source_length, cache_length=cache_length, target=target, quantize=args.quantize,
        check_sources=check_sources, quality_sources=quality_sources if args.quantize else None,
        score=score if args.quantize else None, max_bleu_drop=args.max_bleu_drop, beam_rows=args.beam_rows,
        litert_python=args.litert_python)
    return save_and_print(result, args.out, tolerance=args.tolerance)
