"""tools/mutation.py's saved results: what `--save` writes, what a `--resume` elsewhere starts from.

A module whose mutation run takes longer than a machine lasts is finished over several: the saved
file must carry every status and function hash mutmut keeps; a resume of a changed module goes on
from it (mutmut compares the functions' hashes), a report does not stand for another version.
"""

import hashlib
import importlib.util
import json
import os
import re
import sys
import types
from pathlib import Path

import pytest
from stacks import once_on_keras2

pytestmark = once_on_keras2("`make mutation` runs on .venv, the Keras 2 stack, and nowhere else")

REPO = Path(__file__).resolve().parent.parent
MODULE = "keras_posenc/m.py"
ENTRY = {"tests": ["tests/test_m.py"]}
CODES = {"keras_posenc.m.x_f__mutmut_1": 1, "keras_posenc.m.x_f__mutmut_2": 0,
         "keras_posenc.m.x_g__mutmut_1": None}
HASHES = {"x_f": "8014803b59a4", "x_g": "21ea6b5cc167"}
# The keys of mutmut 3.8.1's `.meta` files: it refuses a file with others and needs all of them.
MUTMUT_META_KEYS = {"exit_code_by_key", "hash_by_function_name", "type_check_error_by_key",
                    "durations_by_key", "estimated_durations_by_key"}


@pytest.fixture
def tool(tmp_path, monkeypatch):
    """The tool on a checkout of one module and one test file, at commit `abc`."""
    spec = importlib.util.spec_from_file_location("mutation_tool", REPO / "tools" / "mutation.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    root = tmp_path / "checkout"
    for folder in ("keras_posenc", "tests", "export", "tools"):
        (root / folder).mkdir(parents=True)
    (root / MODULE).write_text("def f():\n    return 1\n")
    (root / "tests" / "test_m.py").write_text("def test_f():\n    pass\n")
    (root / "setup.cfg").write_text("[tool:pytest]\naddopts = --doctest-modules\n")
    monkeypatch.setattr(tool, "ROOT", root)
    monkeypatch.setattr(tool, "WORK", root / ".cache" / "mutation")
    monkeypatch.setattr(tool, "SAVED", root / "benchmarks" / "results" / "mutation")
    monkeypatch.setattr(tool, "_git_head", lambda: "abc")
    monkeypatch.setattr(tool, "_mutmut_version", lambda: "3.8.1")
    return tool


def _run(tool):
    """A run as mutmut leaves it: the work dir with its `.meta`."""
    work = tool.prepare(MODULE, ENTRY)
    meta = tool.meta_path(work, MODULE)
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": CODES, "hash_by_function_name": HASHES,
                                "type_check_error_by_key": {}, "durations_by_key": {"x": 1.0},
                                "estimated_durations_by_key": {"x": 2.0}}))
    return work


def test_save_writes_the_statuses_hashes_module_digest_and_commits(tool):
    work = _run(tool)
    tool.save(MODULE, work)
    saved = json.loads((tool.SAVED / "keras_posenc__m.json").read_text())
    digest = hashlib.sha256(b"def f():\n    return 1\n").hexdigest()
    assert saved == {"module": MODULE, "module_sha256": digest, "mutmut": "3.8.1",
                     "commits": ["abc"], "hash_by_function_name": HASHES, "exit_code_by_key": CODES}


def test_a_resume_without_a_work_dir_starts_from_the_saved_results(tool, monkeypatch):
    tool.save(MODULE, _run(tool))
    tool.shutil.rmtree(tool.WORK)
    monkeypatch.setattr(tool, "_git_head", lambda: "def")
    work = tool.refresh_tests(MODULE, ENTRY)
    meta = json.loads(tool.meta_path(work, MODULE).read_text())
    assert set(meta) == MUTMUT_META_KEYS
    assert meta["exit_code_by_key"] == CODES and meta["hash_by_function_name"] == HASHES
    assert tool.results(work, MODULE) == CODES
    tool.save(MODULE, work)  # the run goes on at commit def: both commits produced its results
    assert json.loads((tool.SAVED / "keras_posenc__m.json").read_text())["commits"] == ["abc", "def"]


