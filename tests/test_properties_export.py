"""Property: `to_tflite` on `cpu` and `gpu` matches Keras, or refuses exactly when it must.

Hypothesis draws small functional models: a TokenAndPositionEmbedding (every position kind, any
pad id, languages) followed by up to two more position layers (every additive kind, and RoPE with
a cos/sin table) with their own `max_length`s, or an Encoder with every position (RoPE and ALiBi
included) and possibly one more position layer after it; and an export length around the
shortest and longest tables. For each, on both targets:

- `to_tflite` raises ValueError exactly when the length exceeds the shortest table of the model
  (the length at which Keras refuses a full row, or where a layer with overflow="extend" would
  compute rows: exported positions stay inside the tables);
- otherwise the file's outputs on random padded rows (left, right or both sides, any pad id) equal
  Keras's on every real token.

Conversion costs about a second per model and target, so few examples run: a quarter of the
profile's. TensorFlow only (the exporter is TensorFlow's converter); on Keras 2 and Keras 3.
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import example, given, settings
from hypothesis import strategies as st
from layer_test_helper import requires_tf
from strategies import position_layer_configs, rope_configs, row_masks, seeds, token_ids_for

from keras_posenc import Encoder, export
from keras_posenc.backend import keras
from keras_posenc.layers import RotaryEmbedding, TokenAndPositionEmbedding
from keras_posenc.layers.encoder import ENCODER_POSITIONS
from keras_posenc.layers.token_and_position_embedding import POSITION_LAYERS

pytestmark = requires_tf

D_MODEL = 8
TARGETS = ("cpu", "gpu")


@st.composite
def export_models(draw, min_extras=0):
    """A recipe for a small functional model with one or more position layers (see the module)."""
    vocab_size = draw(st.integers(3, 20))
    recipe = {"vocab_size": vocab_size, "pad_id": draw(st.integers(0, vocab_size - 1)),
              "base": draw(st.sampled_from(["embedding", "encoder"])), "extras": []}
    lengths = st.integers(2, 12)
    if recipe["base"] == "embedding":
        kind, config = draw(position_layer_configs(depth=D_MODEL))
        recipe.update(position=kind, position_config=config, max_length=draw(lengths))
    else:
        position = draw(st.sampled_from(ENCODER_POSITIONS))
        config = {}
        if position == "rope":
            config = draw(rope_configs())
        elif position in POSITION_LAYERS:
            config = draw(position_layer_configs((position,), depth=D_MODEL, languages=False))[1]
        recipe.update(position=position, position_config=config, max_length=draw(lengths),
                      causal=draw(st.booleans()))
    for _ in range(draw(st.integers(min_extras, 2 if recipe["base"] == "embedding" else 1))):
        kind = draw(st.sampled_from(("rope",) + tuple(POSITION_LAYERS)))
        config = draw(rope_configs()) if kind == "rope" else draw(
            position_layer_configs((kind,), depth=D_MODEL, languages=recipe["base"] == "embedding"))[1]
        recipe["extras"].append((kind, draw(lengths), config))
    return recipe


def build(recipe):
    """The functional model of `recipe`; the language ids input only where a layer scales by language."""
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    languages = keras.Input(shape=(), dtype="int32", name="language_ids")
    uses_languages = False

    def with_languages(layer):
        nonlocal uses_languages
        if getattr(layer, "num_languages", None):
            uses_languages = True
            return {"language_ids": languages}
        return {}

    if recipe["base"] == "embedding":
        embedding = TokenAndPositionEmbedding(
            recipe["vocab_size"], D_MODEL, recipe["max_length"], pad_id=recipe["pad_id"], dropout=0.0,
            position=recipe["position"], position_config=recipe["position_config"])
        hidden = embedding(ids, **with_languages(embedding.position_embedding))
    else:
        encoder = Encoder(1, D_MODEL, 2, 16, recipe["vocab_size"], recipe["max_length"], dropout=0.0,
                          pad_id=recipe["pad_id"], position=recipe["position"],
                          position_config=recipe["position_config"])
        hidden = encoder(ids, use_causal_mask=recipe["causal"])
    for kind, max_length, config in recipe["extras"]:
        if kind == "rope":
            hidden = RotaryEmbedding(max_length=max_length, **config)(hidden)
        else:
            layer = POSITION_LAYERS[kind](max_length, **config)
            hidden = layer(hidden, **with_languages(layer))
    outputs = keras.layers.Dense(3)(hidden)
    return keras.Model([ids, languages] if uses_languages else ids, outputs)


def tables_of(recipe):
    """max_length of every position table: (all of them, those whose overflow is "error")."""
    layers = [(recipe["max_length"], recipe["position_config"].get("overflow", "error"))]
    layers += [(max_length, config.get("overflow", "error")) for _, max_length, config in recipe["extras"]]
    return [m for m, _ in layers], [m for m, overflow in layers if overflow == "error"]


def keras_refuses(model, feeds):
    try:
        model(feeds if len(feeds) > 1 else feeds[0])
    except (ValueError, tf.errors.InvalidArgumentError):
        return True
    return False


def feeds_of(recipe, token_ids, languages):
    configs = [recipe["position_config"]] + [config for _, _, config in recipe["extras"]]
    counts = [config["num_languages"] for config in configs if config.get("num_languages")]
    return [token_ids] + ([languages % min(counts)] if counts else [])


# The issue's case (tables of 16 and 8 rows, length 12) and a RoPE table as the shortest: checked
# on every run, whatever the profile draws.
ISSUE_CASE = {"vocab_size": 20, "pad_id": 1, "base": "embedding", "position": "sinusoidal",
              "position_config": {}, "max_length": 16, "extras": [("sinusoidal", 8, {})]}
ROPE_SHORTEST = {"vocab_size": 20, "pad_id": 0, "base": "embedding", "position": "learned",
                 "position_config": {}, "max_length": 8, "extras": [("rope", 3, {"scaling": None})]}


@example(recipe=ISSUE_CASE, beyond=3)
@example(recipe=ROPE_SHORTEST, beyond=0)
@given(export_models(min_extras=1), st.integers(0, 20))
def test_tflite_refuses_every_length_past_the_shortest_table(recipe, beyond):
    # Cheap (the exporter refuses before converting), so it runs the profile's full example count.
    model = build(recipe)
    every, error_mode = tables_of(recipe)
    length = min(every) + 1 + beyond % (max(every) + 2 - min(every))
    full_row = feeds_of(recipe, np.full([1, length], (recipe["pad_id"] + 1) % recipe["vocab_size"], np.int32),
                        np.zeros([1], np.int32))
    # Keras itself refuses a full row longer than a table of overflow="error".
    refused = keras_refuses(model, [tf.constant(f) for f in full_row])
    assert refused == (length > min(error_mode, default=length)), (refused, length, error_mode)
    for target in TARGETS:
        with pytest.raises(ValueError, match="exceeds"):
            export.to_tflite(model, sequence_length=length, target=target)


@settings(max_examples=max(3, settings.default.max_examples // 4))
@given(export_models(), st.data(), seeds)
def test_tflite_on_cpu_and_gpu_matches_keras_on_padded_rows(recipe, data, seed):
    # Conversion costs about a second per target: a quarter of the profile's examples.
    keras.utils.set_random_seed(seed)
    model = build(recipe)
    every, _ = tables_of(recipe)
    length = data.draw(st.sampled_from([1, min(every)]) | st.integers(1, min(every)), "sequence_length")
    rng = np.random.default_rng(seed)
    for target in TARGETS:
        flat = export.to_tflite(model, sequence_length=length, target=target)
        mask = np.stack([data.draw(row_masks(data.draw(st.integers(0, length)), length), "row")
                         for _ in range(2)])
        token_ids = token_ids_for(rng, mask, recipe["vocab_size"], recipe["pad_id"])
        feeds = feeds_of(recipe, token_ids, rng.integers(0, 3, size=len(mask)).astype(np.int32))
        difference = export.check_parity(model, flat, *feeds)
        assert difference <= 1e-4, (target, length, difference)
