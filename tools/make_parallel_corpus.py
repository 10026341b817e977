"""Builds English -> German parallel corpora from the human translations in gettext catalogues.

Two sources, two modes.

`--out FILE`: Django, Wagtail, Sphinx, django CMS and Oscar ship the German
translations of their user interface messages as `.po` files inside their
wheels: short English sentences and phrases (`msgid`) with the translation a
person wrote (`msgstr`). All five are BSD-licensed (see
`keras_posenc/app/data/LICENSE-PO-CORPUS.txt`). This mode downloads the pinned wheels with pip, reads every
German `.po` file, keeps the translated, non-fuzzy entries that hold words
(placeholders such as `%(name)s`, `{0}` or `%s` are removed, and an entry
whose text is only placeholders, punctuation or HTML is dropped), and writes
`source<TAB>target` lines, deduplicated by source, in a fixed order.

Rebuild the full corpus (about 5,000 pairs) and the shipped test slice:

    python tools/make_parallel_corpus.py --out runs/po_en_de.tsv
    python tools/make_parallel_corpus.py --out keras_posenc/app/data/po_en_de_slice.tsv \\
        --slice 1200 --licence keras_posenc/app/data/LICENSE-PO-CORPUS.txt

`--wheels DIR` reads already downloaded wheels instead of calling pip.

`--debian OUTDIR`: the German catalogues (`usr/share/locale/de/LC_MESSAGES/*.mo`)
inside the Debian 12 (bookworm) packages pinned in `tools/debian_po_packages.tsv`
(package, version, licence, split). Each package is fetched with
`apt-get download PACKAGE=VERSION` into a cache folder (so a rebuild is
offline) and unpacked with `dpkg-deb --fsys-tarfile`. Every translated
message of a `.mo` file gives a pair: the context (`msgctxt`) is dropped,
plural messages give their singular, keyboard mnemonics (GTK `_File`, Qt/KDE
`&File`) are removed, whitespace is normalised, and a pair is dropped when its
placeholders (`%s`, `%1$s`, `%(name)s`, `{0}`, Qt `%1`) differ between the two
sides, when a side spans lines, is over 200 characters or holds no word, or
when the translation equals the source. Each package belongs to one split, so
a held-out package's software is never seen in training. Pairs are
deduplicated by source within a split (the first package in manifest order
wins), and a dev or test source that also occurs in train (test: or in dev),
compared without case and punctuation, is removed. It writes
`OUTDIR/{train,dev,test}.tsv` (`source<TAB>target`, ordered by a hash of the
source) and `OUTDIR/manifest.json` (per package: version, licence, split, pair
count, sha256 of the `.deb`); a rebuild gives byte-identical files.
`make corpus` runs the first command below; the second also writes the small
slices shipped for tests (3,000 train, 300 dev and 300 test pairs whose source
has at most 60 characters) and their licence notice:

    python tools/make_parallel_corpus.py --debian .cache/corpus/debian_po_en_de
    python tools/make_parallel_corpus.py --debian .cache/corpus/debian_po_en_de --slice 3000 \\
        --slice-dir tests/data/debian_po_en_de \\
        --licence tests/data/debian_po_en_de/LICENSE-DEBIAN-PO-CORPUS.txt

`--cache DIR` (default `OUTDIR/debs`) is where the `.deb` files are kept; the
first build needs a Debian bookworm host with its package lists (`apt-get update`).

References:
    - GNU gettext manual, "The Format of PO Files" and "The Format of GNU MO Files",
      https://www.gnu.org/software/gettext/manual/html_node/PO-Files.html,
      https://www.gnu.org/software/gettext/manual/html_node/MO-Files.html.
    - Debian copyright format 1.0 (DEP-5),
      https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/.
"""

import argparse
import ast
import collections
import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile

__all__ = ["PACKAGES", "build", "build_debian", "clean", "clean_pair", "licences", "mo_entries",
           "placeholders", "po_entries", "read_manifest", "split_pairs", "strip_bar_context",
           "strip_mnemonic"]

# Pinned so that the corpus is the same on every rebuild.
PACKAGES = ("Django==4.2.16", "wagtail==6.2", "sphinx==7.4.7", "django-cms==4.1.2", "django-oscar==3.2.4")
_LANGUAGE = "de"

_PLACEHOLDER = re.compile(r"%\([^)]*\)[#0 +-]*\d*(?:\.\d+)?[a-zA-Z]|%[#0 +-]*\d*(?:\.\d+)?[sdifrxX]|"
                          r"\{[^{}]*\}|<[^<>]+>|&\w+;|%%")
_WORD = re.compile(r"[^\W\d_]{2,}")
_QUOTES = "\"'\u201c\u201d\u201e\u201a\u2018\u2019\u00ab\u00bb\u2039\u203a"
_EMPTY_QUOTES = re.compile(f"[{_QUOTES}]\\s*[{_QUOTES}]")


def _unquote(text):
    return ast.literal_eval(text) if text.startswith('"') else ""


