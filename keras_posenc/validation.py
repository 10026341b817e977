"""Argument checks shared by every module of the package.

Constructor arguments are plain Python values: the `check_*` functions raise
`TypeError` for a value of the wrong type and `ValueError` for a value out of
range, with a message naming the argument and the offending value.

Tensor values are checked with `check` and `with_checks`, which read the same
in eager mode and in graphs. Eager calls raise `ValueError` (the value is
known, so the check is plain Python). Inside a `tf.function` the check
becomes an assertion op, which raises `tf.errors.InvalidArgumentError` with
the same message text when the graph runs. Under XLA assertions cannot be
compiled, so they are left out there; shapes and ranges are then the
caller's contract.

On the JAX backend (Keras 3) eager calls raise the same `ValueError`. Under
`jax.jit` (`model.fit`, `predict`, a jitted function) tensor values are not
known, so `check` adds nothing there: ranks, dtypes and lengths known while
tracing are still checked in Python (`ValueError`/`TypeError` at trace
time), but value ranges (`position_ids`, `language_ids`, `offset`, a
length past `max_length` that only the data reveals) are the caller's
contract, as under XLA on TensorFlow.

This module sits below every other one (`tables` is pure numpy and imports
it), so TensorFlow is imported only when a tensor check runs.
"""

import math
import numbers

__all__ = [
    "check",
    "check_equal_dims",
    "check_base",
    "check_choice",
    "check_epsilon",
    "check_positive_int",
    "check_positive_ints",
    "check_rate",
    "check_stored_dims",
    "with_checks",
]


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_choice(name, value, choices):
    """Raises ValueError unless `value` is one of `choices`.

    Args:
        name: the argument name shown in the message.
        value: the value to check.
        choices: a collection of allowed values (a tuple, or a dict's keys).

    Example:

    >>> check_choice("overflow", "extend", ("error", "extend"))
    >>> check_choice("overflow", "wrap", ("error", "extend"))
    Traceback (most recent call last):
        ...
    ValueError: `overflow` must be one of ('error', 'extend'), got overflow='wrap'.
    """
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}, got {name}={value!r}.")


def check_positive_int(name, value, minimum=1):
    """Raises TypeError unless `value` is an int (not a bool), ValueError unless it is >= `minimum`.

    Args:
        name: the argument name shown in the message.
        value: the value to check (a Python or numpy integer).
        minimum: int, the smallest allowed value.

    Example:

    >>> check_positive_int("max_length", 512)
    >>> check_positive_int("start", 0, minimum=0)
    >>> check_positive_int("max_length", 0)
    Traceback (most recent call last):
        ...
    ValueError: `max_length` must be >= 1, got max_length=0.
    >>> check_positive_int("max_length", 8.0)
    Traceback (most recent call last):
        ...
    TypeError: `max_length` must be an int, got max_length=8.0.
    """
    if not _is_int(value):
        raise TypeError(f"`{name}` must be an int, got {name}={value!r}.")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {name}={value}.")


def check_positive_ints(settings):
    """Raises ValueError naming the first setting that is not an int >= 1.

    For settings read from a config or a command line, where one error type
    serves every bad value.

    Args:
        settings: iterable of `(name, value)` pairs.

    Example:

    >>> check_positive_ints([("steps", 300), ("batch_size", 32)])
    >>> check_positive_ints([("steps", 300), ("batch_size", 0)])
    Traceback (most recent call last):
        ...
    ValueError: `batch_size` must be a positive int, got batch_size=0.
    """
    for name, value in settings:
        if not _is_int(value) or value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {name}={value!r}.")


