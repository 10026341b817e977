"""Mutation testing of one module against the tests that cover it (`make mutation MODULE=...`).

    python tools/mutation.py keras_posenc/layers/rope_scaling.py          # run, then report
    python tools/mutation.py keras_posenc/layers/rope_scaling.py --report # report the last run
    python tools/mutation.py keras_posenc/layers/rope_scaling.py --resume # go on with the last run
    python tools/mutation.py keras_posenc/layers/rope_scaling.py --survivors  # re-test its survivors
    python tools/mutation.py keras_posenc/app/train.py --save     # keep the last run's results
    python tools/mutation.py keras_posenc/layers/rotary_embedding.py --jax  # survivors, on JAX
    python tools/mutation.py keras_posenc/export/litertlm_bundle.py --only probe_texts  # one function
    python tools/mutation.py --list                                       # the modules configured

tools/mutation.toml names, per module, the test files that cover it (or single tests,
`tests/test_x.py::test_name`, where a file's other tests are too slow to run per mutant) and the
surviving mutants that are equivalent (with the reason). The run happens in a copy of the package
and the tests, .cache/mutation/<module>/ (mutmut then mutates its own copy, mutants/, inside it):
TensorFlow's autograph re-reads source files while it traces, so nothing the tool writes may touch
the checkout. mutmut runs with one worker (`--children 1`; more run mutants side by side, one
core each), each mutant against only the configured tests that executed the mutated function; a
function that a module- or session-scoped fixture calls counts as executed by every test using the
fixture (FixtureHits: mutmut alone credits it to the first such test, whose setup ran it).
`--resume` and `--survivors` keep the work dir and its results, copy the current package, tests and
configured test selection into it and run the mutants not yet tested, or again the ones that
survived (after tests were added) and are not listed as equivalent. If the module changed since,
mutmut compares each function's hash with the one its results were measured on: the mutants of the
functions that changed are made and run again, the others keep their results. `--only NAME...`
runs (and reports) only the mutants of the named functions (`probe_texts`, or `Class.method`):
after a change to a few functions of a module whose full run takes hours, those functions' mutants
are the new ones. A change to a module's `tests` list makes mutmut reset all of its results (a new
test selection can map other tests to each function): `--resume` then runs every mutant again, and
`--survivors` only the survivors, leaving the rest not run. Tests added to files already listed
keep the results.

A run longer than a machine lasts goes on elsewhere: `--save` writes the work dir's results to
benchmarks/results/mutation/<module>.json (committed): each mutant's exit status, mutmut's hash of
each function and the commits whose tests produced them. `--resume` or `--survivors` on a machine
without the work dir starts from that file: mutmut keeps the saved statuses of the functions whose
hash is unchanged and runs the mutants not yet run (or the survivors), as in its own work dir.
`--report` without a work dir reports the saved results, if the module is the one they were
measured on (by its SHA-256).

mutmut runs the tests on the Keras 2 stack (.venv), where the branches for other backends never run.
A module with `jax_tests` in its table can have its survivors re-tested on Keras 3's JAX backend
(`--jax`: .venv-keras3, KERAS_BACKEND=jax, each survivor against all of `jax_tests`, stopping at the
first failure); a survivor those tests kill counts as killed (jax_results.json in the work dir).

The report: killed (timeouts count as killed), survived, no tests (mutants in code that no
configured test runs: counted as survivors), equivalent, not run yet (an interrupted run), and the
score killed / (run - equivalent). Exit status 1 when a mutant survives that is not listed as
equivalent, when an equivalent one listed is no longer a survivor (the list is stale), or when
mutants were not run.
"""

import argparse
import configparser
import fnmatch
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
# The device kit: its modules import each other by bare name (`from kit_contract import fail`), as
# on the device, so their mutants are named by bare module name too (`kit_contract.x_fail__mutmut_1`).
KIT = "export/jetson"
CONFIG = ROOT / "tools" / "mutation.toml"
WORK = ROOT / ".cache" / "mutation"
MUTMUT_SITE = ROOT / ".cache" / "mutmut-site"
SAVED = ROOT / "benchmarks" / "results" / "mutation"
# mutmut: test failure, pytest internal error, timeouts (SIGXCPU, then SIGKILL after the CPU-time limit's
# grace second), a crash (SIGSEGV)
KILLED = {1, 3, 24, -24, 152, 255, 36, -9, -11}
SURVIVED = {0}
NO_TESTS = {5, 33}


