"""The prefill/decode exporter piece by piece, on a two-layer model and on scripted sessions.

tests/test_export_generator.py checks whole exports over 32 tokens; these tests pin each function
of `keras_posenc.export.generator` on inputs small enough to run in a second or two: the refusals
with their messages, the boundaries of the lengths, the feeds greedy generation sends, the figures
of the quality report recomputed by hand, and the files' inputs, outputs and metadata.
"""

import contextlib
import json
import os

import numpy as np
import onnx
import pytest
import tensorflow as tf
from litert_stand_in import FAILED_QUANTIZE, executable, failing_litert_python
from stacks import once_on_keras2
from tflite_files import tensor_dtypes

from keras_posenc import special_ids
from keras_posenc.backend import keras
from keras_posenc.export import (
    generation_export,
    generator,
    model_spec,
    pipeline,
    quantization,
    runners,
)
from keras_posenc.export import quality as quality_module
from keras_posenc.export.targets import target_of
from keras_posenc.models import CausalLM

# generator.py's own decisions (lengths, defaults, which Python checks, every kind on a tiny file).
plumbing_once = once_on_keras2("generator.py's own decisions; test_export_generator.py converts and runs the "
                               "files of every kind on both stacks")

TINY = {"num_layers": 2, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 20, "max_length": 16,
        "dropout": 0.0}


def _model(**config):
    keras.utils.set_random_seed(11)
    model = CausalLM({**TINY, **config})
    model.build_on_dummy()
    return model


@pytest.fixture(scope="module")
def model():
    return _model()


def _generates_like_keras(model, session, prompt, steps):
    """The file's greedy tokens are Keras's, and each step's logits are the full forward pass's."""
    ids, logits = runners.greedy_generate(session, prompt, steps)
    assert ids == model.generate(prompt, steps).ids[0].tolist()
    full = np.asarray(model(np.array([prompt + ids[:-1]], np.int32)))[0, len(prompt) - 1:]
    np.testing.assert_allclose(logits, full, atol=1e-5, rtol=0)


# --- the checks before any conversion ----------------------------------------------------------

@pytest.mark.parametrize("prompt_length,cache_length,target", [
    (4, 16, "cpu"),    # the cache as long as the model
    (16, 16, "cpu"),   # a prompt as long as the cache
    (1, 1, "gpu"),
    (4, 16, "gl"),
    (4, 16, "tensorrt"),
])
def test_lengths_at_their_bounds_are_accepted(model, prompt_length, cache_length, target):
    assert generator.check_export(model, prompt_length, cache_length, target) is target_of(target)


def test_the_gpu_cache_bound_is_2048_inclusive():
    long = CausalLM({**TINY, "max_length": 2049})  # checked before any build
    assert generator.check_export(long, 4, 2048, "gl").name == "gl"
    assert generator.check_export(long, 4, 2048, "gpu").name == "gpu"
    assert generator.check_export(long, 4, 2049, "cpu").name == "cpu"  # only the shader targets
    with pytest.raises(ValueError) as error:
        generator.check_export(long, 4, 2049, "gpu")
    assert str(error.value) == ("target='gpu' takes `cache_length` up to 2048 (the GPU compares positions as "
                                "float16 integers), got cache_length=2049.")


class _AnotherLibrarysLM(keras.Model):
    """A causal LM of another library: it generates, but has no keras_posenc `encoder`."""

    def generate(self, prompt, max_new_tokens):
        raise AssertionError("never called")


@pytest.mark.parametrize("make,args,message", [
    (lambda: keras.Sequential([keras.layers.Dense(2)]), (4, 8, "cpu"),
     "A prefill/decode export needs a keras_posenc CausalLM, got Sequential."),
    (_AnotherLibrarysLM, (4, 8, "cpu"),
     "A prefill/decode export needs a keras_posenc CausalLM, got _AnotherLibrarysLM."),
    (lambda: _model(), (4, 8, "metal"),
     "A prefill/decode export supports target in ('gpu', 'gl', 'cpu', 'tensorrt'), got target='metal'."),
    (lambda: _model(), (4, 8, None),
     "A prefill/decode export supports target in ('gpu', 'gl', 'cpu', 'tensorrt'), got target=None."),
    (lambda: CausalLM(TINY, causal=False), (4, 8, "cpu"),
     "A prefill/decode export needs a causal model; this CausalLM has causal=False."),
    (lambda: CausalLM({**TINY, "num_languages": 2}), (4, 8, "cpu"),
     "A prefill/decode export of a model with num_languages is not supported: export it with "
     "`keras-posenc export` (fixed window) instead."),
    (lambda: _model(), (4, 17, "cpu"),
     "`cache_length`=17 exceeds the model's max_length=16: the cache holds the prompt and every "
     "generated token."),
    (lambda: _model(), (9, 8, "cpu"), "`prompt_length`=9 exceeds `cache_length`=8."),
])
def test_refused_exports_name_the_argument_and_value(make, args, message):
    with pytest.raises(ValueError) as error:
        generator.check_export(make(), *args)
    assert str(error.value) == message


def test_embedding_choice_and_its_refusals(model):
    choose = generator.embedding_of
    assert choose(model, "gpu", None) == "host" and choose(model, "gl", None) == "host"
    assert choose(model, "cpu", None) == "graph"
    assert choose(model, "gpu", "graph") == "graph" and choose(model, "gl", "host") == "host"
    with pytest.raises(ValueError) as error:
        choose(model, "gpu", "rows")
    assert str(error.value) == "`embedding` must be one of ('graph', 'host'), got embedding='rows'."
    with pytest.raises(ValueError) as error:
        choose(model, "cpu", "host")
    assert str(error.value) == "`embedding='host'` is for the gpu and gl targets, got target='cpu'."


