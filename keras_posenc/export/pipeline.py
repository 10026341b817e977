"""The one export pass: every kind (`kinds`) and target (`targets`), one `ExportResult`.

`export(model, kind, target=...)` checks the options once, runs the kind's build (convert the
model for the target, check the files against Keras, cost them and gather their metadata:
`window_export`, `generation_export`, `litertlm_bundle`, `genai`, `translation_export`) and adds
what every kind shares: the quantizer's line, the quality measured against float32 and its gate
(`ExportResult.failures`), the recipe and quality in FILE.json. `export_and_check`, `export_generation`,
`export_litertlm`, `export_genai` and `export_translation` are `export` of one kind, with that kind's
arguments.
"""

from keras_posenc.export import contract
from keras_posenc.export.conversion import ONNX_OPSET
from keras_posenc.export.genai import build_genai
from keras_posenc.export.generation_export import build_generation
from keras_posenc.export.kinds import GENAI, LITERTLM, PREFILL_DECODE, TRANSLATE, WINDOW, kind_of
from keras_posenc.export.litertlm_bundle import build_litertlm
from keras_posenc.export.quality import DEFAULT_MAX_LOSS_INCREASE
from keras_posenc.export.quantization import precision_of
from keras_posenc.export.result import EXPORT_TOLERANCE, ExportResult
from keras_posenc.export.targets import DEFAULT_TARGET
from keras_posenc.export.translation_export import DEFAULT_MAX_BLEU_DROP, build_translation
from keras_posenc.export.window_export import build_window

__all__ = ["EXPORT_TOLERANCE", "ExportResult", "export", "export_and_check", "export_genai",
           "export_generation", "export_generator", "export_litertlm", "export_translation"]

# Each kind's build: `(model, *, target, precision, litert_python, **options) -> result.Built`.
_BUILDS = {WINDOW: build_window, PREFILL_DECODE: build_generation, LITERTLM: build_litertlm,
           GENAI: build_genai, TRANSLATE: build_translation}


def export(model, kind=WINDOW, *, target=None, quantize=None, max_loss_increase=DEFAULT_MAX_LOSS_INCREASE,
           litert_python=None, **options):
    """Exports `model` as `kind` for `target` and checks the files: the one pass of every export.

    Args:
        model: a built Keras model with keras_posenc layers (a `CausalLM` for the generating kinds, a
            `Seq2SeqTransformer` for "translate").
        kind: a `Kind` or its name (`kinds.KINDS`): "window", "prefill_decode", "litertlm", "genai",
            "translate".
        target: a `Target` or its name; default `targets.DEFAULT_TARGET` ("gpu"). `genai` takes none
            (onnxruntime-genai's CPU provider runs its folder).
        quantize: None (float32), "float16", "int8" or "int4": the recipe of
            `quantization.RECIPES[(target, kind)]`, refused before anything is converted where the
            runtime cannot run it.
        max_loss_increase: float >= 0, the largest relative rise of the held-out cross-entropy a
            quantized export may cost (default 1 %); `ExportResult.failures` applies it.
        litert_python: the Python with LiteRT's tools (LiteRT Quantizer, litert-lm-builder; default
            `litert_python.runtime_python`).
        **options: the kind's own arguments: see `export_and_check`, `export_generation`,
            `export_litertlm` (`sp_model`, ...), `export_genai` and `export_translation`.

    Returns:
        An `ExportResult` of `kind`.

    Raises:
        ValueError: an unknown kind, target or precision, a target given to `genai`, a negative
            `max_loss_increase`, and what the kind's checks refuse (each names the argument).

    Example:

    >>> from keras_posenc.backend import keras
    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> result = export(model, "window", target="cpu", sequence_length=6)
    >>> result.kind.name, result.target, result.failures()
    ('window', 'cpu', [])
    """
    kind = kind_of(kind)
    if not kind.takes_target and target is not None:
        raise ValueError(f"A {kind.name} export runs on its own runtime and takes no target, got "
                         f"target={target!r}.")
    if not max_loss_increase >= 0:
        raise ValueError(f"`max_loss_increase` must be >= 0, got max_loss_increase={max_loss_increase!r}.")
    precision = precision_of(quantize)
    if kind.takes_target and target is None:
        target = DEFAULT_TARGET
    built = _BUILDS[kind](model, target=target, precision=precision, litert_python=litert_python, **options)
    result = built.result()
    recipe = built.recipe
    if recipe is not None:
        result.lines.insert(0, f"Quantized by {recipe.tool}: {recipe.weights}{built.quantized_note}")
        result.report.update(quality=built.quality, max_loss_increase=max_loss_increase)
        result.lines.append(built.format_quality(built.quality, max_loss_increase))
        result.metadata[contract.KEYS["quantization"]] = recipe.describe()
        if built.quality is not None:
            result.metadata[contract.KEYS["quality"]] = built.quality
    result.lines.extend(built.notes)
    return result


