"""`keras-posenc ablate`: the position-encoding ablation and length-extrapolation report."""

import dataclasses
import json
import os

import numpy as np
import pytest
from stacks import once_on_keras2

from keras_posenc.app import ablation, cli
from keras_posenc.app import dataset as data

QUICK_VARIANTS = tuple(ablation.VARIANTS)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


quick_run_once = once_on_keras2(
    "the quick report's files and statistics; run_ablation's training and evaluation run on both in "
    "test_integer_at_scale_zero_trains_exactly_like_none, attention_by_distance in test_diagnostics")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ablation"))
    assert cli.main(["ablate", "--quick", "--out", out]) == 0
    with open(os.path.join(out, "ablation.json")) as f:
        return out, json.load(f)


@quick_run_once
def test_quick_cli_writes_every_file(quick_run):
    out, results = quick_run
    for name in ("ablation.md", "ablation.json"):
        assert os.path.getsize(os.path.join(out, name)) > 100
    for name in ("loss_curves.png", "extrapolation.png", "attention_focus.png"):
        with open(os.path.join(out, name), "rb") as f:
            content = f.read()
        assert content.startswith(PNG_SIGNATURE) and len(content) > 5000, name
    assert results["command"] == f"keras-posenc ablate --quick --out {out}"
    assert tuple(results["variants"]) == QUICK_VARIANTS


@quick_run_once
def test_quick_results_cover_every_variant_seed_and_length(quick_run):
    _, results = quick_run
    t = ablation.QUICK.max_length
    assert [t, 2 * t, 4 * t] == ablation.QUICK.eval_lengths
    for name, entry in results["variants"].items():
        assert [run["seed"] for run in entry["runs"]] == list(ablation.QUICK.seeds)
        for run in entry["runs"]:
            assert len(run["losses"]) == ablation.QUICK.steps
            assert np.isfinite(run["eval"][str(t)])
            for length in (2 * t, 4 * t):
                value = run["eval"][str(length)]
                if name == "learned":
                    assert value == ablation.CANNOT_EXTRAPOLATE
                else:
                    assert np.isfinite(value)
        summary = entry["summary"]["eval"][str(4 * t)]
        if name == "learned":
            assert summary == "cannot extrapolate"
        else:
            values = [run["eval"][str(4 * t)] for run in entry["runs"]]
            np.testing.assert_allclose(summary, [np.mean(values), np.std(values, ddof=1)], rtol=1e-12)


@quick_run_once
def test_markdown_table_has_a_row_per_variant(quick_run):
    out, results = quick_run
    with open(os.path.join(out, "ablation.md")) as f:
        text = f.read()
    assert "keras-posenc ablate --quick" in text
    for name in QUICK_VARIANTS:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        cells = row.strip("|").split("|")
        assert len(cells) == 7  # variant, train, @T, @2T, @4T, then @2T and @4T past T
        if name == "learned":
            assert [c.strip() for c in cells[3:]] == ["cannot extrapolate"] * 4
        mean, std = results["variants"][name]["summary"]["eval"][str(ablation.QUICK.max_length)]
        assert cells[2].strip() == f"{mean:.3f} ± {std:.3f}"


@quick_run_once
def test_factorized_table_gives_the_full_table_results(quick_run):
    # Equal by construction: the factorized table is the full table to float32 rounding.
    _, results = quick_run
    full, factorized = (results["variants"][n]["runs"] for n in ("sinusoidal", "sinusoidal-factorized"))
    for a, b in zip(full, factorized):
        np.testing.assert_allclose(a["losses"], b["losses"], atol=1e-5)
        for key in a["eval"]:
            np.testing.assert_allclose(a["eval"][key], b["eval"][key], atol=1e-5)


@quick_run_once
def test_positions_below_the_training_length_do_not_depend_on_the_evaluated_length(quick_run):
    # Causal mask: position p sees only positions <= p, so the first T losses of a 4T window are
    # those of the T window with the same start; only the positions past T can differ. NTK, YaRN and
    # llama3 change every frequency when evaluated past T (scaling factor L / T), so they are left out.
    _, results = quick_run
    t = ablation.QUICK.max_length
    rescaled = {"rope-ntk", "rope-yarn", "rope-llama3"}
    for name, entry in results["variants"].items():
        for run in entry["runs"]:
            short = run["position_losses"][str(t)]
            if name != "learned" and name not in rescaled:
                np.testing.assert_allclose(run["position_losses"][str(4 * t)][:t], short, atol=1e-5)
                beyond = np.mean(run["position_losses"][str(4 * t)][t:])
                np.testing.assert_allclose(run["beyond_train_length"][str(4 * t)], beyond, rtol=1e-12)


