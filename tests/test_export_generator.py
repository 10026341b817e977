"""The prefill/decode export and the kit's run_generate.py: the file generates what Keras generates."""

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from stacks import once_on_keras2, once_on_keras3
from tflite_files import assert_same_graph

from keras_posenc import export
from keras_posenc.app import dataset as data
from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import generation_export, generator, pipeline, runners
from keras_posenc.models import CausalLM

RUNNER = os.path.join(os.path.dirname(__file__), os.pardir, "export", "jetson", "run_generate.py")
BASE = {"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 40,
        "dropout": 0.0}


def _model(**config):
    keras.utils.set_random_seed(3)
    model = CausalLM({**BASE, **config})
    model.build_on_dummy()
    return model


CASES_32_STEPS = {
    "sinusoidal-factorized": {"position": "sinusoidal", "table": "factorized"},
    "learned": {"position": "learned"},
    "rope-yarn": {"position": "rope", "scaling": "yarn", "scaling_factor": 2.0, "original_length": 16},
    "alibi": {"position": "alibi"},
}


@functools.lru_cache(maxsize=None)
def _file_32_steps(name):
    model = _model(**CASES_32_STEPS[name])
    return model, generator.to_tflite_generator(model, prompt_length=8, cache_length=38, target="cpu")


@pytest.mark.parametrize("name", [
    "sinusoidal-factorized", "rope-yarn", "alibi",
    pytest.param("learned", marks=once_on_keras3("its file is sinusoidal-factorized's graph with another "
                                                 "table (checked here), and that case runs on both"))])
def test_the_file_generates_the_keras_tokens_for_32_steps(name):
    model, flat = _file_32_steps(name)
    if name == "learned":
        assert_same_graph(flat, _file_32_steps("sinusoidal-factorized")[1])
    prompt = [2, 9, 17, 5, 11]
    same, parity = generation_export.check_generator_parity(model, runners.TfliteSession(flat), prompt, 32)
    assert same
    assert parity <= 1e-4  # every step's logits against the full forward pass


def test_every_decode_step_equals_the_full_pass_after_a_full_prefill():
    model = _model()
    flat = generator.to_tflite_generator(model, prompt_length=6, cache_length=12, target="cpu")
    ids, logits = runners.greedy_generate(runners.TfliteSession(flat), [4, 8, 15, 16, 23, 30], 7)
    full = np.asarray(model(np.array([[4, 8, 15, 16, 23, 30] + ids[:-1]], np.int32)))[0, 5:]
    np.testing.assert_allclose(logits, full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kwargs,config,match", [
    ({"prompt_length": 8, "cache_length": 4}, {}, "`prompt_length`=8 exceeds `cache_length`=4"),
    ({"prompt_length": 4, "cache_length": 41}, {}, "max_length=40"),
    ({"prompt_length": 4, "cache_length": 8, "target": "opencl"}, {}, "target='opencl'"),
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
        generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="cpu")


def test_interpreter_runner_rejects_long_prompts_and_overlong_runs():
    model = _model()
    session = runners.TfliteSession(generator.to_tflite_generator(model, prompt_length=4, cache_length=8,
                                                                  target="cpu"))
    with pytest.raises(ValueError, match="1 to 4"):
        runners.greedy_generate(session, [5, 6, 7, 8, 9], 2)
    with pytest.raises(ValueError, match="cache_length=8"):
        runners.greedy_generate(session, [5, 6, 7], 7)
    with pytest.raises(ValueError, match="1 to 4"):
        runners.greedy_generate(session, [], 2)


# The gpu/gl graphs on the CPU interpreter (the runtimes themselves run them in tests/edge): each
# position kind on one of the two targets, host and graph embeddings both.
SHADER_CASES = {
    "gpu-sinusoidal-factorized-graph": ("gpu", {"position": "sinusoidal", "table": "factorized"}, "graph"),
    "gpu-rope-yarn-host": ("gpu", {"position": "rope", "scaling": "yarn", "scaling_factor": 2.0,
                                   "original_length": 16}, "host"),
    "gl-alibi-host": ("gl", {"position": "alibi"}, "host"),
    "gl-learned-graph": ("gl", {"position": "learned"}, "graph"),
}


# Keras 3 reads the same weights into the same graphs: one case there, all four on Keras 2.
KERAS2_ONLY = once_on_keras2("the gl graphs of this case run on Keras 2; Keras 3 runs gl-alibi-host "
                             "(CI time is tight)")


@pytest.mark.parametrize("name", [name if name == "gl-alibi-host" else pytest.param(name, marks=KERAS2_ONLY)
                                  for name in sorted(SHADER_CASES)])
