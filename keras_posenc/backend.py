"""The one place that knows whether this is Keras 2 (TF 2.12) or Keras 3.

Import Keras and its ops from here, never from `tensorflow` or `keras`
directly::

    from keras_posenc.backend import keras, ops

- `keras` is `tf.keras` on Keras 2 and the `keras` package on Keras 3;
- `ops` is `keras.ops` on Keras 3 (whatever `KERAS_BACKEND` says), and on
  Keras 2 a small TensorFlow implementation of the same names and
  signatures, for the subset this package uses (add a name when you need
  it: same signature and semantics as `keras.ops`).

Code that only works on the TensorFlow backend (tf.data, tf.distribute,
TFLite, XLA fusion) checks `is_tensorflow()` first; `backend_name()` is
"tensorflow" on Keras 2. The version is detected once, at import.

Example:

>>> from keras_posenc.backend import ops
>>> ops.convert_to_numpy(ops.cumsum(ops.convert_to_tensor([1, 2, 3]))).tolist()
[1, 3, 6]
>>> backend_name() in ("tensorflow", "jax", "torch")
True
"""

import builtins
import contextlib
import types

__all__ = ["add_rows", "attention_kernel_initializer", "backend_name", "dropout_state", "dtype_name",
           "eager_scope", "inference_function", "is_keras3", "is_tensorflow", "is_symbolic", "is_tracer",
           "keras", "keras_version", "make_deterministic", "no_autocast", "ops", "save_model",
           "static_call", "static_function", "static_int", "widest_float"]
__all__ += ["build_multi_head_attention", "dense_gradients", "is_functional", "model_input_names",
            "weight_name_scope", "without_keras_mask"]


def _keras_major():
    try:
        import keras as _keras_package
    except ImportError:  # pragma: no cover - TF without a keras package
        return 2
    version = getattr(_keras_package, "__version__", "2")
    return int(version.split(".")[0])


_KERAS3 = _keras_major() >= 3

if _KERAS3:
    import keras  # noqa: I001
    from keras import ops
else:
    from tensorflow import keras


def is_keras3():
    """True when the Keras in use is Keras 3 (any backend)."""
    return _KERAS3


def keras_version():
    """The version string of the Keras in use, e.g. "2.12.0" or "3.15.1"."""
    return keras.__version__


def backend_name():
    """"tensorflow", "jax" or "torch": the Keras backend (always "tensorflow" on Keras 2)."""
    return keras.backend.backend() if _KERAS3 else "tensorflow"


def is_tensorflow():
    """True when tensors are TensorFlow tensors (Keras 2, or Keras 3 with the TF backend)."""
    return backend_name() == "tensorflow"


def is_symbolic(x):
    """True for a Keras 3 `KerasTensor` (a functional-API placeholder with no values)."""
    return _KERAS3 and isinstance(x, keras.KerasTensor)


def dtype_name(x):
    """The dtype of tensor `x` as a string, e.g. "int32", "float16", "bool"."""
    dtype = x.dtype
    if _KERAS3:
        return keras.backend.standardize_dtype(dtype)
    return dtype.name


def no_autocast():
    """`add_weight` keyword arguments that keep a float32 variable float32 under mixed precision."""
    return {"autocast": False} if _KERAS3 else {"experimental_autocast": False}


def is_tracer(x):
    """True for a JAX tracer (a value inside `jax.jit` or a shape-only trace): no Python value."""
    if backend_name() != "jax":
        return False
    import jax

    return isinstance(x, jax.core.Tracer)


def static_int(x):
    """`x` as a Python int when it is known while tracing, else None.

    Keras 3 and JAX shapes are Python ints; a TensorFlow graph dimension or a
    scalar tensor is resolved with `tf.get_static_value`.
    """
    if isinstance(x, int):
        return x
    if hasattr(x, "__index__") and not is_tensorflow():
        try:
            return int(x)
        except Exception:  # a tracer: no value yet
            return None
    if is_tensorflow():
        import tensorflow as tf

        value = tf.get_static_value(x)
        return None if value is None else int(value)
    return None


def eager_scope():
    """A context in which tensors are concrete values, even while a graph or `jax.jit` traces.

    Layers create their constant tables under it in `build`, which Keras 3 may
    run inside a `tf.function` or a JAX trace: a constant made there would be
    a graph tensor or tracer that dies with the trace.
    """
    if is_tensorflow():
        import tensorflow as tf

        return tf.init_scope()
    if backend_name() == "jax":
        import jax

        return jax.ensure_compile_time_eval()
    return contextlib.nullcontext()