def load_config():
    with open(CONFIG, "rb") as f:
        return tomllib.load(f)["modules"]


def work_dir(module):
    return WORK / module.replace("/", "__").removesuffix(".py")


def _checked_tests(module, tests):
    missing = [t for t in tests if not (ROOT / t.split("::")[0]).is_file()]
    if missing:
        sys.exit(f"error: {CONFIG.relative_to(ROOT)}: {module}: no such test file: {', '.join(missing)}")
    return tests


def _survivors(codes):
    """The mutants that were run and not killed."""
    return sorted(k for k, c in codes.items() if c is not None and c not in KILLED)


def prepare(module, entry, commits=()):
    """A fresh copy of the package, the tests and setup.cfg with the module's [mutmut] section; its
    results come from `commits` (a saved run's) and the checkout's."""
    work = work_dir(module)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "keras_posenc", work / "keras_posenc", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    shutil.copytree(ROOT / "export", work / "export", ignore=ignore)  # the device kit, which tests run
    shutil.copytree(ROOT / "tools", work / "tools", ignore=ignore)  # the corpus builder, which tests run
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    cfg["mutmut"] = {
        "source_paths": "keras_posenc" + ("\n" + KIT if module.startswith(KIT + "/") else ""),
        "only_mutate": module,
        "also_copy": "\ntests\nexport\ntools\nsetup.cfg",
        "pytest_add_cli_args_test_selection": "\n" + "\n".join(_checked_tests(module, entry["tests"])),
        "pytest_add_cli_args": "\n-p\nno:cacheprovider",
        "use_git_change_detection": "false",
        # TensorFlow's runtime does not survive a fork once it has run ops (its thread pools stay in
        # the parent): the fork server forks every mutant from a process that has only imported
        # the test modules (pytest --collect-only), and the stats and clean runs run in children.
        "process_isolation": "forkserver",
        "forkserver_warmup": "collect",
    }
    # The [tool:pytest] of the package stays (markers, filterwarnings); doctests are not run.
    if cfg.has_section("tool:pytest"):
        cfg.remove_option("tool:pytest", "addopts")
    with open(work / "setup.cfg", "w", encoding="utf-8") as f:
        cfg.write(f)
    record_commit(work, commits)
    return work


def refresh_tests(module, entry):
    """The last run's work dir with the checkout's current package, tests and test selection."""
    work = work_dir(module)
    copy = work / module
    if not copy.is_file():
        return start_from_saved(module, entry)
    if copy.read_bytes() != (ROOT / module).read_bytes():
        print(f"{module} changed since its last run: the mutants of the functions that changed run again")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("keras_posenc", "tests", KIT, "tools"):
        shutil.rmtree(work / folder, ignore_errors=True)
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, work / folder, ignore=ignore)
    # mutmut makes a module's mutants again only if the module is newer than them; it then keeps
    # the results of each function whose hash is unchanged.
    copy.touch()
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(work / "setup.cfg")
    selection = _checked_tests(module, entry["tests"])
    cfg["mutmut"]["pytest_add_cli_args_test_selection"] = "\n" + "\n".join(selection)
    with open(work / "setup.cfg", "w", encoding="utf-8") as f:
        cfg.write(f)
    record_commit(work, _commits(work))
    return work


# `python -m mutmut`, with its trampolines (the wrapper of each mutated function) given their
# function's signature as `__signature__`. Keras 2 reads a layer's call arguments with
# `inspect.getfullargspec`, which does not follow a wrapper's `__wrapped__` and so sees `(*args,
# **kwargs)`: keyword calls (`layer(inputs=x)`) then fail in every test. `__signature__` it reads.
# mutmut forks its fork server and every test run from this process, so they all see the patch.
LAUNCHER = """
import inspect, sys
from mutmut.mutation import trampoline
wrap_in_trampoline = trampoline.wrap_in_trampoline
def with_signature(*args, **kwargs):
    decorate = wrap_in_trampoline(*args, **kwargs)
    def decorator(function):
        wrapper = decorate(function)
        wrapper.__signature__ = inspect.signature(function)
        return wrapper
    return decorator
trampoline.wrap_in_trampoline = with_signature
# The device kit's modules are imported by bare name (their folder is on sys.path, as on the device):
# their mutants are named so, or the trampolines, which compare __module__, would never switch them.
import os
from pathlib import Path
from mutmut.utils import format_utils
path_named = format_utils.get_mutant_name
def get_mutant_name(relative_source_path, mutant_method_name):
    path = Path(relative_source_path)
    if path.parent.as_posix() == KIT:
        path = Path(path.name)
    return path_named(path, mutant_method_name)
format_utils.get_mutant_name = get_mutant_name
import mutmut.__main__, mutmut.mutation.file_mutation
mutmut.__main__.get_mutant_name = mutmut.mutation.file_mutation.get_mutant_name = get_mutant_name
# The stats run (the one pytest run given plugins that runs tests) credits a wide fixture's calls
# to every test using it (FixtureHits, from this tool, copied into the work dir's tools/).
sys.path.insert(0, "tools")
from mutation import FixtureHits
from mutmut.runners.harness import PytestRunner
from mutmut.state import state
execute_pytest = PytestRunner.execute_pytest
def with_fixture_hits(self, params, **kwargs):
    if kwargs.get("plugins"):
        kwargs["plugins"] = [*kwargs["plugins"], FixtureHits(state)]
    return execute_pytest(self, params, **kwargs)
PytestRunner.execute_pytest = with_fixture_hits
from mutmut.__main__ import cli
sys.argv[0] = "mutmut"
cli()
"""


