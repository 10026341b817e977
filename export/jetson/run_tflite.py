#!/usr/bin/env python3
"""Runs an exported keras_posenc `.tflite` model and prints latency percentiles and an output checksum.

Two runtimes, the first one installed:

- `ai-edge-litert` (JetPack 6, Python 3.10): its `CompiledModel`; `--accelerator gpu` is the
  LiteRT GPU accelerator (WebGPU over Vulkan, part of L4T r36), run GPU-only, so a file that
  is not fully accelerated fails to compile instead of running half on the CPU;
- `tflite-runtime` (JetPack 5, Python 3.8): its `Interpreter`; `--accelerator gpu` needs
  `--delegate libtensorflowlite_gpu_delegate.so` (the classic delegate, OpenGL ES on a Jetson).

TensorFlow's `tf.lite.Interpreter` is the CPU fallback on development machines.

Every file is checked before a runtime opens it: its size and sha256 against `MODEL.tflite.json`
and the TFLite identifier; the tensor names and FILE.json keys come from
`MODEL.tflite.contract.json` (both written by `keras-posenc export`: copy every file it writes).
Token ids come from `--token-ids FILE.npy` (int, `[batch, length]` of the model), else random ids
drawn with `--seed` from `[1, vocab_size)`, the vocab size read from FILE.json or given with
`--vocab-size`. Language ids, when the model has that input, are 0 unless `--language-ids FILE.npy`
is given. Inputs are fed in the model's input dtype (float32 for a `--target gl` export, int32
otherwise). A file exported with `--embedding host`
also takes `embeddings`, the rows `table[token_ids]`, which this runner looks up from
`MODEL.tflite.embeddings.npy` (written beside the file by `keras-posenc export`).

Usage:
    python3 run_tflite.py model.tflite [--accelerator cpu|gpu] [--delegate libtensorflowlite_gpu_delegate.so]
                                       [--iterations 200] [--warmup 10] [--threads 4] [--json]
                                       [--token-ids ids.npy] [--output logits.npy]
"""

import argparse
import os
import sys

import numpy as np
from kit_contract import fail, open_export, stdout_to_stderr
from kit_embeddings import HostTable
from kit_report import print_summary, summarize, time_runs
from kit_runtime import compiled_model, interpreter, open_runtime


class LiteRtRunner:
    """ai-edge-litert's CompiledModel on the CPU or, GPU-only, on the LiteRT GPU accelerator."""

    name = "ai_edge_litert.CompiledModel"

    def __init__(self, path, accelerator, threads, precision):
        self.model = compiled_model(path, accelerator, threads, precision)
        self.key = next(iter(self.model.get_signature_list()))
        details = self.model.get_input_tensor_details(self.key)
        self.inputs = [dict(detail, dtype=np.dtype(detail["dtype"])) for detail in details.values()]
        output = self.model.get_output_tensor_details(self.key)
        self.output_shape = list(next(iter(output.values()))["shape"])
        self.input_buffers = self.model.create_input_buffers(0)
        self.output_buffers = self.model.create_output_buffers(0)
        self.fully_accelerated = self.model.is_fully_accelerated()

    def set_inputs(self, arrays):
        for buffer, array in zip(self.input_buffers, arrays):
            buffer.write(np.ascontiguousarray(array))

    def invoke(self):
        self.model.run_by_index(0, self.input_buffers, self.output_buffers)

    def output(self):
        size = int(np.prod(self.output_shape))
        return self.output_buffers[0].read(size, np.float32).reshape(self.output_shape)