def add_rows(x, table, ids):
    """`x + take(table, ids, axis=0)`: the gather-and-add of the position layers, fused where it can be.

    In a Keras 3 TensorFlow graph (a `tf.function`: Keras's train and predict
    functions) the gather and the add are marked as one XLA cluster
    (`tf.xla.experimental.jit_scope`), so the rows are added as they are read
    instead of being written to memory and read back: a plain graph pays one
    more pass over `[batch, length, depth]` for that (benchmarks/bench_layers.py).
    The mark is an attribute of the two ops, not a `cond` or a nested
    function: exporters (SavedModel, tf2onnx, the TFLite converter) see two
    plain ops. TensorFlow compiles such a cluster lazily, once a shape
    repeats, and stops compiling one that keeps seeing new shapes, so inputs
    of varying length do not pay a compilation per call. Eagerly and on JAX
    (whose `jit` fuses the two anyway) these are the plain ops.

    Keras 2 (TF 2.12) gets the plain ops too: its clustering grows the mark
    into the whole training step, forward, gradients and optimizer, and the
    step then needs the count of distinct token ids (the embedding's sparse
    gradient) at compile time, so it is compiled again, about 2 s on 2 cores,
    each time a new count repeats (benchmarks/bench_train_step.py).
    """
    if is_keras3() and is_tensorflow():
        import tensorflow as tf

        if not tf.executing_eagerly():
            with tf.xla.experimental.jit_scope(compile_ops=True, separate_compiled_gradients=False):
                return x + tf.gather(table, ids)  # ids are in range: no negative-index handling
    return x + ops.take(table, ids, axis=0)


def static_function(fn, **options):
    """`tf.function(fn, **options)` traced without AutoGraph.

    The package's graphs are static: no Python `if` or loop depends on a
    tensor's value. AutoGraph would still rewrite every function the trace
    calls, the layers' `call`s included, and only make tracing slower:
    without it an export's first traces take a seventh of the time on
    Keras 2 and a third on Keras 3, to the same ops
    (benchmarks/bench_tracing.py).

    Args:
        fn: the Python function to trace.
        **options: passed on to `tf.function` (`input_signature`,
            `jit_compile`, `reduce_retracing`).
    """
    import tensorflow as tf

    return tf.function(fn, autograph=False, **options)


def static_call(call):
    """Decorates a layer's `call`: a static graph, which Keras 2 traces without AutoGraph.

    Keras 2 runs AutoGraph over the `call` of every layer defined outside
    Keras whenever it traces one (`fit`, `predict`, SavedModel, a functional
    model's construction): it rewrites the source and routes each op through
    AutoGraph's dispatch, for graphs that have no tensor-dependent Python
    control flow to convert. This marks `call` as not to be converted, keeping
    its signature, from which Keras reads the `mask` and `training`
    arguments. Keras 3 converts no layer's `call`: there `call` is returned
    unchanged.

    Args:
        call: the layer class's `call` method.
    """
    if _KERAS3:
        return call
    import inspect

    import tensorflow as tf

    wrapper = tf.autograph.experimental.do_not_convert(call)
    wrapper.__signature__ = inspect.signature(call)
    return wrapper


def inference_function(layer, fn):
    """`fn(*tensors)`, which calls `layer`, compiled for repeated inference calls.

    TensorFlow: a `tf.function`, which reads the layer's variables when it
    runs. JAX: `jax.jit` of a stateless call that takes the variables'
    current values as arguments, so later weight updates are seen too.
    Every argument must be a tensor (or None): one trace then serves every
    call with the same shapes.
    """
    if is_tensorflow():
        return static_function(fn, reduce_retracing=True)
    if backend_name() != "jax":
        return fn
    import jax

    def pure(trainable, non_trainable, *args):
        mapping = list(zip(layer.trainable_variables, trainable))
        mapping += list(zip(layer.non_trainable_variables, non_trainable))
        with keras.StatelessScope(state_mapping=mapping):
            return fn(*args)

    compiled = jax.jit(pure)

    def call(*args):
        return compiled([v.value for v in layer.trainable_variables],
                        [v.value for v in layer.non_trainable_variables], *args)

    return call


