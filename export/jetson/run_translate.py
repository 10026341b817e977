#!/usr/bin/env python3
"""Translates a file on the device with an encoder-decoder export (`keras-posenc export MODEL --translate`).

Needs numpy, sentencepiece and one runtime: `ai-edge-litert` (its `CompiledModel`), else
`tflite-runtime` or TensorFlow (the `Interpreter`, with `--delegate SO` for a GPU delegate); for the
ONNX pair of `--target tensorrt` (`STEM.onnx` names `STEM.encode.onnx` and `STEM.decode.onnx`),
onnxruntime. The file's two signatures: `encode(source_ids [1, S])` once per sentence gives each
decoder layer's cross-attention keys and values and the source mask; then one `decode(token_id,
position, past cache, cross keys and values, source mask)` per target token and hypothesis, which
returns the logits and the cache for the next step. A file with a `decode_beams` signature (`--target
cpu` and `tensorrt`, `FILE.json` `beam_rows` K) steps up to K hypotheses of a beam search in one call.
A `--target gl` export is the pair `STEM.encode.tflite` / `STEM.decode.tflite`, given as `STEM.tflite`.

The search is `keras-posenc translate`'s (keras_posenc/beam_search.py, run here in float64 numpy):
beam search ranked by GNMT's length penalty `((5 + length) / 6) ** alpha` (`--beam-size 1`: greedy),
padding and `<s>` never chosen, a hypothesis ends at `</s>`. Each sentence is `pieces </s>` cut to S
pieces, right-padded; the text drops the special ids, as `keras-posenc translate` prints it. Ids,
lengths and the default alpha come from `FILE.json`, tensor names from `FILE.contract.json`; every
model file is checked (size, sha256, the TFLite identifier) before a runtime opens it.

One sentence per input line, one translation per output line (an empty line stays empty); the
output appears whole or not at all (written to a temporary file, then renamed). Prints the runtime,
the sentences/s, the target tokens/s (end tokens counted, as `keras-posenc translate` counts them) and
the mean time to first token (encode + first decode step); with `--json` one object. With
`--beam-size 1`, `--logits FILE.npz` also keeps the float32 logits of every greedy step, per line.
`--jobs N` translates N sentences at once on the CPU, each job with its own session on a thread:
the same translations, more of the cores where the runtime computes without Python's lock (the
classic Interpreter, onnxruntime; not LiteRT 2.3's CompiledModel).

Usage:
    python3 run_translate.py de.tflite --spm spm.model --input src.txt --output hyp.txt [--beam-size 4]
        [--alpha A] [--max-new-tokens N] [--accelerator cpu|gpu] [--delegate SO] [--precision fp32|fp16]
        [--threads N] [--runtime auto|litert|tflite-runtime|onnxruntime] [--jobs N] [--json]
        [--logits FILE.npz]
"""

import argparse
import json
import os
import queue
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from kit_contract import fail, open_export, stdout_to_stderr
from kit_sessions import open_session

RUNTIMES = ("auto", "litert", "tflite-runtime", "onnxruntime")


# --- the search (keras_posenc/beam_search.py, one sentence at a time) ------------------------------


def log_softmax(logits):
    """The log-probabilities of float logits `[vocab]` (or `[rows, vocab]`, row by row), in float64."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - np.max(logits, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def forbid(log_probs, forbidden_ids):
    """A float64 copy of `log_probs` with the `forbidden_ids` at -inf (never chosen)."""
    log_probs = np.array(log_probs, np.float64)
    log_probs[list(forbidden_ids)] = -np.inf
    return log_probs


def length_penalty(length, alpha):
    """GNMT's length penalty `((5 + length) / 6) ** alpha` (the end token counted in `length`)."""
    return ((5.0 + np.float64(length)) / 6.0) ** alpha


def top(scores, count):
    """The indices of the `count` largest `scores` (1-D), largest first; ties: the lower index first."""
    count = min(count, len(scores))
    near = near_best(scores, count)
    bound = -np.partition(-scores[near], count - 1)[count - 1]
    chosen = near[scores[near] >= bound]
    return chosen[np.lexsort((chosen, -scores[chosen]))[:count]]


