"""Mixin for layers whose output has the input's shape and keeps its Keras mask; `build` shapes."""

import inspect

__all__ = ["ShapePreserving", "input_shape_of"]


class ShapePreserving:
    """Passes the Keras mask through and reports the input shape as the output shape.

    Put it before the Keras base class: `class Foo(ShapePreserving, keras.layers.Layer)`.
    """

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape=None, **shapes):
        return input_shape_of(self, input_shape, shapes)


def input_shape_of(layer, input_shape, shapes):
    """The shape of the first call argument, however `build` was called.

    Keras passes it positionally; keras-hub's conventions pass one
    `<argument>_shape` keyword per tensor argument of `call`, e.g.
    `build(inputs_shape=..., language_ids_shape=...)`. The other shapes are
    not needed: every other tensor argument is checked against the inputs
    when the layer is called.
    """
    first = next(iter(inspect.signature(layer.call).parameters))
    if input_shape is None:
        input_shape = shapes.get(f"{first}_shape")
    unknown = sorted(set(shapes) - {f"{name}_shape" for name in inspect.signature(layer.call).parameters})
    if unknown:
        raise TypeError(f"{type(layer).__name__}.build() got shapes of arguments its call does not take: "
                        f"{unknown}.")
    if input_shape is None:
        raise ValueError(f"{type(layer).__name__}.build() needs the shape of `{first}` (positional or "
                         f"`{first}_shape=`), got {sorted(shapes) or 'nothing'}.")
    return tuple(input_shape)