def widest_float():
    """"float64" where the backend computes in float64, else "float32" (JAX without x64)."""
    if backend_name() == "jax":
        import jax

        return "float64" if jax.config.jax_enable_x64 else "float32"
    return "float64"


def save_model(model, path):
    """Saves `model` as a `.keras` file, atomically (Keras 2 needs the format named; Keras 3 infers it).

    The model goes to a temporary `.keras` file beside `path`, renamed onto `path` once complete
    (`keras_posenc.files.atomic_path`): an error or an interrupt leaves an existing `path` as it was
    and no partial file. A full disk or a read-only folder raises `files.FileWriteError` (one line:
    the path, the reason, the free space), whatever layer of Keras or h5py meets it.
    """
    import errno

    from keras_posenc.files import FileWriteError, atomic_path, describe_write_error, is_disk_full

    try:
        with atomic_path(path) as temp:
            if _KERAS3:
                model.save(temp)
            else:
                model.save(temp, save_format="keras_v3")
    except FileWriteError:
        raise
    except Exception as error:
        if not is_disk_full(error):
            raise
        full = OSError(errno.ENOSPC, "No space left on device")
        raise FileWriteError(errno.ENOSPC, describe_write_error(path, full)) from error


def make_deterministic(seed=None):
    """Deterministic ops and checkpointable dropout randomness; seeds Python, numpy and Keras if given.

    On Keras 2 the dropout layers get `tf.random.Generator`s (which a
    checkpoint can hold) only when `enable_tf_random_generator()` runs
    before they are created; Keras 3's `SeedGenerator`s are always
    variables. Call it before building the model.
    """
    import tensorflow as tf

    if not _KERAS3:
        keras.backend.experimental.enable_tf_random_generator()
    tf.config.experimental.enable_op_determinism()
    if seed is not None:
        keras.utils.set_random_seed(seed)


def dropout_state(model):
    """The random-number state of every random layer of `model` (dropout), created now.

    Keras does not checkpoint it with the model, so a resumed run would replay
    the dropout masks of the first steps unless the trainer checkpoints these.
    On Keras 3 they are the state variables of the layers' `SeedGenerator`s.
    On Keras 2 they are the layers' `tf.random.Generator`s, which exist only
    after `make_deterministic()` (otherwise the layers use stateful ops and the
    list is empty); reading them needs Keras 2.12's private `_flatten_layers`
    and `_random_generator`.
    """
    if _KERAS3:
        weights = {id(weight) for weight in model.weights}
        return [variable for variable in model.variables
                if id(variable) not in weights and variable.name == "seed_generator_state"]
    generators = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        rng = getattr(layer, "_random_generator", None)
        if rng is None or not hasattr(rng, "_maybe_init"):
            continue
        rng._maybe_init()
        if getattr(rng, "_generator", None) is not None:
            generators.append(rng._generator)
    return generators


def attention_kernel_initializer():
    """The kernel initializer of `MultiHeadAttention`'s projections: the same scale on every Keras.

    Glorot-uniform with the fans Keras has always computed for the rank-3
    kernels `[d_model, heads, head_dim]` and `[heads, head_dim, d_model]`, a
    convolution's: `fan_in = shape[-2] * shape[0]`, `fan_out = shape[-1] *
    shape[0]` (limit 0.068 for the query of a d_model 64, 4-head layer).
    Keras 3.15's `EinsumDense` computes the fans of the projection instead
    (`d_model` and `heads * head_dim`, limit 0.217, keras-team/keras#22789):
    3.2 times the initial scale, and a 300-step run that ends 0.6 nats
    worse (benchmarks/RESULTS.md, "Keras 2 and Keras 3: the same run over
    seeds"). Where `GlorotUniform` takes `input_axes` and `output_axes`, they
    are set to give the convolution's fans (overlapping axes multiply in
    `shape[0]` on both sides), which also keeps `EinsumDense` from replacing
    them; elsewhere the Keras default already uses those fans and is kept, so
    the random draws stay the same.

    Returns:
        a `keras.initializers.GlorotUniform`, or the name "glorot_uniform".

    Example:

    >>> init = attention_kernel_initializer()
    >>> init == "glorot_uniform" or (init.input_axes, init.output_axes) == ([0, 1], [0, 2])
    True
    """
    import inspect

    if "input_axes" not in inspect.signature(keras.initializers.GlorotUniform).parameters:
        return "glorot_uniform"
    return keras.initializers.GlorotUniform(input_axes=[0, 1], output_axes=[0, 2])


