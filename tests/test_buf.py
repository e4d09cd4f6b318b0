"""The contract in protos/ passes `buf lint` (buf.yaml) and has no breaking change against the last
released contract: the commit named in protos/release, read with `git archive`.

buf is the pinned @bufbuild/buf of tests/node (`npm ci` there; scripts/setup.sh --dev runs it).
Without it the tests skip on a developer machine and fail in CI (CI=true). The breaking check
skips only when the checkout has no git history to read the release from (a source tarball, a
shallow clone).
"""
from __future__ import annotations

import os
import subprocess
import tarfile
import io

import pytest

from stack import ROOT

BUF = os.path.join(ROOT, "tests", "node", "node_modules", ".bin", "buf")
RELEASE_FILE = os.path.join(ROOT, "protos", "release")
# Internal calls that released contracts still held in laya_proto/v1; they live in
# laya_proto/internal/v1 now, which the gate ignores (buf.yaml), so they leave the released tree too.
INTERNAL_BEFORE = ("laya_proto/v1/tokenizer.proto", "laya_proto/v1/inference.proto")


def _buf() -> str:
    if not os.access(BUF, os.X_OK):
        missing = "buf is missing: run `npm ci` in tests/node (scripts/setup.sh --dev does)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(missing)
        pytest.skip(missing)
    return BUF


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True)


def release_commit() -> str:
    """The commit of the last released contract: the first word of protos/release."""
    with open(RELEASE_FILE) as f:
        return f.read().split()[0]


def test_buf_lint():
    p = subprocess.run([_buf(), "lint"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, "buf lint:\n" + p.stdout + p.stderr


def test_no_breaking_change_against_the_release(tmp_path):
    buf = _buf()
    commit = release_commit()
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("no git history in this checkout: cannot read the released contract %s" % commit)
    if _git("cat-file", "-e", commit + "^{commit}").returncode != 0:
        if _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true":
            pytest.skip("shallow clone: the released contract %s is not in this checkout" % commit)
        pytest.fail("protos/release names %s, which this repository does not have; it must name the "
                    "commit that landed the last released contract (docs/protocol.md, 'Versioning')" % commit)
    archive = _git("archive", "--format=tar", commit, "buf.yaml", "protos/laya_proto")
    assert archive.returncode == 0, archive.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    for path in INTERNAL_BEFORE:
        old = tmp_path / "protos" / path
        if old.exists():
            old.unlink()
    p = subprocess.run([buf, "breaking", "--against", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, "buf breaking against %s:\n%s%s" % (commit, p.stdout, p.stderr)
