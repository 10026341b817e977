"""Batched beam search and greedy search over a step function, with GNMT's length penalty.

The search runs on the host in float64 numpy; the model only provides the
log-probabilities of the next token of each row (`step`) and reorders its
state (a key/value cache) when beams are selected (`reorder`). So one
search serves any model with a cached step: `Seq2SeqTransformer.translate`
(encoder-decoder) and a decoder-only `CausalLM` continuing `source <sep>`.

References:
    - Wu et al., "Google's Neural Machine Translation System", 2016,
      section 7 (the length penalty `((5 + |Y|) / 6) ** alpha`),
      https://arxiv.org/abs/1609.08144.
    - Vaswani et al., "Attention Is All You Need", 2017, section 6.1
      (beam 4, alpha 0.6), https://arxiv.org/abs/1706.03762.
"""

import numpy as np

__all__ = ["SearchResult", "beam_search", "greedy_search", "length_penalty"]


def length_penalty(length, alpha):
    """GNMT's length penalty `((5 + length) / 6) ** alpha`.

    Args:
        length: int or int array, hypothesis lengths (the end token counted).
        alpha: float >= 0; 0 ranks by total log-probability.

    Example:

    >>> round(float(length_penalty(7, 0.6)), 6), float(length_penalty(7, 0.0))
    (1.515717, 1.0)
    """
    return ((5.0 + np.asarray(length, np.float64)) / 6.0) ** alpha


class SearchResult:
    """What a search returns.

    Attributes:
        ids: list (one per row) of int64 numpy arrays, the best hypothesis
            without its end token.
        scores: float64 numpy `[batch]`, each hypothesis's log-probability
            divided by its length penalty (greedy: the log-probability).
        log_probs: float64 numpy `[batch]`, the total log-probability.
        steps: int, step calls made.
    """

    def __init__(self, ids, scores, log_probs, steps):
        self.ids = ids
        self.scores = scores
        self.log_probs = log_probs
        self.steps = steps


def _check_common(log_probs, max_new_tokens, end_id):
    log_probs = np.asarray(log_probs, np.float64)
    if log_probs.ndim != 2:
        raise ValueError(f"`log_probs` must have shape [batch, vocab], got shape {log_probs.shape}.")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or \
            max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be an int >= 1, got max_new_tokens={max_new_tokens!r}.")
    if not 0 <= end_id < log_probs.shape[1]:
        raise ValueError(f"`end_id` must lie in [0, vocab={log_probs.shape[1]}), got end_id={end_id!r}.")
    return log_probs


def _forbid(log_probs, forbidden_ids):
    log_probs = np.array(log_probs, np.float64)
    for token in forbidden_ids:
        log_probs[:, token] = -np.inf
    return log_probs


def _top(scores, count):
    """The indices of each row's `count` largest scores, largest first (ties: the lower index first)."""
    count = min(count, scores.shape[1])
    # The count-th largest score of each row; argpartition alone would pick among scores tied with
    # it at random, so every id reaching it is ranked, and the lower ids win the tie.
    bounds = -np.partition(-scores, count - 1, axis=-1)[:, count - 1]
    top = np.empty([scores.shape[0], count], np.int64)
    for row, (values, bound) in enumerate(zip(scores, bounds)):
        chosen = np.flatnonzero(values >= bound)
        top[row] = chosen[np.lexsort((chosen, -values[chosen]))[:count]]
    return top


def greedy_search(log_probs, state, step, *, max_new_tokens, end_id, forbidden_ids=()):
    """The argmax token at every step until `end_id` or `max_new_tokens`.

    Args:
        log_probs: float `[batch, vocab]`, log-probabilities of each row's
            first new token.
        state: the model's state for the batch (passed to `step`).
        step: `step(tokens int64 [batch], state) -> (log_probs [batch, vocab], state)`.
        max_new_tokens: int >= 1, tokens at most (the end token included).
        end_id: int, the token that ends a hypothesis.
        forbidden_ids: ids never chosen (padding, the start token).

    Returns:
        A `SearchResult`.

    Example:

    >>> table = np.log(np.array([[0.1, 0.6, 0.3], [0.7, 0.2, 0.1]]))
    >>> step = lambda tokens, state: (table[tokens], state)
    >>> greedy_search(table[[1]], None, step, max_new_tokens=5, end_id=0).ids[0].tolist()
    []
    >>> greedy_search(table[[0]], None, step, max_new_tokens=5, end_id=0).ids[0].tolist()
    [1]
    """
    log_probs = _forbid(_check_common(log_probs, max_new_tokens, end_id), forbidden_ids)
    batch = log_probs.shape[0]
    tokens = np.zeros([batch, int(max_new_tokens)], np.int64)
    lengths = np.full([batch], int(max_new_tokens))
    total = np.zeros([batch])
    done = np.zeros([batch], bool)
    steps = 0
    for t in range(int(max_new_tokens)):
        choice = np.argmax(log_probs, axis=-1)
        total += np.where(done, 0.0, log_probs[np.arange(batch), choice])
        tokens[:, t] = np.where(done, end_id, choice)
        finished = ~done & (choice == end_id)
        lengths[finished] = t
        done |= finished
        if done.all() or t + 1 == max_new_tokens:
            break
        log_probs, state = step(tokens[:, t], state)
        log_probs = _forbid(_check_common(log_probs, max_new_tokens, end_id), forbidden_ids)
        steps += 1
    ids = [tokens[row, :lengths[row]] for row in range(batch)]
    return SearchResult(ids, total.copy(), total, steps)


