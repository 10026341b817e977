"""Latency percentiles and the output checksum that run_tflite.py and run_tensorrt.py print.

Kept beside the two runners (copy the three files to the device together); numpy only.
"""

import json
import time

import numpy as np


def time_runs(invoke, iterations, warmup):
    """Calls `invoke()` `warmup` times untimed, then `iterations` times; returns the seconds of each."""
    for _ in range(warmup):
        invoke()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        invoke()
        times.append(time.perf_counter() - start)
    return times


def summarize(times, result, **fields):
    """The report: `fields`, p50/p90/p99 latency in ms, and the output's shape, sum and mean |x|."""
    result = np.asarray(result, np.float64)
    p50, p90, p99 = (float(np.percentile(times, q)) * 1e3 for q in (50, 90, 99))
    return {**fields, "iterations": len(times), "p50_ms": p50, "p90_ms": p90, "p99_ms": p99,
            "output_shape": list(result.shape), "checksum": float(result.sum()),
            "mean_abs": float(np.abs(result).mean())}


def print_summary(summary, header, *, as_json):
    """Prints `summary` as one JSON line, or as `header` then the latency and checksum lines."""
    if as_json:
        print(json.dumps(summary))
        return
    print(header)
    print(f"latency over {summary['iterations']} runs: p50 {summary['p50_ms']:.3f} ms  "
          f"p90 {summary['p90_ms']:.3f} ms  p99 {summary['p99_ms']:.3f} ms")
    print(f"output {tuple(summary['output_shape'])}: checksum (sum) {summary['checksum']:.6f}  "
          f"mean |x| {summary['mean_abs']:.6f}")
