"""Shader building blocks: the ops of the GPU delegate's OpenGL ES backend, shared by the `gl` and
`gpu` formulations and the generation graphs (`keras_posenc.export.gl_generate`).

The OpenGL ES backend (the one a Jetson without OpenCL runs) has shaders for a short list of ops
(`tensorflow/lite/delegates/gpu/gl/kernels/registry.cc`): no TRANSPOSE, BATCH_MATMUL, CUMSUM,
EQUAL, CAST or SPLIT, MEAN over height/width only, SOFTMAX over channels only. Its arithmetic is on
float tensors, so this target takes float32 inputs (integer-valued token ids, language ids) and
builds everything from FULLY_CONNECTED with constant weights, 1x1 CONV_2D, CONCATENATION, RESHAPE,
MUL, SUB, ADD, ABS, RELU, RSQRT, EXP, AVERAGE_POOL_2D and SOFTMAX:

- a lookup `table[v]` is `relu(1 - |v - classes|) @ table` (a one-hot row, exact for integer v);
- position ids of real tokens (left padding, packed segments) are `real @ M` with a constant
  0/1 matrix M (an exclusive cumulative count), padding gets id -1, whose one-hot row is zero;
- a per-token mean (LayerNormalization) is a product with the constant `[D, D]` matrix 1/D;
- attention per head: queries and keys are materialised as `[1, T, T, head_dim]` by
  CONCATENATION (a broadcasting MUL is rejected by the GL backend, and the converter folds
  TILE into one), multiplied, summed over channels by a 1x1 CONV_2D with constant weights,
  reshaped to keys-in-channels for SOFTMAX, and the weighted sum of values is an
  AVERAGE_POOL_2D over the key axis times T;
- the attention bias (padding keys, causal mask, segments) is the runtime key row repeated per
  query by CONCATENATION times a constant `[T, T]` structure, `(keep - 1) * 1e4`: every
  constant of the file grows at most as T^2, and the bias is finite in float16.

Every constant and intermediate is representable in float16, what the delegates compute in
with precision loss allowed: masked scores get -1e4, LayerNorm squares values scaled by 1/8,
and token ids above 2048 (float16's last exact integer) are looked up as two digits
(`token_one_hot`); with `embedding="host"` the file takes the looked-up rows instead.

Batch 1 only (what the GL delegate runs); position ids and attention masks must be constant in
the traced graph (segment ids may be a runtime input).
"""

import collections
import math

import numpy as np
import tensorflow as tf

from keras_posenc.export.constants import Frozen, exclusive_count_matrix, static_structure
from keras_posenc.layers.encoder_layer import residual_block

__all__ = ["FLOAT16_INTEGERS", "LAYER_NORM_SCALE", "MASKED", "Projections", "alibi_constants",
           "attention_projections", "broadcast_rows", "check_batch", "complement", "dense", "embed",
           "encoder_structure", "gl_attention", "gl_encoder_layer", "head_attention", "key_bias", "key_rows",
           "layer_norm", "linear", "one_hot", "pair_constant", "position_rows", "query_columns",
           "real_tokens", "rotate", "rotation_constants", "same_segment", "segment_positions",
           "token_one_hot"]

_RSQRT_EXPONENT = float(np.nextafter(np.float32(-0.5), np.float32(-1.0)))
# Added to masked attention scores. Finite in float16 (largest 65504; Keras' float32 -1e9 is inf
# there, and the bias (keep - 1) * 1e9 then 0 * inf = NaN), and exp(score - 1e4) underflows to
# exactly 0 in float16 and float32 alike, as Keras' does: the same softmax at real tokens.
MASKED = -1e4
LAYER_NORM_SCALE = 0.125
# float16 represents every integer in [0, 2048] exactly.
FLOAT16_INTEGERS = 2048


def complement(real_like):
    """`1 - x` for 0/1 floats (relu(1 - x)): shader ops only."""
    return tf.nn.relu(real_like * -1.0 + 1.0)


def linear(x, kernel, bias=None):
    """`x @ kernel (+ bias)` over the last axis as a 1x1 CONV_2D with constant weights.

    Not FULLY_CONNECTED: the converter flattens its input to 2-D, whose first axis (T) the GL
    delegate takes for a batch ("Batch size mismatch, expected 1 but got 48").
    """
    shape = x.shape.as_list()
    kernel = tf.convert_to_tensor(kernel)
    rows = tf.reshape(x, [1, 1, -1, shape[-1]])
    y = tf.nn.conv2d(rows, tf.reshape(kernel, [1, 1, shape[-1], -1]), strides=1, padding="VALID")
    if bias is not None:
        y = y + bias
    return tf.reshape(y, shape[:-1] + [kernel.shape[-1]])