def test_the_cache_size_and_the_kit_metadata(model):
    assert generator.cache_bytes(model, 12) == 2 * 2 * 12 * 8 * 4
    two = CausalLM({**TINY, "num_layers": 2, "d_model": 16})
    assert generator.cache_bytes(CausalLM({**TINY, "num_layers": 3}), 5) == 2 * 3 * 5 * 8 * 4
    assert generator.cache_bytes(two, 5) == 2 * 2 * 5 * 16 * 4
    meta = generation_export.generator_metadata(two, prompt_length=3, cache_length=5, target="gl")
    assert meta == {"kind": "prefill_decode", "target": "gl", "accelerators": ["gpu", "cpu"],
                    "prompt_length": 3, "cache_length": 5, "vocab_size": 20, "num_layers": 2,
                    "pad_id": 0, "bos_id": special_ids.BOS_ID, "eos_id": special_ids.EOS_ID,
                    "unk_id": special_ids.UNK_ID, "special_ids": [0, 1, 2, 3, 4], "cache_bytes": 1280}
    metadata = generation_export.generator_metadata(two, prompt_length=3, cache_length=5, target="cpu")
    assert metadata["accelerators"] == ["cpu"]


def test_file_names_of_the_one_file_per_signature_exports(tmp_path):
    out = str(tmp_path / "gen.tflite")
    assert generator.tflite_paths(out) == (str(tmp_path / "gen.prefill.tflite"),
                                           str(tmp_path / "gen.decode.tflite"))
    assert generator.onnx_paths(str(tmp_path / "gen.onnx")) == (str(tmp_path / "gen.prefill.onnx"),
                                                                 str(tmp_path / "gen.decode.onnx"))


def test_calibration_prompts_cycle_through_the_ordinary_ids():
    prompts = generator.calibration_prompts(CausalLM({**TINY, "vocab_size": 12}), prompt_length=20)
    ordinary = list(range(5, 12))
    assert prompts == [[ordinary[(7 * row + 13 * i) % 7] for i in range(8)] for row in range(4)]
    assert prompts[1][:3] == [5, 11, 10]
    assert generator.calibration_prompts(CausalLM({**TINY, "vocab_size": 12}), 3, count=2) == [
        [5, 11, 10], [5, 11, 10]]  # 7 = len(ordinary): every row starts at the same id
    assert generator.calibration_prompts(CausalLM({**TINY, "vocab_size": 4}), 2) == [
        [(7 * row + 13 * i) % 4 for i in range(2)] for row in range(4)]  # no ordinary id: all ids
    assert generator.calibration_prompts(CausalLM({**TINY, "vocab_size": 12}), 0, count=1) == [[5]]


# --- greedy generation on a scripted session ---------------------------------------------------

class _Scripted:
    """A session whose logits are a function of the fed token: it prefers `(token + 1) % vocab`, then
    `(token + 2) % vocab`; its cache output holds the fed tokens per slot, so a step sees what the
    steps before it wrote."""

    def __init__(self, prompt_length=4, cache_length=8, vocab_size=10, shift=None):
        self.prompt_length, self.cache_length, self.vocab_size = prompt_length, cache_length, vocab_size
        self.shift = shift or {}  # fed token -> other preferred token
        self.calls = []

    def _logits(self, token):
        first = self.shift.get(int(token), (int(token) + 1) % self.vocab_size)
        logits = np.zeros(self.vocab_size, np.float32)
        logits[(first + 1) % self.vocab_size] = 1.0
        logits[first] = 2.0
        return logits

    def run(self, signature, feeds):
        self.calls.append((signature, {name: np.array(value) for name, value in feeds.items()}))
        if signature == "prefill":
            tokens = feeds["token_ids"]
            assert tokens.dtype == np.int32  # onnxruntime takes the declared int32 only
            cache = np.full([1, self.cache_length], -1, np.int32)
            cache[0, :self.prompt_length] = tokens[0]
            return {"logits": np.stack([self._logits(t) for t in tokens[0]])[None],
                    "present_key_0": cache, "present_value_0": -cache}
        cache = np.array(feeds["past_key_0"])
        assert (feeds["past_value_0"] == -cache).all()
        cache[0, feeds["position"][0]] = feeds["token_id"][0, 0]
        return {"logits": self._logits(feeds["token_id"][0, 0])[None], "present_key_0": cache,
                "present_value_0": -cache}


def test_greedy_generation_feeds_the_padded_prompt_then_one_token_per_step():
    session = _Scripted()
    ids, logits = runners.greedy_generate(session, [2, 5], 4, pad_id=9)
    assert ids == [6, 7, 8, 0]  # 8 + 1 = 9 is the padding id: never picked, its runner-up 0 is
    signatures = [signature for signature, _ in session.calls]
    assert signatures == ["prefill", "decode", "decode", "decode"]  # the last pick is not fed
    prefill = session.calls[0][1]
    assert list(prefill) == ["token_ids"] and prefill["token_ids"].dtype == np.int32
    assert prefill["token_ids"].tolist() == [[2, 5, 9, 9]]
    for step, (_, feeds) in enumerate(session.calls[1:]):
        assert feeds["token_id"].tolist() == [[ids[step]]] and feeds["token_id"].dtype == np.int32
        assert feeds["position"].tolist() == [2 + step] and feeds["position"].dtype == np.int32
    # Each decode step reads the cache the step before wrote: the prompt, then every fed token.
    assert session.calls[3][1]["past_key_0"][0, :4].tolist() == [2, 5, 6, 7]
    # The logits returned are the raw ones that chose each token, padding's score included.
    np.testing.assert_array_equal(logits, np.stack([session._logits(t) for t in [5, 6, 7, 8]]))
    assert logits[3, 9] == 2.0


def test_the_pick_of_the_last_prompt_token_starts_the_run():
    session = _Scripted(shift={3: 7})
    ids, _ = runners.greedy_generate(session, [3, 1, 3], 2)
    assert ids == [7, 8]


