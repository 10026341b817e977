"""What runs an exported file here: TFLite's interpreter and onnxruntime, window files and sessions.

- `run_file`: a window file's output (`run_interpreter` for a `.tflite`, `run_onnx` for ONNX),
  fed the looked-up rows where the file takes them (`with_host_rows`);
- `TfliteSession`, `OnnxSession`: the two signatures of a prefill/decode export, and
  `greedy_generate`, the package's greedy loop over such a session;
- `TranslatorSession`: the `encode` and `decode` signatures of a translator export.

The parity (`parity`), the quality measures (`quality`) and the generation checks run files only
through this module.
"""

import collections
import contextlib

import numpy as np
import tensorflow as tf

from keras_posenc.export import contract
from keras_posenc.export.flatbuffer import input_names
from keras_posenc.export.model_spec import HOST_EMBEDDINGS, ROLES, host_embedding_table, role_of
from keras_posenc.export.targets import ONNX, TFLITE

__all__ = ["FLOAT_TYPES", "OnnxSession", "TfliteSession", "TranslatorSession", "greedy_generate",
           "interpreter_class", "onnx_input_names", "past", "recording", "run_file", "run_interpreter",
           "run_onnx", "step_outputs", "typed_feeds", "with_host_rows", "with_host_rows_of"]

TOKEN_IDS, TOKEN_ID, POSITION, LOGITS = (contract.TENSORS[name]
                                         for name in ("token_ids", "token_id", "position", "logits"))
PREFILL, DECODE = contract.SIGNATURES


def run_file(spec, exported, feeds, *, file_format=TFLITE, table=None, interpreter=None):
    """The output of a window file on `feeds` (`spec.feeds`), fed the host rows where it takes them.

    Args:
        spec: the `ModelSpec` the file was exported from.
        exported: the file (a `.tflite` flatbuffer or `TfliteFile`, or an ONNX model).
        feeds: one array per input role, as `spec.feeds` gives them.
        file_format: the `FileFormat` of `exported`: TFLite's interpreter or onnxruntime runs it.
        table, interpreter: as in `parity`.
    """
    return _RUNNERS[file_format](spec, exported, feeds, table, interpreter)


def _run_tflite(spec, exported, feeds, table, interpreter):
    feeds, roles = with_host_rows(spec.model, exported, feeds, spec.roles, table)
    return run_interpreter(exported, feeds, roles, interpreter=interpreter)


def _run_onnx(spec, exported, feeds, table, interpreter):
    feeds, roles = with_host_rows_of(spec.model, onnx_input_names(exported), feeds, spec.roles, table)
    return run_onnx(exported, feeds, roles)


_RUNNERS = {TFLITE: _run_tflite, ONNX: _run_onnx}


def with_host_rows(model, tflite_bytes, feeds, roles, table=None):
    """`(feeds, roles)` plus the looked-up rows `table[token_ids]` when the file takes `embeddings`.

    `table`: float32 `[vocab, d_model]`, default `host_embedding_table(model)`.
    """
    return with_host_rows_of(model, input_names(tflite_bytes), feeds, roles, table)


def with_host_rows_of(model, names, feeds, roles, table=None):
    """`with_host_rows` for a file whose input names are `names` (an ONNX model's, say)."""
    if not any(role_of(name) == HOST_EMBEDDINGS for name in names):
        return feeds, list(roles)
    table = host_embedding_table(model) if table is None else np.asarray(table, np.float32)
    return list(feeds) + [table[feeds[0]]], list(roles) + [HOST_EMBEDDINGS]


def run_interpreter(tflite_bytes, feeds, roles=None, interpreter=None):
    """Runs the TFLite model on `feeds` (one array per input), in chunks of its batch size.

    Args:
        tflite_bytes: a TFLite flatbuffer (bytes).
        feeds: a list of numpy arrays in the order of `roles`; each of the
            exported shape except the first axis, which is a multiple of the
            exported batch size.
        roles: the input roles of `feeds` (`ModelSpec.roles`); default
            token ids, then language ids.
        interpreter: the interpreter class, called with `model_content=` (default
            `interpreter_class()`; `litert_python.RemoteRuntime.interpreter` runs LiteRT 2.x).

    Returns:
        A numpy array: the model's first output for all rows, concatenated.

    Example:

    >>> double = tf.function(lambda x: x * 2.0, input_signature=[tf.TensorSpec([1, 3], tf.float32)])
    >>> flat = tf.lite.TFLiteConverter.from_concrete_functions([double.get_concrete_function()]).convert()
    >>> run_interpreter(flat, [np.arange(6, dtype=np.float32).reshape(2, 3)]).tolist()
    [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    """
    tflite_bytes = getattr(tflite_bytes, "bytes", tflite_bytes)  # a TfliteFile's flatbuffer
    interpreter = (interpreter or interpreter_class())(model_content=bytes(tflite_bytes))
    interpreter.allocate_tensors()
    # Token ids first, language ids second, whatever order the converter gave the inputs.
    inputs = _in_role_order(interpreter.get_input_details(), lambda detail: detail["name"], roles)
    output = interpreter.get_output_details()[0]["index"]

    def run(chunk):
        for detail, feed in zip(inputs, chunk):
            interpreter.set_tensor(detail["index"], feed.astype(detail["dtype"]))
        interpreter.invoke()
        return interpreter.get_tensor(output)

    shapes = [(detail["name"], tuple(int(n) for n in detail["shape"])) for detail in inputs]
    return _run_in_chunks("TFLite", shapes, feeds, run)


