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

import numpy as np
import tensorflow as tf

from keras_posenc import special_ids
from keras_posenc.export import contract, conversion, gl_generate, onnx_graph
from keras_posenc.export.conversion import ONNX_OPSET, ModelSpec, frozen_function, rebuild
from keras_posenc.export.cost import graph_cost, onnx_cost
from keras_posenc.export.formulation import ExportContext
from keras_posenc.export.formulations import FORMULATIONS
from keras_posenc.export.host_table import dequantized_table
from keras_posenc.export.quality import (
    DEFAULT_MAX_LOSS_INCREASE,
    format_generation_quality,
    next_token_cross_entropy,
    quality_prompts,
)
from keras_posenc.export.quantization import (
    interpreter_for,
    precision_of,
    quantize_onnx,
    quantize_tflite,
    recipe_for,
    stored_host_table,
)
from keras_posenc.export.result import ExportResult
from keras_posenc.export.targets import TARGETS, target_of
from keras_posenc.layers.encoder_layer import ATTENTION_POSITIONS
from keras_posenc.validation import check_positive_int

TOKEN_IDS, TOKEN_ID, POSITION, LOGITS = (contract.TENSORS[name]
                                         for name in ("token_ids", "token_id", "position", "logits"))
PREFILL, DECODE = contract.SIGNATURES

__all__ = ["OnnxSession", "TfliteSession", "cache_bytes", "cached_forward", "check_export",
           "check_generation", "check_generator_parity", "convert_signatures", "export_generation",
           "generation_quality",
           "export_generator", "frozen_onnx", "frozen_signature", "generator_metadata", "greedy_generate",
           "onnx_paths", "past", "tflite_paths", "to_onnx_generator", "to_tflite_generator", "typed_feeds"]


