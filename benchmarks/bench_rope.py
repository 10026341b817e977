"""RotaryEmbedding against keras-hub's RotaryEmbedding on Keras 3, TensorFlow and JAX, as ratios.

Queries `[B, 512, 8, 64]` (float32, CPU), B = 32 and 1, rotated by
`RotaryEmbedding(max_length=512)` (ids 0..T-1: one cos/sin table of the
static length broadcast over the batch) and by
`keras_hub.layers.RotaryEmbedding()` (cos/sin computed in every call), both
compiled: inside `tf.function` on TensorFlow, `jax.jit` on JAX. The outputs
are checked equal first (both use the half layout and base 10000).

Printed: per backend and batch, the median over interleaved repetitions of
ours / keras-hub (below 1 is faster), and the median times. Without
`--backend` the script runs itself once per backend (subprocesses, since
Keras fixes its backend at import) and prints the four cells together.

Run: python benchmarks/bench_rope.py [--reps N]   (the Keras 3 venv: requirements/tf221.txt)
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SHAPE = (512, 8, 64)
BATCHES = (32, 1)


def _measure(backend, reps, calls):
    os.environ["KERAS_BACKEND"] = backend
    import keras
    import keras_hub
    import numpy as np

    from keras_posenc.layers import RotaryEmbedding

    ours_layer = RotaryEmbedding(max_length=SHAPE[0])
    hub_layer = keras_hub.layers.RotaryEmbedding()
    if backend == "jax":
        import jax

        def compile_(layer):
            return jax.jit(lambda q: layer(q))

        def sync(value):
            return value.block_until_ready()
    else:
        import tensorflow as tf

        def compile_(layer):
            return tf.function(lambda q: layer(q))

        def sync(value):
            return value.numpy()

    ours, hub = compile_(ours_layer), compile_(hub_layer)
    results = {}
    for batch in BATCHES:
        q = np.random.default_rng(0).standard_normal((batch,) + SHAPE, np.float32)
        q = keras.ops.convert_to_tensor(q)
        difference = np.max(np.abs(np.asarray(sync(ours(q))) - np.asarray(sync(hub(q)))))
        if difference > 1e-4:
            raise AssertionError(f"outputs differ by {difference}")
        times = {"ours": [], "hub": []}
        for _ in range(reps):
            for name, function in (("ours", ours), ("hub", hub)):
                start = time.perf_counter()
                for _ in range(calls):
                    out = function(q)
                sync(out)
                times[name].append((time.perf_counter() - start) / calls)
        ratios = [a / b for a, b in zip(times["ours"], times["hub"])]
        results[f"B{batch}"] = {"ratio": float(np.median(ratios)),
                                "ours_ms": 1e3 * float(np.median(times["ours"])),
                                "hub_ms": 1e3 * float(np.median(times["hub"])),
                                "max_abs_diff": float(difference)}
    versions = {"keras": keras.__version__, "keras_hub": keras_hub.__version__}
    if backend == "jax":
        versions["jax"] = jax.__version__
    else:
        versions["tensorflow"] = tf.__version__
    return {"backend": backend, "versions": versions, "results": results}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5, help="calls per timed repetition")
    parser.add_argument("--backend", choices=["tensorflow", "jax"], help="one backend, printed as JSON")
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(_measure(args.backend, args.reps, args.calls)))
        return
    rows = []
    for backend in ("tensorflow", "jax"):
        out = subprocess.run([sys.executable, __file__, "--backend", backend, "--reps", str(args.reps),
                              "--calls", str(args.calls)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"q [B, {', '.join(map(str, SHAPE))}] float32, CPU; ours = RotaryEmbedding(max_length=512), "
          "hub = keras_hub.layers.RotaryEmbedding(); ratio = median of ours / hub per interleaved repetition")
    print("| backend | versions | B32 ours/hub | B1 ours/hub | B32 ms (ours, hub) | B1 ms (ours, hub) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        r = row["results"]
        versions = ", ".join(f"{k} {v}" for k, v in row["versions"].items())
        print(f"| {row['backend']} | {versions} | {r['B32']['ratio']:.2f}x | {r['B1']['ratio']:.2f}x | "
              f"{r['B32']['ours_ms']:.2f}, {r['B32']['hub_ms']:.2f} | {r['B1']['ours_ms']:.3f}, "
              f"{r['B1']['hub_ms']:.3f} |")


if __name__ == "__main__":
    main()
