"""The prefill/decode kind: the generator's files, checked token for token against `CausalLM.generate`.

`build_generation` is the prefill/decode part of the one export pass (`pipeline.export`,
`export_generation`): convert the two signatures for the target (`generator`), run the file's
greedy loop against `CausalLM.generate` (`check_generator_parity`), cost each signature and
gather what `export/jetson/run_generate.py` reads (`generator_metadata`). A quantized file is
also measured against the float32 file of the same target (`generation_quality`).
"""

import numpy as np

from keras_posenc import special_ids
from keras_posenc.export import contract, model_spec
from keras_posenc.export.cost import graph_cost, onnx_cost
from keras_posenc.export.generator import (
    cache_bytes,
    check_export,
    embedding_of,
    to_onnx_generator,
    to_tflite_generator,
)
from keras_posenc.export.host_table import dequantized_table
from keras_posenc.export.kinds import PREFILL_DECODE
from keras_posenc.export.quality import format_generation_quality, next_token_cross_entropy, quality_prompts
from keras_posenc.export.quantization import interpreter_for, recipe_for, stored_host_table
from keras_posenc.export.result import Built
from keras_posenc.export.runners import OnnxSession, TfliteSession, greedy_generate
from keras_posenc.export.targets import DEFAULT_TARGET, ONNX, TFLITE, target_of

__all__ = ["build_generation", "check_generation", "check_generator_parity", "generation_quality",
           "generator_metadata"]

TOKEN_IDS = contract.TENSORS["token_ids"]
PREFILL = contract.SIGNATURES[0]


def check_generator_parity(model, session, prompt_ids, max_new_tokens):
    """`(same_tokens, max_abs_logit_diff)` of the file's greedy run against `model.generate`.

    Args:
        model: the `CausalLM`.
        session: a `TfliteSession` or `OnnxSession` of its export.
        prompt_ids: list of int.
        max_new_tokens: int.

    The logits are compared with those of the Keras full forward pass over the prompt and the
    generated tokens, at each step that chose a token.
    """
    pad_id = model.encoder.pad_id
    keras_ids = model.generate(list(prompt_ids), max_new_tokens).ids[0].tolist()
    file_ids, file_logits = greedy_generate(session, list(prompt_ids), max_new_tokens, pad_id=pad_id)
    sequence = np.array([list(prompt_ids) + file_ids], np.int32)
    full = np.asarray(model(sequence))[0, len(prompt_ids) - 1:len(prompt_ids) - 1 + len(file_ids)]
    return keras_ids == file_ids, float(np.abs(full - file_logits).max())


def generator_metadata(model, *, prompt_length, cache_length, target):
    """What the device kit (`run_generate.py`) reads from `FILE.json`: lengths, special ids, cache size."""
    encoder = model.encoder
    return {"kind": PREFILL_DECODE.contract_kind, "target": target,
            "accelerators": list(target_of(target).runs_on), "prompt_length": prompt_length,
            "cache_length": cache_length, "vocab_size": encoder.vocab_size, "num_layers": encoder.num_layers,
            "pad_id": encoder.pad_id, "bos_id": special_ids.BOS_ID, "eos_id": special_ids.EOS_ID,
            "unk_id": special_ids.UNK_ID, "special_ids": list(range(special_ids.NUM_RESERVED_IDS)),
            "cache_bytes": cache_bytes(model, cache_length)}


