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