def _run_in_chunks(kind, shapes, feeds, run):
    """`run(chunk)` over row chunks of `feeds` of the exported batch size, the outputs concatenated.

    `shapes`: `(name, exported shape)` of each input, in the order of `feeds`.
    """
    if len(shapes) != len(feeds):
        raise ValueError(f"The {kind} model has {len(shapes)} inputs, got {len(feeds)} arrays.")
    rows = int(shapes[0][1][0])
    for (name, shape), feed in zip(shapes, feeds):
        if tuple(shape[1:]) != feed.shape[1:] or len(feed) % rows:
            raise ValueError(f"Input '{name}' of shape {feed.shape} does not fit the exported "
                             f"shape {shape} (same length, batch a multiple of it).")
        if len(feed) != len(feeds[0]):
            raise ValueError(f"Input '{name}' has {len(feed)} rows, input '{shapes[0][0]}' {len(feeds[0])}: "
                             "every input needs one row per token row.")
    return np.concatenate([run([feed[start:start + rows] for feed in feeds])
                           for start in range(0, len(feeds[0]), rows)])



def interpreter_class():
    """ai-edge-litert's `Interpreter` where it is installed (TF >= 2.16), else `tf.lite.Interpreter`.

    `tf.lite.Interpreter` is deprecated from TF 2.20 on in favour of LiteRT's, which runs the
    same flatbuffers; the TF 2.12 stack has no ai-edge-litert wheel and keeps TensorFlow's.

    Example:

    >>> interpreter_class().__name__
    'Interpreter'
    """
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return tf.lite.Interpreter
    return Interpreter


def _in_role_order(details, name_of, roles):
    """Runtime input details in the order of `roles` (default: token ids, language ids, ...)."""
    found = {role_of(name_of(detail)): detail for detail in details}
    roles = roles or ROLES[:len(details)]
    if len(found) != len(details) or set(found) != set(roles):
        return list(details)  # unnamed inputs: the converter's order
    return [found[role] for role in roles]


def onnx_input_names(onnx_bytes):
    """The input names of an ONNX model, as onnxruntime reads them."""
    import onnxruntime

    session = onnxruntime.InferenceSession(bytes(onnx_bytes), providers=["CPUExecutionProvider"])
    return [detail.name for detail in session.get_inputs()]


FLOAT_TYPES = {"tensor(float)": np.float32}


def run_onnx(onnx_bytes, feeds, roles=None):
    """Runs an ONNX model with onnxruntime (CPU) on `feeds` (token ids, language ids), row chunks.

    Args:
        onnx_bytes: the model from `to_onnx`.
        feeds: numpy arrays as in `run_interpreter` (int ids; the float rows
            `embeddings` of an `embedding="host"` file).

    Returns:
        The output `logits` (`contract.TENSORS`; the first output of a file without it) for all
        rows, concatenated.
    """
    import onnxruntime

    session = onnxruntime.InferenceSession(bytes(onnx_bytes), providers=["CPUExecutionProvider"])
    inputs = _in_role_order(session.get_inputs(), lambda detail: detail.name, roles)
    outputs = [detail.name for detail in session.get_outputs()]
    output = contract.TENSORS["logits"] if contract.TENSORS["logits"] in outputs else outputs[0]

    def run(chunk):
        feeds_by_name = {detail.name: np.asarray(feed, FLOAT_TYPES.get(detail.type, np.int32))
                         for detail, feed in zip(inputs, chunk)}
        return session.run([output], feeds_by_name)[0]

    return _run_in_chunks("ONNX", [(detail.name, tuple(detail.shape)) for detail in inputs], feeds, run)


