"""Autoregressive generation with a key/value cache: the loop, its checks and the samplers.

`CausalLM.generate` is the entry point. The model runs one prefill over
the (left-padded) prompts, then one decode step per new token; each step
writes its keys and values into a cache of `prompt_length +
max_new_tokens` slots and attends over it, so a step costs O(T·d) instead
of re-running the whole window. Sampling happens on the host in float64
numpy with a seeded generator, so a seed gives the same tokens on every
backend.

References:
    - Holtzman et al., "The Curious Case of Neural Text Degeneration", 2020
      (nucleus / top-p sampling), https://arxiv.org/abs/1904.09751.
    - keras-hub's `CausalLM.generate` and `CachedMultiHeadAttention` (the
      cache layout `[batch, layers, 2, cache_length, heads, head_dim]`).
"""

import weakref

import numpy as np

from keras_posenc.backend import inference_function, ops
from keras_posenc.positions import position_ids

__all__ = ["SAMPLERS", "GenerationResult", "check_prompt", "generate", "sample_next"]

SAMPLERS = ("greedy", "top_k", "top_p")
# One compiled step per model, so repeated `generate` calls trace it once per shape.
_STEPS = weakref.WeakKeyDictionary()


def _step_function(model):
    if model not in _STEPS:
        def step(ids, positions, cache, index, languages):
            return model(ids, position_ids=positions, language_ids=languages, cache=cache, cache_index=index,
                         training=False)

        _STEPS[model] = inference_function(model, step)
    return _STEPS[model]


class GenerationResult:
    """What `generate` returns: the new ids and the time split of the run.

    Attributes:
        ids: int numpy `[batch, max_new_tokens]`, the generated ids; after a
            row's `stop_id` the rest of the row is `pad_id`.
        prefill_seconds: float, the prompt pass and the first token.
        decode_seconds: float, every later step.
        decode_steps: int, the number of decode steps run.
    """

    def __init__(self, ids, prefill_seconds, decode_seconds, decode_steps):
        self.ids = ids
        self.prefill_seconds = prefill_seconds
        self.decode_seconds = decode_seconds
        self.decode_steps = decode_steps

    @property
    def decode_tokens_per_second(self):
        """Tokens per second of the decode steps (every row counted), or None without any."""
        if not self.decode_steps or self.decode_seconds <= 0:
            return None
        return self.ids.shape[0] * self.decode_steps / self.decode_seconds


def check_prompt(prompt_ids, *, vocab_size, pad_id):
    """The prompts as int64 numpy `[batch, length]`, after checking them.

    Args:
        prompt_ids: int array `[length]` or `[batch, length]`; rows shorter
            than the longest are left-padded with `pad_id`.
        vocab_size: int, ids must be below it.
        pad_id: int, the padding id.

    Returns:
        int64 numpy `[batch, length]`.

    Raises:
        ValueError: empty prompt, a row of padding only, padding after a real
            token (right padding), or an id outside `[0, vocab_size)`.
        TypeError: non-integer ids.

    Example:

    >>> check_prompt([5, 6], vocab_size=10, pad_id=0).tolist()
    [[5, 6]]
    >>> check_prompt([[5, 0]], vocab_size=10, pad_id=0)
    Traceback (most recent call last):
        ...
    ValueError: `prompt_ids` must be left-padded: row 0 has padding (pad_id=0) after a real token.
    """
    prompt = np.asarray(prompt_ids)
    if prompt.dtype.kind not in "iu":
        if prompt.size == 0:
            raise ValueError("`prompt_ids` is empty: give at least one token.")
        raise TypeError(f"`prompt_ids` must be integer token ids, got dtype {prompt.dtype}.")
    if prompt.ndim == 1:
        prompt = prompt[None]
    if prompt.ndim != 2:
        raise ValueError(f"`prompt_ids` must have shape [length] or [batch, length], "
                         f"got shape {prompt.shape}.")
    if prompt.size == 0:
        raise ValueError(f"`prompt_ids` is empty (shape {prompt.shape}): give at least one token.")
    bad = (prompt < 0) | (prompt >= vocab_size)
    if bad.any():
        raise ValueError(f"`prompt_ids` must lie in [0, vocab_size={vocab_size}), got {int(prompt[bad][0])}.")
    real = prompt != pad_id
    for row in range(prompt.shape[0]):
        if not real[row].any():
            raise ValueError(f"`prompt_ids` row {row} is all padding (pad_id={pad_id}): "
                             "give at least one token.")
        first = int(np.argmax(real[row]))
        if not real[row, first:].all():
            raise ValueError(f"`prompt_ids` must be left-padded: row {row} has padding (pad_id={pad_id}) "
                             "after a real token.")
    return prompt.astype(np.int64)


def sample_next(logits, sampler="greedy", *, temperature=1.0, k=None, p=None, rng=None):
    """The next id of every row from its logits.

    Args:
        logits: float numpy `[batch, vocab]`.
        sampler: "greedy" (argmax), "top_k" (sample among the `k` largest) or
            "top_p" (sample among the smallest set of largest-probability ids
            whose mass reaches `p`).
        temperature: float > 0, divides the logits before sampling.
        k: int >= 1, for "top_k".
        p: float in (0, 1], for "top_p".
        rng: a `numpy.random.Generator` (sampling only).

    Returns:
        int64 numpy `[batch]`.

    Example:

    >>> logits = np.array([[0.0, 3.0, 1.0]])
    >>> sample_next(logits).tolist()
    [1]
    >>> sample_next(logits, "top_k", k=1, rng=np.random.default_rng(0)).tolist()
    [1]
    """
    logits = np.asarray(logits, np.float64)
    if sampler == "greedy":
        return np.argmax(logits, axis=-1).astype(np.int64)
    scaled = logits / temperature
    order = np.argsort(-scaled, axis=-1, kind="stable")
    ranked = np.take_along_axis(scaled, order, axis=-1)
    probabilities = np.exp(ranked - ranked[:, :1])
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    if sampler == "top_k":
        keep = np.arange(ranked.shape[-1])[None] < k
    else:
        mass_before = np.cumsum(probabilities, axis=-1) - probabilities
        keep = mass_before < p  # the top id always stays
    probabilities = np.where(keep, probabilities, 0.0)
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    picks = [rng.choice(ranked.shape[-1], p=row) for row in probabilities]
    return order[np.arange(len(picks)), picks].astype(np.int64)


