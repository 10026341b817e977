"""An encoder-decoder translator as files: an `encode` signature and the cached `decode` step.

The runtimes hold no state between calls, so what the decoder reads is an input of every call:

- `encode(source_ids [1, S]) -> cross_key_<i>, cross_value_<i>, source_mask`: the source
  (`pieces </s>`, right-padded with `pad_id` to `S`) through the encoder, then every decoder
  layer's cross-attention keys and values (`[1, S, heads, head_dim]`), computed once per
  sentence, and the mask of its real tokens (float32 `[1, S]`, 1 at a real token).
- `decode(token_id [1, 1], position [1], past_key_<i>, past_value_<i>, cross_key_<i>,
  cross_value_<i>, source_mask) -> logits [1, V], present_key_<i>, present_value_<i>`: one target
  token at slot `position` against the self-attention cache (`[1, C, heads, head_dim]` per layer
  and kind) and the source. The target starts with `<s>` at slot 0, so there is no prefill: a
  translation is `encode`, then one `decode` per token, `<s>` first.
- `decode_beams` (`cpu` and `tensorrt`, with `beam_rows` K): `decode` over K rows at one position:
  `[K, 1]` tokens, `[K, C, heads, head_dim]` caches and each row's sentence's `encode` outputs
  (`[K, S, heads, head_dim]`, `[K, S]`): the hypotheses of one sentence's beam search, or of
  several sentences translated in lockstep, in one call instead of K.

The decode step is `Seq2SeqTransformer.cached_layers`, the step `translate` runs, so the file
computes what `translate` computes; `translate_with` runs the package's own search
(`keras_posenc.beam_search`) over the files, and `translation_export` checks them token for
token against `translate`.

Targets: `cpu` (one `.tflite` with every signature, XNNPACK; the cache written by
DYNAMIC_UPDATE_SLICE, `write_by_update_slice`), `gpu` (one `.tflite`, the shader graphs of
`gl_translate` for LiteRT's GPU accelerator, int32 inputs), `gl` (the same graphs with float32
inputs, one file per signature, `STEM.encode.tflite` / `STEM.decode.tflite`: the classic GPU
delegate serves one subgraph per interpreter, see `generator`) and `tensorrt` (the ONNX pair
`STEM.encode.onnx` / `STEM.decode.onnx`, static shapes; tf2onnx has no DYNAMIC_UPDATE_SLICE, so
the one-hot write).
"""

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla

from keras_posenc.backend import static_function
from keras_posenc.beam_search import beam_search
from keras_posenc.export import contract, gl_translate, onnx_graph
from keras_posenc.export.conversion import ONNX_OPSET
from keras_posenc.export.formulation import ExportContext
from keras_posenc.export.formulations import FORMULATIONS
from keras_posenc.export.generator import convert_signatures, frozen_onnx, frozen_signature
from keras_posenc.export.model_spec import all_layers, float32_policy
from keras_posenc.export.quantization import quantize_onnx
from keras_posenc.export.runners import step_outputs
from keras_posenc.export.targets import DEFAULT_TARGET, target_of
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.seq2seq import DEFAULT_LENGTH_PENALTY

__all__ = ["TRANSLATOR_TARGETS", "TranslatorSignatures", "cache_bytes", "float32_clone", "to_onnx_translator",
           "to_tflite_translator", "translate_with", "write_by_update_slice"]

ENCODE, DECODE = contract.TRANSLATE_SIGNATURES
SOURCE_IDS, SOURCE_MASK, TOKEN_ID, POSITION, LOGITS = (
    contract.TENSORS[name] for name in ("source_ids", "source_mask", "token_id", "position", "logits"))
# The targets a translator is exported for.
TRANSLATOR_TARGETS = ("cpu", "gpu", "gl", "tensorrt")


def float32_clone(model, cache_length):
    """The model rebuilt in float32 from its config, with its weights (RoPE frozen at `cache_length`)."""
    with float32_policy():
        clone = type(model).from_config(model.get_config())
        clone.build_on_dummy()
    clone.set_weights([np.asarray(w, np.float32) for w in model.get_weights()])
    for layer in all_layers(clone):
        if isinstance(layer, RotaryEmbedding):
            layer.freeze(cache_length)
    return clone


