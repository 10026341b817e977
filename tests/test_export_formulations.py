"""The export wing's structure: one formulation table, targets as objects, no private imports, no circle."""

import ast
import dataclasses
import pathlib

import numpy as np
import pytest

from keras_posenc import export
from keras_posenc.backend import keras
from keras_posenc.export import (
    contract,
    formulation,
    formulations,
    gather,
    gl,
    gpu,
    kinds,
    model_spec,
    targets,
)
from keras_posenc.layers import (
    RotaryEmbedding,
    SinusoidalPositionEmbedding,
    TokenAndPositionEmbedding,
)
from keras_posenc.layers.encoder import Encoder
from keras_posenc.layers.encoder_layer import EncoderLayer
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.models import CausalLM

ROOT = pathlib.Path(export.__file__).parents[2]
PACKAGE = ROOT / "keras_posenc"
WING = sorted((PACKAGE / "export").glob("*.py"))
# Not Keras: TF 2.12's TFLiteConverter has only this private switch for what TF >= 2.16 calls
# `unfold_batchmatmul` (the gpu target keeps BATCH_MATMUL); it is set only where the public one is missing.
# TF 2.21's converter has no public switch for per-tensor FULLY_CONNECTED int8 weights, the op version
# the GL delegate runs (quantization.Recipe.dense_per_tensor; TF 2.12 writes them per tensor anyway).
# The translation ablation's "norm over positions" arm puts the article's faulty normalization into a
# model it builds itself, before the model is built (an injected fault, not a way of working).
ALLOWED = {"app/translation_ablation.py": [
               "setattr(layer, name, _PositionAxisNormalization(norm.epsilon, name=norm.name))"],
           "export/conversion.py": ["converter._experimental_disable_batchmatmul_unfold"],
           "export/quantization.py": [
               "converter._experimental_disable_per_channel_quantization_for_dense_layers"]}


def _foreign_writes(tree):
    """`x.call = ...`, `x._private = ...` (x not self/cls) and `setattr(x, ...)` (x not self)."""
    found = []
    for node in ast.walk(tree):
        targets_ = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets_:
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


# Targets: objects, no branch on their names ---------------------------------------------------
def _name_branches(tree, names, words=("target",)):
    """`... target ... == "gl"` and `... target ... in ("gpu", "gl")`: comparisons of an expression
    that says one of `words` with one of `names` (a string or a collection of strings)."""
    def literal_names(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left] + node.comparators
        if any(literal_names(o) & names for o in operands) and any(
                any(word in ast.unparse(o) for word in words) for o in operands if not literal_names(o)):
            found.append(ast.unparse(node))
    return found


def test_no_branch_on_a_target_name_outside_the_target_definitions():
    names = set(targets.TARGETS)
    paths = [p for p in WING if p.name != "targets.py"] + sorted((PACKAGE / "app").glob("cli*.py")) + sorted(
        (ROOT / "export" / "jetson").glob("*.py"))
    found = {str(p.relative_to(ROOT)): _name_branches(ast.parse(p.read_text()), names) for p in paths}
    assert {path: lines for path, lines in found.items() if lines} == {}
    # The scan finds what it looks for, and leaves other comparisons alone.
    sample = ('a = target == "gl"\nb = args.target not in ("gpu", "gl")\nc = meta["target"] != "cpu"\n'
              'd = accelerator == "gpu"\ne = backend == "gl"')
    assert _name_branches(ast.parse(sample), names) == [
        "target == 'gl'", "args.target not in ('gpu', 'gl')", "meta['target'] != 'cpu'"]


# What an export's files are and how they run: `Kind` and `FileFormat` objects, no branch on their names.
_FORMAT_WORDS = ("format", "runtime", "kind")


def test_no_branch_on_a_kind_or_file_format_name_outside_their_definitions():
    """The export wing reads `Kind` and `FileFormat` objects (tables keyed by them) instead of comparing
    "window", "prefill_decode", "litertlm", "genai", "onnx" or "tflite" with an expression naming a
    format, runtime or kind."""
    names = set(kinds.KINDS) | {f.name for f in targets.FILE_FORMATS}
    paths = [p for p in WING if p.name not in ("targets.py", "kinds.py")]
    paths += sorted((PACKAGE / "app").glob("cli*.py"))
    found = {str(p.relative_to(ROOT)): _name_branches(ast.parse(p.read_text()), names, _FORMAT_WORDS)
             for p in paths}
    assert {path: lines for path, lines in found.items() if lines} == {}
    sample = ('a = target.file_format == "onnx"\nb = runtime != "tflite"\nc = kind in ("litertlm", "genai")\n'
              'd = recipe.runtime == "litert"\ne = name == "onnx"')
    assert _name_branches(ast.parse(sample), names, _FORMAT_WORDS) == [
        "target.file_format == 'onnx'", "runtime != 'tflite'", "kind in ('litertlm', 'genai')"]


