"""`keras-posenc ablate --task translate`: seed 002's claims as paired arms, scored in BLEU."""

import json
import os
import shutil

import numpy as np
import pytest
import sentencepiece as spm
from stacks import once_on_keras2

from keras_posenc.app import cli
from keras_posenc.app import dataset as data_lib
from keras_posenc.app import translation_ablation as ta
from keras_posenc.backend import keras
from keras_posenc.special_ids import PAD_ID

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "debian_po_en_de")
QUICK_ARMS = ["base", "pad-not-zeroed", "norm-over-positions"]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    for split in ("train", "test"):
        shutil.copy(os.path.join(DATA, f"debian_po_en_de_{split}_slice.tsv"), folder / f"{split}.tsv")
    return str(folder)


@pytest.fixture(scope="module")
def tiny(corpus_dir):
    pairs = data_lib.load_corpus(os.path.join(corpus_dir, "train.tsv"), "tsv")
    sp_model = data_lib.train_sentencepiece(data_lib.corpus_texts(pairs), 200)
    return pairs, sp_model, spm.SentencePieceProcessor(model_proto=sp_model)


# Word shuffling (claim c) ---------------------------------------------------------------------------
def test_shuffle_words_keeps_the_first_and_last_words_and_the_words():
    sentences = [f"w{i} " + " ".join(f"x{i}{j}" for j in range(6)) + f" end{i}" for i in range(40)]
    sentences += ["too short", "one two three"]
    shuffled = ta.shuffle_words(sentences, fraction=0.1, seed=3)
    changed = [i for i, (a, b) in enumerate(zip(sentences, shuffled)) if a != b]
    assert len(changed) == round(0.1 * len(sentences)) == 4
    for i in changed:
        before, after = sentences[i].split(), shuffled[i].split()
        assert (after[0], after[-1]) == (before[0], before[-1])
        assert sorted(after) == sorted(before) and after != before
    assert shuffled[-2:] == sentences[-2:]  # under four words: nothing to shuffle
    assert ta.shuffle_words(sentences, 0.1, seed=3) == shuffled
    assert ta.shuffle_words(sentences, 0.1, seed=4) != shuffled


def test_shuffle_words_draws_only_among_sentences_that_can_change():
    sentences = ["a b", "c d e f g", "h i"]
    assert ta.shuffle_words(sentences, fraction=1.0, seed=0)[0::2] == ["a b", "h i"]
    assert ta.shuffle_words(sentences, fraction=0.0, seed=0) == sentences
    assert ta.shuffle_words(["a b b c"], fraction=1.0, seed=0) == ["a b b c"]  # one order only


# The article's layer normalization (claim b) -----------------------------------------------------------
def test_position_axis_normalization_against_numpy():
    x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype(np.float32) * 3 + 1
    layer = ta._PositionAxisNormalization(1e-6)
    layer.build(x.shape)
    layer.gamma.assign(np.array([1.0, 2.0, 0.5, -1.0], np.float32))
    layer.beta.assign(np.array([0.0, 1.0, -1.0, 0.25], np.float32))
    x64 = x.astype(np.float64)
    expected = (x64 - x64.mean(axis=1, keepdims=True)) / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-6)
    expected = expected * np.array([1.0, 2.0, 0.5, -1.0]) + np.array([0.0, 1.0, -1.0, 0.25])
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5, atol=1e-5)


def test_the_norm_arm_normalizes_every_block_over_positions():
    config = ta.QUICK
    model = ta.build_model(config, 200, "norm-over-positions")
    norms = [getattr(layer, name) for layer in [*model.encoder.encoder_layers, *model.decoder_layers]
             for name in ta._NORMS if hasattr(layer, name)]
    assert len(norms) == 2 * config.num_layers + 3 * config.num_layers
    assert all(isinstance(norm, ta._PositionAxisNormalization) for norm in norms)
    base = ta.build_model(config, 200, "base")
    assert not any(isinstance(layer.ffn_norm, ta._PositionAxisNormalization)
                   for layer in base.decoder_layers)


