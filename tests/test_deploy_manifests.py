"""The Kubernetes manifests and the Dockerfile under deploy/ are checked here, since no cluster
or docker daemon runs in CI.

- Every resource validates against the Kubernetes API schema (kubernetes-validate, strict mode:
  unknown fields are errors) of KUBERNETES_VERSION; deliberately broken copies prove that the
  check rejects what it should.
- The manifests hang together: Services select the Deployments' pods, probes and Services name
  container ports that exist, each listen address matches its containerPort, the scrape
  annotations point at the metrics port, grace periods outlast the drain.
- Every LAYA_* variable the manifests set is a current setting name, and the values parse
  (`laya-grpc config COMMAND` under the manifest's environment exits 0).
- The image tags the manifests use are targets of deploy/Dockerfile at the package's version.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kv   # the dev extra


ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# The Kubernetes release whose schema the manifests must satisfy (the newest kubernetes-validate
# ships); raise it with the dev extra's kubernetes-validate pin.
KUBERNETES_VERSION = "1.37.0"

def validate(resource: dict) -> None:
    """Raise unless `resource` validates strictly. A kind/apiVersion without a schema is an error
    too (the kubernetes-validate command only warns about it)."""
    kv.validate(resource, KUBERNETES_VERSION, strict=True)


def load_resources() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


RESOURCES = load_resources()


def by_kind(kind: str) -> dict[str, dict]:
    return {r["metadata"]["name"]: r for _, r in RESOURCES if r["kind"] == kind}


def deployments() -> dict[str, dict]:
    return by_kind("Deployment")


def the_container(dep: dict) -> dict:
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, dep["metadata"]["name"]
    return containers[0]


def component_deployment(component: str) -> dict:
    found = [d for d in deployments().values()
             if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, "expected one %s Deployment, found %d" % (component, len(found))
    return found[0]


def config_data() -> dict[str, str]:
    data = {}
    for cm in by_kind("ConfigMap").values():
        data.update(cm.get("data", {}))
    return data


def container_env(dep: dict) -> dict[str, str]:
    """The environment a container starts with: its ConfigMaps (envFrom), then its own env."""
    c = the_container(dep)
    cms = by_kind("ConfigMap")
    env = {}
    for src in c.get("envFrom", []):
        env.update(cms[src["configMapRef"]["name"]]["data"])
    for e in c.get("env", []):
        env[e["name"]] = e["value"]
    return env


# --- schema ---------------------------------------------------------------------------------

def test_manifests_found():
    kinds = sorted({r["kind"] for _, r in RESOURCES})
    assert {"Deployment", "Service", "ConfigMap"} <= set(kinds), kinds


@pytest.mark.parametrize("resource", [r for _, r in RESOURCES],
                         ids=["%s:%s/%s" % (f, r["kind"], r["metadata"]["name"]) for f, r in RESOURCES])
def test_manifest_validates_strictly(resource):
    validate(resource)


def _broken_copies():
    dep = copy.deepcopy(component_deployment("inference"))
    unknown_field = copy.deepcopy(dep)
    the_container(unknown_field)["imagePulPolicy"] = "Always"           # misspelt field
    wrong_type = copy.deepcopy(dep)
    wrong_type["spec"]["replicas"] = "two"                               # not an integer
    missing_required = copy.deepcopy(dep)
    del the_container(missing_required)["name"]                          # containers need a name
    bad_probe = copy.deepcopy(dep)
    the_container(bad_probe)["readinessProbe"]["grpc"] = {"service": "x"}  # grpc probe without port
    unknown_kind = copy.deepcopy(dep)
    unknown_kind["kind"] = "Deploymnet"                                  # no schema at all
    return {"unknown_field": unknown_field, "wrong_type": wrong_type, "missing_required": missing_required,
            "bad_probe": bad_probe, "unknown_kind": unknown_kind}


@pytest.mark.parametrize("case", sorted(_broken_copies()))
def test_broken_copy_is_rejected(case):
    """The schema check has teeth: each broken copy of the inference Deployment fails it."""
    with pytest.raises((kv.ValidationError, kv.SchemaNotFoundError)):
        validate(_broken_copies()[case])


def test_broken_file_fails_the_command(tmp_path):
    """The same through the `kubernetes-validate` command a person runs by hand."""
    bad = tmp_path / "broken.yaml"
    bad.write_text(yaml.safe_dump(_broken_copies()["unknown_field"]))
    cmd = [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", KUBERNETES_VERSION]
    ok = subprocess.run(cmd + [str(MANIFESTS / "inference.yaml")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = subprocess.run(cmd + [str(bad)], capture_output=True, text=True)
    assert broken.returncode != 0 and "imagePulPolicy" in broken.stdout, broken.stdout + broken.stderr


# --- what the deployment needs --------------------------------------------------------------

def test_three_services_with_grpc_readiness():
    for component, port in (("tokenizer", 50053), ("inference", 50052)):
        c = the_container(component_deployment(component))
        assert c["args"] == [component]
        assert c["readinessProbe"]["grpc"]["port"] == port
        assert c["startupProbe"]["grpc"]["port"] == port
    gw = the_container(component_deployment("gateway"))
    assert gw["args"] == ["gateway"]
    assert gw["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gw["livenessProbe"]["httpGet"]["path"] == "/live"


def test_services_headless_for_backends_and_select_pods():
    services = by_kind("Service")
    for name in ("laya-tokenizer", "laya-inference"):
        assert services[name]["spec"].get("clusterIP") == "None", "%s must be headless" % name
    assert services["laya-gateway"]["spec"].get("clusterIP") != "None"
    for name, svc in services.items():
        selected = [d for d in deployments().values()
                    if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, "Service %s selects %d Deployments" % (name, len(selected))
        port_names = {p["name"] for p in the_container(selected[0])["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in port_names, (name, p)


def test_gateway_targets_are_the_headless_services():
    env = container_env(component_deployment("gateway"))
    services = by_kind("Service")
    for var, svc in (("LAYA_TOKENIZER", "laya-tokenizer"), ("LAYA_INFERENCE", "laya-inference")):
        m = re.fullmatch(r"dns:///([a-z0-9-]+):(\d+)", env[var])
        assert m, "%s=%r is not a dns:/// target" % (var, env[var])
        assert m.group(1) == svc
        assert int(m.group(2)) in {p["port"] for p in services[svc]["spec"]["ports"]}


def test_listen_addresses_probes_and_scrape_port_match_container_ports():
    for name, dep in deployments().items():
        c = the_container(dep)
        ports = {p["containerPort"] for p in c["ports"]}
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        for var, value in container_env(dep).items():
            m = re.fullmatch(r"0\.0\.0\.0:(\d+)", value)
            if m:
                assert int(m.group(1)) in ports, "%s %s=%s has no containerPort" % (name, var, value)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            for handler in c.get(probe, {}).values():
                if isinstance(handler, dict) and "port" in handler:
                    port = handler["port"]
                    assert (port in named) if isinstance(port, str) else (port in ports), (name, probe)
        ann = dep["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true"
        assert int(ann["prometheus.io/port"]) == named["metrics"], name


def test_resources_gpu_only_for_inference():
    for name, dep in deployments().items():
        res = the_container(dep)["resources"]
        assert "cpu" in res["requests"] and "memory" in res["requests"], name
        wants_gpu = "nvidia.com/gpu" in res["requests"]
        assert wants_gpu == (name == "laya-inference"), name
    res = the_container(deployments()["laya-inference"])["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "1"


def test_grace_period_outlasts_the_drain():
    for name, dep in deployments().items():
        env = container_env(dep)
        drain = float(env["LAYA_DRAIN_GRACE_SECONDS"])
        pre_stop = the_container(dep).get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain + pre_stop, name


def test_runs_as_non_root_with_writable_scratch():
    for name, dep in deployments().items():
        pod = dep["spec"]["template"]["spec"]
        c = the_container(dep)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, name


def test_every_backend_of_a_set_reads_the_same_checkpoints():
    """One ConfigMap gives all three services the checkpoint set, so a gateway never routes a
    checkpoint to a tokenizer or inference replica that lacks it."""
    from laya_grpc.core.sources import parse_checkpoint_specs
    sets = {name: container_env(dep).get("LAYA_CHECKPOINT") for name, dep in deployments().items()}
    assert len(set(sets.values())) == 1 and None not in sets.values(), sets
    value = next(iter(sets.values()))
    specs = parse_checkpoint_specs(value.replace(",", " ").split())   # as core.flags splits a list variable
    # every checkpoint of the set stays resident: no request waits for a reload after an eviction
    assert int(container_env(deployments()["laya-inference"])["LAYA_MAX_LOADED"]) >= len(specs), specs


def test_volumes_and_config_refer_to_objects_that_exist():
    claims, maps = set(by_kind("PersistentVolumeClaim")), set(by_kind("ConfigMap"))
    for name, dep in deployments().items():
        pod = dep["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, (name, v)
        for m in the_container(dep).get("volumeMounts", []):
            assert m["name"] in volumes, (name, m)
        for src in the_container(dep).get("envFrom", []):
            assert src["configMapRef"]["name"] in maps, (name, src)


# --- the code reads what the manifests set ---------------------------------------------------

def _env_names_read_by_code() -> set[str]:
    """The current names of every service's settings (deprecated names do not count)."""
    from laya_grpc.cli.config import SERVICES, settings_class
    from laya_grpc.core import flags
    return {flags.env_name(f) for s in SERVICES for f in flags.fields(settings_class(s))}