def near_best(scores, count):
    """The indices, ascending, of the `scores` within the smallest gap of the best (2, 8, 32, ...)
    that holds `count` of them, else of all: the `count` largest and every score tied with them lie
    there. A beam's candidates mostly lie far below its best, so a partition of these few replaces
    one of the whole `beams * vocab`."""
    best = np.max(scores)
    gap = 2.0
    while np.isfinite(best) and gap < 1e6:
        near = np.flatnonzero(scores >= best - gap)
        if len(near) >= count:
            return near
        gap *= 4.0
    return np.arange(len(scores))


def greedy_steps(log_probs, state, *, max_new_tokens, end_id, forbidden_ids=()):
    """Greedy search as a generator: the argmax token at each step until `end_id` or `max_new_tokens`
    tokens. It yields `(tokens, states)` to step (one hypothesis) and is sent their
    `[(log_probs, state)]`; it returns the ids without the end token."""
    ids, log_probs = [], forbid(log_probs, forbidden_ids)
    for t in range(max_new_tokens):
        choice = int(np.argmax(log_probs))
        if choice == end_id:
            break
        ids.append(choice)
        if t + 1 == max_new_tokens:
            break
        [(log_probs, state)] = yield [choice], [state]
        log_probs = forbid(log_probs, forbidden_ids)
    return ids


def beam_steps(log_probs, state, *, beam_size, max_new_tokens, end_id, alpha, forbidden_ids=()):
    """A `beam_size` beam search as a generator (`beam_size` 1: `greedy_steps`); it returns the best
    hypothesis without its end token.

    At each step the `2 * beam_size` best extensions of the live hypotheses are taken in order: one
    ending in `end_id` is finished, scored `log_prob / length_penalty(its length, alpha)`; the others
    fill the live beams. The search stops when `beam_size` hypotheses are finished and no live one can
    still beat the worst of them; at `max_new_tokens` the live hypotheses compete as they are. Each
    live hypothesis keeps its own `state` (its cache): the generator yields the live extensions'
    `(tokens, states)` (each extension with the state of the beam it extends) and is sent their
    `[(log_probs, state), ...]`, so whoever drives it may step them one by one or all at once.
    """
    if beam_size == 1:
        return (yield from greedy_steps(log_probs, state, max_new_tokens=max_new_tokens, end_id=end_id,
                                        forbidden_ids=forbidden_ids))
    vocab, forbidden = len(log_probs), list(forbidden_ids)
    # The live hypotheses: (ids, score, state, the next token's log-probabilities), best first.
    live = [([], 0.0, state, np.asarray(log_probs, np.float64))]
    finished = []  # (score, log_prob, ids), best first, at most beam_size
    best_possible = length_penalty(max_new_tokens, alpha)
    done = False
    for t in range(max_new_tokens):
        candidates = np.full([beam_size, vocab], -np.inf)
        for beam, (_, score, _, next_log_probs) in enumerate(live):
            candidates[beam] = score + next_log_probs
        candidates[:, forbidden] = -np.inf
        candidates = candidates.reshape(-1)
        extended = []  # (ids, score, the beam it extends)
        for flat in top(candidates, 2 * beam_size):
            score = candidates[flat]
            if not np.isfinite(score):
                break
            beam, token = divmod(int(flat), vocab)
            if token == end_id:
                finished.append((score / length_penalty(t + 1, alpha), score, live[beam][0]))
            elif len(extended) < beam_size:
                extended.append((live[beam][0] + [token], score, beam))
        finished.sort(key=lambda item: -item[0])
        del finished[beam_size:]
        first = extended[0][1] if extended else -np.inf
        done = len(finished) == beam_size and first / best_possible <= finished[-1][0]
        if done or t + 1 == max_new_tokens or not extended:
            live = [(ids, score, None, None) for ids, score, _ in extended]
            break
        steps = yield [ids[-1] for ids, _, _ in extended], [live[beam][2] for _, _, beam in extended]
        live = [(ids, score, next_state, np.asarray(next_log_probs, np.float64))
                for (ids, score, _), (next_log_probs, next_state) in zip(extended, steps)]
    pool = list(finished)
    if not done:  # out of steps: the live hypotheses compete as they are
        pool += [(score / length_penalty(len(ids), alpha), score, ids) for ids, score, _, _ in live]
    return list(max(pool, key=lambda item: item[0])[2])


def run_search(search, step_many):
    """Drives one search generator to its end: `step_many(tokens, states) -> [(log_probs, state)]`."""
    try:
        request = next(search)
        while True:
            request = search.send(step_many(*request))
    except StopIteration as stop:
        return stop.value


