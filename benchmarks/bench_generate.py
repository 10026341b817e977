"""Generation with a key/value cache against re-running the whole window, per new token.

Two untrained causal LMs (speed does not depend on the weights): the demo's shape (2 layers,
d_model 64, 4 heads, dff 128, vocab 1000) and a larger one (4 layers, d_model 256, 4 heads,
dff 1024, vocab 8000), both with max_length 512, at cache lengths 128 and 512.

- TFLite (TensorFlow backends only; XNNPACK, one thread): the prefill/decode file of
  `keras-posenc export --generate` (prefill length C/2) against the fixed-window `cpu` file of
  length C, which a scorer must run once per new token. Decode tokens/s of each, their ratio,
  the time to first token (prefill) and the cache bytes.
- Keras (this process's backend): `CausalLM.generate`'s compiled decode step against the
  compiled full forward pass over C tokens.

Each timed quantity is the median over `--calls` calls, the two sides interleaved in every
repetition; the ratio is the median of the per-repetition ratios (this machine is noisy).

With `--litertlm PYTHON` (a Python with litert-lm-api 0.18.1, e.g. the edge cache's
venv-litertlm) and `--litert PYTHON` (ai-edge-litert, venv-litert): LiteRT-LM's Engine on the
`.litertlm` bundle against `export/jetson/run_generate.py` (LiteRT `CompiledModel`) on the
`--generate --target cpu` file of the same model, both on the CPU backend with one thread
(`--backend gpu`: the `--target gpu` files on the GPU backends, LiteRT-LM's and LiteRT's):
decode tokens/s, time to first token and prefill tokens/s of one text prompt of 32 tokens (BOS +
31 pieces, the prefill length P = 32; 64 new tokens, greedy; "same text" compares the two),
median of `--repetitions` runs of a fresh process each, and per model the engine's TTFT over the
runner's and its prefill rate over its decode rate (`--models demo`: the demo's rows only). The
engine's figures are its own benchmark info; each run holds two sessions with the prompt: the
first session's TTFT ("TTFT") includes the backend's first-use costs, the second's ("2nd TTFT")
and the rates are the engine serving a prompt. The runner's TTFT is its first prefill call (after
its model's compilation), its prefill rate the prompt's tokens over that TTFT. run_generate.py
takes the prompt's ids (the venv of ai-edge-litert has no sentencepiece).
Both models use a SentencePiece vocabulary of 1000 here (trained on the embedded corpus: the
bundle holds the tokenizer, whose size must be the model's).

Usage:
    python benchmarks/bench_generate.py [--repetitions 5] [--calls 20] [--cache-lengths 128 512]
    KERAS_BACKEND=jax .venv-keras3/bin/python benchmarks/bench_generate.py   # Keras rows only
    python benchmarks/bench_generate.py --litertlm .edge-cache/venv-litertlm/bin/python \
        --litert .edge-cache/venv-litert/bin/python --repetitions 3     # engine vs runner rows only
"""

import argparse
import json
import os
import subprocess
import tempfile

import numpy as np
from bench_export import median_call_ms

from keras_posenc.backend import inference_function, is_tensorflow, keras, ops
from keras_posenc.export import pipeline, runners
from keras_posenc.models import CausalLM

MODELS = {
    "demo (2x64)": dict(num_layers=2, d_model=64, num_heads=4, dff=128, vocab_size=1000),
    "d256 (4x256)": dict(num_layers=4, d_model=256, num_heads=4, dff=1024, vocab_size=8000),
}


def tflite_pair(model, cache_length):
    """(decode step, window call, prefill call) of the exported files, one interpreter thread each."""
    import tensorflow as tf

    from keras_posenc import export
    from keras_posenc.export import generator

    prompt_length = cache_length // 2
    flat = generator.to_tflite_generator(model, prompt_length=prompt_length, cache_length=cache_length,
                                         target="cpu")
    interpreter = tf.lite.Interpreter(model_content=flat, num_threads=1)
    prefill = interpreter.get_signature_runner("prefill")
    decode = interpreter.get_signature_runner("decode")
    cache = runners.past(prefill(token_ids=np.full([1, prompt_length], 5, np.int32)))
    feeds = dict(token_id=np.array([[7]], np.int32), position=np.array([prompt_length], np.int32), **cache)
    window = tf.lite.Interpreter(model_content=export.to_tflite(model, sequence_length=cache_length,
                                                                target="cpu"), num_threads=1)
    window.allocate_tensors()
    window.set_tensor(window.get_input_details()[0]["index"], np.full([1, cache_length], 5, np.int32))
    tokens = np.full([1, prompt_length], 5, np.int32)
    return (lambda: decode(**feeds)), window.invoke, (lambda: prefill(token_ids=tokens))


