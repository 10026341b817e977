"""The device kit's functions (export/jetson/), one by one, in this process: what a user on the device
meets when a file is missing, truncated or foreign, when an id, a length or a runtime version sits
at its limit, and what the runners feed and print. The runtimes are stand-ins here; the kit run on
real files is tests/test_run_tflite.py, tests/test_export_generator.py and tests/edge/edge_kit.py."""

import hashlib
import json
import os
import sys
import types

import numpy as np
import pytest
from user_checks import assert_first_refused, assert_lowest_accepted, refuses

from keras_posenc.export import contract
from keras_posenc.export.host_table import dequantized_table, quantize_table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "export", "jetson"))
import kit_contract  # noqa: E402  (the kit's modules import each other by name, as on the device)
import kit_embeddings  # noqa: E402
import kit_report  # noqa: E402
import kit_runtime  # noqa: E402
import kit_sessions  # noqa: E402
import run_generate  # noqa: E402
import run_tflite  # noqa: E402

TFLITE = b"\x1c\x00\x00\x00TFL3" + bytes(range(40))  # a flatbuffer's head: the identifier at byte 4


def record(path):
    data = open(path, "rb").read()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_export(folder, metadata=None, model=TFLITE, name="model.tflite", others=None):
    """A model file, its FILE.json (recording every file written) and its contract; the model's path."""
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(model)
    written = [path]
    for other, data in (others or {}).items():
        with open(os.path.join(folder, other), "wb") as f:
            f.write(data)
        written.append(os.path.join(folder, other))
    meta = dict(metadata or {})
    meta.setdefault("files", {os.path.basename(p): record(p) for p in written})
    with open(path + ".json", "w") as f:
        json.dump(meta, f)
    with open(path + ".contract.json", "w") as f:
        json.dump(contract.document(), f)
    return path


def exited(call):
    """The message of the SystemExit that `call()` raises."""
    with pytest.raises(SystemExit) as raised:
        call()
    return str(raised.value)


# --- kit_contract ---------------------------------------------------------------------------------


def test_fail_is_one_line_and_exit_status_1():
    with pytest.raises(SystemExit) as raised:
        kit_contract.fail("bad file")
    assert raised.value.code == "bad file"  # SystemExit with a message: printed on stderr, status 1


def test_open_export_reads_the_contract_and_the_metadata(tmp_path):
    path = write_export(tmp_path, {"kind": "window", "vocab_size": 9})
    export = kit_contract.open_export(path)
    assert export.model == path and export.folder == str(tmp_path)
    assert export.tensors.token_ids == "token_ids" and export.signatures == ["prefill", "decode"]
    assert export.get("vocab_size") == 9 and export["vocab_size"] == 9
    assert export.get("pad_id") is None and export.get("pad_id", 4) == 4
    assert export.is_kind("window") and not export.is_kind("prefill_decode")
    assert export.path("x.npy") == os.path.join(str(tmp_path), "x.npy")


def test_a_key_missing_from_file_json_is_named(tmp_path):
    export = kit_contract.open_export(write_export(tmp_path, {"pad_id": None}))
    assert export["pad_id"] is None  # present, null: no failure
    message = exited(lambda: export["vocab_size"])
    assert message == f"{export.model}: FILE.json has no 'vocab_size'; export it again."


def test_a_file_without_its_contract_is_refused(tmp_path):
    path = write_export(tmp_path)
    os.remove(path + ".contract.json")
    assert exited(lambda: kit_contract.open_export(path)) == (
        f"{path}: no model.tflite.contract.json beside it (it says what the file's tensors and "
        "FILE.json keys are): export the model again with `keras-posenc export` and copy every file "
        "it writes."
    )


def test_a_missing_or_broken_file_json_is_one_line(tmp_path):
    path = write_export(tmp_path)
    with open(path + ".json", "w") as f:
        f.write("{not json")
    message = exited(lambda: kit_contract.open_export(path))
    assert message == (
        f"{path}.json: not readable as JSON (JSONDecodeError: Expecting property name enclosed "
        "in double quotes: line 1 column 2 (char 1))."
    )
    with open(path + ".json", "w") as f:
        f.write("[1,\n\n")
    assert exited(lambda: kit_contract.open_export(path)).endswith(
        "Expecting value: line 3 column 1 (char 5))."
    )
    os.remove(path + ".json")
    assert exited(lambda: kit_contract.open_export(path)) == f"FILE.json not found: {path}.json"
    assert kit_contract.read_json(path + ".contract.json", "x") == contract.document()


def test_signature_files_one_file_or_one_per_signature(tmp_path):
    one = kit_contract.open_export(write_export(tmp_path))
    assert one.signature_files() == {"prefill": one.model, "decode": one.model}
    pair = kit_contract.open_export(
        write_export(
            tmp_path,
            {"signature_files": {"prefill": "s.prefill.tflite", "decode": "s.decode.tflite"}},
            name="s.tflite",
        )
    )
    assert pair.signature_files() == {
        "prefill": os.path.join(str(tmp_path), "s.prefill.tflite"),
        "decode": os.path.join(str(tmp_path), "s.decode.tflite"),
    }


def test_check_accelerator(tmp_path):
    export = kit_contract.open_export(write_export(tmp_path, {"accelerators": ["cpu"], "target": "cpu"}))
    export.check_accelerator("cpu")
    message = exited(lambda: export.check_accelerator("gpu"))
    assert message == (
        f"{export.model} was exported with --target cpu, which runs on cpu only; for "
        "--accelerator gpu export it with --target gpu (LiteRT GPU accelerator) or --target gl "
        "(OpenGL ES delegate)."
    )
    both = kit_contract.open_export(write_export(tmp_path, {"accelerators": ["cpu", "gpu"], "target": "gpu"}))
    both.check_accelerator("gpu")
    assert "runs on cpu and gpu only" in exited(lambda: both.check_accelerator("npu"))
    kit_contract.open_export(write_export(tmp_path, {})).check_accelerator("gpu")  # an older file: no list


def test_verify_accepts_the_file_the_export_wrote(tmp_path):
    export = kit_contract.open_export(write_export(tmp_path))
    export.verify(export.model, tflite=True)


def test_verify_names_a_truncated_a_replaced_and_a_foreign_file(tmp_path):
    export = kit_contract.open_export(write_export(tmp_path))
    model = export.model
    with open(model, "wb") as f:
        f.write(TFLITE[:-1])
    assert exited(lambda: export.verify(model)) == (
        f"{model}: {len(TFLITE) - 1} bytes, but the export wrote {len(TFLITE)} (truncated or replaced): "
        "copy it again."
    )
    replaced = TFLITE[:-1] + b"\xff"
    with open(model, "wb") as f:
        f.write(replaced)
    message = exited(lambda: export.verify(model, tflite=True))
    assert message == (
        f"{model}: sha256 {hashlib.sha256(replaced).hexdigest()[:12]}... differs from the export's "
        f"{hashlib.sha256(TFLITE).hexdigest()[:12]}... (corrupt or replaced): copy it again."
    )
    foreign = b"\x1c\x00\x00\x00ONNX" + TFLITE[8:]
    with open(model, "wb") as f:
        f.write(foreign)
    assert exited(lambda: export.verify(model, tflite=True)) == (
        f"{model}: not a TFLite file (no 'TFL3' identifier at byte 4)."
    )
    assert "sha256" in exited(lambda: export.verify(model))  # not a TFLite check: the digest differs


def test_verify_names_an_unrecorded_and_a_missing_file(tmp_path):
    export = kit_contract.open_export(write_export(tmp_path, others={"table.npy": b"123"}))
    other = export.path("other.npy")
    assert exited(lambda: export.verify(other)) == (
        f"{other}: not recorded in {export.model}.json; export it again."
    )
    os.remove(export.path("table.npy"))
    table = export.path("table.npy")
    assert exited(lambda: export.verify(table)) == (
        f"{table}: file not found (copy it from `keras-posenc export` beside {export.model})."
    )


def test_verify_reads_a_large_file_in_blocks(tmp_path):
    big = TFLITE + bytes(3 << 20)
    export = kit_contract.open_export(write_export(tmp_path, model=big))
    export.verify(export.model, tflite=True)
    with open(export.model, "r+b") as f:
        f.seek(len(big) - 1)
        f.write(b"\x01")
    assert "sha256" in exited(lambda: export.verify(export.model, tflite=True))


def test_stdout_to_stderr_moves_file_descriptor_1_inside_the_block(capfd):
    with kit_contract.stdout_to_stderr():
        os.write(1, b"native\n")
    print("after")
    os.write(1, b"fd after\n")
    out, err = capfd.readouterr()
    assert out == "after\nfd after\n" and err == "native\n"
    with kit_contract.stdout_to_stderr(active=False):
        os.write(1, b"kept\n")
    out, err = capfd.readouterr()
    assert out == "kept\n" and err == ""


# --- kit_embeddings -------------------------------------------------------------------------------


