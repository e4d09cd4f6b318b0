"""Settings: one typed class per service, its flags and environment variables generated from it.

A settings class is a dataclass whose fields are declared with `setting(default, help, ...)`.
The attribute name is what the code reads (`args.max_wait_ms`); the setting's public name is the
same unless `name=` gives another, and from it come the flag and the variable:

    drain_grace_s: float = setting(20.0, "...", name="drain_grace_seconds", unit="seconds",
                                   deprecated=("--drain-grace-s", "LAYA_DRAIN_GRACE_S"))
    -> --drain-grace-seconds, LAYA_DRAIN_GRACE_SECONDS

A flag given on the command line wins over the variable, which wins over the default. Old
spellings listed in `deprecated` keep working and log a one-line warning. Variables that upstream
`laya serve` defines (`env="LAYA_MAX_CONCURRENT"`) keep upstream's name and, through `env_parse`,
upstream's lenient parsing. `resolve` records where each value came from, for `laya-grpc config`.

This module is the only reader of the process environment for settings (`external` serves the few
variables that other libraries define).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import sys
import types
from typing import Any, Callable, Iterable, Mapping, MutableMapping, Optional

log = logging.getLogger("laya_grpc.settings")

USE_DEFAULT = object()   # what an `env_parse` returns to fall back to the default, as upstream does


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


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds, got %r" % text) from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number of seconds, got %r" % text)
    return value


def parse_bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError("expected a boolean (1/0, true/false), got %r" % text)


@dataclasses.dataclass(frozen=True)
class Spec:
    help: str = ""
    type: Optional[Callable[[str], Any]] = None
    unit: Optional[str] = None          # shown in --help; the public name ends with it
    name: Optional[str] = None          # public name when it differs from the attribute
    env: Optional[str] = None           # a variable named otherwise: upstream laya's, or another setting's
    env_parse: Optional[Callable[[str], Any]] = None   # upstream's parsing of that variable
    choices: Optional[tuple] = None
    metavar: Optional[str] = None
    repeatable: bool = False            # a list: the flag repeats, the variable is comma-separated
    nargs: Optional[str] = None
    const: Any = None
    deprecated: tuple = ()              # old flag spellings ("--x") and variable names ("LAYA_X")
    secret: bool = False                # `config` shows it as set, never its value
    required: bool = False


def setting(default: Any = None, help: str = "", **kw: Any) -> Any:
    """A settings field: its default, the help users read, and how flag and variable parse."""
    spec = Spec(help=help, **kw)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata={"laya": spec})
    return dataclasses.field(default=default, metadata={"laya": spec})


def public_name(f: dataclasses.Field) -> str:
    return f.metadata["laya"].name or f.name


def flag_name(f: dataclasses.Field) -> str:
    return "--" + public_name(f).replace("_", "-")


def env_name(f: dataclasses.Field) -> str:
    """LAYA_<SETTING>; a tool command's settings (ENV_PREFIX on their class) LAYA_<COMMAND>_<SETTING>."""
    return f.metadata["laya"].env or f.metadata["laya_prefix"] + public_name(f).upper()


def fields(cls) -> list:
    out = [f for f in dataclasses.fields(cls) if "laya" in f.metadata]
    prefix = getattr(cls, "ENV_PREFIX", "LAYA_")
    for f in out:
        if f.metadata.get("laya_prefix") != prefix:
            f.metadata = types.MappingProxyType(dict(f.metadata, laya_prefix=prefix))
    return out


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()   # type: ignore[misc]


def _is_switch(f: dataclasses.Field) -> bool:
    return isinstance(default_of(f), bool)


class _Deprecated(argparse.Action):
    """An old spelling of a flag: warns once, then acts as the new flag does."""

    def __init__(self, option_strings, dest, new: str = "", inner: type = argparse._StoreAction, **kw):
        self.new, self.inner = new, inner
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        log.warning("%s is deprecated; use %s", option_string, self.new)
        if self.inner is argparse._StoreTrueAction:
            setattr(namespace, self.dest, True)
        elif self.inner is argparse._AppendAction:
            setattr(namespace, self.dest, list(getattr(namespace, self.dest, None) or []) + [values])
        else:
            setattr(namespace, self.dest, values)


