"""A translator's `encode` and `decode` on the GPU (`--target gpu` and `gl`): shader-only graphs.

The target's formulations (`keras_posenc.export.formulations`: `gpu`'s or `gl`'s) run the
encoder; the decode step is built from the blocks of `keras_posenc.export.gl_generate` (no
GATHER, no DYNAMIC_UPDATE_SLICE; `gpu`'s int32 inputs cast once, `gl`'s float32 inputs as they
are):

- the self-attention cache is written by `gl_generate`'s one-hot blend and attended to at slots
  `0 .. position` (`_cached_attention`, the `--generate` files' decode step);
- the cross-attention's one query attends to the `S` source keys by `gl_generate.attend`, the
  source's padding masked by the `source_mask` input (`(mask - 1) * 1e4`, finite in float16);
- the target token's row is a one-hot product (two digits above 2048, exact in float16 from int32
  and from float ids: `shader_ops.token_one_hot`).

Each decoder layer is `DecoderLayer`'s three residual blocks (`residual_block`), in its order.
"""

import tensorflow as tf

from keras_posenc.export import gl_generate
from keras_posenc.export import shader_ops as ops
from keras_posenc.layers.encoder_layer import ATTENTION_POSITIONS, residual_block
from keras_posenc.seq2seq import SOURCE_LANGUAGE, TARGET_LANGUAGE

__all__ = ["decode_graph", "encode_graph"]


class _SelfAttention:
    """What `gl_generate`'s cached attention reads of a layer: its attention and ALiBi slopes."""

    def __init__(self, layer):
        self.attention = layer.self_attention
        self.slopes = layer.self_attention.slopes


def _languages(model, ids, language):
    return tf.fill(ids.shape, float(language)) if model.language_scale else None


def _projected(weights_pair, x, width):
    kernel, bias = weights_pair
    return ops.linear(x, tf.reshape(kernel, [-1, width]), tf.reshape(bias, [width]))


def encode_graph(model, context, source_ids):
    """`(pairs, source_mask)`: each decoder layer's cross `(keys, values)` `[1, S, heads, head_dim]` and
    the float mask `[1, S]` of the right-padded `source_ids` `[1, S]` (int32)."""
    length = source_ids.shape[1]
    languages = _languages(model, source_ids, SOURCE_LANGUAGE)
    outputs = context.emit(model.encoder, source_ids, language_ids=languages)
    pairs = []
    for layer in model.decoder_layers:
        weights = ops.attention_projections(layer.cross_attention, model.d_model)
        width = weights.heads * weights.head_dim
        shape = [1, length, weights.heads, weights.head_dim]
        pairs.append(tuple(tf.reshape(_projected(pair, outputs, width), shape)
                           for pair in (weights.key, weights.value)))
    return pairs, ops.real_tokens(source_ids, model.pad_id)


def _cross_attention(layer, x, keys, values, bias):
    weights = ops.attention_projections(layer.cross_attention, x.shape[-1])
    width = weights.heads * weights.head_dim
    flat = [tf.reshape(t, [1, t.shape[1], width]) for t in (keys, values)]
    return gl_generate.attend(weights, _projected(weights.query, x, width), flat[0], flat[1], bias)


def _decoder_block(model, layer, x, positions, slot_rows, key_cache, value_cache, cross_attend):
    """One `DecoderLayer`: cached self-attention, cross-attention, feed-forward, each a residual block."""
    caches = []

    def self_attend(h):
        attended, key, value = gl_generate.cached_attention(_SelfAttention(layer), h, positions, slot_rows,
                                                            key_cache, value_cache)
        caches.extend((key, value))
        return attended

    def norm(weights):
        return lambda h: ops.layer_norm(h, weights)

    x = residual_block(x, self_attend, norm(layer.self_attention_norm), model.norm_first)
    x = residual_block(x, cross_attend, norm(layer.cross_attention_norm), model.norm_first)
    x = residual_block(x, lambda h: ops.dense(layer.ffn_output, ops.dense(layer.ffn_hidden, h)),
                       norm(layer.ffn_norm), model.norm_first)
    return (x, *caches)


def decode_graph(model, context, token_id, position, key_caches, value_caches, cross_pairs, source_mask):
    """`(logits [1, V], keys, values)` of one target token at slot `position` (`[1]` int32).

    Args:
        model: the float32 `Seq2SeqTransformer` clone.
        context: the `gpu` `ExportContext` (inside its `tracing()`).
        token_id: `[1, 1]` int32.
        key_caches, value_caches: per decoder layer, `[1, C, heads, head_dim]` float32.
        cross_pairs: per decoder layer, `(keys, values)` of `encode_graph`.
        source_mask: `[1, S]` float, 1 at real source tokens.
    """
    cache_length = key_caches[0].shape[1]
    positions = tf.reshape(gl_generate.as_float(position), [1, 1, 1])
    slot_rows = ops.one_hot(positions, cache_length)
    additive = model.position not in ATTENTION_POSITIONS
    x = context.emit(model.target_embedding, token_id,
                     position_ids=tf.reshape(positions, [1, 1]) if additive else None,
                     language_ids=_languages(model, token_id, TARGET_LANGUAGE))
    bias = gl_generate.masking_bias(tf.reshape(source_mask, [1, 1, source_mask.shape[-1]]))
    keys, values = [], []
    for layer, key_cache, value_cache, (cross_keys, cross_values) in zip(
            model.decoder_layers, key_caches, value_caches, cross_pairs):
        x, key, value = _decoder_block(model, layer, x, positions, slot_rows, key_cache, value_cache,
                                       lambda h, layer=layer, k=cross_keys, v=cross_values:
                                       _cross_attention(layer, h, k, v, bias))
        keys.append(key)
        values.append(value)
    if model.decoder_norm is not None:
        x = ops.layer_norm(x, model.decoder_norm)
    if model.head is not None:
        logits = ops.dense(model.head, x)
    else:
        logits = ops.linear(x, tf.transpose(model.target_embedding.token_embedding.embeddings))
    return tf.reshape(logits, [1, -1]), keys, values
