"""Positional embeddings for Transformers in TensorFlow/Keras."""

# Before TensorFlow's first import, _startup loads the application's native libraries that must
# come first (sentencepiece, when the `app` extra is installed) and, for the `keras-posenc`
# command, keeps the runtime's log lines and the libraries' warnings off its output unless
# --verbose is given. The layers themselves need only TensorFlow/Keras and numpy.
from keras_posenc import _startup  # noqa: F401, I001

from keras_posenc import layers
from keras_posenc.layers.alibi import alibi_slopes
from keras_posenc.layers.decoder_layer import DecoderLayer
from keras_posenc.layers.encoder import Encoder, EncoderLayer
from keras_posenc.positions import position_ids
from keras_posenc.schedules import WarmupSchedule
from keras_posenc.tables import resize_table_2d, sinusoidal_table, sinusoidal_table_2d

__version__ = "0.1.0"

__all__ = ["DecoderLayer", "Encoder", "EncoderLayer", "WarmupSchedule", "alibi_slopes", "layers",
           "position_ids", "resize_table_2d", "sinusoidal_table", "sinusoidal_table_2d"]