if not _KERAS3:
    import numpy as _np
    import tensorflow as tf

    def _axis_list(axis):
        return axis if axis is None or isinstance(axis, int) else list(axis)

    def _dtype(x):
        return tf.as_dtype(x) if x is not None else None

    def convert_to_tensor(x, dtype=None, sparse=None, ragged=None):
        return tf.convert_to_tensor(x, dtype=_dtype(dtype))

    def convert_to_numpy(x):
        return _np.asarray(x.numpy() if tf.is_tensor(x) else x)

    def cast(x, dtype):
        return tf.cast(x, _dtype(dtype))

    def shape(x):
        """Static dims as ints, unknown dims as scalar tensors (like keras.ops.shape on TF)."""
        x = tf.convert_to_tensor(x)
        static = x.shape.as_list() if x.shape.rank is not None else None
        if static is None:
            return tf.shape(x)
        if builtins.all(d is not None for d in static):
            return tuple(static)
        dynamic = tf.shape(x)
        return tuple(d if d is not None else dynamic[i] for i, d in enumerate(static))

    def size(x):
        return tf.size(x)

    def cumsum(x, axis=None, dtype=None):
        x = tf.convert_to_tensor(x)
        if dtype is not None:
            x = tf.cast(x, _dtype(dtype))
        if axis is None:
            return tf.cumsum(tf.reshape(x, [-1]))
        return tf.cumsum(x, axis=axis)

    def where(condition, x1=None, x2=None):
        return tf.where(condition, x1, x2)

    def take(x, indices, axis=None):
        if axis is None:
            return tf.gather(tf.reshape(x, [-1]), indices)
        return tf.gather(x, indices, axis=axis)

    def take_along_axis(x, indices, axis=None):
        if axis is None:
            raise ValueError("take_along_axis in keras_posenc needs an explicit axis.")
        x = tf.convert_to_tensor(x)
        rank = x.shape.rank
        axis = axis % rank
        return tf.gather(x, indices, axis=axis, batch_dims=axis)

    def concatenate(xs, axis=0):
        return tf.concat(list(xs), axis=axis)

    def stack(x, axis=0):
        return tf.stack(list(x), axis=axis)

    def zeros(shape, dtype=None):
        return tf.zeros(shape, _dtype(dtype) or tf.float32)

    def ones(shape, dtype=None):
        return tf.ones(shape, _dtype(dtype) or tf.float32)

    def zeros_like(x, dtype=None):
        return tf.zeros_like(x, dtype=_dtype(dtype))

    def ones_like(x, dtype=None):
        return tf.ones_like(x, dtype=_dtype(dtype))

    def arange(start, stop=None, step=1, dtype=None):
        if stop is None:
            start, stop = 0, start
        return tf.range(start, stop, step, dtype=_dtype(dtype) or tf.int32)

    def reshape(x, newshape):
        return tf.reshape(x, newshape)

    def expand_dims(x, axis):
        return tf.expand_dims(x, axis)

    def max(x, axis=None, keepdims=False, initial=None):  # noqa: A001 - keras.ops name
        result = tf.reduce_max(x, axis=_axis_list(axis), keepdims=keepdims)
        return result if initial is None else tf.maximum(result, tf.cast(initial, result.dtype))

    def min(x, axis=None, keepdims=False, initial=None):  # noqa: A001 - keras.ops name
        result = tf.reduce_min(x, axis=_axis_list(axis), keepdims=keepdims)
        return result if initial is None else tf.minimum(result, tf.cast(initial, result.dtype))

    def sum(x, axis=None, keepdims=False):  # noqa: A001 - keras.ops name
        return tf.reduce_sum(x, axis=_axis_list(axis), keepdims=keepdims)

    def all(x, axis=None, keepdims=False):  # noqa: A001 - keras.ops name
        return tf.reduce_all(tf.cast(x, tf.bool), axis=_axis_list(axis), keepdims=keepdims)

    def segment_sum(data, segment_ids, num_segments=None, sorted=False):  # noqa: A002
        if num_segments is None:
            num_segments = tf.reduce_max(segment_ids) + 1
        return tf.math.unsorted_segment_sum(data, segment_ids, num_segments)

    def einsum(subscripts, *operands):
        return tf.einsum(subscripts, *operands)

    def softmax(x, axis=-1):
        return tf.nn.softmax(x, axis=axis)

    def log_softmax(x, axis=-1):
        return tf.nn.log_softmax(x, axis=axis)

    def matmul(x1, x2):
        return tf.linalg.matmul(x1, x2)

    def transpose(x, axes=None):
        return tf.transpose(x, perm=axes)

    def full(shape, fill_value, dtype=None):
        return tf.fill(shape, tf.constant(fill_value, dtype=_dtype(dtype) if dtype else None))

    def broadcast_to(x, shape):
        return tf.broadcast_to(x, shape)

    def _binary(fn):
        def op(x1, x2):
            x1, x2 = _common(x1, x2)
            return fn(x1, x2)
        op.__name__ = fn.__name__
        return op

    def _common(x1, x2):
        """Converts Python numbers to the other operand's dtype, as keras.ops does."""
        if tf.is_tensor(x1) and not tf.is_tensor(x2):
            x2 = tf.convert_to_tensor(x2, x1.dtype)
        elif tf.is_tensor(x2) and not tf.is_tensor(x1):
            x1 = tf.convert_to_tensor(x1, x2.dtype)
        return x1, x2

    power = _binary(tf.pow)
    equal = _binary(tf.equal)
    not_equal = _binary(tf.not_equal)
    minimum = _binary(tf.minimum)
    maximum = _binary(tf.maximum)

    _SAME_AS_TF = {
        "sin": tf.sin, "cos": tf.cos, "rsqrt": tf.math.rsqrt, "abs": tf.abs,
        "logical_and": tf.logical_and, "logical_or": tf.logical_or, "is_tensor": tf.is_tensor,
        "copy": tf.identity,
    }

    ops = types.SimpleNamespace(**_SAME_AS_TF, **{
        name: value for name, value in dict(globals()).items()
        if callable(value) and not name.startswith("_") and name not in __all__
        and name not in ("tf", "types", "builtins")
    })


