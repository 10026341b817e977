"""Small functional models built from every public layer, for the tests of Keras's own export.

Shapes are static (batch 2, length 8), as a LiteRT/ONNX user exports them: `MODELS[name]()` gives
`(model, feeds)`, the feeds keyed by the model's input names, with left padding where a mask is.
"""

import numpy as np

from keras_posenc.backend import keras
from keras_posenc.layers import (
    IntegerPositionEmbedding,
    LearnedPositionEmbedding,
    PositionalAttention,
    RotaryEmbedding,
    SinusoidalPositionEmbedding,
    SinusoidalPositionEmbedding2D,
    TokenAndPositionEmbedding,
    ZeroPositionEmbedding,
)

BATCH, LENGTH, DEPTH = 2, 8, 16
REAL = np.arange(LENGTH)[None, :] >= np.array([[3], [0]])  # row 0 left-padded by 3, row 1 full


def _inputs(**specs):
    return {name: keras.Input(batch_shape=shape, dtype=dtype, name=name)
            for name, (shape, dtype) in specs.items()}


def _features(seed=0):
    return np.random.default_rng(seed).standard_normal([BATCH, LENGTH, DEPTH]).astype(np.float32)


def sinusoidal_position_ids():
    inputs = _inputs(features=((BATCH, LENGTH, DEPTH), "float32"), positions=((BATCH, LENGTH), "int32"))
    y = SinusoidalPositionEmbedding(max_length=16)(inputs["features"], position_ids=inputs["positions"])
    positions = np.array([[0, 0, 0, 0, 1, 2, 3, 4], [3, 4, 5, 6, 7, 8, 9, 10]], np.int32)
    return keras.Model(inputs, y), {"features": _features(), "positions": positions}


def sinusoidal_languages_mask():
    inputs = _inputs(features=((BATCH, LENGTH, DEPTH), "float32"), languages=((BATCH,), "int32"),
                     real=((BATCH, LENGTH), "bool"))
    y = SinusoidalPositionEmbedding(max_length=16, num_languages=2)(
        inputs["features"], language_ids=inputs["languages"], mask=inputs["real"])
    return keras.Model(inputs, y), {"features": _features(), "languages": np.array([1, 0], np.int32),
                                    "real": REAL}


def learned_mask():
    keras.utils.set_random_seed(1)
    inputs = _inputs(features=((BATCH, LENGTH, DEPTH), "float32"), real=((BATCH, LENGTH), "bool"))
    y = LearnedPositionEmbedding(max_length=16)(inputs["features"], mask=inputs["real"])
    return keras.Model(inputs, y), {"features": _features(), "real": REAL}


def integer():
    inputs = _inputs(features=((BATCH, LENGTH, DEPTH), "float32"))
    return keras.Model(inputs, IntegerPositionEmbedding(max_length=16)(inputs["features"])), {
        "features": _features()}


def zero_mask():
    inputs = _inputs(features=((BATCH, LENGTH, DEPTH), "float32"), real=((BATCH, LENGTH), "bool"))
    y = ZeroPositionEmbedding(max_length=16)(inputs["features"], mask=inputs["real"])
    return keras.Model(inputs, keras.layers.Dense(4)(y)), {"features": _features(), "real": REAL}


def sinusoidal_2d():
    inputs = _inputs(features=((BATCH, LENGTH, DEPTH), "float32"))
    return keras.Model(inputs, SinusoidalPositionEmbedding2D(2, 4)(inputs["features"])), {
        "features": _features()}


def rotary_mask():
    inputs = _inputs(heads=((BATCH, LENGTH, 2, 8), "float32"), real=((BATCH, LENGTH), "bool"))
    # With max_length: float32 tables gathered by position. Without, the angles are float64 in the
    # graph (exact past any table), which LiteRT runs with Flex ops only.
    y = RotaryEmbedding(max_length=16)(inputs["heads"], mask=inputs["real"])
    heads = np.random.default_rng(2).standard_normal([BATCH, LENGTH, 2, 8]).astype(np.float32)
    return keras.Model(inputs, y), {"heads": heads, "real": REAL}


def token_and_position():
    keras.utils.set_random_seed(3)
    inputs = _inputs(tokens=((BATCH, LENGTH), "int32"))
    x = TokenAndPositionEmbedding(20, DEPTH, 16, dropout=0.0)(inputs["tokens"])
    tokens = np.where(REAL, np.arange(1, 1 + BATCH * LENGTH).reshape(BATCH, LENGTH) % 19 + 1, 0)
    return keras.Model(inputs, keras.layers.Dense(5)(x)), {"tokens": tokens.astype(np.int32)}


def _attention(position):
    def build():
        keras.utils.set_random_seed(4)
        inputs = _inputs(features=((BATCH, LENGTH, DEPTH), "float32"))
        attention = PositionalAttention(num_heads=2, key_dim=8, position=position)
        y = attention(inputs["features"], inputs["features"])
        return keras.Model(inputs, y), {"features": _features()}
    return build


MODELS = {
    "sinusoidal_position_ids": sinusoidal_position_ids,
    "sinusoidal_languages_mask": sinusoidal_languages_mask,
    "learned_mask": learned_mask,
    "integer": integer,
    "zero_mask": zero_mask,
    "sinusoidal_2d": sinusoidal_2d,
    "rotary_mask": rotary_mask,
    "token_and_position": token_and_position,
    "attention_rope": _attention("rope"),
    "attention_alibi": _attention("alibi"),
}

# Op names that a static LiteRT file from the layers must not hold: not GPU ops (CUMSUM), control
# flow (IF, WHILE) and TensorFlow ops run by the Flex delegate.
FORBIDDEN_OPS = ("CUMSUM", "IF", "WHILE")


def forbidden_ops(op_counts):
    """The forbidden or Flex ops among `{name: count}` of a TFLite flatbuffer."""
    return {name: n for name, n in op_counts.items()
            if name in FORBIDDEN_OPS or name.upper().startswith("FLEX") or name == "CUSTOM"}


def feed_by_name(details, feeds):
    """`{detail index: value}` for runtime input `details` (dicts with "name", "index") named after feeds."""
    out = {}
    for detail in details:
        match = [key for key in feeds if key in detail["name"]]
        assert len(match) == 1, (detail["name"], list(feeds))
        out[detail["index"]] = feeds[match[0]]
    return out


def input_signature(model):
    """The static `input_signature` of `model` for `model.export`: one dict of TensorSpecs."""
    import tensorflow as tf

    return [{t.name: tf.TensorSpec(t.shape, t.dtype, name=t.name) for t in model.inputs}]