def host_export(folder, table, name="model.tflite"):
    """An export whose FILE.json names `table` (an array: .npy; a dict: .npz) beside the model."""
    suffix = ".embeddings.npz" if isinstance(table, dict) else ".embeddings.npy"
    table_path = os.path.join(folder, name + suffix)
    if isinstance(table, dict):
        np.savez(table_path, **table)
    else:
        np.save(table_path, table)
    data = open(table_path, "rb").read()
    return kit_contract.open_export(
        write_export(
            folder,
            {"embedding_table": os.path.basename(table_path)},
            name=name,
            others={os.path.basename(table_path): data},
        )
    )


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_host_table_rows_are_the_table_s_rows(tmp_path, bits):
    table = np.random.default_rng(0).normal(size=[11, 64]).astype(np.float32)
    stored = table if bits is None else quantize_table(table, bits)
    host = kit_embeddings.HostTable(host_export(str(tmp_path), stored))
    assert host.vocab == 11 and host.bits == bits
    expected = table if bits is None else dequantized_table(stored)
    ids = np.array([[3, 0, 10], [10, 10, 1]])
    rows = host.rows(ids)
    assert rows.dtype == np.float32 and rows.shape == (2, 3, 64)
    np.testing.assert_allclose(rows, expected[ids], rtol=1e-6, atol=1e-7)
    if bits is None:
        assert host.rows(np.zeros([0], int)).shape == (0, 64)


def test_a_float16_table_gives_float32_rows(tmp_path):
    table = np.arange(12, dtype=np.float16).reshape(3, 4)
    rows = kit_embeddings.HostTable(host_export(str(tmp_path), table)).rows([2])
    assert rows.dtype == np.float32 and rows.tolist() == [[8.0, 9.0, 10.0, 11.0]]


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_host_table_ids_at_the_vocabulary_s_bounds(tmp_path, bits):
    table = np.ones([7, 32], np.float32)
    host = kit_embeddings.HostTable(
        host_export(str(tmp_path), table if bits is None else quantize_table(table, bits))
    )

    def accepts(token):
        return not refuses(lambda: host.rows(np.array([[1, token]])))

    assert_first_refused(accepts, 7)  # an id equal to the vocabulary size is one line, no traceback
    assert_lowest_accepted(accepts, 0)
    assert exited(lambda: host.rows([2, 7, -1])) == "Token ids must lie in [0, 7), got ids from -1 to 7."


def test_a_host_table_missing_or_replaced_is_named(tmp_path):
    export = host_export(str(tmp_path), np.ones([3, 4], np.float32))
    table = export.path("model.tflite.embeddings.npy")
    np.save(table, np.zeros([3, 4], np.float32))
    assert "sha256" in exited(lambda: kit_embeddings.HostTable(export))
    os.remove(table)
    assert exited(lambda: kit_embeddings.HostTable(export)) == (
        f"{export.model} takes looked-up `embeddings` (exported with --embedding host): copy "
        "model.tflite.embeddings.npy from `keras-posenc export` beside it."
    )


# --- kit_report -----------------------------------------------------------------------------------


def test_time_runs_times_only_the_runs_after_the_warmup(monkeypatch):
    now = [0.0]
    calls = []

    def invoke():
        calls.append(now[0])
        now[0] += len(calls)  # the n-th call takes n seconds

    monkeypatch.setattr(kit_report.time, "perf_counter", lambda: now[0])
    times = kit_report.time_runs(invoke, iterations=3, warmup=2)
    assert len(calls) == 5 and times == [3.0, 4.0, 5.0]
    assert kit_report.time_runs(invoke, iterations=1, warmup=0) == [6.0]


def test_summarize_reports_percentiles_and_the_checksum():
    times = [i / 1000 for i in range(1, 101)]
    result = np.array([[1.5, -2.5], [0.5, 4.0]], np.float32)
    summary = kit_report.summarize(times, result, runtime="r", accelerator="cpu")
    assert summary.pop("output_shape") == [2, 2]
    assert summary == pytest.approx(
        {
            "runtime": "r",
            "accelerator": "cpu",
            "iterations": 100,
            "p50_ms": 50.5,
            "p90_ms": 90.1,
            "p99_ms": 99.01,
            "checksum": 3.5,
            "mean_abs": 2.125,
        }
    )
    assert isinstance(summary["checksum"], float) and isinstance(summary["p50_ms"], float)
    # float32 outputs are summed in float64: a float32 sum would lose the 1 next to 1e8
    assert kit_report.summarize([0.1], np.array([1e8, 1.0, -1e8], np.float32))["checksum"] == 1.0


def test_print_summary_as_json_or_as_lines(capsys):
    summary = kit_report.summarize([0.001, 0.003], np.ones([1, 3]), runtime="r")
    kit_report.print_summary(summary, "HEADER", as_json=True)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == summary
    kit_report.print_summary(summary, "HEADER", as_json=False)
    assert capsys.readouterr().out == (
        "HEADER\n"
        "latency over 2 runs: p50 2.000 ms  p90 2.800 ms  p99 2.980 ms\n"
        "output (1, 3): checksum (sum) 3.000000  mean |x| 1.000000\n"
    )


# --- kit_runtime ----------------------------------------------------------------------------------


def module(name, **attributes):
    made = types.ModuleType(name)
    made.__dict__.update(attributes)
    return made


