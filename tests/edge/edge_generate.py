"""Prefill/decode exports on the device runtimes: LiteRT's CompiledModel (the kit) and onnxruntime."""

import json
import os
import subprocess
import sys

from keras_posenc.backend import keras
from keras_posenc.export import generator
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
    result = generator.export_generator(model, path, prompt_length=8, cache_length=40, check_tokens=32)
    assert result["same_tokens"] and result["parity"] <= 1e-4
    litert = os.path.join(edge.CACHE, "venv-litert", "bin", "python")
    with __import__("tempfile").TemporaryDirectory() as scratch:
        done = subprocess.run([litert, KIT, path, "--prompt-ids", ",".join(map(str, PROMPT)),
                               "--max-new-tokens", "32", "--runtime", "litert", "--json"],
                              capture_output=True, text=True, timeout=600, env=edge._environment(scratch))
    assert done.returncode == 0, done.stderr[-3000:]
    kit = json.loads(done.stdout.strip().splitlines()[-1])
    assert kit["ids"] == model.generate(PROMPT, 32).ids[0].tolist()


def test_the_onnx_pair_generates_the_keras_tokens(edge, tmp_path):
    model = causal_lm(position="alibi")
    out = str(tmp_path / "gen.onnx")
    result = generator.export_generator(model, out, prompt_length=8, cache_length=40, target="tensorrt",
                                        check_tokens=32)
    assert result["files"] == [str(tmp_path / "gen.prefill.onnx"), str(tmp_path / "gen.decode.onnx")]
    assert result["same_tokens"] and result["tokens_checked"] == 32 and result["parity"] <= 1e-4
    done = subprocess.run([sys.executable, KIT, out, "--prompt-ids", ",".join(map(str, PROMPT)),
                           "--max-new-tokens", "32", "--json"], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr[-3000:]
    kit = json.loads(done.stdout.strip().splitlines()[-1])
    assert kit["ids"] == model.generate(PROMPT, 32).ids[0].tolist()
