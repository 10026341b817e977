"""The float16 rules of `make test-edge`: GPU logits computed in half precision against float32 ones.

float16 has 11 significant bits: a GPU file run in half precision moves every logit by about 1e-3 of
the largest |logit| (measured on the emulated GPUs: 1e-3 to 3e-3). Where the float32 top two are
closer than that, either token may win, and which one does depends on how the GPU (here the CPU
under lavapipe/llvmpipe, with or without AVX-512 and FMA) rounds. So the argmax is judged pooled
over hundreds of tokens, never all-or-nothing on a few, and near-ties are counted and reported.
"""

import numpy as np

# The float16 rule (see close_in_half_precision): relative error bound, pooled argmax agreement and
# the number of real tokens it is pooled over.
HALF_ERROR = 2e-2
HALF_AGREEMENT = 0.99
HALF_MIN_TOKENS = 200


def near_ties(reference, error):
    """Tokens whose float32 top-2 margin is at most `2 * error`: there float16 rounding alone may
    pick either of the two (each logit moved by up to `error`), so an argmax flip means nothing."""
    top = np.sort(np.asarray(reference, np.float64), axis=-1)
    return top[:, -1] - top[:, -2] <= 2 * error


def close_in_half_precision(half, reference, real):
    """The float16-GPU logits `half` against the float32 CPU logits `reference` `[..., T, vocab]`.

    On the rows of the real tokens (`real`, a bool mask or index over the leading axes), pooled
    over every row given:
    - all finite;
    - max |half - reference| within `HALF_ERROR` (2e-2) of the reference's max |x| (measured on
      the emulated GPUs: 1e-3 to 3e-3, float16 has 11 significant bits);
    - the same argmax for at least `HALF_AGREEMENT` (99 %) of the real tokens, counted over at
      least `HALF_MIN_TOKENS` (200) of them: over a handful of tokens a single near-tie decides
      the verdict (one flip in a 24-token row is 95.8 %), over hundreds a systematic shift shows.
    Near-ties (float32 top-2 margin <= twice the measured max |half - reference|, where rounding
    alone may pick either token) are counted and printed with how many of them flipped; no flip
    can happen outside them while the error bound holds. Returns the relative error and the
    agreement, and prints the figures (`pytest -s` shows them).
    """
    real = np.asarray(real)
    half = np.asarray(half, np.float64)[real].reshape(-1, np.shape(half)[-1])
    reference = np.asarray(reference, np.float64)[real].reshape(-1, np.shape(reference)[-1])
    assert len(reference) >= HALF_MIN_TOKENS, (
        f"float16 argmax judged on {len(reference)} real tokens: pool at least {HALF_MIN_TOKENS}")
    assert np.isfinite(half).all(), "non-finite logits in float16"
    scale = np.max(np.abs(reference))
    difference = float(np.max(np.abs(half - reference)))
    error = difference / scale
    same = half.argmax(-1) == reference.argmax(-1)
    agreement = float(np.mean(same))
    ties = near_ties(reference, difference)
    print(f"float16: max |dx| / max |x| = {error:.2e}, argmax agreement {agreement:.2%} of {len(half)} "
          f"tokens; {int(ties.sum())} near-ties, {int((~same & ties).sum())} of them flipped")
    assert error <= HALF_ERROR, f"float16 logits {error:.3g} (relative to max |x|) from the float32 ones"
    assert agreement >= HALF_AGREEMENT, (
        f"float16 argmax agrees on {agreement:.1%} of {len(half)} real tokens ({int(ties.sum())} near-ties)")
    return error, agreement


def check_half_generation(half_ids, half_logits, ids, reference):
    """float16 greedy generation against float32's: the two paths compared up to where they part.

    `half_ids`/`half_logits` `[N]`/`[N, vocab]`: the float16 run's tokens and the logits that chose
    them; `ids`/`reference`: the float32 ones. Until the first differing token both runs fed the same
    tokens, so their logits at those steps (the differing one included) must be finite and within
    `HALF_ERROR` of the reference's max |x|. Where they part, the float32 logits must be a near-tie
    at that step (rounding's choice); that step and the tokens agreed before it are printed. After
    it the prefixes differ and nothing is compared. Returns the number of agreeing tokens.
    """
    half_logits, reference = np.asarray(half_logits, np.float64), np.asarray(reference, np.float64)
    assert np.isfinite(half_logits).all(), "non-finite logits in float16"
    differ = [step for step, (a, b) in enumerate(zip(half_ids, ids)) if a != b]
    agreed = differ[0] if differ else min(len(half_ids), len(ids))
    steps = min(agreed + 1, len(half_logits), len(reference))
    difference = float(np.max(np.abs(half_logits[:steps] - reference[:steps])))
    error = difference / float(np.max(np.abs(reference[:steps])))
    print(f"float16 generation: {agreed} of {len(ids)} greedy tokens as in float32, "
          f"max |dx| / max |x| = {error:.2e} over those steps")
    assert error <= HALF_ERROR, f"float16 logits {error:.3g} (relative to max |x|) from the float32 ones"
    if differ and agreed < len(reference):
        assert near_ties(reference[agreed:agreed + 1], difference)[0], (
            f"float16 generation parts from float32 at token {agreed} where float32 has a clear winner")
    return agreed
