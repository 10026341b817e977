"""`keras-posenc export MODEL --translate` before the files are made (`cli_export_translate`): the flags
it refuses, the defaults and the dev set it hands to `export.export_translation`.

`export.export_translation` is replaced by a recorder here: what the files then hold is
tests/test_export_translation.py's and tests/test_translate.py's. Expected rows and scores are made
from the tokenizer and sacrebleu, never by the module under test; nothing is converted, so the file
runs in seconds (it is what `make mutation` runs for the module).
"""

import json

import pytest
import sacrebleu
import sentencepiece as spm

from keras_posenc import export
from keras_posenc.app import cli, cli_export_translate
from keras_posenc.app.cli_flags import CommandError
from keras_posenc.app.dataset import train_sentencepiece
from keras_posenc.backend import is_keras3, save_model
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.special_ids import EOS_ID, NUM_RESERVED_IDS, PAD_ID

SOURCES = ["the cat sat on the mat", "the dog sat on the log", "a bird flew over the house", "a cat",
           "the dog", "a bird sat on the cat", "the mat", "the log sat", "a house", "the bird flew"]
REFERENCES = ["die katze sitzt auf der matte", "der hund sitzt auf dem baumstamm", "ein vogel flog",
              "eine katze", "der hund", "ein vogel sitzt", "die matte", "der baumstamm", "ein haus",
              "der vogel flog"]
MAX_LENGTH = 12
# a quantized export on a target whose int8 needs no LiteRT Python
INT8 = ("--target", "cpu", "--quantize", "int8")


@pytest.fixture(scope="module")
def sp_model():
    return train_sentencepiece((SOURCES + REFERENCES) * 4, 40)


@pytest.fixture(scope="module")
def run(tmp_path_factory, sp_model):
    """A translation run's folder: a tiny untrained translator, its tokenizer, a dev TSV and the
    report that names it as the run's `--dev-corpus` (its first 9 pairs)."""
    folder = tmp_path_factory.mktemp("run")
    model = Seq2SeqTransformer(num_layers=1, d_model=16, num_heads=2, dff=32, vocab_size=40,
                               max_length=MAX_LENGTH, dropout=0.0)
    model.build_on_dummy()
    save_model(model, str(folder / "model.keras"))
    (folder / "spm.model").write_bytes(sp_model)
    dev = folder / "dev.tsv"
    dev.write_text("".join(f"{s}\t{r}\n" for s, r in zip(SOURCES, REFERENCES)), encoding="utf-8")
    (folder / "report.json").write_text(json.dumps(
        {"train_config": {"dev_corpus": str(dev), "dev_sentences": 9}}))
    return folder


class Recorder:
    """`export.export_translation` and `save_and_print` as recorders of what they are given."""

    def __init__(self):
        self.export_calls, self.printed = [], []

    def export_translation(self, model, **kwargs):
        self.export_calls.append((model, kwargs))
        return "the result"

    def save_and_print(self, result, out, **kwargs):
        self.printed.append((result, out, kwargs))
        return 7