def export_and_check(model, *, sequence_length, target=DEFAULT_TARGET, batch_size=1, quantize=None,
                     embedding=None, token_ids=None, language_ids=None, eval_token_ids=None,
                     max_loss_increase=DEFAULT_MAX_LOSS_INCREASE, litert_python=None):
    """Exports `model` and checks the file, every analysis once.

    Builds the `ModelSpec` once, converts (`to_tflite`, or `to_onnx` for
    target "tensorrt"), decodes the flatbuffer once for the op histogram,
    GPU verdicts and cost, runs the parity once (one Keras pass, one
    interpreter pass: real tokens and padding both), and derives the runtime
    metadata.

    Args:
        model: a built Keras model with keras_posenc layers.
        sequence_length, target, batch_size, quantize: as in `to_tflite`.
        embedding: "host", "graph" or None (`default_embedding`).
        token_ids: optional int `[n, sequence_length]` for the parity
            (default: `sample_token_batch` rows, 4 per exported batch row).
        language_ids: optional, as in `check_parity` (default: zeros when the
            model needs them).
        eval_token_ids: optional int `[n, sequence_length]` of held-out text
            (right-padded with the model's pad id). With `quantize`, the
            quantized file is run against a float32 export of the same
            target on these rows (`quality.quantization_quality`): the
            report's `quality` holds the cross-entropies, greedy agreement
            and logit error, and `failures()` fails a loss increase above
            `max_loss_increase`. Without them, the quality is not measured
            (the report says so).
        max_loss_increase: float >= 0, the largest relative rise of the
            held-out cross-entropy a quantized file may cost (default 1 %).
        litert_python: the Python with LiteRT Quantizer (int4; default
            `litert_python.runtime_python`). Its files are checked by
            ai-edge-litert's interpreter (TFLite 2.12's computes them wrong).

    Returns:
        An `ExportResult`. With `quantize`, the host table of an
        `embedding="host"` export is stored in the same precision and the
        checks feed its dequantized rows, as the kit does.

    Raises:
        ValueError: as `to_tflite`, a `token_ids` of another shape, a
            quantization the target's runtime cannot run (before converting),
            or `embedding="host"` with target "cpu".

    Example:

    >>> from keras_posenc.backend import keras
    >>> from keras_posenc.layers import TokenAndPositionEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    >>> result = export_and_check(model, sequence_length=6, target="cpu")
    >>> result.parity < 1e-5, result.failures(), result.metadata["inputs"], "GATHER" in result.report["ops"]
    (True, [], ['token_ids'], True)
    """
    return export(model, WINDOW, target=target, quantize=quantize, max_loss_increase=max_loss_increase,
                  litert_python=litert_python, sequence_length=sequence_length, batch_size=batch_size,
                  embedding=embedding, token_ids=token_ids, language_ids=language_ids,
                  eval_token_ids=eval_token_ids)


