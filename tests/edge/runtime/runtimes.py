"""Runs exported files on the CPU-emulated GPU runtimes of the edge cache, as subprocesses.

- `run_litert`: ai-edge-litert 2.3 `CompiledModel` (GPU = the WebGPU accelerator over Vulkan,
  here Mesa lavapipe), see tests/edge/runtime/probe_litert.py;
- `run_gl`: the classic TFLite GPU delegate's OpenGL ES backend bundled in mediapipe 0.10.21,
  on Mesa llvmpipe (EGL surfaceless), see tests/edge/runtime/probe_gl.py; `run_gl_generate` and
  `run_gl_translate` run the greedy loops of a `gl` prefill/decode and encode/decode pair there
  (probe_gl_generate.py, probe_gl_translate.py);
- `run_genai`: onnxruntime-genai 0.18's generator (CPU) on a `--format genai` folder, see
  tests/edge/runtime/probe_genai.py.

`run_litert` and `run_gl` return a `Run`: the exit status, the probe's JSON line, the runtime's own
log (stderr) and the first output. `tests/edge/runtime/bootstrap.sh` (run by `make test-edge`) fills
the cache.
"""

import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
CACHE = os.environ.get("EDGE_CACHE", os.path.join(ROOT, ".edge-cache"))
# tf2onnx + onnxruntime, one folder per Python of the package's locks: tf2onnx 1.16.1 beside
# .venv (TF 2.12, Python 3.11), tf2onnx 1.17.0 beside .venv-keras3 (TF 2.21, Python 3.12).
ONNX_SITES = {(3, 11): "onnx-site", (3, 12): "onnx-site-py312"}
ONNX_SITE = ONNX_SITES.get(sys.version_info[:2], "onnx-site")
# The Jetson kit's device side: tflite-runtime 2.14 + numpy + sentencepiece, no TensorFlow, on JetPack 5's
# Python 3.8 and JetPack 6's 3.10; numpy 2.2.6 to put in front of the 3.10 venv's numpy 1.26.
KIT_VENVS = {"3.8": "venv-tflite-py38", "3.10": "venv-tflite-py310"}
NUMPY2_SITE = "numpy2-py310"
PARTS = ("mesa/.stamp", "venv-litert/.stamp", "venv-mediapipe/.stamp", "venv-litertlm/.stamp",
         "venv-genai/.stamp", f"{ONNX_SITE}/.stamp", *(f"{venv}/.stamp" for venv in KIT_VENVS.values()),
         f"{NUMPY2_SITE}/.stamp")

Run = collections.namedtuple("Run", ["returncode", "info", "log", "output"])

# The lines in which the runtimes say that an op does not run on the GPU.
_REFUSALS = re.compile(r"not supported by GPU delegate|Operation is not supported|No shader implementation|"
                       r"Max version supported|failed to prepare|will run on the CPU|"
                       r"Some ops are not accelerated|isn't compatible|Not supported")


def missing_parts():
    """The parts of the cache that are not bootstrapped (empty when everything is there)."""
    return [part for part in PARTS if not os.path.isfile(os.path.join(CACHE, part))]


def onnx_site():
    """The folder with tf2onnx + onnxruntime to put on `sys.path` of this Python (.venv or .venv-keras3)."""
    return os.path.join(CACHE, ONNX_SITE)


def litertlm_python():
    """The Python of the edge cache's venv-litertlm (litert-lm-builder, litert-lm-api, litert-lm 0.18.1)."""
    return os.path.join(CACHE, "venv-litertlm", "bin", "python")


def run_genai(folder, sessions, max_new_tokens, timeout=600):
    """onnxruntime-genai 0.18's greedy sessions of a `--format genai` folder (runtime/probe_genai.py).

    `sessions`: lists of turns (str), one generator each. Returns the probe's JSON (`prompt_ids`,
    `turns`, `texts`, `version`); raises AssertionError with the runtime's log when it fails.
    """
    with tempfile.TemporaryDirectory() as scratch:
        spec = os.path.join(scratch, "spec.json")
        with open(spec, "w") as f:
            json.dump({"folder": os.path.abspath(folder), "sessions": sessions,
                       "max_new_tokens": max_new_tokens}, f)
        command = [os.path.join(CACHE, "venv-genai", "bin", "python"), os.path.join(HERE, "probe_genai.py"),
                   spec]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def kit_python(version):
    """The Python of the kit's tflite-runtime venv for Python `version` ("3.8" or "3.10")."""
    return os.path.join(CACHE, KIT_VENVS[version], "bin", "python")


