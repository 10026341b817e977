"""A custom training step and `model.fit` with the position layers' gather and add marked for XLA or not.

`backend.add_rows` marks the gather and the add of a masked position lookup
as one XLA cluster in Keras 3 TensorFlow graphs and leaves them plain on
Keras 2 (TF 2.12), whose clustering grows such a mark into the whole training
step: forward, gradients and Adam's updates. That step needs the count of
distinct token ids (the size of the embedding's deduplicated sparse gradient)
at compile time, so TensorFlow compiles it again each time a new count
repeats.

The model is the `keras-posenc demo` CausalLM (2 layers, d_model 64, 4 heads,
dff 128, vocabulary 1000), batches of 16 rows of 48 random tokens (no padding,
so every row takes the one-gather path), Adam at 1e-2. Two copies with the
same weights run in this process, one calling the package's `add_rows` and one
calling the marked gather and add (the code before the change, rebuilt here);
both see the same batches, in alternating blocks of `--block` steps. Timed:
every step including its compilations (what a user waits for), for

  (a) a `tf.function` training step (GradientTape, `apply_gradients`);
  (b) `model.fit` over the same batches (`steps_per_epoch` = `--steps`).

Printed: seconds for each, and the ratio marked / package (> 1: the mark
costs time). On Keras 3 both copies carry the mark, so the ratio is noise
around 1.00 by construction; run it there to see that.

Run: python benchmarks/bench_train_step.py [--steps 150] [--block 25]
     KERAS_BACKEND=tensorflow .venv-keras3/bin/python benchmarks/bench_train_step.py
"""

import argparse
import os
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import keras_posenc.layers.position_embedding_base as position_base
from keras_posenc.backend import add_rows, keras, keras_version
from keras_posenc.models import CausalLM

DEMO = dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000, max_length=48, dropout=0.0)
ROWS, LENGTH = 16, 48


def marked_add_rows(x, table, ids):
    """The gather and add as `add_rows` wrote them on every TensorFlow stack before the change."""
    if not tf.executing_eagerly():
        with tf.xla.experimental.jit_scope(compile_ops=True, separate_compiled_gradients=False):
            return x + tf.gather(table, ids)
    return x + tf.gather(table, ids)


class Variant:
    """A demo CausalLM whose position layer's gather and add are `add`, with its own step and fit."""

    def __init__(self, add, weights=None):
        self.add = add
        keras.utils.set_random_seed(11)
        self.model = CausalLM(DEMO, name="demo")
        self.model.build_on_dummy()
        if weights is not None:
            self.model.set_weights(weights)
        self.optimizer = keras.optimizers.Adam(1e-2)
        self.step = tf.function(self._step)
        self.model.compile(optimizer=keras.optimizers.Adam(1e-2),
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def _step(self, ids):
        model = self.model
        with tf.GradientTape() as tape:
            logits = model(ids[:, :-1], training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(ids[:, 1:], logits,
                                                                               from_logits=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def run(self, batches, mode):
        """Seconds for `batches` through the custom step ("step") or `model.fit` ("fit")."""
        position_base.add_rows = self.add  # the layer's module reads the name when a call is traced
        start = time.perf_counter()
        if mode == "step":
            for ids in batches:
                self.step(tf.constant(ids))
        else:
            ids = np.concatenate(batches)
            self.model.fit(ids[:, :-1], ids[:, 1:], batch_size=ROWS, epochs=1, shuffle=False, verbose=0)
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--block", type=int, default=25)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batches = [rng.integers(1, DEMO["vocab_size"], [ROWS, LENGTH + 1]).astype(np.int32)
               for _ in range(args.steps)]
    package = Variant(add_rows)
    marked = Variant(marked_add_rows, package.model.get_weights())
    print(f"Keras {keras_version()}, TF {tf.__version__}: {args.steps} steps of {ROWS} x {LENGTH} tokens, "
          f"blocks of {args.block}")
    for mode, label in (("step", "(a) tf.function step"), ("fit", "(b) model.fit")):
        seconds = {"package": 0.0, "marked": 0.0}
        for first in range(0, args.steps, args.block):
            block = batches[first:first + args.block]
            seconds["package"] += package.run(block, mode)
            seconds["marked"] += marked.run(block, mode)
        print(f"  {label}: package {seconds['package']:.1f} s, marked {seconds['marked']:.1f} s, "
              f"marked / package {seconds['marked'] / seconds['package']:.2f}x")


if __name__ == "__main__":
    main()
