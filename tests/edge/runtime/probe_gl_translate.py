"""Greedy translation with an encode/decode `.tflite` pair on the GL delegate (mediapipe); one JSON line.

A `gl` translator export is two one-signature files, `STEM.encode.tflite` and `STEM.decode.tflite`
(the classic GPU delegate serves one subgraph per interpreter). Each runs in its own mediapipe graph
(probe_gl_generate's `Signature`), kept open for every sentence and step. Per sentence: `encode` once
on its source row, then `decode` steps from `bos_id` at position 0, each fed the cross keys/values
and the source mask of `encode` and the previous step's `present_*` outputs as `past_*` (zeros at
the first step); the next token is the argmax of the logits with `pad_id` and `bos_id` forbidden,
and the sentence ends at `eos_id` or after `max_new_tokens` steps (the end token counted), as
`Seq2SeqTransformer.translate(..., beam_size=1)` does.

    python probe_gl_translate.py SPEC.json OUTPUT.npz [--cpu | --fp16]

SPEC.json: {"encode": {"model", "inputs", "outputs"}, "decode": {...}, "sources" (id rows of length
S), "max_new_tokens", "pad_id", "bos_id", "eos_id", "cache_shape", "forced" (optional: per sentence,
the tokens to feed instead of the argmax, one step each: teacher forcing)}. OUTPUT.npz, per sentence
k: `ids_k` (the greedy ids without the end token; with `forced`, the argmax of every step) and
`logits_k` (the float32 logits of each step, the one that chose the end token included). The JSON
line adds `ttft_ms` (the first sentence's encode and first decode step, shader compilation
included) and `decode_tokens_per_s` (every later decode step).
"""

import argparse
import json
import sys
import time

import numpy as np
from probe_gl_generate import Signature  # imports probe_gl first: its module stubs precede mediapipe


def translate(encode, decode, spec, source, forced=None):
    """`(ids, logits, ttft seconds, decode steps after the first, their seconds)` of one sentence."""
    start = time.perf_counter()
    cross = encode.run({"source_ids": np.asarray([source])})
    past = {name: np.zeros(spec["cache_shape"], np.float32) for name in spec["decode"]["inputs"]
            if name.startswith("past_")}
    steps = spec["max_new_tokens"] if forced is None else len(forced)
    token, ids, chosen = spec["bos_id"], [], []
    ttft, later = None, None
    for step in range(steps):
        outputs = decode.run(dict(cross, **past, token_id=np.array([[token]]), position=np.array([step])))
        if ttft is None:
            ttft, later = time.perf_counter() - start, time.perf_counter()
        logits = outputs.pop("logits")
        chosen.append(logits)
        masked = np.array(logits, np.float64)
        masked[[spec["pad_id"], spec["bos_id"]]] = -np.inf
        choice = int(np.argmax(masked))
        if forced is None and choice == spec["eos_id"]:
            break
        ids.append(choice)
        token = choice if forced is None else forced[step]
        past = {name.replace("present_", "past_"): value for name, value in outputs.items()}
    return ids, np.stack(chosen), ttft, len(chosen) - 1, time.perf_counter() - later


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("output")
    parser.add_argument("--cpu", action="store_true", help="TFLite CPU kernels instead of the GL delegate")
    parser.add_argument("--fp16", action="store_true", help="allow_precision_loss: true")
    args = parser.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    encode, decode = (Signature(spec[key], args.cpu, args.fp16) for key in ("encode", "decode"))
    forced = spec.get("forced") or [None] * len(spec["sources"])
    arrays, translations, ttfts, steps, seconds = {}, [], [], 0, 0.0
    for k, (source, tokens) in enumerate(zip(spec["sources"], forced)):
        ids, logits, ttft, later, spent = translate(encode, decode, spec, source, tokens)
        arrays[f"ids_{k}"], arrays[f"logits_{k}"] = np.array(ids, np.int64), logits
        translations.append(ids)
        ttfts.append(ttft)
        steps, seconds = steps + later, seconds + spent
    encode.close()
    decode.close()
    np.savez(args.output, **arrays)
    finite = all(np.isfinite(arrays[f"logits_{k}"]).all() for k in range(len(translations)))
    print(json.dumps({"ids": translations, "finite": bool(finite), "ttft_ms": ttfts[0] * 1e3,
                      "decode_tokens_per_s": steps / seconds if steps and seconds > 0 else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
