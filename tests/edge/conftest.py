"""`make test-edge`: the exported files run by the real GPU runtimes, on CPU-emulated GPUs.

The test files here are named `edge_*.py`, so the main suite (`make test`) never collects them;
`make test-edge` bootstraps the runtimes (tests/edge/runtime/bootstrap.sh) and runs them by name. A missing
cache is an error here, not a skip: these tests exist to run the runtimes.
"""

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from runtime import runtimes  # noqa: E402

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


def close_in_half_precision(half, reference, real):
    """The float16-GPU logits `half` against the float32 CPU logits `reference` `[T, vocab]`.

    On the rows of the real tokens (`real` `[T]` bool or index): all finite, within 2e-2 of the
    reference relative to its max |x|, and the same argmax for at least 99 % of the real tokens
    (every one counted, near-ties included). Returns the relative error and the argmax agreement,
    and prints both (`pytest -s` shows the measured figures).
    """
    half, reference = np.asarray(half)[real], np.asarray(reference)[real]
    assert np.isfinite(half).all(), "non-finite logits in float16"
    scale = np.max(np.abs(reference))
    error = float(np.max(np.abs(half - reference)) / scale)
    agreement = float(np.mean(half.argmax(-1) == reference.argmax(-1)))
    print(f"float16: max |dx| / max |x| = {error:.2e}, argmax agreement {agreement:.2%} "
          f"of {len(half)} tokens")
    assert error <= 2e-2, f"float16 logits {error:.3g} (relative to max |x|) from the float32 ones"
    assert agreement >= 0.99, f"float16 argmax agrees on {agreement:.1%} of the real tokens"
    return error, agreement


@pytest.fixture(scope="session")
def half_precision():
    """`close_in_half_precision(half, reference, real)`, the float16 check of every GPU file."""
    return close_in_half_precision
