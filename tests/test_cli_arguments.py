"""`keras-posenc` as a user drives it: flags, defaults, messages, exit status and printed lines.

Every subcommand runs through `cli.main(argv)` with the work below it (training, conversion,
generation, the ablation, the diagnostics) replaced by stand-ins that record what they are called
with and return canned results: these tests check what the command line itself does (parse, check,
pass on, print), in well under a second each, so that `make mutation MODULE=keras_posenc/app/cli.py`
(and `cli_flags.py`, `cli_train.py`, `cli_trained_run.py`, `cli_export.py`, `cli_ablate.py`) can run
them per mutant. The real runs behind the stand-ins are tested in tests/test_cli.py,
tests/test_export*.py, tests/test_train*.py and tests/test_ablation.py.
"""

import dataclasses
import json
import os
import signal
import sys
import warnings

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from keras_posenc import _startup, backend, export
from keras_posenc.app import ablation, cli, cli_train, diagnostics, text_generation
from keras_posenc.app import dataset as data
from keras_posenc.app import train as train_lib
from keras_posenc.app.run_lock import LOCK_FILE
from keras_posenc.app.train import TrainConfig, TrainingInterrupted
from keras_posenc.export import quantization
from keras_posenc.export.litert_python import INSTALL_HINT
from keras_posenc.files import FileWriteError

MODEL = object()  # what the stand-in of `export.load_model` loads


def run(capsys, *argv):
    """`keras-posenc ARGV`: `(exit status, stdout lines, stderr lines)`; argparse's exits included."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out.splitlines(), captured.err.splitlines()


def lock_holder(folder):
    """The pid in the run lock of `folder`, None when no run holds it."""
    path = os.path.join(folder, LOCK_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return int(f.read())


# --help: the whole text a user reads ------------------------------------------------------------
# Printed 1000 columns wide (COLUMNS), so that every entry is one line whatever the terminal.
VARIANTS = ("{sinusoidal,sinusoidal-factorized,sinusoidal-interpolated,learned,integer,integer-raw,none,rope,"
            "rope-ntk,rope-yarn,rope-llama3,alibi}")
ARMS = "{base,pad-not-zeroed,norm-over-positions,pe-dropout,compressed,no-language-scale,learned}"
VERBOSE_HELP = ("also show TensorFlow's, XLA's and TFLite's log lines and the libraries' warnings "
                "(default: off)")
HELP = {
    (): """usage: keras-posenc [-h] COMMAND ...

The `keras-posenc` command line: `demo`, `train`, `generate`, `translate`, `inspect`, `export`, `ablate`.

positional arguments:
  COMMAND
    demo      train a small LM on the embedded corpus (a few minutes on a CPU)
    train     train a causal LM on a text or TSV corpus, or a translator (--task translate)
    generate  generate text from a trained model (KV cache)
    translate
              translate sentences with a trained run (beam search); BLEU/chrF with --reference
    inspect   position-embedding diagnostics of a trained model
    export    convert a trained model to TFLite for edge GPUs (builtin ops only)
    ablate    position-encoding ablation and length extrapolation; seed 002's claims in BLEU

options:
  -h, --help  show this help message and exit
""",
    ("train",): f"""usage: keras-posenc train [-h] [--task {{lm,translate}}] [--corpus CORPUS] \
[--dev-corpus DEV_CORPUS] \
[--dev-sentences DEV_SENTENCES] [--out OUT] [--format {{text,tsv}}] [--skip-bad-lines] [--vocab-size \
VOCAB_SIZE] [--no-bos] [--no-eos] [--eval-fraction EVAL_FRACTION] [--max-length MAX_LENGTH] [--num-layers \
NUM_LAYERS] [--d-model D_MODEL] [--num-heads NUM_HEADS] [--dff DFF] [--dropout DROPOUT] [--norm-first] \
[--label-smoothing LABEL_SMOOTHING] [--share-embeddings] [--position \
{{sinusoidal,learned,integer,none,rope,alibi,rope-ntk,rope-yarn,rope-llama3}}] [--table \
{{full,interpolated,factorized}}] [--steps STEPS] [--batch-size BATCH_SIZE] [--warmup-steps WARMUP_STEPS] \
[--lr-scale LR_SCALE] [--seed SEED] [--checkpoint-every CHECKPOINT_EVERY] [--keep-checkpoints \
KEEP_CHECKPOINTS] [--log-every LOG_EVERY] [--resume] [--strategy {{default,mirrored,multiworker}}] \
[--jit-compile {{auto,on,off}}] [--quiet] [--verbose]

