#!/usr/bin/env bash
# Benchmarks an exported model on a Jetson with TFLite's benchmark_model: CPU (XNNPACK), then the GPU
# delegate with its default backend (OpenCL if present), then forced OpenGL ES. Prints, for each run,
# how many nodes the delegate took and the average latency.
#
# Usage: ./jetson_benchmark.sh MODEL.tflite [PATH/TO/benchmark_model] [NUM_RUNS]
set -euo pipefail

model=${1:?usage: jetson_benchmark.sh MODEL.tflite [benchmark_model] [num_runs]}
tool=${2:-./benchmark_model}
runs=${3:-200}
[ -f "$model" ] || { echo "no such model: $model" >&2; exit 2; }
[ -x "$tool" ] || { echo "benchmark_model not found or not executable: $tool (see export/jetson/README.md)" >&2; exit 2; }

run() {
  local label=$1; shift
  echo "== $label"
  "$tool" --graph="$model" --num_runs="$runs" --warmup_runs=10 "$@" 2>&1 \
    | grep -E "Replacing|delegate|Initialized|avg=|ERROR|Failed" || true
}

run "CPU (XNNPACK)" --use_gpu=false --use_xnnpack=true --num_threads="$(nproc)"
run "GPU delegate, default backend" --use_gpu=true
run "GPU delegate, OpenGL ES backend" --use_gpu=true --gpu_backend=gl