def test_the_report_without_a_work_dir_reads_the_saved_results(tool, capsys):
    tool.save(MODULE, _run(tool))
    tool.shutil.rmtree(tool.WORK)
    assert tool.results(tool.work_dir(MODULE), MODULE) == CODES
    assert capsys.readouterr().out.endswith("saved results: benchmarks/results/mutation/keras_posenc__m.json "
                                            "(commits abc)\n")


def test_a_resume_of_a_changed_module_starts_from_the_saved_results_and_says_so(tool, capsys):
    # mutmut then makes the module's mutants and keeps the saved results of each function whose hash
    # is unchanged; the report alone does not stand for another version of the module.
    tool.save(MODULE, _run(tool))
    tool.shutil.rmtree(tool.WORK)
    (tool.ROOT / MODULE).write_text("def f():\n    return 2\n")
    work = tool.refresh_tests(MODULE, ENTRY)
    assert (work / MODULE).read_text() == "def f():\n    return 2\n"
    meta = json.loads(tool.meta_path(work, MODULE).read_text())
    assert meta["exit_code_by_key"] == CODES and meta["hash_by_function_name"] == HASHES
    assert capsys.readouterr().out.endswith(f"{MODULE} changed since: the mutants of the functions that "
                                            "changed run again\n")
    tool.shutil.rmtree(tool.WORK)
    message = ("error: benchmarks/results/mutation/keras_posenc__m.json holds the results of another version "
               f"of {MODULE}: --resume runs the functions that changed")
    with pytest.raises(SystemExit, match=re.escape(message)):
        tool.results(tool.work_dir(MODULE), MODULE)


def test_a_resume_in_the_work_dir_takes_the_checkouts_package_and_remakes_a_changed_modules_mutants(
        tool, capsys):
    work = _run(tool)
    mutants = work / "mutants" / MODULE
    mutants.write_text("the mutants of the earlier version")
    os.utime(mutants, (2000, 2000))
    (tool.ROOT / MODULE).write_text("def f():\n    return 2\n")
    os.utime(tool.ROOT / MODULE, (1000, 1000))  # a checkout's file can be older than the mutants
    (tool.ROOT / "keras_posenc" / "other.py").write_text("X = 1\n")
    (tool.ROOT / "tests" / "test_other.py").write_text("def test_x():\n    pass\n")
    (tool.ROOT / "tools" / "mutation.py").write_text("# the launcher imports FixtureHits from here\n")
    assert tool.refresh_tests(MODULE, ENTRY) == work
    assert (work / MODULE).read_text() == "def f():\n    return 2\n"
    assert (work / "keras_posenc" / "other.py").is_file() and (work / "tests" / "test_other.py").is_file()
    assert (work / "tools" / "mutation.py").read_text() == "# the launcher imports FixtureHits from here\n"
    assert os.path.getmtime(work / MODULE) > os.path.getmtime(mutants)  # mutmut makes them again
    assert json.loads(tool.meta_path(work, MODULE).read_text())["exit_code_by_key"] == CODES
    assert capsys.readouterr().out == (f"{MODULE} changed since its last run: the mutants of the functions "
                                       "that changed run again\n")


def test_a_resume_with_neither_a_work_dir_nor_saved_results_says_to_run_first(tool):
    message = (f"error: no earlier run of {MODULE} to go on with (no work dir, no "
               "benchmarks/results/mutation/keras_posenc__m.json): run it without --resume first")
    with pytest.raises(SystemExit, match=re.escape(message)):
        tool.refresh_tests(MODULE, ENTRY)