def one_by_one(step):
    return lambda tokens, states: [step(token, state) for token, state in zip(tokens, states)]


def beam_search(log_probs, state, step, *, beam_size, max_new_tokens, end_id, alpha, forbidden_ids=(),
                step_many=None):
    """`beam_steps` driven by `step(token, state) -> (log_probs, state)` once per live hypothesis and
    step, or by `step_many(tokens, states) -> [(log_probs, state), ...]` where given."""
    search = beam_steps(log_probs, state, beam_size=beam_size, max_new_tokens=max_new_tokens, end_id=end_id,
                        alpha=alpha, forbidden_ids=forbidden_ids)
    return run_search(search, step_many or one_by_one(step))


def lockstep(searches, step_many):
    """Drives several searches together (sentences started at the same time, so their hypotheses
    step at the same positions): each round, every unfinished search's request in one
    `step_many` call. Returns each search's result, in order."""
    results, pending = [None] * len(searches), {}
    for i, search in enumerate(searches):
        try:
            pending[i] = next(search)
        except StopIteration as stop:
            results[i] = stop.value
    while pending:
        order = list(pending)
        tokens = [token for i in order for token in pending[i][0]]
        states = [state for i in order for state in pending[i][1]]
        stepped, first = step_many(tokens, states), 0
        for i in order:
            count = len(pending[i][0])
            try:
                pending[i] = searches[i].send(stepped[first:first + count])
            except StopIteration as stop:
                results[i] = stop.value
                del pending[i]
            first += count
    return results


# --- the file ----------------------------------------------------------------------------------------


def stacked_rows(parts, rows):
    """`{name: array}` dicts of one row each stacked into `rows` rows, the rows past them zeros."""
    padding = rows - len(parts)
    return {name: np.concatenate([part[name] for part in parts] + [np.zeros_like(parts[0][name])] * padding)
            for name in parts[0]}


