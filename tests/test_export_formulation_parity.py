"""Each export formulation computes what its Keras layer computes, for every option it branches on.

The formulations (`keras_posenc.export.gl`, `gather`, `gpu`) are called as the export calls them:
inside a traced graph (`graph_call`: every input a placeholder of fixed shape, as in the exported
file), or converted to a TFLite file for the op lists a target promises. Tiny layers (d_model 8,
length 6), every weight random (so a dropped LayerNorm gamma or language scale shows), compared
with the layer's own call (float32; tolerances below).
"""

import inspect
import math
import re

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import export
from keras_posenc.backend import is_keras3, keras
from keras_posenc.export import formulation, formulations, gather, gl, gpu, model_spec, shader_ops
from keras_posenc.layers import SinusoidalPositionEmbedding, TokenAndPositionEmbedding
from keras_posenc.layers.encoder import Encoder
from keras_posenc.layers.encoder_layer import EncoderLayer
from keras_posenc.layers.positional_attention import PositionalAttention
from keras_posenc.models import CausalLM
from keras_posenc.positions import position_ids as derive_position_ids

LENGTH, DEPTH, VOCAB = 6, 8, 20
EMBED_TOL = 1e-5  # a position row plus a token row: one float32 rounding each
ENCODER_TOL = 1e-4  # attention and LayerNorm in another order of float32 operations
# Right padding, left padding (positions must count real tokens only), a full row.
IDS = np.array([[3, 4, 5, 0, 0, 0], [0, 0, 7, 8, 9, 1], [4, 4, 8, 9, 10, 11]], np.int32)
POSITIONS = np.array([[5, 4, 3, 2, 1, 0], [2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 2, 2]], np.int32)
SEGMENTS = np.array([[1, 1, 2, 2, 2, 3], [1, 2, 2, 3, 3, 3], [1, 1, 1, 1, 2, 2]], np.int32)
LANGUAGES = np.array([1, 0, 1], np.int32)
LANGUAGE_TOKENS = np.array([[0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 1], [0, 0, 1, 1, 1, 1]], np.int32)


def context(target):
    return formulation.ExportContext(export.target_of(target), formulations.FORMULATIONS)


def randomize(layer, seed=0):
    """Every weight drawn anew (LayerNorm gamma/beta, language scales, tables, projections)."""
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(0.0, 0.5, w.shape).astype(np.float32) + (1.0 if "scale" in name else 0.0)
                       for name, w in zip([v.name for v in layer.weights], layer.get_weights())])
    return layer


def graph_call(function, *arrays):
    """`function(*tensors)` traced with every input a placeholder of the arrays' fixed shapes."""
    arrays = [np.asarray(a) for a in arrays]
    specs = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in arrays]
    return tf.function(function, input_signature=specs, autograph=False)(*arrays).numpy()


def features(batch=3, seed=1):
    return np.random.default_rng(seed).normal(0.0, 1.0, [batch, LENGTH, DEPTH]).astype(np.float32)


def token_layer(**kwargs):
    layer = TokenAndPositionEmbedding(VOCAB, DEPTH, 16, dropout=0.0, **kwargs)
    layer(IDS[:1], **({"language_ids": LANGUAGES[:1]} if kwargs.get("num_languages") else {}))
    return randomize(layer, 2)


def encoder_layer(**kwargs):
    layer = EncoderLayer(DEPTH, 2, 16, dropout=0.0, **kwargs)
    layer(features(1))
    return randomize(layer, 3)


def encoder(dropout=0.0, **kwargs):
    layer = Encoder(1, DEPTH, 2, 16, VOCAB, 16, dropout=dropout, **kwargs)
    layer(IDS[:1], **({"language_ids": LANGUAGES[:1]} if kwargs.get("num_languages") else {}))
    return randomize(layer, 4)


def host_rows(layer, ids, table=None):
    """What a runner feeds an `embedding="host"` file: the token rows, scaled by sqrt(d_model)."""
    table = layer.token_embedding.embeddings.numpy() if table is None else table
    return (table[ids] * (math.sqrt(layer.d_model) if layer.scale_embeddings else 1.0)).astype(np.float32)


def real_rows(ids):
    return ids != 0


def assert_close(got, want, tol, real=None):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    if real is not None:  # padding queries attend to nothing: arbitrary in every implementation
        got, want = got[real], want[real]
    assert np.abs(got - want).max() <= tol, np.abs(got - want).max()


# Position layers (gl.position on gl and gpu, gather.position on cpu and tensorrt) -------------
POSITION_FORMULATIONS = [(gl.position, "gl"), (gl.position, "gpu"), (gather.position, "cpu")]


@pytest.mark.parametrize("zero_padding", [True, False])
@pytest.mark.parametrize("function, target", POSITION_FORMULATIONS)
def test_position_rows_follow_the_mask(function, target, zero_padding):
    layer = SinusoidalPositionEmbedding(16, zero_padding=zero_padding)
    x, mask = features(), real_rows(IDS)
    want = layer(x, mask=tf.constant(mask)).numpy()
    batch = 1 if target == "gl" else 3
    for rows in range(0, 3, batch):
        part = slice(rows, rows + batch)
        got = graph_call(lambda x, m: function(context(target), layer, x, mask=m), x[part], mask[part])
        assert_close(got, want[part], EMBED_TOL)
    # Without a mask: the rows 0..T-1 at every position.
    table = layer.table_prefix(LENGTH)
    got = graph_call(lambda x: function(context(target), layer, x), x[:batch])
    assert_close(got, x[:batch] + np.asarray(table)[None], EMBED_TOL)