def test_arms_build_the_models_they_describe():
    config = ta.TranslationAblationConfig()
    assert ta.build_model(config, 300, "base").position == "sinusoidal"
    assert ta.build_model(config, 300, "learned").position == "learned"
    assert ta.build_model(config, 300, "no-language-scale").language_scale is False
    assert ta.build_model(config, 300, "base").language_scale is True
    assert ta.build_model(config, 300, "compressed").position_config == {"table": "interpolated",
                                                                         "stored_dims": 16}
    assert ta.build_model(config, 300, "pad-not-zeroed").position_config == {"zero_padding": False}
    assert ta.build_model(config, 300, "pe-dropout").position_config == {"dropout": 0.1}


# Decoding and the attention probe ---------------------------------------------------------------------
def test_greedy_translate_equals_the_models_cached_greedy(tiny):
    pairs, _, processor = tiny
    keras.utils.set_random_seed(1)
    model = ta.build_model(ta.QUICK, processor.get_piece_size(), "base")  # untrained: outputs vary by source
    sources = [s for s, _ in pairs[400:430]]
    model({"source_ids": np.array([[7, 3]]), "target_ids": np.array([[2]])})
    # Wide logit gaps: the full pass and the cached step round differently, so no near-tie may decide.
    model.head.kernel.assign(model.head.kernel * 40.0)
    ours = ta.greedy_translate(model, processor, sources, batch_size=7, max_new_tokens=12)
    rows = ta.source_ids(processor, sources, model.max_length)
    cached = []
    for row in rows:
        ids = model.translate(row[None], max_new_tokens=12, beam_size=1).ids[0]
        cached.append(processor.decode([int(t) for t in ids]))
    assert ours == cached
    assert len(set(ours)) > 1


@pytest.mark.parametrize("arm", ["base", "pad-not-zeroed"])
def test_no_attention_reaches_padding(tiny, arm):
    _, _, processor = tiny
    model = ta.build_model(ta.QUICK, processor.get_piece_size(), arm)
    batch = np.array([[7, 8, 9, 3, PAD_ID, PAD_ID], [7, 8, 9, 10, 11, 3]], np.int32)
    model({"source_ids": batch, "target_ids": batch[:, :2]})
    assert ta.attention_on_padding(model, batch) == [0.0] * ta.QUICK.num_layers
    # Without a padding row the probe has nothing to measure on padding: zero as well.
    assert ta.attention_on_padding(model, batch[1:]) == [0.0] * ta.QUICK.num_layers


# Verdicts ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, differences, expected", [
    ("norm-axis", [-3.0, -2.0, -4.0], "agrees in sign (smaller)"),
    ("norm-axis", [-15.0, -16.0, -17.0], "agrees in sign (a similar size)"),
    ("padding", [4.0, 3.5, 5.0], "agrees in sign (larger)"),
    ("padding", [-1.0, -0.6, -0.8], "does not agree: the opposite sign"),
    ("padding", [1.0, -0.2, 0.9], "does not agree: no effect beyond seed noise"),
    ("padding", [0.3, 0.4, 0.2], "does not agree: no effect beyond seed noise"),
    ("padding", [0.0, 0.0, 0.0], "does not agree: no difference in any seed"),
    ("compressed", [0.0, 0.0, 0.0], "agrees: no effect beyond seed noise"),
    ("compressed", [-0.6, -0.7, -0.5], "does not agree: an effect of -0.60 BLEU"),
    ("compressed", [-0.5, -0.5, -0.5], "does not agree: an effect of -0.50 BLEU"),  # the bound is an effect
])
def test_verdicts(key, differences, expected):
    claim = next(c for c in ta.CLAIMS if c.key == key)
    assert ta.verdict(claim, differences) == expected


def test_claims_are_paired_arms_with_the_articles_numbers():
    by_key = {claim.key: claim for claim in ta.CLAIMS}
    assert by_key["norm-axis"].article_effect == pytest.approx(12.1 - 27.9)
    assert by_key["pe-dropout"].article_effect == pytest.approx(8.7 - 2.3)
    assert by_key["learned-long"].metric == "long" and by_key["pe-dropout"].metric == "shuffled_drop"
    assert all(claim.treatment in ta.ARMS and claim.control in ta.ARMS for claim in ta.CLAIMS)


