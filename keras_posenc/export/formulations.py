"""Which function formulates which keras_posenc layer on which target: the one table, in one place.

`FORMULATIONS[(target name, layer class)]` is a function `(context, layer, inputs, **call_arguments)`
(`keras_posenc.export.formulation`). A layer takes the entry of its own class, else of its
nearest base class (`PositionEmbeddingBase` covers every position layer); a layer without an
entry on the way (Dense, LayerNormalization, ...) runs as it is. Each key appears once: no order
decides between two functions.

| layer class              | cpu                    | tensorrt         | gl              | gpu              |
|--------------------------|------------------------|------------------|-----------------|------------------|
| PositionEmbeddingBase    | gather.position        | gather.position  | gl.position     | gl.position      |
| TokenAndPositionEmbedding| gather.embedding_lookup| gather.embedding | gl.embedding    | gl.embedding     |
| EncoderLayer             | (the layer itself)     | (the layer itself)| gl.encoder_layer| gpu.encoder_layer|
| Encoder                  | gather.encoder         | gather.encoder   | gl.encoder      | gpu.encoder      |
| CausalLM                 | gather.causal_lm       | gather.causal_lm | gather.causal_lm| gather.causal_lm |
"""

from keras_posenc.export import gather, gl, gpu
from keras_posenc.layers.encoder import Encoder
from keras_posenc.layers.encoder_layer import EncoderLayer
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.models import CausalLM

__all__ = ["ENTRIES", "FORMULATIONS"]

ENTRIES = (
    ("cpu", PositionEmbeddingBase, gather.position),
    ("cpu", TokenAndPositionEmbedding, gather.embedding_lookup),
    ("cpu", Encoder, gather.encoder),
    ("cpu", CausalLM, gather.causal_lm),
    ("tensorrt", PositionEmbeddingBase, gather.position),
    ("tensorrt", TokenAndPositionEmbedding, gather.embedding),
    ("tensorrt", Encoder, gather.encoder),
    ("tensorrt", CausalLM, gather.causal_lm),
    ("gl", PositionEmbeddingBase, gl.position),
    ("gl", TokenAndPositionEmbedding, gl.embedding),
    ("gl", EncoderLayer, gl.encoder_layer),
    ("gl", Encoder, gl.encoder),
    ("gl", CausalLM, gather.causal_lm),
    ("gpu", PositionEmbeddingBase, gl.position),
    ("gpu", TokenAndPositionEmbedding, gl.embedding),
    ("gpu", EncoderLayer, gpu.encoder_layer),
    ("gpu", Encoder, gpu.encoder),
    ("gpu", CausalLM, gather.causal_lm),
)

FORMULATIONS = {(target, layer_class): function for target, layer_class, function in ENTRIES}