def keras_pair(model, cache_length):
    """(decode step, window call) of the Keras model, both compiled for this backend."""
    encoder = model.encoder
    cache = ops.zeros(encoder.cache_shape(1, cache_length), "float32")
    index = ops.convert_to_tensor(np.int32(cache_length // 2))
    token = ops.convert_to_tensor(np.array([[7]], np.int32))
    position = ops.convert_to_tensor(np.array([[cache_length // 2]], np.int32))
    step = inference_function(model, lambda t, p, c, i: model(t, position_ids=p, cache=c, cache_index=i))
    window_ids = ops.convert_to_tensor(np.full([1, cache_length], 5, np.int32))
    full = inference_function(model, lambda ids: model(ids))

    def decode():
        ops.convert_to_numpy(step(token, position, cache, index)[0])

    def window():
        ops.convert_to_numpy(full(window_ids))

    decode()
    window()
    return decode, window


def measure(pair, repetitions, calls):
    decode, window = pair[:2]
    ratios, decode_ms, window_ms = [], [], []
    for _ in range(repetitions):
        d, w = median_call_ms(decode, calls), median_call_ms(window, calls)
        decode_ms.append(d)
        window_ms.append(w)
        ratios.append(w / d)
    return float(np.median(decode_ms)), float(np.median(window_ms)), float(np.median(ratios))


ENGINE_NEW_TOKENS, ENGINE_PROMPT_LENGTH, ENGINE_VOCAB = 64, 32, 1000
KIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "export", "jetson",
                   "run_generate.py")


def engine_vs_runner(args):
    """LiteRT-LM's Engine (bundle) vs run_generate.py (LiteRT, the --target cpu file), CPU, one thread."""
    import sentencepiece as spm

    from keras_posenc.app import dataset as data
    from keras_posenc.export import litertlm_bundle

    sp_model = data.train_sentencepiece(data.read_text_corpus(data.default_corpus_path()), ENGINE_VOCAB)
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    prompt = _prompt_text(processor, ENGINE_PROMPT_LENGTH - 1)
    prompt_ids = [2] + list(processor.EncodeAsIds(prompt))  # BOS + pieces: the prompt's 32 tokens
    print(f"prompt: BOS + {len(prompt_ids) - 1} pieces, {ENGINE_NEW_TOKENS} new tokens, "
          f"prefill length {ENGINE_PROMPT_LENGTH}, backend {args.backend}, 1 CPU thread")
    print(f"{'model':14} {'C':>4} {'runtime':24} {'TTFT ms':>8} {'2nd TTFT':>8} {'prefill tok/s':>13} "
          f"{'decode tok/s':>12} {'same text':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for name, config in MODELS.items():
            if name.split()[0] not in args.models:
                continue
            model = CausalLM({**config, "vocab_size": ENGINE_VOCAB, "max_length": max(args.cache_lengths),
                              "dropout": 0.0})
            model.build_on_dummy()
            for cache_length in args.cache_lengths:
                tflite = os.path.join(folder, f"gen{cache_length}.tflite")
                generated = pipeline.export_generation(model, prompt_length=ENGINE_PROMPT_LENGTH,
                                                        cache_length=cache_length, target=args.backend,
                                                        check_tokens=1)
                generated.save(tflite)
                bundle = os.path.join(folder, f"gen{cache_length}.litertlm")
                pipeline.export_litertlm(model, sp_model, prompt_length=ENGINE_PROMPT_LENGTH,
                                                cache_length=cache_length, target=args.backend,
                                                probes=[[prompt]], max_new_tokens=4,
                                                python=args.litertlm).save(bundle)
                engine, runner = [], []
                for _ in range(args.repetitions):
                    # Two sessions of one engine: the first pays the backend's first-use costs (its
                    # "cold" TTFT), the second is the engine serving a prompt (rates from it).
                    texts, info, _ = litertlm_bundle.engine_texts(
                        bundle, [[prompt], [prompt]], ENGINE_NEW_TOKENS, backend=args.backend,
                        python=args.litertlm, benchmark=True, threads=1)
                    cold, warm = info
                    engine.append((cold["time_to_first_token_in_second"] * 1e3,
                                   warm["time_to_first_token_in_second"] * 1e3,
                                   warm["last_prefill_tokens_per_second"],
                                   warm["last_decode_tokens_per_second"], texts[1][0]))
                    done = subprocess.run([args.litert, KIT, tflite, "--prompt-ids",
                                           ",".join(str(i) for i in prompt_ids),
                                           "--max-new-tokens", str(ENGINE_NEW_TOKENS), "--runtime", "litert",
                                           "--threads", "1", "--accelerator", args.backend, "--json"],
                                          capture_output=True, text=True, check=True)
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                    text = processor.DecodeIds([i for i in result["ids"] if i >= 5])  # specials dropped
                    runner.append((result["ttft_ms"], float("nan"), len(prompt_ids) / result["ttft_ms"] * 1e3,
                                   result["decode_tokens_per_s"], text))
                same = all(e[4].strip() == r[4].strip() for e, r in zip(engine, runner))
                medians = {}
                for runtime, rows in (("LiteRT-LM Engine", engine), ("run_generate.py (LiteRT)", runner)):
                    medians[runtime] = [float(np.median([row[i] for row in rows])) for i in range(4)]
                    cold, warm, prefill, decode = medians[runtime]
                    print(f"{name:14} {cache_length:4d} {runtime:24} {cold:8.2f} {warm:8.2f} {prefill:13.1f} "
                          f"{decode:12.1f} {str(same):>9}", flush=True)
                cold, warm, prefill, decode = medians["LiteRT-LM Engine"]
                runner_ttft = medians["run_generate.py (LiteRT)"][0]
                print(f"{'':19} engine TTFT / runner TTFT {cold / runner_ttft:.2f}x (first session), "
                      f"{warm / runner_ttft:.2f}x (second); engine prefill / decode tokens/s "
                      f"{prefill / decode:.1f}x", flush=True)


def _prompt_text(processor, pieces):
    """A text that the tokenizer splits into exactly `pieces` pieces (every third vocabulary piece)."""
    candidates = [i for i in range(5, ENGINE_VOCAB) if not processor.IsControl(i)][::3]
    for count in range(pieces // 2, len(candidates)):
        text = processor.DecodeIds(candidates[:count])
        if len(processor.EncodeAsIds(text)) == pieces:
            return text
    raise ValueError(f"no prefix of the vocabulary's pieces encodes as {pieces} pieces")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--cache-lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--models", nargs="+", choices=[name.split()[0] for name in MODELS],
                        default=[name.split()[0] for name in MODELS],
                        help="with --litertlm: the models whose rows are measured")
    parser.add_argument("--litertlm", help="a Python with litert-lm-api: the engine-vs-runner rows only")
    parser.add_argument("--litert", help="with --litertlm: a Python with ai-edge-litert for run_generate.py")
    parser.add_argument("--backend", choices=("cpu", "gpu"), default="cpu",
                        help="with --litertlm: both on the CPU (--target cpu files) or the GPU (--target "
                             "gpu; Vulkan from this environment, e.g. VK_ICD_FILENAMES of Mesa lavapipe)")
    args = parser.parse_args()
    if args.litertlm:
        if not args.litert:
            parser.error("--litertlm needs --litert PYTHON (ai-edge-litert) for run_generate.py")
        return engine_vs_runner(args)
    keras.utils.set_random_seed(0)
    print(f"backend {keras.backend.backend() if hasattr(keras.backend, 'backend') else 'tensorflow'}, "
          f"Keras {keras.__version__}; decode tokens/s = 1000 / ms per token")
    header = (f"{'model':14} {'runtime':8} {'C':>4} {'cached tok/s':>12} {'window tok/s':>12} "
              f"{'speed-up':>8} {'TTFT ms':>8} {'cache KiB':>9}")
    print(header)
    for name, config in MODELS.items():
        model = CausalLM({**config, "max_length": max(args.cache_lengths), "dropout": 0.0})
        model.build_on_dummy()
        for cache_length in args.cache_lengths:
            cache_kib = 2 * config["num_layers"] * cache_length * config["d_model"] * 4 / 1024
            rows = []
            if is_tensorflow():
                pair = tflite_pair(model, cache_length)
                ttft = float(np.median([median_call_ms(pair[2], max(3, args.calls // 4))
                                        for _ in range(args.repetitions)]))
                rows.append(("TFLite", measure(pair, args.repetitions, args.calls), ttft))
            keras_times = measure(keras_pair(model, cache_length), args.repetitions, args.calls)
            rows.append(("Keras", keras_times, None))
            for runtime, (decode_ms, window_ms, ratio), ttft in rows:
                ttft_text = f"{ttft:8.2f}" if ttft is not None else f"{'-':>8}"
                print(f"{name:14} {runtime:8} {cache_length:4d} {1e3 / decode_ms:12.1f} "
                      f"{1e3 / window_ms:12.1f} {ratio:7.1f}x {ttft_text} {cache_kib:9.0f}", flush=True)


if __name__ == "__main__":
    main()
