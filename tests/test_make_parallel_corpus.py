"""tools/make_parallel_corpus.py's Debian mode: .mo reading, cleaning, splits, slices, offline rebuilds."""

import collections
import doctest
import gettext
import importlib.util
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(REPO, "tools", "make_parallel_corpus.py")
DATA = os.path.join(REPO, "tests", "data", "debian_po_en_de")
SLICES = {split: os.path.join(DATA, f"debian_po_en_de_{split}_slice.tsv")
          for split in ("train", "dev", "test")}
NOTICE = os.path.join(DATA, "LICENSE-DEBIAN-PO-CORPUS.txt")


def _load_tool():
    spec = importlib.util.spec_from_file_location("make_parallel_corpus", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _load_tool()
needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None,
                                reason="dpkg-deb builds the test .deb files")


def write_mo(entries, byteorder="<", charset="UTF-8"):
    """The bytes of a GNU .mo file of `entries`, `(msgid, msgstr)` pairs.

    A context ends with `\\x04` in the msgid; plural forms are joined by `\\x00`.
    """
    header = ("", f"Content-Type: text/plain; charset={charset}\n"
                  "Plural-Forms: nplurals=2; plural=(n != 1);\n")
    items = sorted([header, *entries], key=lambda item: item[0].encode(charset))
    originals = [key.encode(charset) for key, _ in items]
    translations = [value.encode(charset) for _, value in items]
    count, first = len(items), 28
    offset, table, blob = first + 16 * count, [], b""
    for text in originals + translations:
        table.append((len(text), offset))
        blob += text + b"\0"
        offset += len(text) + 1
    head = struct.pack(byteorder + "7I", 0x950412DE, 0, count, first, first + 8 * count, 0, 0)
    return head + b"".join(struct.pack(byteorder + "2I", *row) for row in table) + blob


ENTRIES = [("Open", "Öffnen"), ("menu\x04File", "Datei"),
           ("One file\x00%d files", "Eine Datei\x00%d Dateien"), ("Close", ""), ("Quit", "Beenden")]


# .mo files --------------------------------------------------------------------------------------
@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_mo_entries_give_context_singular_and_translation_in_file_order(byteorder):
    data = write_mo(ENTRIES, byteorder)
    assert tool.mo_entries(data) == [(None, "Close", ""), (None, "One file", "Eine Datei"),
                                     (None, "Open", "Öffnen"), (None, "Quit", "Beenden"),
                                     ("menu", "File", "Datei")]
    # The writer is a real .mo: Python's own reader agrees with it.
    catalogue = gettext.GNUTranslations(io.BytesIO(data))
    assert catalogue.gettext("Open") == "Öffnen" and catalogue.pgettext("menu", "File") == "Datei"
    assert catalogue.ngettext("One file", "%d files", 3) == "%d Dateien"


def test_mo_entries_decode_the_header_charset_and_reject_other_files():
    data = write_mo([("Size", "Größe")], charset="ISO-8859-1")
    assert data.count("Größe".encode("latin-1")) == 1
    assert tool.mo_entries(data) == [(None, "Size", "Größe")]
    with pytest.raises(ValueError, match="not a .mo file: magic number 7f454c46"):
        tool.mo_entries(b"\x7fELF" + b"\0" * 40)
    with pytest.raises(ValueError, match="too short"):
        tool.mo_entries(b"\xde\x12\x04\x95")


def test_catalogue_pairs_clean_entries_and_drop_translator_credits():
    entries = tool.mo_entries(write_mo(ENTRIES + [("translator-credits", "Anna Beispiel"),
                                                  ("NAME OF TRANSLATORS\x04Your names", "Anna Beispiel"),
                                                  ("_Save As…", "Speichern _unter …")]))
    assert tool.catalogue_pairs(entries) == [("One file", "Eine Datei"), ("Open", "Öffnen"),
                                             ("Quit", "Beenden"), ("Save As…", "Speichern unter …"),
                                             ("File", "Datei")]


