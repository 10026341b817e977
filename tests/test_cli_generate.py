"""`keras-posenc generate`: text through the run's tokenizer, the cached generator, JSON, clear errors."""

import json
import re

import numpy as np
import pytest
import sentencepiece as spm

from keras_posenc.app import cli, text_generation
from keras_posenc.app import dataset as data

FLAGS = ["--steps", "4", "--batch-size", "4", "--num-layers", "1", "--d-model", "16", "--num-heads", "2",
         "--dff", "32", "--max-length", "24", "--warmup-steps", "2", "--vocab-size", "24", "--dropout", "0.0",
         "--quiet"]
PROMPT = "the cat sat"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("generate")
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(["the cat sat on the mat", "a dog ran in the park", "we read the book"] * 20),
                      encoding="utf-8")
    out = str(folder / "run")
    assert cli.main(["train", "--corpus", str(corpus), "--out", out] + FLAGS) == 0
    return out


def test_json_output_is_the_models_greedy_continuation(run, capsys):
    assert cli.main(["generate", run, "--prompt", PROMPT, "--max-new-tokens", "6", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"ids", "text", "ttft_ms", "decode_tokens_per_s"}
    model, sp_model = text_generation.load_run(run)
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    prompt_ids = [data.BOS_ID] + list(processor.EncodeAsIds(PROMPT))
    expected = model.generate([prompt_ids], 6, stop_id=data.EOS_ID).ids[0].tolist()
    if data.EOS_ID in expected:
        expected = expected[:expected.index(data.EOS_ID) + 1]
    assert result["ids"] == expected
    assert result["text"] == data.decode(sp_model, expected)
    assert result["ttft_ms"] > 0


def test_text_output_and_a_model_path(run, capsys):
    assert cli.main(["generate", f"{run}/model.keras", "--prompt", PROMPT, "--max-new-tokens", "4",
                     "--sampler", "top_k", "--top-k", "3", "--seed", "5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith(PROMPT)
    assert re.fullmatch(r"time to first token [0-9.]+ ms, decode ([0-9.]+ tokens/s|n/a \(one token\)) "
                        r"\(\d+ tokens\)", lines[-1])


def test_sampling_is_reproducible_with_a_seed(run, capsys):
    outputs = []
    for _ in range(2):
        assert cli.main(["generate", run, "--prompt", PROMPT, "--max-new-tokens", "5", "--sampler", "top_p",
                         "--top-p", "0.9", "--temperature", "1.5", "--seed", "11", "--json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ids"])
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("argv,message", [
    (["generate", "no_such_run", "--prompt", "x"], "no model at 'no_such_run'"),
    (["generate", "RUN", "--prompt", PROMPT, "--max-new-tokens", "40"], "max_length=24"),
    (["generate", "RUN", "--prompt", PROMPT, "--sampler", "top_k"], "`k` must be an int >= 1"),
    (["generate", "RUN", "--prompt", PROMPT, "--spm", "missing.model"], "no SentencePiece model"),
])
def test_bad_input_exits_2_with_a_clear_message(run, argv, message, capsys):
    argv = [run if a == "RUN" else a for a in argv]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_empty_prompt_still_has_the_start_token(run, capsys):
    assert cli.main(["generate", run, "--prompt", "", "--max-new-tokens", "3", "--json"]) == 0
    ids = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ids"]
    assert 1 <= len(ids) <= 3 and np.all(np.array(ids) != data.PAD_ID)


def test_a_truncated_model_file_is_named(run, tmp_path, capsys):
    import shutil

    model = tmp_path / "model.keras"
    whole = open(f"{run}/model.keras", "rb").read()
    model.write_bytes(whole[:len(whole) // 2])
    shutil.copy(f"{run}/spm.model", tmp_path)
    assert cli.main(["generate", str(tmp_path), "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"keras-posenc: error: cannot load a Keras model from '{model}': ")