def export_generation(model, *, prompt_length, cache_length, target=DEFAULT_TARGET, embedding=None,
                      check_prompt=None, check_tokens=16, quantize=None, eval_token_ids=None,
                      max_loss_increase=DEFAULT_MAX_LOSS_INCREASE, litert_python=None):
    """Exports a `CausalLM` as prefill + decode and checks the file against `model.generate`.

    `cpu` and `gpu` give one `.tflite` with two signatures, `gl` one file per signature, and
    `tensorrt` the two ONNX models (checked on onnxruntime); `gpu`/`gl` with `embedding="host"`
    also the table the runner reads (`host_table`, in the export's precision).

    Args:
        model: a built `CausalLM`.
        prompt_length, cache_length, target, embedding: as in `to_tflite_generator`.
        check_prompt: optional list of int, the prompt of the check (default: ids 5, 6, 7 clipped
            to the vocabulary).
        check_tokens: int, the tokens generated by the check (fewer if the cache is shorter).
        quantize: None, "float16", "int8" or "int4" (`quantization.RECIPES`).
        eval_token_ids: int `[n, T]` held-out rows: the quantized file's prefill cross-entropy
            against float32's, and their first tokens as more greedy prompts.
        max_loss_increase: float >= 0, the largest relative rise of that cross-entropy.
        litert_python: the Python with LiteRT Quantizer (int4).

    Returns:
        An `ExportResult`: `report` has `same_tokens`, `parity` (max abs logit difference),
        `tokens_checked` and, quantized, `quality`; `metadata` what `export/jetson/run_generate.py`
        reads.
    """
    return export(model, PREFILL_DECODE, target=target, quantize=quantize,
                  max_loss_increase=max_loss_increase, litert_python=litert_python,
                  prompt_length=prompt_length, cache_length=cache_length, embedding=embedding,
                  check_prompt=check_prompt, check_tokens=check_tokens, eval_token_ids=eval_token_ids)


def export_generator(model, out, **options):
    """`export_generation(model, **options).save(out)`, as a dict (the form earlier releases returned).

    Returns:
        dict: `files` (the model files written), `bytes`, `metadata`, `same_tokens` (bool),
        `parity` (max abs logit difference), `tokens_checked`, and `result` (the `ExportResult`).
    """
    result = export_generation(model, **options)
    result.save(out)
    return {"files": result.model_paths(out), "bytes": sum(len(content) for content in result.models),
            "metadata": result.metadata, "same_tokens": result.report["same_tokens"], "parity": result.parity,
            "tokens_checked": result.report["tokens_checked"], "result": result}


def export_litertlm(model, sp_model, *, prompt_length, cache_length, target=DEFAULT_TARGET, probes=None,
                    max_new_tokens=8, python=None, check_tokens=16, activation=None, engine_env=None,
                    quantize=None, eval_token_ids=None, max_loss_increase=DEFAULT_MAX_LOSS_INCREASE):
    """Exports a `CausalLM` as a `.litertlm` bundle and checks it against `CausalLM.generate`.

    Args:
        model: a built `CausalLM` (causal, no language ids).
        sp_model: bytes, the run's serialized SentencePiece model.
        prompt_length, cache_length, target: as in `litertlm.to_litertlm_tflite`.
        probes: sessions of turns (list of lists of str) for the engine check (default
            `probe_texts`: one prompt longer than `P`, and a second turn).
        max_new_tokens: int, tokens per turn of the engine check.
        python: the LiteRT Python, with `litert-lm-builder` / `litert-lm-api` (default
            `litert_python.runtime_python`); LiteRT Quantizer too for int4.
        check_tokens: int, tokens of the emulated-engine check.
        activation: "fp32" or "fp16", the activation type the bundle asks the engine for
            (default: the target's `litertlm_activation`).
        engine_env: optional environment of the engine check's process (`gpu`: where Vulkan
            finds the GPU driver; default this process's).
        quantize: None (float32), "float16", "int8" or "int4" (`quantization.RECIPES`).
        eval_token_ids: int `[n, T]` held-out rows: with `quantize`, the model's cross-entropy
            fed them one token a step, as the engine decodes, against the float32 model's.
        max_loss_increase: float >= 0, the largest relative rise of that cross-entropy.

    Returns:
        An `ExportResult` with the bundle; `report` has `same_tokens` (the emulated engine's
        tokens, with a chunked prefill and a second turn, equal Keras'), `parity` (0.0 or 1.0:
        the emulated check compares tokens), `engine_same_text` (None without the engine),
        `engine` (the texts, or why it did not run) and, quantized, `quality`
        (`bundle_quality`); a quantized bundle's engine text is compared with the text its
        own model generates on LiteRT's interpreter, and where they part, must be a greedy
        run of that model through near-ties (`near_greedy`, `ENGINE_NEAR_TIE`).

    Raises:
        ValueError: as `to_litertlm_tflite`, a probe that does not fit in the cache
            (`check_probes`), or no Python with `litert-lm-builder` (the bundle cannot be built
            without it).
        RuntimeError: the builder's process failed (its last log lines in the message).
    """
    return export(model, LITERTLM, target=target, quantize=quantize, max_loss_increase=max_loss_increase,
                  litert_python=python, sp_model=sp_model, prompt_length=prompt_length,
                  cache_length=cache_length, probes=probes, max_new_tokens=max_new_tokens,
                  check_tokens=check_tokens, activation=activation, engine_env=engine_env,
                  eval_token_ids=eval_token_ids)


