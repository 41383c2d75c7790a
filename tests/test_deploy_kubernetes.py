"""The Kubernetes manifests: valid against the API schemas, wired to each other, generated from one source."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from crossover_monitor import __version__
from crossover_monitor.cli.main import _parser
from crossover_monitor.config.settings import DEFAULT_PORT
from crossover_monitor.service.coordinator import STOP_WAIT_S
from tests.conftest import REPO
from tests.promql import DASHBOARD, FLEET_DASHBOARD, FLEET_RULES, RULES, SCRAPE_EXAMPLE, promtool

HERE = REPO / "deploy" / "kubernetes"
GENERATOR = HERE / "generate.py"
GPU_DOCKERFILE = REPO / "deploy" / "container" / "Dockerfile.gpu"
EXAMPLE_CONFIG = REPO / "deploy" / "config.example.yaml"
# A recent release that kubernetes-validate ships schemas for; bump with the package.
KUBERNETES_VERSION = "1.34.0"
# The Prometheus Operator's kinds: kubernetes-validate has no schemas for CRDs.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def manifests() -> list[Path]:
    return sorted(p for p in HERE.glob("*.yaml") if p.name != "kustomization.yaml")


def load(path: Path) -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert len(documents) == 1, f"{path.name}: expected one object, found {len(documents)}"
    return documents[0]


def validate(resource: dict[str, Any]) -> None:
    """Raises kubernetes_validate.ValidationError if the object breaks its schema (unknown fields too)."""
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    return load(HERE / "daemonset.yaml")["spec"]["template"]


@pytest.fixture(scope="module")
def container(pod: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod["spec"]["containers"]
    return only


@pytest.mark.parametrize(
    "path", [p for p in manifests() if load(p)["kind"] not in OPERATOR_KINDS], ids=lambda p: p.name
)
def test_manifest_matches_the_kubernetes_schema(path: Path) -> None:
    """Every built-in object validates strictly against the Kubernetes API schema, offline."""
    validate(load(path))


def test_schema_validation_rejects_a_misspelled_field() -> None:
    """The same validator rejects a DaemonSet whose probe name is misspelled."""
    daemonset = load(HERE / "daemonset.yaml")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        validate(daemonset)


def test_schema_validation_rejects_a_wrongly_typed_value() -> None:
    """The same validator rejects a port number given as a word."""
    service = load(HERE / "service.yaml")
    service["spec"]["ports"][0]["port"] = "metrics"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(service)


def test_manifests_name_no_namespace() -> None:
    """No object pins a namespace, so `kubectl apply -n` or kustomize's `namespace:` decides it."""
    pinned = [p.name for p in manifests() if "namespace" in load(p)["metadata"]]
    assert pinned == []


