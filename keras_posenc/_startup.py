"""Start-up of the `keras-posenc` application, before TensorFlow's first import.

Two jobs, both done when `keras_posenc` is imported (its `__init__` imports
this module first):

- `preload_app_libraries`: sentencepiece, when installed (the `app` extra),
  is loaded before TensorFlow. sentencepiece <= 0.2.0 (the last release for
  Python 3.8, the Python of the TF 2.12 GPU image) segfaults training a
  tokenizer when TensorFlow was loaded first. Without the extra nothing is
  imported: the layers need only TensorFlow/Keras and numpy.
- `quiet_runtime`: keeps the runtime's log lines off the `keras-posenc`
  command's output, unless `--verbose`.

TensorFlow, XLA, absl and TFLite write log lines straight to the process's
stderr from C++: oneDNN and CUDA notices while TensorFlow loads (TF 2.16 and
later print some through absl before they read `TF_CPP_MIN_LOG_LEVEL`),
`failed call to cuInit` on a machine without a GPU driver, TF 2.21's
`NodeDef mentions attribute use_unbounded_threadpool` and TFLite's
`INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`. None of them can
be switched off one by one from Python.

So when the `keras-posenc` command runs without `--verbose`, importing this
module (`keras_posenc/__init__.py` does it first, before TensorFlow's import)
sets `TF_CPP_MIN_LOG_LEVEL=2` unless the user set it, lowers the Python
loggers of TensorFlow and absl to errors, hides Python warnings raised by
the libraries (the package's own warnings still show), and sends the
process's stderr (file descriptor 2) through a small filter process that
drops the lines `is_runtime_noise` recognizes and passes every other line
(errors, tracebacks, the command's own messages) unchanged. The filter is a
separate process so that the last lines of a process that crashes still
come out. Library users and `--verbose` runs are never affected.
"""

import atexit
import importlib.util
import logging
import os
import re
import subprocess
import sys
import warnings

VERBOSE_FLAG = "--verbose"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# Log lines of the runtime that say nothing about the run: C++ INFO/WARNING lines (absl's format
# and TF 2.12's), absl's preamble, TFLite's INFO lines, and known-benign ERROR lines.
RUNTIME_NOISE = re.compile("|".join([
    r"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] ",
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] \S+:\d+\] ",
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags",
    r"^INFO: (Created TensorFlow Lite|Initialized TensorFlow Lite runtime)",
    r"^(WARNING|INFO):(tensorflow|absl):",
    r"^E\S* .*(failed call to cuInit|NodeDef mentions attribute use_unbounded_threadpool"
    r"|Unable to register cu(DNN|FFT|BLAS) factory)",
]))

_FILTER_PROCESS = """
import re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # outlive a Ctrl-C of the command: its traceback still comes
noise, out = re.compile(sys.argv[1]), sys.stdout.buffer
for line in sys.stdin.buffer:
    if not noise.search(line.decode("utf-8", "replace")):
        out.write(line)
        out.flush()
"""


def is_runtime_noise(line):
    """Whether a stderr line is one of the runtime's log lines that the quiet command drops.

    Args:
        line: str, one line of stderr.

    Returns:
        bool.

    Example:

    >>> is_runtime_noise("I0000 00:00:1796110649.093696    9593 port.cc:153] oneDNN custom operations on.")
    True
    >>> is_runtime_noise("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.")
    True
    >>> is_runtime_noise("E0000 00:00:1796110654.589365    9593 cuda_platform.cc:52] failed call to cuInit: "
    ...                  "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")
    True
    >>> is_runtime_noise("E0000 00:00:1796110654.589365    9593 bfc_allocator.cc:485] Allocator ran out")
    False
    >>> is_runtime_noise("keras-posenc: error: Corpus file not found: corpus='missing.txt'.")
    False
    """
    return bool(RUNTIME_NOISE.search(line))


def _is_command():
    argv = getattr(sys, "orig_argv", sys.argv)[:3]
    return any(os.path.basename(arg) in ("keras-posenc", "keras_posenc.app.cli") for arg in argv)


def is_package_warning(filename):
    """Whether a warning raised in `filename` is the package's own (shown) or a library's (hidden)."""
    return os.path.abspath(filename).startswith(PACKAGE_DIR + os.sep)


def _show_package_warnings_only(message, category, filename, lineno, file=None, line=None):
    if is_package_warning(filename):
        print(f"keras-posenc: warning: {message}", file=sys.stderr)


def _filter_stderr():
    """Routes file descriptor 2 through the filter process; restores it at exit."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _FILTER_PROCESS, RUNTIME_NOISE.pattern],
                                   stdin=read_end, stdout=2, stderr=subprocess.DEVNULL)
    except OSError:  # no filter, no harm: the lines just show
        os.close(read_end)
        os.close(write_end)
        return
    os.close(read_end)
    saved = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)

    def restore():
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe: the filter reads to the end and exits
        os.close(saved)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()

    atexit.register(restore)


def quiet_runtime():
    """Silences the runtime's logs and the libraries' warnings for the `keras-posenc` command.

    Does nothing for library users, with `--verbose` on the command line, or
    when TensorFlow was imported before (its start-up lines are out already).
    """
    if not _is_command() or VERBOSE_FLAG in sys.argv[1:] or "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.showwarning = _show_package_warnings_only
    if importlib.util.find_spec("tensorflow") is not None:
        _filter_stderr()


def preload_app_libraries():
    """Loads sentencepiece before TensorFlow when it is installed; returns whether it did.

    Does nothing when TensorFlow is loaded already (too late to matter) or
    when sentencepiece is not installed (the package without its `app` extra).
    """
    if "tensorflow" in sys.modules:
        return False
    try:
        importlib.import_module("sentencepiece")
    except ImportError:
        return False
    return True


preload_app_libraries()
quiet_runtime()
