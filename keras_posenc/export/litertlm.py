"""A `CausalLM` as a `.litertlm` bundle: the model in LiteRT-LM's executor contract, tokenizer, metadata.

LiteRT-LM (`litert-lm-api`, the engine people deploy) runs a TFLite file with a `prefill` and a
`decode` signature and feeds them itself; the contract, as its 0.18.1 executor reads it:

- `prefill(tokens [1, P], input_pos [P], kv_cache_k_0, kv_cache_v_0, ...) -> kv_cache_k_0, ...`:
  the engine fills `tokens` with a chunk of the prompt (the last token of each prefill is held
  back and fed first by the next call), right-padded with 0, and `input_pos` with the chunk's
  positions, the padding's with 0. A prompt longer than `P` is prefilled in chunks; a second
  turn in the same session is a prefill from the session's current position.
- `decode(tokens [1, 1], input_pos [1], kv_cache_k_0, ...) -> logits [1, 1, V], kv_cache_k_0, ...`.
- The caches `kv_cache_k_<i>` / `kv_cache_v_<i>` are `[1, heads, C, head_dim]` float32, inputs
  and outputs under the same names (the engine swaps the buffers: updated in place).

Each call writes its chunk from slot `input_pos[0]` (slots `input_pos[0] .. input_pos[0] + T - 1`:
the padding writes slots after the real tokens, which the next call overwrites before any query
reads them) and the tokens' positions are `input_pos` (a padding token's 0 is a valid position
of every table). On `cpu` the step is `Encoder.cached_step` with the target's formulations, as in
`generator`, the cache transposed to its own layout `[1, C, heads, head_dim]` inside the file. On
`gpu` (shader-only ops, finite float16 constants: what LiteRT-LM's GPU backend runs, in its default
float16 activations too) the prefill is `gl_generate.chunk_graph`, the `P` tokens in parallel: each
attends to the slots before `input_pos[0]` and causally within the chunk. The decode is
`gl_generate.decode_graph`, the same step for one token. The caches are `[1, 1, C, heads *
head_dim]` (`_ShaderEngineGraphs`).

`pack_bundle` puts the file, the run's SentencePiece model and LlmMetadata (BOS/EOS/pad from the
model's special ids, `max_num_tokens = C`) into a `.litertlm` with the `litert-lm-builder`
package, run in a Python that has it (see `litertlm_runtime`): its generated protos need
protobuf >= 6.31, which the TF 2.12 stack cannot load.
"""

import numpy as np
import tensorflow as tf

from keras_posenc.backend import static_function
from keras_posenc.export import contract, generator, gl_generate
from keras_posenc.export.kinds import LITERTLM
from keras_posenc.export.model_spec import ModelSpec, rebuild
from keras_posenc.export.quantization import recipe_for
from keras_posenc.export.targets import DEFAULT_TARGET, TARGETS

__all__ = [
    "EngineFeeder", "EngineGraphs", "check_litertlm", "engine_greedy", "kv_cache_names", "to_litertlm_tflite",
]

TOKENS, INPUT_POS, LOGITS = (contract.TENSORS[name] for name in ("tokens", "input_pos", "logits"))
PREFILL, DECODE = contract.SIGNATURES


def kv_cache_names(num_layers):
    """`[kv_cache_k_0, kv_cache_v_0, kv_cache_k_1, ...]`: the cache buffers of a bundle's model."""
    return [contract.kv_cache_name(kind, i) for i in range(num_layers) for kind in ("key", "value")]


class EngineGraphs(generator.CachedSignatures):
    """The two signatures in LiteRT-LM's contract over a float32 clone (`Encoder.cached_step`)."""

    def __init__(self, clone, prompt_length, cache_length, target):
        super().__init__(clone, prompt_length, cache_length, target, kv_cache_names)
        self.cache_spec = [1, self.heads, cache_length, self.head_dim]

    def _call(self, tokens, input_pos, cache):
        # The engine's layout [1, heads, C, head_dim] <-> cached_step's [1, C, heads, head_dim].
        own = [tf.transpose(buffer, [0, 2, 1, 3]) for buffer in cache]
        # The first slot as a [1] slice, not a scalar: the GPU delegates refuse STRIDED_SLICE with a
        # shrink axis (and every op depending on it would run on the CPU); [1] broadcasts as a scalar.
        logits, keys, values = generator.cached_forward(self.clone, self.context, tokens, input_pos[None],
                                                        input_pos[:1], own[0::2], own[1::2])
        outputs = {}
        for i in range(self.layers):
            outputs[contract.kv_cache_name("key", i)] = tf.transpose(keys[i], [0, 2, 1, 3])
            outputs[contract.kv_cache_name("value", i)] = tf.transpose(values[i], [0, 2, 1, 3])
        return logits, outputs

    def _signature(self, length):
        return ([tf.TensorSpec([1, length], tf.int32, name=TOKENS), tf.TensorSpec([length], tf.int32,
                                                                                  name=INPUT_POS)]
                + [tf.TensorSpec(self.cache_spec, tf.float32, name=name) for name in self.cache_names])

    def prefill_function(self):
        def prefill(tokens, input_pos, *cache):
            return self._call(tokens, input_pos, cache)[1]

        return static_function(prefill, input_signature=self._signature(self.prompt_length))

    def decode_function(self):
        def decode(tokens, input_pos, *cache):
            logits, outputs = self._call(tokens, input_pos, cache)
            return {LOGITS: logits, **outputs}

        return static_function(decode, input_signature=self._signature(1))


