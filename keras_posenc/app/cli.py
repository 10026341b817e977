"""The `keras-posenc` command line: `demo`, `train`, `generate`, `translate`, `inspect`, `export`, `ablate`.

Each subcommand is a pair `add_<name>_parser(subparsers)` (its flags) and
`run_<name>(args) -> int` (its work), registered in `_SUBCOMMANDS`: `train`
and `demo` in `cli_train`, `generate`, `translate` and `inspect` in
`cli_trained_run`, `export` in `cli_export`, `ablate` in `cli_ablate`; what
they share (the user error, the flag types) is in `cli_flags`. The flags of
`train` and `demo` are generated from the fields of `train_config.TrainConfig`
(name, type, default, help and choices in one place); `demo` and `export`
share `cli_export.export_command`, which prints `export.export_and_check`.

Exit status: 0 on success, 1 when `export` fails its parity or GPU check,
2 on a usage or input error, a file that cannot be written (full disk,
read-only folder) or a run folder that another run holds (the message goes
to stderr, one line, no traceback); 128 + the signal when SIGTERM or SIGINT
stopped training (after it saved a checkpoint).

Output: the command's own lines only. TensorFlow's, XLA's and TFLite's log
lines and the libraries' Python warnings are dropped unless a subcommand gets
`--verbose` (`keras_posenc._startup` sets this up before TensorFlow loads).

Example:

>>> main(["train", "--corpus", "missing.txt"])  # prints the error to stderr
2

From a shell (each subcommand has `--help`)::

    keras-posenc demo                                    # train + export a small LM, runs/demo/
    keras-posenc train --corpus corpus.txt --out runs/lm --steps 500
    keras-posenc generate runs/lm --prompt "The module" --max-new-tokens 20
    keras-posenc train --task translate --format tsv --corpus pairs.tsv --out runs/mt --steps 4000
    keras-posenc translate runs/mt --input test.en --output test.hyp --reference test.de
    keras-posenc inspect runs/lm/model.keras
    keras-posenc export runs/lm/model.keras --out runs/lm/model.tflite --sequence-length 64
    keras-posenc ablate --quick

The subcommands that train or convert models are exercised by
`tests/test_cli.py`, `tests/test_ablation.py` and `tests/test_export.py`.
"""

import argparse
import sys
import warnings

from keras_posenc import _startup
from keras_posenc.app.cli_ablate import add_ablate_parser, run_ablate
from keras_posenc.app.cli_export import add_export_parser, run_export
from keras_posenc.app.cli_flags import CommandError
from keras_posenc.app.cli_train import add_demo_parser, add_train_parser, run_demo, run_train
from keras_posenc.app.cli_trained_run import (
    add_generate_parser,
    add_inspect_parser,
    add_translate_parser,
    run_generate,
    run_inspect,
    run_translate,
)

__all__ = ["build_parser", "main"]

# The modules of the `app` extra (setup.cfg): the layers run without them, the command does not.
APP_EXTRA_MODULES = ("sentencepiece", "tensorflow_text", "matplotlib", "sacrebleu")

_SUBCOMMANDS = {
    "demo": (add_demo_parser, run_demo),
    "train": (add_train_parser, run_train),
    "generate": (add_generate_parser, run_generate),
    "translate": (add_translate_parser, run_translate),
    "inspect": (add_inspect_parser, run_inspect),
    "export": (add_export_parser, run_export),
    "ablate": (add_ablate_parser, run_ablate),
}


def build_parser():
    """The `argparse` parser of `keras-posenc` with every subcommand.

    Returns:
        an `argparse.ArgumentParser`; `parse_args` gives a namespace whose
        `command` names the subcommand.

    Example:

    >>> args = build_parser().parse_args(["train", "--steps", "5", "--position", "learned"])
    >>> args.command, args.steps, args.position, args.corpus_format
    ('train', 5, 'learned', 'text')
    """
    parser = argparse.ArgumentParser(prog="keras-posenc", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_parser, _ in _SUBCOMMANDS.values():
        add_parser(subparsers)
    for subparser in subparsers.choices.values():
        subparser.add_argument(_startup.VERBOSE_FLAG, dest="runtime_logs", action="store_true",
                               help="also show TensorFlow's, XLA's and TFLite's log lines and the "
                                    "libraries' warnings (default: off)")
    return parser


def _warning_printer(show_library_warnings):
    def show(message, category, filename, lineno, file=None, line=None):
        if show_library_warnings or _startup.is_package_warning(filename):
            print(f"keras-posenc: warning: {message}", file=sys.stderr)

    return show


def main(argv=None):
    """Runs `keras-posenc` with `argv` (default: the process arguments); returns the exit code.

    User errors (`ValueError`, `OSError`, a bad flag combination, a module
    of the `app` extra that is not installed), write
    errors (`files.FileWriteError`, TensorFlow's file errors), a run folder
    held by another run (`RunLockedError`) are printed to stderr as one line
    `keras-posenc: error: ...` and give status 2; argparse errors exit with
    status 2 through `SystemExit`. Training stopped by SIGTERM or SIGINT
    prints one line and gives 128 + the signal.

    Args:
        argv: list of str, the arguments after the program name (None:
            `sys.argv[1:]`).

    Returns:
        int, the exit status: 0 success, 1 failed export check, 2 error.

    Example:

    >>> main(["train", "--format", "tsv"])  # the embedded corpus is not TSV; message on stderr
    2
    """
    try:
        return _main(argv)
    except ModuleNotFoundError as err:  # the parser's defaults already need the application's modules
        if (err.name or "").split(".")[0] not in APP_EXTRA_MODULES:
            raise
        print(f"keras-posenc: error: the command needs the application's dependencies ({err}): "
              "pip install 'keras-posenc[app]'.", file=sys.stderr)
        return 2


def _main(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    from keras_posenc.backend import backend_name, is_tensorflow

    if not is_tensorflow():  # tf.data, tf.distribute, checkpoints and TFLite are TensorFlow's
        print(f"keras-posenc: error: `{args.command}` needs KERAS_BACKEND=tensorflow "
              f"(this process runs Keras on {backend_name()}).", file=sys.stderr)
        return 2
    import tensorflow as tf

    from keras_posenc.app.run_lock import RunLockedError
    from keras_posenc.app.train import TrainingInterrupted

    previous, warnings.showwarning = warnings.showwarning, _warning_printer(args.runtime_logs)
    try:
        return _SUBCOMMANDS[args.command][1](args)
    except TrainingInterrupted as err:
        print(f"keras-posenc: {err}", file=sys.stderr)
        return 128 + err.signum
    except KeyboardInterrupt:
        print("keras-posenc: interrupted (SIGINT).", file=sys.stderr)
        return 128 + 2
    except (CommandError, ValueError, OSError, RunLockedError) as err:
        print(f"keras-posenc: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except tf.errors.OpError as err:  # a file TensorFlow reads or writes (full disk, corrupt file)
        print(f"keras-posenc: error: {type(err).__name__}: {_one_line(err)}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = previous


def _one_line(error):
    """The message of `error` on one line (TensorFlow's start with the op's node name: dropped)."""
    from keras_posenc.files import FileWriteError

    text = error.strerror if isinstance(error, FileWriteError) else str(error)  # without "[Errno 28]"
    if text.startswith("{{function_node"):
        text = text.split("}}", 1)[-1]
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
