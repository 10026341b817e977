"""`.litertlm` bundles on Google's LiteRT-LM 0.18.1 (the edge cache's venv-litertlm): its Engine on the CPU
generates Keras' greedy text, with a chunked prefill and a second turn in one session; the
`litert-lm` command line prints the same text; a `--target gpu` bundle runs fully on its GPU
backend (WebGPU on Mesa lavapipe), in float32 and in its default float16 activations."""

import os
import subprocess
import tempfile

import pytest
import sentencepiece as spm
from stacks import once_on_keras2, once_on_keras3

from keras_posenc.app import cli
from keras_posenc.app import dataset as data
from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import litert_python, litertlm, litertlm_bundle, pipeline
from keras_posenc.models import CausalLM

VOCAB = 120
POSITIONS = {
    "sinusoidal": {"position": "sinusoidal"},
    "rope-yarn": {"position": "rope", "scaling": "yarn", "scaling_factor": 2.0, "original_length": 24},
    "alibi": {"position": "alibi"},
    "learned": {"position": "learned"},
}
KERAS3_POSITIONS = ("rope-yarn",)  # Keras 3 exports one kind (the same graphs; CI time is tight)
PROMPT_LENGTH, CACHE_LENGTH, NEW_TOKENS = 8, 64, 12


@pytest.fixture(scope="module")
def sp_model(corpus):
    return data.train_sentencepiece(data.read_text_corpus(corpus), vocab_size=VOCAB)


def save(model, path):
    model.save(path) if is_keras3() else model.save(path, save_format="keras_v3")


def tied_lm(config):
    """A small LM whose head is the token table: clear winners, varied text (as in edge_generate)."""
    keras.utils.set_random_seed(3)
    model = CausalLM({"num_layers": 2, "d_model": 32, "num_heads": 4, "dff": 64, "vocab_size": VOCAB,
                      "max_length": 64, "dropout": 0.0, **config})
    model.build_on_dummy()
    model.head.kernel.assign(model.encoder.embedding.token_embedding.embeddings.numpy().T)
    return model


def sessions(sp_model):
    """A short prompt, one longer than P (two prefill chunks), and a session of two turns."""
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    long = "the old house stood at the end of the long road near the river"
    assert 1 + len(processor.EncodeAsIds(long)) > PROMPT_LENGTH  # BOS + pieces: a chunked prefill
    return [["the cat"], [long], ["a small dog", "ran into the garden"]]


@pytest.fixture(scope="module", params=[
    name if name in KERAS3_POSITIONS else pytest.param(name, marks=once_on_keras2("the same graphs as "
                                                                                  "rope-yarn's"))
    for name in sorted(POSITIONS)])
def bundle(request, tmp_path_factory, sp_model, edge):
    model = tied_lm(POSITIONS[request.param])
    out = str(tmp_path_factory.mktemp(f"litertlm-{request.param}") / "gen.litertlm")
    result = pipeline.export_litertlm(model, sp_model, prompt_length=PROMPT_LENGTH,
                                             cache_length=CACHE_LENGTH, target="cpu",
                                             probes=sessions(sp_model), max_new_tokens=NEW_TOKENS,
                                             python=edge.litertlm_python())
    result.save(out)
    return request.param, model, result, out


def test_the_export_pass_checks_the_bundle_on_the_engine(bundle):
    name, _, result, _ = bundle
    assert result.report["same_tokens"], name  # fed as the engine feeds it (TF interpreter)
    assert result.report["engine_same_text"] is True, result.report["engine"]
    assert result.failures() == []
    assert any("LiteRT-LM Engine (cpu)" in line and "same text" in line for line in result.lines)


def test_the_engine_on_cpu_generates_the_keras_text_chunked_prefill_and_second_turn(bundle, sp_model, edge):
    name, model, _, path = bundle
    probes = sessions(sp_model)
    texts, benchmarks, _ = litertlm_bundle.engine_texts(path, probes, NEW_TOKENS,
                                                        python=edge.litertlm_python(), benchmark=True)
    expected, ids = litertlm_bundle.keras_texts(model, sp_model, probes, NEW_TOKENS)
    assert texts == expected, name
    assert len(benchmarks) == len(probes)
    assert sum(len(new) for session in ids for new in session) >= 4 * NEW_TOKENS // 2  # real generations
    assert len({text for session in expected for text in session}) == 4  # four different continuations
    assert texts[2][1] == expected[2][1]  # the second turn: Keras on BOS + turn 1 + its tokens + turn 2


def test_the_litert_lm_command_line_prints_the_keras_text(bundle, sp_model, edge):
    name, model, _, path = bundle
    if name != "rope-yarn":
        pytest.skip("the command line is checked on one bundle")
    # The command line generates until the cache is full (max_num_tokens = C): Keras' text up to C
    # tokens, of which it prints a prefix no shorter than the first NEW_TOKENS tokens' text.
    expected, _ = litertlm_bundle.keras_texts(model, sp_model, [["the cat"]], NEW_TOKENS)
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    room = CACHE_LENGTH - 1 - len(processor.EncodeAsIds("the cat"))
    longest, _ = litertlm_bundle.keras_texts(model, sp_model, [["the cat"]], room)
    command = os.path.join(os.path.dirname(edge.litertlm_python()), "litert-lm")
    with tempfile.TemporaryDirectory() as home:
        done = subprocess.run([command, "run", path, "--backend", "cpu", "--no-template", "--top-k", "1",
                               "--prompt", "the cat"], capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, HOME=home))
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.strip()
    assert printed.startswith(expected[0][0].strip()) and longest[0][0].startswith(printed)


