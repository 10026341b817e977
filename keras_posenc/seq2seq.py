"""The package's translation model: an encoder-decoder Transformer built from its layers.

`Seq2SeqTransformer` is the model that `keras-posenc train --task translate`
trains and `keras-posenc translate` runs. Importing this module registers it
for `keras.models.load_model`.

References:
    - Vaswani et al., "Attention Is All You Need", 2017 (the model, tied
      embeddings in section 3.4, label smoothing in section 5.4, beam 4 and
      alpha 0.6 in section 6.1), https://arxiv.org/abs/1706.03762.
    - TF Model Garden's `Seq2SeqTransformer` and keras-hub's
      `TransformerEncoder` / `TransformerDecoder` (keras-io's translation
      example): the peers this model is measured against
      (benchmarks/bench_translate.py).
"""

import weakref

import numpy as np
import tensorflow as tf

from keras_posenc.backend import inference_function, keras, ops, static_call
from keras_posenc.beam_search import beam_search
from keras_posenc.layers.decoder_layer import DecoderLayer
from keras_posenc.layers.encoder import (
    ATTENTION_POSITIONS,
    ENCODER_POSITIONS,
    Encoder,
    embedding_kwargs,
    split_position,
)
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.models import TokenLossTraining
from keras_posenc.special_ids import BOS_ID, EOS_ID, PAD_ID
from keras_posenc.validation import check_choice, check_positive_int, check_rate

__all__ = ["DEFAULT_LENGTH_PENALTY", "SOURCE_LANGUAGE", "Seq2SeqTransformer", "TARGET_LANGUAGE"]

# The language ids of the position layers' per-language scale.
SOURCE_LANGUAGE, TARGET_LANGUAGE = 0, 1
# GNMT's length-penalty exponent of `translate`, chosen on the dev packages (docs/translation.md).
DEFAULT_LENGTH_PENALTY = 1.0
# One compiled decoder step and one encoder pass per model.
_FUNCTIONS = weakref.WeakKeyDictionary()


