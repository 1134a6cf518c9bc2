"""deploy/k8s: the Kubernetes manifests, checked without a cluster.

* ``kubeconform -strict`` validates every resource against the Kubernetes JSON schemas of
  :data:`K8S_VERSION` (the schemas come from the kubernetes-validate package, made standalone
  here, as kubeconform reads them; ``make kubeconform`` installs both into the virtual
  environment), and a manifest with a misspelt field is shown to fail it;
* the wiring the schemas cannot see: every worker's probes hit ``/metrics`` on its metrics port
  and it serves that port on the pod address, every container mounts the Kafka Secret and the
  scenario ConfigMap it is told to read, every command is accepted by ``headroom``'s own parser,
  the client names each server replica by its stable StatefulSet name, and the kustomization
  lists every manifest.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom.cli import build_parser
from headroom.kernel.scenario_load import load_scenario

REPO = Path(__file__).parents[2]
K8S = REPO / "deploy" / "k8s"
K8S_VERSION = "1.33.0"
WORKLOADS = {"Deployment", "StatefulSet", "Job"}
METRICS_PORT = 9100
COMPONENTS = {"controller", "server", "client", "precompute"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out.extend(_docs(path))
    return out


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def workloads(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] in WORKLOADS]


def component(m: dict[str, Any]) -> str:
    return str(m["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])


def _kubeconform() -> str:
    path = shutil.which("kubeconform") or str(Path(sys.executable).parent / "kubeconform")
    assert Path(path).exists(), "kubeconform is missing: `make kubeconform` installs it"
    return path


def standalone_schemas(kinds: set[tuple[str, str]], out: Path) -> Path:
    """kubernetes-validate's schemas of ``kinds`` ((kind, apiVersion) pairs) written as
    kubeconform's standalone-strict layout under ``out``: the shared definitions inlined into
    each file (the package refers to them by an absolute path kubeconform cannot resolve)."""
    spec = importlib.util.find_spec("kubernetes_validate")
    missing = "kubernetes-validate is missing: `make kubeconform` installs it"
    assert spec is not None, missing
    assert spec.origin, missing
    src = Path(spec.origin).parent / "kubernetes-json-schema" / f"v{K8S_VERSION}-local-strict"
    defs = json.loads((src / "_definitions.json").read_text())["$defs"]
    dst = out / f"v{K8S_VERSION}-standalone-strict"
    dst.mkdir(parents=True)
    for kind, api_version in kinds:
        group, _, version = api_version.rpartition("/")
        suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
        name = f"{kind.lower()}{suffix}.json"
        text = (src / name).read_text().replace('"/api/_definitions.json#', '"#')
        doc = json.loads(text)
        doc["$defs"] = defs
        (dst / name).write_text(json.dumps(doc))
    return out


def kubeconform(files: list[Path], schemas: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            _kubeconform(),
            "-strict",
            "-summary",
            "-kubernetes-version",
            K8S_VERSION,
            "-schema-location",
            str(schemas),
            "-skip",
            "Kustomization",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def schemas(manifests: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    kinds = {(m["kind"], m["apiVersion"]) for m in manifests}
    return standalone_schemas(kinds, tmp_path_factory.mktemp("k8s-schemas"))


def test_every_manifest_passes_kubeconform(manifests: list[dict[str, Any]], schemas: Path) -> None:
    done = kubeconform(sorted(K8S.glob("*.yaml")), schemas)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"Valid: {len(manifests)}, Invalid: 0, Errors: 0, Skipped: 1" in out, out


def test_kubeconform_rejects_a_misspelt_field(schemas: Path, tmp_path: Path) -> None:
    text = (K8S / "client.yaml").read_text()
    bad = tmp_path / "client.yaml"
    bad.write_text(text.replace("readinessProbe:", "readinesProbe:"))
    done = kubeconform([bad], schemas)
    assert done.returncode != 0
    assert "readinesProbe" in done.stdout


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_there_is_a_workload_for_each_component(manifests: list[dict[str, Any]]) -> None:
    found = {component(m) for m in workloads(manifests)}
    assert found >= COMPONENTS
    for m in workloads(manifests):
        assert m["metadata"]["namespace"] == "headroom"
        if m["kind"] != "Job":
            labels = m["spec"]["template"]["metadata"]["labels"]
            for key, value in m["spec"]["selector"]["matchLabels"].items():
                assert labels[key] == value, m["metadata"]["name"]


def test_workers_are_probed_on_their_metrics_port(manifests: list[dict[str, Any]]) -> None:
    settings = by_kind(manifests, "ConfigMap")["headroom-settings"]["data"]
    # /metrics on the pod address: the kubelet and Prometheus reach it
    assert settings["HEADROOM_METRICS_HOST"] == "0.0.0.0"
    probed = set()
    for m in workloads(manifests):
        if m["kind"] == "Job":
            continue
        for c in m["spec"]["template"]["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert ports["metrics"] == METRICS_PORT
            args = c["args"]
            assert args[args.index("--metrics-port") + 1] == str(METRICS_PORT)
            for probe in ("livenessProbe", "readinessProbe"):
                get = c[probe]["httpGet"]
                assert get == {"path": "/metrics", "port": "metrics"}, (
                    m["metadata"]["name"],
                    probe,
                )
            assert {"configMapRef": {"name": "headroom-settings"}} in c["envFrom"]
            probed.add(component(m))
    assert probed == COMPONENTS


def test_every_container_reads_kafka_config_from_the_secret_and_the_scenario_from_the_configmap(
    manifests: list[dict[str, Any]],
) -> None:
    settings = by_kind(manifests, "ConfigMap")["headroom-settings"]["data"]
    secret = by_kind(manifests, "Secret")["headroom-kafka"]
    properties = dict(
        line.split("=", 1)
        for line in secret["stringData"]["client.properties"].splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert properties["security.protocol"] == "SASL_SSL"
    assert properties["sasl.mechanism"] == "SCRAM-SHA-512"
    assert {"sasl.username", "sasl.password", "ssl.ca.location"} <= set(properties)
    readers = set()
    for m in workloads(manifests):
        pod = m["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for claim in m["spec"].get("volumeClaimTemplates", []):
            volumes[claim["metadata"]["name"]] = {"claim": claim}
        for c in pod["containers"]:
            mounts = {v["mountPath"]: volumes[v["name"]] for v in c["volumeMounts"]}
            config = Path(settings["HEADROOM_KAFKA_CONFIG"])
            assert mounts[str(config.parent)]["secret"]["secretName"] == "headroom-kafka"
            assert config.name in secret["stringData"]
            ca = Path(properties["ssl.ca.location"])
            assert ca.parent == config.parent
            assert ca.name in secret["stringData"]
            if component(m) == "controller":  # its Faust tables' cache survives a restart
                assert "claim" in mounts[settings["HEADROOM_CONTROLLER_DIR"]]
            args = build_parser().parse_args(c["args"])
            if not hasattr(args, "scenario"):  # topics create: no scenario
                continue
            assert args.scenario is not None, m["metadata"]["name"]  # not the built-in default
            scenario = Path(args.scenario)
            source = mounts[str(scenario.parent)]["configMap"]["name"]
            assert scenario.name in by_kind(manifests, "ConfigMap")[source]["data"]
            readers.add(component(m))
    assert readers >= COMPONENTS | {"feed"}


def test_every_command_is_accepted_by_headroom(manifests: list[dict[str, Any]]) -> None:
    for m in workloads(manifests):
        for c in m["spec"]["template"]["spec"]["containers"]:
            args = build_parser().parse_args(c["args"])  # SystemExit(2) on an unknown flag
            assert args._handler, m["metadata"]["name"]


def test_the_client_reaches_every_server_replica_by_its_stable_name(
    manifests: list[dict[str, Any]],
) -> None:
    services = by_kind(manifests, "Service")
    expected = set()
    for name, sts in by_kind(manifests, "StatefulSet").items():
        if component(sts) != "server":
            continue
        service = services[sts["spec"]["serviceName"]]
        assert service["spec"]["clusterIP"] == "None"  # headless: a DNS name per pod
        c = sts["spec"]["template"]["spec"]["containers"][0]
        server = build_parser().parse_args(c["args"])
        assert (server.host, server.port) == ("0.0.0.0", 7001)
        for i in range(sts["spec"]["replicas"]):
            expected.add(f"{server.pool}={name}-{i}.{service['metadata']['name']}:{server.port}")
    clients = [m for m in workloads(manifests) if component(m) == "client"]
    assert len(clients) == 1
    container = clients[0]["spec"]["template"]["spec"]["containers"][0]
    client = build_parser().parse_args(container["args"])
    assert set(client.server) == expected


def test_each_client_pod_is_its_own_static_group_member(manifests: list[dict[str, Any]]) -> None:
    """A region's clients scale as a StatefulSet: a pod's static instance id is its stable name
    (never two pods with one name, the same name after a restart), behind a headless Service."""
    services = by_kind(manifests, "Service")
    clients = [m for m in workloads(manifests) if component(m) == "client"]
    assert [m["kind"] for m in clients] == ["StatefulSet"]
    sts = clients[0]
    assert services[sts["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert build_parser().parse_args(container["args"]).instance == "$(POD_NAME)"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_the_scenario_configmap_holds_the_quickstart_scenario(
    manifests: list[dict[str, Any]], tmp_path: Path
) -> None:
    text = by_kind(manifests, "ConfigMap")["headroom-scenario"]["data"]["scenario.yaml"]
    quickstart = REPO / "scenarios" / "quickstart.yaml"
    assert yaml.safe_load(text) == yaml.safe_load(quickstart.read_text())
    (tmp_path / "scenario.yaml").write_text(text)
    scenario = load_scenario(tmp_path / "scenario.yaml")
    regions = {r.name for r in scenario.regions}
    # the precompute worker refuses a scenario without precompute: none runs then
    for m in workloads(manifests):
        if component(m) == "precompute":
            assert (m["spec"]["replicas"] > 0) == scenario.precompute_enabled
    for m in workloads(manifests):
        args = build_parser().parse_args(m["spec"]["template"]["spec"]["containers"][0]["args"])
        region = getattr(args, "region", None)
        assert region is None or region in regions