class FixtureHits:
    """A pytest plugin for mutmut's stats run: the mutated functions that a fixture wider than one
    test (module, class, package or session scope) calls while it is set up are credited to every
    test that uses it. mutmut credits them to the test during whose setup they ran, the first one
    that uses the fixture, so a mutant of a function that only such a fixture calls would run
    against that one test and survive the tests that would kill it.

    `state` is mutmut's `state` function; its `_stats` is the set of functions hit since the last
    test's teardown, which mutmut's own teardown hook reads and clears.
    """

    def __init__(self, state):
        self.state = state
        self.hits_by_fixture = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        outer = self.state()._stats
        self.state()._stats = set()
        try:
            yield
        finally:
            hits = self.state()._stats
            self.state()._stats = outer | hits
            if fixturedef.scope != "function":
                self.hits_by_fixture.setdefault(fixturedef, set()).update(hits)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem):
        for definitions in item._fixtureinfo.name2fixturedefs.values():
            for fixturedef in definitions:
                self.state()._stats |= self.hits_by_fixture.get(fixturedef, set())


def _mutant_env(**settings):
    """The environment of a test run under mutmut: its site (the trampolines import it) on the path."""
    env = dict(os.environ, PYTHONPATH=str(MUTMUT_SITE), **settings)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_mutmut(work, names=(), children=1):
    env = _mutant_env()
    env.setdefault("EDGE_CACHE", str(ROOT / ".edge-cache"))  # tests/edge/ files configured for a module
    launcher = f"KIT = {KIT!r}\n" + LAUNCHER
    return subprocess.call([sys.executable, "-c", launcher, "run", "--max-children", str(children), *names],
                           cwd=work, env=env)


def only_patterns(module, functions):
    """mutmut's name patterns of the mutants of `functions` (`name` or `Class.method`) in `module`
    (a kit module's mutants are named by its bare module name, as the launcher names them)."""
    path = Path(module)
    dotted = path.stem if path.parent.as_posix() == KIT else module.removesuffix(".py").replace("/", ".")
    patterns = []
    for function in functions:
        owner, _, name = function.rpartition(".")
        patterns.append(f"{dotted}.x{'ǁ' + owner + 'ǁ' if owner else '_'}{name}__mutmut_*")
    return patterns


def _matches(name, patterns):
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def _matching(codes, patterns):
    return {k: c for k, c in codes.items() if _matches(k, patterns)}


def meta_path(work, module):
    """mutmut's results of the module's run in `work`: exit status by mutant, hash by function."""
    return work / "mutants" / (module + ".meta")


def results(work, module):
    meta = meta_path(work, module)
    if not meta.is_file():
        saved = saved_results(module)
        if saved is not None:
            if saved["module_sha256"] != _sha256(ROOT / module):
                sys.exit(f"error: {saved_path(module).relative_to(ROOT)} holds the results of another "
                         f"version of {module}: --resume runs the functions that changed")
            commits = ", ".join(saved["commits"])
            print(f"saved results: {saved_path(module).relative_to(ROOT)} (commits {commits})")
            return saved["exit_code_by_key"]
        sys.exit(f"error: no results for {module} ({meta.relative_to(ROOT)} missing): run it first")
    with open(meta, encoding="utf-8") as f:
        return json.load(f)["exit_code_by_key"]


