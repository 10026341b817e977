"""A run folder: the files `keras-posenc train` writes and the other commands read.

A run folder holds `model.keras`, the tokenizer it was trained with
(`spm.model`) and `report.json` (the training config, so the held-out split
can be made again). `generate`, `translate`, `inspect` and `export` take the
folder or the model file inside it; this module is the one place that knows
the names and where each file sits.

Example:

>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> tokenizer_path(os.path.join(folder, MODEL_FILE)) == os.path.join(folder, TOKENIZER_FILE)
True
>>> read_tokenizer(os.path.join(folder, MODEL_FILE)) is None  # no spm.model there
True

Imports of the data pipeline are lazy: the CLI's help must show before TensorFlow loads.
"""

import json
import os

__all__ = ["EVAL_ROWS", "MODEL_FILE", "REPORT_FILE", "TOKENIZER_FILE", "corpus_token_ids", "dev_pairs",
           "eval_examples", "eval_token_ids", "read_tokenizer", "resolve_run", "token_rows", "tokenizer_path"]

MODEL_FILE, TOKENIZER_FILE, REPORT_FILE = "model.keras", "spm.model", "report.json"
# Held-out rows a quantized export's cross-entropy is measured on (at most).
EVAL_ROWS = 256


def _beside(model_path, name):
    return os.path.join(os.path.dirname(os.path.abspath(model_path)), name)


def tokenizer_path(model_path):
    """The path of the `spm.model` beside `model_path`."""
    return _beside(model_path, TOKENIZER_FILE)


def read_tokenizer(model_path):
    """The serialized `spm.model` beside the model (bytes), or None when there is none."""
    path = tokenizer_path(model_path)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def resolve_run(path, spm_path=None):
    """`(model path, tokenizer path)` of a run folder or of a `.keras` file with `spm.model` beside it.

    Raises:
        FileNotFoundError: no model or no tokenizer at the expected place.

    Example:

    >>> resolve_run("no_such_run")
    Traceback (most recent call last):
        ...
    FileNotFoundError: no model at 'no_such_run': give a run folder with model.keras, or a .keras file
    """
    model_path = os.path.join(path, MODEL_FILE) if os.path.isdir(path) else path
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"no model at {path!r}: give a run folder with {MODEL_FILE}, "
                                "or a .keras file")
    spm_path = spm_path or tokenizer_path(model_path)
    if not os.path.isfile(spm_path):
        raise FileNotFoundError(f"no SentencePiece model at {spm_path!r}: `keras-posenc train` writes "
                                f"{TOKENIZER_FILE} beside {MODEL_FILE} (or pass --spm PATH)")
    return model_path, spm_path


def token_rows(sp_model, examples, sequence_length):
    """`examples` tokenized as `lm_dataset` frames them, int32 `[n, sequence_length]`, right-padded."""
    import numpy as np

    from keras_posenc.app import dataset as data_lib

    dataset = data_lib.lm_dataset(examples, sp_model, max_length=sequence_length, batch_size=len(examples),
                                  shuffle=False, bucket_lengths=None)
    features, _ = next(iter(dataset))
    token_ids = np.asarray(features["token_ids"])[:, :sequence_length]
    return np.pad(token_ids, ((0, 0), (0, sequence_length - token_ids.shape[1])),
                  constant_values=data_lib.PAD_ID)


def corpus_token_ids(model_path, sequence_length, rows):
    """Embedded-corpus sentences tokenized with the run's `spm.model`, as in training; None without one."""
    from keras_posenc.app import dataset as data_lib

    sp_model = read_tokenizer(model_path)
    if sp_model is None:
        return None
    return token_rows(sp_model, data_lib.read_text_corpus(data_lib.default_corpus_path())[:rows],
                      sequence_length)


def eval_examples(model_path):
    """The examples training held out: the corpus, format, fraction and seed of `report.json`, split
    as `train` split them; None without a `report.json` beside the model.

    Raises:
        ValueError: the run's corpus is no longer where the report says.
    """
    from keras_posenc.app import dataset as data_lib

    report_path = _beside(model_path, REPORT_FILE)
    if not os.path.isfile(report_path):
        return None
    with open(report_path) as f:
        config = json.load(f)["train_config"]
    corpus = config["corpus"] or data_lib.default_corpus_path()
    if not os.path.isfile(corpus):
        raise ValueError(f"the run's corpus {corpus} ({REPORT_FILE}) is not here: pass --eval-corpus FILE "
                         "for the held-out loss of the quantized file.")
    corpus_format = "text" if config["corpus"] is None else config["corpus_format"]
    examples = data_lib.load_corpus(corpus, corpus_format, skip_bad_lines=config.get("skip_bad_lines", False))
    return data_lib.split_corpus(examples, config["eval_fraction"], seed=config["seed"])[1]


def dev_pairs(model_path, dev_corpus=None):
    """The `(source, reference)` pairs a translation run scored in training: `dev_corpus` (a TSV),
    else the run's `--dev-corpus` (its first `dev_sentences`), else its held-out split; None
    without a `report.json` beside the model.

    Raises:
        ValueError: the run's dev corpus is no longer where the report says.
    """
    from keras_posenc.app import dataset as data_lib

    if dev_corpus is not None:
        return data_lib.load_corpus(dev_corpus, "tsv")
    report_path = _beside(model_path, REPORT_FILE)
    if not os.path.isfile(report_path):
        return None
    with open(report_path) as f:
        config = json.load(f)["train_config"]
    if not config.get("dev_corpus"):
        return (eval_examples(model_path) or [])[:config.get("dev_sentences")]
    if not os.path.isfile(config["dev_corpus"]):
        raise ValueError(f"the run's dev corpus {config['dev_corpus']} ({REPORT_FILE}) is not here: pass "
                         "--eval-corpus TSV for the quantized translator's BLEU.")
    pairs = data_lib.load_corpus(config["dev_corpus"], "tsv",
                                 skip_bad_lines=config.get("skip_bad_lines", False))
    return pairs[:config.get("dev_sentences")]


def eval_token_ids(model_path, sequence_length, eval_corpus):
    """Held-out rows for a quantized export: `eval_corpus`, else the run's eval split; None without a run.

    At most `EVAL_ROWS` rows, tokenized with the run's `spm.model`, right-padded to `sequence_length`.

    Raises:
        ValueError: `eval_corpus` without the run's tokenizer, or the run's corpus is gone.
    """
    from keras_posenc.app import dataset as data_lib

    sp_model = read_tokenizer(model_path)
    if sp_model is None:
        if eval_corpus is not None:
            raise ValueError(f"--eval-corpus needs the run's {TOKENIZER_FILE} beside the model {model_path} "
                             "(the tokenizer the model was trained with).")
        return None
    if eval_corpus is not None:
        examples = data_lib.read_text_corpus(eval_corpus)
    else:
        examples = eval_examples(model_path)
    if examples is None:
        return None
    return token_rows(sp_model, examples[:EVAL_ROWS], sequence_length)