def test_the_gpu_and_gl_graphs_generate_the_keras_tokens_with_shader_ops_only(name):
    target, config, embedding = SHADER_CASES[name]
    model = _model(**config)
    flat = generator.to_tflite_generator(model, prompt_length=8, cache_length=38, target=target,
                                         embedding=embedding)
    files = flat if target == "gl" else (flat,)
    assert len(files) == (2 if target == "gl" else 1)  # gl: one file per signature
    for content in files:
        assert export.gpu_incompatible_ops(content, "webgpu" if target == "gpu" else "gl") == []
        assert not {"GATHER", "GATHER_ND", "BATCH_MATMUL", "STRIDED_SLICE", "ONE_HOT", "EQUAL"} & set(
            export.op_counts(content))
    table = export.host_embedding_table(model) if embedding == "host" else None
    session = runners.TfliteSession(flat, table=table)
    if embedding == "host":  # the rows replace the token ids
        assert "token_ids" not in session.details["prefill"] and "embeddings" in session.details["decode"]
    same, parity = generation_export.check_generator_parity(model, session, [2, 9, 17, 5, 11], 32)
    assert same
    assert parity <= 1e-4


def test_gpu_export_errors():
    model = _model()
    with pytest.raises(ValueError, match="`embedding='host'` is for the gpu and gl targets"):
        generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="cpu", embedding="host")
    with pytest.raises(ValueError, match="embedding='row'"):
        generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="gpu", embedding="row")
    long = CausalLM({**BASE, "max_length": 2100})
    long.build_on_dummy()
    with pytest.raises(ValueError, match="cache_length=2049"):
        generator.to_tflite_generator(long, prompt_length=4, cache_length=2049, target="gl")


def test_the_gl_pair_rejects_bad_prompts_and_fills_its_cache_exactly():
    model = _model(position="alibi")
    pair = generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="gl",
                                         embedding="host")
    session = runners.TfliteSession(pair, table=export.host_embedding_table(model))
    with pytest.raises(ValueError, match="1 to 4"):
        runners.greedy_generate(session, [], 2)
    with pytest.raises(ValueError, match="1 to 4"):
        runners.greedy_generate(session, [5, 6, 7, 8, 9], 2)
    with pytest.raises(ValueError, match=r"\[0, 40\) \(the vocabulary\), got id 40"):
        runners.greedy_generate(session, [5, 40], 2)
    with pytest.raises(ValueError, match="cache_length=8"):
        runners.greedy_generate(session, [5, 6, 7], 7)
    ids, _ = runners.greedy_generate(session, [5, 6, 7], 6)  # exactly fills the 8 slots
    assert ids == model.generate([5, 6, 7], 6).ids[0].tolist()


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
    result = pipeline.export_generator(model, path, prompt_length=8, cache_length=24, target="cpu")
    assert result["same_tokens"] and result["parity"] <= 1e-4
    return model, sp_model, path, str(folder / "spm.model")


# The kit is one runtime-only script whatever stack exported the file: its subprocess runs (each
# starts a TFLite runtime) run once, on Keras 2.
kit_once = once_on_keras2("the kit is one runtime-only script whatever stack exported the file")


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



# The one pipeline and printer: `export --generate` as `export` --------------------------------
def _saved(model, path):
    model.save(path) if is_keras3() else model.save(path, save_format="keras_v3")
    return path


@once_on_keras2("the result type, its files and its failures are the pipeline's; the gl generation export "
                "itself runs on both stacks in test_the_gpu_and_gl_graphs_generate_the_keras_tokens_with_"
                "shader_ops_only[gl-alibi-host]")
def test_window_and_generation_exports_give_one_result_type_with_failures(tmp_path):
    model = _model()
    window = export.export_and_check(model, sequence_length=8, target="cpu")
    generation = export.export_generation(model, prompt_length=4, cache_length=12, target="gl")
    assert type(window) is type(generation) is export.ExportResult
    assert window.failures() == [] and generation.failures() == []
    assert generation.report["same_tokens"]
    assert generation.report["tokens_checked"] == 10  # 12 slots - 3 prompt + 1
    assert len(generation.models) == 2  # gl: one file per signature
    paths = generation.save(str(tmp_path / "gen.tflite"))
    assert [os.path.basename(p) for p in paths] == [
        "gen.prefill.tflite", "gen.decode.tflite", "gen.tflite.embeddings.npy", "gen.tflite.json",
        "gen.tflite.contract.json"]
    meta = json.loads(open(tmp_path / "gen.tflite.json").read())
    assert meta["signature_files"] == {"prefill": "gen.prefill.tflite", "decode": "gen.decode.tflite"}
    assert sorted(meta["files"]) == sorted(os.path.basename(p) for p in paths[:3])
    assert meta["files"]["gen.prefill.tflite"]["bytes"] == len(generation.models[0])
    # A check that fails is named by failures(), as for a window export.
    generation.report["same_tokens"] = False
    generation.report["parity"] = 0.5
    assert generation.failures() == [
        "FAILED: the file does not generate what the model generates (greedy tokens differ from "
        "CausalLM.generate).", "FAILED: parity 0.5 exceeds the tolerance 0.0001."]
    assert generation.failures(tolerance=1.0) == generation.failures()[:1]


