"""How the CLI reports a mistake: one `error:` line, a "did you mean" for a near key, exit status 2.

jsonargparse's own report prints the whole usage (40 lines for a Trainer) before the message, and
an error raised while the objects are built (a strategy typo, FSDP not dividing the devices, a
checkpoint path that is not one) would otherwise end in a traceback and status 1. `--debug` (taken
off the command line before parsing) keeps the traceback for the cases where it is wanted.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import sys
from typing import Any, Iterable, NoReturn

__all__ = ["DEBUG_FLAG", "did_you_mean", "one_line", "report_error", "take_debug_flag"]

DEBUG_FLAG = "--debug"

_PARSER_KEY = re.compile(r'^Parser key "(?P<key>[^"]+)":\s*(?P<rest>.*)$', re.S)
_EXPECTED = re.compile(r"Expected a <class '(?P<type>[\w.]+)'>")
_GIVEN = re.compile(r"Given value: (?P<value>.*)$", re.M)
# the parts of jsonargparse's report on a Union that say nothing to a user
_NOISE = [re.compile(p) for p in (r"Does not validate against any of the Union subtypes", r"Subtypes: \[.*?\]\n",
                                  r"Errors:", r"- Expected a <class 'NoneType'>", r"Given value type: <class '[^']*'>")]
# the name a user mistyped, in jsonargparse's and argparse's wordings
_UNKNOWN = [
    re.compile(r"unrecognized arguments: (?P<name>\S+)"),
    re.compile(r"does not accept option '(?P<name>[^']+)'"),
    re.compile(r"Option '(?P<name>[^']+)' is not accepted"),
    re.compile(r"invalid choice: '(?P<name>[^']+)'"),
    re.compile(r"Key \"(?P<name>[^\"]+)\" is not expected"),
]
# an argument a class chosen by `class_path` (`--model`, `--data`) does not take, from the command line
# (`NestedArg`) or from a config's `init_args`
_CLASS_ARGUMENT = re.compile(r"Problem with given class_path '(?P<cls>[\w.]+)':\s*Option '(?P<name>[^']+)' is "
                             r"not accepted.*?Given value: (?P<nested>NestedArg)?", re.S)
# the sections whose valid names an unknown one lists (a module's or data's few; the Trainer's are many)
_LISTED = ("model", "data")


def take_debug_flag(args: list[str]) -> tuple[list[str], bool]:
    """`args` without `--debug`, and whether it was there."""
    kept = [a for a in args if a != DEBUG_FLAG]
    return kept, len(kept) != len(args)


def one_line(message: str) -> str:
    """A message on one line; jsonargparse's nested report on a key as "--KEY: what is wrong (given: VALUE)"."""
    match = _PARSER_KEY.match(message.strip())
    if not match:
        return " ".join(message.split())
    rest, given = match["rest"], _GIVEN.search(match["rest"])
    types = [t for t in dict.fromkeys(_EXPECTED.findall(rest)) if t != "NoneType"]
    text = _GIVEN.sub("", rest)
    for noise in _NOISE:
        text = noise.sub(" ", text)
    pieces = [" ".join(piece.split()) for piece in text.split("- ")]
    text = "; ".join(piece for piece in pieces if piece)
    if given is None:
        return f"--{match['key']}: {text}"
    if not text or _EXPECTED.fullmatch(text):
        return f"--{match['key']}: got {given['value'].strip()!r}, expected {' or '.join(types)}"
    return f"--{match['key']}: {text} (given: {given['value'].strip()})"


def did_you_mean(message: str, known: Iterable[str]) -> str | None:
    """The known option or subcommand closest to the unknown one `message` names, if one is close."""
    known = list(known)
    for pattern in _UNKNOWN:
        match = pattern.search(message)
        if match is None:
            continue
        name = match["name"].split("=", 1)[0]
        bare = name.lstrip("-")
        close = difflib.get_close_matches(bare, [k.lstrip("-") for k in known], n=1, cutoff=0.75)
        if close and close[0] != bare:
            prefix = "--" if name.startswith("--") or "." in bare else ""
            return prefix + close[0]
    return None


def option_names(parser: Any) -> list[str]:
    """Every option and subcommand of an argparse-style `parser` and of its subcommand parsers."""
    names: list[str] = []
    for action in getattr(parser, "_actions", []):
        names += [s for s in action.option_strings if s.startswith("--")]
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):  # the subcommands
            for sub_name, sub in choices.items():
                names.append(sub_name)
                names += option_names(sub)
    return names


def class_argument(message: str) -> str | None:
    """jsonargparse's report on an argument a `class_path` class does not take, as one line with
    the nearest argument it takes and every one of them ("--model.lrr: examples.digits.Classifier
    takes no argument 'lrr' (did you mean --model.lr?); it takes lr, model"); None for another
    report. The parser's options cannot suggest it: they are known once the class is chosen."""
    key, match = _PARSER_KEY.match(message.strip()), _CLASS_ARGUMENT.search(message)
    if key is None or match is None:
        return None
    cls, name, section = _imported(match["cls"]), match["name"], key["key"]
    takes = _arguments_of(cls)
    if takes is None:
        return None
    shown = f"--{section}." if match["nested"] else f"{section}.init_args."  # as the user wrote it
    close = difflib.get_close_matches(name, takes, n=1, cutoff=0.6)
    line = f"{shown}{name}: {match['cls']} takes no argument {name!r}"
    if close:
        line += f" (did you mean {shown}{close[0]}?)"
    return f"{line}; it takes {', '.join(takes) or 'none'}"


def _imported(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):  # jsonargparse resolved it: not expected
        return None


def _arguments_of(cls: Any) -> list[str] | None:
    """The keyword arguments `cls(...)` takes (None when they cannot be read)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _section_names(near: str, known: Iterable[str]) -> str:
    """"; --model takes lr, width" for a near key in a module's or data's section, else ""."""
    section, dot, _ = near.lstrip("-").partition(".")
    if not dot or section not in _LISTED:
        return ""
    prefix = f"--{section}."
    names = [k[len(prefix):] for k in dict.fromkeys(known) if k.startswith(prefix) and "." not in k[len(prefix):]]
    return f"; --{section} takes {', '.join(names)}" if names else ""


def report_error(message: str, *, prog: str, known: Iterable[str] = (), hint: str | None = None) -> NoReturn:
    """Prints `error: MESSAGE` (and the near key, and a hint), then exits with status 2."""
    known = list(known)
    line = class_argument(message)
    if line is None:
        line, near = one_line(message), did_you_mean(message, known)
        if near is not None:
            line += f" (did you mean {near}?){_section_names(near, known)}"
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.write(f"tip: {hint or f'{prog} --help lists the options'}; add {DEBUG_FLAG} for a traceback\n")
    sys.stderr.flush()
    raise SystemExit(2)