@pytest.mark.parametrize("function, target", POSITION_FORMULATIONS)
def test_position_rows_of_explicit_ids_and_languages(function, target):
    layer = SinusoidalPositionEmbedding(16, num_languages=2)
    layer(features(1), language_ids=tf.constant([0]))
    layer.language_scale.assign([0.5, 3.0])
    x, batch = features(), 1 if target == "gl" else 3
    for languages in (LANGUAGES, np.repeat(LANGUAGES[:, None], LENGTH, axis=1) * np.array([1, 0] * 3)):
        for mask in (None, real_rows(IDS)):
            want = layer(x, position_ids=tf.constant(POSITIONS), language_ids=tf.constant(languages),
                         mask=None if mask is None else tf.constant(mask)).numpy()
            for rows in range(0, 3, batch):
                part = slice(rows, rows + batch)
                arrays = [x[part], POSITIONS[part], languages[part]] + ([] if mask is None else [mask[part]])
                got = graph_call(lambda x, p, lang, *m: function(context(target), layer, x, position_ids=p,
                                                                 language_ids=lang, mask=m[0] if m else None),
                                 *arrays)
                assert_close(got, want[part], EMBED_TOL)


@pytest.mark.parametrize("runtime", [True, False])
@pytest.mark.parametrize("function, target", POSITION_FORMULATIONS)
def test_position_rows_restart_in_each_segment(function, target, runtime):
    layer = SinusoidalPositionEmbedding(16)
    x, mask = features(), real_rows(IDS)
    segments = SEGMENTS if runtime else np.repeat(SEGMENTS[:1], 3, 0)
    ids = derive_position_ids(tf.constant(mask), segment_ids=tf.constant(segments))
    want = layer(x, position_ids=ids, mask=tf.constant(mask)).numpy()
    batch = 1 if target == "gl" or (runtime and target == "gpu") else 3
    for rows in range(0, 3, batch):
        part = slice(rows, rows + batch)
        if runtime:
            got = graph_call(lambda x, m, s: function(context(target), layer, x, mask=m, segment_ids=s),
                             x[part], mask[part], segments[part])
        else:
            got = graph_call(_with_constant_position_segments(function, target, layer, segments[part]),
                             x[part], mask[part])
        assert_close(got, want[part], EMBED_TOL)


def _with_constant_position_segments(function, target, layer, segments):
    def run(x, mask):
        return function(context(target), layer, x, mask=mask, segment_ids=tf.constant(segments))

    return run


# Token and position embeddings ---------------------------------------------------------------
EMBEDDINGS = [(gl.embedding, "gl"), (gl.embedding, "gpu"), (gather.embedding_lookup, "cpu"),
              (gather.embedding, "tensorrt")]


def _row_batches(target, batch, arguments, host, table_layer, call, ids=IDS):
    """`call(ctx, ids, **arguments)` traced on the rows of `ids`, `batch` at a time, concatenated;
    with `host`, the traced context also takes the rows of that table (`table_layer`'s lookup)."""
    names = list(arguments)
    out = []
    for rows in range(0, len(ids), batch):
        part = slice(rows, rows + batch)
        arrays = [ids[part]] + [arguments[name][part] for name in names]
        if host is not None:  # the rows of the table `host`
            arrays.append(host_rows(table_layer, ids[part], host))

        def run(token_ids, *others):
            ctx = context(target)
            with ctx.tracing(host_rows=others[-1] if host is not None else None):
                return call(ctx, token_ids, **dict(zip(names, others[:len(names)])))

        out.append(graph_call(run, *arrays))
    return np.concatenate(out)


def _embedding_calls(layer, target, function, arguments, host=None, ids=IDS):
    """The formulation's rows for every row of `ids`, with `arguments` {name: array}: batch 1 on gl,
    and with runtime segment ids on gpu."""
    batch = 1 if target == "gl" or (target == "gpu" and "segment_ids" in arguments) else len(ids)
    return _row_batches(target, batch, arguments, host, layer,
                        lambda ctx, token_ids, **given: function(ctx, layer, token_ids, **given), ids)


@pytest.mark.parametrize("arguments", ["", "position_ids", "segment_ids", "language_ids",
                                       "language_ids_per_token", "pad_id"])
@pytest.mark.parametrize("function, target", EMBEDDINGS)
def test_embedding_matches_the_layer(function, target, arguments):
    per_token = arguments == "language_ids_per_token"
    if arguments.startswith("language"):
        layer = token_layer(num_languages=2)
    else:  # pad id 4: the last row's first two tokens are padding
        layer = token_layer(pad_id=4) if arguments == "pad_id" else token_layer()
    given = {"position_ids": POSITIONS, "segment_ids": SEGMENTS,
             "language_ids": LANGUAGE_TOKENS if per_token else LANGUAGES}
    name = "" if arguments == "pad_id" else "language_ids" if per_token else arguments
    kwargs = {name: given[name]} if name else {}
    want = layer(IDS, **{k: tf.constant(v) for k, v in kwargs.items()}).numpy()
    assert_close(_embedding_calls(layer, target, function, kwargs), want, EMBED_TOL)


@pytest.mark.parametrize("scale_embeddings", [True, False])
@pytest.mark.parametrize("function, target", EMBEDDINGS)
def test_embedding_with_host_rows_and_unscaled_tokens(function, target, scale_embeddings):
    layer = token_layer(scale_embeddings=scale_embeddings, zero_padding=False)
    want = layer(IDS).numpy()
    assert_close(_embedding_calls(layer, target, function, {}), want, EMBED_TOL)
    if target != "cpu":  # embedding="host": the rows fed are used (not the file's table), the ids mask
        fed = np.random.default_rng(7).normal(0.0, 1.0, [VOCAB, DEPTH]).astype(np.float32)
        got = _embedding_calls(layer, target, function, {}, host=fed)
        layer.token_embedding.embeddings.assign(fed)
        assert_close(got, layer(IDS).numpy(), EMBED_TOL)