def _help(f: dataclasses.Field) -> str:
    spec: Spec = f.metadata["laya"]
    text = spec.help.replace("%", "%%")
    default = default_of(f)
    if spec.required:
        text += " (required)"
    elif default not in (None, [], {}, False, ""):
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        text += " (default: %s%s)" % (shown, " " + spec.unit if spec.unit else "")
    return text + " [env: %s]" % env_name(f)


def _section(cls, name: str) -> str:
    """The help section of a field: the SECTION of the class that declares it."""
    for klass in cls.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return getattr(klass, "SECTION", None) or "options"
    return "options"


def ordered_fields(cls) -> list:
    """Fields in help order: the most specific class's first."""
    order = [k for k in cls.__mro__ if "__annotations__" in vars(k)]
    rank = {}
    for f in fields(cls):
        for i, klass in enumerate(order):
            if f.name in vars(klass)["__annotations__"]:
                rank[f.name] = i
                break
    return sorted(fields(cls), key=lambda f: rank.get(f.name, 0))


def add_settings(parser: argparse.ArgumentParser, cls) -> None:
    """Add one flag per field of `cls`; `finish` resolves them after parsing."""
    groups: dict = {}
    for f in ordered_fields(cls):
        section = _section(cls, f.name)
        if section not in groups:
            groups[section] = parser.add_argument_group(section)
        group = groups[section]
        spec: Spec = f.metadata["laya"]
        if _is_switch(f):
            on = default_of(f)   # a switch that is on unless turned off gets --no-NAME too
            kw: dict = {"action": argparse.BooleanOptionalAction if on else "store_true"}
            inner = argparse._StoreTrueAction
        else:
            kw = {"type": spec.type, "choices": spec.choices,
                  "metavar": spec.metavar or (spec.unit.upper() if spec.unit else None)
                  or ("N" if spec.type in (int, positive_int, non_negative_int) else None)}
            if spec.repeatable:
                kw["action"], inner = "append", argparse._AppendAction
            else:
                inner = argparse._StoreAction
                if spec.nargs:
                    kw.update(nargs=spec.nargs, const=spec.const)
        if spec.required and env_name(f) not in os.environ:
            kw["required"] = True   # usage shows it without brackets; the variable satisfies it too
        group.add_argument(flag_name(f), dest=f.name, default=argparse.SUPPRESS, help=_help(f), **kw)
        old = [d for d in spec.deprecated if d.startswith("-")]
        if old:
            extra = {k: v for k, v in kw.items() if k not in ("action", "required")}
            if inner is argparse._StoreTrueAction:
                extra = {"nargs": 0}
            group.add_argument(*old, dest=f.name, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                               action=_Deprecated, new=flag_name(f), inner=inner, **extra)
    classes = getattr(parser, "_laya_settings", [])
    parser._laya_settings = classes + [cls]


@dataclasses.dataclass
class Resolved:
    """One resolved value and where it came from: 'flag', 'environment' or 'default'."""
    value: Any
    source: str
    via: str = ""     # the flag or variable that gave it


def _parse_env(f: dataclasses.Field, raw: str, name: str) -> Any:
    spec: Spec = f.metadata["laya"]
    if spec.env_parse is not None and name == env_name(f):
        return spec.env_parse(raw)
    if _is_switch(f):
        return parse_bool(raw)
    if spec.repeatable:
        items = raw.replace(",", " ").split()
        return [spec.type(v) if spec.type else v for v in items]
    value = spec.type(raw) if spec.type else raw
    if spec.choices and value not in spec.choices:
        raise argparse.ArgumentTypeError("invalid choice %r (choose from %s)"
                                         % (value, ", ".join(map(str, spec.choices))))
    return value


def resolve_fields(cls, given: Mapping[str, Any], env: Mapping[str, str],
                   error: Callable[[str], Any]) -> dict:
    """{attribute: Resolved} for every setting of `cls`: a flag given, else its variable (or an
    old variable name, with a warning), else the default."""
    out = {}
    for f in fields(cls):
        spec: Spec = f.metadata["laya"]
        if f.name in given:
            out[f.name] = Resolved(given[f.name], "flag", flag_name(f))
            continue
        names = [env_name(f)] + [d for d in spec.deprecated if not d.startswith("-")]
        for name in names:
            raw = env.get(name)
            if raw is None:
                continue
            if name != names[0]:
                log.warning("%s is deprecated; use %s", name, names[0])
            try:
                value = _parse_env(f, raw, name)
            except (ValueError, argparse.ArgumentTypeError) as e:
                error("environment variable %s=%r is invalid: %s" % (name, raw, e))
            if value is USE_DEFAULT:
                out[f.name] = Resolved(default_of(f), "default", "%s=%r ignored" % (name, raw))
            else:
                out[f.name] = Resolved(value, "environment", name)
            break
        else:
            out[f.name] = Resolved(default_of(f), "default")
        if spec.required and out[f.name].value in (None, [], ""):
            error("%s is required (or set %s)" % (flag_name(f), env_name(f)))
    return out