def po_entries(text):
    """The `(msgid, msgstr, fuzzy)` entries of a `.po` file's text (singular forms only).

    Args:
        text: str, the file's content.

    Returns:
        list of `(str, str, bool)`; plural entries give their singular pair
        (`msgid`, `msgstr[0]`); the header (empty `msgid`) is left out.

    Example:

    >>> text = ('#, fuzzy\\nmsgid "Save"\\nmsgstr "Sichern"\\n\\n'
    ...         'msgid ""\\n"Log "\\n"out"\\nmsgstr "Abmelden"\\n')
    >>> po_entries(text)
    [('Save', 'Sichern', True), ('Log out', 'Abmelden', False)]
    """
    entries = []
    for block in re.split(r"\n\s*\n", text):
        fields, current, fuzzy = {}, None, False
        for line in block.splitlines():
            line = line.strip()
            if line.startswith("#,") and "fuzzy" in line:
                fuzzy = True
            elif line.startswith("#") or not line:
                continue
            elif line.startswith('"') and current:
                fields[current] += _unquote(line)
            else:
                key, _, rest = line.partition(" ")
                current = key
                fields[current] = _unquote(rest.strip())
        source = fields.get("msgid", "")
        target = fields.get("msgstr", fields.get("msgstr[0]", ""))
        if source:
            entries.append((source, target, fuzzy))
    return entries


def clean(text):
    """`text` without placeholders, markup and repeated whitespace; '' when no word is left.

    Example:

    >>> clean("Add %(name)s")
    'Add'
    >>> clean("Are you sure you want to delete the {0} \\"{1}\\"?")
    'Are you sure you want to delete the?'
    >>> clean("%(count)s")
    ''
    """
    text = _PLACEHOLDER.sub(" ", text.replace("\n", " ").replace("\t", " "))
    text = re.sub(_EMPTY_QUOTES, " ", text)  # quotes left empty by a placeholder
    text = re.sub(r"\s+([?!.,:;)])", r"\1", re.sub(r"\s+", " ", text)).strip(" -:")
    return text if _WORD.search(text) else ""


def _po_files(wheel):
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            if name.endswith(".po") and f"/locale/{_LANGUAGE}/LC_MESSAGES/" in name:
                yield name, archive.read(name).decode("utf-8")


def build(wheels):
    """The deduplicated `(english, german)` pairs of the German `.po` files in `wheels`.

    Args:
        wheels: list of wheel paths.

    Returns:
        list of `(str, str)`, sorted by a hash of the English side (a fixed
        shuffle, so that any prefix mixes all sources).
    """
    pairs = {}
    for wheel in sorted(wheels):
        for _, text in _po_files(wheel):
            for source, target, fuzzy in po_entries(text):
                source, target = clean(source), clean(target)
                if fuzzy or not source or not target or source in pairs:
                    continue
                if len(source.split()) > 30 or len(target.split()) > 30:
                    continue
                pairs[source] = target
    return sorted(pairs.items(), key=lambda pair: hashlib.sha256(pair[0].encode()).hexdigest())


def licences(wheels):
    """The licence texts of `wheels`, each under a heading naming its package, as one str."""
    parts = []
    for wheel in sorted(wheels):
        with zipfile.ZipFile(wheel) as archive:
            for name in sorted(archive.namelist()):
                if re.search(r"\.dist-info/LICEN[CS]E(\.rst|\.txt)?$", name):
                    text = archive.read(name).decode("utf-8").strip()
                    parts.append(f"{os.path.basename(wheel)}, {name}:\n\n{text}\n")
    return ("\n" + "=" * 78 + "\n\n").join(parts)


def _download(directory):
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                    "-d", directory, *PACKAGES], check=True, stdout=subprocess.DEVNULL)
    return glob.glob(os.path.join(directory, "*.whl"))


# --- Debian bookworm: the German .mo catalogues of pinned packages --------------------------------
MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "debian_po_packages.tsv")
SPLITS = ("train", "dev", "test")
SLICE_MAX_SOURCE = 60  # characters: the slices keep short pairs so that tests train fast
_MANIFEST_COLUMNS = ("package", "version", "licence", "split")
_MO_FOLDER = f"usr/share/locale/{_LANGUAGE}/LC_MESSAGES/"
_MAX_CHARS = 200
# Entries that name the translators rather than translate a message (GNOME, KDE).
_CREDITS = {"translator-credits", "translator_credits", "Your names", "Your emails"}
_CREDIT_CONTEXTS = {"NAME OF TRANSLATORS", "EMAIL OF TRANSLATORS"}

# One alternative per placeholder syntax, `%%` first so that a literal percent sign is consumed.
_FORMAT = re.compile(
    r"(?P<percent>%%)"
    r"|%\((?P<named>[^()]+)\)[-+ #0]*(?:\d+|\*)?(?:\.\d+)?[a-zA-Z]"
    r"|%(?:(?P<position>\d+)\$)?[-+#0'I]*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?P<length>hh|ll|[hlLqjzZt])?(?P<conversion>[diouxXeEfFgGaAcspnmCS])"
    r"|%L?(?P<qt>\d{1,2})"
    r"|\{(?P<brace>[A-Za-z_][\w.]*|\d*)(?:![rsa])?(?::[^{}]*)?\}")
