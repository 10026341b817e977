"""Finding the LiteRT Python and talking to it (keras_posenc/export/litert_python.py), without it.

Which Python is the LiteRT Python (the argument, either variable, this one), how a script that
fails or overruns its time reaches the caller, and the interpreter server's life: started, answering
an error, exiting on its own, closed. The scripts run in this Python; where a case needs a module
to be missing or broken there, a folder of stand-in modules goes first on its PYTHONPATH. The
interpreter itself (ai-edge-litert's, in the real LiteRT Python) runs in
tests/edge/edge_litert_python.py.
"""

import importlib.util
import os
import subprocess
import sys
import types

import pytest
from litert_stand_in import executable

from keras_posenc.export import litert_python
from keras_posenc.export.litert_python import RemoteRuntime, run_script, runtime_python

HINT = ("without --litert-python, $KERAS_POSENC_LITERT_PYTHON and $KERAS_POSENC_NO_TOOL_INSTALL, "
        "keras-posenc creates one on first use; or run "
        "python3 -m venv venv-litert-tools && venv-litert-tools/bin/pip install litert-lm-api==0.18.1 "
        "litert-lm-builder==0.18.1 litert-quantizer==0.11.0, then set "
        "KERAS_POSENC_LITERT_PYTHON=venv-litert-tools/bin/python (or pass --litert-python)")
SERVER = os.path.join(os.path.dirname(litert_python.__file__), "litert_runtime.py")


def stand_ins(folder, **modules):
    """`folder` with a module `name.py` of source `text` for each `name=text`: a PYTHONPATH entry."""
    folder.mkdir(exist_ok=True)
    for name, text in modules.items():
        (folder / f"{name}.py").write_text(text)
    return str(folder)


# runtime_python ---------------------------------------------------------------------------------

def test_the_install_hint_names_the_packages_and_the_variable():
    assert litert_python.INSTALL_HINT == HINT
    assert (litert_python.PYTHON_ENV, litert_python.LEGACY_PYTHON_ENV) == (
        "KERAS_POSENC_LITERT_PYTHON", "KERAS_POSENC_LITERTLM_PYTHON")


def test_the_argument_first_then_the_new_variable_then_the_old_one(no_litert_python_variables, tmp_path):
    new, old, given = (executable(tmp_path / name) for name in ("new", "old", "given"))
    no_litert_python_variables.setenv("KERAS_POSENC_LITERTLM_PYTHON", old)
    assert runtime_python() == old
    assert runtime_python(module="json") == old  # a variable wins over this Python
    no_litert_python_variables.setenv("KERAS_POSENC_LITERT_PYTHON", new)
    assert runtime_python() == new
    assert runtime_python(given) == given
    no_litert_python_variables.setenv("KERAS_POSENC_LITERT_PYTHON", "")  # set but empty: the old one
    assert runtime_python() == old


def test_without_a_variable_this_python_when_it_imports_the_module(no_litert_python_variables):
    assert runtime_python(module="json") == sys.executable
    assert runtime_python(None, "json") == sys.executable
    assert runtime_python(module="keras_posenc_no_such_module") is None
    builder = importlib.util.find_spec("litert_lm_builder") is not None
    assert runtime_python() == (sys.executable if builder else None)  # the bundle builder by default


def test_this_python_is_the_litert_python_once_it_imports_the_bundle_builder(no_litert_python_variables):
    builder = types.ModuleType("litert_lm_builder")
    no_litert_python_variables.setitem(sys.modules, "litert_lm_builder", builder)
    assert runtime_python() == sys.executable
    assert runtime_python(module="litert_quantizer_no_such_module") is None


@pytest.mark.parametrize("kind", ["missing", "not executable", "folder"])
def test_what_is_not_an_executable_file_is_refused_with_the_install_line(no_litert_python_variables, tmp_path,
                                                                          kind):
    path = tmp_path / "python"
    if kind == "not executable":
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644)
    elif kind == "folder":
        path.mkdir()
    message = f"the LiteRT Python '{path}' is not an executable file: {HINT}."
    with pytest.raises(ValueError) as error:
        runtime_python(str(path))
    assert str(error.value) == message
    no_litert_python_variables.setenv("KERAS_POSENC_LITERT_PYTHON", str(path))
    with pytest.raises(ValueError) as error:
        runtime_python(module="json")
    assert str(error.value) == message
    no_litert_python_variables.delenv("KERAS_POSENC_LITERT_PYTHON")
    no_litert_python_variables.setenv("KERAS_POSENC_LITERTLM_PYTHON", str(path))
    with pytest.raises(ValueError) as error:
        runtime_python()
    assert str(error.value) == message


# run_script -------------------------------------------------------------------------------------

def test_a_failing_script_raises_with_its_exit_status_and_last_three_log_lines(tmp_path):
    """The quantizer's import fails in the script: the traceback's last three lines in the message."""
    folder = tmp_path / "site"
    folder.mkdir()
    package = folder / "litert_quantizer"
    package.mkdir()
    raising = 'raise ImportError("LiteRT Quantizer stand-in: broken install")'
    (package / "__init__.py").write_text(f"\n\n{raising}\n")
    env = dict(os.environ, PYTHONPATH=str(folder))
    spec = {"model": str(tmp_path / "float.tflite"), "out": str(tmp_path / "out.tflite"), "configs": []}
    with pytest.raises(RuntimeError) as error:
        run_script(sys.executable, "litert_runtime.py", "quantize", spec, env=env)
    assert str(error.value) == (
        f'LiteRT `quantize` failed (exit 1):   File "{package / "__init__.py"}", line 3, in <module> | '
        f"    {raising} | "
        "ImportError: LiteRT Quantizer stand-in: broken install")
    assert not (tmp_path / "out.tflite").exists()