def test_a_stop_id_ends_the_run_after_it_is_generated():
    session = _Scripted()
    ids, logits = runners.greedy_generate(session, [2], 6, stop_id=5)
    assert ids == [3, 4, 5] and logits.shape == (3, 10)
    assert len(session.calls) == 3  # prefill, then the steps fed 3 and 4
    ids, _ = runners.greedy_generate(_Scripted(), [2], 3, stop_id=9)
    assert ids == [3, 4, 5]


def test_forced_ids_are_fed_back_instead_of_the_picks():
    session = _Scripted(shift={6: 1})
    ids, _ = runners.greedy_generate(session, [4], 3, forced_ids=[6, 2, 8])
    assert ids == [5, 1, 3]  # the pick after each fed token: after 4, after 6, after 2
    assert [feeds["token_id"].tolist() for _, feeds in session.calls[1:]] == [[[6]], [[2]]]
    # A stop id is matched against the fed token.
    session = _Scripted()
    ids, _ = runners.greedy_generate(session, [4], 3, forced_ids=[6, 2, 8], stop_id=6)
    assert ids == [5] and len(session.calls) == 1


def test_a_run_that_fills_the_cache_exactly_is_allowed():
    session = _Scripted(prompt_length=4, cache_length=8)
    ids, _ = runners.greedy_generate(session, [1, 2, 3], 6)  # slots 0..7: 3 + 6 - 1 = 8
    assert len(ids) == 6
    assert session.calls[-1][1]["position"].tolist() == [7]


@pytest.mark.parametrize("prompt,tokens,message", [
    ([], 2, "the prompt has 0 tokens: it must have 1 to 4 (the prefill length)."),
    ([1, 2, 3, 4, 5], 2, "the prompt has 5 tokens: it must have 1 to 4 (the prefill length)."),
    ([1, 10], 2, "`prompt_ids` must lie in [0, 10) (the vocabulary), got id 10."),
    ([1, -1, 11], 2, "`prompt_ids` must lie in [0, 10) (the vocabulary), got id -1."),
    ([1, 2, 3], 7, "3 prompt tokens + max_new_tokens=7 need 9 cache slots; the file has cache_length=8."),
])
def test_greedy_generation_refuses_what_the_file_cannot_run(prompt, tokens, message):
    session = _Scripted()
    with pytest.raises(ValueError) as error:
        runners.greedy_generate(session, prompt, tokens)
    assert str(error.value) == message
    assert session.calls == []
    ids, _ = runners.greedy_generate(session, [0, 9, 1, 2], 5)  # ids 0 and 9, 4 tokens: in bounds
    assert len(ids) == 5


def test_past_renames_every_present_output_and_drops_the_logits():
    outputs = {"logits": 1, "present_key_0": 2, "present_value_0": 3, "present_key_1": 4}
    assert runners.past(outputs) == {"past_key_0": 2, "past_value_0": 3, "past_key_1": 4}


def test_recorded_feeds_are_the_greedy_runs_that_fill_the_cache():
    session = _Scripted(prompt_length=4, cache_length=6)
    run = session.run
    calls = generator.recorded_feeds(session, [[2, 3], [7]], cache_length=6, pad_id=0)
    assert session.run == run  # the session runs unrecorded again
    assert list(calls) == ["prefill", "decode"]
    assert [feeds["token_ids"].tolist() for feeds in calls["prefill"]] == [[[2, 3, 0, 0]], [[7, 0, 0, 0]]]
    # 6 - 2 + 1 = 5 tokens after [2, 3] (4 decode steps), 6 tokens after [7] (5 steps).
    assert [int(feeds["position"][0]) for feeds in calls["decode"]] == [2, 3, 4, 5, 1, 2, 3, 4, 5]
    assert set(calls["decode"][0]) == {"token_id", "position", "past_key_0", "past_value_0"}
    # The pad id is never generated, so never fed: after 7 comes 8, then 0, not 9.
    calls = generator.recorded_feeds(_Scripted(cache_length=6), [[7]], cache_length=6, pad_id=9)
    assert [int(feeds["token_id"][0, 0]) for feeds in calls["decode"]] == [8, 0, 1, 2, 3]


def test_recorded_feeds_restore_the_session_after_a_failure():
    session = _Scripted(prompt_length=2, cache_length=6)
    run = session.run
    with pytest.raises(ValueError, match="the prompt has 3 tokens"):
        generator.recorded_feeds(session, [[2], [1, 2, 3]], cache_length=6, pad_id=0)
    assert session.run == run


# --- the quality report of a quantized file ------------------------------------------------------

def test_generation_quality_counts_steps_where_the_forced_file_agrees():
    float_session = _Scripted(prompt_length=4, cache_length=12)
    quantized = _Scripted(prompt_length=4, cache_length=12, shift={3: 5})
    quality = generation_export.generation_quality(CausalLM(TINY), float_session, quantized, [[1], [6]], 4)
    # float32 after [1]: 2 3 4 5; the quantized file, fed them, picks 2 3 5 5: 3 of 4 agree.
    # After [6]: 7 8 9 1 (0 is padding), the same picks: 4 of 4.
    assert quality == {"prompts": 2, "greedy_tokens": 4, "same_greedy_tokens": False,
                       "generation_agreement": 7 / 8}
    same = generation_export.generation_quality(CausalLM(TINY), float_session, _Scripted(cache_length=12),
                                                [[6]], 3)
    assert same["same_greedy_tokens"] is True and same["generation_agreement"] == 1.0
    # The model's pad id is never picked, in both files: after 8, float32 picks 0 (9 is padding).
    pad_nine = CausalLM({**TINY, "pad_id": 9})
    padded = generation_export.generation_quality(pad_nine, _Scripted(cache_length=12),
                                          _Scripted(cache_length=12, shift={0: 5}), [[7]], 3)
    assert padded == {"prompts": 1, "greedy_tokens": 3, "same_greedy_tokens": False,
                      "generation_agreement": 2 / 3}  # float32 8 0 1; fed them, 8 0 5
    same = generation_export.generation_quality(pad_nine, _Scripted(cache_length=12),
                                                _Scripted(cache_length=12), [[7]], 3)
    assert same["same_greedy_tokens"] is True  # both 8 0 1, not 8 9 0


