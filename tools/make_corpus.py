"""Rebuilds `python_docs_en.txt`, the embedded default corpus.

The corpus is English prose from the Python documentation shipped with the
interpreter (the language reference topics in `pydoc_data.topics` and the
docstrings of the standard library's public modules, classes and functions),
one sentence per line. Code, grammar rules, tables and headings are left out.
The text is copyright the Python Software Foundation and distributed under
the PSF License Version 2 (see `keras_posenc/app/data/LICENSE-PSF.txt`).

The shipped file was built with CPython 3.11.7:

    python tools/make_corpus.py > keras_posenc/app/data/python_docs_en.txt

References:
    - PSF License Version 2, https://docs.python.org/3/license.html.
"""

import importlib
import inspect
import re
import sys
import textwrap
import warnings

__all__ = ["build"]

_SKIP_MODULES = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3",
                 "ensurepip", "pydoc_data", "__main__"}


def _documents():
    from pydoc_data import topics

    for key in sorted(topics.topics):
        yield topics.topics[key]
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in _SKIP_MODULES:
            continue
        try:
            module = importlib.import_module(name)
        except (ImportError, OSError, RuntimeError):  # platform-specific modules
            continue
        yield inspect.getdoc(module) or ""
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield inspect.getdoc(obj) or ""
            if inspect.isclass(obj):
                for method_name, method in sorted(vars(obj).items()):
                    if not method_name.startswith("_") and inspect.isfunction(method):
                        yield inspect.getdoc(method) or ""


def _sentences(text):
    for block in re.split(r"\n\s*\n", text):
        block = textwrap.dedent(block)
        lines = block.split("\n")
        if any(set(line.strip()) <= set("*=-~^+|") for line in lines):  # headings and tables
            continue
        if any(s in block for s in (">>>", "::=", "...", "|")) or block.lstrip().startswith(("#", "-", "*")):
            continue
        if any(line.startswith((" ", "\t")) for line in lines):  # code samples
            continue
        paragraph = re.sub(r"\s+", " ", " ".join(lines)).strip()
        if paragraph[:1].isupper():
            yield from re.split(r"(?<=[.!?:])\s+(?=[A-Z(\"])", paragraph)


def build():
    """Returns the corpus text, one sentence per line.

    Imports every public standard-library module (so it is not run as a
    doctest), and the result depends on the Python version (the shipped
    file used CPython 3.11.7). Sentences shorter than 30 characters, mostly
    non-letters, duplicated, unterminated or holding quoted paths are dropped.

    Returns:
        str, the sentences joined with newlines, ending with a newline.

    Example: run as a script (see the module docstring)::

        python tools/make_corpus.py > keras_posenc/app/data/python_docs_en.txt
        git diff --stat keras_posenc/app/data/python_docs_en.txt   # empty on CPython 3.11.7
    """
    warnings.simplefilter("ignore")
    out, seen = [], set()
    for document in _documents():
        for sentence in _sentences(document):
            letters = sum(c.isalpha() or c in " ,." for c in sentence)
            if (len(sentence) < 30 or letters / len(sentence) < 0.88 or sentence in seen
                    or sentence[-1] not in ".!?:" or re.search(r"'/\w", sentence)):
                continue
            seen.add(sentence)
            out.append(sentence)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(build())