def one_hot(values, depth):
    """`N` integer-valued floats -> `[1, N, depth]` one-hot rows: relu(1 - |v - classes|).

    A value outside [0, depth) (e.g. -1) gives a zero row. Every tensor keeps a leading batch
    axis of 1: the GL delegate takes the first axis as the batch and needs it equal everywhere.
    """
    values = tf.reshape(tf.cast(values, tf.float32), [1, -1, 1])
    spread = linear(values, tf.ones([1, depth]))  # a broadcast by constant weights
    return complement(tf.abs(spread - tf.range(depth, dtype=tf.float32)))


def token_one_hot(token_ids, vocab_size):
    """Token ids `[B, T]` -> `[1, B * T, V']` one-hot rows (V' >= vocab_size), exact in float16 too.

    float16 holds every integer up to 2048 only: above that, `|v - classes|` would pick a
    neighbouring row. Larger vocabs split each id into two digits (high = v // base, low =
    v % base, base a power of two near sqrt(vocab)), one-hot each, and join them as the outer
    product, whose row `high * base + low` is the id's. int32 ids (the `gpu` target) are split
    by FLOOR_DIV before the one CAST. Float ids (`gl`): a float16 GPU rounds the ids that a 1x1
    CONV_2D reads (the GL delegate on llvmpipe does), so the thresholds `base * h` they pass
    (constants exact in float16: multiples of a power of two) give a high digit that may be off
    by one; the low digit `v - base * high` is an element-wise SUB, which reads the float32
    input exactly, and one step corrects both digits into [0, base).
    """
    if vocab_size <= FLOAT16_INTEGERS:
        return one_hot(token_ids, vocab_size)
    base = 1 << ((vocab_size - 1).bit_length() + 1) // 2  # 2^ceil(log2(vocab) / 2)
    count = -(-vocab_size // base)
    if token_ids.dtype.is_integer:
        high = tf.math.floordiv(token_ids, base)
        low = tf.cast(token_ids - high * base, tf.float32)
        high = tf.cast(high, tf.float32)
    else:
        values = tf.reshape(token_ids, [1, -1, 1])
        # [v >= base * h] = 1 - min(relu(base * h - v), 1) for integer-valued v: no constant but base * h.
        below = tf.minimum(tf.nn.relu(linear(values, -np.ones([1, count - 1], np.float32),
                                             base * np.arange(1, count, dtype=np.float32))), 1.0)
        high = (count - 1.0) - linear(below, np.ones([count - 1, 1], np.float32))  # [1, N, 1]
        low = values - high * float(base)  # in (-base, 2 * base)
        under = tf.minimum(tf.nn.relu(-low), 1.0)  # low < 0: one high step too many
        over = tf.minimum(tf.nn.relu(low - (base - 1.0)), 1.0)  # low >= base: one too few
        high = tf.reshape(high - under + over, [1, -1])
        low = tf.reshape(low + (under - over) * float(base), [1, -1])
    high = tf.reshape(one_hot(high, count), [1, -1, count, 1])
    high = tf.reshape(linear(high, np.ones([1, base], np.float32)), [1, -1, count, base])
    low = broadcast_rows(tf.reshape(one_hot(low, base), [1, -1, 1, base]), count, axis=2)
    return tf.reshape(high * low, [1, -1, count * base])


def real_tokens(token_ids, pad_id):
    """1.0 for real tokens, 0.0 for the pad id, from float token ids `[1, T]`."""
    return 1.0 - complement(tf.abs(tf.cast(token_ids, tf.float32) - float(pad_id)))


def layer_norm(x, norm):
    """LayerNormalization over the last axis of `x` `[1, N, D]` with `norm`'s weights."""
    depth = x.shape[-1]
    average = tf.constant(np.full([depth, depth], 1.0 / depth, np.float32))
    # Centered values scaled by 1/8 before squaring: float16 squares overflow above 255, so the
    # variance of activations up to 2047 stays finite in half precision, and
    # c * (v + eps)^-1/2 = (c / 8) * (v / 64 + eps / 64)^-1/2 exactly.
    centered = (x - linear(x, average)) * LAYER_NORM_SCALE
    variance = linear(centered * centered, average)
    # POW, not RSQRT: the GL RSQRT shader declares a `nan` constant, and fused shaders with
    # several RSQRT fail to compile ("`nan' redeclared"). Grappler rewrites pow(v, -0.5) as
    # RSQRT, so the exponent is the next float32 below -0.5: a relative change of
    # 6e-8 * |ln v|, far below float32 LayerNorm rounding.
    epsilon = norm.epsilon * LAYER_NORM_SCALE ** 2
    y = centered * tf.pow(variance + epsilon, _RSQRT_EXPONENT)
    if norm.scale:
        y = y * norm.gamma
    if norm.center:
        y = y + norm.beta
    return y


def check_batch(tensor):
    """ValueError unless the batch axis is 1 (the GL delegate takes the first axis for the batch)."""
    if tensor.shape[0] != 1:
        raise ValueError(f"The gl target and runtime segment_ids export batch 1 only, got shape "
                         f"{tensor.shape}.")


def position_rows(layer, x, real, position_ids=None, language_ids=None, segment_ids=None, frozen=Frozen):
    """`x + pe` for float `x` `[B, T, D]` and float `real` `[B, T]` (None: no mask).

    `frozen(layer)` gives the position layer's constants (`ExportContext.frozen` in an export).
    """
    constants = frozen(layer)
    batch, length, depth = x.shape
    if real is None:
        real = tf.ones([batch, length])
    if position_ids is not None:
        ids = tf.reshape(tf.cast(position_ids, tf.float32), [-1, length])
        rows = constants.table
    else:
        if segment_ids is not None and tf.get_static_value(segment_ids) is None:
            ids = segment_positions(real, segment_ids)
        else:
            runs = np.ones([length, length], bool)
            if segment_ids is not None:
                _, runs = static_structure(length, segment_ids=segment_ids)
            ids = linear(real, exclusive_count_matrix(runs))
        rows = constants.table[:length]
    if layer.zero_padding:
        ids = (ids + 1.0) * real - 1.0  # padding -> -1 -> a zero one-hot row -> pe exactly 0
    elif position_ids is None:
        ids = ids * real
    pe = tf.reshape(linear(one_hot(ids, len(rows)), rows), [-1, length, depth])
    if constants.scales is not None:
        count = len(constants.scales)
        languages = tf.cast(language_ids, tf.float32)
        if language_ids.shape.rank == 1:  # one language per row: spread over [T * D] by the weights
            spread = np.repeat(constants.scales[:, None], length * depth, axis=1)
        else:
            spread = np.repeat(constants.scales[:, None], depth, axis=1)
        scale = tf.reshape(linear(one_hot(languages, count), spread), [-1, length, depth])
        pe = pe * scale
    return x + pe


def embed(layer, token_ids, position_ids=None, language_ids=None, segment_ids=None, rows=None, frozen=Frozen):
    """`[B, T, D]` embeddings and the float real-token rows `[B, T]` for token ids `[B, T]`.

    `rows`: the looked-up token rows of an `embedding="host"` file, else None (a one-hot lookup).
    """
    length = token_ids.shape[1]
    if rows is not None:  # embedding="host": the runner looked the rows up, scaled
        # The pad test reads the ids as floats: exact for a pad id up to 2048 in float16, because
        # only ids above 2048 round, and never below 2048.
        x = tf.reshape(rows, [-1, length, layer.d_model])
        real = real_tokens(token_ids, layer.pad_id)
        x = position_rows(layer.position_embedding, x, real, position_ids, language_ids, segment_ids, frozen)
        return x, real
    table = layer.token_embedding.embeddings
    if layer.scale_embeddings:
        table = table * math.sqrt(layer.d_model)
    rows = token_one_hot(token_ids, layer.vocab_size)
    if rows.shape[-1] > layer.vocab_size:  # digit rows past the vocab select nothing
        table = tf.concat([table, tf.zeros([rows.shape[-1] - layer.vocab_size, table.shape[-1]])], 0)
    if layer.vocab_size <= FLOAT16_INTEGERS:
        real = real_tokens(token_ids, layer.pad_id)
    else:  # the pad id's one-hot column: exact for any pad id
        column = np.zeros([rows.shape[-1], 1], np.float32)
        column[layer.pad_id] = 1.0
        real = tf.reshape(1.0 - linear(rows, column), [-1, length])
    x = tf.reshape(linear(rows, table), [-1, length, layer.d_model])
    x = position_rows(layer.position_embedding, x, real, position_ids, language_ids, segment_ids, frozen)
    return x, real


def broadcast_rows(tensor, copies, axis):
    """`copies` copies of `tensor` along `axis` by CONCATENATION (the GL backend has no broadcast).

    By doubling (1, 2, 4, ... copies, then the binary digits of `copies` joined): a GL shader
    binds at most 16 storage buffers, so one CONCATENATION of T inputs fails to link for T > 15.
    """
    powers, block = [], tensor
    while (1 << len(powers)) <= copies:
        powers.append(block)
        block = tf.concat([block, block], axis=axis)
    parts = [powers[bit] for bit in reversed(range(len(powers))) if copies >> bit & 1]
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=axis)