def test_config_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"`arms` must be a non-empty subset .*arms=\('rope',\)"):
        ta.TranslationAblationConfig(arms=("rope",))
    with pytest.raises(ValueError, match="train_length_cap=64"):
        ta.TranslationAblationConfig(train_length_cap=64)
    with pytest.raises(ValueError, match="shuffle_fraction"):
        ta.TranslationAblationConfig(shuffle_fraction=1.5)
    with pytest.raises(ValueError, match="seeds"):
        ta.TranslationAblationConfig(seeds=())


# The command ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_run(corpus_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ablation") / "run")
    code = cli.main(["ablate", "--task", "translate", "--quick", "--corpus-dir", corpus_dir, "--arms",
                     *QUICK_ARMS, "--out", out])
    assert code == 0
    with open(os.path.join(out, "translation_ablation.json"), encoding="utf-8") as f:
        return out, json.load(f)


@once_on_keras2("the arms train through Seq2SeqTransformer, whose training runs on both stacks in "
                "tests/test_translate.py")
def test_quick_run_writes_the_report(quick_run):
    out, results = quick_run
    for name in ("translation_ablation.md", "bleu_by_length.png", "claims.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    assert sorted(results["arms"]) == sorted(QUICK_ARMS)
    assert [row["key"] for row in results["claims"]] == ["padding", "norm-axis"]
    assert results["corpus"]["test_pairs"] == ta.QUICK.max_test_sentences
    for arm, entry in results["arms"].items():
        assert [run["seed"] for run in entry["runs"]] == list(ta.QUICK.seeds)
        for run in entry["runs"]:
            path = os.path.join(out, "translations", f"{arm}.seed{run['seed']}.txt")
            with open(path, encoding="utf-8") as f:
                assert len(f.read().splitlines()) == ta.QUICK.max_test_sentences
    with open(os.path.join(out, "translation_ablation.md"), encoding="utf-8") as f:
        text = f.read()
    assert "keras-posenc ablate --task translate --quick" in text and "(a) position encoding zeroed" in text


@once_on_keras2("as test_quick_run_writes_the_report")
def test_padding_encodings_never_reach_a_real_token(quick_run):
    """Zeroing the encoding at padding changes no real token's output, so no translation: claim (a)."""
    _, results = quick_run
    row = results["claims"][0]
    assert row["identical_translations"] == len(ta.QUICK.seeds)
    assert row["differences"] == [0.0] * len(ta.QUICK.seeds)
    assert row["attention_on_padding"]["base"] == [0.0, 0.0]
    assert row["verdict"] == "does not agree: no difference in any seed"


@once_on_keras2("argument checks before any model is built")
@pytest.mark.parametrize("extra, message", [
    (["--variants", "rope"], "--variants is for --task lm"),
    (["--no-causal-mask"], "--no-causal-mask is for --task lm"),
    (["--corpus", "x.txt"], "--corpus is for --task lm"),
])
def test_lm_flags_are_refused_for_translate(extra, message, corpus_dir, tmp_path, capsys):
    assert cli.main(["ablate", "--task", "translate", "--corpus-dir", corpus_dir,
                     "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@once_on_keras2("argument checks before any model is built")
def test_missing_corpus_is_one_line(tmp_path, capsys):
    assert cli.main(["ablate", "--task", "translate", "--corpus-dir", str(tmp_path), "--out",
                     str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"--corpus-dir {tmp_path} has no train.tsv: run `make corpus`" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@once_on_keras2("argument checks before any model is built")
def test_arms_are_refused_for_the_lm_ablation(tmp_path, capsys):
    assert cli.main(["ablate", "--arms", "base", "--out", str(tmp_path / "o")]) == 2
    assert "--arms is for --task translate." in capsys.readouterr().err