def check_rate(name, value):
    """Raises ValueError unless `value` is a number (not a bool) in [0, 1).

    Args:
        name: the argument name shown in the message (`"dropout"`).
        value: the value to check.

    Example:

    >>> check_rate("dropout", 0.1)
    >>> check_rate("dropout", 1.0)
    Traceback (most recent call last):
        ...
    ValueError: `dropout` must be a float in [0, 1), got dropout=1.0.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"`{name}` must be a float in [0, 1), got {name}={value!r}.")


def check_epsilon(value):
    """Raises ValueError unless `value`, a LayerNormalization epsilon, is a number > 0.

    Args:
        value: the value to check.

    Example:

    >>> check_epsilon(1e-6)
    >>> check_epsilon(0)
    Traceback (most recent call last):
        ...
    ValueError: `epsilon` must be a float > 0, got epsilon=0.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"`epsilon` must be a float > 0, got epsilon={value!r}.")


def check_base(base):
    """Raises TypeError unless `base` is a number, ValueError unless it is finite and > 1.

    Args:
        base: the value to check (the wavelength base of a sinusoid).

    Example:

    >>> check_base(10000.0)
    >>> check_base(1)
    Traceback (most recent call last):
        ...
    ValueError: `base` must be a finite number > 1, got base=1.
    """
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"`base` must be a number, got base={base!r}.")
    if not math.isfinite(base) or base <= 1:
        raise ValueError(f"`base` must be a finite number > 1, got base={base!r}.")


def check_stored_dims(stored_dims, depth=None):
    """Validates `stored_dims` of an interpolated table: an even int, 2 <= stored_dims <= depth.

    `None` is accepted (the default, see `tables.resolve_stored_dims`).
    `depth` is checked only when given.

    Args:
        stored_dims: the value to check, or None.
        depth: optional int, the table width `stored_dims` may not exceed.

    Raises:
        TypeError: `stored_dims` is not an int.
        ValueError: it is odd, below 2 or above `depth`.

    Example:

    >>> check_stored_dims(None)
    >>> check_stored_dims(8, depth=16)
    >>> check_stored_dims(7)
    Traceback (most recent call last):
        ...
    ValueError: `stored_dims` must be even (whole sin/cos pairs), got stored_dims=7.
    """
    if stored_dims is None:
        return
    check_positive_int("stored_dims", stored_dims, minimum=2)
    if stored_dims % 2:
        raise ValueError(f"`stored_dims` must be even (whole sin/cos pairs), got stored_dims={stored_dims}.")
    if depth is not None and stored_dims > depth:
        raise ValueError(f"`stored_dims` must be <= depth={depth}, got stored_dims={stored_dims}.")


def _in_xla_context():
    """True while tracing a function that XLA will compile."""
    import tensorflow as tf

    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - private module moved
        return False
    graph = tf.compat.v1.get_default_graph()
    return control_flow_util.GraphOrParentsInXlaContext(graph)


def check(condition, template, *values):
    """Fails with `template.format(*values)` when `condition` is False.

    Args:
        condition: a scalar bool tensor or Python bool.
        template: message with one `{}` per value.
        *values: tensors or Python values shown in the message.

    Returns:
        A list of control dependencies to attach to the result in graph mode
        (empty in eager mode and under XLA).

    Raises:
        ValueError: in eager mode, when `condition` is False.

    Example:

    >>> import tensorflow as tf
    >>> check(True, "`offset` must be >= 0, got offset={}.", 3)
    []
    >>> check(False, "`offset` must be >= 0, got offset={}.", -1)
    Traceback (most recent call last):
        ...
    ValueError: `offset` must be >= 0, got offset=-1.
    >>> @tf.function
    ... def checked(x):
    ...     return with_checks(x, check(x >= 0, "`x` must be >= 0, got x={}.", x))
    >>> checked(tf.constant(-2))
    Traceback (most recent call last):
        ...
    tensorflow.python.framework.errors_impl.InvalidArgumentError: ...`x` must be >= 0, got x=-2...
    """
    from keras_posenc.backend import is_tensorflow

    if not is_tensorflow():
        return _check_python(condition, template, values)
    import tensorflow as tf

    if tf.executing_eagerly():
        if not bool(condition):
            message = template
            if values:
                message = tf.strings.format(template, values, summarize=6).numpy().decode()
            raise ValueError(message)
        return []
    if _in_xla_context():
        return []
    message = tf.strings.format(template, values, summarize=6) if values else template
    return [tf.debugging.Assert(condition, [message])]


