"""keras_posenc.beam_search at its limits, on numpy stand-in models: the argument checks at their
boundaries, what a search returns (ids without the end token, scores, totals, step calls), forbidden
ids, batch rows that finish at different steps, and a beam's early stop. The exhaustive optimum of a
beam as wide as the search space: tests/test_seq2seq.py."""

import numpy as np
import pytest
from user_checks import assert_first_refused, assert_lowest_accepted, refuses

from keras_posenc.beam_search import beam_search, greedy_search, length_penalty


def markov(seed, vocab):
    return np.log(np.random.default_rng(seed).dirichlet(np.ones(vocab), size=vocab))


def chain(table):
    """A model whose next token depends on the last one only; it counts its step calls."""
    calls = []

    def step(tokens, state):
        calls.append(np.asarray(tokens).copy())
        return table[np.asarray(tokens)], state

    return step, calls


def test_length_penalty():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(7, 1.0) == 2.0
    np.testing.assert_allclose(length_penalty(np.array([1, 4]), 0.5), [1.0, np.sqrt(1.5)])


def test_the_argument_checks_at_their_boundaries():
    first = np.log(np.full([1, 4], 0.25))
    step, _ = chain(np.log(np.full([4, 4], 0.25)))

    def greedy_accepts(**given):
        options = {"max_new_tokens": 2, "end_id": 0, **given}
        return not refuses(lambda: greedy_search(first, None, step, **options))

    def beam_accepts(**given):
        options = {"beam_size": 2, "max_new_tokens": 2, "end_id": 0, "alpha": 0.6, **given}
        return not refuses(lambda: beam_search(first, None, step, lambda s, r: s, **options))

    assert_lowest_accepted(lambda n: greedy_accepts(max_new_tokens=n), 1)
    assert_first_refused(lambda e: greedy_accepts(end_id=e), 4)
    assert_lowest_accepted(lambda e: greedy_accepts(end_id=e), 0)
    assert_lowest_accepted(lambda k: beam_accepts(beam_size=k), 1)
    assert_lowest_accepted(lambda n: beam_accepts(max_new_tokens=n), 1)
    assert_first_refused(lambda e: beam_accepts(end_id=e), 4)
    assert beam_accepts(alpha=0.0) and not beam_accepts(alpha=-1e-9) and not beam_accepts(alpha=float("nan"))
    for bad in (True, 2.0, "2"):
        assert not greedy_accepts(max_new_tokens=bad) and not beam_accepts(beam_size=bad)
    assert greedy_accepts(max_new_tokens=np.int64(2)) and beam_accepts(beam_size=np.int32(2))
    with pytest.raises(ValueError, match=r"`log_probs` must have shape \[batch, vocab\], got shape \(4,\)"):
        greedy_search(first[0], None, step, max_new_tokens=2, end_id=0)
    with pytest.raises(ValueError, match=r"got max_new_tokens=0\."):
        greedy_search(first, None, step, max_new_tokens=0, end_id=0)
    with pytest.raises(ValueError, match=r"`end_id` must lie in \[0, vocab=4\), got end_id=-1\."):
        greedy_search(first, None, step, max_new_tokens=2, end_id=-1)
    with pytest.raises(ValueError, match=r"got beam_size=0\."):
        beam_search(first, None, step, None, beam_size=0, max_new_tokens=2, end_id=0)
    with pytest.raises(ValueError, match=r"must be >= 0, got alpha=-1\."):
        beam_search(first, None, step, None, beam_size=2, max_new_tokens=2, end_id=0, alpha=-1)


def test_a_step_s_log_probs_are_checked_too():
    first = np.log(np.full([1, 3], 1 / 3))
    first[0, 1] = 0.0

    def bad_step(tokens, state):
        return np.zeros([3]), state

    with pytest.raises(ValueError, match="must have shape"):
        greedy_search(first, None, bad_step, max_new_tokens=3, end_id=0)


