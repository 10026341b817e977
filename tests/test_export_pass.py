"""The one export pass (`pipeline.export`): every kind through one function, one default target.

What the pass adds to every kind's build is checked with stand-in builds (no conversion); a real
window export checks that the wrapper and the pass give the same file.
"""

import inspect

import numpy as np
import pytest

from keras_posenc import export
from keras_posenc.backend import keras
from keras_posenc.export import kinds, pipeline, quantization, targets
from keras_posenc.export.result import Built, ExportResult
from keras_posenc.layers import TokenAndPositionEmbedding


def _stand_in_build(recorded, *, recipe=None, quality=None, notes=()):
    def build(model, *, target, precision, litert_python=None, **options):
        recorded.append(dict(model=model, target=target, precision=precision, litert_python=litert_python,
                             **options))
        return Built("cpu", precision, "graph", (b"model",), {"parity": 0.0, "verdicts": {}}, ["own line"],
                     {"kind": "window", "quantize": precision}, "held", kind=kinds.WINDOW, recipe=recipe,
                     quality=quality, format_quality=lambda q, limit: f"quality {q} under {limit}",
                     quantized_note="; noted", notes=notes)

    return build


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setitem(pipeline._BUILDS, kinds.WINDOW, _stand_in_build(calls))
    return calls


def test_every_kind_has_one_build_in_the_pass():
    assert set(pipeline._BUILDS) == set(kinds.KINDS.values())


@pytest.mark.parametrize("wrapper, kind, arguments", [
    (pipeline.export_and_check, kinds.WINDOW, dict(sequence_length=6)),
    (pipeline.export_generation, kinds.PREFILL_DECODE, dict(prompt_length=4, cache_length=8)),
    (pipeline.export_litertlm, kinds.LITERTLM, dict(sp_model=b"spm", prompt_length=4, cache_length=8)),
    (pipeline.export_genai, kinds.GENAI, dict(sp_model=b"spm", prompt_length=4, cache_length=8)),
    (pipeline.export_translation, kinds.TRANSLATE, dict(source_length=6, cache_length=8)),
])
def test_each_wrapper_is_the_pass_of_its_kind(monkeypatch, wrapper, kind, arguments):
    calls = []
    monkeypatch.setattr(pipeline, "export", lambda model, k, **options: calls.append((model, k, options)))
    positional = [arguments.pop("sp_model")] if "sp_model" in arguments else []
    wrapper("model", *positional, **arguments)
    [(model, got_kind, options)] = calls
    assert model == "model" and got_kind is kind
    assert {name: options[name] for name in arguments} == arguments
    if kind.takes_target:
        assert options["target"] == targets.DEFAULT_TARGET
    else:
        assert "target" not in options


def test_the_pass_gives_the_build_its_options_and_the_default_target(recorded):
    result = export.export("the model", "window", sequence_length=6, quantize="dynamic_int8",
                           litert_python="py")
    assert recorded == [dict(model="the model", target="gpu", precision="int8", litert_python="py",
                             sequence_length=6)]
    assert isinstance(result, ExportResult) and not isinstance(result, Built)
    assert result.kind is kinds.WINDOW and result.quantize == "int8"
    export.export("the model", kinds.WINDOW, target="gl")
    assert recorded[-1]["target"] == "gl" and recorded[-1]["precision"] is None


def test_the_pass_adds_the_quantizer_s_line_the_quality_and_its_limit_once(monkeypatch):
    recipe = quantization.recipe_for("cpu", "float16")
    quality = {"loss_increase": 0.001}
    monkeypatch.setitem(pipeline._BUILDS, kinds.WINDOW,
                        _stand_in_build([], recipe=recipe, quality=quality, notes=("last",)))
    result = export.export(None, target="cpu", quantize="float16", max_loss_increase=0.02)
    assert result.lines == [f"Quantized by {recipe.tool}: {recipe.weights}; noted", "own line",
                            "quality {'loss_increase': 0.001} under 0.02", "last"]
    assert result.report == {"parity": 0.0, "verdicts": {}, "quality": quality, "max_loss_increase": 0.02}
    assert list(result.metadata) == ["kind", "quantize", "quantization", "quality"]
    assert result.metadata["quantization"] == recipe.describe() and result.metadata["quality"] is quality
    # a quality that was not measured: reported as such, not written into FILE.json
    monkeypatch.setitem(pipeline._BUILDS, kinds.WINDOW, _stand_in_build([], recipe=recipe))
    result = export.export(None, target="cpu", quantize="float16")
    assert result.report["quality"] is None and "quality" not in result.metadata
    assert result.lines[-1] == "quality None under 0.01"


def test_float32_has_no_quantization_part(recorded):
    result = export.export(None, target="cpu")
    assert result.lines == ["own line"] and "quality" not in result.report
    assert result.metadata == {"kind": "window", "quantize": None}


@pytest.mark.parametrize("call, message", [
    (lambda: export.export(None, "onnx"), r"`kind` must be one of \('window', 'prefill_decode', 'litertlm', "
                                          r"'genai', 'translate'\), got kind='onnx'\."),
    (lambda: export.export(None, "genai", target="cpu"),
     r"A genai export runs on its own runtime and takes no target, got target='cpu'\."),
    (lambda: export.export(None, max_loss_increase=-0.01),
     r"`max_loss_increase` must be >= 0, got max_loss_increase=-0.01\."),
    (lambda: export.export(None, max_loss_increase=float("nan")),
     r"`max_loss_increase` must be >= 0, got max_loss_increase=nan\."),
    (lambda: export.export(None, quantize="int2"), r"`quantize` must be one of"),
])
def test_bad_options_are_refused_before_any_build(recorded, call, message):
    with pytest.raises(ValueError, match=message):
        call()
    assert recorded == []


def test_every_function_of_the_wing_with_a_target_defaults_to_the_one_default_target():
    found = {}
    for name in dir(export):
        module = getattr(export, name)
        if not inspect.ismodule(module) or not module.__name__.startswith("keras_posenc.export."):
            continue
        for function_name, function in vars(module).items():
            if function_name.startswith("_") or not inspect.isfunction(function):
                continue
            parameter = inspect.signature(function).parameters.get("target")
            if parameter is not None and parameter.default is not inspect.Parameter.empty:
                found[f"{module.__name__}.{function_name}"] = parameter.default
    assert found.pop("keras_posenc.export.pipeline.export") is None  # the kind decides: genai takes none
    assert len(found) >= 10 and set(found.values()) == {targets.DEFAULT_TARGET}, found
    assert targets.DEFAULT_TARGET == "gpu"


def test_the_pass_and_its_window_wrapper_write_the_same_file():
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, TokenAndPositionEmbedding(50, 8, max_length=16)(ids))
    batch = np.array([[3, 4, 5, 6, 0, 0]], np.int32)
    through_pass = export.export(model, "window", target="cpu", sequence_length=6, token_ids=batch)
    wrapped = export.export_and_check(model, sequence_length=6, target="cpu", token_ids=batch)
    assert through_pass.models == wrapped.models and through_pass.lines == wrapped.lines
    assert through_pass.metadata == wrapped.metadata and through_pass.failures() == []