def test_the_export_command_writes_a_bundle_the_engine_runs(tmp_path, sp_model, edge, capsys, monkeypatch):
    monkeypatch.setenv(litert_python.PYTHON_ENV, edge.litertlm_python())
    model = tied_lm(POSITIONS["alibi"])
    save(model, str(tmp_path / "model.keras"))
    (tmp_path / "spm.model").write_bytes(sp_model)
    out = str(tmp_path / "gen.litertlm")
    status = cli.main(["export", str(tmp_path / "model.keras"), "--generate", "--format", "litertlm",
                       "--cache-length", "48", "--prompt-length", "8", "--target", "cpu", "--out", out])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "LiteRT-LM Engine (cpu)" in printed and "same text as CausalLM.generate" in printed
    assert sorted(os.listdir(tmp_path)) == ["gen.litertlm", "gen.litertlm.contract.json", "gen.litertlm.json",
                                            "model.keras", "spm.model"]


# The activation type is the engine's choice, not the converter's: each stack's file runs in one of them.
@pytest.mark.parametrize("activation", [
    pytest.param("fp32", marks=once_on_keras2("the Keras 3 file runs in the engine's float16 activations")),
    pytest.param("fp16", marks=once_on_keras3("the Keras 2 file runs in the engine's float32 activations"))])
def test_the_gpu_bundle_runs_fully_on_the_engine_gpu_backend(tmp_path, sp_model, edge, activation):
    model = tied_lm(POSITIONS["rope-yarn"])
    probes = sessions(sp_model)
    result = pipeline.export_litertlm(model, sp_model, prompt_length=PROMPT_LENGTH,
                                             cache_length=CACHE_LENGTH, target="gpu", probes=probes,
                                             max_new_tokens=NEW_TOKENS, python=edge.litertlm_python(),
                                             activation=activation,
                                             engine_env=edge.lavapipe_environment(str(tmp_path)))
    assert result.report["same_tokens"] and result.report["engine_same_text"] is True, result.report["engine"]
    path = str(tmp_path / "gpu.litertlm")
    result.save(path)
    with tempfile.TemporaryDirectory() as scratch:
        texts, _, log = litertlm_bundle.engine_texts(path, probes, NEW_TOKENS, backend="gpu",
                                                     python=edge.litertlm_python(),
                                                     env=edge.lavapipe_environment(scratch))
    assert "llvmpipe" in log and "WebGPU" in log  # the emulated GPU ran it
    assert edge.refusals(log) == [] and "operations will run on the CPU" not in log  # every op on the GPU
    expected, _ = litertlm_bundle.keras_texts(model, sp_model, probes, NEW_TOKENS)
    assert texts == expected


def held_out_rows(sp_model, corpus, rows=24):
    """Corpus lines tokenized as training frames them (BOS + pieces), right-padded to the cache length."""
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    lines = data.read_text_corpus(corpus)[-rows:]
    ids = [[2] + list(processor.EncodeAsIds(line))[:CACHE_LENGTH - 1] for line in lines]
    table = [[0] * CACHE_LENGTH for _ in ids]
    for row, line in zip(table, ids):
        row[:len(line)] = line
    return table


# The TFLite converter quantizes int8, each stack's its own way: each converter's int8 bundle runs on
# one backend of the engine (TensorFlow 2.12's on the CPU, 2.21's on the GPU); int4 is LiteRT
# Quantizer's, whichever stack converted the float32 model.
@pytest.mark.parametrize("target,quantize", [
    pytest.param("cpu", "int8", marks=once_on_keras2("TensorFlow 2.21's int8 bundle runs on the GPU")),
    pytest.param("cpu", "int4", marks=once_on_keras3("int4 bundles: the same LiteRT Quantizer recipe; on "
                                                     "Keras 3, whose edge run is the shorter")),
    pytest.param("gpu", "int8", marks=once_on_keras3("TensorFlow 2.12's int8 bundle runs on the CPU"))])
def test_quantized_bundles_run_on_the_engine_as_on_litert(tmp_path, sp_model, corpus, edge, target, quantize):
    model = tied_lm(POSITIONS["rope-yarn"])
    probes = sessions(sp_model)
    # The float32 bundle, packed as export_litertlm packs it (its engine run is the other tests' job).
    float32_model = litertlm.to_litertlm_tflite(model, prompt_length=PROMPT_LENGTH, cache_length=CACHE_LENGTH,
                                                target=target)
    float32 = litertlm_bundle.pack_bundle(
        float32_model, sp_model, cache_length=CACHE_LENGTH, pad_id=model.encoder.pad_id, activation="fp32",
        python=edge.litertlm_python())
    result = pipeline.export_litertlm(model, sp_model, prompt_length=PROMPT_LENGTH,
                                             cache_length=CACHE_LENGTH, target=target, probes=probes,
                                             max_new_tokens=NEW_TOKENS, python=edge.litertlm_python(),
                                             activation="fp32", quantize=quantize,
                                             engine_env=edge.lavapipe_environment(str(tmp_path)),
                                             eval_token_ids=held_out_rows(sp_model, corpus))
    quality = result.report["quality"]
    # The engine runs the quantized model as LiteRT's interpreter does (same text).
    assert result.report["engine_same_text"] is True, result.report["engine"]
    ratio = len(result.models[0]) / len(float32)
    print(f"{target} {quantize}: bundle {ratio:.3f}x of float32, loss {quality['loss_increase']:+.2%}, "
          f"agreement {quality['generation_agreement']:.1%}")
    assert quality["tokens"] > 200 and quality["loss_float"] > 0
    assert len(result.models[0]) < len(float32)
    if quantize == "int8":
        assert result.failures() == []
        assert quality["loss_increase"] <= 0.01
        assert quality["same_greedy_tokens"] or quality["generation_agreement"] >= 0.95