def test_kustomization_lists_every_manifest() -> None:
    """kustomization.yaml applies each manifest in the folder, and nothing that is not there."""
    kustomization = load(HERE / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(p.name for p in manifests())
    (container,) = load(HERE / "daemonset.yaml")["spec"]["template"]["spec"]["containers"]
    assert container["image"].split(":")[0] in {image["name"] for image in kustomization["images"]}


def test_the_image_tag_names_this_release() -> None:
    """Every node pulls the image of the release the manifests come from, never a moving tag."""
    (image,) = load(HERE / "kustomization.yaml")["images"]
    assert image["newTag"] == f"{__version__}-gpu"


def gpu_resources(pod_spec: dict[str, Any]) -> list[str]:
    """``kind.resource`` for every GPU the pod's containers request or limit (a reservation of GPUs)."""
    containers = [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
    return [
        f"{c['name']}: {kind}.{name}"
        for c in containers
        for kind in ("requests", "limits")
        for name in c.get("resources", {}).get(kind, {})
        if "gpu" in name.lower()
    ]


def test_daemonset_runs_on_gpu_nodes(pod: dict[str, Any]) -> None:
    """It selects GPU nodes and tolerates their taint."""
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_daemonset_reserves_no_gpu(pod: dict[str, Any]) -> None:
    """No container requests or limits nvidia.com/gpu (or any GPU resource): every GPU stays schedulable."""
    assert gpu_resources(pod["spec"]) == []


@pytest.mark.parametrize("kind", ["requests", "limits"])
def test_gpu_reservation_check_catches_a_gpu_request(kind: str) -> None:
    """The same check names a container that asks the device plugin for a GPU again, as a request or a limit."""
    daemonset = load(HERE / "daemonset.yaml")
    spec = daemonset["spec"]["template"]["spec"]
    spec["containers"][0]["resources"].setdefault(kind, {})["nvidia.com/gpu"] = 1
    validate(daemonset)  # a schema-valid manifest: only this check stands in the way
    assert f"crossover-monitor: {kind}.nvidia.com/gpu" in gpu_resources(spec)


def test_daemonset_sees_every_gpu_through_the_nvidia_runtime(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Every GPU through NVIDIA_VISIBLE_DEVICES=all under the NVIDIA RuntimeClass, with NVML (utility) for the guard."""
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) >= {"compute", "utility"}
    assert "CUDA_VISIBLE_DEVICES" not in env  # it would hide GPUs from the framework again


def test_daemonset_keeps_the_host_pid_namespace_off_by_default(pod: dict[str, Any]) -> None:
    """hostPID is spelled out (the trade-off is explained beside it) and off, as the Pod Security Standards ask."""
    assert pod["spec"]["hostPID"] is False
    assert not pod["spec"].get("hostNetwork")
    assert not pod["spec"].get("hostIPC")
    assert "hostPID: true" in (HERE / "daemonset.yaml").read_text(encoding="utf-8")  # the comment names the switch


def test_probes_use_health_and_readiness_endpoints(container: dict[str, Any]) -> None:
    """Liveness and startup ask /healthz (alive), readiness asks /readyz (a sweep has completed)."""
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": DEFAULT_PORT, "protocol": "TCP"}]


def test_pod_runs_unprivileged_and_read_only(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Non-root as the GPU image's own user, a read-only root filesystem, no capabilities, no escalation."""
    image_user = re.search(r"^USER (\d+)", GPU_DOCKERFILE.read_text(encoding="utf-8"), re.MULTILINE)
    assert image_user
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == int(image_user.group(1)) > 0
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp", "/var/lib/crossover-monitor"}  # scratch, and the run history


def test_history_lives_on_a_volume_the_service_is_told_about(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """STATE_DIRECTORY names the mounted state volume, so a restarted container serves its last results."""
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert env["STATE_DIRECTORY"] in mounts
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mounts[env["STATE_DIRECTORY"]])
    assert "emptyDir" in volume


def test_termination_grace_outlasts_the_sweep_kill_path(pod: dict[str, Any]) -> None:
    """Kubernetes waits well past the service's own bounded stop before it kills the pod."""
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 2 * STOP_WAIT_S


def test_pod_reads_its_config_from_the_configmap(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """The ConfigMap is mounted at /etc/crossover-monitor and the service is started with its file."""
    configmap = load(HERE / "configmap.yaml")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/crossover-monitor"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    (key,) = configmap["data"]
    args = _parser().parse_args(container["args"])  # the service's own parser: exits on a bad command line
    assert args.command == "run"
    assert args.config == f"/etc/crossover-monitor/{key}"


def test_configmap_config_passes_check_config(tmp_path: Path) -> None:
    """The configuration the pods get is accepted by the service's own check-config."""
    config = tmp_path / "config.yaml"
    config.write_text(load(HERE / "configmap.yaml")["data"]["config.yaml"], encoding="utf-8")
    binary = Path(sys.executable).with_name("crossover-monitor")
    result = subprocess.run([str(binary), "check-config", str(config)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_service_selects_the_pods_by_their_metrics_port(pod: dict[str, Any]) -> None:
    """The Service's selector matches the pod labels and its port targets the pod port named metrics."""
    service = load(HERE / "service.yaml")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics"
    assert port["targetPort"] == "metrics"


def test_servicemonitor_scrapes_the_service_metrics_port() -> None:
    """A monitoring.coreos.com/v1 ServiceMonitor that selects the Service and scrapes as the example job does."""
    monitor = load(HERE / "servicemonitor.yaml")
    service = load(HERE / "service.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["name"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    (job,) = load(SCRAPE_EXAMPLE)["scrape_configs"]  # the scrape settings the rules and dashboard assume
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == (
        job["metrics_path"],
        job["scrape_interval"],
        job["scrape_timeout"],
    )


RULE_MANIFESTS = [("prometheusrule.yaml", RULES), ("prometheusrule-fleet.yaml", FLEET_RULES)]


@pytest.mark.parametrize(("manifest", "source"), RULE_MANIFESTS, ids=[name for name, _ in RULE_MANIFESTS])
def test_prometheusrule_carries_the_rules_file_groups(manifest: str, source: Path) -> None:
    """A monitoring.coreos.com/v1 PrometheusRule per rules file (the node's and the fleet tier's, so that a global
    Prometheus can select the fleet's alone), whose groups equal that file's."""
    rule = load(HERE / manifest)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"]
    assert rule["spec"]["groups"] == load(source)["groups"]
    assert all(group["name"] and group["rules"] for group in rule["spec"]["groups"])
    assert manifest in load(HERE / "kustomization.yaml")["resources"]


@pytest.mark.parametrize("manifest", [name for name, _ in RULE_MANIFESTS])
def test_prometheusrule_groups_pass_promtool(tmp_path: Path, manifest: str) -> None:
    """promtool check rules accepts the groups as the Prometheus Operator will hand them to Prometheus."""
    groups = tmp_path / "groups.yml"
    groups.write_text(yaml.safe_dump({"groups": load(HERE / manifest)["spec"]["groups"]}), encoding="utf-8")
    result = promtool("check", "rules", groups)
    assert result.returncode == 0, result.stdout + result.stderr


DASHBOARD_MANIFESTS = [
    ("grafana-dashboard-configmap.yaml", DASHBOARD),
    ("grafana-dashboard-fleet-configmap.yaml", FLEET_DASHBOARD),
]


@pytest.mark.parametrize(("manifest", "source"), DASHBOARD_MANIFESTS, ids=[name for name, _ in DASHBOARD_MANIFESTS])
def test_dashboard_configmap_carries_the_dashboard_for_the_grafana_sidecar(manifest: str, source: Path) -> None:
    """Each dashboard's ConfigMap (the node's and the fleet's) has the sidecar's label, is applied by the
    kustomization, and carries its dashboard JSON byte for byte under the dashboard's file name."""
    configmap = load(HERE / manifest)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {source.name: source.read_text(encoding="utf-8")}
    assert manifest in load(HERE / "kustomization.yaml")["resources"]


def test_the_two_dashboard_configmaps_do_not_overwrite_each_other() -> None:
    """Distinct ConfigMap names, and distinct data keys: the sidecar writes every key into one folder."""
    configmaps = [load(HERE / manifest) for manifest, _ in DASHBOARD_MANIFESTS]
    assert len({c["metadata"]["name"] for c in configmaps}) == len(configmaps)
    assert len({key for c in configmaps for key in c["data"]}) == len(configmaps)


def test_generated_manifests_are_up_to_date() -> None:
    """generate.py --check finds every generated manifest equal to what its source gives today."""
    result = generate("--check")
    assert result.returncode == 0, result.stderr


def copy_sources(root: Path) -> None:
    """A minimal repository under ``root``: the generator's sources and its output folder."""
    for source in (RULES, FLEET_RULES, DASHBOARD, FLEET_DASHBOARD, EXAMPLE_CONFIG):
        target = root / source.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    shutil.copytree(HERE, root / HERE.relative_to(REPO))


def test_check_reports_a_manifest_left_behind_by_its_source(tmp_path: Path) -> None:
    """After a source changes, --check fails naming the stale manifest, and a plain run brings it up to date."""
    copy_sources(tmp_path)
    rules = tmp_path / RULES.relative_to(REPO)
    data = load(rules)
    data["groups"][0]["interval"] = "1m"
    rules.write_text(yaml.safe_dump(data), encoding="utf-8")

    stale = generate("--check", "--root", str(tmp_path))
    assert stale.returncode == 1
    assert "prometheusrule.yaml is out of date" in stale.stderr

    assert generate("--root", str(tmp_path)).returncode == 0
    assert generate("--check", "--root", str(tmp_path)).returncode == 0
    written = load(tmp_path / "deploy" / "kubernetes" / "prometheusrule.yaml")
    assert written["spec"]["groups"][0]["interval"] == "1m"


def test_generator_names_a_missing_source(tmp_path: Path) -> None:
    """Without the rules file the generator fails with a message naming it, and still writes the others."""
    copy_sources(tmp_path)
    (tmp_path / RULES.relative_to(REPO)).unlink()
    (tmp_path / "deploy" / "kubernetes" / "configmap.yaml").unlink()

    result = generate("--root", str(tmp_path))
    assert result.returncode == 1
    assert "deploy/prometheus/rules.yml is missing" in result.stderr
    assert (tmp_path / "deploy" / "kubernetes" / "configmap.yaml").is_file()


def test_daemonset_requests_what_the_daemon_holds_and_limits_what_a_sweep_peaks_at(container: dict[str, Any]) -> None:
    """A memory request that covers the measured TensorFlow worker peak and the daemon (issue 35: 128Mi let the
    scheduler overcommit by 1.7 GiB a sweep, and made the pod the first evicted under memory pressure); a
    limit above it with room; a CPU request as light as dcgm-exporter's and no CPU limit."""
    import json  # noqa: PLC0415

    resources = container["resources"]
    assert resources["requests"]["cpu"] == "100m"
    assert "cpu" not in resources["limits"]  # a CFS quota would throttle the CPU timings
    recorded = REPO / "benchmarks" / "results" / "footprint-tensorflow-defaults-h200-2026-12-02.json"
    phases = json.loads(recorded.read_text(encoding="utf-8"))["phases"]
    worker_peak_mib = max(p["worker_peak_rss_mib"] for p in phases)
    daemon_mib = max(p["daemon_rss_mib"] for p in phases)
    assert daemon_mib < 128

    def mib(quantity: str) -> int:
        return {"Gi": 1024, "Mi": 1}[quantity[-2:]] * int(quantity[:-2])

    assert mib(resources["requests"]["memory"]) >= worker_peak_mib + daemon_mib
    assert mib(resources["limits"]["memory"]) >= 1.5 * (worker_peak_mib + daemon_mib)


def test_daemonset_is_placed_early_but_never_preempts(pod: dict[str, Any]) -> None:
    """Its own PriorityClass: above ordinary pods, preemptionPolicy Never (not system-node-critical)."""
    assert pod["spec"]["priorityClassName"] == "crossover-monitor"
    priority = load(HERE / "priorityclass.yaml")
    assert priority["metadata"]["name"] == "crossover-monitor"
    assert priority["preemptionPolicy"] == "Never"
    assert priority["value"] > 0
    assert priority.get("globalDefault") is False


def _json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902's add and replace, as kustomize applies a component's patch (what the component uses)."""
    for op in operations:
        *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in op["path"].split("/")[1:]]
        target: Any = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "add" and isinstance(target, list):
            target.append(op["value"]) if last == "-" else target.insert(int(last), op["value"])
        elif op["op"] == "add" or (op["op"] == "replace" and last in target):
            target[last] = op["value"]
        else:
            raise AssertionError(f"{op}: the path is not in the DaemonSet")
    return document


def test_the_pod_names_component_mounts_only_the_kubelets_socket_read_only() -> None:
    """The opt-in component: the kubelet's pod-resources directory read-only where the worker looks, as root
    (the socket's owner) but with no capability, no escalation and a read-only root file system."""
    from crossover_monitor.measure.guard.podresources import DEFAULT_SOCKET  # noqa: PLC0415

    component = load(HERE / "pod-names" / "kustomization.yaml")
    assert component["kind"] == "Component"
    (patch,) = component["patches"]
    assert patch["target"] == {"kind": "DaemonSet", "name": "crossover-monitor"}
    daemonset = _json_patch(load(HERE / "daemonset.yaml"), yaml.safe_load(patch["patch"]))
    validate(daemonset)
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {"name": "pod-resources", "mountPath": str(Path(DEFAULT_SOCKET).parent), "readOnly": True}
    volume = next(v for v in spec["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert spec["securityContext"]["runAsUser"] == 0
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["hostPID"] is False
    if shutil.which("kubectl"):  # kustomize itself agrees, where it is installed
        overlay = Path(tempfile.mkdtemp(prefix="overlay-"))
        try:
            shutil.copytree(HERE, overlay / "base")
            (overlay / "kustomization.yaml").write_text("resources: [base]\ncomponents: [base/pod-names]\n")
            built = subprocess.run(
                ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60, check=True
            ).stdout
            (rendered,) = [d for d in yaml.safe_load_all(built) if d and d["kind"] == "DaemonSet"]
            assert rendered["spec"]["template"]["spec"]["volumes"] == spec["volumes"]
            assert rendered["spec"]["template"]["spec"]["securityContext"] == spec["securityContext"]
        finally:
            shutil.rmtree(overlay)


# Who the NetworkPolicy lets reach the pods by default: kube-prometheus's Prometheus pods, in its namespace.
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def policy_openings(policy: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    """How ``policy`` lets anything but the Prometheus peer reach the pods, or misses them; [] when it does not."""
    spec = policy["spec"]
    found = []
    selected = spec["podSelector"].get("matchLabels", {})
    if not selected or not selected.items() <= pod["metadata"]["labels"].items():
        found.append(f"podSelector {spec['podSelector']} is not the DaemonSet's pods alone")
    if "Ingress" not in spec.get("policyTypes", []):
        found.append("policyTypes has no Ingress: ingress is not restricted")
    if pod["spec"].get("hostNetwork"):
        found.append("the pods use the host network, which no NetworkPolicy restricts")
    (container,) = pod["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for index, rule in enumerate(spec.get("ingress", [])):
        peers = rule.get("from")
        if peers != [PROMETHEUS_PEER]:
            found.append(f"ingress[{index}] lets in {peers or 'every source'}, not Prometheus alone")
        ports = [(named.get(p.get("port"), p.get("port")), p.get("protocol", "TCP")) for p in rule.get("ports") or []]
        if ports != [(DEFAULT_PORT, "TCP")]:
            found.append(f"ingress[{index}] opens {ports or 'every port'}, not {DEFAULT_PORT}/TCP alone")
    return found


def test_networkpolicy_lets_only_prometheus_reach_the_metrics_port(pod: dict[str, Any]) -> None:
    """Issue 51 deploy: the pods (off the host network) take connections on 9437 from Prometheus pods alone."""
    policy = load(HERE / "networkpolicy.yaml")
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy_openings(policy, pod) == []
    assert len(policy["spec"]["ingress"]) == 1  # one rule: Prometheus, the metrics port


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda spec: spec["ingress"].append({}), "every source"),
        (lambda spec: spec["ingress"][0]["from"][0].pop("podSelector"), "not Prometheus alone"),
        (lambda spec: spec["ingress"][0].pop("ports"), "every port"),
        (lambda spec: spec.update(podSelector={}), "not the DaemonSet's pods alone"),
        (lambda spec: spec.update(policyTypes=["Egress"]), "no Ingress"),
    ],
)
def test_networkpolicy_check_catches_a_policy_open_to_more(
    change: Callable[[dict[str, Any]], object], said: str, pod: dict[str, Any]
) -> None:
    """Issue 51 deploy: the same check names a rule open to any pod, any port, or a policy that misses the pods."""
    policy = load(HERE / "networkpolicy.yaml")
    change(policy["spec"])
    assert any(said in opening for opening in policy_openings(policy, pod)), policy_openings(policy, pod)


def test_networkpolicy_check_catches_pods_on_the_host_network(pod: dict[str, Any]) -> None:
    """Issue 51 deploy: a DaemonSet moved to the host network would leave the policy without effect: named."""
    on_host = {**pod, "spec": {**pod["spec"], "hostNetwork": True}}
    assert policy_openings(load(HERE / "networkpolicy.yaml"), on_host) == [
        "the pods use the host network, which no NetworkPolicy restricts"
    ]


def test_servicemonitor_drops_the_pod_label_so_a_rollout_keeps_every_series() -> None:
    """Issue 52: the operator's `pod` label changed on every rollout, starting every series anew (up to 28 M at
    10,000 nodes); the ServiceMonitor drops it after naming the instance by its node."""
    (endpoint,) = load(HERE / "servicemonitor.yaml")["spec"]["endpoints"]
    steps = endpoint["relabelings"]
    instance = next(i for i, s in enumerate(steps) if s.get("targetLabel") == "instance")
    assert steps[instance]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    drops = [i for i, s in enumerate(steps) if s.get("action") == "labeldrop" and re.fullmatch(s["regex"], "pod")]
    assert drops
    assert drops[0] > instance