def _cross_entropy(logits, rows, pad_id):
    """Mean next-token cross-entropy of the real targets, float64, written out."""
    losses = []
    for row_logits, row in zip(logits, rows):
        for t in range(len(row) - 1):
            if row[t + 1] != pad_id:
                z = np.asarray(row_logits[t], np.float64)
                losses.append(np.log(np.exp(z).sum()) - z[row[t + 1]])
    return float(np.mean(losses)), len(losses)


def test_generation_quality_scores_held_out_rows_on_the_prefill_logits():
    float_session = _Scripted(prompt_length=4, cache_length=12)
    quantized = _Scripted(prompt_length=4, cache_length=12, shift={3: 5})
    held_out = np.array([[1, 2, 3, 4, 5, 6],  # cut to the prefill's 4
                         [3, 0, 0, 0, 0, 0],  # no real next token: left out
                         [2, 3, 0, 0, 0, 0]])
    quality = generation_export.generation_quality(CausalLM(TINY), float_session, quantized, [[1]], 2,
                                                   held_out)
    rows = np.array([[1, 2, 3, 4], [2, 3, 0, 0]])
    logits = {name: np.stack([np.stack([session._logits(t) for t in row]) for row in rows])
              for name, session in (("float", float_session), ("quantized", quantized))}
    loss_float, tokens = _cross_entropy(logits["float"], rows, 0)
    loss_quantized, _ = _cross_entropy(logits["quantized"], rows, 0)
    assert quality["rows"] == 2 and quality["tokens"] == tokens == 4
    assert quality["loss_float"] == pytest.approx(loss_float, rel=1e-12)
    assert quality["loss_quantized"] == pytest.approx(loss_quantized, rel=1e-12)
    assert quality["loss_increase"] == pytest.approx(loss_quantized / loss_float - 1, rel=1e-12)
    # Argmax agreement over the real positions (6 of them): only token 3's row differs.
    assert quality["agreement"] == pytest.approx(4 / 6)
    assert quality["max_abs_diff"] == 2.0
    assert {"prompts", "greedy_tokens", "same_greedy_tokens", "generation_agreement"} <= set(quality)


def test_held_out_rows_shorter_than_the_prefill_are_padded():
    session = _Scripted(prompt_length=4, cache_length=12)
    quality = generation_export.generation_quality(CausalLM(TINY), session, session, [[1]], 1,
                                           np.array([[5, 6], [7, 8]]))
    assert quality["rows"] == 2 and quality["tokens"] == 2
    assert quality["agreement"] == 1.0 and quality["max_abs_diff"] == 0.0
    prefills = [feeds["token_ids"].tolist() for signature, feeds in session.calls if signature == "prefill"]
    assert prefills[-2:] == [[[5, 6, 0, 0]], [[7, 8, 0, 0]]]


# --- the files themselves ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_file(model):
    return generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="cpu")


def test_the_cpu_file_has_the_documented_signatures(model, cpu_file):
    interpreter = tf.lite.Interpreter(model_content=cpu_file)
    signatures = interpreter.get_signature_list()
    assert sorted(signatures) == ["decode", "prefill"]
    assert signatures["prefill"]["inputs"] == ["token_ids"]
    assert sorted(signatures["decode"]["inputs"]) == ["past_key_0", "past_key_1", "past_value_0",
                                                      "past_value_1", "position", "token_id"]
    for key in signatures:
        assert sorted(signatures[key]["outputs"]) == ["logits", "present_key_0", "present_key_1",
                                                      "present_value_0", "present_value_1"]
    session = runners.TfliteSession(cpu_file)
    assert (session.prompt_length, session.cache_length, session.vocab_size) == (4, 8, 20)
    prefill, decode = session.details["prefill"], session.details["decode"]
    assert prefill["token_ids"]["shape"].tolist() == [1, 4] and prefill["token_ids"]["dtype"] == np.int32
    assert decode["token_id"]["shape"].tolist() == [1, 1] and decode["position"]["shape"].tolist() == [1]
    assert decode["past_key_0"]["shape"].tolist() == [1, 8, 2, 4]
    assert decode["past_value_0"]["dtype"] == np.float32


def test_the_cpu_file_fills_its_cache_with_the_keras_tokens(model, cpu_file):
    session = runners.TfliteSession(cpu_file)
    _generates_like_keras(model, session, [6, 7, 8], 6)
    # The prefill writes the prompt's keys: a decode step from them equals the full pass.
    prefill = session.run("prefill", {"token_ids": np.array([[6, 7, 8, 0]], np.int32)})
    np.testing.assert_allclose(prefill["logits"][0, :3], np.asarray(model(np.array([[6, 7, 8]])))[0],
                               atol=1e-5, rtol=0)
    for name in ("present_key_0", "present_value_1"):  # slots 0 .. P-1 written, the rest still empty
        assert prefill[name][0, :4].any(axis=(1, 2)).all() and not prefill[name][0, 4:].any()


def test_parity_compares_every_generated_step_with_the_full_pass(model, cpu_file):
    session = runners.TfliteSession(cpu_file)
    same, parity = generation_export.check_generator_parity(model, session, [6, 7, 8], 6)
    assert same is True and 0 <= parity <= 1e-5

    class Nudged(runners.TfliteSession):
        def run(self, signature, feeds):
            outputs = dict(super().run(signature, feeds))
            if signature == "decode" and int(feeds["position"][0]) == 5:
                outputs["logits"] = outputs["logits"] + np.float32(0.25)  # the same argmax
            return outputs

    same, parity = generation_export.check_generator_parity(model, Nudged(cpu_file), [6, 7, 8], 6)
    assert same is True and parity == pytest.approx(0.25, abs=1e-5)

    class Wrong(runners.TfliteSession):
        def run(self, signature, feeds):
            outputs = dict(super().run(signature, feeds))
            if signature == "decode":
                logits = np.array(outputs["logits"])
                logits[0, 1] = 1e3  # every step picks id 1
                outputs["logits"] = logits
            return outputs

    same, parity = generation_export.check_generator_parity(model, Wrong(cpu_file), [6, 7, 8], 3)
    assert same is False and parity > 100