def _pick(logits, pad_id, sampler, temperature, k, p, rng):
    """The next ids from the last position's logits; `pad_id` is never generated (it would mask itself)."""
    last = ops.convert_to_numpy(logits)[:, -1].astype(np.float64)
    last[:, pad_id] = -np.inf
    return sample_next(last, sampler, temperature=temperature, k=k, p=p, rng=rng)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_sampling(sampler, temperature, k, p, max_new_tokens):
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {SAMPLERS}, got sampler={sampler!r}.")
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be an int >= 1, got max_new_tokens={max_new_tokens!r}.")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0, got temperature={temperature!r}.")
    if sampler == "top_k" and (not _is_int(k) or k < 1):
        raise ValueError(f"`k` must be an int >= 1 with sampler='top_k', got k={k!r}.")
    if sampler == "top_p" and (p is None or not 0 < p <= 1):
        raise ValueError(f"`p` must lie in (0, 1] with sampler='top_p', got p={p!r}.")


def generate(model, prompt_ids, max_new_tokens, *, sampler="greedy", temperature=1.0, k=None, p=None,
             seed=None, stop_id=None, language_ids=None, clock=None, warmup=False):
    """Generates `max_new_tokens` ids after each prompt with a key/value cache.

    See `CausalLM.generate` for the arguments. `clock` is a zero-argument
    function returning seconds (default `time.perf_counter`). With
    `warmup=True` the prefill and a decode step run once untimed first, so
    the times leave out tracing and compilation.

    Returns:
        A `GenerationResult`.
    """
    import time

    clock = clock or time.perf_counter
    encoder = model.encoder
    if not model.causal:
        raise ValueError("`generate` needs a causal model; this CausalLM has causal=False.")
    _check_sampling(sampler, temperature, k, p, max_new_tokens)
    prompt = check_prompt(prompt_ids, vocab_size=encoder.vocab_size, pad_id=encoder.pad_id)
    batch, prompt_length = prompt.shape
    cache_length = prompt_length + int(max_new_tokens)
    longest = int((prompt != encoder.pad_id).sum(axis=1).max()) + int(max_new_tokens)
    if longest > encoder.max_length and encoder.position_config.get("overflow", "error") != "extend":
        raise ValueError(f"Generating past the model's max_length={encoder.max_length}: the longest prompt "
                         f"({longest - int(max_new_tokens)} tokens) plus max_new_tokens={max_new_tokens} "
                         f"needs {longest} positions.")
    if bool(model.num_languages) != (language_ids is not None):
        raise ValueError(f"`language_ids` must be given exactly when the model has num_languages "
                         f"(num_languages={model.num_languages}, language_ids={language_ids!r}).")
    if language_ids is not None:
        language_ids = ops.convert_to_tensor(np.broadcast_to(np.asarray(language_ids, np.int32), [batch]))
    rng = np.random.default_rng(seed)
    step = _step_function(model)
    real = prompt != encoder.pad_id
    positions = ops.convert_to_numpy(position_ids(real)).astype(np.int32)
    cache = ops.zeros(encoder.cache_shape(batch, cache_length), encoder.compute_dtype)
    if warmup:
        step(ops.convert_to_tensor(prompt.astype(np.int32)), ops.convert_to_tensor(positions), cache,
             ops.convert_to_tensor(np.int32(0)), language_ids)
        step(ops.convert_to_tensor(prompt[:, -1:].astype(np.int32)), ops.convert_to_tensor(positions[:, -1:]),
             cache, ops.convert_to_tensor(np.int32(prompt_length)), language_ids)

    start = clock()
    logits, cache = step(ops.convert_to_tensor(prompt.astype(np.int32)), ops.convert_to_tensor(positions),
                         cache, ops.convert_to_tensor(np.int32(0)), language_ids)
    next_ids = _pick(logits, encoder.pad_id, sampler, temperature, k, p, rng)
    prefill_seconds = clock() - start
    generated = np.full([batch, int(max_new_tokens)], encoder.pad_id, np.int64)
    done = np.zeros([batch], bool)
    next_position = real.sum(axis=1).astype(np.int32)
    decode_start, steps = clock(), 0
    for t in range(int(max_new_tokens)):
        generated[:, t] = np.where(done, encoder.pad_id, next_ids)
        if stop_id is not None:
            done |= next_ids == stop_id
        if t == int(max_new_tokens) - 1 or done.all():
            break
        logits, cache = step(ops.convert_to_tensor(next_ids.astype(np.int32)[:, None]),
                             ops.convert_to_tensor((next_position + t)[:, None]), cache,
                             ops.convert_to_tensor(np.int32(prompt_length + t)), language_ids)
        next_ids = _pick(logits, encoder.pad_id, sampler, temperature, k, p, rng)
        steps += 1
    return GenerationResult(generated, prefill_seconds, clock() - decode_start, steps)