def saved_path(module):
    return SAVED / (work_dir(module).name + ".json")


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def saved_results(module):
    """The saved results of `module` (`--save`), None if there are none."""
    path = saved_path(module)
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _git_head():
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _commits_path(work):
    return work / "commits.json"


def _commits(work):
    path = _commits_path(work)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def record_commit(work, commits):
    """`commits` and the checkout's commit: the commits whose tests produced the results in `work`."""
    head = _git_head()
    commits = list(commits) + ([] if head in commits else [head])
    _commits_path(work).write_text(json.dumps(commits), encoding="utf-8")


def _mutmut_version():
    for dist in importlib.metadata.distributions(path=[str(MUTMUT_SITE)]):
        if dist.metadata["Name"] == "mutmut":
            return dist.version
    return "unknown"


def save(module, work):
    """The results in `work` into benchmarks/results/mutation/<module>.json, for `--resume` elsewhere."""
    with open(meta_path(work, module), encoding="utf-8") as f:
        meta = json.load(f)
    record = {
        "module": module,
        "module_sha256": _sha256(work / module),
        "mutmut": _mutmut_version(),
        "commits": _commits(work),
        "hash_by_function_name": meta["hash_by_function_name"],
        "exit_code_by_key": meta["exit_code_by_key"],
    }
    path = saved_path(module)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    print(f"saved {sum(c is not None for c in record['exit_code_by_key'].values())} results of "
          f"{len(record['exit_code_by_key'])} mutants to {path.relative_to(ROOT)}")


def start_from_saved(module, entry):
    """A fresh work dir whose mutmut results are the saved ones: mutmut keeps those of unchanged functions."""
    saved = saved_results(module)
    if saved is None:
        sys.exit(f"error: no earlier run of {module} to go on with (no work dir, no "
                 f"{saved_path(module).relative_to(ROOT)}): run it without --resume first")
    work = prepare(module, entry, saved["commits"])
    meta = meta_path(work, module)
    meta.parent.mkdir(parents=True)
    with open(meta, "w", encoding="utf-8") as f:
        json.dump({"exit_code_by_key": saved["exit_code_by_key"],
                   "hash_by_function_name": saved["hash_by_function_name"],
                   "type_check_error_by_key": {}, "durations_by_key": {},
                   "estimated_durations_by_key": {}}, f)
    print(f"going on from {saved_path(module).relative_to(ROOT)} (commits {', '.join(saved['commits'])})")
    if saved["module_sha256"] != _sha256(ROOT / module):
        print(f"{module} changed since: the mutants of the functions that changed run again")
    return work


JAX_PYTHON = ROOT / ".venv-keras3" / "bin" / "python"


def jax_results_path(work):
    return work / "jax_results.json"


def jax_results(work, codes):
    """Exit statuses of the survivors re-tested on JAX, for the mutants as they are now."""
    path = jax_results_path(work)
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    survivors = set(_survivors(codes))
    return {k: c for k, c in saved.items() if k in survivors}


