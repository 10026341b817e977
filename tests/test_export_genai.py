"""`--format genai`'s parts that need no ONNX tool: tokenizer.json against SentencePiece on the embedded
corpus, genai_config.json from the model, and the command's refusals. tests/edge/edge_genai.py exports
folders and runs them on onnxruntime-genai 0.18."""

import io
import json
import sys

import pytest
import sentencepiece as spm
from stacks import once_on_keras2
from tokenizers import Tokenizer

from keras_posenc import special_ids
from keras_posenc.app import cli
from keras_posenc.app import dataset as data
from keras_posenc.export import genai
from keras_posenc.export.tool_env import ToolEnvironmentError
from keras_posenc.models import CausalLM


@pytest.fixture(scope="module")
def corpus_lines():
    return data.read_text_corpus(data.default_corpus_path())


@pytest.fixture(scope="module")
def sp_model(corpus_lines):
    return data.train_sentencepiece(corpus_lines, vocab_size=400)


def _processor(sp_model):
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    return processor


def test_tokenizer_json_gives_sentencepieces_ids_on_the_embedded_corpus(sp_model, corpus_lines):
    text, config = genai.tokenizer_files(sp_model, cache_length=64)
    tokenizer, processor = Tokenizer.from_str(text), _processor(sp_model)
    texts = corpus_lines + ["  two  spaces  ", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ ①", "tab\there", "é", "",
                            "a <sep> b", "Zürich ☃"]
    got = [tokenizer.encode(line).ids for line in texts]
    assert got == [[special_ids.BOS_ID] + processor.EncodeAsIds(line) for line in texts]
    assert len(corpus_lines) > 6000 and any(special_ids.UNK_ID in ids for ids in got)  # real text, unknowns
    assert special_ids.SEP_ID in got[-2]  # the user-defined <sep> piece, where SentencePiece puts it
    # A later turn is encoded without BOS; decoding drops the control pieces, as SentencePiece does.
    line = corpus_lines[10]
    assert tokenizer.encode(line, add_special_tokens=False).ids == processor.EncodeAsIds(line)
    ids = processor.EncodeAsIds(line)
    assert tokenizer.decode([special_ids.BOS_ID] + ids + [special_ids.EOS_ID]) == processor.DecodeIds(ids)
    # A pair (Hugging Face's callers may encode one): BOS, then both texts' pieces.
    pair = tokenizer.encode(line, texts[-1]).ids
    assert pair == [special_ids.BOS_ID] + ids + processor.EncodeAsIds(texts[-1])
    # onnxruntime-extensions reads the added tokens' flags: the control pieces are special and matched
    # in the text as written.
    added = [(token["id"], token["content"], token["special"], token["normalized"])
             for token in json.loads(text)["added_tokens"]]
    assert added == [(special_ids.PAD_ID, "<pad>", True, False), (special_ids.BOS_ID, "<s>", True, False),
                     (special_ids.EOS_ID, "</s>", True, False)]
    assert config == {"tokenizer_class": genai.TOKENIZER_CLASS, "bos_token": "<s>", "eos_token": "</s>",
                      "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": True,
                      "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": 64}
    assert "model_max_length" not in genai.tokenizer_files(sp_model)[1]
    # No byte pieces to fall back on: the file says so to onnxruntime-extensions, which reads the flag
    model = json.loads(text)["model"]
    assert (model["type"], model["unk_id"], model["byte_fallback"]) == ("Unigram", special_ids.UNK_ID, False)


@pytest.mark.parametrize("options", [{"normalization_rule_name": "identity"}, {"add_dummy_prefix": False},
                                     {"remove_extra_whitespaces": False},
                                     {"add_dummy_prefix": False, "remove_extra_whitespaces": False},
                                     {"split_by_whitespace": False},
                                     {"split_by_whitespace": False, "remove_extra_whitespaces": False},
                                     {"split_by_whitespace": False, "add_dummy_prefix": False,
                                      "remove_extra_whitespaces": False}],
                         ids=["identity", "no-dummy-prefix", "spaces-kept", "both", "pieces-across-words",
                              "across-words-spaces-kept", "across-words-both"])
def test_tokenizer_json_follows_the_models_own_normalizer_settings(corpus_lines, options):
    """A `--spm` model trained with other settings than keras-posenc's: the same ids, the same text
    decoded."""
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus_lines[:2000]), model_writer=buffer,
                                   vocab_size=300, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                                   user_defined_symbols=["<sep>"], minloglevel=2, **options)
    text, _ = genai.tokenizer_files(buffer.getvalue())
    tokenizer, processor = Tokenizer.from_str(text), _processor(buffer.getvalue())
    texts = corpus_lines[:200] + ["  two  spaces  ", " lead", "trail ", "a  b", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ ①",
                                  "Zürich ☃", ""]
    expected = [[special_ids.BOS_ID] + processor.EncodeAsIds(line) for line in texts]
    assert [tokenizer.encode(line).ids for line in texts] == expected
    # Decoded as SentencePiece decodes (a leading space kept where no dummy prefix is removed); unknown
    # pieces left out (SentencePiece writes " ⁇ " for them).
    known = [ids[1:] for ids in expected if special_ids.UNK_ID not in ids]
    assert [tokenizer.decode(ids) for ids in known] == [processor.DecodeIds(ids) for ids in known]
    if options.get("split_by_whitespace") is False:  # pieces that span a space are used
        assert any("▁" in processor.IdToPiece(i)[1:] for ids in known for i in ids)


