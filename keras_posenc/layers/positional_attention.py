"""PositionalAttention: multi-head attention with RoPE or ALiBi inside it."""

from keras_posenc.backend import build_multi_head_attention, keras, ops, static_call
from keras_posenc.layers._shape_preserving import input_shape_of
from keras_posenc.layers.alibi import MASKED_BIAS, alibi_bias, alibi_slopes
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.validation import check_choice

__all__ = ["ATTENTION_POSITIONS", "PositionalAttention", "ROPE_KEYS"]

# Position encodings that act inside the attention rather than on the embeddings.
ATTENTION_POSITIONS = ("rope", "alibi")
# Keyword arguments of `RotaryEmbedding` that a "rope" layer's `position_config` may hold.
ROPE_KEYS = ("max_wavelength", "layout", "scaling", "scaling_factor", "max_length", "original_length",
             "beta_fast", "beta_slow", "truncate", "mscale", "mscale_all_dim", "attention_factor",
             "low_freq_factor", "high_freq_factor", "short_factor", "long_factor", "partial_rotary_factor",
             "head_dim")


@keras.utils.register_keras_serializable(package="keras_posenc")
class PositionalAttention(keras.layers.MultiHeadAttention):
    """Multi-head attention whose logits carry the positions: RoPE or ALiBi.

    A `keras.layers.MultiHeadAttention` with the same projections and
    weights; with `position=None` it is that layer. With a position it takes
    `position_ids` and computes the logits itself, in float32 (also under
    mixed precision):

    - "rope": queries and keys of every head are rotated by
      `RotaryEmbedding(**position_config)` before their dot product;
    - "alibi": `-slope_h * |p_j - p_i|` is added to the logits of head `h`
      (`keras_posenc.layers.alibi.alibi_bias`), merged with the mask into one
      additive bias; with a causal mask this is Press et al.'s
      `slope_h * (j - i)`.

    Position ids, not indices: a left-padded row (ids counted over its real
    tokens) gets the outputs of the same row without padding. The layer
    also runs one step of cached decoding (`cached_attention`) and exposes
    its projections (`projections`, `head_dim`) for exporters.

    Args:
        num_heads: int, the attention heads.
        key_dim: int, the size of each head (queries, keys and values).
        position: None, "rope" or "alibi".
        position_config: optional dict; for "rope" the keyword arguments of
            `keras_posenc.layers.RotaryEmbedding` (`ROPE_KEYS`); must be
            empty otherwise.
        **kwargs: the arguments of `keras.layers.MultiHeadAttention`
            (`dropout`, `use_bias`, `name`, `dtype`, ...).

    Call arguments:
        query: float tensor `[batch, length, dim]`.
        value: optional float tensor `[batch, length, dim]`; default: the
            query (self-attention).
        key: optional float tensor, defaults to `value`.
        attention_mask: optional bool `[batch, length, length]` (or
            `[batch, 1, length]`), True where query `i` may attend to key `j`.
        return_attention_scores: bool, also return the probabilities
            `[batch, num_heads, length, length]` (before dropout).
        training: bool, enables dropout on the probabilities.
        use_causal_mask: bool, forbid attention to later positions.
        position_ids: optional int `[batch, length]` or `[length]`, the
            positions of "rope" and "alibi"; default `0 .. length - 1`.

    Returns:
        `[batch, length, dim]`, or `(outputs, scores)` with
        `return_attention_scores=True`.

    Example:

    >>> import numpy as np
    >>> attention = PositionalAttention(num_heads=2, key_dim=4, position="alibi")
    >>> x = np.random.default_rng(0).normal(size=[2, 5, 8]).astype("float32")
    >>> ids = np.array([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]], "int32")
    >>> keys = np.array([[[True] * 5], [[False, False, True, True, True]]])
    >>> y, scores = attention(x, x, attention_mask=keys, position_ids=ids, return_attention_scores=True)
    >>> tuple(y.shape), float(ops.convert_to_numpy(scores)[1, :, :, :2].max())  # no padding keys
    ((2, 5, 8), 0.0)
    >>> unpadded = attention(x[1:, 2:], x[1:, 2:], position_ids=ids[1:, 2:])
    >>> bool(np.allclose(ops.convert_to_numpy(y)[1, 2:], ops.convert_to_numpy(unpadded)[0], atol=1e-5))
    True
    >>> attention.num_heads, attention.head_dim, attention.slopes.tolist()
    (2, 4, [0.0625, 0.00390625])

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864), RoPE.
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409), ALiBi.
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762),
          section 3.2.2.
    """

    def __init__(self, num_heads, key_dim, *, position=None, position_config=None, **kwargs):
        super().__init__(num_heads, key_dim, **kwargs)
        if position is not None:
            check_choice("position", position, ATTENTION_POSITIONS + (None,))
        position_config = dict(position_config or {})
        allowed_keys = ROPE_KEYS if position == "rope" else ()
        unknown = sorted(set(position_config) - set(allowed_keys))
        if unknown:
            raise ValueError(f"`position_config` of position={position!r} takes {allowed_keys}, got "
                             f"unknown keys {unknown}.")
        self.position = position
        self.position_config = position_config
        self.rotary = None
        if position == "rope":
            self.rotary = RotaryEmbedding(**position_config, dtype=self.dtype_policy, name="rotary")
        self.slopes = alibi_slopes(num_heads) if position == "alibi" else None

    # What exporters read: the heads and the four projections.
    @property
    def num_heads(self):
        return self._num_heads

    @property
    def head_dim(self):
        return self._key_dim

    @property
    def query_dense(self):
        return self._query_dense

    @property
    def key_dense(self):
        return self._key_dense

    @property
    def value_dense(self):
        return self._value_dense

    @property
    def output_dense(self):
        return self._output_dense

    def build(self, query_shape, value_shape=None, key_shape=None, **shapes):
        # keras-hub's convention passes every tensor argument's shape (`position_ids_shape`, ...):
        # only the query, value and key shapes size the weights.
        input_shape_of(self, query_shape, shapes)
        query_shape = tuple(query_shape)
        value_shape = query_shape if value_shape is None else tuple(value_shape)
        build_multi_head_attention(self, query_shape, value_shape, key_shape)
        if self.rotary is not None:
            self.rotary.build(query_shape[:-1] + (self.num_heads, self.head_dim))
        self.built = True

    def projections(self, query_shape):
        """The query, key, value and output projections, built for self-attention on `query_shape`.

        Keras 2 builds them on their first call; an exporter that reads their
        kernels without calling them gets them built here.

        Returns:
            `(query_dense, key_dense, value_dense, output_dense)`.
        """
        query_shape = tuple(query_shape)
        output_shape = query_shape[:-1] + (self.num_heads, self._value_dim)
        layers = (self._query_dense, self._key_dense, self._value_dense, self._output_dense)
        for dense, shape in zip(layers, (query_shape,) * 3 + (output_shape,)):
            if not dense.built:
                dense.build(shape)
        return layers

    def project(self, x):
        """Queries, keys and values of self-attention on `x`: three `[batch, length, heads, head_dim]`."""
        return self._query_dense(x), self._key_dense(x), self._value_dense(x)

    @static_call
    def call(self, query, value=None, key=None, attention_mask=None, return_attention_scores=False,
             training=None, use_causal_mask=False, position_ids=None, **kwargs):
        value = query if value is None else value
        if self.position is None:
            result = super().call(query, value, key=key, attention_mask=attention_mask,
                                  return_attention_scores=return_attention_scores, training=training,
                                  use_causal_mask=use_causal_mask, **kwargs)
            if return_attention_scores:
                return self._in_compute_dtype(result[0]), result[1]
            return self._in_compute_dtype(result)
        length = ops.shape(query)[1]
        if use_causal_mask:
            steps = ops.arange(length)
            causal = (steps[:, None] >= steps[None, :])[None]
            attention_mask = causal if attention_mask is None else ops.logical_and(
                ops.cast(attention_mask, "bool"), causal)
        plain = position_ids is None  # ids 0..T-1: RoPE broadcasts one table
        if position_ids is None:
            position_ids = ops.arange(length, dtype="int32")[None]
        self_attention = key is None and value is query
        query = self._query_dense(query)
        key = self._key_dense(value if key is None else key)
        value = self._value_dense(value)
        if self.rotary is not None:
            ids = None if plain else position_ids
            if self_attention:  # one position per row for queries and keys: one table lookup
                query, key = self.rotary.rotate_pair(query, key, position_ids=ids)
            else:
                query = self.rotary(query, position_ids=ids)
                key = self.rotary(key, position_ids=ids)
        logits = ops.einsum("bqhd,bkhd->bhqk", ops.cast(query, "float32"), ops.cast(key, "float32"))
        logits = logits * (1.0 / float(self.head_dim) ** 0.5)
        if self.slopes is not None:
            ids = ops.cast(position_ids, "int32")
            ids = ids[None] if len(ids.shape) == 1 else ids
            logits = logits + alibi_bias(self.slopes, ids, attention_mask)
        elif attention_mask is not None:
            logits = ops.where(ops.expand_dims(ops.cast(attention_mask, "bool"), 1), logits, MASKED_BIAS)
        scores = ops.softmax(logits, axis=-1)
        probabilities = self._dropout_layer(ops.cast(scores, self.compute_dtype), training=training)
        output = self._output_dense(ops.einsum("bhqk,bkhd->bqhd", probabilities, value))
        output = self._in_compute_dtype(output)
        if return_attention_scores:
            return output, ops.cast(scores, self.compute_dtype)
        return output

    def _in_compute_dtype(self, output):
        # Keras 2 builds the projections under the global policy (float32 under a mixed layer).
        return ops.cast(output, self.compute_dtype)

    def cached_attention(self, x, key_cache, value_cache, cache_index, position_ids, write_cache=None):
        """One step of cached self-attention: writes the chunk's keys and values, attends over the caches.

        Slot `s` of a cache holds the token of step `s` (a left-padded row's
        padding first); a query at slot `s` with position id `p` (its row's
        real tokens before it) attends to slots `s - p .. s`: causal, without
        padding, from the ids alone. The ALiBi distance of two real tokens is
        their slot distance.

        Args:
            x: float `[batch, length, dim]`, the chunk starting at slot
                `cache_index`.
            key_cache, value_cache: float `[batch, cache_length, num_heads,
                head_dim]`.
            cache_index: int scalar (tensor).
            position_ids: int `[batch, length]`.
            write_cache: optional `(cache, chunk, cache_index) -> cache`, how
                the chunk's keys and values (`[batch, length, num_heads,
                head_dim]`, in the cache's dtype) are written at slots
                `cache_index ..`; by default a one-hot product, which every
                backend and runtime computes. An export may write with its
                runtime's own op instead (the same values).

        Returns:
            `(outputs, key_cache, value_cache, scores)`.
        """
        query, key, value = self.project(x)
        position_ids = ops.cast(position_ids, "int32")
        if self.rotary is not None:
            query = self.rotary(query, position_ids=position_ids)
            key = self.rotary(key, position_ids=position_ids)
        cache_length = ops.shape(key_cache)[1]
        query_slots = ops.cast(cache_index, "int32") + ops.arange(ops.shape(x)[1], dtype="int32")
        if write_cache is None:
            # Writing by a one-hot product keeps every other slot bit for bit (x * 1 + 0).
            write = ops.cast(ops.equal(query_slots[:, None], ops.arange(cache_length, dtype="int32")[None]),
                             key_cache.dtype)  # [length, cache_length]
            keep = (1.0 - ops.sum(write, axis=0))[None, :, None, None]
            key_cache = key_cache * keep + ops.einsum("sc,bshd->bchd", write, ops.cast(key, key_cache.dtype))
            value_cache = value_cache * keep + ops.einsum("sc,bshd->bchd", write,
                                                          ops.cast(value, value_cache.dtype))
        else:
            key_cache = write_cache(key_cache, ops.cast(key, key_cache.dtype), cache_index)
            value_cache = write_cache(value_cache, ops.cast(value, value_cache.dtype), cache_index)
        logits = ops.einsum("bqhd,bkhd->bhqk", ops.cast(query, "float32"), ops.cast(key_cache, "float32"))
        logits = logits * (1.0 / float(self.head_dim) ** 0.5)
        key_slots = ops.arange(cache_length, dtype="int32")[None, None, :]
        first_real = (query_slots[None, :] - position_ids)[:, :, None]
        allowed = ops.logical_and(key_slots <= query_slots[None, :, None], key_slots >= first_real)
        allowed = ops.expand_dims(allowed, 1)  # [batch, 1, length, cache_length]
        if self.slopes is not None:
            distance = ops.cast(query_slots[:, None] - key_slots[0], "float32")
            logits = logits - ops.convert_to_tensor(self.slopes, "float32")[:, None, None] * distance[None]
        logits = ops.where(allowed, logits, MASKED_BIAS)
        scores = ops.softmax(logits, axis=-1)
        output = ops.einsum("bhqk,bkhd->bqhd", ops.cast(scores, self.compute_dtype),
                            ops.cast(value_cache, self.compute_dtype))
        return self._output_dense(output), key_cache, value_cache, ops.cast(scores, self.compute_dtype)

    def attend_projected(self, query, keys, values, key_mask=None, training=None):
        """Attention of `query` over keys and values already projected (cross-attention with a cache).

        The query is projected here; `keys` and `values` are `key_dense` and
        `value_dense` of the attended sequence, computed once by the caller
        (an encoder-decoder's cross-attention reads the same source at every
        decoder step). No position term: for `position=None` layers.

        Args:
            query: float `[batch, length, dim]`.
            keys, values: float `[batch, key_length, num_heads, head_dim]`.
            key_mask: optional bool `[batch, key_length]`, True for keys that may be attended to.
            training: bool, enables dropout on the probabilities.

        Returns:
            `(outputs [batch, length, dim], probabilities [batch, num_heads, length, key_length])`,
            the probabilities before dropout.
        """
        if self.position is not None:
            raise ValueError(f"`attend_projected` has no position term; this layer has "
                             f"position={self.position!r}.")
        query = self._query_dense(query)
        logits = ops.einsum("bqhd,bkhd->bhqk", ops.cast(query, "float32"), ops.cast(keys, "float32"))
        logits = logits * (1.0 / float(self.head_dim) ** 0.5)
        if key_mask is not None:
            logits = ops.where(ops.cast(key_mask, "bool")[:, None, None, :], logits, MASKED_BIAS)
        scores = ops.cast(ops.softmax(logits, axis=-1), self.compute_dtype)
        # Keras 2 gives the dropout layer the global policy: cast again after it.
        probabilities = ops.cast(self._dropout_layer(scores, training=training), self.compute_dtype)
        output = ops.einsum("bhqk,bkhd->bqhd", probabilities, ops.cast(values, self.compute_dtype))
        return self._in_compute_dtype(self._output_dense(output)), scores

    def compute_output_spec(self, query, value=None, key=None, position_ids=None, **kwargs):
        return super().compute_output_spec(query, query if value is None else value, key=key, **kwargs)

    @classmethod
    def from_config(cls, config):
        return super().from_config(dict(config))  # Keras 2 pops the shapes from the dict it is given

    def get_config(self):
        config = super().get_config()
        config.update({"position": self.position, "position_config": dict(self.position_config)})
        return config