Projections = collections.namedtuple("Projections", ["heads", "head_dim", "query", "key", "value", "output"])


def attention_projections(attention, width):
    """The weights of a `PositionalAttention` over `width` features, built if it never ran.

    Returns `Projections(heads, head_dim, query, key, value, output)`: `(kernel, bias)` pairs,
    kernels `[width, heads, head_dim]` (output: `[heads * head_dim, width]`), biases
    `[heads, head_dim]` (output: `[width]`), read through the layer's public `projections`.
    """
    *inputs, output = attention.projections([1, 1, width])
    heads, head_dim = attention.num_heads, attention.head_dim
    query, key, value = ((dense.kernel, dense.bias) for dense in inputs)
    return Projections(heads, head_dim, query, key, value,
                       (tf.reshape(output.kernel, [heads * head_dim, -1]), output.bias))


# RoPE logits and ALiBi biases depend on positions only through differences. The per-sample ids
# of a left-padded row are 0..T-1 shifted by the padding, and those of a packed row are shifted
# once per segment, across which attention is masked: constants for positions 0..T-1 give every
# real token the outputs of the per-sample ids.
def rotation_constants(attention, length):
    """RoPE of one head as constants: `q_rotated = q * cos + (q @ turn) * sin`, or None.

    Args:
        attention: a `PositionalAttention`.
        length: int, the exported sequence length T.

    Returns:
        None without RoPE, else float32 numpy `(cos, sin, turn)`: `cos` and `sin` `[T, head_dim]`
        of positions `0 .. T-1` in the layer's layout (the scaling's attention factor included;
        "dynamic" and "longrope" with the frequencies of a call of length T), `turn`
        `[head_dim, head_dim]` the signed permutation taking each pair `(a, b)` to `(-b, a)`.
        Features past the rotated width (partial rotary) get cos 1, sin 0 and no turn.

    Example:

    >>> from keras_posenc.layers.positional_attention import PositionalAttention
    >>> cos, sin, turn = rotation_constants(PositionalAttention(2, 4, position="rope"), 3)
    >>> cos.shape, turn[2].tolist()  # half layout, head_dim 4: pair (0, 2) -> (-x2, x0)
    ((3, 4), [-1.0, 0.0, 0.0, 0.0])
    """
    rotary = attention.rotary
    if rotary is None:
        return None
    head_dim = attention.head_dim
    width = rotary.rotated_width(head_dim)
    cos, sin = rotary.cos_sin_tables(length, head_dim)
    half = width // 2
    if rotary.layout == "half":
        pairs = [(k, k + half) for k in range(half)]
        columns = np.arange(width) % half
    else:
        pairs = [(2 * k, 2 * k + 1) for k in range(half)]
        columns = np.arange(width) // 2
    turn = np.zeros([head_dim, head_dim], np.float32)
    for a, b in pairs:
        turn[b, a], turn[a, b] = -1.0, 1.0
    factor = np.float32(rotary.attention_factor)
    full_cos = np.ones([length, head_dim], np.float32)
    full_sin = np.zeros([length, head_dim], np.float32)
    full_cos[:, :width], full_sin[:, :width] = cos[:, columns] * factor, sin[:, columns] * factor
    return full_cos, full_sin, turn


