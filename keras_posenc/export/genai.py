"""`--format genai`: a `CausalLM` as a model folder of onnxruntime-genai (ONNX Runtime's generation loop).

onnxruntime-genai (`pip install onnxruntime-genai`) loads a folder: `genai_config.json`, one
decoder ONNX and a Hugging Face `tokenizer.json` / `tokenizer_config.json`. Its decoder
contract, as its 0.18 release reads it:

- inputs `input_ids` int64 `[B, S]` (the whole prompt at once, or a chunk of `search.chunk_size`
  tokens, then one token per step), `attention_mask` int64 `[B, total]`, `position_ids` int64
  `[B, S]`, and per layer `past_key_values.<i>.key` / `.value` float32 `[B, heads, C, head_dim]`;
- outputs `logits` float32 `[B, S, V]` and per layer `present.<i>.key` / `.value`, the caches
  with the chunk written.

A cache dimension `C` that is a number (not symbolic) makes the runtime allocate each cache once,
`C` slots, and bind it as both the past input and the present output of every call
("past_present_share_buffer"): the graph writes the chunk from slot `position_ids[0, 0]` and
returns the whole cache. That is the step `generator.cached_forward` computes (the caches
transposed to its `[1, C, heads, head_dim]` inside the file, as in `litertlm.EngineGraphs`), so
a prompt longer than a chunk and a second turn of the same generator continue where the cache
is. Batch 1: `attention_mask` is read by nothing (the positions give the causal window). The
runtime runs a turn's last generated token only when it generates the next one: a second turn is
appended after rewinding the generator by that token, with the token in front of the turn's ids
(`GenaiFeeder` feeds it so; docs/onnxruntime-genai.md).

`genai_config.json` holds the model's ids (BOS, EOS, pad), sizes and `search.max_length = C`,
`search.chunk_size = P` (`--prompt-length`). The tokenizer files are built with Hugging Face's
`tokenizers` from the run's `spm.model` (a Unigram model with SentencePiece's scores, its
normalization and `▁` pre-tokenization, BOS added in front as `keras-posenc generate` does), and
`tokenizer_ids` checks that they give SentencePiece's ids.
"""

import json

import numpy as np
import tensorflow as tf

from keras_posenc import special_ids
from keras_posenc.backend import static_function
from keras_posenc.export import contract, generator, litertlm, litertlm_bundle, onnx_graph
from keras_posenc.export.conversion import ONNX_OPSET
from keras_posenc.export.kinds import GENAI
from keras_posenc.export.model_spec import ModelSpec, rebuild
from keras_posenc.export.onnx_tools import import_tf2onnx
from keras_posenc.export.result import Built
from keras_posenc.export.tool_env import ToolEnvironmentError
from keras_posenc.validation import check_positive_int

__all__ = ["CONFIG", "FILES", "MODEL", "TOKENIZER", "TOKENIZER_CONFIG", "GenaiFeeder",
           "TOKENIZERS_HINT", "build_genai", "check_genai", "feeder_turns", "genai_config", "past_name",
           "present_name", "to_genai_onnx", "tokenizer_files"]

MODEL, CONFIG, TOKENIZER, TOKENIZER_CONFIG = ("model.onnx", "genai_config.json", "tokenizer.json",
                                             "tokenizer_config.json")
FILES = (MODEL, CONFIG, TOKENIZER, TOKENIZER_CONFIG)
INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS = ("input_ids", "attention_mask", "position_ids",
                                                   contract.TENSORS["logits"])
PAST, PRESENT = "past_key_values.%s.%s", "present.%s.%s"


def past_name(kind, layer):
    """`past_key_values.0.key`: a cache input of the decoder ("key" or "value")."""
    return PAST % (layer, kind)


def present_name(kind, layer):
    """`present.0.key`: a cache output of the decoder."""
    return PRESENT % (layer, kind)


