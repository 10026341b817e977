"""The tiny language model of the export-quality and quantization tests: one layer, d_model 32."""

from keras_posenc.backend import keras


def tiny_lm(vocab_size, seed):
    """A built `CausalLM` (1 layer, d_model 32, 2 heads, dff 64, max_length 16, no dropout), its
    weights drawn from `seed`."""
    from keras_posenc.models import CausalLM

    keras.utils.set_random_seed(seed)
    model = CausalLM(dict(num_layers=1, d_model=32, num_heads=2, dff=64, vocab_size=vocab_size, max_length=16,
                          dropout=0.0), name="lm")
    model.build_on_dummy()
    return model
