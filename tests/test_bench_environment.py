"""The bench's environment record names the commit of the tree that ran, and none for a tree that is
not a checkout of its own (an archive unpacked inside another checkout, as the A/B trees are)."""
import subprocess

from laya_grpc.bench.suite import _checkout


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_the_commit_is_the_checkouts_own_and_an_unpacked_tree_inside_it_has_none(tmp_path):
    outer = tmp_path / "outer"
    (outer / "inner" / "laya_grpc").mkdir(parents=True)
    (outer / "inner" / "laya_grpc" / "__init__.py").write_text("")
    _git(outer, "init", "-q")
    _git(outer, "commit", "-q", "--allow-empty", "-m", "x")
    head = _git(outer, "rev-parse", "HEAD")
    assert _checkout(str(outer)) == (head, True)   # inner/ is untracked: the checkout is dirty
    assert _checkout(str(outer / "inner")) == ("unknown", False)
    assert _checkout(str(tmp_path)) == ("unknown", False)   # no git checkout at all
