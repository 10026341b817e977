"""A stand-in LiteRT Python for the tests: a script that shows it is the Python the exporter ran."""

FAILED_QUANTIZE = "LiteRT `quantize` failed (exit 3): stand-in LiteRT Python: quantize"


def failing_litert_python(tmp_path, monkeypatch):
    """The path of a Python that exits 3 with its command as its last log line (`FAILED_QUANTIZE`
    for `quantize`); the LiteRT Python variables are unset, so only the given one can run."""
    for variable in ("KERAS_POSENC_LITERT_PYTHON", "KERAS_POSENC_LITERTLM_PYTHON"):
        monkeypatch.delenv(variable, raising=False)
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho \"stand-in LiteRT Python: $2\" >&2\nexit 3\n")
    python.chmod(0o755)
    return str(python)