@pytest.mark.parametrize("arguments", ["position_ids", "segment_ids", "language_ids"])
@pytest.mark.parametrize("function, target", [(gl.embedding, "gl"), (gl.embedding, "gpu"),
                                              (gather.embedding, "tensorrt")])
def test_host_rows_take_position_ids_segments_and_languages(function, target, arguments):
    """embedding="host": the rows fed get the position rows of the ids, segments and languages given."""
    layer = token_layer(num_languages=2) if arguments == "language_ids" else token_layer()
    given = {"position_ids": POSITIONS, "segment_ids": SEGMENTS, "language_ids": LANGUAGES}
    kwargs = {arguments: given[arguments]}
    want = layer(IDS, **{k: tf.constant(v) for k, v in kwargs.items()}).numpy()
    table = layer.token_embedding.embeddings.numpy()
    assert_close(_embedding_calls(layer, target, function, kwargs, host=table), want, EMBED_TOL)


BIG_VOCAB = 3000  # past 2048: ids split into two digits (64 * 47 = 3008 rows), padding by its one-hot column
BIG_IDS = np.array([[2999, 2048, 2049, 0, 0, 0], [0, 0, 63, 64, 2999, 1], [4, 2999, 2047, 2500, 10, 2998]],
                   np.int32)


@pytest.mark.parametrize("pad_id", [0, 2999, 2500])
@pytest.mark.parametrize("target", ["gl", "gpu"])
def test_embedding_of_a_vocab_past_2048_matches_the_layer(target, pad_id):
    layer = TokenAndPositionEmbedding(BIG_VOCAB, DEPTH, 16, dropout=0.0, pad_id=pad_id)
    layer(BIG_IDS[:1])
    randomize(layer, 5)
    got = _embedding_calls(layer, target, gl.embedding, {}, ids=BIG_IDS)
    want = layer(BIG_IDS).numpy()
    assert_close(got, want, EMBED_TOL)
    # A pad id past 2048 is padding too: its token row and no position row.
    token_rows = layer.token_embedding.embeddings.numpy()[BIG_IDS] * math.sqrt(DEPTH)
    np.testing.assert_allclose(got[BIG_IDS == pad_id], token_rows[BIG_IDS == pad_id], rtol=0, atol=EMBED_TOL)


def test_cpu_and_tensorrt_position_ids_restart_in_constant_segments():
    layer = token_layer(zero_padding=False)  # row 0 at padding
    segments = SEGMENTS[:1]
    for target, function in (("cpu", gather.embedding_lookup), ("tensorrt", gather.embedding)):
        def run(ids, target=target, function=function):
            return function(context(target), layer, ids, segment_ids=tf.constant(segments))

        got = graph_call(run, IDS)
        want = layer(IDS, segment_ids=tf.constant(np.repeat(segments, 3, 0))).numpy()
        assert_close(got, want, EMBED_TOL)


def _embedding_model(**kwargs):
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    layer = TokenAndPositionEmbedding(VOCAB, DEPTH, 16, dropout=0.0, **kwargs)
    model = keras.Model(ids, layer(ids))
    randomize(model, 5)
    return model


def test_cpu_looks_tokens_up_by_embedding_lookup_and_positions_by_gather():
    model = _embedding_model()
    flat = export.to_tflite(model, sequence_length=LENGTH, target="cpu", batch_size=3)
    ops = export.op_counts(flat)
    assert ops.get("EMBEDDING_LOOKUP") == 1 and ops.get("GATHER") == 1, ops
    assert export.check_parity(model, flat, IDS, ignore_padding=False) <= EMBED_TOL
    for target in ("gpu", "gl"):  # one-hot products: no GATHER, no CUMSUM
        flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
        ops = export.op_counts(flat)
        assert not {"GATHER", "EMBEDDING_LOOKUP", "CUMSUM"} & set(ops), ops
        assert export.check_parity(model, flat, IDS, ignore_padding=False) <= EMBED_TOL


# Encoder layers (gl.encoder_layer, gpu.encoder_layer) ----------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("function, target", [(gl.encoder_layer, "gl"), (gpu.encoder_layer, "gpu")])
def test_encoder_layer_matches_the_layer(function, target, masked, causal):
    layer = encoder_layer(norm_first=causal)
    x, mask = features(), real_rows(IDS)
    want = layer(x, mask=tf.constant(mask) if masked else None, use_causal_mask=causal).numpy()
    batch = 1 if target == "gl" else 3
    for rows in range(0, 3, batch):
        part = slice(rows, rows + batch)
        if masked:
            got = graph_call(lambda x, m: function(context(target), layer, x, mask=m, use_causal_mask=causal),
                             x[part], mask[part])
        else:
            got = graph_call(lambda x: function(context(target), layer, x, use_causal_mask=causal), x[part])
        assert_close(got, want[part], ENCODER_TOL, mask[part] if masked else None)


@pytest.mark.parametrize("function, target", [(gl.encoder_layer, "gl"), (gpu.encoder_layer, "gpu")])
def test_encoder_layer_takes_a_constant_attention_mask(function, target):
    layer = encoder_layer()
    allowed = np.tril(np.ones([LENGTH, LENGTH], bool)) | np.eye(LENGTH, k=2, dtype=bool)
    x = features(1)
    want = layer(x, attention_mask=tf.constant(allowed[None])).numpy()
    got = graph_call(lambda x: function(context(target), layer, x, attention_mask=tf.constant(allowed[None])),
                     x)
    assert_close(got, want, ENCODER_TOL)


