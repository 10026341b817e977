"""Translator exports on the emulated GPUs, every op on the GPU: the `gl` pair on the GL delegate itself
(mediapipe's graph on llvmpipe, tests/edge/runtime/probe_gl_translate.py) and the `gpu` file on
LiteRT's GPU accelerator (lavapipe) through the kit (export/jetson/run_translate.py `--logits`). In
float32 each translates greedily as `Seq2SeqTransformer.translate(..., beam_size=1)` does, its logits
within 1e-4 of the model's teacher-forced ones; in the runtimes' float16 modes the logits follow
tests/edge/float16_rules.py (within `HALF_ERROR`, the argmax pooled over >= 200 real tokens, a
differing token only where float32 has a near-tie). The translators are trained briefly on a toy task
(`train_briefly`), so that their logits have clear winners as a real translator's."""

import json
import os
import subprocess
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from edge_kit_translate import sentencepiece_only
from float16_rules import check_half_generation, close_in_half_precision
from stacks import once_on_keras2

from keras_posenc.app.dataset import train_sentencepiece
from keras_posenc.backend import keras
from keras_posenc.export import contract, export_translation
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.special_ids import BOS_ID, EOS_ID, NUM_RESERVED_IDS, PAD_ID

pytestmark = once_on_keras2("the same shader graphs whichever stack exported them; CI time is tight")

KIT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "export", "jetson", "run_translate.py")
SOURCE_LENGTH, CACHE_LENGTH, NEW_TOKENS = 12, 15, 15  # max_length 16: translate's limit is 15 tokens
SENTENCES = 32  # 4 to 15 steps each (9 on average): > HALF_MIN_TOKENS (200) in all
# Rotary positions (the default) with a vocabulary above 2048 (the target token's one-hot in two
# digits), and an additive position with an ordinary one.
CASES = {"rope-2300": {"vocab_size": 2300}, "sinusoidal": {"position": "sinusoidal", "vocab_size": 300}}


def translator(**config):
    """A small untrained translator (`train_briefly` teaches it its task)."""
    keras.utils.set_random_seed(5)
    model = Seq2SeqTransformer(**{"num_layers": 2, "d_model": 32, "num_heads": 4, "dff": 64, "max_length": 16,
                                  "dropout": 0.0, **config})
    model.build_on_dummy()
    return model