def test_kinds_are_frozen_objects_and_name_their_choices():
    assert tuple(kinds.KINDS) == ("window", "prefill_decode", "litertlm", "genai", "translate")
    assert kinds.kind_of(kinds.LITERTLM) is kinds.LITERTLM and kinds.kind_of("genai") is kinds.GENAI
    with pytest.raises(dataclasses.FrozenInstanceError):
        kinds.WINDOW.generates = True
    assert [k.generates for k in kinds.KINDS.values()] == [False, True, True, True, True]
    assert [k.contract_kind for k in kinds.KINDS.values()] == [
        "window", "prefill_decode", "prefill_decode", None, "translate"]
    assert [k.name for k in kinds.KINDS.values() if k.signatures != contract.SIGNATURES] == ["translate"]
    assert {k.contract_kind for k in kinds.KINDS.values()} - {None} == set(contract.KINDS.values())
    assert [k.name for k in kinds.KINDS.values() if k.folder] == ["genai"]
    assert [k.name for k in kinds.KINDS.values() if not k.takes_target] == ["genai"]
    with pytest.raises(ValueError, match=r"`kind` must be one of \('window', 'prefill_decode', 'litertlm', "
                                         r"'genai', 'translate'\), got kind='onnx'\."):
        kinds.kind_of("onnx")


def test_targets_are_frozen_objects_with_every_difference_as_a_field():
    assert tuple(targets.TARGETS) == ("gpu", "gl", "cpu", "tensorrt")
    gl_target = export.target_of("gl")
    assert export.target_of(gl_target) is gl_target
    with pytest.raises(dataclasses.FrozenInstanceError):
        gl_target.max_batch = 4
    assert [t.input_dtype for t in targets.TARGETS.values()] == ["int32", "float32", "int32", "int32"]
    assert [t.max_batch for t in targets.TARGETS.values()] == [None, 1, None, None]
    assert [t.file_format.name for t in targets.TARGETS.values()] == ["tflite", "tflite", "tflite", "onnx"]
    assert [t.suffix for t in targets.TARGETS.values()] == [".tflite", ".tflite", ".tflite", ".onnx"]
    assert targets.DEFAULT_TARGET in targets.TARGETS
    assert [t.default_embedding(True) for t in targets.TARGETS.values()] == ["host", "host", "graph", "graph"]
    assert {t.default_embedding(False) for t in targets.TARGETS.values()} == {"graph"}
    assert export.target_of("gpu").backends[0] == "webgpu" and export.target_of("gl").backends[0] == "gl"
    assert set().union(*(t.backends for t in targets.TARGETS.values())) <= set(export.BACKENDS)
    with pytest.raises(ValueError, match=r"`target` must be one of \('gpu', 'gl', 'cpu', 'tensorrt'\), "
                                         r"got target='npu'"):
        export.target_of("npu")


# The formulation table ------------------------------------------------------------------------
def test_the_formulation_table_names_one_function_per_target_and_layer_class():
    entries = formulations.ENTRIES
    keys = {(target, cls) for target, cls, _ in entries}
    assert len(keys) == len(entries) == len(formulations.FORMULATIONS)
    assert {target for target, _, _ in entries} == set(targets.TARGETS.values())  # keyed by the objects
    table = {(target.name, cls): function for (target, cls), function in formulations.FORMULATIONS.items()}
    assert table[("gpu", Encoder)] is gpu.encoder and table[("gl", Encoder)] is gl.encoder
    assert table[("gpu", EncoderLayer)] is gpu.encoder_layer
    assert table[("gl", EncoderLayer)] is gl.encoder_layer
    assert table[("gpu", PositionEmbeddingBase)] is gl.position is table[("gl", PositionEmbeddingBase)]
    assert table[("cpu", TokenAndPositionEmbedding)] is gather.embedding_lookup
    assert table[("tensorrt", TokenAndPositionEmbedding)] is gather.embedding
    assert ("cpu", EncoderLayer) not in table  # the layer runs as it is
    assert all(table[(name, CausalLM)] is gather.causal_lm for name in targets.TARGETS)
    # The table is the module's docstring table, row by row.
    documented = {}
    for line in formulations.__doc__.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] and not cells[0].startswith(("layer", "-")):
            for names, cell in zip((("cpu",), ("tensorrt",), ("gl",), ("gpu",)), cells[1:]):
                for name in names:
                    documented[(name, cells[0])] = cell
    assert documented == {
        (target.name, cls.__name__): (f"{function.__module__.rsplit('.', 1)[-1]}.{function.__name__}")
        for target, cls, function in entries} | {
        (name, "EncoderLayer"): "(the layer itself)" for name in ("cpu", "tensorrt")}


