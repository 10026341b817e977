"""The last step of every ONNX export: constants folded, outputs named by the contract, static shapes.

tf2onnx leaves shape arithmetic in the graph (Shape -> Gather -> Concat -> Reshape, ReduceProd of
shapes) although every shape of a `tensorrt` export is static, names a window file's output
after its TensorFlow tensor (`Identity:0`) and gives some outputs symbolic dimensions
(`unk__12`). `finish` folds the constants with onnxruntime's graph optimizer, offline at its
basic level (standard ONNX operators only, no fusion for one machine), until no `Shape` of a
statically shaped tensor is left: onnxruntime cannot see through a `Reshape` whose shape is
computed, ONNX's shape inference with data propagation can, so each pass turns the `Shape`
nodes it resolves into constants and lets onnxruntime fold what they fed. Then the outputs get
the contract's names (`contract.TENSORS`) and their inferred static shapes. What
`polygraphy surgeon sanitize --fold-constants` would remove is already gone
(tests/edge/edge_onnx_graph.py checks it).
"""

import os
import tempfile

__all__ = ["MAX_PASSES", "drop_unused_domains", "finish", "fold_constants", "name_outputs", "output_shapes",
           "static_output_shapes"]

# onnxruntime passes: 1 for a window or prefill file; a decode step needs 3 (each resolves more `Shape`s).
MAX_PASSES = 12


def finish(model_bytes, output_names=None):
    """A serialized tf2onnx model folded, its outputs renamed and statically shaped.

    Args:
        model_bytes: the serialized `ModelProto`.
        output_names: None, or the contract's names of the graph's outputs, in their order.

    Returns:
        The serialized model.

    Raises:
        ValueError: an output keeps a dimension that is not a static int (the graph is not
            static: a bug of the export), or `output_names` does not match the outputs.
    """
    import onnx

    model = fold_constants(onnx.load_from_string(bytes(model_bytes)))
    if output_names is not None:
        name_outputs(model, output_names)
    return static_output_shapes(model).SerializeToString()


def fold_constants(model):
    """`model` (a `ModelProto`) with every node whose inputs are constants folded into an initializer."""
    model = _optimized(model)
    for _ in range(MAX_PASSES):
        if not _fold_static_shapes(model):
            break
        model = _optimized(model)
    return drop_unused_domains(model)


def name_outputs(model, names):
    """Renames the graph outputs of `model` (in place) to `names`, in order, and the tensors behind them."""
    outputs = list(model.graph.output)
    if len(names) != len(outputs):
        raise ValueError(f"the graph has {len(outputs)} outputs ({[o.name for o in outputs]}), "
                         f"got {len(names)} names: {list(names)}")
    renamed = {output.name: name for output, name in zip(outputs, names) if output.name != name}
    if not renamed:
        return model
    for node in model.graph.node:
        node.output[:] = [renamed.get(name, name) for name in node.output]
        node.input[:] = [renamed.get(name, name) for name in node.input]
    for value in list(model.graph.output) + list(model.graph.value_info):
        value.name = renamed.get(value.name, value.name)
    return model


def output_shapes(model):
    """`{output name: [dims]}` of `model`'s graph as declared: ints, or the symbolic names (str)."""
    return {output.name: [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?")
                          for dim in output.type.tensor_type.shape.dim]
            for output in model.graph.output}


def static_output_shapes(model):
    """`model` (in place) with its value infos and outputs shaped by ONNX's shape inference.

    tf2onnx's value infos carry its symbolic `unk__N` dimensions, which would win over the
    inferred ones: they are dropped first. Raises ValueError if an output stays not static.
    """
    import onnx

    for output in model.graph.output:
        output.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    model.graph.value_info.extend(inferred.graph.value_info)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    loose = {name: dims for name, dims in output_shapes(model).items()
             if not dims or not all(isinstance(dim, int) and dim > 0 for dim in dims)}
    if loose:
        raise ValueError(f"ONNX outputs without a static shape after folding: {loose}")
    return model


def _optimized(model):
    """onnxruntime's basic offline optimization of `model` (constant folding, redundant nodes)."""
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="keras_posenc_onnx_") as folder:
        options.optimized_model_filepath = os.path.join(folder, "folded.onnx")
        onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def _fold_static_shapes(model):
    """Replaces each `Shape`/`Size` of a statically shaped tensor by its value (in place); their count."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(bare, data_prop=True)
    shapes = {}
    for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            if all(dim.HasField("dim_value") for dim in dims):
                shapes[value.name] = [dim.dim_value for dim in dims]
    for initializer in model.graph.initializer:
        shapes[initializer.name] = list(initializer.dims)
    kept, folded = [], []
    for node in model.graph.node:
        shape = shapes.get(node.input[0]) if node.op_type in ("Shape", "Size") and not node.domain else None
        if shape is None:
            kept.append(node)
            continue
        if node.op_type == "Size":
            value = np.array(int(np.prod(shape)), np.int64)
        else:
            attributes = {item.name: helper.get_attribute_value(item) for item in node.attribute}
            value = np.array(shape[attributes.get("start", 0):attributes.get("end", len(shape))], np.int64)
        folded.append(numpy_helper.from_array(value, node.output[0]))
    if folded:
        del model.graph.node[:]
        model.graph.node.extend(kept)
        model.graph.initializer.extend(folded)
    return len(folded)


def drop_unused_domains(model):
    """`model` (in place) without the opset imports no node uses (onnxruntime's optimizer adds its own)."""
    used = {node.domain for node in model.graph.node} | {""}
    kept = [entry for entry in model.opset_import if entry.domain in used or entry.domain == "ai.onnx"]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model
