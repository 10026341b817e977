"""The Jetson kit's one-line failures when a runtime's native code does not load (kit_runtime: a
`--delegate` library, NumPy 2 under a module built for NumPy 1.x) and pack.py, with stand-ins; the real
runtimes run them in tests/edge/edge_kit_tflite_runtime.py (`make test-edge`)."""

import gc
import os
import struct
import sys
import types

import pytest
from stacks import once_on_keras2

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "export", "jetson"))
import kit_runtime  # noqa: E402  (the kit's modules import each other by name, as on the device)
import pack  # noqa: E402

pytestmark = once_on_keras2("the kit's loading code with stand-in runtimes imports no TensorFlow or Keras")


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


def test_elf_machine_reads_the_code_unsigned(tmp_path):
    # EM_ALPHA (0x9026): a code past 0x7fff is named by its number, not a negative one
    assert kit_runtime.elf_machine(elf(tmp_path / "a.so", 0x9026)) == "ELF machine 36902"
    assert kit_runtime.elf_machine(elf(tmp_path / "b.so", 0x9026, big_endian=True)) == "ELF machine 36902"


@pytest.mark.parametrize("reported, named", [("x86_64", "x86_64"), ("AMD64", "x86_64"), ("arm64", "aarch64"),
                                             ("aarch64", "aarch64"), ("AARCH64", "aarch64"), ("i686", "x86"),
                                             ("i386", "x86"), ("armv7l", "armv7l")])
def test_this_machine_is_named_as_an_elf_header_names_it(reported, named, monkeypatch):
    monkeypatch.setattr(kit_runtime.platform, "machine", lambda: reported)
    assert kit_runtime.this_machine() == named


def test_a_delegate_for_another_machine_names_both(tmp_path, monkeypatch):
    monkeypatch.setattr(kit_runtime.platform, "machine", lambda: "AMD64")
    arm = elf(tmp_path / "arm.so", 0xB7)
    assert kit_runtime.delegate_failure(arm, OSError("wrong ELF class")) == (
        f"--delegate {arm}: built for aarch64, but this machine is x86_64: build the delegate for this "
        "platform (export/jetson/README.md).")
    here = elf(tmp_path / "here.so", 0x3E)  # built for this machine: the loader's own reason
    assert kit_runtime.delegate_failure(here, OSError("undefined symbol: x")) == (
        f"--delegate {here}: the loader refused it: undefined symbol: x")


def test_a_delegate_failure_without_a_message_names_the_error(tmp_path, monkeypatch):
    monkeypatch.setattr(kit_runtime, "this_machine", lambda: "x86_64")
    here = elf(tmp_path / "here.so", 0x3E)
    assert kit_runtime.delegate_failure(here, OSError()) == (
        f"--delegate {here}: the loader refused it: OSError")
    assert kit_runtime.delegate_failure(here, RuntimeError(" ")) == (
        f"--delegate {here}: the delegate did not start: RuntimeError")
    assert kit_runtime.delegate_failure(here, AttributeError("undefined symbol")) == (
        f"--delegate {here}: not a TFLite delegate (it has no tflite_plugin_create_delegate); build "
        "libtensorflowlite_gpu_delegate.so as export/jetson/README.md shows.")


def test_load_gpu_delegate_names_what_loading_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(kit_runtime, "this_machine", lambda: "x86_64")
    monkeypatch.chdir(tmp_path)
    elf(tmp_path / "gpu.so", 0x3E)

    def raising(error):
        def load(library):
            raise error
        return load

    with pytest.raises(SystemExit) as exited:
        kit_runtime.load_gpu_delegate(raising(AttributeError("no tflite_plugin_create_delegate")), "gpu.so")
    local = os.path.join(os.curdir, "gpu.so")  # the file here, as it was loaded
    assert str(exited.value).startswith(f"--delegate {local}: not a TFLite delegate")
    with pytest.raises(SystemExit) as exited:
        kit_runtime.load_gpu_delegate(raising(ValueError("Failed to load delegate")), "gpu.so")
    assert str(exited.value).endswith(": the delegate did not start: Failed to load delegate")


