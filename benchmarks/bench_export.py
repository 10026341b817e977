"""TFLite export: CPU (XNNPACK) latency against the Keras model's tf.function, and file sizes.

The model is the demo's causal LM (`keras_posenc.train.CausalLM`: Encoder, 2
layers, d_model 64, 4 heads, dff 128, vocab 1000) with max_length 128, at
batch 1 and length 128. Keras and TFLite calls are interleaved in every
repetition; the ratio is the median over repetitions of the per-repetition
median latencies. Keras runs with TensorFlow's default threads; the
interpreter with one thread (`--threads`), because XNNPACK's spinning worker
threads collapse on a shared, loaded machine (2 threads: p90 near a second),
and one thread is also what a single-stream edge process gets.

Also reported: the .tflite size against the model's weight bytes (trainable
+ non-trainable; the frozen position table and the graph are in the file but
not in the weights), float16 and dynamic_int8 sizes, the latency of the
GATHER export (`gpu_friendly=False`) to show what the one-hot lookup costs on
a CPU, and `export/run_tflite.py`'s own figures for the fp32 file.

Usage:
    python benchmarks/bench_export.py [--repetitions 15] [--calls 20]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

from keras_posenc import export
from keras_posenc.train import CausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
DEMO_MODEL = dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000, max_length=128,
                  dropout=0.0)

LARGE_MODEL = dict(num_layers=4, d_model=256, num_heads=4, dff=1024, vocab_size=8000, max_length=128,
                   dropout=0.0)


def median_call_ms(fn, calls):
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def interpreter_call(flat, token_ids, threads):
    interpreter = tf.lite.Interpreter(model_content=flat, num_threads=threads)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], token_ids)
    return interpreter.invoke


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="TFLite interpreter threads")
    args = parser.parse_args(argv)

    tf.keras.utils.set_random_seed(0)
    model = CausalLM(DEMO_MODEL, name="demo_lm")
    model.build_on_dummy()
    rng = np.random.default_rng(0)
    token_ids = rng.integers(1, DEMO_MODEL["vocab_size"], size=(1, args.length)).astype(np.int32)
    token_ids[0, args.length - args.length // 4:] = 0  # padding, as in a real batch

    flats = {
        "fp32": export.to_tflite(model, sequence_length=args.length),
        "float16": export.to_tflite(model, sequence_length=args.length, quantize="float16"),
        "dynamic_int8": export.to_tflite(model, sequence_length=args.length, quantize="dynamic_int8"),
        "fp32_gather": export.to_tflite(model, sequence_length=args.length, gpu_friendly=False),
    }
    keras_fn = tf.function(lambda ids: model(ids, training=False))
    ids_tensor = tf.constant(token_ids)
    candidates = {"keras": lambda: keras_fn(ids_tensor).numpy()}
    candidates.update({name: interpreter_call(flat, token_ids, args.threads) for name, flat in flats.items()})
    for fn in candidates.values():  # warm up: tracing, allocation, XNNPACK packing
        for _ in range(3):
            fn()
    per_rep = {name: [] for name in candidates}
    for _ in range(args.repetitions):
        for name, fn in candidates.items():
            per_rep[name].append(median_call_ms(fn, args.calls))
    ratios = {name: float(np.median(np.array(per_rep[name]) / np.array(per_rep["keras"])))
              for name in flats}
    medians = {name: float(np.median(values)) for name, values in per_rep.items()}

    weights = export.weight_bytes(model)
    print(f"B1 T{args.length}, demo-size causal LM, {args.repetitions} interleaved repetitions x "
          f"{args.calls} calls, {os.cpu_count()} CPUs, TFLite threads {args.threads}")
    print(f"{'variant':<14}{'median ms':>10}{'x keras':>9}{'bytes':>10}{'/ weights':>10}"
          f"{'parity':>10}  GPU-incompatible ops")
    print(f"{'keras tf.fn':<14}{medians['keras']:>10.3f}{1.0:>9.2f}{'':>10}{'':>10}")
    batch, _ = export.sample_token_batch(model, args.length)
    for name, flat in flats.items():
        parity = export.check_parity(model, flat, batch)
        print(f"{name:<14}{medians[name]:>10.3f}{ratios[name]:>9.2f}{len(flat):>10}"
              f"{len(flat) / weights:>10.3f}{parity:>10.2g}  {export.gpu_incompatible_ops(flat)}")
    transposes = export.op_counts(flats["fp32"]).get("TRANSPOSE", 0)
    table = args.length * DEMO_MODEL["d_model"] * 4
    print(f"fp32 file without the frozen position table ({table} bytes): "
          f"{(len(flats['fp32']) - table) / weights:.3f} x the weight bytes")
    print(f"weight bytes: {weights}; fp32 TRANSPOSE ops: {transposes}; "
          f"float16 / fp32 file: {len(flats['float16']) / len(flats['fp32']):.3f}")

    large = CausalLM(LARGE_MODEL, name="large_lm")
    large.build_on_dummy()
    large_flat = export.to_tflite(large, sequence_length=args.length)
    print(f"size only, {LARGE_MODEL}: fp32 file {len(large_flat)} bytes = "
          f"{len(large_flat) / export.weight_bytes(large):.3f} x the weight bytes "
          f"({export.weight_bytes(large)})")

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.tflite")
        with open(path, "wb") as f:
            f.write(flats["fp32"])
        with open(path + ".json", "w") as f:
            json.dump(export.runtime_metadata(model, args.length), f)
        runner = os.path.join(ROOT, "export", "run_tflite.py")
        command = [sys.executable, runner, path, "--iterations", "200", "--warmup", "10",
                   "--threads", str(args.threads)]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        print("export/run_tflite.py on the fp32 file (random ids from the metadata):")
        print("  " + "\n  ".join(result.stdout.strip().splitlines()))


if __name__ == "__main__":
    main()