def alibi_constants(attention, length):
    """The ALiBi bias of positions `0 .. T-1` as a float32 `[num_heads, T, T]` constant, or None.

    Example:

    >>> from keras_posenc.layers.positional_attention import PositionalAttention
    >>> (alibi_constants(PositionalAttention(2, 4, position="alibi"), 3)[0] * 16).tolist()  # slope 1/16
    [[0.0, -1.0, -2.0], [-1.0, 0.0, -1.0], [-2.0, -1.0, 0.0]]
    """
    if attention.slopes is None:
        return None
    positions = np.arange(length, dtype=np.float64)
    distance = np.abs(positions[None, :] - positions[:, None])
    return (0.0 - attention.slopes[:, None, None] * distance).astype(np.float32)


def gl_attention(attention, x, bias):
    """Multi-head self-attention of `x` `[1, T, D]` with an additive `bias` `[1, T, 1, T]`.

    `attention` is a built `PositionalAttention`; its weights are read through its public
    `projections`.
    """
    length = x.shape[1]
    projections = attention_projections(attention, x.shape[2])
    heads, head_dim = projections.heads, projections.head_dim
    (query_kernel, query_bias), (key_kernel, key_bias), (value_kernel, value_bias) = (
        projections.query, projections.key, projections.value)
    # RoPE and ALiBi (position="rope" | "alibi") as constants of positions 0..T-1.
    rotation = rotation_constants(attention, length)
    alibi = alibi_constants(attention, length)
    outputs = []
    for head in range(heads):
        q = linear(x, query_kernel[:, head, :], query_bias[head])
        k = linear(x, key_kernel[:, head, :], key_bias[head])
        v = linear(x, value_kernel[:, head, :], value_bias[head])
        if rotation is not None:
            cos, sin, turn = tf.constant(rotation[0][None]), tf.constant(rotation[1][None]), rotation[2]
            q, k = rotate(q, cos, sin, turn), rotate(k, cos, sin, turn)
        outputs.append(head_attention(q, k, v, bias, None if alibi is None else alibi[head]))
    merged = tf.reshape(tf.concat(outputs, axis=-1), [1, length, heads * head_dim])
    return linear(merged, *projections.output)


