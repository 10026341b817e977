"""`keras-posenc export --generate --format genai` folders on onnxruntime-genai 0.18 (the edge cache's
venv-genai, CPU, no TensorFlow): its tokenizer encodes the prompts as `keras-posenc generate` does, its
greedy ids equal `keras-posenc generate`'s on three prompts (one longer than a prefill chunk), and a
second turn appended to the same generator equals Keras continuing the conversation."""

import json
import os

import pytest
import sentencepiece as spm
from stacks import once_on_keras3

from keras_posenc import special_ids
from keras_posenc.app import cli
from keras_posenc.export import genai, litertlm_bundle, load_model

VOCAB = 160
POSITIONS = ("rope", "sinusoidal", "alibi", "learned")
BOTH_STACKS = ("rope",)  # the other kinds: the same graphs as rope's, other position tables
ONCE = once_on_keras3("the same graphs as rope's, other position tables; on Keras 3, whose edge run is the "
                      "shorter")
CHUNK, CACHE_LENGTH, NEW_TOKENS = 8, 64, 10
PROMPTS = ["the cat", "the old house stood near the river", "a small dog"]
SECOND_TURN = "ran into the garden"
# A small run trained for a few seconds: its greedy ids depend on the earlier tokens, so a cache slot
# written wrong (a chunk, a second turn) changes them.
TRAIN = ["--steps", "150", "--batch-size", "16", "--num-layers", "2", "--d-model", "32", "--num-heads", "4",
         "--dff", "64", "--max-length", str(CACHE_LENGTH), "--vocab-size", str(VOCAB), "--warmup-steps", "20",
         "--dropout", "0.0", "--quiet"]


@pytest.fixture(scope="module", params=[
    name if name in BOTH_STACKS else pytest.param(name, marks=ONCE) for name in POSITIONS])
def folder(request, tmp_path_factory, corpus, edge):
    run = str(tmp_path_factory.mktemp(f"genai-{request.param}") / "run")
    assert cli.main(["train", "--corpus", corpus, "--out", run, "--position", request.param] + TRAIN) == 0
    return request.param, os.path.join(run, "model.keras"), os.path.join(run, "genai")


def _export(path, out, capsys):
    status = cli.main(["export", path, "--generate", "--format", "genai", "--cache-length", str(CACHE_LENGTH),
                       "--prompt-length", str(CHUNK), "--out", out])
    printed = capsys.readouterr()
    return status, printed.out, printed.err


def _generate(path, prompt, capsys):
    """`keras-posenc generate PATH --prompt PROMPT --json`: its ids."""
    argv = ["generate", path, "--prompt", prompt, "--max-new-tokens", str(NEW_TOKENS), "--json"]
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)["ids"]


def test_onnxruntime_genai_generates_the_ids_of_keras_posenc_generate(folder, edge, capsys):
    name, path, out = folder
    with open(os.path.join(os.path.dirname(path), "spm.model"), "rb") as f:
        sp_model = f.read()
    status, printed, err = _export(path, out, capsys)
    assert status == 0, printed + err
    assert sorted(os.listdir(out)) == sorted(genai.FILES)
    assert "same ids as CausalLM.generate" in printed and "SentencePiece's ids" in printed
    sessions = [[prompt] for prompt in PROMPTS] + [[PROMPTS[2], SECOND_TURN]]
    result = edge.run_genai(out, sessions, NEW_TOKENS)
    assert result["version"] == "0.18.0"
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    # Its tokenizer: BOS + SentencePiece's pieces, the second turn without BOS.
    assert [ids[0] for ids in result["prompt_ids"][:3]] == [[special_ids.BOS_ID] + processor.EncodeAsIds(p)
                                                            for p in PROMPTS]
    assert result["prompt_ids"][3][1] == processor.EncodeAsIds(SECOND_TURN)
    assert len(result["prompt_ids"][1][0]) > CHUNK  # the second prompt is prefilled in two chunks
    expected = [_generate(path, prompt, capsys) for prompt in PROMPTS]
    assert [turns[0] for turns in result["turns"][:3]] == expected, name
    assert result["turns"][3][0] == expected[2]  # the same first turn in the two-turn generator
    _, continued = litertlm_bundle.keras_texts(load_model(path), sp_model, sessions[3:], NEW_TOKENS)
    assert result["turns"][3] == continued[0], name
    # The ids depend on the context: three prompts, three continuations, and a second turn that is not
    # what the turn's text alone (a fresh generator) continues with.
    assert len({tuple(ids) for ids in expected}) == 3
    alone = edge.run_genai(out, [[SECOND_TURN]], NEW_TOKENS)["turns"][0][0]
    assert alone != result["turns"][3][1]

