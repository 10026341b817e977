"""`translation_export`'s checks and report before any conversion.

The files are stood in for by the signatures' `tf.function`s (tests/translator_sessions.py): the
parity, beam and quality checks run over them against `Seq2SeqTransformer.translate`, a second model
stands for a quantized file, and `build_translation` runs with its conversion replaced by those
sessions (`tensorrt`, whose report has no flatbuffer verdicts), so its report, lines, metadata and
refusals are read whole. Expected values are computed here from the models; the converted files
are tests/test_export_translation.py's. The file runs in seconds (what `make mutation` runs).
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from stacks import once_on_keras2
from translator_sessions import (
    CACHE_LENGTH,
    SOURCE_LENGTH,
    VOCAB,
    check_sources,
    function_session,
    sharp_translator,
)

from keras_posenc.export import translation_export
from keras_posenc.export.kinds import TRANSLATE
from keras_posenc.export.targets import TARGETS, target_of
from keras_posenc.models import CausalLM
from keras_posenc.seq2seq import Seq2SeqTransformer

# The checks read numpy arrays from the sessions; what differs on Keras 3 (its clone's signatures,
# its translate) is tests/test_translator_signatures.py's and tests/test_seq2seq.py's.
pytestmark = once_on_keras2("checks over numpy outputs of the signatures, which Keras 3 runs elsewhere")


@pytest.fixture(scope="module")
def model():
    return sharp_translator()


@pytest.fixture(scope="module")
def other():
    """Another translator of the same shapes: a file that computes something else."""
    return sharp_translator(seed=7)


@pytest.fixture(scope="module")
def near(model):
    """The model with its weights moved a little: a quantized file, which picks some of its tokens."""
    copy = sharp_translator()
    rng = np.random.default_rng(1)
    copy.set_weights([w + rng.normal(0, 0.02, w.shape).astype(w.dtype) for w in model.get_weights()])
    return copy


def _session(model, beam_rows=0):
    return function_session(model, SOURCE_LENGTH, CACHE_LENGTH, beam_rows)


def _keras_ids(model, row, max_new_tokens, beam_size=1):
    return model.translate(np.array([row], np.int32), max_new_tokens, beam_size=beam_size).ids[0].tolist()


def _teacher_forced(model, row, ids):
    target = np.array([[model.bos_id] + ids[:-1]], np.int32)
    return np.asarray(model({"source_ids": np.array([row], np.int32), "target_ids": target}), np.float64)[0]


# check_parity, check_beams, translation_quality ------------------------------------------------
def test_parity_of_the_models_own_signatures_is_the_same_ids_and_float32_noise(model):
    same, parity, tokens = translation_export.check_parity(model, _session(model), check_sources(model), 6)
    expected_tokens = sum(len(_keras_ids(model, row, 6) or [model.eos_id]) for row in check_sources(model))
    assert (same, tokens) == (True, expected_tokens) and 0 < parity < 1e-4


def test_parity_of_another_models_files_is_their_logit_difference(model, other):
    sources = check_sources(model)
    same, parity, tokens = translation_export.check_parity(model, _session(other), sources, 6)
    expected, worst = True, 0.0
    for row in sources:
        ids = _keras_ids(model, row, 6)
        expected = expected and ids == _keras_ids(other, row, 6)
        fed = ids or [model.eos_id]
        worst = max(worst, np.abs(_teacher_forced(model, row, fed) - _teacher_forced(other, row, fed)).max())
    assert same is expected is False
    assert parity == pytest.approx(worst, abs=1e-4) and parity > 1.0
    assert tokens == sum(len(_keras_ids(model, row, 6) or [model.eos_id]) for row in sources)


def test_check_beams_compares_with_translate_at_the_rows_beam(model):
    """Two rows: the files' beam of 2 against translate's beam of 2 (not its default 4)."""
    sources = next(rows for rows in (check_sources(model, seed) for seed in range(20))
                   if any(_keras_ids(model, row, 6, 2) != _keras_ids(model, row, 6, 4) for row in rows))
    assert translation_export.check_beams(model, _session(model, beam_rows=2), sources, 6) is True


def test_check_beams_compares_translates_beam_of_4_at_most_the_rows(model, other):
    sources = check_sources(model)
    assert translation_export.check_beams(model, _session(model, beam_rows=3), sources, 6) is True
    differ = any(_keras_ids(model, row, 6, 3) != _keras_ids(other, row, 6, 3) for row in sources)
    assert differ and translation_export.check_beams(model, _session(other, beam_rows=3), sources, 6) is False
    session = _session(model, beam_rows=6)
    seen = []
    run = session.run
    session.run = lambda signature, feeds: seen.append(len(feeds.get("token_id", ()))) or run(signature,
                                                                                              feeds)
    assert translation_export.check_beams(model, session, sources[:1], 6) is True
    assert translation_export.CHECKED_BEAM == 4
    assert set(seen) == {0, 1, 6}  # encode, decode, and decode_beams' 6 rows


def test_quality_of_a_file_against_itself_is_full_agreement(model):
    session = _session(model)
    quality = translation_export.translation_quality(model, session, session, check_sources(model), 6)
    assert quality == {"sentences": 3, "same_greedy_tokens": True, "generation_agreement": 1.0}


def test_quality_counts_the_steps_where_the_quantized_file_picks_float32s_token(model, near):
    sources = check_sources(model)
    seen = []

    def score(translations):
        seen.append(translations)
        return {"bleu": 40.0 - 15.0 * len(seen), "chrf": 60.0 - len(seen)}

    bound = CACHE_LENGTH - 1
    quality = translation_export.translation_quality(model, _session(model), _session(near), sources, bound,
                                                     score)
    hits = steps = 0
    references, owns = [], []
    for row in sources:
        reference = _keras_ids(model, row, bound)
        fed = reference + [model.eos_id] if len(reference) < bound else reference
        logits = _teacher_forced(near, row, fed)
        logits[:, [model.pad_id, model.bos_id]] = -np.inf
        hits += sum(int(a) == b for a, b in zip(np.argmax(logits, axis=-1), fed))
        steps += len(fed)
        references.append(reference)
        owns.append(_keras_ids(near, row, bound))
    assert seen == [references, owns]
    assert min(map(len, references)) < bound == max(map(len, references))  # the end token fed after one
    assert quality == {"sentences": 3, "same_greedy_tokens": references == owns,
                       "generation_agreement": pytest.approx(hits / steps), "bleu_float": 25.0,
                       "bleu_quantized": 10.0, "bleu_drop": 15.0, "chrf_float": 59.0, "chrf_quantized": 58.0}
    assert 0 < hits < steps


def test_a_translation_of_max_new_tokens_is_fed_without_an_end_token(model):
    session = _session(model)
    fed = []
    run = session.run
    session.run = lambda signature, feeds: fed.append(int(feeds["token_id"][0, 0])) or run(signature, feeds) \
        if signature == "decode" else run(signature, feeds)
    row = check_sources(model)[0]
    full = _keras_ids(model, row, 3)
    assert len(full) == 3
    translation_export.translation_quality(model, session, session, [row], 3)
    # greedy twice (bos + 2 tokens each), then forced: bos + the first two of the three, no </s>
    assert fed[-3:] == [model.bos_id] + full[:2]


def test_the_quality_line(model):
    quality = {"sentences": 3, "same_greedy_tokens": False, "generation_agreement": 0.875}
    assert translation_export.format_translation_quality(quality, 1.0) == (
        "Quality against float32 (3 sentences, greedy): same tokens on every sentence: False, fed float32's "
        "tokens it picks them at 87.5% of the steps.")
    quality.update(bleu_float=25.0, bleu_quantized=24.125, bleu_drop=0.875, chrf_float=50.5,
                   chrf_quantized=50.0)
    assert translation_export.format_translation_quality(quality, 0.5) == (
        "Quality against float32 (3 sentences, greedy): same tokens on every sentence: False, fed float32's "
        "tokens it picks them at 87.5% of the steps; BLEU 25.00 -> 24.12 (limit: a drop of 0.5), chrF "
        "50.50 -> 50.00.")
    assert translation_export.format_translation_quality(None, 1.0) == "Quality: not measured."


# the checks of the arguments ------------------------------------------------------------------
def test_default_sources_are_ordinary_ids_ending_in_eos(model):
    sources = translation_export.default_sources(model, SOURCE_LENGTH)
    ordinary = list(range(5, VOCAB))
    lengths = [3, 7, 7]
    assert sources == [[ordinary[(7 * r + 13 * i) % len(ordinary)] for i in range(n)] + [model.eos_id]
                       for r, n in enumerate(lengths)]
    assert translation_export.default_sources(model, 3) == [s[:2] + [model.eos_id] for s in sources]
    assert translation_export.default_sources(model, SOURCE_LENGTH, count=1) == sources[:1]
    assert [len(row) for row in translation_export.default_sources(model, 12)] == [4, 8, 12]  # 3, 7, 11 ids
    assert translation_export.default_sources(model, 2) == [[5, model.eos_id], [12, model.eos_id],
                                                             [19, model.eos_id]]


@pytest.mark.parametrize("target", ["cpu", "gpu", "gl", "tensorrt"])
def test_the_translator_targets_by_name_or_object(model, target):
    assert translation_export.check_translation(model, 2, 12, target) is TARGETS[target]
    assert translation_export.check_translation(model, 12, 2, TARGETS[target]) is TARGETS[target]


@pytest.mark.parametrize("call, message", [
    (("lm", 8, 8, "cpu"), "A translator export (--translate) needs a keras_posenc Seq2SeqTransformer "
                          "(`keras-posenc train --task translate`), got CausalLM."),
    ((None, 8, 8, "tflite"), "A translator export supports target in ('cpu', 'gpu', 'gl', 'tensorrt'), got "
                             "target='tflite'."),
    ((None, 1, 8, "cpu"), "`source_length` must be an int in [2, max_length=12], got source_length=1."),
    ((None, 13, 8, "cpu"), "`source_length` must be an int in [2, max_length=12], got source_length=13."),
    ((None, 8, 13, "cpu"), "`cache_length` must be an int in [2, max_length=12], got cache_length=13."),
    ((None, 8, True, "cpu"), "`cache_length` must be an int in [2, max_length=12], got cache_length=True."),
    ((None, 8.0, 8, "cpu"), "`source_length` must be an int in [2, max_length=12], got source_length=8.0."),
])
def test_refusals_name_the_argument_and_value(model, call, message):
    first, *rest = call
    if first == "lm":
        first = CausalLM({"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 20,
                          "max_length": 16})
    with pytest.raises(ValueError) as error:
        translation_export.check_translation(first or model, *rest)
    assert str(error.value) == message


def test_the_gpu_targets_take_lengths_up_to_float16_integers(monkeypatch):
    big = Seq2SeqTransformer(num_layers=1, d_model=8, num_heads=2, dff=16, vocab_size=20, max_length=4096)
    limit = TARGETS["gpu"].max_cache_length
    for target in ("gpu", "gl"):
        assert translation_export.check_translation(big, limit, limit, target).name == target
        with pytest.raises(ValueError) as error:
            translation_export.check_translation(big, 8, limit + 1, target)
        assert str(error.value) == (f"target={target!r} takes `cache_length` up to {limit} (the GPU compares "
                                    f"positions as float16 integers), got cache_length={limit + 1}.")
    assert translation_export.check_translation(big, limit + 1, limit + 1, "cpu").name == "cpu"


@pytest.mark.parametrize("target, given, rows", [("cpu", None, 4), ("tensorrt", None, 4), ("gpu", None, 0),
                                                 ("gl", None, 0), ("cpu", 0, 0), ("cpu", 2, 2),
                                                 ("tensorrt", 7, 7), ("gl", 0, 0)])
def test_beam_rows_default_and_given(target, given, rows):
    assert translation_export.beam_rows_of(target_of(target), given) == rows


@pytest.mark.parametrize("target, given, message", [
    ("cpu", 1, "`beam_rows` must be 0 (no decode_beams) or an int >= 2, got beam_rows=1."),
    ("cpu", -2, "`beam_rows` must be 0 (no decode_beams) or an int >= 2, got beam_rows=-2."),
    ("cpu", True, "`beam_rows` must be 0 (no decode_beams) or an int >= 2, got beam_rows=True."),
    ("cpu", 2.0, "`beam_rows` must be 0 (no decode_beams) or an int >= 2, got beam_rows=2.0."),
    ("gpu", 2, "`beam_rows` is for the cpu and tensorrt targets (the GPU files are batch 1), got beam_rows=2 "
               "with target='gpu'."),
])
def test_beam_rows_refusals(target, given, message):
    with pytest.raises(ValueError) as error:
        translation_export.beam_rows_of(target_of(target), given)
    assert str(error.value) == message


def test_the_metadata_the_kit_reads(model):
    metadata = translation_export.translation_metadata(model, source_length=8, cache_length=9,
                                                       target=target_of("gl"))
    assert metadata == {"kind": "translate", "target": "gl", "accelerators": list(TARGETS["gl"].runs_on),
                        "input_dtype": "float32", "embedding": "graph", "vocab_size": VOCAB, "num_layers": 2,
                        "pad_id": 0, "bos_id": model.bos_id, "eos_id": model.eos_id, "unk_id": 1,
                        "special_ids": [0, 1, 2, 3, 4], "source_length": 8, "cache_length": 9,
                        "cache_shape": [1, 9, 2, 8], "cross_shape": [1, 8, 2, 8],
                        "cache_bytes": 2 * 2 * 9 * 16 * 4, "length_penalty": 1.0}
    # Written as JSON and given to np.zeros by the kit, which refuses a float dimension (8.0 == 8).
    assert json.dumps([metadata["cache_shape"], metadata["cross_shape"]]) == "[[1, 9, 2, 8], [1, 8, 2, 8]]"


# build_translation with the files stood in for ------------------------------------------------
@pytest.fixture
def built_with(monkeypatch, near):
    """`build_translation` whose `_files` gives function sessions (the quantized one: `near`'s)."""
    calls = []

    def files(model, target, source_length, cache_length, beam_rows, recipe, litert_python, interpreter,
              calibration=None):
        calls.append({"target": target.name, "recipe": recipe, "beam_rows": beam_rows,
                      "calibration": calibration, "lengths": (source_length, cache_length)})
        session = function_session(model if recipe is None else near, source_length, cache_length, beam_rows)
        return (b"encode", b"decode"), session

    monkeypatch.setattr(translation_export, "_files", files)

    def build(model, **settings):
        arguments = {"target": "tensorrt", "precision": None, "source_length": SOURCE_LENGTH,
                     "cache_length": CACHE_LENGTH, "max_new_tokens": 6}
        return translation_export.build_translation(model, **{**arguments, **settings}), calls

    return build


def test_a_float32_build_reports_parity_and_beams(model, built_with):
    built, calls = built_with(model, check_sources=check_sources(model))
    same, parity, tokens = translation_export.check_parity(model, _session(model), check_sources(model), 6)
    assert calls == [{"target": "tensorrt", "recipe": None, "beam_rows": 4, "calibration": None,
                      "lengths": (SOURCE_LENGTH, CACHE_LENGTH)}]
    assert built.report == {"same_tokens": True, "parity": pytest.approx(parity, abs=1e-6),
                            "tokens_checked": tokens, "verdicts": {}, "max_bleu_drop": 1.0,
                            "same_beam_tokens": True}
    assert built.lines == [
        f"Greedy parity over {tokens} tokens of 3 sources: same tokens as Seq2SeqTransformer.translate, max "
        f"abs logit diff {built.report['parity']:.3g}",
        "Beam search of 4 over decode_beams (4 rows): same tokens as translate(beam_size=4)"]
    assert built.description == ("target tensorrt: encode [1, 8], decode [1, 1] and [4, 1] (decode_beams), "
                                 "cache 9 slots = 2304 bytes")
    assert built.models == (b"encode", b"decode") and built.signatures == ("encode", "decode", "decode_beams")
    assert built.metadata == {**translation_export.translation_metadata(
        model, source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH, target=target_of("tensorrt")),
        "quantize": None, "beam_rows": 4}
    assert (built.target, built.quantize, built.embedding, built.kind, built.recipe, built.quality) == (
        "tensorrt", None, "graph", TRANSLATE, None, None)
    assert built.format_quality(None, None) == "Quality: not measured."


def test_a_build_without_beams_has_no_beam_line(model, built_with):
    built, _ = built_with(model, check_sources=check_sources(model), beam_rows=0)
    assert built.report["same_beam_tokens"] is None and len(built.lines) == 1
    assert built.signatures == ("encode", "decode")
    assert built.description == "target tensorrt: encode [1, 8], decode [1, 1], cache 9 slots = 2304 bytes"
    assert built.metadata["beam_rows"] == 0


def test_files_that_translate_otherwise_are_reported_so(model, other, monkeypatch):
    monkeypatch.setattr(translation_export, "_files", lambda *args, **kwargs: (
        (b"encode", b"decode"), function_session(other, SOURCE_LENGTH, CACHE_LENGTH, kwargs["beam_rows"])))
    built = translation_export.build_translation(model, target="tensorrt", precision=None,
                                                 source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH,
                                                 check_sources=check_sources(model), max_new_tokens=6)
    assert (built.report["same_tokens"], built.report["same_beam_tokens"]) == (False, False)
    assert " tokens of 3 sources: TOKENS DIFFER from Seq2SeqTransformer.translate, max abs logit diff " in \
        built.lines[-2]
    assert built.lines[-1] == ("Beam search of 4 over decode_beams (4 rows): TOKENS DIFFER from "
                               "translate(beam_size=4)")


def test_the_check_sources_are_cut_to_the_source_length_and_default_to_default_sources(model, built_with):
    long = list(range(5, 5 + SOURCE_LENGTH + 3))
    built, _ = built_with(model, check_sources=[long])
    assert built.report["same_tokens"] is True
    built, _ = built_with(model)
    sources = translation_export.default_sources(model, SOURCE_LENGTH)
    assert built.report["tokens_checked"] == sum(len(_keras_ids(model, row, 6) or [1]) for row in sources)


def test_a_quantized_build_measures_quality_on_its_sources_and_calibrates_onnx_int8(model, near, built_with):
    seen = []

    def score(translations):
        seen.append(translations)
        return {"bleu": 30.0 - len(seen), "chrf": 50.0}

    quality_sources = check_sources(model, seed=5)
    built, calls = built_with(model, precision="int8", check_sources=check_sources(model),
                              quality_sources=quality_sources, score=score, max_bleu_drop=0.5)
    assert [call["recipe"] is None for call in calls] == [True, False]
    calibration = calls[1]["calibration"]
    assert sorted(calibration) == ["decode", "decode_beams", "encode"]
    assert len(calibration["encode"]) == 2 * 3  # greedy and beam search of each check source
    assert all(sorted(feeds) == ["source_ids"] for feeds in calibration["encode"])
    assert built.quality == translation_export.translation_quality(
        model, _session(model), _session(near), quality_sources, 6, score) | {"bleu_float": 29.0,
                                                                               "bleu_quantized": 28.0}
    assert len(seen[0]) == 3 and built.report["same_beam_tokens"] is None
    assert built.report["max_bleu_drop"] == 0.5 and built.metadata["quantize"] == "int8"
    assert built.description.endswith(", int8 weights")
    assert built.format_quality(built.quality, None).endswith("(limit: a drop of 0.5), chrF 50.00 -> 50.00.")


def test_an_int8_build_checking_one_new_token_calibrates_every_signature(model, near, built_with):
    """The calibration runs as many steps as the files allow, whatever the check's `max_new_tokens`:
    a beam search of one step would never call `decode_beams`."""
    _, calls = built_with(model, precision="int8", max_new_tokens=1, check_sources=check_sources(model))
    calibration = calls[1]["calibration"]
    assert sorted(calibration) == ["decode", "decode_beams", "encode"]
    assert all(calibration[key] for key in calibration)
    assert len(calibration["decode"]) > 2 * 3  # more steps than the first of each greedy and beam run


def test_a_float16_build_is_not_calibrated(model, built_with):
    built, calls = built_with(model, precision="float16", check_sources=check_sources(model))
    assert [call["calibration"] for call in calls] == [None, None]
    assert built.quality["sentences"] == 3  # the check sources, without quality sources


@pytest.mark.parametrize("value, message", [
    (0, "`max_new_tokens` must be an int in [1, 9] (the cache length and the model's max_length - 1), got "
        "max_new_tokens=0."),
    (10, "`max_new_tokens` must be an int in [1, 9] (the cache length and the model's max_length - 1), got "
         "max_new_tokens=10."),
    (True, "`max_new_tokens` must be an int in [1, 9] (the cache length and the model's max_length - 1), got "
           "max_new_tokens=True."),
])
def test_max_new_tokens_is_checked_against_the_cache(model, built_with, value, message):
    with pytest.raises(ValueError) as error:
        built_with(model, max_new_tokens=value)
    assert str(error.value) == message


def test_a_precision_the_translators_runtime_cannot_run_is_refused_before_any_conversion(model, monkeypatch):
    from keras_posenc.export import quantization

    monkeypatch.setattr(translation_export, "_files", lambda *args, **kwargs: pytest.fail("converted"))
    with pytest.raises(ValueError) as error:
        translation_export.build_translation(model, target="cpu", precision="int4",
                                             source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH)
    refusal = quantization.recipes_of(target_of("cpu"), TRANSLATE)["int4"]
    assert str(error.value) == f"--quantize int4 is refused for target='cpu': {refusal}."


def test_the_litert_python_given_is_the_one_a_litert_checked_recipe_looks_for(model, built_with, monkeypatch):
    from keras_posenc.export import quantization

    asked = []
    monkeypatch.setattr(quantization, "runtime_python", lambda given, module: asked.append(given))
    monkeypatch.setattr(quantization, "_litert_in_process", lambda: False)
    with pytest.raises(ValueError, match=r"^--quantize int8 on target='gl' is checked by ai-edge-litert"):
        built_with(model, target="gl", precision="int8", litert_python="/opt/litert/bin/python")
    assert asked == ["/opt/litert/bin/python"]


def test_the_recipes_interpreter_and_litert_python_reach_every_file(model, near, monkeypatch):
    """A gl int8 build: the files are converted with the LiteRT Python given, and both the float32
    reference and the quantized file run on the interpreter that `interpreter_for` gives the recipe."""
    import contextlib

    from keras_posenc.export import quantization

    opened, files = [], []

    @contextlib.contextmanager
    def interpreter_for(recipe, litert_python=None):
        opened.append((recipe, litert_python))
        yield "LiteRT's interpreter"

    def converted(model_, target, source_length, cache_length, beam_rows, recipe, litert_python, interpreter,
                  calibration=None):
        files.append((recipe, litert_python, interpreter))
        session = function_session(model_ if recipe is None else near, source_length, cache_length, beam_rows)
        return (b"encode", b"decode"), session

    monkeypatch.setattr(quantization, "_litert_in_process", lambda: False)
    monkeypatch.setattr(quantization, "runtime_python", lambda given, module: given)
    monkeypatch.setattr(translation_export, "interpreter_for", interpreter_for)
    monkeypatch.setattr(translation_export, "_files", converted)
    monkeypatch.setattr(translation_export, "verdict_line", lambda flat, backend: "verdict")
    monkeypatch.setattr(translation_export, "gpu_incompatible_ops", lambda flat, backend: [])
    built = translation_export.build_translation(
        model, target="gl", precision="int8", source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH,
        check_sources=check_sources(model), max_new_tokens=2, litert_python="/opt/litert/bin/python")
    recipe = quantization.recipe_for("gl", "int8", TRANSLATE, litert_python="/opt/litert/bin/python")
    assert opened == [(built.recipe, "/opt/litert/bin/python")] and built.recipe == recipe
    assert files == [(None, "/opt/litert/bin/python", "LiteRT's interpreter"),
                     (built.recipe, "/opt/litert/bin/python", "LiteRT's interpreter")]


def test_max_new_tokens_defaults_to_the_cache_or_the_models_bound(model, built_with):
    row = check_sources(model)[0]  # no decode_beams: the parity's greedy tokens count the steps
    built, _ = built_with(model, max_new_tokens=None, check_sources=[row], beam_rows=0)
    assert built.report["tokens_checked"] == len(_keras_ids(model, row, CACHE_LENGTH) or [1])
    built, _ = built_with(model, max_new_tokens=None, cache_length=12, check_sources=[row], beam_rows=0)
    assert built.report["tokens_checked"] == len(_keras_ids(model, row, 11) or [1])


@pytest.fixture(scope="module")
def flatbuffers():
    """Three tiny TFLite files: one every GPU backend runs (ADD), one with a lookup (GATHER), one that
    the LiteRT GPU accelerator runs and the GL delegate does not (TRANSPOSE)."""
    import tensorflow as tf

    table = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
    add = tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([2, 3], tf.float32)])
    gather = tf.function(lambda ids: tf.gather(table, ids), input_signature=[tf.TensorSpec([2], tf.int32)])
    transpose = tf.function(lambda x: tf.transpose(x) + 1.0,
                            input_signature=[tf.TensorSpec([2, 3], tf.float32)])
    return tuple(tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()]).convert()
                 for f in (add, gather, transpose))


