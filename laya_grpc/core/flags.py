"""Every command-line flag is also an environment variable.

`add(parser, "--device", env="LAYA_DEVICE", default="auto", help=...)` reads the default from
the environment, so a flag given on the command line wins over the variable, which wins over the
built-in default; `--help` shows the variable's name next to each flag.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Optional


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= minimum."""
    def parse(text: str) -> int:
        try:
            n = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError("expected an integer, got %r" % text) from None
        if n < minimum:
            raise argparse.ArgumentTypeError("must be at least %d, got %d" % (minimum, n))
        return n
    return parse


positive_int = int_at_least(1)       # a count of 0 would leave nothing to serve with
non_negative_int = int_at_least(0)


def _parse_bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError("expected a boolean (1/0, true/false), got %r" % text)


def add(parser: argparse.ArgumentParser, *names: str, env: str, default: Any = None,
        type: Optional[Callable] = None, help: str = "", action: Optional[str] = None,
        choices=None, append: bool = False, metavar: Optional[str] = None,
        nargs: Optional[str] = None, const: Any = None) -> None:
    """Add a flag whose default comes from `env` when that variable is set."""
    raw = os.environ.get(env)
    text = "%s [env: %s]" % (help, env)
    if action == "store_true":
        value = _parse_bool(raw) if raw is not None else bool(default)
        parser.add_argument(*names, action="store_true", default=value, help=text)
        return
    if append:
        # Repeatable flag; the variable holds a comma- or whitespace-separated list.
        value = [v for v in raw.replace(",", " ").split()] if raw else list(default or [])
        parser.add_argument(*names, action="append", default=None, type=type, choices=choices,
                            metavar=metavar, help=text + " (repeatable)")
        parser.set_defaults(**{_dest(names): None})
        parser._laya_append_defaults = getattr(parser, "_laya_append_defaults", {})
        parser._laya_append_defaults[_dest(names)] = value
        return
    if raw is not None:
        try:
            value = type(raw) if type else raw
        except (ValueError, argparse.ArgumentTypeError) as e:
            parser.error("environment variable %s=%r is invalid: %s" % (env, raw, e))
    else:
        value = default
    extra = {"nargs": nargs, "const": const} if nargs else {}
    parser.add_argument(*names, default=value, type=type, choices=choices, metavar=metavar, **extra,
                        help=text + ("" if default is None else " (default: %(default)s)"))


def finish(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Apply env/defaults of repeatable flags that were not given on the command line."""
    for dest, value in getattr(parser, "_laya_append_defaults", {}).items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)
    return args


def _dest(names) -> str:
    long = [n for n in names if n.startswith("--")]
    return (long[0] if long else names[0]).lstrip("-").replace("-", "_")

