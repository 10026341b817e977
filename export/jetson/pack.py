#!/usr/bin/env python3
"""Writes the Jetson kit and exported files into one folder, ready to copy to the device as it is.

Run on the training machine, from the repository (stdlib only):

    python3 export/jetson/pack.py posenc model.tflite gen_gl.tflite runs/demo/spm.model
    scp -r posenc jetson:~/

DEST (created when missing) gets every file of the kit, this folder: the runners (run_tflite.py,
run_generate.py, run_translate.py, run_tensorrt.py), the kit_*.py modules they import (kit_sessions.py
included), jetson_benchmark.sh and the README. Each exported model named (a file or a per-signature
stem with `MODEL.contract.json` beside it, as `keras-posenc export --out MODEL` writes it) brings
`MODEL.json`, `MODEL.contract.json` and every file its `MODEL.json` records: the model, or the
`STEM.prefill.*` / `STEM.decode.*` pair of a `--target gl` or `tensorrt` generation export (the
`STEM.encode.*` / `STEM.decode.*` pair of a translator's), and the `--embedding host` table. Each
of those is checked against its record (size, sha256) before it is copied. Any other file named
(spm.model, a delegate library) is copied as it is. A file that is missing, or two files of one
name, is one line on stderr and exit status 1.
"""

import argparse
import os
import shutil
import sys

from kit_contract import CONTRACT_SUFFIX, fail, open_export

KIT = os.path.dirname(os.path.abspath(__file__))


def kit_files():
    """Every file of the kit (this folder), sorted."""
    return sorted(os.path.join(KIT, name) for name in os.listdir(KIT)
                  if os.path.isfile(os.path.join(KIT, name)) and not name.endswith((".pyc", ".pyo")))


def export_files(model):
    """The files of the export `model`: MODEL.json, MODEL.contract.json and each file MODEL.json records
    (checked against its size and sha256)."""
    export = open_export(model)
    files = [model + export.files.metadata_suffix, model + CONTRACT_SUFFIX]
    for name in sorted(export.get("files") or {}):
        path = export.path(name)
        export.verify(path, tflite=path.endswith(".tflite"))
        files.append(path)
    return files


def pack(dest, named):
    """Copies the kit and the files of `named` (exports and other files) into `dest`; returns the names."""
    sources = kit_files()
    for path in named:
        if os.path.isfile(path + CONTRACT_SUFFIX):
            sources += export_files(path)
        elif os.path.isfile(path):
            sources.append(path)
        else:
            fail(f"{path}: not found (neither a file nor an export with {os.path.basename(path)}"
                 f"{CONTRACT_SUFFIX} beside it).")
    chosen = {}
    for path in sources:
        name = os.path.basename(path)
        if name in chosen and os.path.realpath(chosen[name]) != os.path.realpath(path):
            fail(f"two files named {name}: {chosen[name]} and {path}; rename one of them.")
        chosen[name] = path
    if os.path.exists(dest) and not os.path.isdir(dest):
        fail(f"{dest}: exists and is not a folder.")
    os.makedirs(dest, exist_ok=True)
    for name, path in sorted(chosen.items()):
        shutil.copy2(path, os.path.join(dest, name))
    return sorted(chosen)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", help="the folder to write (created when missing)")
    parser.add_argument("files", nargs="*", help="exported models (MODEL, as given to `keras-posenc export "
                                                 "--out`) and other files to take along (spm.model)")
    args = parser.parse_args(argv)
    names = pack(args.dest, args.files)
    print(f"{args.dest}: {len(names)} files ({', '.join(names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