_MARKUP = re.compile(r"<[^<>]+>|&(?:#\d+|#x[0-9a-fA-F]+|[A-Za-z]\w*);")
# `Context|Message`: a context of words (no `|`, not an option like `-m`), then a message without `|`.
_BAR_CONTEXT = re.compile(r"[A-Za-z][\w ,-]*\|+(?=[^|\s][^|]*\Z)")
_ENTITY = re.compile(r"&(?:#\d+|#x[0-9a-fA-F]+|[A-Za-z]\w*);")


class CorpusError(Exception):
    """A problem with the manifest, the archive or the cache, said in one line."""


def read_manifest(path=MANIFEST):
    """The packages of a manifest TSV: `package, version, licence, split` per line.

    Lines starting with `#` and blank lines are skipped; the first other line
    is the header.

    Returns:
        list of dicts with the four columns as keys, in file order.

    Raises:
        CorpusError: a line without four columns, an unknown split or a package named twice.
    """
    rows, seen = [], set()
    with open(path, encoding="utf-8") as f:
        lines = [(number, line.rstrip("\n")) for number, line in enumerate(f, 1)
                 if line.strip() and not line.startswith("#")]
    header = "\t".join(_MANIFEST_COLUMNS)
    if not lines or lines[0][1] != header:
        raise CorpusError(f"{path}: the first line must be the header {header!r}")
    for number, line in lines[1:]:
        fields = line.split("\t")
        if len(fields) != len(_MANIFEST_COLUMNS) or not all(fields):
            raise CorpusError(f"{path} line {number}: expected 4 tab-separated columns, got {line!r}")
        row = dict(zip(_MANIFEST_COLUMNS, fields))
        if row["split"] not in SPLITS:
            raise CorpusError(f"{path} line {number}: split {row['split']!r} is not one of {SPLITS}")
        if row["package"] in seen:
            raise CorpusError(f"{path} line {number}: package {row['package']!r} is listed twice")
        seen.add(row["package"])
        rows.append(row)
    return rows


def _mo_charset(header):
    match = re.search(r"charset=([\w.-]+)", header.decode("ascii", "replace"))
    return match.group(1) if match and match.group(1).upper() != "CHARSET" else "utf-8"


def mo_entries(data):
    """The `(context, msgid, msgstr)` entries of a compiled gettext catalogue (`.mo` file).

    Args:
        data: bytes, the file's content (either byte order).

    Returns:
        list of `(str or None, str, str)` in file order: `context` is the
        `msgctxt` (None without one), plural entries give their singular
        (`msgid`, `msgstr[0]`), and the header (empty `msgid`) is left out.

    Raises:
        ValueError: `data` is not a `.mo` file.
    """
    if len(data) < 20:
        raise ValueError("not a .mo file: too short")
    magic = data[:4]
    order = {b"\xde\x12\x04\x95": "<", b"\x95\x04\x12\xde": ">"}.get(magic)
    if order is None:
        raise ValueError(f"not a .mo file: magic number {magic.hex()}")
    revision, count, originals, translations = struct.unpack_from(order + "4I", data, 4)
    if revision >> 16 > 1:
        raise ValueError(f"unsupported .mo revision {revision >> 16}")
    raw = []
    for index in range(count):
        length, offset = struct.unpack_from(order + "2I", data, originals + 8 * index)
        t_length, t_offset = struct.unpack_from(order + "2I", data, translations + 8 * index)
        raw.append((data[offset:offset + length], data[t_offset:t_offset + t_length]))
    charset = next((_mo_charset(msgstr) for msgid, msgstr in raw if not msgid), "utf-8")
    entries = []
    for msgid, msgstr in raw:
        if not msgid:
            continue
        context, separator, msgid = msgid.decode(charset).rpartition("\x04")
        entries.append((context if separator else None, msgid.split("\x00")[0],
                        msgstr.decode(charset).split("\x00")[0]))
    return entries


def placeholders(text):
    """The placeholders of `text` as a multiset, comparable between a message and its translation.

    printf conversions are keyed by the argument they take (their position:
    explicit as in `%2$s`, else counted) and their length and conversion
    letters, without flags or width, so `%s of %d` matches `%2$d von %1$s` and
    `%d` matches `%'d`; `%m` and `%%` take no argument. Python `%(name)s`,
    braces (`{0}`, `{name}`, `{}` counted) and Qt `%1` are keyed by their name.

    Example:

    >>> placeholders("%s of %d") == placeholders("%2$d von %1$s")
    True
    >>> placeholders("%s of %d") == placeholders("%2$s von %1$d")
    False
    >>> sorted(placeholders("Delete %(name)s in {0} or %1?").elements())
    [('brace', '0'), ('named', 'name'), ('qt', '1')]
    """
    keys, printf_count, brace_count = [], 0, 0
    for match in _FORMAT.finditer(text):
        if match.group("percent"):
            continue
        if match.group("named") is not None:
            keys.append(("named", match.group("named")))
        elif match.group("conversion"):
            conversion = (match.group("length") or "") + match.group("conversion")
            if conversion == "m":  # glibc's strerror(errno): no argument
                keys.append(("printf", 0, "m"))
                continue
            printf_count += 1
            keys.append(("printf", int(match.group("position") or printf_count), conversion))
        elif match.group("qt"):
            keys.append(("qt", match.group("qt")))
        else:
            name = match.group("brace")
            if not name:
                name, brace_count = str(brace_count), brace_count + 1
            keys.append(("brace", name))
    return collections.Counter(keys)