@keras.utils.register_keras_serializable(package="keras_posenc")
class Seq2SeqTransformer(TokenLossTraining, keras.Model):
    """An encoder-decoder Transformer for translation over one joint vocabulary.

    The source runs through an `Encoder` (token and position embedding,
    `num_layers` `EncoderLayer`s); the target through its embedding and
    `num_layers` `DecoderLayer`s (causal self-attention, cross-attention to
    the encoder outputs with the source's padding masked, feed-forward),
    then a softmax over the vocabulary. Positions: by default RoPE rotates
    the queries and keys of the self-attention of both stacks (the
    cross-attention has no positions), as "alibi" biases them; an additive
    position (sinusoidal, learned, ...) is instead added to both embeddings,
    with one learned scale per language (`language_scale`: source 0,
    target 1). At the sizes of benchmarks/bench_translate.py RoPE scored
    3 to 4 BLEU above the sinusoidal table (docs/translation.md).

    Per-sample positions as everywhere in the package: a left-padded or
    batched source gives each sentence the outputs it gets alone.

    Training (`fit`) minimizes the label-smoothed cross-entropy of the real
    target tokens (`label_smoothing`, Szegedy et al.); `evaluate` reports
    the plain cross-entropy.

    Args:
        num_layers: int, encoder layers and decoder layers (each).
        d_model: int, model width.
        num_heads: int, attention heads.
        dff: int, feed-forward hidden width.
        vocab_size: int, the joint source and target vocabulary.
        max_length: int, the longest source and target (rows of the
            position tables).
        dropout: float in [0, 1).
        norm_first: bool, pre-LN blocks and a final LayerNormalization in
            both stacks.
        activation: feed-forward activation.
        epsilon: float > 0, LayerNormalization epsilon.
        pad_id, bos_id, eos_id: ints, padding, the decoder's start token
            and the end token.
        position: one of `keras_posenc.layers.encoder.ENCODER_POSITIONS`
            (default "rope").
        position_config: optional dict, the position's options (as `Encoder`'s).
        language_scale: bool, a learned position scale per language (additive
            positions only; `num_languages=2`).
        share_embeddings: bool, one token embedding for source and target
            (default: one each).
        tie_output: bool, the softmax's weights are the target token
            embedding's (Vaswani et al., section 3.4); else (default) a
            `Dense` head. Vaswani et al. share and tie (both True); at the
            sizes of benchmarks/bench_translate.py separate tables trained
            better (docs/translation.md).
        label_smoothing: float in [0, 1), on the training loss.
        **kwargs: standard model arguments (`name`, ...).

    Call arguments:
        inputs: dict with `source_ids` int `[batch, source_length]` (any
            padding) and `target_ids` int `[batch, target_length]` (the
            target starting with `bos_id`, right-padded).
        training: bool.

    Returns:
        float32 logits `[batch, target_length, vocab_size]`.

    Example:

    >>> model = Seq2SeqTransformer(num_layers=1, d_model=8, num_heads=2, dff=16, vocab_size=20,
    ...                            max_length=16)
    >>> logits = model({"source_ids": np.array([[7, 8, 9, 3]]), "target_ids": np.array([[2, 5, 6]])})
    >>> tuple(logits.shape)
    (1, 3, 20)
    >>> result = model.translate([[0, 7, 8, 9, 3], [7, 8, 9, 3, 0]], max_new_tokens=4, beam_size=2)
    >>> result.ids[0].tolist() == result.ids[1].tolist()  # left and right padding change nothing
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762).
        - [Szegedy et al., 2016](https://arxiv.org/abs/1512.00567), label smoothing.
        - [Press & Wolf, 2017](https://arxiv.org/abs/1608.05859), tied embeddings.
    """

    def __init__(self, num_layers, d_model, num_heads, dff, vocab_size, max_length, *, dropout=0.1,
                 norm_first=False, activation="relu", epsilon=1e-6, pad_id=PAD_ID, bos_id=BOS_ID,
                 eos_id=EOS_ID,
                 position="rope", position_config=None, language_scale=True, share_embeddings=False,
                 tie_output=False, label_smoothing=0.1, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_layers", num_layers)
        check_positive_int("vocab_size", vocab_size)
        check_choice("position", position, ENCODER_POSITIONS)
        check_rate("label_smoothing", label_smoothing)
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
                raise ValueError(f"`{name}` must be an int in [0, vocab_size={vocab_size}), "
                                 f"got {name}={value!r}.")
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.activation = keras.activations.serialize(keras.activations.get(activation))
        self.epsilon = float(epsilon)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.position = position
        self.position_config = dict(position_config or {})
        self.in_attention = position in ATTENTION_POSITIONS
        self.language_scale = bool(language_scale) and not self.in_attention
        self.share_embeddings = bool(share_embeddings)
        self.tie_output = bool(tie_output)
        self.label_smoothing = float(label_smoothing)
        self.eval_loss = keras.metrics.Mean(name="loss")
        self.distribute_reduction_method = "sum"

        embedding_config = dict(self.position_config)
        if self.language_scale:
            embedding_config["num_languages"] = 2
        common = {"d_model": d_model, "num_heads": num_heads, "dff": dff, "dropout": self.dropout,
                  "norm_first": self.norm_first, "activation": self.activation, "epsilon": self.epsilon}
        self.encoder = Encoder(num_layers, vocab_size=vocab_size, max_length=max_length, pad_id=pad_id,
                               position=position, position_config=embedding_config, name="encoder", **common)
        (target_position, target_config), (layer_position, layer_config) = split_position(
            position, embedding_config, max_length)
        if self.share_embeddings:
            self.target_embedding = self.encoder.embedding
        else:
            self.target_embedding = TokenAndPositionEmbedding(
                vocab_size, d_model, max_length, pad_id=pad_id, position=target_position,
                dropout=self.dropout, name="target_embedding", **embedding_kwargs(target_config))
        self.decoder_layers = [
            DecoderLayer(position=layer_position, position_config=layer_config, name=f"decoder_layer_{i}",
                         **common)
            for i in range(num_layers)
        ]
        self.decoder_norm = None
        if self.norm_first:
            self.decoder_norm = keras.layers.LayerNormalization(axis=-1, epsilon=self.epsilon,
                                                                name="decoder_norm")
        self.head = None if self.tie_output else keras.layers.Dense(vocab_size, name="lm_head")

    # The forward pass -----------------------------------------------------------------------------
    @static_call
    def call(self, inputs, training=None):
        source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
        encoder_outputs, source_mask = self.encode(source_ids, training=training)
        return self.decode(target_ids, encoder_outputs, source_mask, training=training)

    def _languages(self, ids, language):
        if not self.language_scale:
            return None
        return ops.full(ops.shape(ids), language, "int32")

    def encode(self, source_ids, training=False):
        """The encoder's outputs `[batch, source_length, d_model]` and the mask of the real source tokens."""
        source_mask = ops.not_equal(source_ids, self.pad_id)
        outputs = self.encoder(source_ids, language_ids=self._languages(source_ids, SOURCE_LANGUAGE),
                               training=training)
        return outputs, source_mask

    def _target_positions(self, target_ids, start=0):
        # Targets start at `bos_id` in slot 0 and are right-padded: position = slot.
        length = ops.shape(target_ids)[1]
        return ops.broadcast_to(ops.cast(start, "int32") + ops.arange(length, dtype="int32")[None],
                                ops.shape(target_ids))

    def decode(self, target_ids, encoder_outputs, source_mask, training=False):
        """Logits `[batch, target_length, vocab_size]` (float32) of the whole target, teacher-forced."""
        # RoPE/ALiBi: the slots are the positions (0 .. T - 1 in every row), which the attention
        # takes from one broadcast table when given none; right padding only follows the real tokens,
        # which the causal mask already keeps from them. Additive positions: the embedding adds them.
        if self.in_attention:
            positions = layer_mask = None
        else:
            positions = self._target_positions(target_ids)
            layer_mask = ops.not_equal(target_ids, self.pad_id)
        x = self.target_embedding(target_ids, position_ids=positions,
                                  language_ids=self._languages(target_ids, TARGET_LANGUAGE),
                                  training=training)
        for layer in self.decoder_layers:
            x = layer(x, encoder_outputs, mask=layer_mask, encoder_mask=source_mask, training=training)
        return self._logits(x)

    def _logits(self, x):
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if self.head is not None:
            return ops.cast(self.head(x), "float32")
        table = self.target_embedding.token_embedding.embeddings
        return ops.cast(ops.matmul(x, ops.transpose(ops.cast(table, x.dtype))), "float32")

    # Cached decoding --------------------------------------------------------------------------------
    def cross_key_values(self, encoder_outputs):
        """Each decoder layer's cross-attention `(keys, values)`, `[batch, source_length, heads, head_dim]`
        each."""
        return [layer.cross_key_value(encoder_outputs) for layer in self.decoder_layers]

    def cross_cache(self, encoder_outputs):
        """Every decoder layer's cross-attention keys and values.

        Returns:
            float `[batch, num_layers, 2, source_length, heads, head_dim]`.
        """
        pairs = [ops.stack(pair, axis=1) for pair in self.cross_key_values(encoder_outputs)]
        return ops.stack(pairs, axis=1)

    def cache_shape(self, batch_size, cache_length):
        """An empty self-attention cache's shape: `[batch, num_layers, 2, cache_length, heads, head_dim]`."""
        return (batch_size, self.num_layers, 2, cache_length, self.num_heads, self.d_model // self.num_heads)

    def decode_step(self, target_ids, cache, cache_index, cross_cache, source_mask):
        """Logits of a target chunk starting at slot `cache_index`, and the updated self-attention cache.

        Args:
            target_ids: int `[batch, length]`, the chunk (slot 0 holds `bos_id`).
            cache: float `cache_shape(batch, cache_length)`.
            cache_index: int scalar, the chunk's first slot.
            cross_cache: `cross_cache(encoder_outputs)`.
            source_mask: bool `[batch, source_length]`.

        Returns:
            `(logits float32 [batch, length, vocab_size], cache)`.
        """
        layers = range(self.num_layers)
        logits, keys, values = self.cached_layers(
            target_ids, [cache[:, i, 0] for i in layers], [cache[:, i, 1] for i in layers], cache_index,
            [cross_cache[:, i, 0] for i in layers], [cross_cache[:, i, 1] for i in layers], source_mask)
        return logits, ops.stack([ops.stack(pair, axis=1) for pair in zip(keys, values)], axis=1)

    def cached_layers(self, target_ids, keys, values, cache_index, cross_keys, cross_values, source_mask,
                      embeddings=None, write_cache=None):
        """`decode_step` over one cache tensor per layer and kind (an exported decoder's inputs).

        Args:
            target_ids, cache_index, source_mask: as `decode_step`.
            keys, values: per decoder layer, float `[batch, cache_length, heads, head_dim]`.
            cross_keys, cross_values: per decoder layer, `cross_key_values(encoder_outputs)`.
            embeddings: optional float `[batch, length, d_model]`, the target embedding's output
                (an export computes it in its target's formulation), else the layer's.
            write_cache: optional, how each layer's cache is written
                (`PositionalAttention.cached_attention`; an export may use its runtime's op).

        Returns:
            `(logits float32 [batch, length, vocab_size], keys, values)`, the caches with the chunk
            written.
        """
        positions = self._target_positions(target_ids, cache_index)
        x = embeddings
        if x is None:
            x = self.target_embedding(target_ids, position_ids=None if self.in_attention else positions,
                                      language_ids=self._languages(target_ids, TARGET_LANGUAGE),
                                      training=False)
        new_keys, new_values = [], []
        for layer, key, value, cross_key, cross_value in zip(self.decoder_layers, keys, values, cross_keys,
                                                             cross_values):
            x, key, value = layer.cached_step(x, key, value, cache_index, positions, cross_key, cross_value,
                                              source_mask, write_cache=write_cache)
            new_keys.append(key)
            new_values.append(value)
        return self._logits(x), new_keys, new_values

    def _functions(self):
        if self not in _FUNCTIONS:
            def encode(source_ids):
                outputs, mask = self.encode(source_ids, training=False)
                return self.cross_cache(outputs), mask

            def step(tokens, cache, index, cross, mask):
                logits, cache = self.decode_step(tokens, cache, index, cross, mask)
                return ops.log_softmax(logits[:, -1], axis=-1), cache

            _FUNCTIONS[self] = (inference_function(self, encode), inference_function(self, step))
        return _FUNCTIONS[self]

    def translate(self, source_ids, max_new_tokens=None, *, beam_size=4, alpha=DEFAULT_LENGTH_PENALTY):
        """Translates a batch of sources with a key/value cache: beam search, or greedy with `beam_size=1`.

        The encoder runs once; each decoder layer's cross-attention keys and
        values are computed once per sentence; each step runs one token per
        hypothesis over the self-attention cache. Rows may be padded on
        either side.

        Args:
            source_ids: int `[batch, length]` (or `[length]`); each row holds
                its sentence (ending in `eos_id`, as in training) and `pad_id`.
            max_new_tokens: int, tokens at most per hypothesis, the end token
                included (default and limit: `max_length - 1`, the
                positions after `bos_id`).
            beam_size: int >= 1.
            alpha: float >= 0, the length penalty's exponent. 1.0 (Vaswani
                et al. used 0.6): on the dev packages of the Debian corpus, 1.0
                gave 17.1 BLEU with beam 4 against 16.5 for 0.6
                (docs/translation.md).

        Returns:
            A `keras_posenc.beam_search.SearchResult`: `.ids`, one int array
            per row without `bos_id` and `eos_id`.
        """
        source = np.asarray(source_ids)
        if source.ndim == 1:
            source = source[None]
        if source.ndim != 2 or source.size == 0 or source.dtype.kind not in "iu":
            raise ValueError(f"`source_ids` must be int [batch, length] with at least one token, got "
                             f"shape {source.shape} and dtype {source.dtype}.")
        if ((source < 0) | (source >= self.vocab_size)).any():
            raise ValueError(f"`source_ids` must lie in [0, vocab_size={self.vocab_size}).")
        if source.shape[1] > self.max_length and self.position_config.get("overflow", "error") != "extend":
            source = _without_padding_columns(source, self.pad_id)
            if source.shape[1] > self.max_length:
                raise ValueError(f"A source of {source.shape[1]} tokens is longer than the model's "
                                 f"max_length={self.max_length}.")
        limit = self.max_length - 1
        max_new_tokens = limit if max_new_tokens is None else max_new_tokens
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or \
                not 1 <= max_new_tokens <= limit:
            raise ValueError(f"`max_new_tokens` must be an int in [1, max_length - 1 = {limit}], got "
                             f"max_new_tokens={max_new_tokens!r}.")
        encode, step = self._functions()
        cross, mask = encode(ops.convert_to_tensor(source.astype(np.int32)))
        batch = source.shape[0]
        state = {"cross": cross, "mask": mask, "index": 0,
                 "cache": ops.zeros(self.cache_shape(batch, max_new_tokens), self.compute_dtype)}

        def run(tokens, state):
            log_probs, cache = step(ops.convert_to_tensor(np.asarray(tokens, np.int32).reshape(-1, 1)),
                                    state["cache"], ops.convert_to_tensor(np.int32(state["index"])),
                                    state["cross"], state["mask"])
            return ops.convert_to_numpy(log_probs), {**state, "cache": cache, "index": state["index"] + 1}

        def reorder(state, rows):
            # The beams of a sentence share its source: only the first call, which repeats every
            # sentence beam_size times, changes which source a row reads.
            keys = ("cache",) if len(rows) == ops.shape(state["cache"])[0] else ("cross", "mask", "cache")
            rows = ops.convert_to_tensor(np.asarray(rows, np.int32))
            return {**state, **{key: ops.take(state[key], rows, axis=0) for key in keys}}

        first, state = run(np.full([batch], self.bos_id), state)
        return beam_search(first, state, run, reorder, beam_size=beam_size,
                           max_new_tokens=int(max_new_tokens), end_id=self.eos_id, alpha=alpha,
                           forbidden_ids=(self.pad_id, self.bos_id))

    # Training --------------------------------------------------------------------------------------
    def token_loss_sums(self, data, training=False):
        """`(sum of the losses of the real labels, their count)` of one batch; label-smoothed when training.

        Args:
            data: `(features, labels)`, labels int `[batch, target_length]`;
                labels equal to `pad_id` are left out.
            training: bool; the smoothed loss
                `(1 - eps) * CE + eps * mean over the vocabulary of -log p`.

        Returns:
            two float32 scalars.
        """
        features, labels = data
        logits = self(features, training=training)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        nll = -tf.gather(log_probs, tf.cast(labels, tf.int32), axis=-1, batch_dims=2)
        if training and self.label_smoothing:
            uniform = -tf.reduce_mean(log_probs, axis=-1)
            nll = (1.0 - self.label_smoothing) * nll + self.label_smoothing * uniform
        real = tf.cast(tf.not_equal(labels, self.pad_id), tf.float32)
        return tf.reduce_sum(nll * real), tf.reduce_sum(real)

    def build_on_dummy(self):
        """Creates the weights by calling the model on a tiny batch."""
        ids = np.full([1, 2], min(self.pad_id + 1, self.vocab_size - 1), np.int32)
        self({"source_ids": ids, "target_ids": ids}, training=False)

    def get_build_config(self):
        return {"built": True}

    def build_from_config(self, config):
        self.build_on_dummy()

    def get_config(self):
        return {
            "num_layers": self.num_layers, "d_model": self.d_model, "num_heads": self.num_heads,
            "dff": self.dff,
            "vocab_size": self.vocab_size, "max_length": self.max_length, "dropout": self.dropout,
            "norm_first": self.norm_first, "activation": self.activation, "epsilon": self.epsilon,
            "pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id, "position": self.position,
            "position_config": dict(self.position_config), "language_scale": self.language_scale,
            "share_embeddings": self.share_embeddings, "tie_output": self.tie_output,
            "label_smoothing": self.label_smoothing, "name": self.name,
        }


def _without_padding_columns(source, pad_id):
    """A batch padded wider than needed, narrowed: each row's tokens right-padded to the longest row.

    A batch none of whose columns is all padding is returned as it is.
    """
    if (source != pad_id).any(axis=0).all():
        return source
    rows = [row[row != pad_id] for row in source]
    out = np.full([len(rows), max(len(row) for row in rows)], pad_id, source.dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out
