#!/usr/bin/env python3
"""Runs an exported keras_posenc `.tflite` model and prints latency percentiles and an output checksum.

Depends only on numpy and a TFLite runtime: `tflite-runtime` (JetPack 5,
Python 3.8) or `ai-edge-litert` (JetPack 6); falls back to TensorFlow's
`tf.lite.Interpreter` where neither is installed (development machines).

Token ids come from `--token-ids FILE.npy` (int, `[batch, length]` of the
model), else random ids drawn with `--seed` from `[1, vocab_size)`, the vocab
size read from `MODEL.tflite.json` (written by `keras-posenc export`) or
given with `--vocab-size`. Language ids, when the model has that input, are
0 unless `--language-ids FILE.npy` is given.

Usage:
    python3 run_tflite.py model.tflite [--delegate libtensorflowlite_gpu_delegate.so]
                                       [--iterations 200] [--warmup 10] [--threads 4] [--json]
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def load_runtime():
    """`(name, Interpreter class, load_delegate function)` of the first runtime installed."""
    try:
        from tflite_runtime.interpreter import Interpreter, load_delegate
        return "tflite_runtime", Interpreter, load_delegate
    except ImportError:
        pass
    try:
        from ai_edge_litert.interpreter import Interpreter, load_delegate
        return "ai_edge_litert", Interpreter, load_delegate
    except ImportError:
        pass
    try:
        import tensorflow as tf
    except ImportError:
        raise SystemExit("No TFLite runtime: pip install tflite-runtime (JetPack 5) or ai-edge-litert "
                         "(JetPack 6).") from None
    return "tensorflow", tf.lite.Interpreter, tf.lite.experimental.load_delegate


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help=".tflite file from `keras-posenc export`")
    parser.add_argument("--delegate", help="delegate library, e.g. libtensorflowlite_gpu_delegate.so")
    parser.add_argument("--iterations", type=int, default=100, help="timed runs (default 100)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    parser.add_argument("--threads", type=int, help="CPU threads of the interpreter")
    parser.add_argument("--token-ids", help="int .npy of the model's input shape")
    parser.add_argument("--language-ids", help="int .npy for the language input, if the model has one")
    parser.add_argument("--vocab-size", type=int, help="for random ids (default: from MODEL.tflite.json)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0:
        parser.error(f"--iterations must be >= 1 and --warmup >= 0, got {args.iterations} and {args.warmup}")
    if not os.path.isfile(args.model):
        parser.error(f"model file not found: {args.model}")
    return args


def read_metadata(model_path):
    path = model_path + ".json"
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def make_inputs(details, args, metadata):
    """One array per interpreter input, matched by name (token_ids / language_ids)."""
    rng = np.random.default_rng(args.seed)
    feeds = {}
    for detail in details:
        shape, dtype = tuple(int(n) for n in detail["shape"]), detail["dtype"]
        if "language_ids" in detail["name"]:
            values = np.load(args.language_ids) if args.language_ids else np.zeros(shape)
        elif args.token_ids:
            values = np.load(args.token_ids)
        else:
            vocab = args.vocab_size or metadata.get("vocab_size")
            if not vocab:
                raise SystemExit(f"No vocab size for random token ids: pass --vocab-size or --token-ids, or "
                                 f"keep {args.model}.json from `keras-posenc export` beside the model.")
            values = rng.integers(1, vocab, size=shape)
        if tuple(values.shape) != shape:
            raise SystemExit(f"Input '{detail['name']}' needs shape {shape}, got {tuple(values.shape)}.")
        feeds[detail["index"]] = values.astype(dtype)
    return feeds


def main(argv=None):
    args = parse_args(argv)
    runtime, interpreter_class, load_delegate = load_runtime()
    delegates = [load_delegate(args.delegate)] if args.delegate else None
    kwargs = {"num_threads": args.threads} if args.threads else {}
    interpreter = interpreter_class(model_path=args.model, experimental_delegates=delegates, **kwargs)
    interpreter.allocate_tensors()
    feeds = make_inputs(interpreter.get_input_details(), args, read_metadata(args.model))
    output = interpreter.get_output_details()[0]
    for index, values in feeds.items():
        interpreter.set_tensor(index, values)
    for _ in range(args.warmup):
        interpreter.invoke()
    times = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        interpreter.invoke()
        times.append(time.perf_counter() - start)
    result = interpreter.get_tensor(output["index"]).astype(np.float64)
    p50, p90, p99 = (float(np.percentile(times, q)) * 1e3 for q in (50, 90, 99))
    summary = {
        "runtime": runtime, "delegate": args.delegate, "iterations": args.iterations,
        "p50_ms": p50, "p90_ms": p90, "p99_ms": p99,
        "output_shape": list(result.shape), "checksum": float(result.sum()),
        "mean_abs": float(np.abs(result).mean()),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"runtime: {runtime}  delegate: {args.delegate or 'none (CPU, XNNPACK)'}")
    print(f"latency over {args.iterations} runs: p50 {p50:.3f} ms  p90 {p90:.3f} ms  p99 {p99:.3f} ms")
    print(f"output {tuple(result.shape)}: checksum (sum) {summary['checksum']:.6f}  "
          f"mean |x| {summary['mean_abs']:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