@plumbing_once
def test_parity_skips_the_model_s_own_pad_id_as_generate_does():
    # Padding is id 1; the head makes 1 the raw best pick at every step and 0 the runner-up.
    model = _model(pad_id=1)
    kernel, bias = model.head.get_weights()
    bias[1], bias[0] = 50.0, 25.0
    model.head.set_weights([kernel, bias])
    session = runners.TfliteSession(generator.to_tflite_generator(model, prompt_length=4, cache_length=8,
                                                                  target="cpu"))
    assert model.generate([6, 7, 8], 3).ids[0].tolist() == [0, 0, 0]
    assert generation_export.check_generator_parity(model, session, [6, 7, 8], 3)[0] is True
    assert runners.greedy_generate(session, [6, 7, 8], 3)[0] == [1, 1, 1]  # with padding id 0


@pytest.mark.parametrize("config", [
    {"position": "rope", "scaling": "yarn", "scaling_factor": 2.0, "original_length": 8},
    {"position": "alibi"},
    {"position": "learned", "norm_first": True},
    {"dropout": 0.5},
], ids=["rope-yarn", "alibi", "learned-pre-ln", "dropout"])
@plumbing_once
def test_every_position_kind_generates_the_keras_tokens(config):
    model = _model(**config)
    session = runners.TfliteSession(generator.to_tflite_generator(model, prompt_length=4, cache_length=8,
                                                                  target="cpu"))
    _generates_like_keras(model, session, [6, 7], 7)


@plumbing_once
def test_a_one_layer_model_s_file_reads_its_lengths_from_its_one_cache():
    one = _model(num_layers=1)
    session = runners.TfliteSession(generator.to_tflite_generator(one, prompt_length=4, cache_length=8,
                                                                  target="cpu"))
    assert (session.prompt_length, session.cache_length, session.vocab_size) == (4, 8, 20)
    _generates_like_keras(one, session, [6, 7, 8], 5)


@pytest.fixture(scope="module")
def gpu_files(model):
    return {embedding: generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="gpu",
                                                     embedding=embedding) for embedding in ("graph", "host")}


def test_gpu_files_take_int32_ids_or_host_rows(model, gpu_files):
    graph = runners.TfliteSession(gpu_files["graph"])
    assert graph.details["prefill"]["token_ids"]["dtype"] == np.int32
    assert graph.details["decode"]["position"]["dtype"] == np.int32
    with pytest.raises(ValueError) as error:
        runners.TfliteSession(gpu_files["host"])
    assert str(error.value) == ("This file takes looked-up `embeddings`: pass `table` "
                                "(model_spec.host_embedding_table(model)).")
    host = runners.TfliteSession(gpu_files["host"], table=model_spec.host_embedding_table(model))
    assert list(host.details["prefill"]) == ["embeddings"]
    assert host.details["prefill"]["embeddings"]["shape"].tolist() == [1, 4, 8]
    assert host.details["decode"]["embeddings"]["shape"].tolist() == [1, 1, 8]
    for session in (graph, host):
        decode = session.details["decode"]
        assert decode["position"]["shape"].tolist() == [1] and decode["position"]["dtype"] == np.int32
        assert decode["past_value_1"]["shape"].tolist() == [1, 8, 2, 4]
        assert decode["past_value_1"]["dtype"] == np.float32
    assert (host.prompt_length, host.cache_length, host.vocab_size) == (4, 8, 20)
    for session in (graph, host):
        _generates_like_keras(model, session, [6, 7, 8], 6)


def test_the_default_gpu_embedding_is_host(model, gpu_files):
    assert generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="gpu") \
        == gpu_files["host"]


def test_typed_feeds_cast_to_the_file_and_look_up_host_rows():
    details = {"token_id": {"dtype": np.float32}, "position": {"dtype": np.int32}}
    typed = runners.typed_feeds(details, {"token_id": [[3]], "position": [2], "ignored": 1})
    assert set(typed) == {"token_id", "position"}
    assert typed["token_id"].dtype == np.float32 and typed["token_id"].tolist() == [[3.0]]
    assert typed["position"].dtype == np.int32
    table = np.arange(12, dtype=np.float64).reshape(6, 2)
    for name in ("token_ids", "token_id"):
        typed = runners.typed_feeds({"embeddings": {"dtype": np.float32}}, {name: [[4, 1]]}, table)
        assert typed["embeddings"].dtype == np.float32
        assert typed["embeddings"].tolist() == [[[8.0, 9.0], [2.0, 3.0]]]


def test_the_gl_export_is_one_float32_file_per_signature(model):
    prefill, decode = generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="gl",
                                                    embedding="graph")
    assert list(tf.lite.Interpreter(model_content=prefill).get_signature_list()) == ["prefill"]
    assert list(tf.lite.Interpreter(model_content=decode).get_signature_list()) == ["decode"]
    session = runners.TfliteSession((prefill, decode))
    assert session.details["prefill"]["token_ids"]["dtype"] == np.float32
    assert session.details["decode"]["position"]["dtype"] == np.float32
    assert session.details["decode"]["position"]["shape"].tolist() == [1]
    assert session.details["decode"]["token_id"]["shape"].tolist() == [1, 1]
    _generates_like_keras(model, session, [6, 7, 8], 6)