def test_a_half_made_delegate_is_quiet_and_the_caller_s_unraisable_hook_is_kept(monkeypatch, capfd):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    deleted = []

    class HalfMade:
        def __init__(self, library):
            raise OSError(f"{library}: cannot open shared object file")

        def __del__(self):
            deleted.append(True)
            raise AttributeError("'HalfMade' object has no attribute '_library'")

    assert kit_runtime.load_gpu_delegate(lambda so: "delegate", "gpu.so") == "delegate"
    assert sys.unraisablehook == seen.append
    with pytest.raises(SystemExit):
        kit_runtime.load_gpu_delegate(HalfMade, "./missing.so")
    assert deleted == [True] and seen == []  # its __del__ ran, and nobody was told
    assert sys.unraisablehook == seen.append
    assert capfd.readouterr().err == ""

    class Later:
        def __del__(self):
            raise ValueError("after the load")

    Later()
    gc.collect()
    assert [type(unraisable.exc_value) for unraisable in seen] == [ValueError]  # the caller's hook again


def numpy_1_refusal(*args, **kwargs):
    """What NumPy 2 does when a module built against NumPy 1.x uses its C API: a banner on fd 2, an error."""
    os.write(2, b"\nA module that was compiled using NumPy 1.x cannot be run in\n"
                b"NumPy 2.2.6 as it may crash.\n")
    raise ImportError("numpy.core.multiarray failed to import")


def refusing_module(name):
    """A module that NumPy 2 refuses on its first use (`from name import anything`)."""
    made = types.ModuleType(name)
    made.__path__ = []
    made.__getattr__ = lambda attribute: numpy_1_refusal()
    return made


def numpy_1_message(runtime):
    import numpy

    return (f"{runtime} was built against NumPy 1.x and cannot run with numpy {numpy.__version__}, installed "
            'here: pip install "numpy<2" (see export/jetson/README.md).')


