"""The samplers' properties, on the package's (`keras_posenc.generation.sample_next`, what
`CausalLM.generate` and `keras-posenc generate` draw with) and on the device kit's
(`export/jetson/run_generate.py`'s `sample`): top-k 1 is greedy, top-k and top-p draw only within
their candidates and reach each of them, and a seed repeats its draws (tests/user_checks.py)."""

import os
import sys

import numpy as np
import pytest
from user_checks import SAMPLER_LOGITS, assert_sampler_properties

from keras_posenc.generation import SAMPLERS, sample_next

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "export", "jetson"))
import run_generate  # noqa: E402  (the kit's modules import each other by name)


def package_draws(logits, sampler, seed, count, k=None, p=None, temperature=1.0):
    """`count` ids, each from its own `sample_next` call on one generator (as `generate` draws)."""
    rng = np.random.default_rng(seed)
    return [
        int(sample_next(logits[None], sampler, temperature=temperature, k=k, p=p, rng=rng)[0])
        for _ in range(count)
    ]


def package_batch_draws(logits, sampler, seed, count, k=None, p=None, temperature=1.0):
    """`count` ids from one `sample_next` call on a batch of `count` equal rows."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.asarray(logits)[None], count, axis=0)
    return [int(i) for i in sample_next(rows, sampler, temperature=temperature, k=k, p=p, rng=rng)]


def kit_draws(logits, sampler, seed, count, k=None, p=None, temperature=1.0):
    rng = np.random.default_rng(seed)
    return [run_generate.sample(logits, rng, sampler, temperature, k, p) for _ in range(count)]


@pytest.mark.parametrize(
    "draws", [package_draws, package_batch_draws, kit_draws], ids=["package", "package-batch", "kit"]
)
def test_sampler_properties(draws):
    assert_sampler_properties(draws)


@pytest.mark.parametrize("draws", [package_draws, kit_draws], ids=["package", "kit"])
def test_sampler_properties_with_ties_and_a_masked_id(draws):
    """Equal logits stay candidates in id order (a stable sort), and a -inf id (the pad id, which
    both generators mask) is never drawn, even where top-k would reach past the finite ids."""
    logits = np.array([1.0, 2.0, 2.0, -np.inf, 0.5])
    assert set(draws(logits, "top_k", 0, 200, k=1)) == {1}
    assert set(draws(logits, "top_k", 0, 300, k=2)) == {1, 2}
    assert 3 not in set(draws(logits, "top_k", 0, 300, k=5))
    assert 3 not in set(draws(logits, "top_p", 0, 300, p=1.0))


def test_the_package_and_the_kit_draw_the_same_ids_from_the_same_seed():
    """A device run with --seed S draws what `keras-posenc generate --seed S` draws from equal logits."""
    for sampler, options in (("top_k", {"k": 3}), ("top_p", {"p": 0.8}), ("greedy", {})):
        assert package_draws(SAMPLER_LOGITS, sampler, 5, 40, **options) == kit_draws(
            SAMPLER_LOGITS, sampler, 5, 40, **options
        )


def test_the_samplers_named_are_those_the_kit_takes():
    """`keras-posenc generate --sampler` and the kit's `--sampler` take the same names."""
    args = run_generate.parse_args(["m.tflite", "--prompt-ids", "1", "--sampler", "top_k", "--top-k", "1"])
    assert args.sampler == "top_k"
    parser_choices = {"greedy", "top_k", "top_p"}
    assert set(SAMPLERS) == parser_choices
    for sampler in SAMPLERS:
        extra = {"top_k": ["--top-k", "2"], "top_p": ["--top-p", "0.5"]}.get(sampler, [])
        assert (
            run_generate.parse_args(["m.tflite", "--prompt-ids", "1", "--sampler", sampler, *extra]).sampler
            == sampler
        )
