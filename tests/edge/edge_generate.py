"""Prefill/decode exports on the device runtimes: LiteRT's CompiledModel (the kit), the GL delegate and
onnxruntime; the gpu and gl files on the emulated GPUs in float32 and in their float16 modes."""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from float16_rules import check_half_generation

from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import generator, pipeline
from keras_posenc.models import CausalLM

KIT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "export", "jetson", "run_generate.py")
PROMPT = [2, 9, 17, 5, 11]


def causal_lm(**config):
    keras.utils.set_random_seed(3)
    model = CausalLM({"num_layers": 2, "d_model": 32, "num_heads": 4, "dff": 64, "vocab_size": 300,
                      "max_length": 48, "dropout": 0.0, **config})
    model.build_on_dummy()
    return model


def test_the_kit_on_litert_generates_the_keras_tokens(edge, tmp_path):
    model = causal_lm(position="rope", scaling="yarn", scaling_factor=2.0, original_length=24)
    path = str(tmp_path / "gen.tflite")
    result = pipeline.export_generator(model, path, prompt_length=8, cache_length=40, check_tokens=32,
                                       target="cpu")
    assert result["same_tokens"] and result["parity"] <= 1e-4
    litert = os.path.join(edge.CACHE, "venv-litert", "bin", "python")
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run([litert, KIT, path, "--prompt-ids", ",".join(map(str, PROMPT)),
                               "--max-new-tokens", "32", "--runtime", "litert", "--json"],
                              capture_output=True, text=True, timeout=600, env=edge._environment(scratch))
    assert done.returncode == 0, done.stderr[-3000:]
    kit = json.loads(done.stdout.strip().splitlines()[-1])
    assert kit["ids"] == model.generate(PROMPT, 32).ids[0].tolist()


def test_the_onnx_pair_generates_the_keras_tokens(edge, tmp_path):
    model = causal_lm(position="alibi")
    out = str(tmp_path / "gen.onnx")
    result = pipeline.export_generator(model, out, prompt_length=8, cache_length=40, target="tensorrt",
                                        check_tokens=32)
    assert result["files"] == [str(tmp_path / "gen.prefill.onnx"), str(tmp_path / "gen.decode.onnx")]
    assert result["same_tokens"] and result["tokens_checked"] == 32 and result["parity"] <= 1e-4
    done = subprocess.run([sys.executable, KIT, out, "--prompt-ids", ",".join(map(str, PROMPT)),
                           "--max-new-tokens", "32", "--json"], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr[-3000:]
    kit = json.loads(done.stdout.strip().splitlines()[-1])
    assert kit["ids"] == model.generate(PROMPT, 32).ids[0].tolist()


# gpu/gl prefill/decode: the LiteRT GPU accelerator (lavapipe) and the GL delegate (llvmpipe) ----------
NEW_TOKENS = 32
# Every position kind on both GPU runtimes, exported on Keras 2; Keras 3 exports one (same graphs).
POSITIONS = {
    "sinusoidal": {"position": "sinusoidal"},
    "rope-yarn": {"position": "rope", "scaling": "yarn", "scaling_factor": 2.0, "original_length": 24},
    "alibi": {"position": "alibi"},
    "learned": {"position": "learned"},
}
KERAS3_POSITIONS = ("rope-yarn",)


def tied_lm(config):
    """A small LM whose head is the token table (clear winners, as in edge_targets.tie_head)."""
    model = causal_lm(**config)
    table = model.encoder.embedding.token_embedding.embeddings
    model.head.kernel.assign(table.numpy().T)
    return model


def keras_reference(model):
    """Keras' greedy ids and the full-forward logits `[NEW_TOKENS, vocab]` that chose them."""
    ids = model.generate(PROMPT, NEW_TOKENS).ids[0].tolist()
    sequence = np.array([PROMPT + ids[:-1]], np.int32)
    full = np.asarray(model(sequence))[0, len(PROMPT) - 1:]
    return ids, full


@pytest.fixture(scope="module", params=sorted(POSITIONS))
def generation_case(request, tmp_path_factory):
    if is_keras3() and request.param not in KERAS3_POSITIONS:
        pytest.skip(f"{request.param}: exported on Keras 2 only (the same gl graphs; CI time is tight)")
    model = tied_lm(POSITIONS[request.param])
    folder = tmp_path_factory.mktemp(f"generate-{request.param}")
    paths = {}
    for target in ("gpu", "gl"):
        paths[target] = str(folder / f"{target}.tflite")
        result = pipeline.export_generator(model, paths[target], prompt_length=8, cache_length=40,
                                            target=target, check_tokens=1)  # the tests check 32
        assert result["same_tokens"]
        assert result["metadata"]["embedding"] == "host"  # the gpu/gl default
    return request.param, model, keras_reference(model), paths


def run_kit_on_litert(edge, path, precision, tmp_path):
    """The kit on LiteRT's GPU accelerator only: `(ids, logits, stdout)`; fails unless every op of
    both signatures runs on the GPU (a GPU-only compilation refuses anything else)."""
    logits = str(tmp_path / f"logits-{precision}.npy")
    litert = os.path.join(edge.CACHE, "venv-litert", "bin", "python")
    with tempfile.TemporaryDirectory() as scratch:
        command = [litert, KIT, path, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens",
                   str(NEW_TOKENS), "--runtime", "litert", "--accelerator", "gpu", "--precision", precision,
                   "--logits", logits]
        done = subprocess.run(command,
                              capture_output=True, text=True, timeout=600, env=edge._environment(scratch))
    assert done.returncode == 0, done.stderr[-3000:]
    ids = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("ids: "))[5:])
    return ids, np.load(logits), done.stdout


def test_gpu_generation_on_litert_gpu_equals_keras(edge, generation_case, tmp_path):
    name, model, (keras_ids, full), paths = generation_case
    ids, logits, stdout = run_kit_on_litert(edge, paths["gpu"], "fp32", tmp_path)
    assert "fully accelerated: True" in stdout  # both signatures compiled for the GPU
    assert ids == keras_ids, name
    assert np.max(np.abs(logits - full)) <= 1e-4  # every decode step against the full forward pass
    half_ids, half_logits, _ = run_kit_on_litert(edge, paths["gpu"], "fp16", tmp_path)
    check_half_generation(half_ids, half_logits, ids, full)


def test_gl_generation_on_the_gl_delegate_equals_keras(edge, generation_case):
    name, model, (keras_ids, full), paths = generation_case
    pair = generator.tflite_paths(paths["gl"])
    table = np.load(paths["gl"] + ".embeddings.npy")
    gl = edge.run_gl_generate(pair, PROMPT, NEW_TOKENS, pad_id=0, table=table)
    assert gl.returncode == 0, gl.log[-3000:]
    assert edge.refusals(gl.log) == []  # no "not supported", no "No shader", no failed Prepare
    ids, logits = gl.output
    assert ids == keras_ids, name
    assert np.max(np.abs(logits - full)) <= 1e-4
    half = edge.run_gl_generate(pair, PROMPT, NEW_TOKENS, pad_id=0, table=table, fp16=True)
    assert half.returncode == 0 and edge.refusals(half.log) == [], half.log[-3000:]
    check_half_generation(*half.output, ids, full)
