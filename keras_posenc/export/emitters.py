"""Per-target formulations of the keras_posenc layers, and the wrapper layer that applies them.

Each export target needs the same numbers from a different set of ops:

- `cpu` and `tensorrt`: plain lookups (`GATHER`), the cheapest graph for XNNPACK and TensorRT;
- `gpu` (LiteRT GPU accelerator, OpenCL delegate) and `gl` (the classic delegate's OpenGL ES
  backend): only ops with a GPU shader, see `keras_posenc.export.gl` (`gpu` adds one CAST of
  the int32 inputs);

A formulation is a plain function `(layer, inputs, **call_arguments)` marked with
`@emits(targets, LayerClass)`; it reads the layer's public attributes and weights. The layer
modules stay free of export concerns. `Formulations.collect(*modules)` gathers the marked
functions of the modules it is given (the exporter lists them explicitly; importing a module
registers nothing), keyed by `(target, layer class)`, the later one winning.

`Formulated` is a Keras layer that owns one (cloned) layer and whose `call` is that layer's
formulation: `formulate(model, target, formulations)` returns the model with every formulated
layer wrapped (`keras.models.clone_model(clone_function=...)` for a functional model, the
model itself wrapped otherwise); nothing of the wrapped layers is changed. Inside a
formulation, `emit(sublayer, ...)` runs a sublayer's formulation of the same target (or the
sublayer itself when it has none). The constants of the export (`Frozen` tables, the
`embedding="host"` rows) live in the `ExportContext` that the exporter opens around the trace.
"""

import contextlib
import inspect
import math
import threading

import numpy as np
import tensorflow as tf

from keras_posenc.backend import keras
from keras_posenc.layers.encoder import Encoder
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.models import CausalLM

__all__ = ["TARGETS", "ExportContext", "Formulated", "Formulations", "Frozen", "emit", "emits", "exporting",
           "formulate", "frozen", "host_rows", "static_structure"]

TARGETS = ("gpu", "gl", "cpu", "tensorrt")
_MARK = "_keras_posenc_formulates"


def emits(targets, layer_class):
    """Marks the decorated function as the formulation of `layer_class` for `targets`.

    The function is returned unchanged; `Formulations.collect` reads the mark.
    """
    def mark(function):
        marks = function.__dict__.setdefault(_MARK, [])
        marks.extend((target, layer_class) for target in targets)
        return function
    return mark


class Formulations:
    """The formulation of each `(target, layer class)`, gathered from explicitly listed modules."""

    def __init__(self):
        self.table = {target: {} for target in TARGETS}

    @classmethod
    def collect(cls, *modules):
        """The marked functions of `modules` (in order: a later one replaces an earlier one)."""
        formulations = cls()
        for module in modules:
            for function in vars(module).values():
                for target, layer_class in getattr(function, _MARK, ()):
                    formulations.add(target, layer_class, function)
        return formulations

    def add(self, target, layer_class, function):
        if target not in self.table:
            raise ValueError(f"`target` must be one of {TARGETS}, got target={target!r}.")
        self.table[target][layer_class] = function

    def of(self, layer, target):
        """The formulation of `layer` (its class or the nearest base class) for `target`, or None."""
        table = self.table[target]
        return next((table[cls] for cls in type(layer).__mro__ if cls in table), None)


class ExportContext:
    """What the formulations of one export read besides the layers: target, constants, host rows."""

    def __init__(self, target, formulations, host_embeddings=None):
        self.target = target
        self.formulations = formulations
        self.host_embeddings = host_embeddings
        self._frozen = {}

    def frozen(self, layer):
        entry = self._frozen.get(id(layer))
        if entry is None:
            entry = self._frozen[id(layer)] = (layer, Frozen(layer))  # the layer kept alive with its id
        return entry[1]


_ACTIVE = threading.local()


