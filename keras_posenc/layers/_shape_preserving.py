"""Mixin for layers whose output has the input's shape and keeps its Keras mask."""

__all__ = ["ShapePreserving"]


class ShapePreserving:
    """Passes the Keras mask through and reports the input shape as the output shape.

    Put it before the Keras base class: `class Foo(ShapePreserving, keras.layers.Layer)`.
    """

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return input_shape
