"""What the kit reads beside a model: `FILE.contract.json` (tensor names, FILE.json keys, file names,
written by `keras-posenc export`) and `FILE.json`; and the checks of every file before a runtime
opens it (size, sha256, the TFLite identifier), so a truncated, replaced or foreign file is one
line on stderr and a non-zero exit, never a traceback or a crash inside a native runtime.

Kept beside run_tflite.py, run_generate.py, run_translate.py and run_tensorrt.py (copy them together);
stdlib only.
"""

import contextlib
import hashlib
import json
import os
import sys
import types

# The one name the kit knows by itself: where the contract of FILE lies. Everything else comes from it.
CONTRACT_SUFFIX = ".contract.json"


class Export:
    """One export as the kit sees it: `contract` (`tensors`, `keys`, `kinds`, `files` as attribute
    namespaces; `signatures`, a prefill/decode file's, and `translate_signatures`, a translator's),
    `metadata` (FILE.json) and the folder it lies in."""

    def __init__(self, model, contract, metadata):
        self.model = model
        self.folder = os.path.dirname(os.path.abspath(model))
        self.tensors = types.SimpleNamespace(**contract["tensors"])
        self.keys = types.SimpleNamespace(**contract["keys"])
        self.kinds = types.SimpleNamespace(**contract["kinds"])
        self.files = types.SimpleNamespace(**contract["files"])
        self.signatures = list(contract["signatures"])
        self.translate_signatures = list(contract.get("translate_signatures", ()))
        self.beam_signature = contract.get("beam_signature")
        self.metadata = metadata

    def get(self, key, default=None):
        """FILE.json's value under the contract's key `key` (an attribute name of `keys`)."""
        return self.metadata.get(getattr(self.keys, key), default)

    def __getitem__(self, key):
        value = self.get(key)
        if value is None and getattr(self.keys, key) not in self.metadata:
            fail(f"{self.model}: FILE.json has no {getattr(self.keys, key)!r}; export it again.")
        return value

    def path(self, name):
        """A file named in FILE.json, beside the model."""
        return os.path.join(self.folder, name)

    def is_kind(self, kind):
        return self.get("kind") == getattr(self.kinds, kind)

    def signature_files(self):
        """`{signature: path}`: one file for both signatures, or the file of each (FILE.json says)."""
        named = self.get("signature_files")
        if named:
            return {key: self.path(name) for key, name in named.items()}
        return {key: self.model for key in self.signatures}

    def check_accelerator(self, accelerator):
        """Refuses a file built for another accelerator (a `--target cpu` file on the GPU)."""
        accelerators = self.get("accelerators")
        if accelerators and accelerator not in accelerators:
            fail(f"{self.model} was exported with --target {self.get('target')}, which runs on "
                 f"{' and '.join(accelerators)} only; for --accelerator {accelerator} export it with "
                 f"--target gpu (LiteRT GPU accelerator) or --target gl (OpenGL ES delegate).")

    def verify(self, path, tflite=False):
        """Size, sha256 (as FILE.json records them) and, for TFLite, the identifier of `path`."""
        records = self.get("files") or {}
        name = os.path.basename(path)
        record = records.get(name)
        if record is None:
            fail(f"{path}: not recorded in {self.model}{self.files.metadata_suffix}; export it again.")
        if not os.path.isfile(path):
            fail(f"{path}: file not found (copy it from `keras-posenc export` beside {self.model}).")
        size = os.path.getsize(path)
        expected = record[self.keys.bytes]
        if size != expected:
            fail(f"{path}: {size} bytes, but the export wrote {expected} (truncated or replaced): copy it "
                 "again.")
        if tflite:
            offset = self.files.tflite_identifier_offset
            identifier = self.files.tflite_identifier
            with open(path, "rb") as f:
                head = f.read(offset + len(identifier))
            if head[offset:] != identifier.encode():
                fail(f"{path}: not a TFLite file (no {identifier!r} identifier at byte {offset}).")
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != record[self.keys.sha256]:
            fail(f"{path}: sha256 {digest.hexdigest()[:12]}... differs from the export's "
                 f"{record[self.keys.sha256][:12]}... (corrupt or replaced): copy it again.")


def fail(message):
    """One line on stderr and exit status 1."""
    raise SystemExit(message)


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        fail(f"{what} not found: {path}")
    except (OSError, ValueError, UnicodeDecodeError) as error:
        fail(f"{path}: not readable as JSON ({type(error).__name__}: {str(error).splitlines()[0]}).")


def open_export(model):
    """The `Export` of a model path (`FILE.tflite`, `STEM.tflite` of a per-signature pair, `FILE.onnx`).

    A file exported before the contract existed has no `FILE.contract.json`: the kit refuses it
    (export it again) rather than guess the names of an older layout.
    """
    contract_path = model + CONTRACT_SUFFIX
    if not os.path.isfile(contract_path):
        fail(f"{model}: no {os.path.basename(contract_path)} beside it (it says what the file's tensors and "
             "FILE.json keys are): export the model again with `keras-posenc export` and copy every file "
             "it writes.")
    contract = read_json(contract_path, "The contract")
    metadata = read_json(model + contract["files"]["metadata_suffix"], "FILE.json")
    return Export(model, contract, metadata)


@contextlib.contextmanager
def stdout_to_stderr(active=True):
    """Routes file descriptor 1 to 2 inside the block: what native runtimes print (LiteRT's "INFO:
    ..." lines) cannot mix with the JSON a `--json` run prints on stdout afterwards."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
