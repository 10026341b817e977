"""How a formulation is applied: the export's `ExportContext` and the `Formulated` wrapper layer.

A formulation is a plain function `(context, layer, inputs, **call_arguments)`: it computes what
`layer` computes from the ops its target runs, reading the layer's public attributes and
weights. The table of which function formulates which layer class on which target is
`keras_posenc.export.formulations.FORMULATIONS`.

`ExportContext` is what one export passes to every formulation, explicitly: the target, the
table, `emit(sublayer, ...)` (the sublayer's formulation of the same target, or the sublayer
itself without one), and, inside `tracing()`, the looked-up rows of an `embedding="host"` file
and the `Frozen` constants of each position layer (read once per trace, after the weights were
copied).

`Formulated` is a Keras layer that owns one layer and whose `call` is that layer's formulation:
`formulate(model, context)` returns the model with every formulated layer wrapped
(`keras.models.clone_model(clone_function=...)` for a functional model, the model itself wrapped
otherwise); nothing of the wrapped layers is changed.
"""

import contextlib
import inspect

import tensorflow as tf

from keras_posenc.backend import keras
from keras_posenc.export.constants import Frozen

__all__ = ["ExportContext", "Formulated", "formulate"]


class ExportContext:
    """What the formulations of one export read besides the layers.

    Args:
        target: the `Target` (`keras_posenc.export.targets`).
        formulations: `{(Target, layer class): function}`.

    Attributes:
        host_rows: inside `tracing(host_rows)`, the looked-up token rows of an `embedding="host"`
            file (the last input), else None.
    """

    def __init__(self, target, formulations):
        self.target = target
        self.formulations = formulations
        self.host_rows = None
        self._frozen = None

    def formulation_of(self, layer):
        """The function formulating `layer` (its class, else its nearest base class), or None."""
        for cls in type(layer).__mro__:
            function = self.formulations.get((self.target, cls))
            if function is not None:
                return function
        return None

    @contextlib.contextmanager
    def tracing(self, host_rows=None):
        """One trace of the export: frozen constants read once per layer, `host_rows` given."""
        self.host_rows, self._frozen = host_rows, {}
        try:
            yield self
        finally:
            self.host_rows, self._frozen = None, None

    def frozen(self, layer):
        """The layer's `Frozen` constants: once per trace (fresh outside of one)."""
        if self._frozen is None:
            return Frozen(layer)
        entry = self._frozen.get(id(layer))
        if entry is None:
            entry = self._frozen[id(layer)] = (layer, Frozen(layer))  # the layer kept alive with its id
        return entry[1]

    @tf.autograph.experimental.do_not_convert
    def emit(self, layer, *args, **kwargs):
        """`layer`'s formulation for this target, or `layer(...)` without one."""
        function = self.formulation_of(layer)
        if function is None:
            return layer(*args, **kwargs)
        return apply(function, self, layer, args, kwargs)


def _accepted(function, kwargs):
    """`kwargs` without `mask` and `training` when `function` does not take them (Keras passes both)."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return kwargs
    return {name: value for name, value in kwargs.items()
            if name in parameters or name not in ("mask", "training")}


def apply(function, context, layer, args, kwargs):
    """`function(context, layer, *args, **kwargs)`, the arguments it does not take left out."""
    # Plain Python: autograph would convert the formulations, which have no data-dependent control flow.
    plain = tf.autograph.experimental.do_not_convert(function)
    return plain(context, layer, *args, **_accepted(function, kwargs))


class Formulated(keras.layers.Layer):
    """A layer computed by its export formulation: owns `layer`, calls `formulation(context, layer, ...)`.

    The wrapped layer keeps its own weights (the only weights of this layer, in the same order)
    and its class, config and `call`; this layer's `call` is the formulation of the context's
    target. Build one with `Formulated.of(layer, context)`: its class takes the call signature of
    the layer's class, so Keras passes it the same arguments (mask and training included).
    """

    _classes = {}

    @classmethod
    def of(cls, layer, context):
        layer_class = type(layer)
        wrapper = cls._classes.get(layer_class)
        if wrapper is None:
            def call(self, *args, **kwargs):
                return self.formulated_call(*args, **kwargs)

            call.__signature__ = inspect.signature(layer_class.call)
            wrapper = cls._classes[layer_class] = type(f"Formulated{layer_class.__name__}", (cls,),
                                                       {"call": call})
        return wrapper(layer, context)

    def __init__(self, layer, context, **kwargs):
        super().__init__(name=f"{layer.name}_{context.target.name}", **kwargs)
        self.layer = layer
        self.context = context
        self.formulation = context.formulation_of(layer)
        if self.formulation is None:
            raise ValueError(f"No {context.target.name} formulation for {type(layer).__name__} "
                             f"'{layer.name}'.")
        self.supports_masking = True

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)
        self.built = True

    def formulated_call(self, *args, **kwargs):
        return apply(self.formulation, self.context, self.layer, args, kwargs)

    def compute_mask(self, inputs, mask=None):
        return self.layer.compute_mask(inputs, mask)


def formulate(model, context, input_tensors=None, clone_layer=None):
    """`model` computed by the formulations of `context`: wrapped layers, the originals unchanged.

    With `input_tensors` (a functional model), `keras.models.clone_model` clones each layer
    by `clone_layer` (default: the layer itself) and wraps every formulated one in its
    `Formulated` layer. Any other model or layer is wrapped whole when its class has a
    formulation (`CausalLM`, `Encoder`, ...), and returned as it is otherwise. Without a
    `context` (None), nothing is wrapped: the plain clone.
    """
    if input_tensors is not None:
        def wrap(layer):
            if not isinstance(layer, keras.layers.Layer):
                return layer  # a Keras 3 stateless operation of the graph (`x + y`): nothing to clone
            layer = clone_layer(layer) if clone_layer is not None else layer
            if context is not None and context.formulation_of(layer) is not None:
                return Formulated.of(layer, context)
            return layer

        return keras.models.clone_model(model, input_tensors=input_tensors, clone_function=wrap)
    if context is not None and context.formulation_of(model) is not None:
        return Formulated.of(model, context)
    return model
