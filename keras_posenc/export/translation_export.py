"""The translator kind: a `Seq2SeqTransformer`'s encode/decode files, checked against `translate`.

`build_translation` is the translator's part of the one export pass (`pipeline.export`,
`export_translation`): convert the `encode` and `decode` signatures for the target
(`translator`), run the package's greedy search over the files on check sources against
`Seq2SeqTransformer.translate` (same ids) and the model's teacher-forced logits (parity), and
gather what `export/jetson/run_translate.py` reads. A quantized file is also measured against
the float32 file of the same target: the share of steps where it picks float32's token, fed
float32's tokens, and with a scorer (the app passes sacrebleu on the run's dev split) the BLEU
and chrF of both files' greedy translations; `ExportResult.failures` refuses a drop of BLEU
over `max_bleu_drop`.
"""

import numpy as np

from keras_posenc import special_ids
from keras_posenc.export.contract import translate_signatures
from keras_posenc.export.kinds import TRANSLATE
from keras_posenc.export.quantization import interpreter_for, recipe_for
from keras_posenc.export.result import Built
from keras_posenc.export.runners import TranslatorSession, recording
from keras_posenc.export.targets import ONNX, TARGETS, TFLITE, target_of
from keras_posenc.export.translator import (
    TRANSLATOR_TARGETS,
    cache_bytes,
    to_onnx_translator,
    to_tflite_translator,
    translate_with,
)
from keras_posenc.export.verdicts import gpu_incompatible_ops, verdict_line
from keras_posenc.seq2seq import DEFAULT_LENGTH_PENALTY

__all__ = ["DEFAULT_BEAM_ROWS", "DEFAULT_MAX_BLEU_DROP", "beam_rows_of", "build_translation", "check_beams",
           "check_translation", "translation_metadata", "translation_quality"]

# The largest BLEU a quantized translator may lose against the float32 file of its target.
DEFAULT_MAX_BLEU_DROP = 1.0
# `decode_beams`' rows by default on the CPU targets: translate's default beam of 4 in one call (more
# rows, for several sentences in lockstep, cost about as much per row on a CPU: benchmarks/RESULTS.md).
DEFAULT_BEAM_ROWS = 4
# The beam size the export checks `decode_beams` with (translate's default; rows past it padded).
CHECKED_BEAM = 4


def check_translation(model, source_length, cache_length, target):
    """The `Target` of a translator export of `model`, or a ValueError naming the argument and value."""
    if not hasattr(model, "cached_layers") or not hasattr(model, "translate"):
        raise ValueError("A translator export (--translate) needs a keras_posenc Seq2SeqTransformer "
                         f"(`keras-posenc train --task translate`), got {type(model).__name__}.")
    if not (isinstance(target, str) and target in TRANSLATOR_TARGETS) and \
            target not in [TARGETS[name] for name in TRANSLATOR_TARGETS]:
        raise ValueError(f"A translator export supports target in {TRANSLATOR_TARGETS}, got "
                         f"target={target!r}.")
    target = target_of(target)
    for name, value in (("source_length", source_length), ("cache_length", cache_length)):
        if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= model.max_length:
            raise ValueError(f"`{name}` must be an int in [2, max_length={model.max_length}], got "
                             f"{name}={value!r}.")
        if target.max_cache_length is not None and value > target.max_cache_length:
            raise ValueError(f"target={target.name!r} takes `{name}` up to {target.max_cache_length} (the "
                             f"GPU compares positions as float16 integers), got {name}={value}.")
    return target


def translation_metadata(model, *, source_length, cache_length, target):
    """What the device kit (`run_translate.py`) reads from `FILE.json`: lengths, ids, shapes."""
    head_dim = model.d_model // model.num_heads
    return {"kind": TRANSLATE.contract_kind, "target": target.name, "accelerators": list(target.runs_on),
            "input_dtype": target.input_dtype, "embedding": "graph", "vocab_size": model.vocab_size,
            "num_layers": model.num_layers, "pad_id": model.pad_id, "bos_id": model.bos_id,
            "eos_id": model.eos_id, "unk_id": special_ids.UNK_ID,
            "special_ids": list(range(special_ids.NUM_RESERVED_IDS)), "source_length": source_length,
            "cache_length": cache_length, "cache_shape": [1, cache_length, model.num_heads, head_dim],
            "cross_shape": [1, source_length, model.num_heads, head_dim],
            "cache_bytes": cache_bytes(model, cache_length), "length_penalty": DEFAULT_LENGTH_PENALTY}


def _ids(model, session, row, max_new_tokens, **kwargs):
    return translate_with(session, row, bos_id=model.bos_id, eos_id=model.eos_id, pad_id=model.pad_id,
                          max_new_tokens=max_new_tokens, **kwargs)


