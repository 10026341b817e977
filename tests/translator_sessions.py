"""A translator's signatures as a session without conversion, for the tests of what runs over the files.

`FunctionSession` has the interface of `runners.TranslatorSession` (`run`, `source_length`,
`cache_shape`, `beam_rows`) over `translator.TranslatorSignatures`' `tf.function`s, the functions the
converter is given, and records each call's signature.
"""

import numpy as np

from keras_posenc.export import translator


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


def function_session(model, source_length, cache_length, beam_rows=0,
                     write_cache=translator.write_by_update_slice):
    """A `FunctionSession` over the float32 clone of `model`, as the `cpu` file computes it."""
    clone = translator.float32_clone(model, cache_length)
    return FunctionSession(translator.TranslatorSignatures(clone, source_length, cache_length, beam_rows,
                                                           write_cache=write_cache))
