"""Positional embeddings for Transformers in TensorFlow/Keras."""

from keras_posenc import layers
from keras_posenc.encoder import Encoder, EncoderLayer
from keras_posenc.positions import position_ids
from keras_posenc.schedules import WarmupSchedule
from keras_posenc.tables import sinusoidal_table

__version__ = "0.1.0"

__all__ = ["Encoder", "EncoderLayer", "WarmupSchedule", "layers", "position_ids", "sinusoidal_table"]
