"""The `gpu`/`gl` prefill and decode graphs (`gl_generate`), run eagerly against the Keras `CausalLM`.

No conversion: the graphs of `prefill_graph` and `decode_graph` are the ones the generation export
freezes (and `chunk_graph` the `.litertlm` gpu bundle's prefill), here called op by op on the
float32 clone the export builds. Each decode step's and chunk's logits must equal the Keras
model's full pass at those positions, and each cache write must change only its own slots. The
converted files run on the interpreter and the GPU runtimes in tests/test_export_generator.py,
tests/test_export_litertlm.py and tests/edge/edge_generate.py.
"""

import numpy as np
import pytest
import tensorflow as tf
from tiny_lm import perturbed_causal_lm

from keras_posenc.export import gl_generate, shader_ops
from keras_posenc.export.model_spec import ModelSpec, host_embedding_table, rebuild

BASE = {"num_layers": 2, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40, "max_length": 24,
        "dropout": 0.0}
CACHE = 12
PROMPT = [2, 9, 17, 5, 11]
CASES = {
    "sinusoidal": {},
    "sinusoidal-factorized-pre-ln": {"table": "factorized", "norm_first": True},
    "learned-unscaled": {"position": "learned", "scale_embeddings": False},
    "rope": {"position": "rope"},
    "rope-yarn-pre-ln": {"position": "rope", "scaling": "yarn", "scaling_factor": 2.0, "original_length": 8,
                         "norm_first": True},
    "alibi": {"position": "alibi", "num_heads": 4},
    "vocab-3000": {"vocab_size": 3000},
}


def _model(**config):
    return perturbed_causal_lm({**BASE, **config})


def _clone(model):
    return rebuild(model, ModelSpec.of(model, CACHE, 1))


def _ids(values, dtype):
    return tf.constant(np.asarray(values, np.int32)[None], dtype)


def _full_pass(model, ids):
    return np.asarray(model(np.asarray([ids], np.int32), training=False), np.float64)[0]


def _run(model, embedding, dtype, prompt_length):
    """Prefill a right-padded prompt, then decode greedily to the last slot: the logits of each step."""
    clone = _clone(model)
    table = host_embedding_table(model)
    padded = PROMPT + [0] * (prompt_length - len(PROMPT))

    def rows(ids):
        return None if embedding == "graph" else tf.constant(table[np.asarray(ids)][None])

    def fed(ids):  # as the export's signatures: zeros in place of the ids when the rows are given
        return _ids(ids if embedding == "graph" else [0] * len(ids), dtype)

    logits, keys, values = gl_generate.prefill_graph(clone, fed(padded), CACHE, rows(padded))
    steps = [np.asarray(logits, np.float64)[0, :len(PROMPT)]]
    tokens = list(PROMPT)
    for position in range(len(PROMPT), CACHE):
        token = int(np.argmax(steps[-1][-1][1:])) + 1  # never the pad id: the Keras pass would mask it
        tokens.append(token)
        step, new_keys, new_values = gl_generate.decode_graph(
            clone, fed([token]), tf.constant([position], dtype), keys, values, rows([token]))
        for old, new in zip(keys + values, new_keys + new_values):
            old, new = np.asarray(old), np.asarray(new)
            others = np.arange(CACHE) != position
            np.testing.assert_array_equal(new[:, others], old[:, others])  # every other slot bit for bit
            assert not np.array_equal(new[:, position], old[:, position])
        keys, values = new_keys, new_values
        steps.append(np.asarray(step, np.float64))
    return tokens, np.concatenate(steps)