def only_tensorflow(monkeypatch, version):
    """No tflite-runtime; TensorFlow `version` (its lite Interpreter records its arguments)."""
    monkeypatch.setitem(sys.modules, "tflite_runtime", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", None)
    lite = types.SimpleNamespace(
        Interpreter=lambda **kw: ("tf-interpreter", kw),
        experimental=types.SimpleNamespace(load_delegate=lambda so: ("tf-delegate", so)),
    )
    monkeypatch.setitem(sys.modules, "tensorflow", module("tensorflow", __version__=version, lite=lite))


def only_tflite_runtime(monkeypatch, version="2.14.0"):
    interpreter = module(
        "tflite_runtime.interpreter",
        Interpreter=lambda **kw: ("tflite-interpreter", kw),
        load_delegate=lambda so: ("tflite-delegate", so),
    )
    monkeypatch.setitem(
        sys.modules, "tflite_runtime", module("tflite_runtime", __version__=version, interpreter=interpreter)
    )
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", interpreter)


@pytest.mark.parametrize(
    "version, expected",
    [("2.21.0", (2, 21)), ("2.9.1rc0", (2, 9)), ("3.0", (3, 0)), ("2.x", (2,)), ("10.12.3", (10, 12))],
)
def test_classic_version_of_tensorflow(monkeypatch, version, expected):
    only_tensorflow(monkeypatch, version)
    assert kit_runtime.classic_version() == ("tensorflow", expected)


def test_classic_version_prefers_tflite_runtime_and_none_without_either(monkeypatch):
    only_tflite_runtime(monkeypatch, "2.14.0")
    assert kit_runtime.classic_version() == ("tflite_runtime", (2, 14))
    monkeypatch.setitem(sys.modules, "tflite_runtime", None)
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    assert kit_runtime.classic_version() == (None, None)
    monkeypatch.setitem(sys.modules, "tensorflow", module("tensorflow"))  # no __version__
    assert kit_runtime.classic_version() == ("tensorflow", (0, 0))


def litert_export(tmp_path, quantization=None):
    meta = {} if quantization is None else {"quantization": quantization}
    return kit_contract.open_export(write_export(str(tmp_path), meta))


INT4 = {"runtime": "litert", "precision": "int4", "weights": "int4 blockwise"}


def test_the_classic_runtime_s_version_check_at_its_boundary(tmp_path, monkeypatch):
    export = litert_export(tmp_path, INT4)

    def accepts(version):
        monkeypatch.setattr(kit_runtime, "classic_version", lambda: ("tensorflow", version))
        return not refuses(lambda: kit_runtime.check_classic(export, None))

    assert kit_runtime.LITERT_RUNTIME_TENSORFLOW == (2, 21)
    assert_lowest_accepted(accepts, (2, 21))  # the version the message names runs the file
    assert accepts((3, 0)) and not accepts((1, 99)) and not accepts(None)
    monkeypatch.setattr(kit_runtime, "classic_version", lambda: ("tensorflow", (2, 20)))
    assert exited(lambda: kit_runtime.check_classic(export, None)) == (
        f"{export.model} holds int4 weights (int4 blockwise) that tensorflow 2.20 does not compute right "
        "on the CPU: run it with ai-edge-litert (pip install ai-edge-litert; the default --runtime auto "
        "uses it) or TensorFlow >= 2.21, or with --delegate on the GPU."
    )


def test_the_classic_check_refuses_tflite_runtime_and_skips_other_files(tmp_path, monkeypatch):
    export = litert_export(tmp_path, INT4)
    monkeypatch.setattr(kit_runtime, "classic_version", lambda: ("tflite_runtime", (2, 99)))
    assert "tflite_runtime 2.99 does not compute right" in exited(
        lambda: kit_runtime.check_classic(export, None)
    )
    kit_runtime.check_classic(export, "libdelegate.so")  # the GPU delegate computes it
    kit_runtime.check_classic(litert_export(tmp_path, {"runtime": "tflite", "precision": "int8"}), None)
    kit_runtime.check_classic(litert_export(tmp_path), None)


def test_without_any_classic_runtime_the_user_is_told_what_to_install(tmp_path, monkeypatch):
    """An int4 file on a device with no TFLite runtime at all: the message says what to install
    (it said "None  does not compute right")."""
    export = litert_export(tmp_path, INT4)
    monkeypatch.setitem(sys.modules, "tflite_runtime", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", None)
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    kit_runtime.check_classic(export, None)
    assert exited(
        lambda: kit_runtime.open_runtime(
            runtime_args(runtime="interpreter"), litert_stand_in(), kit_runtime.interpreter, export
        )
    ) == ("No TFLite runtime: pip install ai-edge-litert (JetPack 6) or tflite-runtime (JetPack 5).")


def test_interpreter_prefers_tflite_runtime(monkeypatch):
    only_tflite_runtime(monkeypatch)
    made, name = kit_runtime.interpreter("m.tflite", "gpu.so", 4)
    assert name == "tflite_runtime"
    assert made == (
        "tflite-interpreter",
        {
            "model_path": "m.tflite",
            "experimental_delegates": [("tflite-delegate", "gpu.so")],
            "num_threads": 4,
        },
    )
    made, _ = kit_runtime.interpreter("m.tflite", None, None)
    assert made == ("tflite-interpreter", {"model_path": "m.tflite", "experimental_delegates": None})


def test_interpreter_falls_back_to_tensorflow_then_says_what_to_install(monkeypatch):
    only_tensorflow(monkeypatch, "2.21.0")
    made, name = kit_runtime.interpreter("m.tflite", "gpu.so", None)
    assert name == "tensorflow"
    assert made == (
        "tf-interpreter",
        {"model_path": "m.tflite", "experimental_delegates": [("tf-delegate", "gpu.so")]},
    )
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    assert exited(lambda: kit_runtime.interpreter("m.tflite", None, None)) == (
        "No TFLite runtime: pip install ai-edge-litert (JetPack 6) or tflite-runtime (JetPack 5)."
    )


def fake_litert(monkeypatch):
    """Stand-ins for ai-edge-litert's modules; `CompiledModel.from_file` returns what it was given."""
    options = lambda **kw: ("Options", kw)  # noqa: E731
    parts = {
        "ai_edge_litert.compiled_model": {
            "CompiledModel": types.SimpleNamespace(
                from_file=lambda path, options: ("compiled", path, options)
            )
        },
        "ai_edge_litert.cpu_options": {"CpuOptions": lambda **kw: ("CpuOptions", kw)},
        "ai_edge_litert.gpu_options": {"GpuOptions": lambda **kw: ("GpuOptions", kw)},
        "ai_edge_litert.hardware_accelerator": {
            "HardwareAccelerator": types.SimpleNamespace(CPU="CPU", GPU="GPU")
        },
        "ai_edge_litert.options": {"Options": options},
    }
    monkeypatch.setitem(sys.modules, "ai_edge_litert", module("ai_edge_litert", __path__=[]))
    for name, attributes in parts.items():
        monkeypatch.setitem(sys.modules, name, module(name, **attributes))


def test_compiled_model_options(monkeypatch):
    fake_litert(monkeypatch)
    assert kit_runtime.compiled_model("m.tflite", "gpu", 4, "fp32") == (
        "compiled",
        "m.tflite",
        ("Options", {"hardware_accelerators": "GPU", "gpu_options": ("GpuOptions", {"enforce_f32": True})}),
    )
    assert kit_runtime.compiled_model("m.tflite", "gpu", None, "fp16")[2][1]["gpu_options"] == (
        "GpuOptions",
        {"enforce_f32": False},
    )
    assert kit_runtime.compiled_model("m.tflite", "cpu", 3, "fp32") == (
        "compiled",
        "m.tflite",
        ("Options", {"hardware_accelerators": "CPU", "cpu_options": ("CpuOptions", {"num_threads": 3})}),
    )
    assert kit_runtime.compiled_model("m.tflite", "cpu", None, "fp32")[2][1]["cpu_options"] is None


def runtime_args(**given):
    return types.SimpleNamespace(
        **{
            "runtime": "auto",
            "delegate": None,
            "accelerator": "cpu",
            "threads": 2,
            "precision": "fp32",
            "model": "m.tflite",
            **given,
        }
    )


def litert_stand_in(available=True):
    def litert(model, accelerator, threads, precision):
        if not available:
            raise ImportError("no ai_edge_litert")
        return ("litert", model, accelerator, threads, precision)

    return litert


def classic_stand_in(model, delegate, threads):
    return ("classic", model, delegate, threads)


@pytest.mark.parametrize(
    "given, available, expected",
    [
        ({}, True, ("litert", "m.tflite", "cpu", 2, "fp32")),
        ({"accelerator": "gpu", "precision": "fp16"}, True, ("litert", "m.tflite", "gpu", 2, "fp16")),
        ({"runtime": "litert", "delegate": "d.so"}, True, ("litert", "m.tflite", "cpu", 2, "fp32")),
        ({}, False, ("classic", "m.tflite", None, 2)),
        ({"delegate": "d.so", "accelerator": "gpu"}, True, ("classic", "m.tflite", "d.so", 2)),
        ({"delegate": "d.so"}, True, ("classic", "m.tflite", None, 2)),  # the delegate only on the GPU
        ({"runtime": "interpreter"}, True, ("classic", "m.tflite", None, 2)),
        (
            {"runtime": "interpreter", "accelerator": "gpu", "delegate": "d.so"},
            True,
            ("classic", "m.tflite", "d.so", 2),
        ),
    ],
)
def test_open_runtime_picks_the_runtime_asked_for(given, available, expected):
    assert (
        kit_runtime.open_runtime(runtime_args(**given), litert_stand_in(available), classic_stand_in)
        == expected
    )


def test_open_runtime_says_what_is_missing():
    assert (
        exited(
            lambda: kit_runtime.open_runtime(
                runtime_args(runtime="litert"), litert_stand_in(False), classic_stand_in
            )
        )
        == "--runtime litert: pip install ai-edge-litert"
    )
    message = exited(
        lambda: kit_runtime.open_runtime(
            runtime_args(accelerator="gpu"), litert_stand_in(False), classic_stand_in
        )
    )
    assert message == (
        "--accelerator gpu without ai-edge-litert needs --delegate "
        "libtensorflowlite_gpu_delegate.so (see export/jetson/README.md)."
    )
    assert "needs --delegate" in exited(
        lambda: kit_runtime.open_runtime(
            runtime_args(accelerator="gpu", runtime="interpreter"), litert_stand_in(), classic_stand_in
        )
    )


def test_open_runtime_checks_the_classic_runtime_with_its_delegate(tmp_path, monkeypatch):
    export = litert_export(tmp_path, INT4)
    monkeypatch.setattr(kit_runtime, "classic_version", lambda: ("tensorflow", (2, 12)))
    args = runtime_args(runtime="interpreter")
    assert "does not compute right" in exited(
        lambda: kit_runtime.open_runtime(args, litert_stand_in(), classic_stand_in, export)
    )
    assert kit_runtime.open_runtime(args, litert_stand_in(), classic_stand_in) == (
        "classic",
        "m.tflite",
        None,
        2,
    )
    gpu = runtime_args(runtime="interpreter", accelerator="gpu", delegate="d.so")
    assert kit_runtime.open_runtime(gpu, litert_stand_in(), classic_stand_in, export) == (
        "classic",
        "m.tflite",
        "d.so",
        2,
    )
    assert (
        kit_runtime.open_runtime(runtime_args(), litert_stand_in(), classic_stand_in, export)[0] == "litert"
    )


# --- run_generate ---------------------------------------------------------------------------------

VOCAB, PAD, EOS = 8, 0, 7


class CountingModel:
    """A prefill/decode session whose next token is the last one + 1 (logits 10 on it, 5 on the one
    after, 0 elsewhere); it records each call's feeds. The cache holds the positions seen so far."""

    def __init__(self, tensors):
        self.tensors = tensors
        self.calls = []

    def logits(self, token):
        row = np.zeros(VOCAB, np.float32)
        row[(token + 1) % VOCAB] = 10.0
        row[(token + 2) % VOCAB] = 5.0
        return row

    def run(self, signature, feeds):
        self.calls.append((signature, feeds))
        t = self.tensors
        if signature == "prefill":
            tokens = feeds[t.token_ids]
            logits = np.stack([self.logits(int(token)) for token in tokens[0]])[None]
            return {
                t.logits: logits,
                t.present_prefix + "key_0": np.array([len(self.calls)]),
                t.present_prefix + "value_0": np.array([-len(self.calls)]),
            }
        token = int(feeds[t.token_id][0, 0])
        return {
            t.logits: self.logits(token)[None],
            t.present_prefix + "key_0": np.array([len(self.calls)]),
            t.present_prefix + "value_0": np.array([-len(self.calls)]),
        }


# The FILE.json of a small prefill/decode export.
GENERATION_META = {
    "kind": "prefill_decode",
    "prompt_length": 4,
    "cache_length": 8,
    "pad_id": PAD,
    "eos_id": EOS,
    "bos_id": 1,
    "unk_id": 2,
    "special_ids": [0, 1, 2, 7],
    "vocab_size": VOCAB,
}


def generation_export(tmp_path, **metadata):
    return kit_contract.open_export(write_export(str(tmp_path), {**GENERATION_META, **metadata}))


def test_generate_feeds_positions_and_the_cache_and_stops_at_the_end_id(tmp_path):
    meta = generation_export(tmp_path)
    model = CountingModel(meta.tensors)
    ticks = iter(range(10, 100))
    chosen = []
    ids, ttft, decode_seconds, steps = run_generate.generate(
        model, meta, [1, 2, 3], 6, None, clock=lambda: float(next(ticks)), chosen=chosen
    )
    assert ids == [4, 5, 6, 7]  # 3 -> 4 ... up to the end id 7, which is kept
    assert steps == 3 and ttft == 1.0 and decode_seconds == 1.0
    signature, feeds = model.calls[0]
    assert signature == "prefill" and feeds[meta.tensors.token_ids].tolist() == [[1, 2, 3, PAD]]
    assert feeds[meta.tensors.token_ids].dtype == np.int32
    decodes = model.calls[1:]
    assert [s for s, _ in decodes] == ["decode"] * 3
    assert [f["token_id"].tolist() for _, f in decodes] == [[[4]], [[5]], [[6]]]
    assert [f["position"].tolist() for _, f in decodes] == [[3], [4], [5]]  # the prompt's 3 tokens first
    assert all(f["token_id"].dtype == np.int32 and f["position"].dtype == np.int32 for _, f in decodes)
    assert [(f["past_key_0"].tolist(), f["past_value_0"].tolist()) for _, f in decodes] == [
        ([1], [-1]),
        ([2], [-2]),
        ([3], [-3]),
    ]  # each step gets the cache the last call returned
    assert set(decodes[0][1]) == {"token_id", "position", "past_key_0", "past_value_0"}
    assert len(chosen) == 4 and all(c.dtype == np.float32 for c in chosen)
    np.testing.assert_array_equal(chosen[0], model.logits(3))


def test_generate_never_picks_the_pad_id_and_runs_without_an_end_id(tmp_path):
    meta = generation_export(tmp_path, eos_id=None)
    model = CountingModel(meta.tensors)
    chosen = []
    ids, _, _, steps = run_generate.generate(model, meta, [5, 6], 4, None, chosen=chosen)
    assert ids == [7, 1, 2, 3]  # after 7 comes the pad id 0: its logits are masked, 1 is next best
    assert steps == 3
    assert chosen[1][PAD] == 10.0  # the logits handed back are the model's, unmasked
    ids, _, _, steps = run_generate.generate(model, meta, [5], 1, None)
    assert ids == [6] and steps == 0


def test_generate_refuses_a_prompt_or_a_length_past_the_file_s(tmp_path):
    meta = generation_export(tmp_path)  # prompt_length 4, cache_length 8

    def runs(prompt_length=None, new_tokens=1, n=None):
        prompt = [1] * (n if n is not None else prompt_length)
        return not refuses(
            lambda: run_generate.generate(CountingModel(meta.tensors), meta, prompt, new_tokens, None),
            SystemExit,
        )

    assert_first_refused(lambda n: runs(prompt_length=n), 5)
    assert_first_refused(lambda new: runs(n=3, new_tokens=new), 7)  # 3 + 6 - 1 = 8 cache slots
    assert exited(lambda: run_generate.generate(None, meta, [1] * 5, 1, None)) == (
        "The prompt has 5 tokens; this file's prefill takes at most 4 (export with a larger --prompt-length)."
    )
    assert exited(lambda: run_generate.generate(None, meta, [1] * 3, 7, None)) == (
        "3 prompt tokens + --max-new-tokens 7 need 9 cache slots; the file has 8 (export with a larger "
        "--cache-length)."
    )


def test_typed_feeds_in_the_file_s_dtypes_and_host_rows(tmp_path):
    table = np.arange(VOCAB * 4, dtype=np.float32).reshape(VOCAB, 4)
    meta = host_export(str(tmp_path), table)
    host = kit_embeddings.HostTable(meta)
    tensors = meta.tensors
    arrays = kit_sessions.typed(
        {"token_ids": np.array([[1, 2]]), "x": [1.5]},
        {"embeddings": np.float32, "x": np.float32},
        host,
        tensors,
    )
    assert arrays["embeddings"].tolist() == table[[[1, 2]]].tolist() and arrays["x"].dtype == np.float32
    arrays = kit_sessions.typed(
        {"token_id": np.array([[3]]), "position": np.array([5])},
        {"embeddings": np.float32, "position": np.float32},
        host,
        tensors,
    )
    assert arrays["embeddings"].tolist() == [[table[3].tolist()]] and arrays["position"].dtype == np.float32
    assert (
        kit_sessions.typed({"token_ids": [[1]]}, {"token_ids": np.int32}, None, tensors)["token_ids"].dtype
        == np.int32
    )


def test_checksum_is_order_sensitive():
    assert run_generate.checksum([]) == 0
    assert run_generate.checksum([0]) == 1 and run_generate.checksum([4, 2]) == 5 + 6
    assert run_generate.checksum([2, 4]) != run_generate.checksum([4, 2])
    assert run_generate.checksum([10**6] * 3) == (10**6 + 1) * 6 % 1000003


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--sampler", "top_k"], "--sampler top_k needs --top-k K >= 1"),
        (["--sampler", "top_k", "--top-k", "0"], "--sampler top_k needs --top-k K >= 1"),
        (["--sampler", "top_p"], "--sampler top_p needs --top-p P in (0, 1]"),
        (["--sampler", "top_p", "--top-p", "0"], "--sampler top_p needs --top-p P in (0, 1]"),
        (["--sampler", "top_p", "--top-p", "1.01"], "--sampler top_p needs --top-p P in (0, 1]"),
        (["--temperature", "0"], "--temperature must be > 0, got 0.0"),
        (["--prompt-ids", "1,x"], "--prompt-ids must be comma-separated integers, got '1,x'"),
    ],
)
def test_run_generate_argument_errors(flags, message, capsys):
    argv = ["m.tflite"] + (flags if "--prompt-ids" in flags else ["--prompt-ids", "1"] + flags)
    with pytest.raises(SystemExit) as raised:
        run_generate.parse_args(argv)
    assert raised.value.code == 2 and f"error: {message}" in capsys.readouterr().err


