"""The `.litertlm` kind: a `CausalLM` as a bundle, checked on the emulated engine and on LiteRT-LM.

`build_litertlm` is the bundle's part of the one export pass (`pipeline.export`, `export_litertlm`):
convert (`litertlm.to_litertlm_tflite`), check the file fed the way LiteRT-LM's
executor feeds it (`litertlm.EngineFeeder`: chunked prefill, the held-back last token, a second
turn) token for token against `CausalLM.generate`, cost it, pack it with the run's SentencePiece
model and LlmMetadata (`litertlm_runtime.py pack`), then run LiteRT-LM's own `Engine` on probe
prompts (one longer than the prefill length `P`) and compare its greedy text with Keras'.

`litert-lm-builder` and `litert-lm-api` run in their own Python (`runtime_python`): their
generated protos need protobuf >= 6.31 and the TF 2.12 stack pins 4.25. Without the engine the
bundle is still written and the report says "engine not installed: ..." (never a silent pass).
"""

import os
import subprocess
import tempfile

import numpy as np

from keras_posenc import special_ids
from keras_posenc.export import contract, litertlm
from keras_posenc.export.cost import graph_cost
from keras_posenc.export.generation_export import generator_metadata
from keras_posenc.export.kinds import LITERTLM
from keras_posenc.export.litert_python import INSTALL_HINT, run_script, runtime_python
from keras_posenc.export.quality import format_generation_quality, next_token_cross_entropy
from keras_posenc.export.quantization import interpreter_for, recipe_for
from keras_posenc.export.result import Built

__all__ = ["ENGINE_NEAR_TIE", "build_litertlm", "bundle_quality", "check_probes", "engine_texts",
           "feeder_texts", "keras_texts", "near_greedy", "pack_bundle", "probe_texts"]

_SCRIPT = "litertlm_runtime.py"
# Logits: where a quantized bundle's engine text leaves its model's text on LiteRT's interpreter,
# each token of it must be within this of the interpreter's best (`near_greedy`). The engine and
# the interpreter quantize the activations of dynamic-range int8 kernels each their own way, so
# near-ties can go either way (the demo: one turn of four, ", bute.g.," against ", bute., but").
ENGINE_NEAR_TIE = 0.5


def pack_bundle(flat, sp_model, *, cache_length, pad_id, activation, python, timeout=600):
    """The `.litertlm` bytes: LlmMetadata (BOS, EOS, pad, `max_num_tokens=cache_length`), tokenizer, model.

    Args:
        flat: bytes of `litertlm.to_litertlm_tflite`.
        sp_model: bytes, the serialized SentencePiece model.
        cache_length: int, `max_num_tokens`.
        pad_id: int, the model's padding id.
        activation: "fp32" or "fp16", the activation type the engine is asked to use.
        python: the Python of `runtime_python`.
    """
    with tempfile.TemporaryDirectory(prefix="keras_posenc_litertlm_") as folder:
        paths = {name: os.path.join(folder, name) for name in ("model.tflite", "spm.model", "out.litertlm")}
        for name, content in (("model.tflite", flat), ("spm.model", sp_model)):
            with open(paths[name], "wb") as f:
                f.write(content)
        spec = {"tflite": paths["model.tflite"], "spm": paths["spm.model"], "out": paths["out.litertlm"],
                "start_id": special_ids.BOS_ID, "stop_ids": [special_ids.EOS_ID], "pad_id": int(pad_id),
                "max_num_tokens": int(cache_length), "activation": activation}
        run_script(python, _SCRIPT, "pack", spec, timeout)
        with open(paths["out.litertlm"], "rb") as f:
            return f.read()


def engine_texts(bundle_path, sessions, max_new_tokens, *, backend="cpu", python, benchmark=False,
                 threads=None, timeout=600, env=None):
    """LiteRT-LM's greedy text for each session's turns: `(texts, benchmarks, log)`.

    Args:
        bundle_path: a `.litertlm` file.
        sessions: list of lists of str: the turns of each session (a fresh session each).
        max_new_tokens: int, tokens per turn.
        backend: "cpu" or "gpu".
        python: the Python of `runtime_python`.
        benchmark: bool, also return the engine's benchmark info of each session.
        threads: optional int, the CPU backend's threads (default: the engine's).
        env: optional environment of the engine's process (e.g. where Vulkan finds its driver).

    Raises:
        RuntimeError: the engine failed (its last log lines in the message).
    """
    spec = {"bundle": os.path.abspath(bundle_path), "backend": backend, "turns": sessions,
            "max_new_tokens": max_new_tokens, "benchmark": benchmark, "threads": threads}
    result, log = run_script(python, _SCRIPT, "generate", spec, timeout, env)
    return result["turns"], result["benchmark"], log