@pytest.mark.parametrize("name", sorted(CASES))
def test_prefill_and_every_decode_step_equal_the_keras_full_pass(name):
    model = _model(**CASES[name])
    dtype = tf.int32 if name == "vocab-3000" else tf.float32  # above 2048: the gpu target's int32 digits
    tokens, logits = _run(model, "graph", dtype, prompt_length=len(PROMPT))
    np.testing.assert_allclose(logits, _full_pass(model, tokens), atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", ["rope", "alibi", "sinusoidal-factorized-pre-ln"])
def test_host_rows_and_a_right_padded_prompt_give_the_same_steps(name):
    """Rows looked up on the host, a prompt padded to 8 slots: the padded slots are overwritten."""
    model = _model(**CASES[name])
    tokens, logits = _run(model, "host", tf.int32, prompt_length=8)
    np.testing.assert_allclose(logits, _full_pass(model, tokens), atol=2e-5, rtol=0)
    graph_tokens, _ = _run(model, "graph", tf.float32, prompt_length=len(PROMPT))
    assert tokens == graph_tokens


@pytest.mark.parametrize("name", sorted(CASES))
def test_chunks_at_offsets_equal_the_keras_full_pass_and_write_only_their_slots(name):
    """LiteRT-LM's prefill: chunks of 4 at slots 0, 4 and 8 (the last runs past the cache's 10 slots)."""
    model = _model(**CASES[name])
    dtype = tf.int32 if name == "vocab-3000" else tf.float32
    clone = rebuild(model, ModelSpec.of(model, 10, 1))
    heads = clone.encoder.num_heads
    keys = values = [tf.zeros([1, 10, heads, BASE["d_model"] // heads])] * 2
    ids = [2, 9, 17, 5, 11, 30, 7, 21, 13, 6]
    logits = []
    for first in (0, 4, 8):
        chunk = ids[first:first + 4]
        padded = _ids(chunk + [0] * (4 - len(chunk)), dtype)
        step, new_keys, new_values = gl_generate.chunk_graph(clone, padded, tf.constant([first], dtype), keys,
                                                             values)
        for old, new in zip(keys + values, new_keys + new_values):
            old, new = np.asarray(old), np.asarray(new)
            written = np.arange(first, min(first + 4, 10))
            others = np.ones(10, bool)
            others[written] = False
            np.testing.assert_array_equal(new[:, others], old[:, others])  # bit for bit
            assert np.abs(new[:, written]).max(axis=(0, 2, 3)).all()  # each written slot was zero before
        keys, values = new_keys, new_values
        logits.append(np.asarray(step, np.float64)[0, :len(chunk)])
    np.testing.assert_allclose(np.concatenate(logits), _full_pass(model, ids), atol=2e-5, rtol=0)


def test_one_token_chunk_is_the_decode_step():
    clone = _clone(_model(position="rope"))
    rng = np.random.default_rng(0)
    keys = [tf.constant(rng.normal(size=[1, CACHE, 2, 8]).astype(np.float32)) for _ in range(2)]
    values = [tf.constant(rng.normal(size=[1, CACHE, 2, 8]).astype(np.float32)) for _ in range(2)]
    chunk = gl_generate.chunk_graph(clone, _ids([9], tf.float32), tf.constant([5.0]), keys, values)
    decode = gl_generate.decode_graph(clone, _ids([9], tf.float32), tf.constant([5.0]), keys, values)
    np.testing.assert_allclose(np.asarray(chunk[0])[0], np.asarray(decode[0]), atol=1e-6, rtol=0)
    for a, b in zip(chunk[1] + chunk[2], decode[1] + decode[2]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_prefill_cache_holds_the_prompt_values_and_zeros_after_it():
    model = _model(position="alibi")
    clone = _clone(model)
    _, keys, values = gl_generate.prefill_graph(clone, _ids(PROMPT, tf.float32), CACHE)
    heads, head_dim = BASE["num_heads"], BASE["d_model"] // BASE["num_heads"]
    assert [tuple(t.shape) for t in keys + values] == [(1, CACHE, heads, head_dim)] * 4
    # The first layer (post-LN) attends over the token rows themselves: ALiBi adds no position rows.
    embedded = np.asarray(clone.encoder.embedding(np.asarray([PROMPT], np.int32)), np.float64)[0]
    value = clone.encoder.encoder_layers[0].attention.projections([1, 1, BASE["d_model"]])[2]
    kernel, bias = np.asarray(value.kernel, np.float64), np.asarray(value.bias, np.float64)
    expected = np.einsum("td,dhk->thk", embedded, kernel) + bias
    np.testing.assert_allclose(np.asarray(values[0])[0, :len(PROMPT)], expected, atol=1e-5)
    for cache in keys + values:
        assert not np.asarray(cache)[0, len(PROMPT):].any()
        assert np.asarray(cache)[0, :len(PROMPT)].any(axis=(1, 2)).all()


@pytest.mark.parametrize("vocab, dtype, split", [(3000, tf.int32, True), (3000, tf.float32, False),
                                                 (2048, tf.int32, False), (40, tf.int32, False)])
def test_int32_ids_past_2048_are_split_by_floor_div_before_the_one_cast(vocab, dtype, split):
    """The gpu target's int32 ids: FLOOR_DIV digits above 2048; gl's float ids: float thresholds."""
    clone = _clone(_model(vocab_size=vocab))
    caches = [tf.zeros([1, CACHE, 2, 8])] * 2

    def decode(token_id, position):
        return gl_generate.decode_graph(clone, token_id, position, caches, caches)[0]

    graph = tf.function(decode).get_concrete_function(tf.TensorSpec([1, 1], dtype), tf.TensorSpec([1], dtype))
    types = [op.type for op in graph.graph.get_operations()]
    assert ("FloorDiv" in types) == split
    casts = [op for op in graph.graph.get_operations() if op.type == "Cast" and op.inputs[0].dtype.is_integer]
    assert len(casts) == (0 if dtype == tf.float32 else 3 if split else 2)  # the position's, the id's
    prefill = tf.function(lambda ids: gl_generate.prefill_graph(clone, ids, CACHE)[0])
    prefill_graph = prefill.get_concrete_function(tf.TensorSpec([1, 4], dtype)).graph
    types = [op.type for op in prefill_graph.get_operations()]
    assert ("FloorDiv" in types) == split


def test_the_cache_length_limit_is_the_float16_integers():
    assert gl_generate.MAX_CACHE_LENGTH == shader_ops.FLOAT16_INTEGERS == 2048
