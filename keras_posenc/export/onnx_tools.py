"""tf2onnx and onnxruntime, the tools of `--target tensorrt`, or one line saying why they cannot be had.

Both locks install them (requirements/tf212.txt on Python 3.10+: tf2onnx 1.17.0, onnx 1.16.2,
onnxruntime 1.23.2; requirements/tf221.txt: tf2onnx 1.17.0, onnx 1.19.1, onnxruntime 1.23.2). On
Python 3.8 and 3.9 (the TF 2.12 Docker image) there is none that TF 2.12's lock can hold: tf2onnx
1.17 needs Python 3.10, and 1.16.1, the last release for older Pythons, pins protobuf~=3.20.
"""

import sys

from keras_posenc.export.tool_env import ToolEnvironmentError

__all__ = ["import_tf2onnx", "missing_message"]


def missing_message(error, version=None):
    """The one line of `--target tensorrt` without its tools: what is missing, and what to do.

    Args:
        error: the `ImportError` of the failed import.
        version: (major, minor) of the Python (default: this one).

    Example:

    >>> missing_message(ImportError("No module named 'tf2onnx'"), (3, 8))  # doctest: +NORMALIZE_WHITESPACE
    "--target tensorrt needs tf2onnx (No module named 'tf2onnx'), which the TF 2.12 lock installs on
    Python 3.10+ only: tf2onnx 1.17 needs Python 3.10, and 1.16.1, the last release for Python 3.8,
    pins protobuf~=3.20, which TF 2.12's lock (protobuf 4.25) excludes; export from a Python 3.10+
    venv (make venv)."
    """
    major, minor = version or sys.version_info[:2]
    if (major, minor) < (3, 10):
        return (f"--target tensorrt needs tf2onnx ({error}), which the TF 2.12 lock installs on Python "
                "3.10+ only: tf2onnx 1.17 needs Python 3.10, and 1.16.1, the last release for Python "
                f"{major}.{minor}, pins protobuf~=3.20, which TF 2.12's lock (protobuf 4.25) excludes; "
                "export from a Python 3.10+ venv (make venv).")
    return (f"--target tensorrt needs tf2onnx and onnxruntime ({error}), which the locks install: "
            "pip install -r requirements/tf212.txt (TF 2.12) or requirements/tf221.txt (Keras 3), or "
            "pip install tf2onnx==1.17.0 onnx onnxruntime==1.23.2.")


def import_tf2onnx():
    """The `tf2onnx` module, after onnxruntime (which folds the constants and checks the file).

    Raises:
        ToolEnvironmentError: either is not importable (`missing_message`).
    """
    try:
        import onnxruntime  # noqa: F401
        import tf2onnx
    except ImportError as error:
        raise ToolEnvironmentError(missing_message(error)) from error
    return tf2onnx
