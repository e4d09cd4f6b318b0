"""`laya-grpc` entry point.

Only the module of the chosen command is imported, so `laya-grpc gateway` and
`laya-grpc tokenizer` never pull in torch or mlx, and `--help` stays instant.
Each command module exposes `add_arguments(parser)` and `run(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from laya_grpc import __version__
from laya_grpc.core.runtime import flags, logs

# name -> (module, one-line summary)
COMMANDS = {
    "serve": ("laya_grpc.cli.serve", "run tokenizer, inference and gateway on this machine (unix sockets), supervised"),
    "tokenizer": ("laya_grpc.tokenizer.server", "run the tokenizer service alone (TCP, for multi-host setups)"),
    "inference": ("laya_grpc.inference.server", "run the inference service alone (TCP, for multi-host setups)"),
    "gateway": ("laya_grpc.gateway.server", "run the HTTP + gRPC gateway alone, pointed at tokenizer/inference services"),
    "predict": ("laya_grpc.cli.predict", "offline: answer /v1/systemone-shaped JSONL requests in one process"),
    "make-checkpoint": ("laya_grpc.cli.make_checkpoint", "write a random-weight checkpoint in upstream's exact layout"),
    "warm-kernels": ("laya_grpc.cli.warm_kernels", "compile the GPU kernels the inference service runs into "
                                                   "--kernel-cache-dir ahead of time (image build, Job)"),
    "decide": ("laya_grpc.cli.client_commands", "ask a running gateway one decision over gRPC"),
    "watch": ("laya_grpc.cli.client_commands", "subscribe to a running gateway's status stream"),
    "bench": ("laya_grpc.bench.suite", "benchmark upstream laya and our engine, gRPC and HTTP side by side"),
    "doctor": ("laya_grpc.cli.doctor", "print the machine, versions and devices, and time a short request per backend"),
    "config": ("laya_grpc.cli.config", "print the settings serve, gateway, inference or tokenizer would run with, "
                                       "and where each came from"),
}


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="laya-grpc",
        description="Local serving of Laya System-1 decision models over gRPC and HTTP.",
        epilog="Run 'laya-grpc COMMAND --help' for a command's flags. Every flag is also an environment variable "
               "(LAYA_<FLAG>, shown in --help); 'laya-grpc config' prints the resolved settings.")
    p.add_argument("--version", action="version", version="laya-grpc %s" % __version__)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logs.quiet_grpc_core()   # before any command imports grpc
    if not argv or argv[0] not in COMMANDS:
        top = _top_parser()
        if not argv:
            top.print_help()
            return 2
        top.parse_args(argv)  # handles --help/--version, errors on unknown commands
        return 2
    name = argv[0]
    module_name, summary = COMMANDS[name]
    module = importlib.import_module(module_name)
    if not hasattr(module, "add_arguments"):   # a command that parses its own arguments (config)
        return int(module.main(argv[1:]) or 0)
    parser = flags.Parser(prog="laya-grpc %s" % name, description=module.__doc__ or summary,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    if _takes_name(module.add_arguments):
        module.add_arguments(parser, name)
    else:
        module.add_arguments(parser)
    args = flags.finish(parser, parser.parse_args(argv[1:]))
    args.command = name
    missing = missing_backend(getattr(args, "backend", None)) if name in NEEDS_BACKEND else None
    if missing:
        print("laya-grpc %s: %s" % (name, missing), file=sys.stderr)
        return 2
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130


# Commands that run the network in this process: they need the chosen backend's extra.
NEEDS_BACKEND = ("inference", "predict", "warm-kernels")


def missing_backend(backend) -> str | None:
    """One clear line when the `--backend` package is not installed (the base install has neither
    torch nor mlx), checked before anything loads; None when it is importable."""
    if backend not in ("torch", "mlx"):
        return None
    try:
        found = importlib.util.find_spec(backend) is not None
    except ImportError:
        found = False
    if found:
        return None
    return ("the %s backend is not installed; install the '%s' extra: pip install 'laya-grpc[%s]'"
            % (backend, backend, backend))


def _takes_name(fn) -> bool:
    import inspect
    return len(inspect.signature(fn).parameters) >= 2


if __name__ == "__main__":
    sys.exit(main())
