"""The Jetson kit on tflite-runtime 2.14 as a JetPack user installs it (export/jetson/README.md, section 1):
venvs of Python 3.8 (JetPack 5) and 3.10 (JetPack 6) with only tflite-runtime, numpy and sentencepiece,
no TensorFlow. The README's `pack.py` lines run as written into an empty folder, and the kit runs from
there: the window files equal Keras, `run_generate.py` prints what `keras-posenc generate --json`
prints. The README's install lines admit those venvs' versions (and, on Python 3.10, not numpy 2);
numpy 2 under tflite-runtime and every `--delegate` that does not load are one line and exit status 1.
"""

import contextlib
import glob
import io
import json
import os
import re
import shlex
import struct
import subprocess
import sys

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from stacks import once_on_keras2

from keras_posenc import export
from keras_posenc.app import cli
from keras_posenc.app import dataset as data
from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import pipeline
from keras_posenc.models import CausalLM

pytestmark = once_on_keras2("the kit runs files of the same graphs whichever stack exported them; "
                            "TF 2.12's converter is the one older than tflite-runtime 2.14")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "export", "jetson", "README.md")
VERSIONS = ("3.8", "3.10")  # JetPack 5's and JetPack 6's Python
VOCAB, WINDOW, PROMPT_LENGTH, CACHE_LENGTH, NEW_TOKENS = 120, 16, 16, 48, 24
PROMPTS = ("the cat", "a small dog", "the old house")


def tied_lm():
    """A small LM whose head is the token table: clear winners, varied text (as in edge_generate)."""
    keras.utils.set_random_seed(3)
    model = CausalLM({"num_layers": 2, "d_model": 32, "num_heads": 4, "dff": 64, "vocab_size": VOCAB,
                      "max_length": 64, "dropout": 0.0, "position": "rope", "scaling": "yarn",
                      "scaling_factor": 2.0, "original_length": 24})
    model.build_on_dummy()
    model.head.kernel.assign(model.encoder.embedding.token_embedding.embeddings.numpy().T)
    return model


def readme_pack_lines():
    """The README's `pack.py` command lines, as written."""
    with open(README) as f:
        return [line.strip() for line in f if line.startswith("python3 export/jetson/pack.py ")]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, corpus):
    """A folder as the README's training machine has it: runs/demo/{model.keras, spm.model}, the exports
    the README names (model.tflite of --target gpu, model_gl.tflite, gen.tflite of --target cpu,
    gen_gl.tflite) and export/ (the repository's); the model."""
    folder = tmp_path_factory.mktemp("kit-tflite-runtime")
    run = folder / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "spm.model").write_bytes(data.train_sentencepiece(data.read_text_corpus(corpus), vocab_size=VOCAB))
    model = tied_lm()
    path = str(run / "model.keras")
    model.save(path) if is_keras3() else model.save(path, save_format="keras_v3")
    for out, target in (("model.tflite", "gpu"), ("model_gl.tflite", "gl")):
        result = export.export_and_check(model, sequence_length=WINDOW, target=target)
        assert result.failures() == [], result.failures()
        result.save(str(folder / out))
    for out, target in (("gen.tflite", "cpu"), ("gen_gl.tflite", "gl")):
        result = pipeline.export_generator(model, str(folder / out), prompt_length=PROMPT_LENGTH,
                                            cache_length=CACHE_LENGTH, target=target, check_tokens=1)
        assert result["same_tokens"], out
    os.symlink(os.path.join(ROOT, "export"), folder / "export")
    return folder, model


