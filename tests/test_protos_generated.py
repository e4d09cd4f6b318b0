"""The committed generated code (and the copy of the .proto sources shipped beside it) is exactly
what scripts/gen_protos.sh makes from protos/laya_proto/v1 and protos/laya_proto/internal/v1."""
import filecmp
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_generated_code_is_current(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "gen_protos.sh"), str(tmp_path)], check=True, env=env, cwd=ROOT)
    for package in (("v1",), ("internal", "v1")):
        committed = os.path.join(ROOT, "protos", "gen", "laya_proto", *package)
        fresh = os.path.join(tmp_path, "laya_proto", *package)
        names = sorted(n for n in os.listdir(fresh) if n.endswith((".py", ".pyi", ".proto")))
        assert names == sorted(n for n in os.listdir(committed) if n.endswith((".py", ".pyi", ".proto")))
        _, mismatch, errors = filecmp.cmpfiles(committed, fresh, names, shallow=False)
        assert not mismatch and not errors, "regenerate with scripts/gen_protos.sh: %s differ" % (mismatch + errors)
