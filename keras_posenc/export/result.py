"""What one export produced and measured (`ExportResult`), its pass/fail rule and its save step.

One result type for every export kind (`keras_posenc.export.kinds`), made by the one pass
(`pipeline.export`): the model file(s), the report, the runtime metadata and the host embedding
table; `failures()` names every failed check, `save(out)` writes every file atomically
(`keras_posenc.files`) with `FILE.json` recording each file's size and sha256, and the contract
(`keras_posenc.export.contract`) beside them; a folder kind's files go into the folder `out`.
"""

import dataclasses
import os

from keras_posenc import files
from keras_posenc.export import contract
from keras_posenc.export.kinds import WINDOW
from keras_posenc.export.quantization import precision_of
from keras_posenc.export.targets import target_of
from keras_posenc.export.verdicts import BACKENDS

__all__ = ["EXPORT_TOLERANCE", "MIN_GENERATION_AGREEMENT", "Built", "ExportResult", "check_folder"]

# The largest parity error accepted per precision (int8 and int4 weights: reported, not checked;
# their gate is the held-out loss, `quality.DEFAULT_MAX_LOSS_INCREASE`).
EXPORT_TOLERANCE = {None: 1e-4, "float16": 2e-2, "int8": None, "int4": None}
# A quantized prefill/decode file whose greedy tokens leave float32's must still pick float32's
# token at this share of the steps, fed float32's tokens (`quality.generation_quality`).
MIN_GENERATION_AGREEMENT = 0.95


