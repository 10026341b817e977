"""Resume cost at a late step against an early step: it must not grow with the step count.

A tiny model (1 layer, d_model 8, batch 4, length 16) is trained on the
embedded corpus to LONG steps (checkpoint every SHORT steps, so a
checkpoint at SHORT and one at LONG exist in two runs of the same config);
then `train(resume=True)` continues each run by one step, and the wall time
of that call (reading the corpus, loading the tokenizer, restoring the
checkpoint with its data iterator, tracing and running one step, evaluating)
is compared. Both resumes do identical work apart from the restored state.

As a baseline within the same run, the old way of resuming, replaying the
consumed batches through the input pipeline (`dataset.skip(step)`), is
timed for the first batch after SHORT and after LONG steps.

Run: python benchmarks/bench_resume.py [--long 20000] [--short 200] [--reps 3]
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from keras_posenc.app import dataset as data  # noqa: E402  (sentencepiece before TensorFlow)
from keras_posenc.app.train import TrainConfig, train  # noqa: E402

TINY = dict(batch_size=4, num_layers=1, d_model=8, num_heads=2, dff=16, max_length=16, vocab_size=200,
            warmup_steps=100, dropout=0.0, log_every=1000, keep_checkpoints=2, verbose=0)


def _train_to(out, steps):
    start = time.perf_counter()
    train(TrainConfig(out=out, steps=steps, checkpoint_every=steps, **TINY))
    return time.perf_counter() - start


def _resume_seconds(out, step, reps):
    times = []
    for rep in range(reps):
        copy = f"{out}-resume{rep}"  # a fresh copy each time, so every repetition resumes from `step`
        shutil.copytree(out, copy)
        start = time.perf_counter()
        report = train(TrainConfig(out=copy, steps=step + 1, checkpoint_every=10 ** 9, resume=True, **TINY))
        times.append(time.perf_counter() - start)
        assert report["start_step"] == step, report["start_step"]
    return statistics.median(times)


def _replay_seconds(step):
    lines = data.read_text_corpus(data.default_corpus_path())
    sp_model = data.train_sentencepiece(lines, TINY["vocab_size"])
    ds = data.lm_dataset(lines, sp_model, max_length=TINY["max_length"], batch_size=TINY["batch_size"],
                         shuffle=True, seed=0, repeat=True, drop_remainder=True)
    start = time.perf_counter()
    next(iter(ds.skip(step)))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=20000)
    parser.add_argument("--short", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        runs = {}
        for steps in (args.short, args.long):
            runs[steps] = os.path.join(scratch, f"run{steps}")
            print(f"training {steps} steps: {_train_to(runs[steps], steps):.1f} s")
        resume = {steps: _resume_seconds(path, steps, args.reps) for steps, path in runs.items()}
    replay = {steps: _replay_seconds(steps) for steps in (args.short, args.long)}
    print()
    print("| resume from step | train --resume, 1 more step (s, median) "
          "| old replay: skip(step) to the next batch (s) |")
    print("|---:|---:|---:|")
    for steps in (args.short, args.long):
        print(f"| {steps} | {resume[steps]:.2f} | {replay[steps]:.2f} |")
    print(f"| ratio {args.long} / {args.short} | {resume[args.long] / resume[args.short]:.2f}x | "
          f"{replay[args.long] / replay[args.short]:.1f}x |")


if __name__ == "__main__":
    main()