def check_export(model, prompt_length, cache_length, target):
    """The `Target` of a prefill/decode export of `model`, or a ValueError naming the argument and value."""
    if not hasattr(model, "generate") or not hasattr(model, "encoder"):
        raise ValueError("A prefill/decode export needs a keras_posenc CausalLM, "
                         f"got {type(model).__name__}.")
    if not isinstance(target, str) or target not in TARGETS:
        raise ValueError(f"A prefill/decode export supports target in {tuple(TARGETS)}, "
                         f"got target={target!r}.")
    target = target_of(target)
    if not model.causal:
        raise ValueError("A prefill/decode export needs a causal model; this CausalLM has causal=False.")
    if model.num_languages:
        raise ValueError("A prefill/decode export of a model with num_languages is not supported: "
                         "export it with `keras-posenc export` (fixed window) instead.")
    longest = conversion.longest_sequence(model)
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
    """`Encoder.cached_step` of every layer with the token embedding of the target's formulation.

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
        x = context.emit(encoder.embedding, token_ids, position_ids=None if in_attention else positions,
                         training=False)
        new_keys, new_values = [], []
        for layer, key_cache, value_cache in zip(encoder.encoder_layers, keys, values):
            x, key_cache, value_cache, _ = layer.cached_step(x, key_cache, value_cache, index, positions)
            new_keys.append(key_cache)
            new_values.append(value_cache)
        if encoder.final_norm is not None:
            x = encoder.final_norm(x)
    return clone.head(x), new_keys, new_values


class _Generator:
    """The two signatures over a rebuilt float32 clone of the model."""

    def __init__(self, clone, prompt_length, cache_length, target):
        self.clone = clone
        self.context = ExportContext(target, FORMULATIONS)
        encoder = clone.encoder
        self.layers = encoder.num_layers
        self.cache_spec = [1, cache_length, encoder.num_heads, encoder.d_model // encoder.num_heads]
        self.prompt_length = prompt_length
        self.cache_names = [contract.past_name(kind, i)
                            for i in range(self.layers) for kind in ("key", "value")]
        self.output_names = [LOGITS] + [contract.present_name(kind, i) for i in range(self.layers)
                                        for kind in ("key", "value")]

    def _outputs(self, logits, keys, values):
        outputs = {LOGITS: logits}
        for i in range(self.layers):
            outputs[contract.present_name("key", i)] = keys[i]
            outputs[contract.present_name("value", i)] = values[i]
        return outputs

    def _step(self, token_ids, positions, index, keys, values):
        return cached_forward(self.clone, self.context, token_ids, positions, index, keys, values)

    def prefill_function(self):
        def prefill(token_ids):
            empty = [tf.zeros(self.cache_spec)] * self.layers
            logits, keys, values = self._step(token_ids, tf.range(self.prompt_length)[None], 0, empty, empty)
            return self._outputs(logits, keys, values)

        return tf.function(prefill, input_signature=[tf.TensorSpec([1, self.prompt_length], tf.int32,
                                                                    name=TOKEN_IDS)])

    def decode_function(self):
        def decode(token_id, position, *cache):
            logits, keys, values = self._step(token_id, position[:, None], position[0], list(cache[0::2]),
                                              list(cache[1::2]))
            return self._outputs(logits[:, 0], keys, values)

        signature = [tf.TensorSpec([1, 1], tf.int32, name=TOKEN_ID),
                     tf.TensorSpec([1], tf.int32, name=POSITION)]
        signature += [tf.TensorSpec(self.cache_spec, tf.float32, name=name) for name in self.cache_names]
        return tf.function(decode, input_signature=signature)


class _ShaderGenerator(_Generator):
    """The `gpu`/`gl` signatures: `gl_generate`'s graphs, float32 inputs for `gl`, int32 for `gpu`."""

    def __init__(self, clone, prompt_length, cache_length, target, embedding):
        super().__init__(clone, prompt_length, cache_length, target)
        self.cache_length = cache_length
        self.dtype = tf.as_dtype(target.input_dtype)
        self.host = embedding == "host"
        self.width = clone.encoder.d_model

    def _ids(self, length, name):
        if self.host:
            return tf.TensorSpec([1, length, self.width], tf.float32, name=conversion.HOST_EMBEDDINGS)
        return tf.TensorSpec([1, length], self.dtype, name=name)

    def prefill_function(self):
        def prefill(ids):
            rows, token_ids = (ids, tf.zeros([1, self.prompt_length])) if self.host else (None, ids)
            logits, keys, values = gl_generate.prefill_graph(self.clone, token_ids, self.cache_length, rows)
            return self._outputs(logits, keys, values)

        return tf.function(prefill, input_signature=[self._ids(self.prompt_length, TOKEN_IDS)])

    def decode_function(self):
        def decode(ids, position, *cache):
            rows, token_id = (ids, tf.zeros([1, 1])) if self.host else (None, ids)
            logits, keys, values = gl_generate.decode_graph(self.clone, token_id, position, list(cache[0::2]),
                                                            list(cache[1::2]), rows)
            return self._outputs(logits, keys, values)

        signature = [self._ids(1, TOKEN_ID), tf.TensorSpec([1], self.dtype, name=POSITION)]
        signature += [tf.TensorSpec(self.cache_spec, tf.float32, name=name) for name in self.cache_names]
        return tf.function(decode, input_signature=signature)


