"""The model an export reads: loading it, its inputs (`ModelSpec`), its float32 rebuild and its tables.

- `load_model`: a saved model with the keras_posenc layers registered;
- `ModelSpec`: the model's input roles (token, language, position and segment ids), their ranks,
  its pad id and vocabulary, at one fixed batch and length, and how to call it;
- `rebuild`: the same architecture and weights under the float32 policy with fixed input shapes,
  each layer computed by its target's formulation (`formulation.formulate`);
- `host_embedding_table`, `default_embedding`, `longest_sequence`, `rope_notes`: what the
  exports read of the model's layers.
"""

import contextlib
import math
import os

import numpy as np
import tensorflow as tf

from keras_posenc import models as _models  # noqa: F401  (registers Encoder and CausalLM for load_model)
from keras_posenc.backend import is_functional, keras, model_input_names
from keras_posenc.export import contract
from keras_posenc.export.formulation import formulate
from keras_posenc.export.targets import target_of
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.layers.rope_scaling import DYNAMIC_SCALINGS
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.validation import check_positive_int

__all__ = ["HOST_EMBEDDINGS", "ROLES", "ModelSpec", "all_layers", "default_embedding", "float32_policy",
           "frozen_function", "host_embedding_table", "load_model", "longest_sequence", "rebuild", "role_of",
           "rope_notes", "traced"]


def default_embedding(model, target):
    """The faster token lookup on a GPU: "host" for the gpu and gl targets of a model with a token table.

    The cost model: `embedding="graph"` looks a token up as a one-hot row times the table on the
    GPU, `T * vocab * d_model` multiply-adds (2.1 G at T = 512, vocab 8000, d_model 512: a
    sixth of the whole encoder's); `embedding="host"` moves `T * d_model` floats instead of T
    ids to the GPU (1 MiB at that size) and costs the GPU nothing. The `cpu` and `tensorrt`
    targets GATHER, which costs `T * d_model` copies: "graph" (`Target.default_embedding`).
    """
    return target_of(target).default_embedding(
        any(isinstance(layer, TokenAndPositionEmbedding) for layer in all_layers(model)))


