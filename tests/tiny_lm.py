"""The tiny language models of the export tests (one layer, d_model 32, and variants) and of the trainer's."""

import numpy as np

from keras_posenc.backend import keras

# The trainer's tiny model (`TrainConfig` fields), quiet: it builds in a moment and trains a step in
# milliseconds, for the tests of `keras_posenc.app.train`.
TINY_TRAINER_MODEL = {"batch_size": 4, "num_layers": 1, "d_model": 16, "num_heads": 2, "dff": 32,
                      "max_length": 16, "vocab_size": 150, "verbose": 0}


def tiny_lm(vocab_size, seed):
    """A built `CausalLM` (1 layer, d_model 32, 2 heads, dff 64, max_length 16, no dropout), its
    weights drawn from `seed`."""
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(seed)
    model = CausalLM(dict(num_layers=1, d_model=32, num_heads=2, dff=64, vocab_size=vocab_size, max_length=16,
                          dropout=0.0), name="lm")
    model.build_on_dummy()
    return model


def two_language_lm(vocab_size):
    """`tiny_lm`'s shape with `num_languages=2`, language 1 scaled by 0.25 (language 0 by 1), seed 4."""
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(4)
    model = CausalLM(dict(num_layers=1, d_model=32, num_heads=2, dff=64, vocab_size=vocab_size, max_length=16,
                          dropout=0.0, num_languages=2), name="lm")
    model.build_on_dummy()
    [scale] = [weight for weight in model.weights if "language_scale" in weight.name]
    scale.assign([1.0, 0.25])
    return model


def perturbed_causal_lm(config):
    """A built `CausalLM(config)` (seed 3) whose every trainable weight is moved off its initial value:
    zero biases and LayerNorm's 0 and 1 would hide a dropped term."""
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(3)
    model = CausalLM(config)
    model.build_on_dummy()
    rng = np.random.default_rng(7)
    for weight in model.trainable_weights:
        weight.assign(np.asarray(weight) + rng.normal(0.0, 0.1, weight.shape).astype(np.float32))
    return model