def test_run_generate_argument_bounds(tmp_path):
    def parses(*flags):
        return not refuses(
            lambda: run_generate.parse_args(["m.tflite", "--prompt-ids", "1", *flags]), SystemExit
        )

    assert_lowest_accepted(lambda n: parses("--max-new-tokens", str(n)), 1)
    assert_lowest_accepted(lambda k: parses("--sampler", "top_k", "--top-k", str(k)), 1)
    assert parses("--sampler", "top_p", "--top-p", "1") and parses("--sampler", "top_p", "--top-p", "0.001")
    assert parses("--temperature", "0.001") and not parses("--temperature", "-1")
    args = run_generate.parse_args(["m.tflite", "--prompt-ids", "1,20,3"])
    assert args.prompt_ids == [1, 20, 3] and args.max_new_tokens == 32 and args.sampler == "greedy"
    assert not parses("--prompt", "hi")  # a text prompt needs the SentencePiece model
    assert not refuses(
        lambda: run_generate.parse_args(["m.tflite", "--prompt", "x", "--spm", __file__]), SystemExit
    )
    assert refuses(
        lambda: run_generate.parse_args(["m.tflite", "--prompt", "x", "--spm", str(tmp_path / "no")]),
        SystemExit,
    )


def run_generate_main(tmp_path, monkeypatch, argv, **metadata):
    meta = generation_export(tmp_path, **metadata)
    made = []

    def session(args, export):
        assert export.model == meta.model
        made.append(args)
        model = CountingModel(meta.tensors)
        model.name, model.fully_accelerated = "stand-in", None
        return model

    monkeypatch.setattr(run_generate, "make_session", session)
    return run_generate.main([meta.model, *argv]), made


