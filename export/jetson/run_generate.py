#!/usr/bin/env python3
"""Generates text on the device from a prefill/decode `.tflite` (`keras-posenc export --generate`).

Needs numpy, sentencepiece and one runtime: `ai-edge-litert` (its `CompiledModel`), else
`tflite-runtime` or TensorFlow (the `Interpreter`, with `--delegate SO` for a GPU delegate); for
the ONNX pair of `--target tensorrt` (`STEM.onnx` names `STEM.prefill.onnx` and
`STEM.decode.onnx`), onnxruntime with TensorRT's or CUDA's execution provider where installed.
The file's two signatures carry the key/value cache in and out: `prefill(token_ids [1, P])`
over the right-padded prompt, then one `decode(token_id, position, cache)` per new token. A
`--target gl` export is the pair `STEM.prefill.tflite` / `STEM.decode.tflite`, given as
`STEM.tflite` (one interpreter and delegate each); a file exported with `--embedding host` (the
gpu/gl default) takes the rows `table[ids]` from `FILE.embeddings.npy` instead of token ids.
The prompt is `<s>` + its SentencePiece pieces; generation stops at `</s>` or after
`--max-new-tokens`. Ids, lengths and special tokens come from `FILE.json`, tensor names and keys
from `FILE.contract.json`, both written beside the file by `keras-posenc export --generate`; every
model file is checked (size, sha256, the TFLite identifier) before a runtime opens it.

Prints the text, the time to first token, the decode tokens/s and a checksum of the generated
ids; with `--json` one object `{"ids", "text", "ttft_ms", "decode_tokens_per_s"}`, as
`keras-posenc generate --json` prints.

Usage:
    python3 run_generate.py model.tflite --spm spm.model --prompt "The module" [--max-new-tokens 32]
        [--accelerator cpu|gpu] [--delegate libtensorflowlite_gpu_delegate.so]
        [--sampler greedy|top_k|top_p --temperature T --top-k K --top-p P --seed S] [--json]
"""

import argparse
import json
import os
import sys
import time

import numpy as np
from kit_contract import fail, open_export, stdout_to_stderr
from kit_embeddings import HostTable
from kit_sessions import open_session


def sample(logits, rng, sampler="greedy", temperature=1.0, k=None, p=None):
    """The next id from float logits `[vocab]`: argmax, or top-k / top-p sampling (seeded `rng`)."""
    logits = np.asarray(logits, np.float64)
    if sampler == "greedy":
        return int(np.argmax(logits))
    scaled = logits / temperature
    order = np.argsort(-scaled, kind="stable")
    probabilities = np.exp(scaled[order] - scaled[order[0]])
    probabilities /= probabilities.sum()
    if sampler == "top_k":
        keep = np.arange(len(order)) < k
    else:
        keep = np.cumsum(probabilities) - probabilities < p
    probabilities = np.where(keep, probabilities, 0.0)
    return int(order[rng.choice(len(order), p=probabilities / probabilities.sum())])


def generate(session, meta, prompt_ids, max_new_tokens, rng, clock=time.perf_counter, chosen=None,
             **sampling):
    """Prefill + decode steps; returns `(ids, ttft_seconds, decode_seconds, decode_steps)`.

    `chosen`: an optional list that receives the float32 logits of each generated token.
    """
    prompt_length, cache_length = meta["prompt_length"], meta["cache_length"]
    pad_id, stop_id = meta["pad_id"], meta.get("eos_id")
    tensors = meta.tensors
    prefill, decode = meta.signatures
    n = len(prompt_ids)
    if n > prompt_length:
        raise SystemExit(f"The prompt has {n} tokens; this file's prefill takes at most {prompt_length} "
                         "(export with a larger --prompt-length).")
    if n + max_new_tokens - 1 > cache_length:
        raise SystemExit(f"{n} prompt tokens + --max-new-tokens {max_new_tokens} need "
                         f"{n + max_new_tokens - 1} cache slots; the file has {cache_length} "
                         "(export with a larger --cache-length).")
    tokens = np.full([1, prompt_length], pad_id, np.int32)
    tokens[0, :n] = prompt_ids
    start = clock()
    cache = session.run(prefill, {tensors.token_ids: tokens})
    logits = np.array(cache.pop(tensors.logits)[0, n - 1], np.float64)
    if chosen is not None:
        chosen.append(np.array(logits, np.float32))
    logits[pad_id] = -np.inf
    ids = [sample(logits, rng, **sampling)]
    ttft = clock() - start
    start, steps = clock(), 0
    while len(ids) < max_new_tokens and ids[-1] != stop_id:
        feeds = {tensors.token_id: np.array([[ids[-1]]], np.int32),
                 tensors.position: np.array([n + len(ids) - 1], np.int32),
                 **{tensors.past_prefix + name[len(tensors.present_prefix):]: value
                    for name, value in cache.items()}}
        cache = session.run(decode, feeds)
        logits = np.array(cache.pop(tensors.logits)[0], np.float64)
        if chosen is not None:
            chosen.append(np.array(logits, np.float32))
        logits[pad_id] = -np.inf
        ids.append(sample(logits, rng, **sampling))
        steps += 1
    return ids, ttft, clock() - start, steps


