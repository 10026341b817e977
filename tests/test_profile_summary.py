"""benchmarks/profile_summary.py reads py-spy's raw format, multi-line command lines included."""

import importlib.util
import pathlib

from stacks import once_on_keras2

pytestmark = once_on_keras2("a text parser: no TensorFlow or Keras in its subject")

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "profile_summary.py"
PARENT = 'process 1:"python -m pytest -q"'
TEST = "test_a (test_x.py:3);helper (keras_posenc/export/pipeline.py:9)"
RAW = (f"{PARENT};{TEST};convert (tensorflow/lite/python/lite.py:7) 8\n"
       f"{PARENT};{TEST};trace (tensorflow/python/framework/func_graph.py:2) 4\n"
       f'{PARENT};process 2:"python -c import os\nprint(1)";<module> (<string>:1) 12\n'
       f"{PARENT};main (_pytest/main.py:1) 16\n")


def _summary(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("profile_summary", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "run.raw"
    path.write_text(RAW)
    module.summarize(str(path), rate=4.0, top=10)
    return capsys.readouterr().out


def test_seconds_per_file_kind_leaf_and_child_process(tmp_path, capsys):
    out = _summary(tmp_path, capsys)
    assert "10 CPU seconds sampled" in out  # (8 + 4 + 12 + 16) samples at 4 a second
    assert "     3.0  test_x.py\n" in out
    assert "     7.0  (no test frame" in out
    assert "     2.0  TFLite converter\n" in out and "     1.0  TensorFlow tracing (func_graph)\n" in out
    assert "     3.0  child processes\n" in out
    assert "     3.0  python -c import os print(1)\n" in out
    assert "     4.0  main (_pytest/main.py)\n" in out
