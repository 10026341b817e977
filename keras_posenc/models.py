"""The package's language model and its optimizer recipe.

`CausalLM` is the model that `keras-posenc train` trains, `ablate` compares,
`inspect` probes and `export` converts; `transformer_adam` is the optimizer
all of them train it with. Importing this module registers `CausalLM` for
`keras.models.load_model`.

Loss: the mean cross-entropy over every real (non-padding) label of the
global batch. Each replica divides its sum by the token count of the whole
global batch (an all-reduce), and the optimizer sums the replicas'
gradients, so one device and N devices compute the same update (up to
the order of float additions). On Keras 3 the gradients reach the
optimizer dense, so an embedding row looked up several times gets Adam's
update for the sum of its gradients, as on Keras 2.

References:
    - Vaswani et al., "Attention Is All You Need", 2017, section 5.3
      (Adam and the warmup schedule), https://arxiv.org/abs/1706.03762.
    - TensorFlow, "Custom training with tf.distribute.Strategy", loss
      scaling by the global batch,
      https://www.tensorflow.org/tutorials/distribute/custom_training.
"""

import tensorflow as tf

from keras_posenc.backend import dense_gradients, keras, ops, static_call
from keras_posenc.generation import generate as _generate
from keras_posenc.layers.encoder import Encoder
from keras_posenc.schedules import WarmupSchedule

__all__ = ["CausalLM", "TokenLossTraining", "transformer_adam"]


