"""The Helm chart at deploy/helm/switchyard, through the official Helm SDK
(PyPI ``helm-python-sdk``: Helm 4's Go SDK behind a C ABI, no helm binary):

- ``helm lint --strict`` is clean with the default and the HA values;
- both render, and every rendered manifest validates with
  ``kubernetes-validate --strict`` against a current Kubernetes version;
- the rendered manifests say what the deployment needs (gRPC probes, Secrets,
  hooks, autoscaling, metrics);
- ``values.schema.json`` rejects bad values, one test per mistake;
- yamllint passes on the chart's plain YAML and on the rendered manifests.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "switchyard"
HA_VALUES = CHART / "ci" / "ha-values.yaml"
YAMLLINT_CONFIG = REPO / "deploy" / ".yamllint"
# A current Kubernetes: the newest schemas kubernetes-validate ships.
KUBE_VERSION = kubernetes_validate.latest_version()
# Kinds from CRDs have no schema in kubernetes-validate; checked by hand below.
CRD_KINDS = {"ServiceMonitor"}


def ha_values() -> dict[str, Any]:
    return yaml.safe_load(HA_VALUES.read_text())


def render(values: dict[str, Any] | None = None, name: str = "demo") -> dict[str, str]:
    chart = helm.Chart.load(CHART)
    return chart.render(values, name=name, namespace="switchyard", is_install=True)


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


CASES = {
    "default": (None, "demo"),
    "ha": (ha_values(), "ha"),
}


# --- lint -----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_lint_is_clean(case):
    values, _ = CASES[case]
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [], report
    assert report["messages"] == [], report


# --- render and validate --------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_manifest_validates_strictly(case):
    values, name = CASES[case]
    docs = manifests(render(values, name))
    assert docs
    checked = []
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        # Raises ValidationError (with the path) on any unknown or wrong field.
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        checked.append(f"{doc['kind']}/{doc['metadata']['name']}")
    print(f"{case}: {len(checked)} manifests valid for Kubernetes {KUBE_VERSION}: {', '.join(checked)}")


def test_default_render_has_the_pieces():
    docs = manifests(render())
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Secret", "Secret", "Service", "ServiceAccount"]
    )
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": 50051, "service": ""}, probe
    assert pod["terminationGracePeriodSeconds"] > container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {p["containerPort"] for p in container["ports"]} == {50051, 9090}
    config = one(docs, "ConfigMap")["data"]
    assert config["SWITCHYARD_LISTEN"] == "0.0.0.0:50051"
    assert config["SWITCHYARD_METRICS_LISTEN"] == "0.0.0.0:9090"
    assert "SWITCHYARD_TOKENS_FILE" not in config and "SWITCHYARD_INSECURE" not in config
    # The URL reaches the server from a Secret, never the ConfigMap.
    (db_env,) = [e for e in container["env"] if e["name"] == "SWITCHYARD_DATABASE_URL"]
    assert db_env["valueFrom"]["secretKeyRef"] == {"name": "demo-switchyard", "key": "database-url"}
    assert not any("postgres://" in str(v) for v in config.values())
    service = one(docs, "Service")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"grpc": 50051, "metrics": 9090}


def test_migrations_run_as_a_hook_before_the_pods_change():
    docs = manifests(render())
    job = one(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    # The release's Secret does not exist yet at pre-install: the Job reads a
    # hook Secret created just before it.
    ref = next(e for e in container["env"] if e["name"] == "SWITCHYARD_DATABASE_URL")["valueFrom"]["secretKeyRef"]
    hook_secret = next(s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == ref["name"])
    annotations = hook_secret["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(annotations["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert "serviceAccountName" not in job["spec"]["template"]["spec"]


def test_ha_render_autoscales_and_reads_existing_secrets():
    docs = manifests(render(ha_values(), "ha"))
    assert not by_kind(docs, "Secret"), "both Secrets are existing ones"
    deployment = one(docs, "Deployment")
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 9)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (db_env,) = [e for e in container["env"] if e["name"] == "SWITCHYARD_DATABASE_URL"]
    assert db_env["valueFrom"]["secretKeyRef"] == {"name": "switchyard-database", "key": "url"}
    job_env = one(docs, "Job")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "switchyard-database", "key": "url"} in [
        e["valueFrom"]["secretKeyRef"] for e in job_env if "valueFrom" in e
    ]
    # The tokens file is mounted where SWITCHYARD_TOKENS_FILE points.
    tokens_file = one(docs, "ConfigMap")["data"]["SWITCHYARD_TOKENS_FILE"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tokens"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tokens"]
    assert volume["secret"]["secretName"] == "switchyard-tokens"
    assert tokens_file == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service_ports = {p["name"] for p in one(docs, "Service")["spec"]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert "metrics" in service_ports
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert [c["topologyKey"] for c in pod["topologySpreadConstraints"]] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]


def test_inline_tokens_and_insecure_reach_the_config():
    docs = manifests(render({"auth": {"tokens": "admin:s3cret\n"}}))
    secret = next(s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == "demo-switchyard")
    assert secret["stringData"]["tokens"] == "admin:s3cret\n"
    assert one(docs, "ConfigMap")["data"]["SWITCHYARD_TOKENS_FILE"] == "/etc/switchyard/tokens/tokens"
    docs = manifests(render({"auth": {"insecure": True}, "metrics": {"enabled": False}}))
    config = one(docs, "ConfigMap")["data"]
    assert config["SWITCHYARD_INSECURE"] == "true"
    assert "SWITCHYARD_METRICS_LISTEN" not in config
    assert {p["name"] for p in one(docs, "Service")["spec"]["ports"]} == {"grpc"}


def test_notes_show_grpcurl_commands():
    notes = render()["switchyard/templates/NOTES.txt"]
    assert "kubectl -n switchyard port-forward svc/demo-switchyard 50051:50051" in notes
    assert "grpc.health.v1.Health/Check" in notes
    assert "switchyard.v1.TaskService/SubmitTask" in notes
    assert "WARNING: no API tokens" in notes


# --- the schema rejects bad values ---------------------------------------

BAD_VALUES = {
    "zero replicas": {"replicaCount": 0},
    "replicas as text": {"replicaCount": "two"},
    "unknown top-level key (a typo)": {"replicas": 3},
    "unknown server setting": {"server": {"listen": "0.0.0.0:1"}},
    "SQLite database for replicas": {"database": {"url": "sqlite://switchyard.db"}},
    "no database at all": {"database": {"url": "", "existingSecret": ""}},
    "bad Secret name": {"database": {"existingSecret": "Not_A_Name"}},
    "port out of range": {"server": {"grpcPort": 70000}},
    "metrics port zero": {"metrics": {"port": 0}},
    "unknown log format": {"server": {"logFormat": "xml"}},
    "unknown pull policy": {"image": {"pullPolicy": "Sometimes"}},
    "negative lease TTL": {"server": {"leaseTtlMs": -1}},
    "heartbeat as text": {"server": {"heartbeatIntervalMs": "5s"}},
    "insecure as a string": {"auth": {"insecure": "yes"}},
    "grace period too short to drain": {"terminationGracePeriodSeconds": 1},
    "preStop sleep too long": {"preStopSleepSeconds": 600},
    "CPU target over 100%": {"autoscaling": {"targetCPUUtilizationPercentage": 150}},
    "bad scrape interval": {"metrics": {"serviceMonitor": {"interval": "often"}}},
    "unknown service type": {"service": {"type": "ExternalName"}},
    "env entry without a name": {"extraEnv": [{"value": "x"}]},
}


@pytest.mark.parametrize("label", BAD_VALUES)
def test_schema_rejects(label):
    chart = helm.Chart.load(CHART)
    values = BAD_VALUES[label]
    with pytest.raises(helm.HelmValuesError) as err:
        chart.validate_schema(chart.merge_values(values))
    print(f"{label}: {str(err.value).strip().splitlines()[-1]}")
    # An install would refuse them too.
    with pytest.raises(helm.HelmValuesError):
        render(values)


def test_default_and_ha_values_pass_the_schema():
    chart = helm.Chart.load(CHART)
    chart.validate_schema(chart.merge_values(None))
    chart.validate_schema(chart.merge_values(ha_values()))


def test_autoscaler_bounds_are_checked_at_render():
    with pytest.raises(helm.HelmRenderError, match="minReplicas must not exceed"):
        render({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}})


# --- yamllint -------------------------------------------------------------


def yamllint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(YAMLLINT_CONFIG), *args],
        capture_output=True,
        text=True,
    )


def test_yamllint_on_the_charts_plain_yaml():
    # Templates are Go templates, not YAML: they are linted as rendered below.
    files = [CHART / "Chart.yaml", CHART / "values.yaml", *sorted((CHART / "ci").glob("*.yaml"))]
    result = yamllint(*map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", CASES)
def test_yamllint_on_the_rendered_manifests(case, tmp_path):
    values, name = CASES[case]
    for path, text in render(values, name).items():
        if path.endswith(".yaml") and text.strip():
            out = tmp_path / pathlib.Path(path).name
            out.write_text(text.lstrip("\n"))
    result = yamllint(str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