def test_a_layer_takes_the_entry_of_its_nearest_class():
    context = formulation.ExportContext(export.target_of("gpu"), formulations.FORMULATIONS)
    assert context.formulation_of(SinusoidalPositionEmbedding(8)) is gl.position  # via PositionEmbeddingBase
    assert context.formulation_of(RotaryEmbedding()) is None  # not a PositionEmbeddingBase: runs as it is
    gpu_target = export.target_of("gpu")
    nearest = {**formulations.FORMULATIONS, (gpu_target, SinusoidalPositionEmbedding): gather.position}
    assert formulation.ExportContext(export.target_of("gpu"), nearest).formulation_of(
        SinusoidalPositionEmbedding(8)) is gather.position


def test_export_leaves_the_model_and_its_layers_unchanged():
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, TokenAndPositionEmbedding(30, 8, max_length=12)(ids))
    before = {layer.name: dict(vars(layer)) for layer in model.layers}
    context = formulation.ExportContext(export.target_of("gl"), formulations.FORMULATIONS)
    clone = model_spec.rebuild(model, model_spec.ModelSpec.of(model, 6, 1), context)
    wrappers = [layer for layer in clone.layers if isinstance(layer, formulation.Formulated)]
    assert [type(w.layer).__name__ for w in wrappers] == ["TokenAndPositionEmbedding"]
    assert type(wrappers[0].layer).call is TokenAndPositionEmbedding.call
    assert "call" not in vars(wrappers[0].layer)
    assert {layer.name: dict(vars(layer)) for layer in model.layers}.keys() == before.keys()
    flat = export.to_tflite(model, sequence_length=6, target="gl")
    batch = np.array([[3, 4, 5, 0, 0, 0]], np.int32)
    assert export.check_parity(model, flat, batch) < 1e-5


# Imports inside the package: no private names, no circle -------------------------------------
def _package_imports(path):
    """`(module imported, names taken from it)` for every keras_posenc import of `path`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("keras_posenc"):
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("keras_posenc"):
                    yield alias.name, []


def _module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private_uses(path):
    """Private names imported from another module, or read as `module._name` of an imported module."""
    tree = ast.parse(path.read_text())
    aliases, found = {}, []
    for module, names in _package_imports(path):
        found += [f"{module}.{name}" for name in names if name.startswith("_")]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("keras_posenc"):
            aliases.update({(a.asname or a.name): f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            aliases.update({(a.asname or a.name): a.name for a in node.names
                            if a.name.startswith("keras_posenc")})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names(tmp_path):
    """Across the package and the kit. A private *module* (`keras_posenc._startup`) is private to its
    package, which may import it; a private name inside another module is not."""
    paths = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "export" / "jetson").glob("*.py"))
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    found = {str(p.relative_to(ROOT)): [name for name in _private_uses(p) if name not in modules]
             for p in paths}
    assert {path: names for path, names in found.items() if names} == {}
    # The scan finds what it looks for.
    sample = tmp_path / "sample.py"
    sample.write_text("from keras_posenc.export.gl import _x\nfrom keras_posenc.export import gl\ngl._y\n")
    assert _private_uses(sample) == ["keras_posenc.export.gl._x", "keras_posenc.export.gl._y"]


def test_no_import_circle_in_the_package():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for module, names in _package_imports(path):
            for candidate in [f"{module}.{n}" for n in names] + [module]:
                if candidate in modules and candidate != name:
                    edges.add(candidate)
                    break
        graph[name] = edges
    # Package entry points re-export from below: an edge into an __init__ is an edge into the package.
    packages = {n for n, p in modules.items() if p.name == "__init__.py"}

    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [nxt]
                if nxt not in seen and nxt not in packages:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = {name: cycle_from(name) for name in graph if name not in packages}
    assert {name: cycle for name, cycle in cycles.items() if cycle} == {}
    assert "keras_posenc.export.verdicts" not in graph["keras_posenc.export.flatbuffer"]
