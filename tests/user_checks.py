"""Checks of what a user sees, written once and used by the tests of every module they apply to.

- `assert_lowest_accepted`, `assert_first_refused`: a version, length or id check at its boundary,
  the limit itself, one below and one above it (an int steps by 1, a version tuple by its last part).
- `assert_sampler_properties`: a sampler's top-k with k = 1 is the argmax, its top-k draws lie in
  the k largest logits and reach each of them, its top-p draws lie in the nucleus and reach each of
  its ids, and a seed repeats its draws.
- `assert_failed_saves_keep_files`: a save that fails mid-write (a file size limit, as a full disk
  does) at each of its files in turn leaves each file of the folder whole, the earlier save's or the
  new one's, and no partial or temporary file.
- `assert_readable_per_umask`: a written file's mode is 0o666 less the umask, as `open` gives
  (tests run as root, who reads any file: the mode bits are what another user would meet).
- `ascii_locale`: the C locale inside a block, for text that must be read and written as UTF-8
  whatever the locale says.
- `assert_config_round_trip`: `get_config` holds every constructor argument given, key by key, and
  `from_config` of it gives the same config again; `assert_arguments_covered` says which
  constructor arguments no case sets to a value other than its default.
"""

import contextlib
import inspect
import locale
import os
import resource
import signal
import stat

import numpy as np

# --- boundaries ----------------------------------------------------------------------------------


def neighbours(limit):
    """`(one below, limit, one above)`: ints by 1, version tuples by their last part."""
    if isinstance(limit, tuple):
        return limit[:-1] + (limit[-1] - 1,), limit, limit[:-1] + (limit[-1] + 1,)
    return limit - 1, limit, limit + 1


def _outcomes(accepts, limit):
    return {value: bool(accepts(value)) for value in neighbours(limit)}


def assert_lowest_accepted(accepts, limit):
    """`accepts(value)` is False one below `limit`, True at it and one above (a lower bound)."""
    below, at, above = neighbours(limit)
    outcomes = _outcomes(accepts, limit)
    assert outcomes == {below: False, at: True, above: True}, f"lowest accepted {limit}: {outcomes}"


def assert_first_refused(accepts, limit):
    """`accepts(value)` is True one below `limit`, False at it and one above (an exclusive upper bound)."""
    below, at, above = neighbours(limit)
    outcomes = _outcomes(accepts, limit)
    assert outcomes == {below: True, at: False, above: False}, f"first refused {limit}: {outcomes}"


def refuses(call, *errors):
    """`call()` raises one of `errors` (default SystemExit and ValueError): True; returns: False."""
    errors = errors or (SystemExit, ValueError)
    try:
        call()
    except errors:
        return True
    return False


# --- samplers ------------------------------------------------------------------------------------

# Distinct logits with a clear order, and a nucleus that is not the whole vocabulary.
SAMPLER_LOGITS = np.log(np.array([0.05, 0.30, 0.02, 0.40, 0.08, 0.15]))


def assert_sampler_properties(draws, logits=SAMPLER_LOGITS, count=300):
    """`draws(logits, sampler, seed, count, k=None, p=None, temperature=1.0)` -> `count` int ids drawn
    one after the other with one generator seeded with `seed`.

    Checks greedy and top-k 1 (the argmax at every draw), top-k 2..vocab-1 (only the k largest,
    each of them reached), top-p (only the smallest set of largest ids whose mass reaches p, each
    reached), a tiny p (the argmax), a high temperature (a top-k still within its k), and that a
    seed repeats its draws while another seed draws others.
    """
    logits = np.asarray(logits, np.float64)
    order = [int(i) for i in np.argsort(-logits, kind="stable")]
    top = order[0]
    assert set(draws(logits, "greedy", None, 5)) == {top}
    assert set(draws(logits, "top_k", 0, count, k=1)) == {top}, "top-k 1 is not greedy"
    for k in range(2, len(logits)):
        seen = set(draws(logits, "top_k", k, count, k=k))
        assert seen == set(order[:k]), f"top-k {k}: drew {sorted(seen)}, the top {k} are {sorted(order[:k])}"
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    mass = np.cumsum(probabilities[order])
    for p in (0.39, 0.41, 0.69, 0.72, 0.86, 0.95, 1.0):  # just below and above each cumulative mass
        size = int(np.searchsorted(mass, p - 1e-12)) + 1  # the smallest prefix whose mass reaches p
        seen = set(draws(logits, "top_p", 1, count, p=p))
        assert seen == set(order[:size]), (
            f"top-p {p}: drew {sorted(seen)}, the nucleus is {sorted(order[:size])}"
        )
    assert set(draws(logits, "top_p", 2, 50, p=1e-6)) == {top}
    # p exactly the mass before the third id (computed as the samplers do): it stays out; just above, in
    ranked = np.exp(logits[order] - logits[order[0]])
    ranked /= ranked.sum()
    before = float((np.cumsum(ranked) - ranked)[2])
    assert set(draws(logits, "top_p", 3, count, p=before)) == set(order[:2])
    assert set(draws(logits, "top_p", 3, count, p=float(np.nextafter(before, 1.0)))) == set(order[:3])
    hot = set(draws(logits, "top_k", 3, count, k=3, temperature=50.0))
    assert hot == set(order[:3]), f"top-k 3 at temperature 50 drew {sorted(hot)}"
    first = draws(logits, "top_k", 7, 30, k=len(logits))
    assert draws(logits, "top_k", 7, 30, k=len(logits)) == first, "the same seed drew other ids"
    assert draws(logits, "top_k", 8, 30, k=len(logits)) != first, "another seed drew the same ids"