class Translator:
    """The `encode` and `decode` signatures of one export, fed by the contract's tensor names.

    A hypothesis' state is `(position, cross, past)`: the slot of its next token, `encode`'s outputs
    (shared by every hypothesis of the sentence) and its own cache (the last call's `present_*` outputs
    as `past_*` inputs; zeros of FILE.json's `cache_shape` before the first call). With `chosen` a
    list (`--logits`), each sentence appends the list of its decode steps' float32 logits.
    """

    def __init__(self, session, meta):
        self.session, self.meta, self.tensors = session, meta, meta.tensors
        self.encode_signature, self.decode_signature = meta.translate_signatures
        self.decode_inputs = set(session.input_names(self.decode_signature))
        self.empty = {name: np.zeros(meta["cache_shape"], np.float32) for name in sorted(self.decode_inputs)
                      if name.startswith(self.tensors.past_prefix)}
        files = meta.signature_files()
        self.beam_rows = (meta.get("beam_rows") or 0) if meta.beam_signature in files else 0
        self.chosen = None
        self.sentences_per_call = 1
        self._tiled = None  # (one sentence's encode outputs, them repeated over decode_beams' rows)
        self.normalized = True  # greedy needs only the argmax, which the logits give as they are

    def source_row(self, pieces):
        """`pieces </s>` cut to `source_length` tokens and right-padded with `pad_id`: int32 `[1, S]`."""
        length = self.meta["source_length"]
        ids = list(pieces[:length - 1]) + [self.meta["eos_id"]]
        row = np.full([1, length], self.meta["pad_id"], np.int32)
        row[0, :len(ids)] = ids
        return row

    def encode(self, row):
        """`encode`'s outputs that `decode` takes (the cross-attention keys and values, the source mask)."""
        outputs = self.session.run(self.encode_signature, {self.tensors.source_ids: row})
        return {name: value for name, value in outputs.items() if name in self.decode_inputs}

    def step(self, token, state):
        """One `decode` call: `(log_probs float64 [vocab], the next state)`."""
        position, cross, past = state
        tensors = self.tensors
        outputs = self.session.run(self.decode_signature, {
            tensors.token_id: np.array([[token]], np.int32), tensors.position: np.array([position], np.int32),
            **cross, **past})
        logits = outputs.pop(tensors.logits)[0]
        if self.chosen is not None:
            self.chosen[-1].append(np.array(logits, np.float32))
        present = {tensors.past_prefix + name[len(tensors.present_prefix):]: value
                   for name, value in outputs.items() if name.startswith(tensors.present_prefix)}
        return self.scores(logits), (position + 1, cross, present)

    def step_many(self, tokens, states):
        """`step` of each hypothesis (all at one position, of one sentence or several): one
        `decode_beams` call per `beam_rows` of them (rows past them padded with zeros), one `decode`
        for a hypothesis alone."""
        if not self.beam_rows:
            return [self.step(token, state) for token, state in zip(tokens, states)]
        steps = []
        for first in range(0, len(tokens), self.beam_rows):
            chunk = slice(first, first + self.beam_rows)
            if len(tokens[chunk]) == 1:
                steps.append(self.step(tokens[chunk][0], states[chunk][0]))
            else:
                steps.extend(self._decode_rows(tokens[chunk], states[chunk]))
        return steps

    def _decode_rows(self, tokens, states):
        tensors, rows, count = self.tensors, self.beam_rows, len(tokens)
        position = states[0][0]
        if any(state[0] != position for state in states):
            raise ValueError("decode_beams steps hypotheses at one position only.")
        fed = np.zeros([rows, 1], np.int32)
        fed[:count, 0] = tokens
        caches = stacked_rows([state[2] for state in states], rows)
        outputs = self.session.run(self.meta.beam_signature, {
            tensors.token_id: fed, tensors.position: np.array([position], np.int32),
            **self._sources([state[1] for state in states]), **caches})
        scores = self.scores(outputs.pop(tensors.logits)[:count])
        steps = []
        for row, state in enumerate(states):
            present = {tensors.past_prefix + name[len(tensors.present_prefix):]: value[row:row + 1]
                       for name, value in outputs.items() if name.startswith(tensors.present_prefix)}
            steps.append((scores[row], (position + 1, state[1], present)))
        return steps

    def _sources(self, crosses):
        """`decode_beams`' source inputs for rows of these `encode` outputs, rows past them padded
        with zeros. The rows of one sentence's beam all read its source: that input is made once per
        sentence (every row a copy of it, the padding rows too, whose outputs are dropped)."""
        rows = self.beam_rows
        if all(cross is crosses[0] for cross in crosses):
            if self._tiled is None or self._tiled[0] is not crosses[0]:
                self._tiled = (crosses[0], {name: np.repeat(value, rows, axis=0)
                                            for name, value in crosses[0].items()})
            return self._tiled[1]
        return stacked_rows(crosses, rows)

    def scores(self, logits):
        """A step's scores (`[vocab]`, or `[rows, vocab]` row by row): the log-probabilities (a beam
        compares them across hypotheses), or for a greedy search the float64 logits, whose argmax is
        theirs."""
        return log_softmax(logits) if self.normalized else np.array(logits, np.float64)

    def group_size(self, beam_size):
        """Sentences translated in lockstep: `sentences_per_call`, at most as many as `decode_beams`
        holds with all their beams (one without it, or while the logits are kept)."""
        if not self.beam_rows or self.chosen is not None:
            return 1
        return max(1, min(self.sentences_per_call, self.beam_rows // beam_size))

    def translate_group(self, sentences, *, beam_size, alpha, max_new_tokens, clock=time.perf_counter):
        """The target ids of each sentence's pieces (without `<s>` and `</s>`), the sentences searched
        in lockstep, and the group's time to first token (every sentence's encode and first step)."""
        if self.chosen is not None:
            self.chosen.append([])
        self.normalized = beam_size > 1
        start = clock()
        crosses = [self.encode(self.source_row(pieces)) for pieces in sentences]
        firsts = self.step_many([self.meta["bos_id"]] * len(sentences),
                                [(0, cross, self.empty) for cross in crosses])
        ttft = clock() - start
        searches = [beam_steps(first, state, beam_size=beam_size, max_new_tokens=max_new_tokens,
                               end_id=self.meta["eos_id"], alpha=alpha,
                               forbidden_ids=(self.meta["pad_id"], self.meta["bos_id"]))
                    for first, state in firsts]
        return lockstep(searches, self.step_many), ttft

    def translate(self, pieces, *, beam_size, alpha, max_new_tokens, clock=time.perf_counter):
        """The target ids of one sentence's `pieces` (without `<s>` and `</s>`) and its time to first
        token (encode + the first decode step), in seconds."""
        [ids], ttft = self.translate_group([pieces], beam_size=beam_size, alpha=alpha,
                                           max_new_tokens=max_new_tokens, clock=clock)
        return ids, ttft


def text_of(processor, ids, special_ids):
    """The text of target ids without every special id (`<unk>` too): `keras-posenc translate`'s text."""
    special = set(special_ids)
    return processor.DecodeIds([int(i) for i in ids if int(i) not in special])


def translate_lines(translator, processor, lines, *, beam_size, alpha, max_new_tokens,
                    clock=time.perf_counter, helpers=()):
    """The translation of each line (an empty line stays empty) and the run's figures: `sentences`
    (lines), `translated` (lines not empty), `tokens` (target tokens, end tokens counted), `seconds`,
    `ttft` (the mean time to first token, seconds; None without a sentence).

    `helpers`: more `Translator`s, each over its own session (`--jobs`), that take sentences too, on
    threads: a runtime computes without Python's lock, so N sessions keep up to N cores busy while
    the searches take turns. Each sentence's translation is the same whichever translator takes it.
    """
    special = translator.meta["special_ids"]
    outputs, tokens, ttfts = [""] * len(lines), 0, []
    start = clock()
    pieces = {i: processor.EncodeAsIds(line) for i, line in enumerate(lines) if line.strip()}
    # Sentences of similar length share a group (a group steps until its longest translation ends);
    # one sentence at a time, they go in the input's order.
    size = translator.group_size(beam_size)
    order = sorted(pieces, key=lambda i: (len(pieces[i]), i)) if size > 1 else list(pieces)
    groups = [order[first:first + size] for first in range(0, len(order), size)]
    free = queue.SimpleQueue()  # the translators not busy: one call at a time on each session
    for worker in (translator, *helpers):
        free.put(worker)

    def translate_group(group):
        worker = free.get()
        try:
            return worker.translate_group([pieces[i] for i in group], beam_size=beam_size, alpha=alpha,
                                          max_new_tokens=max_new_tokens, clock=clock)
        finally:
            free.put(worker)

    if helpers:
        with ThreadPoolExecutor(1 + len(helpers)) as executor:
            results = list(executor.map(translate_group, groups))
    else:
        results = [translate_group(group) for group in groups]
    for group, (found, ttft) in zip(groups, results):
        for i, ids in zip(group, found):
            outputs[i] = text_of(processor, ids, special)
            tokens += len(ids) + 1
            ttfts.append(ttft)
    return outputs, {"sentences": len(lines), "translated": len(ttfts), "tokens": tokens,
                     "seconds": clock() - start, "ttft": sum(ttfts) / len(ttfts) if ttfts else None}


# --- files and the command line ---------------------------------------------------------------------


def read_lines(path):
    """The lines of the UTF-8 text file `path`, without their line ends."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        fail(f"--input {path}: file not found.")
    except UnicodeDecodeError as error:
        fail(f"--input {path}: not UTF-8 text ({error.reason} at byte {error.start}).")
    except OSError as error:
        fail(f"--input {path}: not readable ({error.strerror}).")


def write_atomically(path, text):
    """Writes `text` to `path` whole or not at all: a temporary file beside it, renamed into place."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        handle, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    except OSError as error:
        fail(f"--output {path}: cannot write there ({error.strerror}).")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(handle, 0o666 & ~umask)  # mkstemp's 0600 would make the output private
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as error:
        if os.path.exists(temp):
            os.remove(temp)
        if isinstance(error, OSError):
            fail(f"--output {path}: cannot write it ({error.strerror}).")
        raise


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 1, as the kit's others."""

    def error(self, message):
        fail(f"{self.prog}: {message}")


def parse_args(argv):
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="translator from `keras-posenc export MODEL --translate`: a .tflite "
                                      "(STEM.tflite for the STEM.encode.tflite/STEM.decode.tflite pair of "
                                      "--target gl), or STEM.onnx for the STEM.encode.onnx/STEM.decode.onnx "
                                      "pair of --target tensorrt (onnxruntime)")
    parser.add_argument("--spm", required=True, help="the run's SentencePiece model (spm.model)")
    parser.add_argument("--input", required=True, help="the sentences to translate, one per line (UTF-8)")
    parser.add_argument("--output", required=True, help="the translations, one per line")
    parser.add_argument("--beam-size", type=int, default=4, help="default 4; 1: greedy")
    parser.add_argument("--alpha", type=float, help="the length penalty's exponent (default: FILE.json's "
                                                    "length_penalty, that of `keras-posenc translate`)")
    parser.add_argument("--max-new-tokens", type=int, help="target tokens at most, the end token included "
                                                           "(default and limit: the file's cache_length)")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu", help="default cpu")
    parser.add_argument("--delegate", help="tflite-runtime: a delegate library for --accelerator gpu")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default="fp32", help="LiteRT GPU precision")
    parser.add_argument("--threads", type=int, help="CPU threads")
    parser.add_argument("--runtime", choices=RUNTIMES, default="auto",
                        help="auto: onnxruntime for an .onnx file, else ai-edge-litert's CompiledModel when "
                             "installed, else the Interpreter (tflite-runtime's, else TensorFlow's)")
    parser.add_argument("--sentences-per-call", type=int, default=1,
                        help="sentences translated in lockstep, their hypotheses in one decode_beams call "
                             "(up to FILE.json's beam_rows with all their beams; default 1: on a CPU one "
                             "sentence at a time is the faster, benchmarks/RESULTS.md)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="sentences translated at once, each job with its own session on its own "
                             "thread (--accelerator cpu; default 1; up to the CPU cores). It pays where "
                             "the runtime computes without Python's lock: 2 jobs of the classic "
                             "Interpreter on 2 cores translate 1.3 to 1.7 times the sentences/s of one; "
                             "LiteRT 2.3's CompiledModel keeps the lock and slows down "
                             "(benchmarks/RESULTS.md)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--logits", metavar="FILE.npz",
                        help="with --beam-size 1: write the float32 logits of each greedy step (the one "
                             "that chose </s> included) to this .npz, one [steps, vocab] array per "
                             "translated line, named line_K (K: the line's index from 0); for parity "
                             "checks")
    args = parser.parse_args(argv)
    if args.beam_size < 1:
        fail(f"--beam-size must be >= 1, got {args.beam_size}.")
    if args.sentences_per_call < 1:
        fail(f"--sentences-per-call must be >= 1, got {args.sentences_per_call}.")
    if args.jobs < 1:
        fail(f"--jobs must be >= 1, got {args.jobs}.")
    if args.jobs > 1 and args.accelerator != "cpu":
        fail(f"--jobs {args.jobs} opens a session per job: it is for --accelerator cpu, not "
             f"{args.accelerator} (one GPU runs one session at a time).")
    if args.jobs > 1 and args.logits is not None:
        fail(f"--logits keeps the steps in the order they run: it needs --jobs 1, got {args.jobs}.")
    if args.logits is not None and args.beam_size != 1:
        fail(f"--logits writes the greedy steps' logits: it needs --beam-size 1, got {args.beam_size}.")
    if args.alpha is not None and not args.alpha >= 0:
        fail(f"--alpha must be >= 0, got {args.alpha}.")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        fail(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}.")
    for flag, path in (("--spm", args.spm), ("--input", args.input)):
        if not os.path.isfile(path):
            fail(f"{flag} {path}: file not found.")
    if os.path.realpath(args.output) == os.path.realpath(args.input):
        fail(f"--output {args.output} is the input: give another file.")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        fail(f"--output {args.output}: no such folder.")
    return args