def test_a_sentencepiece_model_that_is_not_unigram_is_refused(corpus_lines):
    bpe = data.train_sentencepiece(corpus_lines[:300], vocab_size=200, model_type="bpe")
    with pytest.raises(ValueError, match=r"^--format genai builds a Unigram tokenizer\.json; this "
                                         r"SentencePiece model has model_type='bpe', byte_fallback=False\.$"):
        genai.tokenizer_files(bpe)


def test_byte_fallback_is_refused(corpus_lines):
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus_lines[:300]), model_writer=buffer,
                                   vocab_size=400, byte_fallback=True, minloglevel=2)
    with pytest.raises(ValueError, match=r"model_type='unigram', byte_fallback=True\.$"):
        genai.tokenizer_files(buffer.getvalue())


@once_on_keras2("a dict of the model's config; no graph")
def test_genai_config_holds_the_models_ids_sizes_and_lengths():
    model = CausalLM({"num_layers": 3, "d_model": 24, "num_heads": 4, "dff": 32, "vocab_size": 50,
                      "max_length": 40, "pad_id": 0})
    config = genai.genai_config(model, cache_length=32, prompt_length=6)
    decoder = config["model"].pop("decoder")
    assert config["model"] == {"type": "decoder", "bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 0,
                               "vocab_size": 50, "context_length": 32}
    assert decoder == {
        "filename": "model.onnx", "session_options": {"log_id": "keras-posenc", "provider_options": []},
        "hidden_size": 24, "head_size": 6, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 3,
        "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                   "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                   "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"}}
    # greedy, one sequence, no penalty: onnxruntime-genai's search then picks what CausalLM.generate picks
    assert config["search"] == {
        "do_sample": False, "num_beams": 1, "num_return_sequences": 1, "top_k": 1, "top_p": 1.0,
        "temperature": 1.0, "repetition_penalty": 1.0, "min_length": 0, "max_length": 32,
        "past_present_share_buffer": True, "chunk_size": 6, "early_stopping": True, "length_penalty": 1.0,
        "no_repeat_ngram_size": 0}
    # JSON as it is, sizes as integers (the runtime reads "head_size": 6, not 6.0)
    assert json.loads(json.dumps(config)) == config
    assert '"head_size": 6,' in json.dumps(decoder) and '"hidden_size": 24,' in json.dumps(decoder)
    assert (genai.past_name("key", 2), genai.present_name("value", 0)) == ("past_key_values.2.key",
                                                                          "present.0.value")


REFUSAL = ("--format genai writes float32 weights with the lookup in the file, checked token for token: it "
           "takes no")


@once_on_keras2("argument checks before any model is read")
@pytest.mark.parametrize("flags, line", [
    (["--generate", "--cache-length", "8", "--target", "cpu"],
     "--format genai runs on onnxruntime-genai's CPU provider and takes no --target, got --target cpu."),
    (["--generate", "--cache-length", "8", "--quantize", "int8"],
     f"{REFUSAL} --quantize."),
    (["--generate", "--cache-length", "8", "--embedding", "graph", "--tolerance", "0.1"],
     f"{REFUSAL} --embedding, --tolerance."),
    (["--sequence-length", "8"], "--format genai is an onnxruntime-genai decoder folder: add --generate "
                                 "--cache-length C."),
    (["--generate"], "--generate needs --cache-length C (prompt + generated tokens)."),
    (["--generate", "--cache-length", "8"], "--format genai needs a .keras file with its tokenizer, got "
                                            "'MODEL'."),
])
def test_the_command_refuses_in_one_line(flags, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", "MODEL", "--format", "genai", "--out", "folder"] + flags) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"keras-posenc: error: {line}\n")
    assert not (tmp_path / "folder").exists()


@once_on_keras2("argument checks before any model is read")
def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "out").write_text("kept")
    argv = ["export", "MODEL", "--generate", "--cache-length", "8", "--format", "genai", "--out",
            str(tmp_path / "out")]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (f"keras-posenc: error: --format genai writes a folder: --out "
                                       f"{tmp_path / 'out'} is a file.\n")
    assert (tmp_path / "out").read_text() == "kept"


def test_without_tokenizers_the_error_says_how_to_install_it(sp_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises ImportError
    with pytest.raises(ImportError, match=r"^--format genai writes tokenizer\.json with Hugging Face's "
                                          r"tokenizers: pip install tokenizers \(requirements/tf212\.txt and "
                                          r"tf221\.txt pin it\)\.$"):
        genai.tokenizer_files(sp_model)


@once_on_keras2("an import refused before any graph is traced")
def test_without_the_onnx_tools_the_error_names_the_format(monkeypatch):
    model = CausalLM({"num_layers": 1, "d_model": 8, "num_heads": 2, "dff": 16, "vocab_size": 20,
                      "max_length": 16})
    model.build_on_dummy()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ToolEnvironmentError, match=r"^--format genai needs tf2onnx and onnxruntime \("):
        genai.to_genai_onnx(model, cache_length=8)
    with pytest.raises(ValueError, match=r"`cache_length`=32 exceeds the model's max_length=16"):
        genai.to_genai_onnx(model, cache_length=32)