def _is_mnemonic(text, start, other):
    """Whether the `_` or `&` at `text[start]` marks a mnemonic rather than being part of the text."""
    marker = text[start]
    if (start and text[start - 1] == marker) or text[start + 1:start + 2] == marker:
        return False  # `&&` or `__`: a literal character
    run = re.search(r"\S*\Z", text[:start]).group() + re.match(r"\S*", text[start:]).group()
    if marker == "&" and (_ENTITY.match(text, start) or re.search(r"[=<>]|://", run)):
        return False  # an entity, a URL's query or markup
    before = re.search(r"[\w&]*\Z", text[:start]).group()
    after = re.match(r"[\w&]*", text[start + 1:]).group()
    if before + marker + after not in re.findall(r"[\w&]+", other):
        return True
    # The same word on the other side: an identifier (`LC_ALL`, `_NET_WM_NAME`, `AT&T`) if it
    # looks like one; Qt/KDE's `I&n`, `St&op` keep their mnemonic's place in many translations.
    if marker == "_":
        return not (before or "_" in after)
    return not (before[-1:].isupper() and after[:1].isupper())


def _strip_marker(text, marker, other):
    for match in re.finditer(re.escape(marker) + r"(?=[^\W_])", text):
        if _is_mnemonic(text, match.start(), other):
            return text[:match.start()] + text[match.start() + 1:]  # a label has one mnemonic
    return text


def strip_mnemonic(text, other=""):
    """`text` without its keyboard mnemonic: GTK's `_` or Qt/KDE's `&` before a letter or digit.

    Doubled markers (`&&`, `__`), HTML entities (`&amp;`), a `&` in a URL or
    tag and a marker not before a letter (`Tom & Jerry`) stay. So does a
    marker in a word that occurs unchanged in `other` (the message's
    translation or source) and looks like an identifier: `_` inside the word
    or one of several (`LC_ALL`, `_NET_WM_NAME`), `&` between capitals (`AT&T`).

    Args:
        text: str, a message.
        other: str, its counterpart on the other side of the pair.

    Example:

    >>> strip_mnemonic("_Open"), strip_mnemonic("Ö_ffnen"), strip_mnemonic("&Save")
    ('Open', 'Öffnen', 'Save')
    >>> strip_mnemonic("Save && Quit"), strip_mnemonic("Tom & Jerry"), strip_mnemonic("R&amp;D")
    ('Save && Quit', 'Tom & Jerry', 'R&amp;D')
    >>> strip_mnemonic("Set LC_ALL", "LC_ALL setzen"), strip_mnemonic("I&n Toolbar", "I&n Werkzeugleiste")
    ('Set LC_ALL', 'In Toolbar')
    """
    for marker in "_&":
        text = _strip_marker(text, marker, other)
    return text


def _has_word(text):
    return bool(_WORD.search(_MARKUP.sub(" ", _FORMAT.sub(" ", text))))


def strip_bar_context(source, target):
    """The pair without a glib `Q_()`/Gramps-style context written into the message: `Context|Message`.

    The source loses its `Context|` prefix when the translation has none (the
    translator translated only the message) or the same one (both lose it).

    Example:

    >>> strip_bar_context("Person|Title", "Titel")
    ('Title', 'Titel')
    >>> strip_bar_context("DialogTitle|Move", "DialogTitle|Verschieben")
    ('Move', 'Verschieben')
    >>> strip_bar_context("Debug (never|query|always)", "Fehlersuche (never|query|always)")[0]
    'Debug (never|query|always)'
    """
    match = _BAR_CONTEXT.match(source)
    if not match:
        return source, target
    if "|" not in target:
        return source[match.end():], target
    if target.startswith(match.group()):
        return source[match.end():], target[match.end():]
    return source, target