def test_each_runtime_refused_by_numpy_2_is_named(monkeypatch, capfd):
    for name in ("ai_edge_litert", "ai_edge_litert.compiled_model", "ai_edge_litert.cpu_options",
                 "ai_edge_litert.gpu_options", "ai_edge_litert.hardware_accelerator",
                 "ai_edge_litert.options"):
        monkeypatch.setitem(sys.modules, name, refusing_module(name))
    with pytest.raises(SystemExit) as exited:
        kit_runtime.compiled_model("m.tflite", "cpu", None, "fp32")
    assert str(exited.value) == numpy_1_message("ai-edge-litert")

    interpreter = types.ModuleType("tflite_runtime.interpreter")
    interpreter.Interpreter, interpreter.load_delegate = numpy_1_refusal, lambda so: so
    monkeypatch.setitem(sys.modules, "tflite_runtime", types.ModuleType("tflite_runtime"))
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", interpreter)
    with pytest.raises(SystemExit) as exited:
        kit_runtime.interpreter("m.tflite", None, None)
    assert str(exited.value) == numpy_1_message("tflite-runtime")

    monkeypatch.setitem(sys.modules, "tflite_runtime", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", None)
    tensorflow = types.ModuleType("tensorflow")
    tensorflow.lite = types.SimpleNamespace(Interpreter=numpy_1_refusal,
                                            experimental=types.SimpleNamespace(load_delegate=lambda so: so))
    monkeypatch.setitem(sys.modules, "tensorflow", tensorflow)
    with pytest.raises(SystemExit) as exited:
        kit_runtime.interpreter("m.tflite", None, None)
    assert str(exited.value) == numpy_1_message("tensorflow")
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


def test_pack_checks_each_recorded_file_against_its_record(tmp_path):
    tflite = b"\0\0\0\0TFL3" + bytes(8)
    write_export(tmp_path, "model.tflite", {"model.tflite.data.tflite": tflite,
                                            "model.tflite.embeddings.npy": b"rows"})
    model, dest = str(tmp_path / "model.tflite"), str(tmp_path / "out")
    data, rows = tmp_path / "model.tflite.data.tflite", tmp_path / "model.tflite.embeddings.npy"

    def refused():
        with pytest.raises(SystemExit) as exited:
            pack.pack(dest, [model])
        assert not os.path.exists(dest)  # nothing written
        return str(exited.value)

    data.write_bytes(tflite[:-1])
    assert refused() == f"{data}: 15 bytes, but the export wrote 16 (truncated or replaced): copy it again."
    data.write_bytes(bytes(16))  # its size, not a TFLite file
    assert refused() == f"{data}: not a TFLite file (no 'TFL3' identifier at byte 4)."
    data.write_bytes(b"\0\0\0\0TFL3" + b"x" * 8)
    assert refused().startswith(f"{data}: sha256 ")
    data.write_bytes(tflite)
    rows.write_bytes(b"ROWS")  # not a .tflite: its size and sha256 only
    assert refused().startswith(f"{rows}: sha256 ")
    rows.write_bytes(b"rows")
    assert "model.tflite.data.tflite" in pack.pack(dest, [model])


def test_kit_files_are_the_folder_s_files_without_bytecode(tmp_path, monkeypatch):
    for name in ("run_tflite.py", "README.md", "stale.pyc", "stale.pyo"):
        (tmp_path / name).write_text("x")
    (tmp_path / "__pycache__").mkdir()
    monkeypatch.setattr(pack, "KIT", str(tmp_path))
    assert pack.kit_files() == [str(tmp_path / "README.md"), str(tmp_path / "run_tflite.py")]


def test_pack_again_into_its_folder_replaces_the_files_and_refuses_a_file_as_the_folder(tmp_path):
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"old")
    dest = tmp_path / "out"
    pack.pack(str(dest), [str(spm)])
    spm.write_bytes(b"new")
    assert "spm.model" in pack.pack(str(dest), [str(spm)])
    assert (dest / "spm.model").read_bytes() == b"new"
    with pytest.raises(SystemExit) as exited:
        pack.pack(str(spm), [])
    assert str(exited.value) == f"{spm}: exists and is not a folder."
    assert spm.read_bytes() == b"new"


def test_pack_main_prints_the_folder_and_its_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["pack.py"])  # main(argv) reads its own arguments
    kit = sorted(name for name in os.listdir(pack.KIT) if os.path.isfile(os.path.join(pack.KIT, name))
                 and not name.endswith((".pyc", ".pyo")))
    dest = str(tmp_path / "out")
    assert pack.main([dest]) == 0
    assert capsys.readouterr().out == f"{dest}: {len(kit)} files ({', '.join(kit)})\n"
    (tmp_path / "spm.model").write_bytes(b"s")
    (tmp_path / "zz.bin").write_bytes(b"z")
    assert pack.main([dest, str(tmp_path / "spm.model"), str(tmp_path / "zz.bin")]) == 0
    names = sorted(kit + ["spm.model", "zz.bin"])
    assert capsys.readouterr().out == f"{dest}: {len(names)} files ({', '.join(names)})\n"
    assert sorted(os.listdir(dest)) == names


def test_pack_help_is_what_a_user_reads(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(sys, "argv", ["pack.py"])
    with pytest.raises(SystemExit) as raised:
        pack.main(["--help"])
    assert raised.value.code == 0
    assert capsys.readouterr().out == (
        "usage: pack.py [-h] dest [files ...]\n"
        "\n"
        "Writes the Jetson kit and exported files into one folder, ready to copy to the device as it is.\n"
        "\n"
        "positional arguments:\n"
        "  dest        the folder to write (created when missing)\n"
        "  files       exported models (MODEL, as given to `keras-posenc export --out`) and other files to\n"
        "              take along (spm.model)\n"
        "\n"
        "options:\n"
        "  -h, --help  show this help message and exit\n")