def check_parity(model, session, sources, max_new_tokens):
    """`(same_ids, max_abs_logit_diff, tokens_checked)` of the files' greedy runs against `translate`.

    The logits are compared with the model's teacher-forced `decode` over `<s>` and `translate`'s
    tokens, at every step that chose one.
    """
    same, worst, tokens = True, 0.0, 0
    for row in sources:
        keras_ids = model.translate(np.array([row], np.int32), max_new_tokens, beam_size=1).ids[0].tolist()
        file_ids = _ids(model, session, row, max_new_tokens).ids[0].tolist()
        same = same and keras_ids == file_ids
        fed, logits = (keras_ids or [model.eos_id]), []
        _ids(model, session, row, max_new_tokens, forced_ids=fed, logits=logits)
        target = np.array([[model.bos_id] + fed[:-1]], np.int32)
        full = np.asarray(model({"source_ids": np.array([row], np.int32), "target_ids": target}))[0]
        worst = max(worst, float(np.abs(full - np.stack(logits)).max()))
        tokens += len(fed)
    return same, worst, tokens


def translation_quality(model, float_session, quantized_session, sources, max_new_tokens, score=None):
    """A quantized translator against the float32 file of the same target, greedy on `sources`.

    Returns:
        dict: `sentences`, `same_greedy_tokens` (every sentence), `generation_agreement` (share of
        steps where the quantized file, fed float32's tokens, picks float32's token), and with
        `score` (`ids lists -> {"bleu", "chrf"}`) `bleu_float`, `bleu_quantized`, `bleu_drop`,
        `chrf_float`, `chrf_quantized`.
    """
    hits, steps, same = 0, 0, True
    translations = ([], [])
    for row in sources:
        reference = _ids(model, float_session, row, max_new_tokens).ids[0].tolist()
        own = _ids(model, quantized_session, row, max_new_tokens).ids[0].tolist()
        fed = reference + [model.eos_id] if len(reference) < max_new_tokens else reference
        forced = _ids(model, quantized_session, row, max_new_tokens, forced_ids=fed)
        same = same and own == reference
        hits += sum(a == b for a, b in zip(forced, fed))
        steps += len(fed)
        translations[0].append(reference)
        translations[1].append(own)
    quality = {"sentences": len(sources), "same_greedy_tokens": bool(same),
               "generation_agreement": hits / steps}
    if score is not None:
        scores = [score(ids) for ids in translations]
        quality.update(bleu_float=scores[0]["bleu"], bleu_quantized=scores[1]["bleu"],
                       bleu_drop=scores[0]["bleu"] - scores[1]["bleu"], chrf_float=scores[0]["chrf"],
                       chrf_quantized=scores[1]["chrf"])
    return quality


def format_translation_quality(quality, max_bleu_drop):
    """The quality line of a quantized translator."""
    if quality is None:
        return "Quality: not measured."
    line = (f"Quality against float32 ({quality['sentences']} sentences, greedy): same tokens on every "
            f"sentence: {quality['same_greedy_tokens']}, fed float32's tokens it picks them at "
            f"{quality['generation_agreement']:.1%} of the steps")
    if "bleu_drop" in quality:
        line += (f"; BLEU {quality['bleu_float']:.2f} -> {quality['bleu_quantized']:.2f} (limit: a drop of "
                 f"{max_bleu_drop:g}), chrF {quality['chrf_float']:.2f} -> {quality['chrf_quantized']:.2f}")
    return line + "."


def default_sources(model, source_length, count=3):
    """Check sources of ordinary ids (after the reserved ones), each ending in `eos_id`."""
    ordinary = list(range(special_ids.NUM_RESERVED_IDS, model.vocab_size)) or [model.eos_id]
    lengths = [max(1, min(source_length - 1, n)) for n in (3, 7, source_length - 1)][:count]
    return [[ordinary[(7 * row + 13 * i) % len(ordinary)] for i in range(n)] + [model.eos_id]
            for row, n in enumerate(lengths)]


def _files(model, target, source_length, cache_length, beam_rows, recipe, litert_python, interpreter,
           calibration=None):
    """`(models, session)`: the files' contents in file order and a session of their signatures."""
    options = dict(source_length=source_length, cache_length=cache_length, recipe=recipe, beam_rows=beam_rows)
    if target.file_format is TFLITE:
        flat = to_tflite_translator(model, target=target, litert_python=litert_python, **options)
        if isinstance(flat, tuple):  # gl: one file per signature
            return flat, TranslatorSession(flat, TFLITE, interpreter)
        return (flat,), TranslatorSession((flat,) * (3 if beam_rows else 2), TFLITE, interpreter)
    protos = to_onnx_translator(model, calibration=calibration, **options)
    return tuple(protos), TranslatorSession(protos, ONNX)


def _onnx_calibration(session, model, sources, max_new_tokens):
    """`{signature: [feeds]}` of the float32 files' greedy runs over `sources` (ONNX int8), and with
    `decode_beams` their beam searches, `max_new_tokens` steps at most (the longest the files allow:
    a beam search of one step never calls `decode_beams`)."""
    with recording(session) as calls:
        for row in sources:
            _ids(model, session, row, max_new_tokens)
            if session.beam_rows:
                _ids(model, session, row, max_new_tokens, beam_size=session.beam_rows)
    return dict(calls)