def test_greedy_returns_the_argmax_chain_its_log_probability_and_its_steps():
    table = markov(3, 5)
    step, calls = chain(table)
    first = table[[1, 2]]
    result = greedy_search(first, None, step, max_new_tokens=6, end_id=0)
    for row in range(2):
        expected, total, logp = [], 0.0, first[row]
        for _ in range(6):
            token = int(np.argmax(logp))
            total += logp[token]
            if token == 0:
                break
            expected.append(token)
            logp = table[token]
        assert result.ids[row].tolist() == expected and result.ids[row].dtype == np.int64
        np.testing.assert_allclose(result.log_probs[row], total, rtol=1e-12)
    np.testing.assert_array_equal(result.scores, result.log_probs)
    assert result.scores is not result.log_probs
    assert result.steps == len(calls) and 1 <= result.steps <= 5
    assert all(c.dtype == np.int64 for c in calls)


def test_greedy_rows_that_end_early_wait_with_the_end_token():
    table = np.log(np.full([4, 4], 0.01))
    table[:, 0] = np.log(0.97)  # after any token: the end
    table[3, 0], table[3, 3] = np.log(0.01), np.log(0.97)  # except after 3: 3 again
    table[0, 0], table[0, 2] = np.log(0.01), np.log(0.97)  # and after the end: 2 (never fed)
    step, calls = chain(table)
    first = table[[1, 3]]  # row 0 ends at once, row 1 repeats 3
    result = greedy_search(first, None, step, max_new_tokens=4, end_id=0)
    assert [ids.tolist() for ids in result.ids] == [[], [3, 3, 3, 3]]
    assert [c.tolist() for c in calls] == [[0, 3], [0, 3], [0, 3]]  # the ended row is fed the end token
    np.testing.assert_allclose(result.log_probs, [np.log(0.97), 4 * np.log(0.97)])
    assert result.steps == 3


def test_greedy_stops_calling_the_model_when_every_row_ended():
    table = np.log(np.full([3, 3], 0.1))
    table[:, 0] = np.log(0.8)
    step, calls = chain(table)
    result = greedy_search(np.log([[0.1, 0.8, 0.1]]), None, step, max_new_tokens=10, end_id=0)
    assert result.ids[0].tolist() == [1] and result.steps == 1 and len(calls) == 1


@pytest.mark.parametrize("beam_size", [1, 3])
def test_forbidden_ids_are_never_chosen(beam_size):
    table = np.log(np.full([4, 4], 0.05))
    table[:, 2] = np.log(0.85)  # 2 is always the most likely
    step, _ = chain(table)
    first = table[[1]]
    result = beam_search(
        first, None, step, lambda s, r: s, beam_size=beam_size, max_new_tokens=5, end_id=0, forbidden_ids=(2,)
    )
    assert 2 not in result.ids[0].tolist()
    unforbidden = beam_search(
        first, None, step, lambda s, r: s, beam_size=beam_size, max_new_tokens=5, end_id=0
    )
    assert unforbidden.ids[0].tolist() == [2] * 5


def test_a_beam_scores_with_the_length_penalty_and_keeps_the_total():
    table = markov(5, 4)
    step, _ = chain(table)
    for alpha in (0.0, 0.6, 1.5):
        result = beam_search(
            table[[1, 2]], None, step, lambda s, r: s, beam_size=3, max_new_tokens=5, end_id=0, alpha=alpha
        )
        for row in range(2):
            ids = result.ids[row].tolist()
            ended = len(ids) < 5
            tokens = [1 + row] + ids + ([0] if ended else [])
            total = sum(table[a, b] for a, b in zip(tokens, tokens[1:]))
            np.testing.assert_allclose(result.log_probs[row], total, rtol=1e-12)
            penalty = length_penalty(len(ids) + ended, alpha)
            np.testing.assert_allclose(result.scores[row], total / penalty, rtol=1e-12)


def test_a_beam_stops_once_no_live_hypothesis_can_win():
    """Ending is likely (0.9) at every step: the beam's finished hypotheses beat every live one
    after a few steps, so it stops far before max_new_tokens and returns the best ended one."""
    table = np.log(np.full([3, 3], 0.05))
    table[:, 0] = np.log(0.9)
    step, calls = chain(table)
    result = beam_search(
        table[[1]], None, step, lambda s, r: s, beam_size=2, max_new_tokens=50, end_id=0, alpha=0.6
    )
    assert result.ids[0].tolist() == []
    assert result.steps == len(calls) < 5
    np.testing.assert_allclose(result.log_probs[0], np.log(0.9))


