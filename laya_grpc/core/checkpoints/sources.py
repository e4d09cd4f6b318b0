"""Which checkpoints a deployment serves: `NAME=SOURCE` specs and upstream's defaults."""
from __future__ import annotations

from ..errors import Kind, LayaError
from ..decisions.routing import BUILTIN_SOURCES

def parse_checkpoint_specs(specs) -> dict:
    """['english=/ckpt/en', 'ml=org/repo/sub@rev'] -> {'english': '/ckpt/en', ...}; none -> hub defaults."""
    if not specs:
        return dict(BUILTIN_SOURCES)   # upstream's published checkpoints
    out = {}
    for spec in specs:
        name, sep, source = str(spec).partition("=")
        name, source = name.strip(), source.strip()
        if not sep or not name or not source:
            raise LayaError(Kind.INVALID, "--checkpoint expects NAME=SOURCE (e.g. english=/path/to/ckpt), got %r" % spec)
        if name in out:
            raise LayaError(Kind.INVALID, "checkpoint name %r given twice" % name)
        out[name] = source
    return out


def split_source(source: str) -> tuple:
    """'org/repo/sub@rev' -> ('org/repo', 'sub', 'rev'); an existing local path -> (path, None, None)."""
    import os
    if source.startswith("~"):
        source = os.path.expanduser(source)   # as routing.repo shows it
    if os.path.exists(source) or source.startswith(("/", ".")):
        return source, None, None
    base, _, revision = source.partition("@")
    parts = base.split("/")
    repo = "/".join(parts[:2])
    subfolder = "/".join(parts[2:]) or None
    return repo, subfolder, (revision or None)


def open_source(source: str):
    """A `--checkpoint` source (local dir or hub id with optional subfolder and @revision), validated."""
    from .checkpoint import open_checkpoint
    repo, subfolder, revision = split_source(source)
    return open_checkpoint(repo, revision=revision, subfolder=subfolder)