def load_model(path, translator=False):
    """Loads a `.keras`/`.h5` file or SavedModel directory with the keras_posenc layers registered.

    Args:
        path: path of the file or SavedModel directory.
        translator: bool, the export takes a `Seq2SeqTransformer` (`--translate`); else one is
            refused, with the flag that exports it.

    Returns:
        The `keras.Model`, not compiled.

    Raises:
        FileNotFoundError: nothing at `path`.
        ValueError: the file is not a loadable Keras model (corrupt, or it
            uses a custom layer that is not registered).

    Example:

    >>> load_model("no_such_model.keras")
    Traceback (most recent call last):
        ...
    FileNotFoundError: Model file not found: 'no_such_model.keras'.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"Model file not found: {path!r}.")
    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for corrupt or foreign files
        raise ValueError(f"Could not load a Keras model from {path!r}: {type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}. Is it a model saved by "
                         "keras_posenc, with every custom layer registered?") from error
    if isinstance(model, Seq2SeqTransformer) and not translator:
        raise ValueError(f"{path!r} holds an encoder-decoder translator (Seq2SeqTransformer): export it "
                         "with `keras-posenc export MODEL --translate`.")
    if translator and not isinstance(model, Seq2SeqTransformer):
        raise ValueError(f"--translate exports a translator (`keras-posenc train --task translate`); "
                         f"{path!r} holds a {type(model).__name__}.")
    return model


ROLES = tuple(contract.TENSORS[role] for role in ("token_ids", "language_ids", "position_ids", "segment_ids"))


# The input of a file exported with `embedding="host"`: the looked-up token rows [batch, T, d_model].
HOST_EMBEDDINGS = contract.TENSORS["embeddings"]


def role_of(name):
    """The input role (`ROLES`, or `HOST_EMBEDDINGS`) a tensor name stands for; token ids by default."""
    if HOST_EMBEDDINGS in name:
        return HOST_EMBEDDINGS
    return next((role for role in ROLES[1:] if role in name), "token_ids")


def host_embedding_table(model):
    """The token table that an `embedding="host"` file reads its rows from, `sqrt(d_model)` included.

    float32 `[vocab_size, d_model]`: the runner feeds `table[token_ids]` as the `embeddings` input.

    Raises:
        ValueError: the model has no token embedding (`TokenAndPositionEmbedding`).
    """
    layers = [layer for layer in all_layers(model) if isinstance(layer, TokenAndPositionEmbedding)]
    if not layers:
        raise ValueError(f"`embedding='host'` needs a token embedding, and model '{model.name}' has no "
                         "TokenAndPositionEmbedding: export it with embedding='graph'.")
    layer = layers[0]
    table = np.asarray(layer.token_embedding.embeddings.numpy(), np.float32)
    return table * np.float32(math.sqrt(layer.d_model)) if layer.scale_embeddings else table


class ModelSpec:
    """What the exporter needs to know about a model: its inputs (by role) and the fixed shapes.

    A functional model's inputs are recognised by their names (`keras.Input(name="position_ids")`,
    `"segment_ids"`, `"language_ids"`); the first input is the token ids, and an unnamed second
    input of a model with `num_languages` is the language ids. Subclassed models take token ids
    and, with `num_languages`, `language_ids=`.
    """

    def __init__(self, model, sequence_length, batch_size, position_layers, roles, ranks, pad_id=None,
                 vocab_size=None):
        self.model = model
        self.pad_id = pad_id
        self.vocab_size = vocab_size
        self.sequence_length = sequence_length
        self.batch_size = batch_size
        self.position_layers = position_layers
        self.roles = roles
        self.ranks = ranks
        self.needs_languages = "language_ids" in roles
        self.language_rank = ranks[roles.index("language_ids")] if self.needs_languages else None
        self.functional = is_functional(model)

    @classmethod
    def of(cls, model, sequence_length, batch_size):
        if not isinstance(model, keras.layers.Layer):
            raise TypeError(f"`model` must be a keras Model or Layer, got {type(model).__name__}.")
        check_positive_int("sequence_length", sequence_length)
        check_positive_int("batch_size", batch_size)
        if not model.built:
            raise ValueError(f"Model '{model.name}' is not built: call it on a batch or load a trained "
                             "model.")
        layers = all_layers(model)
        unknown = [layer for layer in layers if not _is_known(layer)]
        if unknown:
            names = ", ".join(f"'{layer.name}' ({type(layer).__module__}.{type(layer).__name__})"
                              for layer in unknown)
            raise ValueError(f"Model '{model.name}' contains layers the exporter does not know: {names}. "
                             "Only keras built-in layers and keras_posenc layers can be exported.")
        positions = [layer for layer in layers if isinstance(layer, PositionEmbeddingBase)]
        if not positions:
            raise ValueError(f"Model '{model.name}' contains no keras_posenc position layer "
                             "(TokenAndPositionEmbedding, SinusoidalPositionEmbedding, ...): "
                             "nothing to export with this tool.")
        shortest = longest_sequence(model)
        if sequence_length > shortest:
            raise ValueError(
                f"`sequence_length`={sequence_length} exceeds the model's max_length={shortest}.")
        needs_languages = any(layer.num_languages is not None for layer in positions)
        roles, ranks = ["token_ids"], [2]
        if is_functional(model):
            input_names = model_input_names(model)
            for index, tensor in enumerate(model.inputs[1:], start=1):
                role = role_of(input_names[index])
                if role == "token_ids" and index == 1 and needs_languages:
                    role = "language_ids"
                if role == "token_ids" or role in roles:
                    raise ValueError(f"Model '{model.name}': input {index} ('{input_names[index]}') is "
                                     f"not one of {ROLES[1:]}; name the inputs with keras.Input(name=...).")
                roles.append(role)
                ranks.append(len(tensor.shape))
            if needs_languages and "language_ids" not in roles:
                raise ValueError(f"Model '{model.name}' scales positions per language: it must take "
                                 f"[token_ids, language_ids] as inputs, got {len(model.inputs)} inputs.")
        elif needs_languages:
            roles.append("language_ids")
            ranks.append(2)  # subclassed models get per-token language ids, the general case
        embeddings = [layer for layer in layers if isinstance(layer, TokenAndPositionEmbedding)]
        return cls(model, sequence_length, batch_size, positions, roles, ranks,
                   pad_id=embeddings[0].pad_id if embeddings else None,
                   vocab_size=embeddings[0].vocab_size if embeddings else None)

    def signature(self, dtype=tf.int32):
        """Input specs in the model's input order; float32 for the gl target."""
        return [tf.TensorSpec([self.batch_size, self.sequence_length][:rank], dtype, name=role)
                for role, rank in zip(self.roles, self.ranks)]

    def caller(self, model):
        """`call(*inputs)` in the order of `roles`, with training=False."""
        functional = is_functional(model)

        def call(*inputs):
            if len(inputs) == 1:
                return model(inputs[0], training=False)
            if functional:
                return model(list(inputs), training=False)
            return model(inputs[0], language_ids=inputs[1], training=False)

        return call

    def feeds(self, token_ids, **others):
        """The arrays of `token_ids` and `others` (by role) in input order; ValueError if one is missing."""
        arrays = {"token_ids": token_ids, **others}
        missing = [role for role in self.roles if arrays.get(role) is None]
        if missing:
            raise ValueError(f"Model '{self.model.name}' takes {list(self.roles)}: pass "
                             + ", ".join(f"`{role}`" for role in missing) + ".")
        return [np.asarray(arrays[role]).astype(np.int32) for role in self.roles]