def generation_quality(model, float_session, quantized_session, prompts, max_new_tokens, eval_token_ids=None):
    """A quantized prefill/decode file against the float32 file of the same target.

    Args:
        model: the `CausalLM` both were exported from (its pad id).
        float_session, quantized_session: `runners.TfliteSession`s (or `OnnxSession`s).
        prompts: lists of token ids.
        max_new_tokens: int, greedy tokens per prompt.
        eval_token_ids: optional int `[n, T]` held-out rows: the prefill logits' cross-entropy
            on their first `P` tokens.

    Returns:
        dict: `prompts`, `greedy_tokens` (generated per file), `same_greedy_tokens` (the
        quantized file's greedy tokens are float32's on every prompt), `generation_agreement`
        (share of steps where the quantized file, fed float32's tokens, picks float32's token),
        and with `eval_token_ids` the keys of `quality.quantization_quality` (prefill logits).
    """
    pad_id = model.encoder.pad_id
    hits, steps, same = 0, 0, True
    for prompt in prompts:
        reference, _ = greedy_generate(float_session, prompt, max_new_tokens, pad_id=pad_id)
        own, _ = greedy_generate(quantized_session, prompt, max_new_tokens, pad_id=pad_id)
        forced, _ = greedy_generate(quantized_session, prompt, len(reference), pad_id=pad_id,
                                    forced_ids=reference)
        same = same and own == reference
        hits += sum(a == b for a, b in zip(forced, reference))
        steps += len(reference)
    quality = {"prompts": len(prompts), "greedy_tokens": max_new_tokens, "same_greedy_tokens": bool(same),
               "generation_agreement": hits / steps}
    if eval_token_ids is None:
        return quality
    length = float_session.prompt_length
    rows = np.full([len(eval_token_ids), length], pad_id, np.int32)
    width = min(length, np.asarray(eval_token_ids).shape[1])
    rows[:, :width] = np.asarray(eval_token_ids)[:, :width]
    rows = rows[(rows[:, 1:] != pad_id).any(axis=1)]
    logits = [np.stack([session.run(PREFILL, {TOKEN_IDS: row[None]})["logits"][0] for row in rows])
              for session in (float_session, quantized_session)]
    loss_float, tokens = next_token_cross_entropy(logits[0], rows, pad_id)
    loss_quantized, _ = next_token_cross_entropy(logits[1], rows, pad_id)
    real = rows != pad_id
    return dict(quality, rows=int(len(rows)), tokens=tokens, loss_float=loss_float,
                loss_quantized=loss_quantized,
                loss_increase=loss_quantized / loss_float - 1.0,
                agreement=float((logits[0].argmax(-1) == logits[1].argmax(-1))[real].mean()),
                max_abs_diff=float(np.abs(logits[0].astype(np.float64) - logits[1])[real].max()))


def check_generation(model, *, prompt_length, cache_length, target=DEFAULT_TARGET, embedding=None,
                     check_prompt=None, check_tokens=16, quantize=None, eval_token_ids=None,
                     litert_python=None):
    """The prefill/decode export of `model`, checked against `model.generate` (`pipeline.export_generation`).

    With `quantize`, the file is also measured against a float32 export of the same target
    (`generation_quality`): held-out cross-entropy of the prefill logits on
    `eval_token_ids`, and, on the check prompt and the first tokens of held-out rows, whether
    its greedy tokens are float32's and how often it picks float32's token when fed them.

    Returns:
        dict: `models` (the file contents: one, or one per signature), `metadata`, `host_table`
        (as stored, or None), `same_tokens` (bool), `parity` (max abs logit difference),
        `tokens_checked`, `recipe` and `quality` (None without `quantize`).
    """
    target = check_export(model, prompt_length, cache_length, target)
    recipe = recipe_for(target, quantize, PREFILL_DECODE, litert_python=litert_python)
    vocab = model.encoder.vocab_size
    prompt = list(check_prompt or [min(i, vocab - 1) for i in (5, 6, 7)])[:prompt_length]
    tokens = max(1, min(check_tokens, cache_length - len(prompt) + 1, model.encoder.max_length - len(prompt)))
    options = dict(prompt_length=prompt_length, cache_length=cache_length, target=target, embedding=embedding,
                   quantize=quantize, recipe=recipe, litert_python=litert_python)
    with interpreter_for(recipe, litert_python) as interpreter:
        files = _FILES[target.file_format](model, interpreter=interpreter, **options)
        same, parity = check_generator_parity(model, files.session, prompt, tokens)
        quality = None
        if recipe is not None:
            prompts = [prompt] + quality_prompts(eval_token_ids, model.encoder.pad_id, prompt_length)
            quality = generation_quality(model, files.float_session(), files.session, prompts, tokens,
                                         eval_token_ids)
    metadata = generator_metadata(model, prompt_length=prompt_length, cache_length=cache_length,
                                  target=target.name)
    metadata["embedding"] = "graph" if files.stored is None else "host"
    metadata["input_dtype"] = target.input_dtype
    metadata["prefill_multiply_adds"], metadata["decode_multiply_adds"] = (
        c["multiply_adds"] for c in files.costs)
    return {"models": tuple(files.models), "metadata": metadata, "host_table": files.stored,
            "same_tokens": same, "parity": parity, "tokens_checked": tokens, "recipe": recipe,
            "quality": quality}