def chains_of(ids, classes):
    """`classes` chains of 3 to 14 of the `ids` (disjoint): what each class of sentences translates to."""
    lengths = [3 + 11 * c // (classes - 1) for c in range(classes)]
    starts = np.cumsum([0] + lengths)
    return [list(ids[start:start + length]) for start, length in zip(starts, lengths)]


def pairs(draw_source, chains, rng, batch):
    """`batch` sentences of random classes: `(sources [batch, S], targets [batch, NEW_TOKENS + 1])`.

    Class c's source is `draw_source(c, rng)` (ids), cut to S - 1, then `</s>`, right-padded; its
    target is `<s>`, the chain `chains[c]`, `</s>`, right-padded.
    """
    sources = np.full([batch, SOURCE_LENGTH], PAD_ID, np.int32)
    targets = np.full([batch, NEW_TOKENS + 1], PAD_ID, np.int32)
    for row, c in enumerate(rng.integers(0, len(chains), batch)):
        ids = list(draw_source(c, rng))[:SOURCE_LENGTH - 1] + [EOS_ID]
        sources[row, :len(ids)] = ids
        target = [BOS_ID] + list(chains[c]) + [EOS_ID]
        targets[row, :len(target)] = target
    return sources, targets


def train_briefly(model, draw_source, chains, steps=100, batch=16):
    """Adam steps on the toy task of `pairs`, so that the logits have clear winners, as a trained
    translator's. An untrained one is no such test: its random head puts the top two within the
    float16 GPU's rounding (3e-3 of max |x|) at about one step in 25 (measured here: 13 of 276), and
    the pooled 99 % argmax rule then hangs on two or three flips that rounding decides."""
    rng = np.random.default_rng(0)
    optimizer = keras.optimizers.Adam(1e-2)

    @tf.function
    def step(sources, targets):
        with tf.GradientTape() as tape:
            logits = model({"source_ids": sources, "target_ids": targets[:, :-1]}, training=True)
            losses = keras.losses.sparse_categorical_crossentropy(targets[:, 1:], logits, from_logits=True)
            real = tf.cast(targets[:, 1:] != PAD_ID, losses.dtype)
            loss = tf.reduce_sum(losses * real) / tf.reduce_sum(real)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    for _ in range(steps):
        step(*map(tf.constant, pairs(draw_source, chains, rng, batch)))
    return model


def fed_tokens(ids, steps):
    """The tokens a greedy run chose at its `steps` steps: `ids`, then `</s>` when it ended there."""
    return list(ids) + [EOS_ID] * (steps - len(ids))


def teacher_forced(model, row, fed):
    """The model's logits `[len(fed), vocab]` over `<s>` and `fed[:-1]` for the source `row`."""
    target = np.array([[BOS_ID] + list(fed[:-1])], np.int32)
    return np.asarray(model({"source_ids": np.array([row], np.int32), "target_ids": target}))[0]


def greedy_choices(logits):
    """The token each step's logits `[steps, vocab]` choose: the argmax with `<pad>` and `<s>` forbidden."""
    masked = np.array(logits, np.float64)
    masked[:, [PAD_ID, BOS_ID]] = -np.inf
    return masked.argmax(-1).tolist()


def greedy_ids(logits):
    """The ids a greedy run with these step logits wrote: its choices, without the end token."""
    choices = greedy_choices(logits)
    return choices[:-1] if choices and choices[-1] == EOS_ID else choices


def keras_reference(model, rows):
    """Keras' greedy ids of each row and the teacher-forced logits of every step that chose a token."""
    translations = [ids.tolist() for ids in model.translate(np.array(rows, np.int32), NEW_TOKENS,
                                                            beam_size=1).ids]
    logits = [teacher_forced(model, row, fed_tokens(ids, min(len(ids) + 1, NEW_TOKENS)))
              for row, ids in zip(rows, translations)]
    return translations, logits


def check_float32(runs, translations, references, name):
    """Each sentence's `(ids, logits)` against Keras: the same ids, every step's logits within 1e-4."""
    assert [ids for ids, _ in runs] == translations, name
    worst = max(float(np.max(np.abs(logits - reference))) for (_, logits), reference in zip(runs, references))
    assert worst <= 1e-4, (name, worst)
    return worst


def check_half_translations(half_logits, references):
    """float16 greedy translations against float32's, sentence by sentence and pooled.

    Each sentence: `check_half_generation` (the logits within `HALF_ERROR` up to where the two runs
    part, and a parting only at a float32 near-tie). Pooled: the steps both runs were fed alike (up to
    and including the first differing one) by `close_in_half_precision`. Returns the sentences that
    parted.
    """
    pooled_half, pooled_reference, parted = [], [], 0
    for half, reference in zip(half_logits, references):
        half_ids, ids = greedy_choices(half), greedy_choices(reference)
        agreed = check_half_generation(half_ids, half, ids, reference)
        parted += half_ids != ids
        steps = min(agreed + 1, len(half), len(reference))
        pooled_half.append(half[:steps])
        pooled_reference.append(reference[:steps])
    half, reference = np.concatenate(pooled_half), np.concatenate(pooled_reference)
    close_in_half_precision(half, reference, np.ones(len(reference), bool))
    return parted


def toy_task(vocab_size, classes=8, seed=0):
    """`(draw_source, chains)` of `pairs` over the whole vocabulary: class c's sources are 2 to S - 1
    draws from 6 ids of its own, its translation a chain of 3 to 14 other ids."""
    ids = np.random.default_rng(seed).permutation(np.arange(NUM_RESERVED_IDS, vocab_size)).tolist()
    words = [ids[6 * c:6 * c + 6] for c in range(classes)]
    chains = chains_of(ids[6 * classes:], classes)
    return (lambda c, rng: rng.choice(words[c], int(rng.integers(2, SOURCE_LENGTH)))), chains


# The gl pair on the GL delegate (mediapipe, llvmpipe) ------------------------------------------------


@pytest.fixture(scope="module", params=sorted(CASES))
def gl_case(request, tmp_path_factory):
    """`(name, model, rows, Keras' ids, their teacher-forced logits, the (encode, decode) paths)`."""
    model = translator(**CASES[request.param])
    draw_source, chains = toy_task(model.vocab_size)
    train_briefly(model, draw_source, chains)
    out = str(tmp_path_factory.mktemp(f"translate-{request.param}") / "de_gl.tflite")
    result = export_translation(model, target="gl", source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH)
    assert result.report["same_tokens"] and result.report["verdicts"]["gl"] == []
    result.save(out)
    rows = pairs(draw_source, chains, np.random.default_rng(7), SENTENCES)[0].tolist()
    translations, references = keras_reference(model, rows)
    assert len({tuple(ids) for ids in translations}) > 1, translations  # the source matters
    if model.vocab_size > 2048:  # ids of two digits in the source and in the translations
        assert max(map(max, rows)) >= 2048 and max(map(max, translations)) >= 2048
    paths = tuple(contract.model_paths(out, ".tflite", per_signature=True,
                                       signatures=contract.TRANSLATE_SIGNATURES))
    return request.param, model, rows, translations, references, paths


def run_gl(edge, case, **options):
    name, model, rows, _, _, paths = case
    run = edge.run_gl_translate(paths, rows, NEW_TOKENS, pad_id=model.pad_id, bos_id=model.bos_id,
                                eos_id=model.eos_id, **options)
    assert run.returncode == 0, run.log[-3000:]
    assert edge.refusals(run.log) == [], (name, edge.refusals(run.log))  # every op has a GL shader
    assert run.info["finite"]
    return run


def test_the_gl_pair_on_the_gl_delegate_translates_as_keras(edge, gl_case):
    name, _, _, translations, references, _ = gl_case
    run = run_gl(edge, gl_case)
    worst = check_float32(run.output, translations, references, name)
    print(f"{name}: GL delegate float32, {sum(len(r) for r in references)} steps of {len(references)} "
          f"sentences as translate, max |dlogit| {worst:.2e}, {run.info['decode_tokens_per_s']:.0f} tokens/s")


def test_the_gl_pair_in_float16_differs_only_at_near_ties(edge, gl_case):
    """`allow_precision_loss: true`: teacher-forced on float32's tokens, every step pooled by
    `close_in_half_precision`; run free, `check_half_translations`."""
    name, _, _, translations, references, _ = gl_case
    fed = [fed_tokens(ids, len(reference)) for ids, reference in zip(translations, references)]
    forced = run_gl(edge, gl_case, fp16=True, forced=fed)
    half = np.concatenate([logits for _, logits in forced.output])
    close_in_half_precision(half, np.concatenate(references), np.ones(len(half), bool))
    free = run_gl(edge, gl_case, fp16=True)
    parted = check_half_translations([logits for _, logits in free.output], references)
    print(f"{name}: GL delegate float16, {parted} of {len(references)} greedy translations part from float32")


# The gpu file on LiteRT's GPU accelerator (lavapipe), through the kit ---------------------------------


# The kit's toy task: each class of lines is made of its own words and translates to its own chain.
KIT_CLASSES = ("the cat sat on a mat", "dog ran to old house", "bird sang by river is small")


def kit_line(c, rng):
    """A line of 3 to 8 words of class `c`."""
    return " ".join(rng.choice(KIT_CLASSES[c].split(), int(rng.integers(3, 9))))


@pytest.fixture(scope="module")
def kit_case(tmp_path_factory):
    """A translator over a 32-piece SentencePiece model, trained briefly on the kit's toy task and
    exported to `gpu`, with spm.model and src.txt (`SENTENCES` lines) beside it; the source rows as the
    kit cuts and pads them."""
    import sentencepiece as spm

    folder = tmp_path_factory.mktemp("translate-kit-gpu")
    rng = np.random.default_rng(1)
    sp_model = train_sentencepiece([kit_line(c % len(KIT_CLASSES), rng) for c in range(120)], vocab_size=32)
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    model = translator(vocab_size=processor.GetPieceSize())
    chains = chains_of(np.random.default_rng(0).permutation(np.arange(NUM_RESERVED_IDS, 32)).tolist(),
                       len(KIT_CLASSES))
    train_briefly(model, lambda c, rng: processor.encode(kit_line(c, rng)), chains)
    result = export_translation(model, target="gpu", source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH)
    assert result.report["same_tokens"] and result.report["verdicts"]["webgpu"] == []
    result.save(str(folder / "de_gpu.tflite"))
    rng = np.random.default_rng(11)
    lines = [kit_line(int(c), rng) for c in rng.integers(0, len(KIT_CLASSES), SENTENCES)]
    (folder / "spm.model").write_bytes(sp_model)
    (folder / "src.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    rows = [(pieces[:SOURCE_LENGTH - 1] + [EOS_ID] + [PAD_ID] * SOURCE_LENGTH)[:SOURCE_LENGTH]
            for pieces in processor.encode(lines)]
    return folder, model, rows


def run_kit_on_litert_gpu(edge, folder, precision):
    """The kit, greedy and GPU-only on LiteRT at `precision`: each line's step logits (`--logits`)."""
    litert = os.path.join(edge.CACHE, "venv-litert", "bin", "python")
    logits = str(folder / f"logits-{precision}.npz")
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(edge._environment(scratch), PYTHONPATH=sentencepiece_only(scratch))
        done = subprocess.run([litert, KIT, "de_gpu.tflite", "--spm", "spm.model", "--input", "src.txt",
                               "--output", f"hyp-{precision}.txt", "--beam-size", "1", "--max-new-tokens",
                               str(NEW_TOKENS), "--runtime", "litert", "--accelerator", "gpu", "--precision",
                               precision, "--logits", logits, "--json"],
                              cwd=folder, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["runtime"] == "ai_edge_litert.CompiledModel" and shown["accelerator"] == "gpu"
    assert shown["fully_accelerated"] is True  # a GPU-only compilation: no op left on the CPU
    with np.load(logits) as kept:
        return [kept[f"line_{k}"] for k in range(len(kept.files))]


def test_the_gpu_file_on_litert_gpu_translates_as_keras_and_in_float16_differs_only_at_near_ties(
        edge, kit_case):
    folder, model, rows = kit_case
    translations, references = keras_reference(model, rows)
    steps = run_kit_on_litert_gpu(edge, folder, "fp32")
    runs = [(greedy_ids(logits), logits) for logits in steps]
    worst = check_float32(runs, translations, references, "gpu fp32")
    half = run_kit_on_litert_gpu(edge, folder, "fp16")
    parted = check_half_translations(half, references)
    print(f"LiteRT GPU: float32 as translate (max |dlogit| {worst:.2e}); float16: {parted} of {len(rows)} "
          "greedy translations part from float32")
