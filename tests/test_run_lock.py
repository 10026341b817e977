"""The run lock (keras_posenc.app.run_lock) function by function, in this process: who holds a run
folder, what a second run is told, what a killed run leaves, and the folders it creates and removes.
Two real processes racing for a folder: tests/test_run_safety.py."""

import errno
import fcntl
import os
import stat
import subprocess
import sys

import pytest
from user_checks import umask

from keras_posenc.app import run_lock as lock_module
from keras_posenc.app.run_lock import LOCK_FILE, RunLockedError, run_lock
from keras_posenc.files import FileWriteError


def dead_pid():
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


@pytest.fixture
def live():
    """A running process of ours (never pid 1 or this one: a mutant's signal hits only it)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


def held_by(folder, pid):
    """Another holder of `folder`'s lock, as another process's flock: an open file description of
    our own (flock locks conflict between descriptions), with `pid` in the file. Returns its fd."""
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, str(pid).encode())
    return fd


def test_the_lock_file_holds_the_pid_and_goes_with_the_lock(tmp_path):
    folder = str(tmp_path / "run")
    with run_lock(folder) as lock:
        assert lock.path == os.path.join(folder, LOCK_FILE)
        assert open(lock.path).read() == str(os.getpid())
        assert os.stat(lock.path).st_size == len(str(os.getpid()))
        (tmp_path / "run" / "report.json").write_text("{}")
    assert os.listdir(folder) == ["report.json"]  # the folder the run filled stays, the lock file goes


def test_a_folder_the_lock_created_and_nothing_filled_is_removed(tmp_path):
    folder = str(tmp_path / "a" / "b")
    with run_lock(folder):
        assert os.path.isdir(folder)
    assert not os.path.exists(folder) and os.path.isdir(tmp_path / "a")
    os.makedirs(folder)
    with run_lock(folder):
        pass
    assert os.path.isdir(folder) and os.listdir(folder) == []  # it existed before: kept


def test_a_second_run_is_refused_naming_the_folder_and_the_holder(tmp_path):
    folder = str(tmp_path / "run")
    holder = dead_pid()  # the holder's pid, gone by the time it releases
    fd = held_by(folder, holder)
    try:
        with pytest.raises(RunLockedError) as raised:
            with run_lock(folder):
                pass
        assert str(raised.value) == (
            f"{folder} is in use by another keras-posenc run (pid {holder}, lock file "
            f"{os.path.join(folder, LOCK_FILE)}): wait for it to end or pick another --out."
        )
        assert open(os.path.join(folder, LOCK_FILE)).read() == str(holder)  # the holder's file is untouched
    finally:
        os.close(fd)
    with pytest.warns(UserWarning, match=f"from pid {holder}, which is no longer running"):
        with run_lock(folder) as lock:  # free again: taken
            assert open(lock.path).read() == str(os.getpid())


def test_a_holder_whose_pid_is_unreadable_is_named_unknown(tmp_path):
    folder = str(tmp_path / "run")
    fd = held_by(folder, "")
    try:
        with pytest.raises(RunLockedError, match=r"\(pid unknown, lock file"):
            with run_lock(folder):
                pass
    finally:
        os.close(fd)


def test_a_killed_run_s_lock_is_taken_over_and_said(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    gone = dead_pid()
    (folder / LOCK_FILE).write_text(f"{gone}\n")
    with pytest.warns(UserWarning) as warned:
        with run_lock(str(folder)) as lock:
            assert open(lock.path).read() == str(os.getpid())  # no trace of the longer old pid is left
    took_over = [w for w in warned if "took over" in str(w.message)]
    assert len(took_over) == 1
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampolines add frames between
        assert took_over[0].filename == __file__  # the warning points at the caller of run_lock
    assert str(took_over[0].message) == (
        f"took over the lock of {folder} from pid {gone}, which is no longer running (a run that was killed)."
    )


def test_our_own_pid_in_the_file_takes_the_lock_without_a_warning(tmp_path, recwarn):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_FILE).write_text(str(os.getpid()))
    with run_lock(str(folder)):
        pass
    (folder / LOCK_FILE).write_text("not a pid")
    with run_lock(str(folder)):
        pass
    assert not recwarn.list


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    folder = str(tmp_path / "run")
    with run_lock(folder) as outer:
        with run_lock(folder + "/.") as inner:  # the same folder by another spelling
            assert inner is outer
            with run_lock(folder) as innermost:
                assert innermost is outer
        assert os.path.exists(outer.path)  # the inner blocks' ends keep the outer lock
        assert lock_module._held[os.path.realpath(folder)][1] == 1
    assert not os.path.exists(folder) and os.path.realpath(folder) not in lock_module._held


def test_the_reentrant_count_drops_when_an_inner_block_fails(tmp_path):
    folder = str(tmp_path / "run")
    with run_lock(folder) as outer:
        with pytest.raises(ValueError):
            with run_lock(folder):
                raise ValueError
        assert lock_module._held[os.path.realpath(folder)] == [outer, 1]
    assert os.path.realpath(folder) not in lock_module._held


def test_a_failed_run_releases_the_lock(tmp_path):
    folder = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        with run_lock(folder):
            raise KeyboardInterrupt
    assert not os.path.exists(folder) and os.path.realpath(folder) not in lock_module._held
    with run_lock(folder):
        pass


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL])
def test_without_flock_the_pid_in_the_file_decides(live, tmp_path, monkeypatch, code):
    def no_flock(fd, operation):
        raise OSError(code, "no locks here")

    monkeypatch.setattr(lock_module.fcntl, "flock", no_flock)
    folder = tmp_path / "run"
    folder.mkdir()
    with run_lock(str(folder)):  # no pid in the file: free
        pass
    (folder / LOCK_FILE).write_text(str(live.pid))  # a running process
    with pytest.raises(RunLockedError, match=rf"\(pid {live.pid}, "):
        with run_lock(str(folder)):
            pass
    (folder / LOCK_FILE).write_text(str(dead_pid()))
    with pytest.warns(UserWarning, match="took over"):
        with run_lock(str(folder)):
            pass


def test_another_flock_error_is_not_taken_for_a_missing_flock(tmp_path, monkeypatch):
    def failing(fd, operation):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(lock_module.fcntl, "flock", failing)
    with pytest.raises(OSError, match="I/O error"):
        with run_lock(str(tmp_path / "run")):
            pass
    assert os.path.realpath(tmp_path / "run") not in lock_module._held
    monkeypatch.undo()
    with run_lock(str(tmp_path / "run")):  # what the failed run left does not hold the folder
        pass


def test_is_running(live, monkeypatch):
    assert lock_module._is_running(live.pid) and not lock_module._is_running(dead_pid())
    with pytest.raises(subprocess.TimeoutExpired):
        live.wait(timeout=0.5)  # asking sent it no signal that ends it

    def other_user(pid, signal):
        raise PermissionError

    monkeypatch.setattr(lock_module.os, "kill", other_user)
    assert lock_module._is_running(1)  # alive, another user's


def test_a_lock_file_unlinked_by_a_releasing_holder_is_opened_again(tmp_path, monkeypatch):
    """A holder that releases between our open and our flock removed the file we locked: we open
    the new one instead of holding a lock on a file no other run sees."""
    answers = iter([False, True])
    opened = []
    real_open = lock_module._Lock._open

    def counting_open(self):
        fd = real_open(self)
        opened.append(fd)
        return fd

    monkeypatch.setattr(lock_module, "_same_file", lambda fd, path: next(answers))
    monkeypatch.setattr(lock_module._Lock, "_open", counting_open)
    with run_lock(str(tmp_path / "run")) as lock:
        assert len(opened) == 2 and lock.fd == opened[1]
        assert open(lock.path).read() == str(os.getpid())


def test_same_file(tmp_path):
    path = str(tmp_path / "f")
    open(path, "w").close()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert lock_module._same_file(fd, path)
        os.remove(path)
        assert not lock_module._same_file(fd, path)
        open(path, "w").close()
        assert not lock_module._same_file(fd, path)
    finally:
        os.close(fd)


def test_read_pid(tmp_path):
    path = str(tmp_path / "f")
    for text, pid in (("123", 123), (" 77\n", 77), ("", None), ("12a", None), ("-5", None)):
        with open(path, "w") as f:
            f.write(text)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert lock_module._read_pid(fd) == pid, text
        finally:
            os.close(fd)


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    folder = str(tmp_path / "file" / "run")
    with pytest.raises(FileWriteError) as raised:
        with run_lock(folder):
            pass
    assert str(raised.value).startswith(f"[Errno {errno.ENOTDIR}] cannot write {folder}: Not a directory (")


def test_a_lock_file_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    folder = str(tmp_path / "run")
    real_open = os.open

    def read_only(path, flags, mode=0o777):
        if str(path).endswith(LOCK_FILE):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, mode)

    monkeypatch.setattr(lock_module.os, "open", read_only)
    with pytest.raises(FileWriteError) as raised:
        with run_lock(folder):
            pass
    assert str(raised.value).startswith(
        f"[Errno {errno.EROFS}] cannot write {os.path.join(folder, LOCK_FILE)}: Read-only file system ("
    )


def test_a_pid_that_cannot_be_written_releases_the_lock(tmp_path, monkeypatch):
    folder = str(tmp_path / "run")

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lock_module.os, "pwrite", full)
    with pytest.raises(FileWriteError, match="No space left on device") as raised:
        with run_lock(folder):
            pass
    assert raised.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert not os.path.exists(os.path.join(folder, LOCK_FILE))
    assert os.path.realpath(folder) not in lock_module._held
    with run_lock(folder):  # free
        pass


def test_a_concurrent_mkdir_is_not_an_error(tmp_path, monkeypatch):
    folder = str(tmp_path / "run")
    real_makedirs = os.makedirs

    def raced(path, *args, **kwargs):
        real_makedirs(path)
        raise FileExistsError(errno.EEXIST, "File exists")

    monkeypatch.setattr(lock_module.os, "makedirs", raced)
    with run_lock(folder) as lock:
        assert not lock.created_folder
    assert os.path.isdir(folder)  # made by the other run: not removed


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_the_lock_file_is_readable_as_the_umask_says(tmp_path, mask):
    with umask(mask):
        with run_lock(str(tmp_path / "run")) as lock:
            assert stat.S_IMODE(os.stat(lock.path).st_mode) == 0o644 & ~mask


def test_a_lock_file_of_other_bytes_is_no_pid(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_FILE).write_bytes(b"\xff\xfe 12")
    with run_lock(str(folder)) as lock:
        assert open(lock.path).read() == str(os.getpid())


def test_a_lock_file_removed_during_the_run_is_no_error(tmp_path):
    with run_lock(str(tmp_path / "run")) as lock:
        os.remove(lock.path)
    assert not os.path.exists(tmp_path / "run")
