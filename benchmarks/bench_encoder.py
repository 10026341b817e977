"""Train-step throughput of one EncoderLayer against keras-nlp / keras-hub and TF Model Garden blocks.

One encoder block each, same shape (default d_model 256, 4 heads, dff 1024,
batch 32, length 128), on the CPU:
  - ours: `keras_posenc.EncoderLayer(d_model, heads, dff)`, padding mask as
    the Keras `mask` argument;
  - keras-nlp 0.5.2 `keras_nlp.layers.TransformerEncoder`, `padding_mask=`;
  - TF Model Garden 2.12 `official.nlp.modeling.layers.TransformerEncoderBlock`,
    given the `[B, T, T]` mask built by Model Garden's own `SelfAttentionMask`
    inside the step (that is what its users have to do).
All three are post-LN with ReLU and dropout 0.1 on attention probabilities and
on both sublayer outputs. Every block gets the same embedded float input, the
same padding mask (real lengths drawn in [T/2, T]), the same masked MSE loss
and a fresh Adam optimizer; the train step is a `tf.function` (no XLA).

Timing: after a warm-up (tracing) step per model, each repetition runs
`--steps` steps of every model, in an order rotated every repetition; tokens/s
is `batch * length * steps / seconds`, measured both in wall-clock seconds and in
seconds of CPU time used by this process (less sensitive to other processes
on a shared machine). Printed: the median tokens/s of each
model and the ratios ours/peer (median and range of the per-repetition ratios).

Peers need their own environment (they pin other versions than this
package's tests), e.g. tensorflow 2.12.0, keras-nlp 0.5.2 and
tf-models-official 2.12.0 (see requirements/). A missing peer is reported and
skipped.

On Keras 3 (requirements/tf221.txt) the peer is keras-hub's
`TransformerEncoder` (`padding_mask=`), on the TensorFlow backend and on JAX
(KERAS_BACKEND=jax). Both blocks are wrapped in the same functional model
(inputs x and mask) and trained by the same driver, `train_on_batch` with
Adam and the padding mask as sample weights: a `tf.function` without XLA on
TensorFlow, `jax.jit` on JAX.

Run from the repository root: python benchmarks/bench_encoder.py [--reps N] [--steps N]
"""

import argparse
import os
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from keras_posenc import EncoderLayer  # noqa: E402
from keras_posenc.backend import backend_name, is_keras3, keras, keras_version  # noqa: E402


def build_blocks(d_model, heads, dff, dropout):
    """name -> (layer, call(layer, x, mask, training)) for every available implementation."""
    blocks = {"ours": (EncoderLayer(d_model, heads, dff, dropout=dropout),
                       lambda layer, x, mask: layer(x, mask=mask, training=True))}
    try:
        import keras_nlp
        layer = keras_nlp.layers.TransformerEncoder(dff, heads, dropout=dropout)
        blocks[f"keras-nlp {keras_nlp.__version__} TransformerEncoder"] = (
            layer, lambda layer, x, mask: layer(x, padding_mask=mask, training=True))
    except ImportError as error:
        print(f"skipped keras-nlp: {error}")
    try:
        import tensorflow as tf
        from official.nlp.modeling import layers as mg_layers
        layer = mg_layers.TransformerEncoderBlock(
            num_attention_heads=heads, inner_dim=dff, inner_activation="relu",
            output_dropout=dropout, attention_dropout=dropout)
        self_attention_mask = mg_layers.SelfAttentionMask()

        def call_model_garden(layer, x, mask):
            return layer([x, self_attention_mask(x, tf.cast(mask, tf.int32))], training=True)

        blocks["Model Garden 2.12 TransformerEncoderBlock"] = (layer, call_model_garden)
    except ImportError as error:
        print(f"skipped Model Garden: {error}")
    return blocks


