"""Tracing the export signatures and the inference step with and without AutoGraph.

`backend.static_function` traces the package's `tf.function`s with `autograph=False`: the graphs
are static, so AutoGraph's rewrite of every function a trace calls (the layers' `call`s included)
adds tracing time and no op. Here the same Python functions are traced both ways:

  (a) the translator export's `encode` and `decode` signatures
      (`translator.TranslatorSignatures` over the float32 clone; decode with 4 beam rows);
  (b) the `.litertlm` export's `prefill` and `decode` signatures (`litertlm.EngineGraphs`, cpu);
  (c) the translator's inference step: `decode_step` and a log-softmax, what `translate` traces.

First traces: each way in its own fresh process (`--processes` of each, alternating), the five
functions traced in the order above, as an export or a first `translate` call traces them: the
first AutoGraph trace also converts the source of every function it reaches. Later traces: in one
process, each function traced afresh (a new `tf.function`) `--repeats` times each way,
alternating, after the first traces. Printed: median seconds of each way, the ratio
AutoGraph / static (> 1: AutoGraph costs time), and whether both ways give the same ops.

Run: python benchmarks/bench_tracing.py [--processes 3] [--repeats 5]
     KERAS_BACKEND=tensorflow .venv-keras3/bin/python benchmarks/bench_tracing.py
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

from keras_posenc.backend import keras, keras_version, ops, static_function
from keras_posenc.export import litertlm, translator
from keras_posenc.export.model_spec import ModelSpec, rebuild
from keras_posenc.export.targets import TARGETS
from keras_posenc.models import CausalLM
from keras_posenc.seq2seq import Seq2SeqTransformer

SIZE = dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000, max_length=48, dropout=0.0)
SOURCE_LENGTH, CACHE_LENGTH, PROMPT_LENGTH = 24, 24, 8


WAYS = ("autograph", "static")


def _make(way, python, signature=None):
    if way == "autograph":
        return tf.function(python, input_signature=signature)
    return static_function(python, input_signature=signature)


def _ops(concrete):
    return collections.Counter(op.type for op in concrete.graph.get_operations())


def functions():
    """`[(name, python function, input signature or None, arguments or None)]`, the models built."""
    keras.utils.set_random_seed(0)
    model = Seq2SeqTransformer(**SIZE)
    model.build_on_dummy()
    clone = translator.float32_clone(model, CACHE_LENGTH)
    signatures = translator.TranslatorSignatures(clone, SOURCE_LENGTH, CACHE_LENGTH, beam_rows=4)
    lm = CausalLM(SIZE)
    lm.build_on_dummy()
    lm_clone = rebuild(lm, ModelSpec.of(lm, CACHE_LENGTH, 1))  # as `to_tflite_generator` does
    generation = litertlm.EngineGraphs(lm_clone, PROMPT_LENGTH, CACHE_LENGTH, TARGETS["cpu"])

    def step(tokens, cache, index, cross, mask):  # as `Seq2SeqTransformer.translate` traces it
        logits, cache = model.decode_step(tokens, cache, index, cross, mask)
        return ops.log_softmax(logits[:, -1], axis=-1), cache

    encoded, mask = model.encode(np.full([4, SOURCE_LENGTH], 7, np.int32), training=False)
    cross = model.cross_cache(encoded)
    cache = tf.zeros(model.cache_shape(4, CACHE_LENGTH - 1), model.compute_dtype)
    step_arguments = (tf.constant(np.full([4, 1], 7, np.int32)), cache, tf.constant(np.int32(0)), cross, mask)
    listed = [("translator export: encode", signatures.encode_function()),
              ("translator export: decode (4 beam rows)", signatures.decode_function(rows=4)),
              (".litertlm export: prefill", generation.prefill_function()),
              (".litertlm export: decode", generation.decode_function())]
    return ([(name, f.python_function, f.input_signature, None) for name, f in listed]
            + [("Seq2SeqTransformer.translate's step", step, None, step_arguments)])


def trace(way, python, signature, arguments):
    """`(seconds, op counts)` of one fresh trace."""
    start = time.perf_counter()
    traced = _make(way, python, signature)
    concrete = traced.get_concrete_function(*arguments) if arguments else traced.get_concrete_function()
    return time.perf_counter() - start, _ops(concrete)


def child(way):
    """The first traces of this process, one way: prints `{name: [seconds, op counts]}` as JSON."""
    print(json.dumps({name: trace(way, *rest) for name, *rest in functions()}))


def first_traces(processes):
    runs = {way: [] for way in WAYS}
    for _ in range(processes):
        for way in WAYS:
            out = subprocess.run([sys.executable, __file__, "--child", way], capture_output=True, text=True,
                                 check=True).stdout
            runs[way].append(json.loads(out.strip().splitlines()[-1]))
    print(f"First traces, fresh processes (medians of {processes} each way):")
    totals = {way: [sum(seconds for seconds, _ in run.values()) for run in runs[way]] for way in WAYS}
    for name in runs["static"][0]:
        medians = [statistics.median(run[name][0] for run in runs[way]) for way in WAYS]
        same = "same ops" if runs["autograph"][0][name][1] == runs["static"][0][name][1] else "OPS DIFFER"
        _line(name, *medians, same)
    _line("all five", *(statistics.median(totals[way]) for way in WAYS), "")


def later_traces(repeats):
    print(f"Later traces, one process (medians of {repeats} each way):")
    listed = functions()
    for _name, *rest in listed:  # the first traces, untimed
        for way in WAYS:
            trace(way, *rest)
    for name, *rest in listed:
        seconds = {way: [] for way in WAYS}
        for _ in range(repeats):
            for way in WAYS:
                seconds[way].append(trace(way, *rest)[0])
        _line(name, *(statistics.median(seconds[way]) for way in WAYS), "")


def _line(name, autograph, static, note):
    print(f"  {name:<42} autograph {autograph:6.3f} s  static {static:6.3f} s  "
          f"ratio {autograph / static:5.2f}  {note}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    print(f"Keras {keras_version()}, TensorFlow {tf.__version__}")
    first_traces(args.processes)
    later_traces(args.repeats)


if __name__ == "__main__":
    main()