@pytest.mark.parametrize("function, target", [(gl.encoder_layer, "gl"), (gpu.encoder_layer, "gpu")])
def test_encoder_layer_takes_the_additive_bias_its_encoder_builds(function, target):
    layer = encoder_layer()
    allowed = np.tril(np.ones([LENGTH, LENGTH], bool))
    allowed[:, 1] = False  # key 1 masked for every query (each still has key 0)
    x = features(1)
    want = layer(x, attention_mask=tf.constant(allowed[None])).numpy()
    bias = np.where(allowed, 0.0, -1e4).astype(np.float32)
    bias = bias[None, :, None, :] if target == "gl" else bias[None, None]  # gl [1, T, 1, T], gpu [B, 1, T, T]
    got = graph_call(lambda x, b: function(context(target), layer, x, attention_mask=b), x, bias)
    assert_close(got, want, ENCODER_TOL)


@pytest.mark.parametrize("target", ["gl", "gpu"])
def test_encoder_layer_in_a_model_gets_the_padding_mask(target):
    # Keras hands the embedding's padding mask to the wrapped EncoderLayer: the file masks padding keys.
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    embedded = TokenAndPositionEmbedding(VOCAB, DEPTH, 16, dropout=0.0)(ids)
    model = keras.Model(ids, EncoderLayer(DEPTH, 2, 16, dropout=0.0)(embedded))
    randomize(model, 10)
    flat = export.to_tflite(model, sequence_length=LENGTH, target=target)
    assert export.check_parity(model, flat, IDS) <= ENCODER_TOL
    # Without the mask the real tokens would attend to the padding: a visible difference.
    unmasked = model.layers[-1](tf.identity(model.layers[1](IDS[:2])))  # a plain tensor: no mask
    assert np.abs(unmasked.numpy() - model(IDS[:2]).numpy())[real_rows(IDS[:2])].max() > 1e-3


def test_gl_encoder_layer_refuses_a_batch_of_two():
    layer = encoder_layer()
    with pytest.raises(ValueError, match="batch 1 only"):
        graph_call(lambda x: gl.encoder_layer(context("gl"), layer, x), features(2))


# Encoders (gl.encoder, gpu.encoder, gather.encoder) ------------------------------------------
ENCODERS = [(gl.encoder, "gl"), (gpu.encoder, "gpu"), (gather.encoder, "cpu"), (gather.encoder, "tensorrt")]


def _encoder_calls(layer, target, function, arguments, batch=None, host=None, **options):
    batch = batch or (1 if target == "gl" else 3)
    return _row_batches(target, batch, arguments, host, layer.embedding,
                        lambda ctx, ids, **given: ctx.emit(layer, ids, **given, **options))


@pytest.mark.parametrize("case", ["plain", "causal_norm_first", "segments", "causal_segments", "host",
                                  "attention_mask", "pad_id"])
@pytest.mark.parametrize("function, target", ENCODERS)
def test_encoder_matches_the_layer(function, target, case):
    pad_id = 4 if case == "pad_id" else 0
    layer = encoder(norm_first=case == "causal_norm_first", pad_id=pad_id)
    assert context(target).formulation_of(layer) is function
    causal = case.startswith("causal")
    arguments = {"segment_ids": SEGMENTS} if "segments" in case else {}
    options = {"use_causal_mask": causal}
    if case == "attention_mask":
        allowed = np.tril(np.ones([LENGTH, LENGTH], bool)) | np.eye(LENGTH, k=3, dtype=bool)
        options["attention_mask"] = tf.constant(allowed[None])
    batch = 1 if "segments" in case and target == "gpu" else None  # runtime segments: batch 1 on gpu
    fed = None
    if case == "host":  # rows of another table fed: the file must use them
        fed = np.random.default_rng(7).normal(0.0, 1.0, [VOCAB, DEPTH]).astype(np.float32)
    got = _encoder_calls(layer, target, function, arguments, batch=batch, host=fed, **options)
    if fed is not None:
        layer.embedding.token_embedding.embeddings.assign(fed)
    want = layer(IDS, **{k: tf.constant(v) for k, v in arguments.items()}, **options).numpy()
    assert_close(got, want, ENCODER_TOL, IDS != pad_id)


def _with_constant_segments(layer, target, segments):
    def run(ids, position_ids, language_ids):  # segment ids a constant of the graph: a known structure
        return context(target).emit(layer, ids, position_ids=position_ids, language_ids=language_ids,
                                    segment_ids=tf.constant(segments))

    return run


@pytest.mark.parametrize("function, target", ENCODERS)
def test_encoder_with_position_ids_languages_and_constant_segments(function, target):
    layer = encoder(num_languages=2)
    layer.embedding.position_embedding.language_scale.assign([0.5, 3.0])
    segments = SEGMENTS[:1]
    want = layer(IDS, position_ids=tf.constant(POSITIONS), language_ids=tf.constant(LANGUAGES),
                 segment_ids=tf.constant(np.repeat(segments, 3, 0))).numpy()
    batch = 1 if target == "gl" else 3
    out = []
    for rows in range(0, 3, batch):
        part = slice(rows, rows + batch)
        out.append(graph_call(_with_constant_segments(layer, target, np.repeat(segments, batch, 0)),
                              IDS[part], POSITIONS[part], LANGUAGES[part]))
    assert_close(np.concatenate(out), want, ENCODER_TOL, real_rows(IDS))


