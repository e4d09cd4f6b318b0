"""One configuration: each service's settings class generates its flags and variables (core/runtime/flags.py).
These check the naming scheme, precedence and sources, the deprecated spellings, upstream laya's
variables, 'did you mean', `laya-grpc config`, what `serve` hands its children, and that nothing
outside the settings modules reads the environment. Fast: no service is started."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from laya_grpc.cli import config as config_cmd
from laya_grpc.cli.serve import child_argvs, child_env
from laya_grpc.cli.settings import SERVE_ONLY, ServeSettings
from laya_grpc.core.runtime import flags
from laya_grpc.gateway.settings import GatewaySettings
from laya_grpc.inference.settings import InferenceSettings
from laya_grpc.tokenizer.settings import TokenizerSettings
from stack import ROOT

ENV = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
CLASSES = (ServeSettings, GatewaySettings, InferenceSettings, TokenizerSettings)
UPSTREAM = {"LAYA_API_KEY", "LAYA_MAX_CONCURRENT", "LAYA_BODY_READ_TIMEOUT", "LAYA_MAX_TOKEN_BUDGET",
            "LAYA_JEV_STRICT", "LAYA_DEFAULT_MODEL", "LAYA_AUTO_TASK", "LAYA_EXTRA_MODELS", "LAYA_MODELS",
            "LAYA_HOST", "LAYA_PORT", "LAYA_ROOT_PATH"}


def cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laya_grpc.cli", *argv], capture_output=True, text=True,
                          env=dict(ENV, **(env or {})), cwd=ROOT, timeout=60)


def resolve(cls, argv: list, env: dict):
    p = flags.Parser(prog="t")
    flags.add_settings(p, cls)
    return flags.finish(p, p.parse_args(argv), env=env)


def config(*argv: str, env: dict | None = None) -> dict:
    r = cli("config", *argv, "--json", env=env)
    assert r.returncode == 0, r.stderr
    return {row["flag"]: row for row in json.loads(r.stdout)["settings"]}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_one_naming_scheme_with_units_in_the_name(cls):
    for f in flags.fields(cls):
        spec = f.metadata["laya"]
        name = flags.public_name(f)
        assert flags.flag_name(f) == "--" + name.replace("_", "-")
        env = flags.env_name(f)
        assert env == "LAYA_" + name.upper() or env in UPSTREAM, (f.name, env)
        if spec.unit:
            assert name.endswith(spec.unit) or env in UPSTREAM, (name, spec.unit)
        if spec.type is float or spec.unit == "seconds":
            assert spec.unit, "%s: a time or amount needs its unit in the name" % name
        assert spec.help and "options.py" not in spec.help and ".py)" not in spec.help


def test_flag_wins_over_variable_wins_over_default():
    a = resolve(GatewaySettings, ["--request-timeout-seconds", "7"],
                {"LAYA_REQUEST_TIMEOUT_SECONDS": "9", "LAYA_HTTP_IDLE_TIMEOUT_SECONDS": "11"})
    assert a.request_timeout_s == 7.0 and a.sources["request_timeout_s"].source == "flag"
    assert a.http_idle_timeout == 11.0 and a.sources["http_idle_timeout"].source == "environment"
    assert a.http_header_timeout == 10.0 and a.sources["http_header_timeout"].source == "default"
    assert a.settings.request_timeout_s == 7.0


def test_old_spellings_still_work_and_warn(caplog):
    with caplog.at_level("WARNING", logger="laya_grpc.settings"):
        a = resolve(GatewaySettings, ["--drain-grace-s", "3", "--http-header-timeout", "4"],
                    {"LAYA_TOKENIZER_ADDRESSES": "a:1,b:2", "LAYA_INFERENCE_ADDRESS": "c:3",
                     "LAYA_GATEWAY_METRICS": "127.0.0.1:9", "LAYA_CHECKPOINTS": "english=/x"})
    assert a.drain_grace_s == 3.0 and a.http_header_timeout == 4.0
    assert a.tokenizer == ["a:1", "b:2"] and a.inference == "c:3" and a.metrics == "127.0.0.1:9"
    assert a.checkpoint == ["english=/x"]
    said = " ".join(r.getMessage() for r in caplog.records)
    for old, new in (("--drain-grace-s", "--drain-grace-seconds"), ("LAYA_TOKENIZER_ADDRESSES", "LAYA_TOKENIZER"),
                     ("LAYA_INFERENCE_ADDRESS", "LAYA_INFERENCE"), ("LAYA_GATEWAY_METRICS", "LAYA_METRICS"),
                     ("LAYA_CHECKPOINTS", "LAYA_CHECKPOINT"), ("--http-header-timeout", "--http-header-timeout-seconds")):
        assert "%s is deprecated; use %s" % (old, new) in said, said
    # the new name wins over the old one
    a = resolve(InferenceSettings, [], {"LAYA_INFERENCE_LISTEN": "old:1", "LAYA_LISTEN": "new:2"})
    assert a.listen == "new:2"


def test_upstream_variables_are_read_as_upstream_reads_them():
    a = resolve(GatewaySettings, [], {"LAYA_MAX_CONCURRENT": "abc", "LAYA_BODY_READ_TIMEOUT": "-1",
                                      "LAYA_MAX_TOKEN_BUDGET": "0", "LAYA_JEV_STRICT": "maybe",
                                      "LAYA_AUTO_TASK": "on", "LAYA_API_KEY": "", "LAYA_DEFAULT_MODEL": " english "})
    s = a.settings
    assert (s.max_concurrent, s.body_read_timeout, s.max_token_budget) == (512, 10.0, 8192)   # a bad value falls back to the default
    assert s.jev_strict is False and s.auto_task is True and s.api_key is None and s.default_model == "english"
    assert "ignored" in a.sources["max_concurrent"].via
    assert resolve(GatewaySettings, [], {"LAYA_API_KEY": " k "}).api_key == " k "   # upstream takes it as is
    # while the flag is strict: a bad value is a usage error
    r = cli("config", "gateway", "--max-concurrent-requests", "abc")
    assert r.returncode == 2 and "--max-concurrent-requests" in r.stderr
    i = resolve(InferenceSettings, [], {"LAYA_MODELS": " english, multilingual ", "LAYA_MAX_LOADED": "x"})
    assert i.preload == ["english", "multilingual"] and i.max_loaded == 2


def test_extra_models_add_checkpoints_as_upstream_documents():
    a = resolve(TokenizerSettings, ["--checkpoint", "english=/ckpt/en"],
                {"LAYA_EXTRA_MODELS": '{"Support": "/ckpt/support", "english": ["org/repo", "sub"]}'})
    assert a.settings.checkpoint_sources() == {"english": "org/repo/sub", "support": "/ckpt/support"}
    r = cli("config", "gateway", env={"LAYA_EXTRA_MODELS": "[1]"})
    assert r.returncode != 0 and "invalid LAYA_EXTRA_MODELS" in r.stderr


def test_host_port_and_grpc_port_replace_parts_of_the_addresses():
    rows = config("serve", "--port", "8001", "--host", "0.0.0.0", "--grpc-port", "50061")
    assert rows["--http"]["value"] == "0.0.0.0:8001" and rows["--http"]["source"] == "flag"
    assert rows["--grpc"]["value"] == "0.0.0.0:50061"
    rows = config("gateway", env={"LAYA_PORT": "9000"})   # upstream's variable
    assert rows["--http"]["value"] == "127.0.0.1:9000" and rows["--http"]["via"] == "LAYA_PORT"


def test_config_names_the_source_of_every_value_and_hides_the_key():
    rows = config("gateway", "--json-output", env={"LAYA_MAX_CONCURRENT": "64", "LAYA_API_KEY": "sekrit",
                                                   "LAYA_DRAIN_GRACE_S": "5"})
    assert rows["--max-concurrent-requests"]["value"] == 64
    assert rows["--max-concurrent-requests"]["source"] == "environment"
    assert rows["--drain-grace-seconds"]["via"] == "LAYA_DRAIN_GRACE_S"
    assert rows["--json-output"]["source"] == "flag" and rows["--log-format"]["value"] == "json"
    assert rows["--api-key"]["value"] == "(set)"
    assert rows["--http-max-connections"]["source"] == "default"
    text = cli("config", "inference", "--max-wait-ms", "2").stdout
    assert re.search(r"--max-wait-ms\s+2.0\s+flag", text), text


def test_an_unknown_flag_gets_a_did_you_mean_and_serve_takes_port():
    r = cli("serve", "--prot", "8001")
    assert r.returncode == 2 and "did you mean --port" in r.stderr, r.stderr
    r = cli("serve", "--max-concurrent", "5")   # no abbreviations: a prefix is not silently taken
    assert r.returncode == 2 and "did you mean --max-concurrent-requests" in r.stderr, r.stderr
    assert config("serve", "--port", "8001")["--port"]["value"] == 8001


def test_make_checkpoint_shows_preset_as_required():
    usage = cli("make-checkpoint", "--help").stdout.split("\n\n")[0]
    assert "--preset" in usage and "[--preset" not in usage
    r = cli("make-checkpoint", "/tmp/never-written")
    assert r.returncode == 2 and "--preset" in r.stderr


def test_help_speaks_to_users():
    for command in ("serve", "gateway", "inference", "tokenizer"):
        out = cli(command, "--help").stdout
        assert "options.py" not in out and "[env: LAYA_" in out, command
    out = cli("serve", "--help").stdout
    for wanted in ("--host", "--port", "--grpc-port", "--api-key", "--max-concurrent-requests", "--json-output",
                   "--otlp-endpoint", "--http-header-timeout-seconds", "--request-timeout-seconds"):
        assert wanted in out, wanted


def test_serve_hands_its_children_their_settings_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYA_TOURNAMENT_GROUP", "0")            # a variable serve was given...
    a = resolve(ServeSettings, ["--request-timeout-seconds", "7", "--max-batch-rows", "32", "--gateway-workers",
                                "2", "--tokenizer-workers", "1", "--checkpoint", "english=/x"],
                {"LAYA_MAX_CONCURRENT": "99", "LAYA_HTTP_IDLE_TIMEOUT": "12"})
    env = child_env(a.settings)
    assert "LAYA_TOURNAMENT_GROUP" not in env                     # ...the children get only the resolved ones
    assert not any(k in env for k in ("LAYA_HTTP_IDLE_TIMEOUT", "LAYA_GATEWAY_WORKERS", "LAYA_METRICS"))
    children = child_argvs(a, str(tmp_path), env)
    for child in children:
        command = child.argv[child.argv.index(next(c for c in child.argv if c in config_cmd.SERVICES)):]
        cls = config_cmd.settings_class(command[0])
        got = resolve(cls, command[1:], child.env).settings
        for f in flags.fields(cls):
            if f.name in ServeSettings.__dataclass_fields__ and f.name not in SERVE_ONLY + ("device",):
                assert getattr(got, f.name) == getattr(a.settings, f.name), (child.name, f.name)
    gateway = [c for c in children if c.name.startswith("gateway")][0]
    got = resolve(GatewaySettings, gateway.argv[gateway.argv.index("gateway") + 1:], gateway.env).settings
    assert (got.request_timeout_s, got.max_concurrent, got.http_idle_timeout) == (7.0, 99, 12.0)


# Where the environment may be read: the settings modules. core/runtime/flags.py holds every read (and the
# copies of the environment for child processes); gateway/settings.py reads one upstream variable
# that only refuses to start.
ENV_READERS = {"laya_grpc/core/runtime/flags.py", "laya_grpc/gateway/settings.py"}


def test_nothing_outside_the_settings_modules_reads_the_environment():
    found = []
    for path in sorted(Path(ROOT, "laya_grpc").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bos\.(environ|getenv|putenv|unsetenv)\b|\benviron\[|from os import", line) \
                    and rel not in ENV_READERS:
                found.append("%s:%d: %s" % (rel, n, line.strip()))
    assert not found, "\n".join(found)


def test_the_docs_list_every_setting():
    doc = Path(ROOT, "docs", "configuration.md").read_text()
    begin, end = "<!-- settings:begin (laya-grpc config --markdown) -->\n", "<!-- settings:end -->"
    table = doc.split(begin, 1)[1].split(end, 1)[0]
    assert table.strip() == config_cmd.markdown().strip(), "regenerate with: laya-grpc config --markdown"


def test_serve_starts_the_inference_replicas_first(tmp_path):
    # the supervisor spawns the children in this order, one after another; the inference replicas'
    # start (torch, the device, the checkpoint, the warm-up) is the one serve's ready waits for
    a = resolve(ServeSettings, ["--tokenizer-workers", "3", "--gateway-workers", "2", "--inference-replicas", "2",
                                "--checkpoint", "english=/x"], {})
    names = [c.name for c in child_argvs(a, str(tmp_path))]
    assert names == ["inference-0", "inference-1", "tokenizer-0", "tokenizer-1", "tokenizer-2",
                     "gateway-0", "gateway-1"]
