"""Export targets: op counts, file bytes / weight bytes and CPU latency / Keras latency, per target.

The model is the demo's causal LM (`keras_posenc.models.CausalLM`: Encoder, 2 layers, d_model 64,
4 heads, dff 128, vocab 1000, max_length 48) at batch 1 and length 48. For each target
(`gpu`, `gl`, `cpu` as TFLite; `tensorrt` as ONNX, when tf2onnx and onnxruntime are importable,
e.g. with `PYTHONPATH=.edge-cache/onnx-site` after `make test-edge`) it prints the number of
ops and the most frequent ones, the file size against the weight bytes, the parity against
Keras, the per-backend GPU verdicts, and the CPU latency of the file (TFLite interpreter with
XNNPACK, one thread; onnxruntime, one thread) against the Keras model's `tf.function`.

The emulated GPUs of `make test-edge` are CPUs, so no GPU time is measured here. Keras and the
files are called interleaved in every repetition; a ratio is the median over repetitions of the
per-repetition median latencies. The interpreter runs one thread because XNNPACK's spinning
workers collapse on a shared machine, and one thread is what a single-stream edge process gets.

Usage:
    python benchmarks/bench_export.py [--repetitions 15] [--calls 20] [--length 48]
"""

import argparse
import collections
import os
import time

import numpy as np
import tensorflow as tf

from keras_posenc import export
from keras_posenc.backend import keras
from keras_posenc.models import CausalLM

DEMO_MODEL = dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000, max_length=48, dropout=0.0)


def median_call_ms(fn, calls):
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def interpreter_call(flat, feed, threads):
    interpreter = export.interpreter_class()(model_content=flat, num_threads=threads)
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    interpreter.set_tensor(detail["index"], feed.astype(detail["dtype"]))
    return interpreter.invoke


def onnx_call(onnx_bytes, feed, threads):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda: session.run(None, {name: feed})


def top_ops(counts, n=6):
    return ", ".join(f"{name} {count}" for name, count in collections.Counter(counts).most_common(n))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="TFLite / onnxruntime threads")
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    model = CausalLM(dict(DEMO_MODEL, max_length=max(args.length, DEMO_MODEL["max_length"])), name="demo_lm")
    model.build_on_dummy()
    rng = np.random.default_rng(0)
    token_ids = rng.integers(1, DEMO_MODEL["vocab_size"], size=(1, args.length)).astype(np.int32)
    token_ids[0, args.length - args.length // 4:] = 0  # padding, as in a real batch
    batch, _ = export.sample_token_batch(model, args.length)

    files = {target: export.to_tflite(model, sequence_length=args.length, target=target)
             for target in ("gpu", "gl", "cpu")}
    files["gpu float16"] = export.to_tflite(model, sequence_length=args.length, quantize="float16")
    candidates = {name: interpreter_call(flat, token_ids, args.threads) for name, flat in files.items()}
    try:
        onnx_bytes = export.to_onnx(model, sequence_length=args.length)
        candidates["tensorrt (onnxruntime)"] = onnx_call(onnx_bytes, token_ids, args.threads)
    except ImportError as error:
        onnx_bytes = None
        print(f"tensorrt target skipped: {error}")
    keras_fn = tf.function(lambda ids: model(ids, training=False))
    ids_tensor = tf.constant(token_ids)
    candidates = {"keras": lambda: keras_fn(ids_tensor).numpy(), **candidates}
    for fn in candidates.values():  # warm up: tracing, allocation, XNNPACK packing
        for _ in range(3):
            fn()
    per_rep = {name: [] for name in candidates}
    for _ in range(args.repetitions):
        for name, fn in candidates.items():
            per_rep[name].append(median_call_ms(fn, args.calls))
    medians = {name: float(np.median(values)) for name, values in per_rep.items()}
    ratios = {name: float(np.median(np.array(per_rep[name]) / np.array(per_rep["keras"])))
              for name in candidates}

    weights = export.weight_bytes(model)
    print(f"B1 T{args.length}, demo-size causal LM ({weights} weight bytes), {args.repetitions} interleaved "
          f"repetitions x {args.calls} calls, {os.cpu_count()} CPUs, threads {args.threads}")
    print(f"{'target':<24}{'ops':>5}{'bytes':>10}{'/ weights':>10}{'CPU ms':>9}{'/ keras':>9}{'parity':>10}")
    print(f"{'keras tf.function':<24}{'':>5}{'':>10}{'':>10}{medians['keras']:>9.3f}{1.0:>9.2f}")
    for name, flat in files.items():
        parity = export.check_parity(model, flat, batch)
        ops = export.op_counts(flat)
        print(f"{name:<24}{sum(ops.values()):>5}{len(flat):>10}{len(flat) / weights:>10.3f}"
              f"{medians[name]:>9.3f}{ratios[name]:>9.2f}{parity:>10.2g}")
    if onnx_bytes is not None:
        import onnx

        nodes = collections.Counter(node.op_type for node in onnx.load_from_string(onnx_bytes).graph.node)
        parity = export.check_onnx_parity(model, onnx_bytes, batch)
        name = "tensorrt (onnxruntime)"
        print(f"{name:<24}{sum(nodes.values()):>5}{len(onnx_bytes):>10}{len(onnx_bytes) / weights:>10.3f}"
              f"{medians[name]:>9.3f}{ratios[name]:>9.2f}{parity:>10.2g}")
    print("Most frequent ops and the verdict per backend:")
    for name, flat in files.items():
        print(f"  {name}: {top_ops(export.op_counts(flat))}")
        for backend in ("webgpu", "gl"):
            print(f"    {export.verdict_line(flat, backend)}")
    if onnx_bytes is not None:
        print(f"  tensorrt: {top_ops(nodes)}")


if __name__ == "__main__":
    main()