def beam_search(log_probs, state, step, reorder, *, beam_size, max_new_tokens, end_id, alpha=0.6,
                forbidden_ids=()):
    """Batched beam search: the `beam_size` best hypotheses of each row, ranked by GNMT's score.

    Each row keeps `beam_size` live hypotheses. At every step the `2 *
    beam_size` best extensions of a row are taken in order: one ending in
    `end_id` is a finished hypothesis scored `log_prob / length_penalty`
    (the end token counted in the length), the others fill the live beams.
    A row stops when it holds `beam_size` finished hypotheses and no live
    one can still beat the worst of them (a live score only falls, and the
    penalty is at most that of `max_new_tokens`); at `max_new_tokens` the
    live hypotheses are scored as they are. `beam_size=1` is
    `greedy_search`.

    Args:
        log_probs: float `[batch, vocab]`, each row's first-token log-probabilities.
        state: the model's state for `batch` rows.
        step: `step(tokens int64 [n], state) -> (log_probs [n, vocab], state)`.
        reorder: `reorder(state, rows int64 [n]) -> state`, the state of the
            given rows (a gather along the batch axis); first called with
            every row repeated `beam_size` times.
        beam_size: int >= 1.
        max_new_tokens: int >= 1, tokens at most (the end token included).
        end_id: int, the token that ends a hypothesis.
        alpha: float >= 0, the length penalty's exponent.
        forbidden_ids: ids never chosen (padding, the start token).

    Returns:
        A `SearchResult`.

    Example: two tokens, the end (0) and "a" (1). A first "a" is likely (0.6)
    but what follows is even, so "a" then the end has probability 0.3, below
    the empty hypothesis's 0.4: greedy takes "a", beam 2 finds the empty one.

    >>> first = np.log(np.array([[0.4, 0.6]]))
    >>> after_a = np.log(np.array([[0.5, 0.5]]))  # then: the end or "a", even
    >>> step = lambda tokens, state: (np.repeat(after_a, len(tokens), axis=0), state)
    >>> reorder = lambda state, rows: state
    >>> greedy_search(first, None, step, max_new_tokens=2, end_id=0).ids[0].tolist()
    [1]
    >>> beam_search(first, None, step, reorder, beam_size=2, max_new_tokens=2, end_id=0,
    ...             alpha=0.0).ids[0].tolist()
    []
    """
    if isinstance(beam_size, bool) or not isinstance(beam_size, (int, np.integer)) or beam_size < 1:
        raise ValueError(f"`beam_size` must be an int >= 1, got beam_size={beam_size!r}.")
    if not alpha >= 0:
        raise ValueError(f"`alpha` (the length penalty) must be >= 0, got alpha={alpha!r}.")
    if beam_size == 1:
        return greedy_search(log_probs, state, step, max_new_tokens=max_new_tokens, end_id=end_id,
                             forbidden_ids=forbidden_ids)
    log_probs = _forbid(_check_common(log_probs, max_new_tokens, end_id), forbidden_ids)
    batch, vocab = log_probs.shape
    k = int(beam_size)
    state = reorder(state, np.repeat(np.arange(batch), k))
    log_probs = np.repeat(log_probs, k, axis=0)
    alive_scores = np.tile(np.array([0.0] + [-np.inf] * (k - 1)), [batch, 1])  # one start per row
    alive = np.zeros([batch, k, 0], np.int64)
    finished = [[] for _ in range(batch)]  # (score, log_prob, ids)
    done = np.zeros([batch], bool)
    limit = int(max_new_tokens)
    best_possible = length_penalty(limit, alpha)
    steps = 0
    for t in range(limit):
        candidates = (alive_scores[:, :, None] + log_probs.reshape(batch, k, vocab)).reshape(batch, k * vocab)
        order = _top(candidates, 2 * k)
        new_scores = np.full([batch, k], -np.inf)
        new_alive = np.zeros([batch, k, t + 1], np.int64)
        sources = np.tile(np.arange(k), [batch, 1])
        for row in range(batch):
            if done[row]:
                continue
            filled = 0
            for flat in order[row]:
                score = candidates[row, flat]
                if not np.isfinite(score):
                    break
                beam, token = divmod(int(flat), vocab)
                if token == end_id:
                    finished[row].append((score / length_penalty(t + 1, alpha), score,
                                          alive[row, beam].copy()))
                elif filled < k:
                    new_scores[row, filled] = score
                    new_alive[row, filled, :t] = alive[row, beam]
                    new_alive[row, filled, t] = token
                    sources[row, filled] = beam
                    filled += 1
            finished[row].sort(key=lambda item: -item[0])
            del finished[row][k:]
            if len(finished[row]) == k and new_scores[row, 0] / best_possible <= finished[row][-1][0]:
                done[row] = True
        alive_scores, alive = new_scores, new_alive
        if done.all() or t + 1 == limit:
            break
        rows = (np.arange(batch)[:, None] * k + sources).reshape(-1)
        state = reorder(state, rows)
        log_probs, state = step(alive[:, :, -1].reshape(-1), state)
        log_probs = _forbid(_check_common(log_probs, max_new_tokens, end_id), forbidden_ids)
        steps += 1
    ids, scores, totals = [], np.zeros([batch]), np.zeros([batch])
    for row in range(batch):
        pool = list(finished[row])
        if not done[row]:  # out of steps: the live hypotheses compete as they are
            length = alive.shape[-1]
            pool += [(alive_scores[row, b] / length_penalty(length, alpha), alive_scores[row, b],
                      alive[row, b]) for b in range(k) if np.isfinite(alive_scores[row, b])]
        score, total, hypothesis = max(pool, key=lambda item: item[0])
        ids.append(np.asarray(hypothesis, np.int64))
        scores[row], totals[row] = score, total
    return SearchResult(ids, scores, totals, steps)