@pytest.fixture(scope="module")
def packed(workspace):
    """The folder `posenc` that the README's pack lines write, run as written (bash, in the workspace)."""
    folder, _ = workspace
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    lines = readme_pack_lines()
    assert lines and all(shlex.split(line, comments=True)[2] == "posenc" for line in lines), lines
    for line in lines:
        done = subprocess.run(["bash", "-euc", line], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, (line, done.stderr[-3000:])
    return folder / "posenc"


def kit(edge, version, folder, *args, **environment):
    """`python3 ARGS...` in `folder` with the kit venv of Python `version` (nothing of this repository on
    its path)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(environment)
    return subprocess.run([edge.kit_python(version), *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)


def one_line(done):
    """The one line a failed run printed on stderr (fails on a traceback or more lines)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    return lines[0]


def test_the_readme_pack_lines_write_the_kit_and_every_exported_file(workspace, packed):
    folder, _ = workspace
    kit_files = {name for name in os.listdir(os.path.join(ROOT, "export", "jetson"))
                 if os.path.isfile(os.path.join(ROOT, "export", "jetson", name))}
    exported = set(os.listdir(folder)) - {"runs", "export", "posenc"}
    assert {"gen_gl.prefill.tflite", "gen_gl.decode.tflite", "gen_gl.tflite.embeddings.npy"} <= exported
    assert {"run_tflite.py", "run_generate.py", "kit_embeddings.py", "kit_contract.py"} <= kit_files
    assert set(os.listdir(packed)) == kit_files | exported | {"spm.model"}


def installed(edge, version):
    """`{name: version}` of every distribution in the kit venv of Python `version`."""
    script = ("import importlib.metadata as m, json; "
              "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    done = subprocess.run([edge.kit_python(version), "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return {canonicalize_name(name): found for name, found in json.loads(done.stdout).items()}


def test_the_readme_install_lines_admit_the_tested_venvs(edge):
    with open(README) as f:
        text = f.read()
    marked = r"^# JetPack \d \(Python (3\.\d+)\), tflite-runtime[^\n]*\n(pip3 install [^\n]*)$"
    lines = dict(re.findall(marked, text, re.M))
    assert set(lines) == set(VERSIONS), lines
    for version, line in lines.items():
        requirements = [Requirement(word) for word in shlex.split(line)[2:]]
        have = installed(edge, version)
        assert set(have) - {"pip", "setuptools"} == {canonicalize_name(r.name) for r in requirements}, version
        for requirement in requirements:
            assert requirement.specifier.contains(have[canonicalize_name(requirement.name)]), (version, line)
        numpy = next(r for r in requirements if r.name == "numpy")
        # What a plain `pip install numpy` brings on Python 3.10, which tflite-runtime cannot use.
        assert numpy.specifier.contains("2.2.6") == (version == "3.8"), line


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["model.tflite", "model_gl.tflite"])
def test_window_files_on_tflite_runtime_equal_keras(edge, workspace, packed, version, name, tmp_path):
    _, model = workspace
    ids = np.random.default_rng(1).integers(1, VOCAB, size=(1, WINDOW))
    np.save(tmp_path / "ids.npy", ids)
    out = str(tmp_path / "logits.npy")
    done = kit(edge, version, packed, "run_tflite.py", name, "--token-ids", str(tmp_path / "ids.npy"),
               "--output", out, "--iterations", "2", "--warmup", "0", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["runtime"] == "tflite_runtime"
    assert np.max(np.abs(np.load(out) - np.asarray(model(ids)))) <= 1e-4  # the export's float32 parity


@pytest.fixture(scope="module")
def keras_generations(workspace):
    """`keras-posenc generate runs/demo --prompt P --max-new-tokens N --json` for each prompt."""
    folder, _ = workspace
    printed = {}
    for prompt in PROMPTS:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert cli.main(["generate", str(folder / "runs" / "demo"), "--prompt", prompt,
                             "--max-new-tokens", str(NEW_TOKENS), "--json"]) in (0, None)
        printed[prompt] = json.loads(out.getvalue().strip().splitlines()[-1])
    assert len({printed[prompt]["text"] for prompt in PROMPTS}) == len(PROMPTS)  # real, varied text
    assert sum(len(printed[prompt]["ids"]) for prompt in PROMPTS) >= 2 * NEW_TOKENS, printed
    return printed


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["gen.tflite", "gen_gl.tflite"])
def test_generation_on_tflite_runtime_equals_keras_posenc_generate(edge, packed, keras_generations, version,
                                                                    name):
    for prompt, expected in keras_generations.items():
        done = kit(edge, version, packed, "run_generate.py", name, "--spm", "spm.model", "--prompt", prompt,
                   "--max-new-tokens", str(NEW_TOKENS), "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        printed = json.loads(done.stdout.strip().splitlines()[-1])
        same = (printed["ids"], printed["text"]) == (expected["ids"], expected["text"])
        assert same, (version, name, prompt, printed, expected)


@pytest.mark.parametrize("command", [
    ["run_tflite.py", "model.tflite", "--iterations", "1"],
    ["run_generate.py", "gen_gl.tflite", "--spm", "spm.model", "--prompt", "the cat", "--json"]])
def test_numpy_2_under_tflite_runtime_is_one_line(edge, packed, command):
    line = one_line(kit(edge, "3.10", packed, *command, PYTHONPATH=edge.numpy2_site()))
    assert line.startswith("tflite-runtime was built against NumPy 1.x and cannot run with numpy 2.2.6")
    assert 'pip install "numpy<2"' in line


def shared_library(edge):
    """A shared library of this platform that is no TFLite delegate (sentencepiece's extension)."""
    pattern = os.path.join(os.path.dirname(os.path.dirname(edge.kit_python("3.10"))), "lib", "python3.10",
                           "site-packages", "sentencepiece", "_sentencepiece*.so")
    return open(sorted(glob.glob(pattern))[0], "rb").read()


def test_every_delegate_that_does_not_load_is_one_line(edge, packed, tmp_path):
    library = bytearray(shared_library(edge))
    (tmp_path / "not_a_delegate.so").write_bytes(library)
    aarch64 = struct.unpack_from("<H", library, 18)[0] == 0xB7
    other, other_name = (0x3E, "x86_64") if aarch64 else (0xB7, "aarch64")
    library[18:20] = struct.pack("<H", other)  # ELF e_machine: a delegate built for the other platform
    (tmp_path / "other_platform.so").write_bytes(library)
    (tmp_path / "text.so").write_text("not a library\n")
    cases = {"./missing.so": "file not found",
             str(tmp_path / "text.so"): "not a shared library",
             str(tmp_path / "not_a_delegate.so"): "not a TFLite delegate",
             str(tmp_path / "other_platform.so"): f"built for {other_name}, but this machine is"}
    for delegate, reason in cases.items():
        line = one_line(kit(edge, "3.10", packed, "run_tflite.py", "model_gl.tflite", "--accelerator", "gpu",
                            "--delegate", delegate, "--iterations", "1"))
        assert line.startswith(f"--delegate {delegate}: {reason}"), line
    line = one_line(kit(edge, "3.8", packed, "run_generate.py", "gen_gl.tflite", "--prompt-ids", "2,5,9",
                        "--accelerator", "gpu", "--delegate", "./missing.so"))
    assert line == "--delegate ./missing.so: file not found."