class _Files:
    """One target's prefill/decode files: their contents, a session of them, their costs, the float32
    session (made when asked) and the host table as stored (or None)."""

    def __init__(self, models, session, costs, float_session, stored=None):
        self.models, self.session, self.costs = models, session, costs
        self.float_session, self.stored = float_session, stored


def _tflite_files(model, *, prompt_length, cache_length, target, embedding, quantize, recipe, litert_python,
                  interpreter):
    embedding = embedding_of(model, target, embedding)
    options = dict(prompt_length=prompt_length, cache_length=cache_length, target=target.name,
                   embedding=embedding)
    flat = to_tflite_generator(model, quantize=quantize, litert_python=litert_python, **options)
    stored = None
    if embedding == "host":
        stored = stored_host_table(model_spec.host_embedding_table(model), recipe)
    rows = None if stored is None else dequantized_table(stored)
    float_table = None if rows is None else model_spec.host_embedding_table(model)
    if target.file_per_signature:
        models, costs = flat, [graph_cost(content, signature=key)
                               for content, key in zip(flat, contract.SIGNATURES)]
    else:
        models, costs = (flat,), [graph_cost(flat, signature=key) for key in contract.SIGNATURES]
    return _Files(models, TfliteSession(flat, interpreter=interpreter, table=rows), costs,
                  lambda: TfliteSession(to_tflite_generator(model, **options), interpreter=interpreter,
                                        table=float_table), stored)


def _onnx_files(model, *, prompt_length, cache_length, target, embedding, quantize, recipe, litert_python,
                interpreter):
    models = to_onnx_generator(model, prompt_length=prompt_length, cache_length=cache_length, recipe=recipe)
    return _Files(models, OnnxSession(*models), [onnx_cost(proto) for proto in models],
                  lambda: OnnxSession(*to_onnx_generator(model, prompt_length=prompt_length,
                                                         cache_length=cache_length)))


_FILES = {TFLITE: _tflite_files, ONNX: _onnx_files}


def build_generation(model, *, target, precision, litert_python=None, prompt_length, cache_length,
                     embedding=None, check_prompt=None, check_tokens=16, eval_token_ids=None):
    """The prefill/decode export of `model`, checked: a `Built` for the pass (arguments as
    `export_generation`)."""
    checked = check_generation(model, prompt_length=prompt_length, cache_length=cache_length, target=target,
                               embedding=embedding, check_prompt=check_prompt, check_tokens=check_tokens,
                               quantize=precision, eval_token_ids=eval_token_ids, litert_python=litert_python)
    metadata = checked["metadata"]
    metadata["quantize"] = precision
    report = {"same_tokens": checked["same_tokens"], "parity": checked["parity"],
              "tokens_checked": checked["tokens_checked"], "verdicts": {}}
    lines = [f"Multiply-adds: prefill of {prompt_length} tokens {metadata['prefill_multiply_adds']:,}, one "
             f"decode step {metadata['decode_multiply_adds']:,}",
             f"Greedy parity over {report['tokens_checked']} tokens: "
             f"{'same tokens as' if report['same_tokens'] else 'TOKENS DIFFER from'} CausalLM.generate, "
             f"max abs logit diff {report['parity']:.3g}"]
    description = (f"target {metadata['target']}: prefill [1, {prompt_length}], decode [1, 1], cache "
                   f"{metadata['cache_length']} slots = {metadata['cache_bytes']} bytes"
                   + (f", {precision} weights" if precision else ""))
    return Built(metadata["target"], precision, metadata["embedding"], tuple(checked["models"]), report,
                 lines, metadata, description, checked["host_table"], kind=PREFILL_DECODE,
                 recipe=checked["recipe"], quality=checked["quality"],
                 format_quality=format_generation_quality)