def numpy2_site():
    """A folder holding only numpy 2.2.6 (for Python 3.10): on PYTHONPATH it shadows the venv's numpy 1.26."""
    return os.path.join(CACHE, NUMPY2_SITE)


def lavapipe_environment(scratch):
    """The environment in which Vulkan (LiteRT-LM's and LiteRT's WebGPU backends) finds Mesa lavapipe."""
    return _environment(scratch)


def _environment(scratch):
    lib = os.path.join(CACHE, "mesa", "usr", "lib", "x86_64-linux-gnu")
    env = dict(os.environ, VK_ICD_FILENAMES=os.path.join(CACHE, "mesa", "lvp_icd.json"),
               XDG_RUNTIME_DIR=scratch, EGL_PLATFORM="surfaceless")
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def _probe(venv, script, model_path, feeds, flags, timeout):
    with tempfile.TemporaryDirectory() as scratch:
        inputs, output = os.path.join(scratch, "inputs.npz"), os.path.join(scratch, "output.npy")
        np.savez(inputs, **feeds)
        env = _environment(scratch)
        if venv == "venv-mediapipe":  # llvmpipe from the system's Mesa, not lavapipe's libdrm
            env.pop("LD_LIBRARY_PATH")
        command = [os.path.join(CACHE, venv, "bin", "python"), os.path.join(HERE, script), model_path,
                   inputs, output] + flags
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        info = None
        if result.returncode == 0 and result.stdout.strip():
            info = json.loads(result.stdout.strip().splitlines()[-1])
        data = np.load(output) if os.path.isfile(output) else None
        return Run(result.returncode, info, result.stderr, data)


def run_litert(model_path, feeds, *, accelerator="gpu", allow_cpu=False, fp16=False, timeout=600):
    """Runs `model_path` with LiteRT's CompiledModel; GPU-only unless `allow_cpu`.

    `feeds`: {"token_ids": array, "language_ids": array, ...} matched to the inputs by name; arrays
    with more rows than the model's batch run a batch at a time (one compilation), the output
    holds every row.
    A GPU-only compilation fails (non-zero exit, the runtime's reason in the log) when any op
    does not run on the GPU. `fp16`: the GPU computes in float16 (no enforce_f32).
    """
    flags = ["--accelerator", accelerator] + (["--allow-cpu"] if allow_cpu else [])
    flags += ["--fp16"] if fp16 else []
    return _probe("venv-litert", "probe_litert.py", model_path, feeds, flags, timeout)


def run_gl(model_path, feeds, *, cpu=False, fp16=False, rows=1, timeout=600):
    """Runs `model_path` on the GL delegate (or TFLite's CPU kernels with `cpu=True`) via mediapipe.

    The probe joins the arrays in the model's input order, read from the file: each key of `feeds`
    (token_ids, segment_ids, ...) goes to the input whose name contains it. `fp16`: the delegate
    with `allow_precision_loss: true` (float16 compute). `rows` > 1: each array holds that many rows of
    the batch-1 inputs, run one after the other by one graph; the output is `[rows, size]`.
    """
    flags = ["--inputs-order", ",".join(input_order(model_path, feeds))] + (["--cpu"] if cpu else [])
    flags += ["--rows", str(rows)]
    flags += ["--fp16"] if fp16 else []
    return _probe("venv-mediapipe", "probe_gl.py", model_path, feeds, flags, timeout)


def input_order(model_path, keys):
    """`keys` in the order of the model's inputs (matched by name; TF 2.21's converter sorts them).

    Keys that no input name contains keep their given order after the matched ones.
    """
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(model_path)
    graph = model.subgraphs[0]
    names = [graph.tensors[index].name.decode() for index in graph.inputs]
    keys = list(keys)
    ordered = [next((key for key in keys if key in name), None) for name in names]
    ordered = [key for key in ordered if key is not None]
    return ordered + [key for key in keys if key not in ordered]


def refusals(log):
    """The runtime's own lines saying that ops do not run on the GPU."""
    return [line.strip() for line in log.splitlines() if _REFUSALS.search(line)]


def refused_ops(log):
    """Op names the runtime's messages name (upper-case TFLite names, e.g. GATHER, TRANSPOSE)."""
    names = set()
    for line in refusals(log) + [line for line in log.splitlines() if re.match(r"^[A-Z0-9_]+: ", line)]:
        names.update(re.findall(r"\b([A-Z][A-Z0-9_]{2,})\b(?=:| op|\b)", line))
        shader = re.search(r"No shader implementation for (\w+)", line)
        if shader:
            names.add(shader.group(1).upper())
    return names - {"ERROR", "INFO", "WARNING", "GPU", "CPU", "OK"}


