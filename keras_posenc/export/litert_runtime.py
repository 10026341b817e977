"""Runs in the LiteRT Python (`litert_python.runtime_python`): LiteRT Quantizer and LiteRT's interpreter.

Imports nothing of keras_posenc nor TensorFlow (the TF 2.12 stack pins protobuf 4.25; LiteRT
Quantizer 0.11 and ai-edge-litert 2.3 come with LiteRT-LM's builder, whose protos need protobuf
>= 6.31). Two commands:

    python litert_runtime.py quantize SPEC.json  # {"model", "out", "configs": [[op, bits, granularity]]}
    python litert_runtime.py serve               # an interpreter server on stdin/stdout (below)

`quantize` applies the configs with LiteRT Quantizer (dynamic quantization: integer weights,
float activations quantized by the kernels), then writes the file with every buffer inside the
flatbuffer and byte-identical buffers shared: the quantizer stores buffers past 256 KB after the
flatbuffer (offsets that TFLite before 2.15 cannot read, "Input tensor lacks data") and gives the
prefill and decode subgraphs their own copy of every weight. Byte-identical vectors are written
once too (FlatBuffers lets tables share them): the quantizer gives every per-channel tensor its own
int64 zero points, all 0, 8 bytes a channel. Tensor names are dropped except those of the
subgraphs' inputs and outputs (signatures name their tensors themselves; no runtime reads the
others): the converter's fused names were a ninth of the demo's int4 `cpu` file. It prints one
JSON line `{"out", "bytes", "shared"}`.

`serve` reads one JSON request a line and answers one JSON line each (arrays go through `.npz`
files whose paths the request names):

    {"op": "open", "path"}                             -> {"id", "inputs", "outputs", "signatures"}
    {"op": "invoke", "id", "feeds", "result"}          -> {"outputs": [index, ...]}
    {"op": "signature", "id", "key", "feeds", "result"} -> {"outputs": [name, ...]}
    {"op": "close"}                                    -> (exits)

`inputs` / `outputs` are the interpreter's details (name, index, shape, dtype as a string);
`signatures` maps each key to its input and output details; `feeds` is an `.npz` of the inputs
(by index as a string for `invoke`, by name for `signature`), `result` where the outputs go.
"""

import json
import os
import sys


def _sharing_builder(size):
    """A flatbuffers `Builder` that writes each byte-identical vector (or string) once.

    Every vector goes through `EndVector`; when its bytes (length, data and the padding before the
    older data) were written before, the copy is dropped and the earlier offset returned, as
    FlatBuffers' C++ `CreateSharedString` does for strings. Offsets count from the buffer's end,
    so an earlier vector keeps its alignment. A vector of tables or strings is never shared: its
    elements are offsets relative to their own position, so equal bytes elsewhere name other
    objects.
    """
    import flatbuffers

    class SharingBuilder(flatbuffers.Builder):
        def __init__(self, initial_size):
            super().__init__(initial_size)
            self._written, self._start, self._relative = {}, None, False

        def StartVector(self, elemSize, numElems, alignment):  # noqa: N802, N803 (flatbuffers' names)
            self._start = self.Offset()
            return super().StartVector(elemSize, numElems, alignment)

        def PrependUOffsetTRelative(self, off):  # noqa: N802
            self._relative = self._relative or self._start is not None
            return super().PrependUOffsetTRelative(off)

        def CreateNumpyVector(self, x):  # noqa: N802
            self._start = self.Offset()
            return super().CreateNumpyVector(x)

        def CreateString(self, s, encoding="utf-8", errors="strict"):  # noqa: N802
            self._start = self.Offset()
            return super().CreateString(s, encoding, errors)

        def CreateByteVector(self, x):  # noqa: N802
            self._start = self.Offset()
            return super().CreateByteVector(x)

        def EndVector(self, *args):  # noqa: N802
            offset = super().EndVector(*args)
            start, relative = self._start, self._relative
            self._start, self._relative = None, False
            if start is None or relative:
                return offset
            end = len(self.Bytes) - start
            written = self._written.setdefault(bytes(self.Bytes[self.head:end]), offset)
            if written != offset:
                self.Bytes[self.head:end] = bytes(end - self.head)
                self.head = end
            return written

    return SharingBuilder(size)