def run_jax(module, entry, work, codes):
    """Each survivor that is not listed as equivalent, against `jax_tests` on the JAX backend."""
    tests = entry.get("jax_tests")
    if not tests:
        sys.exit(f"error: {CONFIG.relative_to(ROOT)}: {module} has no `jax_tests`")
    if not JAX_PYTHON.is_file():
        sys.exit(f"error: {JAX_PYTHON.relative_to(ROOT)} missing: run `make venv-keras3` first")
    _checked_tests(module, tests)
    equivalent = entry.get("equivalent", {})
    names = [k for k in _survivors(codes) if k not in equivalent]
    env = _mutant_env(KERAS_BACKEND="jax")
    saved = {}
    for number, name in enumerate(names, 1):
        env["MUTANT_UNDER_TEST"] = name
        status = subprocess.call([str(JAX_PYTHON), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                  *tests], cwd=work / "mutants", env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        saved[name] = status
        print(f"  [{number}/{len(names)}] {'killed' if status == 1 else f'exit {status}'} on JAX: {name}")
    with open(jax_results_path(work), "w", encoding="utf-8") as f:
        json.dump(saved, f, indent=1, sort_keys=True)


def report(module, entry, codes, on_jax=None, only=None):
    equivalent = dict(entry.get("equivalent", {}))
    if only:
        codes = _matching(codes, only)
        equivalent = _matching(equivalent, only)
        print(f"only the mutants of {len(only)} function(s): {', '.join(only)}")
    on_jax = on_jax or {}
    codes = {k: (1 if on_jax.get(k) == 1 else c) for k, c in codes.items()}
    untested = sorted(k for k, c in codes.items() if c is None)
    killed = sorted(k for k, c in codes.items() if c in KILLED)
    survived = _survivors(codes)
    unexplained = [k for k in survived if k not in equivalent]
    stale = sorted(k for k in equivalent if k not in survived and k not in untested)
    tested = len(codes) - len(untested)
    counted = tested - len(equivalent.keys() & set(survived))
    score = 100.0 * len(killed) / counted if counted else 100.0
    by_jax = sum(1 for c in on_jax.values() if c == 1)
    print(f"\n{module}: {len(killed)} killed / {counted} counted ({len(codes)} mutants, "
          f"{tested - counted} equivalent, {len(untested)} not run yet): score {score:.1f}%"
          + (f"; {by_jax} of the killed on the JAX backend (--jax)" if by_jax else ""))
    if untested:
        print(f"  incomplete: {len(untested)} mutants not run yet (--resume goes on)")
    for name in unexplained:
        status = "no tests" if codes[name] in NO_TESTS else ("survived" if codes[name] in SURVIVED
                                                            else f"exit {codes[name]}")
        print(f"  {status}: {name}")
    for name in stale:
        print(f"  listed as equivalent but {'killed' if name in codes else 'not a mutant'}: {name}")
    print(f"| `{module}` | {len(killed)} / {counted} | {score:.1f}% | {tested - counted} | {len(untested)} |")
    return 1 if unexplained or stale or untested else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", nargs="?", help="e.g. keras_posenc/layers/rope_scaling.py")
    parser.add_argument("--report", action="store_true", help="only report the last run's results")
    parser.add_argument("--resume", action="store_true", help="go on with the last run (same module source)")
    parser.add_argument("--survivors", action="store_true", help="re-test the last run's survivors")
    parser.add_argument("--jax", action="store_true",
                        help="re-test the last run's survivors on Keras 3's JAX backend (`jax_tests`)")
    parser.add_argument("--only", nargs="+", metavar="FUNCTION",
                        help="run and report only the mutants of these functions (`name` or `Class.method`)")
    parser.add_argument("--children", type=int, default=1, metavar="N",
                        help="mutants tested side by side (default 1; at most one per core)")
    parser.add_argument("--save", action="store_true",
                        help="write the results to benchmarks/results/mutation/: after --resume or "
                             "--survivors their run's, else the last run's, without running anything")
    parser.add_argument("--list", action="store_true", help="list the configured modules")
    args = parser.parse_args(argv)
    if args.children < 1:
        parser.error(f"--children must be 1 or more, got {args.children}")
    modules = load_config()
    if args.list or not args.module:
        for name, entry in modules.items():
            print(f"{name}: {' '.join(entry['tests'])}")
        return 0
    if args.module not in modules:
        sys.exit(f"error: {args.module} is not in {CONFIG.relative_to(ROOT)}; configured: "
                 + ", ".join(modules))
    entry = modules[args.module]
    work = work_dir(args.module)
    only = only_patterns(args.module, args.only) if args.only else None
    # `--save` alone saves the last run's results; with --resume or --survivors, after that run.
    runs_mutmut = not args.report and (args.resume or args.survivors or not args.save)
    if args.jax:
        run_jax(args.module, entry, work, results(work, args.module))
    elif runs_mutmut:
        names = ()
        if args.resume or args.survivors:
            work = refresh_tests(args.module, entry)
            if args.survivors:
                # The equivalent ones stay survivors by definition: a fresh run re-checks them.
                equivalent = entry.get("equivalent", {})
                names = [name for name in _survivors(results(work, args.module)) if name not in equivalent]
                if not names:
                    print("no survivors to re-test")
        else:
            work = prepare(args.module, entry)
        if only:  # with --survivors: those of the functions; else every mutant of the functions
            names = [name for name in names if _matches(name, only)] if args.survivors else only
        status = run_mutmut(work, names, args.children) if names or not (args.survivors or only) else 0
        if status != 0:
            print(f"error: mutmut exited with status {status}", file=sys.stderr)
            return status
    if args.save:
        if not meta_path(work, args.module).is_file():
            sys.exit(f"error: no results of {args.module} in {work.relative_to(ROOT)} to save: run it first")
        save(args.module, work)
    codes = results(work, args.module)
    return report(args.module, entry, codes, jax_results(work, codes), only)


if __name__ == "__main__":
    sys.exit(main())
