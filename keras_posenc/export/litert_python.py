"""The LiteRT Python: a second interpreter with LiteRT's own tools, and how the exporter talks to it.

LiteRT-LM's builder and engine (`litert-lm-builder`, `litert-lm-api`), LiteRT Quantizer
(`litert-quantizer`) and ai-edge-litert 2.3 need protobuf >= 6.31. The Keras 3 lock
(requirements/tf221.txt) installs them, so its venv is its own LiteRT Python; the TF 2.12 stack
(protobuf 4.25) cannot load them, so there they live in a Python of their own, which
`runtime_python` creates on first use from the pins of `litert_python.txt` and keeps in
keras-posenc's cache (`keras_posenc.export.tool_env`; `$KERAS_POSENC_LITERT_PYTHON` names another
one). The exporter runs scripts there
(`litertlm_runtime.py`: pack and run bundles; `litert_runtime.py`: quantize, and an interpreter
server) with a JSON spec, and `RemoteInterpreter` runs a `.tflite` in ai-edge-litert's interpreter
through that server, with the part of `tf.lite.Interpreter`'s interface the checks use.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from keras_posenc.export import tool_env

__all__ = ["ENVIRONMENT", "INSTALL_HINT", "LEGACY_PYTHON_ENV", "PYTHON_ENV", "RemoteInterpreter",
           "RemoteRuntime", "run_script", "runtime_python"]

# The Python with LiteRT's tools: this variable, or the older name LiteRT-LM bundles used.
PYTHON_ENV = "KERAS_POSENC_LITERT_PYTHON"
LEGACY_PYTHON_ENV = "KERAS_POSENC_LITERTLM_PYTHON"
PACKAGES = "litert-lm-api==0.18.1 litert-lm-builder==0.18.1 litert-quantizer==0.11.0"
# What to do where none can be had (a Python named that is none, `$KERAS_POSENC_NO_TOOL_INSTALL`).
INSTALL_HINT = (f"without --litert-python, ${PYTHON_ENV} and ${tool_env.NO_INSTALL_ENV}, keras-posenc "
                "creates one on first use; or run "
                f"python3 -m venv venv-litert-tools && venv-litert-tools/bin/pip install {PACKAGES}, "
                f"then set {PYTHON_ENV}=venv-litert-tools/bin/python (or pass --litert-python)")
_HERE = os.path.dirname(os.path.abspath(__file__))
# The LiteRT Python that keras-posenc creates where this Python cannot import LiteRT's tools.
ENVIRONMENT = tool_env.ToolEnvironment(
    name="litert-python", requirements=os.path.join(_HERE, "litert_python.txt"),
    what="LiteRT's tools (litert-lm-builder 0.18.1, litert-quantizer 0.11.0)",
    pythons=("3.11", "3.12", "3.13"),
    override=f"set {PYTHON_ENV} to a Python that has them (or pass --litert-python)")


def runtime_python(python=None, module="litert_lm_builder"):
    """The LiteRT Python: `python`, else `$KERAS_POSENC_LITERT_PYTHON` (or `$KERAS_POSENC_LITERTLM_PYTHON`),
    else this one when it imports `module`, else keras-posenc's own (`ENVIRONMENT`), created on
    first use (`tool_env.ensure`: one line on stderr says so).

    Returns:
        str, the path of that Python; None only when keras-posenc's own does not exist yet and
        `$KERAS_POSENC_NO_TOOL_INSTALL` forbids creating it.

    Raises:
        ValueError: `python` (or the variable) names no executable file.
        tool_env.ToolEnvironmentError: keras-posenc's own could not be created (one line: why).
    """
    python = python or os.environ.get(PYTHON_ENV) or os.environ.get(LEGACY_PYTHON_ENV)
    if python:
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ValueError(f"the LiteRT Python {python!r} is not an executable file: {INSTALL_HINT}.")
        return python
    try:
        __import__(module)
    except ImportError:
        return tool_env.ensure(ENVIRONMENT)
    return sys.executable


def run_script(python, script, command, spec, timeout=600, env=None):
    """`python SCRIPT COMMAND SPEC.json` (a script beside this module): `(its last JSON line, its stderr)`.

    Raises:
        RuntimeError: the script failed (its last log lines in the message).
    """
    with tempfile.TemporaryDirectory(prefix="keras_posenc_litert_") as folder:
        path = os.path.join(folder, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        done = subprocess.run([python, os.path.join(_HERE, script), command, path], capture_output=True,
                              text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(f"LiteRT `{command}` failed (exit {done.returncode}): " + " | ".join(lines[-3:]))
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


class RemoteRuntime:
    """The interpreter server of `litert_runtime.py serve` in the LiteRT Python (a context manager).

    One process serves every `RemoteInterpreter` opened through it; `close()` ends it.
    """

    def __init__(self, python):
        self.folder = tempfile.TemporaryDirectory(prefix="keras_posenc_litert_")
        self.count = 0
        self.process = subprocess.Popen([python, os.path.join(_HERE, "litert_runtime.py"), "serve"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def path(self, name):
        self.count += 1
        return os.path.join(self.folder.name, f"{self.count}-{name}")

    def request(self, **request):
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:  # it died before the request (a crash in an earlier one): nothing to read
            line = ""
        else:
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the LiteRT interpreter server exited (status {self.process.wait()}).")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"LiteRT's interpreter: {answer['error']}")
        return answer

    def call(self, op, arrays, **request):
        """A request with `arrays` as its feeds: the outputs it returns, as numpy arrays."""
        feeds, result = self.path("feeds.npz"), self.path("result.npz")
        np.savez(feeds, **arrays)
        answer = self.request(op=op, feeds=feeds, result=result, **request)
        with np.load(result) as outputs:
            values = {name: outputs[name] for name in answer["outputs"]}
        os.remove(feeds)
        os.remove(result)
        return values

    def interpreter(self, model_content=None, model_path=None):
        """A `RemoteInterpreter` of the flatbuffer `model_content` (or the file `model_path`)."""
        if model_path is None:
            model_path = self.path("model.tflite")
            with open(model_path, "wb") as f:
                f.write(bytes(model_content))
        return RemoteInterpreter(self, model_path)

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        self.folder.cleanup()


def _details(details):
    return dict(details, dtype=np.dtype(details["dtype"]).type, shape=np.array(details["shape"], np.int32))


class RemoteInterpreter:
    """A `.tflite` in ai-edge-litert's `Interpreter` in the LiteRT Python, as the checks call an interpreter.

    `get_input_details`, `get_output_details`, `allocate_tensors`, `set_tensor`, `invoke`,
    `get_tensor`, `get_signature_list` and `get_signature_runner(key)` (callable with the inputs
    by name, returning the outputs by name), as `tf.lite.Interpreter` has them.
    """

    def __init__(self, runtime, model_path):
        self.runtime = runtime
        answer = runtime.request(op="open", path=model_path)
        self.id = answer["id"]
        self.inputs = [_details(d) for d in answer["inputs"]]
        self.outputs = [_details(d) for d in answer["outputs"]]
        self.signatures = answer["signatures"]
        self.fed = {}
        self.results = {}

    def allocate_tensors(self):
        pass

    def get_input_details(self):
        return list(self.inputs)

    def get_output_details(self):
        return list(self.outputs)

    def set_tensor(self, index, value):
        self.fed[str(index)] = np.asarray(value)

    def invoke(self):
        self.results = self.runtime.call("invoke", self.fed, id=self.id)

    def get_tensor(self, index):
        return self.results[str(index)]

    def get_signature_list(self):
        return {key: {"inputs": list(s["inputs"]), "outputs": list(s["outputs"])}
                for key, s in self.signatures.items()}

    def get_signature_runner(self, key):
        return _RemoteRunner(self, key)


class _RemoteRunner:
    def __init__(self, interpreter, key):
        self.interpreter, self.key = interpreter, key
        self.signature = interpreter.signatures[key]

    def get_input_details(self):
        return {name: _details(d) for name, d in self.signature["inputs"].items()}

    def get_output_details(self):
        return {name: _details(d) for name, d in self.signature["outputs"].items()}

    def __call__(self, **feeds):
        return self.interpreter.runtime.call("signature", {k: np.asarray(v) for k, v in feeds.items()},
                                             id=self.interpreter.id, key=self.key)