def _inline(data):
    """The model's flatbuffer with every buffer inside it and identical buffers shared: `(bytes, shared)`.

    Identical vectors are written once and only the subgraphs' input and output tensors keep
    their names (this module's docstring says why).
    """
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(data, 0)
    for buffer in model.buffers:
        if buffer.offset and buffer.offset > 1:
            buffer.data = np.frombuffer(data[buffer.offset:buffer.offset + buffer.size], np.uint8)
        buffer.offset, buffer.size = 0, 0
    first, moved = {}, {}
    for index, buffer in enumerate(model.buffers):
        if buffer.data is not None and len(buffer.data):
            moved[index] = first.setdefault(bytes(buffer.data), index)
    moved = {index: target for index, target in moved.items() if index != target}
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            tensor.buffer = moved.get(tensor.buffer, tensor.buffer)
    for index in moved:
        model.buffers[index].data = None
    for subgraph in model.subgraphs:
        named = set(subgraph.inputs if subgraph.inputs is not None else ()) | set(
            subgraph.outputs if subgraph.outputs is not None else ())
        for index, tensor in enumerate(subgraph.tensors):
            if index not in named:
                tensor.name = None
    builder = _sharing_builder(len(data))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), len(moved)


def quantize(spec):
    """LiteRT Quantizer's dynamic quantization of `spec["model"]` by `spec["configs"]`, to `spec["out"]`."""
    from litert_quantizer import qtyping, quantizer, recipe_manager

    manager = recipe_manager.RecipeManager()
    for op, bits, granularity in spec["configs"]:
        manager.add_dynamic_config(".*", qtyping.TFLOperationName[op], bits,
                                   granularity=qtyping.QuantGranularity[granularity])
    quantized = quantizer.Quantizer(spec["model"])
    quantized.load_quantization_recipe(manager.get_quantization_recipe())
    flat, shared = _inline(bytes(quantized.quantize().quantized_model))
    with open(spec["out"], "wb") as f:
        f.write(flat)
    return {"out": spec["out"], "bytes": len(flat), "shared": shared}


def _details(details):
    return [{"name": d["name"], "index": int(d["index"]), "shape": [int(n) for n in d["shape"]],
             "dtype": d["dtype"].__name__ if hasattr(d["dtype"], "__name__") else str(d["dtype"])}
            for d in details]


def _handle(request, interpreters):
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    op = request["op"]
    if op == "open":
        interpreter = Interpreter(model_path=request["path"])
        interpreter.allocate_tensors()
        handle = len(interpreters)
        interpreters.append(interpreter)
        signatures = {}
        for key in interpreter.get_signature_list():
            runner = interpreter.get_signature_runner(key)
            signatures[key] = {
                "inputs": {name: _details([d])[0] for name, d in runner.get_input_details().items()},
                "outputs": {name: _details([d])[0] for name, d in runner.get_output_details().items()}}
        return {"id": handle, "inputs": _details(interpreter.get_input_details()),
                "outputs": _details(interpreter.get_output_details()), "signatures": signatures}
    interpreter = interpreters[request["id"]]
    with np.load(request["feeds"]) as feeds:
        arrays = {name: feeds[name] for name in feeds.files}
    if op == "invoke":
        for index, array in arrays.items():
            interpreter.set_tensor(int(index), array)
        interpreter.invoke()
        outputs = {str(d["index"]): interpreter.get_tensor(d["index"])
                   for d in interpreter.get_output_details()}
    elif op == "signature":
        outputs = interpreter.get_signature_runner(request["key"])(**arrays)
    else:
        raise ValueError(f"unknown request {op!r}")
    np.savez(request["result"], **outputs)
    return {"outputs": list(outputs)}


def serve(channel):
    """Answers requests from stdin on `channel` until "close" or the end of the input."""
    interpreters = []
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "close":
            break
        try:
            answer = _handle(request, interpreters)
        except Exception as error:  # the runtime's own error types, reported to the client
            answer = {"error": f"{type(error).__name__}: {error}"}
        channel.write(json.dumps(answer) + "\n")
        channel.flush()


def main(argv):
    # The runtimes print to stdout (delegate and XNNPACK lines): the answers get their own channel.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if argv[0] == "serve":
        serve(channel)
        return 0
    command, spec_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    result = {"quantize": quantize}[command](spec)
    channel.write(json.dumps(result) + "\n")
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
