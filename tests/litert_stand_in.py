"""Stand-in LiteRT Pythons for the tests: scripts that show they are the Python the exporter ran."""

FAILED_QUANTIZE = "LiteRT `quantize` failed (exit 3): stand-in LiteRT Python: quantize"


def executable(path, text="#!/bin/sh\n"):
    """Writes the shell script `text` to `path`, executable; returns the path as a string."""
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def failing_litert_python(tmp_path):
    """The path of a Python that exits 3 with its command as its last log line (`FAILED_QUANTIZE`
    for `quantize`); pair it with the `no_litert_python_variables` fixture, so only it can run."""
    return executable(tmp_path / "python", "#!/bin/sh\necho \"stand-in LiteRT Python: $2\" >&2\nexit 3\n")