class _DecoderGraph(litertlm.EngineGraphs):
    """The decoder in onnxruntime-genai's contract: LiteRT-LM's engine step with a dynamic chunk length."""

    def function(self):
        names = [(kind, i) for i in range(self.layers) for kind in ("key", "value")]

        encoder = self.clone.encoder
        # `pad_id` is never generated (`CausalLM.generate`): its logit is the lowest float, so the
        # runtime's greedy search (which masks nothing) picks what Keras picks.
        never = np.zeros([encoder.vocab_size], np.float32)
        never[encoder.pad_id] = np.finfo(np.float32).min

        def decoder(input_ids, attention_mask, position_ids, *cache):
            del attention_mask  # batch 1: the positions give the causal window
            logits, caches = self._call(tf.cast(input_ids, tf.int32), tf.cast(position_ids[0], tf.int32),
                                        cache)
            return {LOGITS: logits + never, **{present_name(kind, i): caches[contract.kv_cache_name(kind, i)]
                                               for kind, i in names}}

        signature = [tf.TensorSpec([1, None], tf.int64, name=name)
                     for name in (INPUT_IDS, ATTENTION_MASK, POSITION_IDS)]
        signature += [tf.TensorSpec(self.cache_spec, tf.float32, name=past_name(kind, i))
                      for kind, i in names]
        return static_function(decoder, input_signature=signature)


def check_genai(model, cache_length, prompt_length):
    """ValueError naming the argument and value where `model` or the lengths cannot make a genai folder."""
    return generator.check_export(model, prompt_length, cache_length, "tensorrt")


def to_genai_onnx(model, *, cache_length, opset=ONNX_OPSET):
    """The decoder ONNX of a `CausalLM` in onnxruntime-genai's contract (module docstring).

    Args:
        model: a built `keras_posenc.models.CausalLM` (causal, no language ids).
        cache_length: int, `C`, the cache slots (`search.max_length`), at most the model's
            `max_length`.
        opset: int >= 17, the ONNX opset.

    Returns:
        The serialized ONNX `ModelProto`: constants folded, inputs and outputs named as above,
        the chunk length `S` dynamic.

    Raises:
        ValueError: as `generator.check_export` (not a causal `CausalLM`, language ids, `C` above
            `max_length`), or `opset` < 17.
        ToolEnvironmentError: tf2onnx or onnxruntime is not installed (`onnx_tools.missing_message`).
    """
    check_positive_int("opset", opset, minimum=ONNX_OPSET)
    target = check_genai(model, cache_length, 1)
    try:
        tf2onnx = import_tf2onnx()
    except ToolEnvironmentError as error:  # the tools of --target tensorrt: its one line, for this format
        raise ToolEnvironmentError(str(error).replace("--target tensorrt", "--format genai", 1)) from error
    import onnx

    clone = rebuild(model, ModelSpec.of(model, cache_length, 1))
    graph = _DecoderGraph(clone, None, cache_length, target)
    proto = generator.frozen_onnx(tf2onnx, graph.function(), opset)
    folded = onnx_graph.fold_constants(onnx.load_from_string(proto))
    return _named_dims(folded, graph).SerializeToString()


def _named_dims(model, graph):
    """`model` (in place) with the contract's dims: `[1, sequence_length]` ids and positions,
    `[1, total_sequence_length]` mask, `[1, sequence_length, V]` logits, static caches (tf2onnx
    names its unknown dims `unk__N`)."""
    vocab = graph.clone.encoder.vocab_size
    dims = {INPUT_IDS: [1, "sequence_length"], POSITION_IDS: [1, "sequence_length"],
            ATTENTION_MASK: [1, "total_sequence_length"], LOGITS: [1, "sequence_length", vocab]}
    for value in list(model.graph.input) + list(model.graph.output):
        shape = value.type.tensor_type.shape
        wanted = dims.get(value.name, graph.cache_spec)
        del shape.dim[:]
        for size in wanted:
            dim = shape.dim.add()
            if isinstance(size, str):
                dim.dim_param = size
            else:
                dim.dim_value = int(size)
    del model.graph.value_info[:]
    return model