class _ShaderEngineGraphs(EngineGraphs):
    """The `gpu` signatures: `gl_generate.chunk_graph` and `decode_graph` (shader-only ops).

    The prefill is one parallel step over the `P` chunk tokens, token `t` at slot and position
    `input_pos[0] + t` (the padding's slots follow the real tokens', as on the CPU; a slot past
    the cache matches no one-hot row and writes nothing): its ops grow with `P` only as log2 `P`
    (CONCATENATION), its attention is `P` queries over the `C` slots. The decode is the same step
    for one token (`decode_graph`, the `--generate --target gpu` file's). The caches are `[1, 1,
    C, heads * head_dim]`: the engine's `[1, heads, C, head_dim]` pattern with the heads folded into the
    features, the memory layout of the shader graphs' `[1, C, heads, head_dim]` (a RESHAPE, no
    TRANSPOSE).
    """

    def __init__(self, clone, prompt_length, cache_length, target):
        super().__init__(clone, prompt_length, cache_length, target)
        self.own_spec = [1, cache_length, self.heads, self.head_dim]
        self.cache_spec = [1, 1, cache_length, self.heads * self.head_dim]

    def _call(self, tokens, input_pos, cache):
        keys = [tf.reshape(buffer, self.own_spec) for buffer in cache[0::2]]
        values = [tf.reshape(buffer, self.own_spec) for buffer in cache[1::2]]
        ids = tf.cast(tokens, tf.float32)
        first = tf.cast(input_pos[:1], tf.float32)
        if tokens.shape[1] == 1:  # the decode; its slice and `+ 0.0` kept, its graph stays byte for byte
            logits, keys, values = gl_generate.decode_graph(self.clone, ids[:, 0:1], first + 0.0, keys,
                                                            values)
        else:
            logits, keys, values = gl_generate.chunk_graph(self.clone, ids, first, keys, values)
        outputs = {}
        for i in range(self.layers):
            outputs[contract.kv_cache_name("key", i)] = tf.reshape(keys[i], self.cache_spec)
            outputs[contract.kv_cache_name("value", i)] = tf.reshape(values[i], self.cache_spec)
        return tf.reshape(logits, [1, 1, -1]), outputs  # the decode's [1, 1, V] (unused by the prefill)


def to_litertlm_tflite(model, *, prompt_length, cache_length, target=DEFAULT_TARGET, quantize=None,
                       litert_python=None):
    """The prefill/decode `.tflite` of a `CausalLM` in LiteRT-LM's executor contract (module docstring).

    Args:
        model: a built `keras_posenc.models.CausalLM` (causal, no language ids).
        prompt_length: int, `P`, the prefill chunk length (the engine prefills longer prompts in
            chunks).
        cache_length: int, `C >= P`, the cache slots (the bundle's `max_num_tokens`), at most the
            model's `max_length`.
        target: "cpu" (XNNPACK, EMBEDDING_LOOKUP and GATHER lookups; `Encoder.cached_step`) or
            "gpu" (the default; LiteRT-LM's GPU backend: the shader-only graphs of `gl_generate`, fp16-safe,
            cache length at most 2048).
        quantize: None (float32), "float16", "int8" or "int4": the recipe of
            `quantization.RECIPES[(target, "litertlm")]`.
        litert_python: the Python with LiteRT Quantizer (int4).

    Returns:
        The flatbuffer as bytes.

    Raises:
        ValueError: as `generator.to_tflite_generator` (not a causal `CausalLM`, language ids,
            `P > C`, `C` above `max_length`, an unknown target).

    Example:

    >>> from keras_posenc.models import CausalLM
    >>> model = CausalLM(dict(num_layers=1, d_model=8, num_heads=2, dff=16, vocab_size=20, max_length=16))
    >>> model.build_on_dummy()
    >>> flat = to_litertlm_tflite(model, prompt_length=4, cache_length=12, target="cpu")
    >>> engine_greedy(EngineFeeder(flat), [[2, 5, 6, 7, 8, 9]], 4)[0] == model.generate(
    ...     [2, 5, 6, 7, 8, 9], 4).ids[0].tolist()
    True
    """
    target = check_litertlm(model, prompt_length, cache_length, target)
    recipe = recipe_for(target, quantize, LITERTLM, litert_python=litert_python)
    clone = rebuild(model, ModelSpec.of(model, cache_length, 1))
    graphs = (_ShaderEngineGraphs if target.shader_generation else EngineGraphs)(clone, prompt_length,
                                                                                   cache_length, target)
    signatures = {PREFILL: generator.frozen_signature(graphs.prefill_function(), graphs.cache_names),
                  DECODE: generator.frozen_signature(graphs.decode_function(), [LOGITS] + graphs.cache_names)}
    return generator.convert_signatures(signatures, recipe, litert_python)