def test_a_failed_conversion_is_a_value_error_naming_the_graphs(model, monkeypatch):
    class Failing:
        def __init__(self):
            self.target_spec = type("Spec", (), {})()

        def convert(self):
            raise RuntimeError("op FOO is not supported")

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_saved_model", lambda *args, **kwargs: Failing())
    with pytest.raises(ValueError) as error:
        generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="cpu")
    assert str(error.value) == ("TFLite conversion of the prefill/decode graphs failed: "
                                "op FOO is not supported")
    assert isinstance(error.value.__cause__, RuntimeError)


def test_the_converter_gets_both_signatures_builtin_ops_and_the_recipe(model, monkeypatch):
    seen = {}
    real = tf.lite.TFLiteConverter.from_saved_model

    def recording(folder, signature_keys=None, **kwargs):
        converter = real(folder, signature_keys=signature_keys, **kwargs)
        seen["keys"] = signature_keys
        seen["converter"] = converter
        return converter

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_saved_model", recording)
    flat = generator.to_tflite_generator(model, prompt_length=4, cache_length=8, quantize="float16",
                                         target="cpu")
    assert seen["keys"] == ["prefill", "decode"]
    assert seen["converter"].target_spec.supported_ops == [tf.lite.OpsSet.TFLITE_BUILTINS]
    assert seen["converter"].target_spec.supported_types == [tf.float16]
    assert np.float16 in tensor_dtypes(flat)
    with pytest.raises(ValueError, match="--quantize int4 is refused for target='cpu'"):
        generator.to_tflite_generator(model, prompt_length=4, cache_length=8, quantize="int4", target="cpu")


def test_a_tensorrt_target_is_sent_to_the_onnx_exporter(model):
    with pytest.raises(ValueError) as error:
        generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="tensorrt")
    assert str(error.value) == "target='tensorrt' exports ONNX: use to_onnx_generator(model, ...)."


# --- the checked export and its report ---------------------------------------------------------

@pytest.fixture(scope="module")
def float16_export(model):
    eval_rows = np.array([[6, 7, 8, 9, 10, 11], [12, 13, 0, 0, 0, 0]])
    return pipeline.export_generation(model, prompt_length=4, cache_length=8, target="gpu",
                                       check_prompt=[6, 7, 8, 9, 10], check_tokens=3, quantize="float16",
                                       eval_token_ids=eval_rows)


def test_the_checked_export_reports_tokens_parity_and_costs(model):
    result = pipeline.export_generation(model, prompt_length=4, cache_length=8, check_tokens=16, target="cpu")
    assert result.target == "cpu" and result.quantize is None and result.embedding == "graph"
    assert result.report["tokens_checked"] == 6  # the default prompt [5, 6, 7], 8 - 3 + 1 slots
    assert result.report["same_tokens"] is True and result.report["parity"] <= 1e-5
    meta = result.metadata
    assert meta["embedding"] == "graph" and meta["input_dtype"] == "int32" and meta["quantize"] is None
    assert meta["cache_bytes"] == 2 * 2 * 8 * 8 * 4 and meta["kind"] == "prefill_decode"
    assert (meta["prompt_length"], meta["cache_length"]) == (4, 8)  # what the kit feeds
    assert 0 < meta["decode_multiply_adds"] < meta["prefill_multiply_adds"]
    assert "quantization" not in meta and "quality" not in meta and result.host_table is None
    assert result.lines == [
        f"Multiply-adds: prefill of 4 tokens {meta['prefill_multiply_adds']:,}, one decode step "
        f"{meta['decode_multiply_adds']:,}",
        f"Greedy parity over 6 tokens: same tokens as CausalLM.generate, max abs logit diff "
        f"{result.report['parity']:.3g}"]
    assert result.description == "target cpu: prefill [1, 4], decode [1, 1], cache 8 slots = 1024 bytes"
    assert len(result.models) == 1
    assert set(result.report) == {"same_tokens", "parity", "tokens_checked", "verdicts"}
    assert result.report["verdicts"] == {}


@once_on_keras2("each stack's tensorrt pair is checked by tests/edge/edge_generate_onnx.py; this one is for "
                "`make mutation`, which runs on Keras 2")
def test_the_checked_tensorrt_export_is_the_onnx_pair_measured_against_float32(model):
    """`tensorrt`: the prefill and decode ONNX models, each with its cost, checked token for token
    on onnxruntime, and a float16 pair measured against a float32 pair of the same target."""
    eval_rows = np.array([[6, 7, 8, 9, 10, 11], [12, 13, 0, 0, 0, 0]])
    result = pipeline.export_generation(model, prompt_length=4, cache_length=8, target="tensorrt",
                                        check_prompt=[6, 7, 8, 9, 10], check_tokens=3, quantize="float16",
                                        eval_token_ids=eval_rows)
    assert result.target == "tensorrt" and result.quantize == "float16" and len(result.models) == 2
    for proto in result.models:  # the float16 pair (float16 weights), not the float32 reference
        weights = onnx.load_from_string(proto).graph.initializer
        assert onnx.TensorProto.FLOAT16 in {weight.data_type for weight in weights}
    assert result.report["same_tokens"] is True and result.report["parity"] < 1e-2
    meta = result.metadata
    assert 0 < meta["decode_multiply_adds"] < meta["prefill_multiply_adds"]
    quality = result.report["quality"]
    assert meta["quality"] == quality and quality["prompts"] == 3 and quality["rows"] == 2
    assert quality["greedy_tokens"] == 3 and 0.0 <= quality["generation_agreement"] <= 1.0
    assert quality["loss_increase"] != 0.0  # against float32's logits, not the float16 pair's own
    assert result.description.endswith(", float16 weights")


