"""Keras layers of keras_posenc."""

from keras_posenc.layers.decoder_layer import DecoderLayer
from keras_posenc.layers.integer_position_embedding import IntegerPositionEmbedding
from keras_posenc.layers.learned_position_embedding import LearnedPositionEmbedding
from keras_posenc.layers.positional_attention import PositionalAttention
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.sinusoidal_position_embedding import SinusoidalPositionEmbedding
from keras_posenc.layers.sinusoidal_position_embedding_2d import SinusoidalPositionEmbedding2D
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.layers.zero_position_embedding import ZeroPositionEmbedding

__all__ = [
    "DecoderLayer",
    "IntegerPositionEmbedding",
    "LearnedPositionEmbedding",
    "PositionalAttention",
    "RotaryEmbedding",
    "SinusoidalPositionEmbedding",
    "SinusoidalPositionEmbedding2D",
    "TokenAndPositionEmbedding",
    "ZeroPositionEmbedding",
]