# Mnemonics, placeholders, cleaning ------------------------------------------------------------
@pytest.mark.parametrize("text,other,expected", [
    ("_Open", "Ö_ffnen", "Open"),
    ("Ö_ffnen", "_Open", "Öffnen"),
    ("E_xit", "_Beenden", "Exit"),
    ("&Save", "&Speichern", "Save"),
    ("Save &As...", "Speichern &unter ...", "Save As..."),
    ("I&n Toolbar", "I&n Werkzeugleiste", "In Toolbar"),  # the same word on both sides: still a mnemonic
    ("Save && Quit", "Speichern && Beenden", "Save && Quit"),  # Qt's escaped ampersand stays
    ("Tom & Jerry", "Tom & Jerry", "Tom & Jerry"),  # not before a letter: text
    ("Fish &amp; Chips", "Fisch &amp; Pommes", "Fish &amp; Chips"),  # an entity
    ("<a href='x?a=1&b=2'>Help</a>", "<a href='x?a=1&b=2'>Hilfe</a>", "<a href='x?a=1&b=2'>Help</a>"),
    ("AT&T network", "AT&T-Netz", "AT&T network"),
    ("Set LC_ALL", "LC_ALL setzen", "Set LC_ALL"),  # an identifier the translation keeps
    ("_NET_WM_NAME missing", "_NET_WM_NAME fehlt", "_NET_WM_NAME missing"),
    ("Call __init__", "__init__ aufrufen", "Call __init__"),
    ("_File _Edit", "", "File _Edit"),  # one mnemonic per label
    ("snake_case", "", "snakecase"),  # mid-word and not in the other side: taken for a mnemonic
])
def test_strip_mnemonic(text, other, expected):
    assert tool.strip_mnemonic(text, other) == expected


@pytest.mark.parametrize("source,target,same", [
    ("%s of %d", "%2$d von %1$s", True),
    ("%1$s %2$s", "%2$s %1$s", True),
    ("%s of %d", "%2$s von %1$d", False),  # reordered with the types swapped
    ("%d items", "%'d Einträge", True),  # flags and width do not count
    ("%ld bytes", "%d Bytes", False),  # the length modifier does
    ("%s: %m", "%s: %m", True),
    ("100%% done", "100 %% fertig", True),
    ("%(name)s saved", "%(name)s gespeichert", True),
    ("%(name)s saved", "%(nom)s gespeichert", False),
    ("{0} and {1}", "{1} und {0}", True),
    ("{} of {}", "{} von {}", True),
    ("{name}", "{Name}", False),
    ("%1 of %2", "%2 von %1", True),
    ("Page %1", "Seite %2", False),
    ("%s files", "Dateien", False),
])
def test_placeholders_compare_as_a_multiset(source, target, same):
    assert (tool.placeholders(source) == tool.placeholders(target)) is same


def test_placeholders_keys():
    assert tool.placeholders("%s of %d, %2$s, %(n)s, {0}, {}, %1, %m, 50%%") == collections.Counter({
        ("printf", 1, "s"): 1, ("printf", 2, "d"): 1, ("printf", 2, "s"): 1, ("named", "n"): 1,
        ("brace", "0"): 2, ("qt", "1"): 1, ("printf", 0, "m"): 1})


@pytest.mark.parametrize("source,target,expected", [
    ("_Open  %s", "%s ö_ffnen", ("Open %s", "%s öffnen")),
    ("Save\tall   files", "Alle Dateien  speichern", ("Save all files", "Alle Dateien speichern")),
    ("Usage:\n", "Aufruf:\n", ("Usage:", "Aufruf:")),  # one trailing newline is no second line
    ("Person|Title", "Titel", ("Title", "Titel")),
    ("DialogTitle|Move", "DialogTitle|Verschieben", ("Move", "Verschieben")),
    ("Debug (never|query|always)", "Fehlersuche (never|query|always)",
     ("Debug (never|query|always)", "Fehlersuche (never|query|always)")),
    ("Line one\nline two", "Zeile eins\nZeile zwei", None),
    ("%d files", "%s Dateien", None),
    ("_OK", "_OK", None),  # equal once the mnemonics are gone
    ("Okular", "Okular", None),
    ("%s: %s", "%s: %s", None),
    ("...", "…", None),  # no word
    ("<b>%s</b>", "<b>%s</b> ", None),
    ("gtk_widget_show_all", "gtk_widget_show_all()", None),  # an identifier
    ("Select_Event_selector", "Ereignis_wählen_Auswahl", None),
    ("Open", "", None),
    ("word " * 41, "Wort " * 41, None),  # over 200 characters
])
def test_clean_pair(source, target, expected):
    assert tool.clean_pair(source, target) == expected


