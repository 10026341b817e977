"""The exports' conversions with each function frozen once (by the converter) or twice.

`conversion.convert_tflite` hands the TFLite converter the traced function itself: without a
trackable object `TFLiteConverter.from_concrete_functions` folds the variables into constants and
imports that graph (both stacks' converters). `generator.frozen_onnx` (the tensorrt prefill/decode
pair, the translator's ONNX files, the genai decoder) hands tf2onnx the function itself, which
freezes it and names the outputs by its dict's keys. Until then each function was frozen first as
well (`model_spec.frozen_function`, which imports the frozen graph into a new function; for ONNX,
re-traced under the output names), and the converter froze the result again. Here the same exports
run both ways, alternating, in one process:

  once:  `to_tflite` (cpu, gpu, gl) and `to_onnx_generator` (tensorrt) as they are;
  twice: the same with each function frozen first, as before.

Printed per export: the median CPU seconds of each way (`time.process_time`, the whole export:
clone, trace, conversion), the ratio twice / once (> 1: the second freeze costs time), and whether
both ways give the same outputs (the window files on the same token ids, the pairs' greedy ids from
one prompt; the files differ in the names the converters give fused nodes).

Run: python benchmarks/bench_freeze.py [--repeats 5]
     KERAS_BACKEND=tensorflow .venv-keras3/bin/python benchmarks/bench_freeze.py
"""

import argparse
import contextlib
import os
import statistics
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from absl import logging as absl_logging
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from keras_posenc.backend import keras, keras_version, static_function
from keras_posenc.export import generator, to_tflite
from keras_posenc.export.runners import OnnxSession, greedy_generate
from keras_posenc.models import CausalLM

SIZE = dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000, max_length=64, dropout=0.0)
LENGTH, PROMPT = 32, 8
TARGETS = ("cpu", "gpu", "gl", "tensorrt")
WAYS = ("once", "twice")


@contextlib.contextmanager
def frozen_first():
    """`TFLiteConverter.from_concrete_functions` and tf2onnx given each function frozen beforehand."""
    from_concrete_functions = tf.lite.TFLiteConverter.from_concrete_functions
    frozen_onnx = generator.frozen_onnx

    def from_frozen(funcs, trackable_obj=None):
        frozen = [convert_variables_to_constants_v2(func) for func in funcs]
        return from_concrete_functions(frozen, trackable_obj)

    def onnx_of_frozen(tf2onnx, function, opset):
        names = list(function.get_concrete_function().structured_outputs)
        frozen = generator.frozen_signature(function, names)
        wrapped = static_function(lambda *inputs: frozen(*inputs), input_signature=function.input_signature)
        return frozen_onnx(tf2onnx, wrapped, opset)

    tf.lite.TFLiteConverter.from_concrete_functions = from_frozen
    generator.frozen_onnx = onnx_of_frozen
    try:
        yield
    finally:
        tf.lite.TFLiteConverter.from_concrete_functions = from_concrete_functions
        generator.frozen_onnx = frozen_onnx


def export(model, target, way):
    start = time.process_time()
    with frozen_first() if way == "twice" else contextlib.nullcontext():
        if target == "tensorrt":
            files = generator.to_onnx_generator(model, prompt_length=PROMPT, cache_length=LENGTH)
        else:
            files = to_tflite(model, sequence_length=LENGTH, target=target)
    return time.process_time() - start, files


def outputs(files, ids):
    if isinstance(files, tuple):  # the ONNX prefill/decode pair
        return np.array(greedy_generate(OnnxSession(*files), ids[0, :PROMPT].tolist(), 8)[0])
    interpreter = tf.lite.Interpreter(model_content=files)
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]  # int32 ids, float32 on the GPU targets
    interpreter.set_tensor(detail["index"], ids.astype(detail["dtype"]))
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    absl_logging.set_verbosity(absl_logging.ERROR)  # the converter's notice on every export
    keras.utils.set_random_seed(0)
    model = CausalLM(SIZE)
    model.build_on_dummy()
    ids = np.random.default_rng(0).integers(1, SIZE["vocab_size"], (1, LENGTH)).astype(np.int32)
    for target in ("cpu", "tensorrt"):  # imports and first traces out of the figures
        export(model, target, "once")
    print(f"Keras {keras_version()}, TensorFlow {tf.__version__}; CausalLM {SIZE}, length {LENGTH}, "
          f"{args.repeats} repeats each way, alternating")
    print(f"{'target':8} {'once (s)':>9} {'twice (s)':>10} {'twice/once':>11}  same outputs")
    for target in TARGETS:
        seconds = {way: [] for way in WAYS}
        files = {}
        for repeat in range(args.repeats):
            for way in WAYS if repeat % 2 == 0 else WAYS[::-1]:
                taken, files[way] = export(model, target, way)
                seconds[way].append(taken)
        once, twice = (statistics.median(seconds[way]) for way in WAYS)
        same = np.array_equal(outputs(files["once"], ids), outputs(files["twice"], ids))
        print(f"{target:8} {once:9.2f} {twice:10.2f} {twice / once:11.2f}  {same}")


if __name__ == "__main__":
    main()