def rotate(x, cos, sin, turn):
    """RoPE by constants: `x * cos + (x @ turn) * sin` (`turn` from `rotation_constants`)."""
    return x * cos + linear(x, turn) * sin


def head_attention(q, k, v, bias, alibi=None):
    """One head of the GL attention: `[1, T, 1, head_dim]` from `q`, `k`, `v` `[1, T, head_dim]`.

    Queries and keys are materialised as `[1, T, T, head_dim]` by CONCATENATION, multiplied and
    summed over channels (scaled by 1 / sqrt(head_dim)) by a 1x1 CONV_2D with constant weights,
    reshaped to keys-in-channels for SOFTMAX with the additive `bias` `[1, T, 1, T]` (and the
    head's ALiBi `[T, T]`); the weighted sum of values is an AVERAGE_POOL_2D over the keys times T.
    """
    length, head_dim = q.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(float(head_dim))
    queries = broadcast_rows(tf.reshape(q, [1, length, 1, head_dim]), length, axis=2)
    keys = broadcast_rows(tf.reshape(k, [1, 1, length, head_dim]), length, axis=1)
    summed = tf.constant(np.full([1, 1, head_dim, 1], scale, np.float32))
    scores = tf.nn.conv2d(queries * keys, summed, strides=1, padding="VALID")  # [1, T, T, 1]
    scores = tf.reshape(scores, [1, length, 1, length]) + bias
    if alibi is not None:
        scores = scores + tf.constant(np.asarray(alibi, np.float32).reshape(1, length, 1, length))
    weights = tf.nn.softmax(scores, axis=-1)  # over the keys, in channels
    spread = tf.constant(np.ones([1, 1, 1, head_dim], np.float32))
    weights = tf.nn.conv2d(tf.reshape(weights, [1, length, length, 1]), spread, strides=1,
                           padding="VALID")  # [1, T, T, head_dim]
    values = broadcast_rows(tf.reshape(v, [1, 1, length, head_dim]), length, axis=1)
    mean = tf.nn.avg_pool2d(weights * values, ksize=[1, length], strides=[1, 1], padding="VALID")
    return mean * float(length)


def dense(dense, x):
    """A Keras `Dense` layer as `linear` (1x1 CONV_2D) and its activation."""
    return dense.activation(linear(x, dense.kernel, dense.bias if dense.use_bias else None))


