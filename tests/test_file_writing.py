"""Every file the package writes (keras_posenc.files, and an export's files through
`ExportResult.save`): readable as the umask says, and whole or not there at all when a write fails
mid-way (a size limit stands in for a full disk: tests/user_checks.py)."""

import errno
import json
import os

import numpy as np
import pytest
from user_checks import assert_failed_saves_keep_files, assert_readable_per_umask, file_size_limit, umask

from keras_posenc import files
from keras_posenc.export.result import ExportResult

MASKS = [0o022, 0o077, 0o002, 0o000, 0o027]


def write_each(folder, content):
    """One file of each writer of keras_posenc.files; `content` an int that changes every file."""
    files.write_bytes(os.path.join(folder, "model.bin"), bytes([content % 256]) * (1000 + content))
    files.write_text(os.path.join(folder, "notes.txt"), "ü" * (300 + content))
    files.write_json(os.path.join(folder, "report.json"), {"loss": [content] * 40})
    files.save_npy(os.path.join(folder, "table.npy"), np.full([5 + content, 30], content, np.float32))
    files.save_npz(os.path.join(folder, "table.npz"), {"codes": np.full([3, 70 + content], content, np.int8)})
    with files.atomic_open(os.path.join(folder, "log.txt"), "w", encoding="utf-8") as f:
        f.write(f"line {content}\n" * 30)


@pytest.mark.parametrize("mask", MASKS)
def test_every_writer_s_file_is_readable_as_the_umask_says(tmp_path, mask):
    with umask(mask):
        write_each(str(tmp_path), 1)
    assert len(os.listdir(tmp_path)) == 6
    for name in os.listdir(tmp_path):
        assert_readable_per_umask(os.path.join(tmp_path, name), mask)


def test_the_files_hold_what_was_written(tmp_path):
    write_each(str(tmp_path), 3)
    assert open(tmp_path / "model.bin", "rb").read() == b"\x03" * 1003
    assert open(tmp_path / "notes.txt", encoding="utf-8").read() == "ü" * 303
    assert json.load(open(tmp_path / "report.json")) == {"loss": [3] * 40}
    assert open(tmp_path / "report.json").read().startswith('{\n "loss": [\n  3,')  # indent 1
    np.testing.assert_array_equal(np.load(tmp_path / "table.npy"), np.full([8, 30], 3, np.float32))
    with np.load(tmp_path / "table.npz") as stored:
        assert stored.files == ["codes"] and stored["codes"].shape == (3, 73)
    assert sorted(os.listdir(tmp_path)) == [
        "log.txt",
        "model.bin",
        "notes.txt",
        "report.json",
        "table.npy",
        "table.npz",
    ]  # no temporary file, np.save added no second suffix


def test_json_options_are_passed_on(tmp_path):
    path = str(tmp_path / "r.json")
    files.write_json(path, {"b": 1, "a": 2}, indent=None, sort_keys=True)
    assert open(path).read() == '{"a": 2, "b": 1}'
    files.write_text(path, "x", encoding="utf-16")
    assert open(path, "rb").read().decode("utf-16") == "x"


def test_every_writer_s_failed_save_keeps_the_earlier_files(tmp_path):
    folder = str(tmp_path)
    outcomes = assert_failed_saves_keep_files(
        folder, lambda: write_each(folder, 1), lambda: write_each(folder, 9), errors=(files.FileWriteError,)
    )
    assert len(outcomes) == 6


@pytest.mark.parametrize(
    "write",
    [
        lambda path: files.write_bytes(path + ".bin", b"x" * 5000),
        lambda path: files.write_text(path + ".txt", "x" * 5000),
        lambda path: files.write_json(path + ".json", ["x" * 5000]),
        lambda path: files.save_npy(path + ".npy", np.zeros(2000)),
        lambda path: files.save_npz(path + ".npz", {"a": np.zeros(2000)}),
    ],
    ids=["bytes", "text", "json", "npy", "npz"],
)
def test_a_failed_write_is_one_line_naming_the_file_and_leaves_no_file(tmp_path, write):
    with pytest.raises(files.FileWriteError) as raised:
        with file_size_limit(1000):
            write(str(tmp_path / "out"))
    message = str(raised.value)
    assert message.startswith(f"[Errno {errno.EFBIG}] cannot write {tmp_path / 'out'}.")
    assert "File too large" in message and f"MB free in {tmp_path})" in message and "\n" not in message
    assert raised.value.errno == errno.EFBIG and isinstance(raised.value.__cause__, OSError)
    assert os.listdir(tmp_path) == []