@pytest.mark.parametrize("function, target", ENCODERS)
def test_encoder_with_dropout_exports_inference(function, target):
    # Dropout on the embeddings, attention and feed-forward: the file computes the inference output.
    layer = encoder(dropout=0.5)
    want = layer(IDS, training=False).numpy()
    assert_close(_encoder_calls(layer, target, function, {}), want, ENCODER_TOL, real_rows(IDS))


@pytest.mark.parametrize("target", ["cpu", "tensorrt"])
def test_cpu_and_tensorrt_encoders_take_a_runtime_attention_mask_per_row(target):
    layer = encoder()
    allowed = np.stack([np.tril(np.ones([LENGTH, LENGTH], bool)), np.ones([LENGTH, LENGTH], bool),
                        np.tril(np.ones([LENGTH, LENGTH], bool)) | np.eye(LENGTH, k=2, dtype=bool)])
    for segments in (None, SEGMENTS):
        extra = {} if segments is None else {"segment_ids": tf.constant(segments)}
        want = layer(IDS, attention_mask=tf.constant(allowed), **extra).numpy()
        if segments is None:
            got = graph_call(lambda ids, a: context(target).emit(layer, ids, attention_mask=a), IDS, allowed)
        else:
            got = graph_call(lambda ids, a, s: context(target).emit(layer, ids, attention_mask=a,
                                                                    segment_ids=s), IDS, allowed, segments)
        assert_close(got, want, ENCODER_TOL, real_rows(IDS))


def test_gpu_encoder_compares_segments_at_run_time_only_when_they_are_runtime_inputs():
    layer = encoder()

    def abs_ops(function, *arrays):
        specs = [tf.TensorSpec(a.shape, tf.int32) for a in arrays]
        graph = tf.function(function, input_signature=specs, autograph=False).get_concrete_function().graph
        return sum(op.type == "Abs" for op in graph.get_operations())

    ctx = context("gpu")
    plain = abs_ops(lambda ids: gpu.encoder(ctx, layer, ids), IDS[:1])
    runtime = abs_ops(lambda ids, s: gpu.encoder(ctx, layer, ids, segment_ids=s), IDS[:1], SEGMENTS[:1])
    constant = abs_ops(lambda ids: gpu.encoder(ctx, layer, ids, segment_ids=tf.constant(SEGMENTS[:1])),
                       IDS[:1])
    # |q - k| of the segment ids in the traced graph only for runtime ids; constant ones are in the structure.
    assert runtime > plain == constant


ROPE_AND_ALIBI = {"rope": {"position": "rope"}, "alibi": {"position": "alibi"},
                  "rope-interleave": {"position": "rope", "layout": "interleave"},
                  "rope-partial": {"position": "rope", "partial_rotary_factor": 0.5},
                  "rope-interleave-partial": {"position": "rope", "layout": "interleave",
                                               "partial_rotary_factor": 0.5},
                  # YaRN's attention factor (0.1 ln 4 + 1) scales cos and sin of every rotated pair.
                  "rope-yarn": {"position": "rope", "scaling": "yarn", "scaling_factor": 4.0,
                                "original_length": 8}}


@pytest.mark.parametrize("position", sorted(ROPE_AND_ALIBI))
@pytest.mark.parametrize("function, target", ENCODERS)
def test_rope_and_alibi_encoders_match_the_layer(function, target, position):
    layer = encoder(**ROPE_AND_ALIBI[position])
    want = layer(IDS, use_causal_mask=True).numpy()
    got = _encoder_calls(layer, target, function, {}, use_causal_mask=True)
    assert_close(got, want, ENCODER_TOL, real_rows(IDS))


@pytest.mark.parametrize("position", ["rope", "alibi"])
@pytest.mark.parametrize("function, target", [(gl.encoder, "gl"), (gpu.encoder, "gpu")])
def test_shader_encoders_refuse_explicit_position_ids_with_rope_and_alibi(function, target, position):
    layer = encoder(position=position)
    message = (f"The {position} encoder exports with the ids it derives from padding and segments; "
               "explicit position_ids are not supported on the gl and gpu targets.")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        graph_call(lambda ids, p: function(context(target), layer, ids, position_ids=p),
                   IDS[:1], POSITIONS[:1])


@pytest.mark.parametrize("function, target", [(gl.encoder, "gl"), (gpu.encoder, "gpu")])
def test_shader_encoders_refuse_an_attention_mask_known_only_at_run_time(function, target):
    layer = encoder()
    allowed = np.tril(np.ones([1, LENGTH, LENGTH], np.int32))
    message = "The gl and gpu targets need a constant attention_mask (attention_mask is not constant)."
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        graph_call(lambda ids, m: function(context(target), layer, ids, attention_mask=m), IDS[:1], allowed)


def test_broadcast_rows_gives_any_number_of_copies_by_concatenations_of_few_inputs():
    """Powers of two included (the doubling stops after the largest one not above the count)."""
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    for copies in [1, 2, 3, 4, 6, 8, 9, 16, 31]:
        got = graph_call(lambda t, copies=copies: shader_ops.broadcast_rows(t, copies, axis=1), x)
        np.testing.assert_array_equal(got, np.concatenate([x] * copies, axis=1), err_msg=str(copies))
    graph = tf.function(lambda t: shader_ops.broadcast_rows(t, 31, axis=2)).get_concrete_function(
        tf.TensorSpec([1, 2, 3], tf.float32)).graph
    inputs = [len(op.inputs) - 1 for op in graph.get_operations() if op.type == "ConcatV2"]
    assert inputs and max(inputs) <= 16  # a GL shader binds at most 16 storage buffers


