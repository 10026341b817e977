"""The export formulations: applied by wrapper layers, gathered explicitly, no layer patched."""

import ast
import pathlib
import types

import numpy as np

from keras_posenc import export
from keras_posenc.backend import keras
from keras_posenc.export import conversion, emitters, gl
from keras_posenc.layers import SinusoidalPositionEmbedding, TokenAndPositionEmbedding
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase

PACKAGE = pathlib.Path(export.__file__).parents[1]
# Not Keras: TF 2.12's TFLiteConverter has only this private switch for what TF >= 2.16 calls
# `unfold_batchmatmul` (the gpu target keeps BATCH_MATMUL); it is set only where the public one is missing.
ALLOWED = {"export/conversion.py": ["converter._experimental_disable_batchmatmul_unfold"]}


def _foreign_writes(tree):
    """`x.call = ...`, `x._private = ...` (x not self/cls) and `setattr(x, ...)` (x not self)."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for attribute in (n for n in ast.walk(target) if isinstance(n, ast.Attribute)):
                owner = attribute.value
                own = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
                dunder = attribute.attr.startswith("__") and attribute.attr.endswith("__")
                if attribute.attr == "call" or (attribute.attr.startswith("_") and not own and not dunder):
                    found.append(ast.unparse(target))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            if not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
                found.append(ast.unparse(node))
    return found


def test_no_module_sets_call_or_a_private_attribute_of_another_object():
    found = {str(path.relative_to(PACKAGE)): _foreign_writes(ast.parse(path.read_text()))
             for path in PACKAGE.rglob("*.py")}
    assert {path: lines for path, lines in found.items() if lines} == ALLOWED
    # The scan finds what it looks for.
    assert len(_foreign_writes(ast.parse("layer.call = f\nlayer._x = 1\nsetattr(m, 'a', 1)"))) == 3


def test_formulations_are_gathered_from_the_listed_modules_only():
    def formulation(layer, inputs):
        return inputs

    marked = emitters.emits(("gpu",), PositionEmbeddingBase)(formulation)
    assert marked is formulation  # returned unchanged, only marked
    module = types.SimpleNamespace(formulation=formulation)
    layer = SinusoidalPositionEmbedding(8)
    assert emitters.Formulations.collect(gl).of(layer, "gpu") is gl._position
    assert emitters.Formulations.collect(gl, module).of(layer, "gpu") is formulation  # the later wins
    assert emitters.Formulations.collect(module, gl).of(layer, "gpu") is gl._position
    assert emitters.Formulations.collect(module).of(layer, "cpu") is None
    nearest = emitters.emits(("gpu",), SinusoidalPositionEmbedding)(lambda layer, x: x)
    specific = types.SimpleNamespace(f=nearest)
    assert emitters.Formulations.collect(specific, gl).of(layer, "gpu") is specific.f  # the nearest class
    assert conversion.FORMULATIONS.of(layer, "cpu") is emitters._position_gather


def test_export_leaves_the_model_and_its_layers_unchanged():
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, TokenAndPositionEmbedding(30, 8, max_length=12)(ids))
    before = {layer.name: dict(vars(layer)) for layer in model.layers}
    clone = conversion.rebuild(model, conversion.ModelSpec.of(model, 6, 1), "gl")
    wrappers = [layer for layer in clone.layers if isinstance(layer, emitters.Formulated)]
    assert [type(w.layer).__name__ for w in wrappers] == ["TokenAndPositionEmbedding"]
    assert type(wrappers[0].layer).call is TokenAndPositionEmbedding.call
    assert "call" not in vars(wrappers[0].layer)
    assert {layer.name: dict(vars(layer)) for layer in model.layers}.keys() == before.keys()
    flat = export.to_tflite(model, sequence_length=6, target="gl")
    batch = np.array([[3, 4, 5, 0, 0, 0]], np.int32)
    assert export.check_parity(model, flat, batch) < 1e-5