# Splits ---------------------------------------------------------------------------------------
def _rows(*rows):
    return [{"package": package, "version": "1", "licence": "GPL-2+", "split": split}
            for package, split in rows]


def test_split_pairs_dedupe_in_manifest_order_and_remove_held_out_leaks():
    manifest = _rows(("a", "train"), ("b", "train"), ("c", "dev"), ("d", "test"), ("e", "test"))
    package_pairs = {
        "a": [("Open", "Öffnen"), ("Save", "Speichern")],
        "b": [("Open", "Aufmachen"), ("Print", "Drucken")],
        "c": [("open…", "öffnen …"), ("Rename", "Umbenennen"), ("Quit", "Beenden")],
        "d": [("Rename!", "Umbenennen!"), ("Zoom in", "Vergrößern"), ("SAVE", "SICHERN")],
        "e": [("Zoom in", "Hineinzoomen"), ("Zoom out", "Verkleinern")],
    }
    splits = tool.split_pairs(package_pairs, manifest)
    as_sets = {split: set(pairs) for split, pairs in splits.items()}
    assert as_sets == {
        "train": {("Open", "Öffnen", "a"), ("Save", "Speichern", "a"), ("Print", "Drucken", "b")},
        "dev": {("Rename", "Umbenennen", "c"), ("Quit", "Beenden", "c")},
        "test": {("Zoom in", "Vergrößern", "d"), ("Zoom out", "Verkleinern", "e")},
    }
    for pairs in splits.values():  # a fixed order by the source's hash
        assert pairs == sorted(pairs, key=lambda pair: tool.hashlib.sha256(pair[0].encode()).hexdigest())
    assert tool.split_pairs(package_pairs, manifest) == splits


def test_slices_keep_short_sources_in_order():
    pairs = [(f"source {i}" + "x" * (55 if i % 3 == 0 else 0), f"Ziel {i}", "p") for i in range(40)]
    chosen = tool.slices({"train": pairs, "dev": pairs[:12], "test": pairs[12:]}, 20)
    assert [len(chosen[split]) for split in ("train", "dev", "test")] == [20, 2, 2]
    assert chosen["train"] == [pair for pair in pairs if len(pair[0]) <= 60][:20]
    assert chosen["dev"] == [pairs[1], pairs[2]] and chosen["test"] == [pairs[13], pairs[14]]


# Manifest and copyright files ----------------------------------------------------------------
HEADER = "package\tversion\tlicence\tsplit\n"


@pytest.mark.parametrize("body,message", [
    ("a\t1\tGPL-2+\n", r"expected 4 tab-separated columns, got 'a\\t1\\tGPL-2\+'"),
    ("a\t1\tGPL-2+\tvalid\n", r"line 3: split 'valid' is not one of \('train', 'dev', 'test'\)"),
    ("a\t1\tGPL-2+\ttrain\na\t2\tGPL-2+\ttest\n", r"line 4: package 'a' is listed twice"),
])
def test_read_manifest_errors_name_the_line(tmp_path, body, message):
    path = tmp_path / "m.tsv"
    path.write_text("# comment\n" + HEADER + body, encoding="utf-8")
    with pytest.raises(tool.CorpusError, match=message):
        tool.read_manifest(str(path))
    path.write_text("a\t1\tGPL-2+\ttrain\n", encoding="utf-8")
    with pytest.raises(tool.CorpusError, match="the first line must be the header"):
        tool.read_manifest(str(path))


DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: demo

Files: *
Copyright: 1988, 1992, 1993,
  2001 Free Software Foundation, Inc.
  2005 Anna Beispiel
License: GPL-2+