def checksum(ids):
    """An order-sensitive checksum of the generated ids (equal runs print equal checksums)."""
    return int(sum((i + 1) * (token + 1) for i, token in enumerate(ids)) % 1000003)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="prefill/decode .tflite from `keras-posenc export --generate` "
                                      "(STEM.tflite for the STEM.prefill.tflite/STEM.decode.tflite pair "
                                      "of --target gl), or "
                                      "STEM.onnx for the STEM.prefill.onnx/STEM.decode.onnx pair of "
                                      "--target tensorrt (onnxruntime)")
    parser.add_argument("--spm", help="the run's SentencePiece model (spm.model); needed with --prompt")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the text to continue")
    prompt.add_argument("--prompt-ids", help="the prompt as comma-separated token ids, `<s>` included "
                                             "(no SentencePiece needed; the text is then not decoded)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="default 32")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu", help="default cpu")
    parser.add_argument("--delegate", help="tflite-runtime: a delegate library for --accelerator gpu")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default="fp32", help="LiteRT GPU precision")
    parser.add_argument("--threads", type=int, help="CPU threads")
    parser.add_argument("--runtime", choices=("auto", "litert", "interpreter"), default="auto",
                        help="auto: ai-edge-litert's CompiledModel when installed, else the Interpreter")
    parser.add_argument("--sampler", choices=("greedy", "top_k", "top_p"), default="greedy")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, dest="k")
    parser.add_argument("--top-p", type=float, dest="p")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--logits", help="write the logits of each generated token to this .npy "
                                         "([tokens, vocab] float32, for parity checks)")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.sampler == "top_k" and (args.k is None or args.k < 1):
        parser.error("--sampler top_k needs --top-k K >= 1")
    if args.sampler == "top_p" and (args.p is None or not 0 < args.p <= 1):
        parser.error("--sampler top_p needs --top-p P in (0, 1]")
    if not args.temperature > 0:
        parser.error(f"--temperature must be > 0, got {args.temperature}")
    if args.prompt is not None and not args.spm:
        parser.error("--prompt needs --spm SPM_MODEL (or give --prompt-ids)")
    if args.prompt_ids is not None:
        try:
            args.prompt_ids = [int(i) for i in args.prompt_ids.split(",")]
        except ValueError:
            parser.error(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}")
    if args.spm is not None and not os.path.isfile(args.spm):
        parser.error(f"file not found: {args.spm}")
    return args


def embedding_table(meta):
    """The token table of a file that takes looked-up `embeddings` (`kit_embeddings.HostTable`), else None."""
    return HostTable(meta) if meta.get("embedding_table") else None


def make_session(args, meta):
    """The session of the file (`kit_sessions.open_session`)."""
    return open_session(args, meta)


def main(argv=None):
    args = parse_args(argv)
    meta = open_export(args.model)
    if not meta.is_kind("prefill_decode"):
        fail(f"{args.model} is not a prefill/decode file: export it with "
             "`keras-posenc export MODEL --generate`.")
    meta.check_accelerator(args.accelerator)
    for path in sorted(set(meta.signature_files().values())):
        meta.verify(path, tflite=not args.model.endswith(".onnx"))
    processor = None
    if args.spm:
        import sentencepiece as spm

        processor = spm.SentencePieceProcessor()
        processor.Load(args.spm)
    if args.prompt_ids is not None:
        prompt_ids = args.prompt_ids
        bad = [i for i in prompt_ids if not 0 <= i < meta["vocab_size"]]
        if bad:
            raise SystemExit(f"--prompt-ids: {bad[0]} is outside the vocabulary [0, {meta['vocab_size']}).")
    else:
        prompt_ids = [meta["bos_id"]] + list(processor.EncodeAsIds(args.prompt))
    table = embedding_table(meta)
    chosen = []
    with stdout_to_stderr(args.json):  # native runtimes print on fd 1: keep it for the JSON object
        session = make_session(args, meta)
        session.table = table
        ids, ttft, decode_seconds, steps = generate(
            session, meta, prompt_ids, args.max_new_tokens, np.random.default_rng(args.seed), chosen=chosen,
            sampler=args.sampler, temperature=args.temperature, k=args.k, p=args.p)
    if args.logits:
        np.save(args.logits, np.stack(chosen))
    special = set(meta["special_ids"]) - {meta["unk_id"]}
    text = processor.DecodeIds([i for i in ids if i not in special]) if processor else None
    rate = steps / decode_seconds if steps and decode_seconds > 0 else None
    if args.json:
        print(json.dumps({"ids": ids, "text": text, "ttft_ms": ttft * 1e3, "decode_tokens_per_s": rate}))
        return 0
    print(f"runtime: {session.name}  accelerator: {args.accelerator}  fully accelerated: "
          f"{session.fully_accelerated}")
    print(f"{args.prompt} {text}" if processor else f"ids: {ids}")
    rate_text = "n/a (one token)" if rate is None else f"{rate:.1f} tokens/s"
    print(f"time to first token {ttft * 1e3:.1f} ms, decode {rate_text} ({len(ids)} tokens), "
          f"checksum {checksum(ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
