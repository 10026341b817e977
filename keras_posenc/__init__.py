"""Positional embeddings for Transformers in TensorFlow/Keras."""

# sentencepiece must be loaded before TensorFlow: sentencepiece <= 0.2.0 (the last release for
# Python 3.8, the Python of the TF 2.12 GPU image) segfaults training a model otherwise.
import sentencepiece  # noqa: F401, I001

# For the `keras-posenc` command, the runtime's log lines and the libraries' warnings stay off the
# output unless --verbose is given; importing _startup sets that up, before TensorFlow's first import.
from keras_posenc import _startup  # noqa: F401, I001

from keras_posenc import layers
from keras_posenc.layers.alibi import alibi_slopes
from keras_posenc.layers.encoder import Encoder, EncoderLayer
from keras_posenc.positions import position_ids
from keras_posenc.schedules import WarmupSchedule
from keras_posenc.tables import resize_table_2d, sinusoidal_table, sinusoidal_table_2d

__version__ = "0.1.0"

__all__ = ["Encoder", "EncoderLayer", "WarmupSchedule", "alibi_slopes", "layers", "position_ids",
           "resize_table_2d", "sinusoidal_table", "sinusoidal_table_2d"]
