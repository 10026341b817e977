"""Runs a .tflite file on the classic TFLite GPU delegate's OpenGL ES backend; prints one JSON line.

The delegate is the one bundled in mediapipe 0.10.21 (`InferenceCalculator` with
`delegate { gpu { use_advanced_gpu_api: false } }` = the OpenGL ES 3.1 backend that a Jetson
without OpenCL uses); OpenGL ES comes from Mesa llvmpipe through EGL_PLATFORM=surfaceless. Run
inside the mediapipe venv of the edge cache (tests/edge/runtime/runtimes.py sets the environment). The
delegate's own messages ("Following operations are not supported by GPU delegate", "No shader
implementation for ...") go to stderr, where the caller reads them.

The model takes float32 inputs `[1, N]` (the `gl` export target): each is fed through a
`TensorConverterCalculator` (row-major matrix); several inputs are joined into one tensor vector
in the order of the npz keys given with --inputs-order.

    python probe_gl.py MODEL.tflite INPUTS.npz OUTPUT.npy [--cpu | --fp16] [--rows N]

With `--rows N` each array holds N rows of the model's batch-1 inputs, fed at N consecutive
timestamps of the one graph; the output is `[N, size]`.
"""

import argparse
import json
import sys
import types

# mediapipe's package __init__ imports its solutions, which import cv2 and matplotlib; the
# inference path needs neither, so they are not installed (tests/edge/runtime/bootstrap.sh).
for _name in ("cv2", "matplotlib", "matplotlib.pyplot"):
    sys.modules.setdefault(_name, types.ModuleType(_name))

import numpy as np  # noqa: E402
from google.protobuf import text_format  # noqa: E402

# Imported to register the calculator options that the graph text names.
from mediapipe.calculators.tensor import inference_calculator_pb2, tensor_converter_calculator_pb2  # noqa: E402, F401
from mediapipe.framework import calculator_pb2  # noqa: E402
from mediapipe.python import packet_creator, packet_getter  # noqa: E402
from mediapipe.python._framework_bindings import calculator_graph, timestamp  # noqa: E402

_CONVERTER = """
node {{
  calculator: "TensorConverterCalculator"
  input_stream: "MATRIX:in{i}"
  output_stream: "TENSORS:t{i}"
  options {{ [mediapipe.TensorConverterCalculatorOptions.ext] {{ row_major_matrix: true }} }}
}}
"""
_JOIN = """
node {{
  calculator: "ConcatenateTensorVectorCalculator"
  {inputs}
  output_stream: "tensors"
}}
"""
_INFERENCE = """
node {{
  calculator: "InferenceCalculator"
  input_stream: "TENSORS:{tensors}"
  output_stream: "TENSORS:out"
  options {{
    [mediapipe.InferenceCalculatorOptions.ext] {{
      model_path: "{model}"
      delegate {{ {delegate} }}
    }}
  }}
}}
"""
_FLOATS = """
node {{
  calculator: "TensorsToFloatsCalculator"
  input_stream: "TENSORS:out"
  output_stream: "FLOATS:floats"
}}
"""


def graph_config(model, count, cpu, fp16=False):
    text = graph_config_text(model, count, cpu, fp16)
    return text_format.Parse(text, calculator_pb2.CalculatorGraphConfig())


def graph_config_text(model, count, cpu, fp16=False, outputs=True):
    """The graph as text; `outputs=False` leaves the tensors stream "out" to the caller."""
    text = "".join(f'input_stream: "in{i}"\n' for i in range(count)) + 'output_stream: "floats"\n'
    text += "".join(_CONVERTER.format(i=i) for i in range(count))
    if count > 1:
        text += _JOIN.format(inputs=" ".join(f'input_stream: "t{i}"' for i in range(count)))
    loss = "true" if fp16 else "false"
    delegate = "tflite {}" if cpu else f"gpu {{ use_advanced_gpu_api: false allow_precision_loss: {loss} }}"
    text += _INFERENCE.format(tensors="tensors" if count > 1 else "t0", model=model, delegate=delegate)
    return text + (_FLOATS.format() if outputs else "")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("inputs", help=".npz of float32 arrays [1, N]")
    parser.add_argument("output", help=".npy written with the first output, flattened")
    parser.add_argument("--inputs-order", default="token_ids,language_ids",
                        help="npz keys in the model's input order (missing keys are skipped)")
    parser.add_argument("--cpu", action="store_true", help="TFLite CPU kernels instead of the GL delegate")
    parser.add_argument("--fp16", action="store_true",
                        help="allow_precision_loss: true (float16 compute, the delegate's usual setting)")
    parser.add_argument("--rows", type=int, default=1, help="rows of the arrays, one call each")
    args = parser.parse_args()
    feeds = np.load(args.inputs)
    arrays = [np.asarray(feeds[key], np.float32).reshape(args.rows, 1, -1)
              for key in args.inputs_order.split(",") if key in feeds]
    config = graph_config(args.model, len(arrays), args.cpu, args.fp16)
    graph = calculator_graph.CalculatorGraph(graph_config=config)
    got = []
    graph.observe_output_stream("floats",
                                lambda stream, packet: got.append(packet_getter.get_float_list(packet)))
    graph.start_run()
    for row in range(args.rows):
        for i, array in enumerate(arrays):
            packet = packet_creator.create_matrix(array[row]).at(timestamp.Timestamp(row))
            graph.add_packet_to_input_stream(f"in{i}", packet)
    graph.close()
    result = np.asarray(got, np.float32)
    result = result if args.rows > 1 else result[0]
    np.save(args.output, result)
    print(json.dumps({"size": int(result.size), "all_zero": bool(not result.any()), "inputs": len(arrays)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