def genai_config(model, *, cache_length, prompt_length):
    """The `genai_config.json` of the folder (a dict): the decoder's names and sizes, ids, greedy search.

    `search.max_length` is the cache length `C` (generation stops there), `search.chunk_size` the
    prefill chunk `P`: onnxruntime-genai feeds a longer first prompt `P` tokens a call.

    Example:

    >>> from keras_posenc.models import CausalLM
    >>> model = CausalLM({"num_layers": 2, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 20,
    ...                   "max_length": 16})
    >>> config = genai_config(model, cache_length=16, prompt_length=4)
    >>> search, decoder = config["search"], config["model"]["decoder"]
    >>> search["max_length"], search["chunk_size"], decoder["head_size"]
    (16, 4, 4)
    >>> decoder["inputs"]["past_key_names"]
    'past_key_values.%d.key'
    """
    encoder = model.encoder
    heads = encoder.num_heads
    decoder = {
        "filename": MODEL, "session_options": {"log_id": "keras-posenc", "provider_options": []},
        "hidden_size": encoder.d_model, "head_size": encoder.d_model // heads, "num_attention_heads": heads,
        "num_key_value_heads": heads, "num_hidden_layers": encoder.num_layers,
        "inputs": {"input_ids": INPUT_IDS, "attention_mask": ATTENTION_MASK, "position_ids": POSITION_IDS,
                   "past_key_names": PAST % ("%d", "key"), "past_value_names": PAST % ("%d", "value")},
        "outputs": {"logits": LOGITS, "present_key_names": PRESENT % ("%d", "key"),
                    "present_value_names": PRESENT % ("%d", "value")}}
    return {
        "model": {"type": "decoder", "bos_token_id": special_ids.BOS_ID, "eos_token_id": special_ids.EOS_ID,
                  "pad_token_id": encoder.pad_id, "vocab_size": encoder.vocab_size,
                  "context_length": cache_length, "decoder": decoder},
        "search": {"do_sample": False, "num_beams": 1, "num_return_sequences": 1, "top_k": 1, "top_p": 1.0,
                   "temperature": 1.0, "repetition_penalty": 1.0, "min_length": 0, "max_length": cache_length,
                   "past_present_share_buffer": True, "chunk_size": prompt_length, "early_stopping": True,
                   "length_penalty": 1.0, "no_repeat_ngram_size": 0},
    }


TOKENIZERS_HINT = "pip install tokenizers (requirements/tf212.txt and tf221.txt pin it)"
# onnxruntime-genai's tokenizer (onnxruntime-extensions) reads a `tokenizer.json` Unigram model under
# this class name; it adds BOS when asked for special tokens (`add_special_tokens`), as Keras' prompts
# start with BOS.
TOKENIZER_CLASS = "SentencePieceBackend"
_CONTROL = 3  # a SentencePiece piece type (sentencepiece_model.proto)


def tokenizer_files(sp_model, *, cache_length=None):
    """`(tokenizer.json text, tokenizer_config.json dict)` of a SentencePiece Unigram model.

    Built with Hugging Face's `tokenizers`: a `Unigram` model with the pieces and scores of
    `sp_model`, SentencePiece's own normalization (its precompiled character map, runs of spaces
    collapsed where it collapses them), `▁` in front of the text where it adds one and for every
    space (`Metaspace`), the control
    pieces as special tokens, and BOS in front of each encoded text. Encoding a text
    gives `[BOS] + SentencePiece's ids` (`keras-posenc generate`'s prompt ids).

    Args:
        sp_model: bytes, the serialized SentencePiece model (the run's `spm.model`).
        cache_length: optional int, `model_max_length` of the config.

    Raises:
        ValueError: a SentencePiece model that is not Unigram (BPE, char, word: this builder
            writes Unigram tokenizers only), or that falls back to bytes.
        ImportError: `tokenizers` is not installed (the message says how).
    """
    try:
        import tokenizers
    except ImportError as error:
        raise ImportError(f"--format genai writes tokenizer.json with Hugging Face's tokenizers: "
                          f"{TOKENIZERS_HINT}.") from error
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(bytes(sp_model))
    kind = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)
    if kind != "UNIGRAM" or proto.trainer_spec.byte_fallback:
        raise ValueError(f"--format genai builds a Unigram tokenizer.json; this SentencePiece model has "
                         f"model_type={kind.lower()!r}, byte_fallback={proto.trainer_spec.byte_fallback}.")
    pieces = [(piece.piece, piece.score) for piece in proto.pieces]
    tokenizer = tokenizers.Tokenizer(models.Unigram(pieces, unk_id=special_ids.UNK_ID, byte_fallback=False))
    spec = proto.normalizer_spec
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    # SentencePiece puts its `▁` in front of a text that starts with a space too, which only a model
    # that keeps spaces gives it; Metaspace's own prefix skips such a text, so the normalizer adds it.
    prepended = spec.add_dummy_prefix and not spec.remove_extra_whitespaces
    if prepended:
        steps.append(normalizers.Prepend("▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    scheme = "always" if spec.add_dummy_prefix else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never" if prepended
                                                       else scheme, split=False)
    if proto.trainer_spec.split_by_whitespace:
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    else:
        # Pieces across words (`▁If▁the`): Metaspace's decoder drops every `▁` of the first piece, not
        # only the dummy prefix, so the pieces are joined and one leading space stripped instead (the
        # models split by whitespace keep Metaspace, the decoder onnxruntime-genai is tested with).
        joined = [decoders.Replace("▁", " "), decoders.Fuse()]
        dummy = [decoders.Strip(" ", 1, 0)] if spec.add_dummy_prefix else []
        tokenizer.decoder = decoders.Sequence(joined + dummy)
    # The control pieces (<pad>, <s>, </s>) as special tokens; a user-defined piece (<sep>) stays a
    # piece of the model, as in SentencePiece (its score 0 beats any split of it).
    tokenizer.add_special_tokens([AddedToken(piece.piece, special=True, normalized=False)
                                  for piece in proto.pieces if piece.type == _CONTROL])
    bos, eos, unk, pad = (proto.pieces[i].piece for i in (special_ids.BOS_ID, special_ids.EOS_ID,
                                                         special_ids.UNK_ID, special_ids.PAD_ID))
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                             special_tokens=[(bos, special_ids.BOS_ID)])
    config = {"tokenizer_class": TOKENIZER_CLASS, "bos_token": bos, "eos_token": eos, "unk_token": unk,
              "pad_token": pad, "add_bos_token": True, "add_eos_token": False,
              "clean_up_tokenization_spaces": False}
    if cache_length is not None:
        config["model_max_length"] = int(cache_length)
    return tokenizer.to_str(), config


