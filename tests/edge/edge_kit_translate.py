"""The Jetson kit's translator (export/jetson/run_translate.py) on exported files and the device runtimes:
tflite-runtime 2.14 on Python 3.8 (JetPack 5's venv: numpy, sentencepiece, no TensorFlow), ai-edge-litert
2.3 (its CompiledModel on the CPU, and GPU-only on lavapipe for a `--target gpu` file) and onnxruntime
(the `--target tensorrt` pair). Each translates the sentences into the text `keras-posenc translate`
writes with the Keras model, greedy and with beam 4."""

import json
import os
import subprocess
import sys
import tempfile

import pytest
from stacks import once_on_keras2

from keras_posenc.app.dataset import train_sentencepiece
from keras_posenc.app.translation import TranslationRun, translate_sentences
from keras_posenc.backend import keras
from keras_posenc.export import export_translation
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.special_ids import EOS_ID

pytestmark = once_on_keras2("the kit runs files of the same graphs whichever stack exported them; "
                            "TF 2.12's converter is the one older than tflite-runtime 2.14")

KIT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "export", "jetson", "run_translate.py")
SOURCE_LENGTH, CACHE_LENGTH, NEW_TOKENS = 12, 9, 9
SENTENCES = ["the cat sat on the mat", "a dog ran to the old house", "the bird sang", "old mats and cats",
             "the house by the river is small", "a cat and a dog"]
FILES = {"cpu": "de.tflite", "gpu": "de_gpu.tflite", "gl": "de_gl.tflite", "tensorrt": "de.onnx"}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny translator with sharp distributions (its head scaled up, the end token likelier), its
    spm.model, src.txt and its export to each target in one folder; `keras-posenc translate`'s text
    for greedy and beam 4."""
    folder = tmp_path_factory.mktemp("kit-translate")
    sp_model = train_sentencepiece(SENTENCES * 4, vocab_size=32)
    (folder / "spm.model").write_bytes(sp_model)
    (folder / "src.txt").write_text("".join(line + "\n" for line in SENTENCES), encoding="utf-8")
    keras.utils.set_random_seed(5)
    model = Seq2SeqTransformer(num_layers=2, d_model=16, num_heads=2, dff=32, vocab_size=32,
                               max_length=SOURCE_LENGTH, dropout=0.0)
    model.build_on_dummy()
    model.head.kernel.assign(model.head.kernel.numpy() * 8.0)
    bias = model.head.bias.numpy()
    bias[EOS_ID] += 2.0
    model.head.bias.assign(bias)
    for target, name in FILES.items():
        export_translation(model, target=target, source_length=SOURCE_LENGTH,
                           cache_length=CACHE_LENGTH).save(str(folder / name))
    run = TranslationRun(model, sp_model)
    texts = {beam: translate_sentences(run, SENTENCES, beam_size=beam, alpha=1.0, batch_size=1,
                                       max_new_tokens=NEW_TOKENS)[0] for beam in (1, 4)}
    assert any(texts[4]) and len(set(texts[1])) >= 2, texts  # real, varied translations
    return folder, texts


def translate(python, folder, name, beam, *flags, env=None):
    """run_translate.py with `python` in `folder`: `(the JSON it printed, the lines it wrote)`."""
    output = f"hyp-{len(os.listdir(folder))}.txt"  # a new file each run
    done = subprocess.run([python, KIT, name, "--spm", "spm.model", "--input", "src.txt", "--output", output,
                           "--beam-size", str(beam), "--max-new-tokens", str(NEW_TOKENS), "--json", *flags],
                          cwd=folder, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(folder / output, encoding="utf-8") as f:
        return json.loads(done.stdout.strip().splitlines()[-1]), f.read().splitlines()


def without_pythonpath(**environment):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(environment)
    return env


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("target", ["cpu", "gl"])
def test_tflite_runtime_on_python_3_8_translates_as_keras(edge, workspace, target, beam):
    folder, texts = workspace
    shown, lines = translate(edge.kit_python("3.8"), folder, FILES[target], beam, "--runtime",
                             "tflite-runtime", env=without_pythonpath())
    assert shown["runtime"] == "tflite_runtime" and shown["sentences"] == len(SENTENCES)
    assert lines == texts[beam], (target, beam)
    if target == "cpu":  # two interpreters on two threads: the same text
        shown, lines = translate(edge.kit_python("3.8"), folder, FILES[target], beam, "--runtime",
                                 "tflite-runtime", "--jobs", "2", env=without_pythonpath())
        assert shown["jobs"] == 2 and lines == texts[beam], beam


def sentencepiece_only(scratch):
    """A folder holding only this Python's sentencepiece package: what ai-edge-litert's venv lacks."""
    import sentencepiece

    site = os.path.join(scratch, "spm-site")
    os.makedirs(site)
    os.symlink(os.path.dirname(sentencepiece.__file__), os.path.join(site, "sentencepiece"))
    return site


@pytest.mark.parametrize("beam", [1, 4])
def test_litert_translates_as_keras_on_the_cpu_and_gpu_only(edge, workspace, beam):
    folder, texts = workspace
    litert = os.path.join(edge.CACHE, "venv-litert", "bin", "python")
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(edge._environment(scratch), PYTHONPATH=sentencepiece_only(scratch))
        cpu, lines = translate(litert, folder, FILES["cpu"], beam, "--runtime", "litert", env=env)
        assert cpu["runtime"] == "ai_edge_litert.CompiledModel" and lines == texts[beam]
        cpu, lines = translate(litert, folder, FILES["cpu"], beam, "--runtime", "litert", "--jobs", "3",
                               env=env)
        assert cpu["jobs"] == 3 and lines == texts[beam]
        gpu, lines = translate(litert, folder, FILES["gpu"], beam, "--runtime", "litert", "--accelerator",
                               "gpu", env=env)
        assert gpu["fully_accelerated"] is True and lines == texts[beam]


@pytest.mark.parametrize("beam", [1, 4])
def test_onnxruntime_translates_the_tensorrt_pair_as_keras(edge, workspace, beam):
    folder, texts = workspace
    shown, lines = translate(sys.executable, folder, FILES["tensorrt"], beam,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert shown["runtime"].startswith("onnxruntime (") and lines == texts[beam]
    assert shown["tokens_per_s"] > 0 and shown["ttft_ms"] > 0
    shown, lines = translate(sys.executable, folder, FILES["tensorrt"], beam, "--jobs", "2",
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert shown["jobs"] == 2 and lines == texts[beam]


def test_a_missing_runtime_is_one_line_and_writes_nothing(edge, workspace):
    folder, _ = workspace
    done = subprocess.run([edge.kit_python("3.8"), KIT, FILES["tensorrt"], "--spm", "spm.model", "--input",
                           "src.txt", "--output", "hyp.txt"], cwd=folder, capture_output=True, text=True,
                          timeout=300, env=without_pythonpath())
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "An .onnx pair needs onnxruntime (onnxruntime-gpu on a Jetson)."
    assert not (folder / "hyp.txt").exists()