def check_beams(model, session, sources, max_new_tokens):
    """Whether the files' beam search over `decode_beams` gives `translate`'s ids with translate's
    beam size (at most the rows), on every source."""
    beam = min(CHECKED_BEAM, session.beam_rows)
    return all(_ids(model, session, row, max_new_tokens, beam_size=beam).ids[0].tolist()
               == model.translate(np.array([row], np.int32), max_new_tokens, beam_size=beam).ids[0].tolist()
               for row in sources)


def build_translation(model, *, target, precision, litert_python=None, source_length, cache_length,
                      check_sources=None, quality_sources=None, score=None, max_new_tokens=None,
                      max_bleu_drop=DEFAULT_MAX_BLEU_DROP, beam_rows=None):
    """The translator export of `model`, checked: a `Built` for the pass (arguments as
    `pipeline.export_translation`)."""
    target = check_translation(model, source_length, cache_length, target)
    recipe = recipe_for(target, precision, TRANSLATE, litert_python=litert_python)
    beam_rows = beam_rows_of(target, beam_rows)
    limit = min(cache_length, model.max_length - 1)
    max_new_tokens = limit if max_new_tokens is None else max_new_tokens
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or \
            not 1 <= max_new_tokens <= limit:
        raise ValueError(f"`max_new_tokens` must be an int in [1, {limit}] (the cache length and the model's "
                         f"max_length - 1), got max_new_tokens={max_new_tokens!r}.")
    sources = [list(row)[:source_length] for row in (check_sources or default_sources(model, source_length))]
    quality, same_beams = None, None
    files = dict(target=target, source_length=source_length, cache_length=cache_length, beam_rows=beam_rows,
                 litert_python=litert_python)
    with interpreter_for(recipe, litert_python) as interpreter:
        float_files = None
        calibration = None
        if recipe is not None:
            float_files = _files(model, recipe=None, interpreter=interpreter, **files)
            if target.file_format is ONNX and recipe.precision == "int8":
                calibration = _onnx_calibration(float_files[1], model, sources, limit)
        models, session = _files(model, recipe=recipe, interpreter=interpreter, calibration=calibration,
                                 **files)
        same, parity, tokens = check_parity(model, session, sources, max_new_tokens)
        if beam_rows and recipe is None:
            same_beams = check_beams(model, session, sources, max_new_tokens)
        if recipe is not None:
            quality = translation_quality(model, float_files[1], session, list(quality_sources or sources),
                                          max_new_tokens, score)
    signatures = translate_signatures(beam_rows)
    metadata = translation_metadata(model, source_length=source_length, cache_length=cache_length,
                                    target=target)
    metadata["quantize"] = precision
    metadata["beam_rows"] = beam_rows
    verdicts, verdict_lines = {}, []
    if target.file_format is TFLITE:
        verdicts = {backend: sorted({op for flat in models for op in gpu_incompatible_ops(flat, backend)})
                    for backend in target.backends}
        named = list(zip(signatures, models))
        verdict_lines = [(f"{signature}: " if len(models) > 1 else "") + verdict_line(flat, backend)
                         for backend in target.backends for signature, flat in named]
    report = {"same_tokens": same, "parity": parity, "tokens_checked": tokens, "verdicts": verdicts,
              "max_bleu_drop": max_bleu_drop, "same_beam_tokens": same_beams}
    lines = verdict_lines + [f"Greedy parity over {tokens} tokens of {len(sources)} sources: "
                             f"{'same tokens as' if same else 'TOKENS DIFFER from'} "
                             f"Seq2SeqTransformer.translate, max abs logit diff {parity:.3g}"]
    if same_beams is not None:
        beam = min(CHECKED_BEAM, beam_rows)
        lines.append(f"Beam search of {beam} over decode_beams ({beam_rows} rows): "
                     f"{'same tokens as' if same_beams else 'TOKENS DIFFER from'} "
                     f"translate(beam_size={beam})")
    description = (f"target {target.name}: encode [1, {source_length}], decode [1, 1]"
                   + (f" and [{beam_rows}, 1] (decode_beams)" if beam_rows else "")
                   + f", cache {cache_length} slots = {metadata['cache_bytes']} bytes"
                   + (f", {precision} weights" if precision else ""))
    return Built(target.name, precision, "graph", models, report, lines, metadata, description, None,
                 kind=TRANSLATE, signatures=signatures, recipe=recipe, quality=quality,
                 format_quality=lambda quality, _: format_translation_quality(quality, max_bleu_drop))


def beam_rows_of(target, beam_rows):
    """The rows of a target's `decode_beams`: `beam_rows` checked, or the default (translate's beam
    size on `cpu` and `tensorrt`; none on the batch-1 GPU targets)."""
    if beam_rows is None:
        return 0 if target.shader_generation else DEFAULT_BEAM_ROWS
    if isinstance(beam_rows, bool) or not isinstance(beam_rows, int) or beam_rows < 0 or beam_rows == 1:
        raise ValueError(f"`beam_rows` must be 0 (no decode_beams) or an int >= 2, got "
                         f"beam_rows={beam_rows!r}.")
    if beam_rows and target.shader_generation:
        raise ValueError(f"`beam_rows` is for the cpu and tensorrt targets (the GPU files are batch 1), got "
                         f"beam_rows={beam_rows} with target={target.name!r}.")
    return beam_rows
