"""Checks that the Docker image, the lock and setup.cfg agree (no TensorFlow import needed).

requirements/tf212.txt is the one source of truth: docker/Dockerfile must install exactly that
list plus the package (with --no-deps), on a base image whose TensorFlow is the one the lock pins,
and the ranges in setup.cfg must admit every pin. ``check_docker_lock`` returns every
disagreement; tests/test_docker_lock.py runs it on the real files and on one-sided edits.

    python tools/check_docker_lock.py     # prints the disagreements; exit status 1 if any
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
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


def main() -> int:
    problems = check_docker_lock(DOCKERFILE, LOCK, SETUP_CFG, BENCH_LOCK)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{DOCKERFILE.relative_to(ROOT)}, {LOCK_IN_REPO} and setup.cfg agree.")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
