"""Prefill + decode export of a `CausalLM`: one TFLite file with two signatures and an explicit cache.

The runtimes hold no state between calls, so the key/value cache is an input and an output of
every call: one float32 tensor `[1, cache_length, num_heads, head_dim]` per layer and kind,
named `past_key_<i>` / `past_value_<i>` as inputs and `present_key_<i>` / `present_value_<i>` as
outputs (the names ONNX decoders use).

- `prefill(token_ids [1, P]) -> logits [1, P, V], present_key_0, ...`: the prompt, right-padded
  with `pad_id` to `P`, written into slots `0 .. P-1` with positions `0 .. P-1`. The logits of
  the last real token (`n - 1`) give the first new token. Padding slots hold garbage, but causal
  attention never reads a slot after the query's own, and each decode step overwrites the next
  one.
- `decode(token_id [1, 1], position [1], past_key_0, ...) -> logits [1, V], present_key_0, ...`: the
  token at slot and position `position` (`n`, `n + 1`, ...), attending to slots `0 .. position`.

Position tables, RoPE cos/sin and ALiBi slopes are constants of the file (the layers' exported
formulations, as in `to_tflite`). The step is `Encoder.cached_step`, so the file computes what
`CausalLM.generate` computes, and `check_generator_parity` checks it token for token.

Targets: `cpu` (XNNPACK; GATHER lookups); `gpu` (LiteRT GPU accelerator; int32 inputs) and `gl`
(the GPU delegate's OpenGL ES backend; float32 inputs) with the shader-only graphs of
`keras_posenc.export.gl_generate` (one-hot cache write, cached attention without GATHER, cache
length at most 2048). LiteRT's `CompiledModel` compiles both signatures of one file for its GPU
accelerator. The classic GPU delegate's OpenGL ES backend does not: TFLite applies a delegate to
every subgraph, and on a two-subgraph file the primary subgraph's call then fails ("BhwcToPhwc4:
Input data size does not match expected size") or crashes, while each subgraph alone runs
(the delegate holds one compiled graph). So `gl` writes two one-signature files,
`STEM.prefill.tflite` and `STEM.decode.tflite` (`tflite_paths`), each opened with its own delegate.
On `gpu`/`gl` with `embedding="host"` (the default for a model with a token table) the signatures
take the looked-up rows `embeddings` (`[1, P, d_model]`, `[1, 1, d_model]`) instead of token ids:
the runner reads `table[ids]` from `FILE.embeddings.npy`.
"""

import tempfile

import tensorflow as tf

from keras_posenc import special_ids
from keras_posenc.backend import static_function
from keras_posenc.export import contract, conversion, gl_generate, model_spec, onnx_graph
from keras_posenc.export.conversion import ONNX_OPSET
from keras_posenc.export.formulation import ExportContext
from keras_posenc.export.formulations import FORMULATIONS
from keras_posenc.export.kinds import PREFILL_DECODE
from keras_posenc.export.model_spec import ModelSpec, frozen_function, rebuild
from keras_posenc.export.quantization import quantize_onnx, quantize_tflite, recipe_for
from keras_posenc.export.runners import OnnxSession, greedy_generate, recording, step_outputs
from keras_posenc.export.targets import DEFAULT_TARGET, TARGETS, TFLITE, Target, target_of
from keras_posenc.layers.encoder_layer import ATTENTION_POSITIONS
from keras_posenc.validation import check_positive_int

TOKEN_IDS, TOKEN_ID, POSITION, LOGITS = (contract.TENSORS[name]
                                         for name in ("token_ids", "token_id", "position", "logits"))
PREFILL, DECODE = contract.SIGNATURES

__all__ = ["CachedSignatures", "cache_bytes", "cached_forward", "calibration_prompts", "check_export",
           "convert_signatures", "embedding_of", "frozen_onnx", "frozen_signature", "onnx_paths",
           "past_names", "recorded_feeds", "tflite_paths", "to_onnx_generator", "to_tflite_generator"]


