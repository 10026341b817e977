"""`export_litertlm`: a `CausalLM` as a `.litertlm` bundle, checked on the emulated engine and on LiteRT-LM.

The pass: convert (`litertlm.to_litertlm_tflite`), check the file fed the way LiteRT-LM's
executor feeds it (`litertlm.EngineFeeder`: chunked prefill, the held-back last token, a second
turn) token for token against `CausalLM.generate`, cost it, pack it with the run's SentencePiece
model and LlmMetadata (`litertlm_runtime.py pack`), then run LiteRT-LM's own `Engine` on probe
prompts (one longer than the prefill length `P`) and compare its greedy text with Keras'.

`litert-lm-builder` and `litert-lm-api` run in their own Python (`runtime_python`): their
generated protos need protobuf >= 6.31 and the TF 2.12 stack pins 4.25. Without the engine the
bundle is still written and the report says "engine not installed: ..." (never a silent pass).
"""

import json
import os
import subprocess
import sys
import tempfile

from keras_posenc import special_ids
from keras_posenc.export import contract, generator, litertlm
from keras_posenc.export.cost import graph_cost
from keras_posenc.export.result import ExportResult

__all__ = ["ENGINE_PYTHON_ENV", "INSTALL_HINT", "check_probes", "engine_texts", "export_litertlm",
           "keras_texts", "pack_bundle", "probe_texts", "runtime_python"]

# The Python with litert-lm-builder + litert-lm-api (tests/edge/runtime/bootstrap.sh builds one).
ENGINE_PYTHON_ENV = "KERAS_POSENC_LITERTLM_PYTHON"
INSTALL_HINT = ("python3 -m venv venv-litertlm && venv-litertlm/bin/pip install litert-lm-api==0.18.1 "
                f"litert-lm-builder==0.18.1, then set {ENGINE_PYTHON_ENV}=venv-litertlm/bin/python "
                "(or pass --litertlm-python)")
_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "litertlm_runtime.py")


