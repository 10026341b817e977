#!/usr/bin/env python3
"""Builds (or loads) a TensorRT engine for a `--target tensorrt` ONNX export and times it.

Needs the TensorRT Python API (`import tensorrt`: part of JetPack, or `pip install tensorrt` on
an x86 GPU machine), numpy and either cuda-python (`from cuda import cudart`) or PyCUDA for the
device buffers. Prints p50/p90/p99 latency and the same output checksum as
`run_tflite.py`/`keras-posenc export` print for the same token ids (same `--seed`, same vocab
from `MODEL.onnx.json`). A file exported with `--embedding host` also takes `embeddings`, the rows
`table[token_ids]`, looked up here from `MODEL.onnx.embeddings.npy` (as run_tflite.py does). The
`.onnx` file is checked against its FILE.json record (size, sha256) before TensorRT parses it; an
engine reads the contract and FILE.json of the `.onnx` it was built from (`MODEL.onnx.*`).

Usage:
    python3 run_tensorrt.py model.onnx [--fp16] [--save model.engine] [--iterations 200] [--json]
    python3 run_tensorrt.py model.engine [--iterations 200]
"""

import argparse
import os
import sys

import numpy as np
from kit_contract import fail, open_export, stdout_to_stderr
from kit_report import print_summary, summarize, time_runs
from run_tflite import embedding_rows


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help=".onnx from `keras-posenc export --target tensorrt`, or a .engine")
    parser.add_argument("--fp16", action="store_true",
                        help="allow fp16 kernels when building (as trtexec --fp16)")
    parser.add_argument("--save", help="write the built engine to this file")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--token-ids", help="int .npy of the model's input shape")
    parser.add_argument("--vocab-size", type=int, help="for random ids (default: from MODEL.json)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.model):
        parser.error(f"model file not found: {args.model}")
    if args.iterations < 1 or args.warmup < 0:
        parser.error("--iterations must be >= 1 and --warmup >= 0")
    return args


def build_engine(trt, path, fp16):
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    with open(path, "rb") as f:
        if not parser.parse(f.read()):
            errors = "\n".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise SystemExit(f"TensorRT could not parse {path}:\n{errors}")
    config = builder.create_builder_config()
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise SystemExit("TensorRT failed to build the engine (see the log above).")
    return bytes(serialized)


class Device:
    """Device buffers and copies through cuda-python, else PyCUDA."""

    def __init__(self):
        try:
            from cuda import cudart
            self.cudart, self.pycuda = cudart, None
        except ImportError:
            try:
                import pycuda.autoinit  # noqa: F401
                import pycuda.driver
            except ImportError:
                raise SystemExit("Needs cuda-python (pip install cuda-python) or PyCUDA for device "
                                 "buffers.") from None
            self.cudart, self.pycuda = None, pycuda.driver

    def alloc(self, nbytes):
        if self.pycuda:
            return self.pycuda.mem_alloc(nbytes)
        error, pointer = self.cudart.cudaMalloc(nbytes)
        assert int(error) == 0, error
        return pointer

    def to_device(self, pointer, array):
        if self.pycuda:
            self.pycuda.memcpy_htod(pointer, array)
        else:
            self.cudart.cudaMemcpy(pointer, array.ctypes.data, array.nbytes,
                                   self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice)

    def to_host(self, array, pointer):
        if self.pycuda:
            self.pycuda.memcpy_dtoh(array, pointer)
        else:
            self.cudart.cudaMemcpy(array.ctypes.data, pointer, array.nbytes,
                                   self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)

    def synchronize(self):
        if self.pycuda:
            self.pycuda.Context.synchronize()
        else:
            self.cudart.cudaDeviceSynchronize()


def main(argv=None):
    args = parse_args(argv)
    try:
        import tensorrt as trt
    except ImportError:
        raise SystemExit("No TensorRT Python API: it ships with JetPack (python3-libnvinfer), or "
                         "pip install tensorrt on an x86 GPU machine.") from None
    onnx_path = args.model if args.model.endswith(".onnx") else os.path.splitext(args.model)[0] + ".onnx"
    export = open_export(onnx_path)  # an engine: the contract of the .onnx it was built from
    if args.model.endswith(".onnx"):
        export.verify(args.model)
        with stdout_to_stderr(args.json):
            engine_bytes = build_engine(trt, args.model, args.fp16)
        if args.save:
            with open(args.save, "wb") as f:
                f.write(engine_bytes)
    else:
        with open(args.model, "rb") as f:
            engine_bytes = f.read()
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(engine_bytes)
    context = engine.create_execution_context()
    device = Device()
    languages, rows = export.tensors.language_ids, export.tensors.embeddings
    rng = np.random.default_rng(args.seed)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [name for name in names if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT]
    token_name = next(name for name in inputs if languages not in name and rows not in name)
    if args.token_ids:
        ids = np.load(args.token_ids)
    else:
        vocab = args.vocab_size or export.get("vocab_size")
        if not vocab:
            fail("Pass --vocab-size or --token-ids.")
        ids = rng.integers(1, vocab, size=tuple(engine.get_tensor_shape(token_name)))
    outputs = [name for name in names if name not in inputs]
    # The contract's `logits`; a file exported before outputs were named has one output (`Identity:0`).
    output = export.tensors.logits if export.tensors.logits in outputs else outputs[0]
    host, pointers = {}, {}
    for name in names:
        shape = tuple(engine.get_tensor_shape(name))
        dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
        if name in inputs:
            if languages in name:
                values = np.zeros(shape)
            elif rows in name:  # --embedding host: table[ids] from MODEL.onnx.embeddings.npy
                values = embedding_rows(np.asarray(ids), export)
            else:
                values = ids
            host[name] = np.ascontiguousarray(values.astype(dtype))
        else:
            host[name] = np.empty(shape, dtype)
        pointers[name] = device.alloc(host[name].nbytes)
        context.set_tensor_address(name, int(pointers[name]))
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            device.to_device(pointers[name], host[name])
    stream = 0

    def invoke():
        context.execute_async_v3(stream)
        device.synchronize()

    times = time_runs(invoke, args.iterations, args.warmup)
    device.to_host(host[output], pointers[output])
    summary = summarize(times, host[output], runtime=f"tensorrt {trt.__version__}", fp16=args.fp16)
    print_summary(summary, f"runtime: {summary['runtime']}  fp16: {args.fp16}", as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