def clean_pair(source, target):
    """The cleaned `(source, target)` of a catalogue entry, or None when it makes no good pair.

    A `Context|` prefix and mnemonics are removed and whitespace is
    normalised; the pair is dropped when a side is empty, spans lines, is over
    200 characters or holds no word of two letters, when the source is one
    identifier that keeps an underscore once the mnemonic is gone
    (`gtk_widget_show_all`), when the placeholders differ or when both sides
    are equal.

    Example:

    >>> clean_pair("_Open  %s", "%s ö_ffnen")
    ('Open %s', '%s öffnen')
    >>> clean_pair("%d files", "%s Dateien") is None, clean_pair("OK", "OK") is None
    (True, True)
    """
    if not source.strip() or not target.strip():
        return None
    if any(ch in side.strip() for side in (source, target) for ch in "\n\r"):
        return None
    if placeholders(source) != placeholders(target):
        return None
    source, target = strip_bar_context(source, target)
    source, target = strip_mnemonic(source, target), strip_mnemonic(target, source)
    source, target = " ".join(source.split()), " ".join(target.split())
    if max(len(source), len(target)) > _MAX_CHARS or source == target:
        return None
    if not _has_word(source) or not _has_word(target) or re.fullmatch(r"\S*[^\W_]_[^\W_]\S*", source):
        return None
    return source, target


def catalogue_pairs(entries):
    """The cleaned pairs of `mo_entries` output, in order, without translator credits."""
    pairs = []
    for context, msgid, msgstr in entries:
        if msgid in _CREDITS or context in _CREDIT_CONTEXTS:
            continue
        pair = clean_pair(msgid, msgstr)
        if pair:
            pairs.append(pair)
    return pairs


def _leak_key(source):
    """`source` compared across splits: without case, punctuation or spacing (`Open…` = `open`)."""
    return " ".join(re.sub(r"[\W_]+", " ", source.casefold()).split())


def _hash_order(pair):
    return hashlib.sha256(pair[0].encode("utf-8")).hexdigest()


def split_pairs(package_pairs, manifest):
    """The train, dev and test pairs of each package's pairs, deduplicated and without leaks.

    Args:
        package_pairs: dict package -> list of `(source, target)`, in catalogue order.
        manifest: `read_manifest` rows; their order decides which package's
            translation of a source is kept.

    Returns:
        dict split -> list of `(source, target, package)`, sorted by a hash of
        the source (a fixed shuffle that mixes the packages). A source occurs
        once per split; a dev source never matches a train source, and a test
        source matches neither, compared by `_leak_key`.
    """
    splits = {}
    for split in SPLITS:
        kept = {}
        for row in manifest:
            if row["split"] == split:
                for source, target in package_pairs[row["package"]]:
                    kept.setdefault(source, (source, target, row["package"]))
        splits[split] = kept
    seen = set()
    for split in SPLITS:  # train first, then dev, then test
        splits[split] = {source: triple for source, triple in splits[split].items()
                         if split == "train" or _leak_key(source) not in seen}
        seen.update(_leak_key(source) for source in splits[split])
    return {split: sorted(kept.values(), key=_hash_order) for split, kept in splits.items()}


def _deb_name(package, version):
    return f"{package}_{version.replace(':', '%3a')}_"


def _fetch_deb(package, version, cache):
    """The path of `package=version`'s `.deb` in `cache`, downloaded with apt-get when missing."""
    prefix = _deb_name(package, version)
    found = sorted(name for name in os.listdir(cache) if name.startswith(prefix) and name.endswith(".deb"))
    if found:
        return os.path.join(cache, found[0])
    if shutil.which("apt-get") is None:
        raise CorpusError(f"{package}={version} is not in the cache {cache} and apt-get is not available "
                          "to download it: build on a Debian bookworm host or copy the cache folder over")
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        result = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=scratch,
                                capture_output=True, text=True)
        debs = [name for name in os.listdir(scratch) if name.endswith(".deb")]
        if result.returncode or len(debs) != 1:
            reason = " ".join((result.stderr.strip().splitlines() or ["no .deb written"])[-1:])
            raise CorpusError(f"cannot download {package}={version} ({reason}): if bookworm no longer has "
                              f"that version, update its line in tools/debian_po_packages.tsv "
                              f"(`apt-cache policy {package}` shows the current one)")
        os.replace(os.path.join(scratch, debs[0]), os.path.join(cache, debs[0]))
    return os.path.join(cache, debs[0])


def deb_catalogues(deb, package):
    """The German `.mo` files and the copyright file of a `.deb`, read with `dpkg-deb --fsys-tarfile`.

    Returns:
        `(catalogues, copyright)`: a list of `(name, bytes)` sorted by name,
        and the text of `usr/share/doc/<package>/copyright` ('' when the
        package has none of its own).
    """
    if shutil.which("dpkg-deb") is None:
        raise CorpusError("dpkg-deb is not installed: it unpacks the .deb files (Debian package dpkg)")
    catalogues, copyright_text = [], ""
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as process:
        with tarfile.open(fileobj=process.stdout, mode="r|") as archive:
            for member in archive:
                name = member.name[2:] if member.name.startswith("./") else member.name
                if not member.isfile():
                    continue
                if name.startswith(_MO_FOLDER) and name.endswith(".mo"):
                    catalogues.append((name[len(_MO_FOLDER):], archive.extractfile(member).read()))
                elif name == f"usr/share/doc/{package}/copyright":
                    copyright_text = archive.extractfile(member).read().decode("utf-8", "replace")
        process.stdout.read()  # the tar's end padding, so that dpkg-deb is not cut off
        error = process.stderr.read().decode("utf-8", "replace").strip()
    if process.returncode:
        raise CorpusError(f"dpkg-deb cannot read {deb}: {error}")
    return sorted(catalogues), copyright_text