def check_litertlm(model, prompt_length, cache_length, target):
    """The `Target` of a `.litertlm` export, or a ValueError naming the argument and value."""
    target = generator.check_export(model, prompt_length, cache_length, target)
    if target.litertlm_backend is None:
        choices = tuple(name for name, t in TARGETS.items() if t.litertlm_backend is not None)
        raise ValueError(f"A .litertlm bundle supports target in {choices}, got target={target.name!r}.")
    return target


class EngineFeeder:
    """A bundle's model run by TensorFlow's interpreter the way LiteRT-LM's executor feeds it.

    One session: `prefill(ids)` holds the last id back (it is fed first by the next call),
    prefills the rest in chunks of `P` from the current position (tokens right-padded with 0,
    `input_pos` of the padding 0); `decode()` feeds the held id at the current position and
    returns the logits `[V]`. The caches start as zeros and are passed from each call to the next.

    Args:
        flat: the `.tflite` bytes of `to_litertlm_tflite`.
        interpreter: the interpreter class (default `tf.lite.Interpreter`;
            `quantization.interpreter_for` gives LiteRT 2.x's where a quantized file needs it).
    """

    def __init__(self, flat, interpreter=None):
        interpreter = (interpreter or tf.lite.Interpreter)(model_content=flat)
        self.runners = {key: interpreter.get_signature_runner(key) for key in contract.SIGNATURES}
        details = self.runners[PREFILL].get_input_details()
        self.prompt_length = int(details[INPUT_POS]["shape"][0])
        names = [name for name in details if name not in (TOKENS, INPUT_POS)]
        self.cache = {name: np.zeros(details[name]["shape"], np.float32) for name in names}
        self.cache_length = int(details[names[0]]["shape"][2])  # [1, heads, C, head_dim] on both targets
        self.step = 0
        self.held = None

    def prefill(self, ids):
        ids = ([] if self.held is None else [self.held]) + list(ids)
        if not ids:
            return
        feed = ids[:-1]
        if self.step + len(feed) + 1 > self.cache_length:  # refused before the session changes
            raise ValueError(f"{self.step + len(feed) + 1} tokens do not fit in "
                             f"cache_length={self.cache_length}.")
        self.held = ids[-1]
        for start in range(0, len(feed), self.prompt_length):  # nothing to feed: no call (its padding
            # would be written from input_pos[0] = 0, over the session's first slots)
            chunk = feed[start:start + self.prompt_length]
            tokens = np.zeros([1, self.prompt_length], np.int32)
            positions = np.zeros([self.prompt_length], np.int32)
            tokens[0, :len(chunk)] = chunk
            positions[:len(chunk)] = np.arange(self.step, self.step + len(chunk))
            self.cache = self.runners[PREFILL](**{TOKENS: tokens, INPUT_POS: positions}, **self.cache)
            self.step += len(chunk)

    def decode(self):
        if self.step >= self.cache_length:
            raise ValueError(f"the cache is full (cache_length={self.cache_length}).")
        outputs = self.runners[DECODE](**{TOKENS: np.array([[self.held]], np.int32),
                                          INPUT_POS: np.array([self.step], np.int32)}, **self.cache)
        self.step += 1
        logits = outputs.pop(LOGITS)
        self.cache = outputs
        return logits[0, 0]


def engine_greedy(feeder, turns, max_new_tokens, *, pad_id=0, stop_id=None, forced=None, logits=None):
    """Greedy turns through an `EngineFeeder` (one session): the generated ids of each turn.

    Args:
        feeder: an `EngineFeeder` (a fresh one: a new session).
        turns: list of lists of int: the ids each turn prefills (the first with BOS).
        max_new_tokens: int, the tokens each turn generates (fewer when it stops).
        pad_id: int, never generated (as in `CausalLM.generate`).
        stop_id: optional int ending a turn (kept: it is fed first by the next turn, as the
            engine does).
        forced: optional list per turn of the ids to feed back instead of the file's picks
            (teacher forcing; the turn then runs `len(forced[i])` steps).
        logits: optional list; receives, per turn, the logits of each step (pad_id at -inf).

    Returns:
        list of lists of int: the file's pick at each step.
    """
    generated = []
    for turn, ids in enumerate(turns):
        feeder.prefill(ids)
        new, steps_logits = [], []
        steps = max_new_tokens if forced is None else len(forced[turn])
        for step in range(steps):
            step_logits = np.array(feeder.decode(), np.float64)
            step_logits[pad_id] = -np.inf
            new.append(int(np.argmax(step_logits)))
            steps_logits.append(step_logits)
            feeder.held = new[-1] if forced is None else int(forced[turn][step])
            if feeder.held == stop_id:
                break
        generated.append(new)
        if logits is not None:
            logits.append(steps_logits)
    return generated