class GenaiFeeder:
    """The decoder ONNX run by onnxruntime (CPU) the way onnxruntime-genai feeds it: one generator.

    `append(ids)` runs the ids: the first call in chunks of `chunk_size`, later calls at once,
    each from the generator's length on (`position_ids` = the slots); `step()` picks the greedy
    token of the last logits (`pad_id` never), runs it, and returns it. The caches start as zeros
    and are passed from each call to the next, as the shared past/present buffers are.

    Args:
        proto: the serialized decoder (`to_genai_onnx`).
        chunk_size: int, `search.chunk_size`.
        pad_id: int, never generated.
    """

    def __init__(self, proto, chunk_size, pad_id=special_ids.PAD_ID):
        import onnxruntime

        self.session = onnxruntime.InferenceSession(proto, providers=["CPUExecutionProvider"])
        caches = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.cache = {i.name: np.zeros(i.shape, np.float32) for i in caches}
        self.cache_length = int(caches[0].shape[2])
        self.chunk_size, self.pad_id = chunk_size, pad_id
        self.length, self.logits, self.first = 0, None, True

    def _run(self, ids):
        if self.length + len(ids) > self.cache_length:
            raise ValueError(f"{self.length + len(ids)} tokens do not fit in "
                             f"cache_length={self.cache_length}.")
        positions = np.arange(self.length, self.length + len(ids), dtype=np.int64)[None]
        feeds = {INPUT_IDS: np.array([ids], np.int64), POSITION_IDS: positions,
                 ATTENTION_MASK: np.ones([1, self.length + len(ids)], np.int64), **self.cache}
        outputs = dict(zip([o.name for o in self.session.get_outputs()], self.session.run(None, feeds)))
        self.logits = outputs.pop(LOGITS)[0, -1]
        self.cache = {name.replace("present.", "past_key_values.", 1): value
                      for name, value in outputs.items()}
        self.length += len(ids)

    def append(self, ids):
        ids = [int(i) for i in ids]
        size = self.chunk_size if self.first and self.chunk_size else len(ids)
        for start in range(0, len(ids), max(1, size)):
            self._run(ids[start:start + size])
        self.first = False

    def step(self):
        logits = np.array(self.logits, np.float64)
        logits[self.pad_id] = -np.inf
        return int(np.argmax(logits))


