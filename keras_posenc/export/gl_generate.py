"""Prefill and decode of a `CausalLM` in the `gl` formulation: the `gpu`/`gl` generation targets.

The graphs of `keras_posenc.export.generator` for the GPU runtimes, built from the shader-only
ops of `keras_posenc.export.shader_ops` (1x1 CONV_2D with constant weights, CONCATENATION, RESHAPE, PAD,
MUL, ADD, SUB, ABS, RELU, MINIMUM, POW, SOFTMAX over channels, AVERAGE_POOL_2D; `gpu` adds one
CAST per int32 input, and with `embedding="graph"` and ids above 2048 the FLOOR_DIV digit split
of `shader_ops.token_one_hot`): no GATHER, no broadcasting MUL, constants finite in float16. The
attention weights are read through `shader_ops.attention_projections` only.

- Cached steps (`decode_graph`: one token; `chunk_graph`: `T` tokens at slots `first ..
  first + T - 1`, LiteRT-LM's prefill of a chunk at an offset) are one function of the `T`
  positions: the slot `p` of each token (prompts are right-padded, so slot and position agree)
  arrives as a float. Table lookups by offset (position tables, RoPE cos/sin) are its one-hot
  row `relu(1 - |p - classes|)` times the table.
- The cache write is a one-hot blend `cache * (1 - written) + sum_t new_t * onehot(p_t)`: every
  other slot is kept bit for bit (x * 1 + 0). Over `T > 1` tokens the sum is an AVERAGE_POOL_2D
  over the chunk of the rows scaled by `T`.
- Cached attention, per head: each query repeated over the `C` slots by CONCATENATION, times the
  cached keys (the chunk's own written first), summed over the head's features by a 1x1
  CONV_2D, reshaped to keys-in-channels for SOFTMAX; the mask of query `t` is
  `min(relu(p_t - slot + 1), 1)` (slots `0 .. p_t`: the cache before the chunk and the chunk
  causally), as the finite bias `(keep - 1) * 1e4`; ALiBi adds `-slope * (p_t - slot)`. The
  weighted sum of the cached values is an AVERAGE_POOL_2D over each query's `C` slots times `C`.
  The ops do not grow with `T` but for the CONCATENATIONs repeating the cache per query (by
  doubling: log2 T); the attention's tensors are `[1, T * C, heads * head_dim]`.
- RoPE rotates each key once, when it is written (keys are cached rotated).
- `prefill_graph` (the `--generate` files' prefill, always from slot 0) is the fixed-window
  causal `gl` attention over the `P` prompt slots; its keys and values fill slots `0 .. P-1` of
  the returned cache (PAD with zeros after them).

Token ids: with `embedding="host"` the file takes the rows `table[ids]` as a float input
`embeddings` (`[1, P, d_model]`, `[1, 1, d_model]`), which the runner looks up; with "graph" a
one-hot product (two digits above 2048, `shader_ops.token_one_hot`).

Positions are compared and looked up as floats, exact up to 2048 in float16: the cache length
is at most 2048 on these targets.
"""

import math

import numpy as np
import tensorflow as tf

from keras_posenc.export import shader_ops as ops
from keras_posenc.layers.encoder_layer import ATTENTION_POSITIONS, residual_block

__all__ = ["MAX_CACHE_LENGTH", "as_float", "attend", "cached_attention", "chunk_graph", "decode_graph",
           "masking_bias", "prefill_graph"]

MAX_CACHE_LENGTH = ops.FLOAT16_INTEGERS  # positions and slots are floats on the GPU