def check_folder(kind, out):
    """ValueError when a folder kind's `out` is a file (what a folder kind's save would refuse)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--format {kind.name} writes a folder: --out {out} is a file.")


@dataclasses.dataclass
class ExportResult:
    """What one export produced and measured.

    Attributes:
        target, quantize, embedding: the export options ("graph" or "host"); `target` is None
            for a kind that takes none (`genai`).
        models: tuple of the model files' bytes: one file, or one per signature (`prefill`,
            `decode`) where the target writes one file per signature; a folder kind's files, in
            the order of `names`.
        report: dict of the checks: `parity` (max abs diff on real tokens) and `verdicts` for
            every file export; `same_tokens` and `tokens_checked` for a generating kind; the
            rest of `export_report` for a window `.tflite`.
        lines: the report as printable lines (file names as `FILE`, see `report_lines`).
        metadata: the runtime metadata written as `FILE.json`.
        description: what the model files hold, for the `Wrote ...` line.
        host_table: for `embedding="host"`, the token table as stored: float32 (or float16)
            `[vocab, d_model]`, or the int rows of `host_table.quantize_table`; else None.
        kind: the export's `Kind` (`keras_posenc.export.kinds`).
        names: a folder kind's file names (`models` in the same order), else empty.
        signatures: the files' signatures where they are not the kind's (`Kind.signatures`): a
            translator with `decode_beams`; else empty.
    """

    target: str
    quantize: object
    embedding: str
    models: tuple
    report: dict
    lines: list
    metadata: dict
    description: str = ""
    host_table: object = None
    kind: object = WINDOW
    names: tuple = ()
    signatures: tuple = ()

    @property
    def exported(self):
        """The model file's bytes (a pair for a one-file-per-signature export)."""
        return self.models[0] if len(self.models) == 1 else tuple(self.models)

    @property
    def parity(self):
        return self.report["parity"]

    @property
    def generation(self):
        """Whether the files generate tokens (the kind's), so greedy tokens that differ fail."""
        return self.kind.generates

    def failures(self, *, tolerance=None, require_gpu=False):
        """Lines naming each failed check, `[]` when all hold: parity over `tolerance` (default
        `EXPORT_TOLERANCE`), greedy tokens that differ from `CausalLM.generate`, a quantized
        file whose held-out cross-entropy rises above `max_loss_increase`, and with
        `require_gpu` ops that the target's GPU backend does not run."""
        failed = []
        tolerance = tolerance if tolerance is not None else EXPORT_TOLERANCE[precision_of(self.quantize)]
        quality, limit = self.report.get("quality"), self.report.get("max_loss_increase")
        agreement = (quality or {}).get("generation_agreement")
        if self.generation and not self.report["same_tokens"]:
            if agreement is None:
                failed.append(f"FAILED: {self.kind.checked_as} does not generate what the model generates "
                              "(greedy tokens differ from CausalLM.generate).")
            elif not agreement >= MIN_GENERATION_AGREEMENT:
                failed.append(f"FAILED: the quantized file's greedy tokens differ from float32's, and fed "
                              f"float32's tokens it picks the same token at {agreement:.1%} of the steps "
                              f"(at least {MIN_GENERATION_AGREEMENT:.0%} needed).")
        if self.report.get("same_beam_tokens") is False:
            failed.append("FAILED: the beam search over decode_beams does not give translate's tokens.")
        if self.report.get("engine_same_text") is False:
            failed.append("FAILED: LiteRT-LM's engine does not generate the text CausalLM.generate generates "
                          "(a quantized bundle: its model on LiteRT's interpreter), or did not run "
                          "the bundle.")
        if self.report.get("tokenizer_same_ids") is False:
            failed.append("FAILED: tokenizer.json does not give SentencePiece's ids.")
        if tolerance is not None and not self.parity <= tolerance:
            failed.append(f"FAILED: parity {self.parity:.3g} exceeds the tolerance {tolerance:g}.")
        if quality is not None and limit is not None and "loss_increase" in quality and not (
                quality["loss_increase"] <= limit):
            failed.append(f"FAILED: the quantized file raises the held-out cross-entropy by "
                          f"{quality['loss_increase']:.2%} ({quality['loss_float']:.4f} -> "
                          f"{quality['loss_quantized']:.4f}), over the limit {limit:.2%}.")
        drop, most = (quality or {}).get("bleu_drop"), self.report.get("max_bleu_drop")
        if drop is not None and most is not None and not drop <= most:
            failed.append(f"FAILED: the quantized translator loses {drop:.2f} BLEU against float32's "
                          f"({quality['bleu_float']:.2f} -> {quality['bleu_quantized']:.2f}), over the "
                          f"limit {most:g}.")
        verdicts = self.report.get("verdicts") or {}
        backend = target_of(self.target).backends[0] if verdicts else None
        if require_gpu and backend and verdicts[backend]:
            failed.append(f"FAILED: --require-gpu and {BACKENDS[backend]} does not run "
                          + ", ".join(verdicts[backend]))
        return failed

    def model_paths(self, out):
        """The model files that `save(out)` writes (a folder kind: every file of the folder)."""
        if self.kind.folder:
            return [os.path.join(out, name) for name in self.names]
        suffix = self.kind.suffix or target_of(self.target).suffix
        return contract.model_paths(out, suffix, per_signature=len(self.models) > 1,
                                    signatures=self.signatures or self.kind.signatures)

    def save(self, out):
        """Writes the model file(s), `out.embeddings.npy` (host embeddings), `out.json` and the contract.

        Every file goes to a temporary name in its folder and is renamed into place
        (`keras_posenc.files`): an interrupted or failed save leaves no partial file under a
        final name. `out.json` records the size and sha256 of each file beside it.

        A folder kind (`genai`) writes its files into the folder `out` (made if missing), each
        atomically, and nothing beside them.

        Returns:
            The paths written, model files first.

        Raises:
            keras_posenc.files.FileWriteError: a file could not be written (the message names it
                and the free space).
            ValueError: a folder kind's `out` is a file.
        """
        if self.kind.folder:
            return self._save_folder(out)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        keys = contract.KEYS
        paths = self.model_paths(out)
        for path, content in zip(paths, self.models):
            files.write_bytes(path, content)
        metadata = dict(self.metadata)
        if self.host_table is not None:
            quantized = isinstance(self.host_table, dict)
            table = contract.embeddings_path(out, quantized=quantized)
            if quantized:
                files.save_npz(table, self.host_table)
            else:
                files.save_npy(table, self.host_table)
            metadata[keys["embedding_table"]] = os.path.basename(table)
            paths.append(table)
        signatures = self.signatures or self.kind.signatures
        if len(self.models) > 1:
            metadata[keys["signature_files"]] = dict(zip(signatures, (os.path.basename(p) for p in paths)))
        elif signatures != contract.SIGNATURES:  # the kit's default is the prefill/decode pair
            metadata[keys["signature_files"]] = dict.fromkeys(signatures, os.path.basename(paths[0]))
        metadata[keys["files"]] = {os.path.basename(path): contract.file_record(path) for path in paths}
        files.write_json(contract.contract_path(out), contract.document())
        files.write_json(contract.metadata_path(out), metadata)
        return paths + [contract.metadata_path(out), contract.contract_path(out)]

    def _save_folder(self, out):
        check_folder(self.kind, out)
        os.makedirs(out, exist_ok=True)
        paths = self.model_paths(out)
        for path, content in zip(paths, self.models):
            files.write_bytes(path, content)
        return paths

    def headline(self, paths):
        """`Wrote ...`: the files written and what the model files hold."""
        size = sum(len(content) for content in self.models)
        return f"Wrote {', '.join(paths)} ({size} bytes, {self.description})"

    def report_lines(self, out):
        """`lines` with the file names of an export to `out` in place of `FILE`."""
        names = {"FILE.embeddings.npy": os.path.basename(contract.embeddings_path(out)),
                 "FILE.embeddings.npz": os.path.basename(contract.embeddings_path(out, quantized=True)),
                 "--onnx=FILE": f"--onnx={out}"}
        rendered = []
        for line in self.lines:
            for placeholder, name in names.items():
                line = line.replace(placeholder, name)
            rendered.append(line)
        return rendered


@dataclasses.dataclass
class Built(ExportResult):
    """What one kind's build made and checked: its `ExportResult` before the quantization's part, which
    the pass (`pipeline.export`) adds.

    Attributes:
        recipe: the quantization `Recipe`, or None (float32).
        quality: what the quantized files cost against float32's (None without a recipe, or when
            not measured).
        format_quality: `(quality, max_loss_increase) -> line`, the quality's line.
        quantized_note: words the quantizer's line ends with.
        notes: lines after the quality's.
    """

    recipe: object = None
    quality: object = None
    format_quality: object = None
    quantized_note: str = ""
    notes: tuple = ()

    def result(self):
        """The `ExportResult` this holds (its own fields only)."""
        fields = dataclasses.fields(ExportResult)
        return ExportResult(**{field.name: getattr(self, field.name) for field in fields})
