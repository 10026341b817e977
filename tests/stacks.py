"""Tests, or parameter cases, whose subject is the same on both stacks run on one of them.

`make test` runs the suite twice side by side, on Keras 2 (TensorFlow 2.12) and on Keras 3
(TensorFlow 2.21), and `make test-edge` exports with both converters. A case belongs on both
stacks when the stack can change its outcome: a layer's graph, a converter's lowering, a runtime
log line, a checkpoint format. It runs on one stack only when everything the stack contributes is
exercised the same way by a case that still runs on both, e.g. the RoPE scalings that only change
the values of the frozen cos/sin tables (NumPy float64, the same on both stacks), or the report
logic of a command whose training run is checked on both stacks elsewhere. The reason names the
case that keeps the stack covered.

A test file that `tools/mutation.toml` lists runs its once-cases on Keras 2: `make mutation` runs
the tests on .venv (Keras 2), so a test that kills mutants must run there. The other files, and
`make test-edge`'s, may run a case once on either stack, to balance the two runs (each stage takes
as long as its longer run).
"""

import pytest

from keras_posenc.backend import is_keras3


def once_on_keras2(reason):
    """Marks a test that runs on the Keras 2 stack only; `reason` says why once is enough."""
    return pytest.mark.skipif(is_keras3(), reason=f"run once, on the Keras 2 stack: {reason}")


def once_on_keras3(reason):
    """Marks a test that runs on the Keras 3 stack only; `reason` says why once is enough."""
    return pytest.mark.skipif(not is_keras3(), reason=f"run once, on the Keras 3 stack: {reason}")

