"""The Kubernetes manifests and the Dockerfile under deploy/ are checked here, since no cluster
or docker daemon runs in CI.

- Every core resource validates against the Kubernetes API schema (kubernetes-validate, strict
  mode: unknown fields are errors) of each release in KUBERNETES_VERSIONS; the Prometheus
  Operator's PodMonitor (a CRD, which kubernetes-validate has no schema for) against POD_MONITOR,
  written from the CRD's fields. Deliberately broken copies prove that the checks reject what
  they should.
- The manifests hang together: Services select the Deployments' pods, probes and Services name
  container ports that exist, each listen address matches its containerPort, the scrape
  annotations and the PodMonitor point at the metrics port, grace periods outlast the drain,
  HPAs scale Deployments that leave the count to them.
- What a GPU cluster needs: GPU Deployments roll out without a surge pod, a NetworkPolicy admits
  only the gateway to the internal ports, serving pods read a pinned, locally fetched checkpoint
  revision with hub access off, Triton's kernel cache is on a persistent volume.
- Every LAYA_* variable the manifests set is a current setting name, and the values parse
  (`laya-grpc config COMMAND` under the manifest's environment exits 0).
- The images the manifests use are targets of deploy/Dockerfile at the package's version, the
  kustomization lists every manifest and replaces the image names, and the Dockerfile builds one
  Python and one CUDA from the lock files with OCI labels.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv   # the dev extra


ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
KUSTOMIZATION = MANIFESTS / "kustomization.yaml"
# The Kubernetes releases whose schemas the manifests must satisfy: from 1.29, the first whose
# schema has every field used (docs/deploy.md asks for 1.30, where the gateway's `preStop: sleep`
# is on by default), to the newest kubernetes-validate ships; raise the top with the dev extra's
# kubernetes-validate pin.
KUBERNETES_VERSIONS = ["1.%d.0" % minor for minor in range(29, 38)]
KUBERNETES_VERSION = KUBERNETES_VERSIONS[-1]

# monitoring.coreos.com/v1 PodMonitor, from the Prometheus Operator's CRD
# (monitoring.coreos.com_podmonitors.yaml): `spec` and `spec.selector` are required, and the field
# names are the CRD's. Strict like the core kinds: a field the CRD does not define is an error. The
# endpoint fields this project uses are typed; the CRD's others are allowed by name.
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"], "additionalProperties": False,
        "properties": {"key": {"type": "string"}, "operator": {"type": "string"},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
_ENDPOINT_FIELDS = ("authorization basicAuth bearerTokenSecret enableHttp2 filterRunning followRedirects "
                    "honorLabels honorTimestamps metricRelabelings noProxy oauth2 params portNumber "
                    "proxyConnectHeader proxyFromEnvironment proxyUrl relabelings targetPort tlsConfig "
                    "trackTimestampsStaleness").split()
_SPEC_FIELDS = ("attachMetadata bodySizeLimit convertClassicHistogramsToNHCB fallbackScrapeProtocol jobLabel "
                "keepDroppedTargets labelLimit labelNameLengthLimit labelValueLengthLimit namespaceSelector "
                "nativeHistogramBucketLimit nativeHistogramMinBucketFactor podTargetLabels sampleLimit scrapeClass "
                "scrapeClassicHistograms scrapeNativeHistograms scrapeProtocols selectorMechanism targetLimit").split()
POD_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
        "spec": {"type": "object", "required": ["selector"], "additionalProperties": False, "properties": {
            "selector": _SELECTOR,
            "podMetricsEndpoints": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "properties": {
                    "port": {"type": "string", "minLength": 1},
                    "path": {"type": "string", "pattern": "^/"},
                    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                    "interval": {"type": "string", "pattern": _DURATION},
                    "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                    **{f: {} for f in _ENDPOINT_FIELDS}}}},
            **{f: {} for f in _SPEC_FIELDS}}},
    },
}
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR}


def validate(resource: dict, version: str = KUBERNETES_VERSION) -> None:
    """Raise unless `resource` validates strictly. A kind/apiVersion without a schema is an error
    too (the kubernetes-validate command only warns about it)."""
    crd = CRD_SCHEMAS.get((resource.get("apiVersion"), resource.get("kind")))
    if crd is not None:
        jsonschema.validate(resource, crd)
    else:
        kv.validate(resource, version, strict=True)


def load_resources() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if path == KUSTOMIZATION:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


RESOURCES = load_resources()


def by_kind(kind: str) -> dict[str, dict]:
    return {r["metadata"]["name"]: r for _, r in RESOURCES if r["kind"] == kind}


def deployments() -> dict[str, dict]:
    return by_kind("Deployment")


def workloads() -> dict[str, dict]:
    """Deployments and Jobs: everything that makes pods."""
    return {**deployments(), **by_kind("Job")}


def pod_labels(workload: dict) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def the_container(dep: dict) -> dict:
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, dep["metadata"]["name"]
    return containers[0]


def all_containers(workload: dict) -> list[dict]:
    pod = workload["spec"]["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against a pod's labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        op, has = e["operator"], e["key"] in labels
        if (op == "In" and labels.get(e["key"]) not in e["values"]) or \
           (op == "NotIn" and labels.get(e["key"]) in e["values"]) or \
           (op == "Exists" and not has) or (op == "DoesNotExist" and has):
            return False
    return True


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


def container_env(dep: dict, c: dict | None = None, resources: list[dict] | None = None) -> dict[str, str]:
    """The environment a container (the workload's one main container unless given) starts with:
    its ConfigMaps (envFrom; from `resources` when given, else the manifests), then its own env;
    a downward-API value reads as `<fieldPath>`."""
    c = c or the_container(dep)
    cms = by_kind("ConfigMap") if resources is None else \
        {r["metadata"]["name"]: r for r in resources if r["kind"] == "ConfigMap"}
    env = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            env.update(cms[src["configMapRef"]["name"]]["data"])
    for e in c.get("env", []):
        env[e["name"]] = e["value"] if "value" in e else "<%s>" % e["valueFrom"]["fieldRef"]["fieldPath"]
    return env


# --- schema ---------------------------------------------------------------------------------

def test_manifests_found():
    kinds = sorted({r["kind"] for _, r in RESOURCES})
    assert {"Deployment", "Service", "ConfigMap", "Job", "NetworkPolicy", "HorizontalPodAutoscaler",
            "PodMonitor"} <= set(kinds), kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_validate_strictly(version):
    """Every resource, against each supported release's schema (the CRD against its own)."""
    failures = []
    for f, r in RESOURCES:
        try:
            validate(r, version)
        except (kv.ValidationError, kv.SchemaNotFoundError, jsonschema.ValidationError) as e:
            failures.append("%s %s/%s: %s" % (f, r["kind"], r["metadata"]["name"], e))
    assert not failures, "\n".join(failures)


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
    pm = next(iter(by_kind("PodMonitor").values()))
    monitor_unknown_field = copy.deepcopy(pm)
    monitor_unknown_field["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"   # misspelt field
    monitor_no_selector = copy.deepcopy(pm)
    del monitor_no_selector["spec"]["selector"]                          # the CRD requires it
    monitor_bad_interval = copy.deepcopy(pm)
    monitor_bad_interval["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    return {"unknown_field": unknown_field, "wrong_type": wrong_type, "missing_required": missing_required,
            "bad_probe": bad_probe, "unknown_kind": unknown_kind, "monitor_unknown_field": monitor_unknown_field,
            "monitor_no_selector": monitor_no_selector, "monitor_bad_interval": monitor_bad_interval}


@pytest.mark.parametrize("case", sorted(_broken_copies()))
def test_broken_copy_is_rejected(case):
    """The schema checks have teeth: each broken copy of the inference Deployment or the
    PodMonitor fails them."""
    with pytest.raises((kv.ValidationError, kv.SchemaNotFoundError, jsonschema.ValidationError)):
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
    for name, wl in workloads().items():
        pod = wl["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for c in all_containers(wl):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, (name, c["name"])
        assert "/tmp" in {m["mountPath"] for m in the_container(wl)["volumeMounts"]}, name


def test_every_backend_of_a_set_reads_the_same_checkpoints():
    """One ConfigMap gives all three services the checkpoint set, so a gateway never routes a
    checkpoint to a tokenizer or inference replica that lacks it."""
    from laya_grpc.core.checkpoints.sources import parse_checkpoint_specs
    sets = {name: container_env(dep).get("LAYA_CHECKPOINT") for name, dep in deployments().items()}
    assert len(set(sets.values())) == 1 and None not in sets.values(), sets
    value = next(iter(sets.values()))
    specs = parse_checkpoint_specs(value.replace(",", " ").split())   # as core.runtime.flags splits a list variable
    # every checkpoint of the set stays resident: no request waits for a reload after an eviction
    assert int(container_env(deployments()["laya-inference"])["LAYA_MAX_LOADED"]) >= len(specs), specs


def test_volumes_and_config_refer_to_objects_that_exist():
    claims, maps = set(by_kind("PersistentVolumeClaim")), set(by_kind("ConfigMap"))
    for name, wl in workloads().items():
        pod = wl["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, (name, v)
        for c in all_containers(wl):
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, (name, c["name"], m)
            for src in c.get("envFrom", []):
                ref = src.get("configMapRef") or src["secretRef"]
                # a Secret is the operator's to create: it must be optional here
                assert ref["name"] in maps if "configMapRef" in src else ref.get("optional") is True, (name, src)


# --- what a GPU cluster needs ---------------------------------------------------------------
# Each check returns its findings, so the tests below can show that a broken copy has some.

def _wants_gpu(dep: dict) -> bool:
    return any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in all_containers(dep))


def rollout_problems(dep: dict) -> list[str]:
    """A Deployment of GPU pods must roll out without a surge pod: with one GPU per node there is
    no spare GPU for it, and the rollout would wait forever."""
    if not _wants_gpu(dep):
        return []
    strategy = dep["spec"].get("strategy", {})
    rolling = strategy.get("rollingUpdate", {})
    if strategy.get("type") == "Recreate":
        return []
    problems = []
    if str(rolling.get("maxSurge", "25%")) not in ("0", "0%"):
        problems.append("maxSurge is %r, not 0" % rolling.get("maxSurge", "25% (default)"))
    if str(rolling.get("maxUnavailable", "25%")) in ("0", "0%"):
        problems.append("maxUnavailable 0 with maxSurge 0 never starts a new pod")
    return problems


def test_gpu_deployments_roll_out_without_a_surge_pod():
    assert _wants_gpu(deployments()["laya-inference"])
    for name, dep in deployments().items():
        assert not rollout_problems(dep), (name, rollout_problems(dep))


def network_problems(resources: list[dict]) -> list[str]:
    """The tokenizer's and inference's gRPC ports admit only the gateway pods: some NetworkPolicy
    selects each of those pods for Ingress, and every rule of a policy selecting them that opens
    their gRPC port comes from gateway pods of the same namespace only."""
    deps = {r["metadata"]["name"]: r for r in resources if r["kind"] == "Deployment"}
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    gateway = pod_labels(next(d for d in deps.values() if pod_labels(d)["app.kubernetes.io/component"] == "gateway"))
    problems = []
    for name, dep in deps.items():
        if pod_labels(dep)["app.kubernetes.io/component"] not in ("tokenizer", "inference"):
            continue
        ports = {p["name"]: p["containerPort"] for p in the_container(dep)["ports"]}
        mine = [p for p in policies if selects(p["spec"]["podSelector"], pod_labels(dep))
                and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
        if not mine:
            problems.append("%s: no NetworkPolicy selects its pods" % name)
        for policy in mine:
            for rule in policy["spec"].get("ingress", []):
                opened = {ports.get(p["port"], p["port"]) for p in rule.get("ports", [])} or {"all"}
                if not opened & {ports["grpc"], "all"}:
                    continue
                peers = rule.get("from", [])
                if not peers:
                    problems.append("%s: %s opens the gRPC port to everyone" % (name, policy["metadata"]["name"]))
                for peer in peers:
                    if set(peer) != {"podSelector"} or not selects(peer["podSelector"], gateway) or \
                            not peer["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component"):
                        problems.append("%s: %s admits %s to the gRPC port" % (name, policy["metadata"]["name"], peer))
            for rule in policy["spec"].get("ingress", []):
                for p in rule.get("ports", []):
                    if isinstance(p["port"], str) and p["port"] not in ports:
                        problems.append("%s: %s names no port of it: %s" % (name, policy["metadata"]["name"], p["port"]))
    return problems


def test_network_policy_admits_only_the_gateway_to_internal_ports():
    assert not network_problems([r for _, r in RESOURCES]), network_problems([r for _, r in RESOURCES])


def checkpoint_problems(resources: list[dict]) -> list[str]:
    """Serving pods read local checkpoint directories of one pinned revision with hub access off;
    the fetch Job (the one pod allowed on the hub) fills exactly those directories."""
    deps = [r for r in resources if r["kind"] == "Deployment"]
    jobs = [r for r in resources if r["kind"] == "Job"]
    source = next(r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == "laya-checkpoint-source")
    revision = source["data"]["HUB_REVISION"]
    problems = []
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        problems.append("HUB_REVISION %r is not a commit sha" % revision)
    for dep in deps:
        name = dep["metadata"]["name"]
        env = container_env(dep, resources=resources)
        if env.get("HF_HUB_OFFLINE") != "1":
            problems.append("%s: HF_HUB_OFFLINE is %r" % (name, env.get("HF_HUB_OFFLINE")))
        if pod_labels(dep)["app.kubernetes.io/component"] == "gateway":
            continue
        mounts = {m["mountPath"]: m for m in the_container(dep).get("volumeMounts", [])}
        for spec in env["LAYA_CHECKPOINT"].split():
            path = spec.partition("=")[2]
            if not path.startswith("/models/checkpoints/%s" % revision):
                problems.append("%s: %s is not a local directory of revision %s" % (name, spec, revision))
            if not mounts.get("/models", {}).get("readOnly"):
                problems.append("%s: /models is not mounted read-only" % name)
        waits = [c for c in dep["spec"]["template"]["spec"].get("initContainers", []) if ".laya-complete" in str(c)]
        if not waits:
            problems.append("%s: no init container waits for the fetched checkpoints" % name)
    if len(jobs) != 1:
        return problems + ["expected one fetch Job, found %d" % len(jobs)]
    job = jobs[0]
    env = container_env(job, resources=resources)
    script = " ".join(the_container(job)["command"])
    if env.get("HF_HUB_OFFLINE") == "1" or '--revision "$HUB_REVISION"' not in script or \
            '"/models/checkpoints/$HUB_REVISION"' not in script or ".laya-complete" not in script:
        problems.append("the Job does not fetch HUB_REVISION into /models/checkpoints/HUB_REVISION")
    if not {"configMapRef": {"name": "laya-checkpoint-source"}} in the_container(job)["envFrom"]:
        problems.append("the Job does not read laya-checkpoint-source")
    return problems


def test_serving_pods_read_pinned_local_checkpoints_with_hub_access_off():
    assert not checkpoint_problems([r for _, r in RESOURCES]), checkpoint_problems([r for _, r in RESOURCES])


def _broken_gpu_copies() -> dict:
    """Copies of the manifests with one thing wrong each, and the check that must notice."""
    res = [r for _, r in RESOURCES]

    def edit(fn):
        out = copy.deepcopy(res)
        fn({(r["kind"], r["metadata"]["name"]): r for r in out})
        return out

    def surge(r):
        r["Deployment", "laya-inference"]["spec"]["strategy"]["rollingUpdate"]["maxSurge"] = 1

    def default_strategy(r):
        del r["Deployment", "laya-inference"]["spec"]["strategy"]

    def open_to_namespace(r):
        r["NetworkPolicy", "laya-internal"]["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})

    def open_to_all(r):
        del r["NetworkPolicy", "laya-internal"]["spec"]["ingress"][0]["from"]

    def no_policy_for_inference(r):
        r["NetworkPolicy", "laya-internal"]["spec"]["podSelector"]["matchExpressions"][0]["values"] = ["tokenizer"]

    def online(r):
        del r["ConfigMap", "laya-config"]["data"]["HF_HUB_OFFLINE"]

    def unpinned(r):
        r["ConfigMap", "laya-checkpoint-source"]["data"]["HUB_REVISION"] = "main"

    def hub_id(r):
        r["ConfigMap", "laya-config"]["data"]["LAYA_CHECKPOINT"] = "english=convaiinnovations/laya"

    def writable(r):
        for m in the_container(r["Deployment", "laya-inference"])["volumeMounts"]:
            m.pop("readOnly", None)

    return {"surge": (rollout_problems, edit(surge)), "default_strategy": (rollout_problems, edit(default_strategy)),
            "open_to_namespace": (network_problems, edit(open_to_namespace)),
            "open_to_all": (network_problems, edit(open_to_all)),
            "no_policy_for_inference": (network_problems, edit(no_policy_for_inference)),
            "online": (checkpoint_problems, edit(online)), "unpinned": (checkpoint_problems, edit(unpinned)),
            "hub_id": (checkpoint_problems, edit(hub_id)), "writable": (checkpoint_problems, edit(writable))}


@pytest.mark.parametrize("case", sorted(_broken_gpu_copies()))
def test_gpu_checks_notice_a_broken_copy(case):
    check, resources = _broken_gpu_copies()[case]
    if check is rollout_problems:
        found = rollout_problems(next(r for r in resources if r["metadata"]["name"] == "laya-inference"
                                      and r["kind"] == "Deployment"))
    else:
        found = check(resources)
    assert found, case


def test_kernel_cache_on_a_persistent_volume():
    """Compiled kernels outlive the pod: LAYA_KERNEL_CACHE_DIR, the cuda image's own directory, is
    on a PersistentVolumeClaim, which an init container seeds from that directory of the image."""
    dep = deployments()["laya-inference"]
    cache = container_env(dep)["LAYA_KERNEL_CACHE_DIR"]
    image_env = re.search(r"LAYA_KERNEL_CACHE_DIR=(\S+)", _stages(DOCKERFILE.read_text())["cuda"]).group(1)
    assert cache == image_env   # the image's kernels are where the service looks
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in the_container(dep)["volumeMounts"] if cache.startswith(m["mountPath"] + "/"))
    assert "persistentVolumeClaim" in volumes[mount["name"]] and not mount.get("readOnly")
    (seed,) = [c for c in dep["spec"]["template"]["spec"]["initContainers"] if c["name"] == "seed-kernel-cache"]
    (seed_mount,) = [m for m in seed["volumeMounts"] if m["name"] == mount["name"]]
    script = seed["command"][-1]
    # reads the image's directory (not hidden by the volume in this container), writes the volume
    # at the same place under it as the service's mount
    assert not cache.startswith(seed_mount["mountPath"] + "/") and "$LAYA_KERNEL_CACHE_DIR/triton" in script
    assert seed_mount["mountPath"] + cache[len(mount["mountPath"]):] + "/triton" in script


def test_seed_script_adds_the_image_kernels_and_keeps_the_volume_ones(tmp_path):
    """seed-kernel-cache's script, run by sh on stand-ins for the image's directory and the volume:
    kernel directories the volume lacks arrive whole, those it has stay as they are, and no
    temporary copy is left behind."""
    dep = deployments()["laya-inference"]
    (seed,) = [c for c in dep["spec"]["template"]["spec"]["initContainers"] if c["name"] == "seed-kernel-cache"]
    volume = next(m["mountPath"] for m in seed["volumeMounts"] if m["name"] == "kernel-cache")
    image, cache = tmp_path / "image", tmp_path / "volume"
    for key, name in (("NEW", "k.cubin"), ("OLD", "k.cubin")):
        (image / "triton" / key).mkdir(parents=True)
        (image / "triton" / key / name).write_text("image")
        (image / "triton" / key / "k.json").write_text("image")
    (cache / "kernels" / "triton" / "OLD").mkdir(parents=True)
    (cache / "kernels" / "triton" / "OLD" / "k.cubin").write_text("volume")
    script = seed["command"][-1].replace(volume + "/", str(cache) + "/")
    r = subprocess.run([*seed["command"][:-1], script], env={"PATH": os.environ["PATH"], "LAYA_KERNEL_CACHE_DIR": str(image)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    triton = cache / "kernels" / "triton"
    assert sorted(p.name for p in triton.iterdir()) == ["NEW", "OLD"]
    assert (triton / "NEW" / "k.cubin").read_text() == (triton / "NEW" / "k.json").read_text() == "image"
    assert (triton / "OLD" / "k.cubin").read_text() == "volume" and not (triton / "OLD" / "k.json").exists()
    assert "kernel cache: 2 kernels" in r.stdout


def test_documented_warm_kernels_job_validates_and_matches_the_inference_pod():
    """docs/deploy.md's warm-kernels Job (not applied by the kustomization): valid in strict mode,
    the inference pod's image and kernel cache directory on the same volume, and only variables
    `warm-kernels` reads."""
    from laya_grpc.cli.warm_kernels import WarmKernelsSettings
    from laya_grpc.core.runtime import flags
    docs = (ROOT / "docs" / "deploy.md").read_text()
    block = re.search(r"```yaml\n(# kubectl -n laya apply -f warm-kernels.yaml.*?)```", docs, flags=re.S)
    assert block, "docs/deploy.md has no warm-kernels Job"
    job = yaml.safe_load(block.group(1))
    validate(job)
    dep = deployments()["laya-inference"]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["image"] == the_container(dep)["image"] and c["args"][0] == "warm-kernels"
    env = container_env(job, c)
    assert env["LAYA_KERNEL_CACHE_DIR"] == container_env(dep)["LAYA_KERNEL_CACHE_DIR"]
    read = {flags.env_name(f) for f in flags.fields(WarmKernelsSettings)}
    assert "LAYA_CHECKPOINT" in read and env["LAYA_CHECKPOINT"]
    assert not [n for n in c.get("env", []) if n["name"].startswith("LAYA_") and n["name"] not in read]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]}
    dep_claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in dep["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    mounts = {m["mountPath"]: claims[m["name"]] for m in c["volumeMounts"]}
    dep_mounts = {m["mountPath"]: dep_claims[m["name"]] for m in the_container(dep)["volumeMounts"] if m["name"] in dep_claims}
    assert mounts == dep_mounts   # the same checkpoints and the same kernel cache, at the same paths


def test_pods_name_themselves_for_tracing():
    """Every service gets its pod, namespace and node from the downward API, under the names
    core/runtime/tracing.py reads for the trace resource."""
    from laya_grpc.core.runtime import tracing
    for name, dep in deployments().items():
        env = container_env(dep)
        for var, field in (("K8S_POD_NAME", "metadata.name"), ("K8S_NAMESPACE_NAME", "metadata.namespace"),
                           ("K8S_NODE_NAME", "spec.nodeName")):
            assert var in tracing._K8S_ENV.values()
            assert env.get(var) == "<%s>" % field, (name, var)


def test_autoscalers_scale_deployments_that_leave_the_count_to_them():
    """An HPA's target exists and sets no `replicas` (each apply would reset the HPA's count);
    the inference HPA's custom metric is the one docs/deploy.md's adapter rule makes from a family
    the inference service exports."""
    hpas = by_kind("HorizontalPodAutoscaler")
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()} >= {"laya-inference", "laya-tokenizer"}
    for name, hpa in hpas.items():
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref["kind"] == "Deployment" and ref["name"] in deployments(), name
        assert "replicas" not in deployments()[ref["name"]]["spec"], ref["name"]
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"], name
    metric = hpas["laya-inference"]["spec"]["metrics"][0]["pods"]["metric"]["name"]
    docs = (ROOT / "docs" / "deploy.md").read_text()
    rule = re.search(r"seriesQuery: '(\w+)_count.*?name:\s*\n\s*as: (\w+)", docs, flags=re.S)
    assert rule and rule.group(2) == metric, "docs/deploy.md has no adapter rule for %s" % metric
    from laya_grpc.core.runtime import metrics
    assert rule.group(1) in {f.name for f in vars(metrics).values() if isinstance(f, metrics._Family)}


def test_pod_monitor_scrapes_every_metrics_port():
    (pm,) = by_kind("PodMonitor").values()
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    for name, dep in deployments().items():
        assert selects(pm["spec"]["selector"], pod_labels(dep)), name
        assert endpoint["port"] in {p["name"] for p in the_container(dep)["ports"]}, name
        assert endpoint["path"] == dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]


# --- the code reads what the manifests set ---------------------------------------------------

def _env_names_read_by_code() -> set[str]:
    """The current names of every service's settings (deprecated names do not count)."""
    from laya_grpc.cli.config import SERVICES, settings_class
    from laya_grpc.core.runtime import flags
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

def _stages(text: str) -> dict[str, str]:
    """Dockerfile stage name -> its text (FROM line to the next FROM)."""
    parts = re.split(r"^(?=FROM\s)", text, flags=re.M)
    return {m.group(1): part for part in parts if (m := re.match(r"FROM\s+\S+\s+AS\s+(\S+)", part, flags=re.I))}


def _base(stage_text: str) -> str:
    return stage_text.split()[1]


def test_images_are_dockerfile_targets_at_the_package_version():
    stages = _stages(DOCKERFILE.read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    for spec in re.findall(r"/src\[([a-z,]+)\]", DOCKERFILE.read_text()):
        assert set(spec.split(",")) <= extras, spec
    for name, wl in workloads().items():
        for c in all_containers(wl):
            repo, _, version = c["image"].rpartition(":")
            target = repo.rpartition("laya-grpc-")[2]
            assert repo == "laya-grpc-" + target and version == project["version"], c["image"]
            assert target in stages, "%s: no Dockerfile target %r" % (name, target)
    for c in all_containers(deployments()["laya-inference"]):
        assert c["image"].startswith("laya-grpc-cuda:")


def test_targets_share_one_python_and_carry_the_otel_extra_and_labels():
    text = DOCKERFILE.read_text()
    stages = _stages(text)
    targets = {"slim", "cpu", "cuda"}
    assert targets <= set(stages)
    labels = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", stages["python-base"]))
    assert {"org.opencontainers.image.title", "org.opencontainers.image.version", "org.opencontainers.image.revision",
            "org.opencontainers.image.licenses", "org.opencontainers.image.description"} <= labels, labels
    python = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)-", text, flags=re.M).group(1)
    assert python == "3.12"   # the version the lock files are compiled for (deploy/requirements/compile.sh)
    assert "--python-version %s" % python in (ROOT / "deploy" / "requirements" / "compile.sh").read_text()
    for t in sorted(targets):
        # every target is built on the one Python base: no second interpreter, no CUDA base image
        assert _base(stages[t]) == "python-base", t
        assert "org.opencontainers.image.title=\"laya-grpc-%s\"" % t in stages[t], t
        assert re.search(r"'/src\[[a-z,]*\botel\b[a-z,]*\]'", stages[t]), "%s: no otel extra" % t
        # third-party packages only from the target's lock file, checked against its hashes
        assert "pip install --require-hashes --no-deps -r /src/deploy/requirements/%s.txt" % t in stages[t], t
        for line in re.findall(r"pip install [^\n]*", stages[t]):
            assert "--no-deps" in line, (t, line)
    assert _base(stages["python-base"]) == "${PYTHON_IMAGE}"
    assert "nvidia/cuda" not in text and "apt-get install" not in stages["python-base"]


def _locked(path: Path) -> dict[str, list[str]]:
    text = path.read_text()
    return {m.group(1).lower(): re.findall(r"--hash=sha256:([0-9a-f]{64})", m.group(0))
            for m in re.finditer(r"^([A-Za-z0-9_.-]+)==\S+((?:\s*\\\n\s+--hash=sha256:[0-9a-f]{64})+)", text, flags=re.M)}


@pytest.mark.parametrize("target", ["slim", "cpu", "cuda"])
def test_lock_files_pin_every_requirement_with_hashes(target):
    """The lock of each target pins, with hashes, every requirement of the package and of the
    extras that target installs, and the build backend (installed without build isolation)."""
    from packaging.requirements import Requirement
    path = ROOT / "deploy" / "requirements" / ("%s.txt" % target)
    locked = _locked(path)
    pinned_lines = [l for l in path.read_text().splitlines() if re.match(r"^[A-Za-z0-9_.-]+==", l)]
    assert len(locked) == len(pinned_lines) > 10, "every pin has hashes"
    assert all(locked.values())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = re.search(r"'/src\[([a-z,]+)\]'", _stages(DOCKERFILE.read_text())[target]).group(1).split(",")
    wanted = list(project["project"]["dependencies"]) + project["build-system"]["requires"]
    for extra in extras:
        wanted += project["project"]["optional-dependencies"][extra]
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
    locked = {norm(k) for k in locked}
    for req in map(Requirement, wanted):
        if req.marker and not req.marker.evaluate({"python_version": "3.12", "sys_platform": "linux",
                                                   "platform_system": "Linux", "platform_machine": "x86_64"}):
            continue
        if target == "cpu" and req.name == "torch":
            continue   # the CPU-only wheel, from torch's index at the Dockerfile's TORCH_VERSION
        assert norm(req.name) in locked, "%s.txt lacks %s" % (target, req)
    if target == "cuda":
        assert not any(n.startswith("nvidia-") for n in _locked(ROOT / "deploy" / "requirements" / "slim.txt"))
        torch = re.search(r"^torch==(\S+)", path.read_text(), flags=re.M).group(1)
        assert re.search(r"^ARG TORCH_VERSION=%s$" % re.escape(torch), DOCKERFILE.read_text(), flags=re.M)


def test_kustomization_lists_every_manifest_and_replaces_the_images():
    kust = yaml.safe_load(KUSTOMIZATION.read_text())
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {KUSTOMIZATION.name}
    assert sorted(kust["resources"]) == sorted(files)
    used = {c["image"].rpartition(":")[0] for wl in workloads().values() for c in all_containers(wl)}
    assert {i["name"] for i in kust["images"]} == used
    for i in kust["images"]:
        assert i["newName"].endswith("/" + i["name"]), i


def test_kustomize_build_renders_what_validates():
    """`kubectl kustomize` (kustomize built into kubectl) renders the set with the registry's
    image names, and the result still validates."""
    import shutil
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed")
    r = subprocess.run(["kubectl", "kustomize", str(MANIFESTS)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert len(rendered) == len(RESOURCES)
    kust = yaml.safe_load(KUSTOMIZATION.read_text())
    registry = {i["newName"] + ":" + i["newTag"] for i in kust["images"]}
    for doc in rendered:
        validate(doc)
        if doc["kind"] in ("Deployment", "Job"):
            for c in all_containers(doc):
                assert c["image"] in registry, c["image"]


def test_dockerignore_keeps_what_the_dockerfile_copies():
    kept = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
            if line.startswith("!")]
    for src in re.findall(r"^COPY\s+(.+)\s+\S+$", DOCKERFILE.read_text(), flags=re.M):
        for path in src.split():
            assert any(path == k or path.startswith(k + "/") for k in kept), path
            assert (ROOT / path).exists(), path