def write_by_update_slice(cache, chunk, cache_index):
    """`chunk` written into `cache` at slot `cache_index` by one DYNAMIC_UPDATE_SLICE (the `cpu`
    file's cache write): TFLite's kernel copies the cache once, where the layer's one-hot product
    passes over it three times (a quarter of a 4-row `decode_beams` call on XNNPACK). The values
    are the same: the chunk in its slots, every other slot as it was."""
    start = tf.stack([0, tf.cast(cache_index, tf.int32), 0, 0])
    return xla.dynamic_update_slice(cache, chunk, start)


def cache_bytes(model, cache_length):
    """Bytes of one sentence's float32 self-attention cache: `2 * layers * cache_length * d_model * 4`."""
    return 2 * model.num_layers * cache_length * model.d_model * 4


class TranslatorSignatures:
    """The `encode` and `decode` functions of one export, over the float32 clone of the model.

    Args:
        clone: the float32 `Seq2SeqTransformer` (`float32_clone`).
        source_length: int, `S`.
        cache_length: int, `C`: target tokens at most, `<s>` included.
        beam_rows: int, `K` rows of `decode_beams` (0: no such signature).
        write_cache: optional, how the decode step writes its cache (`write_by_update_slice`;
            default the layer's one-hot product, which every runtime runs).
    """

    def __init__(self, clone, source_length, cache_length, beam_rows=0, write_cache=None):
        self.clone = clone
        self.beam_rows = beam_rows
        self.write_cache = write_cache
        self.layers = clone.num_layers
        head_dim = clone.d_model // clone.num_heads
        self.source_length, self.cache_length = source_length, cache_length
        self.cache_shape = [1, cache_length, clone.num_heads, head_dim]
        self.cross_shape = [1, source_length, clone.num_heads, head_dim]
        pairs = [(i, kind) for i in range(self.layers) for kind in ("key", "value")]
        self.past_names = [contract.past_name(kind, i) for i, kind in pairs]
        self.cross_names = [contract.cross_name(kind, i) for i, kind in pairs]
        self.encode_outputs = self.cross_names + [SOURCE_MASK]
        self.decode_outputs = [LOGITS] + [contract.present_name(kind, i) for i in range(self.layers)
                                          for kind in ("key", "value")]

    def encode_function(self):
        def encode(source_ids):
            outputs, mask = self.clone.encode(source_ids, training=False)
            pairs = self.clone.cross_key_values(outputs)
            tensors = [tensor for pair in pairs for tensor in pair]
            return {**dict(zip(self.cross_names, tensors)), SOURCE_MASK: tf.cast(mask, tf.float32)}

        ids = tf.TensorSpec([1, self.source_length], tf.int32, name=SOURCE_IDS)
        return static_function(encode, input_signature=[ids])

    def decode_function(self, rows=1):
        """`decode` (`rows` 1), or `decode_beams` over `rows` hypotheses of one sentence."""
        count = 2 * self.layers

        def decode(token_id, position, *tensors):
            past, cross, source_mask = tensors[:count], tensors[count:2 * count], tensors[-1]
            logits, keys, values = self.clone.cached_layers(
                token_id, list(past[0::2]), list(past[1::2]), position[0], list(cross[0::2]),
                list(cross[1::2]), tf.greater(source_mask, 0.5), write_cache=self.write_cache)
            return step_outputs(logits[:, 0], keys, values)

        return static_function(decode, input_signature=self.decode_signature(rows=rows))

    def decode_signature(self, ids_dtype=tf.int32, rows=1):
        signature = [tf.TensorSpec([rows, 1], ids_dtype, name=TOKEN_ID),
                     tf.TensorSpec([1], ids_dtype, name=POSITION)]
        cache_shape, cross_shape = [rows] + self.cache_shape[1:], [rows] + self.cross_shape[1:]
        signature += [tf.TensorSpec(cache_shape, tf.float32, name=name) for name in self.past_names]
        signature += [tf.TensorSpec(cross_shape, tf.float32, name=name) for name in self.cross_names]
        signature += [tf.TensorSpec([rows, self.source_length], tf.float32, name=SOURCE_MASK)]
        return signature

    def signatures(self):
        """`{signature: (tf.function with its input signature, output names)}`: encode, decode and,
        with `beam_rows`, decode_beams."""
        functions = {ENCODE: (self.encode_function(), self.encode_outputs),
                     DECODE: (self.decode_function(), self.decode_outputs)}
        if self.beam_rows:
            functions[contract.BEAM_SIGNATURE] = (self.decode_function(self.beam_rows), self.decode_outputs)
        return functions


