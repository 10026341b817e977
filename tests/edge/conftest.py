"""`make test-edge`: the exported files run by the real GPU runtimes, on CPU-emulated GPUs.

The test files here are named `edge_*.py`, so the main suite (`make test`) never collects them;
`make test-edge` bootstraps the runtimes (tests/edge/runtime/bootstrap.sh) and runs them by name. A missing
cache is an error here, not a skip: these tests exist to run the runtimes.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from float16_rules import close_in_half_precision  # noqa: E402
from runtime import runtimes  # noqa: E402

# `make test` collects docstring examples from every module under tests/ (--doctest-modules), which
# would import these files without the edge caches on the path; `make test-edge` names them, so they
# still run there.
collect_ignore_glob = ["edge_*.py"]

if os.path.isdir(runtimes.onnx_site()) and runtimes.onnx_site() not in sys.path:
    sys.path.append(runtimes.onnx_site())  # tf2onnx + onnxruntime beside .venv's TensorFlow


@pytest.fixture(scope="session")
def edge():
    missing = runtimes.missing_parts()
    if missing:
        pytest.fail(f"The edge runtimes are not bootstrapped ({', '.join(missing)} missing under "
                    f"{runtimes.CACHE}): run `make test-edge` (or tests/edge/runtime/bootstrap.sh) first.")
    return runtimes


@pytest.fixture
def tflite_file(tmp_path):
    """`tflite_file(name, flat)`: writes the flatbuffer to `tmp_path/name.tflite`, returns the path."""
    def write(name, flat):
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(flat)
        return str(path)
    return write


@pytest.fixture(scope="session")
def half_precision():
    """`close_in_half_precision(half, reference, real)`, the float16 check of every GPU file."""
    return close_in_half_precision
