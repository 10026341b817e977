"""Runs a .tflite file with ai-edge-litert's CompiledModel on one accelerator; prints one JSON line.

Run inside the litert venv of the edge cache (see tests/edge/runtime/bootstrap.sh), with Mesa lavapipe as the
Vulkan driver for `--accelerator gpu` (tests/edge/runtime/runtimes.py sets the environment). The runtime's own
log lines go to stderr, where the caller reads them.

    python probe_litert.py MODEL.tflite INPUTS.npz OUTPUT.npy --accelerator gpu|cpu [--fp16]

Arrays with more rows than the model's batch run as consecutive calls of the one compiled model,
a batch at a time; the output holds all rows.
"""

import argparse
import json
import sys

import numpy as np
from ai_edge_litert.compiled_model import CompiledModel
from ai_edge_litert.gpu_options import GpuOptions
from ai_edge_litert.hardware_accelerator import HardwareAccelerator
from ai_edge_litert.options import Options


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("inputs", help=".npz whose arrays are matched to the inputs by name")
    parser.add_argument("output", help=".npy written with the first output")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), required=True)
    parser.add_argument("--allow-cpu", action="store_true",
                        help="gpu: let the CPU run the ops the GPU rejects")
    parser.add_argument("--fp16", action="store_true",
                        help="gpu: the accelerator's default precision (float16), not enforce_f32")
    args = parser.parse_args()
    accelerators = HardwareAccelerator.GPU | (HardwareAccelerator.CPU if args.allow_cpu else 0)
    if args.accelerator == "gpu":
        options = Options(hardware_accelerators=accelerators,
                          gpu_options=GpuOptions(enforce_f32=not args.fp16))
    else:
        options = Options(hardware_accelerators=HardwareAccelerator.CPU)
    model = CompiledModel.from_file(args.model, options=options)
    signature = model.get_signature_list()
    key = next(iter(signature))
    feeds = np.load(args.inputs)
    names = signature[key]["inputs"]
    arrays = [feeds[next((k for k in feeds.files if k != "token_ids" and k in name), "token_ids")]
              for name in names]
    batch = int(model.get_input_tensor_details(key)[names[0]]["shape"][0])
    inputs, outputs = model.create_input_buffers(0), model.create_output_buffers(0)
    first = model.get_output_tensor_details(key)[signature[key]["outputs"][0]]
    shape = [int(n) for n in first["shape"]]
    results = []
    for start in range(0, len(arrays[0]), batch):
        for array, buffer in zip(arrays, inputs):
            buffer.write(np.ascontiguousarray(array[start:start + batch]))
        model.run_by_index(0, inputs, outputs)
        results.append(outputs[0].read(int(np.prod(shape)), np.float32).reshape(shape))
    result = np.concatenate(results)
    np.save(args.output, result)
    print(json.dumps({"fully_accelerated": model.is_fully_accelerated(), "shape": list(result.shape),
                      "inputs": list(names)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
