"""Cost of SinusoidalPositionEmbedding on padded batches, as ratios to a bare add.

Everything runs on the CPU. On the TensorFlow backend (Keras 2, or Keras 3
with KERAS_BACKEND=tensorflow) inside `tf.function`s traced once with dynamic
shapes (`input_signature` with None batch and length), the way a Keras model
with variable-length batches runs; on JAX (KERAS_BACKEND=jax) inside
`jax.jit`. The padded batches pass their mask to the layer as a Keras mask
would arrive (`layer(x, mask=mask)`).

Printed ratios (medians over interleaved repetitions of the ratio within each
repetition, all measured in this run):
  (a) ours on a right-padded batch / bare `x + table[:T]`;
  (b) ours on a left-padded batch (per-sample ids derived from the mask) /
      the same bare add;
  (c) a keras-hub / tensor2tensor style layer on the left-padded batch /
      ours: sin and cos evaluated per element from per-sample positions;
  (d) TensorFlow only: (a) and (b) with both sides compiled by XLA
      (`tf.function(jit_compile=True)`, as `model.compile(jit_compile=True)`
      runs a model, the default of Keras 3 on TensorFlow): the layer's gather
      and add fuse into one kernel there (jax.jit always compiles, so on JAX
      (a) and (b) already are this);
  (e) TensorFlow only: ours / the layer's former fused path, the gather and
      add in a nested `tf.function(jit_compile=True)` behind a `tf.cond` on
      the batch's token count (replaced because exporters reject the nested
      call; today the two ops carry an XLA mark instead on Keras 3, `backend.add_rows`),
      left-padded, in the same plain graph.

Run: python benchmarks/bench_layers.py [--reps N]
     KERAS_BACKEND=jax python benchmarks/bench_layers.py  (Keras 3)
"""

import argparse
import os
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from keras_posenc import sinusoidal_table
from keras_posenc.backend import backend_name, keras_version, ops
from keras_posenc.layers import SinusoidalPositionEmbedding

DEPTH = 512
LENGTH = 512
MAX_LENGTH = 2048


