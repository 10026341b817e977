"""What the `keras-posenc` subcommands share: the user error, the flag types and the flag builders.

`CommandError` is a user error that `cli.main` prints as one line (exit
status 2); `positive_int` and `nonnegative_float` are argparse types;
`add_config_flags` makes one flag per field of a dataclass config
(`train_config.TrainConfig`) and `config_from_flags` reads them back;
`add_run_argument` is the positional run folder of the commands that read a
trained run.

Example:

>>> parser = argparse.ArgumentParser()
>>> _ = parser.add_argument("--steps", type=positive_int)
>>> parser.parse_args(["--steps", "3"]).steps
3
>>> positive_int("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a positive integer, got '0'
"""

import argparse
import dataclasses

__all__ = ["CommandError", "add_config_flags", "add_run_argument", "config_from_flags", "nonnegative_float",
           "positive_int"]


class CommandError(Exception):
    """A user error: printed without a traceback."""


def positive_int(text):
    """The argparse type of a count: `text` as an int >= 1.

    Args:
        text: str, the flag's value.

    Returns:
        int >= 1.

    Raises:
        argparse.ArgumentTypeError: not an integer, or below 1.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_float(text):
    """The argparse type of a rate or a penalty: `text` as a float >= 0.

    Args:
        text: str, the flag's value.

    Returns:
        float >= 0.

    Raises:
        argparse.ArgumentTypeError: not a number, negative or NaN.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


_FLAG_TYPES = {int: positive_int, float: float, str: str}


def add_config_flags(parser, config, names=None):
    """Adds a flag for each field of the dataclass `config` whose metadata has a help text.

    Names, types, choices and help come from the fields (`train_config._option`);
    defaults are `config`'s values, shown in `--help`. A bool field, or a
    field with `const` metadata, is a switch; `dest` is the field name.

    Args:
        parser: an `argparse.ArgumentParser`.
        config: a dataclass instance (e.g. `TrainConfig()`), the defaults.
        names: optional collection of field names to add (default: all).
    """
    groups = {}
    for field in dataclasses.fields(config):
        meta = field.metadata
        if "help" not in meta or (names is not None and field.name not in names):
            continue
        if meta["group"] not in groups:
            groups[meta["group"]] = parser.add_argument_group(meta["group"])
        # A field declared None is resolved by the config itself (`position` by `task`): left None here.
        default = None if field.default is None else getattr(config, field.name)
        flag = meta["flag"] or "--" + field.name.replace("_", "-")
        options = {"dest": field.name, "default": default, "help": meta["help"]}
        if field.type is bool or meta.get("const") is not None:
            const = meta.get("const") if meta.get("const") is not None else not default
            options.update(action="store_const", const=const, help=meta["help"] + " (default: off)")
        else:
            options["type"] = meta["type"] or _FLAG_TYPES[field.type]
            if meta["choices"]:
                options["choices"] = list(meta["choices"])
            if default is not None:  # a None default is explained by the help text itself
                options["help"] += f" (default: {default})"
        groups[meta["group"]].add_argument(flag, **options)


def config_from_flags(args, defaults):
    """The config of parsed flags: `defaults` with every field that has a flag in `args`.

    Args:
        args: the `argparse.Namespace` of a parser that `add_config_flags` built.
        defaults: a dataclass instance (e.g. `TrainConfig()`): the fields without a flag.

    Returns:
        a copy of `defaults` (`dataclasses.replace`) with the flags' values.
    """
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(defaults) if hasattr(args, f.name)}
    return dataclasses.replace(defaults, **values)


def add_run_argument(parser):
    """The positional RUN_DIR_OR_MODEL of the commands that read a trained run (generate, translate)."""
    parser.add_argument("run", metavar="RUN_DIR_OR_MODEL",
                        help="a run folder (model.keras + spm.model), or a .keras file with spm.model "
                             "beside it")
