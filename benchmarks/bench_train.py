"""Training tokens/s: Keras 2 against Keras 3, XLA on against off, ours against keras-hub's `fit`.

Two models, both causal LMs trained with Adam on the warmup schedule:

- `demo`: the `keras-posenc demo` model (2 layers, d_model 64, 4 heads, dff 128,
  vocabulary 1000, batch 32, rows up to 48 tokens in the bucket lengths
  8/16/32/48);
- `d256`: 4 layers, d_model 256, 4 heads, dff 1024, vocabulary 2000, batch 16,
  every row padded to T = 128.

Variants, each in its own process (so stacks and settings never share a
process; the driver alternates them round by round and reports medians):

- `ours`: the train step of `keras-posenc train` (`train_steps.TrainSteps`, the
  `CausalLM` train step under the default strategy), XLA off and on, on
  Keras 2 (TF 2.12) and Keras 3 (TF 2.21, TensorFlow backend);
- `hub-fit` (Keras 3 only): the same architecture from keras-hub layers, as
  keras-hub builds GPT-2: `TokenAndPositionEmbedding` (learned positions,
  `mask_zero`), `TransformerDecoder` blocks without cross-attention (causal
  and padding masks) and a `Dense` head, trained by `model.fit` with the same
  optimizer on the same batches, padding weighted out of the loss; `compile`
  at its defaults (`jit_compile="auto"`, which is off on a CPU).

Every variant reads the same batches (the first `--steps` batches of the
`data.lm_dataset` pipeline on the embedded corpus, cached: 60 for `demo`, 20
for `d256`), runs one batch of every shape first (tracing and XLA compiles
are not timed), then times 3 (`demo`) or 2 (`d256`) passes over them.
tokens/s counts real (non-padding) label tokens, per wall-clock second and
per CPU-second of the process (steadier than wall time on a shared machine).

Run: python benchmarks/bench_train.py [--rounds 2] [--models demo d256]
         [--keras2-python .venv/bin/python] [--keras3-python .venv-keras3/bin/python]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "demo": dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000, max_length=48,
                 batch_size=32, bucket_lengths="auto", steps=60, passes=3),
    "d256": dict(num_layers=4, d_model=256, num_heads=4, dff=1024, vocab_size=2000, max_length=128,
                 batch_size=16, bucket_lengths=[128], steps=20, passes=2),
}
VARIANTS = [("keras2", "ours", False), ("keras3", "ours", False), ("keras2", "ours", True),
            ("keras3", "ours", True), ("keras3", "hub-fit", None)]


# Worker: one variant in this process ---------------------------------------------------------------
def _clocks():
    return time.perf_counter(), time.process_time()


def _elapsed(start):
    """(wall seconds, CPU seconds of this process) since `start`."""
    return tuple(now - then for now, then in zip(_clocks(), start))


def _batches(spec, steps):
    from keras_posenc.app import dataset as data

    lines = data.read_text_corpus(data.default_corpus_path())
    sp_model = data.train_sentencepiece(lines, spec["vocab_size"])
    ds = data.lm_dataset(lines, sp_model, max_length=spec["max_length"], batch_size=spec["batch_size"],
                         bucket_lengths=spec["bucket_lengths"], shuffle=True, seed=0, repeat=True,
                         drop_remainder=True)
    timed = ds.take(steps).cache()
    shapes, first, tokens = set(), [], 0
    for index, (_, labels) in enumerate(timed):  # fills the cache
        tokens += int((labels.numpy() != 0).sum())
        if tuple(labels.shape) not in shapes:
            shapes.add(tuple(labels.shape))
            first.append(index)
    import tensorflow as tf

    wanted = tf.constant(first, tf.int64)
    warm = timed.enumerate().filter(lambda i, batch: tf.reduce_any(tf.equal(i, wanted))).map(lambda i, b: b)
    return ds.element_spec, warm, timed, tokens, sorted(shapes)


def _ours(spec, element_spec, warm, timed, jit_compile):
    import tensorflow as tf

    from keras_posenc.app.train import TrainConfig
    from keras_posenc.app.train_steps import TrainSteps
    from keras_posenc.models import CausalLM, transformer_adam

    config = TrainConfig(**{k: spec[k] for k in ("num_layers", "d_model", "num_heads", "dff", "max_length")},
                         dropout=0.0)
    model = CausalLM(config.model_config(spec["vocab_size"]))
    model.build_on_dummy()
    optimizer = transformer_adam(spec["d_model"], 4000)
    optimizer.build(model.trainable_variables)
    model.compile(optimizer=optimizer)
    steps = TrainSteps(model, tf.distribute.get_strategy(), element_spec, jit_compile)
    for batch in warm:
        steps.train(batch)["loss"].numpy()
    start = _clocks()
    for _ in range(spec["passes"]):
        for batch in timed:
            steps.train(batch)["loss"].numpy()  # as `train` does: the step's logs reach the callbacks
    return _elapsed(start)


def _hub_fit(spec, warm, timed):
    import keras
    import keras_hub

    from keras_posenc.models import transformer_adam

    inputs = keras.Input((None,), dtype="int32")
    x = keras_hub.layers.TokenAndPositionEmbedding(spec["vocab_size"], spec["max_length"], spec["d_model"],
                                                   mask_zero=True)(inputs)
    for _ in range(spec["num_layers"]):
        x = keras_hub.layers.TransformerDecoder(spec["dff"], spec["num_heads"])(x)  # no cross-attention
    model = keras.Model(inputs, keras.layers.Dense(spec["vocab_size"])(x))
    model.compile(optimizer=transformer_adam(spec["d_model"], 4000),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def weighted(features, labels):
        import tensorflow as tf

        return features["token_ids"], labels, tf.cast(labels != 0, "float32")

    model.fit(warm.map(weighted), verbose=0)
    start = _clocks()
    model.fit(timed.map(weighted), epochs=spec["passes"], verbose=0)
    return _elapsed(start)


def _worker(model_name, variant, jit_compile):
    spec = MODELS[model_name]
    element_spec, warm, timed, tokens, shapes = _batches(spec, spec["steps"])
    if variant == "ours":
        wall, cpu = _ours(spec, element_spec, warm, timed, jit_compile)
    else:
        wall, cpu = _hub_fit(spec, warm, timed)
    print(json.dumps({"tokens_per_second": spec["passes"] * tokens / wall,
                      "tokens_per_cpu_second": spec["passes"] * tokens / cpu, "shapes": shapes}))


# Driver: every variant in its own process, alternating -----------------------------------------------
def _run(python, stack, model_name, variant, jit_compile):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    if stack == "keras3":
        env["KERAS_BACKEND"] = "tensorflow"
    command = [python, os.path.abspath(__file__), "--worker", model_name, variant, str(jit_compile)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode:
        raise RuntimeError(f"{stack} {model_name} {variant} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _label(stack, variant, jit_compile):
    stack_name = {"keras2": "Keras 2 (TF 2.12)", "keras3": "Keras 3 (TF 2.21)"}[stack]
    if variant == "hub-fit":
        return f"{stack_name}, keras-hub layers + `fit`"
    return f"{stack_name}, ours, XLA {'on' if jit_compile else 'off'}"


def _report(model_name, results):
    """Prints the medians and the ratios of one model, per wall-clock and per CPU-second."""
    metrics = ("tokens_per_second", "tokens_per_cpu_second")
    median = {(key[1:], metric): statistics.median(run[metric] for run in runs)
              for key, runs in results.items() if key[0] == model_name for metric in metrics}
    print(f"### {model_name}\n")
    print("| variant | tokens/s, wall (median) | tokens per CPU-second (median) | runs (wall) |")
    print("|---|---:|---:|---|")
    for key in VARIANTS:
        runs = ", ".join(f"{run['tokens_per_second']:.0f}" for run in results[(model_name, *key)])
        print(f"| {_label(*key)} | {median[key, metrics[0]]:.0f} | {median[key, metrics[1]]:.0f} | {runs} |")
    ratios = [(f"Keras 3 / Keras 2, ours, XLA {'on' if jit else 'off'}",
               ("keras3", "ours", jit), ("keras2", "ours", jit)) for jit in (False, True)]
    ratios += [(f"XLA on / off, ours, {stack}", (stack, "ours", True), (stack, "ours", False))
               for stack in ("keras2", "keras3")]
    ratios += [(f"ours (Keras 3, XLA {'on' if jit else 'off'}) / keras-hub `fit`", ("keras3", "ours", jit),
                ("keras3", "hub-fit", None)) for jit in (False, True)]
    print("\n| ratio | wall | CPU time |\n|---|---:|---:|")
    for name, top, bottom in ratios:
        print(f"| {name} | {median[top, metrics[0]] / median[bottom, metrics[0]]:.2f} | "
              f"{median[top, metrics[1]] / median[bottom, metrics[1]]:.2f} |")
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--keras2-python", default=os.path.join(REPO, ".venv", "bin", "python"))
    parser.add_argument("--keras3-python", default=os.path.join(REPO, ".venv-keras3", "bin", "python"))
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "VARIANT", "JIT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        model_name, variant, jit = args.worker
        _worker(model_name, variant, jit == "True")
        return
    pythons = {"keras2": args.keras2_python, "keras3": args.keras3_python}
    results = {}
    for round_index in range(args.rounds):
        for model_name in args.models:
            for stack, variant, jit in VARIANTS:
                run = _run(pythons[stack], stack, model_name, variant, jit)
                results.setdefault((model_name, stack, variant, jit), []).append(run)
                print(f"round {round_index + 1} {model_name} {_label(stack, variant, jit)}: "
                      f"{run['tokens_per_second']:.0f} tokens/s, "
                      f"{run['tokens_per_cpu_second']:.0f} per CPU-second", flush=True)
    print()
    for model_name in args.models:
        _report(model_name, results)


if __name__ == "__main__":
    sys.exit(main())