def check_export(model, prompt_length, cache_length, target):
    """The `Target` of a prefill/decode export of `model`, or a ValueError naming the argument and value."""
    if not hasattr(model, "generate") or not hasattr(model, "encoder"):
        raise ValueError("A prefill/decode export needs a keras_posenc CausalLM, "
                         f"got {type(model).__name__}.")
    if not (isinstance(target, Target) or (isinstance(target, str) and target in TARGETS)):
        raise ValueError(f"A prefill/decode export supports target in {tuple(TARGETS)}, "
                         f"got target={target!r}.")
    target = target_of(target)
    if not model.causal:
        raise ValueError("A prefill/decode export needs a causal model; this CausalLM has causal=False.")
    if model.num_languages:
        raise ValueError("A prefill/decode export of a model with num_languages is not supported: "
                         "export it with `keras-posenc export` (fixed window) instead.")
    longest = model_spec.longest_sequence(model)
    if longest is not None and cache_length > longest:
        raise ValueError(f"`cache_length`={cache_length} exceeds the model's max_length={longest}: the cache "
                         "holds the prompt and every generated token.")
    if prompt_length > cache_length:
        raise ValueError(f"`prompt_length`={prompt_length} exceeds `cache_length`={cache_length}.")
    if target.max_cache_length is not None and cache_length > target.max_cache_length:
        raise ValueError(f"target={target.name!r} takes `cache_length` up to {target.max_cache_length} (the "
                         f"GPU compares positions as float16 integers), got cache_length={cache_length}.")
    return target


def cache_bytes(model, cache_length):
    """Bytes of the float32 key/value cache of one sequence: `2 * layers * cache_length * d_model * 4`."""
    encoder = model.encoder
    return 2 * encoder.num_layers * cache_length * encoder.d_model * 4


def cached_forward(clone, context, token_ids, positions, index, keys, values):
    """`Encoder.cached_step` with the token embedding of the target's formulation, then the head.

    Args:
        clone: the float32 `CausalLM` clone (`rebuild`).
        context: the target's `ExportContext`.
        token_ids: int `[1, T]`, the chunk written from slot `index`.
        positions: int `[1, T]`, the chunk's position ids.
        index: int scalar, the first slot the chunk writes.
        keys, values: per layer, float32 `[1, cache_length, num_heads, head_dim]`.

    Returns:
        `(logits [1, T, V], keys, values)`, the caches with the chunk written.
    """
    encoder = clone.encoder
    with context.tracing() as context:
        in_attention = encoder.position in ATTENTION_POSITIONS
        rows = context.emit(encoder.embedding, token_ids, position_ids=None if in_attention else positions,
                            training=False)
        x, new_keys, new_values = encoder.cached_step(token_ids, list(keys), list(values), index, positions,
                                                      embeddings=rows)
    return clone.head(x), new_keys, new_values


class CachedSignatures:
    """The prefill and decode signatures of one export, over a rebuilt float32 clone of the model.

    Holds what every form of them reads: the target's `ExportContext`, the model's layers, heads
    and head size, the lengths, and the cache tensors' names (`cache_names(layers)`: one per layer
    and kind, keys first). Subclasses give the signatures and the cache's layout (`cache_spec`).
    """

    def __init__(self, clone, prompt_length, cache_length, target, cache_names):
        self.clone = clone
        self.context = ExportContext(target, FORMULATIONS)
        encoder = clone.encoder
        self.layers, self.heads = encoder.num_layers, encoder.num_heads
        self.head_dim = encoder.d_model // encoder.num_heads
        self.prompt_length, self.cache_length = prompt_length, cache_length
        self.cache_names = cache_names(self.layers)


def past_names(layers):
    """`[past_key_0, past_value_0, past_key_1, ...]`: the cache inputs of a prefill/decode file."""
    return [contract.past_name(kind, i) for i in range(layers) for kind in ("key", "value")]