# --- file writing --------------------------------------------------------------------------------


def snapshot(folder):
    """`{name: bytes}` of every file in `folder` (hidden ones included)."""
    return {
        name: open(os.path.join(folder, name), "rb").read()
        for name in sorted(os.listdir(folder))
        if os.path.isfile(os.path.join(folder, name))
    }


@contextlib.contextmanager
def file_size_limit(size):
    """Writes past `size` bytes of any file fail with EFBIG inside the block (RLIMIT_FSIZE), as on a
    full disk; SIGXFSZ is ignored meanwhile so that the write fails instead of the process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def assert_failed_saves_keep_files(folder, save_old, save_new, errors=(OSError,)):
    """`save_old()` then `save_new()` write the same file names into `folder` with other contents.

    For each file of the new save, the new save runs again over the old files under a size limit
    of half that file's size, so that it fails mid-write at the first file written that is at least
    that large. Afterwards every file must be whole (the old save's bytes or the new save's) and
    no other file may exist. Returns `[(name, {file: "old" or "new"})]`, the file whose half size
    was the limit and what each file held afterwards.
    """
    save_new()
    new = snapshot(folder)
    outcomes = []
    for name, content in sorted(new.items(), key=lambda item: -len(item[1])):
        for stale in os.listdir(folder):
            os.remove(os.path.join(folder, stale))
        save_old()
        old = snapshot(folder)
        assert set(old) == set(new), f"the two saves write different files: {sorted(old)} and {sorted(new)}"
        limit = len(content) // 2
        try:
            with file_size_limit(limit):
                save_new()
        except errors:
            pass
        else:
            raise AssertionError(
                f"the save did not fail under a {limit}-byte size limit ({name}: {len(content)} bytes)"
            )
        after = snapshot(folder)
        assert set(after) == set(new), (
            f"a save failing at {limit} bytes left {sorted(set(after) - set(new))} "
            f"and lost {sorted(set(new) - set(after))}"
        )
        for file, data in after.items():
            assert data in (old[file], new[file]), (
                f"{file}: {len(data)} bytes after a save failing at {limit} bytes, neither the old "
                f"({len(old[file])} bytes) nor the new ({len(new[file])} bytes) file"
            )
        outcomes.append((name, {file: "new" if data == new[file] else "old" for file, data in after.items()}))
    return outcomes


@contextlib.contextmanager
def umask(mask):
    """The process umask is `mask` inside the block."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@contextlib.contextmanager
def ascii_locale():
    """The C locale inside the block: ASCII is what `open` reads and writes without an encoding (a
    shell with LANG=C and PYTHONUTF8=0; Python's UTF-8 mode, when on, still reads UTF-8)."""
    previous = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, previous)


def assert_readable_per_umask(path, mask):
    """`path`'s permission bits are those `open(path, "w")` gives under umask `mask`."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == 0o666 & ~mask, f"{path}: mode {mode:o}, {0o666 & ~mask:o} expected under umask {mask:03o}"


# --- configs -------------------------------------------------------------------------------------


def _plain(value):
    """Lists for tuples and Keras's tracked lists, dicts for tracked dicts, recursively."""
    if isinstance(value, dict) or (hasattr(value, "items") and hasattr(value, "keys")):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListWrapper":
        return [_plain(item) for item in value]
    if hasattr(value, "get_config") and not isinstance(value, type):  # an initializer object
        return {"class_name": type(value).__name__, "config": _plain(value.get_config())}
    if isinstance(value, dict) is False and isinstance(value, np.generic):
        return value.item()
    return value


def _initializer_key(config):
    """An initializer's config as a class name and its own arguments (Keras 3 adds module names)."""
    if isinstance(config, dict) and "class_name" in config:
        return {"class_name": config["class_name"], "config": _plain(config.get("config", {}))}
    return config


def assert_config_round_trip(cls, **arguments):
    """`cls(**arguments).get_config()` holds each argument under its name with its value, and
    `cls.from_config` of that config gives a layer or model with the same config. Returns it."""
    layer = cls(**arguments)
    config = layer.get_config()
    for key, value in arguments.items():
        assert key in config, f"{cls.__name__}.get_config() drops {key!r}"
        assert _initializer_key(_plain(config[key])) == _initializer_key(_plain(value)), (
            f"{cls.__name__}.get_config()[{key!r}] is {config[key]!r}, given {value!r}"
        )
    clone = cls.from_config(config)
    again = clone.get_config()
    assert _plain(again) == _plain(config), f"{cls.__name__}.from_config(config).get_config() differs"
    return clone


def constructor_arguments(cls):
    """`{name: default}` of the named constructor arguments (no *args/**kwargs)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {
        p.name: p.default
        for p in parameters
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def assert_arguments_covered(cls, cases, exempt=()):
    """Every named constructor argument of `cls` is set to a value other than its default in one
    of `cases` (dicts of arguments), except those in `exempt`."""
    missing = []
    for name, default in constructor_arguments(cls).items():
        if name in exempt:
            continue
        values = [case[name] for case in cases if name in case]
        if not any(
            default is inspect.Parameter.empty or _plain(value) != _plain(default) for value in values
        ):
            missing.append(name)
    assert not missing, f"{cls.__name__}: no round-trip case sets {missing} to a non-default value"
