"""The export kinds, one frozen `Kind` each: what an export makes of the model, beside its `Target`.

- `window`: one file of a fixed window `[batch, T]` (`export_and_check`).
- `prefill_decode`: the prompt's prefill and the cached decode step, with an explicit key/value
  cache (`export_generation`; `export/jetson/run_generate.py` runs it).
- `litertlm`: the prefill/decode model in LiteRT-LM's executor contract, packed with the
  tokenizer into a `.litertlm` bundle (`export_litertlm`).
- `translate`: an encoder-decoder translator: `encode` (the source to every decoder layer's
  cross-attention keys and values) and the cached `decode` step (`export_translation`;
  `export/jetson/run_translate.py` runs it).
- `genai`: an onnxruntime-genai folder: one decoder ONNX, `genai_config.json` and the tokenizer
  files (`export_genai`).

`keras_posenc.export.pipeline.export` runs every kind in one pass; the quantization recipes are
keyed by `(Target, Kind)`. Code elsewhere reads a `Kind`'s fields and never compares kind names.
"""

import dataclasses

from keras_posenc.export import contract
from keras_posenc.validation import check_choice

__all__ = ["GENAI", "KINDS", "LITERTLM", "PREFILL_DECODE", "TRANSLATE", "WINDOW", "Kind", "kind_of"]


@dataclasses.dataclass(frozen=True)
class Kind:
    """What one export kind makes and checks.

    Attributes:
        name: str, the kind's name (`--generate --format` picks the generation kinds).
        contract_kind: the `kind` FILE.json records (`contract.KINDS`), or None where no FILE.json
            is written.
        generates: bool, the files generate tokens: the check compares their greedy tokens
            with `CausalLM.generate`'s, and tokens that differ fail the export.
        suffix: None (the target's file ending) or the ending of the kind's one file.
        folder: bool, the files go into the folder `out` under their own names (no FILE.json,
            no contract).
        checked_as: how the check fed the files, for the line naming tokens that differ.
        takes_target: bool, the kind is made for one `--target` (else for `own_runtime` only).
        own_runtime: what runs a kind that takes no target, in words, else None.
        tokenizer: bool, the files hold the run's tokenizer (a bundle, a folder).
        description: what the files are, in words.
        signatures: the files' signatures, in the order of a one-file-per-signature export's files.
    """

    name: str
    contract_kind: object
    generates: bool
    suffix: object = None
    folder: bool = False
    checked_as: str = "the file"
    takes_target: bool = True
    own_runtime: object = None
    tokenizer: bool = False
    description: str = ""
    signatures: tuple = contract.SIGNATURES


WINDOW = Kind("window", contract.KINDS["window"], generates=False, description="a file of a fixed window")
PREFILL_DECODE = Kind("prefill_decode", contract.KINDS["prefill_decode"], generates=True,
                      description="prefill and decode files with a key/value cache")
LITERTLM = Kind("litertlm", contract.KINDS["prefill_decode"], generates=True, suffix=contract.LITERTLM_SUFFIX,
                tokenizer=True, description="a prefill/decode bundle")
TRANSLATE = Kind("translate", contract.KINDS["translate"], generates=True,
                 description="encode and decode files of a translator",
                 signatures=contract.TRANSLATE_SIGNATURES, checked_as="the translator")
GENAI = Kind("genai", None, generates=True, folder=True, takes_target=False,
             own_runtime="onnxruntime-genai's CPU provider", tokenizer=True,
             description="an onnxruntime-genai decoder folder",
             checked_as="the decoder, fed as onnxruntime-genai feeds it,")

KINDS = {kind.name: kind for kind in (WINDOW, PREFILL_DECODE, LITERTLM, GENAI, TRANSLATE)}


def kind_of(kind):
    """The `Kind` of a name, or the `Kind` given; a ValueError naming the choices for another name.

    >>> kind_of("litertlm").suffix, kind_of(WINDOW) is WINDOW
    ('.litertlm', True)
    """
    if not isinstance(kind, Kind):
        check_choice("kind", kind, KINDS)
        kind = KINDS[kind]
    return kind