def check_runtime(args):
    """Refuses a runtime that cannot run the file: onnxruntime runs the .onnx pair, and only it."""
    onnx = args.model.endswith(".onnx")
    if onnx and args.runtime not in ("auto", "onnxruntime"):
        fail(f"{args.model} is the ONNX pair of --target tensorrt: it runs on onnxruntime (--runtime auto or "
             f"onnxruntime), not --runtime {args.runtime}.")
    if not onnx and args.runtime == "onnxruntime":
        fail(f"--runtime onnxruntime runs the STEM.onnx pair of --target tensorrt, not {args.model}.")


def make_session(args, meta):
    """The session of the file (`kit_sessions.open_session`); `--runtime tflite-runtime` is the
    classic Interpreter."""
    runtime = "interpreter" if args.runtime == "tflite-runtime" else args.runtime
    return open_session(argparse.Namespace(**dict(vars(args), runtime=runtime)), meta)


def open_translator(args):
    """`(Export, max_new_tokens, alpha)` of the file, every file checked before a runtime opens it."""
    meta = open_export(args.model)
    if not meta.is_kind("translate"):
        made = ("`keras-posenc export MODEL --generate`" if meta.is_kind("prefill_decode")
                else "`keras-posenc export MODEL`")
        fail(f"{args.model} is not a translator (FILE.json kind {meta.get('kind')!r}, made by {made}): "
             "export the Seq2SeqTransformer with `keras-posenc export MODEL --translate`.")
    if len(meta.translate_signatures) != 2:
        fail(f"{args.model}: its contract names no encode/decode signatures: export it again.")
    check_runtime(args)
    meta.check_accelerator(args.accelerator)
    for path in sorted(set(meta.signature_files().values())):
        meta.verify(path, tflite=not args.model.endswith(".onnx"))
    cache_length = meta["cache_length"]
    max_new_tokens = cache_length if args.max_new_tokens is None else args.max_new_tokens
    if max_new_tokens > cache_length:
        fail(f"--max-new-tokens {max_new_tokens} needs {max_new_tokens} cache slots; the file has "
             f"{cache_length} (export with a larger --cache-length).")
    alpha = meta["length_penalty"] if args.alpha is None else args.alpha
    return meta, max_new_tokens, alpha