def test_save_alone_saves_the_last_run_and_runs_nothing(tool, monkeypatch):
    work = _run(tool)
    monkeypatch.setattr(tool, "load_config", lambda: {MODULE: ENTRY})
    monkeypatch.setattr(tool, "run_mutmut", lambda *args: pytest.fail("--save ran mutmut"))
    assert tool.main([MODULE, "--save"]) == 1  # a survivor, a mutant not run: not a pass
    assert tool.meta_path(work, MODULE).is_file()  # the run's work dir is kept
    assert json.loads((tool.SAVED / "keras_posenc__m.json").read_text())["exit_code_by_key"] == CODES


def test_only_names_the_mutants_as_mutmut_names_them(tool):
    """A package module's mutants carry its dotted path, a kit module's its bare name (the kit imports
    its modules by bare name): `--only` must match the names the run writes."""
    package = tool.only_patterns("keras_posenc/export/result.py", ["save", "ExportResult.failures"])
    assert package == ["keras_posenc.export.result.x_save__mutmut_*",
                       "keras_posenc.export.result.xǁExportResultǁfailures__mutmut_*"]
    kit = tool.only_patterns("export/jetson/run_translate.py", ["top", "Translator.step"])
    assert kit == ["run_translate.x_top__mutmut_*", "run_translate.xǁTranslatorǁstep__mutmut_*"]
    assert tool._matches("run_translate.x_top__mutmut_12", kit)
    assert not tool._matches("run_translate.x_top_k__mutmut_1", kit)
    assert not tool._matches("run_translate.xǁTranslatorǁstep_many__mutmut_1", kit)


class _Stats:
    """mutmut's state as its stats run sees it: the functions hit since the last test's teardown."""

    def __init__(self):
        self._stats = set()


class _StatsCollector:
    """mutmut's own stats plugin: at each test's teardown, every function hit so far goes to it."""

    def __init__(self, state):
        self.state = state
        self.tests_by_function = {}

    def pytest_runtest_teardown(self, item, nextitem):
        for function in self.state()._stats:
            self.tests_by_function.setdefault(function, set()).add(item.name)
        self.state()._stats.clear()


def test_a_wide_fixtures_calls_are_credited_to_every_test_that_uses_it(tool, tmp_path, monkeypatch):
    """mutmut credits what a module fixture calls to the first test using it; with FixtureHits the
    stats run credits it to each of them, and a function-scoped fixture's calls to its own test."""
    stats = _Stats()
    hits = types.ModuleType("mutmut_hits")
    hits.hit = lambda name: stats._stats.add(name)
    monkeypatch.setitem(sys.modules, "mutmut_hits", hits)
    (tmp_path / "test_inner.py").write_text(
        "import pytest\nimport mutmut_hits\n\n"
        "@pytest.fixture(scope='module')\ndef model():\n    mutmut_hits.hit('build')\n\n"
        "@pytest.fixture(scope='module')\ndef exported(model):\n    mutmut_hits.hit('export')\n\n"
        "@pytest.fixture\ndef batch():\n    mutmut_hits.hit('batch')\n\n"
        "def test_first(model, batch):\n    mutmut_hits.hit('first')\n\n"
        "def test_second(exported):\n    pass\n\n"
        "def test_third():\n    pass\n")
    collector = _StatsCollector(lambda: stats)
    args = ["-q", "-p", "no:cacheprovider", "--import-mode=importlib", "--rootdir", str(tmp_path),
            str(tmp_path / "test_inner.py")]
    assert pytest.main(args, plugins=[collector, tool.FixtureHits(lambda: stats)]) == 0
    assert collector.tests_by_function == {"build": {"test_first", "test_second"},
                                           "export": {"test_second"}, "batch": {"test_first"},
                                           "first": {"test_first"}}
    # Without it, mutmut's own crediting: the module fixture's call goes to the first test only.
    stats._stats.clear()
    alone = _StatsCollector(lambda: stats)
    assert pytest.main(args, plugins=[alone]) == 0
    assert alone.tests_by_function["build"] == {"test_first"}