def signature_io(model_path, key):
    """`(inputs, outputs)`: the signature `key`'s tensor names in its subgraph's input/output order."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(model_path)
    signature = next(s for s in model.signatureDefs if s.signatureKey.decode() == key)
    graph = model.subgraphs[signature.subgraphIndex]
    names = {t.tensorIndex: t.name.decode() for t in signature.inputs + signature.outputs}
    return [names[i] for i in graph.inputs], [names[i] for i in graph.outputs]


def run_gl_generate(paths, prompt, max_new_tokens, *, pad_id, table=None, cpu=False, fp16=False,
                    timeout=900):
    """Greedy generation from the `(prefill, decode)` files of a `gl` export on the GL delegate
    (tests/edge/runtime/probe_gl_generate.py); `table`: the token table of an `embedding="host"` export.

    Returns a `Run` whose `output` is `(ids, logits)` of the generated tokens.
    """
    with tempfile.TemporaryDirectory() as scratch:
        spec = {"prompt": list(prompt), "max_new_tokens": max_new_tokens, "pad_id": pad_id}
        for key, path in zip(("prefill", "decode"), paths):
            inputs, outputs = signature_io(path, key)
            spec[key] = {"model": os.path.abspath(path), "inputs": inputs, "outputs": outputs}
        from tensorflow.lite.tools import flatbuffer_utils

        model = flatbuffer_utils.read_model(spec["prefill"]["model"])
        spec["prompt_length"] = int(model.subgraphs[0].tensors[model.subgraphs[0].inputs[0]].shape[1])
        if table is not None:
            spec["table"] = os.path.join(scratch, "table.npy")
            np.save(spec["table"], np.asarray(table, np.float32))
        return _run_gl_probe("probe_gl_generate.py", spec, scratch, cpu, fp16, timeout,
                             lambda arrays: (arrays["ids"].tolist(), arrays["logits"]))


def _run_gl_probe(script, spec, scratch, cpu, fp16, timeout, read):
    """Runs a GL-delegate probe (`script`, tests/edge/runtime/) on `spec` in mediapipe's venv: a `Run`
    whose `output` is `read(the probe's arrays)`, None where it wrote none."""
    spec_path, output = os.path.join(scratch, "spec.json"), os.path.join(scratch, "output.npz")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = _environment(scratch)
    env.pop("LD_LIBRARY_PATH")  # llvmpipe from the system's Mesa, as in run_gl
    command = [os.path.join(CACHE, "venv-mediapipe", "bin", "python"), os.path.join(HERE, script),
               spec_path, output]
    command += (["--cpu"] if cpu else []) + (["--fp16"] if fp16 else [])
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    info = None
    if result.returncode == 0 and result.stdout.strip():
        info = json.loads(result.stdout.strip().splitlines()[-1])
    data = None
    if os.path.isfile(output):
        with np.load(output) as arrays:
            data = read(arrays)
    return Run(result.returncode, info, result.stderr, data)


def run_gl_translate(paths, sources, max_new_tokens, *, pad_id, bos_id, eos_id, forced=None, cpu=False,
                     fp16=False, timeout=900):
    """Greedy translation of the id rows `sources` with the `(encode, decode)` files of a `gl`
    translator export on the GL delegate (tests/edge/runtime/probe_gl_translate.py); `forced`: per
    sentence, the tokens to feed instead of the argmax (teacher forcing, one step each).

    Returns a `Run` whose `output` is a list of `(ids, logits)`, one per sentence: the greedy ids
    without the end token (with `forced`: every step's argmax) and the float32 logits of each step.
    """
    with tempfile.TemporaryDirectory() as scratch:
        spec = {"sources": [[int(i) for i in row] for row in sources], "max_new_tokens": max_new_tokens,
                "pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id,
                "forced": None if forced is None else [[int(i) for i in row] for row in forced]}
        for key, path in zip(("encode", "decode"), paths):
            inputs, outputs = signature_io(path, key)
            spec[key] = {"model": os.path.abspath(path), "inputs": inputs, "outputs": outputs}
        from tensorflow.lite.tools import flatbuffer_utils

        graph = flatbuffer_utils.read_model(spec["decode"]["model"]).subgraphs[0]
        past = next(index for index, name in zip(graph.inputs, spec["decode"]["inputs"])
                    if name.startswith("past_"))
        spec["cache_shape"] = [int(n) for n in graph.tensors[past].shape]
        return _run_gl_probe("probe_gl_translate.py", spec, scratch, cpu, fp16, timeout,
                             lambda arrays: [(arrays[f"ids_{k}"].tolist(), arrays[f"logits_{k}"])
                                             for k in range(len(sources))])
