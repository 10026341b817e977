"""Keras layers of keras_posenc."""

from keras_posenc.layers.learned_position_embedding import LearnedPositionEmbedding
from keras_posenc.layers.sinusoidal_position_embedding import SinusoidalPositionEmbedding
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding

__all__ = ["LearnedPositionEmbedding", "SinusoidalPositionEmbedding", "TokenAndPositionEmbedding"]