def _embedded(model, token_ids, positions, rows):
    """`[1, T, d_model]`: token rows (given or looked up) plus the additive position rows."""
    encoder = model.encoder
    layer = encoder.embedding
    length = token_ids.shape[1]
    if rows is None:
        table = layer.token_embedding.embeddings
        if layer.scale_embeddings:
            table = table * math.sqrt(layer.d_model)
        one_hot = ops.token_one_hot(token_ids, layer.vocab_size)
        if one_hot.shape[-1] > layer.vocab_size:  # digit rows past the vocab select nothing
            table = tf.concat([table, tf.zeros([one_hot.shape[-1] - layer.vocab_size, layer.d_model])], 0)
        rows = ops.linear(one_hot, table)
    x = tf.reshape(rows, [1, length, layer.d_model])
    if encoder.position in ATTENTION_POSITIONS:
        return x
    return ops.position_rows(layer.position_embedding, x, None, positions)


def _rotation(layer, cache_length, heads):
    """RoPE over all heads at once: cos, sin `[C, heads * head_dim]` and the block-diagonal turn."""
    rotation = ops.rotation_constants(layer.attention, cache_length)
    if rotation is None:
        return None
    cos, sin, turn = rotation
    return np.tile(cos, [1, heads]), np.tile(sin, [1, heads]), np.kron(np.eye(heads, dtype=np.float32), turn)


def cached_attention(layer, x, positions, slot_rows, key_cache, value_cache):
    """`T` queries at slots `positions` against the cache; returns `(output, key_cache, value_cache)`.

    The chunk's keys and values are written first (slot `positions[t]` takes token `t`'s), then
    query `t` attends to every slot `c <= positions[t]`: the cache before the chunk and the chunk
    causally. `x` `[1, T, D]`; `positions` `[1, T, 1]` float; `slot_rows` `[1, T, C]` their one-hot
    rows (a zero row past the cache writes nothing); the caches `[1, C, heads, head_dim]`. Pairs
    (query, slot) are rows `t * C + c` of `[1, T * C, width]` tensors. With `T = 1` the helpers
    below add no op: one decode step.
    """
    weights = ops.attention_projections(layer.attention, x.shape[-1])
    heads, head_dim = weights.heads, weights.head_dim
    projections = (weights.query, weights.key, weights.value)
    width = heads * head_dim
    length, cache_length = x.shape[1], key_cache.shape[1]
    query, key, value = (ops.linear(x, tf.reshape(kernel, [-1, width]), tf.reshape(bias, [width]))
                         for kernel, bias in projections)
    rotation = _rotation(layer, cache_length, heads)
    if rotation is not None:
        cos, sin = ops.linear(slot_rows, rotation[0]), ops.linear(slot_rows, rotation[1])  # [1, T, width]
        query, key = ops.rotate(query, cos, sin, rotation[2]), ops.rotate(key, cos, sin, rotation[2])
    # The one-hot blend: a written slot takes its token's key and value, every other keeps its own
    # bit for bit. `write` is T (not 1) at (t, slot_t): the mean over the chunk is then the sum.
    write = tf.reshape(ops.linear(tf.reshape(slot_rows, [1, length * cache_length, 1]),
                                  np.full([1, width], float(length), np.float32)),
                       [1, length * cache_length, width])
    keep = 1.0 - _chunk_mean(write, length)
    keys = (tf.reshape(key_cache, [1, cache_length, width]) * keep
            + _chunk_mean(_repeat_rows(key, cache_length) * write, length))
    values = (tf.reshape(value_cache, [1, cache_length, width]) * keep
              + _chunk_mean(_repeat_rows(value, cache_length) * write, length))
    # Slots 0 .. position: keep = min(relu(position - slot + 1), 1), exact for integer floats.
    slots = np.arange(cache_length, dtype=np.float32)
    spread = ops.linear(positions, np.ones([1, cache_length], np.float32))  # [1, T, C]: position per slot
    allowed = tf.minimum(tf.nn.relu(spread - (slots - 1.0)), 1.0)
    bias = masking_bias(allowed)
    distance = (tf.reshape(spread - slots, [1, length, 1, cache_length]) if layer.slopes is not None
                else None)
    attended = attend(weights, query, keys, values, bias, distance, layer.slopes)
    shape = [1, cache_length, heads, head_dim]
    return attended, tf.reshape(keys, shape), tf.reshape(values, shape)