def finish(parser: argparse.ArgumentParser, args: argparse.Namespace,
           env: Optional[Mapping[str, str]] = None) -> argparse.Namespace:
    """Resolve every settings class added to `parser`: `args.<attribute>` holds each value,
    `args.settings` the typed settings object and `args.sources` where each value came from."""
    env = os.environ if env is None else env
    given = {k: v for k, v in vars(args).items()}
    sources: dict = {}
    settings = None
    for cls in getattr(parser, "_laya_settings", []):
        resolved = resolve_fields(cls, given, env, parser.error)
        sources.update(resolved)
        settings = cls(**{k: r.value for k, r in resolved.items()})
        complete = getattr(settings, "complete", None)
        if complete is not None:
            try:
                complete(sources)
            except ValueError as e:
                parser.error(str(e))
        for f in fields(cls):
            setattr(args, f.name, getattr(settings, f.name))
    args.settings, args.sources = settings, sources
    return args


def to_env(settings: Any, only: Optional[Iterable[str]] = None) -> dict:
    """The variables that give a child process these settings whole (new names; `only`: the
    attributes to pass). A setting left at its default is passed too, so the child's own
    environment cannot change it."""
    out = {}
    for f in fields(type(settings)):
        if only is not None and f.name not in only:
            continue
        value = getattr(settings, f.name)
        if value is None:
            continue
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, list):
            text = ",".join(map(str, value))
        elif isinstance(value, dict):
            import json
            text = json.dumps(value)
        else:
            text = str(value)
        out[env_name(f)] = text
    return out


def external(name: str, default: Optional[str] = None) -> Optional[str]:
    """A variable another library defines (HF_TOKEN, TOKENIZERS_PARALLELISM, ...). Our own
    settings are never read this way: they are fields of a settings class."""
    assert not name.startswith("LAYA_") or name in INTERNAL, name
    return os.environ.get(name, default)


def environment() -> MutableMapping[str, str]:
    """This process's environment, for code that must set another library's variables before that
    library loads (OpenMP's thread pool: core/runtime/cpu_quota.py)."""
    return os.environ


def external_default(name: str, value: str) -> None:
    """Set another library's variable for this process unless it is set (GRPC_VERBOSITY)."""
    os.environ.setdefault(name, value)


# Variables of the machinery rather than settings: the restart counts serve gives its children; the
# gRPC message limit and connection age core/wire/rpc.py reads at import (lowered by tests); the fault
# injection of inference/faults.py (tests only).
INTERNAL = ("LAYA_SUPERVISOR_RESTARTS", "LAYA_GRPC_MAX_MESSAGE_BYTES", "LAYA_GRPC_MAX_CONNECTION_AGE_S",
            "LAYA_TEST_FAULTS")


def child_environment(settings_env: Mapping[str, str], extra: Optional[Mapping[str, str]] = None) -> dict:
    """A child process's whole environment: this one's, less the LAYA_ variables it was given
    (the child gets `settings_env`, the settings already resolved, instead), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_") or k in INTERNAL}
    env.update(settings_env)
    env.update(extra or {})
    return env


class Parser(argparse.ArgumentParser):
    """argparse that answers an unknown flag with the nearest known ones, and takes no abbreviations
    (a flag added later would change what a prefix means)."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            hints = []
            known = [o for o in self._option_string_actions if o.startswith("--")]
            for word in message.split(":", 1)[1].split():
                if word.startswith("-"):
                    close = difflib.get_close_matches(word.split("=")[0], known, n=3, cutoff=0.6)
                    if close:
                        hints.append("%s: did you mean %s?" % (word, " or ".join(close)))
            if hints:
                message += "\n" + "\n".join(hints)
        self.print_usage(sys.stderr)
        self.exit(2, "%s: error: %s\n" % (self.prog, message))