def test_a_file_whose_tokens_differ_says_so(model, monkeypatch):
    monkeypatch.setattr(generation_export, "check_generator_parity", lambda *args: (False, 0.125))
    result = pipeline.export_generation(model, prompt_length=4, cache_length=8, check_tokens=2, target="cpu")
    assert result.report["same_tokens"] is False and result.report["parity"] == 0.125
    assert result.lines[1] == ("Greedy parity over 2 tokens: TOKENS DIFFER from CausalLM.generate, max abs "
                               "logit diff 0.125")
    assert result.failures()[0].startswith("FAILED: the file does not generate what the model generates")


def test_the_checked_gl_export_is_a_pair_with_a_cost_for_each_file(model):
    result = pipeline.export_generation(model, prompt_length=4, cache_length=8, target="gl", check_tokens=2)
    assert (result.target, result.quantize, result.embedding) == ("gl", None, "host")
    assert len(result.models) == 2 and result.host_table is not None
    meta = result.metadata
    assert meta["input_dtype"] == "float32" and meta["embedding"] == "host"
    # The decode file's cost is a decode step's: less than the 4-token prefill's.
    assert 0 < meta["decode_multiply_adds"] < meta["prefill_multiply_adds"]
    np.testing.assert_array_equal(result.host_table, model_spec.host_embedding_table(model))
    assert result.report["same_tokens"] and result.report["tokens_checked"] == 2


@plumbing_once
def test_check_tokens_is_capped_by_the_cache_and_the_model(model):
    checked = generation_export.check_generation(model, prompt_length=4, cache_length=8, check_prompt=[6],
                                         check_tokens=2, target="cpu")
    assert checked["tokens_checked"] == 2
    checked = generation_export.check_generation(model, prompt_length=4, cache_length=8, check_prompt=[6, 7],
                                         check_tokens=0, target="cpu")
    assert checked["tokens_checked"] == 1
    checked = generation_export.check_generation(model, prompt_length=4, cache_length=8,
                                         check_prompt=[6, 7, 8, 9, 10, 11], check_tokens=20, target="cpu")
    assert checked["tokens_checked"] == 5  # the prompt cut to 4: 8 - 4 + 1
    assert checked["quality"] is None and checked["recipe"] is None
    # A cache as long as the model: the last slot's token would need position max_length.
    checked = generation_export.check_generation(model, prompt_length=4, cache_length=16, check_prompt=[6],
                                         check_tokens=40, target="cpu")
    assert checked["tokens_checked"] == 15 and checked["same_tokens"]


@plumbing_once
def test_the_default_check_prompt_is_clipped_to_the_vocabulary():
    small = _model(vocab_size=7)
    checked = generation_export.check_generation(small, prompt_length=4, cache_length=8, check_tokens=1,
                                                 target="cpu")
    # The prompt [5, 6, 6] fills 3 slots: the tokens are the file's after it.
    same, _ = generation_export.check_generator_parity(small, runners.TfliteSession(checked["models"][0]),
                                               [5, 6, 6], 1)
    assert same and checked["same_tokens"]


def test_a_float16_export_reports_its_quality_against_float32(model, float16_export):
    result = float16_export
    assert result.target == "gpu" and result.quantize == "float16" and result.embedding == "host"
    assert result.metadata["quantize"] == "float16" and result.metadata["input_dtype"] == "int32"
    assert result.metadata["quantization"] == quantization.recipe_for("gpu", "float16",
                                                                      "prefill_decode").describe()
    quality = result.report["quality"]
    assert result.metadata["quality"] == quality
    assert quality["prompts"] == 3  # the check prompt cut to 4, then the two held-out rows
    assert quality["greedy_tokens"] == 3 and quality["rows"] == 2 and quality["tokens"] == 4
    assert result.report["max_loss_increase"] == 0.01
    recipe = quantization.recipe_for("gpu", "float16", "prefill_decode")
    assert result.lines[0] == f"Quantized by {recipe.tool}: {recipe.weights}"
    assert result.lines[-1] == quality_module.format_generation_quality(quality, 0.01)
    assert result.lines[-1].startswith("Greedy generation on 3 prompts x 3 tokens: ")
    assert len(result.lines) == 4
    assert result.description.endswith(", float16 weights")
    assert np.float16 in tensor_dtypes(result.models[0])  # the file is the float16 one, not float32's
    stored = result.host_table
    assert stored is not None and np.asarray(stored).dtype == np.float16
    np.testing.assert_allclose(np.asarray(stored, np.float32), model_spec.host_embedding_table(model),
                               atol=1e-3, rtol=1e-3)


@plumbing_once
def test_the_quantized_and_the_float32_file_run_on_the_interpreter_the_recipe_needs(model, monkeypatch):
    opened = []

    class Recording(tf.lite.Interpreter):
        def __init__(self, model_content):
            opened.append(model_content)
            super().__init__(model_content=model_content)

    @contextlib.contextmanager
    def recording_interpreter(recipe, litert_python=None):
        assert recipe == quantization.recipe_for("gpu", "float16", "prefill_decode")
        yield Recording

    monkeypatch.setattr(generation_export, "interpreter_for", recording_interpreter)
    checked = generation_export.check_generation(model, prompt_length=4, cache_length=8, target="gpu",
                                         embedding="graph", quantize="float16", check_tokens=2)
    float32 = generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="gpu",
                                            embedding="graph")
    assert opened == [checked["models"][0], float32]


@plumbing_once
def test_the_quality_check_prompts_are_the_check_prompt_and_the_rows_real_tokens(monkeypatch):
    seen = []
    real = generation_export.generation_quality

    def recording(model, float_session, session, prompts, tokens, eval_token_ids=None):
        seen.append(prompts)
        return real(model, float_session, session, prompts, tokens, eval_token_ids)

    monkeypatch.setattr(generation_export, "generation_quality", recording)
    rows = np.array([[6, 7, 8, 10, 11, 12], [12, 13, 9, 9, 9, 9], [9, 9, 9, 9, 9, 9]])
    generation_export.check_generation(_model(pad_id=9), prompt_length=4, cache_length=8, quantize="float16",
                               check_prompt=[2, 3], check_tokens=2, eval_token_ids=rows, target="cpu")
    assert seen == [[[2, 3], [6, 7, 8, 10], [12, 13]]]  # padding (9) cut, an all-padding row left out