def build_keras3_blocks(d_model, heads, dff, dropout):
    """Keras 3: name -> (layer, call) for ours and keras-hub's TransformerEncoder."""
    blocks = {"ours": (EncoderLayer(d_model, heads, dff, dropout=dropout),
                       lambda layer, x, mask: layer(x, mask=mask))}
    try:
        import keras_hub
        layer = keras_hub.layers.TransformerEncoder(dff, heads, dropout=dropout)
        blocks[f"keras-hub {keras_hub.__version__} TransformerEncoder"] = (
            layer, lambda layer, x, mask: layer(x, padding_mask=mask))
    except ImportError as error:
        print(f"skipped keras-hub: {error}")
    return blocks


def make_keras3_step(layer, call, shape):
    """One `train_on_batch` of a functional model around the block (same driver for every block)."""
    x_in = keras.Input(shape[1:], name="x")
    mask_in = keras.Input(shape[1:2], dtype="bool", name="mask")
    model = keras.Model([x_in, mask_in], call(layer, x_in, mask_in))
    model.compile(keras.optimizers.Adam(1e-4), loss="mse", jit_compile=backend_name() == "jax")

    def train_step(x, mask, target):
        return model.train_on_batch([x, mask], target, sample_weight=mask.astype("float32"))

    return train_step


def make_train_step(layer, call):
    import tensorflow as tf

    optimizer = keras.optimizers.Adam(1e-4)

    @tf.function
    def train_step(x, mask, target):
        with tf.GradientTape() as tape:
            y = call(layer, x, mask)
            weights = tf.cast(mask, y.dtype)[:, :, None]
            loss = tf.reduce_sum(weights * (y - target) ** 2) / tf.reduce_sum(weights)
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(grads, layer.trainable_variables))
        return loss

    return train_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dff", type=int, default=1024)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    shape = (args.batch, args.length, args.d_model)
    x = rng.normal(size=shape).astype("float32")
    target = rng.normal(size=shape).astype("float32")
    lengths = rng.randint(args.length // 2, args.length + 1, size=args.batch)
    mask = np.arange(args.length)[None, :] < lengths[:, None]

    steps = {}
    if is_keras3():
        for name, (layer, call) in build_keras3_blocks(args.d_model, args.heads, args.dff,
                                                       args.dropout).items():
            steps[name] = make_keras3_step(layer, call, shape)
            loss = steps[name](x, mask, target)  # traces and builds
            print(f"{name}: {layer.count_params()} parameters, first loss {float(loss):.3f}")
    else:
        import tensorflow as tf

        x, target, mask = tf.constant(x), tf.constant(target), tf.constant(mask)
        for name, (layer, call) in build_blocks(args.d_model, args.heads, args.dff,
                                                args.dropout).items():
            steps[name] = make_train_step(layer, call)
            loss = steps[name](x, mask, target)  # traces and builds
            print(f"{name}: {layer.count_params()} parameters, first loss {float(loss):.3f}")

    names = list(steps)
    tokens = args.batch * args.length * args.steps
    rates = {name: [] for name in names}
    cpu_rates = {name: [] for name in names}
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                loss = steps[name](x, mask, target)
            float(loss)  # wait for the last step
            rates[name].append(tokens / (time.perf_counter() - start))
            cpu_rates[name].append(tokens / (time.process_time() - cpu_start))

    print(f"\nB{args.batch} T{args.length} d_model {args.d_model} heads {args.heads} dff {args.dff}, "
          f"{args.reps} reps x {args.steps} steps, Keras {keras_version()} ({backend_name()}), "
          f"{os.cpu_count()} CPU cores")
    for label, table in (("wall-clock", rates), ("process CPU time", cpu_rates)):
        print(f" {label}:")
        for name in names:
            print(f"  {name:45s} {np.median(table[name]):10.0f} tokens/s")
        ours = np.array(table["ours"])
        for name in names[1:]:
            ratios = ours / np.array(table[name])
            print(f"  ratio ours / {name}: {np.median(ratios):.3f} "
                  f"(per-repetition range {ratios.min():.3f}-{ratios.max():.3f})")

if __name__ == "__main__":
    main()
