"""`laya-grpc config [serve|gateway|inference|tokenizer] [FLAGS...]`: the settings that command would
run with, resolved from the same flags and environment, and where each value came from (a flag,
an environment variable or the default). --json prints them as one JSON object; --markdown prints
the reference table of every setting of every service instead (docs/configuration.md holds it)."""
from __future__ import annotations

import importlib
import json
import sys

from laya_grpc.core.runtime import flags

SERVICES = {
    "serve": ("laya_grpc.cli.settings", "ServeSettings"),
    "gateway": ("laya_grpc.gateway.settings", "GatewaySettings"),
    "inference": ("laya_grpc.inference.settings", "InferenceSettings"),
    "tokenizer": ("laya_grpc.tokenizer.settings", "TokenizerSettings"),
}
SECRET_SHOWN = "(set)"


def settings_class(service: str):
    module, name = SERVICES[service]
    return getattr(importlib.import_module(module), name)


def main(argv: list) -> int:
    """The whole command; it parses its own arguments, since its flags are the chosen service's."""
    service = argv[0] if argv and argv[0] in SERVICES else "serve"
    rest = list(argv[1:] if argv and argv[0] in SERVICES else argv)
    fmt = "text"
    for option in ("--json", "--markdown"):
        if option in rest:
            rest.remove(option)
            fmt = option[2:]
    if fmt == "markdown":
        sys.stdout.write(markdown())
        return 0
    cls = settings_class(service)
    parser = flags.Parser(prog="laya-grpc config %s" % service, description=__doc__,
                          usage="laya-grpc config [serve|gateway|inference|tokenizer] [FLAGS...] [--json|--markdown]")
    flags.add_settings(parser, cls)
    args = flags.finish(parser, parser.parse_args(rest))
    rows = []
    for f in flags.ordered_fields(cls):
        spec = f.metadata["laya"]
        r = args.sources[f.name]
        value = getattr(args.settings, f.name)
        if spec.secret and value:
            value = SECRET_SHOWN
        rows.append({"setting": flags.public_name(f), "flag": flags.flag_name(f), "env": flags.env_name(f),
                     "value": value, "source": r.source, "via": r.via})
    if fmt == "json":
        print(json.dumps({"command": service, "settings": rows}, default=str))
        return 0
    width = max(len(r["flag"]) for r in rows)
    for r in rows:
        where = r["source"] + (" (%s)" % r["via"] if r["via"] else "")
        print("%-*s  %-24s  %s" % (width, r["flag"], _text(r["value"]), where))
    return 0


def _text(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, (list, dict)):
        return json.dumps(value) if value else "-"
    return str(value)


def markdown() -> str:
    """One table per section: every setting of every service, with the commands that take it."""
    rows: dict = {}
    for service in SERVICES:
        cls = settings_class(service)
        for f in flags.fields(cls):
            key = flags.flag_name(f)
            row = rows.setdefault(key, {"section": flags._section(cls, f.name), "field": f, "commands": [],
                                        "defaults": {}})
            row["commands"].append(service)
            row["defaults"][service] = flags.default_of(f)
    sections: dict = {}
    for key, row in rows.items():
        sections.setdefault(row["section"], []).append((key, row))
    out = []
    for section in sorted(sections, key=lambda s: (s == "this process", s)):
        title = "each process of `gateway`, `inference` and `tokenizer` run alone" if section == "this process" \
            else section
        out += ["### %s" % title[0].upper() + title[1:], "",
                "| flag | variable | default | commands | what it does |", "|---|---|---|---|---|"]
        for key, row in sorted(sections[section], key=lambda kr: kr[0]):
            f = row["field"]
            spec = f.metadata["laya"]
            defaults = row["defaults"]
            if len({json.dumps(v, default=str) for v in defaults.values()}) == 1:
                default = _cell(next(iter(defaults.values())), spec)
            else:
                default = "; ".join("%s: %s" % (c, _cell(v, spec)) for c, v in defaults.items())
            old = ", ".join("`%s`" % d for d in spec.deprecated)
            text = spec.help.replace("|", "\\|") + (". Old names (deprecated): %s." % old if old else "")
            variable = "`%s`" % flags.env_name(f) + (" (upstream laya's)" if spec.env_parse else "")
            out.append("| `%s` | %s | %s | %s | %s |" % (key, variable, default, ", ".join(row["commands"]), text))
        out.append("")
    return "\n".join(out)


def _cell(value, spec) -> str:
    if spec.required:
        return "required"
    if value in (None, [], {}, ""):
        return "-"
    if isinstance(value, list):
        value = ",".join(map(str, value))
    return "`%s`%s" % (value, " " + spec.unit if spec.unit else "")
