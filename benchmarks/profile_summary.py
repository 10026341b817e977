"""Where a test run's CPU time goes, from a py-spy profile of it.

Record the run (py-spy is not in the lock: `pip install py-spy` anywhere, it attaches from outside)::

    py-spy record -r 40 -f raw --subprocesses -o k2.raw -- .venv/bin/python -m pytest -q -p no:cacheprovider
    python benchmarks/profile_summary.py k2.raw --rate 40

py-spy samples the threads that are running, so the seconds printed are CPU seconds: per test
file (the outermost test frame of each sample), per kind of work (a sample counts for every kind
its stack passes through, so the kinds overlap), per leaf function (where the time is spent
itself), and per child process that the tests started (by command line).
"""

import argparse
import collections
import re

KINDS = {
    "TensorFlow tracing (func_graph)": r"framework/func_graph\.py",
    "Keras fit / predict / evaluate":
        r"\.(fit|predict|evaluate) \(keras/(src/backend/tensorflow/trainer|engine/training)\.py",
    "TFLite converter": r"tensorflow/lite/python/(lite|convert)\.py",
    "freezing variables to constants": r"convert_to_constants\.py",
    "tf2onnx": r"tf2onnx/",
    "onnxruntime": r"onnxruntime/",
    "Keras saving, SavedModel": r"saving|saved_model",
    "AutoGraph converting source": r"autograph/(pyct|converters|core/converter|impl/conversion)",
    "reading source (inspect, linecache, tokenize, ast)": r"\((inspect|linecache|tokenize|ast)\.py",
    "op tracebacks (tf_stack)": r"tf_stack\.py",
    "imports": r"importlib\._bootstrap",
    "Hypothesis": r"hypothesis/",
    "SentencePiece, tensorflow-text": r"sentencepiece|tensorflow_text",
    "matplotlib": r"matplotlib",
    "child processes": r";process \d+:",
}
TEST_FRAME = re.compile(r";([A-Za-z_0-9.<>]+) \(((?:test|edge)_[a-z_0-9]+\.py):\d+\)")
PROCESS = re.compile(r'process \d+:"(.*?)"(?:;|$)', re.S)


def samples(path):
    """(stack, count) for each line of py-spy's raw format (a command line may span lines)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for match in re.finditer(r"(.*?) (\d+)\n", text, re.S):
        yield match.group(1), int(match.group(2))


def summarize(path, rate, top):
    files, kinds, leaves, children = (collections.Counter() for _ in range(4))
    total = 0
    for stack, count in samples(path):
        total += count
        test = TEST_FRAME.search(stack)
        files[test.group(2) if test else "(no test frame: collection, imports, child processes)"] += count
        for kind, pattern in KINDS.items():
            if re.search(pattern, stack):
                kinds[kind] += count
        leaves[re.sub(r":\d+\)$", ")", stack.rsplit(";", 1)[-1])] += count
        processes = PROCESS.findall(stack)
        if len(processes) >= 2:
            children[re.sub(r"\s+", " ", processes[1])] += count
    print(f"{path}: {total / rate:.0f} CPU seconds sampled")
    for title, counter in (("test file", files), ("kind of work (overlapping)", kinds),
                           ("leaf function", leaves), ("child process", children)):
        print(f"\nby {title}:")
        for name, count in counter.most_common(top):
            print(f"{count / rate:8.1f}  {name[:140]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a py-spy `record -f raw` file")
    parser.add_argument("--rate", type=float, default=40.0, help="the samples a second it was recorded at")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    args = parser.parse_args()
    summarize(args.profile, args.rate, args.top)


if __name__ == "__main__":
    main()
