"""Quantized exports: bytes / float32, held-out loss increase, greedy agreement, CPU latency, decode tokens/s.

Three models:

- demo: `keras-posenc demo`'s run (1000 steps on the embedded English corpus; 2 layers,
  d_model 64, vocab 1000), trained here unless `--demo RUN` names its folder;
- d256: 4 pre-LN layers, d_model 256, 4 heads, dff 1024, vocab 2000, trained for `--d256-steps`
  (500) steps on the shipped English -> German slice (`keras_posenc/app/data/po_en_de_slice.tsv`;
  eval loss 5.70 against the unigram baseline's 6.18), unless `--d256 RUN` names its folder;
- seed size (T 512, d_model 512, 6 layers, 8 heads, dff 2048, vocab 8000), untrained: bytes only.

For each model, target (cpu, gpu, gl, tensorrt) and precision (float32, float16, int8, int4) the
window export of `export_and_check` (the CLI's default embedding: host rows on gpu/gl), on the
run's eval split: bytes of the file plus its host table over the float32 export's, the held-out
cross-entropy's relative increase, the share of real positions whose argmax is float32's, and the
median CPU latency of one call (ai-edge-litert's interpreter, XNNPACK, one thread, in the LiteRT
Python; onnxruntime with one thread), over the float32 file's. Refused combinations print their
reason. For the demo also the prefill/decode file on `cpu` (decode tokens/s of one step, one
thread, LiteRT's interpreter) and the `.litertlm` bundle on LiteRT-LM's engine (CPU, one thread,
decode tokens/s of its benchmark info), with the quality of each against float32.

Usage (the LiteRT Python: the edge cache's venv-litertlm, `make test-edge` builds it; onnxruntime
and tf2onnx from its onnx-site):

    PYTHONPATH=.edge-cache/onnx-site .venv/bin/python benchmarks/bench_quantize.py \
        --litert-python .edge-cache/venv-litertlm/bin/python [--demo runs/demo] [--d256 runs/d256]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from keras_posenc import export
from keras_posenc.export import host_table, litertlm_bundle, pipeline
from keras_posenc.models import CausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("cpu", "gpu", "gl", "tensorrt")
PRECISIONS = (None, "float16", "int8", "int4")
SEED_SIZE = dict(num_layers=6, d_model=512, num_heads=8, dff=2048, vocab_size=8000, max_length=512,
                 dropout=0.0)
TIMER = os.path.join(HERE, "_litert_timing.py")
SLICE = os.path.join(os.path.dirname(HERE), "keras_posenc", "app", "data", "po_en_de_slice.tsv")
# Pre-LN: the post-LN d_model 256 stack stays at the unigram baseline in a few hundred steps here.
D256_FLAGS = ["--corpus", SLICE, "--format", "tsv", "--d-model", "256", "--num-layers", "4", "--dff", "1024",
              "--norm-first"]


def train(command, out, extra=()):
    from keras_posenc.app import cli

    status = cli.main([command, "--out", out, "--quiet", *extra])
    if status:
        raise SystemExit(f"`keras-posenc {command}` into {out} failed (exit {status})")
    return out


def run_folders(args, scratch):
    demo = args.demo or train("demo", os.path.join(scratch, "demo"))
    d256 = args.d256 or train("train", os.path.join(scratch, "d256"),
                              D256_FLAGS + ["--steps", str(args.d256_steps)])
    return {"demo": demo, "d256": d256}


def window_length(model):
    return min(64, export.longest_sequence(model))


def total_bytes(result):
    table = 0 if result.host_table is None else host_table.table_bytes(result.host_table)
    return sum(len(content) for content in result.models) + table


def latency_ms(args, path, feeds, onnx):
    """Median ms of one call, one thread: onnxruntime here, or ai-edge-litert in the LiteRT Python."""
    if onnx:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        named = {i.name: feeds[k] for i, k in zip(session.get_inputs(), sorted(feeds, key=_role_order))}
        named = {name: value.astype(np.float32 if "embeddings" in name else np.int32)
                 for name, value in named.items()}
        from bench_export import median_call_ms

        return median_call_ms(lambda: session.run(None, named), args.calls)
    with tempfile.TemporaryDirectory() as scratch:
        np.savez(os.path.join(scratch, "feeds.npz"), **feeds)
        done = subprocess.run([args.litert_python, TIMER, "window", path, os.path.join(scratch, "feeds.npz"),
                               str(args.calls)], capture_output=True, text=True, timeout=1200)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["ms"]


def _role_order(name):
    return {"token_ids": 0, "language_ids": 1, "embeddings": 2}.get(name, 3)


def window_rows(args, name, run):
    from keras_posenc.app import run_folder

    model = export.load_model(os.path.join(run, "model.keras"))
    length = window_length(model)
    model_path = os.path.join(run, "model.keras")
    eval_ids = run_folder.eval_token_ids(model_path, length, None)
    ids = run_folder.corpus_token_ids(model_path, length, 4)
    spec = export.ModelSpec.of(model, length, 1)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for target in TARGETS:
            reference = None
            for precision in PRECISIONS:
                label = precision or "float32"
                try:
                    result = export.export_and_check(
                        model, sequence_length=length, target=target, quantize=precision, token_ids=ids,
                        eval_token_ids=eval_ids, litert_python=args.litert_python)
                except ValueError as error:
                    rows.append((name, target, label, f"refused: {str(error).split(': ', 1)[1][:90]}"))
                    continue
                onnx = target == "tensorrt"
                path = os.path.join(scratch, f"{target}-{label}.{'onnx' if onnx else 'tflite'}")
                with open(path, "wb") as f:
                    f.write(result.models[0])
                feeds = dict(zip(spec.roles, spec.feeds(ids[:1], language_ids=np.zeros_like(ids[:1])
                                                        if spec.needs_languages else None)))
                if result.embedding == "host":
                    feeds["embeddings"] = host_table.dequantize_rows(result.host_table, ids[:1])
                ms = latency_ms(args, path, feeds, onnx)
                if reference is None:
                    reference = (total_bytes(result), ms)
                quality = result.report.get("quality") or {}
                rows.append((name, target, label, total_bytes(result), total_bytes(result) / reference[0],
                             quality.get("loss_increase"), quality.get("agreement"), ms / reference[1],
                             ms, result.failures(), quality.get("loss_float")))
                print(_row(rows[-1]), flush=True)
    return rows


def _row(row):
    if isinstance(row[3], str):
        return f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} |"
    name, target, label, size, ratio, loss, agreement, speed, ms, failures, loss_float = row
    flag = " (fails the 1% gate)" if failures else ""
    quality = "- | -" if loss is None else f"{loss:+.2%} ({loss_float:.3f}){flag} | {agreement:.1%}"
    return f"| {name} | {target} | {label} | {size:,} | {ratio:.3f} | {quality} | {ms:.2f} | {speed:.2f} |"


def _failed_checks(failures):
    """The generation checks that failed, in a few words (a table cell)."""
    words = {"95%": "fails the 95% rule", "engine": "engine text differs from LiteRT's interpreter"}
    return [text for key, text in words.items() if any(key in line for line in failures)]


def generation_rows(args, name, model, sp_model, eval_ids):
    """A model's prefill/decode file on cpu and its .litertlm bundle, per precision: bytes, quality, speed."""
    cache = min(128, export.longest_sequence(model))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        reference = None
        for precision in (None, "float16", "int8"):
            result = export.export_generation(model, prompt_length=cache // 2, cache_length=cache,
                                              target="cpu", quantize=precision, eval_token_ids=eval_ids,
                                              litert_python=args.litert_python)
            path = os.path.join(scratch, f"gen-{precision}.tflite")
            with open(path, "wb") as f:
                f.write(result.models[0])
            done = subprocess.run([args.litert_python, TIMER, "decode", path, str(cache // 2),
                                   str(args.calls)], capture_output=True, text=True, timeout=1200)
            tokens_per_s = json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"]
            reference = reference or (total_bytes(result), tokens_per_s)
            quality = result.report.get("quality") or {}
            rows.append((name, "prefill/decode cpu", precision or "float32",
                         total_bytes(result) / reference[0], quality.get("loss_increase"),
                         quality.get("generation_agreement"), tokens_per_s,
                         tokens_per_s / reference[1], result.failures()))
            print(rows[-1], flush=True)
        reference = None
        for precision in (None, "int8", "int4"):
            result = pipeline.export_litertlm(
                model, sp_model, prompt_length=cache // 2, cache_length=cache, target="cpu",
                python=args.litert_python, quantize=precision, eval_token_ids=eval_ids)
            path = os.path.join(scratch, f"b-{precision}.litertlm")
            result.save(path)
            texts, benchmark, _ = litertlm_bundle.engine_texts(path, [["The module"]], 24, benchmark=True,
                                                               python=args.litert_python, threads=1)
            decode = benchmark[0]["last_decode_tokens_per_second"]
            reference = reference or (len(result.models[0]), decode)
            quality = result.report.get("quality") or {}
            rows.append((name, ".litertlm cpu (engine)", precision or "float32",
                         len(result.models[0]) / reference[0], quality.get("loss_increase"),
                         quality.get("generation_agreement"), decode, decode / reference[1],
                         result.failures()))
            print(rows[-1], texts, flush=True)
    return rows


def demo_generation(args, run):
    from keras_posenc.app import run_folder

    model_path = os.path.join(run, run_folder.MODEL_FILE)
    model = export.load_model(model_path)
    sp_model = run_folder.read_tokenizer(model_path)
    eval_ids = run_folder.eval_token_ids(model_path, min(128, export.longest_sequence(model)), None)
    return generation_rows(args, "demo", model, sp_model, eval_ids)


def d256_generation(args, run):
    """The d256 shape as an untrained LM without language ids (the trained one takes them, which
    prefill/decode files do not): speed and bytes only, with the demo run's tokenizer (vocab 1000)."""
    keras_utils = __import__("keras_posenc.backend", fromlist=["keras"]).keras.utils
    keras_utils.set_random_seed(0)
    model = CausalLM(dict(num_layers=4, d_model=256, num_heads=4, dff=1024, vocab_size=1000, max_length=128,
                          dropout=0.0, norm_first=True), name="d256")
    model.build_on_dummy()
    with open(os.path.join(run, "spm.model"), "rb") as f:
        sp_model = f.read()
    return generation_rows(args, "d256 (untrained)", model, sp_model, None)


def seed_size_rows(args):
    model = CausalLM(dict(SEED_SIZE), name="seed")
    model.build_on_dummy()
    rows = []
    for target in TARGETS:
        reference = None
        for precision in PRECISIONS:
            label = precision or "float32"
            try:
                if target == "tensorrt":
                    calibration = np.random.default_rng(0).integers(5, 8000, [2, 512]).astype(np.int32)
                    recipe = export.recipe_for(target, precision)
                    flat = export.conversion.convert_onnx(export.ModelSpec.of(model, 512, 1), recipe=recipe,
                                                          calibration=calibration)
                    size = len(flat)
                else:
                    embedding = export.default_embedding(model, target)
                    flat = export.to_tflite(model, sequence_length=512, target=target, quantize=precision,
                                            embedding=embedding, litert_python=args.litert_python)
                    recipe = export.recipe_for(target, precision, litert_python=args.litert_python)
                    table = (export.quantization.stored_host_table(export.host_embedding_table(model), recipe)
                             if embedding == "host" else None)
                    size = len(flat) + (0 if table is None else host_table.table_bytes(table))
            except ValueError as error:
                rows.append(("seed", target, label, f"refused: {str(error).split(': ', 1)[1][:90]}"))
                continue
            reference = reference or size
            rows.append(("seed", target, label, size, size / reference))
            print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--litert-python", required=True,
                        help="a Python with litert-quantizer, litert-lm-api and ai-edge-litert "
                             "(.edge-cache/venv-litertlm)")
    parser.add_argument("--demo", help="a run folder of `keras-posenc demo` (default: train one)")
    parser.add_argument("--d256", help="a run folder of the d256 model (default: train one)")
    parser.add_argument("--d256-steps", type=int, default=500)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--parts", default="window,generation,seed",
                        help="comma-separated: window, generation, seed")
    args = parser.parse_args()
    parts = args.parts.split(",")
    window, generation, seed = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        runs = run_folders(args, scratch)
        if "window" in parts:
            window = [row for name, run in runs.items() for row in window_rows(args, name, run)]
        if "generation" in parts:
            generation = demo_generation(args, runs["demo"]) + d256_generation(args, runs["demo"])
    if "seed" in parts:
        seed = seed_size_rows(args)
    if window:
        print("\n## Window exports")
        print("| model | target | precision | bytes (file + host table) | / float32 "
              "| loss increase (float32 loss) | agreement | CPU ms (1 thread) | / float32 |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|")
        for row in window:
            print(_row(row))
    if generation:
        print("\n## Generation")
        print("| model | file | precision | bytes / float32 | loss increase | greedy agreement "
              "| decode tokens/s | / float32 |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        for name, kind, label, ratio, loss, agreement, speed, relative, failures in generation:
            loss = "-" if loss is None else f"{loss:+.2%}"
            agreement = "-" if agreement is None else f"{agreement:.1%}"
            failed = _failed_checks(failures)
            agreement += f" ({'; '.join(failed)})" if failed else ""
            print(f"| {name} | {kind} | {label} | {ratio:.3f} | {loss} | {agreement} | {speed:,.0f} | "
                  f"{relative:.2f} |")
    if seed:
        print("\n## Seed size (untrained; bytes only)")
        print("| target | precision | bytes (file + host table) | / float32 |")
        print("|---|---|---:|---:|")
        for row in seed:
            print(f"| {row[1]} | {row[2]} | {row[3]} |" if isinstance(row[3], str) else
                  f"| {row[1]} | {row[2]} | {row[3]:,} | {row[4]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main())
