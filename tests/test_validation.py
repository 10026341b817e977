"""The shared argument checks: types, ranges and message texts, eager and in graphs."""

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import validation


@pytest.mark.parametrize("call, error, message", [
    (lambda: validation.check_positive_int("depth", 2.5), TypeError,
     r"^`depth` must be an int, got depth=2\.5\.$"),
    (lambda: validation.check_positive_int("depth", True), TypeError,
     r"^`depth` must be an int, got depth=True\.$"),
    (lambda: validation.check_positive_int("depth", 0), ValueError, r"^`depth` must be >= 1, got depth=0\.$"),
    (lambda: validation.check_positive_int("start", -1, minimum=0), ValueError,
     r"^`start` must be >= 0, got start=-1\.$"),
    (lambda: validation.check_positive_ints([("steps", 3), ("batch_size", 1.0)]), ValueError,
     r"^`batch_size` must be a positive int, got batch_size=1\.0\.$"),
    (lambda: validation.check_choice("layout", "rows", ("interleave", "concat")), ValueError,
     r"^`layout` must be one of \('interleave', 'concat'\), got layout='rows'\.$"),
    (lambda: validation.check_rate("dropout", -0.1), ValueError,
     r"^`dropout` must be a float in \[0, 1\), got dropout=-0\.1\.$"),
    (lambda: validation.check_epsilon(False), ValueError,
     r"^`epsilon` must be a float > 0, got epsilon=False\.$"),
    (lambda: validation.check_base(float("inf")), ValueError,
     r"^`base` must be a finite number > 1, got base=inf\.$"),
    (lambda: validation.check_base("big"), TypeError, r"^`base` must be a number, got base='big'\.$"),
    (lambda: validation.check_stored_dims(10, depth=8), ValueError,
     r"^`stored_dims` must be <= depth=8, got stored_dims=10\.$"),
    (lambda: validation.check_stored_dims(0), ValueError,
     r"^`stored_dims` must be >= 2, got stored_dims=0\.$"),
])
def test_bad_values_raise_typed_errors_naming_argument_and_value(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_numpy_scalars_are_accepted_where_python_numbers_are():
    validation.check_positive_int("depth", np.int64(4))
    validation.check_positive_ints([("steps", np.int32(2))])
    validation.check_base(np.float32(100.0))
    validation.check_stored_dims(np.int64(8), depth=8)
    with pytest.raises(ValueError, match="got depth=0"):
        validation.check_positive_int("depth", np.int64(0))


def test_tensor_check_has_the_same_text_eager_and_in_a_graph():
    template = "`offset` must be >= 0, got offset={}."
    with pytest.raises(ValueError, match=r"^`offset` must be >= 0, got offset=-1\.$"):
        validation.check(tf.constant(-1) >= 0, template, tf.constant(-1))

    @tf.function
    def checked(x):
        return validation.with_checks(x + 1, validation.check(x >= 0, template, x))

    assert int(checked(tf.constant(4))) == 5
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`offset` must be >= 0, got offset=-3\."):
        checked(tf.constant(-3))


def test_checks_are_left_out_under_xla():
    @tf.function(jit_compile=True)
    def compiled(x):
        return validation.with_checks(x * 2, validation.check(x >= 0, "`x` must be >= 0, got x={}.", x))

    assert int(compiled(tf.constant(-2))) == -4  # no assertion op can be compiled; the caller's contract


def test_only_the_validation_module_defines_generic_checks():
    import keras_posenc.layers.encoder_layer as encoder_layer
    import keras_posenc.layers.position_embedding_base as base
    import keras_posenc.tables as tables
    for module in (tables, base, encoder_layer):
        for name in ("check_choice", "check_positive_int", "check_rate", "check_epsilon", "check_base",
                     "check_stored_dims"):
            value = getattr(module, name, None)
            assert value is None or value is getattr(validation, name), (module.__name__, name)