class _Generator(CachedSignatures):
    """The two signatures of a prefill/decode file: `Encoder.cached_step` with the target's lookup."""

    def __init__(self, clone, prompt_length, cache_length, target):
        super().__init__(clone, prompt_length, cache_length, target, past_names)
        self.cache_spec = [1, cache_length, self.heads, self.head_dim]
        self.output_names = [LOGITS] + [contract.present_name(kind, i) for i in range(self.layers)
                                        for kind in ("key", "value")]

    def _outputs(self, logits, keys, values):
        return step_outputs(logits, keys, values)

    def _step(self, token_ids, positions, index, keys, values):
        return cached_forward(self.clone, self.context, token_ids, positions, index, keys, values)

    def prefill_function(self):
        def prefill(token_ids):
            empty = [tf.zeros(self.cache_spec)] * self.layers
            logits, keys, values = self._step(token_ids, tf.range(self.prompt_length)[None], 0, empty, empty)
            return self._outputs(logits, keys, values)

        ids = tf.TensorSpec([1, self.prompt_length], tf.int32, name=TOKEN_IDS)
        return static_function(prefill, input_signature=[ids])

    def decode_function(self):
        def decode(token_id, position, *cache):
            logits, keys, values = self._step(token_id, position[:, None], position[0], list(cache[0::2]),
                                              list(cache[1::2]))
            return self._outputs(logits[:, 0], keys, values)

        signature = [tf.TensorSpec([1, 1], tf.int32, name=TOKEN_ID),
                     tf.TensorSpec([1], tf.int32, name=POSITION)]
        signature += [tf.TensorSpec(self.cache_spec, tf.float32, name=name) for name in self.cache_names]
        return static_function(decode, input_signature=signature)


class _ShaderGenerator(_Generator):
    """The `gpu`/`gl` signatures: `gl_generate`'s graphs, float32 inputs for `gl`, int32 for `gpu`."""

    def __init__(self, clone, prompt_length, cache_length, target, embedding):
        super().__init__(clone, prompt_length, cache_length, target)
        self.dtype = tf.as_dtype(target.input_dtype)
        self.host = embedding == "host"
        self.width = clone.encoder.d_model

    def _ids(self, length, name):
        if self.host:
            return tf.TensorSpec([1, length, self.width], tf.float32, name=model_spec.HOST_EMBEDDINGS)
        return tf.TensorSpec([1, length], self.dtype, name=name)

    def prefill_function(self):
        def prefill(ids):
            rows, token_ids = (ids, tf.zeros([1, self.prompt_length])) if self.host else (None, ids)
            logits, keys, values = gl_generate.prefill_graph(self.clone, token_ids, self.cache_length, rows)
            return self._outputs(logits, keys, values)

        return static_function(prefill, input_signature=[self._ids(self.prompt_length, TOKEN_IDS)])

    def decode_function(self):
        def decode(ids, position, *cache):
            rows, token_id = (ids, tf.zeros([1, 1])) if self.host else (None, ids)
            logits, keys, values = gl_generate.decode_graph(self.clone, token_id, position, list(cache[0::2]),
                                                            list(cache[1::2]), rows)
            return self._outputs(logits, keys, values)

        signature = [self._ids(1, TOKEN_ID), tf.TensorSpec([1], self.dtype, name=POSITION)]
        signature += [tf.TensorSpec(self.cache_spec, tf.float32, name=name) for name in self.cache_names]
        return static_function(decode, input_signature=signature)