class ShaderTranslatorSignatures(TranslatorSignatures):
    """The `gpu` and `gl` signatures: `gl_translate`'s graphs over the same inputs and outputs, the ids
    and position in the target's input dtype (int32 on `gpu`, float32 on `gl`)."""

    def __init__(self, clone, source_length, cache_length, target):
        super().__init__(clone, source_length, cache_length)
        self.context = ExportContext(target, FORMULATIONS)
        self.ids_dtype = tf.as_dtype(target.input_dtype)

    def encode_function(self):
        def encode(source_ids):
            with self.context.tracing() as context:
                pairs, mask = gl_translate.encode_graph(self.clone, context, source_ids)
            tensors = [tensor for pair in pairs for tensor in pair]
            return {**dict(zip(self.cross_names, tensors)), SOURCE_MASK: mask}

        ids = tf.TensorSpec([1, self.source_length], self.ids_dtype, name=SOURCE_IDS)
        return static_function(encode, input_signature=[ids])

    def decode_function(self):
        count = 2 * self.layers

        def decode(token_id, position, *tensors):
            past, cross, source_mask = tensors[:count], tensors[count:2 * count], tensors[-1]
            with self.context.tracing() as context:
                logits, keys, values = gl_translate.decode_graph(
                    self.clone, context, token_id, position, list(past[0::2]), list(past[1::2]),
                    list(zip(cross[0::2], cross[1::2])), source_mask)
            return step_outputs(logits, keys, values)

        return static_function(decode, input_signature=self.decode_signature(self.ids_dtype))


def to_tflite_translator(model, *, source_length, cache_length, target=DEFAULT_TARGET, recipe=None,
                         litert_python=None, beam_rows=0):
    """The signatures as TFLite, quantized by `recipe`: one file holding them all (`cpu`, `gpu`), or
    the pair `(encode, decode)` of one-signature files (`gl`). `beam_rows`: `cpu` only."""
    target = target_of(target)
    clone = float32_clone(model, cache_length)
    if target.shader_generation:
        module = ShaderTranslatorSignatures(clone, source_length, cache_length, target)
    else:
        module = TranslatorSignatures(clone, source_length, cache_length, beam_rows,
                                      write_cache=write_by_update_slice)
    signatures = {key: frozen_signature(function, names)
                  for key, (function, names) in module.signatures().items()}
    if target.file_per_signature:
        return tuple(convert_signatures({key: signature}, recipe, litert_python)
                     for key, signature in signatures.items())
    return convert_signatures(signatures, recipe, litert_python)


