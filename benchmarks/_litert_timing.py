"""Run in the LiteRT Python by bench_quantize.py: one-thread latency of a `.tflite` in ai-edge-litert.

    python _litert_timing.py window MODEL FEEDS.npz CALLS      # {"ms": median ms of one invoke}
    python _litert_timing.py decode MODEL POSITION CALLS       # {"ms", "tokens_per_s"} of one decode step
"""

import json
import sys
import time

import numpy as np
from ai_edge_litert.interpreter import Interpreter


def median_ms(call, calls):
    call()  # the first call allocates and packs the weights
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def window(path, feeds_path, calls):
    interpreter = Interpreter(model_path=path, num_threads=1)
    interpreter.allocate_tensors()
    with np.load(feeds_path) as feeds:
        arrays = {name: feeds[name] for name in feeds.files}
    for detail in interpreter.get_input_details():
        key = next((key for key in ("language_ids", "embeddings") if key in detail["name"]), "token_ids")
        interpreter.set_tensor(detail["index"], arrays[key].astype(detail["dtype"]))
    return {"ms": median_ms(interpreter.invoke, calls)}


def decode(path, position, calls):
    interpreter = Interpreter(model_path=path, num_threads=1)
    runner = interpreter.get_signature_runner("decode")
    feeds = {}
    for name, detail in runner.get_input_details().items():
        value = position if name == "position" else (7 if name == "token_id" else 0)
        feeds[name] = np.full(detail["shape"], value, detail["dtype"])
    ms = median_ms(lambda: runner(**feeds), calls)
    return {"ms": ms, "tokens_per_s": 1e3 / ms}


if __name__ == "__main__":
    command, path, argument, calls = sys.argv[1:]
    if command == "window":
        result = window(path, argument, int(calls))
    else:
        result = decode(path, int(argument), int(calls))
    print(json.dumps(result))