def test_every_laya_variable_is_read_by_the_code():
    read = _env_names_read_by_code()
    assert "LAYA_CHECKPOINT" in read and "LAYA_CHECKPOINTS" not in read   # the scan itself works
    used = set(config_data())
    for dep in deployments().values():
        used.update(container_env(dep))
    unknown = sorted(n for n in used if n.startswith("LAYA_") and n not in read)
    assert not unknown, "the manifests set variables no code reads: %s" % unknown


@pytest.mark.parametrize("component", ["tokenizer", "inference", "gateway"])
def test_manifest_environment_parses(component):
    """`laya-grpc config COMMAND` with exactly the manifest's variables: an invalid value (a
    non-number where a count goes) makes it exit 2, as the command itself would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    env.update(container_env(component_deployment(component)))
    args = the_container(component_deployment(component))["args"]
    r = subprocess.run([sys.executable, "-m", "laya_grpc.cli", "config", *args], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# --- the image ------------------------------------------------------------------------------

def test_images_are_dockerfile_targets_at_the_package_version():
    text = DOCKERFILE.read_text()
    targets = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, flags=re.M | re.I))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    for spec in re.findall(r"/src\[([a-z,]+)\]", text):
        assert set(spec.split(",")) <= extras, spec
    for name, dep in deployments().items():
        image = the_container(dep)["image"]
        repo, _, tag = image.rpartition(":")
        version, _, target = tag.rpartition("-")
        assert repo.endswith("laya-grpc") and version == project["version"], image
        assert target in targets, "%s: no Dockerfile target %r" % (name, target)
    assert the_container(deployments()["laya-inference"])["image"].endswith("-cuda")


def test_dockerignore_keeps_what_the_dockerfile_copies():
    kept = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
            if line.startswith("!")]
    for src in re.findall(r"^COPY\s+(.+)\s+\S+$", DOCKERFILE.read_text(), flags=re.M):
        for path in src.split():
            assert any(path == k or path.startswith(k + "/") for k in kept), path
            assert (ROOT / path).exists(), path
