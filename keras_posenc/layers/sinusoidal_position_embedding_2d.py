"""SinusoidalPositionEmbedding2D: the fixed 2-D sin-cos table of a patch grid (MAE's layout)."""

import numpy as np

from keras_posenc import tables
from keras_posenc.backend import keras, ops, static_call
from keras_posenc.layers._shape_preserving import ShapePreserving, input_shape_of
from keras_posenc.validation import check_base, check_positive_int

__all__ = ["SinusoidalPositionEmbedding2D"]


@keras.utils.register_keras_serializable(package="keras_posenc")
class SinusoidalPositionEmbedding2D(ShapePreserving, keras.layers.Layer):
    """Adds the 2-D sin-cos encoding of a `height x width` patch grid to patch tokens.

    The table is `keras_posenc.sinusoidal_table_2d(height, width, depth,
    cls_token=cls_token)`: computed in float64 numpy, stored as a float32
    constant (never a weight) and cast to the compute dtype at the add.
    Tokens are the patches in row-major order, after a class token when
    `cls_token` is True (which gets a zero encoding). For another grid size
    (fine-tuning at a new resolution), build a new layer, or resize a
    learned table with `keras_posenc.resize_table_2d`.

    Args:
        height: int >= 1, patch rows.
        width: int >= 1, patch columns.
        cls_token: bool, the first token is a class token.
        base: float > 1, wavelength scale.
        **kwargs: standard layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[batch, height * width (+ 1), depth]`, `depth`
            a multiple of 4.

    Example:

    >>> layer = SinusoidalPositionEmbedding2D(2, 3, cls_token=True)
    >>> y = layer(ops.zeros([1, 7, 8]))
    >>> tuple(y.shape)
    (1, 7, 8)
    >>> ops.convert_to_numpy(y)[0, 0].tolist()  # the class token gets no encoding
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]

    References:
        - [He et al., 2021](https://arxiv.org/abs/2111.06377), "Masked
          Autoencoders Are Scalable Vision Learners" (`util/pos_embed.py`).
        - [Dosovitskiy et al., 2020](https://arxiv.org/abs/2010.11929), ViT
          (patch tokens and the class token).
    """

    def __init__(self, height, width, *, cls_token=False, base=10000.0, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("height", height)
        check_positive_int("width", width)
        check_base(base)
        self.height = height
        self.width = width
        self.cls_token = bool(cls_token)
        self.base = float(base)
        self.supports_masking = True

    @property
    def num_tokens(self):
        """Tokens per row of inputs: `height * width`, plus one with `cls_token`."""
        return self.height * self.width + int(self.cls_token)

    def build(self, input_shape=None, **shapes):
        input_shape = input_shape_of(self, input_shape, shapes)
        if len(input_shape) != 3 or input_shape[1] not in (None, self.num_tokens):
            extra = " plus a class token" if self.cls_token else ""
            raise ValueError(f"`inputs` must have shape [batch, {self.num_tokens}, depth] for a "
                             f"{self.height}x{self.width} grid{extra}, got shape {tuple(input_shape)}.")
        # NumPy, made a constant of each traced graph at the add: never a captured tensor.
        table = tables.sinusoidal_table_2d(self.height, self.width, int(input_shape[-1]),
                                           cls_token=self.cls_token, base=self.base)
        self._table = np.asarray(table, np.float32)
        super().build(input_shape)

    @static_call
    def call(self, inputs):
        if inputs.shape[1] is not None and inputs.shape[1] != self.num_tokens:
            raise ValueError(f"`inputs` must have {self.num_tokens} tokens, got shape {inputs.shape}.")
        return inputs + ops.cast(ops.convert_to_tensor(self._table), inputs.dtype)[None]

    def get_config(self):
        config = super().get_config()
        config.update({"height": self.height, "width": self.width, "cls_token": self.cls_token,
                       "base": self.base})
        return config
