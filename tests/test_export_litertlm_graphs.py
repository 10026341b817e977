"""The `.litertlm` model's two signatures, fed as LiteRT-LM's engine feeds them, without a conversion.

tests/test_export_litertlm.py converts every position kind and runs the files (seconds each); here
the same `prefill`/`decode` functions run in TensorFlow directly, fed by a small re-statement of
the engine's contract (chunks of `P` right-padded with 0, `input_pos` of the padding 0, the last
id of a prefill held back and fed first by the next call), and each decode step's logits are
checked against the Keras model's full pass. One small CPU file covers `EngineFeeder` and
`engine_greedy`, the interpreter-side feeder of the tests and the CLI's probes.
"""

import numpy as np
import pytest
import tensorflow as tf
from litert_stand_in import FAILED_QUANTIZE, failing_litert_python
from tflite_files import tensor_dtypes
from tiny_lm import perturbed_causal_lm

from keras_posenc.export import litertlm
from keras_posenc.export.model_spec import ModelSpec, rebuild
from keras_posenc.export.targets import TARGETS

BASE = {"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 24,
        "dropout": 0.0}
PROMPT_LENGTH, CACHE = 4, 16
CASES = {
    "cpu-sinusoidal": ("cpu", {}),
    "cpu-rope-yarn": ("cpu", {"position": "rope", "scaling": "yarn", "scaling_factor": 2.0,
                              "original_length": 8}),
    "cpu-alibi-pre-ln": ("cpu", {"position": "alibi", "norm_first": True}),
    "gpu-sinusoidal-factorized": ("gpu", {"table": "factorized"}),
    "gpu-rope": ("gpu", {"position": "rope"}),
    "gpu-learned-pre-ln": ("gpu", {"position": "learned", "norm_first": True}),
    "gpu-alibi": ("gpu", {"position": "alibi", "num_heads": 4}),
}


def _model(**config):
    return perturbed_causal_lm({**BASE, **config})


def _full_pass(model, ids):
    return np.asarray(model(np.asarray([ids], np.int32), training=False), np.float64)[0]


