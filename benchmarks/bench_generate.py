"""Generation with a key/value cache against re-running the whole window, per new token.

Two untrained causal LMs (speed does not depend on the weights): the demo's shape (2 layers,
d_model 64, 4 heads, dff 128, vocab 1000) and a larger one (4 layers, d_model 256, 4 heads,
dff 1024, vocab 8000), both with max_length 512, at cache lengths 128 and 512.

- TFLite (TensorFlow backends only; XNNPACK, one thread): the prefill/decode file of
  `keras-posenc export --generate` (prefill length C/2) against the fixed-window `cpu` file of
  length C, which a scorer must run once per new token. Decode tokens/s of each, their ratio,
  the time to first token (prefill) and the cache bytes.
- Keras (this process's backend): `CausalLM.generate`'s compiled decode step against the
  compiled full forward pass over C tokens.

Each timed quantity is the median over `--calls` calls, the two sides interleaved in every
repetition; the ratio is the median of the per-repetition ratios (this machine is noisy).

Usage:
    python benchmarks/bench_generate.py [--repetitions 5] [--calls 20] [--cache-lengths 128 512]
    KERAS_BACKEND=jax .venv-keras3/bin/python benchmarks/bench_generate.py   # Keras rows only
"""

import argparse

import numpy as np
from bench_export import median_call_ms

from keras_posenc.backend import inference_function, is_tensorflow, keras, ops
from keras_posenc.models import CausalLM

MODELS = {
    "demo (2x64)": dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000),
    "d256 (4x256)": dict(num_layers=4, d_model=256, num_heads=4, dff=1024, vocab_size=8000),
}


def tflite_pair(model, cache_length):
    """(decode step, window call, prefill call) of the exported files, one interpreter thread each."""
    import tensorflow as tf

    from keras_posenc import export
    from keras_posenc.export import generator

    prompt_length = cache_length // 2
    flat = generator.to_tflite_generator(model, prompt_length=prompt_length, cache_length=cache_length)
    interpreter = tf.lite.Interpreter(model_content=flat, num_threads=1)
    prefill = interpreter.get_signature_runner("prefill")
    decode = interpreter.get_signature_runner("decode")
    cache = generator.past(prefill(token_ids=np.full([1, prompt_length], 5, np.int32)))
    feeds = dict(token_id=np.array([[7]], np.int32), position=np.array([prompt_length], np.int32), **cache)
    window = tf.lite.Interpreter(model_content=export.to_tflite(model, sequence_length=cache_length,
                                                                target="cpu"), num_threads=1)
    window.allocate_tensors()
    window.set_tensor(window.get_input_details()[0]["index"], np.full([1, cache_length], 5, np.int32))
    tokens = np.full([1, prompt_length], 5, np.int32)
    return (lambda: decode(**feeds)), window.invoke, (lambda: prefill(token_ids=tokens))


def keras_pair(model, cache_length):
    """(decode step, window call) of the Keras model, both compiled for this backend."""
    encoder = model.encoder
    cache = ops.zeros(encoder.cache_shape(1, cache_length), "float32")
    index = ops.convert_to_tensor(np.int32(cache_length // 2))
    token = ops.convert_to_tensor(np.array([[7]], np.int32))
    position = ops.convert_to_tensor(np.array([[cache_length // 2]], np.int32))
    step = inference_function(model, lambda t, p, c, i: model(t, position_ids=p, cache=c, cache_index=i))
    window_ids = ops.convert_to_tensor(np.full([1, cache_length], 5, np.int32))
    full = inference_function(model, lambda ids: model(ids))

    def decode():
        ops.convert_to_numpy(step(token, position, cache, index)[0])

    def window():
        ops.convert_to_numpy(full(window_ids))

    decode()
    window()
    return decode, window


def measure(pair, repetitions, calls):
    decode, window = pair[:2]
    ratios, decode_ms, window_ms = [], [], []
    for _ in range(repetitions):
        d, w = median_call_ms(decode, calls), median_call_ms(window, calls)
        decode_ms.append(d)
        window_ms.append(w)
        ratios.append(w / d)
    return float(np.median(decode_ms)), float(np.median(window_ms)), float(np.median(ratios))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--cache-lengths", type=int, nargs="+", default=[128, 512])
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    print(f"backend {keras.backend.backend() if hasattr(keras.backend, 'backend') else 'tensorflow'}, "
          f"Keras {keras.__version__}; decode tokens/s = 1000 / ms per token")
    header = (f"{'model':14} {'runtime':8} {'C':>4} {'cached tok/s':>12} {'window tok/s':>12} "
              f"{'speed-up':>8} {'TTFT ms':>8} {'cache KiB':>9}")
    print(header)
    for name, config in MODELS.items():
        model = CausalLM({**config, "max_length": max(args.cache_lengths), "dropout": 0.0})
        model.build_on_dummy()
        for cache_length in args.cache_lengths:
            cache_kib = 2 * config["num_layers"] * cache_length * config["d_model"] * 4 / 1024
            rows = []
            if is_tensorflow():
                pair = tflite_pair(model, cache_length)
                ttft = float(np.median([median_call_ms(pair[2], max(3, args.calls // 4))
                                        for _ in range(args.repetitions)]))
                rows.append(("TFLite", measure(pair, args.repetitions, args.calls), ttft))
            keras_times = measure(keras_pair(model, cache_length), args.repetitions, args.calls)
            rows.append(("Keras", keras_times, None))
            for runtime, (decode_ms, window_ms, ratio), ttft in rows:
                ttft_text = f"{ttft:8.2f}" if ttft is not None else f"{'-':>8}"
                print(f"{name:14} {runtime:8} {cache_length:4d} {1e3 / decode_ms:12.1f} "
                      f"{1e3 / window_ms:12.1f} {ratio:7.1f}x {ttft_text} {cache_kib:9.0f}", flush=True)


if __name__ == "__main__":
    main()