def masking_bias(allowed):
    """`[1, T, 1, C]` scores added for `allowed` `[1, T, C]` (1: attends, 0: masked), finite in float16."""
    length, keys = allowed.shape[1], allowed.shape[-1]
    return tf.reshape(allowed * -ops.MASKED + ops.MASKED, [1, length, 1, keys])


def attend(weights, query, keys, values, bias, distance=None, slopes=None):
    """Multi-head attention of `T` queries over `C` keys and values, projected out by `weights.output`.

    Args:
        weights: the attention's `shader_ops.Projections`.
        query: `[1, T, heads * head_dim]`, unscaled.
        keys, values: `[1, C, heads * head_dim]`.
        bias: `[1, T, 1, C]`, the scores added (`masking_bias`).
        distance: optional `[1, T, 1, C]`, `position_t - slot_c` for ALiBi's `-slope * distance`.
        slopes: the ALiBi slopes per head (with `distance`).

    Pairs (query, key) are rows `t * C + c` of `[1, T * C, width]` tensors: each query repeated
    over the keys by CONCATENATION, times the keys, summed over each head's features by a 1x1
    CONV_2D, keys-in-channels for SOFTMAX; the weighted sum of the values is an AVERAGE_POOL_2D
    over each query's `C` keys times `C`. With `T = 1` the repeats add no op.
    """
    heads, head_dim = weights.heads, weights.head_dim
    width = heads * head_dim
    length, cache_length = query.shape[1], keys.shape[1]
    products = _repeat_rows(query, cache_length) * _per_query(keys, length)  # [1, T * C, width]
    scale = 1.0 / math.sqrt(float(head_dim))
    spread_weights = None
    for head in range(heads):
        column = np.zeros([width, 1], np.float32)
        column[head * head_dim:(head + 1) * head_dim] = scale
        scores = tf.reshape(ops.linear(products, column), [1, length, 1, cache_length]) + bias
        if distance is not None:
            scores = scores + distance * float(-slopes[head])
        head_weights = tf.reshape(tf.nn.softmax(scores, axis=-1), [1, length * cache_length, 1])
        block = np.zeros([1, width], np.float32)
        block[0, head * head_dim:(head + 1) * head_dim] = 1.0
        spread_head = ops.linear(head_weights, block)  # the head's weights over its features, 0 elsewhere
        spread_weights = spread_head if spread_weights is None else spread_weights + spread_head
    weighted = tf.reshape(spread_weights * _per_query(values, length),
                          [1, length * cache_length, 1, width])
    # Each query's window of C keys (one query: stride 1, the decode's).
    stride = cache_length if length > 1 else 1
    summed = tf.nn.avg_pool2d(weighted, ksize=[cache_length, 1], strides=[stride, 1],
                              padding="VALID") * float(cache_length)
    kernel, bias_out = weights.output
    return ops.linear(tf.reshape(summed, [1, length, width]), tf.reshape(kernel, [width, -1]), bias_out)


def _repeat_rows(x, copies):
    """`[1, T, n]` -> `[1, T * copies, n]`, each row `copies` times in a row (CONCATENATION)."""
    length, width = x.shape[1], x.shape[-1]
    if length == 1:
        return ops.broadcast_rows(x, copies, 1)
    repeated = ops.broadcast_rows(tf.reshape(x, [1, length, 1, width]), copies, 2)
    return tf.reshape(repeated, [1, length * copies, width])


def _per_query(x, length):
    """`[1, C, n]` -> `[1, T * C, n]`: the cache once per query (CONCATENATION; none for one query)."""
    return x if length == 1 else ops.broadcast_rows(x, length, 1)


