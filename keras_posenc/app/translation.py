"""Text in, text out for translation: a run's model and tokenizer around beam search, scored by sacrebleu.

What `keras-posenc translate` and the dev scoring of `train --task translate`
run. Two kinds of run translate:

- a `Seq2SeqTransformer` (`train --task translate`): the source is
  `pieces </s>`, the decoder starts at `<s>` (`Seq2SeqTransformer.translate`);
- a decoder-only `CausalLM` trained on a TSV corpus (`train --format tsv`):
  it continues `<s> source <sep>` (language ids 0, then 1 for the target)
  with the same beam search, over its key/value cache.

Sentences are sorted by length and batched, so a batch pads little; the
output keeps the input's order. BLEU and chrF are sacrebleu's (its default
13a tokenization, on detokenized text), with its signature.

References:
    - Post, "A Call for Clarity in Reporting BLEU Scores", WMT 2018
      (sacrebleu), https://aclanthology.org/W18-6319/.
    - Popović, "chrF: character n-gram F-score for automatic MT
      evaluation", WMT 2015, https://aclanthology.org/W15-3049/.
"""

import json
import os
import sys
import time
import weakref

import numpy as np

from keras_posenc import models as _models  # noqa: F401  (registers CausalLM for load_model)
from keras_posenc import seq2seq as _seq2seq
from keras_posenc.app import dataset as data_lib
from keras_posenc.app.run_folder import resolve_run
from keras_posenc.app.text_generation import load_model_file
from keras_posenc.app.translation_data import pad_rows, source_ids
from keras_posenc.backend import inference_function, ops
from keras_posenc.beam_search import beam_search
from keras_posenc.positions import position_ids

__all__ = ["TranslationRun", "corpus_scores", "format_summary", "load_translator", "stderr_progress",
           "translate_file", "translate_sentences"]

_LM_STEPS = weakref.WeakKeyDictionary()

DEFAULT_LENGTH_PENALTY = _seq2seq.DEFAULT_LENGTH_PENALTY


class TranslationRun:
    """A loaded translator: `model` (a `Seq2SeqTransformer` or a TSV-trained `CausalLM`) and its tokenizer.

    Attributes:
        model: the Keras model.
        processor: a `sentencepiece.SentencePieceProcessor`.
        kind: "seq2seq" or "lm".
    """

    def __init__(self, model, sp_model):
        import sentencepiece as spm

        self.model = model
        self.sp_model = sp_model
        self.processor = spm.SentencePieceProcessor(model_proto=sp_model)
        self.kind = "seq2seq" if isinstance(model, _seq2seq.Seq2SeqTransformer) else "lm"

    @property
    def max_length(self):
        return self.model.max_length if self.kind == "seq2seq" else self.model.encoder.max_length


def load_translator(path, spm_path=None):
    """The `TranslationRun` of a run folder or `.keras` file (with `spm.model` beside it, or `spm_path`).

    Raises:
        FileNotFoundError: no model or tokenizer.
        ValueError: the file holds no translator: a text LM (trained
            without `--format tsv`) or another model.
    """
    model_path, spm_path = resolve_run(path, spm_path)
    model = load_model_file(model_path)
    with open(spm_path, "rb") as f:
        sp_model = f.read()
    if isinstance(model, _seq2seq.Seq2SeqTransformer):
        return TranslationRun(model, sp_model)
    if hasattr(model, "encoder_config") and getattr(model, "num_languages", None) == 2 and model.causal:
        return TranslationRun(model, sp_model)
    raise ValueError(f"{model_path!r} holds no translator: train one with `keras-posenc train --task "
                     f"translate` (or a decoder-only LM with --format tsv), got a {_kind_of(model)}.")


def _kind_of(model):
    """What a model that cannot translate is, in words."""
    kind = type(model).__name__
    if not hasattr(model, "encoder_config"):
        return kind
    languages = getattr(model, "num_languages", None)
    if not languages:
        return f"{kind} trained on plain text"
    if languages != 2:
        return f"{kind} of {languages} languages (a translating LM has 2: source and target)"
    return f"{kind} without the causal mask (causal=False)"


