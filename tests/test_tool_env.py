"""The tool environments keras-posenc creates on first use (`keras_posenc.export.tool_env`).

A stand-in Python plays the interpreter, `venv` and pip: it records each call, and `FAKE_PIP` makes
pip fail or take its time, so creation, reuse, failures, atomicity and the lock are tested without
installing a package.
"""

import dataclasses
import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import test_cli_arguments
from stacks import once_on_keras2

from keras_posenc.export import litert_python, onnx_tools, tool_env
from keras_posenc.export.tool_env import ToolEnvironment, ToolEnvironmentError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL_ENV = tool_env.__file__
# The exporters replaced, and the runner of the command, of the command-line tests.
exports, run = test_cli_arguments.exports, test_cli_arguments.run
NOT_FOUND = "ERROR: Could not find a version that satisfies the requirement litert-lm-builder==0.18.1"
pytestmark = once_on_keras2("a stand-in Python plays the tool environments' interpreter and pip; nothing "
                            "here runs TensorFlow or Keras")

# The stand-in: `-c CODE` prints $FAKE_VERSION; `-m venv DIR` makes DIR/bin/python (itself);
# `-m pip install -r FILE` copies FILE to the environment's installed.txt; `-m pip check` passes.
# Each call is a line of calls.log, and which of PYTHONPATH and PYTHONHOME it had a line of
# calls.log.env. $FAKE_PIP: "venv" fails venv, "fail" fails pip install as pip does when the index
# is out of reach, "silent" fails it without a word, "broken" fails pip check.
STAND_IN = '''#!{python}
import os, shutil, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
with open(os.environ["FAKE_LOG"] + ".env", "a") as log:  # the variables that steer Python, when set
    log.write(" ".join(key for key in ("PYTHONPATH", "PYTHONHOME") if key in os.environ) + "\\n")
mode = os.environ.get("FAKE_PIP", "ok")
if args[0] == "-c":
    print(os.environ.get("FAKE_VERSION", "3.11"))
elif args[:2] == ["-m", "venv"]:
    if mode == "venv":
        print("Error: Command 'ensurepip' returned non-zero exit status 1.")
        sys.exit(1)
    os.makedirs(os.path.join(args[-1], "bin"))
    shutil.copy(__file__, os.path.join(args[-1], "bin", "python"))
elif "install" in args:
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    if mode == "fail":
        print("WARNING: Retrying after connection broken", file=sys.stderr)
        print("{not_found}", file=sys.stderr)
        print("Looking in indexes: https://pypi.org/simple")  # after the ERROR line, not an error
        sys.exit(1)
    if mode == "silent":
        sys.exit(3)
    here = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))
    shutil.copy(args[args.index("-r") + 1], os.path.join(here, "installed.txt"))
elif "check" in args and mode == "broken":
    print("litert-quantizer 0.11.0 requires scipy, which is not installed.")
    sys.exit(1)
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A stand-in Python and an environment of two pins; creating environments is switched on."""
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable, not_found=NOT_FOUND))
    python.chmod(0o755)
    pins = tmp_path / "pins.txt"
    pins.write_text("litert-lm-builder==0.18.1\nprotobuf==7.36.2\n")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv(tool_env.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.delenv(tool_env.NO_INSTALL_ENV)
    environment = ToolEnvironment(name="tools", requirements=str(pins), what="the tools",
                                  pythons=("3.11", "3.12"), override="set TOOLS_PYTHON")
    return environment, str(python), tmp_path


def calls(tmp_path):
    path = tmp_path / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def test_the_conftest_switches_creation_off_for_every_other_test():
    assert os.environ[tool_env.NO_INSTALL_ENV] == "1"
    assert os.environ[tool_env.HOME_ENV].endswith("keras-posenc-home")


def test_the_first_use_creates_it_in_one_line_and_the_next_reuses_it(stand_in, capfd):
    environment, python, tmp_path = stand_in
    created = tool_env.ensure(environment, python)
    folder = tool_env.location(environment, "3.11")
    assert created == os.path.join(folder, "bin", "python") and os.path.isfile(created)
    assert re.fullmatch(r"tools-py311-[0-9a-f]{12}", os.path.basename(folder))
    assert os.path.dirname(folder) == str(tmp_path / "home")
    assert (tmp_path / "home" / folder / "installed.txt").read_text() == environment.pins()
    assert capfd.readouterr().err.splitlines() == [
        f"keras-posenc: creating the environment of the tools in {folder} (once; later commands reuse it)"]
    first = calls(tmp_path)
    assert len(first) == 4 and first[0] == "-c " + tool_env._VERSION_CODE
    assert first[1].startswith(f"-m venv --clear {tmp_path}/home/.{os.path.basename(folder)}.tmp-")
    pip = "-m pip --disable-pip-version-check --no-input"
    assert first[2:] == [f"{pip} install --quiet --no-deps -r {environment.requirements}", f"{pip} check"]
    with open(os.path.join(folder, tool_env.STAMP)) as f:  # what made it, for whoever looks
        assert json.load(f) == {"requirements": environment.pins(), "python": python}
    assert sorted(os.listdir(tmp_path / "home")) == sorted([os.path.basename(folder),
                                                            os.path.basename(folder) + ".lock"])
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(folder).st_mode & 0o777 == 0o777 & ~umask
    assert tool_env.ensure(environment, python) == created
    assert calls(tmp_path)[len(first):] == ["-c " + tool_env._VERSION_CODE]  # only its version asked
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("mode, step, reason", [
    ("venv", "venv", "exit 1: Error: Command 'ensurepip' returned non-zero exit status 1."),
    ("fail", "pip install", f"exit 1: {NOT_FOUND}) (is the package index reachable from here?"),
    ("silent", "pip install", "exit 3) (is the package index reachable from here?"),
    ("broken", "pip check", "exit 1: litert-quantizer 0.11.0 requires scipy, which is not installed."),
])
def test_a_failed_build_is_one_line_and_leaves_nothing(stand_in, monkeypatch, mode, step, reason):
    environment, python, tmp_path = stand_in
    monkeypatch.setenv("FAKE_PIP", mode)
    with pytest.raises(ToolEnvironmentError) as error:
        tool_env.ensure(environment, python)
    folder = tool_env.location(environment, "3.11")
    assert str(error.value) == (f"could not create the environment of the tools in {folder}: {step} failed "
                                f"({reason}); nothing was left there. Run the command again to retry, or set "
                                "TOOLS_PYTHON.")
    assert os.listdir(tmp_path / "home") == [os.path.basename(folder) + ".lock"]
    monkeypatch.setenv("FAKE_PIP", "ok")  # the next command tries again, and succeeds
    assert os.path.isfile(tool_env.ensure(environment, python))


def test_a_build_killed_midway_is_never_used_and_its_leftovers_go(stand_in):
    environment, python, tmp_path = stand_in
    folder = tool_env.location(environment, "3.11")
    name = os.path.basename(folder)
    os.makedirs(tmp_path / "home" / f".{name}.tmp-x1y2" / "bin")  # a killed build's temporary folder
    os.makedirs(tmp_path / "home" / "notes")  # the user's own folder
    os.makedirs(os.path.join(folder, "bin"))  # a folder without its stamp (not ours to trust)
    (tmp_path / "home" / name / "bin" / "python").write_text("")
    assert not tool_env._complete(folder, environment)
    with pytest.raises(ToolEnvironmentError):  # what is there is neither used nor overwritten
        tool_env.ensure(environment, python)
    assert sorted(os.listdir(tmp_path / "home")) == sorted([name, name + ".lock", "notes"])
    assert os.listdir(folder) == ["bin"]
    assert calls(tmp_path) == ["-c " + tool_env._VERSION_CODE]  # no build was started


def test_new_pins_get_a_new_folder_and_the_old_one_stays(stand_in):
    environment, python, tmp_path = stand_in
    old = tool_env.ensure(environment, python)
    with open(environment.requirements, "a") as f:
        f.write("numpy==2.4.6\n")
    new = tool_env.ensure(environment, python)
    assert new != old and os.path.isfile(old) and os.path.isfile(new)
    assert open(os.path.join(os.path.dirname(os.path.dirname(new)), "installed.txt")).read().endswith(
        "numpy==2.4.6\n")


def test_switched_off_it_is_not_created_but_an_existing_one_is_used(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    monkeypatch.setenv(tool_env.NO_INSTALL_ENV, "1")
    assert tool_env.ensure(environment, python) is None
    assert not (tmp_path / "home").exists()
    monkeypatch.setenv(tool_env.NO_INSTALL_ENV, "0")  # "0" and "" do not switch it off
    created = tool_env.ensure(environment, python)
    assert os.path.isfile(created)
    monkeypatch.setenv(tool_env.NO_INSTALL_ENV, "1")
    assert tool_env.ensure(environment, python) == created


def test_a_python_the_pins_have_no_wheels_for_is_refused_in_one_line(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    monkeypatch.setenv("FAKE_VERSION", "3.8")
    with pytest.raises(ToolEnvironmentError) as error:
        tool_env.ensure(environment, python)
    assert str(error.value) == "the tools need Python 3.11 or 3.12, and this is Python 3.8: set TOOLS_PYTHON."
    assert not (tmp_path / "home").exists()


def test_an_unwritable_cache_is_one_line_naming_the_variable(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(tool_env.HOME_ENV, str(tmp_path / "file" / "home"))
    with pytest.raises(ToolEnvironmentError) as error:
        tool_env.ensure(environment, python)
    message = str(error.value)
    assert message.startswith(f"could not create the environment of the tools in {tmp_path}/file/home/"
                              "tools-py311-")
    assert "Not a directory" in message and message.endswith(
        "set KERAS_POSENC_HOME to a writable folder, or set TOOLS_PYTHON.")


def test_two_commands_at_once_build_it_once(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    monkeypatch.setenv("FAKE_SLEEP", "1.5")
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("tool_env", {TOOL_ENV!r})
        tool_env = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tool_env)
        environment = tool_env.ToolEnvironment("tools", {environment.requirements!r}, "the tools", ("3.11",),
                                               "")
        print(tool_env.ensure(environment, {python!r}))
    """)
    first = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    while not any(call.startswith("-m pip") for call in calls(tmp_path)):  # the first one is building
        assert first.poll() is None
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    out, err = first.communicate(timeout=60)
    folder = tool_env.location(environment, "3.11")
    assert out.strip() == second.stdout.strip() == os.path.join(folder, "bin", "python")
    assert sum(call.startswith("-m venv") for call in calls(tmp_path)) == 1
    assert err.splitlines() == [f"keras-posenc: creating the environment of the tools in {folder} (once; "
                                "later commands reuse it)"]
    assert second.stderr.splitlines() == [f"keras-posenc: waiting for another command that is creating the "
                                          f"environment of the tools ({folder}.lock)"]


def block_buffered_stderr(monkeypatch):
    """A stderr that keeps what is written until it is flushed (a redirected one on Python 3.8): the bytes
    that reached its file."""
    written = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(written, encoding="utf-8"))
    return written


def creating(folder):
    return (f"keras-posenc: creating the environment of the tools in {folder} (once; later commands reuse "
            "it)\n")


def test_a_command_that_finds_the_lock_held_says_so_waits_and_uses_what_the_other_built(stand_in, monkeypatch,
                                                                                        capfd):
    environment, python, tmp_path = stand_in
    written = block_buffered_stderr(monkeypatch)
    folder = tool_env.location(environment, "3.11")
    waiting = (f"keras-posenc: waiting for another command that is creating the environment of the tools "
               f"({folder}.lock)\n")
    os.makedirs(tmp_path / "home")
    outcome = []

    def second_command():
        try:
            outcome.append(tool_env.ensure(environment, python))
        except Exception as error:  # the main thread asserts there was none
            outcome.append(error)

    second = threading.Thread(target=second_command, daemon=True)
    with open(folder + ".lock", "a") as lock:  # the first command holds the lock: it is building
        fcntl.flock(lock, fcntl.LOCK_EX)
        second.start()
        for _ in range(6000):  # until the second one's line is out (a guard against a hang, not a timing)
            if written.getvalue() or outcome:
                break
            time.sleep(0.01)
        assert (written.getvalue().decode(), outcome) == (waiting, [])  # it said so, and waits
        tool_env._build(folder, environment, python)  # the first command's build
    second.join(60)
    assert outcome == [os.path.join(folder, "bin", "python")]  # it used that one, and built none
    assert sum(call.startswith("-m venv") for call in calls(tmp_path)) == 1
    assert written.getvalue().decode() == waiting + creating(folder)
    assert capfd.readouterr().out == ""


def test_its_line_is_out_before_the_first_step_and_each_step_has_a_time_limit(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    written = block_buffered_stderr(monkeypatch)
    steps, real_run = [], subprocess.run

    def run_step(command, **options):  # what was on stderr's file when each step started
        steps.append((command[1:3], options.get("timeout"), written.getvalue().decode()))
        return real_run(command, **options)

    monkeypatch.setattr(subprocess, "run", run_step)
    tool_env.ensure(environment, python)
    line = creating(tool_env.location(environment, "3.11"))
    assert steps == [(["-c", tool_env._VERSION_CODE], 60, ""), (["-m", "venv"], 3600, line),
                     (["-m", "pip"], 3600, line), (["-m", "pip"], 3600, line)]


def test_this_python_is_not_asked_its_version_and_the_steps_run_without_its_path_variables(stand_in,
                                                                                            monkeypatch):
    environment, python, tmp_path = stand_in
    this = "{}.{}".format(*sys.version_info[:2])
    environment = dataclasses.replace(environment, pythons=(this,))
    monkeypatch.setattr(sys, "executable", python)  # the stand-in plays this Python
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONHOME", sys.base_prefix)
    monkeypatch.setenv("FAKE_KEPT", "1")
    created = tool_env.ensure(environment)
    assert created == os.path.join(tool_env.location(environment, this), "bin", "python")
    assert [call.split()[:2] for call in calls(tmp_path)] == [["-m", "venv"], ["-m", "pip"], ["-m", "pip"]]
    assert (tmp_path / "calls.log.env").read_text().splitlines() == ["", "", ""]  # neither, in each step


def test_a_python_that_does_not_run_is_one_line(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    missing = str(tmp_path / "gone" / "python")
    with pytest.raises(ToolEnvironmentError) as error:
        tool_env.ensure(environment, missing)
    assert str(error.value) == (f"the Python {missing!r} that would create the environment of the tools does "
                                f"not run: [Errno 2] No such file or directory: {missing!r}.")
    assert not (tmp_path / "home").exists()
    this = "{}.{}".format(*sys.version_info[:2])  # this Python, gone (not asked its version): venv fails
    environment = dataclasses.replace(environment, pythons=(this,))
    monkeypatch.setattr(sys, "executable", missing)
    with pytest.raises(ToolEnvironmentError) as error:
        tool_env.ensure(environment)
    folder = tool_env.location(environment, this)
    assert str(error.value) == (f"could not create the environment of the tools in {folder}: venv failed "
                                f"([Errno 2] No such file or directory: {missing!r}); nothing was left "
                                "there. Run the command again to retry, or set TOOLS_PYTHON.")
    assert os.listdir(tmp_path / "home") == [os.path.basename(folder) + ".lock"]


@pytest.mark.parametrize("pythons, said", [(("3.11",), "3.11"),
                                           (("3.10", "3.11", "3.12"), "3.10, 3.11 or 3.12")])
def test_the_refusal_names_every_python_the_pins_have_wheels_for(stand_in, monkeypatch, pythons, said):
    environment, python, tmp_path = stand_in
    monkeypatch.setenv("FAKE_VERSION", "3.8")
    with pytest.raises(ToolEnvironmentError) as error:
        tool_env.ensure(dataclasses.replace(environment, pythons=pythons), python)
    assert str(error.value) == f"the tools need Python {said}, and this is Python 3.8: set TOOLS_PYTHON."


def test_an_environment_without_its_python_or_with_a_stamp_of_other_pins_is_never_used(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    monkeypatch.setenv(tool_env.NO_INSTALL_ENV, "1")  # what is there is used, nothing is created
    folder = tool_env.location(environment, "3.11")
    os.makedirs(os.path.join(folder, "bin"))
    stamp = os.path.join(folder, tool_env.STAMP)
    with open(stamp, "w") as f:  # these pins, but no bin/python
        json.dump({"requirements": environment.pins(), "python": python}, f)
    assert tool_env.ensure(environment, python) is None
    with open(os.path.join(folder, "bin", "python"), "w"):
        pass
    with open(stamp, "w") as f:  # a bin/python, but the stamp of other pins
        json.dump({"requirements": "protobuf==4.25.3\n", "python": python}, f)
    assert tool_env.ensure(environment, python) is None
    with open(stamp, "w") as f:  # both: used
        json.dump({"requirements": environment.pins(), "python": python}, f)
    assert tool_env.ensure(environment, python) == os.path.join(folder, "bin", "python")


@pytest.mark.parametrize("left", ["no stamp", "no python"])
def test_an_incomplete_environment_is_kept_and_its_line_says_to_remove_it(stand_in, capfd, left):
    environment, python, tmp_path = stand_in
    folder = tool_env.location(environment, "3.11")
    os.makedirs(os.path.join(folder, "bin"))
    with open(os.path.join(folder, "notes.txt"), "w") as f:
        f.write("left by hand\n")
    if left == "no stamp":
        with open(os.path.join(folder, "bin", "python"), "w"):
            pass
    else:
        with open(os.path.join(folder, tool_env.STAMP), "w") as f:
            json.dump({"requirements": environment.pins(), "python": python}, f)
    before = sorted(os.listdir(folder))
    with pytest.raises(ToolEnvironmentError) as error:
        tool_env.ensure(environment, python)
    assert str(error.value) == (f"{folder} is not a complete environment of the tools (no stamp of these "
                                "pins, or no bin/python), so it is not used: remove it to have it created "
                                "again, or set TOOLS_PYTHON.")
    assert sorted(os.listdir(folder)) == before and capfd.readouterr().err == ""
    shutil.rmtree(folder)  # as the line says
    assert tool_env.ensure(environment, python) == os.path.join(folder, "bin", "python")
    assert tool_env._complete(folder, environment)


def test_the_base_python_is_asked_its_version_without_this_ones_path_variables(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONHOME", sys.base_prefix)
    tool_env.ensure(environment, python)
    assert calls(tmp_path)[0] == "-c " + tool_env._VERSION_CODE and len(calls(tmp_path)) == 4
    assert (tmp_path / "calls.log.env").read_text().splitlines() == ["", "", "", ""]


def undeletable(monkeypatch, name):
    """Files called `name` cannot be removed (another user's, in a shared cache)."""
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.path.basename(path) == name:
            raise PermissionError(13, "Permission denied", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)


def test_a_leftover_that_cannot_be_removed_does_not_stop_the_build(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    folder = tool_env.location(environment, "3.11")
    name = os.path.basename(folder)
    leftover = tmp_path / "home" / f".{name}.tmp-x1y2"  # a killed build's, that we may not remove
    os.makedirs(leftover / "bin")
    (leftover / "bin" / "undeletable").write_text("")
    undeletable(monkeypatch, "undeletable")
    assert tool_env.ensure(environment, python) == os.path.join(folder, "bin", "python")
    assert sorted(os.listdir(tmp_path / "home")) == sorted([name, name + ".lock", leftover.name])


def test_a_failed_build_whose_folder_cannot_be_removed_is_still_its_one_line(stand_in, monkeypatch):
    environment, python, tmp_path = stand_in
    monkeypatch.setenv("FAKE_PIP", "silent")
    undeletable(monkeypatch, "python")  # the temporary folder's bin/python stays
    with pytest.raises(ToolEnvironmentError) as error:
        tool_env.ensure(environment, python)
    folder = tool_env.location(environment, "3.11")
    assert str(error.value) == (f"could not create the environment of the tools in {folder}: pip install "
                                "failed (exit 3) (is the package index reachable from here?); nothing was "
                                "left there. Run the command again to retry, or set TOOLS_PYTHON.")
    assert not os.path.exists(folder)


def test_the_cache_folder_follows_the_variables(monkeypatch):
    monkeypatch.setenv(tool_env.HOME_ENV, "~/tools")
    assert tool_env.home() == os.path.expanduser("~/tools")
    monkeypatch.delenv(tool_env.HOME_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "/srv/cache")
    assert tool_env.home() == "/srv/cache/keras-posenc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/someone")
    assert tool_env.home() == "/home/someone/.cache/keras-posenc"


# The LiteRT Python ------------------------------------------------------------------------------

def test_without_the_tools_here_the_litert_python_is_created_from_the_shipped_pins(stand_in, monkeypatch,
                                                                                   no_litert_python_variables):
    _, python, tmp_path = stand_in
    monkeypatch.setattr(sys, "executable", python)  # the stand-in plays this Python
    created = litert_python.runtime_python(module="keras_posenc_no_such_module")
    folder = os.path.dirname(os.path.dirname(created))
    assert os.path.basename(folder).startswith("litert-python-py{}{}-".format(*sys.version_info[:2]))
    with open(os.path.join(folder, "installed.txt")) as f:
        assert f.read() == litert_python.ENVIRONMENT.pins()
    assert litert_python.runtime_python(module="json") == python  # a Python that has them: itself
    no_litert_python_variables.setenv(litert_python.PYTHON_ENV, "/bin/sh")  # the variable still wins
    assert litert_python.runtime_python(module="keras_posenc_no_such_module") == "/bin/sh"


def pins(text):
    """The `name==version` lines of a requirements text (markers dropped), sorted."""
    return sorted(line.split(";")[0].strip() for line in text.splitlines() if line.strip() and line[0] != "#")


def test_the_shipped_pins_are_the_edge_tests_and_the_keras3_lock_has_the_same_tools():
    shipped = pins(litert_python.ENVIRONMENT.pins())
    with open(os.path.join(ROOT, "tests", "edge", "runtime", "bootstrap.sh")) as f:
        edge = re.search(r'^LITERTLM_PINS="([^"]*)"', f.read(), re.M).group(1).split()
    assert shipped == sorted(edge)
    with open(os.path.join(ROOT, "requirements", "tf221.txt")) as f:
        keras3 = pins(f.read())
    for pin in litert_python.PACKAGES.split() + ["ai-edge-litert==2.3.0", "protobuf==7.36.2"]:
        assert pin in shipped and pin in keras3, pin


# One line from the command ----------------------------------------------------------------------

def test_a_litert_python_that_cannot_be_created_is_one_line_from_the_command(stand_in, exports, monkeypatch,
                                                                              capsys):
    _, python, tmp_path = stand_in
    monkeypatch.setattr(sys, "executable", python)
    monkeypatch.setenv("FAKE_PIP", "fail")
    code, lines, err = run(capsys, "export", "model.keras", "--out", str(tmp_path / "m.tflite"),
                           "--sequence-length", "8", "--quantize", "int4", "--target", "cpu")
    folder = tool_env.location(litert_python.ENVIRONMENT, "{}.{}".format(*sys.version_info[:2]))
    assert (code, lines) == (2, [])
    what = litert_python.ENVIRONMENT.what
    assert err == [f"keras-posenc: creating the environment of {what} in {folder} (once; later commands "
                   "reuse it)",
                   f"keras-posenc: error: could not create the environment of {what} in {folder}: pip "
                   f"install failed (exit 1: {NOT_FOUND}) (is the package index reachable from here?); "
                   "nothing was left there. Run the command again to retry, or set "
                   "KERAS_POSENC_LITERT_PYTHON to a Python that has them (or pass --litert-python)."]
    assert "export_and_check" not in exports
    assert not os.path.exists(tmp_path / "m.tflite")


def test_without_tf2onnx_the_tensorrt_export_is_one_line(exports, monkeypatch, capsys, tmp_path):
    for module in ("onnxruntime", "tf2onnx"):  # not importable
        monkeypatch.setitem(sys.modules, module, None)

    def export_and_check(model, **options):
        onnx_tools.import_tf2onnx()

    monkeypatch.setattr("keras_posenc.export.export_and_check", export_and_check)
    code, lines, err = run(capsys, "export", "model.keras", "--out", str(tmp_path / "m.onnx"),
                           "--sequence-length", "8", "--target", "tensorrt")
    assert (code, lines) == (2, [])
    assert err == ["keras-posenc: error: --target tensorrt needs tf2onnx and onnxruntime (import of "
                   "onnxruntime halted; None in sys.modules), which the locks install: pip install -r "
                   "requirements/tf212.txt (TF 2.12) or requirements/tf221.txt (Keras 3), or pip install "
                   "tf2onnx==1.17.0 onnx onnxruntime==1.23.2."]


def test_on_python_3_8_the_tensorrt_message_says_why_the_lock_has_no_tf2onnx():
    message = onnx_tools.missing_message(ImportError("No module named 'tf2onnx'"), (3, 9))
    assert message == (
        "--target tensorrt needs tf2onnx (No module named 'tf2onnx'), which the TF 2.12 lock installs on "
        "Python 3.10+ only: tf2onnx 1.17 needs Python 3.10, and 1.16.1, the last release for Python 3.9, "
        "pins protobuf~=3.20, which TF 2.12's lock (protobuf 4.25) excludes; export from a Python 3.10+ venv "
        "(make venv).")
    assert onnx_tools.missing_message(ImportError("x"), (3, 10)) == (
        "--target tensorrt needs tf2onnx and onnxruntime (x), which the locks install: pip install -r "
        "requirements/tf212.txt (TF 2.12) or requirements/tf221.txt (Keras 3), or pip install "
        "tf2onnx==1.17.0 onnx onnxruntime==1.23.2.")