def transformer_adam(d_model, warmup_steps=4000, scale=1.0):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on `WarmupSchedule(d_model, warmup_steps, scale)`.

    Args:
        d_model: int, the model width (the schedule's peak is
            `scale * d_model**-0.5 * warmup_steps**-0.5`).
        warmup_steps: int, steps of linear warmup.
        scale: float, factor on the schedule.

    Returns:
        a `keras.optimizers.Adam`.

    Example:

    >>> optimizer = transformer_adam(64, warmup_steps=100)
    >>> float(optimizer.beta_2), float(optimizer.epsilon)
    (0.98, 1e-09)
    >>> round(float(optimizer.learning_rate), 9)  # first step: 64**-0.5 * 1 * 100**-1.5
    0.000125

    References:
        - Vaswani et al., "Attention Is All You Need", 2017, section 5.3,
          https://arxiv.org/abs/1706.03762.
    """
    return keras.optimizers.Adam(WarmupSchedule(d_model, warmup_steps, scale=scale),
                                 beta_1=0.9, beta_2=0.98, epsilon=1e-9)


class TokenLossTraining:
    """`train_step`, `test_step` and `metrics` of a model trained on the mean loss of its real labels.

    The model defines `token_loss_sums(data, training)`, the sum of the
    losses of one batch's real labels and their count; this mixin divides by
    the count of the whole global batch (see the module docstring) and keeps
    the token-weighted eval loss. Put it before `keras.Model`; the model sets
    `eval_loss = keras.metrics.Mean(name="loss")` and
    `distribute_reduction_method = "sum"` in its constructor.
    """

    def train_step(self, data):
        context = tf.distribute.get_replica_context()
        with tf.GradientTape() as tape:
            local_sum, local_count = self.token_loss_sums(data, training=True)
            global_count = context.all_reduce(tf.distribute.ReduceOp.SUM, local_count)
            loss = local_sum / tf.maximum(global_count, 1.0)
        gradients = tape.gradient(loss, self.trainable_variables)  # Keras 3 optimizers have no `minimize`
        self.optimizer.apply_gradients(zip(_dense(gradients), self.trainable_variables))
        # Per-replica shares; Keras sums them over replicas (distribute_reduction_method="sum").
        return {"loss": loss, "tokens": local_count}

    def test_step(self, data):
        local_sum, local_count = self.token_loss_sums(data, training=False)
        self.eval_loss.update_state(local_sum / tf.maximum(local_count, 1.0), sample_weight=local_count)
        return {"loss": self.eval_loss.result()}

    @property
    def metrics(self):
        return [self.eval_loss]


@keras.utils.register_keras_serializable(package="keras_posenc")
class CausalLM(TokenLossTraining, keras.Model):
    """A next-token language model: `Encoder` + `Dense(vocab_size)` head.

    Args:
        encoder_config: dict, the keyword arguments of `keras_posenc.Encoder`.
            Its `pad_id` (default 0) marks the labels left out of the loss.
        causal: bool, apply the causal mask. With False every position sees
            the whole input, so a next-token model can read its answer at
            `i + 1` (the setup of a position ablation without a causal mask).
        **kwargs: standard model arguments (`name`, ...).

    Call arguments:
        inputs: int token ids `[batch, length]`, or a dict with `token_ids`
            and optionally `position_ids`, `language_ids`.
        position_ids: optional int `[batch, length]`.
        language_ids: int `[batch]` or `[batch, length]` when the position
            layer has `num_languages`.
        training: bool.
        cache: optional float `[batch, num_layers, 2, cache_length, heads,
            head_dim]` key/value cache (`encoder.cache_shape(...)`), for
            incremental causal decoding; `inputs` is then the chunk of tokens
            that starts at slot `cache_index`.
        cache_index: int scalar, the cache slot of the chunk's first token.

    Returns:
        float32 logits `[batch, length, vocab_size]`; with `cache`, the pair
        `(logits, updated cache)`.

    Training (`fit`) minimizes the mean cross-entropy over the non-padding
    labels of the global batch (see the module docstring); `evaluate`
    reports the token-weighted mean loss.

    Example:

    >>> config = {"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 20,
    ...           "max_length": 16}
    >>> model = CausalLM(config)
    >>> model(tf.constant([[2, 7, 9, 0]])).shape
    TensorShape([1, 4, 20])
    >>> clone = CausalLM.from_config(model.get_config())
    >>> clone.encoder_config == config, clone.causal
    (True, True)

    References:
        - Vaswani et al., "Attention Is All You Need", 2017,
          https://arxiv.org/abs/1706.03762.
    """

    def __init__(self, encoder_config, causal=True, **kwargs):
        super().__init__(**kwargs)
        self.encoder_config = dict(encoder_config)
        self.causal = bool(causal)
        self.pad_id = self.encoder_config.get("pad_id", 0)
        self.encoder = Encoder(**self.encoder_config, name="encoder")
        self.head = keras.layers.Dense(self.encoder_config["vocab_size"], name="lm_head")
        self.num_languages = self.encoder.position_config.get("num_languages")  # flat or in position_config
        self.eval_loss = keras.metrics.Mean(name="loss")
        self.distribute_reduction_method = "sum"

    @static_call
    def call(self, inputs, position_ids=None, language_ids=None, training=None, cache=None, cache_index=None):
        if isinstance(inputs, dict):
            position_ids = inputs.get("position_ids", position_ids)
            language_ids = inputs.get("language_ids", language_ids)
            inputs = inputs["token_ids"]
        if cache is not None:
            if not self.causal:
                raise ValueError("`cache` needs a causal model; this CausalLM has causal=False.")
            x, cache = self.encoder(inputs, position_ids=position_ids, language_ids=language_ids, cache=cache,
                                    cache_index=cache_index)
            return ops.cast(self.head(x), "float32"), cache
        x = self.encoder(inputs, position_ids=position_ids, language_ids=language_ids,
                         use_causal_mask=self.causal, training=training)
        return ops.cast(self.head(x), "float32")

    def generate(self, prompt_ids, max_new_tokens, *, sampler="greedy", temperature=1.0, k=None, p=None,
                 seed=None, stop_id=None, language_ids=None):
        """Generates `max_new_tokens` ids after each prompt, with a key/value cache.

        One prefill pass over the prompts, then one decode step per token,
        each attending over the cached keys and values of every earlier
        token. A left-padded row gets position ids counted over its real
        tokens and never attends to its padding, so it continues exactly as
        the same prompt without padding. `pad_id` is never generated.

        Args:
            prompt_ids: int `[length]` or `[batch, length]`, rows left-padded
                with `pad_id`.
            max_new_tokens: int >= 1.
            sampler: "greedy", "top_k" or "top_p".
            temperature: float > 0 (sampling).
            k: int, for "top_k".
            p: float in (0, 1], for "top_p".
            seed: int or None, for the samplers' numpy generator.
            stop_id: optional int; a row that emits it is finished and the
                rest of its ids are `pad_id`.
            language_ids: int or int `[batch]`, with `num_languages`.

        Returns:
            A `keras_posenc.generation.GenerationResult`: `.ids` int numpy
            `[batch, max_new_tokens]`, and the prefill and decode times.

        Raises:
            ValueError: an empty or right-padded prompt, an id outside the
                vocabulary, more positions than `max_length`, a bad sampler
                setting, or a model with `causal=False`.

        Example:

        >>> model = CausalLM({"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16,
        ...                   "vocab_size": 20, "max_length": 16})
        >>> result = model.generate([[0, 4, 5], [3, 4, 5]], max_new_tokens=3)
        >>> result.ids.shape
        (2, 3)
        >>> unpadded = model.generate([4, 5], max_new_tokens=3)
        >>> bool((result.ids[0] == unpadded.ids[0]).all())  # left padding changes nothing
        True
        """
        return _generate(self, prompt_ids, max_new_tokens, sampler=sampler, temperature=temperature, k=k, p=p,
                         seed=seed, stop_id=stop_id, language_ids=language_ids)

    def token_loss_sums(self, data, training=False):
        """`(sum of the cross-entropies of the real labels, their count)` of one batch.

        Args:
            data: `(features, labels)`, labels int `[batch, length]`;
                labels equal to `pad_id` are left out.
            training: bool.

        Returns:
            two float32 scalars.
        """
        features, labels = data
        logits = self(features, training=training)
        losses = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        real = tf.cast(tf.not_equal(labels, self.pad_id), tf.float32)
        return tf.reduce_sum(losses * real), tf.reduce_sum(real)

    def build_on_dummy(self):
        """Creates the weights by calling the model on a tiny batch."""
        ids = tf.fill([1, 2], min(self.pad_id + 1, self.encoder_config["vocab_size"] - 1))
        languages = tf.zeros([1, 2], tf.int32) if self.num_languages else None
        self(ids, language_ids=languages, training=False)

    def get_build_config(self):
        return {"built": True}

    def build_from_config(self, config):
        self.build_on_dummy()

    def get_config(self):
        return {"encoder_config": self.encoder_config, "causal": self.causal, "name": self.name}


def _dense(gradients):
    """On Keras 3, the gradients as dense tensors: an embedding's `IndexedSlices` summed per row.

    An embedding lookup's gradient holds one slice per looked-up token, so a
    token seen twice has two slices. Keras 3's Adam (TensorFlow backend)
    squares the slices one by one, so its second moment gets `g1**2 + g2**2`
    instead of `(g1 + g2)**2`. Keras 2's optimizers sum duplicate slices
    themselves, so there the gradients pass unchanged (and Keras 2 runs keep
    their exact numbers).
    """
    return dense_gradients(gradients)
