"""Per-target formulations of the keras_posenc layers, keyed by layer class.

Each export target needs the same numbers from a different set of ops:

- `cpu` and `tensorrt`: plain lookups (`GATHER`), the cheapest graph for XNNPACK and TensorRT;
- `gpu` (LiteRT GPU accelerator, OpenCL delegate) and `gl` (the classic delegate's OpenGL ES
  backend): only ops with a GPU shader, see `keras_posenc.export.gl` (`gpu` adds one CAST of
  the int32 inputs);

The formulations live here, in the export package, and not as methods of the layers: the layer
modules belong to the training-time API and stay free of export concerns, and a registry keyed by
layer class (`EMITTERS[target][LayerClass]`) lets a new layer (RoPE, ALiBi) add its own entries
without touching the exporter. `install` binds the formulation of each layer of a throw-away
clone as that instance's `call` (the class is never changed); the formulations read every position
table and language scale as numpy constants (`Frozen`, taken after the trained weights are copied).
"""

import functools
import inspect
import math

import numpy as np
import tensorflow as tf

from keras_posenc.layers.encoder import Encoder
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding

__all__ = ["EMITTERS", "TARGETS", "Frozen", "emits", "install", "static_structure"]

TARGETS = ("gpu", "gl", "cpu", "tensorrt")
EMITTERS = {target: {} for target in TARGETS}


def emits(targets, layer_class):
    """Registers the decorated function as the formulation of `layer_class` for `targets`."""
    def register(function):
        for target in targets:
            EMITTERS[target][layer_class] = function
        return function
    return register


def emitter_for(layer, target):
    for cls in type(layer).__mro__:
        if cls in EMITTERS[target]:
            return EMITTERS[target][cls]
    return None


def frozen(layer):
    """The layer's `Frozen` constants (set by the exporter after the weights are copied)."""
    if getattr(layer, "_export_frozen", None) is None:
        with tf.init_scope():  # eager, also while a graph is being traced
            layer._export_frozen = Frozen(layer)
    return layer._export_frozen


class Frozen:
    """The constants of one position layer, read once from its trained weights (float64 -> float32)."""

    def __init__(self, layer):
        self.table = np.asarray(layer._table_prefix(layer.max_length), np.float32)
        self.scales = (np.asarray(layer.language_scale.numpy(), np.float32)
                       if layer.num_languages is not None else None)


def install(target, layers):
    """Binds the `target` formulation as the `call` of every known layer among `layers`."""
    for layer in layers:
        emitter = emitter_for(layer, target)
        if emitter is None:
            continue
        # Plain Python: autograph would convert the emitters, which have no data-dependent control flow.
        bound = functools.partial(emitter, layer)
        _bind_call(layer, tf.autograph.experimental.do_not_convert(bound), inspect.signature(bound))


def _bind_call(layer, call, signature):
    """Sets `layer.call`; Keras 3 binds `__call__` arguments to the signature read at `__init__`."""
    layer.call = call
    if hasattr(layer, "_call_signature"):  # Keras 3
        layer._call_signature = signature
        layer.call_signature_parameters = list(layer._call_signature.parameters)
        layer._call_has_training_arg = "training" in layer.call_signature_parameters
        layer._call_has_mask_arg = "mask" in layer.call_signature_parameters
        layer._call_has_context_arg = {name: name in layer.call_signature_parameters
                                       for name in layer._call_context_args}


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
    x = getattr(layer, "_export_embeddings", None)  # embedding="host": table[ids] fed, sqrt(d_model) in
    if x is None:
        x = lookup(token_ids)
        if layer.scale_embeddings:
            x = x * math.sqrt(layer.d_model)
    return layer.position_embedding(x, position_ids=position_ids, language_ids=language_ids, mask=mask,
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
    x = layer.embedding(token_ids, position_ids=position_ids, language_ids=language_ids,
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
        x = encoder_layer(x, mask=None, attention_mask=merged, training=False)
    if layer.final_norm is not None:
        x = layer.final_norm(x)
    return x