def per_element_reference(x, mask, base=10000.0):
    """Sinusoidal PE computed per element, as keras-hub / tensor2tensor do.

    Written for this benchmark after keras-hub's `SinePositionEncoding` (a
    timescale per column, sin on even and cos on odd columns, both evaluated
    for every element and blended by column masks) fed with per-sample
    positions, as tensor2tensor's `add_timing_signal_1d_given_position` takes
    them. Angles are float32, as in those libraries.
    """
    depth = x.shape[-1]
    real = ops.cast(mask, x.dtype)
    positions = ops.cumsum(real, axis=1) - real
    columns = ops.arange(depth)
    timescales = ops.power(1.0 / base, ops.cast(2 * (columns // 2), x.dtype) / depth)
    angles = positions[:, :, None] * timescales
    is_cos = ops.cast(columns % 2, x.dtype)
    encoding = ops.sin(angles) * (1.0 - is_cos) + ops.cos(angles) * is_cos
    return x + encoding * real[:, :, None]


def padded_batches(batch, length, seed=0):
    """Right- and left-padded versions of one batch [batch, length, DEPTH] and their bool masks.

    Real lengths are drawn in [length/2, length] (the first row is full when
    batch > 1); the left-padded rows hold the same real tokens, shifted.
    """
    rng = np.random.RandomState(seed)
    lengths = rng.randint(length // 2, length + 1, size=batch)
    lengths[0] = length if batch > 1 else (3 * length) // 4
    steps = np.arange(length)[None, :]
    right_mask = steps < lengths[:, None]
    left_mask = steps >= (length - lengths)[:, None]
    right = rng.standard_normal((batch, length, DEPTH)).astype(np.float32)
    left = np.stack([np.roll(row, length - n, axis=0) for row, n in zip(right, lengths)])
    convert = ops.convert_to_tensor
    return ((convert(right), convert(right_mask)), (convert(left), convert(left_mask)))


def former_fused_layer(min_tokens=4096):
    """The layer's masked call as it was before it traced to a plain graph: the same ids, then
    `x + gather(lookup, ids)` inside a nested XLA-compiled function for batches of at least
    `min_tokens` tokens (a `tf.cond`), the plain ops below."""
    import tensorflow as tf

    table = sinusoidal_table(MAX_LENGTH, DEPTH).astype(np.float32)
    lookup = tf.constant(np.concatenate([np.zeros([1, DEPTH], np.float32), table]))  # row 0: padding
    fused = tf.function(lambda x, ids: x + tf.gather(lookup, ids), jit_compile=True)

    def call(x, mask):
        ids = tf.where(mask, tf.cumsum(tf.cast(mask, tf.int32), axis=1), 0)
        tokens = tf.shape(ids)[0] * tf.shape(ids)[1]
        return tf.cond(tokens >= min_tokens, lambda: fused(x, ids), lambda: x + tf.gather(lookup, ids))

    return call


def compiled(fn, xla=False):
    """`fn` as the backend runs a model: a dynamic-shape tf.function (XLA-compiled with `xla`), or
    jax.jit (waits for the result)."""
    if backend_name() == "jax":
        import jax

        jitted = jax.jit(fn)
        return lambda *args: jax.block_until_ready(jitted(*args))
    import tensorflow as tf

    signature = [tf.TensorSpec([None, None, DEPTH], tf.float32), tf.TensorSpec([None, None], tf.bool)]
    return tf.function(fn, input_signature=signature, jit_compile=xla or None)


def interleaved_times(cases, reps):
    """Seconds per call of every case; each repetition runs every case once, in rotating order."""
    for fn, args in cases.values():
        fn(*args)  # trace and warm up
    times = {name: [] for name in cases}
    names = list(cases)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            fn, args = cases[name]
            start = time.perf_counter()
            fn(*args)
            times[name].append(time.perf_counter() - start)
    return {name: np.array(t) for name, t in times.items()}


def ratio(times, numerator, denominator):
    """Median over repetitions of the per-repetition ratio: both calls ran back to back, under the
    same load, which matters on a shared machine."""
    return float(np.median(times[numerator] / times[denominator]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=0,
                        help="repetitions per case (default: 101 at batch 32, 1001 at batch 1)")
    args = parser.parse_args()

    table = ops.convert_to_tensor(sinusoidal_table(MAX_LENGTH, DEPTH))
    layer = SinusoidalPositionEmbedding(max_length=MAX_LENGTH)
    layer.build([None, None, DEPTH])
    bare = compiled(lambda x, mask: x + table[:ops.shape(x)[1]])
    ours = compiled(lambda x, mask: layer(x, mask=mask))
    reference = compiled(per_element_reference)
    xla = backend_name() == "tensorflow"
    if xla:
        bare_xla = compiled(lambda x, mask: x + table[:ops.shape(x)[1]], xla=True)
        ours_xla = compiled(lambda x, mask: layer(x, mask=mask), xla=True)
        former = compiled(former_fused_layer())

    print(f"CPU, {os.cpu_count()} cores, Keras {keras_version()} ({backend_name()}), T={LENGTH} D={DEPTH} "
          f"max_length={MAX_LENGTH}, real lengths in [T/2, T]")
    for batch in (32, 1):
        right, left = padded_batches(batch, LENGTH)
        # The left-padded rows are the right-padded ones shifted: same per-token output.
        numpy = ops.convert_to_numpy
        left_real, right_real = numpy(left[1]), numpy(right[1])
        expected = numpy(reference(*left))[left_real]
        np.testing.assert_allclose(numpy(ours(*left))[left_real], expected, atol=1e-3)
        np.testing.assert_array_equal(numpy(ours(*left))[left_real], numpy(ours(*right))[right_real])
        reps = args.reps or (101 if batch > 1 else 1001)
        cases = {
            "bare": (bare, right),
            "ours_right": (ours, right),
            "ours_left": (ours, left),
            "reference_left": (reference, left),
        }
        if xla:
            np.testing.assert_allclose(numpy(ours_xla(*left)), numpy(ours(*left)), rtol=0, atol=1e-6)
            np.testing.assert_array_equal(numpy(former(*left)), numpy(ours(*left)))
            cases.update({"bare_xla": (bare_xla, right), "ours_xla_right": (ours_xla, right),
                          "ours_xla_left": (ours_xla, left), "former_left": (former, left)})
        t = interleaved_times(cases, reps)
        print(f"B={batch} T={LENGTH} D={DEPTH} ({reps} reps; medians: "
              + ", ".join(f"{k} {np.median(v) * 1e3:.3f} ms" for k, v in t.items()) + ")")
        print(f"  (a) right-padded, ours / bare add:    {ratio(t, 'ours_right', 'bare'):.2f}x")
        print(f"  (b) left-padded, ours / bare add:     {ratio(t, 'ours_left', 'bare'):.2f}x")
        print(f"  (c) left-padded, per-element / ours:  {ratio(t, 'reference_left', 'ours_left'):.2f}x")
        if xla:
            print(f"  (d) right-padded, XLA, ours / bare:   {ratio(t, 'ours_xla_right', 'bare_xla'):.2f}x")
            print(f"  (d) left-padded, XLA, ours / bare:    {ratio(t, 'ours_xla_left', 'bare_xla'):.2f}x")
            print(f"  (e) left-padded, ours / former fused: {ratio(t, 'ours_left', 'former_left'):.2f}x")


if __name__ == "__main__":
    main()
