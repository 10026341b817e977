"""The graphs of the tensorrt ONNX files: nothing left to fold, static output shapes, the contract's names.

Every ONNX file the export writes (the window file with the graph or the host token lookup, in
float32, float16 and int8, and the prefill/decode pair in the same precisions; sinusoidal and RoPE
positions, language ids) is read back: `polygraphy surgeon sanitize --fold-constants` (what
TensorRT users run first) must remove no node, no `Shape`/`Size` is left, and every output has
its contract name and a shape of static ints. `keras_posenc.export.onnx_graph` does the folding.
"""

import numpy as np
import pytest

from keras_posenc.backend import keras
from keras_posenc.export import contract, generator, onnx_graph, quantization, to_onnx
from keras_posenc.models import CausalLM

VOCAB, LENGTH, PROMPT, CACHE = 40, 12, 4, 12
SMALL = {"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": VOCAB, "max_length": 16,
         "dropout": 0.0}
MODELS = {"sinusoidal": {}, "rope": {"position": "rope"}, "languages": {"num_languages": 2}}
HEAD_DIM = SMALL["d_model"] // SMALL["num_heads"]
GENERATION_RECIPES = quantization.recipes_of("tensorrt", "prefill_decode")
# name: (model, to_onnx keywords)
WINDOW_FILES = {
    "sinusoidal": ("sinusoidal", {}),
    "sinusoidal-host": ("sinusoidal", {"embedding": "host"}),
    "sinusoidal-float16": ("sinusoidal", {"quantize": "float16"}),
    "sinusoidal-int8": ("sinusoidal", {"quantize": "int8"}),
    "rope": ("rope", {}),
    "languages": ("languages", {}),
}
# name: (model, precision)
GENERATION_FILES = {"sinusoidal": ("sinusoidal", None), "sinusoidal-float16": ("sinusoidal", "float16"),
                    "sinusoidal-int8": ("sinusoidal", "int8"), "rope": ("rope", None)}
SHAPE_ARITHMETIC = {"Shape", "Size"}


@pytest.fixture(scope="module")
def models():
    built = {}
    for seed, (name, config) in enumerate(MODELS.items()):
        keras.utils.set_random_seed(seed)
        built[name] = CausalLM({**SMALL, **config})
        built[name].build_on_dummy()
    return built


@pytest.fixture(scope="module")
def exported(edge, models, tmp_path_factory):
    """`{file name: (path, kind)}` of every file, written to a temporary folder."""
    folder = tmp_path_factory.mktemp("onnx_graphs")
    rows = np.random.default_rng(0).integers(1, VOCAB, (4, LENGTH)).astype(np.int32)
    files = {}
    for name, (model, options) in WINDOW_FILES.items():
        calibration = rows if options.get("quantize") == "int8" else None
        files[f"window-{name}"] = (to_onnx(models[model], sequence_length=LENGTH, calibration=calibration,
                                           **options), "window")
    for name, (model, precision) in GENERATION_FILES.items():
        recipe = GENERATION_RECIPES[precision] if precision else None
        pair = generator.to_onnx_generator(models[model], prompt_length=PROMPT, cache_length=CACHE,
                                           recipe=recipe)
        for signature, proto in zip(contract.SIGNATURES, pair):
            files[f"{signature}-{name}"] = (proto, signature)
    paths = {}
    for name, (proto, kind) in files.items():
        path = folder / f"{name}.onnx"
        path.write_bytes(proto)
        paths[name] = (str(path), kind)
    return paths


FILES = ([f"window-{name}" for name in WINDOW_FILES]
         + [f"{signature}-{name}" for name in GENERATION_FILES for signature in contract.SIGNATURES])


def _load(path):
    import onnx

    return onnx.load(path)


def _sanitized(path, out):
    """The model `polygraphy surgeon sanitize --fold-constants` writes for the file at `path`."""
    try:
        from polygraphy.tools import main
    except ImportError:
        pytest.fail("polygraphy is not in the edge cache's ONNX site: run tests/edge/runtime/bootstrap.sh")
    status = main(["surgeon", "sanitize", "--fold-constants", path, "-o", out, "--silent"])
    assert status == 0, f"polygraphy surgeon sanitize failed on {path}"
    return _load(out)