def test_a_beam_reorders_the_state_of_the_hypotheses_it_keeps():
    """The state is each hypothesis's history; a step reads it, so a wrong reorder shows in the ids."""
    vocab = 4
    rng = np.random.default_rng(0)
    tables = {}

    def model(history):
        key = tuple(history)
        if key not in tables:
            tables[key] = np.log(rng.dirichlet(np.ones(vocab)))
        return tables[key]

    def step(tokens, histories):
        histories = [h + [int(t)] for h, t in zip(histories, tokens)]
        return np.stack([model(h) for h in histories]), histories

    reorders = []

    def reorder(histories, rows):
        reorders.append(np.asarray(rows).tolist())
        return [list(histories[r]) for r in rows]

    firsts = np.stack([model([100]), model([200])])
    result = beam_search(firsts, [[100], [200]], step, reorder, beam_size=3, max_new_tokens=4, end_id=0)
    assert reorders[0] == [0, 0, 0, 1, 1, 1]  # every row's state repeated beam_size times first
    for row, start in enumerate((100, 200)):
        ids = result.ids[row].tolist()
        tokens = ids + ([0] if len(ids) < 4 else [])
        history, total = [start], firsts[row][tokens[0]]
        for previous, token in zip(tokens, tokens[1:]):
            history.append(previous)
            total += model(history)[token]
        np.testing.assert_allclose(result.log_probs[row], total, rtol=1e-12)


def test_beam_one_is_greedy():
    table = markov(9, 6)
    step, _ = chain(table)
    greedy = greedy_search(table[[1, 4]], None, step, max_new_tokens=7, end_id=0)
    beam = beam_search(table[[1, 4]], None, step, None, beam_size=1, max_new_tokens=7, end_id=0)
    assert [g.tolist() for g in greedy.ids] == [b.tolist() for b in beam.ids]
    np.testing.assert_array_equal(greedy.log_probs, beam.log_probs)


def history_model(seed, vocab):
    """Log-probabilities of the next token given the whole history (drawn once per history)."""
    rng = np.random.default_rng(seed)
    tables = {}

    def model(history):
        key = tuple(history)
        if key not in tables:
            tables[key] = np.log(rng.dirichlet(np.full(vocab, 0.7)))
        return tables[key]

    return model


def reference_beam(model, start, k, limit, end_id, alpha):
    """The documented search, row by row in plain Python: the 2k best extensions in order (ties: the
    lower beam, then the lower token), an ending one finished with its score over the length
    penalty, the others filling the k live beams; a stop once k are finished and the best live
    score over the largest penalty cannot beat the worst of them."""
    vocab = len(model([start]))
    alive, finished, steps = [(0.0, [])], [], 0
    done = False
    for t in range(limit):
        candidates = []
        for beam, (score, tokens) in enumerate(alive):
            log_probs = model([start] + tokens)
            candidates += [
                (score + log_probs[token], beam * vocab + token, beam, token) for token in range(vocab)
            ]
        candidates.sort(key=lambda c: (-c[0], c[1]))
        new_alive = []
        for score, _, beam, token in candidates[: 2 * k]:
            if not np.isfinite(score):
                break
            if token == end_id:
                finished.append((score / length_penalty(t + 1, alpha), score, alive[beam][1]))
            elif len(new_alive) < k:
                new_alive.append((score, alive[beam][1] + [token]))
        finished = sorted(finished, key=lambda f: -f[0])[:k]
        best_live = new_alive[0][0] if new_alive else -np.inf
        done = len(finished) == k and best_live / length_penalty(limit, alpha) <= finished[-1][0]
        alive = new_alive
        if done or t + 1 == limit:
            break
        steps += 1
    pool = list(finished)
    if not done:
        pool += [(score / length_penalty(t + 1, alpha), score, tokens) for score, tokens in alive]
    best = max(pool, key=lambda f: f[0])
    return best[2], best[0], best[1], steps