Trains a causal next-token LM. A TSV corpus (source<TAB>target) is trained as 'source <sep> target' with \
language ids 0/1 and a position scale per language. --task translate trains an encoder-decoder Transformer \
on the pairs instead and keeps the weights of the best dev BLEU (scored at every checkpoint). Without \
--warmup-steps the warmup is min(4000, max(1, steps // 2)).

options:
  -h, --help            show this help message and exit
  --verbose             {VERBOSE_HELP}

data:
  --task {{lm,translate}}
                        lm: a causal next-token LM; translate: an encoder-decoder translator of the pairs \
of a --format tsv corpus (default: lm)
  --corpus CORPUS       corpus file (default: the embedded English corpus)
  --dev-corpus DEV_CORPUS
                        --task translate: TSV pairs whose BLEU picks the kept model (default: the held-out \
split of --corpus)
  --dev-sentences DEV_SENTENCES
                        --task translate: dev pairs translated (greedy) at each checkpoint, the first N \
(default: 500)
  --out OUT             output folder (default: runs/train)
  --format {{text,tsv}}   text: one document or sentence per line; tsv: source<TAB>target (default: text)
  --skip-bad-lines      skip TSV lines without exactly one tab (default: off)
  --vocab-size VOCAB_SIZE
                        SentencePiece vocabulary size (default: 2000)
  --no-bos              do not start sequences with <s> (default: off)
  --no-eos              do not end sequences with </s> (default: off)
  --eval-fraction EVAL_FRACTION
                        share of examples held out for evaluation (default: 0.05)

model:
  --max-length MAX_LENGTH
                        longest input sequence in tokens (independent of --vocab-size) (default: 64)
  --num-layers NUM_LAYERS
                        encoder layers (--task translate: encoder and decoder layers each) (default: 2)
  --d-model D_MODEL     model width (default: 64)
  --num-heads NUM_HEADS
                        attention heads (default: 4)
  --dff DFF             feed-forward width (default: 256)
  --dropout DROPOUT     dropout rate (default: 0.1)
  --norm-first          pre-LN blocks (default: off)
  --label-smoothing LABEL_SMOOTHING
                        --task translate: label smoothing of the training loss (default: 0.1)
  --share-embeddings    --task translate: one embedding for source and target and the softmax tied to it \
(Vaswani et al., section 3.4) (default: off)
  --position {{sinusoidal,learned,integer,none,rope,alibi,rope-ntk,rope-yarn,rope-llama3}}
                        position encoding (default: sinusoidal; --task translate: rope)
  --table {{full,interpolated,factorized}}
                        sinusoidal table storage (only for --position sinusoidal) (default: full)

training:
  --steps STEPS         total optimizer steps (a resumed run continues to it) (default: 1000)
  --batch-size BATCH_SIZE
                        global batch size (split across replicas) (default: 32)
  --warmup-steps WARMUP_STEPS
                        learning-rate warmup steps (default: min(4000, max(1, steps // 2)), so short runs \
leave warmup)
  --lr-scale LR_SCALE   factor on the warmup schedule (default: 1.0)
  --seed SEED           seed of the split, data order, initialization and dropout (default: 0)
  --checkpoint-every CHECKPOINT_EVERY
                        steps between checkpoints (default: 100)
  --keep-checkpoints KEEP_CHECKPOINTS
                        how many checkpoints to keep (default: 3)
  --log-every LOG_EVERY
                        TensorBoard logging interval in steps (default: 10)
  --resume              continue from the latest checkpoint in --out (default: off)
  --strategy {{default,mirrored,multiworker}}
                        tf.distribute strategy; multiworker reads TF_CONFIG (default: default)
  --jit-compile {{auto,on,off}}
                        XLA-compile the train and eval steps (one compile per bucket length); auto: on for \
one GPU, off on CPUs, where compiling costs more than it saves (default: auto)
  --quiet               no progress bar (default: off)
""",
    ("translate",): f"""usage: keras-posenc translate [-h] --input INPUT [--output OUTPUT] \
[--beam-size BEAM_SIZE] \
[--length-penalty ALPHA] [--batch-size BATCH_SIZE] [--max-new-tokens MAX_NEW_TOKENS] [--reference \
REFERENCE] [--spm SPM] [--json] [--verbose] RUN_DIR_OR_MODEL

Translates one sentence per line with a run of `keras-posenc train --task translate` (or a decoder-only run \
trained with --format tsv, which continues '<s> source <sep>'): batched beam search over a key/value cache, \
GNMT's length penalty; beam 1 is greedy. With --reference, prints sacrebleu's BLEU and chrF and their \
signatures. Translations go to --output; with --output - (stdout) the score and timing lines go to stderr.

positional arguments:
  RUN_DIR_OR_MODEL      a run folder (model.keras + spm.model), or a .keras file with spm.model beside it

options:
  -h, --help            show this help message and exit
  --input INPUT         source sentences, one per line; - reads stdin
  --output OUTPUT       translations, one per line, written atomically; - is stdout (default: -)
  --beam-size BEAM_SIZE
                        beams; 1 is greedy (default: 4)
  --length-penalty ALPHA
                        alpha of GNMT's length penalty ((5 + length) / 6) ** alpha (default: 1.0)
  --batch-size BATCH_SIZE
                        sentences per batch, sorted by length (default: 32)
  --max-new-tokens MAX_NEW_TOKENS
                        target tokens at most (default: what the model's max length leaves)
  --reference REFERENCE
                        reference translations, one per input line: print BLEU and chrF
  --spm SPM             SentencePiece model (default: spm.model beside the model)
  --json                print the scores and timing as one JSON object (default: off)
  --verbose             {VERBOSE_HELP}
""",
    ("demo",): f"""usage: keras-posenc demo [-h] [--out OUT] [--steps STEPS] [--seed SEED] [--quiet] \
[--verbose]

Trains a small causal LM on the embedded English corpus, writes the model, tokenizer, report and loss \
plot, and exports the model to TFLite.

options:
  -h, --help     show this help message and exit
  --verbose      {VERBOSE_HELP}

data:
  --out OUT      output folder (default: runs/demo)

training:
  --steps STEPS  total optimizer steps (a resumed run continues to it) (default: 1000)
  --seed SEED    seed of the split, data order, initialization and dropout (default: 0)
  --quiet        no progress bar (default: off)
""",
    ("generate",): f"""usage: keras-posenc generate [-h] --prompt PROMPT [--max-new-tokens MAX_NEW_TOKENS] \
[--sampler {{greedy,top_k,top_p}}] [--temperature TEMPERATURE] [--top-k K] [--top-p P] [--seed SEED] \
[--language LANGUAGE_IDS] [--spm SPM] [--json] [--verbose] RUN_DIR_OR_MODEL

Continues a prompt with a model trained by `keras-posenc train`, using the run's SentencePiece tokenizer: \
one prefill, then one cached decode step per token. Prints the text, then the time to first token and the \
decode tokens/s.

positional arguments:
  RUN_DIR_OR_MODEL      a run folder (model.keras + spm.model), or a .keras file with spm.model beside it

options:
  -h, --help            show this help message and exit
  --prompt PROMPT       the text to continue
  --max-new-tokens MAX_NEW_TOKENS
                        tokens to generate (default: 32)
  --sampler {{greedy,top_k,top_p}}
                        (default: greedy)
  --temperature TEMPERATURE
                        sampling temperature (default: 1.0)
  --top-k K             k of --sampler top_k (default: none)
  --top-p P             p of --sampler top_p (default: none)
  --seed SEED           seed of the sampler (default: none, random)
  --language LANGUAGE_IDS
                        language id of every token, for models with a position scale per language (TSV \
runs: 0 source, 1 target) (default: none)
  --spm SPM             SentencePiece model (default: spm.model beside the model)
  --json                print one JSON object {{"ids", "text", "ttft_ms", "decode_tokens_per_s"}} \
(default: off)
  --verbose             {VERBOSE_HELP}
""",
    ("inspect",): f"""usage: keras-posenc inspect [-h] [--out OUT] [--text TEXT] [--verbose] model

PE value-range check, PE heatmap, positional-contribution ratio and attention focus by distance of a \
model saved by `train` (model.keras).

positional arguments:
  model        path of model.keras (spm.model beside it is used for text)

options:
  -h, --help   show this help message and exit
  --out OUT    folder for the PNGs and inspect.json (default: beside the model)
  --text TEXT  probe sentence, repeatable (default: sentences of the embedded corpus)
  --verbose    {VERBOSE_HELP}
""",
    ("ablate",): f"""usage: keras-posenc ablate [-h] [--task {{lm,translate}}] [--corpus CORPUS] \
[--corpus-dir CORPUS_DIR] [--steps STEPS] [--seeds SEEDS] [--variants {VARIANTS} [{VARIANTS} ...]] \
[--arms {ARMS} [{ARMS} ...]] [--out OUT] [--quick] [--no-causal-mask] [--verbose]

--task lm (default): trains the same causal LM with every position variant and several seeds, evaluates \
held-out loss at the training length and at 2x and 4x, and writes ablation.md, ablation.json, \
loss_curves.png, extrapolation.png and attention_focus.png (about 10 minutes on 2 CPU cores). --task \
translate: trains the encoder-decoder translator once per arm of seed 002's six claims and seed on the \
corpus of `make corpus`, and writes translation_ablation.md, translation_ablation.json, bleu_by_length.png \
and claims.png (about 2 hours on 2 CPU cores). --quick trains a tiny model for a few steps (seconds to \
minutes; for tests).

options:
  -h, --help            show this help message and exit
  --task {{lm,translate}}
                        what to ablate: position variants of the LM, or seed 002's translation claims \
(default: lm)
  --corpus CORPUS       --task lm: plain-text corpus (default: the embedded English corpus)
  --corpus-dir CORPUS_DIR
                        --task translate: folder with train.tsv and test.tsv (default: \
.cache/corpus/debian_po_en_de, from `make corpus`)
  --steps STEPS         optimizer steps per run (default: 700, --task translate 2000; --quick 4, --task \
translate 40)
  --seeds SEEDS         number of seeds 0, 1, ..., N-1 (default: 3; --quick 2)
  --variants {VARIANTS} [{VARIANTS} ...], --position {VARIANTS} [{VARIANTS} ...]
                        --task lm: subset of the variants, e.g. rope rope-ntk rope-yarn alibi (default: all)
  --arms {ARMS} [{ARMS} ...]
                        --task translate: subset of the arms (default: all; a claim is reported when both \
of its arms ran)
  --out OUT             output folder (default: runs/ablation, --task translate runs/ablation-translate)
  --quick               tiny model, 4 steps (--task translate 40, 60 test pairs), 2 seeds (default: off)
  --no-causal-mask      --task lm: train the unmasked encoder of article 000 on next-token targets (the \
target is visible in the input: a copy task that needs positions) (default: off)
  --verbose             {VERBOSE_HELP}
""",
    ("export",): f"""usage: keras-posenc export [-h] --out OUT [--sequence-length SEQUENCE_LENGTH] \
[--batch-size BATCH_SIZE] [--quantize {{float16,int8,int4,dynamic_int8}}] [--target \
{{gpu,gl,cpu,tensorrt}}] [--embedding {{host,graph}}] [--require-gpu] [--tolerance TOLERANCE] \
[--token-ids TOKEN_IDS] [--eval-corpus EVAL_CORPUS] [--max-loss-increase MAX_LOSS_INCREASE] \
[--litert-python LITERT_PYTHON] [--generate] [--cache-length CACHE_LENGTH] [--prompt-length \
PROMPT_LENGTH] [--format {{tflite,litertlm,genai}}] [--spm SPM] [--probe-prompt PROBE_PROMPTS] \
[--translate] [--source-length SOURCE_LENGTH] [--max-bleu-drop MAX_BLEU_DROP] [--beam-rows BEAM_ROWS] \
[--dev-sentences DEV_SENTENCES] [--verbose] model

Rebuilds the model with fixed input shapes under float32, freezes the position tables as constants, \
converts with TFLite builtin ops only (never Flex) and prints the op histogram, the GPU-delegate verdict, \
the parity against Keras on a real token batch and the file size against the weight bytes. Exit status 1 \
when the parity exceeds the tolerance or, with --require-gpu, when the target's GPU backend does not run \
every op. export/jetson/README.md takes the file to a Jetson.

positional arguments:
  model                 trained model (.keras, .h5 or SavedModel folder)

options:
  -h, --help            show this help message and exit
  --out OUT             output .tflite file (FILE.json with its input shapes is written beside)
  --sequence-length SEQUENCE_LENGTH
                        fixed input length, at most the model's max_length (default: none; required \
without --generate)
  --batch-size BATCH_SIZE
                        fixed batch (gpu, cpu, tensorrt; gl runs batch 1 only) (default: 1)
  --quantize {{float16,int8,int4,dynamic_int8}}
                        float16, int8 or int4 weights (dynamic_int8: the older name of int8), made by the \
quantizer measured best for the target (keras_posenc/export/quantization.py; int4: LiteRT Quantizer, not \
on gl) and checked on held-out text (default: none, float32)
  --target {{gpu,gl,cpu,tensorrt}}
                        gpu: LiteRT GPU accelerator / OpenCL delegate; gl: OpenGL ES delegate (float \
inputs); cpu: XNNPACK with GATHER; tensorrt: ONNX for trtexec (default: gpu)
  --embedding {{host,graph}}
                        gpu/gl/tensorrt: host = the file takes the looked-up rows table[ids] as float \
input `embeddings` (the kit reads them from FILE.embeddings.npy), graph = the lookup in the file (gpu/gl: \
a one-hot product on the GPU, T x vocab x d_model multiply-adds; tensorrt: GATHER) (default: host for \
gpu/gl models with a token table, the faster on a GPU; graph otherwise)
  --require-gpu         fail when the GPU delegate would reject an op (default: off; window exports only)
  --tolerance TOLERANCE
                        max abs parity on real tokens (default: 1e-4; float16 2e-2; int8 report only)
  --token-ids TOKEN_IDS
                        int .npy [n, sequence-length] for the parity check (default: corpus sentences \
tokenized with spm.model beside the model, else a synthetic padded batch)
  --eval-corpus EVAL_CORPUS
                        with --quantize: a text file (one sentence per line) of held-out text on which \
the quantized file's cross-entropy is compared with a float32 export's (default: the run's eval split, \
read from report.json and spm.model beside the model; without them the loss is not measured)
  --max-loss-increase MAX_LOSS_INCREASE
                        with --quantize: fail when the held-out cross-entropy rises by more than this \
fraction over the float32 file's (default: 0.01, 1%)
  --litert-python LITERT_PYTHON, --litertlm-python LITERT_PYTHON
                        a Python with LiteRT's tools (litert-lm-builder, litert-lm-api 0.18.1, \
litert-quantizer 0.11.0): --format litertlm, --quantize int4, and the checks of files only LiteRT 2.x \
computes right (default: $KERAS_POSENC_LITERT_PYTHON, else this one if it has them, else one that \
keras-posenc creates on first use in $KERAS_POSENC_HOME)
  --verbose             {VERBOSE_HELP}

generation:
  one file with prefill and decode signatures and the key/value cache as inputs and outputs, for \
export/jetson/run_generate.py (CausalLM; --target gl: STEM.prefill.tflite and STEM.decode.tflite, \
tensorrt: STEM.prefill.onnx and STEM.decode.onnx)

  --generate            export prefill + decode (default: off)
  --cache-length CACHE_LENGTH
                        cache slots: prompt + generated tokens, at most max_length (default: none; \
required with --generate; --translate: the model's max_length - 1)
  --prompt-length PROMPT_LENGTH
                        prefill length P, prompts are right-padded to it (default: cache-length // 2)
  --format {{tflite,litertlm,genai}}
                        tflite: the prefill/decode file of run_generate.py; litertlm: a bundle for \
LiteRT-LM's Engine and `litert-lm` (model in its contract, spm.model, LlmMetadata; --target cpu or gpu), \
checked on the engine; genai: --out is a folder for onnxruntime-genai (one decoder ONNX, genai_config.json, \
tokenizer.json from spm.model; no --target), checked fed as it feeds it (default: tflite)
  --spm SPM             --format litertlm / genai: the SentencePiece model to bundle (default: spm.model \
beside the model)
  --probe-prompt PROBE_PROMPTS
                        --format litertlm / genai: a prompt of the check, repeatable (default: texts of \
the vocabulary, one longer than the prefill, and a second turn)

translation:
  a Seq2SeqTransformer (train --task translate) as an `encode` signature (the source to every decoder \
layer's cross-attention keys and values) and the cached `decode` step, for export/jetson/run_translate.py \
(--target cpu: one file; tensorrt: STEM.encode.onnx and STEM.decode.onnx); --cache-length: target tokens at \
most (default: the model's max_length - 1, as translate)

  --translate           export a translator (default: off)
  --source-length SOURCE_LENGTH
                        source ids per sentence (pieces and </s>), right-padded (default: the model's \
max_length)
  --max-bleu-drop MAX_BLEU_DROP
                        with --quantize: fail when the quantized file's greedy BLEU on the run's dev pairs \
(or --eval-corpus TSV) is lower than float32's by more than this (default: 1.0)
  --beam-rows BEAM_ROWS
                        rows of the decode_beams signature (a beam search's hypotheses in one call; 0: \
none) (default: 4, translate's beam, on cpu and tensorrt; none on gpu and gl, batch 1)
  --dev-sentences DEV_SENTENCES
                        with --quantize: dev pairs both files translate (default: 200)
""",
}


@pytest.mark.parametrize("command", list(HELP))
def test_help_is_the_documented_text(command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")
    code, out, err = run(capsys, *command, "--help")
    assert (code, err) == (0, [])
    assert out == HELP[command].splitlines()


# argument errors: argparse's usage line, then one error line ----------------------------------
@pytest.mark.parametrize("argv, line", [
    ((), "keras-posenc: error: the following arguments are required: COMMAND"),
    (("train", "--steps", "0"), "keras-posenc train: error: argument --steps: expected a positive integer, "
                                "got '0'"),
    (("train", "--steps", "-3"), "keras-posenc train: error: argument --steps: expected a positive integer, "
                                 "got '-3'"),
    (("train", "--steps", "2.5"), "keras-posenc train: error: argument --steps: expected a positive integer, "
                                  "got '2.5'"),
    (("train", "--dropout", "x"), "keras-posenc train: error: argument --dropout: invalid float value: 'x'"),
    (("train", "--seed", "x"), "keras-posenc train: error: argument --seed: invalid int value: 'x'"),
    (("train", "--position", "rotary"), "keras-posenc train: error: argument --position: invalid choice: "
                                        "'rotary' (choose from 'sinusoidal', 'learned', 'integer', 'none', "
                                        "'rope', 'alibi', 'rope-ntk', 'rope-yarn', 'rope-llama3')"),
    (("train", "--format", "csv"), "keras-posenc train: error: argument --format: invalid choice: 'csv' "
                                   "(choose from 'text', 'tsv')"),
    (("demo", "--vocab-size", "9"), "keras-posenc: error: unrecognized arguments: --vocab-size 9"),
    (("export", "m.keras", "--out", "x", "--max-loss-increase", "-0.5"),
     "keras-posenc export: error: argument --max-loss-increase: expected a number >= 0, got '-0.5'"),
    (("export", "m.keras", "--out", "x", "--max-loss-increase", "nan"),
     "keras-posenc export: error: argument --max-loss-increase: expected a number >= 0, got 'nan'"),
    (("export", "m.keras", "--out", "x", "--max-loss-increase", "one"),
     "keras-posenc export: error: argument --max-loss-increase: expected a number >= 0, got 'one'"),
    (("export", "m.keras", "--sequence-length", "8"),
     "keras-posenc export: error: the following arguments are required: --out"),
    (("generate", "run", "--prompt", "x", "--top-k", "0"),
     "keras-posenc generate: error: argument --top-k: expected a positive integer, got '0'"),
    (("ablate", "--seeds", "0"), "keras-posenc ablate: error: argument --seeds: expected a positive integer, "
                                 "got '0'"),
])
def test_a_bad_argument_is_argparse_usage_and_one_error_line(argv, line, capsys):
    code, out, err = run(capsys, *argv)
    assert (code, out, err[-1]) == (2, [], line)
    assert err[0].startswith("usage: keras-posenc")


def test_the_demo_description_is_printed_as_written(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "60")
    code, out, _ = run(capsys, "demo", "--help")
    assert code == 0
    assert ("Trains a small causal LM on the embedded English corpus, writes the model, tokenizer, report "
            "and loss plot, and exports the model to TFLite.") in out


def test_the_smallest_accepted_values():
    args = cli.build_parser().parse_args(["export", "m.keras", "--out", "x", "--sequence-length", "1",
                                          "--max-loss-increase", "0"])
    assert (args.sequence_length, args.max_loss_increase) == (1, 0.0)
    args = cli.build_parser().parse_args(["export", "m.keras", "--out", "x", "--max-loss-increase", "0.25"])
    assert args.max_loss_increase == 0.25


# train -----------------------------------------------------------------------------------------
REPORT = {"steps": 7, "final_train_loss": 1.25, "eval_loss": 2.5, "eval_perplexity": 12.18,
          "unigram_eval_loss": 3.0, "unigram_eval_perplexity": 20.09, "tokens_per_second": 1234.4,
          "beats_unigram": True, "warmup_steps": 3}


def summary(out, report=REPORT):
    """The lines `train` and `demo` print after training, for `report`."""
    lines = [f"steps: {report['steps']}  final train loss: {report['final_train_loss']}",
             "eval loss: 2.5000 (perplexity 12.2)",
             "unigram baseline on the same eval split: 3.0000 (perplexity 20.1)"]
    if report["tokens_per_second"]:
        lines.append("throughput: 1234 tokens/s")
    lines.append("artifacts:")
    lines += [f"  {os.path.join(out, name)}"
              for name in ("model.keras", "spm.model", "report.json", "loss.png", "logs", "checkpoints")]
    if not report["beats_unigram"]:
        lines.append("WARNING: the eval loss 2.5000 is not below the unigram baseline 3.0000: the model "
                     "predicts no better than word frequencies. Train longer (--steps) or check "
                     "--warmup-steps (3) and --lr-scale.")
    return lines


@pytest.fixture
def trainer(monkeypatch):
    """`train.train` replaced: records each config and the run lock's holder; returns `report` (settable)."""
    calls = {"configs": [], "holders": [], "report": REPORT}

    def train(config):
        calls["configs"].append(config)
        calls["holders"].append(lock_holder(config.out))
        if isinstance(calls["report"], BaseException):
            raise calls["report"]
        return calls["report"]

    monkeypatch.setattr(train_lib, "train", train)
    return calls


def test_train_without_flags_trains_the_default_config(trainer, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "train")
    assert (code, err) == (0, [])
    assert trainer["configs"] == [TrainConfig()]
    assert out == summary(os.path.join("runs", "train"))


def test_train_passes_every_flag_on(trainer, tmp_path, capsys):
    out_dir = str(tmp_path / "run")
    code, out, _ = run(capsys, "train", "--corpus", "c.tsv", "--format", "tsv", "--skip-bad-lines",
                       "--vocab-size", "300", "--no-bos", "--no-eos", "--eval-fraction", "0.2",
                       "--max-length", "40", "--num-layers", "3", "--d-model", "32", "--num-heads", "2",
                       "--dff", "48", "--dropout", "0.25", "--norm-first", "--position", "rope", "--table",
                       "factorized", "--steps", "9", "--batch-size", "8", "--warmup-steps", "5", "--lr-scale",
                       "0.5", "--seed", "-4", "--checkpoint-every", "6", "--keep-checkpoints", "2",
                       "--log-every", "7", "--resume", "--strategy", "mirrored", "--jit-compile", "off",
                       "--quiet", "--out", out_dir)
    assert code == 0
    expected = TrainConfig(
        corpus="c.tsv", out=out_dir, corpus_format="tsv", skip_bad_lines=True, vocab_size=300, add_bos=False,
        add_eos=False, eval_fraction=0.2, max_length=40, num_layers=3, d_model=32, num_heads=2, dff=48,
        dropout=0.25, norm_first=True, position="rope", table="factorized", steps=9, batch_size=8,
        warmup_steps=5, lr_scale=0.5, seed=-4, checkpoint_every=6, keep_checkpoints=2, log_every=7,
        resume=True, strategy="mirrored", jit_compile="off", verbose=0)
    assert trainer["configs"] == [expected]
    # as report.json records it (verbose 0, not false)
    recorded = [json.dumps(dataclasses.asdict(config)) for config in trainer["configs"]]
    assert recorded == [json.dumps(dataclasses.asdict(expected))]
    assert out == summary(out_dir)


@pytest.mark.parametrize("changes", [{"tokens_per_second": None}, {"tokens_per_second": 0.0},
                                     {"beats_unigram": False}])
def test_the_summary_drops_a_missing_throughput_and_flags_a_model_below_the_baseline(changes, trainer,
                                                                                    tmp_path, capsys):
    trainer["report"] = dict(REPORT, **changes)
    code, out, _ = run(capsys, "train", "--out", str(tmp_path))
    assert code == 0
    assert out == summary(str(tmp_path), trainer["report"])


def test_tsv_without_a_corpus_is_refused_before_training(trainer, tmp_path, capsys):
    code, out, err = run(capsys, "train", "--format", "tsv", "--out", str(tmp_path / "run"))
    assert (code, out, err) == (2, [], ["keras-posenc: error: --format tsv needs --corpus PATH (the embedded "
                                        "corpus is plain text)."])
    assert trainer["configs"] == [] and not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("error, code, line", [
    (ValueError("bad\n  value"), 2, "keras-posenc: error: bad value"),
    (OSError("disk\n\nfull"), 2, "keras-posenc: error: disk full"),
    (FileWriteError(28, "cannot write x: No space left on device"), 2,
     "keras-posenc: error: cannot write x: No space left on device"),
    (tf.errors.DataLossError(None, None, "{{function_node __wrapped__X}} corrupt record\nat 12"), 2,
     "keras-posenc: error: DataLossError: corrupt record at 12"),
    (tf.errors.NotFoundError(None, None, "x; {{function_node y}} not found"), 2,
     "keras-posenc: error: NotFoundError: x; {{function_node y}} not found"),
    (tf.errors.NotFoundError(None, None, "{{function_node f}} {{node g}} not found"), 2,
     "keras-posenc: error: NotFoundError: {{node g}} not found"),
    (tf.errors.UnknownError(None, None, "{{function_node f cut short"), 2,
     "keras-posenc: error: UnknownError: {{function_node f cut short"),
    (KeyboardInterrupt(), 130, "keras-posenc: interrupted (SIGINT)."),
    (TrainingInterrupted(signal.SIGTERM, 12, "ck/ckpt-12"), 143,
     "keras-posenc: stopped by SIGTERM at step 12: saved the checkpoint ck/ckpt-12; continue with --resume."),
    (TrainingInterrupted(signal.SIGINT, 3, "ck/ckpt-3"), 130,
     "keras-posenc: stopped by SIGINT at step 3: saved the checkpoint ck/ckpt-3; continue with --resume."),
    (ModuleNotFoundError("No module named 'sentencepiece'", name="sentencepiece"), 2,
     "keras-posenc: error: the command needs the application's dependencies (No module named "
     "'sentencepiece'): pip install 'keras-posenc[app]'."),
    (ModuleNotFoundError("No module named 'tensorflow_text.core'", name="tensorflow_text.core"), 2,
     "keras-posenc: error: the command needs the application's dependencies (No module named "
     "'tensorflow_text.core'): pip install 'keras-posenc[app]'."),
])
def test_a_failure_below_the_command_is_one_line_and_its_status(error, code, line, trainer, tmp_path, capsys):
    trainer["report"] = error
    assert run(capsys, "train", "--out", str(tmp_path)) == (code, [], [line])


@pytest.mark.parametrize("name", ["numpy_extra", None, "matplotlibx"])
def test_a_missing_module_outside_the_app_extra_is_not_hidden(name, trainer, tmp_path, capsys):
    trainer["report"] = ModuleNotFoundError(f"No module named {name!r}", name=name)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["train", "--out", str(tmp_path)])


def test_another_backend_is_refused_before_the_command_runs(trainer, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(backend, "is_tensorflow", lambda: False)
    monkeypatch.setattr(backend, "backend_name", lambda: "jax")
    code, out, err = run(capsys, "train", "--out", str(tmp_path))
    assert (code, out, err) == (2, [], ["keras-posenc: error: `train` needs KERAS_BACKEND=tensorflow (this "
                                        "process runs Keras on jax)."])
    assert trainer["configs"] == []


@pytest.mark.parametrize("verbose, shown", [
    ((), ["keras-posenc: warning: the package's own"]),
    (("--verbose",), ["keras-posenc: warning: the package's own", "keras-posenc: warning: a library's"]),
])
def test_the_package_warnings_show_and_a_librarys_only_with_verbose(verbose, shown, monkeypatch, tmp_path,
                                                                     capsys):
    before = warnings.showwarning

    def train(config):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            own = os.path.join(_startup.PACKAGE_DIR, "x.py")
            warnings.warn_explicit("the package's own", UserWarning, own, 1)
            warnings.warn_explicit("a library's", UserWarning, "/usr/lib/python3/site-packages/lib.py", 2)
        return REPORT

    monkeypatch.setattr(train_lib, "train", train)
    code, _, err = run(capsys, "train", "--out", str(tmp_path), *verbose)
    assert (code, err) == (0, shown)
    assert warnings.showwarning is before


# demo ------------------------------------------------------------------------------------------
@pytest.fixture
def generator(monkeypatch):
    """`text_generation.load_run` and `generate_text` replaced: record their arguments."""
    calls = {}
    result = {"ids": [5, 6, 3], "text": "sat down.", "ttft_ms": 12.34, "decode_tokens_per_s": 56.78}

    def load_run(path, spm_path=None):
        calls["load_run"] = (path, spm_path)
        return "the model", b"the tokenizer"

    def generate_text(model, sp_model, prompt, **generation):
        calls["generate_text"] = (model, sp_model, prompt, generation)
        return result

    monkeypatch.setattr(text_generation, "load_run", load_run)
    monkeypatch.setattr(text_generation, "generate_text", generate_text)
    calls["result"] = result
    return calls


def test_demo_trains_then_exports_and_generates_in_its_folder(trainer, exports, generator, tmp_path,
                                                              monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exports["failures"] = ["FAILED: the GPU does not run every op."]
    code, out, err = run(capsys, "demo")
    folder = os.path.join("runs", "demo")
    assert (code, err) == (1, [])  # the export's status
    assert trainer["configs"] == [TrainConfig(**cli_train.DEMO_SETTINGS)]
    assert trainer["holders"] == [os.getpid()] and exports["holder"] == os.getpid()
    assert exports["load_model"] == os.path.join(folder, "model.keras")
    assert exports["export_and_check"] == ((), window_options(sequence_length=48))
    assert exports["checked"] == (None, True)
    assert generator["load_run"] == (folder, None)
    assert generator["generate_text"] == ("the model", b"the tokenizer", "The module", {"max_new_tokens": 16})
    assert out == ([f"Training a causal LM on the embedded corpus for 1000 steps; writing to {folder}"]
                   + summary(folder)
                   + ["Exporting the demo model to TFLite (float32, GPU target):"]
                   + printed(os.path.join(folder, "model.tflite"), exports["failures"])
                   + [f"Generating from the demo model (keras-posenc generate {folder} --prompt "
                      "'The module'):",
                      "The module sat down.",
                      "time to first token 12.3 ms, decode 56.8 tokens/s (3 tokens)"])
    assert not os.path.exists(os.path.join(folder, LOCK_FILE))


def test_demo_flags_replace_only_their_own_settings(trainer, exports, generator, tmp_path, capsys):
    out_dir = str(tmp_path / "d")
    code, out, _ = run(capsys, "demo", "--out", out_dir, "--steps", "7", "--seed", "3", "--quiet")
    assert code == 0 and exports["saved"] == os.path.join(out_dir, "model.tflite")
    demo_config = TrainConfig(**cli_train.DEMO_SETTINGS)
    assert trainer["configs"] == [dataclasses.replace(demo_config, out=out_dir, steps=7, seed=3, verbose=0)]
    assert out[0] == f"Training a causal LM on the embedded corpus for 7 steps; writing to {out_dir}"


# generate --------------------------------------------------------------------------------------
def test_generate_passes_the_defaults(generator, capsys):
    code, out, err = run(capsys, "generate", "runs/x", "--prompt", "The cat")
    assert (code, err) == (0, [])
    assert generator["load_run"] == ("runs/x", None)
    assert generator["generate_text"] == ("the model", b"the tokenizer", "The cat", {
        "max_new_tokens": 32, "sampler": "greedy", "temperature": 1.0, "k": None, "p": None, "seed": None,
        "language_ids": None})
    assert out == ["The cat sat down.", "time to first token 12.3 ms, decode 56.8 tokens/s (3 tokens)"]


def test_generate_passes_every_flag_and_prints_json(generator, capsys):
    code, out, _ = run(capsys, "generate", "m.keras", "--prompt", "Hi", "--max-new-tokens", "5", "--sampler",
                       "top_p", "--temperature", "0.7", "--top-k", "4", "--top-p", "0.9", "--seed", "11",
                       "--language", "1", "--spm", "t.model", "--json")
    assert code == 0
    assert generator["load_run"] == ("m.keras", "t.model")
    assert generator["generate_text"] == ("the model", b"the tokenizer", "Hi", {
        "max_new_tokens": 5, "sampler": "top_p", "temperature": 0.7, "k": 4, "p": 0.9, "seed": 11,
        "language_ids": 1})
    assert [json.loads(line) for line in out] == [generator["result"]]


def test_generate_needs_a_prompt_and_a_known_sampler(generator, capsys):
    code, _, err = run(capsys, "generate", "run")
    assert (code, err[-1]) == (2, "keras-posenc generate: error: the following arguments are required: "
                                  "--prompt")
    code, _, err = run(capsys, "generate", "run", "--prompt", "x", "--sampler", "beam")
    assert (code, err[-1]) == (2, "keras-posenc generate: error: argument --sampler: invalid choice: 'beam' "
                                  "(choose from 'greedy', 'top_k', 'top_p')")


# inspect ---------------------------------------------------------------------------------------
@pytest.fixture
def inspector(monkeypatch):
    calls = {"summary": {
        "pe_range": {"min": -0.99991, "max": 1.0, "bound": 1.0, "ok": True},
        "positional_contribution_ratio": 0.12345,
        "attention_by_distance": [[0.5, None, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.5, 0.9],
                                  [1.0, 0.0]]}}

    def inspect_model(model_path, out, texts=None):
        calls["inspect_model"] = (model_path, out, texts)
        return {"summary": calls["summary"], "artifacts": [os.path.join(out, "pe_heatmap.png"),
                                                           os.path.join(out, "inspect.json")]}

    monkeypatch.setattr(diagnostics, "inspect_model", inspect_model)
    return calls


def test_inspect_writes_beside_the_model_and_prints_the_summary(inspector, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "inspect", os.path.join("run", "model.keras"))
    folder = os.path.join(str(tmp_path), "run", "inspect")
    assert (code, err) == (0, [])
    assert inspector["inspect_model"] == (os.path.join("run", "model.keras"), folder, None)
    assert out == ["PE value range: min -0.9999, max 1.0000 (bound 1.0): ok",
                   "positional-contribution ratio (first attention, with vs without PE): 0.123",
                   "layer 0 mean attention at distance 0..8: 0.500 - 0.250 0.125 0.062 0.031 0.016 0.008 "
                   "0.500",
                   "layer 1 mean attention at distance 0..8: 1.000 0.000",
                   "artifacts:",
                   f"  {os.path.join(folder, 'pe_heatmap.png')}",
                   f"  {os.path.join(folder, 'inspect.json')}"]


def test_inspect_takes_probe_texts_and_flags_a_range_out_of_bounds(inspector, tmp_path, capsys):
    inspector["summary"]["pe_range"] = {"min": -1.5, "max": 2.25, "bound": 1.0, "ok": False}
    code, out, _ = run(capsys, "inspect", "m.keras", "--out", "o", "--text", "a b", "--text", "c")
    assert code == 0
    assert inspector["inspect_model"] == ("m.keras", "o", ["a b", "c"])
    assert out[0] == "PE value range: min -1.5000, max 2.2500 (bound 1.0): OUT OF RANGE"


# ablate ----------------------------------------------------------------------------------------
@pytest.fixture
def ablator(monkeypatch):
    """The ablation's steps replaced: record their arguments and the run lock's holder."""
    calls = {"check": []}
    results = {"elapsed_seconds": 12.5}

    def check_config(config):
        calls["check"].append(config)
        if calls.get("refuse"):
            raise ValueError("`d_model` must be divisible by `num_heads`, got d_model=9 and num_heads=2.")

    def run_ablation(corpus, config):
        calls["run"] = (corpus, config)
        return results

    def write_report(given, out, command=None):
        assert given is results
        calls["report"] = (out, command, lock_holder(out))
        return {"markdown": os.path.join(out, "ablation.md"), "json": os.path.join(out, "ablation.json")}

    def markdown_table(given):
        assert given is results
        return "| variant | loss |"

    for name, function in [("check_config", check_config), ("run_ablation", run_ablation),
                           ("write_report", write_report), ("markdown_table", markdown_table)]:
        monkeypatch.setattr(ablation, name, function)
    return calls


def test_ablate_runs_the_full_config_by_default(ablator, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "ablate")
    folder = os.path.join("runs", "ablation")
    assert (code, err) == (0, [])
    assert ablator["check"] == [ablation.AblationConfig()]
    assert ablator["run"] == (None, ablation.AblationConfig())
    assert ablator["report"] == (folder, f"keras-posenc ablate --out {folder}", os.getpid())
    assert out == [f"Ablation: 12 variants x 3 seeds, 700 steps each; writing to {folder}",
                   "| variant | loss |", "total time: 12.5 s", "artifacts:",
                   f"  {os.path.join(folder, 'ablation.md')}", f"  {os.path.join(folder, 'ablation.json')}"]


def test_ablate_flags_change_the_config_and_the_recorded_command(ablator, tmp_path, capsys):
    out_dir = str(tmp_path / "abl")
    code, out, _ = run(capsys, "ablate", "--quick", "--corpus", "c.txt", "--steps", "5", "--seeds", "3",
                       "--position", "rope", "alibi", "--no-causal-mask", "--out", out_dir)
    expected = dataclasses.replace(ablation.QUICK, steps=5, seeds=(0, 1, 2), variants=("rope", "alibi"),
                                   causal=False)
    assert code == 0
    assert ablator["check"] == [expected] and ablator["run"] == ("c.txt", expected)
    assert ablator["report"] == (out_dir, "keras-posenc ablate --quick --corpus c.txt --steps 5 --seeds 3 "
                                          f"--variants rope alibi --no-causal-mask --out {out_dir}",
                                 os.getpid())
    assert out[0] == f"Ablation: 2 variants x 3 seeds, 5 steps each; writing to {out_dir}"


def test_ablate_quick_alone_is_the_quick_config(ablator, tmp_path, capsys):
    code, out, _ = run(capsys, "ablate", "--quick", "--out", str(tmp_path))
    assert code == 0 and ablator["run"] == (None, ablation.QUICK)
    assert ablator["report"][1] == f"keras-posenc ablate --quick --out {tmp_path}"
    assert out[0] == f"Ablation: 12 variants x 2 seeds, 4 steps each; writing to {tmp_path}"


def test_a_bad_ablation_setting_is_refused_before_the_folder_is_made(ablator, tmp_path, capsys):
    ablator["refuse"] = True
    code, out, err = run(capsys, "ablate", "--out", str(tmp_path / "abl"))
    assert (code, out, err) == (2, [], ["keras-posenc: error: `d_model` must be divisible by `num_heads`, "
                                        "got d_model=9 and num_heads=2."])
    assert "run" not in ablator and not os.path.exists(tmp_path / "abl")


# export ----------------------------------------------------------------------------------------
class StandInResult:
    """What `export_and_check`, `export_generation` and `export_litertlm` return, as `_save_and_print`
    uses it."""

    def __init__(self, calls):
        self.calls = calls

    def save(self, out):
        self.calls["saved"] = out
        return {"model": out}

    def headline(self, paths):
        return f"wrote {paths['model']}"

    def report_lines(self, out):
        return [f"report of {out}", "ops: 12 builtin"]

    def failures(self, *, tolerance, require_gpu):
        self.calls["checked"] = (tolerance, require_gpu)
        return self.calls["failures"]


@pytest.fixture
def exports(monkeypatch, no_litert_python_variables):
    """The exporters replaced: each records its keyword arguments under its name; `failures` and
    `longest` (the model's max_length) are settable, `builder_error` makes the bundle builder fail.
    This Python has neither LiteRT Quantizer nor LiteRT's interpreter (as on the Keras 2 stack), so that
    the recipes that need them ask for the LiteRT Python on both stacks."""
    calls = {"failures": [], "longest": None}
    monkeypatch.setitem(sys.modules, "litert_quantizer", None)
    monkeypatch.setattr(quantization, "_litert_in_process", lambda: False)

    def load_model(path):
        calls["load_model"] = path
        calls["holder"] = lock_holder(os.path.dirname(path))
        return MODEL

    def longest_sequence(model):
        assert model is MODEL
        return calls["longest"]

    def recorder(name):
        def export_function(model, *args, **options):
            assert model is MODEL
            calls[name] = (args, options)
            if calls.get("builder_error"):
                raise RuntimeError(calls["builder_error"])
            return StandInResult(calls)
        return export_function

    monkeypatch.setattr(export, "load_model", load_model)
    monkeypatch.setattr(export, "longest_sequence", longest_sequence)
    monkeypatch.setattr(export, "export_and_check", recorder("export_and_check"))
    monkeypatch.setattr(export, "export_generation", recorder("export_generation"))
    monkeypatch.setattr(export, "export_litertlm", recorder("export_litertlm"))
    return calls


def printed(out, failures=()):
    """What `export` prints for the stand-in result saved to `out`."""
    return [f"wrote {out}", f"report of {out}", "ops: 12 builtin", *failures]


def window_options(**changes):
    """`export_and_check`'s keyword arguments for `export M --out O --sequence-length 8`, with `changes`."""
    return dict({"sequence_length": 8, "target": "gpu", "batch_size": 1, "quantize": None, "embedding": None,
                 "token_ids": None, "eval_token_ids": None, "max_loss_increase": 0.01, "litert_python": None},
                **changes)


def test_export_passes_the_defaults_and_prints_the_result(exports, tmp_path, capsys):
    model, out = str(tmp_path / "model.keras"), str(tmp_path / "m.tflite")
    code, lines, err = run(capsys, "export", model, "--out", out, "--sequence-length", "8")
    assert (code, err) == (0, [])
    assert exports["load_model"] == model
    assert exports["export_and_check"] == ((), window_options())
    assert (exports["saved"], exports["checked"]) == (out, (None, False))
    assert lines == printed(out)


def test_export_passes_every_flag_and_a_failed_check_exits_1(exports, tmp_path, capsys):
    model, out = str(tmp_path / "model.keras"), str(tmp_path / "m.tflite")
    ids = np.arange(24, dtype=np.int32).reshape(3, 8)
    np.save(tmp_path / "ids.npy", ids)
    exports["failures"] = ["FAILED: parity 0.7 exceeds the tolerance 0.5."]
    python = os.path.realpath(sys.executable)
    code, lines, err = run(capsys, "export", model, "--out", out, "--sequence-length", "8", "--batch-size",
                           "2", "--quantize", "dynamic_int8", "--target", "cpu", "--embedding", "graph",
                           "--require-gpu", "--tolerance", "0.5", "--token-ids", str(tmp_path / "ids.npy"),
                           "--max-loss-increase", "0.05", "--litertlm-python", python)
    assert (code, err) == (1, [])
    args, options = exports["export_and_check"]
    np.testing.assert_array_equal(options.pop("token_ids"), ids)
    assert (args, options) == ((), {"sequence_length": 8, "target": "cpu", "batch_size": 2,
                                    "quantize": "dynamic_int8", "embedding": "graph", "eval_token_ids": None,
                                    "max_loss_increase": 0.05, "litert_python": python})
    assert exports["checked"] == (0.5, True)
    assert lines == printed(out, exports["failures"])


@pytest.mark.parametrize("flags, line", [
    (["--spm", "s.model"], "--spm is for --format litertlm or genai."),
    (["--probe-prompt", "hi"], "--probe-prompt is for --format litertlm or genai."),
    (["--spm", "s.model", "--probe-prompt", "hi", "--generate", "--cache-length", "8"],
     "--spm, --probe-prompt is for --format litertlm or genai."),
    (["--format", "litertlm"],
     "--format litertlm is a prefill/decode bundle: add --generate --cache-length C."),
    ([], "export needs --sequence-length (or --generate with --cache-length)."),
    (["--sequence-length", "8", "--eval-corpus", "e.txt"],
     "--eval-corpus measures a quantized file: it needs --quantize."),
    (["--sequence-length", "8", "--embedding", "host", "--target", "cpu"],
     "--embedding host is for the gpu, gl and tensorrt targets; cpu GATHERs its lookups in the file."),
    (["--sequence-length", "8", "--quantize", "int4", "--target", "gl"],
     "--quantize int4 is refused for target='gl': the GL delegate does not run 4-bit weights "
     "(TfLiteGpuDelegate \"failed to prepare\" on LiteRT Quantizer's int4 files): use --quantize int8 on gl, "
     "or --target gpu."),
    (["--sequence-length", "8", "--quantize", "int4", "--target", "cpu"],
     f"--quantize int4 on target='cpu' is made by LiteRT Quantizer 0.11, which is not installed here: "
     f"{INSTALL_HINT}."),
    (["--sequence-length", "8", "--quantize", "int4", "--target", "cpu", "--litert-python", "/no/python"],
     f"the LiteRT Python '/no/python' is not an executable file: {INSTALL_HINT}."),
    (["--generate"], "--generate needs --cache-length C (prompt + generated tokens)."),
    (["--generate", "--cache-length", "8", "--sequence-length", "8"],
     "--generate exports batch 1 and takes no --sequence-length."),
    (["--generate", "--cache-length", "8", "--token-ids", "ids.npy", "--sequence-length", "8"],
     "--generate exports batch 1 and takes no --sequence-length, --token-ids."),
    (["--generate", "--cache-length", "8", "--batch-size", "2"], "--generate exports batch 1 and takes no "
                                                                 "--batch-size."),
    (["--generate", "--cache-length", "8", "--require-gpu"],
     "--require-gpu checks a window export's ops; the --generate graphs of gpu and gl hold GPU ops only "
     "(the shader graphs): drop --require-gpu."),
    (["--generate", "--cache-length", "8", "--quantize", "int8", "--litert-python", "/no/python"],
     f"the LiteRT Python '/no/python' is not an executable file: {INSTALL_HINT}."),
    (["--generate", "--cache-length", "8", "--eval-corpus", "e.txt"],
     "--eval-corpus measures a quantized file: it needs --quantize."),
    (["--generate", "--cache-length", "8", "--quantize", "int4"],
     "--quantize int4 is refused for target='gpu': LiteRT Quantizer's int4 weights break the shader "
     "prefill/decode graph's constant matrices (prefill logits of 1e7 on LiteRT 2.3): use --quantize int8."),
    (["--generate", "--cache-length", "8", "--format", "litertlm", "--target", "tensorrt", "--quantize",
      "int8"],
     "--quantize int8 is not available for a litertlm export of target='tensorrt'."),
    (["--generate", "--cache-length", "17"],
     "--cache-length 17 exceeds the model's max_length=16 (the cache holds the prompt and every generated "
     "token)."),
    (["--generate", "--cache-length", "8", "--embedding", "host", "--target", "cpu"],
     "--embedding host is for the gpu and gl targets; cpu GATHERs its lookups in the file."),
    (["--generate", "--cache-length", "8", "--embedding", "host", "--target", "tensorrt"],
     "--embedding host is for the gpu and gl targets; tensorrt GATHERs its lookups in the file."),
    (["--generate", "--cache-length", "8", "--format", "litertlm", "--embedding", "graph"],
     "--format litertlm looks tokens up in the file and takes no --embedding."),
])
def test_a_refused_export_is_one_line_and_exports_nothing(flags, line, exports, tmp_path, capsys):
    exports["longest"] = 16
    out = str(tmp_path / "m.tflite")
    code, lines, err = run(capsys, "export", str(tmp_path / "model.keras"), "--out", out, *flags)
    assert (code, lines, err) == (2, [], [f"keras-posenc: error: {line}"])
    assert not {"export_and_check", "export_generation", "export_litertlm", "saved"} & set(exports)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shape", [(3, 7), (8,), (1, 8, 1)])
def test_token_ids_of_another_shape_are_refused(shape, exports, tmp_path, capsys):
    np.save(tmp_path / "ids.npy", np.zeros(shape, np.int32))
    code, lines, err = run(capsys, "export", "model.keras", "--out", str(tmp_path / "m.tflite"),
                           "--sequence-length", "8", "--token-ids", str(tmp_path / "ids.npy"))
    assert (code, lines, err) == (2, [], ["keras-posenc: error: --token-ids must hold an int array [n, 8], "
                                          f"got shape {shape}."])
    assert "export_and_check" not in exports


@pytest.mark.parametrize("target", ["gpu", "gl", "tensorrt"])
def test_host_embedding_goes_to_the_targets_that_take_it(target, exports, tmp_path, capsys):
    code, _, _ = run(capsys, "export", "model.keras", "--out", str(tmp_path / "m"), "--sequence-length", "8",
                     "--embedding", "host", "--target", target)
    assert code == 0
    assert exports["export_and_check"] == ((), window_options(embedding="host", target=target))


def generation_options(**changes):
    """`export_generation`'s keyword arguments for `export M --out O --generate --cache-length 9`."""
    return dict({"prompt_length": 4, "cache_length": 9, "target": "gpu", "embedding": None, "quantize": None,
                 "eval_token_ids": None, "max_loss_increase": 0.01, "litert_python": None}, **changes)


def test_a_generation_export_passes_the_defaults(exports, tmp_path, capsys):
    out = str(tmp_path / "g.tflite")
    code, lines, err = run(capsys, "export", "model.keras", "--out", out, "--generate", "--cache-length", "9",
                           "--batch-size", "1")
    assert (code, err) == (0, [])
    assert exports["load_model"] == "model.keras"
    assert exports["export_generation"] == ((), generation_options())
    assert (exports["saved"], exports["checked"]) == (out, (None, False))
    assert lines == printed(out)


@pytest.mark.parametrize("flags, changes", [
    (["--cache-length", "1"], {"cache_length": 1, "prompt_length": 1}),
    (["--cache-length", "16"], {"cache_length": 16, "prompt_length": 8}),
    (["--cache-length", "9", "--prompt-length", "2"], {"prompt_length": 2}),
    (["--cache-length", "9", "--target", "gl", "--embedding", "host", "--quantize", "float16",
      "--max-loss-increase", "0.5", "--litert-python", "/no/python"],
     {"target": "gl", "embedding": "host", "quantize": "float16", "max_loss_increase": 0.5,
      "litert_python": "/no/python"}),
])
def test_a_generation_export_passes_its_flags(flags, changes, exports, tmp_path, capsys):
    exports["longest"] = 16
    code, _, _ = run(capsys, "export", "model.keras", "--out", str(tmp_path / "g"), "--generate", *flags)
    assert code == 0
    assert exports["export_generation"] == ((), generation_options(**changes))


def test_a_failed_generation_check_exits_1_with_its_tolerance(exports, tmp_path, capsys):
    exports["failures"] = ["FAILED: the file does not generate what the model generates."]
    out = str(tmp_path / "g.tflite")
    code, lines, _ = run(capsys, "export", "model.keras", "--out", out, "--generate", "--cache-length",
                         "5000", "--tolerance", "0.25")
    assert code == 1 and exports["checked"] == (0.25, False)
    assert lines == printed(out, exports["failures"])


@pytest.fixture
def litertlm_run(tmp_path):
    """A folder with a model file and its tokenizer: what `--format litertlm` bundles."""
    (tmp_path / "model.keras").write_bytes(b"a model")
    (tmp_path / "spm.model").write_bytes(b"the run's tokenizer")
    (tmp_path / "other.model").write_bytes(b"another tokenizer")
    return tmp_path


def test_a_litertlm_bundle_gets_the_runs_tokenizer_and_the_defaults(exports, litertlm_run, capsys):
    model, out = str(litertlm_run / "model.keras"), str(litertlm_run / "m.litertlm")
    code, lines, err = run(capsys, "export", model, "--out", out, "--generate", "--cache-length", "8",
                           "--format", "litertlm", "--target", "cpu")
    assert (code, err) == (0, [])
    assert exports["export_litertlm"] == ((b"the run's tokenizer",), {
        "prompt_length": 4, "cache_length": 8, "target": "cpu", "probes": None, "python": None,
        "quantize": None, "eval_token_ids": None, "max_loss_increase": 0.01})
    assert (exports["saved"], exports["checked"]) == (out, (None, False))
    assert lines == printed(out)


def test_a_litertlm_bundle_passes_its_flags(exports, litertlm_run, capsys):
    exports["failures"] = ["FAILED: LiteRT-LM's engine does not generate the text."]
    out = str(litertlm_run / "m.litertlm")
    code, lines, _ = run(capsys, "export", str(litertlm_run / "model.keras"), "--out", out, "--generate",
                         "--cache-length", "8", "--prompt-length", "3", "--format", "litertlm", "--spm",
                         str(litertlm_run / "other.model"), "--probe-prompt", "hi there", "--probe-prompt",
                         "bye", "--litert-python", "/no/python", "--max-loss-increase", "0.2", "--tolerance",
                         "0.1")
    assert code == 1
    assert exports["export_litertlm"] == ((b"another tokenizer",), {
        "prompt_length": 3, "cache_length": 8, "target": "gpu", "probes": [["hi there"], ["bye"]],
        "python": "/no/python", "quantize": None, "eval_token_ids": None, "max_loss_increase": 0.2})
    assert exports["checked"] == (0.1, False)
    assert lines == printed(out, exports["failures"])


def test_a_litertlm_bundle_needs_a_model_file_and_reports_a_builder_failure(exports, litertlm_run, capsys):
    flags = ["--out", str(litertlm_run / "m.litertlm"), "--generate", "--cache-length", "8", "--format",
             "litertlm"]
    assert run(capsys, "export", str(litertlm_run), *flags) == (
        2, [], [f"keras-posenc: error: --format litertlm needs a .keras file with its tokenizer, got "
                f"{str(litertlm_run)!r}."])
    exports["builder_error"] = "litert-lm-builder failed:\n  Error: no space\n"
    assert run(capsys, "export", str(litertlm_run / "model.keras"), *flags) == (
        2, [], ["keras-posenc: error: litert-lm-builder failed: Error: no space"])


# export: the token rows of the parity check and of the held-out loss -----------------------------
@pytest.fixture(scope="module")
def sp_model():
    """A SentencePiece model of the embedded corpus (what `train` writes as spm.model)."""
    return data.train_sentencepiece(data.read_text_corpus(data.default_corpus_path())[:200], 100)


def run_folder(folder, sp_model, train_config=None):
    """A run folder with spm.model and, given a `train_config`, report.json; the path of its model."""
    (folder / "spm.model").write_bytes(sp_model)
    if train_config is not None:
        (folder / "report.json").write_text(json.dumps({"train_config": train_config}))
    return str(folder / "model.keras")


def framed_rows(sp_model, examples, length):
    """`examples` as the model reads them in training: <s> text (pairs: <s> source <sep> target), cut to
    `length` and right-padded, int32 `[len(examples), length]`."""
    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    rows = []
    for example in examples:
        sides = example if isinstance(example, tuple) else (example,)
        tokens = [data.BOS_ID] + processor.EncodeAsIds(sides[0])
        if len(sides) == 2:
            tokens += [data.SEP_ID] + processor.EncodeAsIds(sides[1])
        rows.append(tokens[:length] + [data.PAD_ID] * (length - len(tokens[:length])))
    return np.array(rows, np.int32)


def export_options(exports, name="export_and_check"):
    """The keyword arguments the exporter got, with its int arrays as lists."""
    return {key: value.tolist() if isinstance(value, np.ndarray) else value
            for key, value in exports[name][1].items()}


def test_the_parity_batch_is_four_rows_per_batch_row_of_the_corpus(exports, sp_model, tmp_path, capsys):
    model = run_folder(tmp_path, sp_model)
    code, _, _ = run(capsys, "export", model, "--out", str(tmp_path / "m"), "--sequence-length", "12",
                     "--batch-size", "2")
    corpus = data.read_text_corpus(data.default_corpus_path())
    assert code == 0
    assert export_options(exports) == window_options(
        sequence_length=12, batch_size=2, token_ids=framed_rows(sp_model, corpus[:8], 12).tolist())


SHORT_LINES = [f"the house {'is ' * (i % 3)}small" for i in range(300)]


@pytest.mark.parametrize("exporter, flags", [
    ("export_and_check", ["--sequence-length", "24"]),
    ("export_generation", ["--generate", "--cache-length", "24"]),
    ("export_litertlm", ["--generate", "--cache-length", "24", "--format", "litertlm", "--target", "cpu"]),
])
def test_the_held_out_loss_reads_the_first_256_lines_of_the_eval_corpus(exporter, flags, exports, sp_model,
                                                                         tmp_path, capsys):
    model = run_folder(tmp_path, sp_model)
    (tmp_path / "model.keras").write_bytes(b"a model")
    (tmp_path / "eval.txt").write_text("\n".join(SHORT_LINES) + "\n")
    code, _, _ = run(capsys, "export", model, "--out", str(tmp_path / "m"), *flags, "--quantize", "float16",
                     "--eval-corpus", str(tmp_path / "eval.txt"))
    assert code == 0
    options = export_options(exports, exporter)
    assert options["eval_token_ids"] == framed_rows(sp_model, SHORT_LINES[:256], 24).tolist()
    assert options["quantize"] == "float16"


PAIRS = [(f"the house {i}", f"das Haus {i}") for i in range(40)]


@pytest.mark.parametrize("corpus, train_config, examples", [
    ("pairs.tsv", {"corpus_format": "tsv", "eval_fraction": 0.5, "seed": 3, "skip_bad_lines": True},
     data.split_corpus(PAIRS, 0.5, seed=3)[1]),
    (None, {"corpus_format": "tsv", "eval_fraction": 0.05, "seed": 1},
     data.split_corpus(data.read_text_corpus(data.default_corpus_path()), 0.05, seed=1)[1][:256]),
])
def test_the_held_out_loss_reads_the_runs_eval_split(corpus, train_config, examples, exports, sp_model,
                                                     tmp_path, capsys):
    lines = [f"{source}\t{target}" for source, target in PAIRS]
    (tmp_path / "pairs.tsv").write_text("\n".join(lines[:7] + ["a line without a tab"] + lines[7:]) + "\n")
    model = run_folder(tmp_path, sp_model, dict(train_config, corpus=corpus and str(tmp_path / corpus)))
    code, _, err = run(capsys, "export", model, "--out", str(tmp_path / "m"), "--sequence-length", "12",
                       "--quantize", "float16")
    assert (code, err) == (0, [])
    assert export_options(exports)["eval_token_ids"] == framed_rows(sp_model, examples, 12).tolist()


def test_without_a_report_or_a_tokenizer_the_held_out_loss_is_not_measured(exports, sp_model, tmp_path,
                                                                           capsys):
    (tmp_path / "run").mkdir()
    model = run_folder(tmp_path / "run", sp_model)
    for path in (model, str(tmp_path / "model.keras")):
        code, _, _ = run(capsys, "export", path, "--out", str(tmp_path / "m"), "--sequence-length", "12",
                         "--quantize", "float16")
        assert code == 0 and exports["export_and_check"][1]["eval_token_ids"] is None


@pytest.mark.parametrize("flags", [["--sequence-length", "12"], ["--generate", "--cache-length", "12"]])
def test_a_float32_export_reads_no_held_out_text(flags, exports, sp_model, tmp_path, capsys):
    gone = str(tmp_path / "gone.txt")
    model = run_folder(tmp_path, sp_model, {"corpus": gone, "corpus_format": "text", "eval_fraction": 0.1,
                                            "seed": 0})
    code, _, err = run(capsys, "export", model, "--out", str(tmp_path / "m"), *flags)
    assert (code, err) == (0, [])
    name = "export_generation" if "--generate" in flags else "export_and_check"
    assert exports[name][1]["eval_token_ids"] is None


def test_a_run_without_skip_bad_lines_in_its_report_reads_its_corpus_strictly(exports, sp_model, tmp_path,
                                                                               capsys):
    (tmp_path / "pairs.tsv").write_text("the house\tdas Haus\na line without a tab\n")
    model = run_folder(tmp_path, sp_model, {"corpus": str(tmp_path / "pairs.tsv"), "corpus_format": "tsv",
                                            "eval_fraction": 0.5, "seed": 0})
    code, lines, err = run(capsys, "export", model, "--out", str(tmp_path / "m"), "--sequence-length", "12",
                           "--quantize", "float16")
    assert (code, lines, err) == (2, [], [
        f"keras-posenc: error: TSV corpus '{tmp_path / 'pairs.tsv'}' line 2 has no tab; expected "
        "'source<TAB>target': 'a line without a tab'. Fix the line or pass skip_bad_lines=True "
        "(--skip-bad-lines)."])


def test_the_held_out_loss_needs_the_runs_tokenizer_and_corpus(exports, sp_model, tmp_path, capsys):
    model = str(tmp_path / "model.keras")
    (tmp_path / "eval.txt").write_text("one line\n")
    flags = ["--out", str(tmp_path / "m"), "--sequence-length", "12", "--quantize", "float16"]
    assert run(capsys, "export", model, *flags, "--eval-corpus", str(tmp_path / "eval.txt")) == (
        2, [], [f"keras-posenc: error: --eval-corpus needs the run's spm.model beside the model {model} (the "
                "tokenizer the model was trained with)."])
    gone = str(tmp_path / "gone.txt")
    run_folder(tmp_path, sp_model, {"corpus": gone, "corpus_format": "text", "eval_fraction": 0.1, "seed": 0})
    assert run(capsys, "export", model, *flags) == (
        2, [], [f"keras-posenc: error: the run's corpus {gone} (report.json) is not here: pass --eval-corpus "
                "FILE for the held-out loss of the quantized file."])
    assert "export_and_check" not in exports