def to_tflite_generator(model, *, prompt_length, cache_length, target=DEFAULT_TARGET, embedding=None,
                        quantize=None, litert_python=None):
    """Converts a `CausalLM` to one TFLite file with `prefill` and `decode` signatures.

    Args:
        model: a built `keras_posenc.models.CausalLM` (causal, no language ids).
        prompt_length: int, `P`, the prefill length (prompts are right-padded to it).
        cache_length: int, `C >= P`, the cache slots: at most `C` tokens in all (prompt and
            generated); at most the model's `max_length`.
        target: "cpu", "gpu" or "gl" (see the module docstring).
        embedding: `gpu`/`gl` only: "host" (the signatures take the rows `embeddings`, see
            `host_embedding_table`) or "graph" (token ids); default `default_embedding`.
        quantize: None (float32), "float16", "int8" or "int4": the recipe of
            `quantization.RECIPES[(target, "prefill_decode")]`.
        litert_python: the Python with LiteRT Quantizer (int4).

    Returns:
        The `.tflite` flatbuffer as bytes; for `gl` the pair `(prefill, decode)` of one-signature
        flatbuffers.

    Raises:
        ValueError: not a causal `CausalLM`, a model with language ids, `P > C`, `C` above
            `max_length` (or 2048 on `gpu`/`gl`), another target or embedding, or a conversion
            needing non-builtin ops.

    Example:

    >>> from keras_posenc.models import CausalLM
    >>> model = CausalLM({"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 20,
    ...                   "max_length": 16})
    >>> model.build_on_dummy()
    >>> flat = to_tflite_generator(model, prompt_length=4, cache_length=12, target="cpu")
    >>> from keras_posenc.export.runners import TfliteSession, greedy_generate
    >>> ids, _ = greedy_generate(TfliteSession(flat), [3, 4, 5], 6)
    >>> ids == model.generate([3, 4, 5], 6).ids[0].tolist()
    True
    """
    target = check_export(model, prompt_length, cache_length, target)
    if target.file_format is not TFLITE:
        raise ValueError(f"target={target.name!r} exports {target.file_format.name.upper()}: use "
                         "to_onnx_generator(model, ...).")
    recipe = recipe_for(target, quantize, PREFILL_DECODE, litert_python=litert_python)
    embedding = embedding_of(model, target, embedding)
    # A float32 clone (RoPE frozen at the cache length): the shader graphs read its weights, the
    # others run `Encoder.cached_step` with the target's token lookup.
    clone = rebuild(model, ModelSpec.of(model, cache_length, 1))
    if target.shader_generation:
        module = _ShaderGenerator(clone, prompt_length, cache_length, target, embedding)
    else:
        module = _Generator(clone, prompt_length, cache_length, target)
    # Two signatures convert through a SavedModel (the concrete-function path takes one). The
    # functions are frozen first, so the SavedModel holds no Keras object and no variable.
    functions = (module.prefill_function(), module.decode_function())
    signatures = {key: frozen_signature(function, module.output_names)
                  for key, function in zip(contract.SIGNATURES, functions)}
    if target.file_per_signature:  # see the module docstring
        return tuple(convert_signatures({key: signature}, recipe, litert_python)
                     for key, signature in signatures.items())
    return convert_signatures(signatures, recipe, litert_python)