def _chunk_mean(x, length):
    """`[1, T * C, n]` -> `[1, C, n]`: the mean over the `T` queries of each slot (AVERAGE_POOL_2D)."""
    if length == 1:
        return x
    cache_length, width = x.shape[1] // length, x.shape[-1]
    pooled = tf.nn.avg_pool2d(tf.reshape(x, [1, length, cache_length, width]), ksize=[length, 1], strides=1,
                              padding="VALID")
    return tf.reshape(pooled, [1, cache_length, width])


def _prefill_attention(layer, x, cache_length):
    """Causal attention over the `P` prompt slots; the keys and values padded to `C` slots."""
    length = x.shape[1]
    weights = ops.attention_projections(layer.attention, x.shape[-1])
    heads, head_dim, output = weights.heads, weights.head_dim, weights.output
    projections = (weights.query, weights.key, weights.value)
    width = heads * head_dim
    query, key, value = (ops.linear(x, tf.reshape(kernel, [-1, width]), tf.reshape(bias, [width]))
                         for kernel, bias in projections)
    rotation = _rotation(layer, length, heads)
    if rotation is not None:
        query, key = (ops.rotate(t, rotation[0][None], rotation[1][None], rotation[2]) for t in (query, key))
    causal = np.tril(np.ones([length, length], bool))
    bias = ops.pair_constant(np.where(causal, 0.0, ops.MASKED))
    alibi = ops.alibi_constants(layer.attention, length)
    outputs = []
    for head in range(heads):
        q, k, v = (tf.reshape(ops.linear(t, _columns(width, head, head_dim)), [1, length, head_dim])
                   for t in (query, key, value))
        outputs.append(ops.head_attention(q, k, v, bias, None if alibi is None else alibi[head]))
    merged = tf.reshape(tf.concat(outputs, axis=-1), [1, length, width])
    kernel, bias_out = output
    attended = ops.linear(merged, tf.reshape(kernel, [width, -1]), bias_out)
    # 4-D: the GPU delegates read the first axis of a 3-D tensor as the batch, which PAD refuses.
    padding = [[0, 0], [0, cache_length - length], [0, 0], [0, 0]]
    return (attended, tf.pad(tf.reshape(key, [1, length, heads, head_dim]), padding),
            tf.pad(tf.reshape(value, [1, length, heads, head_dim]), padding))


def _columns(width, head, head_dim):
    """The constant `[width, head_dim]` selecting one head's features (a 1x1 CONV_2D, no SLICE)."""
    select = np.zeros([width, head_dim], np.float32)
    select[head * head_dim:(head + 1) * head_dim] = np.eye(head_dim, dtype=np.float32)
    return select


def _block(layer, x, attend):
    """One encoder layer (`EncoderLayer`'s residual blocks) around `attend(x) -> (output, keys, values)`."""
    caches = []

    def attention(h):
        attended, keys, values = attend(h)
        caches.append((keys, values))
        return attended

    x = residual_block(x, attention, lambda h: ops.layer_norm(h, layer.attention_norm), layer.norm_first)
    x = residual_block(x, lambda h: ops.dense(layer.ffn_output, ops.dense(layer.ffn_hidden, h)),
                       lambda h: ops.layer_norm(h, layer.ffn_norm), layer.norm_first)
    return (x,) + caches[0]


def _logits(model, x):
    if model.encoder.final_norm is not None:
        x = ops.layer_norm(x, model.encoder.final_norm)
    return ops.dense(model.head, x)


def _lookup_ids(model, token_ids):
    """The ids as the token lookup takes them: int32 for a vocabulary past float16's exact integers
    (`shader_ops.token_one_hot` splits them into digits), else float32."""
    if token_ids.dtype.is_integer and model.encoder.vocab_size > ops.FLOAT16_INTEGERS:
        return token_ids
    return as_float(token_ids)


def as_float(tensor):
    """`tensor` as float32 (one CAST for an int32 input of the `gpu` files)."""
    return tf.cast(tensor, tf.float32) if tensor.dtype != tf.float32 else tensor