@pytest.mark.parametrize("vocab", [2048, 2049, 4096, 5041, 8000])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_token_one_hot_gives_every_id_its_own_row(vocab, dtype):
    """Past 2048 (float16's last exact integer) an id is split into two digits, one-hot each, and
    joined by their outer product: int32 ids (gpu) by FLOOR_DIV, float ids (gl) by thresholds."""
    edges = [0, 1, 2, 63, 64, 65, 70, 71, 127, 128, 2047, 2048, 2049, 4095, 4096, 4999, 5040, 7999]
    ids = np.array(sorted({i for i in edges if i < vocab} | {vocab - 1}), dtype)
    ids = np.resize(ids, 2 * math.ceil(len(ids) / 2)).reshape(2, -1)  # [B = 2, T]
    rows = graph_call(lambda t: shader_ops.token_one_hot(t, vocab), ids)
    assert rows.shape[:2] == (1, ids.size) and rows.shape[2] >= vocab
    expected = np.eye(rows.shape[2], dtype=np.float32)[ids.reshape(-1).astype(int)]
    np.testing.assert_array_equal(rows[0], expected)


@pytest.mark.parametrize("misread", ["float16", -2.0, -1.0, 1.0, 2.0])
def test_gl_token_digits_are_corrected_when_the_gpu_misreads_an_id(monkeypatch, misread):
    """gl's float ids: the thresholds' CONV_2D may read an id rounded (a float16 GPU reads 8190 as
    8192) or a step off, and the high digit comes out one off; the low digit's SUB reads the id
    exactly, and one correction step puts both digits back, so every id keeps its own row."""
    vocab, base = 8200, 128  # 65 high digits; float16 steps by 4 past 4096
    ids = np.array(sorted({v for h in range(vocab // base + 1) for v in range(base * h - 2, base * h + 3)
                           if 0 <= v < vocab}), np.float32)
    if misread == "float16":
        def read(values):
            return tf.cast(tf.cast(values, tf.float16), tf.float32)
    else:
        def read(values):
            return values + misread
    exact_linear, reads = shader_ops.linear, []

    def misreading_linear(x, kernel, bias=None):
        if bias is not None:  # token_one_hot's one biased CONV_2D: the ids against the thresholds
            reads.append(x)
            x = read(x)
        return exact_linear(x, kernel, bias)

    monkeypatch.setattr(shader_ops, "linear", misreading_linear)
    rows = graph_call(lambda t: shader_ops.token_one_hot(t, vocab), ids[None])
    assert len(reads) == 1
    read_ids = graph_call(read, ids)
    assert (np.floor(read_ids / base) != np.floor(ids / base)).sum() >= 10  # high digits read off by one
    np.testing.assert_array_equal(rows[0], np.eye(rows.shape[2], dtype=np.float32)[ids.astype(int)])


@pytest.mark.parametrize("vocab", [40, 2048, 2049, 3000, 4097, 5041, 8000, 50257])
def test_token_one_hot_rows_stay_near_the_vocab_and_split_only_past_2048(vocab):
    """The digits' base is 2^ceil(log2(vocab) / 2): two one-hots of about sqrt(vocab) columns each,
    and fewer than `base` zero rows past the vocab in the file's token table; up to 2048 one plain
    one-hot (no FLOOR_DIV to run)."""
    base = 2 ** math.ceil(math.log2(vocab) / 2)
    width = vocab if vocab <= 2048 else base * math.ceil(vocab / base)
    function = tf.function(lambda t: shader_ops.token_one_hot(t, vocab), autograph=False)
    graph = function.get_concrete_function(tf.TensorSpec([1, 3], tf.int32))
    assert graph.structured_outputs.shape == (1, 3, width)
    op_types = {op.type for op in graph.graph.get_operations()}
    assert ("FloorDiv" in op_types) == (vocab > 2048)
    # gl's float ids: every computed tensor keeps the leading batch axis of 1 the GL delegate needs.
    graph = function.get_concrete_function(tf.TensorSpec([1, 3], tf.float32)).graph
    shapes = [output.shape for op in graph.get_operations() if op.type != "Const" for output in op.outputs
              if output.shape.rank]
    assert [shape for shape in shapes if shape.rank >= 2 and shape[0] != 1] == []


def test_alibi_constants_are_minus_the_slope_times_the_distance():
    """The bias the gl and gpu files hold: -m_h |i - j|, zero on the diagonal (a softmax would hide a
    constant added to every score, a file's float16 constants would not)."""
    attention = PositionalAttention(4, 8, position="alibi")
    bias = shader_ops.alibi_constants(attention, 5)
    slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)  # the ALiBi paper's slopes for 4 heads
    distance = np.abs(np.arange(5)[None, :] - np.arange(5)[:, None])
    assert bias.dtype == np.float32
    np.testing.assert_array_equal(bias, (-slopes[:, None, None] * distance).astype(np.float32))
    assert shader_ops.alibi_constants(PositionalAttention(4, 8, position="rope"), 5) is None


def test_shader_layer_norm_keeps_epsilon_where_the_variance_is_as_small():
    """Centered values are scaled by 1/8 before squaring, epsilon by 1/64: exact where epsilon matters."""
    norm = keras.layers.LayerNormalization(epsilon=0.01)
    x = features(1) * 0.1  # variance ~0.01, as large as epsilon
    norm(x)
    randomize(norm, 6)
    got = graph_call(lambda x: shader_ops.layer_norm(x, norm), x)
    centered = x.astype(np.float64) - x.astype(np.float64).mean(-1, keepdims=True)
    y = centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 0.01)
    assert_close(got, y * norm.gamma.numpy() + norm.beta.numpy(), 1e-5)
    assert_close(got, norm(x).numpy(), 1e-5)