@once_on_keras3("the printer is the command's; `export --generate` from a saved model runs on both stacks in "
                "test_export_quantization.py's test_the_command_refuses_a_combination_in_one_line")
def test_the_export_command_prints_generation_with_the_window_printer(tmp_path, capsys):
    from keras_posenc.app import cli

    path = _saved(_model(), str(tmp_path / "model.keras"))
    out = str(tmp_path / "gen.tflite")
    argv = ["export", path, "--out", out, "--generate", "--cache-length", "12", "--target", "cpu"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"Wrote {out}, {out}.json, {out}.contract.json (")
    assert "target cpu: prefill [1, 6], decode [1, 1], cache 12 slots" in printed[0]
    assert printed[2].startswith("Greedy parity over 10 tokens: same tokens as CausalLM.generate")
    window = str(tmp_path / "window.tflite")
    assert cli.main(["export", path, "--out", window, "--sequence-length", "8", "--target", "cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"Wrote {window}, {window}.json, {window}.contract.json (")
    assert "target cpu, quantize=none, batch 1 x length 8" in printed[0]


def test_a_cache_longer_than_the_model_names_the_cache_length_flag(tmp_path, capsys):
    from keras_posenc.app import cli

    path = _saved(_model(max_length=32), str(tmp_path / "model.keras"))
    out = str(tmp_path / "gen.tflite")
    assert cli.main(["export", path, "--out", out, "--generate", "--cache-length", "64"]) == 2
    error = capsys.readouterr().err
    assert "--cache-length 64 exceeds the model's max_length=32" in error and "sequence_length" not in error
    assert not os.path.exists(out) and not os.path.exists(out + ".json")
    with pytest.raises(ValueError, match=r"`cache_length`=64 exceeds the model's max_length=32"):
        generator.to_tflite_generator(_model(max_length=32), prompt_length=8, cache_length=64, target="cpu")


def test_a_failed_write_leaves_no_file_under_a_final_name(tmp_path, monkeypatch):
    from keras_posenc import files

    result = export.export_and_check(_model(), sequence_length=8, target="cpu")
    out = str(tmp_path / "model.tflite")
    written = []
    real = files.write_json

    def full_disk(path, content, **kwargs):
        if path.endswith(".json") and not path.endswith(".contract.json"):
            raise files.FileWriteError(28, f"Could not write {path}: no space left")
        written.append(path)
        return real(path, content, **kwargs)

    monkeypatch.setattr(files, "write_json", full_disk)
    with pytest.raises(files.FileWriteError, match="model.tflite.json"):
        result.save(out)
    assert not os.path.exists(out + ".json")
    # No temporary file is left beside the files that were complete.
    assert sorted(os.listdir(tmp_path)) == ["model.tflite", "model.tflite.contract.json"]
    assert open(out, "rb").read() == result.exported


@kit_once
def test_the_kit_checks_each_file_before_the_runtime_sees_it(kit_files, tmp_path):
    import shutil

    _, _, path, _ = kit_files
    copy = str(tmp_path / "gen.tflite")
    for suffix in ("", ".json", ".contract.json"):
        shutil.copy(path + suffix, copy + suffix)
    content = open(copy, "rb").read()

    def one_line(done, *needles):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert all(needle in lines[0] for needle in needles), lines[0]

    argv = ["--prompt-ids", "2,5,6", "--max-new-tokens", "3", "--runtime", "interpreter"]
    one_line(_run_kit(copy, "--accelerator", "gpu", *argv), "--target cpu", "--target gpu")
    with open(copy, "wb") as f:
        f.write(content[:1000])
    one_line(_run_kit(copy, *argv), "truncated or replaced")
    with open(copy, "wb") as f:
        f.write(b"PK\x03\x04" + content[4:])  # a zip header where the flatbuffer's offset was
    one_line(_run_kit(copy, *argv), "sha256")
    with open(copy, "wb") as f:
        f.write(content)
    done = _run_kit(copy, *argv, "--json")
    assert done.returncode == 0, done.stderr
    assert list(json.loads(done.stdout)) == ["ids", "text", "ttft_ms", "decode_tokens_per_s"]
