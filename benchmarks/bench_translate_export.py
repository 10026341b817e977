"""The exported translator against Keras's `translate`: BLEU and chrF per target and precision, bytes, speed.

A trained translation run (`--run`: `model.keras` and `spm.model`, default the seed-0 RoPE run
of benchmarks/bench_translate.py) is exported with `keras-posenc export --translate` for every
`--targets` and `--precisions` (float32, float16 and int8 weights), and each export's files
translate the corpus's test packages (`make corpus`: test.tsv, 2,412 pairs), greedily:

- `.tflite` files (cpu, gpu, gl) on TensorFlow's interpreter on this CPU (the gpu and gl files'
  shader-only graphs in float32: their arithmetic; the GPUs' own runs are `make test-edge`'s),
  ONNX pairs (tensorrt) on onnxruntime's CPU provider, all through the package's own search over
  the files (`export.translator.translate_with`);
- Keras's `translate_sentences` of the same model (greedy, batches of 32), in the same process.

BLEU and chrF are sacrebleu's on the detokenized text; "same" is the share of sentences whose
translation equals Keras's. Then the speed on the CPU: `export/jetson/run_translate.py` (the
device kit: one sentence at a time, a beam's hypotheses in one `decode_beams` call) on the `cpu`
file (XNNPACK, through LiteRT's CompiledModel and through the classic Interpreter, what
tflite-runtime users run) and on the `tensorrt` files (onnxruntime), against Keras's `translate_sentences` on
the same `--speed-sentences` sentences, greedy and beam 4, the two sides alternated over
`--rounds` rounds; sentences/s and the ratio per round (median). The kit runs one job (one session,
one sentence at a time), then on the `cpu` file `--jobs 2` (two sessions on two threads); Keras's
TensorFlow uses every core either way.

Usage:
    make corpus
    KERAS_BACKEND=tensorflow .venv-keras3/bin/python benchmarks/bench_translate_export.py \\
        [--run .cache/bench_translate/seed0/seq2seq] [--targets cpu gpu gl tensorrt] \\
        [--precisions float32 float16 int8] [--sentences 2412] [--out results.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from keras_posenc.app.translation import corpus_scores, load_translator, translate_sentences
from keras_posenc.app.translation_data import source_ids
from keras_posenc.export import export_translation, load_model
from keras_posenc.export.runners import TranslatorSession
from keras_posenc.export.targets import ONNX, TFLITE, target_of
from keras_posenc.export.translator import translate_with
from keras_posenc.special_ids import NUM_RESERVED_IDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIT = os.path.join(REPO, "export", "jetson", "run_translate.py")


def read_pairs(path, count=None):
    with open(path, encoding="utf-8") as f:
        pairs = [tuple(line.rstrip("\n").split("\t")[:2]) for line in f if "\t" in line]
    return pairs[:count] if count else pairs


def file_translations(result, model, processor, rows, max_new_tokens):
    """The greedy translations of `rows` by the export's files on this machine's runtime."""
    file_format = target_of(result.target).file_format
    files = result.models if file_format is ONNX or len(result.models) == 2 else result.models * 2
    session = TranslatorSession(files, file_format if file_format is ONNX else TFLITE)
    texts = []
    for row in rows:
        ids = translate_with(session, row, bos_id=model.bos_id, eos_id=model.eos_id, pad_id=model.pad_id,
                             max_new_tokens=max_new_tokens).ids[0]
        texts.append(processor.decode([int(t) for t in ids if t >= NUM_RESERVED_IDS]))
    return texts


def quality_rows(args, run, model, source_length):
    """What the export's own checks translate: dev rows, and a scorer of id lists against their references."""
    dev = read_pairs(os.path.join(args.corpus_dir, "dev.tsv"), args.dev_sentences)
    rows = [row.tolist() for row in source_ids(run.processor, [s for s, _ in dev], source_length)]

    def score(translations):
        texts = [run.processor.decode([int(t) for t in ids if t >= NUM_RESERVED_IDS]) for ids in translations]
        return corpus_scores(texts, [reference for _, reference in dev])

    return rows, score