@pytest.mark.parametrize("center, scale", [(False, True), (True, False)])
def test_gpu_layer_norm_without_center_or_scale(center, scale):
    norm = keras.layers.LayerNormalization(epsilon=1e-3, center=center, scale=scale)
    x = features()
    norm(x)
    randomize(norm, 6)
    got = graph_call(lambda x: gpu.layer_norm(x, norm), x)
    mean = x.astype(np.float64).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-3)
    if scale:
        y = y * norm.gamma.numpy()
    if center:
        y = y + norm.beta.numpy()
    assert_close(got, y, 1e-5)


def test_gpu_and_gl_encoder_files_use_their_own_ops():
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, Encoder(1, DEPTH, 2, 16, VOCAB, 16, dropout=0.0, norm_first=True)(ids))
    randomize(model, 7)
    gpu_flat = export.to_tflite(model, sequence_length=LENGTH, target="gpu", batch_size=3)
    ops = export.op_counts(gpu_flat)
    # Attention by BATCH_MATMUL of heads moved by TRANSPOSE, LayerNorm by MEAN (3 norms: 2 + final).
    assert ops.get("BATCH_MATMUL") == 2 and ops.get("MEAN") == 6 and "TRANSPOSE" in ops, ops
    assert export.gpu_incompatible_ops(gpu_flat, backend="webgpu") == []
    assert export.check_parity(model, gpu_flat, IDS) <= ENCODER_TOL
    gl_flat = export.to_tflite(model, sequence_length=LENGTH, target="gl")
    ops = export.op_counts(gl_flat)
    assert not {"BATCH_MATMUL", "TRANSPOSE", "MEAN", "GATHER"} & set(ops), ops
    assert export.gpu_incompatible_ops(gl_flat, backend="gl") == []
    assert export.check_parity(model, gl_flat, IDS) <= ENCODER_TOL
    cpu_flat = export.to_tflite(model, sequence_length=LENGTH, target="cpu", batch_size=3)
    assert "EMBEDDING_LOOKUP" in export.op_counts(cpu_flat)
    assert export.check_parity(model, cpu_flat, IDS) <= ENCODER_TOL


# The language model (gather.causal_lm on every target) ---------------------------------------
def _causal_lm(**config):
    keras.utils.set_random_seed(0)
    model = CausalLM({"num_layers": 1, "d_model": DEPTH, "num_heads": 2, "dff": 16, "vocab_size": VOCAB,
                      "max_length": 16, **config})
    model.build_on_dummy()
    return randomize(model, 8)


@pytest.mark.parametrize("target", ["gl", "gpu", "cpu"])
def test_causal_lm_is_causal_and_returns_float32_logits(target):
    model = _causal_lm(dropout=0.5)  # the file computes the inference logits
    want = model(IDS, training=False).numpy()
    batch = 1 if target == "gl" else 3
    got = np.concatenate([graph_call(lambda ids: context(target).emit(model, ids), IDS[r:r + batch])
                          for r in range(0, 3, batch)])
    assert got.dtype == np.float32 and got.shape == (3, LENGTH, VOCAB)
    assert_close(got, want, ENCODER_TOL, real_rows(IDS))


def test_causal_lm_takes_a_dict_of_inputs():
    model = _causal_lm(num_languages=2)
    model.encoder.embedding.position_embedding.language_scale.assign([0.5, 3.0])
    want = model({"token_ids": IDS, "position_ids": POSITIONS, "language_ids": LANGUAGES}).numpy()
    got = graph_call(lambda ids, p, lang: gather.causal_lm(
        context("cpu"), model, {"token_ids": ids, "position_ids": p, "language_ids": lang}),
        IDS, POSITIONS, LANGUAGES)
    assert_close(got, want, ENCODER_TOL, real_rows(IDS))
    got = graph_call(lambda ids, p, lang: gather.causal_lm(context("cpu"), model, ids, position_ids=p,
                                                           language_ids=lang), IDS, POSITIONS, LANGUAGES)
    assert_close(got, want, ENCODER_TOL, real_rows(IDS))
    # Ids the dict leaves out come from the keywords.
    got = graph_call(lambda ids, p, lang: gather.causal_lm(context("cpu"), model, {"token_ids": ids},
                                                           position_ids=p, language_ids=lang),
                     IDS, POSITIONS, LANGUAGES)
    assert_close(got, want, ENCODER_TOL, real_rows(IDS))


# How a formulation is applied (formulation.py) ------------------------------------------------
def test_formulation_of_follows_the_class_and_the_target():
    for target, module in (("gl", gl), ("gpu", gpu)):
        assert context(target).formulation_of(EncoderLayer(DEPTH, 2, 16)) is module.encoder_layer
    assert context("cpu").formulation_of(EncoderLayer(DEPTH, 2, 16)) is None
    assert context("cpu").formulation_of(keras.layers.Dense(3)) is None


def test_tracing_freezes_each_position_layer_once_and_gives_host_rows():
    ctx = context("gpu")
    layer = SinusoidalPositionEmbedding(16)
    layer(features(1))
    first, second = ctx.frozen(layer), ctx.frozen(layer)
    assert first is not second  # outside a trace: fresh each time
    np.testing.assert_array_equal(first.table, np.asarray(layer.table_prefix(16), np.float32))
    assert ctx.host_rows is None
    with ctx.tracing(host_rows="rows") as traced:
        assert traced is ctx and ctx.host_rows == "rows"
        once = ctx.frozen(layer)
        assert ctx.frozen(layer) is once
        other = SinusoidalPositionEmbedding(16)
        other(features(1))
        assert ctx.frozen(other) is not once
    assert ctx.host_rows is None and ctx.frozen(layer) is not once
    with pytest.raises(RuntimeError):
        with ctx.tracing(host_rows="rows"):
            raise RuntimeError("the trace failed")
    assert ctx.host_rows is None and ctx.frozen(layer) is not ctx.frozen(layer)