def _expected_outputs(kind):
    vocab = [VOCAB]
    cache = {contract.present_name(part, layer): [1, CACHE, SMALL["num_heads"], HEAD_DIM]
             for part in ("key", "value") for layer in range(SMALL["num_layers"])}
    logits = contract.TENSORS["logits"]
    if kind == "window":
        return {logits: [1, LENGTH] + vocab}
    if kind == "prefill":
        return {logits: [1, PROMPT] + vocab, **cache}
    return {logits: [1] + vocab, **cache}


@pytest.mark.parametrize("name", FILES)
def test_polygraphy_s_constant_folding_removes_no_node(exported, name, tmp_path):
    path, _ = exported[name]
    model = _load(path)
    sanitized = _sanitized(path, str(tmp_path / "sanitized.onnx"))
    assert len(sanitized.graph.node) == len(model.graph.node), name
    assert not SHAPE_ARITHMETIC & {node.op_type for node in model.graph.node}
    # Only the domains the nodes use (onnxruntime's optimizer declares its own).
    assert {entry.domain for entry in model.opset_import} <= {node.domain for node in model.graph.node} | {""}


@pytest.mark.parametrize("name", FILES)
def test_every_output_has_its_contract_name_and_static_shape(exported, name):
    path, kind = exported[name]
    model = _load(path)
    assert onnx_graph.output_shapes(model) == _expected_outputs(kind)
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        assert all(dim.HasField("dim_value") and not dim.dim_param for dim in dims)


def test_the_window_file_s_logits_are_read_by_name(exported, models):
    """onnxruntime gives the file's `logits` under their contract name, the Keras model's logits."""
    import onnxruntime

    path, _ = exported["window-sinusoidal"]
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(1).integers(1, VOCAB, (1, LENGTH)).astype(np.int32)
    (logits,) = session.run([contract.TENSORS["logits"]], {contract.TENSORS["token_ids"]: ids})
    np.testing.assert_allclose(logits, np.asarray(models["sinusoidal"](ids)), atol=1e-4, rtol=0)


def _shape_chain_model(batch="static"):
    """x [2, 3, 4] -> Reshape(x, Concat(Shape(x)[0:1], [-1])) -> y: shape arithmetic on a static tensor."""
    from onnx import TensorProto, helper, numpy_helper

    dims = [2, 3, 4] if batch == "static" else ["batch", 3, 4]
    nodes = [helper.make_node("Shape", ["x"], ["shape"], end=1),
             helper.make_node("Concat", ["shape", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["Identity:0"])]
    output = helper.make_tensor_value_info("Identity:0", TensorProto.FLOAT, ["unk__1", "unk__2"])
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [output], [numpy_helper.from_array(np.array([-1], np.int64), "minus_one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_finish_folds_a_shape_chain_and_names_and_shapes_the_output(edge):
    import onnx
    import onnxruntime

    folded = onnx.load_from_string(onnx_graph.finish(_shape_chain_model(), ["logits"]))
    assert [node.op_type for node in folded.graph.node] == ["Reshape"]
    assert onnx_graph.output_shapes(folded) == {"logits": [2, 12]}
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    session = onnxruntime.InferenceSession(folded.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(["logits"], {"x": x})[0], x.reshape(2, 12))


def test_finish_refuses_an_output_without_a_static_shape_and_a_wrong_name_count(edge):
    with pytest.raises(ValueError, match=r"^ONNX outputs without a static shape after folding: "
                                         r"\{'Identity:0': \['batch', "):
        onnx_graph.finish(_shape_chain_model(batch="symbolic"))
    with pytest.raises(ValueError, match=r"^the graph has 1 outputs \(\['Identity:0'\]\), got 2 names"):
        onnx_graph.finish(_shape_chain_model(), ["logits", "more"])