class _Engine:
    """The engine's side of the contract over the two traced functions."""

    def __init__(self, model, target):
        clone = rebuild(model, ModelSpec.of(model, CACHE, 1))
        kind = litertlm._ShaderEngineGraphs if TARGETS[target].shader_generation else litertlm.EngineGraphs
        self.graphs = kind(clone, PROMPT_LENGTH, CACHE, TARGETS[target])
        self.prefill_fn, self.decode_fn = self.graphs.prefill_function(), self.graphs.decode_function()
        self.cache = [tf.zeros(self.graphs.cache_spec)] * len(self.graphs.cache_names)
        self.step, self.held = 0, None

    def _caches(self, outputs):
        return [outputs[name] for name in self.graphs.cache_names]

    def prefill(self, ids):
        ids = ([] if self.held is None else [self.held]) + list(ids)
        self.held, feed = ids[-1], ids[:-1]
        for start in range(0, len(feed), PROMPT_LENGTH):
            chunk = feed[start:start + PROMPT_LENGTH]
            pad = PROMPT_LENGTH - len(chunk)
            tokens = tf.constant([chunk + [0] * pad], tf.int32)
            positions = tf.constant(list(range(self.step, self.step + len(chunk))) + [0] * pad, tf.int32)
            self.cache = self._caches(self.prefill_fn(tokens, positions, *self.cache))
            self.step += len(chunk)

    def decode(self, feed_back):
        outputs = self.decode_fn(tf.constant([[self.held]], tf.int32), tf.constant([self.step], tf.int32),
                                 *self.cache)
        self.cache, self.step = self._caches(outputs), self.step + 1
        logits = np.asarray(outputs[litertlm.LOGITS], np.float64)
        assert logits.shape == (1, 1, BASE["vocab_size"])
        self.held = feed_back(logits[0, 0])
        return logits[0, 0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_chunked_prefill_a_second_turn_and_each_decode_step_equal_the_keras_full_pass(name):
    target, config = CASES[name]
    model = _model(**config)
    engine = _Engine(model, target)
    fed, steps = [], []

    def greedy(logits):  # the pad id is never generated (the bundle's suppress_tokens)
        return int(np.argmax(logits[1:])) + 1

    for turn in ([2, 9, 17, 5, 11, 30, 7], [3, 8]):  # 6 ids fed: a chunk of 4 and one of 2 (padded)
        fed += ([] if engine.held is None else [engine.held]) + turn[:-1]
        engine.prefill(turn)
        for _ in range(3):
            fed.append(engine.held)
            steps.append((len(fed) - 1, engine.decode(greedy)))
    full = _full_pass(model, fed)
    for position, logits in steps:
        np.testing.assert_allclose(logits, full[position], atol=2e-5, rtol=0, err_msg=f"position {position}")
    assert engine.step == len(fed) == 14


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_a_prefill_from_an_offset_writes_only_its_own_slots(target):
    model = _model()
    engine = _Engine(model, target)
    engine.prefill([2, 9, 17, 5, 11, 30])  # slots 0..4 written, the padding's 5..7 too (overwritten later)
    before = [np.asarray(buffer) for buffer in engine.cache]
    engine.prefill([4])  # the held 30 at slot 5, its padding at 6..8
    slot_axis = 2  # [1, heads, C, head_dim] on cpu, [1, 1, C, d_model] on gpu
    for old, new in zip(before, engine.cache):
        new = np.asarray(new)
        np.testing.assert_array_equal(np.take(new, range(5), slot_axis), np.take(old, range(5), slot_axis))
        assert not np.array_equal(np.take(new, [5], slot_axis), np.take(old, [5], slot_axis))
        assert not np.take(new, range(9, CACHE), slot_axis).any()


def test_the_cache_buffers_names_and_layouts():
    assert litertlm.kv_cache_names(2) == ["kv_cache_k_0", "kv_cache_v_0", "kv_cache_k_1", "kv_cache_v_1"]
    assert litertlm.kv_cache_names(0) == []
    model = _model()
    cpu, gpu = _Engine(model, "cpu").graphs, _Engine(model, "gpu").graphs
    assert cpu.cache_spec == [1, 2, CACHE, 8] and gpu.cache_spec == [1, 1, CACHE, 16]
    assert cpu.cache_names == gpu.cache_names == litertlm.kv_cache_names(2)


@pytest.mark.parametrize("target", ["gl", "tensorrt"])
def test_a_target_without_a_litertlm_backend_is_refused_naming_the_two_that_have_one(target):
    with pytest.raises(ValueError) as error:
        litertlm.check_litertlm(_model(), PROMPT_LENGTH, CACHE, target)
    assert str(error.value) == f"A .litertlm bundle supports target in ('gpu', 'cpu'), got target={target!r}."
    assert litertlm.check_litertlm(_model(), PROMPT_LENGTH, CACHE, "gpu") is TARGETS["gpu"]


# The interpreter-side feeder on one small CPU file ----------------------------------------------
@pytest.fixture(scope="module")
def converted():
    model = _model()
    return model, litertlm.to_litertlm_tflite(model, prompt_length=PROMPT_LENGTH, cache_length=CACHE,
                                              target="cpu")


def test_the_feeder_reads_its_lengths_and_starts_empty(converted):
    _, flat = converted
    feeder = litertlm.EngineFeeder(flat)
    assert (feeder.prompt_length, feeder.cache_length, feeder.step, feeder.held) == (PROMPT_LENGTH, CACHE, 0,
                                                                                     None)
    assert sorted(feeder.cache) == sorted(litertlm.kv_cache_names(2))
    assert all(buffer.shape == (1, 2, CACHE, 8) and not buffer.any() for buffer in feeder.cache.values())
    feeder.prefill([])
    assert (feeder.step, feeder.held) == (0, None)
    feeder.prefill([7])  # one id: held back, no position taken
    assert (feeder.step, feeder.held) == (0, 7)


def test_greedy_turns_equal_the_keras_continuation_of_the_whole_session(converted):
    model, flat = converted
    logits = []
    first, second = litertlm.engine_greedy(litertlm.EngineFeeder(flat), [[2, 9, 17, 5, 11, 30], [3, 8]], 3,
                                           logits=logits)
    assert first == model.generate([2, 9, 17, 5, 11, 30], 3).ids[0].tolist()
    session = [2, 9, 17, 5, 11, 30] + first + [3, 8]
    assert second == model.generate(session, 3).ids[0].tolist()
    full = _full_pass(model, session + second)
    assert [len(turn) for turn in logits] == [3, 3]
    for position, step in zip([5, 6, 7, 10, 11, 12], logits[0] + logits[1]):
        assert step[0] == -np.inf  # the pad id is never picked
        np.testing.assert_allclose(step[1:], full[position][1:], atol=2e-5, rtol=0)


def test_an_empty_turn_continues_the_session_as_if_there_were_none(converted):
    _, flat = converted
    with_empty, without = [], []
    litertlm.engine_greedy(litertlm.EngineFeeder(flat), [[2, 9, 17, 5, 11, 30], []], 3, logits=with_empty)
    litertlm.engine_greedy(litertlm.EngineFeeder(flat), [[2, 9, 17, 5, 11, 30]], 6, logits=without)
    np.testing.assert_array_equal(np.array(with_empty[1]), np.array(without[0][3:]))


def test_a_stop_id_ends_the_turn_and_forced_ids_are_fed_back(converted):
    model, flat = converted

    def first_new_pick(prompt):  # a pick after the first that was not picked before: the stop to test
        picks = model.generate(prompt, 4).ids[0].tolist()
        return picks, next((i for i in range(1, 4) if picks[i] not in picks[:i]), None)

    # The first prompt whose greedy picks change within four tokens (any draw of the weights has one).
    tried = ([2, 9, 17, 5, 11, 30], [7, 3, 21, 14], [25, 1, 12], [30, 29, 28, 27, 26])
    asked, (picks, first_new) = next((asked, found) for asked in tried
                                     if (found := first_new_pick(asked))[1] is not None)
    stopped = litertlm.engine_greedy(litertlm.EngineFeeder(flat), [asked], 4, stop_id=picks[first_new])
    assert stopped == [picks[:first_new + 1]]
    prompt = [2, 9, 17, 5, 11, 30]
    forced, logits = [6, 12, 3], []
    fed = litertlm.engine_greedy(litertlm.EngineFeeder(flat), [prompt], 9, forced=[forced], logits=logits)
    full = _full_pass(model, prompt + forced)
    expected = [int(np.argmax(full[position][1:])) + 1 for position in (5, 6, 7)]
    assert fed == [expected]  # three steps: one per forced id, whatever max_new_tokens says
    np.testing.assert_allclose(np.array(logits[0])[:, 1:], full[5:8, 1:], atol=2e-5, rtol=0)
    first_pick = expected[0]  # the forced ids come after it: the same first pick
    with_pad = litertlm.engine_greedy(litertlm.EngineFeeder(flat), [prompt], 2, pad_id=first_pick)
    assert with_pad[0][0] != first_pick


def test_the_feeder_refuses_what_does_not_fit_and_a_full_cache(converted):
    _, flat = converted
    feeder = litertlm.EngineFeeder(flat)
    with pytest.raises(ValueError) as error:
        feeder.prefill(list(range(1, CACHE + 2)))
    assert str(error.value) == f"{CACHE + 1} tokens do not fit in cache_length={CACHE}."
    assert (feeder.step, feeder.held) == (0, None)  # the refused prefill left the session as it was
    feeder.prefill(list(range(1, CACHE + 1)))  # exactly the cache: the last one held back
    assert feeder.step == CACHE - 1
    feeder.decode()
    with pytest.raises(ValueError) as error:
        feeder.decode()
    assert str(error.value) == f"the cache is full (cache_length={CACHE})."


# Quantized bundle models: the recipes of the "litertlm" kind -------------------------------------
def test_an_int8_cpu_model_has_int8_weights_and_fewer_bytes():
    model = _model(d_model=32, dff=64, vocab_size=64)  # kernels of 1024 values and more: quantized

    def convert(quantize):
        return litertlm.to_litertlm_tflite(model, prompt_length=PROMPT_LENGTH, cache_length=CACHE,
                                           quantize=quantize, target="cpu")

    flat, float32 = convert("int8"), convert(None)
    assert np.int8 in tensor_dtypes(flat) and len(flat) < 0.7 * len(float32)
    assert litertlm.EngineFeeder(flat).cache_length == CACHE


def test_the_gpu_bundle_model_refuses_int4_with_the_generation_reason():
    with pytest.raises(ValueError) as error:
        litertlm.to_litertlm_tflite(_model(), prompt_length=PROMPT_LENGTH, cache_length=CACHE, target="gpu",
                                    quantize="int4")
    assert str(error.value) == (
        "--quantize int4 is refused for target='gpu': LiteRT Quantizer's int4 weights break the shader "
        "prefill/decode graph's constant matrices (prefill logits of 1e7 on LiteRT 2.3): use --quantize "
        "int8.")


def test_the_given_litert_python_is_the_one_checked(no_litert_python_variables, tmp_path):
    missing = str(tmp_path / "python")
    with pytest.raises(ValueError) as error:
        litertlm.to_litertlm_tflite(_model(), prompt_length=PROMPT_LENGTH, cache_length=CACHE,
                                    quantize="int4", litert_python=missing, target="cpu")
    assert str(error.value).startswith(f"the LiteRT Python {missing!r} is not an executable file: ")


def test_the_gpu_target_converts_the_shader_graphs_with_their_cache_layout():
    model = _model()
    flat = litertlm.to_litertlm_tflite(model, prompt_length=2, cache_length=8, target="gpu")
    feeder = litertlm.EngineFeeder(flat)
    assert {buffer.shape for buffer in feeder.cache.values()} == {(1, 1, 8, BASE["d_model"])}
    assert litertlm.engine_greedy(feeder, [[2, 9, 17]], 4) == [model.generate([2, 9, 17], 4).ids[0].tolist()]


def test_the_given_litert_python_runs_the_int4_quantizer(no_litert_python_variables, tmp_path):
    """cpu int4 is LiteRT Quantizer's, run as `PYTHON litert_runtime.py quantize SPEC`: a stand-in
    Python that fails shows it is the one run, with its last log line in the error."""
    python = failing_litert_python(tmp_path)
    with pytest.raises(RuntimeError) as error:
        litertlm.to_litertlm_tflite(_model(), prompt_length=PROMPT_LENGTH, cache_length=CACHE,
                                    quantize="int4", litert_python=python, target="cpu")
    assert str(error.value) == FAILED_QUANTIZE