Files: po/*
Copyright:    2010-2012  The   Translators
License: LGPL-2.1+

Files: src/*
Copyright: 2020 Someone Else
License: Expat

License: Expat
 Permission is hereby granted, free of charge.
 .
 THE SOFTWARE IS PROVIDED "AS IS".
"""


def test_copyright_notice_reads_the_paragraph_that_covers_the_translations():
    assert tool.copyright_notice(DEP5) == ("2010-2012 The Translators", "LGPL-2.1+")
    without_po = re.sub(r"Files: po/\*.*?\n\n", "", DEP5, flags=re.S)
    assert tool.copyright_notice(without_po) == (
        "1988, 1992, 1993, 2001 Free Software Foundation, Inc. and others", "GPL-2+")
    assert tool.copyright_notice("Upstream: Anna\n\nCopyright © 1999 Bert\nGPL\n") == ("", "")
    assert tool.copyright_notice("nothing here") == ("", "")


def test_licence_texts_come_from_common_licences_or_the_copyright_file(tmp_path):
    (tmp_path / "GPL-2").write_text("GNU GENERAL PUBLIC LICENSE Version 2\n", encoding="utf-8")
    info = {"p": {"licence": "GPL-2.0-or-later and Expat"}, "q": {"licence": "GPL-2+"}}
    texts = tool.licence_texts(["p", "q"], info, {"p": DEP5, "q": DEP5}, str(tmp_path))
    assert texts == [("GPL-2 (Debian's common-licenses/GPL-2, package base-files)",
                      "GNU GENERAL PUBLIC LICENSE Version 2\n"),
                     ("Expat (from the debian/copyright of p)",
                      'Permission is hereby granted, free of charge.\n\nTHE SOFTWARE IS PROVIDED "AS IS".\n')]
    with pytest.raises(tool.CorpusError, match="p: its debian/copyright has no text for licence 'MIT'"):
        tool.licence_texts(["p"], {"p": {"licence": "MIT"}}, {"p": DEP5}, str(tmp_path))
    with pytest.raises(tool.CorpusError, match="LGPL-3 is missing"):
        tool.licence_texts(["p"], {"p": {"licence": "LGPL-3+"}}, {"p": DEP5}, str(tmp_path))


# Whole builds from a cache of .deb files (no network) -------------------------------------------
EXPAT_COPYRIGHT = DEP5.replace("License: LGPL-2.1+", "License: Expat")


def _deb(cache, package, version, catalogues, copyright_text=EXPAT_COPYRIGHT):
    """Builds `package=version` with German catalogues `{name: entries}` into `cache`, named as apt does."""
    root = cache.parent / f"root-{package}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\nMaintainer: A <a@example.org>\n"
        "Description: test package\n", encoding="utf-8")
    locale = root / "usr" / "share" / "locale" / "de" / "LC_MESSAGES"
    locale.mkdir(parents=True)
    for name, entries in catalogues.items():
        (locale / name).write_bytes(write_mo(entries))
    doc = root / "usr" / "share" / "doc" / package
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(copyright_text, encoding="utf-8")
    deb = cache / f"{package}_{version.replace(':', '%3a')}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


@pytest.fixture
def fake_archive(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    _deb(cache, "alpha", "1:2.0-1", {"alpha.mo": [("_Open", "Ö_ffnen"), ("Save %s", "%s speichern"),
                                                  ("Close", "Schließen"), ("Help", "")],
                                     "extra.mo": [("ctx\x04Print", "Drucken"), ("Open", "Aufmachen")]})
    _deb(cache, "beta", "0.5", {"beta.mo": [("&Open…", "Ö&ffnen …"), ("Rename", "Umbenennen"),
                                            ("Tom & Jerry", "Tom & Jerry")]})
    _deb(cache, "gamma", "3", {"gamma.mo": [("Rename", "Umbenennen"), ("Zoom in", "Vergrößern"),
                                            ("One file\x00%d files", "Eine Datei\x00%d Dateien")]})
    manifest = tmp_path / "packages.tsv"
    manifest.write_text(HEADER + "alpha\t1:2.0-1\tExpat\ttrain\nbeta\t0.5\tExpat\tdev\n"
                        "gamma\t3\tExpat\ttest\n", encoding="utf-8")
    return tmp_path, str(manifest), str(cache)


def _files(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
            if not os.path.isdir(os.path.join(folder, name))}


@needs_dpkg
def test_debian_build_is_offline_deterministic_and_split_by_package(fake_archive, monkeypatch):
    tmp_path, manifest, cache = fake_archive
    which = shutil.which  # no apt-get: the build must need only the cache
    monkeypatch.setattr(tool.shutil, "which", lambda name: None if name == "apt-get" else which(name))
    counts = tool.write_debian(str(tmp_path / "one"), manifest, cache, 10, str(tmp_path / "slices"),
                               str(tmp_path / "slices" / "NOTICE.txt"))
    assert counts == {"train": 4, "dev": 1, "test": 2, "train slice": 4, "dev slice": 1, "test slice": 1}
    first = _files(tmp_path / "one")
    assert sorted(first) == ["dev.tsv", "manifest.json", "test.tsv", "train.tsv"]
    assert sorted(first["train.tsv"].decode().splitlines()) == [
        "Close\tSchließen", "Open\tÖffnen", "Print\tDrucken", "Save %s\t%s speichern"]
    # beta's "Open…" is train's "Open" and "Tom & Jerry" is no translation; gamma's "Rename" is dev's.
    assert first["dev.tsv"] == b"Rename\tUmbenennen\n"
    assert sorted(first["test.tsv"].decode().splitlines()) == ["One file\tEine Datei", "Zoom in\tVergrößern"]
    record = json.loads(first["manifest.json"])
    assert record["pairs"] == {"train": 4, "dev": 1, "test": 2}
    alpha = record["packages"]["alpha"]
    assert {key: alpha[key] for key in ("version", "licence", "split", "pairs", "entries", "catalogues",
                                        "copyright", "deb")} == {
        "version": "1:2.0-1", "licence": "Expat", "split": "train", "pairs": 4, "entries": 5,
        "catalogues": ["alpha.mo", "extra.mo"], "copyright": "2010-2012 The Translators",
        "deb": "alpha_1%3a2.0-1_all.deb"}
    assert alpha["sha256"] == tool._sha256(os.path.join(cache, "alpha_1%3a2.0-1_all.deb"))
    notice = (tmp_path / "slices" / "NOTICE.txt").read_text(encoding="utf-8")
    assert "alpha 1:2.0-1 (train, 4 pairs): Expat\n    Copyright: 2010-2012 The Translators\n" in notice
    assert "beta 0.5 (dev, 1 pairs): Expat" in notice and "gamma 3 (test, 1 pairs): Expat" in notice
    assert "Expat (from the debian/copyright of alpha, beta, gamma):\n\nPermission is hereby" in notice
    # A rebuild from the cache gives the same bytes, and the same as the first build's slices.
    slices = _files(tmp_path / "slices")
    tool.write_debian(str(tmp_path / "two"), manifest, cache, 10, str(tmp_path / "slices"),
                      str(tmp_path / "slices" / "NOTICE.txt"))
    assert _files(tmp_path / "two") == first and _files(tmp_path / "slices") == slices
    assert not [name for name in os.listdir(tmp_path / "two") if name.startswith(".tmp-")]


@needs_dpkg
def test_debian_build_from_the_command_line(fake_archive):
    tmp_path, manifest, cache = fake_archive
    result = subprocess.run([sys.executable, TOOL, "--debian", str(tmp_path / "out"), "--manifest", manifest,
                             "--cache", cache], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"train: 4 pairs, dev: 1 pairs, test: 2 pairs -> {tmp_path / 'out'}\n"
    result = subprocess.run([sys.executable, TOOL, "--debian", str(tmp_path / "out"), "--out", "x.tsv"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "not allowed with argument" in result.stderr
    result = subprocess.run([sys.executable, TOOL, "--out", "x.tsv", "--cache", cache], capture_output=True,
                            text=True)
    assert result.returncode == 2 and "--cache and --slice-dir belong to --debian" in result.stderr


@needs_dpkg
def test_debian_build_checks_the_licence_and_the_copyright_format(fake_archive):
    tmp_path, manifest, cache = fake_archive
    text = open(manifest, encoding="utf-8").read()
    with open(manifest, "w", encoding="utf-8") as f:
        f.write(text.replace("beta\t0.5\tExpat", "beta\t0.5\tGPL-3+"))
    with pytest.raises(tool.CorpusError) as error:
        tool.write_debian(str(tmp_path / "out"), manifest, cache)
    assert str(error.value) == ("beta=0.5: tools/debian_po_packages.tsv says licence 'GPL-3+', its "
                                "debian/copyright says 'Expat' for po/de.po: update the manifest")
    _deb(tmp_path / "cache", "delta", "1", {"delta.mo": [("Open", "Öffnen")]}, "Copyright 2001 Anna\nGPL\n")
    with open(manifest, "w", encoding="utf-8") as f:
        f.write(HEADER + "delta\t1\tGPL\ttrain\n")
    with pytest.raises(tool.CorpusError, match=r"^delta=1 has no machine-readable \(DEP-5\) debian/"):
        tool.write_debian(str(tmp_path / "out"), manifest, cache)


def test_missing_package_errors_say_what_to_do(tmp_path, monkeypatch):
    cache = str(tmp_path)
    monkeypatch.setattr(tool.shutil, "which", lambda name: None)
    with pytest.raises(tool.CorpusError) as error:
        tool._fetch_deb("gimp-data", "2.10-1", cache)
    assert str(error.value) == (f"gimp-data=2.10-1 is not in the cache {cache} and apt-get is not "
                                "available to download it: build on a Debian bookworm host or copy the "
                                "cache folder over")
    monkeypatch.setattr(tool.shutil, "which", lambda name: "/bin/" + name)
    failed = subprocess.CompletedProcess([], 100, "", "Reading package lists...\nE: Version '2.10-1' for "
                                                      "'gimp-data' was not found\n")
    monkeypatch.setattr(tool.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(tool.CorpusError) as error:
        tool._fetch_deb("gimp-data", "2.10-1", cache)
    assert str(error.value) == ("cannot download gimp-data=2.10-1 (E: Version '2.10-1' for 'gimp-data' "
                                "was not found): if bookworm no longer has that version, update its line "
                                "in tools/debian_po_packages.tsv (`apt-cache policy gimp-data` shows the "
                                "current one)")
    assert os.listdir(cache) == []  # the download's scratch folder is gone


# The committed manifest, slices and notice ------------------------------------------------------
def _read_tsv(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[-1] == ""
    return lines[:-1]


def test_manifest_pins_each_package_once_in_one_split():
    rows = tool.read_manifest()
    assert 40 <= len(rows) <= 50
    splits = collections.Counter(row["split"] for row in rows)
    assert splits["train"] >= 35 and 3 <= splits["dev"] <= 5 and 3 <= splits["test"] <= 5
    assert len({row["package"] for row in rows}) == len(rows)
    for row in rows:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", row["package"]), row
        assert re.fullmatch(r"(\d+:)?[0-9][A-Za-z0-9.+~-]*", row["version"]), row
        assert re.search(r"GPL|MIT|Expat|BSD|CC-BY", row["licence"]), row


def test_committed_slices_are_clean_split_by_package_and_short():
    pairs = {}
    for split, path in SLICES.items():
        lines = _read_tsv(path)
        for line in lines:
            assert line.count("\t") == 1, line
            source, target = line.split("\t")
            assert source and target, line
            assert source == " ".join(source.split()) and target == " ".join(target.split()), line
            assert source != target and len(source) <= 60 and len(target) <= 80, line
            assert tool.placeholders(source) == tool.placeholders(target), line
        pairs[split] = [tuple(line.split("\t")) for line in lines]
    assert {split: len(split_pairs) for split, split_pairs in pairs.items()} == {"train": 3000, "dev": 300,
                                                                                 "test": 300}
    sources = {split: {source for source, _ in split_pairs} for split, split_pairs in pairs.items()}
    assert {split: len(found) for split, found in sources.items()} == {"train": 3000, "dev": 300, "test": 300}
    keys = {split: {tool._leak_key(source) for source in found} for split, found in sources.items()}
    assert not keys["test"] & keys["train"] and not keys["test"] & keys["dev"]
    assert not keys["dev"] & keys["train"]
    assert sum(os.path.getsize(path) for path in [*SLICES.values(), NOTICE]) < 1_000_000


def test_committed_notice_names_the_manifest_packages_with_their_licences():
    rows = {row["package"]: row for row in tool.read_manifest()}
    text = open(NOTICE, encoding="utf-8").read()
    entry = r"^(\S+) (\S+) \((train|dev|test), (\d+) pairs\): (.+)\n    Copyright: (.+)$"
    entries = re.findall(entry, text, re.M)
    assert len(entries) >= 30
    for package, version, split, _, licence, holder in entries:
        assert (version, split, licence) == (rows[package]["version"], rows[package]["split"],
                                             rows[package]["licence"]), package
        assert holder.strip(), package
    counts = collections.Counter()
    for _, _, split, count, _, _ in entries:
        counts[split] += int(count)
    assert counts == {"train": 3000, "dev": 300, "test": 300}
    assert {split for _, _, split, _, _, _ in entries} == {"train", "dev", "test"}
    assert "therefore NOT under this project's Apache-2.0 licence" in " ".join(text.split())
    assert "GNU GENERAL PUBLIC LICENSE" in text and "Version 3, 29 June 2007" in text


def test_tool_docstring_examples_hold():
    result = doctest.testmod(tool, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 15 and result.failed == 0
