"""Builds an English -> German parallel corpus from the human translations in gettext `.po` files.

Django, Wagtail, Sphinx, django CMS and Oscar ship the German translations
of their user interface messages as `.po` files inside their wheels: short
English sentences and phrases (`msgid`) with the translation a person wrote
(`msgstr`). All five are BSD-licensed (see
`keras_posenc/app/data/LICENSE-PO-CORPUS.txt`). This script downloads the pinned wheels with pip, reads every
German `.po` file, keeps the translated, non-fuzzy entries that hold words
(placeholders such as `%(name)s`, `{0}` or `%s` are removed, and an entry
whose text is only placeholders, punctuation or HTML is dropped), and writes
`source<TAB>target` lines, deduplicated by source, in a fixed order.

Rebuild the full corpus (about 5,000 pairs) and the shipped test slice:

    python tools/make_parallel_corpus.py --out runs/po_en_de.tsv
    python tools/make_parallel_corpus.py --out keras_posenc/app/data/po_en_de_slice.tsv \\
        --slice 1200 --licence keras_posenc/app/data/LICENSE-PO-CORPUS.txt

`--wheels DIR` reads already downloaded wheels instead of calling pip.

References:
    - GNU gettext manual, "The Format of PO Files",
      https://www.gnu.org/software/gettext/manual/html_node/PO-Files.html.
"""

import argparse
import ast
import glob
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

__all__ = ["PACKAGES", "build", "clean", "licences", "po_entries"]

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output TSV file")
    parser.add_argument("--slice", type=int, help="write only the first N pairs")
    parser.add_argument("--wheels", help="folder of already downloaded wheels (default: pip download)")
    parser.add_argument("--licence", help="also write the packages' licence texts to this file")
    args = parser.parse_args()
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