def _processor(sp_model):
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    return processor


def keras_texts(model, sp_model, sessions, max_new_tokens):
    """What `CausalLM.generate` generates for the engine's sessions: `(texts, ids)` per session and turn.

    The first turn is BOS + the text's pieces; each later turn continues the whole sequence (the
    previous turns' ids and every generated id, the stop id too, as the engine keeps them).
    """
    processor = _processor(sp_model)
    texts, ids = [], []
    for turns in sessions:
        sequence, session_texts, session_ids = [special_ids.BOS_ID], [], []
        for text in turns:
            sequence = sequence + list(processor.EncodeAsIds(text))
            new = model.generate(sequence, max_new_tokens, stop_id=special_ids.EOS_ID).ids[0].tolist()
            if special_ids.EOS_ID in new:
                new = new[:new.index(special_ids.EOS_ID) + 1]
            sequence = sequence + new
            session_ids.append(new)
            session_texts.append(processor.DecodeIds([i for i in new if i >= special_ids.NUM_RESERVED_IDS
                                                      or i == special_ids.UNK_ID]))
        texts.append(session_texts)
        ids.append(session_ids)
    return texts, ids


def probe_texts(sp_model, prompt_length, cache_length, max_new_tokens):
    """Default probe sessions: a short prompt, one longer than `P` (a chunked prefill), and a two-turn one.

    Texts decoded from ordinary pieces (ids after the reserved ones), sized to fit the cache. Pieces
    that decode to whitespace only ("▁") are left out: a one-piece probe of one would be empty.
    """
    processor = _processor(sp_model)
    vocab = processor.GetPieceSize()
    ordinary = [i for i in range(special_ids.NUM_RESERVED_IDS, vocab) if not processor.IsControl(i)
                and not processor.IsUnknown(i) and processor.DecodeIds([i]).strip()]

    def text(count, offset):
        return processor.DecodeIds([ordinary[(offset + 7 * i) % len(ordinary)] for i in range(count)]).strip()

    room = cache_length - 2 * max_new_tokens - 2
    long = min(prompt_length + 3, max(1, room // 2))
    short = max(1, min(prompt_length // 2, room // 4))
    return [[text(short, 0)], [text(long, 3)], [text(short, 11), text(short, 29)]]


def check_probes(sp_model, sessions, cache_length, max_new_tokens):
    """ValueError naming the first probe session that does not fit in the cache with its generated tokens.

    A session needs BOS + every turn's pieces + `max_new_tokens` per turn slots (the engine stops
    at `max_num_tokens = cache_length`).
    """
    processor = _processor(sp_model)
    for turns in sessions:
        if not turns or not all(isinstance(text, str) and text for text in turns):
            raise ValueError(f"a probe session is a list of non-empty prompts, got {turns!r}.")
        needed = 1 + sum(len(processor.EncodeAsIds(text)) + max_new_tokens for text in turns)
        if needed > cache_length:
            raise ValueError(f"the probe prompt {turns[0]!r} needs {needed} cache slots (BOS, its pieces and "
                             f"{max_new_tokens} new tokens per turn); the bundle has "
                             f"cache_length={cache_length}.")


def build_litertlm(model, *, target, precision, litert_python=None, sp_model, prompt_length, cache_length,
                   probes=None, max_new_tokens=8, check_tokens=16, activation=None, engine_env=None,
                   eval_token_ids=None):
    """The `.litertlm` bundle of `model`, checked: a `Built` for the pass (arguments as `export_litertlm`;
    `litert_python` is its `python`)."""
    target = litertlm.check_litertlm(model, prompt_length, cache_length, target)
    python = runtime_python(litert_python)
    if python is None:
        raise ValueError(f"a .litertlm bundle is built with litert-lm-builder, which is not installed here: "
                         f"{INSTALL_HINT}.")
    recipe = recipe_for(target, precision, LITERTLM, litert_python=python)
    sessions = probes or probe_texts(sp_model, prompt_length, cache_length, max_new_tokens)
    check_probes(sp_model, sessions, cache_length, max_new_tokens)  # before the conversion: fails fast
    options = dict(prompt_length=prompt_length, cache_length=cache_length, target=target.name)
    flat = litertlm.to_litertlm_tflite(model, quantize=precision, litert_python=python, **options)
    quality = expected = None
    with interpreter_for(recipe, python) as interpreter:
        same, tokens = _emulated_check(model, flat, prompt_length, cache_length, check_tokens, interpreter)
        if recipe is not None:
            quality = bundle_quality(model, litertlm.to_litertlm_tflite(model, **options), flat,
                                     eval_token_ids, interpreter=interpreter)
            expected = feeder_texts(flat, sp_model, sessions, max_new_tokens, model.encoder.pad_id,
                                    interpreter=interpreter)
    bundle = pack_bundle(flat, sp_model, cache_length=cache_length, pad_id=model.encoder.pad_id,
                         activation=activation or target.litertlm_activation, python=python)
    metadata = generator_metadata(model, prompt_length=prompt_length, cache_length=cache_length,
                                  target=target.name)
    keys = contract.KEYS
    metadata[keys["format"]] = "litertlm"
    metadata[keys["max_num_tokens"]] = cache_length
    metadata[keys["embedding"]], metadata[keys["input_dtype"]] = "graph", "int32"
    metadata[keys["quantize"]] = precision
    costs = [graph_cost(flat, signature=key) for key in contract.SIGNATURES]
    metadata[keys["prefill_multiply_adds"]], metadata[keys["decode_multiply_adds"]] = (
        c["multiply_adds"] for c in costs)

    def near(texts):
        with interpreter_for(recipe, python) as interpreter:
            return near_greedy(flat, sp_model, sessions, texts, max_new_tokens, model.encoder.pad_id,
                               interpreter=interpreter)

    engine = _engine_check(model, sp_model, bundle, sessions, max_new_tokens, target, python, engine_env,
                           expected, near=None if recipe is None else near)
    report = {"same_tokens": same, "parity": 0.0 if same else 1.0, "tokens_checked": tokens, "verdicts": {},
              "engine_same_text": engine["same_text"], "engine": engine}
    lines = [f"Multiply-adds: prefill of {prompt_length} tokens {metadata['prefill_multiply_adds']:,}, one "
             f"decode step {metadata['decode_multiply_adds']:,}; cache {metadata['cache_bytes']:,} bytes",
             f"Greedy parity, fed as LiteRT-LM feeds it (chunked prefill, second turn), {tokens} tokens: "
             f"{'same tokens as' if same else 'TOKENS DIFFER from'} CausalLM.generate",
             engine["line"]]
    description = (f"LiteRT-LM bundle, target {target.name}: prefill [1, {prompt_length}], decode [1, 1], "
                   f"max_num_tokens {cache_length}" + (f", {precision} weights" if precision else ""))
    return Built(target.name, precision, "graph", (bundle,), report, lines, metadata, description,
                 kind=LITERTLM, recipe=recipe, quality=quality, format_quality=format_generation_quality,
                 quantized_note=f"; the model is {len(flat):,} bytes of the bundle")


def bundle_quality(model, float_flat, quantized_flat, eval_token_ids=None, *, interpreter=None, prompts=4,
                   max_new_tokens=16, rows=32):
    """A quantized bundle model against the float32 one, fed as LiteRT-LM's engine feeds them.

    Greedy runs from `prompts` prompts (BOS and ordinary ids) compare the files' tokens and,
    feeding float32's tokens to the quantized file, how often it picks float32's token; the
    cross-entropy is that of each file's decode logits over the first `rows` held-out rows,
    one token a step (the engine's decode).

    Returns:
        dict with the keys of `quality.generation_quality`.
    """
    pad = model.encoder.pad_id
    vocab = model.encoder.vocab_size
    ordinary = list(range(special_ids.NUM_RESERVED_IDS, vocab)) or list(range(vocab))
    hits = steps = 0
    same = True
    cache = litertlm.EngineFeeder(float_flat, interpreter).cache_length
    new = max(1, min(max_new_tokens, cache // 2 - 1))
    for row in range(prompts):
        prompt = [special_ids.BOS_ID] + [ordinary[(3 + 7 * row + 11 * i) % len(ordinary)] for i in range(4)]
        reference = litertlm.engine_greedy(litertlm.EngineFeeder(float_flat, interpreter), [prompt], new,
                                           pad_id=pad)[0]
        own = litertlm.engine_greedy(litertlm.EngineFeeder(quantized_flat, interpreter), [prompt], new,
                                     pad_id=pad)[0]
        forced = litertlm.engine_greedy(litertlm.EngineFeeder(quantized_flat, interpreter), [prompt], new,
                                        pad_id=pad, forced=[reference])[0]
        same = same and own == reference
        hits += sum(a == b for a, b in zip(forced, reference))
        steps += len(reference)
    quality = {"prompts": prompts, "greedy_tokens": new, "same_greedy_tokens": bool(same),
               "generation_agreement": hits / steps}
    if eval_token_ids is None:
        return quality
    texts = [[int(t) for t in row if t != pad][:cache] for row in np.asarray(eval_token_ids)[:rows]]
    texts = [text for text in texts if len(text) > 1]
    logits = []
    for flat in (float_flat, quantized_flat):
        per_row = []
        for text in texts:
            feeder = litertlm.EngineFeeder(flat, interpreter)
            feeder.prefill(text[:1])
            steps_logits = []
            for token in text[1:]:
                steps_logits.append(feeder.decode())
                feeder.held = token
            per_row.append(np.stack(steps_logits + [steps_logits[-1]]))
        logits.append(per_row)
    width = max(len(text) for text in texts)
    ids = np.full([len(texts), width], pad, np.int32)
    padded = [np.zeros([len(texts), width, vocab]) for _ in logits]
    for i, text in enumerate(texts):
        ids[i, :len(text)] = text
        for array, per_row in zip(padded, logits):
            array[i, :len(text)] = per_row[i]
    loss_float, tokens = next_token_cross_entropy(padded[0], ids, pad)
    loss_quantized, _ = next_token_cross_entropy(padded[1], ids, pad)
    real = ids[:, 1:] != pad
    return dict(quality, rows=len(texts), tokens=tokens, loss_float=loss_float, loss_quantized=loss_quantized,
                loss_increase=loss_quantized / loss_float - 1.0,
                agreement=float((padded[0][:, :-1].argmax(-1) == padded[1][:, :-1].argmax(-1))[real].mean()),
                max_abs_diff=float(np.abs(padded[0][:, :-1] - padded[1][:, :-1])[real].max()))


def feeder_texts(flat, sp_model, sessions, max_new_tokens, pad_id, *, interpreter=None):
    """The greedy text of each session's turns from a bundle's model, fed as the engine feeds it.

    The turns are tokenized as `keras_texts` does (BOS and the first turn's pieces, then each
    turn's pieces); generation stops at EOS.
    """
    processor = _processor(sp_model)
    texts = []
    for turns in sessions:
        feeder = litertlm.EngineFeeder(flat, interpreter)
        generated = litertlm.engine_greedy(feeder, _turn_ids(processor, turns), max_new_tokens, pad_id=pad_id,
                                           stop_id=special_ids.EOS_ID)
        texts.append([_decode(processor, new) for new in generated])
    return texts


def near_greedy(flat, sp_model, sessions, texts, max_new_tokens, pad_id, *, near_tie=ENGINE_NEAR_TIE,
                interpreter=None):
    """Whether `texts` (another runtime's run of `sessions`) is a greedy run of a model through near-ties.

    Fed as `feeder_texts` feeds, each step's token must continue the text and have a logit
    within `near_tie` of the step's best: where the model is not near a tie, the pick is the
    greedy one. Each step replays its session so far (teacher forcing): meant for the few
    turns of an engine check.
    """
    processor = _processor(sp_model)
    for turns, session in zip(sessions, texts):
        if len(session) != len(turns):
            return False
        ids, chosen = _turn_ids(processor, turns), []
        for turn, text in enumerate(session):
            new = []
            while len(new) < max_new_tokens and special_ids.EOS_ID not in new[-1:]:
                logits = []
                feeder = litertlm.EngineFeeder(flat, interpreter)
                litertlm.engine_greedy(feeder, ids[:turn + 1], max_new_tokens, pad_id=pad_id,
                                       stop_id=special_ids.EOS_ID, forced=chosen + [new + [pad_id]],
                                       logits=logits)
                pick = _followed_pick(processor, logits[-1][len(new)], near_tie, new, text)
                if pick is None:
                    return False
                new.append(pick)
            if _decode(processor, new) != text:
                return False
            chosen.append(new)
    return len(texts) == len(sessions)


def _followed_pick(processor, step, near_tie, new, text):
    """The token a runtime whose turn reads `text` picked after `new`, or None if none is near the best.

    The step's best is taken where it keeps to `text`. Another token (a flip at a near-tie) must
    add characters: a token that decodes to nothing (padding, a control id) keeps to any text,
    and taking it would hide the token the runtime really picked. Once `text` is complete, the
    runtime stopped: end of sequence must be near the best.
    """
    so_far = _decode(processor, new)
    best = int(np.argmax(step))
    close = [int(i) for i in np.argsort(-step, kind="stable") if step[i] >= step[best] - near_tie]
    if so_far == text:
        if special_ids.EOS_ID in close:
            return special_ids.EOS_ID
        return best if _decode(processor, new + [best]) == text else None
    if best != special_ids.EOS_ID and text.startswith(_decode(processor, new + [best])):
        return best
    for token in close:
        grown = _decode(processor, new + [token])
        if token != special_ids.EOS_ID and len(grown) > len(so_far) and text.startswith(grown):
            return token
    return None


def _turn_ids(processor, turns):
    """The ids each turn prefills: BOS and the first turn's pieces, then each turn's pieces."""
    return ([[special_ids.BOS_ID] + list(processor.EncodeAsIds(turns[0]))]
            + [list(processor.EncodeAsIds(text)) for text in turns[1:]])


def _decode(processor, ids):
    return processor.DecodeIds([i for i in ids
                                if i >= special_ids.NUM_RESERVED_IDS or i == special_ids.UNK_ID])


def _emulated_check(model, flat, prompt_length, cache_length, check_tokens, interpreter=None):
    """The file fed as the engine feeds it: a prompt longer than `P`, then a second turn; tokens vs Keras."""
    vocab = model.encoder.vocab_size
    ordinary = list(range(special_ids.NUM_RESERVED_IDS, vocab)) or list(range(vocab))
    first = min(prompt_length + 3, max(1, cache_length // 3))
    tokens = max(1, min(check_tokens, (cache_length - 2 * first - 2) // 2))
    prompt = [special_ids.BOS_ID] + [ordinary[(5 + 3 * i) % len(ordinary)] for i in range(first - 1)]
    second = [ordinary[(11 + 5 * i) % len(ordinary)] for i in range(max(1, first // 2))]
    pad = model.encoder.pad_id
    feeder = litertlm.EngineFeeder(flat, interpreter)
    got = litertlm.engine_greedy(feeder, [prompt, second], tokens, pad_id=pad)
    keras_first = model.generate(prompt, tokens).ids[0].tolist()
    keras_second = model.generate(prompt + keras_first + second, tokens).ids[0].tolist()
    return got == [keras_first, keras_second], 2 * tokens


def _engine_check(model, sp_model, bundle, sessions, max_new_tokens, target, python, env, expected=None,
                  near=None):
    """LiteRT-LM's Engine on the bundle vs `expected` (default `keras_texts`): `{"same_text", "line", "texts",
    "keras"}`. `near(texts)`: whether other texts pass too (a quantized bundle: `near_greedy`)."""
    reference = "CausalLM.generate" if expected is None else "its model on LiteRT's interpreter"
    if expected is None:
        expected, _ = keras_texts(model, sp_model, sessions, max_new_tokens)
    backend = target.litertlm_backend
    with tempfile.TemporaryDirectory(prefix="keras_posenc_litertlm_") as folder:
        path = os.path.join(folder, "check.litertlm")
        with open(path, "wb") as f:
            f.write(bundle)
        try:
            texts, _, _ = engine_texts(path, sessions, max_new_tokens, backend=backend, python=python,
                                       env=env)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            if "No module named 'litert_lm'" in str(error):
                return {"same_text": None, "texts": None, "keras": expected,
                        "line": f"LiteRT-LM Engine: engine not installed: {INSTALL_HINT}"}
            return {"same_text": False, "texts": None, "keras": expected,
                    "line": f"LiteRT-LM Engine ({backend}): FAILED to run the bundle: {error}"}
    same = texts == expected
    if not same and near is not None and near(texts):
        same, reference = True, reference + f" through near-ties (best logits within {ENGINE_NEAR_TIE})"
    turns = sum(len(turns) for turns in sessions)
    return {"same_text": same, "texts": texts, "keras": expected,
            "line": f"LiteRT-LM Engine ({backend}) greedy text over {len(sessions)} sessions, {turns} turns "
                    f"(a prompt longer than the prefill, a second turn): "
                    + (f"same text as {reference}" if same else f"TEXT DIFFERS from {reference}")}