def reference_greedy(model, start, limit, end_id):
    """The argmax at every step until the end token (kept out of the ids) or `limit` tokens."""
    tokens, total = [], 0.0
    for _ in range(limit):
        log_probs = model([start] + tokens)
        token = int(np.argmax(log_probs))
        total += log_probs[token]
        if token == end_id:
            return tokens, total, total, len(tokens)
        tokens.append(token)
    return tokens, total, total, limit - 1


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.2])
def test_narrow_beams_follow_the_documented_search(k, alpha):
    """Narrow beams (not the exhaustive optimum): each row's hypothesis, score, total and step
    count are the reference's, with a state (each hypothesis's history) the model reads."""
    vocab, limit, end_id = 5, 5, 0
    for seed in range(6):
        model = history_model(seed, vocab)
        starts = [1, 2, 3]
        calls = []

        def step(tokens, histories, calls=calls, model=model):
            calls.append(len(tokens))
            histories = [h + [int(t)] for h, t in zip(histories, tokens)]
            return np.stack([model(h) for h in histories]), histories

        def reorder(histories, rows):
            return [list(histories[r]) for r in rows]

        firsts = np.stack([model([s]) for s in starts])
        result = beam_search(
            firsts,
            [[s] for s in starts],
            step,
            reorder,
            beam_size=k,
            max_new_tokens=limit,
            end_id=end_id,
            alpha=alpha,
        )
        steps = 0
        for row, start in enumerate(starts):
            if k == 1:
                ids, score, total, row_steps = reference_greedy(model, start, limit, end_id)
            else:
                ids, score, total, row_steps = reference_beam(model, start, k, limit, end_id, alpha)
            steps = max(steps, row_steps)
            assert result.ids[row].tolist() == ids, (seed, row)
            assert result.ids[row].dtype == np.int64
            np.testing.assert_allclose(result.log_probs[row], total, rtol=1e-12)
            if k > 1:
                np.testing.assert_allclose(result.scores[row], score, rtol=1e-12)
        assert result.steps == len(calls) == steps, seed


def test_a_row_that_finished_leaves_the_others_searching():
    """Row 0 ends at once (the end is likely after anything), row 1 never ends: row 1 still gets its
    whole hypothesis after row 0 stopped."""
    table = np.log(np.full([4, 4], 0.1))
    table[1, 0] = np.log(0.7)  # after 1: the end
    table[2, 0], table[2, 2] = np.log(0.001), np.log(0.899)  # after 2: 2 again
    step, _ = chain(table)
    result = beam_search(table[[1, 2]], None, step, lambda s, r: s, beam_size=2, max_new_tokens=6, end_id=0)
    assert result.ids[0].tolist() == [] and result.ids[1].tolist() == [2] * 6


def test_the_candidates_are_the_best_in_order_ties_by_index():
    """The 2k extensions a beam considers: the largest scores, largest first, ties by lower index."""
    from keras_posenc.beam_search import _top

    rng = np.random.default_rng(0)
    for _ in range(50):
        scores = rng.normal(size=[3, 40])
        count = int(rng.integers(1, 12))
        scores[:, 30] = scores[:, 7] = scores.max() + 1.0  # a tie among the chosen: index 7 first
        expected = [
            sorted(range(40), key=lambda i, row=row: (-scores[row, i], i))[:count] for row in range(3)
        ]
        assert _top(scores, count).tolist() == expected
    assert _top(np.array([[1.0, 2.0]]), 5).tolist() == [[1, 0]]  # more asked than there are
    # A tie across the boundary: the lower ids take the last places, whatever the partition picks.
    tied = np.array([[0.0, 5.0, 3.0, 5.0, 3.0, 3.0, 3.0, 1.0, 3.0, 3.0]])
    assert _top(tied, 4).tolist() == [[1, 3, 2, 4]]
    assert _top(tied[:, ::-1].copy(), 4).tolist() == [[6, 8, 0, 1]]
    assert _top(np.full([2, 6], -np.inf), 3).tolist() == [[0, 1, 2]] * 2


def test_the_default_length_penalty_is_0_6():
    for seed in range(4):
        model = history_model(seed, 5)
        firsts = np.stack([model([1])])

        def step(tokens, histories, model=model):
            histories = [h + [int(t)] for h, t in zip(histories, tokens)]
            return np.stack([model(h) for h in histories]), histories

        def reorder(histories, rows):
            return [list(histories[r]) for r in rows]

        def search(firsts=firsts, step=step, **alpha):
            return beam_search(firsts, [[1]], step, reorder, beam_size=3, max_new_tokens=5, end_id=0, **alpha)

        np.testing.assert_array_equal(search().scores, search(alpha=0.6).scores)
