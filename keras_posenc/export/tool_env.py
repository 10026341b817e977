"""Tool environments: pinned virtual environments that keras-posenc creates on first use and keeps.

A tool of the exporter that cannot live beside this Python's TensorFlow (LiteRT's tools need
protobuf >= 6.31, the TF 2.12 lock has 4.25) runs in a virtual environment of its own, made from
a pinned requirements file shipped with the package. `ensure` returns that environment's Python,
creating it the first time, as pre-commit creates its hook environments:

- where: `$KERAS_POSENC_HOME`, else `$XDG_CACHE_HOME/keras-posenc`, else `~/.cache/keras-posenc`;
  one folder per environment, Python version and pin list (`litert-python-py311-<hash>`), so new
  pins get a new folder and an old one is never changed;
- said in one line on stderr when it starts;
- atomically: built in a temporary folder beside the final one (`python -m venv`, then
  `pip install --no-deps -r PINS` and `pip check`), renamed into place once complete; a failure
  (no network, a pin pip cannot find) removes the temporary folder and raises
  `ToolEnvironmentError` with one line, so no half-built environment is ever used;
- once: a lock file makes a second command wait for the first one's build, then use it;
- whole: a folder without its stamp or its Python (files removed by hand or by a cleaner) is never
  used, nor removed: its one line says to remove it;
- never, with `$KERAS_POSENC_NO_TOOL_INSTALL=1` (offline machines, tests): `ensure` returns None.
"""

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["HOME_ENV", "NO_INSTALL_ENV", "ToolEnvironment", "ToolEnvironmentError", "ensure", "home",
           "location"]

HOME_ENV = "KERAS_POSENC_HOME"
NO_INSTALL_ENV = "KERAS_POSENC_NO_TOOL_INSTALL"
STAMP = "keras-posenc-environment.json"
_VERSION_CODE = "import sys; print('%d.%d' % sys.version_info[:2])"


class ToolEnvironmentError(OSError):
    """A tool environment could not be had: its one-line message says why and what to do.

    An `OSError` (Python's `EnvironmentError`): the command line prints it as one line.
    """


@dataclasses.dataclass(frozen=True)
class ToolEnvironment:
    """A virtual environment of pinned tools.

    Attributes:
        name: str, the folder's prefix under the cache (`litert-python`).
        requirements: str, the path of its pinned requirements file (every package `==`, the whole
            resolved set: it is installed with `--no-deps`).
        what: str, the tools in words, for the messages.
        pythons: tuple of "X.Y", the Python versions its pins have wheels for.
        override: str, how to bring a Python of one's own instead, for the messages.
    """

    name: str
    requirements: str
    what: str
    pythons: tuple
    override: str

    def pins(self):
        """The text of the requirements file."""
        with open(self.requirements) as f:
            return f.read()


def home():
    """The folder of the tool environments: `$KERAS_POSENC_HOME`, else `$XDG_CACHE_HOME/keras-posenc`,
    else `~/.cache/keras-posenc`."""
    if os.environ.get(HOME_ENV):
        return os.path.abspath(os.path.expanduser(os.environ[HOME_ENV]))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(cache), "keras-posenc")


def location(environment, version):
    """The folder of `environment` for Python `version` ("3.11"): its name, version and pin hash."""
    digest = hashlib.sha256(environment.pins().encode()).hexdigest()[:12]
    return os.path.join(home(), f"{environment.name}-py{version.replace('.', '')}-{digest}")