def export_genai(model, sp_model, *, cache_length, prompt_length, check_texts=(), probes=None,
                 max_new_tokens=8, opset=ONNX_OPSET):
    """Exports a `CausalLM` as an onnxruntime-genai folder and checks it against `CausalLM.generate`.

    Args:
        model: a built `CausalLM` (causal, no language ids).
        sp_model: bytes, the run's serialized SentencePiece model (Unigram).
        cache_length: int, `C`: the caches' slots and `search.max_length`.
        prompt_length: int, `P <= C`: `search.chunk_size`, the prefill chunk.
        check_texts: texts on which tokenizer.json's ids must equal SentencePiece's (the probes'
            texts are checked too).
        probes: sessions of turns (lists of str) run through the decoder as onnxruntime-genai runs
            them (default `litertlm_bundle.probe_texts`: a short prompt, one longer than `P`, and
            a second turn).
        max_new_tokens: int, greedy tokens per turn.
        opset: int >= 17.

    Returns:
        An `ExportResult` of kind `genai` (`save(out)` writes the folder `out`).

    Raises:
        ValueError: as `to_genai_onnx`, a SentencePiece model `tokenizer_files` does not take, or a
            probe that does not fit in the cache.
        ImportError: tokenizers is not installed (the message says how).
        ToolEnvironmentError: tf2onnx or onnxruntime is not installed.
    """
    return export(model, GENAI, sp_model=sp_model, cache_length=cache_length, prompt_length=prompt_length,
                  check_texts=check_texts, probes=probes, max_new_tokens=max_new_tokens, opset=opset)


def export_translation(model, *, source_length, cache_length, target=DEFAULT_TARGET, quantize=None,
                       check_sources=None, quality_sources=None, score=None, max_new_tokens=None,
                       max_bleu_drop=DEFAULT_MAX_BLEU_DROP, beam_rows=None, litert_python=None):
    """Exports a `Seq2SeqTransformer` as a translator (`encode` + cached `decode`) and checks it.

    Args:
        model: a built `keras_posenc.seq2seq.Seq2SeqTransformer`.
        source_length: int, `S`: the source's ids (`pieces </s>`) right-padded to `S`; at most
            the model's `max_length`.
        cache_length: int, `C`: target tokens at most, `<s>` included; at most `max_length`.
        target: "gpu" (one `.tflite` of shader-only graphs, LiteRT's GPU accelerator; the default),
            "gl" (the same graphs, one file per signature, float32 ids: the GL delegate), "cpu"
            (one `.tflite`, XNNPACK) or "tensorrt" (one ONNX file per signature).
        quantize: None (float32), "float16" or "int8" (`quantization.RECIPES`).
        check_sources: id rows (each ending in `eos_id`) the files translate greedily against
            `translate` (default `translation_export.default_sources`).
        quality_sources: with `quantize`, the rows both files translate (default `check_sources`).
        score: with `quantize`, `ids lists -> {"bleu", "chrf"}` (the app's: detokenized,
            sacrebleu against the dev references); without it only token agreement is measured.
        max_new_tokens: int, tokens per check translation (default `min(C, max_length - 1)`).
        max_bleu_drop: float, the largest BLEU a quantized file may lose against float32's.
        beam_rows: int, the rows of the `decode_beams` signature (a beam search's hypotheses in one
            call; checked against `translate` with that beam size), 0 for none; default 4
            (translate's beam) on "cpu" and "tensorrt", none on the batch-1 GPU targets.
        litert_python: as in `export`.

    Returns:
        An `ExportResult` of the "translate" kind: `report` has `same_tokens`, `parity` (max abs
        logit difference against the model's teacher-forced logits) and `tokens_checked`;
        `metadata` is what `export/jetson/run_translate.py` reads.
    """
    return export(model, TRANSLATE, target=target, quantize=quantize, litert_python=litert_python,
                  source_length=source_length, cache_length=cache_length, check_sources=check_sources,
                  quality_sources=quality_sources, score=score, max_new_tokens=max_new_tokens,
                  max_bleu_drop=max_bleu_drop, beam_rows=beam_rows)