def gl_encoder_layer(layer, x, bias):
    """One `EncoderLayer` in shader ops, with the additive attention `bias` `[1, T, 1, T]`."""
    x = residual_block(x, lambda h: gl_attention(layer.attention, h, bias),
                       lambda h: layer_norm(h, layer.attention_norm), layer.norm_first)
    return residual_block(x, lambda h: dense(layer.ffn_output, dense(layer.ffn_hidden, h)),
                          lambda h: layer_norm(h, layer.ffn_norm), layer.norm_first)


def key_rows(row):
    """`[1, T]` -> `[1, T, 1, T]` with entry (q, k) = row[k]: the row once per query (CONCATENATION)."""
    length = row.shape[-1]
    return broadcast_rows(tf.reshape(row, [1, 1, 1, length]), length, axis=1)


def query_columns(column):
    """`[1, T]` -> `[1, T, 1, T]` with entry (q, k) = column[q]: a product with constant ones `[1, T]`."""
    length = column.shape[-1]
    return tf.reshape(linear(tf.reshape(column, [1, length, 1]), np.ones([1, length], np.float32)),
                      [1, length, 1, length])


def pair_constant(matrix):
    """A constant `[T, T]` (query, key) matrix as the `[1, T, 1, T]` float32 tensor of the scores."""
    length = len(matrix)
    return tf.constant(np.asarray(matrix, np.float32).reshape(1, length, 1, length))


def same_segment(segment_ids):
    """`[1, T, 1, T]`: 1.0 where tokens q and k carry the same (runtime) segment id, else 0.0.

    Segment ids are compared as floats: exact below 2048, also in float16.
    """
    segments = tf.reshape(tf.cast(segment_ids, tf.float32), [1, -1])
    return complement(tf.abs(query_columns(segments) - key_rows(segments)))


def segment_positions(real, segment_ids):
    """Position ids that restart per segment, from runtime segment ids (real tokens before, same id).

    Segments are told apart by their id, so a packed row must not reuse an id for two runs
    (packing numbers them 1, 2, 3, ...). Constants `[T, T]` only: the key row is repeated per
    query by CONCATENATION, and the count over keys is a product with constant ones.
    """
    check_batch(real)
    length = real.shape[1]
    before = np.arange(length)[None, :] < np.arange(length)[:, None]  # [query i, key j]: j < i
    counted = key_rows(real) * pair_constant(before) * same_segment(segment_ids)
    summed = linear(tf.reshape(counted, [1, length, length]), np.ones([length, 1], np.float32))
    return tf.reshape(summed, [1, length])


def key_bias(real, allowed, same_segment=None):
    """Additive bias `[1, T, 1, T]`: 0 where `allowed[q, k]`, key k is real (and, with
    `same_segment` `[1, T, 1, T]`, q and k share a segment), else `MASKED`.

    Built from the runtime key row (repeated per query) and the constant `[T, T]` structure:
    constants quadratic in T, and `keep` is exactly 0 or 1, so the bias is finite in float16.
    """
    keep = key_rows(real) * pair_constant(allowed)
    if same_segment is not None:
        keep = keep * same_segment
    return keep * -MASKED + MASKED


def encoder_structure(layer, token_ids, position_ids, segment_ids, attention_mask, use_causal_mask):
    """`(allowed [T, T], runtime_segments)` of an Encoder call on the shader targets, or a ValueError.

    The attention structure must be constant (causal mask, constant segment ids and attention mask);
    segment ids only known at run time are left to the caller's key bias. RoPE and ALiBi encoders
    take the ids they derive from padding and segments, not explicit `position_ids`.
    """
    length = token_ids.shape[1]
    runtime_segments = segment_ids is not None and tf.get_static_value(segment_ids) is None
    try:
        allowed, _ = static_structure(length, None if runtime_segments else segment_ids, attention_mask,
                                      use_causal_mask)
    except ValueError as error:
        raise ValueError(f"The gl and gpu targets need a constant attention_mask ({error}).") from None
    if position_ids is not None and layer.position in ("rope", "alibi"):
        raise ValueError(f"The {layer.position} encoder exports with the ids it derives from padding and "
                         "segments; explicit position_ids are not supported on the gl and gpu targets.")
    return allowed, runtime_segments