def ensure(environment, base_python=None):
    """The Python of `environment`, created from `base_python` (default: this one) on first use.

    Args:
        environment: a `ToolEnvironment`.
        base_python: str, the interpreter whose `venv` module makes it (default `sys.executable`).

    Returns:
        str, the path of the environment's `bin/python`; None when `$KERAS_POSENC_NO_TOOL_INSTALL`
        is set (to anything but "" or "0") and the environment does not exist yet.

    Raises:
        ToolEnvironmentError: `base_python` is a Python the pins have no wheels for, or `venv`,
            pip or `pip check` failed (the message names the folder and pip's last line).
    """
    base_python = base_python or sys.executable
    version = _version(base_python, environment)
    if version not in environment.pythons:
        *others, last = environment.pythons
        pythons = f"{', '.join(others)} or {last}" if others else last
        raise ToolEnvironmentError(f"{environment.what} need Python {pythons}, and this is Python {version}: "
                                   f"{environment.override}.")
    folder = location(environment, version)
    if _complete(folder, environment):
        return _python(folder)
    if os.environ.get(NO_INSTALL_ENV, "") not in ("", "0"):
        return None
    try:
        os.makedirs(home(), exist_ok=True)
        with _locked(folder, environment):
            if not _complete(folder, environment):  # another command may have built it meanwhile
                _build(folder, environment, base_python)
    except ToolEnvironmentError:
        raise
    except OSError as error:  # an unwritable cache folder, a full disk
        raise ToolEnvironmentError(f"could not create the environment of {environment.what} in {folder}: "
                                   f"{error}; set {HOME_ENV} to a writable folder, or "
                                   f"{environment.override}.") from error
    return _python(folder)


def _version(python, environment):
    if python == sys.executable:
        return "{}.{}".format(*sys.version_info[:2])
    try:
        done = subprocess.run([python, "-c", _VERSION_CODE], capture_output=True, text=True, env=_clean_env(),
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolEnvironmentError(f"the Python {python!r} that would create the environment of "
                                   f"{environment.what} does not run: {error}.") from error
    return done.stdout.strip()


def _python(folder):
    return os.path.join(folder, "bin", "python")


def _complete(folder, environment):
    """`folder` holds the environment of exactly these pins (its stamp is written last)."""
    try:
        with open(os.path.join(folder, STAMP)) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return False
    return stamp.get("requirements") == environment.pins() and os.path.isfile(_python(folder))


class _locked:
    """An exclusive `flock` on `FOLDER.lock` for the build (says so when another command holds it)."""

    def __init__(self, folder, environment):
        self.path, self.environment = folder + ".lock", environment

    def __enter__(self):
        self.file = open(self.path, "a")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"keras-posenc: waiting for another command that is creating the environment of "
                  f"{self.environment.what} ({self.path})", file=sys.stderr, flush=True)
            fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info):
        self.file.close()  # releases the lock


def _build(folder, environment, base_python):
    """Builds the environment in a temporary folder beside `folder`, then renames it into place."""
    parent, name = os.path.split(folder)
    for stale in os.listdir(parent):  # left by a build that was killed (we hold the lock: none runs)
        if stale.startswith(f".{name}.tmp-"):
            shutil.rmtree(os.path.join(parent, stale), ignore_errors=True)
    if os.path.lexists(folder):  # not what a build of these pins leaves: perhaps not ours to remove
        raise ToolEnvironmentError(f"{folder} is not a complete environment of {environment.what} (no stamp "
                                   f"of these pins, or no bin/python), so it is not used: remove it to have "
                                   f"it created again, or {environment.override}.")
    print(f"keras-posenc: creating the environment of {environment.what} in {folder} (once; later "
          f"commands reuse it)", file=sys.stderr, flush=True)
    building = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        _run(environment, folder, [base_python, "-m", "venv", "--clear", building], "venv")
        python = _python(building)
        pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
        _run(environment, folder, pip + ["install", "--quiet", "--no-deps", "-r", environment.requirements],
             "pip install")
        _run(environment, folder, pip + ["check"], "pip check")
        with open(os.path.join(building, STAMP), "w") as f:
            json.dump({"requirements": environment.pins(), "python": base_python}, f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(building, 0o777 & ~umask)  # as any folder of the user's (mkdtemp made it 0700)
        os.rename(building, folder)
    finally:
        if os.path.isdir(building):
            shutil.rmtree(building, ignore_errors=True)


def _clean_env():
    """This process's environment without the variables that would point another Python at this one's
    packages or prefix."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}


def _run(environment, folder, command, step):
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=_clean_env(), timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as error:
        reason = str(error)
    else:
        if done.returncode == 0:
            return
        lines = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines()
                 if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines
        reason = f"exit {done.returncode}" + (f": {errors[-1]}" if errors else "")
    hint = " (is the package index reachable from here?)" if step == "pip install" else ""
    raise ToolEnvironmentError(f"could not create the environment of {environment.what} in {folder}: "
                               f"{step} failed ({reason}){hint}; nothing was left there. Run the command "
                               f"again to retry, or {environment.override}.")
