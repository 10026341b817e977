"""The run folder's files: where a run's model and tokenizer are found, and the one-line refusals."""

import os

import pytest

from keras_posenc.app import run_folder


def _touch(path):
    with open(path, "wb") as f:
        f.write(b"x")
    return str(path)


def test_a_run_folder_gives_its_model_and_the_tokenizer_beside_it(tmp_path):
    model, spm = _touch(tmp_path / "model.keras"), _touch(tmp_path / "spm.model")
    assert run_folder.resolve_run(str(tmp_path)) == (model, spm)
    assert run_folder.resolve_run(model) == (model, spm)  # the .keras file itself


def test_a_tokenizer_given_is_taken_instead_of_the_one_beside(tmp_path):
    model = _touch(tmp_path / "other.keras")
    given = _touch(tmp_path / "given.model")
    assert run_folder.resolve_run(model, given) == (model, given)
    os.mkdir(tmp_path / "run")
    inside = _touch(tmp_path / "run" / "model.keras")
    assert run_folder.resolve_run(str(tmp_path / "run"), given) == (inside, given)


def test_a_missing_model_or_tokenizer_is_one_sentence_naming_the_path(tmp_path):
    empty = str(tmp_path / "empty")
    os.mkdir(empty)
    with pytest.raises(FileNotFoundError) as error:
        run_folder.resolve_run(empty)
    assert str(error.value) == (f"no model at {empty!r}: give a run folder with model.keras, or a .keras "
                                "file")
    model = _touch(tmp_path / "alone.keras")
    with pytest.raises(FileNotFoundError) as error:
        run_folder.resolve_run(model)
    spm = str(tmp_path / "spm.model")
    assert str(error.value) == (f"no SentencePiece model at {spm!r}: `keras-posenc train` writes spm.model "
                                "beside model.keras (or pass --spm PATH)")
    with pytest.raises(FileNotFoundError, match="no SentencePiece model at '/no/such.model'"):
        run_folder.resolve_run(model, "/no/such.model")