def test_a_negative_loss_bound_is_refused_before_any_export(model):
    for bad in (-0.5, float("nan")):
        with pytest.raises(ValueError) as error:
            pipeline.export_generation(model, prompt_length=4, cache_length=8, max_loss_increase=bad,
                                       target="cpu")
        assert str(error.value) == f"`max_loss_increase` must be >= 0, got max_loss_increase={bad!r}."
    result = pipeline.export_generation(model, prompt_length=4, cache_length=8, check_tokens=1,
                                         max_loss_increase=0, target="cpu")
    assert result.failures() == []


def test_export_generator_writes_the_files_and_returns_the_summary(model, tmp_path):
    out = str(tmp_path / "gen.tflite")
    summary = pipeline.export_generator(model, out, prompt_length=4, cache_length=8, check_tokens=2,
                                        target="cpu")
    result = summary["result"]
    assert summary["files"] == result.model_paths(out) == [out]
    assert summary["bytes"] == len(result.models[0]) == os.path.getsize(out)
    assert summary["same_tokens"] is True and summary["parity"] == result.parity
    assert summary["tokens_checked"] == 2 and summary["metadata"] == result.metadata
    with open(out + ".json") as f:
        assert json.load(f)["cache_length"] == 8


@plumbing_once
def test_export_options_reach_the_check(model):
    long = _model(max_length=24)
    result = pipeline.export_generation(long, prompt_length=4, cache_length=20, target="cpu")
    assert result.report["tokens_checked"] == 16  # the default check_tokens, under 20 - 3 + 1
    assert generation_export.check_generation(long, prompt_length=4, cache_length=20,
                                              target="cpu")["tokens_checked"] == 16
    result = pipeline.export_generation(model, prompt_length=4, cache_length=8, check_prompt=[9],
                                        target="cpu")
    assert result.report["tokens_checked"] == 8  # one prompt token: all 8 slots
    result = pipeline.export_generation(model, prompt_length=4, cache_length=8, target="gpu",
                                         embedding="graph", check_tokens=1)
    assert result.embedding == "graph" and result.host_table is None and len(result.models) == 1


@plumbing_once
def test_the_litert_python_given_is_the_one_used(no_litert_python_variables, model, tmp_path, monkeypatch):
    # As on Keras 2's stack: no ai-edge-litert in this Python, so the check runs in the LiteRT Python.
    monkeypatch.setattr(quantization, "_litert_in_process", lambda: False)
    marker = tmp_path / "ran"
    python = executable(tmp_path / "python", f"#!/bin/sh\ntouch {marker}\nexit 3\n")
    # gpu int8 is converted by TensorFlow (this model's weights are below the converter's
    # 1024-element bound, so stay float32); only its check needs the LiteRT Python.
    flat = generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="gpu",
                                         embedding="graph", quantize="int8", litert_python=python)
    assert tf.lite.Interpreter(model_content=flat).get_signature_list() and not marker.exists()
    with pytest.raises(RuntimeError, match=r"^the LiteRT interpreter server exited \(status 3\)\.$"):
        pipeline.export_generation(model, prompt_length=4, cache_length=8, target="gpu", quantize="int8",
                                    litert_python=python)
    assert marker.exists()
    with pytest.raises(ValueError, match="--quantize int8 on target='gpu' is checked by ai-edge-litert's "):
        pipeline.export_generation(model, prompt_length=4, cache_length=8, target="gpu", quantize="int8")


@plumbing_once
def test_the_check_runs_the_default_prompt_cut_to_the_prefill(monkeypatch):
    prompts = []
    real = generation_export.check_generator_parity

    def recording(model, session, prompt, tokens):
        prompts.append(list(prompt))
        return real(model, session, prompt, tokens)

    monkeypatch.setattr(generation_export, "check_generator_parity", recording)
    for vocab, prompt_length in ((20, 4), (7, 4), (20, 2)):
        generation_export.check_generation(_model(vocab_size=vocab), prompt_length=prompt_length,
                                           cache_length=8, check_tokens=1, target="cpu")
    assert prompts == [[5, 6, 7], [5, 6, 6], [5, 6]]


def test_the_check_refuses_what_a_prefill_decode_export_refuses(model):
    # int4 on gpu: a window export's recipe (LiteRT Quantizer), refused for prefill/decode graphs.
    with pytest.raises(ValueError, match="--quantize int4 is refused for target='gpu': "):
        generation_export.check_generation(model, prompt_length=4, cache_length=8, target="gpu",
                                           quantize="int4")


def test_a_gl_pair_is_quantized_file_by_file(model):
    for content in generator.to_tflite_generator(model, prompt_length=4, cache_length=8, target="gl",
                                                 quantize="float16"):
        assert np.float16 in tensor_dtypes(content)


def test_signatures_with_a_litert_quantizer_recipe_go_to_the_litert_python(no_litert_python_variables,
                                                                           tmp_path):
    # The .litertlm export converts its signatures here with LiteRT Quantizer's int4 recipe.
    double = tf.function(lambda x: {"y": x * 2.0},
                         input_signature=[tf.TensorSpec([1, 2], tf.float32, name="x")])
    signatures = {"prefill": double.get_concrete_function()}
    flat = generator.convert_signatures(signatures)
    runner = tf.lite.Interpreter(model_content=flat).get_signature_runner("prefill")
    assert runner(x=np.array([[1.5, -2.0]], np.float32))["y"].tolist() == [[3.0, -4.0]]
    recipe = quantization.recipes_of("cpu", "window")["int4"]
    with pytest.raises(RuntimeError) as error:
        generator.convert_signatures(signatures, recipe, failing_litert_python(tmp_path))
    assert FAILED_QUANTIZE in str(error.value)