def convert_signatures(signatures, recipe=None, litert_python=None):
    """The frozen signatures as one TFLite file, builtin ops only, quantized by `recipe` (or float32)."""
    with tempfile.TemporaryDirectory(prefix="keras_posenc_generator_") as folder:
        tf.saved_model.save(tf.Module(), folder, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(folder, signature_keys=list(signatures))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if recipe is not None:
            recipe.configure(converter)
        try:
            flat = converter.convert()
        except Exception as error:  # the converter raises its own ConverterError type
            raise ValueError(f"TFLite conversion of the prefill/decode graphs failed: {error}") from error
    return quantize_tflite(flat, recipe, litert_python=litert_python)


def embedding_of(model, target, embedding):
    """The token lookup of a prefill/decode export: `embedding` checked, or the target's default."""
    target = target_of(target)
    if embedding is None:
        return model_spec.default_embedding(model, target)
    if embedding not in conversion.EMBEDDINGS:
        raise ValueError(f"`embedding` must be one of {conversion.EMBEDDINGS}, got embedding={embedding!r}.")
    if embedding == "host" and not target.generation_host_embedding:
        raise ValueError(f"`embedding='host'` is for the gpu and gl targets, got target={target.name!r}.")
    return embedding


def to_onnx_generator(model, *, prompt_length, cache_length, opset=ONNX_OPSET, recipe=None):
    """The prefill and decode graphs as two ONNX models (`target="tensorrt"`), static shapes.

    Same inputs, outputs and names as the `.tflite` signatures, constants folded and every output's
    shape static (`onnx_graph.finish`). Needs tf2onnx (see `to_onnx`).
    `recipe`: an ONNX `quantization.Recipe` (int8: its activations calibrated on the feeds of the
    float32 models' greedy runs over `calibration_prompts`).

    Returns:
        `(prefill, decode)`: serialized ONNX `ModelProto`s.
    """
    check_positive_int("opset", opset, minimum=ONNX_OPSET)
    target = check_export(model, prompt_length, cache_length, "tensorrt")
    from keras_posenc.export.onnx_tools import import_tf2onnx

    tf2onnx = import_tf2onnx()

    clone = rebuild(model, ModelSpec.of(model, cache_length, 1))
    module = _Generator(clone, prompt_length, cache_length, target)
    # The outputs keep their contract names (the dict's keys); the shape arithmetic goes.
    protos = [onnx_graph.finish(frozen_onnx(tf2onnx, function, opset))
              for function in (module.prefill_function(), module.decode_function())]
    if recipe is None:
        return tuple(protos)
    calibration = {}
    if recipe.precision == "int8":
        calibration = recorded_feeds(OnnxSession(*protos), calibration_prompts(model, prompt_length),
                                     cache_length, model.encoder.pad_id)
    return tuple(quantize_onnx(proto, recipe, calibration.get(key, ()))
                 for proto, key in zip(protos, contract.SIGNATURES))


def calibration_prompts(model, prompt_length, count=4):
    """Prompts of ordinary ids (after the reserved ones) whose greedy runs calibrate int8 activations."""
    vocab = model.encoder.vocab_size
    ordinary = list(range(special_ids.NUM_RESERVED_IDS, vocab)) or list(range(vocab))
    length = max(1, min(prompt_length, 8))
    return [[ordinary[(7 * row + 13 * i) % len(ordinary)] for i in range(length)] for row in range(count)]


def recorded_feeds(session, prompts, cache_length, pad_id):
    """`{signature: [feeds of each call]}` of greedy runs of `session` on `prompts` (filling the cache)."""
    with recording(session) as calls:
        for prompt in prompts:
            greedy_generate(session, prompt, cache_length - len(prompt) + 1, pad_id=pad_id)
    return {key: calls[key] for key in contract.SIGNATURES}


def frozen_signature(function, output_names):
    """`function` with its variables folded in, re-wrapped so its outputs keep their names."""
    frozen = frozen_function(function)
    names = sorted(output_names)  # the frozen function returns the flattened dict: sorted keys
    return static_function(lambda *inputs: dict(zip(names, frozen(*inputs))),
                           input_signature=function.input_signature).get_concrete_function()


def frozen_onnx(tf2onnx, function, opset):
    """The serialized ONNX of `function` (a `tf.function` with an input signature, returning a dict)
    by `tf2onnx`, its variables folded in and its outputs named by the dict's keys; unfolded (see
    `onnx_graph`).

    `tf2onnx`: the module (`onnx_tools.import_tf2onnx()`), imported by the caller before any
    graph is traced, so that a missing tool is said first.
    """
    # tf2onnx freezes the function itself and names the outputs by its dict's keys: freezing it
    # here first as well would import the graph twice.
    proto, _ = tf2onnx.convert.from_function(function, input_signature=function.input_signature, opset=opset)
    return proto.SerializeToString()


def tflite_paths(out):
    """The two files of a `gl` export to `out`: `STEM.prefill.tflite` and `STEM.decode.tflite`."""
    return tuple(contract.model_paths(out, ".tflite", per_signature=True))


def onnx_paths(out):
    """The two files of a `tensorrt` export to `out`: `STEM.prefill.onnx` and `STEM.decode.onnx`."""
    return tuple(contract.model_paths(out, ".onnx", per_signature=True))