def kit_speed(python, model_path, spm_path, sources, beam, folder, runtime, jobs=1):
    """`run_translate.py --json --runtime RUNTIME --jobs JOBS` on `sources`: its sentences/s."""
    source = os.path.join(folder, "speed.src")
    with open(source, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in sources))
    output = os.path.join(folder, f"speed-{beam}.hyp")
    done = subprocess.run([python, KIT, model_path, "--spm", spm_path, "--input", source, "--output", output,
                           "--beam-size", str(beam), "--runtime", runtime, "--jobs", str(jobs), "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["sentences_per_s"]


def keras_speed(run, sources, beam):
    start = time.perf_counter()
    translate_sentences(run, sources, beam_size=beam)
    return len(sources) / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=os.path.join(REPO, ".cache", "bench_translate", "seed0", "seq2seq"))
    parser.add_argument("--corpus-dir", default=os.path.join(REPO, ".cache", "corpus", "debian_po_en_de"))
    parser.add_argument("--targets", nargs="+", default=["cpu", "gpu", "gl", "tensorrt"])
    parser.add_argument("--precisions", nargs="+", default=["float32", "float16", "int8"])
    parser.add_argument("--sentences", type=int, default=None, help="test pairs (default: all)")
    parser.add_argument("--dev-sentences", type=int, default=200,
                        help="dev pairs of a quantized export's gate")
    parser.add_argument("--speed-sentences", type=int, default=300, help="0: no speed rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    model_path, spm_path = os.path.join(args.run, "model.keras"), os.path.join(args.run, "spm.model")
    run = load_translator(model_path)
    model = load_model(model_path, translator=True)
    test = read_pairs(os.path.join(args.corpus_dir, "test.tsv"), args.sentences)
    sources, references = [s for s, _ in test], [r for _, r in test]
    source_length, cache_length = model.max_length, model.max_length - 1
    rows = [row.tolist() for row in source_ids(run.processor, sources, source_length)]
    keras_texts, _ = translate_sentences(run, sources, beam_size=1)
    keras_scores = corpus_scores(keras_texts, references)
    results = {"run": os.path.relpath(args.run, REPO), "sentences": len(test),
               "keras_greedy": {"bleu": keras_scores["bleu"], "chrf": keras_scores["chrf"]},
               "bleu_signature": keras_scores["bleu_signature"], "exports": [], "speed": []}
    print(f"Keras translate, greedy: BLEU {keras_scores['bleu']:.2f}, chrF {keras_scores['chrf']:.2f} "
          f"({len(test)} sentences)")
    dev_rows, score = quality_rows(args, run, model, source_length)
    folder = tempfile.mkdtemp(prefix="bench_translate_export_")
    paths = {}
    print("| target | precision | bytes | checks | BLEU | ΔBLEU vs Keras | chrF | ΔchrF | same text |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for target in args.targets:
        for precision in args.precisions:
            quantize = None if precision == "float32" else precision
            result = export_translation(model, source_length=source_length, cache_length=cache_length,
                                        target=target, quantize=quantize, check_sources=dev_rows[:8],
                                        quality_sources=dev_rows if quantize else None,
                                        score=score if quantize else None)
            out = os.path.join(folder, f"de-{target}-{precision}" + target_of(target).suffix)
            result.save(out)
            paths[(target, precision)] = out
            texts = file_translations(result, model, run.processor, rows, cache_length)
            scores = corpus_scores(texts, references)
            same = float(np.mean([a == b for a, b in zip(texts, keras_texts)]))
            failures = result.failures()
            entry = {"target": target, "precision": precision, "bytes": sum(len(m) for m in result.models),
                     "failures": failures, "parity": result.parity, "bleu": scores["bleu"],
                     "chrf": scores["chrf"], "bleu_delta": scores["bleu"] - keras_scores["bleu"],
                     "chrf_delta": scores["chrf"] - keras_scores["chrf"], "same_text": same,
                     "quality": result.report.get("quality")}
            results["exports"].append(entry)
            print(f"| {target} | {precision} | {entry['bytes']:,} | {'pass' if not failures else 'FAIL'} | "
                  f"{scores['bleu']:.2f} | {entry['bleu_delta']:+.2f} | {scores['chrf']:.2f} | "
                  f"{entry['chrf_delta']:+.2f} | {same:.1%} |", flush=True)
    speed_sources = sources[:args.speed_sentences]
    if speed_sources:
        translate_sentences(run, speed_sources[:32], beam_size=1)  # Keras traces its functions once
    runs = (("cpu", "litert", 1, "cpu .tflite, LiteRT CompiledModel (XNNPACK)"),
            ("cpu", "tflite-runtime", 1, "cpu .tflite, the classic Interpreter (XNNPACK)"),
            ("cpu", "litert", 2, "cpu .tflite, LiteRT CompiledModel (XNNPACK), --jobs 2"),
            ("cpu", "tflite-runtime", 2, "cpu .tflite, the classic Interpreter (XNNPACK), --jobs 2"),
            ("tensorrt", "onnxruntime", 1, "tensorrt ONNX, onnxruntime"))
    for target, runtime, jobs, label in runs:
        if (target, "float32") not in paths or not speed_sources:
            continue
        for beam in (1, 4):
            kit, keras, ratios = [], [], []
            for _ in range(args.rounds):
                kit.append(kit_speed(sys.executable, paths[(target, "float32")], spm_path, speed_sources,
                                     beam, folder, runtime, jobs))
                keras.append(keras_speed(run, speed_sources, beam))
                ratios.append(kit[-1] / keras[-1])
            entry = {"file": label, "beam": beam, "jobs": jobs, "kit_sentences_per_s": statistics.median(kit),
                     "keras_sentences_per_s": statistics.median(keras), "ratio": statistics.median(ratios)}
            results["speed"].append(entry)
            print(f"speed {label}, beam {beam}: kit {entry['kit_sentences_per_s']:.1f} sentences/s, Keras "
                  f"{entry['keras_sentences_per_s']:.1f}, ratio {entry['ratio']:.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
