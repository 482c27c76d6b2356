"""Command lines as people type them: options and `key=value` overrides in any order.

    args = parse_command_line(parser, argv)   # instead of parser.parse_args(argv)

argparse alone stops reading options at the first positional (`train.py --config X k=v --output-dir
D` fails with "unrecognized arguments"), and an option taking a list (`--sparse-fractions 0 0.5
data.root=/d`) swallows the override after it. Here every `key=value` token that is not the value of
an option is an override, wherever it stands; the rest is read with `parse_intermixed_args`, so
plain positionals (run folders) may follow options too. Every entry point parses its command line
through this function.
"""

import argparse
import sys
from collections.abc import Sequence


def _action_of(parser: argparse.ArgumentParser, token: str) -> argparse.Action | None:
    """The option `token` names (`--out`, `--out=X`, or an abbreviation argparse accepts), None if
    none or several."""
    name = token.split("=", 1)[0]
    table = parser._option_string_actions  # argparse's own table of option strings
    if name in table:
        return table[name]
    if not parser.allow_abbrev:
        return None
    matches = {
        action
        for option, action in table.items()
        if option.startswith(name) and option.startswith("--")
    }
    return matches.pop() if len(matches) == 1 else None


def _is_override(token: str) -> bool:
    return "=" in token and not token.startswith("-")


def _looks_negative(parser: argparse.ArgumentParser, token: str) -> bool:
    """-0.5 is a value (argparse's rule: when no option looks like a negative number)."""
    return (
        parser._negative_number_matcher.match(token) is not None
        and not parser._has_negative_number_optionals
    )


def split_overrides(
    parser: argparse.ArgumentParser, argv: Sequence[str], key_value_options: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """(the other tokens, the key=value overrides in their order). An option's own value stays with
    it: one token after an option of one value (`--slurm-arg account=abc`), n after one of n; an
    option of a list takes key=value tokens only if it is named in `key_value_options`
    (reproduce.py's `--eval k=v ...`), up to the next option."""
    others, overrides = [], []
    pending = 0  # values still owed to the option just read
    collecting = False  # inside a key_value_options list
    positional_only = False  # after "--"
    for token in argv:
        if positional_only:
            (overrides if _is_override(token) else others).append(token)
        elif pending:
            others.append(token)
            pending -= 1
        elif token == "--":  # kept: argparse reads what follows as positionals too
            others.append(token)
            positional_only = True
            collecting = False
        elif token.startswith("-") and len(token) > 1 and not _looks_negative(parser, token):
            action = _action_of(parser, token)
            nargs = getattr(action, "nargs", 0)
            inline = "=" in token
            collecting = (
                action is not None
                and not inline
                and any(o in key_value_options for o in action.option_strings)
            )
            if action is None or inline or collecting:
                pending = 0
            elif nargs is None:
                pending = 1
            elif isinstance(nargs, int):
                pending = nargs
            else:  # "?", "*", "+": its values are the tokens that are not key=value
                pending = 0
            others.append(token)
        elif collecting or not _is_override(token):
            others.append(token)
        else:
            overrides.append(token)
    return others, overrides


def parse_command_line(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    overrides: str = "overrides",
    key_value_options: Sequence[str] = (),
) -> argparse.Namespace:
    """`parser.parse_args(argv)` with options, positionals and key=value overrides in any order.
    `overrides`: the dest of the parser's `key=value` positional (nargs="*"), which receives every
    override; a parser without one is only read intermixed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    takes_overrides = any(a.dest == overrides and not a.option_strings for a in parser._actions)
    if not takes_overrides:
        return parser.parse_intermixed_args(argv)
    others, found = split_overrides(parser, argv, key_value_options)
    args = parser.parse_intermixed_args(others)
    setattr(
        args, overrides, [*found, *getattr(args, overrides)]
    )  # any left there are not key=value: load refuses
    return args