def check_equal_dims(template, first, second):
    """Checks that two dims, or two lists of dims, are equal: now if they are known, else in the graph.

    Dims known while tracing (Python ints, as Keras 3 and static TF shapes
    give them) are compared in Python and raise `ValueError` at once, also
    inside a `tf.function`; otherwise the comparison becomes a `check`. Lists
    print as `tf.strings.format` prints a shape tensor (`[2 3]`) either way,
    so the message is the same in both cases.

    Args:
        template: message with two `{}`, filled with `first` and `second`.
        first: an int or scalar tensor, or a list of them.
        second: the same kind as `first`.

    Returns:
        the control dependencies of `check` (empty when the dims are known).

    Raises:
        ValueError: the dims are known and differ.

    Example:

    >>> check_equal_dims("`mask` must have shape {}, got shape {}.", [2, 5], [2, 5])
    []
    >>> check_equal_dims("`mask` must have shape {}, got shape {}.", [2, 5], [2, 4])
    Traceback (most recent call last):
        ...
    ValueError: `mask` must have shape [2 5], got shape [2 4].
    """
    single = not isinstance(first, (list, tuple))
    firsts, seconds = ([first], [second]) if single else (list(first), list(second))
    if all(_is_int(d) for d in (*firsts, *seconds)):
        if firsts != seconds:
            show = (lambda dims: dims[0]) if single else _numpy_style
            raise ValueError(template.format(show(firsts), show(seconds)))
        return []
    from keras_posenc.backend import ops

    if single:
        return check(ops.equal(first, second), template, first, second)
    same = ops.all(ops.equal(ops.stack(firsts), ops.stack(seconds)))
    return check(same, template, ops.stack(firsts), ops.stack(seconds))


def _numpy_style(dims):
    """Dims as `tf.strings.format` prints a shape tensor: `[2 3]`."""
    return "[" + " ".join(str(d) for d in dims) + "]"


def _check_python(condition, template, values):
    """`check` on the JAX (or torch) backend: plain Python on concrete values.

    Under `jax.jit` (and while Keras traces shapes) the values are tracers with
    no value yet, so nothing can be raised there: the check is skipped, and
    shapes and ranges are the caller's contract, as under XLA on TensorFlow.
    Arguments known while tracing (ranks, static lengths, dtypes) are still
    checked by the callers in plain Python.
    """
    from keras_posenc.backend import is_tracer, ops

    if is_tracer(condition) or any(is_tracer(v) for v in values):
        return []
    if not bool(condition):
        shown = [_plain(ops.convert_to_numpy(v)) if ops.is_tensor(v) else v for v in values]
        raise ValueError(template.format(*shown))
    return []


def _plain(array, summarize=6):
    """A numpy value as `tf.strings.format` prints it: scalars bare, arrays as `[0 -2 3]`."""
    if array.ndim == 0:
        return array.item()
    items = [_plain(a, summarize) for a in array]
    if len(items) > summarize:
        items = items[:summarize // 2] + ["..."] + items[-(summarize // 2):]
    return "[" + " ".join(str(item) for item in items) + "]"


def with_checks(tensor, checks):
    """Returns `tensor`, made to depend on `checks` when there are any.

    In a graph, the checks then run whenever the returned tensor is computed;
    with no checks (eager mode, XLA) `tensor` itself is returned.

    Args:
        tensor: any tensor.
        checks: a list of ops from `check`.

    Returns:
        `tensor`, or an identity of it with control dependencies on `checks`.

    Example:

    >>> import tensorflow as tf
    >>> x = tf.constant(5)
    >>> with_checks(x, check(x > 0, "`x` must be > 0, got x={}.", x)) is x  # eager: no ops
    True
    """
    if not checks:
        return tensor
    import tensorflow as tf

    with tf.control_dependencies(checks):
        return tf.identity(tensor)