def translate_sentences(run, sentences, *, beam_size=4, alpha=DEFAULT_LENGTH_PENALTY, batch_size=32,
                        max_new_tokens=None, progress=None):
    """Translates `sentences`, in batches of similar length; returns the translations in input order.

    Args:
        run: a `TranslationRun`.
        sentences: list of str.
        beam_size: int >= 1 (1: greedy).
        alpha: float >= 0, the length penalty's exponent.
        batch_size: int >= 1, sentences per batch.
        max_new_tokens: optional int, target tokens at most (default: what
            the model's `max_length` leaves after `<s>`; a decoder-only LM:
            half its `max_length`, its sources cut to leave room for them).
        progress: optional function `progress(done, total)` called after each batch.

    Returns:
        `(translations list of str, stats dict)`: `sentences`, `tokens`
        (target tokens generated, end tokens included), `seconds`.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be an int >= 1, got batch_size={batch_size!r}.")
    sentences = list(sentences)
    if run.kind == "seq2seq":
        rows = source_ids(run.processor, sentences, run.max_length)
    else:
        max_new_tokens = max_new_tokens or run.max_length // 2
        rows = _lm_prefixes(run, sentences, max_new_tokens)
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]), i))
    outputs, tokens, start = [None] * len(rows), 0, time.perf_counter()
    for first in range(0, len(order), batch_size):
        chosen = order[first:first + batch_size]
        batch = [rows[i] for i in chosen]
        if run.kind == "seq2seq":
            result = run.model.translate(pad_rows(batch), max_new_tokens, beam_size=beam_size,
                                         alpha=alpha)
        else:
            result = _lm_search(run.model, batch, max_new_tokens, beam_size=beam_size, alpha=alpha)
        for i, ids in zip(chosen, result.ids):
            outputs[i] = run.processor.decode([int(t) for t in ids if t >= data_lib.NUM_RESERVED_IDS])
            tokens += len(ids) + 1
        if progress is not None:
            progress(min(first + batch_size, len(order)), len(order))
    return outputs, {"sentences": len(rows), "tokens": tokens, "seconds": time.perf_counter() - start}


def _lm_prefixes(run, sentences, max_new_tokens):
    """`<s> source <sep>` of every sentence, the source cut so that `max_new_tokens` fit after it.

    The cut depends on the model and `max_new_tokens` only, never on the batch: a sentence gets the
    same translation in any batch.
    """
    keep = run.max_length - 2 - max_new_tokens
    if keep < 1:
        raise ValueError(f"`max_new_tokens`={max_new_tokens} leaves no room for a source within the "
                         f"decoder-only model's max_length={run.max_length} (<s>, the source, <sep>, the "
                         "translation).")
    return [np.asarray([data_lib.BOS_ID] + list(ids[:keep]) + [data_lib.SEP_ID], np.int32)
            for ids in run.processor.encode(sentences)]


def _lm_step_function(model):
    if model not in _LM_STEPS:
        def step(ids, positions, languages, cache, index):
            logits, cache = model(ids, position_ids=positions, language_ids=languages, cache=cache,
                                  cache_index=index, training=False)
            return ops.log_softmax(logits[:, -1], axis=-1), cache

        _LM_STEPS[model] = inference_function(model, step)
    return _LM_STEPS[model]


def _lm_search(model, prefixes, max_new_tokens, *, beam_size, alpha):
    """Beam search of a decoder-only TSV LM after left-padded `<s> source <sep>` prefixes."""
    encoder = model.encoder
    prompt = pad_rows(prefixes, left=True)
    batch, prompt_length = prompt.shape
    step = _lm_step_function(model)
    real = prompt != encoder.pad_id
    positions = ops.convert_to_numpy(position_ids(real)).astype(np.int32)
    cache = ops.zeros(encoder.cache_shape(batch, prompt_length + max_new_tokens), encoder.compute_dtype)
    log_probs, cache = step(ops.convert_to_tensor(prompt), ops.convert_to_tensor(positions),
                            ops.zeros([batch, prompt_length], "int32"), cache,
                            ops.convert_to_tensor(np.int32(0)))
    state = {"cache": cache, "next": real.sum(axis=1).astype(np.int32), "slot": prompt_length}

    def run(tokens, state):
        n = len(tokens)
        log_probs, cache = step(ops.convert_to_tensor(np.asarray(tokens, np.int32).reshape(n, 1)),
                                ops.convert_to_tensor(state["next"].reshape(n, 1)), ops.ones([n, 1], "int32"),
                                state["cache"], ops.convert_to_tensor(np.int32(state["slot"])))
        return ops.convert_to_numpy(log_probs), {"cache": cache, "next": state["next"] + 1,
                                                 "slot": state["slot"] + 1}

    def reorder(state, rows):
        rows = np.asarray(rows)
        return {"cache": ops.take(state["cache"], ops.convert_to_tensor(rows.astype(np.int32)), axis=0),
                "next": state["next"][rows], "slot": state["slot"]}

    return beam_search(ops.convert_to_numpy(log_probs), state, run, reorder, beam_size=beam_size,
                       max_new_tokens=int(max_new_tokens), end_id=data_lib.EOS_ID, alpha=alpha,
                       forbidden_ids=(encoder.pad_id, data_lib.BOS_ID, data_lib.SEP_ID))


def corpus_scores(hypotheses, references):
    """sacrebleu's corpus BLEU and chrF of `hypotheses` against one reference each, with signatures.

    Args:
        hypotheses: list of str.
        references: list of str, as many.

    Returns:
        dict: `bleu`, `chrf` (floats, 0-100), `bleu_signature`,
        `chrf_signature` (sacrebleu's), `sentences`.

    Example:

    >>> scores = corpus_scores(["Die Katze sitzt auf der Matte ."], ["Die Katze sitzt auf der Matte ."])
    >>> round(scores["bleu"], 1), round(scores["chrf"], 1)
    (100.0, 100.0)
    """
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} translations but {len(references)} references: the reference "
                         "file must have one line per input line.")
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {"bleu": float(bleu_score.score), "chrf": float(chrf_score.score),
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
            "sentences": len(hypotheses)}


def stderr_progress(label="translated"):
    """A `progress(done, total)` that redraws one line on stderr (only on a terminal)."""
    start = time.perf_counter()
    interactive = sys.stderr.isatty()

    def progress(done, total):
        if not interactive:
            return
        rate = done / max(time.perf_counter() - start, 1e-9)
        end = "\n" if done == total else ""
        print(f"\r{label} {done}/{total} sentences ({rate:.1f}/s)", end=end, file=sys.stderr, flush=True)

    return progress


def _read_lines(path, what):
    """The lines of `path` (`-`: stdin) without their line ends."""
    if path == "-":
        return sys.stdin.read().splitlines()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} file at {path!r}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"the {what} file {path!r} is not UTF-8 text: {error.reason} at byte "
                         f"{error.start}") from None


def translate_file(run_path, input_path, output_path, *, reference_path=None, spm_path=None, beam_size=4,
                   alpha=1.0, batch_size=32, max_new_tokens=None):
    """What `keras-posenc translate` does: reads, checks, translates, writes, scores.

    Every input is checked before anything is written: the run, the input,
    the reference (one line per input line), and that the output is neither
    of them. Empty input lines give empty translations. The output file is
    written atomically (`-`: stdout).

    Returns:
        dict: `sentences`, `seconds`, `sentences_per_second`,
        `tokens_per_second`, `beam_size`, `length_penalty`, `model` (the
        model's class), and with a reference `bleu`, `chrf`,
        `bleu_signature`, `chrf_signature`.
    """
    from keras_posenc.files import write_text

    if output_path != "-" and os.path.abspath(output_path) in {
            os.path.abspath(p) for p in (input_path, reference_path) if p and p != "-"}:
        raise ValueError(f"--output {output_path!r} would overwrite an input: give another file")
    if input_path == "-" and reference_path == "-":
        raise ValueError("--input and --reference cannot both read stdin")
    run = load_translator(run_path, spm_path)
    lines = _read_lines(input_path, "input")
    references = _read_lines(reference_path, "reference") if reference_path else None
    if references is not None and len(references) != len(lines):
        raise ValueError(f"the reference {reference_path!r} has {len(references)} lines but the input has "
                         f"{len(lines)}: give one reference per input line")
    real = [i for i, line in enumerate(lines) if line.strip()]
    translated, stats = translate_sentences(run, [lines[i] for i in real], beam_size=beam_size, alpha=alpha,
                                            batch_size=batch_size, max_new_tokens=max_new_tokens,
                                            progress=stderr_progress())
    hypotheses = [""] * len(lines)
    for i, text in zip(real, translated):
        hypotheses[i] = text
    text = "".join(line + "\n" for line in hypotheses)
    if output_path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text(output_path, text)
    seconds = stats["seconds"]
    result = {"sentences": len(lines), "seconds": seconds,
              "sentences_per_second": stats["sentences"] / seconds if seconds else None,
              "tokens_per_second": stats["tokens"] / seconds if seconds else None,
              "beam_size": beam_size, "length_penalty": alpha, "model": type(run.model).__name__}
    if references is not None:
        result.update(corpus_scores(hypotheses, references))
    return result


def format_summary(result, as_json=False):
    """The lines `keras-posenc translate` prints after translating: scores (with a reference) and timing."""
    if as_json:
        return json.dumps(result)
    rate = result["sentences_per_second"]
    lines = []
    if "bleu" in result:
        lines.append(f"BLEU {result['bleu']:.2f}  {result['bleu_signature']}")
        lines.append(f"chrF {result['chrf']:.2f}  {result['chrf_signature']}")
    lines.append(f"translated {result['sentences']} sentences in {result['seconds']:.1f} s"
                 + (f" ({rate:.1f} sentences/s, {result['tokens_per_second']:.0f} tokens/s)" if rate else "")
                 + f", beam {result['beam_size']}, {result['model']}")
    return "\n".join(lines)
