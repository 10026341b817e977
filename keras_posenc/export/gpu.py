"""The `gpu` formulations of the encoder: ops the LiteRT GPU accelerator runs and GL does not.

The LiteRT GPU accelerator (WebGPU, and the OpenCL delegate, which share the GPU delegate's
parser) runs BATCH_MATMUL, TRANSPOSE, MEAN and ADD/MUL/SUB that broadcast, at batch 1 and above
(tested by running them, `make test-edge`); the OpenGL ES backend has no shader for any of them
("No shader implementation for batched_matmul"). So `gpu` keeps the lookups of `gl` (one-hot
products by constant weights, exact ids above 2048, `embedding="host"`) and replaces the rest:

- attention: the projections of all heads in one 1x1 CONV_2D each, heads moved to the batch
  axis by TRANSPOSE, scores `q @ k^T` and the weighted values `weights @ v` by BATCH_MATMUL:
  `T * T * head_dim` multiply-adds per head for each product, and no `[T, T, head_dim]` tensor;
- LayerNorm: MEAN over the features (the `gl` file multiplies by a constant `[D, D]` matrix,
  `D * D` multiply-adds per token and per norm);
- the attention bias `[B, 1, T, T]`: the runtime key row times the constant `[T, T]` structure,
  a broadcasting MUL (`gl` repeats the row by CONCATENATION), shared by all heads.

float16 safety is that of `gl`: masked scores get -1e4, LayerNorm squares values scaled by 1/8,
the 1 / sqrt(head_dim) of the scores is folded into the query projection.
"""

import numpy as np
import tensorflow as tf

from keras_posenc.export.constants import static_structure
from keras_posenc.export.shader_ops import (
    LAYER_NORM_SCALE,
    MASKED,
    alibi_constants,
    attention_projections,
    complement,
    dense,
    embed,
    encoder_structure,
    linear,
    rotate,
    rotation_constants,
)
from keras_posenc.layers.encoder_layer import residual_block

__all__ = ["encoder", "encoder_layer", "layer_norm"]


def layer_norm(x, norm):
    """LayerNormalization over the last axis of `x` `[B, T, D]` with `norm`'s weights, by MEAN.

    The centered values are scaled by 1/8 before squaring (float16 squares overflow above 255),
    and `c * (v + eps)^-1/2 = (c / 8) * (v / 64 + eps / 64)^-1/2` exactly.
    """
    centered = (x - tf.reduce_mean(x, axis=-1, keepdims=True)) * LAYER_NORM_SCALE
    variance = tf.reduce_mean(centered * centered, axis=-1, keepdims=True)
    y = centered * tf.math.rsqrt(variance + norm.epsilon * LAYER_NORM_SCALE ** 2)
    if norm.scale:
        y = y * norm.gamma
    if norm.center:
        y = y + norm.beta
    return y


def _split_heads(x, pair, heads, head_dim, scale=1.0):
    """`x` `[B, T, D]` projected by `(kernel [D, heads, head_dim], bias)` -> `[B, heads, T, head_dim]`."""
    batch, length, depth = x.shape
    kernel, bias = pair
    y = linear(x, tf.reshape(kernel, [depth, heads * head_dim]) * scale,
               tf.reshape(bias, [heads * head_dim]) * scale)
    return tf.transpose(tf.reshape(y, [batch, length, heads, head_dim]), [0, 2, 1, 3])


def _attention(layer, x, bias):
    """Multi-head self-attention of `x` `[B, T, D]` with an additive `bias` `[B, 1, T, T]`."""
    batch, length, depth = x.shape
    projections = attention_projections(layer.attention, depth)
    heads, head_dim = projections.heads, projections.head_dim
    q = _split_heads(x, projections.query, heads, head_dim, 1.0 / np.sqrt(float(head_dim)))
    k = _split_heads(x, projections.key, heads, head_dim)
    v = _split_heads(x, projections.value, heads, head_dim)
    rotation = rotation_constants(layer.attention, length)  # RoPE: constants of positions 0..T-1
    if rotation is not None:
        cos, sin, turn = tf.constant(rotation[0]), tf.constant(rotation[1]), rotation[2]
        q, k = rotate(q, cos, sin, turn), rotate(k, cos, sin, turn)
    scores = tf.matmul(q, k, transpose_b=True) + bias  # [B, heads, T, T]
    alibi = alibi_constants(layer.attention, length)
    if alibi is not None:
        scores = scores + tf.constant(alibi[None])
    weights = tf.nn.softmax(scores, axis=-1)
    merged = tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3])  # [B, T, heads, head_dim]
    return linear(tf.reshape(merged, [batch, length, heads * head_dim]), *projections.output)


def _encoder_layer_rows(layer, x, bias):
    def norm(which):
        return lambda h: layer_norm(h, which)

    x = residual_block(x, lambda h: _attention(layer, h, bias), norm(layer.attention_norm), layer.norm_first)
    return residual_block(x, lambda h: dense(layer.ffn_output, dense(layer.ffn_hidden, h)),
                          norm(layer.ffn_norm), layer.norm_first)


def _key_bias(real, allowed, segment_ids=None):
    """Additive bias `[B, 1, T, T]`: 0 where `allowed[q, k]`, key k is real (and, with runtime
    `segment_ids` `[B, T]`, q and k share a segment), else -1e4 (finite in float16).

    Constants `[T, T]` only; `keep` is exactly 0 or 1.
    """
    length = real.shape[-1]
    keep = tf.reshape(real, [-1, 1, 1, length]) * tf.constant(np.asarray(allowed, np.float32))
    if segment_ids is not None:  # ids compared as floats: exact below 2048, also in float16
        segments = tf.cast(segment_ids, tf.float32)
        queries, keys = tf.reshape(segments, [-1, 1, length, 1]), tf.reshape(segments, [-1, 1, 1, length])
        keep = keep * complement(tf.abs(queries - keys))
    return keep * -MASKED + MASKED


def encoder_layer(context, layer, x, mask=None, attention_mask=None, use_causal_mask=False, training=None):
    """`attention_mask` here is the additive bias `[B, 1, T, T]` that the gpu Encoder builds."""
    length = x.shape[1]
    if attention_mask is None or attention_mask.shape.rank != 4:
        allowed, _ = static_structure(length, attention_mask=attention_mask, use_causal_mask=use_causal_mask)
        real = tf.ones([x.shape[0], length]) if mask is None else tf.cast(mask, tf.float32)
        bias = _key_bias(real, allowed)
    else:
        bias = attention_mask
    return _encoder_layer_rows(layer, x, bias)


def encoder(context, layer, token_ids, position_ids=None, language_ids=None, segment_ids=None,
            attention_mask=None, use_causal_mask=False, training=None):
    allowed, runtime_segments = encoder_structure(layer, token_ids, position_ids, segment_ids, attention_mask,
                                                  use_causal_mask)
    x, real = embed(layer.embedding, token_ids, position_ids, language_ids, segment_ids,
                    rows=context.host_rows, frozen=context.frozen)
    bias = _key_bias(real, allowed, segment_ids if runtime_segments else None)
    for block in layer.encoder_layers:
        x = _encoder_layer_rows(block, x, bias)
    if layer.final_norm is not None:
        x = layer_norm(x, layer.final_norm)
    return x
