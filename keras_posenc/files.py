"""Atomic files: every file the package writes appears whole under its final name, or not at all.

A writer gets a temporary path in the destination's own folder (same file system, so the final
`os.replace` is atomic), writes and flushes it, and only then is it renamed into place. On any
error, an interrupt included, the temporary file is removed and an existing file of that name is
left as it was. Write errors (a full disk, a read-only folder) become `FileWriteError`: one line
that names the path and the free space.

Example:

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> path = os.path.join(folder, "report.json")
>>> write_json(path, {"loss": 1.5})
>>> open(path).read()
'{\\n "loss": 1.5\\n}'
>>> with atomic_path(path) as temp:
...     with open(temp, "w") as f:
...         _ = f.write("half")
...     raise RuntimeError("interrupted")
Traceback (most recent call last):
...
RuntimeError: interrupted
>>> open(path).read()  # the old file is untouched, no temporary file is left
'{\\n "loss": 1.5\\n}'
>>> sorted(os.listdir(folder))
['report.json']
"""

import contextlib
import errno
import io
import json
import os
import shutil
import tempfile

TEMP_PREFIX = ".tmp-"


class FileWriteError(OSError):
    """A file could not be written: the message names the path, the reason and the free space."""


def free_space(folder):
    """Bytes free for this user in `folder` (or its nearest existing parent); None if unknown."""
    folder = os.path.abspath(folder or ".")
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def describe_write_error(path, error):
    """One line: what could not be written, why, and how much space is left there."""
    reason = getattr(error, "strerror", None) or str(error)
    free = free_space(os.path.dirname(os.path.abspath(path)))
    room = "" if free is None else f" ({_megabytes(free)} free in {os.path.dirname(os.path.abspath(path))})"
    return f"cannot write {path}: {reason}{room}"


def _megabytes(count):
    return f"{count / 2**20:.1f} MB"


def _temp_name(path):
    folder, name = os.path.split(os.path.abspath(path))
    # The final suffix is kept: np.save, Keras and matplotlib pick the format from it.
    suffix = "".join(_suffixes(name))
    handle, temp = tempfile.mkstemp(prefix=TEMP_PREFIX + name[:40] + ".", suffix=suffix, dir=folder)
    try:
        os.fchmod(handle, 0o666 & ~_umask())  # mkstemp's 0600 would make the final file private
    finally:
        os.close(handle)
    return temp


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _suffixes(name):
    stem, dot, last = name.rpartition(".")
    return [dot + last] if dot and stem else []


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path beside `path`; renamed onto `path` when the block ends cleanly.

    For writers that take a file name (`np.save`, `model.save`, `savefig`). The temporary file
    ends with `path`'s suffix. A failure inside the block removes it and re-raises; an `OSError`
    from the file system (a full disk, a read-only folder) is re-raised as `FileWriteError`.
    """
    try:
        temp = _temp_name(path)
    except OSError as error:
        raise FileWriteError(error.errno, describe_write_error(path, error)) from error
    try:
        yield temp
        _flush_to_disk(temp)
        os.replace(temp, path)
    except OSError as error:
        _remove_quietly(temp)
        if isinstance(error, FileWriteError):
            raise
        raise FileWriteError(error.errno, describe_write_error(path, error)) from error
    except BaseException:
        _remove_quietly(temp)
        raise


@contextlib.contextmanager
def atomic_open(path, mode="wb", **kwargs):
    """`open(path, mode)` into a temporary file renamed onto `path` when the block ends cleanly."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes a whole file: mode must contain 'w', got {mode!r}")
    with atomic_path(path) as temp:
        with open(temp, mode, **kwargs) as f:
            yield f


def write_bytes(path, data):
    """Writes `data` to `path` atomically."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_text(path, text, encoding="utf-8"):
    """Writes `text` to `path` atomically."""
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)


def write_json(path, content, indent=1, sort_keys=False):
    """Writes `content` as JSON to `path` atomically (the JSON is made before the file is opened)."""
    write_text(path, json.dumps(content, indent=indent, sort_keys=sort_keys))


def save_npy(path, array):
    """`np.save(path, array)` atomically; `path` must end with `.npy` (np.save would add it)."""
    import numpy as np

    if not str(path).endswith(".npy"):
        raise ValueError(f"save_npy writes .npy files: path must end with '.npy', got {path!r}")
    # Made in memory first: np.save into a file writes through C stdio, and numpy drops the error of
    # its last flush (a full disk), so a cut-short file would be renamed into place as if whole.
    buffer = io.BytesIO()
    np.save(buffer, array)
    write_bytes(path, buffer.getvalue())


def save_npz(path, arrays):
    """`np.savez(path, **arrays)` atomically; `path` must end with `.npz` (np.savez would add it)."""
    import numpy as np

    if not str(path).endswith(".npz"):
        raise ValueError(f"save_npz writes .npz files: path must end with '.npz', got {path!r}")
    with atomic_path(path) as temp:
        np.savez(temp, **arrays)


def _flush_to_disk(path):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _remove_quietly(path):
    with contextlib.suppress(OSError):
        os.remove(path)


def is_disk_full(error):
    """True for the errors of a full disk or quota (ENOSPC, EDQUOT), also inside TensorFlow's messages."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    return "No space left on device" in text or "Disk quota exceeded" in text
