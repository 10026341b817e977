"""The `cpu` and `tensorrt` formulations: plain lookups, the cheapest graph for XNNPACK and TensorRT.

Each function is `(context, layer, inputs, **call_arguments)` (`keras_posenc.export.formulation`);
`causal_lm` is the language model on every target (its encoder's formulation, then the head).
Position rows are GATHERed; the token table is an EMBEDDING_LOOKUP on `cpu` (`embedding_lookup`:
the lookup LiteRT Quantizer quantizes, GATHER it leaves float32) and a GATHER on `tensorrt`
(`embedding`).
"""

import math

import numpy as np
import tensorflow as tf

from keras_posenc.export.constants import exclusive_count_matrix, static_structure
from keras_posenc.layers.encoder_layer import merge_attention_masks
from keras_posenc.positions import position_ids as derive_position_ids

__all__ = ["causal_lm", "embedding", "embedding_lookup", "encoder", "position"]


def _positions_int(mask, position_ids, segment_ids, length):
    """int32 position ids [B, T] (0 at padding) for the integer-input targets."""
    if position_ids is not None:
        return tf.broadcast_to(tf.cast(position_ids, tf.int32), tf.shape(mask))
    real = tf.cast(mask, tf.float32)
    if segment_ids is not None:
        try:
            _, runs = static_structure(length, segment_ids=segment_ids)
        except ValueError:
            return derive_position_ids(mask, segment_ids=segment_ids)
        ids = tf.reshape(tf.matmul(tf.reshape(real, [-1, length]), exclusive_count_matrix(runs)),
                         [-1, length])
        return tf.cast(ids * real, tf.int32)
    return tf.cast((tf.cumsum(real, axis=1) - real) * real, tf.int32)


def position(context, layer, inputs, position_ids=None, language_ids=None, mask=None, training=None,
             segment_ids=None):
    constants = context.frozen(layer)
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


def _embed(context, layer, token_ids, position_ids, language_ids, segment_ids, lookup):
    token_ids = tf.cast(token_ids, tf.int32)
    mask = tf.not_equal(token_ids, layer.pad_id)
    x = context.host_rows  # embedding="host": table[ids] fed, sqrt(d_model) in
    if x is None:
        x = lookup(token_ids)
        if layer.scale_embeddings:
            x = x * math.sqrt(layer.d_model)
    return context.emit(layer.position_embedding, x, position_ids=position_ids, language_ids=language_ids,
                        mask=mask, segment_ids=segment_ids, training=False)


def embedding(context, layer, token_ids, position_ids=None, language_ids=None, segment_ids=None,
              training=None):
    table = layer.token_embedding.embeddings
    return _embed(context, layer, token_ids, position_ids, language_ids, segment_ids,
                  lambda ids: tf.gather(table, ids))


def embedding_lookup(context, layer, token_ids, position_ids=None, language_ids=None, segment_ids=None,
                     training=None):
    """`embedding` with the token rows looked up by TFLite's EMBEDDING_LOOKUP.

    The lookup is a function that implements TensorFlow's "embedding_matmul" composite, which the
    TFLite converter replaces by one EMBEDDING_LOOKUP of the constant table (its body, a one-hot
    product, is what TensorFlow itself would run).
    """
    table = layer.token_embedding.embeddings
    width = layer.d_model

    def lookup(ids):
        rows = _embedding_matmul(tf.convert_to_tensor(table), tf.reshape(ids, [-1]))
        return tf.reshape(rows, tf.concat([tf.shape(ids), [width]], 0))

    return _embed(context, layer, token_ids, position_ids, language_ids, segment_ids, lookup)


@tf.function(experimental_implements="embedding_matmul", autograph=False)
def _embedding_matmul(table, ids):
    # The converter matches this body (a static range, EXPAND_DIMS, EQUAL, CAST, MATMUL); other
    # spellings of the same one-hot product are left as they are.
    one_hot = tf.cast(tf.equal(tf.expand_dims(ids, 1), tf.range(0, table.shape[0], 1)), tf.float32)
    return tf.matmul(one_hot, table)


def encoder(context, layer, token_ids, position_ids=None, language_ids=None, segment_ids=None,
            attention_mask=None, use_causal_mask=False, training=None):
    """The encoder with its attention mask built by RESHAPE/MUL (no STRIDED_SLICE)."""
    length = token_ids.shape[1]
    x = context.emit(layer.embedding, token_ids, position_ids=position_ids, language_ids=language_ids,
                     segment_ids=segment_ids, training=False)
    real = tf.cast(tf.not_equal(tf.cast(token_ids, tf.int32), layer.pad_id), tf.float32)
    keys = tf.reshape(real, [-1, 1, length])
    try:
        allowed, _ = static_structure(length, segment_ids, attention_mask, use_causal_mask)
        merged = keys * tf.constant(allowed.astype(np.float32))[None]
    except ValueError:  # runtime segments or attention mask: the layer's own (CPU-friendly) ops
        merged = tf.cast(merge_attention_masks(length, mask=tf.cast(real, tf.bool),
                                               attention_mask=attention_mask,
                                               use_causal_mask=use_causal_mask,
                                               segment_ids=segment_ids), tf.float32)
    merged = tf.broadcast_to(merged, [tf.shape(real)[0], length, length])
    for encoder_layer in layer.encoder_layers:
        x = context.emit(encoder_layer, x, mask=None, attention_mask=merged, training=False)
    if layer.final_norm is not None:
        x = layer.final_norm(x)
    return x


def causal_lm(context, layer, inputs, position_ids=None, language_ids=None, training=None):
    """The language model on every target: its encoder's formulation, then the head."""
    if isinstance(inputs, dict):
        position_ids = inputs.get("position_ids", position_ids)
        language_ids = inputs.get("language_ids", language_ids)
        inputs = inputs["token_ids"]
    x = context.emit(layer.encoder, inputs, position_ids=position_ids, language_ids=language_ids,
                     use_causal_mask=layer.causal, training=False)
    return tf.cast(layer.head(x), tf.float32)
