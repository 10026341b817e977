"""Text in, text out: a trained run's model and SentencePiece tokenizer around `CausalLM.generate`.

What `keras-posenc generate` and the end of `keras-posenc demo` run. A
run folder written by `keras-posenc train` holds `model.keras` and the
tokenizer `spm.model`; the prompt becomes `<s>` + its pieces, generation
stops at `</s>`, and the new ids are decoded with the special ids dropped.
"""

import json

from keras_posenc import generation
from keras_posenc import models as _models  # noqa: F401  (registers CausalLM for load_model)
from keras_posenc.app import dataset as data_lib
from keras_posenc.app.run_folder import resolve_run
from keras_posenc.backend import keras

__all__ = ["format_result", "generate_text", "load_model_file", "load_run"]


def load_model_file(path):
    """The Keras model in the file `path`; a corrupt or foreign file is a ValueError naming it.

    Keras reports a file that is not a model with its own words ("Unable to synchronously open
    file", "File is not a zip file"), without the file's name.

    Example:

    >>> import os
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "model.keras")
    >>> _ = open(path, "wb").write(b"not a model")
    >>> load_model_file(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: cannot load a Keras model from '.../model.keras': ...
    """
    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for a corrupt or foreign file
        lines = str(error).strip().splitlines()
        raise ValueError(f"cannot load a Keras model from {path!r}: {type(error).__name__}"
                         f"{': ' + lines[0] if lines else ''} (is it a model.keras written by keras-posenc, "
                         "whole?)") from error


def load_run(path, spm_path=None):
    """`(CausalLM, serialized SentencePiece model)` of a run folder or `.keras` file."""
    model_path, spm_path = resolve_run(path, spm_path)
    model = load_model_file(model_path)
    if not hasattr(model, "generate"):
        raise ValueError(f"{model_path!r} holds a {type(model).__name__}, not a keras_posenc CausalLM.")
    with open(spm_path, "rb") as f:
        return model, f.read()


def generate_text(model, sp_model, prompt, max_new_tokens=32, **sampling):
    """Generates a continuation of `prompt`.

    Args:
        model: a `CausalLM`.
        sp_model: bytes, the serialized SentencePiece model it was trained with.
        prompt: str.
        max_new_tokens: int >= 1.
        **sampling: `sampler`, `temperature`, `k`, `p`, `seed`, `language_ids` of
            `CausalLM.generate`.

    Returns:
        dict with `ids` (the generated ids, list of int, up to `</s>`),
        `text` (their decoded text), `ttft_ms` (prefill and first token, in
        milliseconds) and `decode_tokens_per_s` (None with a single token),
        both timed after one untimed warm-up step (tracing and compilation
        left out).
    """
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(sp_model)
    prompt_ids = [data_lib.BOS_ID] + list(processor.EncodeAsIds(prompt))
    result = generation.generate(model, [prompt_ids], max_new_tokens, stop_id=data_lib.EOS_ID, warmup=True,
                                 **sampling)
    ids = [int(i) for i in result.ids[0]]
    if data_lib.EOS_ID in ids:
        ids = ids[:ids.index(data_lib.EOS_ID) + 1]
    rate = result.decode_tokens_per_second
    return {"ids": ids, "text": data_lib.decode(sp_model, ids), "ttft_ms": result.prefill_seconds * 1e3,
            "decode_tokens_per_s": rate}


def format_result(prompt, result, as_json=False):
    """The printout of `keras-posenc generate`: the text and the timing line, or one JSON object."""
    if as_json:
        return json.dumps(result)
    rate = result["decode_tokens_per_s"]
    rate_text = "n/a (one token)" if rate is None else f"{rate:.1f} tokens/s"
    count = len(result["ids"])
    return (f"{prompt}{'' if prompt.endswith(' ') else ' '}{result['text']}\n"
            f"time to first token {result['ttft_ms']:.1f} ms, decode {rate_text} ({count} tokens)")