def to_tflite_generator(model, *, prompt_length, cache_length, target="cpu", embedding=None, quantize=None,
                        litert_python=None):
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
    >>> flat = to_tflite_generator(model, prompt_length=4, cache_length=12)
    >>> ids, _ = greedy_generate(TfliteSession(flat), [3, 4, 5], 6)
    >>> ids == model.generate([3, 4, 5], 6).ids[0].tolist()
    True
    """
    target = check_export(model, prompt_length, cache_length, target)
    if target.file_format != "tflite":
        raise ValueError(f"target={target.name!r} exports {target.file_format.upper()}: use "
                         "to_onnx_generator(model, ...).")
    recipe = recipe_for(target, quantize, "prefill_decode", litert_python=litert_python)
    embedding = _embedding(model, target, embedding)
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


def _embedding(model, target, embedding):
    target = target_of(target)
    if embedding is None:
        return conversion.default_embedding(model, target)
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
    protos = [onnx_graph.finish(frozen_onnx(tf2onnx, function, module.output_names, opset))
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
    calls = {key: [] for key in contract.SIGNATURES}
    run = session.run

    def recording(signature, feeds):
        calls[signature].append({name: np.asarray(value) for name, value in feeds.items()})
        return run(signature, feeds)

    session.run = recording
    try:
        for prompt in prompts:
            greedy_generate(session, prompt, cache_length - len(prompt) + 1, pad_id=pad_id)
    finally:
        session.run = run
    return calls


def frozen_signature(function, output_names):
    """`function` with its variables folded in, re-wrapped so its outputs keep their names."""
    frozen = frozen_function(function)
    names = sorted(output_names)  # the frozen function returns the flattened dict: sorted keys
    return tf.function(lambda *inputs: dict(zip(names, frozen(*inputs))),
                       input_signature=function.input_signature).get_concrete_function()


def frozen_onnx(tf2onnx, function, output_names, opset):
    """The serialized ONNX of `function` (a `tf.function` with an input signature) by `tf2onnx`,
    its variables folded in and its outputs named `output_names`; unfolded (see `onnx_graph`).

    `tf2onnx`: the module (`onnx_tools.import_tf2onnx()`), imported by the caller before any
    graph is traced, so that a missing tool is said first.
    """
    frozen = frozen_signature(function, output_names)
    wrapped = tf.function(lambda *inputs: frozen(*inputs), input_signature=function.input_signature)
    proto, _ = tf2onnx.convert.from_function(wrapped, input_signature=function.input_signature, opset=opset)
    return proto.SerializeToString()


class TfliteSession:
    """The two signatures of a prefill/decode `.tflite`, run by TensorFlow's interpreter.

    Feeds are given as int32 `token_ids` / `token_id` and `position`: they are cast to the
    file's input types (float32 for `gl`), and a file that takes `embeddings` gets the rows
    `table[ids]` (`table`: `conversion.host_embedding_table(model)`).
    """

    def __init__(self, flat, interpreter=None, table=None):
        files = flat if isinstance(flat, (tuple, list)) else (flat, flat)  # a `gl` pair: one file each
        opened = {content: (interpreter or tf.lite.Interpreter)(model_content=content)
                  for content in dict.fromkeys(files)}
        self.runners = {key: opened[content].get_signature_runner(key)
                        for key, content in zip(contract.SIGNATURES, files)}
        self.details = {key: runner.get_input_details() for key, runner in self.runners.items()}
        prefill = self.details[PREFILL]
        self.prompt_length = int(prefill[next(iter(prefill))]["shape"][1])
        self.cache_length = int(self.details[DECODE][contract.past_name("key", 0)]["shape"][1])
        self.vocab_size = int(self.runners[DECODE].get_output_details()[LOGITS]["shape"][-1])
        if conversion.HOST_EMBEDDINGS in prefill and table is None:
            raise ValueError("This file takes looked-up `embeddings`: pass `table` "
                             "(conversion.host_embedding_table(model)).")
        self.table = table

    def run(self, signature, feeds):
        return self.runners[signature](**typed_feeds(self.details[signature], feeds, self.table))


def typed_feeds(details, feeds, table=None):
    """`feeds` in the dtypes of the inputs `details` (name -> detail); ids -> `embeddings` rows."""
    typed = {}
    for name, detail in details.items():
        if name == conversion.HOST_EMBEDDINGS:
            ids = feeds[TOKEN_IDS] if TOKEN_IDS in feeds else feeds[TOKEN_ID]
            typed[name] = np.asarray(table, np.float32)[np.asarray(ids)]
        else:
            typed[name] = np.asarray(feeds[name]).astype(detail["dtype"])
    return typed


class OnnxSession:
    """The prefill and decode ONNX models (`to_onnx_generator`), run by onnxruntime on the CPU."""

    def __init__(self, prefill, decode):
        import onnxruntime

        self.sessions = {key: onnxruntime.InferenceSession(proto, providers=["CPUExecutionProvider"])
                         for key, proto in zip(contract.SIGNATURES, (prefill, decode))}
        shapes = {key: {i.name: i.shape for i in session.get_inputs()}
                  for key, session in self.sessions.items()}
        self.prompt_length = int(shapes[PREFILL][TOKEN_IDS][1])
        self.cache_length = int(shapes[DECODE][contract.past_name("key", 0)][1])
        logits = next(o for o in self.sessions[DECODE].get_outputs() if o.name == LOGITS)
        self.vocab_size = int(logits.shape[-1])

    def run(self, signature, feeds):
        session = self.sessions[signature]
        values = session.run(None, feeds)
        return dict(zip([o.name for o in session.get_outputs()], values))


def greedy_generate(session, prompt_ids, max_new_tokens, *, pad_id=0, stop_id=None, forced_ids=None):
    """Greedy generation through a `TfliteSession` or `OnnxSession`.

    Args:
        session: the file's session.
        prompt_ids: list of int, one prompt (no padding).
        max_new_tokens: int >= 1.
        pad_id: int, the padding id (right padding; never generated).
        stop_id: optional int ending generation.
        forced_ids: optional list of `max_new_tokens` ints fed back instead of the file's own
            picks (teacher forcing: the file's pick at each step of another run's sequence).

    Returns:
        `(ids, logits)`: the generated ids (list; with `forced_ids`, the file's pick at each
        step) and the logits `[steps, vocab]` that chose them.

    Raises:
        ValueError: an empty prompt, one longer than the prefill, a token id outside the
            vocabulary, or more tokens than the cache holds.
    """
    n = len(prompt_ids)
    outside = [i for i in prompt_ids if not 0 <= i < session.vocab_size]
    if outside:
        raise ValueError(f"`prompt_ids` must lie in [0, {session.vocab_size}) (the vocabulary), got "
                         f"id {outside[0]}.")
    if not 1 <= n <= session.prompt_length:
        raise ValueError(f"the prompt has {n} tokens: it must have 1 to {session.prompt_length} "
                         "(the prefill length).")
    if n + max_new_tokens - 1 > session.cache_length:
        raise ValueError(f"{n} prompt tokens + max_new_tokens={max_new_tokens} need {n + max_new_tokens - 1} "
                         f"cache slots; the file has cache_length={session.cache_length}.")
    tokens = np.full([1, session.prompt_length], pad_id, np.int32)
    tokens[0, :n] = prompt_ids
    outputs = session.run(PREFILL, {TOKEN_IDS: tokens})
    logits = outputs[LOGITS][0, n - 1]
    ids, chosen = [], []
    for step in range(max_new_tokens):
        masked = np.array(logits, np.float64)
        masked[pad_id] = -np.inf
        chosen.append(logits)
        ids.append(int(np.argmax(masked)))
        fed = ids[-1] if forced_ids is None else int(forced_ids[step])
        if fed == stop_id or step == max_new_tokens - 1:
            break
        feeds = {TOKEN_ID: np.array([[fed]], np.int32), POSITION: np.array([n + step], np.int32)}
        outputs = session.run(DECODE, {**feeds, **past(outputs)})
        logits = outputs[LOGITS][0]
    return ids, np.stack(chosen)


def past(outputs):
    """A call's `present_*` cache outputs renamed as the next decode step's `past_*` inputs."""
    return {contract.present_to_past(name): value for name, value in outputs.items() if name != LOGITS}


def check_generator_parity(model, session, prompt_ids, max_new_tokens):
    """`(same_tokens, max_abs_logit_diff)` of the file's greedy run against `model.generate`.

    Args:
        model: the `CausalLM`.
        session: a `TfliteSession` or `OnnxSession` of its export.
        prompt_ids: list of int.
        max_new_tokens: int.

    The logits are compared with those of the Keras full forward pass over the prompt and the
    generated tokens, at each step that chose a token.
    """
    pad_id = model.encoder.pad_id
    keras_ids = model.generate(list(prompt_ids), max_new_tokens).ids[0].tolist()
    file_ids, file_logits = greedy_generate(session, list(prompt_ids), max_new_tokens, pad_id=pad_id)
    sequence = np.array([list(prompt_ids) + file_ids], np.int32)
    full = np.asarray(model(sequence))[0, len(prompt_ids) - 1:len(prompt_ids) - 1 + len(file_ids)]
    return keras_ids == file_ids, float(np.abs(full - file_logits).max())


def generator_metadata(model, *, prompt_length, cache_length, target):
    """What the device kit (`run_generate.py`) reads from `FILE.json`: lengths, special ids, cache size."""
    encoder = model.encoder
    return {"kind": contract.KINDS["prefill_decode"], "target": target,
            "accelerators": list(target_of(target).runs_on), "prompt_length": prompt_length,
            "cache_length": cache_length, "vocab_size": encoder.vocab_size, "num_layers": encoder.num_layers,
            "pad_id": encoder.pad_id, "bos_id": special_ids.BOS_ID, "eos_id": special_ids.EOS_ID,
            "unk_id": special_ids.UNK_ID, "special_ids": list(range(special_ids.NUM_RESERVED_IDS)),
            "cache_bytes": cache_bytes(model, cache_length)}


def tflite_paths(out):
    """The two files of a `gl` export to `out`: `STEM.prefill.tflite` and `STEM.decode.tflite`."""
    return tuple(contract.model_paths(out, ".tflite", per_signature=True))


def onnx_paths(out):
    """The two files of a `tensorrt` export to `out`: `STEM.prefill.onnx` and `STEM.decode.onnx`."""
    return tuple(contract.model_paths(out, ".onnx", per_signature=True))


def generation_quality(model, float_session, quantized_session, prompts, max_new_tokens, eval_token_ids=None):
    """A quantized prefill/decode file against the float32 file of the same target.

    Args:
        model: the `CausalLM` both were exported from (its pad id).
        float_session, quantized_session: `generator.TfliteSession`s (or `OnnxSession`s).
        prompts: lists of token ids.
        max_new_tokens: int, greedy tokens per prompt.
        eval_token_ids: optional int `[n, T]` held-out rows: the prefill logits' cross-entropy
            on their first `P` tokens.

    Returns:
        dict: `prompts`, `greedy_tokens` (generated per file), `same_greedy_tokens` (the
        quantized file's greedy tokens are float32's on every prompt), `generation_agreement`
        (share of steps where the quantized file, fed float32's tokens, picks float32's token),
        and with `eval_token_ids` the keys of `quality.quantization_quality` (prefill logits).
    """
    pad_id = model.encoder.pad_id
    hits, steps, same = 0, 0, True
    for prompt in prompts:
        reference, _ = greedy_generate(float_session, prompt, max_new_tokens, pad_id=pad_id)
        own, _ = greedy_generate(quantized_session, prompt, max_new_tokens, pad_id=pad_id)
        forced, _ = greedy_generate(quantized_session, prompt, len(reference), pad_id=pad_id,
                                    forced_ids=reference)
        same = same and own == reference
        hits += sum(a == b for a, b in zip(forced, reference))
        steps += len(reference)
    quality = {"prompts": len(prompts), "greedy_tokens": max_new_tokens, "same_greedy_tokens": bool(same),
               "generation_agreement": hits / steps}
    if eval_token_ids is None:
        return quality
    length = float_session.prompt_length
    rows = np.full([len(eval_token_ids), length], pad_id, np.int32)
    width = min(length, np.asarray(eval_token_ids).shape[1])
    rows[:, :width] = np.asarray(eval_token_ids)[:, :width]
    rows = rows[(rows[:, 1:] != pad_id).any(axis=1)]
    logits = [np.stack([session.run(PREFILL, {TOKEN_IDS: row[None]})["logits"][0] for row in rows])
              for session in (float_session, quantized_session)]
    loss_float, tokens = next_token_cross_entropy(logits[0], rows, pad_id)
    loss_quantized, _ = next_token_cross_entropy(logits[1], rows, pad_id)
    real = rows != pad_id
    return dict(quality, rows=int(len(rows)), tokens=tokens, loss_float=loss_float,
                loss_quantized=loss_quantized,
                loss_increase=loss_quantized / loss_float - 1.0,
                agreement=float((logits[0].argmax(-1) == logits[1].argmax(-1))[real].mean()),
                max_abs_diff=float(np.abs(logits[0].astype(np.float64) - logits[1])[real].max()))


def check_generation(model, *, prompt_length, cache_length, target="cpu", embedding=None, check_prompt=None,
                     check_tokens=16, quantize=None, eval_token_ids=None, litert_python=None):
    """The prefill/decode export of `model`, checked against `model.generate` (`pipeline.export_generation`).

    With `quantize`, the file is also measured against a float32 export of the same target
    (`generation_quality`): held-out cross-entropy of the prefill logits on
    `eval_token_ids`, and, on the check prompt and the first tokens of held-out rows, whether
    its greedy tokens are float32's and how often it picks float32's token when fed them.

    Returns:
        dict: `models` (the file contents: one, or one per signature), `metadata`, `host_table`
        (as stored, or None), `same_tokens` (bool), `parity` (max abs logit difference),
        `tokens_checked`, `recipe` and `quality` (None without `quantize`).
    """
    target = check_export(model, prompt_length, cache_length, target)
    recipe = recipe_for(target, quantize, "prefill_decode", litert_python=litert_python)
    vocab = model.encoder.vocab_size
    prompt = list(check_prompt or [min(i, vocab - 1) for i in (5, 6, 7)])[:prompt_length]
    tokens = max(1, min(check_tokens, cache_length - len(prompt) + 1, model.encoder.max_length - len(prompt)))
    stored = None
    with interpreter_for(recipe, litert_python) as interpreter:
        if target.file_format == "onnx":
            models = to_onnx_generator(model, prompt_length=prompt_length, cache_length=cache_length,
                                       recipe=recipe)
            session = OnnxSession(*models)
            costs = [onnx_cost(proto) for proto in models]
            float_session = (lambda: OnnxSession(*to_onnx_generator(model, prompt_length=prompt_length,
                                                                    cache_length=cache_length)))
        else:
            embedding = _embedding(model, target, embedding)
            options = dict(prompt_length=prompt_length, cache_length=cache_length, target=target.name,
                           embedding=embedding)
            flat = to_tflite_generator(model, quantize=quantize, litert_python=litert_python, **options)
            if embedding == "host":
                stored = stored_host_table(conversion.host_embedding_table(model), recipe)
            rows = None if stored is None else dequantized_table(stored)
            session = TfliteSession(flat, interpreter=interpreter, table=rows)
            float_table = None if rows is None else conversion.host_embedding_table(model)
            float_session = (lambda: TfliteSession(to_tflite_generator(model, **options),
                                                   interpreter=interpreter, table=float_table))
            if target.file_per_signature:
                models = flat
                costs = [graph_cost(content, signature=key)
                         for content, key in zip(flat, contract.SIGNATURES)]
            else:
                models = (flat,)
                costs = [graph_cost(flat, signature=key) for key in contract.SIGNATURES]
        same, parity = check_generator_parity(model, session, prompt, tokens)
        quality = None
        if recipe is not None:
            prompts = [prompt] + quality_prompts(eval_token_ids, model.encoder.pad_id, prompt_length)
            quality = generation_quality(model, float_session(), session, prompts, tokens, eval_token_ids)
    metadata = generator_metadata(model, prompt_length=prompt_length, cache_length=cache_length,
                                  target=target.name)
    metadata["embedding"] = "graph" if stored is None else "host"
    metadata["input_dtype"] = target.input_dtype
    metadata["prefill_multiply_adds"], metadata["decode_multiply_adds"] = (c["multiply_adds"] for c in costs)
    return {"models": tuple(models), "metadata": metadata, "host_table": stored, "same_tokens": same,
            "parity": parity, "tokens_checked": tokens, "recipe": recipe, "quality": quality}


def export_generation(model, *, prompt_length, cache_length, target="cpu", embedding=None, check_prompt=None,
                      check_tokens=16, quantize=None, eval_token_ids=None,
                      max_loss_increase=DEFAULT_MAX_LOSS_INCREASE, litert_python=None):
    """Exports a `CausalLM` as prefill + decode and checks the file against `model.generate`.

    `cpu` and `gpu` give one `.tflite` with two signatures, `gl` one file per signature, and
    `tensorrt` the two ONNX models (checked on onnxruntime); `gpu`/`gl` with `embedding="host"`
    also the table the runner reads (`host_table`, in the export's precision).

    Args:
        model: a built `CausalLM`.
        prompt_length, cache_length, target, embedding: as in `to_tflite_generator`.
        check_prompt: optional list of int, the prompt of the check (default: ids 5, 6, 7 clipped
            to the vocabulary).
        check_tokens: int, the tokens generated by the check (fewer if the cache is shorter).
        quantize: None, "float16", "int8" or "int4" (`quantization.RECIPES`).
        eval_token_ids: int `[n, T]` held-out rows: the quantized file's prefill cross-entropy
            against float32's, and their first tokens as more greedy prompts.
        max_loss_increase: float >= 0, the largest relative rise of that cross-entropy.
        litert_python: the Python with LiteRT Quantizer (int4).

    Returns:
        An `ExportResult`: `report` has `same_tokens`, `parity` (max abs logit difference),
        `tokens_checked` and, quantized, `quality`; `metadata` what `export/jetson/run_generate.py`
        reads.
    """
    if not max_loss_increase >= 0:
        raise ValueError(f"`max_loss_increase` must be >= 0, got max_loss_increase={max_loss_increase!r}.")
    precision = precision_of(quantize)
    checked = check_generation(model, prompt_length=prompt_length, cache_length=cache_length, target=target,
                               embedding=embedding, check_prompt=check_prompt, check_tokens=check_tokens,
                               quantize=precision, eval_token_ids=eval_token_ids, litert_python=litert_python)
    metadata, recipe, quality = checked["metadata"], checked["recipe"], checked["quality"]
    metadata["quantize"] = precision
    report = {"same_tokens": checked["same_tokens"], "parity": checked["parity"],
              "tokens_checked": checked["tokens_checked"], "verdicts": {}}
    lines = [f"Multiply-adds: prefill of {prompt_length} tokens {metadata['prefill_multiply_adds']:,}, one "
             f"decode step {metadata['decode_multiply_adds']:,}",
             f"Greedy parity over {report['tokens_checked']} tokens: "
             f"{'same tokens as' if report['same_tokens'] else 'TOKENS DIFFER from'} CausalLM.generate, "
             f"max abs logit diff {report['parity']:.3g}"]
    if recipe is not None:
        metadata[contract.KEYS["quantization"]] = recipe.describe()
        metadata[contract.KEYS["quality"]] = quality
        report.update(quality=quality, max_loss_increase=max_loss_increase)
        lines.insert(0, f"Quantized by {recipe.tool}: {recipe.weights}")
        lines.append(format_generation_quality(quality, max_loss_increase))
    description = (f"target {metadata['target']}: prefill [1, {prompt_length}], decode [1, 1], cache "
                   f"{metadata['cache_length']} slots = {metadata['cache_bytes']} bytes"
                   + (f", {precision} weights" if precision else ""))
    return ExportResult(metadata["target"], precision, metadata["embedding"], tuple(checked["models"]),
                        report, lines, metadata, description, checked["host_table"])


def export_generator(model, out, **options):
    """`export_generation(model, **options).save(out)`, as a dict (the form earlier releases returned).

    Returns:
        dict: `files` (the model files written), `bytes`, `metadata`, `same_tokens` (bool),
        `parity` (max abs logit difference), `tokens_checked`, and `result` (the `ExportResult`).
    """
    result = export_generation(model, **options)
    result.save(out)
    return {"files": result.model_paths(out), "bytes": sum(len(content) for content in result.models),
            "metadata": result.metadata, "same_tokens": result.report["same_tokens"], "parity": result.parity,
            "tokens_checked": result.report["tokens_checked"], "result": result}
