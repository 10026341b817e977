"""The `gl` formulations: every op with a shader in the GPU delegate's OpenGL ES backend.

The OpenGL ES backend (the one a Jetson without OpenCL runs) has no TRANSPOSE, BATCH_MATMUL,
CUMSUM, EQUAL, CAST or SPLIT shader; these formulations build every layer from the shader
building blocks of `keras_posenc.export.shader_ops` (one-hot lookups by constant weights,
LayerNorm by a constant `[D, D]` average, attention per head by CONCATENATION, 1x1 CONV_2D,
SOFTMAX over channels and AVERAGE_POOL_2D). The `gpu` target uses `position` and `embedding`
as they are (`keras_posenc.export.formulations`).

Batch 1 only (what the GL delegate runs); position ids and attention masks must be constant in
the traced graph (segment ids may be a runtime input).
"""

import numpy as np
import tensorflow as tf

from keras_posenc.export import shader_ops
from keras_posenc.export.constants import static_structure

__all__ = ["embedding", "encoder", "encoder_layer", "position"]


def position(context, layer, inputs, position_ids=None, language_ids=None, mask=None, training=None,
             segment_ids=None):
    real = None if mask is None else tf.reshape(tf.cast(mask, tf.float32), [-1, inputs.shape[1]])
    return shader_ops.position_rows(layer, inputs, real, position_ids, language_ids, segment_ids,
                                    frozen=context.frozen)


def embedding(context, layer, token_ids, position_ids=None, language_ids=None, segment_ids=None,
              training=None):
    return shader_ops.embed(layer, token_ids, position_ids, language_ids, segment_ids, rows=context.host_rows,
                            frozen=context.frozen)[0]


def encoder_layer(context, layer, x, mask=None, attention_mask=None, use_causal_mask=False, training=None):
    """`attention_mask` here is the additive bias `[1, T, 1, T]` that the gl Encoder builds."""
    shader_ops.check_batch(x)
    length = x.shape[1]
    if attention_mask is None or attention_mask.shape.rank != 4:
        allowed, _ = static_structure(length, attention_mask=attention_mask, use_causal_mask=use_causal_mask)
        if mask is not None:
            bias = shader_ops.key_bias(tf.reshape(tf.cast(mask, tf.float32), [1, length]), allowed)
        else:
            bias = shader_ops.pair_constant(np.where(allowed, 0.0, shader_ops.MASKED))
    else:
        bias = attention_mask
    return shader_ops.gl_encoder_layer(layer, x, bias)


def encoder(context, layer, token_ids, position_ids=None, language_ids=None, segment_ids=None,
            attention_mask=None, use_causal_mask=False, training=None):
    shader_ops.check_batch(token_ids)
    allowed, runtime_segments = shader_ops.encoder_structure(layer, token_ids, position_ids, segment_ids,
                                                             attention_mask, use_causal_mask)
    x, real = shader_ops.embed(layer.embedding, token_ids, position_ids, language_ids, segment_ids,
                               rows=context.host_rows, frozen=context.frozen)
    same_segment = shader_ops.same_segment(segment_ids) if runtime_segments else None
    bias = shader_ops.key_bias(real, allowed, same_segment)
    for block in layer.encoder_layers:
        x = shader_ops.gl_encoder_layer(block, x, bias)
    if layer.final_norm is not None:
        x = shader_ops.layer_norm(x, layer.final_norm)
    return x
