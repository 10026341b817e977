"""Export at deployment sizes: file bytes, conversion time and memory, multiply-adds, CPU latency.

Untrained `CausalLM`s (vocab 8000, d_model 256, 4 heads, dff 1024, 4 layers) at T = 64, 128, 256
and 512, and the seed's size (d_model 512, 6 layers, 8 heads, dff 2048) at T = 512. For each
target (`cpu`, `gpu`, `gl`; `tensorrt` too when tf2onnx is importable, e.g. with
`PYTHONPATH=.edge-cache/onnx-site`):

- file bytes / the fp32 weight bytes;
- conversion seconds (`to_tflite` / `to_onnx` only), wall-clock and the process's CPU time (on
  a shared machine the wall-clock time depends on the other load), and the peak RSS of the
  whole converting process, TensorFlow and the model included (each conversion runs in its own subprocess, its
  `ru_maxrss` read with `os.wait4`; one above `--max-rss-gb` is killed and reported as such);
- multiply-adds, non-weight constant bytes and the largest intermediate tensor
  (`keras_posenc.export.cost`), multiply-adds as a ratio to the `cpu` file's;
- CPU latency (TFLite interpreter, XNNPACK, one thread) as a ratio to the `cpu` file's, the
  files called interleaved in every repetition (median over repetitions of the median call).

Usage:
    python benchmarks/bench_export_scale.py [--lengths 64,128,256,512] [--targets cpu,gpu,gl]
        [--embedding host|graph] [--seed-size | --only-seed-size] [--repetitions 3] [--calls 3]
        [--max-rss-gb 6] [--no-latency]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SMALL = dict(num_layers=4, d_model=256, num_heads=4, dff=1024, vocab_size=8000, dropout=0.0)
SEED = dict(num_layers=6, d_model=512, num_heads=8, dff=2048, vocab_size=8000, dropout=0.0)


def convert(config, target, length, out, embedding):
    """Child process: build the model, convert it, write `out`; print one JSON line."""
    from keras_posenc import export
    from keras_posenc.backend import keras
    from keras_posenc.export.cost import graph_cost, onnx_cost
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(0)
    model = CausalLM(dict(config, max_length=length), name="lm")
    model.build_on_dummy()
    start, cpu_start = time.perf_counter(), time.process_time()
    if target == "tensorrt":
        flat = export.to_onnx(model, sequence_length=length)
        cost = onnx_cost(flat)
    else:
        options = {"embedding": embedding} if embedding and target in ("gpu", "gl") else {}
        flat = export.to_tflite(model, sequence_length=length, target=target, **options)
        cost = graph_cost(flat)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    with open(out, "wb") as f:
        f.write(flat)
    weights = export.weight_bytes(model)
    in_file = weights if target == "tensorrt" else export.parity.weights_in_file(model, flat)
    extra = max(0, cost["constant_bytes"] - in_file)
    print(json.dumps(dict(cost, seconds=seconds, cpu_seconds=cpu_seconds, file_bytes=len(flat),
                          weight_bytes=weights, non_weight_constant_bytes=extra)))


def run_child(args, max_rss_gb):
    """Runs one conversion in a subprocess; returns (its JSON dict or None, peak RSS bytes, note)."""
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--convert", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    killed, status_path = False, f"/proc/{process.pid}/status"
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)  # this child's own rusage
        if pid:
            break
        try:
            with open(status_path) as f:
                rss = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            rss = 0
        if rss > max_rss_gb * 2 ** 30 and not killed:
            process.kill()
            killed = True
        time.sleep(0.2)
    process.returncode = os.waitstatus_to_exitcode(status)
    output = process.stdout.read()
    peak = usage.ru_maxrss * 1024
    if killed:
        return None, peak, f"killed above {max_rss_gb} GB"
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if process.returncode or not lines:
        return None, peak, f"failed (exit {process.returncode})"
    return json.loads(lines[-1]), peak, ""


def latency_ms(paths, repetitions, calls):
    """Median call time of each file on the TFLite interpreter (1 thread), interleaved."""
    from keras_posenc import export

    runners = {}
    for name, path in paths.items():
        interpreter = export.interpreter_class()(model_path=path, num_threads=1)
        interpreter.allocate_tensors()
        for detail in interpreter.get_input_details():
            interpreter.set_tensor(detail["index"], np.ones(detail["shape"], detail["dtype"]))
        runners[name] = interpreter.invoke
    medians = {name: [] for name in paths}
    for _ in range(repetitions):
        for name, invoke in runners.items():
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                invoke()
                times.append(time.perf_counter() - start)
            medians[name].append(float(np.median(times)) * 1e3)
    return {name: float(np.median(values)) for name, values in medians.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--convert", nargs=5, metavar=("CONFIG", "TARGET", "LENGTH", "OUT", "EMBEDDING"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--lengths", default="64,128,256,512")
    parser.add_argument("--targets", default="cpu,gpu,gl")
    parser.add_argument("--embedding", default="host",
                        help="host or graph: the token lookup of the gpu/gl files (default: host, the "
                             "CLI's default for them)")
    parser.add_argument("--seed-size", action="store_true", help="also d_model 512, 6 layers at T = 512")
    parser.add_argument("--only-seed-size", action="store_true", help="only the d_model 512 row")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--max-rss-gb", type=float, default=6.0)
    parser.add_argument("--no-latency", action="store_true")
    args = parser.parse_args()
    if args.convert:
        config, target, length, out, embedding = args.convert
        convert(json.loads(config), target, int(length), out, None if embedding == "default" else embedding)
        return
    rows = [] if args.only_seed_size else [("d256 L4", SMALL, int(n)) for n in args.lengths.split(",")]
    if args.seed_size or args.only_seed_size:
        rows.append(("d512 L6", SEED, 512))
    targets = args.targets.split(",")
    header = ("| model | T | target | file / weights | convert s (wall / CPU) | peak RSS GB "
              "| multiply-adds (G) | / cpu | non-weight constants MB | largest tensor MB "
              "| CPU latency / cpu |")
    print(header)
    print("|" + "---|" * 11)
    with tempfile.TemporaryDirectory() as folder:
        for label, config, length in rows:
            results, paths = {}, {}
            for target in targets:
                suffix = "onnx" if target == "tensorrt" else "tflite"
                path = os.path.join(folder, f"{target}_{length}.{suffix}")
                child = [json.dumps(config), target, str(length), path, args.embedding]
                result, peak, note = run_child(child, args.max_rss_gb)
                results[target] = (result, peak, note)
                if result and target != "tensorrt":
                    paths[target] = path
            latency = {} if args.no_latency else latency_ms(paths, args.repetitions, args.calls)
            cpu = results.get("cpu", (None,))[0]
            for target in targets:
                result, peak, note = results[target]
                if result is None:
                    print(f"| {label} | {length} | {target} | {note} |" + " |" * 7)
                    continue
                ratio = result["multiply_adds"] / cpu["multiply_adds"] if cpu else float("nan")
                slower = latency[target] / latency["cpu"] if target in latency and "cpu" in latency else None
                extra = result["non_weight_constant_bytes"]
                size = result["file_bytes"] / result["weight_bytes"]
                print(f"| {label} | {length} | {target} | {size:.2f} | "
                      f"{result['seconds']:.1f} / {result['cpu_seconds']:.1f} | {peak / 2 ** 30:.2f} | "
                      f"{result['multiply_adds'] / 1e9:.2f} | {ratio:.2f} | {extra / 2 ** 20:.1f} | "
                      f"{result['largest_tensor_bytes'] / 2 ** 20:.1f} | "
                      f"{'' if slower is None else f'{slower:.2f}'} |", flush=True)
            for path in paths.values():
                os.remove(path)


if __name__ == "__main__":
    main()