def test_run_generate_main_prints_the_ids_and_a_json_object(tmp_path, monkeypatch, capsys):
    status, _ = run_generate_main(tmp_path, monkeypatch, ["--prompt-ids", "1,2", "--max-new-tokens", "3"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0 and out[0] == "runtime: stand-in  accelerator: cpu  fully accelerated: None"
    assert out[1] == "ids: [3, 4, 5]"
    assert out[2].startswith("time to first token ") and out[2].endswith(
        f"tokens/s (3 tokens), checksum {run_generate.checksum([3, 4, 5])}"
    )
    run_generate_main(
        tmp_path,
        monkeypatch,
        ["--prompt-ids", "1,2", "--max-new-tokens", "3", "--json", "--logits", str(tmp_path / "l.npy")],
    )
    shown = json.loads(capsys.readouterr().out)
    assert shown["ids"] == [3, 4, 5] and shown["text"] is None and shown["ttft_ms"] >= 0
    assert np.load(tmp_path / "l.npy").shape == (3, VOCAB)
    run_generate_main(tmp_path, monkeypatch, ["--prompt-ids", "1,5", "--max-new-tokens", "1"])
    assert (
        capsys.readouterr().out.splitlines()[2].split(", decode ")[1].startswith("n/a (one token) (1 tokens)")
    )


def test_run_generate_main_refuses_prompt_ids_outside_the_vocabulary(tmp_path, monkeypatch):
    def accepts(token):
        return not refuses(
            lambda: run_generate_main(
                tmp_path, monkeypatch, ["--prompt-ids", f"1,{token}", "--max-new-tokens", "1"]
            ),
            SystemExit,
        )

    assert_first_refused(accepts, VOCAB)
    assert_lowest_accepted(accepts, 0)
    assert exited(lambda: run_generate_main(tmp_path, monkeypatch, ["--prompt-ids", f"1,{VOCAB},9"])) == (
        f"--prompt-ids: {VOCAB} is outside the vocabulary [0, {VOCAB})."
    )


def test_run_generate_main_refuses_another_kind_a_foreign_file_and_another_accelerator(tmp_path, monkeypatch):
    assert exited(
        lambda: run_generate_main(tmp_path, monkeypatch, ["--prompt-ids", "1"], kind="window")
    ).endswith(
        "model.tflite is not a prefill/decode file: export it with `keras-posenc export MODEL --generate`."
    )
    assert "for --accelerator gpu export it with" in exited(
        lambda: run_generate_main(
            tmp_path,
            monkeypatch,
            ["--prompt-ids", "1", "--accelerator", "gpu"],
            accelerators=["cpu"],
            target="cpu",
        )
    )
    meta = generation_export(tmp_path)
    with open(meta.model, "r+b") as f:
        f.write(b"\x00" * 8)
    assert "not a TFLite file" in exited(lambda: run_generate.main([meta.model, "--prompt-ids", "1"]))


def test_make_session_of_an_onnx_pair_needs_onnxruntime(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    args = types.SimpleNamespace(model="m.onnx")
    assert exited(lambda: run_generate.make_session(args, None)) == (
        "An .onnx pair needs onnxruntime (onnxruntime-gpu on a Jetson)."
    )


# --- run_tflite -----------------------------------------------------------------------------------


def tflite_args(**given):
    return types.SimpleNamespace(
        **{"token_ids": None, "language_ids": None, "vocab_size": None, "seed": 0, **given}
    )


def test_random_token_ids_lie_in_1_to_the_vocabulary(tmp_path):
    export = kit_contract.open_export(write_export(str(tmp_path), {"vocab_size": 5}))
    ids = run_tflite.token_ids((4, 50), tflite_args(), export)
    assert ids.shape == (4, 50) and ids.min() == 1 and ids.max() == 4  # no pad id, none past the vocabulary
    assert (run_tflite.token_ids((4, 50), tflite_args(), export) == ids).all()
    assert (run_tflite.token_ids((4, 50), tflite_args(seed=1), export) != ids).any()
    assert run_tflite.token_ids((2, 50), tflite_args(vocab_size=3), export).max() == 2
    np.save(tmp_path / "ids.npy", np.array([[7, 8]]))
    assert run_tflite.token_ids(
        (1, 2), tflite_args(token_ids=str(tmp_path / "ids.npy")), export
    ).tolist() == [[7, 8]]
    bare = kit_contract.open_export(write_export(str(tmp_path), {}))
    assert exited(lambda: run_tflite.token_ids((1, 2), tflite_args(), bare)) == (
        "No vocab size for random token ids: pass --vocab-size or --token-ids."
    )


def test_make_inputs_by_name_in_the_file_s_dtypes(tmp_path):
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    export = host_export(str(tmp_path), table)
    export.metadata["vocab_size"] = 5
    inputs = [
        {"name": "serving_token_ids:0", "shape": [1, 3], "dtype": np.int32},
        {"name": "serving_language_ids:0", "shape": [1], "dtype": np.int32},
        {"name": "serving_embeddings:0", "shape": [1, 3, 4], "dtype": np.float32},
    ]
    ids, languages, rows = run_tflite.make_inputs(inputs, tflite_args(seed=3), export)
    assert ids.dtype == np.int32 and ids.shape == (1, 3)
    assert languages.tolist() == [0] and languages.dtype == np.int32
    assert rows.tolist() == table[ids].tolist() and rows.dtype == np.float32
    np.save(tmp_path / "lang.npy", np.array([2]))
    _, languages, _ = run_tflite.make_inputs(
        inputs, tflite_args(language_ids=str(tmp_path / "lang.npy")), export
    )
    assert languages.tolist() == [2]
    gl = [{"name": "token_ids", "shape": [1, 3], "dtype": np.float32}]
    assert run_tflite.make_inputs(gl, tflite_args(), export)[0].dtype == np.float32
    np.save(tmp_path / "ids.npy", np.array([[1, 2]]))
    assert exited(
        lambda: run_tflite.make_inputs(gl, tflite_args(token_ids=str(tmp_path / "ids.npy")), export)
    ) == ("Input 'token_ids' needs shape (1, 3), got (1, 2).")


def test_run_tflite_argument_bounds(tmp_path):
    model = write_export(str(tmp_path))

    def parses(*flags):
        return not refuses(lambda: run_tflite.parse_args([model, *flags]), SystemExit)

    assert_lowest_accepted(lambda n: parses("--iterations", str(n)), 1)
    assert_lowest_accepted(lambda n: parses("--warmup", str(n)), 0)
    assert parses.__call__() is not False
    assert refuses(lambda: run_tflite.parse_args([str(tmp_path / "none.tflite")]), SystemExit)


class StandInRunner:
    name = "stand-in"
    fully_accelerated = True

    def __init__(self):
        self.inputs = [{"name": "token_ids", "shape": [1, 2], "dtype": np.dtype(np.int32)}]
        self.invoked = 0

    def set_inputs(self, arrays):
        self.arrays = arrays

    def invoke(self):
        self.invoked += 1
        os.write(1, b"INFO: a native runtime's line\n")  # as LiteRT prints on file descriptor 1

    def output(self):
        return np.full([1, 2, 3], 0.5, np.float32)


def test_run_tflite_main_reports_the_runs(tmp_path, monkeypatch, capfd):
    model = write_export(str(tmp_path), {"vocab_size": 9})
    runner = StandInRunner()
    monkeypatch.setattr(run_tflite, "make_runner", lambda args, export=None: runner)
    assert run_tflite.main([model, "--iterations", "3", "--warmup", "2", "--json"]) == 0
    out, err = capfd.readouterr()
    shown = json.loads(out)  # the runtime's lines went to stderr
    assert err.count("INFO: a native runtime's line") == 5
    assert runner.invoked == 5 and shown["iterations"] == 3 and shown["checksum"] == 3.0
    assert (
        shown["runtime"] == "stand-in"
        and shown["accelerator"] == "cpu"
        and shown["fully_accelerated"] is True
    )
    assert shown["delegate"] is None and shown["output_shape"] == [1, 2, 3]
    assert runner.arrays[0].dtype == np.int32 and runner.arrays[0].shape == (1, 2)
    run_tflite.main([model, "--iterations", "1"])
    lines = [line for line in capfd.readouterr().out.splitlines() if not line.startswith("INFO")]
    assert lines[0] == ("runtime: stand-in  on: CPU (XNNPACK)  fully accelerated: True")


def test_run_tflite_main_names_a_failed_gpu_compile(tmp_path, monkeypatch):
    model = write_export(str(tmp_path), {"vocab_size": 9})

    def failing(args, export=None):
        raise RuntimeError("Some ops are not accelerated")

    monkeypatch.setattr(run_tflite, "make_runner", failing)
    assert exited(lambda: run_tflite.main([model, "--accelerator", "gpu"])) == (
        "GPU compilation failed: Some ops are not accelerated"
    )


# --- the runners' sessions, on stand-in runtimes ----------------------------------------------------


class StandInBuffer:
    def __init__(self, log, number=0):
        self.log, self.number = log, number

    def write(self, array):
        self.log.append(("write", array.copy(), array.flags["C_CONTIGUOUS"]))

    def read(self, size, dtype):
        self.log.append(("read", size, dtype))
        return (np.arange(size) + 100 * self.number).astype(dtype)


class StandInCompiled:
    """ai-edge-litert's CompiledModel as the runners use it: signatures, tensor details, buffers."""

    def __init__(self, signatures, accelerated=True):
        self.signatures = signatures  # {key: (inputs {name: detail}, outputs {name: detail})}
        self.accelerated = accelerated
        self.log = []

    def get_signature_list(self):
        return {key: {} for key in self.signatures}

    def get_input_tensor_details(self, key):
        return self.signatures[key][0]

    def get_output_tensor_details(self, key):
        return self.signatures[key][1]

    def create_input_buffers(self, index):
        return [StandInBuffer(self.log) for _ in list(self.signatures.values())[index][0]]

    def create_output_buffers(self, index):
        return [StandInBuffer(self.log, n) for n, _ in enumerate(list(self.signatures.values())[index][1])]

    def run_by_index(self, index, inputs, outputs):
        self.log.append(("run", index, len(inputs), len(outputs)))

    def is_fully_accelerated(self):
        return self.accelerated


def test_the_litert_runner_feeds_buffers_and_reads_the_first_output(monkeypatch):
    model = StandInCompiled(
        {
            "serving_default": (
                {
                    "token_ids": {"name": "token_ids", "dtype": "int32", "shape": [1, 3]},
                    "language_ids": {"name": "language_ids", "dtype": "int32", "shape": [1]},
                },
                {"logits": {"shape": [1, 3, 2]}, "other": {"shape": [5]}},
            )
        },
        accelerated=False,
    )
    opened = []
    monkeypatch.setattr(run_tflite, "compiled_model", lambda *args: opened.append(args) or model)
    runner = run_tflite.LiteRtRunner("m.tflite", "gpu", 2, "fp16")
    assert [(d["name"], d["shape"]) for d in runner.inputs] == [("token_ids", [1, 3]), ("language_ids", [1])]
    assert opened == [("m.tflite", "gpu", 2, "fp16")]
    assert runner.name == "ai_edge_litert.CompiledModel" and runner.fully_accelerated is False
    assert [d["dtype"] for d in runner.inputs] == [np.dtype(np.int32)] * 2 and runner.output_shape == [
        1,
        3,
        2,
    ]
    runner.set_inputs([np.arange(6, dtype=np.int32).reshape(3, 2)[:, 0][None], np.zeros([1], np.int32)])
    runner.invoke()
    output = runner.output()
    assert (
        output.shape == (1, 3, 2) and output.dtype == np.float32 and output.ravel().tolist() == list(range(6))
    )
    writes = [entry for entry in model.log if entry[0] == "write"]
    assert [w[1].tolist() for w in writes] == [[[0, 2, 4]], [0]] and all(w[2] for w in writes)
    assert ("run", 0, 2, 2) in model.log and ("read", 6, np.float32) in model.log


class StandInInterpreter:
    def __init__(self, details):
        self.details, self.tensors, self.log = details, {}, []

    def allocate_tensors(self):
        self.log.append("allocate")

    def get_input_details(self):
        return self.details

    def set_tensor(self, index, array):
        self.tensors[index] = array

    def invoke(self):
        self.log.append("invoke")
        self.tensors[9] = sum(float(np.sum(t)) for t in self.tensors.values())

    def get_output_details(self):
        return [{"index": 9}, {"index": 10}]

    def get_tensor(self, index):
        return self.tensors[index]


def test_the_interpreter_runner_sets_tensors_by_index(monkeypatch):
    details = [
        {"index": 3, "name": "token_ids", "shape": np.array([1, 2]), "dtype": np.int32},
        {"index": 5, "name": "language_ids", "shape": np.array([1]), "dtype": np.int32},
    ]
    made = StandInInterpreter(details)
    opened = []
    monkeypatch.setattr(run_tflite, "interpreter", lambda *args: opened.append(args) or (made, "tensorflow"))
    runner = run_tflite.InterpreterRunner("m.tflite", "d.so", 3)
    assert opened == [("m.tflite", "d.so", 3)] and made.log == ["allocate"]
    assert runner.name == "tensorflow" and runner.fully_accelerated is None
    assert runner.inputs[0]["shape"] == [1, 2] and runner.inputs[1]["dtype"] == np.dtype(np.int32)
    runner.set_inputs([np.array([[2, 3]]), np.array([4])])
    assert made.tensors[3].tolist() == [[2, 3]] and made.tensors[5].tolist() == [4]
    runner.invoke()
    assert runner.output() == 9.0


def test_run_tflite_make_runner_passes_the_export_on(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(run_tflite, "open_runtime", lambda *args: seen.append(args) or "runtime")
    args, export = object(), object()
    assert run_tflite.make_runner(args, export) == "runtime"
    assert seen == [(args, run_tflite.LiteRtRunner, run_tflite.InterpreterRunner, export)]


def prefill_decode_signatures():
    return {
        "prefill": (
            {"token_ids": {"dtype": "int32"}},
            {"logits": {"shape": [1, 4, 3]}, "present_k": {"shape": [2]}},
        ),
        "decode": (
            {
                "token_id": {"dtype": "int32"},
                "position": {"dtype": "float32"},
                "past_k": {"dtype": "float32"},
            },
            {"logits": {"shape": [1, 3]}, "present_k": {"shape": [2]}},
        ),
    }


def test_the_litert_session_runs_each_signature_by_its_index(tmp_path, monkeypatch):
    meta = generation_export(tmp_path)
    model = StandInCompiled(prefill_decode_signatures())
    opened = []
    monkeypatch.setattr(kit_sessions, "compiled_model", lambda *args: opened.append(args) or model)
    session = kit_sessions.LiteRtSession(meta, "cpu", 4, "fp32")
    assert opened == [(meta.model, "cpu", 4, "fp32")]  # one file: one compiled model for both signatures
    assert session.index == {"prefill": 0, "decode": 1} and session.fully_accelerated is True
    assert session.table is None  # no host embedding table until the caller gives one
    assert session.dtypes["decode"] == {
        "token_id": np.dtype("int32"),
        "position": np.dtype("float32"),
        "past_k": np.dtype("float32"),
    }
    results = session.run(
        "decode", {"token_id": np.array([[5]]), "position": np.array([3]), "past_k": [1, 2]}
    )
    assert ("run", 1, 3, 2) in model.log
    writes = [entry[1] for entry in model.log if entry[0] == "write"]
    assert [w.dtype for w in writes] == [np.int32, np.float32, np.float32]
    assert sorted(results) == ["logits", "present_k"] and results["logits"].shape == (1, 3)
    assert results["logits"].tolist() == [[0.0, 1.0, 2.0]] and results["logits"].dtype == np.float32
    prefill = session.run("prefill", {"token_ids": np.zeros([1, 4])})
    assert prefill["logits"].shape == (1, 4, 3) and ("run", 0, 1, 2) in model.log


def test_the_litert_session_writes_an_input_again_only_when_its_array_changes(tmp_path, monkeypatch):
    meta = generation_export(tmp_path)
    model = StandInCompiled(prefill_decode_signatures())
    monkeypatch.setattr(kit_sessions, "compiled_model", lambda *args: model)
    session = kit_sessions.LiteRtSession(meta, "cpu", None, "fp32")
    source = np.array([1.0, 2.0], np.float32)  # a sentence's source: the same array at every step

    def written(feeds):
        before = len(model.log)
        session.run("decode", feeds)
        return [entry[1].tolist() for entry in model.log[before:] if entry[0] == "write"]

    assert written({"token_id": np.array([[5]]), "position": np.array([3.0], np.float32), "past_k": source}) \
        == [[[5]], [3.0], [1.0, 2.0]]
    assert written({"token_id": np.array([[6]]), "position": np.array([4.0], np.float32), "past_k": source}) \
        == [[[6]], [4.0]]
    # An equal array that is not the same one is written.
    assert written({"token_id": np.array([[6]]), "position": np.array([4.0], np.float32),
                    "past_k": source.copy()}) == [[[6]], [4.0], [1.0, 2.0]]


def test_the_litert_session_keeps_what_it_wrote_per_signature(tmp_path, monkeypatch):
    """Two signatures with an input of the same name have two buffers: the array written to one
    is written to the other too (decode and decode_beams both take `cross_key_0`)."""
    meta = generation_export(tmp_path)
    both = ({"cross": {"dtype": "float32"}}, {"logits": {"shape": [1]}})
    model = StandInCompiled({"prefill": both, "decode": both})
    monkeypatch.setattr(kit_sessions, "compiled_model", lambda *args: model)
    session = kit_sessions.LiteRtSession(meta, "cpu", None, "fp32")
    source = np.array([1.0, 2.0], np.float32)
    for signature in ("prefill", "decode", "prefill", "decode"):
        session.run(signature, {"cross": source})
    assert [entry[0] for entry in model.log if entry[0] != "read"] == ["write", "run", "write", "run", "run",
                                                                       "run"]


def test_a_gl_pair_opens_each_file_once_with_its_own_runtime(tmp_path, monkeypatch):
    meta = generation_export(
        tmp_path, signature_files={"prefill": "s.prefill.tflite", "decode": "s.decode.tflite"}
    )
    opened = []

    def compiled(path, *args):
        opened.append(path)
        return StandInCompiled(prefill_decode_signatures(), accelerated=path.endswith("decode.tflite"))

    monkeypatch.setattr(kit_sessions, "compiled_model", compiled)
    session = kit_sessions.LiteRtSession(meta, "gpu", None, "fp16")
    assert sorted(opened) == sorted(meta.signature_files().values())
    assert session.fully_accelerated is False  # all files must be fully accelerated


class StandInSignatureRunner:
    def __init__(self, key, log):
        self.key, self.log = key, log

    def get_input_details(self):
        return {"token_ids": {"dtype": np.int32}, "position": {"dtype": np.float32}}

    def __call__(self, **feeds):
        self.log.append((self.key, feeds))
        return {"logits": np.zeros([1, 3])}


def test_the_interpreter_session_opens_one_interpreter_per_file(tmp_path, monkeypatch):
    log, opened = [], []

    def open_interpreter(path, delegate, threads):
        opened.append((path, delegate, threads))
        made = types.SimpleNamespace(get_signature_runner=lambda key: StandInSignatureRunner(key, log))
        return made, "tflite_runtime"

    monkeypatch.setattr(kit_sessions, "open_interpreter", open_interpreter)
    one = generation_export(tmp_path)
    session = kit_sessions.InterpreterSession(one, "d.so", 2)
    assert opened == [(one.model, "d.so", 2)] and session.name == "tflite_runtime"
    assert session.fully_accelerated is None and session.table is None
    assert session.run("decode", {"token_ids": [[1]], "position": [3]}) == {
        "logits": pytest.approx(np.zeros([1, 3]))
    }
    key, feeds = log[0]
    assert key == "decode" and feeds["token_ids"].dtype == np.int32 and feeds["position"].dtype == np.float32
    pair = generation_export(tmp_path, signature_files={"prefill": "p.tflite", "decode": "d.tflite"})
    opened.clear()
    kit_sessions.InterpreterSession(pair, "d.so", None)
    assert sorted(path for path, _, _ in opened) == sorted(pair.signature_files().values())


def test_the_onnx_session_prefers_tensorrt_then_cuda(tmp_path, monkeypatch):
    made = []

    class Session:
        def __init__(self, file, providers):
            made.append((file, providers))

        def get_outputs(self):
            return [types.SimpleNamespace(name="logits"), types.SimpleNamespace(name="present_k")]

        def run(self, names, feeds):
            assert names is None
            return [np.ones([1, 3]), np.zeros([2])]

    available = ["CPUExecutionProvider", "CUDAExecutionProvider", "OtherProvider"]
    monkeypatch.setitem(
        sys.modules,
        "onnxruntime",
        module("onnxruntime", get_available_providers=lambda: available, InferenceSession=Session),
    )
    meta = generation_export(
        tmp_path, signature_files={"prefill": "s.prefill.onnx", "decode": "s.decode.onnx"}
    )
    session = kit_sessions.OnnxSession(meta)
    assert session.name == "onnxruntime (CUDAExecutionProvider)" and session.fully_accelerated is None
    assert session.table is None  # no host embedding table until the caller gives one
    assert sorted(made) == sorted(
        (path, ["CUDAExecutionProvider", "CPUExecutionProvider"]) for path in meta.signature_files().values()
    )
    results = session.run("decode", {"token_id": np.array([[1]])})
    assert sorted(results) == ["logits", "present_k"] and results["logits"].tolist() == [[1.0, 1.0, 1.0]]
    available.insert(0, "TensorrtExecutionProvider")
    assert kit_sessions.OnnxSession(meta).name == "onnxruntime (TensorrtExecutionProvider)"


def test_run_generate_make_session_of_a_tflite_file_opens_the_runtime_with_the_export(monkeypatch):
    seen, made = [], []
    monkeypatch.setattr(kit_sessions, "open_runtime", lambda *args: seen.append(args) or "session")
    args = types.SimpleNamespace(model="m.tflite")
    assert run_generate.make_session(args, "export") == "session"
    (given, litert, classic, export), = seen
    assert given is args and export == "export"
    monkeypatch.setattr(kit_sessions, "LiteRtSession", lambda *given: made.append(("litert", given)))
    monkeypatch.setattr(kit_sessions, "InterpreterSession", lambda *given: made.append(("classic", given)))
    litert("m.tflite", "gpu", 2, "fp16")
    classic("m.tflite", "d.so", None)
    assert made == [("litert", ("export", "gpu", 2, "fp16")), ("classic", ("export", "d.so", None))]


def test_embedding_table_only_for_a_host_export(tmp_path):
    assert run_generate.embedding_table(generation_export(tmp_path)) is None
    host = host_export(str(tmp_path), np.ones([3, 4], np.float32))
    assert isinstance(run_generate.embedding_table(host), kit_embeddings.HostTable)


def test_make_inputs_finds_the_token_input_in_any_order(tmp_path):
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    export = host_export(str(tmp_path), table)
    export.metadata["vocab_size"] = 5
    inputs = [
        {"name": "language_ids", "shape": [2], "dtype": np.int32},
        {"name": "embeddings", "shape": [2, 3, 4], "dtype": np.float32},
        {"name": "token_ids", "shape": [2, 3], "dtype": np.int32},
    ]
    languages, rows, ids = run_tflite.make_inputs(inputs, tflite_args(), export)
    assert languages.shape == (2,) and ids.shape == (2, 3) and rows.tolist() == table[ids].tolist()


def test_run_tflite_main_on_the_gpu_with_the_runtime_asked_for(tmp_path, monkeypatch, capsys):
    model = write_export(str(tmp_path), {"vocab_size": 9, "accelerators": ["cpu", "gpu"], "target": "gpu"})
    seen = []

    def runner(args, export=None):
        seen.append((args.model, args.accelerator, args.delegate, export.model))
        return StandInRunner()

    monkeypatch.setattr(run_tflite, "make_runner", runner)
    run_tflite.main([model, "--iterations", "1", "--accelerator", "gpu"])
    assert seen == [(model, "gpu", None, model)]
    assert capsys.readouterr().out.splitlines()[0] == (
        "runtime: stand-in  on: LiteRT GPU accelerator  fully accelerated: True"
    )
    run_tflite.main([model, "--iterations", "1", "--accelerator", "gpu", "--delegate", "d.so", "--json"])
    assert json.loads(capsys.readouterr().out)["delegate"] == "d.so"
    run_tflite.main([model, "--iterations", "1", "--accelerator", "gpu", "--delegate", "d.so"])
    assert capsys.readouterr().out.splitlines()[0] == "runtime: stand-in  on: d.so  fully accelerated: True"


def test_run_tflite_main_checks_the_file_before_a_runtime_opens_it(tmp_path, monkeypatch):
    monkeypatch.setattr(run_tflite, "make_runner", lambda args, export=None: StandInRunner())
    cpu = write_export(str(tmp_path), {"vocab_size": 9, "accelerators": ["cpu"], "target": "cpu"})
    assert "was exported with --target cpu" in exited(lambda: run_tflite.main([cpu, "--accelerator", "gpu"]))
    foreign = write_export(str(tmp_path), {"vocab_size": 9}, model=b"\x00" * 40, name="foreign.tflite")
    assert exited(lambda: run_tflite.main([foreign])) == (
        f"{foreign}: not a TFLite file (no 'TFL3' identifier at byte 4)."
    )


@pytest.mark.parametrize("runner", [run_tflite, run_generate], ids=["run_tflite", "run_generate"])
def test_the_runners_help_is_what_a_device_user_reads(runner, monkeypatch, capsys):
    """`--help` word for word (tests/data/kit_help/; after a change to an option, regenerate it with
    `COLUMNS=100 python3 export/jetson/RUNNER.py --help > tests/data/kit_help/RUNNER.txt`; run_translate's
    is tests/test_kit_translate.py's)."""
    name = runner.__name__
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])
    with pytest.raises(SystemExit) as raised:
        runner.parse_args(["--help"])
    assert raised.value.code == 0
    expected = open(os.path.join(os.path.dirname(__file__), "data", "kit_help", f"{name}.txt")).read()
    assert capsys.readouterr().out == expected


class StandInPieces:
    """sentencepiece's processor as run_generate uses it: a word is its id in `WORDS`."""

    WORDS = ["<pad>", "<s>", "<unk>", "a", "b", "c", "d", "</s>"]

    loaded = []

    def Load(self, path):  # noqa: N802  (sentencepiece's names)
        self.loaded.append(path)

    def EncodeAsIds(self, text):  # noqa: N802
        return [self.WORDS.index(word) for word in text.split()]

    def DecodeIds(self, ids):  # noqa: N802
        return " ".join(self.WORDS[i] for i in ids)


def test_run_generate_main_with_a_text_prompt(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(
        sys.modules, "sentencepiece", module("sentencepiece", SentencePieceProcessor=StandInPieces)
    )
    prompts = []
    real_generate = run_generate.generate

    def recording(session, meta, prompt_ids, *args, **kwargs):
        prompts.append(list(prompt_ids))
        return real_generate(session, meta, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(run_generate, "generate", recording)
    argv = ["--prompt", "a b", "--spm", __file__, "--max-new-tokens", "4"]
    run_generate_main(tmp_path, monkeypatch, argv)
    assert prompts == [[1, 3, 4]]  # <s> first
    assert StandInPieces.loaded[-1] == __file__
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "a b c d"  # the prompt, then the new text without </s> (special ids left out)
    run_generate_main(tmp_path, monkeypatch, [*argv, "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["ids"] == [5, 6, 7] and shown["text"] == "c d"
    assert shown["decode_tokens_per_s"] > 0
    run_generate_main(
        tmp_path,
        monkeypatch,
        ["--prompt", "c", "--spm", __file__, "--max-new-tokens", "3"],
        special_ids=[0, 1, 2, 7, 6],
    )
    assert capsys.readouterr().out.splitlines()[1] == "c "  # 6 is special too; unk would be kept


def test_run_generate_main_passes_the_sampling_options_on(tmp_path, monkeypatch, capsys):
    calls = []

    def recording(session, meta, prompt_ids, max_new_tokens, rng, chosen=None, **sampling):
        calls.append((max_new_tokens, rng.integers(1 << 30), sampling, session.table))
        return [3], 0.5, 0.0, 0

    monkeypatch.setattr(run_generate, "generate", recording)
    argv = [
        "--prompt-ids",
        "1",
        "--max-new-tokens",
        "5",
        "--sampler",
        "top_p",
        "--top-p",
        "0.5",
        "--temperature",
        "0.7",
        "--seed",
        "11",
    ]
    run_generate_main(tmp_path, monkeypatch, argv)
    run_generate_main(tmp_path, monkeypatch, argv)
    assert calls[0][0] == 5 and calls[0][2] == {"sampler": "top_p", "temperature": 0.7, "k": None, "p": 0.5}
    assert calls[0][1] == calls[1][1] == np.random.default_rng(11).integers(1 << 30)
    assert calls[0][3] is None
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "time to first token 500.0 ms, decode n/a (one token) (1 tokens), checksum 4"


def test_generate_samples_with_the_seeded_generator_and_the_options_given(tmp_path):
    meta = generation_export(tmp_path, eos_id=None)

    def run(seed, **sampling):
        rng = np.random.default_rng(seed)
        return run_generate.generate(CountingModel(meta.tensors), meta, [3], 6, rng, **sampling)[0]

    hot = {"sampler": "top_k", "k": 2, "temperature": 5.0}
    runs = [run(seed, **hot) for seed in range(6)]
    assert run(0, **hot) == runs[0]
    assert len({tuple(r) for r in runs}) > 1  # not greedy: the second-best id is drawn at times
    assert all(r[0] in (4, 5) for r in runs)  # the first id sampled too (not only the decode steps)
    assert {r[0] for r in runs} == {4, 5}
    # the decode steps sample too: somewhere an id is not the one after its predecessor (greedy's pick)
    assert any(b != (a + 1) % VOCAB for r in runs for a, b in zip(r, r[1:]) if (a + 1) % VOCAB != PAD)
    assert run(0) == [4, 5, 6, 7, 1, 2]  # greedy by default


def test_the_kit_sampler_takes_large_logits_and_breaks_ties_by_id():
    rng = np.random.default_rng(0)
    large = np.array([1000.0, 999.0, 0.0, -5.0])
    draws = {run_generate.sample(large, rng, "top_k", 1.0, 2, None) for _ in range(200)}
    assert draws == {0, 1}
    assert run_generate.sample([0.0, 800.0, 1.0], rng, "top_p", 1.0, None, 0.9) == 1
    ties = np.zeros(5000)
    ties[[1234, 4000]] = 3.0
    assert {run_generate.sample(ties, rng, "top_k", 1.0, 1, None) for _ in range(20)} == {1234}


def test_the_kit_sampler_s_temperature_default_is_1():
    """Top-2 of (0.6, 0.3, 0.1) at temperature 1 draws the first id 2/3 of the time (at 2: 0.59)."""
    rng = np.random.default_rng(0)
    draws = [run_generate.sample(np.log([0.6, 0.3, 0.1]), rng, "top_k", k=2) for _ in range(2000)]
    assert 0.63 < draws.count(0) / 2000 < 0.70


def test_run_generate_main_s_json_and_rates(tmp_path, monkeypatch, capfd):
    def fixed(session, meta, prompt_ids, max_new_tokens, rng, chosen=None, **sampling):
        os.write(1, b"INFO: a native runtime's line\n")
        return [3, 4, 5], 0.5, 0.25, 2

    monkeypatch.setattr(run_generate, "generate", fixed)
    status, _ = run_generate_main(tmp_path, monkeypatch, ["--prompt-ids", "1", "--json"])
    out, err = capfd.readouterr()
    assert status == 0 and "INFO" in err
    assert json.loads(out) == {"ids": [3, 4, 5], "text": None, "ttft_ms": 500.0, "decode_tokens_per_s": 8.0}
    monkeypatch.setattr(run_generate, "generate", lambda *a, **k: ([3, 4], 0.5, 0.0, 1))
    run_generate_main(tmp_path, monkeypatch, ["--prompt-ids", "1", "--json"])
    assert json.loads(capfd.readouterr().out)["decode_tokens_per_s"] is None  # no time measured: no rate


def test_run_generate_parse_args_defaults_and_types():
    args = run_generate.parse_args(["m.tflite", "--prompt-ids", "1", "--threads", "4", "--seed", "7"])
    assert (args.precision, args.runtime, args.temperature, args.accelerator) == ("fp32", "auto", 1.0, "cpu")
    assert args.threads == 4 and args.seed == 7 and args.k is None and args.p is None and not args.json
    assert args.delegate is None and args.logits is None and args.spm is None and args.prompt is None


def test_run_generate_parse_args_text_prompt_message(capsys):
    with pytest.raises(SystemExit):
        run_generate.parse_args(["m.tflite", "--prompt", "hi"])
    assert capsys.readouterr().err.endswith("error: --prompt needs --spm SPM_MODEL (or give --prompt-ids)\n")


def test_run_generate_main_feeds_a_host_table_and_checks_an_onnx_pair_as_onnx(tmp_path, monkeypatch):
    tables = []

    def recording(session, meta, prompt_ids, *args, **kwargs):
        tables.append(session.table)
        return [3], 0.1, 0.0, 0

    monkeypatch.setattr(run_generate, "generate", recording)
    table_path = str(tmp_path / "model.tflite.embeddings.npy")
    np.save(table_path, np.ones([VOCAB, 4], np.float32))
    data = open(table_path, "rb").read()
    meta = dict(GENERATION_META, embedding_table="model.tflite.embeddings.npy")
    model = write_export(str(tmp_path), meta, others={"model.tflite.embeddings.npy": data})
    monkeypatch.setattr(
        run_generate,
        "make_session",
        lambda args, export: types.SimpleNamespace(name="s", fully_accelerated=None, table="unset"),
    )
    run_generate.main([model, "--prompt-ids", "1"])
    assert isinstance(tables[0], kit_embeddings.HostTable)
    onnx = write_export(str(tmp_path), dict(meta, embedding_table=None), model=b"onnx bytes", name="m.onnx")
    run_generate.main([onnx, "--prompt-ids", "1"])  # an ONNX file has no TFLite identifier to check
    assert tables[1] is None


def test_make_session_of_an_onnx_pair(tmp_path, monkeypatch):
    made = []

    class Session:
        def __init__(self, file, providers):
            made.append(file)

    monkeypatch.setitem(
        sys.modules,
        "onnxruntime",
        module(
            "onnxruntime", get_available_providers=lambda: ["CPUExecutionProvider"], InferenceSession=Session
        ),
    )
    onnx = write_export(
        str(tmp_path),
        {"signature_files": {"prefill": "m.prefill.onnx", "decode": "m.decode.onnx"}},
        name="m.onnx",
    )
    session = run_generate.make_session(types.SimpleNamespace(model=onnx), kit_contract.open_export(onnx))
    assert (
        isinstance(session, kit_sessions.OnnxSession) and session.name == "onnxruntime (CPUExecutionProvider)"
    )
    assert sorted(made) == [str(tmp_path / "m.decode.onnx"), str(tmp_path / "m.prefill.onnx")]


def test_every_session_feeds_the_host_table_it_was_given(tmp_path, monkeypatch):
    meta = generation_export(tmp_path)
    tables = []

    def typed(feeds, dtypes, table, tensors):
        assert tensors is meta.tensors
        tables.append(table)
        return {name: np.asarray(feeds[name]) for name in dtypes}

    monkeypatch.setattr(kit_sessions, "typed", typed)
    monkeypatch.setattr(
        kit_sessions, "compiled_model", lambda *args: StandInCompiled(prefill_decode_signatures())
    )
    litert = kit_sessions.LiteRtSession(meta, "cpu", None, "fp32")
    litert.table = "the table"
    litert.run("prefill", {"token_ids": np.zeros([1, 4])})
    log = []
    monkeypatch.setattr(
        kit_sessions,
        "open_interpreter",
        lambda *args: (
            types.SimpleNamespace(get_signature_runner=lambda key: StandInSignatureRunner(key, log)),
            "tensorflow",
        ),
    )
    classic = kit_sessions.InterpreterSession(meta, None, None)
    classic.table = "another table"
    classic.run("decode", {"token_ids": [[1]], "position": [2]})
    assert tables == ["the table", "another table"]


def test_the_onnx_session_runs_the_feeds_it_is_given(tmp_path, monkeypatch):
    fed = []

    class Session:
        def __init__(self, file, providers):
            pass

        def get_outputs(self):
            return [types.SimpleNamespace(name="logits")]

        def run(self, names, feeds):
            fed.append(feeds)
            return [np.ones([1, 3])]

    monkeypatch.setitem(
        sys.modules,
        "onnxruntime",
        module(
            "onnxruntime", get_available_providers=lambda: ["CPUExecutionProvider"], InferenceSession=Session
        ),
    )
    meta = generation_export(tmp_path)
    feeds = {"token_id": np.array([[1]])}
    kit_sessions.OnnxSession(meta).run("decode", feeds)
    assert fed == [feeds]


def test_run_tflite_parse_args_defaults_types_and_messages(tmp_path, capsys):
    model = write_export(str(tmp_path))
    args = run_tflite.parse_args([model])
    assert (args.iterations, args.warmup, args.seed, args.precision, args.runtime) == (
        100,
        5,
        0,
        "fp32",
        "auto",
    )
    assert (args.accelerator, args.threads, args.vocab_size, args.delegate, args.json) == (
        "cpu",
        None,
        None,
        None,
        False,
    )
    args = run_tflite.parse_args([model, "--threads", "3", "--vocab-size", "50", "--seed", "9"])
    assert (args.threads, args.vocab_size, args.seed) == (3, 50, 9)
    with pytest.raises(SystemExit):
        run_tflite.parse_args([model, "--iterations", "0", "--warmup", "-1"])
    assert capsys.readouterr().err.endswith(
        "error: --iterations must be >= 1 and --warmup >= 0, got 0 and -1\n"
    )
    with pytest.raises(SystemExit):
        run_tflite.parse_args([str(tmp_path / "none.tflite")])
    assert capsys.readouterr().err.endswith(f"error: model file not found: {tmp_path / 'none.tflite'}\n")


def test_run_generate_main_makes_the_session_of_its_model_with_the_top_k_given(tmp_path, monkeypatch):
    options = []

    def recording(session, meta, prompt_ids, max_new_tokens, rng, chosen=None, **sampling):
        options.append(sampling)
        return [3], 0.1, 0.0, 0

    monkeypatch.setattr(run_generate, "generate", recording)
    _, made = run_generate_main(
        tmp_path, monkeypatch, ["--prompt-ids", "1", "--sampler", "top_k", "--top-k", "3"]
    )
    assert made[0].model.endswith("model.tflite") and made[0].sampler == "top_k"
    assert options == [{"sampler": "top_k", "temperature": 1.0, "k": 3, "p": None}]


def test_run_generate_names_a_missing_sentencepiece_model(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_generate.parse_args(["m.tflite", "--prompt", "x", "--spm", str(tmp_path / "spm.model")])
    assert capsys.readouterr().err.endswith(f"error: file not found: {tmp_path / 'spm.model'}\n")


def test_each_session_names_its_inputs(tmp_path, monkeypatch):
    meta = generation_export(tmp_path)
    monkeypatch.setattr(
        kit_sessions, "compiled_model", lambda *args: StandInCompiled(prefill_decode_signatures())
    )
    litert = kit_sessions.LiteRtSession(meta, "cpu", None, "fp32")
    assert litert.input_names("decode") == ["token_id", "position", "past_k"]
    monkeypatch.setattr(
        kit_sessions,
        "open_interpreter",
        lambda *args: (
            types.SimpleNamespace(get_signature_runner=lambda key: StandInSignatureRunner(key, [])),
            "tflite_runtime",
        ),
    )
    classic = kit_sessions.InterpreterSession(meta, None, None)
    assert classic.input_names("prefill") == ["token_ids", "position"]

    class Session:
        def __init__(self, file, providers):
            pass

        def get_inputs(self):
            return [types.SimpleNamespace(name="token_id"), types.SimpleNamespace(name="past_k")]

    monkeypatch.setitem(
        sys.modules,
        "onnxruntime",
        module(
            "onnxruntime", get_available_providers=lambda: ["CPUExecutionProvider"], InferenceSession=Session
        ),
    )
    assert kit_sessions.OnnxSession(meta).input_names("decode") == ["token_id", "past_k"]
