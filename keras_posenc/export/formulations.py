"""Which function formulates which keras_posenc layer on which target: the one table, in one place.

`FORMULATIONS[(Target, layer class)]` is a function `(context, layer, inputs, **call_arguments)`
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
from keras_posenc.export.targets import TARGETS
from keras_posenc.layers.encoder import Encoder
from keras_posenc.layers.encoder_layer import EncoderLayer
from keras_posenc.layers.position_embedding_base import PositionEmbeddingBase
from keras_posenc.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_posenc.models import CausalLM

__all__ = ["ENTRIES", "FORMULATIONS"]

_CPU, _GPU, _GL, _TENSORRT = (TARGETS[name] for name in ("cpu", "gpu", "gl", "tensorrt"))

ENTRIES = (
    (_CPU, PositionEmbeddingBase, gather.position),
    (_CPU, TokenAndPositionEmbedding, gather.embedding_lookup),
    (_CPU, Encoder, gather.encoder),
    (_CPU, CausalLM, gather.causal_lm),
    (_TENSORRT, PositionEmbeddingBase, gather.position),
    (_TENSORRT, TokenAndPositionEmbedding, gather.embedding),
    (_TENSORRT, Encoder, gather.encoder),
    (_TENSORRT, CausalLM, gather.causal_lm),
    (_GL, PositionEmbeddingBase, gl.position),
    (_GL, TokenAndPositionEmbedding, gl.embedding),
    (_GL, EncoderLayer, gl.encoder_layer),
    (_GL, Encoder, gl.encoder),
    (_GL, CausalLM, gather.causal_lm),
    (_GPU, PositionEmbeddingBase, gl.position),
    (_GPU, TokenAndPositionEmbedding, gl.embedding),
    (_GPU, EncoderLayer, gpu.encoder_layer),
    (_GPU, Encoder, gpu.encoder),
    (_GPU, CausalLM, gather.causal_lm),
)

FORMULATIONS = {(target, layer_class): function for target, layer_class, function in ENTRIES}
