"""Greedy generation from a prefill/decode `.tflite` on the GL delegate (mediapipe); one JSON line.

A `gl` export is two one-signature files, `STEM.prefill.tflite` and `STEM.decode.tflite` (the
classic GPU delegate serves one subgraph per interpreter). Each runs in its own mediapipe graph,
kept open for all steps: the inputs (float32, the `gl` target) joined in the subgraph's input
order, every output split off and read back as floats, the cache outputs fed to the next step.

    python probe_gl_generate.py SPEC.json OUTPUT.npz [--cpu | --fp16]

SPEC.json: {"prefill": {"model", "inputs", "outputs"}, "decode": {...}, "prompt", "max_new_tokens",
"pad_id", "prompt_length", "table" (an .npy path or null)}. OUTPUT.npz: `ids`, `logits` (the
float32 logits that chose each token); the JSON line adds `ttft_ms` (the first call, shader
compilation included) and `decode_tokens_per_s`.
"""

import argparse
import json
import sys
import time

import numpy as np
import probe_gl  # before mediapipe: it stubs the modules that mediapipe's package imports
from mediapipe.framework import calculator_pb2

_SPLIT = """
node {{
  calculator: "SplitTensorVectorCalculator"
  input_stream: "out"
  {streams}
  options {{ [mediapipe.SplitVectorCalculatorOptions.ext] {{ {ranges} }} }}
}}
"""
_FLOATS = """
node {{
  calculator: "TensorsToFloatsCalculator"
  input_stream: "TENSORS:o{i}"
  output_stream: "FLOATS:f{i}"
}}
"""


class Signature:
    """One signature's copy of the file in a running mediapipe graph."""

    def __init__(self, spec, cpu, fp16):
        self.inputs, self.outputs = spec["inputs"], spec["outputs"]
        text = probe_gl.graph_config_text(spec["model"], len(self.inputs), cpu, fp16, outputs=False)
        text = text.replace('output_stream: "floats"\n', "".join(
            f'output_stream: "f{i}"\n' for i in range(len(self.outputs))), 1)
        count = len(self.outputs)
        text += _SPLIT.format(streams=" ".join(f'output_stream: "o{i}"' for i in range(count)),
                              ranges=" ".join(f"ranges: {{ begin: {i} end: {i + 1} }}" for i in range(count)))
        text += "".join(_FLOATS.format(i=i) for i in range(count))
        config = probe_gl.text_format.Parse(text, calculator_pb2.CalculatorGraphConfig())
        self.graph = probe_gl.calculator_graph.CalculatorGraph(graph_config=config)
        self.got = {}
        for i, name in enumerate(self.outputs):
            self.graph.observe_output_stream(
                f"f{i}", lambda stream, packet, name=name: self.got.__setitem__(
                    name, np.asarray(probe_gl.packet_getter.get_float_list(packet), np.float32)))
        self.graph.start_run()
        self.step = 0

    def run(self, feeds):
        self.got = {}
        for i, name in enumerate(self.inputs):
            array = np.asarray(feeds[name], np.float32).reshape(1, -1)
            packet = probe_gl.packet_creator.create_matrix(array).at(probe_gl.timestamp.Timestamp(self.step))
            self.graph.add_packet_to_input_stream(f"in{i}", packet)
        self.graph.wait_until_idle()
        self.step += 1
        return dict(self.got)

    def close(self):
        self.graph.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("output")
    parser.add_argument("--cpu", action="store_true", help="TFLite CPU kernels instead of the GL delegate")
    parser.add_argument("--fp16", action="store_true", help="allow_precision_loss: true")
    args = parser.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    table = np.load(spec["table"]) if spec.get("table") else None
    prefill, decode = (Signature(spec[key], args.cpu, args.fp16) for key in ("prefill", "decode"))
    prompt, pad_id = spec["prompt"], spec["pad_id"]
    n = len(prompt)
    tokens = np.full([1, spec["prompt_length"]], pad_id, np.int64)
    tokens[0, :n] = prompt

    def feeds_of(ids, extra):
        feeds = dict(extra, token_ids=ids, token_id=ids)
        if table is not None:
            feeds["embeddings"] = table[ids]
        return feeds

    start = time.perf_counter()
    outputs = prefill.run(feeds_of(tokens, {}))
    ttft, start = time.perf_counter() - start, time.perf_counter()
    vocab = outputs["logits"].size // spec["prompt_length"]
    logits = outputs["logits"].reshape(-1, vocab)[n - 1]
    ids, chosen = [], []
    for step in range(spec["max_new_tokens"]):
        chosen.append(logits)
        masked = np.array(logits, np.float64)
        masked[pad_id] = -np.inf
        ids.append(int(np.argmax(masked)))
        if step == spec["max_new_tokens"] - 1:
            break
        cache = {name.replace("present_", "past_"): value for name, value in outputs.items()
                 if name != "logits"}
        outputs = decode.run(feeds_of(np.array([[ids[-1]]]), dict(cache, position=np.array([n + step]))))
        logits = outputs["logits"]
    decode_seconds = time.perf_counter() - start
    prefill.close()
    decode.close()
    np.savez(args.output, ids=np.array(ids), logits=np.stack(chosen))
    rate = (len(ids) - 1) / decode_seconds if len(ids) > 1 else None
    print(json.dumps({"ids": ids, "finite": bool(np.isfinite(np.stack(chosen)).all()), "ttft_ms": ttft * 1e3,
                      "decode_tokens_per_s": rate}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