class TfliteSession:
    """The two signatures of a prefill/decode `.tflite`, run by TensorFlow's interpreter.

    Feeds are given as int32 `token_ids` / `token_id` and `position`: they are cast to the
    file's input types (float32 for `gl`), and a file that takes `embeddings` gets the rows
    `table[ids]` (`table`: `model_spec.host_embedding_table(model)`).
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
        if HOST_EMBEDDINGS in prefill and table is None:
            raise ValueError("This file takes looked-up `embeddings`: pass `table` "
                             "(model_spec.host_embedding_table(model)).")
        self.table = table

    def run(self, signature, feeds):
        return self.runners[signature](**typed_feeds(self.details[signature], feeds, self.table))


def typed_feeds(details, feeds, table=None):
    """`feeds` in the dtypes of the inputs `details` (name -> detail); ids -> `embeddings` rows."""
    typed = {}
    for name, detail in details.items():
        if name == HOST_EMBEDDINGS:
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


@contextlib.contextmanager
def recording(session):
    """Inside the block, every `session.run` also records its feeds: yields `{signature: [feeds of
    each call]}` (what calibrates an int8 ONNX file's activations)."""
    calls = collections.defaultdict(list)
    run = session.run

    def recorded(signature, feeds):
        calls[signature].append({name: np.asarray(value) for name, value in feeds.items()})
        return run(signature, feeds)

    session.run = recorded
    try:
        yield calls
    finally:
        session.run = run


def step_outputs(logits, keys, values):
    """A cached step's outputs by their contract names: `logits`, then `present_key_<i>` and
    `present_value_<i>` of each layer."""
    outputs = {LOGITS: logits}
    for i, (key, value) in enumerate(zip(keys, values)):
        outputs[contract.present_name("key", i)] = key
        outputs[contract.present_name("value", i)] = value
    return outputs


def past(outputs):
    """A call's `present_*` cache outputs renamed as the next decode step's `past_*` inputs."""
    return {contract.present_to_past(name): value for name, value in outputs.items() if name != LOGITS}


class TranslatorSession:
    """The `encode`, `decode` (and `decode_beams`) signatures of a translator export, by name.

    Args:
        files: the file of each signature, in the order `encode`, `decode`, `decode_beams`: the
            `.tflite` flatbuffers (one file repeated where it holds them all) or the ONNX models.
        file_format: `TFLITE` (TensorFlow's interpreter, or `interpreter`) or `ONNX`
            (onnxruntime, CPU).
        interpreter: optional interpreter class for the `.tflite` files.

    Attributes:
        beam_rows: the rows of `decode_beams`, 0 without it.

    Feeds are cast to the files' input dtypes (float32 ids for `gl`).
    """

    def __init__(self, files, file_format=TFLITE, interpreter=None):
        signatures = contract.TRANSLATE_SIGNATURES + (contract.BEAM_SIGNATURE,)
        self.calls, self.inputs = {}, {}
        if file_format is TFLITE:
            opened = {content: (interpreter or tf.lite.Interpreter)(model_content=content)
                      for content in dict.fromkeys(files)}
            for key, content in zip(signatures, files):
                runner = opened[content].get_signature_runner(key)
                self.inputs[key] = {name: (detail["dtype"], tuple(detail["shape"]))
                                    for name, detail in runner.get_input_details().items()}
                self.calls[key] = runner
        else:
            import onnxruntime

            for key, proto in zip(signatures, files):
                session = onnxruntime.InferenceSession(bytes(proto), providers=["CPUExecutionProvider"])
                self.inputs[key] = {i.name: (FLOAT_TYPES.get(i.type, np.int32), tuple(i.shape))
                                    for i in session.get_inputs()}
                names = [o.name for o in session.get_outputs()]
                self.calls[key] = lambda session=session, names=names, **feeds: dict(
                    zip(names, session.run(None, feeds)))
        encode, decode = contract.TRANSLATE_SIGNATURES
        self.source_length = int(self.inputs[encode][contract.TENSORS["source_ids"]][1][1])
        self.cache_shape = self.inputs[decode][contract.past_name("key", 0)][1]
        beams = self.inputs.get(contract.BEAM_SIGNATURE)
        self.beam_rows = int(beams[contract.TENSORS["token_id"]][1][0]) if beams else 0

    def run(self, signature, feeds):
        typed = {name: np.asarray(feeds[name]).astype(dtype)
                 for name, (dtype, _) in self.inputs[signature].items()}
        return self.calls[signature](**typed)