# Where a German catalogue's source sits in an upstream tarball: GNOME-style and KDE-style.
_TRANSLATION_PATHS = ("po/de.po", "po/de/messages.po")


def _dep5_field(paragraph, name):
    match = re.search(rf"^{name}:[ \t]*(.*(?:\n[ \t].*)*)", paragraph, re.M)
    return [line.strip() for line in match.group(1).splitlines() if line.strip()] if match else []


def copyright_notice(text):
    """The copyright holder line and licence that a `debian/copyright` text gives the translations.

    They come from the last `Files:` paragraph of the machine-readable format
    (DEP-5) whose patterns match a German `.po` file (`po/de.po`, `po/de/*.po`;
    often `Files: *`), as that format says: the first line of its `Copyright:`
    field (with "and others" when it has more) and the first line of its
    `License:`. A free-form copyright file gives `('', '')`.

    Example:

    >>> copyright_notice("Format: https://x\\n\\nFiles: *\\nCopyright: 2001 A\\n 2002 B\\nLicense: GPL-2+\\n")
    ('2001 A and others', 'GPL-2+')
    >>> copyright_notice("Upstream: A\\n\\nCopyright (C) 1999 Free Software Foundation, Inc.\\n")
    ('', '')
    """
    if not text.startswith("Format:"):
        return "", ""
    holders, licence = [], []
    for paragraph in re.split(r"\n[ \t]*\n", text):
        patterns = " ".join(_dep5_field(paragraph, "Files")).split()
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns for path in _TRANSLATION_PATHS):
            holders, licence = _dep5_field(paragraph, "Copyright"), _dep5_field(paragraph, "License")
    while len(holders) > 1 and holders[0].endswith(",") and holders[1][:1].isdigit():
        holders[:2] = [f"{holders[0]} {holders[1]}"]  # a list of years wrapped onto the next line
    holder = _holder(holders[0]) if holders else ""
    if len(holders) > 1 and not re.search(r"\bothers\W*$", holder):
        holder += " and others"
    return holder, licence[0] if licence else ""


def _holder(line):
    """`line` without a leading "Copyright:", "Copyright (C)" or "©", its spacing normalised."""
    return " ".join(re.sub(r"^(?:copyright\b:?|\(c\)|©|\s)+", "", line.strip(), flags=re.I).split())


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _package_pairs(deb, catalogues):
    """The cleaned pairs of a package's catalogues and its count of translated entries."""
    pairs, entries = [], 0
    for name, data in catalogues:
        try:
            found = mo_entries(data)
        except (ValueError, LookupError, struct.error) as error:
            raise CorpusError(f"{os.path.basename(deb)}: {_MO_FOLDER}{name}: {error}") from None
        entries += sum(1 for _, _, msgstr in found if msgstr)
        pairs += catalogue_pairs(found)
    return pairs, entries


def read_packages(manifest, cache):
    """Each manifest package's pairs, what the manifest file records about it and its copyright text.

    Raises:
        CorpusError: a package without German catalogues, without a
            machine-readable `debian/copyright`, or whose licence there is not
            the manifest's.

    Returns:
        `(package_pairs, info, copyrights)`: dict package -> list of
        `(source, target)`; dict package -> dict with `version`, `licence`,
        `split`, `deb`, `sha256`, `catalogues`, `entries` and `copyright`
        (the holder line); dict package -> the text of its `debian/copyright`.
    """
    os.makedirs(cache, exist_ok=True)
    package_pairs, info, copyrights = {}, {}, {}
    for row in manifest:
        package, version = row["package"], row["version"]
        deb = _fetch_deb(package, version, cache)
        catalogues, copyright_text = deb_catalogues(deb, package)
        if not catalogues:
            raise CorpusError(f"{package}={version} has no {_MO_FOLDER}*.mo file: "
                              "drop it from tools/debian_po_packages.tsv")
        holder, licence = copyright_notice(copyright_text)
        if not licence:
            raise CorpusError(f"{package}={version} has no machine-readable (DEP-5) debian/copyright, so its "
                              "translations' licence cannot be checked: pick another package")
        if licence != row["licence"]:
            raise CorpusError(f"{package}={version}: tools/debian_po_packages.tsv says licence "
                              f"{row['licence']!r}, its debian/copyright says {licence!r} for po/de.po: "
                              "update the manifest")
        package_pairs[package], entries = _package_pairs(deb, catalogues)
        info[package] = {"version": version, "licence": licence, "split": row["split"],
                         "deb": os.path.basename(deb), "sha256": _sha256(deb),
                         "catalogues": [name for name, _ in catalogues], "entries": entries,
                         "copyright": holder}
        copyrights[package] = copyright_text
    return package_pairs, info, copyrights