class InterpreterRunner:
    """The classic `Interpreter` (tflite-runtime or TensorFlow), with an optional delegate library."""

    def __init__(self, path, delegate, threads):
        self.interpreter, self.name = interpreter(path, delegate, threads)
        self.interpreter.allocate_tensors()
        self.inputs = [dict(detail, shape=list(detail["shape"]), dtype=np.dtype(detail["dtype"]))
                       for detail in self.interpreter.get_input_details()]
        self.fully_accelerated = None  # the classic API does not say; benchmark_model prints it

    def set_inputs(self, arrays):
        for detail, array in zip(self.inputs, arrays):
            self.interpreter.set_tensor(detail["index"], array)

    def invoke(self):
        self.interpreter.invoke()

    def output(self):
        return self.interpreter.get_tensor(self.interpreter.get_output_details()[0]["index"])


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help=".tflite file from `keras-posenc export`")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu",
                        help="cpu (XNNPACK) or gpu (LiteRT GPU accelerator, or --delegate); default cpu")
    parser.add_argument("--delegate", help="tflite-runtime only: delegate library, e.g. "
                                           "libtensorflowlite_gpu_delegate.so")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default="fp32",
                        help="LiteRT GPU precision (fp32 = enforce_f32, the parity setting); default fp32")
    parser.add_argument("--iterations", type=int, default=100, help="timed runs (default 100)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    parser.add_argument("--threads", type=int, help="CPU threads")
    parser.add_argument("--token-ids", help="int .npy of the model's input shape")
    parser.add_argument("--language-ids", help="int .npy for the language input, if the model has one")
    parser.add_argument("--vocab-size", type=int, help="for random ids (default: from MODEL.tflite.json)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    parser.add_argument("--runtime", choices=("auto", "litert", "interpreter"), default="auto",
                        help="auto: ai-edge-litert's CompiledModel when installed, else the Interpreter")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    parser.add_argument("--output", help="write the output of the last run to this .npy (float32, for "
                                         "parity checks)")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0:
        parser.error(f"--iterations must be >= 1 and --warmup >= 0, got {args.iterations} and {args.warmup}")
    if not os.path.isfile(args.model):
        parser.error(f"model file not found: {args.model}")
    return args


def token_ids(shape, args, export):
    """The token ids: --token-ids, else random ids from [1, vocab) drawn with --seed."""
    if args.token_ids:
        return np.load(args.token_ids)
    vocab = args.vocab_size or export.get("vocab_size")
    if not vocab:
        fail("No vocab size for random token ids: pass --vocab-size or --token-ids.")
    return np.random.default_rng(args.seed).integers(1, vocab, size=shape)


def embedding_rows(ids, export):
    """`table[ids]` of a file exported with `--embedding host` (`kit_embeddings.HostTable`)."""
    return HostTable(export).rows(ids)


def make_inputs(inputs, args, export):
    """One array per model input, matched by name (token ids / language ids / embeddings), in its dtype."""
    languages, rows = export.tensors.language_ids, export.tensors.embeddings
    token_shape = next((tuple(int(n) for n in detail["shape"]) for detail in inputs
                        if languages not in detail["name"] and rows not in detail["name"]), None)
    ids = token_ids(token_shape, args, export) if token_shape else None
    arrays = []
    for detail in inputs:
        shape = tuple(int(n) for n in detail["shape"])
        if languages in detail["name"]:
            values = np.load(args.language_ids) if args.language_ids else np.zeros(shape)
        elif rows in detail["name"]:
            values = embedding_rows(np.asarray(ids), export)
        else:
            values = ids
        if tuple(values.shape) != shape:
            fail(f"Input '{detail['name']}' needs shape {shape}, got {tuple(values.shape)}.")
        arrays.append(values.astype(detail["dtype"]))
    return arrays


def make_runner(args, export=None):
    return open_runtime(args, LiteRtRunner, InterpreterRunner, export)


def main(argv=None):
    args = parse_args(argv)
    export = open_export(args.model)
    export.check_accelerator(args.accelerator)
    export.verify(args.model, tflite=True)
    with stdout_to_stderr(args.json):  # native runtimes print on fd 1: keep it for the JSON line
        try:
            runner = make_runner(args, export)
        except RuntimeError as error:  # LiteRT: e.g. "Some ops are not accelerated" on a GPU-only compile
            fail(f"{args.accelerator.upper()} compilation failed: {error}")
        runner.set_inputs(make_inputs(runner.inputs, args, export))
        times = time_runs(runner.invoke, args.iterations, args.warmup)
        output = runner.output()
    if args.output:
        np.save(args.output, np.asarray(output, np.float32))
    summary = summarize(times, output, runtime=runner.name, accelerator=args.accelerator,
                        delegate=args.delegate, fully_accelerated=runner.fully_accelerated)
    where = args.delegate or ("LiteRT GPU accelerator" if args.accelerator == "gpu" else "CPU (XNNPACK)")
    header = f"runtime: {runner.name}  on: {where}  fully accelerated: {runner.fully_accelerated}"
    print_summary(summary, header, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
