"""One writer per run folder: an exclusive lock on `--out` for `train`, `demo` and `ablate`.

`run_lock(folder)` creates the folder if needed and takes an exclusive `fcntl.flock` on
`folder/.keras-posenc.lock`, with the holder's pid written in it. A second run into the same
folder refuses at once with `RunLockedError`, naming the folder and the holder's pid. The kernel
drops a `flock` when its process dies, so the lock of a run killed with `kill -9` is free: the
next run takes it over and says so (the dead pid is still in the file). On a file system
without `flock` the pid in the file decides: a live process holds the folder, a gone one does
not. The lock is reentrant within a process (`demo` holds it around `train`, which takes it
too); the lock file is removed on release, and so is a folder that the lock created and
nothing else filled.

Example:

>>> import tempfile
>>> folder = os.path.join(tempfile.mkdtemp(), "run")
>>> with run_lock(folder) as lock:
...     open(lock.path).read() == str(os.getpid())
True
>>> os.path.exists(folder)  # created for the run, left empty: removed again
False
"""

import contextlib
import errno
import fcntl
import os
import warnings

from keras_posenc.files import FileWriteError, describe_write_error

__all__ = ["LOCK_FILE", "RunLockedError", "run_lock"]

LOCK_FILE = ".keras-posenc.lock"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_held = {}  # real path of the folder -> [lock, depth]: the locks this process holds


class RunLockedError(RuntimeError):
    """Another live process writes into the run folder."""


class _Lock:
    def __init__(self, folder):
        self.folder = folder
        self.path = os.path.join(folder, LOCK_FILE)
        self.fd = None
        self.created_folder = False

    def acquire(self):
        if not os.path.isdir(self.folder):
            try:
                os.makedirs(self.folder)
                self.created_folder = True
            except FileExistsError:
                pass
            except OSError as error:
                raise FileWriteError(error.errno, describe_write_error(self.folder, error)) from error
        while True:
            fd = self._open()
            try:
                previous = _read_pid(fd)
                if not self._flock(fd, previous):
                    holder = previous if previous is not None else "unknown"
                    raise RunLockedError(f"{self.folder} is in use by another keras-posenc run (pid "
                                         f"{holder}, lock file {self.path}): wait for it to end or pick "
                                         "another --out.")
                if _same_file(fd, self.path):  # not unlinked by a holder releasing meanwhile
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        self.fd = fd
        if previous is not None and previous != os.getpid():
            warnings.warn(f"took over the lock of {self.folder} from pid {previous}, which is no longer "
                          "running (a run that was killed).", stacklevel=4)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as error:
            self.release()
            raise FileWriteError(error.errno, describe_write_error(self.path, error)) from error

    def _open(self):
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise FileWriteError(error.errno, describe_write_error(self.path, error)) from error

    def _flock(self, fd, previous):
        """True when this process now holds the folder."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        except OSError as error:
            if error.errno not in _NO_FLOCK:
                raise
            return previous is None or previous == os.getpid() or not _is_running(previous)

    def release(self):
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.remove(self.path)  # while still locked: a waiting run re-checks the file it locked
        os.close(self.fd)
        self.fd = None
        if self.created_folder:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)  # only if empty: the run failed before writing anything


def _read_pid(fd):
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _same_file(fd, path):
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _is_running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


@contextlib.contextmanager
def run_lock(folder):
    """Holds the exclusive lock of the run folder `folder` (created if needed) for the block.

    Raises:
        RunLockedError: another live process holds it (the message names the folder and its pid).
        FileWriteError: the folder or its lock file cannot be written (read-only, full disk).
    """
    key = os.path.realpath(folder)
    if key in _held:
        _held[key][1] += 1
        try:
            yield _held[key][0]
        finally:
            _held[key][1] -= 1
        return
    lock = _Lock(folder)
    lock.acquire()
    _held[key] = [lock, 1]
    try:
        yield lock
    finally:
        del _held[key]
        lock.release()