@pytest.mark.parametrize("target, files", [("gl", (0, 1)), ("cpu", (1,)), ("gl", (0, 2))])
def test_a_tflite_build_reports_each_backends_verdict_per_signature_file(model, flatbuffers, monkeypatch,
                                                                          target, files):
    from keras_posenc.export.verdicts import gpu_incompatible_ops, verdict_line

    models = tuple(flatbuffers[i] for i in files)
    monkeypatch.setattr(translation_export, "_files", lambda *args, **kwargs: (
        models, function_session(model, SOURCE_LENGTH, CACHE_LENGTH, kwargs["beam_rows"])))
    built = translation_export.build_translation(model, target=target, precision=None,
                                                 source_length=SOURCE_LENGTH, cache_length=CACHE_LENGTH,
                                                 check_sources=check_sources(model)[:1], max_new_tokens=4,
                                                 beam_rows=0)
    backends = TARGETS[target].backends
    assert built.report["verdicts"] == {backend: sorted({op for flat in models
                                                         for op in gpu_incompatible_ops(flat, backend)})
                                        for backend in backends}
    assert any(built.report["verdicts"].values())  # GATHER or TRANSPOSE is refused somewhere
    if 2 in files:  # each backend's own verdict
        assert built.report["verdicts"] == {"gl": ["TRANSPOSE"], "webgpu": []}
    if len(models) == 2:
        expected = [f"{signature}: {verdict_line(flat, backend)}" for backend in backends
                    for signature, flat in zip(("encode", "decode"), models)]
    else:
        expected = [verdict_line(models[0], backend) for backend in backends]
    assert built.lines[:-1] == expected and built.lines[-1].startswith("Greedy parity over ")
    assert built.models == models


# _files: the converted files and their session -------------------------------------------------
class _RecordingInterpreter(tf.lite.Interpreter):
    opened = 0

    def __init__(self, **kwargs):
        type(self).opened += 1
        super().__init__(**kwargs)


@pytest.mark.parametrize("target, files", [("cpu", 1), ("gl", 2)])
def test_the_files_session_opens_each_file_with_the_interpreter_given_and_no_decode_beams(model, target,
                                                                                          files):
    _RecordingInterpreter.opened = 0
    models, session = translation_export._files(
        model, TARGETS[target], SOURCE_LENGTH, CACHE_LENGTH, beam_rows=0, recipe=None, litert_python=None,
        interpreter=_RecordingInterpreter)
    assert len(models) == files and _RecordingInterpreter.opened == files
    assert set(session.calls) == {"encode", "decode"} and session.beam_rows == 0
    row = check_sources(model)[0]
    assert translation_export._ids(model, session, row, 6).ids[0].tolist() == _keras_ids(model, row, 6)
