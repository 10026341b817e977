"""Test configuration shared by the whole suite."""

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

# The runtimes' probes run inside the edge cache's own venvs (`make test-edge`), never in this one.
collect_ignore = ["edge/runtime"]

# Hypothesis profiles of the property tests (tests/test_properties*.py). `ci`, the default, is
# reproducible (derandomize: the same examples on every run) and bounded; `thorough`
# (HYPOTHESIS_PROFILE=thorough, `make test-thorough`) draws 10x more, randomly, for local runs.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=200, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first 300 lines of the embedded default corpus as a file: a small training run's data."""
    from keras_posenc.app import dataset as data  # the application's dependencies, only where used

    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    lines = data.read_text_corpus(data.default_corpus_path())[:300]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _random_modes():
    """The process-wide modes `backend.make_deterministic` sets, as far as they were set at all."""
    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.framework import config

    from keras_posenc import backend

    generators = None
    if not backend.is_keras3():
        generators = backend.keras.backend.experimental.is_tf_random_generator_enabled()
    return config.is_op_determinism_enabled(), generators


def _restoring_random_modes():
    before = _random_modes()
    yield
    after = _random_modes()
    if after is None or after == before:
        return
    if before is None:  # TensorFlow came in meanwhile: its modes start off
        before = (False, None if after[1] is None else False)
    from tensorflow.python.framework import config

    from keras_posenc import backend

    determinism, generators = before
    (config.enable_op_determinism if determinism else config.disable_op_determinism)()
    if generators is not None:
        experimental = backend.keras.backend.experimental
        if generators:
            experimental.enable_tf_random_generator()
        else:
            experimental.disable_tf_random_generator()


# Every training run calls `make_deterministic`, which switches Keras 2's initializers to
# `tf.random.Generator`s (other weights for the same seed) and TF's ops to their deterministic
# kernels for the whole process. Each test, and each module (its fixtures may train), ends with
# the modes it started with: a test's weights do not depend on which tests ran before it.
@pytest.fixture(autouse=True, scope="module")
def _random_modes_restored_per_module():
    yield from _restoring_random_modes()


@pytest.fixture(autouse=True)
def _random_modes_restored():
    yield from _restoring_random_modes()


@pytest.fixture(autouse=True, scope="session")
def _no_tool_environments(tmp_path_factory):
    """No test creates a tool environment (`keras_posenc.export.tool_env`), nor finds one of the user's:
    their cache is an empty folder of the session, and creating one is switched off (tests/test_tool_env.py
    turns it back on with a stand-in Python). Not through `monkeypatch`: an autouse fixture that requests
    it would keep every test's patches until after the test's other fixtures are torn down."""
    names = ("KERAS_POSENC_HOME", "KERAS_POSENC_NO_TOOL_INSTALL")  # literal: keras_posenc.export loads TF
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(KERAS_POSENC_HOME=str(tmp_path_factory.getbasetemp() / "keras-posenc-home"),
                      KERAS_POSENC_NO_TOOL_INSTALL="1")
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def no_litert_python_variables(monkeypatch):
    """Neither LiteRT Python variable is set during the test: only a Python the test names runs."""
    from keras_posenc.export.litert_python import LEGACY_PYTHON_ENV, PYTHON_ENV

    for name in (PYTHON_ENV, LEGACY_PYTHON_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def python_sigint_handler():
    """SIGINT raises `KeyboardInterrupt` during the test, as in a terminal, whatever the suite inherited.

    A suite started in the background (`make test &`, `nohup`) inherits SIGINT ignored, and Python
    then installs no handler of its own.
    """
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
