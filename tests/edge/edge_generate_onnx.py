"""The tensorrt prefill/decode pair on a two-layer model, run by onnxruntime: inputs, opset, recipes.

tests/edge/edge_generate.py runs a larger pair for 32 tokens through the kit; these tests pin what
`generator.to_onnx_generator` and `runners.OnnxSession` give on a model small enough to convert in
a few seconds.
"""

import numpy as np
import onnx
import pytest

from keras_posenc.backend import keras
from keras_posenc.export import generator, pipeline, quantization, runners
from keras_posenc.export.conversion import ONNX_OPSET
from keras_posenc.models import CausalLM

TINY = {"num_layers": 2, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 20, "max_length": 16,
        "dropout": 0.0}
RECIPES = quantization.recipes_of("tensorrt", "prefill_decode")


def _model(**config):
    keras.utils.set_random_seed(11)
    model = CausalLM({**TINY, **config})
    model.build_on_dummy()
    return model


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture(scope="module")
def pair(model):
    return generator.to_onnx_generator(model, prompt_length=4, cache_length=8)


OUTPUTS = ["logits", "present_key_0", "present_key_1", "present_value_0", "present_value_1"]


def _opsets(proto):
    return [o.version for o in onnx.load_from_string(proto).opset_import if o.domain in ("", "ai.onnx")]


def _inputs(proto):
    graph = onnx.load_from_string(proto).graph
    return {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}


def test_the_pair_has_the_tflite_signatures_names_and_static_shapes(pair):
    prefill, decode = pair
    assert _inputs(prefill) == {"token_ids": [1, 4]}
    cache = [1, 8, 2, 4]
    assert _inputs(decode) == {"token_id": [1, 1], "position": [1], "past_key_0": cache,
                               "past_value_0": cache, "past_key_1": cache, "past_value_1": cache}
    for proto in pair:
        outputs = sorted(o.name for o in onnx.load_from_string(proto).graph.output)
        assert outputs == OUTPUTS and _opsets(proto) == [ONNX_OPSET]
    session = runners.OnnxSession(*pair)
    assert (session.prompt_length, session.cache_length, session.vocab_size) == (4, 8, 20)


def test_the_pair_fills_its_cache_with_the_keras_tokens(model, pair):
    session = runners.OnnxSession(*pair)
    ids, logits = runners.greedy_generate(session, [6, 7, 8], 6)
    assert ids == model.generate([6, 7, 8], 6).ids[0].tolist()
    full = np.asarray(model(np.array([[6, 7, 8] + ids[:-1]], np.int32)))[0, 2:]
    np.testing.assert_allclose(logits, full, atol=1e-5, rtol=0)
    outputs = session.run("decode", {"token_id": np.array([[ids[0]]], np.int32),
                                     "position": np.array([3], np.int32),
                                     **runners.past(session.run("prefill", {
                                         "token_ids": np.array([[6, 7, 8, 0]], np.int32)}))})
    assert sorted(outputs) == OUTPUTS
    assert outputs["logits"].shape == (1, 20) and outputs["present_key_0"].shape == (1, 8, 2, 4)


def test_a_one_layer_pair_reads_its_lengths_from_its_one_cache():
    one = _model(num_layers=1)
    session = runners.OnnxSession(*generator.to_onnx_generator(one, prompt_length=4, cache_length=8))
    assert (session.prompt_length, session.cache_length, session.vocab_size) == (4, 8, 20)
    ids, _ = runners.greedy_generate(session, [6, 7, 8], 5)
    assert ids == one.generate([6, 7, 8], 5).ids[0].tolist()


def test_the_opset_is_checked_and_passed_to_tf2onnx(model):
    with pytest.raises(ValueError, match=rf"^`opset` must be >= {ONNX_OPSET}, got opset={ONNX_OPSET - 1}\.$"):
        generator.to_onnx_generator(model, prompt_length=4, cache_length=8, opset=ONNX_OPSET - 1)
    pair = generator.to_onnx_generator(model, prompt_length=2, cache_length=4, opset=ONNX_OPSET + 1)
    assert [_opsets(proto) for proto in pair] == [[ONNX_OPSET + 1]] * 2
    with pytest.raises(ValueError, match="`prompt_length`=5 exceeds `cache_length`=4"):
        generator.to_onnx_generator(model, prompt_length=5, cache_length=4)


def test_a_float16_pair_holds_float16_weights_and_keeps_float32_inputs(model, pair):
    half = generator.to_onnx_generator(model, prompt_length=4, cache_length=8, recipe=RECIPES["float16"])
    for proto, float32 in zip(half, pair):
        graph = onnx.load_from_string(proto).graph
        assert {i.data_type for i in graph.initializer} >= {onnx.TensorProto.FLOAT16}
        assert _inputs(proto) == _inputs(float32)
    ids, _ = runners.greedy_generate(runners.OnnxSession(*half), [6, 7, 8], 3)
    assert len(ids) == 3


def test_int8_calibrates_on_the_float32_pairs_greedy_runs(model, monkeypatch):
    seen = []
    real = quantization.quantize_onnx

    def recording(proto, recipe, calibration=()):
        seen.append((recipe, list(calibration)))
        return real(proto, recipe, calibration)

    monkeypatch.setattr(generator, "quantize_onnx", recording)
    pair = generator.to_onnx_generator(model, prompt_length=4, cache_length=8, recipe=RECIPES["int8"])
    prompts = generator.calibration_prompts(model, 4)
    assert [recipe for recipe, _ in seen] == [RECIPES["int8"]] * 2
    prefill_feeds, decode_feeds = (calls for _, calls in seen)
    assert [feeds["token_ids"].tolist() for feeds in prefill_feeds] == [[prompt] for prompt in prompts]
    # Each 4-token prompt fills the 8 slots: 5 tokens, 4 decode steps at positions 4 .. 7.
    assert [int(feeds["position"][0]) for feeds in decode_feeds] == [4, 5, 6, 7] * 4
    assert {node.op_type for node in onnx.load_from_string(pair[1]).graph.node} >= {"QuantizeLinear",
                                                                                    "DequantizeLinear"}
    # float16 quantizes without calibration.
    seen.clear()
    generator.to_onnx_generator(model, prompt_length=2, cache_length=4, recipe=RECIPES["float16"])
    assert [calls for _, calls in seen] == [[], []]


def test_the_checked_tensorrt_export_reports_both_files(model):
    result = pipeline.export_generation(model, prompt_length=4, cache_length=8, target="tensorrt",
                                         check_tokens=3, quantize="float16")
    assert (result.target, result.quantize, result.embedding) == ("tensorrt", "float16", "graph")
    assert len(result.models) == 2 and result.host_table is None
    for proto in result.models:  # the checked pair is the float16 one
        initializers = onnx.load_from_string(proto).graph.initializer
        assert onnx.TensorProto.FLOAT16 in {initializer.data_type for initializer in initializers}
    assert result.report["same_tokens"] and result.report["tokens_checked"] == 3
    meta = result.metadata
    assert meta["input_dtype"] == "int32" and meta["accelerators"] == ["gpu", "cpu"]
    assert 0 < meta["decode_multiply_adds"] < meta["prefill_multiply_adds"]
    quality = result.report["quality"]
    assert quality["prompts"] == 1 and quality["greedy_tokens"] == 3
    assert quality["generation_agreement"] == 1.0 and quality["same_greedy_tokens"] is True