def _active():
    stack = getattr(_ACTIVE, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def exporting(target, formulations, host_embeddings=None):
    """Opens the `ExportContext` of one trace: frozen constants are read once per layer inside it."""
    context = ExportContext(target, formulations, host_embeddings)
    stack = _ACTIVE.__dict__.setdefault("stack", [])
    stack.append(context)
    try:
        yield context
    finally:
        stack.pop()


def frozen(layer):
    """The layer's `Frozen` constants: once per export context (fresh outside of one)."""
    context = _active()
    return Frozen(layer) if context is None else context.frozen(layer)


def host_rows():
    """The looked-up token rows of an `embedding="host"` export (None otherwise)."""
    context = _active()
    return None if context is None else context.host_embeddings


class Frozen:
    """The constants of one position layer, read once from its trained weights (float64 -> float32)."""

    def __init__(self, layer):
        with tf.init_scope():  # eager, also while a graph is being traced
            self.table = np.asarray(layer._table_prefix(layer.max_length), np.float32)
            self.scales = (np.asarray(layer.language_scale.numpy(), np.float32)
                           if layer.num_languages is not None else None)


def _accepted(function, kwargs):
    """`kwargs` without `mask` and `training` when `function` does not take them (Keras passes both)."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return kwargs
    return {name: value for name, value in kwargs.items()
            if name in parameters or name not in ("mask", "training")}


def _apply(function, layer, args, kwargs):
    # Plain Python: autograph would convert the formulations, which have no data-dependent control flow.
    plain = tf.autograph.experimental.do_not_convert(function)
    return plain(layer, *args, **_accepted(function, kwargs))


@tf.autograph.experimental.do_not_convert
def emit(layer, *args, **kwargs):
    """Inside a formulation: `layer`'s formulation for the current target, or `layer(...)` without one."""
    context = _active()
    function = None if context is None else context.formulations.of(layer, context.target)
    if function is None:
        return layer(*args, **kwargs)
    return _apply(function, layer, args, kwargs)


class Formulated(keras.layers.Layer):
    """A layer computed by its export formulation: owns `layer`, calls `formulation(layer, ...)`.

    The wrapped layer keeps its own weights (the only weights of this layer, in the same order)
    and its class, config and `call`; this layer's `call` is the formulation of `target`. Build
    one with `Formulated.of(layer, target, formulations)`: its class takes the call signature of
    the layer's class, so Keras passes it the same arguments (mask and training included).
    """

    _classes = {}

    @classmethod
    def of(cls, layer, target, formulations):
        layer_class = type(layer)
        wrapper = cls._classes.get(layer_class)
        if wrapper is None:
            def call(self, *args, **kwargs):
                return self.formulated_call(*args, **kwargs)

            call.__signature__ = inspect.signature(layer_class.call)
            wrapper = cls._classes[layer_class] = type(f"Formulated{layer_class.__name__}", (cls,),
                                                       {"call": call})
        return wrapper(layer, target, formulations)

    def __init__(self, layer, target, formulations, **kwargs):
        super().__init__(name=f"{layer.name}_{target}", **kwargs)
        self.layer = layer
        self.target = target
        self.formulations = formulations
        self.formulation = formulations.of(layer, target)
        if self.formulation is None:
            raise ValueError(f"No {target} formulation for {type(layer).__name__} '{layer.name}'.")
        self.supports_masking = True

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
        self.built = True

    def formulated_call(self, *args, **kwargs):
        context = _active()
        if context is not None and context.target == self.target:
            return _apply(self.formulation, self.layer, args, kwargs)
        with exporting(self.target, self.formulations):  # a symbolic call while the clone is built
            return _apply(self.formulation, self.layer, args, kwargs)

    def compute_mask(self, inputs, mask=None):
        return self.layer.compute_mask(inputs, mask)


def formulate(model, target, formulations, input_tensors=None, clone_layer=None):
    """`model` computed by the `target` formulations: wrapped layers, the originals unchanged.

    With `input_tensors` (a functional model), `keras.models.clone_model` clones each layer
    by `clone_layer` (default: the layer itself) and wraps every formulated one in its
    `Formulated` layer. Any other model or layer is wrapped whole when its class has a
    formulation (`CausalLM`, `Encoder`, ...), and returned as it is otherwise.
    """
    if input_tensors is not None:
        def wrap(layer):
            if not isinstance(layer, keras.layers.Layer):
                return layer  # a Keras 3 stateless operation of the graph (`x + y`): nothing to clone
            layer = clone_layer(layer) if clone_layer is not None else layer
            if formulations.of(layer, target) is not None:
                return Formulated.of(layer, target, formulations)
            return layer

        return keras.models.clone_model(model, input_tensors=input_tensors, clone_function=wrap)
    if formulations.of(model, target) is not None:
        return Formulated.of(model, target, formulations)
    return model


def static_structure(length, segment_ids=None, attention_mask=None, use_causal_mask=False):
    """Constant attention structure `[T, T]` (bool) and same-run matrix for position ids, or None.

    Returns `(allowed, runs)`: `allowed[q, k]` from the causal mask, constant segment ids and a
    constant attention mask; `runs[j, i]` True when key j lies in the same contiguous segment run
    as i (for position ids that restart per segment). Raises ValueError for non-constant
    segment ids or attention masks with more than one row (the caller decides what to do).
    """
    allowed = np.ones([length, length], bool)
    runs = np.ones([length, length], bool)
    if use_causal_mask:
        allowed &= np.tril(np.ones([length, length], bool))
    if segment_ids is not None:
        segments = tf.get_static_value(segment_ids)
        if segments is None:
            raise ValueError("segment_ids are not constant")
        segments = np.asarray(segments).reshape(-1, length)
        if len(segments) != 1 and not (segments == segments[:1]).all():
            raise ValueError("segment_ids differ between rows")
        segments = segments[0]
        allowed &= segments[:, None] == segments[None, :]
        starts = np.concatenate([[1], segments[1:] != segments[:-1]])
        ordinal = np.cumsum(starts)
        runs = ordinal[:, None] == ordinal[None, :]
    if attention_mask is not None:
        given = tf.get_static_value(attention_mask)
        if given is None:
            raise ValueError("attention_mask is not constant")
        given = np.asarray(given, bool).reshape(-1, length, length)
        if len(given) != 1:
            raise ValueError("attention_mask differs between rows")
        allowed &= given[0]
    return allowed, runs


def exclusive_count_matrix(runs):
    """`[T, T]` float32 M with M[j, i] = 1 when j < i in the same run: ids = real @ M."""
    length = len(runs)
    before = np.arange(length)[:, None] < np.arange(length)[None, :]
    return (before & runs.T).astype(np.float32)


# cpu / tensorrt: GATHER lookups -------------------------------------------------------------
def _positions_int(mask, position_ids, segment_ids, length):
    """int32 position ids [B, T] (0 at padding) for the integer-input targets."""
    if position_ids is not None:
        return tf.broadcast_to(tf.cast(position_ids, tf.int32), tf.shape(mask))
    real = tf.cast(mask, tf.float32)
    if segment_ids is not None:
        try:
            _, runs = static_structure(length, segment_ids=segment_ids)
        except ValueError:
            from keras_posenc.positions import position_ids as derive
            return derive(mask, segment_ids=segment_ids)
        ids = tf.reshape(tf.matmul(tf.reshape(real, [-1, length]), exclusive_count_matrix(runs)),
                         [-1, length])
        return tf.cast(ids * real, tf.int32)
    return tf.cast((tf.cumsum(real, axis=1) - real) * real, tf.int32)


@emits(("cpu", "tensorrt"), PositionEmbeddingBase)
def _position_gather(layer, inputs, position_ids=None, language_ids=None, mask=None, training=None,
                     segment_ids=None):
    constants = frozen(layer)
    length = inputs.shape[1]
    if mask is None and position_ids is None:
        pe = tf.constant(constants.table[:length])[None]
    else:
        if mask is None:
            mask = tf.ones(tf.shape(inputs)[:2], tf.bool)
        ids = _positions_int(mask, position_ids, segment_ids, length)
        if layer.zero_padding:
            padded = np.concatenate([np.zeros_like(constants.table[:1]), constants.table])
            pe = tf.gather(tf.constant(padded), tf.where(mask, ids + 1, 0))
        else:
            pe = tf.gather(tf.constant(constants.table), ids)
    if constants.scales is not None:
        scales = tf.gather(tf.constant(constants.scales), tf.cast(language_ids, tf.int32))
        pe = pe * (tf.reshape(scales, [-1, 1, 1]) if language_ids.shape.rank == 1 else scales[..., None])
    return inputs + pe


def _embed(layer, token_ids, position_ids, language_ids, segment_ids, lookup):
    token_ids = tf.cast(token_ids, tf.int32)
    mask = tf.not_equal(token_ids, layer.pad_id)
    x = host_rows()  # embedding="host": table[ids] fed, sqrt(d_model) in
    if x is None:
        x = lookup(token_ids)
        if layer.scale_embeddings:
            x = x * math.sqrt(layer.d_model)
    return emit(layer.position_embedding, x, position_ids=position_ids, language_ids=language_ids, mask=mask,
                segment_ids=segment_ids, training=False)


@emits(("cpu", "tensorrt"), TokenAndPositionEmbedding)
def _embedding_gather(layer, token_ids, position_ids=None, language_ids=None, segment_ids=None,
                      training=None):
    table = layer.token_embedding.embeddings
    return _embed(layer, token_ids, position_ids, language_ids, segment_ids,
                  lambda ids: tf.gather(table, ids))


@emits(("cpu", "tensorrt"), Encoder)
def _encoder(layer, token_ids, position_ids=None, language_ids=None, segment_ids=None, attention_mask=None,
             use_causal_mask=False, training=None):
    """The encoder with its attention mask built by RESHAPE/MUL (no STRIDED_SLICE)."""
    length = token_ids.shape[1]
    x = emit(layer.embedding, token_ids, position_ids=position_ids, language_ids=language_ids,
             segment_ids=segment_ids, training=False)
    real = tf.cast(tf.not_equal(tf.cast(token_ids, tf.int32), layer.pad_id), tf.float32)
    keys = tf.reshape(real, [-1, 1, length])
    try:
        allowed, _ = static_structure(length, segment_ids, attention_mask, use_causal_mask)
        merged = keys * tf.constant(allowed.astype(np.float32))[None]
    except ValueError:  # runtime segments or attention mask: the layer's own (CPU-friendly) ops
        from keras_posenc.layers.encoder_layer import merge_attention_masks
        merged = tf.cast(merge_attention_masks(length, mask=tf.cast(real, tf.bool),
                                               attention_mask=attention_mask,
                                               use_causal_mask=use_causal_mask,
                                               segment_ids=segment_ids), tf.float32)
    merged = tf.broadcast_to(merged, [tf.shape(real)[0], length, length])
    for encoder_layer in layer.encoder_layers:
        x = emit(encoder_layer, x, mask=None, attention_mask=merged, training=False)
    if layer.final_norm is not None:
        x = layer.final_norm(x)
    return x



@emits(TARGETS, CausalLM)
def _causal_lm(layer, inputs, position_ids=None, language_ids=None, training=None):
    """The language model on every target: its encoder's formulation, then the head."""
    if isinstance(inputs, dict):
        position_ids = inputs.get("position_ids", position_ids)
        language_ids = inputs.get("language_ids", language_ids)
        inputs = inputs["token_ids"]
    x = emit(layer.encoder, inputs, position_ids=position_ids, language_ids=language_ids,
             use_causal_mask=layer.causal, training=False)
    return tf.cast(layer.head(x), tf.float32)
