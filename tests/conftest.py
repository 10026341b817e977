"""Test configuration shared by the whole suite."""

import os
import sys

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