def to_onnx_translator(model, *, source_length, cache_length, recipe=None, opset=ONNX_OPSET,
                       calibration=None, beam_rows=0):
    """The `encode`, `decode` (and with `beam_rows` `decode_beams`) graphs as ONNX models
    (`tensorrt`), static shapes, in that order.

    `calibration`: for an int8 `recipe`, `{signature: [feeds]}` of float32 runs (`recorded_feeds`),
    some for every signature.

    Raises:
        ValueError: an int8 `recipe` without feeds for a signature, before any conversion.
    """
    calibration = calibration or {}
    if recipe is not None and recipe.precision == "int8":
        missing = [key for key in contract.translate_signatures(beam_rows) if not calibration.get(key)]
        if missing:
            raise ValueError(f"An int8 ONNX translator is calibrated on float32 runs of each signature: "
                             f"`calibration` has no feeds for {', '.join(missing)} (it holds "
                             f"{sorted(calibration)}).")
    from keras_posenc.export.onnx_tools import import_tf2onnx

    tf2onnx = import_tf2onnx()
    module = TranslatorSignatures(float32_clone(model, cache_length), source_length, cache_length, beam_rows)
    signatures = module.signatures()
    protos = [onnx_graph.finish(frozen_onnx(tf2onnx, function, opset)) for function, _ in signatures.values()]
    if recipe is None:
        return tuple(protos)
    return tuple(quantize_onnx(proto, recipe, calibration.get(key, ()))
                 for proto, key in zip(protos, signatures))


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def translate_with(session, source_row, *, bos_id, eos_id, pad_id, max_new_tokens, beam_size=1,
                   alpha=DEFAULT_LENGTH_PENALTY, forced_ids=None, logits=None):
    """One sentence through the files: `encode`, then the package's search over `decode` steps.

    Args:
        session: a `runners.TranslatorSession`.
        source_row: int ids of the source (`pieces </s>`), at most the file's source length.
        bos_id, eos_id, pad_id: the model's special ids.
        max_new_tokens: int, tokens at most (the end token included), at most the cache length.
        beam_size: int >= 1 (1: greedy), alpha: the length penalty's exponent, as `translate`.
        forced_ids: optional target ids fed instead of the search's (teacher forcing, greedy
            only): the file's pick after each of them.
        logits: optional list that receives the float32 logits `[V]` of each step (greedy).

    Returns:
        A `keras_posenc.beam_search.SearchResult` (`.ids[0]`: without `<s>` and `</s>`), or with
        `forced_ids` the list of the file's picks.
    """
    row = np.full([1, session.source_length], pad_id, np.int32)
    row[0, :len(source_row)] = source_row
    cross = session.run(ENCODE, {SOURCE_IDS: row})
    empty = {name: np.zeros(session.cache_shape, np.float32) for name in _past_names(cross)}

    def run(tokens, state):
        tokens = np.asarray(tokens).reshape(-1)
        position = np.array([state["index"]], np.int32)
        if 1 < len(tokens) <= session.beam_rows:
            outputs = _beam_step(session, tokens, position, state["caches"], cross)
        else:
            outputs = [session.run(DECODE, {TOKEN_ID: np.array([[token]], np.int32), POSITION: position,
                                            **cache, **cross})
                       for token, cache in zip(tokens, state["caches"])]
        step_logits = np.stack([out.pop(LOGITS)[0] for out in outputs])
        if logits is not None:
            logits.append(np.array(step_logits[0], np.float32))
        caches = [{contract.present_to_past(name): value for name, value in out.items()} for out in outputs]
        return _log_softmax(step_logits), {"caches": caches, "index": state["index"] + 1}

    def reorder(state, rows):
        return {**state, "caches": [state["caches"][r] for r in np.asarray(rows).reshape(-1)]}

    first, state = run([bos_id], {"caches": [empty], "index": 0})
    if forced_ids is not None:
        picks, log_probs = [], first
        for step, token in enumerate(forced_ids):
            masked = log_probs[0].copy()
            masked[[pad_id, bos_id]] = -np.inf
            picks.append(int(np.argmax(masked)))
            if step + 1 < len(forced_ids):
                log_probs, state = run([token], state)
        return picks
    return beam_search(first, state, run, reorder, beam_size=beam_size, max_new_tokens=max_new_tokens,
                       end_id=eos_id, alpha=alpha, forbidden_ids=(pad_id, bos_id))


def _beam_step(session, tokens, position, caches, cross):
    """One `decode_beams` call for the hypotheses' `tokens` of one sentence (rows past them padded):
    per row, the outputs as `decode` gives them (`[1, ...]`)."""
    rows, count = session.beam_rows, len(tokens)
    fed = np.zeros([rows, 1], np.int32)
    fed[:count, 0] = tokens
    stacked = {name: np.concatenate([cache[name] for cache in caches]
                                    + [np.zeros_like(caches[0][name])] * (rows - count))
               for name in caches[0]}
    shared = {name: np.repeat(value, rows, axis=0) for name, value in cross.items()}  # one source
    outputs = session.run(contract.BEAM_SIGNATURE, {TOKEN_ID: fed, POSITION: position, **stacked, **shared})
    return [{name: value[row:row + 1] for name, value in outputs.items()} for row in range(count)]


def _past_names(cross):
    layers = sum(1 for name in cross if name.startswith(contract.TENSORS["cross_prefix"])) // 2
    return [contract.past_name(kind, i) for i in range(layers) for kind in ("key", "value")]