def prefill_graph(model, token_ids, cache_length, rows=None):
    """`(logits [1, P, V], keys, values)` of the right-padded prompt `token_ids` `[1, P]` at slots 0..P-1.

    Args:
        model: the float32 `CausalLM` (a rebuilt clone: RoPE frozen at the cache length).
        token_ids: `[1, P]` int32 (`gpu`) or float32 (`gl`).
        cache_length: int, `C`.
        rows: optional `[1, P, d_model]` float, the looked-up token rows (`embedding="host"`).
    """
    length = token_ids.shape[1]
    ids = _lookup_ids(model, token_ids)
    x = _embedded(model, ids, tf.constant(np.arange(length, dtype=np.float32)[None]), rows)
    keys, values = [], []
    for layer in model.encoder.encoder_layers:
        x, key, value = _block(layer, x, lambda h, layer=layer: _prefill_attention(layer, h, cache_length))
        keys.append(key)
        values.append(value)
    return _logits(model, x), keys, values


def _cached_graph(model, token_ids, positions, key_caches, value_caches, rows):
    """`(logits [1, T, V], keys, values)` of `T` tokens at the float slots `positions` `[1, T, 1]`."""
    length, cache_length = positions.shape[1], key_caches[0].shape[1]
    ids = _lookup_ids(model, token_ids)
    slot_rows = ops.one_hot(positions, cache_length)  # [1, T, C]
    x = _embedded(model, ids, tf.reshape(positions, [1, length]), rows)
    keys, values = [], []
    for layer, key_cache, value_cache in zip(model.encoder.encoder_layers, key_caches, value_caches):
        x, key, value = _block(layer, x, lambda h, layer=layer, k=key_cache, v=value_cache:
                               cached_attention(layer, h, positions, slot_rows, k, v))
        keys.append(key)
        values.append(value)
    return _logits(model, x), keys, values


def decode_graph(model, token_id, position, key_caches, value_caches, rows=None):
    """`(logits [1, V], keys, values)` of one token at slot `position` against the caches.

    Args:
        model: as in `prefill_graph`.
        token_id: `[1, 1]` int32 or float32.
        position: `[1]` int32 or float32, the token's slot and position id.
        key_caches, value_caches: lists of `[1, C, heads, head_dim]` float32, one per layer.
        rows: optional `[1, 1, d_model]` float (`embedding="host"`).
    """
    position = tf.reshape(as_float(position), [1, 1, 1])
    logits, keys, values = _cached_graph(model, token_id, position, key_caches, value_caches, rows)
    return tf.reshape(logits, [1, -1]), keys, values


def chunk_graph(model, token_ids, first, key_caches, value_caches, rows=None):
    """`(logits [1, T, V], keys, values)` of `T` tokens at slots `first .. first + T - 1`, in parallel.

    The prefill of a chunk at an offset (LiteRT-LM's `prefill`): token `t` has slot and position
    `first + t`, attends to the cache's slots before `first` and causally within the chunk, and
    its key and value are written at its slot (a slot past the cache writes nothing). Every
    other slot is kept bit for bit. `decode_graph` is the same step for one token.

    Args:
        model: as in `prefill_graph`.
        token_ids: `[1, T]` int32 or float32.
        first: `[1]` int32 or float32, the slot of the chunk's first token.
        key_caches, value_caches: lists of `[1, C, heads, head_dim]` float32, one per layer.
        rows: optional `[1, T, d_model]` float (`embedding="host"`).
    """
    length = token_ids.shape[1]
    first = tf.reshape(as_float(first), [1, 1, 1])
    # first + t, by constant weights and a same-shape ADD (no broadcasting on the GL backend).
    positions = (tf.reshape(ops.linear(first, np.ones([1, length], np.float32)), [1, length, 1])
                 + np.arange(length, dtype=np.float32).reshape(1, length, 1))
    return _cached_graph(model, token_ids, positions, key_caches, value_caches, rows)
