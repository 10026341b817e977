"""The same short training run on Keras 2 and on Keras 3, over several seeds.

Runs `keras-posenc train --format tsv --steps 300` (every other flag at its
default) once per seed on each stack, each in its own Python (the two stacks
live in two virtual environments), and prints the eval loss per seed, the
mean and standard deviation per stack, and the per-seed difference
Keras 3 - Keras 2. A gap is systematic when it is far beyond the seed spread.

`--attention-fans` redraws the attention kernels right after the model is
built, with numpy (seeded by the run's seed) and Glorot-uniform limits
`sqrt(6 / (fan_in + fan_out))`, to test whether the initial scale of the
attention projections explains a gap:

- `receptive`: the fans Keras 2 uses for a rank-3 kernel, a convolution's
  (`fan_in = shape[-2] * prod(shape[:-2])`, `fan_out = shape[-1] * prod(shape[:-2])`),
- `projection`: the fans of the projection each kernel computes
  (`d_model -> heads * head_dim` for query, key and value, the reverse for the
  output), which Keras 3.15's `EinsumDense` uses (keras-team/keras#22789),
- `package` (default): leave the weights as `keras_posenc` draws them.

Run (a missing `--corpus` is built first, as `python tools/make_parallel_corpus.py
--out runs/po_en_de.tsv` does):

    python benchmarks/bench_stack_seeds.py --keras2 .venv/bin/python --keras3 .venv-keras3/bin/python \\
        [--seeds 0 1 2] [--steps 300] [--warmup-steps W] [--attention-fans package|receptive|projection]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FANS = ("package", "receptive", "projection")


def _glorot_limit(name, shape, fans):
    if fans == "receptive":
        receptive = 1
        for size in shape[:-2]:
            receptive *= size
        total = (shape[-2] + shape[-1]) * receptive
    elif "attention_output" in name:  # [heads, head_dim, d_model]
        total = shape[0] * shape[1] + shape[2]
    else:  # query, key, value: [d_model, heads, head_dim]
        total = shape[0] + shape[1] * shape[2]
    return (6.0 / total) ** 0.5


def _child(args):
    """One training run in this Python; prints one JSON line."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np

    from keras_posenc import models
    from keras_posenc.app.train import TrainConfig, train
    from keras_posenc.backend import keras_version

    built = models.CausalLM.build_on_dummy
    init = {}

    def build_on_dummy(model):
        built(model)
        rng = np.random.default_rng(args.seed)
        for variable in model.weights:
            name = getattr(variable, "path", variable.name)
            if "attention/" not in name or "kernel" not in name:
                continue
            shape = tuple(variable.shape)
            if args.attention_fans != "package":
                limit = _glorot_limit(name, shape, args.attention_fans)
                variable.assign(rng.uniform(-limit, limit, shape).astype("float32"))
            if "encoder_layer_0/attention/" in name:
                kind = name.split("attention/")[1].split("/")[0]
                init[kind] = float(np.std(variable.numpy()))

    models.CausalLM.build_on_dummy = build_on_dummy
    report = train(TrainConfig(corpus=args.corpus, corpus_format="tsv", steps=args.steps, seed=args.seed,
                               warmup_steps=args.warmup_steps, out=args.out, verbose=0))
    print(json.dumps({"keras": keras_version(), "seed": args.seed, "eval_loss": report["eval_loss"],
                      "final_train_loss": report["final_train_loss"],
                      "unigram_eval_loss": report["unigram_eval_loss"], "init_std": init}))


def _run(python, seed, args, stack):
    command = [python, os.path.abspath(__file__), "--child", "--seed", str(seed), "--steps", str(args.steps),
               "--corpus", args.corpus, "--attention-fans", args.attention_fans,
               *(["--warmup-steps", str(args.warmup_steps)] if args.warmup_steps else []),
               "--out", os.path.join(args.out, f"{stack}-seed{seed}")]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{stack} seed {seed} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mean_sd(values):
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else \
        f"{values[0]:.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keras2", default=".venv/bin/python", help="Python of the Keras 2 env")
    parser.add_argument("--keras3", default=".venv-keras3/bin/python", help="Python of the Keras 3 env")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: derived from --steps")
    parser.add_argument("--corpus", default="runs/po_en_de.tsv")
    parser.add_argument("--attention-fans", choices=FANS, default="package")
    parser.add_argument("--out", default="runs/stack_seeds")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)

    for flag, python in (("--keras2", args.keras2), ("--keras3", args.keras3)):
        if not os.path.isfile(python):
            sys.exit(f"{flag} {python}: no such Python; give the Python of that environment.")
    if not os.path.isfile(args.corpus):  # built from the pinned wheels (pip download), as documented
        subprocess.run([sys.executable, os.path.join(ROOT, "keras_posenc", "data", "make_parallel_corpus.py"),
                        "--out", args.corpus], check=True)
    rows = {}
    for seed in args.seeds:
        for stack, python in (("keras2", args.keras2), ("keras3", args.keras3)):
            rows[stack, seed] = result = _run(python, seed, args, stack)
            print(f"# {stack} (Keras {result['keras']}) seed {seed}: eval {result['eval_loss']:.4f}, "
                  f"unigram {result['unigram_eval_loss']:.4f}, layer-0 attention kernel std "
                  + ", ".join(f"{k} {v:.4f}" for k, v in sorted(result["init_std"].items())), flush=True)
    versions = {stack: rows[stack, args.seeds[0]]["keras"] for stack in ("keras2", "keras3")}
    warmup = args.warmup_steps or "default"
    print(f"\nattention fans: {args.attention_fans}; {args.steps} steps, warmup {warmup}; eval loss\n")
    print(f"| seed | Keras {versions['keras2']} | Keras {versions['keras3']} | Keras 3 - Keras 2 |")
    print("|---:|---:|---:|---:|")
    for seed in args.seeds:
        k2, k3 = rows["keras2", seed]["eval_loss"], rows["keras3", seed]["eval_loss"]
        print(f"| {seed} | {k2:.3f} | {k3:.3f} | {k3 - k2:+.3f} |")
    k2 = [rows["keras2", s]["eval_loss"] for s in args.seeds]
    k3 = [rows["keras3", s]["eval_loss"] for s in args.seeds]
    print(f"| mean ± sd | {_mean_sd(k2)} | {_mean_sd(k3)} | {_mean_sd([b - a for a, b in zip(k2, k3)])} |")


if __name__ == "__main__":
    main()
