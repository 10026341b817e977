"""Keeps TensorFlow's C++ start-up log off the `keras-posenc` command's output.

TensorFlow prints oneDNN, CUDA and TF-TRT notices while it loads. TF 2.12
honours `TF_CPP_MIN_LOG_LEVEL`; TF 2.16 and later print some of them through
absl before reading it. So when the `keras-posenc` command runs and the user
has not set `TF_CPP_MIN_LOG_LEVEL`, `quiet_tensorflow_import` sets it to 2
(warnings and errors of the run itself still show) and loads TensorFlow with
the process's stderr held. A failed import still raises, with its traceback
printed after stderr is back. Library users are never affected.

Importing this module does it (`keras_posenc/__init__.py` imports it first).
"""

import importlib.util
import os
import sys


def _is_command():
    argv = getattr(sys, "orig_argv", sys.argv)[:3]
    return any(os.path.basename(arg) in ("keras-posenc", "keras_posenc.cli") for arg in argv)


def quiet_tensorflow_import():
    """Loads TensorFlow with its start-up log silenced, for the `keras-posenc` command only."""
    if not _is_command() or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is None:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)


quiet_tensorflow_import()