def test_an_interrupt_inside_the_block_removes_the_temporary_file(tmp_path):
    path = str(tmp_path / "a.npy")
    files.save_npy(path, np.ones(3))
    with pytest.raises(KeyboardInterrupt):
        with files.atomic_path(path) as temp:
            assert os.path.dirname(temp) == str(tmp_path) and temp.endswith(".npy")
            assert os.path.basename(temp).startswith(".tmp-a.npy.")
            np.save(temp, np.zeros(3))
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["a.npy"] and np.load(path).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(files.FileWriteError, match="cannot write"):
        with files.atomic_path(path) as temp:
            raise OSError(errno.ENOSPC, "No space left on device")
    assert os.listdir(tmp_path) == ["a.npy"]


def test_a_folder_that_does_not_exist_is_one_line(tmp_path):
    path = str(tmp_path / "missing" / "deeper" / "x.json")
    with pytest.raises(files.FileWriteError) as raised:
        files.write_json(path, {})
    assert str(raised.value) == (
        f"[Errno {errno.ENOENT}] cannot write {path}: No such file or directory "
        f"({files._megabytes(files.free_space(str(tmp_path)))} free in "
        f"{tmp_path / 'missing' / 'deeper'})"
    )


def test_free_space_walks_up_to_an_existing_folder(tmp_path):
    assert files.free_space(str(tmp_path / "a" / "b")) == files.free_space(str(tmp_path)) > 0
    assert files.free_space("") == files.free_space(os.getcwd())
    assert files._megabytes(3 * 2**20 + 2**19) == "3.5 MB"


def test_the_writers_refuse_a_name_they_would_change(tmp_path):
    with pytest.raises(ValueError, match="path must end with '.npy'"):
        files.save_npy(str(tmp_path / "t.np"), np.ones(1))
    with pytest.raises(ValueError, match="path must end with '.npz'"):
        files.save_npz(str(tmp_path / "t"), {"a": np.ones(1)})
    with pytest.raises(ValueError, match="mode must contain 'w', got 'rb'"):
        with files.atomic_open(str(tmp_path / "t"), "rb"):
            pass
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "name, suffix", [("model.keras", ".keras"), ("a.b.npz", ".npz"), ("plain", ""), (".hidden", "")]
)
def test_the_temporary_name_keeps_the_final_suffix(tmp_path, name, suffix):
    temp = files._temp_name(str(tmp_path / name))
    assert os.path.basename(temp).startswith(".tmp-" + name + ".") and temp.endswith(suffix)
    assert os.path.dirname(temp) == str(tmp_path)


def test_a_long_name_s_temporary_name_stays_short(tmp_path):
    temp = files._temp_name(str(tmp_path / ("x" * 200 + ".json")))
    assert len(os.path.basename(temp)) < 70 and temp.endswith(".json")


@pytest.mark.parametrize(
    "error, full",
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (RuntimeError("ResourceExhausted: No space left on device while writing"), True),
        (RuntimeError("... Disk quota exceeded ..."), True),
        (RuntimeError("out of memory"), False),
    ],
)
def test_is_disk_full(error, full):
    assert files.is_disk_full(error) is full


# --- an export's files ------------------------------------------------------------------------------


def export_result(version, models=1, table="float"):
    """An ExportResult whose files' sizes grow in the order `save` writes them (model, table,
    contract, metadata), so that a size limit at half of each makes each one fail in turn."""
    model = [bytes([version]) * (40 + version) * 3**i for i in range(models)]
    host = None
    if table == "float":
        host = np.full([4, 24], version, np.float32)
    elif table == "int":
        host = {"codes": np.full([4, 24], version, np.int8), "scales": np.ones([4, 1], np.float32)}
    metadata = {"target": "cpu", "vocab_size": 10, "notes": "n" * (6000 + version)}
    return ExportResult(
        target="gl" if models == 2 else "cpu",
        quantize=None,
        embedding="host" if host is not None else "graph",
        models=tuple(model),
        report={"parity": 0.0},
        lines=[],
        metadata=metadata,
        host_table=host,
    )


