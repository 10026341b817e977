"""Runtime argument checks that read the same in eager mode and in graphs.

Eager calls raise `ValueError` (the value is known, so the check is plain
Python). Inside a `tf.function` the check becomes an assertion op, which
raises `tf.errors.InvalidArgumentError` with the same message text when the
graph runs. Under XLA assertions cannot be compiled, so they are left out
there; shapes and ranges are then the caller's contract.
"""

import tensorflow as tf

__all__ = ["check", "with_checks"]


def _in_xla_context():
    """True while tracing a function that XLA will compile."""
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
    if tf.executing_eagerly():
        if not bool(condition):
            raise ValueError(_format(template, values))
        return []
    if _in_xla_context():
        return []
    message = tf.strings.format(template, values, summarize=6) if values else template
    return [tf.debugging.Assert(condition, [message])]


def _format(template, values):
    if not values:
        return template
    return tf.strings.format(template, values, summarize=6).numpy().decode()


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

    >>> x = tf.constant(5)
    >>> with_checks(x, check(x > 0, "`x` must be > 0, got x={}.", x)) is x  # eager: no ops
    True
    """
    if not checks:
        return tensor
    with tf.control_dependencies(checks):
        return tf.identity(tensor)