# ---------------------------------------------------------------------------------------------
# Keras 2 / Keras 3 differences of the layers, models and exporter (kept here, the one module
# that branches on the Keras version).
def build_multi_head_attention(layer, query_shape, value_shape, key_shape=None):
    """Builds a `keras.layers.MultiHeadAttention` (or subclass) `layer` from shapes.

    Keras 3 has `MultiHeadAttention.build(query_shape, value_shape, key_shape)`; Keras 2 builds
    from `_build_from_signature`, which takes shapes too (and which its `from_config` has
    already run when the config holds the shapes: not twice, that would make new weights).
    """
    if _KERAS3:
        keras.layers.MultiHeadAttention.build(layer, query_shape, value_shape, key_shape)
    elif not layer._built_from_signature:
        layer._build_from_signature(query_shape, value_shape, key_shape)


def weight_name_scope(name):
    """Keras 2: a name scope, so that weight names are unique as the legacy h5 format requires."""
    if _KERAS3:
        return contextlib.nullcontext()
    import tensorflow as tf

    return tf.name_scope(name)


def without_keras_mask(x):
    """A new tensor equal to `x` that carries no Keras mask."""
    if _KERAS3:
        return ops.copy(x)
    import tensorflow as tf

    return tf.identity(x)


def dense_gradients(gradients):
    """On Keras 3 (TensorFlow), the gradients with each `IndexedSlices` summed per row as a dense tensor.

    Keras 3's Adam squares an embedding gradient's slices one by one (`g1**2 + g2**2` for a
    token seen twice, not `(g1 + g2)**2`); Keras 2's optimizers sum duplicate slices themselves,
    so there the gradients pass unchanged.
    """
    if not _KERAS3:
        return gradients
    import tensorflow as tf

    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]


def is_functional(model):
    """True for a functional (graph-network) model: Keras 2 `_is_graph_network`, Keras 3 `Functional`."""
    if not _KERAS3:
        return bool(getattr(model, "_is_graph_network", False))
    from keras.src.models.functional import Functional

    return isinstance(model, Functional) and not isinstance(model, keras.Sequential)


def model_input_names(model):
    """The input names of a functional model: Keras 2's `input_names`, Keras 3's input tensors' names."""
    names = getattr(model, "input_names", None)
    return list(names) if names else [tensor.name for tensor in model.inputs]