def runtime_python(python=None):
    """The Python that runs `litertlm_runtime.py`: `python`, else `$KERAS_POSENC_LITERTLM_PYTHON`, else this
    one when it imports `litert_lm_builder`; None when there is none.

    Raises:
        ValueError: `python` (or the variable) names no executable file.
    """
    python = python or os.environ.get(ENGINE_PYTHON_ENV)
    if python:
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ValueError(f"the LiteRT-LM Python {python!r} is not an executable file: {INSTALL_HINT}.")
        return python
    try:
        import litert_lm_builder  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def _run_script(python, command, spec, timeout, env=None):
    with tempfile.TemporaryDirectory(prefix="keras_posenc_litertlm_") as folder:
        path = os.path.join(folder, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        done = subprocess.run([python, _SCRIPT, command, path], capture_output=True, text=True,
                              timeout=timeout, env=env)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(f"LiteRT-LM `{command}` failed (exit {done.returncode}): "
                           + " | ".join(lines[-3:]))
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


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
        _run_script(python, "pack", {"tflite": paths["model.tflite"], "spm": paths["spm.model"],
                                     "out": paths["out.litertlm"], "start_id": special_ids.BOS_ID,
                                     "stop_ids": [special_ids.EOS_ID], "pad_id": int(pad_id),
                                     "max_num_tokens": int(cache_length), "activation": activation}, timeout)
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
    result, log = _run_script(python, "generate", {"bundle": os.path.abspath(bundle_path), "backend": backend,
                                                   "turns": sessions, "max_new_tokens": max_new_tokens,
                                                   "benchmark": benchmark, "threads": threads}, timeout, env)
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

    Texts decoded from ordinary pieces (ids after the reserved ones), sized to fit the cache.
    """
    processor = _processor(sp_model)
    vocab = processor.GetPieceSize()
    ordinary = [i for i in range(special_ids.NUM_RESERVED_IDS, vocab) if not processor.IsControl(i)
                and not processor.IsUnknown(i)]

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


def export_litertlm(model, sp_model, *, prompt_length, cache_length, target="cpu", probes=None,
                    max_new_tokens=8, python=None, check_tokens=16, activation=None, engine_env=None):
    """Exports a `CausalLM` as a `.litertlm` bundle and checks it against `CausalLM.generate`.

    Args:
        model: a built `CausalLM` (causal, no language ids).
        sp_model: bytes, the run's serialized SentencePiece model.
        prompt_length, cache_length, target: as in `litertlm.to_litertlm_tflite`.
        probes: sessions of turns (list of lists of str) for the engine check (default
            `probe_texts`: one prompt longer than `P`, and a second turn).
        max_new_tokens: int, tokens per turn of the engine check.
        python: the Python with `litert-lm-builder` / `litert-lm-api` (default `runtime_python`).
        check_tokens: int, tokens of the emulated-engine check.
        activation: "fp32" or "fp16", the activation type the bundle asks the engine for
            (default: the target's `litertlm_activation`).
        engine_env: optional environment of the engine check's process (`gpu`: where Vulkan
            finds the GPU driver; default this process's).

    Returns:
        An `ExportResult` with the bundle; `report` has `same_tokens` (the emulated engine's
        tokens, with a chunked prefill and a second turn, equal Keras'), `parity` (0.0 or 1.0:
        the emulated check compares tokens), `engine_same_text` (None without the engine),
        `engine` (the texts, or why it did not run).

    Raises:
        ValueError: as `to_litertlm_tflite`, a probe that does not fit in the cache
            (`check_probes`), or no Python with `litert-lm-builder` (the bundle cannot be built
            without it).
        RuntimeError: the builder's process failed (its last log lines in the message).
    """
    target = litertlm.check_litertlm(model, prompt_length, cache_length, target)
    python = runtime_python(python)
    if python is None:
        raise ValueError(f"a .litertlm bundle is built with litert-lm-builder, which is not installed here: "
                         f"{INSTALL_HINT}.")
    sessions = probes or probe_texts(sp_model, prompt_length, cache_length, max_new_tokens)
    check_probes(sp_model, sessions, cache_length, max_new_tokens)  # before the conversion: fails fast
    flat = litertlm.to_litertlm_tflite(model, prompt_length=prompt_length, cache_length=cache_length,
                                       target=target.name)
    same, tokens = _emulated_check(model, flat, prompt_length, cache_length, check_tokens)
    bundle = pack_bundle(flat, sp_model, cache_length=cache_length, pad_id=model.encoder.pad_id,
                         activation=activation or target.litertlm_activation, python=python)
    metadata = generator.generator_metadata(model, prompt_length=prompt_length, cache_length=cache_length,
                                            target=target.name)
    keys = contract.KEYS
    metadata[keys["format"]] = "litertlm"
    metadata[keys["max_num_tokens"]] = cache_length
    metadata[keys["embedding"]], metadata[keys["input_dtype"]] = "graph", "int32"
    costs = [graph_cost(flat, signature=key) for key in contract.SIGNATURES]
    metadata[keys["prefill_multiply_adds"]], metadata[keys["decode_multiply_adds"]] = (
        c["multiply_adds"] for c in costs)
    engine = _engine_check(model, sp_model, bundle, sessions, max_new_tokens, target, python, engine_env)
    report = {"same_tokens": same, "parity": 0.0 if same else 1.0, "tokens_checked": tokens, "verdicts": {},
              "engine_same_text": engine["same_text"], "engine": engine}
    lines = [f"Multiply-adds: prefill of {prompt_length} tokens {metadata['prefill_multiply_adds']:,}, one "
             f"decode step {metadata['decode_multiply_adds']:,}; cache {metadata['cache_bytes']:,} bytes",
             f"Greedy parity, fed as LiteRT-LM feeds it (chunked prefill, second turn), {tokens} tokens: "
             f"{'same tokens' if same else 'TOKENS DIFFER'} as CausalLM.generate",
             engine["line"]]
    description = (f"LiteRT-LM bundle, target {target.name}: prefill [1, {prompt_length}], decode [1, 1], "
                   f"max_num_tokens {cache_length}")
    return ExportResult(target.name, None, "graph", (bundle,), report, lines, metadata, description,
                        suffix=contract.LITERTLM_SUFFIX)


def _emulated_check(model, flat, prompt_length, cache_length, check_tokens):
    """The file fed as the engine feeds it: a prompt longer than `P`, then a second turn; tokens vs Keras."""
    vocab = model.encoder.vocab_size
    ordinary = list(range(special_ids.NUM_RESERVED_IDS, vocab)) or list(range(vocab))
    first = min(prompt_length + 3, max(1, cache_length // 3))
    tokens = max(1, min(check_tokens, (cache_length - 2 * first - 2) // 2))
    prompt = [special_ids.BOS_ID] + [ordinary[(5 + 3 * i) % len(ordinary)] for i in range(first - 1)]
    second = [ordinary[(11 + 5 * i) % len(ordinary)] for i in range(max(1, first // 2))]
    pad = model.encoder.pad_id
    got = litertlm.engine_greedy(litertlm.EngineFeeder(flat), [prompt, second], tokens, pad_id=pad)
    keras_first = model.generate(prompt, tokens).ids[0].tolist()
    keras_second = model.generate(prompt + keras_first + second, tokens).ids[0].tolist()
    return got == [keras_first, keras_second], 2 * tokens


def _engine_check(model, sp_model, bundle, sessions, max_new_tokens, target, python, env):
    """LiteRT-LM's Engine on the bundle vs `keras_texts`: `{"same_text", "line", "texts", "keras"}`."""
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
    turns = sum(len(turns) for turns in sessions)
    return {"same_text": same, "texts": texts, "keras": expected,
            "line": f"LiteRT-LM Engine ({backend}) greedy text over {len(sessions)} sessions, {turns} turns "
                    f"(a prompt longer than the prefill, a second turn): "
                    + ("same text as CausalLM.generate" if same else "TEXT DIFFERS from CausalLM.generate")}