def load_pieces(path, meta):
    """The SentencePiece processor of `path`, refused when its pieces do not fit the file's vocabulary."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    try:
        processor.Load(path)
    except (OSError, RuntimeError) as error:
        fail(f"--spm {path}: not a SentencePiece model ({' '.join(str(error).split())}).")
    if processor.GetPieceSize() > meta["vocab_size"]:
        fail(f"--spm {path} has {processor.GetPieceSize()} pieces, more than the file's vocabulary of "
             f"{meta['vocab_size']}: give the spm.model of the run that was exported.")
    return processor


def report(stats, session, args, alpha):
    """The run's figures as `--json` prints them."""
    seconds = stats["seconds"]
    return {"sentences": stats["sentences"], "tokens": stats["tokens"], "seconds": seconds,
            "sentences_per_s": stats["translated"] / seconds if stats["translated"] and seconds > 0 else None,
            "tokens_per_s": stats["tokens"] / seconds if stats["tokens"] and seconds > 0 else None,
            "ttft_ms": None if stats["ttft"] is None else stats["ttft"] * 1e3, "runtime": session.name,
            "accelerator": args.accelerator, "fully_accelerated": session.fully_accelerated,
            "beam_size": args.beam_size, "alpha": alpha, "jobs": args.jobs}


def main(argv=None):
    args = parse_args(argv)
    meta, max_new_tokens, alpha = open_translator(args)
    processor = load_pieces(args.spm, meta)
    lines = read_lines(args.input)
    with stdout_to_stderr(args.json):  # native runtimes print on fd 1: keep it for the JSON object
        translators = [Translator(make_session(args, meta), meta) for _ in range(args.jobs)]
        for translator in translators:
            translator.sentences_per_call = args.sentences_per_call
        translator, session = translators[0], translators[0].session
        translator.chosen = [] if args.logits else None
        outputs, stats = translate_lines(translator, processor, lines, beam_size=args.beam_size, alpha=alpha,
                                         max_new_tokens=max_new_tokens, helpers=translators[1:])
    write_atomically(args.output, "".join(line + "\n" for line in outputs))
    if args.logits:
        translated = [k for k, line in enumerate(lines) if line.strip()]
        np.savez(args.logits, **{f"line_{k}": np.stack(steps)
                                 for k, steps in zip(translated, translator.chosen)})
    shown = report(stats, session, args, alpha)
    if args.json:
        print(json.dumps(shown))
        return 0
    print(f"runtime: {session.name}  accelerator: {args.accelerator}  fully accelerated: "
          f"{session.fully_accelerated}")
    rates = ("" if shown["sentences_per_s"] is None else
             f" ({shown['sentences_per_s']:.2f} sentences/s, {shown['tokens_per_s']:.1f} target tokens/s)")
    print(f"translated {stats['translated']} of {stats['sentences']} lines in {stats['seconds']:.2f} s"
          f"{rates}, beam {args.beam_size}, alpha {alpha}" + (f", {args.jobs} jobs" if args.jobs > 1 else ""))
    if shown["ttft_ms"] is not None:
        print(f"mean time to first token {shown['ttft_ms']:.1f} ms (encode + first decode step)")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
