"""Compressed position tables: bytes, accuracy, speed, and a float precision study.

For `SinusoidalPositionEmbedding(table=KIND)`, KIND in full / interpolated
(64 stored dims) / factorized, all measured in this run:
  1. bytes stored as a fraction of the full float32 table: the layer's own
     constants (`table_nbytes`) and the Const tensors found in the
     `saved_model.pb` of a saved one-layer model; max and RMS error against
     the float64 table; error per dimension band (interpolated);
  2. forward time of each kind / table="full" (medians of interleaved
     repetitions, CPU, `tf.function`), B32 T512 D512 and B1 T128 D512, with
     positions 0..T-1 (no mask) and with a left-padded mask (per-sample ids);
  3. max error of attention logits `(PE Wq)(PE Wk)^T / sqrt(d)` with random
     projections, against the full table;
  4. precision at positions up to 8192 (depth 512): the float64 table stored
     as float16, angles computed in float16, angles computed in float32, and
     the factorized table (float32 constants).
  5. with --train-steps N: the training demo (`keras_posenc.app.train.train` with
     the `keras-posenc demo` settings and corpus, same seed and steps) per kind,
     at every d_model of --train-d-model; final train loss and held-out loss.
     At d_model 64 the interpolated table's default 64 stored dims are the
     whole width, so it is exact there; at d_model 128 it stores half.
Plots go to benchmarks/results/.

Run: python benchmarks/bench_tables.py [--reps N] [--train-steps N --train-d-model 64 128]
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from keras_posenc import tables
from keras_posenc.backend import keras
from keras_posenc.layers import SinusoidalPositionEmbedding

KINDS = ("full", "interpolated", "factorized")
SHAPES = ((512, 512), (2048, 768))
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def saved_constant_bytes(kind, length, depth):
    """Bytes of all Const tensors in the saved_model.pb of a one-layer model."""
    inputs = keras.Input([None, depth])
    model = keras.Model(inputs, SinusoidalPositionEmbedding(length, table=kind)(inputs))
    with tempfile.TemporaryDirectory() as path:
        model.save(path, save_format="tf")
        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
    graph = proto.meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return model.layers[1].table_nbytes, sum(
        len(n.attr["value"].tensor.tensor_content) for n in nodes if n.op == "Const")


def memory_and_error():
    print("## 1. Bytes and error against the float64 table\n")
    print("| (max_length, depth) | table | layer constants (bytes) | fraction of full | "
          "Const bytes in saved_model.pb | max abs error | RMS error |")
    print("|---|---|---|---|---|---|---|")
    reports = {}
    for length, depth in SHAPES:
        for kind in KINDS:
            report = tables.table_error_report(kind, length, depth)
            layer_bytes, saved = saved_constant_bytes(kind, length, depth)
            assert layer_bytes == report["stored_bytes"]
            reports[length, depth, kind] = report
            print(f"| ({length}, {depth}) | {kind} | {layer_bytes} | {report['fraction']:.4f} | {saved} | "
                  f"{report['max_abs_error']:.3g} | {report['rms_error']:.3g} |")
    print("\nInterpolated table (64 stored dims), error per band of columns (interleaved layout):\n")
    print("| (max_length, depth) | columns | max abs error | RMS error |")
    print("|---|---|---|---|")
    for length, depth in SHAPES:
        for band in reports[length, depth, "interpolated"]["bands"]:
            first, last = band["columns"]
            print(f"| ({length}, {depth}) | {first}-{last} | {band['max_abs_error']:.3g} | "
                  f"{band['rms_error']:.3g} |")
    plot_interpolated_error(reports)
    return reports


def tflite_sizes():
    """Flatbuffer bytes of a one-layer model converted with builtins only, batch 1, T 128, D 512."""
    print("TFLite (builtins only, batch 1, T 128, D 512, max_length 512), flatbuffer bytes:\n")
    print("| positions | full | interpolated | factorized |")
    print("|---|---|---|---|")
    for with_ids in (False, True):
        sizes = []
        for kind in KINDS:
            x = keras.Input([128, 512], batch_size=1)
            layer = SinusoidalPositionEmbedding(512, table=kind)
            if with_ids:
                ids = keras.Input([128], batch_size=1, dtype="int32")
                model = keras.Model([x, ids], layer(x, position_ids=ids))
            else:
                model = keras.Model(x, layer(x))
            converter = tf.lite.TFLiteConverter.from_keras_model(model)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            sizes.append(len(converter.convert()))
        label = "position_ids input" if with_ids else "0..T-1 (folded to a [128, 512] constant)"
        print(f"| {label} | " + " | ".join(str(n) for n in sizes) + " |")
    print()


def plot_interpolated_error(reports):
    fig, axes = plt.subplots(1, len(SHAPES), figsize=(11, 3.8))
    for ax, (length, depth) in zip(axes, SHAPES):
        exact = tables.sinusoidal_table(length, depth, dtype=np.float64)
        approx = tables.compressed_table("interpolated", length, depth)
        error = np.abs(approx - exact)
        for last, style in [(length // 16, ":"), (length // 4, "--"), (length, "-")]:
            ax.semilogy(np.maximum(error[:last].max(axis=0), 1e-9), style,
                        label=f"max over positions < {last}")
        ax.semilogy(np.sqrt((error ** 2).mean(axis=0)) + 1e-9, color="k", lw=0.8, label="RMS, all positions")
        stored = np.repeat(tables.interpolation_nodes((depth + 1) // 2, 32) * 2, 2) + np.tile([0, 1], 32)
        ax.plot(stored, np.full(stored.shape, 1e-9), "|", color="gray", label="stored columns")
        ax.set_title(f"interpolated, 64 of {depth} dims stored, max_length {length}")
        ax.set_xlabel("column (interleaved: 0 = highest frequency)")
        ax.set_ylabel("|error| vs float64 table")
        ax.set_ylim(5e-10, 5)
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    path = os.path.join(RESULTS, "tables_interpolated_error_per_dim.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"\nPlot: benchmarks/results/{os.path.basename(path)}\n")


def compiled_call(layer, with_mask):
    def call(x, mask):
        return layer(x, mask=mask) if with_mask else layer(x)
    return tf.function(call)


def timing(reps):
    print("## 2. Forward time, ratio to table=\"full\" (CPU, medians of interleaved repetitions)\n")
    print("| inputs | positions | interpolated / full | factorized / full | full (ms) |")
    print("|---|---|---|---|---|")
    for batch, length in [(32, 512), (1, 128)]:
        depth = 512
        x = tf.random.normal([batch, length, depth], seed=0)
        lengths = np.linspace(length // 2, length, batch).astype(int)
        mask = tf.constant(np.arange(length)[None] >= (length - lengths)[:, None])
        for positions, with_mask in [("0..T-1", False), ("from left-padded mask", True)]:
            fns = {}
            for kind in KINDS:
                layer = SinusoidalPositionEmbedding(512, table=kind)
                layer(x[:1, :4])
                fns[kind] = compiled_call(layer, with_mask)
                fns[kind](x, mask)  # trace
            seconds = {kind: [] for kind in KINDS}
            inner = max(1, 2000 // (batch * length // 64))
            for rep in range(reps):
                order = KINDS[rep % 3:] + KINDS[:rep % 3]
                for kind in order:
                    start = time.perf_counter()
                    for _ in range(inner):
                        out = fns[kind](x, mask)
                    out.numpy()
                    seconds[kind].append((time.perf_counter() - start) / inner)
            med = {kind: float(np.median(v)) for kind, v in seconds.items()}
            print(f"| B{batch} T{length} D{depth} | {positions} | {med['interpolated'] / med['full']:.2f} | "
                  f"{med['factorized'] / med['full']:.2f} | {1e3 * med['full']:.3f} |")
    print()


def attention_logits():
    print("## 3. Attention logits (PE Wq)(PE Wk)^T / sqrt(d), random Wq, Wk ~ N(0, 1/d), float64\n")
    print("| (max_length, depth) | table | max abs error | error / std of logits |")
    print("|---|---|---|---|")
    rng = np.random.RandomState(0)
    for length, depth in SHAPES:
        wq, wk = rng.standard_normal((2, depth, depth)) / np.sqrt(depth)
        exact = tables.sinusoidal_table(length, depth, dtype=np.float64)
        reference = (exact @ wq) @ (exact @ wk).T / np.sqrt(depth)
        scale = reference.std()
        for kind in KINDS:
            pe = tables.compressed_table(kind, length, depth).astype(np.float64)
            error = np.abs((pe @ wq) @ (pe @ wk).T / np.sqrt(depth) - reference).max()
            print(f"| ({length}, {depth}) | {kind} | {error:.3g} | {error / scale:.3g} |")
    print()


def precision_study():
    length, depth = 8192, 512
    exact = tables.sinusoidal_table(length, depth, dtype=np.float64)
    freq, is_sin = tables.column_frequencies(depth)

    def on_the_fly(dtype):
        # What a layer computing its encoding per call does in `dtype`.
        positions = tf.cast(tf.range(length), dtype)[:, None]
        angles = positions * tf.constant(freq, dtype)[None, :]
        return tf.where(is_sin, tf.sin(angles), tf.cos(angles)).numpy().astype(np.float64)

    variants = {
        "float64 table stored as float16": exact.astype(np.float16).astype(np.float64),
        "angles in float16": on_the_fly(tf.float16),
        "angles in float32": on_the_fly(tf.float32),
        "factorized table (float32 constants)": tables.compressed_table(
            "factorized", length, depth).astype(np.float64),
    }
    print("## 4. Precision study, depth 512: max abs error against the float64 table\n")
    limits = [128, 512, 2048, 8192]
    print("| variant | " + " | ".join(f"positions < {n}" for n in limits) + " |")
    print("|---|" + "---|" * len(limits))
    fig, ax = plt.subplots(figsize=(7, 4))
    chunk = 64
    starts = np.arange(0, length, chunk)
    for name, values in variants.items():
        per_position = np.abs(values - exact).max(axis=1)
        print(f"| {name} | " + " | ".join(f"{per_position[:n].max():.3g}" for n in limits) + " |")
        ax.semilogy(starts + chunk, np.maximum(per_position.reshape(-1, chunk).max(axis=1), 1e-9), label=name)
    ax.set_xlabel("position (max over each block of 64 positions)")
    ax.set_ylabel("max |error| over the 512 dims")
    ax.set_title("Sinusoidal table precision, depth 512")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    path = os.path.join(RESULTS, "tables_precision.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"\nPlot: benchmarks/results/{os.path.basename(path)}\n")


def demo_losses(steps, d_models):
    from keras_posenc.app.cli_train import DEMO_SETTINGS
    from keras_posenc.app.train import TrainConfig, train

    print(f"## 5. Training demo (`keras-posenc demo` settings), {steps} steps, seed 0\n")
    print("| d_model | table | final train loss | held-out loss |")
    print("|---|---|---|---|")
    for d_model in d_models:
        for kind in KINDS:
            with tempfile.TemporaryDirectory() as out:
                settings = {**DEMO_SETTINGS, "steps": steps, "d_model": d_model}
                report = train(TrainConfig(corpus=None, out=out, table=kind, seed=0, verbose=0, **settings))
            print(f"| {d_model} | {kind} | {report['final_train_loss']:.4f} | {report['eval_loss']:.4f} |",
                  flush=True)
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15, help="interleaved repetitions per timing case")
    parser.add_argument("--train-steps", type=int, default=0, help="also run the training demo per kind")
    parser.add_argument("--train-d-model", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--only-train", action="store_true", help="run the training demo only")
    args = parser.parse_args()
    if args.only_train:
        demo_losses(args.train_steps, args.train_d_model)
        return
    os.makedirs(RESULTS, exist_ok=True)
    memory_and_error()
    tflite_sizes()
    attention_logits()
    precision_study()
    timing(args.reps)
    if args.train_steps:
        demo_losses(args.train_steps, args.train_d_model)


if __name__ == "__main__":
    main()
