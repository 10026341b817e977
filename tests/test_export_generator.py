"""The prefill/decode export and the kit's run_generate.py: the file generates what Keras generates."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_posenc.app import dataset as data
from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import generator
from keras_posenc.models import CausalLM

RUNNER = os.path.join(os.path.dirname(__file__), os.pardir, "export", "jetson", "run_generate.py")
BASE = {"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 40,
        "dropout": 0.0}


def _model(**config):
    keras.utils.set_random_seed(3)
    model = CausalLM({**BASE, **config})
    model.build_on_dummy()
    return model


@pytest.mark.parametrize("config", [
    {"position": "sinusoidal", "table": "factorized"},
    {"position": "learned"},
    {"position": "rope", "scaling": "yarn", "scaling_factor": 2.0, "original_length": 16},
    {"position": "alibi"},
], ids=["sinusoidal-factorized", "learned", "rope-yarn", "alibi"])
def test_the_file_generates_the_keras_tokens_for_32_steps(config):
    model = _model(**config)
    flat = generator.to_tflite_generator(model, prompt_length=8, cache_length=38)
    prompt = [2, 9, 17, 5, 11]
    same, parity = generator.check_generator_parity(model, generator.TfliteSession(flat), prompt, 32)
    assert same
    assert parity <= 1e-4  # every step's logits against the full forward pass


def test_every_decode_step_equals_the_full_pass_after_a_full_prefill():
    model = _model()
    flat = generator.to_tflite_generator(model, prompt_length=6, cache_length=12)
    ids, logits = generator.greedy_generate(generator.TfliteSession(flat), [4, 8, 15, 16, 23, 30], 7)
    full = np.asarray(model(np.array([[4, 8, 15, 16, 23, 30] + ids[:-1]], np.int32)))[0, 5:]
    np.testing.assert_allclose(logits, full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kwargs,config,match", [
    ({"prompt_length": 8, "cache_length": 4}, {}, "`prompt_length`=8 exceeds `cache_length`=4"),
    ({"prompt_length": 4, "cache_length": 41}, {}, "max_length=40"),
    ({"prompt_length": 4, "cache_length": 8, "target": "gl"}, {}, "target='gl'"),
    ({"prompt_length": 4, "cache_length": 8, "target": "tensorrt"}, {}, "to_onnx_generator"),
    ({"prompt_length": 4, "cache_length": 8}, {"num_languages": 2}, "num_languages"),
])
def test_bad_exports_are_rejected(kwargs, config, match):
    model = _model(**config) if "num_languages" not in config else CausalLM({**BASE, **config})
    if "num_languages" in config:
        model.build_on_dummy()
    with pytest.raises(ValueError, match=match):
        generator.to_tflite_generator(model, **kwargs)


def test_an_unmasked_model_cannot_be_exported_for_generation():
    model = CausalLM(BASE, causal=False)
    model.build_on_dummy()
    with pytest.raises(ValueError, match="causal=False"):
        generator.to_tflite_generator(model, prompt_length=4, cache_length=8)


def test_interpreter_runner_rejects_long_prompts_and_overlong_runs():
    model = _model()
    session = generator.TfliteSession(generator.to_tflite_generator(model, prompt_length=4, cache_length=8))
    with pytest.raises(ValueError, match="1 to 4"):
        generator.greedy_generate(session, [5, 6, 7, 8, 9], 2)
    with pytest.raises(ValueError, match="cache_length=8"):
        generator.greedy_generate(session, [5, 6, 7], 7)
    with pytest.raises(ValueError, match="1 to 4"):
        generator.greedy_generate(session, [], 2)


@pytest.fixture(scope="module")
def kit_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kit_generate")
    texts = ["the cat sat on the mat", "a dog ran in the park", "we read the book"] * 20
    sp_model = data.train_sentencepiece(texts, vocab_size=24)
    (folder / "spm.model").write_bytes(sp_model)
    keras.utils.set_random_seed(5)
    model = CausalLM({**BASE, "vocab_size": 24})
    model.build_on_dummy()
    path = str(folder / "gen.tflite")
    result = generator.export_generator(model, path, prompt_length=8, cache_length=24)
    assert result["same_tokens"] and result["parity"] <= 1e-4
    return model, sp_model, path, str(folder / "spm.model")


# The kit is one runtime-only script whatever stack exported the file: its subprocess runs (each
# starts a TFLite runtime) run once, on Keras 2.
kit_once = pytest.mark.skipif(is_keras3(), reason="the kit's subprocess runs are checked once, on Keras 2")


def _run_kit(*args):
    return subprocess.run([sys.executable, RUNNER, *args], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def test_the_report_counts_the_multiply_adds_of_prefill_and_decode(kit_files):
    model, _, path, _ = kit_files
    with open(path + ".json") as f:
        meta = json.load(f)
    layers, d, dff, vocab, cache = 2, 16, 32, 24, 24
    dense = layers * (4 * d * d + 2 * d * dff) + vocab * d  # q, k, v, output, feed-forward, head
    # A decode step adds at most a few passes over the cache per layer (write, keep, logits, values).
    assert dense <= meta["decode_multiply_adds"] <= dense + layers * 8 * cache * d + 100 * d
    assert meta["prefill_multiply_adds"] >= 8 * dense  # 8 prompt slots


@kit_once
def test_the_kit_prints_the_keras_continuation(kit_files):
    from keras_posenc.app import text_generation

    model, sp_model, path, spm_path = kit_files
    done = _run_kit(path, "--spm", spm_path, "--prompt", "the cat", "--max-new-tokens", "10", "--json",
                    "--runtime", "interpreter")
    assert done.returncode == 0, done.stderr
    kit = json.loads(done.stdout.strip().splitlines()[-1])
    expected = text_generation.generate_text(model, sp_model, "the cat", 10)
    assert kit["ids"] == expected["ids"] and kit["text"] == expected["text"]
    assert set(kit) == set(expected)
    with open(path + ".json") as f:
        assert json.load(f)["cache_bytes"] == 2 * 2 * 24 * 16 * 4


@kit_once
def test_the_kit_text_output_and_its_errors(kit_files):
    _, _, path, spm_path = kit_files
    done = _run_kit(path, "--spm", spm_path, "--prompt", "the cat", "--max-new-tokens", "4",
                    "--runtime", "interpreter", "--sampler", "top_k", "--top-k", "3", "--seed", "1")
    assert done.returncode == 0, done.stderr
    assert "time to first token" in done.stdout and "checksum" in done.stdout
    done = _run_kit(path, "--spm", spm_path, "--prompt", "the cat", "--max-new-tokens", "40",
                    "--runtime", "interpreter")
    assert done.returncode != 0 and "cache slots" in done.stderr
    done = _run_kit(path, "--spm", spm_path, "--prompt", "the cat sat on the mat the cat sat on the mat",
                    "--runtime", "interpreter")
    assert done.returncode != 0 and "prefill takes at most 8" in done.stderr