@pytest.mark.parametrize("models, table", [(1, "float"), (2, "float"), (1, "int"), (1, None)])
def test_an_export_failing_mid_save_at_each_file_keeps_whole_files(tmp_path, models, table):
    """An export saved over an earlier one into the same folder fails (a full disk) at each of its
    files in turn: each file is the earlier export's or the new one's, none is cut short; the files
    before the failing one are the new export's, it and those after it the earlier one's, and
    FILE.json comes last (so the kit refuses a mix: the sha256 it records are the earlier files')."""
    out = str(tmp_path / "model.tflite")
    outcomes = assert_failed_saves_keep_files(
        str(tmp_path),
        lambda: export_result(1, models, table).save(out),
        lambda: export_result(2, models, table).save(out),
        errors=(files.FileWriteError,),
    )
    paths = export_result(2, models, table).save(out)
    model_files, metadata, contract_file = paths[:-2], paths[-2], paths[-1]
    order = [os.path.basename(p) for p in model_files + [contract_file, metadata]]  # as `save` writes them
    sizes = {name: os.path.getsize(tmp_path / name) for name in order}
    failing = set()
    for name, after in outcomes:
        limit = sizes[name] // 2
        at = next(i for i, file in enumerate(order) if sizes[file] > limit)
        failing.add(order[at])
        expected = {file: ("new" if i < at else "old") for i, file in enumerate(order)}
        expected[order[-2]] = after[order[-2]]  # the contract: the same document in both exports
        assert after == expected, f"failing at {order[at]}"
    assert failing >= set(order) - {order[-2]}, "a file of the export never failed"


def test_an_interrupted_export_leaves_no_model_file_under_its_name(tmp_path, monkeypatch):
    """A save stopped while a model file is written (Ctrl-C) leaves neither it nor a partial one."""
    out = str(tmp_path / "model.tflite")
    real_open = open

    def interrupted_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if "w" in mode and str(path).endswith(".tflite"):
            handle.write(b"half")
            handle.close()
            raise KeyboardInterrupt
        return handle

    monkeypatch.setattr("builtins.open", interrupted_open)
    with pytest.raises(KeyboardInterrupt):
        export_result(1).save(out)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("mask", MASKS)
def test_an_export_s_files_are_readable_as_the_umask_says(tmp_path, mask):
    with umask(mask):
        paths = export_result(1, models=2).save(str(tmp_path / "model.tflite"))
    assert len(paths) == 5
    for path in paths:
        assert_readable_per_umask(path, mask)


def test_json_keeps_the_key_order_by_default(tmp_path):
    path = str(tmp_path / "r.json")
    files.write_json(path, {"b": 1, "a": 2})
    assert open(path).read() == '{\n "b": 1,\n "a": 2\n}'


@pytest.mark.parametrize(
    "name, ending", [("model.keras", ".keras"), ("a.b.npz", ".npz"), ("plain", ""), (".hidden", "")]
)
def test_the_temporary_name_ends_with_the_last_suffix_only(tmp_path, name, ending):
    temp = os.path.basename(files._temp_name(str(tmp_path / name)))
    random_part = temp[len(".tmp-" + name + ".") : len(temp) - len(ending)]
    assert temp == ".tmp-" + name + "." + random_part + ending and "." not in random_part and random_part


def test_a_long_name_s_temporary_name_keeps_its_first_40_characters(tmp_path):
    name = "".join(chr(ord("a") + i % 26) for i in range(60)) + ".json"
    temp = os.path.basename(files._temp_name(str(tmp_path / name)))
    assert temp.startswith(".tmp-" + name[:40] + ".") and temp.endswith(".json")


def test_a_writer_that_removed_its_own_file_gets_its_own_error_back(tmp_path):
    with pytest.raises(RuntimeError, match="the writer's"):
        with files.atomic_path(str(tmp_path / "x.bin")) as temp:
            os.remove(temp)
            raise RuntimeError("the writer's")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "error, reason",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
        (OSError("2000 requested and 109 written"), "2000 requested and 109 written"),  # numpy's, no errno
        (RuntimeError("a converter's error"), "a converter's error"),
    ],
)
def test_describe_write_error_names_the_reason_and_the_folder_s_free_space(
    tmp_path, monkeypatch, error, reason
):
    asked = []
    monkeypatch.setattr(files, "free_space", lambda folder: asked.append(folder) or 5 * 2**20)
    path = str(tmp_path / "sub" / "f.json")
    assert files.describe_write_error(path, error) == (
        f"cannot write {path}: {reason} (5.0 MB free in {tmp_path / 'sub'})"
    )
    assert asked == [str(tmp_path / "sub")]
    monkeypatch.setattr(files, "free_space", lambda folder: None)
    assert files.describe_write_error(path, error) == f"cannot write {path}: {reason}"


def test_free_space_asks_the_nearest_existing_folder(tmp_path, monkeypatch):
    asked = []
    real = files.shutil.disk_usage
    monkeypatch.setattr(files.shutil, "disk_usage", lambda folder: asked.append(folder) or real(folder))
    files.free_space(str(tmp_path / "a" / "b"))
    files.free_space(str(tmp_path))
    files.free_space("")
    assert asked == [str(tmp_path), str(tmp_path), os.getcwd()]