@pytest.fixture
def recorder(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(export, "export_translation", recorder.export_translation)
    return recorder


def _args(model, *flags):
    return cli.build_parser().parse_args(["export", str(model), "--translate", "--out", "out.tflite",
                                          *flags])


def _exported(recorder, model, *flags):
    status = cli_export_translate.export_translator(_args(model, *flags), recorder.save_and_print)
    [(model, kwargs)] = recorder.export_calls
    return status, model, kwargs


def _rows(processor, sources, length):
    """`pieces </s>` cut to `length`: the rows as the translator reads them (unpadded)."""
    return [processor.encode(source)[:length - 1] + [EOS_ID] for source in sources]


@pytest.mark.parametrize("flags, named", [
    (["--generate"], "--generate"),
    (["--sequence-length", "8"], "--sequence-length"),
    (["--token-ids", "ids.npy"], "--token-ids"),
    (["--embedding", "host"], "--embedding"),
    (["--spm", "spm.model"], "--spm"),
    (["--probe-prompt", "hello"], "--probe-prompt"),
    (["--prompt-length", "4"], "--prompt-length"),
    (["--batch-size", "2"], "--batch-size"),
    (["--generate", "--batch-size", "3", "--spm", "x"], "--generate, --spm, --batch-size"),
])
def test_flags_of_the_other_exports_are_refused_by_name_before_the_model_is_read(flags, named, tmp_path):
    with pytest.raises(CommandError) as error:
        cli_export_translate.export_translator(_args(tmp_path / "no_model.keras", *flags), None)
    assert str(error.value) == f"--translate exports batch 1 encode/decode files and takes no {named}."


def test_batch_size_1_given_is_no_refusal(run, recorder):
    status, _, kwargs = _exported(recorder, run / "model.keras", "--batch-size", "1")
    assert (status, kwargs["source_length"]) == (7, MAX_LENGTH)


def test_an_eval_corpus_without_quantize_is_refused(tmp_path):
    with pytest.raises(CommandError) as error:
        cli_export_translate.export_translator(_args(tmp_path / "m.keras", "--eval-corpus", "dev.tsv"), None)
    assert str(error.value) == "--eval-corpus measures a quantized file: it needs --quantize."


def test_a_precision_the_target_refuses_is_refused_before_the_model_is_read(tmp_path):
    with pytest.raises(ValueError) as error:
        cli_export_translate.export_translator(
            _args(tmp_path / "no_model.keras", "--target", "cpu", "--quantize", "int4"), None)
    assert str(error.value).startswith("--quantize int4 is refused for target='cpu': ")


@pytest.mark.skipif(is_keras3(), reason="TF 2.21 checks gpu int8 files itself: no LiteRT Python is asked for")
def test_the_litert_python_given_is_the_one_the_precision_is_checked_with(tmp_path):
    python = tmp_path / "no_python"
    with pytest.raises(ValueError) as error:
        cli_export_translate.export_translator(
            _args(tmp_path / "no_model.keras", "--quantize", "int8", "--litert-python", str(python)), None)
    assert str(error.value).startswith(f"the LiteRT Python {str(python)!r} is not an executable file: ")


def test_a_model_that_is_no_translator_is_refused(run, tmp_path, recorder):
    from keras_posenc.models import CausalLM

    lm = CausalLM({"num_layers": 1, "d_model": 16, "num_heads": 2, "dff": 32, "vocab_size": 40,
                   "max_length": MAX_LENGTH})
    lm.build_on_dummy()
    path = str(tmp_path / "lm.keras")
    save_model(lm, path)
    with pytest.raises(ValueError) as error:
        cli_export_translate.export_translator(_args(path), recorder.save_and_print)
    assert str(error.value) == ("--translate exports a translator (`keras-posenc train --task translate`); "
                                f"{path!r} holds a CausalLM.")
    assert recorder.export_calls == []


def test_the_defaults_are_the_models_lengths_the_default_target_and_a_float32_check(run, sp_model, recorder):
    status, model, kwargs = _exported(recorder, run / "model.keras")
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    assert type(model).__name__ == "Seq2SeqTransformer" and model.max_length == MAX_LENGTH
    assert kwargs["check_sources"] == _rows(processor, SOURCES[:cli_export_translate.CHECK_SENTENCES],
                                            MAX_LENGTH)
    del kwargs["check_sources"]
    assert kwargs == {"source_length": MAX_LENGTH, "cache_length": MAX_LENGTH - 1,
                      "target": export.DEFAULT_TARGET, "quantize": None, "quality_sources": None,
                      "score": None, "max_bleu_drop": 1.0, "beam_rows": None, "litert_python": None}
    assert status == 7
    assert recorder.printed == [("the result", "out.tflite", {"tolerance": None})]


def test_given_lengths_target_and_checks_are_handed_on(run, recorder):
    _, _, kwargs = _exported(recorder, run / "model.keras", "--source-length", "6", "--cache-length", "5",
                             "--target", "tensorrt", "--max-bleu-drop", "0.25", "--beam-rows", "3",
                             "--litert-python", "/py", "--tolerance", "0.5")
    assert {key: kwargs[key] for key in ("source_length", "cache_length", "target", "max_bleu_drop",
                                         "beam_rows", "litert_python")} == {
        "source_length": 6, "cache_length": 5, "target": "tensorrt", "max_bleu_drop": 0.25,
        "beam_rows": 3, "litert_python": "/py"}
    assert max(len(row) for row in kwargs["check_sources"]) == 6
    assert recorder.printed[0][2] == {"tolerance": 0.5}


def test_a_quantized_export_is_scored_on_the_runs_dev_pairs_in_bleu_and_chrf(run, sp_model, recorder):
    _, _, kwargs = _exported(recorder, run / "model.keras", "--target", "cpu", "--quantize", "float16",
                             "--dev-sentences", "9")
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    assert kwargs["quantize"] == "float16"
    assert kwargs["quality_sources"] == _rows(processor, SOURCES[:9], MAX_LENGTH)
    assert kwargs["check_sources"] == kwargs["quality_sources"][:cli_export_translate.CHECK_SENTENCES]
    # translations as the files give them: reserved ids (left out of the text) around the pieces
    hypotheses = [REFERENCES[0], "der hund sitzt auf dem haus", *REFERENCES[2:9]]
    translations = [[EOS_ID] + processor.encode(text) + [EOS_ID, PAD_ID] for text in hypotheses]
    scores = kwargs["score"](translations)
    bleu = sacrebleu.corpus_bleu(hypotheses, [REFERENCES[:9]]).score
    assert 0 < bleu < 100
    assert scores["bleu"] == pytest.approx(bleu, abs=1e-9)
    chrf = sacrebleu.corpus_chrf(hypotheses, [REFERENCES[:9]]).score
    assert scores["chrf"] == pytest.approx(chrf, abs=1e-9)
    assert scores["sentences"] == 9
    assert min(min(ids) for ids in translations) < NUM_RESERVED_IDS


def test_dev_sentences_takes_the_first_pairs(run, recorder):
    _, _, kwargs = _exported(recorder, run / "model.keras", *INT8, "--dev-sentences", "3")
    assert len(kwargs["quality_sources"]) == len(kwargs["check_sources"]) == 3


def test_an_eval_corpus_replaces_the_runs_dev_pairs(run, sp_model, recorder, tmp_path):
    tsv = tmp_path / "eval.tsv"
    tsv.write_text("".join(f"{s}\t{r}\n" for s, r in zip(SOURCES[5:], REFERENCES[5:])), encoding="utf-8")
    _, _, kwargs = _exported(recorder, run / "model.keras", *INT8, "--eval-corpus", str(tsv))
    processor = spm.SentencePieceProcessor(model_proto=sp_model)
    assert kwargs["quality_sources"] == _rows(processor, SOURCES[5:], MAX_LENGTH)
    # the sentences are too short for 4-grams (BLEU 0 even when exact); chrF is 100 against the TSV's own
    def chrf(texts):
        return kwargs["score"]([processor.encode(text) for text in texts])["chrf"]

    assert chrf(REFERENCES[5:]) == pytest.approx(100.0)
    assert chrf(REFERENCES[:5]) < 50


def _copy(run, tmp_path, *names):
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("model.keras", *names):
        (folder / name).write_bytes((run / name).read_bytes())
    return folder


def test_without_a_tokenizer_nothing_is_checked_on_text(run, tmp_path, recorder):
    folder = _copy(run, tmp_path, "report.json")
    _, _, kwargs = _exported(recorder, folder / "model.keras", *INT8)
    assert (kwargs["check_sources"], kwargs["quality_sources"], kwargs["score"]) == (None, None, None)


def test_without_a_report_nothing_is_checked_on_text(run, tmp_path, recorder):
    folder = _copy(run, tmp_path, "spm.model")
    _, _, kwargs = _exported(recorder, folder / "model.keras", *INT8)
    assert (kwargs["check_sources"], kwargs["quality_sources"], kwargs["score"]) == (None, None, None)


def test_an_eval_corpus_without_the_runs_tokenizer_is_refused(run, tmp_path, recorder):
    folder = _copy(run, tmp_path)
    with pytest.raises(CommandError) as error:
        _exported(recorder, folder / "model.keras", *INT8, "--eval-corpus", "x.tsv")
    assert str(error.value) == "--eval-corpus needs the run's spm.model beside the model."


def test_a_dev_corpus_moved_away_is_one_line_naming_it(run, tmp_path, recorder):
    folder = _copy(run, tmp_path, "spm.model")
    gone = tmp_path / "gone.tsv"
    (folder / "report.json").write_text(json.dumps({"train_config": {"dev_corpus": str(gone)}}))
    with pytest.raises(CommandError) as error:
        _exported(recorder, folder / "model.keras", *INT8)
    assert str(error.value) == (f"the run's dev corpus {gone} (report.json) is not here: pass --eval-corpus "
                                "TSV for the quantized translator's BLEU.")
    assert recorder.export_calls == []