def write_atomic(path, text):
    """Writes `text` to `path` through a temporary file in the same folder and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def tsv_text(pairs):
    """`source<TAB>target` lines of `pairs` (further items of a pair are ignored)."""
    return "".join(f"{pair[0]}\t{pair[1]}\n" for pair in pairs)


def build_debian(manifest, cache):
    """The split corpus of the manifest's packages and a record of how each contributed.

    Returns:
        `(splits, info, copyrights)`: `split_pairs` output; the `read_packages`
        info plus `pairs`, the pairs each package gave its split; the copyright texts.
    """
    package_pairs, info, copyrights = read_packages(manifest, cache)
    splits = split_pairs(package_pairs, manifest)
    counts = collections.Counter(package for pairs in splits.values() for _, _, package in pairs)
    for package, record in info.items():
        record["pairs"] = counts[package]
    return splits, info, copyrights


def slices(splits, size):
    """The first `size` train pairs and `size // 10` dev and test pairs whose source is short.

    A pair is kept when its source has at most `SLICE_MAX_SOURCE` characters
    and its translation at most a third more; the hash order of `splits`
    makes every slice a mix of its split's packages.
    """
    sizes = {"train": size, "dev": size // 10, "test": size // 10}
    return {split: [pair for pair in pairs if len(pair[0]) <= SLICE_MAX_SOURCE
                    and len(pair[1]) <= SLICE_MAX_SOURCE * 4 // 3][:sizes[split]]
            for split, pairs in splits.items()}


# Licences whose full text Debian ships in /usr/share/common-licenses (base-files).
COMMON_LICENCES = "/usr/share/common-licenses"
_COMMON_NAMES = {"GPL-2", "GPL-3", "LGPL-2", "LGPL-2.1", "LGPL-3", "MPL-2.0", "Apache-2.0", "GFDL-1.2",
                 "GFDL-1.3"}


def licence_names(licence):
    """The licences a DEP-5 licence expression names, in order.

    Example:

    >>> licence_names("GPL-3+ and GPL-2.0-or-later or MIT, LGPL-2.1+ with Foo exception")
    ['GPL-3+', 'GPL-2.0-or-later', 'MIT', 'LGPL-2.1+ with Foo exception']
    """
    return [name.strip() for name in re.split(r"\s+(?:and|or)\s+|,", licence) if name.strip()]


def _common_name(name):
    """The /usr/share/common-licenses file of a licence name (`GPL-2.0-or-later` -> `GPL-2`), or None."""
    match = re.fullmatch(r"(L?GPL|GFDL(?:-NIV)?|MPL|Apache)-(\d(?:\.\d)?)(?:\+|\.0|-only|-or-later)*", name)
    if not match:
        return None
    family, number = match.group(1).replace("-NIV", ""), match.group(2)
    if family in ("GPL", "LGPL") and number.endswith(".0"):
        number = number[:-2]  # SPDX's GPL-2.0 is Debian's GPL-2
    common = f"{family}-{number}"
    return common if common in _COMMON_NAMES else None


def _licence_text(copyright_text, name):
    """The text of licence `name` in a DEP-5 file: its first `License: name` field with a body, or ''."""
    field = rf"^License:[ \t]*{re.escape(name)}[ \t]*\n((?:[ \t].*(?:\n|\Z))+)"
    match = re.search(field, copyright_text, re.M)
    if not match:
        return ""
    lines = [line.strip() for line in match.group(1).splitlines()]
    return "\n".join("" if line == "." else line for line in lines).strip() + "\n"


def licence_texts(packages, info, copyrights, common_licences=COMMON_LICENCES):
    """The full texts of the licences that `packages` are under, as `(heading, text)` pairs.

    A licence Debian ships in `common_licences` is copied from there once; any
    other comes from the package's `debian/copyright` (its `License:` field
    of that name that has a text).
    """
    common, own = set(), {}
    for package in packages:
        for name in licence_names(info[package]["licence"]):
            if _common_name(name):
                common.add(_common_name(name))
            else:
                text = _licence_text(copyrights[package], name)
                if not text:
                    raise CorpusError(f"{package}: its debian/copyright has no text for licence {name!r}")
                own.setdefault((name, text), []).append(package)
    texts = []
    for name in sorted(common):
        path = os.path.join(common_licences, name)
        if not os.path.exists(path):
            raise CorpusError(f"{path} is missing: the notice copies the licence texts from Debian's "
                              "base-files (/usr/share/common-licenses)")
        with open(path, encoding="utf-8") as f:
            texts.append((f"{name} (Debian's common-licenses/{name}, package base-files)", f.read()))
    for (name, text), owners in sorted(own.items()):
        texts.append((f"{name} (from the debian/copyright of {', '.join(owners)})", text))
    return texts


def slice_licence(slice_splits, info, copyrights, common_licences=COMMON_LICENCES):
    """The licence notice of the slices: each package drawn from, then the licence texts they name."""
    counts = collections.Counter(package for pairs in slice_splits.values() for _, _, package in pairs)
    lines = [
        "English -> German pairs in debian_po_en_de_{train,dev,test}_slice.tsv",
        "",
        "The pairs are the messages (msgid) and German translations (msgstr) of the gettext",
        f"catalogues {_MO_FOLDER}*.mo in the Debian 12 (bookworm) packages below,",
        "cleaned as described in tools/make_parallel_corpus.py. The translations are part of those",
        "packages and are distributed under each package's licence, as its debian/copyright states it",
        "for po/de.po: the GNU GPL or LGPL for most. These three files are therefore NOT under this",
        "project's Apache-2.0 licence; whoever redistributes them must follow the licences below.",
        "Each entry names the package, its version, its split, the number of pairs the slices take",
        "from it, its licence and the first copyright holder line of that paragraph of its",
        "debian/copyright (the whole file is in the package as usr/share/doc/<package>/copyright).",
        "The full licence texts follow the list.",
        "",
    ]
    for package in sorted(counts):
        record = info[package]
        lines.append(f"{package} {record['version']} ({record['split']}, {counts[package]} pairs): "
                     f"{record['licence']}")
        lines.append(f"    Copyright: {record['copyright']}")
    text = "\n".join(lines) + "\n"
    for heading, body in licence_texts(sorted(counts), info, copyrights, common_licences):
        text += "\n" + "=" * 78 + f"\n\n{heading}:\n\n{body}"
    return text


def write_debian(outdir, manifest_path, cache, slice_size=None, slice_dir=None, licence=None):
    """Builds the Debian corpus into `outdir` (and the slices and their notice); returns the counts."""
    manifest = read_manifest(manifest_path)
    splits, info, copyrights = build_debian(manifest, cache)
    for split, pairs in splits.items():
        write_atomic(os.path.join(outdir, f"{split}.tsv"), tsv_text(pairs))
    record = {"source": "German gettext catalogues of Debian 12 (bookworm) packages",
              "manifest": os.path.basename(manifest_path), "manifest_sha256": _sha256(manifest_path),
              "pairs": {split: len(pairs) for split, pairs in splits.items()}, "packages": info}
    write_atomic(os.path.join(outdir, "manifest.json"),
                 json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    counts = {split: len(pairs) for split, pairs in splits.items()}
    if slice_size:
        chosen = slices(splits, slice_size)
        for split, pairs in chosen.items():
            write_atomic(os.path.join(slice_dir, f"debian_po_en_de_{split}_slice.tsv"), tsv_text(pairs))
            counts[f"{split} slice"] = len(pairs)
        if licence:
            write_atomic(licence, slice_licence(chosen, info, copyrights))
    return counts


def _main_debian(args, parser):
    if args.wheels:
        parser.error("--wheels belongs to --out; --debian reads the packages of --manifest")
    if args.slice and not args.slice_dir:
        parser.error("--slice with --debian needs --slice-dir, the folder of the slice files")
    if args.licence and not args.slice:
        parser.error("--licence with --debian writes the notice of the slices: give --slice too")
    cache = args.cache or os.path.join(args.debian, "debs")
    try:
        counts = write_debian(args.debian, args.manifest, cache, args.slice, args.slice_dir, args.licence)
    except CorpusError as error:
        sys.exit(f"error: {error}")
    print(", ".join(f"{split}: {count} pairs" for split, count in counts.items()) + f" -> {args.debian}",
          file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", help="output TSV file of the wheels' .po translations")
    mode.add_argument("--debian", metavar="OUTDIR",
                      help="output folder of the Debian corpus: train.tsv, dev.tsv, test.tsv, manifest.json")
    parser.add_argument("--slice", type=int, help="write only the first N pairs (--debian: also write N "
                        "train, N/10 dev and N/10 test pairs with short sources to --slice-dir)")
    parser.add_argument("--wheels", help="folder of already downloaded wheels (default: pip download)")
    parser.add_argument("--licence", help="also write the packages' licence texts to this file")
    parser.add_argument("--manifest", default=MANIFEST, help="--debian: the packages (default: %(default)s)")
    parser.add_argument("--cache", help="--debian: folder of the .deb files (default: OUTDIR/debs)")
    parser.add_argument("--slice-dir", help="--debian: folder of the debian_po_en_de_<split>_slice.tsv files")
    args = parser.parse_args()
    if args.debian:
        return _main_debian(args, parser)
    if args.cache or args.slice_dir or args.manifest != MANIFEST:
        parser.error("--manifest, --cache and --slice-dir belong to --debian")
    with tempfile.TemporaryDirectory() as scratch:
        wheels = glob.glob(os.path.join(args.wheels, "*.whl")) if args.wheels else _download(scratch)
        pairs = build(wheels)
        if args.licence:
            with open(args.licence, "w", encoding="utf-8") as f:
                f.write(licences(wheels))
    if args.slice:
        pairs = pairs[:args.slice]
    with open(args.out, "w", encoding="utf-8") as f:
        for source, target in pairs:
            f.write(f"{source}\t{target}\n")
    print(f"{len(pairs)} pairs -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
