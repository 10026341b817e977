"""The sessions of the kit's two-signature files: `prefill`/`decode` (run_generate.py) and
`encode`/`decode` (run_translate.py), each run one signature at a time by name.

Three runtimes, one interface (`run(signature, feeds) -> {output name: array}`, `input_names`,
`name`, `fully_accelerated`, `table`): ai-edge-litert's `CompiledModel` (`LiteRtSession`), the
classic `Interpreter` of tflite-runtime or TensorFlow (`InterpreterSession`) and onnxruntime for the
ONNX pair of `--target tensorrt` (`OnnxSession`). Each takes the `kit_contract.Export` of the file:
which file holds which signature (FILE.json's `signature_files`) and the contract's tensor names.

Kept beside run_generate.py and run_translate.py (copy them to the device together); it imports only
the runtime that is asked for.
"""

import numpy as np
from kit_runtime import compiled_model, open_runtime
from kit_runtime import interpreter as open_interpreter


def typed(feeds, dtypes, table, tensors):
    """The feeds of one call in the file's input dtypes (float32 for a `--target gl` file); a file
    that takes `embeddings` (exported with the gpu/gl default `--embedding host`) gets the rows
    `table[ids]` of the token ids instead. `tensors`: the contract's tensor names."""
    arrays = {}
    for name, dtype in dtypes.items():
        if name == tensors.embeddings:
            ids = feeds[tensors.token_ids] if tensors.token_ids in feeds else feeds[tensors.token_id]
            arrays[name] = table.rows(ids)
        else:
            arrays[name] = np.asarray(feeds[name]).astype(dtype, copy=False)
    return arrays


class InterpreterSession:
    """The classic `Interpreter` (tflite-runtime, else TensorFlow's) and its signature runners.

    A `--target gl` pair gets one interpreter per file, each with its own `--delegate` instance:
    the classic GPU delegate serves one subgraph per interpreter.
    """

    def __init__(self, export, delegate, threads):
        files, opened, self.runners = export.signature_files(), {}, {}
        for key, file in files.items():
            if file not in opened:
                opened[file], self.name = open_interpreter(file, delegate, threads)
            self.runners[key] = opened[file].get_signature_runner(key)
        self.dtypes = {key: {name: detail["dtype"] for name, detail in runner.get_input_details().items()}
                       for key, runner in self.runners.items()}
        self.tensors = export.tensors
        self.fully_accelerated = None
        self.table = None

    def input_names(self, signature):
        return list(self.dtypes[signature])

    def run(self, signature, feeds):
        return self.runners[signature](**typed(feeds, self.dtypes[signature], self.table, self.tensors))


class LiteRtSession:
    """ai-edge-litert's `CompiledModel`, on the CPU or GPU-only on the LiteRT GPU accelerator."""

    name = "ai_edge_litert.CompiledModel"

    def __init__(self, export, accelerator, threads, precision):
        files, opened = export.signature_files(), {}
        self.models, self.index = {}, {}
        for key, file in files.items():
            if file not in opened:
                opened[file] = compiled_model(file, accelerator, threads, precision)
            self.models[key] = opened[file]
            self.index[key] = list(opened[file].get_signature_list()).index(key)
        self.inputs = {key: self.models[key].get_input_tensor_details(key) for key in files}
        self.outputs = {key: self.models[key].get_output_tensor_details(key) for key in files}
        self.buffers = {key: (self.models[key].create_input_buffers(i),
                              self.models[key].create_output_buffers(i)) for key, i in self.index.items()}
        self.dtypes = {key: {name: np.dtype(detail["dtype"]) for name, detail in details.items()}
                       for key, details in self.inputs.items()}
        self.tensors = export.tensors
        self.fully_accelerated = all(model.is_fully_accelerated() for model in opened.values())
        self.table = None
        self.written = {}  # {signature: {input name: the array last written to its buffer}}

    def input_names(self, signature):
        return list(self.dtypes[signature])

    def run(self, signature, feeds):
        """One call; an input given the very array it was given at this signature's last call is not
        written again (its buffer keeps it): a sentence's source, fed at each of its decode steps."""
        inputs, outputs = self.buffers[signature]
        feeds = typed(feeds, self.dtypes[signature], self.table, self.tensors)
        written = self.written.setdefault(signature, {})
        for buffer, name in zip(inputs, self.inputs[signature]):
            if written.get(name) is not feeds[name]:
                buffer.write(np.ascontiguousarray(feeds[name]))
                written[name] = feeds[name]
        self.models[signature].run_by_index(self.index[signature], inputs, outputs)
        results = {}
        for buffer, (name, detail) in zip(outputs, self.outputs[signature].items()):
            shape = [int(n) for n in detail["shape"]]
            results[name] = buffer.read(int(np.prod(shape)), np.float32).reshape(shape)
        return results


class OnnxSession:
    """The ONNX pair of `--target tensorrt` (`STEM.prefill.onnx` / `STEM.decode.onnx`, or
    `STEM.encode.onnx` / `STEM.decode.onnx` of a translator), on onnxruntime.

    Execution providers in order of preference: TensorRT, CUDA, CPU (what the installed
    onnxruntime offers).
    """

    def __init__(self, export):
        try:
            import onnxruntime
        except ImportError:
            raise SystemExit("An .onnx pair needs onnxruntime (onnxruntime-gpu on a Jetson).") from None
        wanted = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
        providers = [p for p in wanted if p in onnxruntime.get_available_providers()]
        self.sessions = {key: onnxruntime.InferenceSession(file, providers=providers)
                         for key, file in export.signature_files().items()}
        self.name = f"onnxruntime ({providers[0]})"
        self.fully_accelerated = None
        self.table = None

    def input_names(self, signature):
        return [i.name for i in self.sessions[signature].get_inputs()]

    def run(self, signature, feeds):
        session = self.sessions[signature]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, feeds)))


def open_session(args, export):
    """The session of `args.model` that the command line asks for: onnxruntime for an `.onnx` file,
    else `kit_runtime.open_runtime`'s choice (LiteRT's `CompiledModel` or the classic Interpreter)."""
    if args.model.endswith(".onnx"):
        return OnnxSession(export)
    return open_runtime(args, lambda model, *options: LiteRtSession(export, *options),
                        lambda model, *options: InterpreterSession(export, *options), export)