def feeder_turns(proto, chunk_size, turns, max_new_tokens, pad_id=special_ids.PAD_ID):
    """The greedy ids of each turn of one `GenaiFeeder` generator (EOS ends a turn, and is kept).

    A turn's last picked token is run with the next turn's ids, in front of them (onnxruntime-genai
    after `rewind_to` by that token, see the module docstring).
    """
    feeder = GenaiFeeder(proto, chunk_size, pad_id)
    generated, pending = [], []
    for ids in turns:
        feeder.append(pending + list(ids))
        new = []
        while len(new) < max_new_tokens:
            new.append(feeder.step())
            if new[-1] == special_ids.EOS_ID or len(new) == max_new_tokens:
                break
            feeder.append([new[-1]])
        pending = new[-1:]
        generated.append(new)
    return generated


def _sentencepiece(sp_model):
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(bytes(sp_model))
    return processor


def build_genai(model, *, target, precision, litert_python=None, sp_model, cache_length, prompt_length,
                check_texts=(), probes=None, max_new_tokens=8, opset=ONNX_OPSET):
    """The onnxruntime-genai folder of `model`, checked: a `Built` for the pass (arguments as
    `export_genai`; `target` is None and `litert_python` is not read: onnxruntime-genai's CPU
    provider runs the folder)."""
    if precision is not None:
        raise ValueError(f"An onnxruntime-genai folder has float32 weights: `quantize` must be None, got "
                         f"quantize={precision!r}.")
    check_genai(model, cache_length, prompt_length)
    check_positive_int("max_new_tokens", max_new_tokens)
    tokenizer_json, tokenizer_config = tokenizer_files(sp_model, cache_length=cache_length)
    from tokenizers import Tokenizer  # there: tokenizer_files raised the install hint otherwise
    sessions = probes or litertlm_bundle.probe_texts(sp_model, prompt_length, cache_length, max_new_tokens)
    litertlm_bundle.check_probes(sp_model, sessions, cache_length, max_new_tokens)
    tokenizer, processor = Tokenizer.from_str(tokenizer_json), _sentencepiece(sp_model)
    texts = list(check_texts) + [text for turns in sessions for text in turns]
    same_ids = all(tokenizer.encode(text).ids == [special_ids.BOS_ID] + processor.EncodeAsIds(text)
                   for text in texts)
    proto = to_genai_onnx(model, cache_length=cache_length, opset=opset)
    _, expected = litertlm_bundle.keras_texts(model, sp_model, sessions, max_new_tokens)
    got = [feeder_turns(proto, prompt_length, [tokenizer.encode(turns[0]).ids]
                        + [tokenizer.encode(text, add_special_tokens=False).ids for text in turns[1:]],
                        max_new_tokens, model.encoder.pad_id)
           for turns in sessions]
    same = got == expected
    config = genai_config(model, cache_length=cache_length, prompt_length=prompt_length)
    contents = {MODEL: proto, CONFIG: json.dumps(config, indent=1).encode(),
                TOKENIZER: tokenizer_json.encode(),
                TOKENIZER_CONFIG: json.dumps(tokenizer_config, indent=1).encode()}
    turns = sum(len(session) for session in sessions)
    tokens = sum(len(new) for session in got for new in session)
    report = {"same_tokens": same, "parity": 0.0 if same else 1.0, "tokens_checked": tokens,
              "tokenizer_texts": len(texts), "tokenizer_same_ids": same_ids,
              "sessions": {"keras": expected, "decoder": got}}
    lines = [f"Decoder: input_ids [1, S], cache {cache_length} slots = "
             f"{generator.cache_bytes(model, cache_length):,} bytes, prefill chunks of {prompt_length}",
             f"Greedy ids fed as onnxruntime-genai feeds the folder, {len(sessions)} sessions, {turns} turns "
             f"(a prompt longer than a chunk, a second turn), {tokens} tokens: "
             + ("same ids as" if same else "IDS DIFFER from") + " CausalLM.generate",
             f"tokenizer.json on {len(texts)} texts: "
             + ("SentencePiece's ids" if same_ids else "IDS DIFFER from SentencePiece's")]
    description = (f"onnxruntime-genai folder: decoder with a dynamic chunk, max_length {cache_length}, "
                   f"chunk_size {prompt_length}")
    return Built(None, None, "graph", tuple(contents.values()), report, lines, {}, description, kind=GENAI,
                 names=tuple(contents))