def longest_sequence(model):
    """The longest sequence `model` takes: the shortest of its position tables (RoPE cos/sin included).

    Keras refuses a longer row in any of them. None without a keras_posenc position layer.
    """
    layers = all_layers(model)
    lengths = [layer.max_length for layer in layers if isinstance(layer, PositionEmbeddingBase)]
    lengths += [layer.max_length for layer in layers
                if isinstance(layer, RotaryEmbedding) and layer.max_length is not None]
    return min(lengths) if lengths else None


def frozen_function(function):
    """The concrete function of `function` with every variable it reads folded in as a constant.

    For the exports that save their signatures in a SavedModel of a bare `tf.Module` (several
    signatures in one file): the module tracks none of the variables (a Keras 3 model's least of
    all), so unfrozen they would stay VAR_HANDLE/READ_VARIABLE ops that the runtime never
    initialises (garbage outputs, and no GPU runs them). One function given to
    `TFLiteConverter.from_concrete_functions` needs no freezing here: the converter does it.
    """
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    return convert_variables_to_constants_v2(function.get_concrete_function())


def all_layers(model):
    """`model` and every layer inside it (Keras 2 and Keras 3)."""
    # _flatten_layers: Keras 2 and Keras 3 (a Keras 3 model is no tf.Module: no `submodules`); a
    # Keras 3 op of a functional graph (`x + y` is an `ops.Add`) is no layer and has neither.
    flatten = getattr(model, "_flatten_layers", None)
    layers = flatten(include_self=False) if flatten is not None else []
    return [model] + [m for m in layers if isinstance(m, keras.layers.Layer)]


def _is_known(layer):
    module = type(layer).__module__
    return module.split(".")[0] in ("keras", "keras_posenc") or module.startswith("tensorflow.python.keras")


@contextlib.contextmanager
def float32_policy():
    """The global dtype policy set to float32 inside the block (a float32 clone of any model)."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _float32_config(config):
    config = dict(config)
    if "dtype" in config:
        config["dtype"] = "float32"
    return config


def rebuild(model, spec, context=None):
    """Same architecture and weights, fixed input shapes, float32 compute, the formulations of `context`.

    The float32 clone of each layer is built from its config; with an `ExportContext`, a
    functional model is cloned with its formulated layers wrapped (`formulation.formulate`), any
    other model is built by one call of its own and then wrapped; without one, the plain clone
    (int32 inputs). The formulations read the weights when traced inside `context.tracing()`
    (after `set_weights`): the trained values, frozen as constants.
    """
    dtype = context.target.input_dtype if context is not None else tf.int32

    def clone_layer(layer):
        return type(layer).from_config(_float32_config(layer.get_config()))

    with float32_policy():
        if spec.functional:
            inputs = [keras.Input(batch_size=s.shape[0], shape=s.shape[1:], dtype=s.dtype)
                      for s in spec.signature(dtype)]
            if not isinstance(model.input, (list, tuple)):
                inputs = inputs[0]  # Keras 3 wants the structure of model.input
            clone = formulate(model, context, input_tensors=inputs, clone_layer=clone_layer)
        else:
            clone = clone_layer(model)
            spec.caller(clone)(*[tf.zeros(s.shape, s.dtype) for s in spec.signature(tf.int32)])
    weights = model.get_weights()
    clone_shapes = [w.shape for w in clone.get_weights()]
    if clone_shapes != [w.shape for w in weights]:
        raise ValueError(f"Could not rebuild model '{model.name}' from its config: the rebuilt weights "
                         "differ in number or shape; does every custom layer have a complete get_config?")
    clone.set_weights([np.asarray(w, np.float32) if w.dtype == np.float16 else w for w in weights])
    for layer in all_layers(clone):
        if isinstance(layer, RotaryEmbedding):
            layer.freeze(spec.sequence_length)  # "dynamic"/"longrope": the tables of length T
    if not spec.functional and context is not None:
        clone = formulate(clone, context)
    return clone


def traced(call, context, host_embeddings=False):
    """`call` run inside one trace of `context` (with `host_embeddings`: the rows as the last input)."""
    def run(*inputs):
        rows = inputs[-1] if host_embeddings else None
        with context.tracing(host_rows=rows):
            return call(*(inputs[:-1] if host_embeddings else inputs))

    return run


def rope_notes(model, sequence_length):
    """One line per RoPE layer whose scaling depends on the call length: what the export froze."""
    return [f"RoPE '{layer.name}' (scaling={layer.scaling!r}): cos/sin frozen for calls of the exported "
            f"length {sequence_length} (max(position_ids) + 1 = {sequence_length}); the Keras layer "
            "switches frequencies by each call's length" for layer in all_layers(model)
            if isinstance(layer, RotaryEmbedding) and layer.scaling in DYNAMIC_SCALINGS]