def test_emit_calls_the_layer_itself_without_a_formulation():
    dense = keras.layers.Dense(3)
    x = features(1)
    got = context("cpu").emit(dense, tf.constant(x))
    np.testing.assert_allclose(got.numpy(), dense(x).numpy(), atol=1e-6)


def test_apply_leaves_out_mask_and_training_for_functions_without_them():
    seen = []

    def plain(context, layer, x, scale=1.0):
        seen.append((x, scale))
        return x

    def keywords(context, layer, x, **kwargs):
        seen.append(kwargs)
        return x

    formulation.apply(plain, None, None, (1,), {"mask": "m", "training": False, "scale": 2.0})
    formulation.apply(keywords, None, None, (1,), {"mask": "m", "training": False})
    assert seen == [(1, 2.0), {"mask": "m", "training": False}]
    with pytest.raises(TypeError):  # other unknown arguments are not dropped silently
        formulation.apply(plain, None, None, (1,), {"segment_ids": 3})


def test_formulated_layer_wraps_one_layer_with_its_signature():
    ctx = context("gl")
    layer = encoder_layer()
    wrapped = formulation.Formulated.of(layer, ctx)
    assert type(wrapped).__name__ == "FormulatedEncoderLayer"
    # Keras reads the call signature to decide what to pass (mask, training): the layer's own.
    assert inspect.signature(type(wrapped).call) == inspect.signature(EncoderLayer.call)
    assert type(formulation.Formulated.of(encoder_layer(), ctx)) is type(wrapped)
    assert wrapped.name == f"{layer.name}_gl" and wrapped.layer is layer
    assert wrapped.formulation is gl.encoder_layer and wrapped.supports_masking
    mask = tf.constant(real_rows(IDS[1:2]))
    # The wrapped layer's own mask passes on (an EncoderLayer keeps the padding mask).
    np.testing.assert_array_equal(np.asarray(wrapped.compute_mask(tf.constant(features(1)), mask)),
                                  real_rows(IDS[1:2]))
    x = features(1)
    got = wrapped(tf.constant(x), mask=mask)
    assert_close(got.numpy(), layer(x, mask=mask).numpy(), ENCODER_TOL, real_rows(IDS[1:2]))
    with pytest.raises(ValueError, match="No gl formulation for Dense 'plain'"):
        formulation.Formulated.of(keras.layers.Dense(3, name="plain"), ctx)


def test_formulated_layer_takes_the_keras_layer_arguments():
    wrapped = formulation.Formulated(encoder_layer(), context("gpu"), trainable=False)
    assert wrapped.trainable is False


def test_formulated_layer_builds_an_unbuilt_layer():
    layer = EncoderLayer(DEPTH, 2, 16, dropout=0.0)
    wrapped = formulation.Formulated.of(layer, context("gpu"))
    wrapped.build((1, LENGTH, DEPTH))
    assert layer.built and wrapped.built
    built = encoder_layer()
    weights = [w.copy() for w in built.get_weights()]
    formulation.Formulated.of(built, context("gpu")).build((1, LENGTH, DEPTH))
    assert all(np.array_equal(a, b) for a, b in zip(built.get_weights(), weights))  # not built again


def test_formulate_wraps_the_formulated_layers_of_a_model():
    model = _embedding_model()
    ctx = context("gl")
    spec = model_spec.ModelSpec.of(model, LENGTH, 1)
    clone = model_spec.rebuild(model, spec, ctx)
    wrapped = [layer for layer in clone.layers if isinstance(layer, formulation.Formulated)]
    assert [type(w.layer) for w in wrapped] == [TokenAndPositionEmbedding]
    originals = {type(layer): layer for layer in model.layers}
    assert wrapped[0].layer is not originals[TokenAndPositionEmbedding]  # a clone, the original untouched
    # Without clone_layer, the model's own layers are wrapped.
    inputs = keras.Input(batch_size=1, shape=(LENGTH,), dtype="int32", name="token_ids")
    same = formulation.formulate(model, ctx, input_tensors=inputs)
    wrapped = [layer for layer in same.layers if isinstance(layer, formulation.Formulated)]
    assert [w.layer for w in wrapped] == [originals[TokenAndPositionEmbedding]]
    plain = model_spec.rebuild(model, spec, None)
    assert not [layer for layer in plain.layers if isinstance(layer, formulation.Formulated)]
    lm = _causal_lm()
    assert isinstance(formulation.formulate(lm, ctx), formulation.Formulated)
    dense = keras.layers.Dense(2)
    assert formulation.formulate(dense, ctx) is dense and formulation.formulate(lm, None) is lm
    # A functional model whose graph has an operation that is not a layer (`x + y` in Keras 3).
    ids = keras.Input(shape=(LENGTH,), dtype="int32", name="token_ids")
    embedded = TokenAndPositionEmbedding(VOCAB, DEPTH, 16, dropout=0.0)(ids)
    model = keras.Model(ids, embedded + embedded if is_keras3() else keras.layers.Add()([embedded, embedded]))
    randomize(model, 9)
    flat = export.to_tflite(model, sequence_length=LENGTH, target="gl")
    assert export.check_parity(model, flat, IDS[1:2], ignore_padding=False) <= 2 * EMBED_TOL
