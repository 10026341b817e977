"""The Jetson kit's one-line failures when a runtime's native code does not load (kit_runtime: a
`--delegate` library, NumPy 2 under a module built for NumPy 1.x) and pack.py, with stand-ins; the real
runtimes run them in tests/edge/edge_kit_tflite_runtime.py (`make test-edge`)."""

import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "export", "jetson"))
import kit_runtime  # noqa: E402  (the kit's modules import each other by name, as on the device)
import pack  # noqa: E402


def elf(path, machine, big_endian=False):
    """A file with an ELF header for `machine` (e_machine) and nothing else."""
    head = bytearray(b"\x7fELF" + bytes(16))
    head[5] = 2 if big_endian else 1
    head[18:20] = struct.pack(">H" if big_endian else "<H", machine)
    path.write_bytes(bytes(head) + bytes(44))
    return str(path)


def test_elf_machine_reads_the_header(tmp_path):
    assert kit_runtime.elf_machine(elf(tmp_path / "a.so", 0xB7)) == "aarch64"
    assert kit_runtime.elf_machine(elf(tmp_path / "b.so", 0x3E)) == "x86_64"
    assert kit_runtime.elf_machine(elf(tmp_path / "c.so", 0xB7, big_endian=True)) == "aarch64"
    assert kit_runtime.elf_machine(elf(tmp_path / "d.so", 999)) == "ELF machine 999"
    (tmp_path / "e.so").write_bytes(b"\x7fELF")  # too short for a header
    assert kit_runtime.elf_machine(str(tmp_path / "e.so")) is None
    (tmp_path / "f.so").write_text("text, long enough to hold a header\n")
    assert kit_runtime.elf_machine(str(tmp_path / "f.so")) is None


def test_each_delegate_failure_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(kit_runtime, "this_machine", lambda: "x86_64")
    failure = kit_runtime.delegate_failure
    assert failure("./missing.so", OSError("x")) == "--delegate ./missing.so: file not found."
    assert failure("missing.so", OSError("x")).startswith("--delegate missing.so: not a file here, nor a "
                                                          "library on the loader's path")
    assert failure(str(tmp_path), OSError("x")).endswith(": a folder, not a delegate library.")
    (tmp_path / "text.so").write_text("text, long enough to hold a header\n")
    text = str(tmp_path / "text.so")
    assert failure(text, OSError("x")).endswith(": not a shared library (no ELF header).")
    arm = elf(tmp_path / "arm.so", 0xB7)
    assert failure(arm, OSError("cannot open shared object file")) == (
        f"--delegate {arm}: built for aarch64, but this machine is x86_64: build the delegate for this "
        "platform (export/jetson/README.md).")
    here = elf(tmp_path / "here.so", 0x3E)
    assert "not a TFLite delegate" in failure(here, AttributeError("undefined symbol"))
    refused = failure(here, OSError("some\n  loader reason"))
    assert refused.endswith(": the loader refused it: some loader reason")
    assert failure(here, ValueError("Failed to load delegate from x\n no GPU")).endswith(
        ": the delegate did not start: Failed to load delegate from x no GPU")


def test_load_gpu_delegate_returns_the_delegate_or_exits_with_one_line(tmp_path, monkeypatch):
    assert kit_runtime.load_gpu_delegate(lambda so: ("delegate", so), "gpu.so") == ("delegate", "gpu.so")
    monkeypatch.chdir(tmp_path)
    elf(tmp_path / "gpu.so", 0x3E)
    seen = []
    kit_runtime.load_gpu_delegate(seen.append, "gpu.so")
    assert seen == [os.path.join(os.curdir, "gpu.so")]  # a file here, not the loader's path

    class HalfMade:
        def __init__(self, library):
            raise OSError(f"{library}: cannot open shared object file")

        def __del__(self):
            raise AttributeError("'HalfMade' object has no attribute '_library'")

    hook = sys.unraisablehook
    with pytest.raises(SystemExit) as exited:
        kit_runtime.load_gpu_delegate(HalfMade, "./missing.so")
    assert str(exited.value) == "--delegate ./missing.so: file not found."
    assert sys.unraisablehook is hook


def test_numpy_abi_guard_passes_output_and_errors_on(capfd):
    with kit_runtime.numpy_abi_guard({"runtime": "r"}):
        os.write(2, b"native log line\n")
    assert capfd.readouterr().err == "native log line\n"
    with pytest.raises(ImportError, match="no module"):
        with kit_runtime.numpy_abi_guard({"runtime": "r"}):
            os.write(2, b"before\n")
            raise ImportError("no module")
    assert capfd.readouterr().err == "before\n"


def test_numpy_abi_guard_names_numpy_and_the_fix_in_one_line(capfd):
    import numpy

    with pytest.raises(SystemExit) as exited:
        with kit_runtime.numpy_abi_guard({"runtime": "tflite-runtime"}):
            # NumPy writes it to sys.stderr, file descriptor 2 outside pytest's capture
            os.write(2, b"\nA module that was compiled using NumPy 1.x cannot be run in\nNumPy 2.2.6 ...\n"
                        b"Traceback (most recent call last): ...\n")
            raise SystemError("returned a result with an exception set")
    assert str(exited.value) == (
        "tflite-runtime was built against NumPy 1.x and cannot run with numpy "
        f'{numpy.__version__}, installed here: pip install "numpy<2" (see export/jetson/README.md).')
    assert capfd.readouterr().err == ""


def write_export(folder, name, files):
    """An export `name` whose FILE.json records `files` ({name: bytes}), with its contract."""
    import hashlib
    import json

    from keras_posenc.export import contract

    for file, data in files.items():
        (folder / file).write_bytes(data)
    records = {file: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
               for file, data in files.items()}
    (folder / f"{name}.json").write_text(json.dumps({"files": records}))
    (folder / f"{name}.contract.json").write_text(json.dumps(contract.document()))


def test_pack_writes_the_kit_and_every_recorded_file(tmp_path, capsys):
    tflite = b"\0\0\0\0TFL3" + bytes(8)  # the TFLite identifier at byte 4
    write_export(tmp_path, "gen_gl.tflite", {"gen_gl.prefill.tflite": tflite,
                                             "gen_gl.decode.tflite": tflite + b"d",
                                             "gen_gl.tflite.embeddings.npy": b"e"})
    (tmp_path / "spm.model").write_bytes(b"s")
    dest = tmp_path / "out"
    names = pack.pack(str(dest), [str(tmp_path / "gen_gl.tflite"), str(tmp_path / "spm.model")])
    kit = {name for name in os.listdir(pack.KIT) if os.path.isfile(os.path.join(pack.KIT, name))}
    assert set(names) == set(os.listdir(dest)) == kit | {
        "gen_gl.prefill.tflite", "gen_gl.decode.tflite", "gen_gl.tflite.embeddings.npy", "gen_gl.tflite.json",
        "gen_gl.tflite.contract.json", "spm.model"}
    with pytest.raises(SystemExit, match="nope: not found"):
        pack.pack(str(dest), ["nope"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "spm.model").write_bytes(b"t")
    with pytest.raises(SystemExit, match="two files named spm.model"):
        pack.pack(str(dest), [str(tmp_path / "spm.model"), str(tmp_path / "other" / "spm.model")])
