"""A translator's signatures as a session without conversion, for the tests of what runs over the files.

`FunctionSession` has the interface of `runners.TranslatorSession` (`run`, `source_length`,
`cache_shape`, `beam_rows`) over `translator.TranslatorSignatures`' `tf.function`s, the functions the
converter is given, and records each call's signature. `sharp_translator` and `check_sources` are
the tiny model and the sources these tests run it on.
"""

import copy

import numpy as np

from keras_posenc.backend import keras
from keras_posenc.export import translator
from keras_posenc.seq2seq import Seq2SeqTransformer

SOURCE_LENGTH, CACHE_LENGTH, VOCAB = 8, 9, 40


def sharp_translator(seed=0):
    """A tiny translator with sharp distributions (its head scaled up), so that searches pick real
    tokens."""
    keras.utils.set_random_seed(seed)
    model = Seq2SeqTransformer(num_layers=2, d_model=16, num_heads=2, dff=32, vocab_size=VOCAB, max_length=12,
                               dropout=0.0)
    model.build_on_dummy()
    model.head.kernel.assign(np.asarray(model.head.kernel) * 8.0)
    return model


def check_sources(model, seed=0):
    """Three sources of 1, 4 and `SOURCE_LENGTH - 1` ordinary ids (seeded), each ending in `eos_id`."""
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(5, VOCAB, n))) + [model.eos_id] for n in (1, 4, SOURCE_LENGTH - 1)]


class FunctionSession:
    """`runners.TranslatorSession`'s interface over a `TranslatorSignatures`' functions."""

    def __init__(self, module):
        self.functions = {name: function for name, (function, _) in module.signatures().items()}
        self.source_length = module.source_length
        self.cache_shape = module.cache_shape
        self.beam_rows = module.beam_rows
        self.calls = []

    def run(self, signature, feeds):
        self.calls.append(signature)
        function = self.functions[signature]
        args = [feeds[spec.name] for spec in function.input_signature]
        assert len(feeds) == len(args), sorted(feeds)
        return {name: np.asarray(value) for name, value in function(*args).items()}


# (model, lengths, beam rows, write_cache) -> the first session of those arguments, whose traced
# functions the later ones share (each with its own `calls`)
_TRACED = {}


def function_session(model, source_length, cache_length, beam_rows=0,
                     write_cache=translator.write_by_update_slice):
    """A `FunctionSession` over the float32 clone of `model`, as the `cpu` file computes it; its
    functions are traced once per model and arguments (the clone's weights are `model`'s at that time:
    the tests do not change their models' weights)."""
    key = (model, source_length, cache_length, beam_rows, write_cache)
    if key not in _TRACED:
        clone = translator.float32_clone(model, cache_length)
        _TRACED[key] = FunctionSession(translator.TranslatorSignatures(clone, source_length, cache_length,
                                                                       beam_rows, write_cache=write_cache))
    session = copy.copy(_TRACED[key])
    session.calls = []
    return session