@quick_run_once
def test_attention_by_distance_is_a_mean_over_rows_that_sum_to_one(quick_run):
    _, results = quick_run
    t = ablation.QUICK.max_length
    pairs_at_distance = t - np.arange(t)
    for entry in results["variants"].values():
        for run in entry["runs"]:
            weights = np.asarray(run["attention_by_distance"])
            assert weights.shape == (t,)
            np.testing.assert_allclose(np.sum(weights * pairs_at_distance), t, rtol=1e-5)
    uniform = np.asarray(results["uniform_attention_by_distance"])
    np.testing.assert_allclose(np.sum(uniform * pairs_at_distance), t, rtol=1e-12)


def test_uniform_baseline_matches_brute_force():
    t = 5
    weights = np.tril(np.ones([t, t])) / np.arange(1, t + 1)[:, None]
    expected = [np.mean(np.diagonal(weights, offset=-d)) for d in range(t)]
    np.testing.assert_allclose(ablation.uniform_attention_by_distance(t), expected, rtol=1e-12)


def test_integer_at_scale_zero_trains_exactly_like_none(monkeypatch):
    monkeypatch.setitem(ablation.VARIANTS, "integer-0",
                        ("integer, scale 0", lambda c: {"position": "integer", "scale": 0.0}))
    config = dataclasses.replace(ablation.QUICK, seeds=(3,), variants=("none", "integer-0"),
                                 eval_multiples=(1, 2))
    results = ablation.run_ablation(None, config, log=lambda line: None)
    none, zero = (results["variants"][n]["runs"][0] for n in ("none", "integer-0"))
    assert none["losses"] == zero["losses"]
    assert none["eval"] == zero["eval"]


def test_joined_windows_chain_consecutive_lines():
    lines = ["a", "b c", "d", "e f g"]
    counts = [1, 2, 1, 3]
    assert ablation.joined_windows(lines, counts, 3) == ["a b c", "b c d", "d e f g", "e f g"]
    assert ablation.joined_windows(lines, counts, 4, max_windows=2) == ["a b c d", "d e f g"]
    assert ablation.joined_windows(lines, counts, 8) == []


def test_too_small_corpus_is_a_clear_error(tmp_path):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("\n".join(data.read_text_corpus(data.default_corpus_path())[:40]))
    config = dataclasses.replace(ablation.QUICK, max_length=512, max_train_lines=None)
    match = r"too small for the ablation: .* at least 515 pieces for training and 2051"
    with pytest.raises(data.CorpusError, match=match):
        ablation.prepare_data(str(corpus), config)


@pytest.mark.parametrize("kwargs, match", [
    ({"variants": ("sinusoidal", "t5-bias")}, r"`variants` must be a non-empty subset of .*'t5-bias'"),
    ({"variants": ()}, r"`variants` must be a non-empty subset"),
    ({"steps": 0}, r"`steps` must be a positive int, got steps=0"),
    ({"seeds": ()}, r"`seeds` must be a non-empty list of ints"),
    ({"eval_multiples": (1, 0)}, r"`eval_multiples` must be positive ints"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(ablation.QUICK, **kwargs)


def test_cli_rejects_an_unknown_variant(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ablate", "--quick", "--variants", "t5-bias"])
    assert exit_info.value.code == 2
    assert "invalid choice: 't5-bias'" in capsys.readouterr().err


@pytest.mark.parametrize("causal", [True, False])
def test_unmasked_model_sees_the_future_token_and_the_causal_one_does_not(causal):
    config = dataclasses.replace(ablation.QUICK, causal=causal, dropout=0.0)
    model = ablation.build_model(config, 30, "sinusoidal")
    assert model.causal is causal and model.get_config()["causal"] is causal
    ids = np.array([[2, 7, 8, 9]], np.int32)
    changed = ids.copy()
    changed[0, 1] = 20  # the next-token target of position 0
    delta = np.abs(model(ids).numpy()[0, 0] - model(changed).numpy()[0, 0]).max()
    assert (delta == 0.0) if causal else (delta > 1e-4)