def test_the_script_runs_the_command_it_is_given(tmp_path, monkeypatch):
    """`pack` is no command of litert_runtime.py: it fails on the command, after reading the spec file."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError) as error:
        run_script(sys.executable, "litert_runtime.py", "pack", {"model": "m.tflite"})
    assert os.listdir(tmp_path) == []  # the spec went to a folder of its own, gone now
    assert str(error.value).startswith("LiteRT `pack` failed (exit 1): ")
    assert str(error.value).endswith(" | KeyError: 'pack'")


def test_a_script_past_its_timeout_is_stopped(tmp_path):
    site = stand_ins(tmp_path / "site", sitecustomize="import time\ntime.sleep(120)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_script(sys.executable, "litert_runtime.py", "quantize", {}, timeout=3,
                   env=dict(os.environ, PYTHONPATH=site))


# RemoteRuntime ----------------------------------------------------------------------------------

def test_the_server_starts_numbers_its_files_and_exits_cleanly_on_close():
    with RemoteRuntime(sys.executable) as runtime:
        folder = runtime.folder.name
        assert os.path.isdir(folder) and os.listdir(folder) == []
        assert runtime.process.args == [sys.executable, SERVER, "serve"]
        assert runtime.path("model.tflite") == os.path.join(folder, "1-model.tflite")
        assert runtime.path("feeds.npz") == os.path.join(folder, "2-feeds.npz")
        assert runtime.process.poll() is None
    assert runtime.process.returncode == 0  # the "close" request ended its loop
    assert not os.path.exists(folder)


def test_an_error_in_the_server_reaches_the_caller_and_the_server_goes_on(tmp_path, monkeypatch):
    """ai-edge-litert broken there: each request's answer is that error, as a RuntimeError."""
    package = tmp_path / "site" / "ai_edge_litert"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "interpreter.py").write_text('raise ImportError("ai-edge-litert stand-in: no interpreter")\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    message = "LiteRT's interpreter: ImportError: ai-edge-litert stand-in: no interpreter"
    with RemoteRuntime(sys.executable) as runtime:
        with pytest.raises(RuntimeError) as error:
            runtime.interpreter(model_content=b"\x00\x00\x00\x00TFL3")
        assert str(error.value) == message
        with open(os.path.join(runtime.folder.name, "1-model.tflite"), "rb") as f:
            assert f.read() == b"\x00\x00\x00\x00TFL3"  # the flatbuffer went to a file of its own
        with pytest.raises(RuntimeError) as error:
            runtime.interpreter(model_path=str(tmp_path / "given.tflite"))
        assert str(error.value) == message
        assert sorted(os.listdir(runtime.folder.name)) == ["1-model.tflite"]  # a path given: no copy
        with pytest.raises(RuntimeError) as error:
            runtime.call("invoke", {"0": [1.0, 2.0]}, id=0)
        assert str(error.value) == message
        assert runtime.process.poll() is None
    assert runtime.process.returncode == 0


def test_a_server_that_exits_is_reported_with_its_status_and_its_log_is_not_shown(tmp_path, capfd):
    server = "#!/bin/sh\necho 'INFO: a runtime log line' >&2\nread request\nexit 3\n"
    python = executable(tmp_path / "python", server)
    runtime = RemoteRuntime(python)
    with pytest.raises(RuntimeError) as error:
        runtime.request(op="open", path="model.tflite")
    assert str(error.value) == "the LiteRT interpreter server exited (status 3)."
    folder = runtime.folder.name
    runtime.close()  # nothing left to tell: only the folder goes
    assert runtime.process.returncode == 3
    assert not os.path.exists(folder)
    assert capfd.readouterr() == ("", "")


def test_a_server_already_gone_when_asked_is_reported_with_its_status(tmp_path):
    # a request written to a dead server's closed pipe: the same message, not a BrokenPipeError
    python = executable(tmp_path / "python", "#!/bin/sh\nexit 5\n")
    runtime = RemoteRuntime(python)
    runtime.process.wait()
    with pytest.raises(RuntimeError) as error:
        runtime.request(op="open", path="model.tflite")  # no reader on the pipe: the write fails
    assert str(error.value) == "the LiteRT interpreter server exited (status 5)."
    runtime.close()
    assert runtime.process.returncode == 5


def test_a_server_that_does_not_end_on_close_is_killed(tmp_path, monkeypatch):
    """The close request unanswered: after the wait, the process is killed."""
    python = executable(tmp_path / "python", "#!/bin/sh\nexec sleep 120\n")
    runtime = RemoteRuntime(python)
    wait = runtime.process.wait
    waits = []

    def short_wait(timeout=None):  # a bounded wait, made short here
        waits.append(timeout)
        return wait(timeout=None if timeout is None else 0.5)

    monkeypatch.setattr(runtime.process, "wait", short_wait)
    runtime.close()
    assert len(waits) == 1
    assert wait(timeout=30) == -9  # SIGKILL
    assert not os.path.exists(runtime.folder.name)
