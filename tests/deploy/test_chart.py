"""The Helm charts at deploy/helm/switchyard (the server) and
deploy/helm/switchyard-agent (agents), through the official Helm SDK (PyPI
``helm-python-sdk``: Helm 4's Go SDK behind a C ABI, no helm binary):

- ``helm lint --strict`` is clean with every values file under each chart's
  ``ci/``;
- each renders, and every rendered manifest validates with
  ``kubernetes-validate --strict`` against a current Kubernetes version;
- the rendered manifests say what the deployment needs (gRPC probes, Secrets,
  hooks, autoscaling, metrics, generated tokens, TLS, agents);
- values that could only crash-loop (no image, no tokens, TLS without a
  certificate, an agent without a server) fail at render time, saying what to
  do;
- the flags and variables the charts set are the binaries' own (read from
  their clap definitions);
- ``values.schema.json`` rejects bad values, one test per mistake;
- yamllint passes on the charts' plain YAML and on the rendered manifests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "switchyard"
AGENT_CHART = REPO / "deploy" / "helm" / "switchyard-agent"
HA_VALUES = CHART / "ci" / "ha-values.yaml"
SERVER_CONFIG_RS = REPO / "server" / "src" / "config.rs"
AGENT_MAIN_RS = REPO / "agent-rs" / "src" / "main.rs"
YAMLLINT_CONFIG = REPO / "deploy" / ".yamllint"
# A current Kubernetes: the newest schemas kubernetes-validate ships.
KUBE_VERSION = kubernetes_validate.latest_version()
# Kinds from CRDs have no schema in kubernetes-validate; checked by hand below.
CRD_KINDS = {"ServiceMonitor"}


# The one value the server chart has no default for.
IMAGE = {"image": {"repository": "registry.example.com/switchyard"}}
# The agent chart's required values.
AGENT_BASE = {
    **IMAGE,
    "server": {"url": "http://demo-switchyard.switchyard.svc:50051"},
    "token": {"secretName": "demo-switchyard-tokens"},
}


def ha_values() -> dict[str, Any]:
    return yaml.safe_load(HA_VALUES.read_text())


def ci_values(chart: pathlib.Path, case: str) -> dict[str, Any]:
    return yaml.safe_load((chart / "ci" / f"{case}-values.yaml").read_text())


def merge(base: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    """``extra`` over ``base``, maps merged key by key (as Helm does)."""
    out = dict(base)
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def render(
    values: dict[str, Any] | None = None, name: str = "demo", chart_dir: pathlib.Path = CHART
) -> dict[str, str]:
    """Renders the server chart over ``IMAGE`` (pass a full set to
    ``render_exact`` to leave the image out)."""
    return render_exact(merge(IMAGE, values), name, chart_dir)


def render_exact(
    values: dict[str, Any] | None, name: str = "demo", chart_dir: pathlib.Path = CHART
) -> dict[str, str]:
    chart = helm.Chart.load(chart_dir)
    return chart.render(values, name=name, namespace="switchyard", is_install=True)


def render_agent(values: dict[str, Any] | None = None, name: str = "agents") -> dict[str, str]:
    return render_exact(merge(AGENT_BASE, values), name, AGENT_CHART)


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


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    """A Secret's keys as the API server stores them (stringData merged into data)."""
    data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
    return {**data, **secret.get("stringData", {})}


def container_of(docs: list[dict[str, Any]], kind: str = "Deployment") -> tuple[dict[str, Any], dict[str, Any]]:
    pod = one(docs, kind)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def file_behind(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The volume a file path in the container comes from, and the key of
    that volume's Secret or ConfigMap projected to the path."""
    for mount in container["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            source = volume.get("secret") or volume.get("configMap")
            rest = path[len(prefix) :]
            for item in source.get("items", []):
                if item["path"] == rest:
                    return volume, item["key"]
            assert "items" not in source, f"{path}: no item projects {rest}"
            return volume, rest
    raise AssertionError(f"{path} is on no mounted volume")


# Every values file under ci/, by chart: the cases lint, validation and
# yamllint run over.
CASES = {
    "minimal": (ci_values(CHART, "minimal"), "demo"),
    "ha": (ha_values(), "ha"),
    "tls": (ci_values(CHART, "tls"), "demo"),
}
AGENT_CASES = {
    "deployment": ci_values(AGENT_CHART, "deployment"),
    "daemonset": ci_values(AGENT_CHART, "daemonset"),
}


def test_every_ci_values_file_is_a_case():
    assert {p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml")} == set(CASES)
    assert {p.name.removesuffix("-values.yaml") for p in (AGENT_CHART / "ci").glob("*-values.yaml")} == set(
        AGENT_CASES
    )


# --- lint -----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_lint_is_clean(case):
    values, _ = CASES[case]
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [], report
    assert report["messages"] == [], report


@pytest.mark.parametrize("case", AGENT_CASES)
def test_agent_chart_lint_is_clean(case):
    report = helm.lint(AGENT_CHART, AGENT_CASES[case], strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [], report
    assert report["messages"] == [], report


# --- render and validate --------------------------------------------------


def validate_all(case: str, docs: list[dict[str, Any]]) -> None:
    assert docs
    checked = []
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        # Raises ValidationError (with the path) on any unknown or wrong field.
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        checked.append(f"{doc['kind']}/{doc['metadata']['name']}")
    print(f"{case}: {len(checked)} manifests valid for Kubernetes {KUBE_VERSION}: {', '.join(checked)}")


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_manifest_validates_strictly(case):
    values, name = CASES[case]
    validate_all(case, manifests(render_exact(values, name)))


@pytest.mark.parametrize("case", AGENT_CASES)
def test_every_rendered_agent_manifest_validates_strictly(case):
    validate_all(case, manifests(render_exact(AGENT_CASES[case], "agents", AGENT_CHART)))


def test_default_render_has_the_pieces():
    docs = manifests(render())
    kinds = sorted(d["kind"] for d in docs)
    # Secrets: the release's (database URL), the migration hook's, the
    # generated tokens.
    assert kinds == sorted(
        ["ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service", "ServiceAccount", *["Secret"] * 3]
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
    assert config["SWITCHYARD_TOKENS_FILE"] == "/etc/switchyard/tokens/tokens"
    assert "SWITCHYARD_INSECURE" not in config
    assert container["args"] == ["serve"]
    assert container["image"] == "registry.example.com/switchyard:0.1.0", "the tag follows appVersion"
    # The URL reaches the server from a Secret, never the ConfigMap.
    (db_env,) = [e for e in container["env"] if e["name"] == "SWITCHYARD_DATABASE_URL"]
    assert db_env["valueFrom"]["secretKeyRef"] == {"name": "demo-switchyard", "key": "database-url"}
    assert not any("postgres://" in str(v) for v in config.values())
    service = one(docs, "Service")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"grpc": 50051, "metrics": 9090}
    assert service["spec"]["ports"][0]["appProtocol"] == "kubernetes.io/h2c"


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
    tokens = json.dumps([{"name": "admin", "namespace": "default", "role": "operator", "token": "s3cret"}])
    docs = manifests(render({"auth": {"tokens": tokens}}))
    secret = next(s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == "demo-switchyard")
    assert secret["stringData"]["tokens"] == tokens
    assert one(docs, "ConfigMap")["data"]["SWITCHYARD_TOKENS_FILE"] == "/etc/switchyard/tokens/tokens"
    assert "demo-switchyard-tokens" not in [s["metadata"]["name"] for s in by_kind(docs, "Secret")]
    docs = manifests(render({"auth": {"insecure": True}, "metrics": {"enabled": False}}))
    config = one(docs, "ConfigMap")["data"]
    assert config["SWITCHYARD_INSECURE"] == "true"
    assert "SWITCHYARD_TOKENS_FILE" not in config
    assert "demo-switchyard-tokens" not in [s["metadata"]["name"] for s in by_kind(docs, "Secret")]
    assert "SWITCHYARD_METRICS_LISTEN" not in config
    assert {p["name"] for p in one(docs, "Service")["spec"]["ports"]} == {"grpc"}


def test_the_console_is_off_by_default_and_one_value_turns_it_on():
    config = one(manifests(render({})), "ConfigMap")["data"]
    assert "SWITCHYARD_CONSOLE_LISTEN" not in config
    docs = manifests(render({"console": {"enabled": True, "port": 8088}}))
    assert one(docs, "ConfigMap")["data"]["SWITCHYARD_CONSOLE_LISTEN"] == "0.0.0.0:8088"
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "console", "containerPort": 8088, "protocol": "TCP"} in container["ports"]
    ports = {p["name"]: p for p in one(docs, "Service")["spec"]["ports"]}
    assert ports["console"]["port"] == 8088 and ports["console"]["targetPort"] == "console"
    notes = render({"console": {"enabled": True, "port": 8088}})["switchyard/templates/NOTES.txt"]
    assert "port-forward svc/demo-switchyard 8088:8088" in notes
    assert "console" not in render()["switchyard/templates/NOTES.txt"]


def test_notes_show_grpcurl_commands():
    notes = render()["switchyard/templates/NOTES.txt"]
    assert "kubectl -n switchyard port-forward svc/demo-switchyard 50051:50051" in notes
    assert "grpc.health.v1.Health/Check" in notes
    assert "switchyard.v1.TaskService/SubmitTask" in notes
    assert "CONN=(-plaintext)" in notes
    assert "http://demo-switchyard.switchyard.svc:50051" in notes
    notes = render({"auth": {"insecure": True}})["switchyard/templates/NOTES.txt"]
    assert "WARNING: auth.insecure=true" in notes


# --- the image: nothing publishes it ---------------------------------------


def test_no_image_repository_fails_saying_how_to_build_it():
    for chart_dir, values in ((CHART, None), (AGENT_CHART, {**AGENT_BASE, "image": {"repository": ""}})):
        with pytest.raises(helm.HelmRenderError) as err:
            render_exact(values, chart_dir=chart_dir)
        message = str(err.value)
        assert "image.repository is required" in message, message
        assert "docker build -t REGISTRY/switchyard:0.1.0 ." in message, message
        assert "docker push REGISTRY/switchyard:0.1.0" in message, message
    # The chart's default names no registry.
    assert helm.Chart.load(CHART).values["image"]["repository"] == ""
    assert helm.Chart.load(AGENT_CHART).values["image"]["repository"] == ""


def test_one_version_across_the_charts_and_the_workspace():
    cargo = (REPO / "Cargo.toml").read_text()
    (workspace,) = re.findall(r'^\[workspace\.package\][^\[]*?^version = "([^"]+)"', cargo, re.M | re.S)
    for chart_dir in (CHART, AGENT_CHART):
        meta = helm.Chart.load(chart_dir).metadata
        assert meta["version"] == meta["appVersion"] == workspace == "0.1.0", meta


# --- tokens: generated, kept, or a clear failure ---------------------------

TOKEN = re.compile(r"^sy_[0-9a-f]{64}$")


def generated_secret(docs: list[dict[str, Any]], name: str = "demo-switchyard-tokens") -> dict[str, str]:
    (secret,) = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == name]
    assert secret["type"] == "Opaque"
    assert "helm.sh/hook" not in secret["metadata"].get("annotations", {}), "a release resource, kept on upgrade"
    return secret_data(secret)


def check_tokens_file(data: dict[str, str], namespace: str = "default") -> None:
    """The file is what server/src/auth.rs reads: a JSON list of {name,
    namespace, role, sha256}, here the SHA-256 of the Secret's tokens."""
    entries = json.loads(data["tokens"])
    assert [e["role"] for e in entries] == ["operator", "agent"]
    for entry in entries:
        assert set(entry) == {"name", "namespace", "role", "sha256"}, "only the hash reaches the server"
        assert entry["namespace"] == namespace
        token = data[f"{entry['role']}-token"]
        assert TOKEN.match(token), token
        assert entry["sha256"] == hashlib.sha256(token.encode()).hexdigest()
    assert len({e["name"] for e in entries}) == 2


def test_default_values_generate_a_token_secret_and_mount_it():
    docs = manifests(render())
    data = generated_secret(docs)
    assert set(data) == {"operator-token", "agent-token", "tokens"}
    check_tokens_file(data)
    assert data["operator-token"] != data["agent-token"]
    # The server reads the file, and only the file, from that Secret.
    pod, container = container_of(docs)
    tokens_file = one(docs, "ConfigMap")["data"]["SWITCHYARD_TOKENS_FILE"]
    volume, key = file_behind(pod, container, tokens_file)
    assert volume["secret"]["secretName"] == "demo-switchyard-tokens"
    assert key == "tokens"
    assert [i["key"] for i in volume["secret"]["items"]] == ["tokens"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True


def test_generated_tokens_are_fresh_per_render_and_bound_to_the_namespace_asked():
    # Without a cluster, `lookup` finds nothing: each render makes new tokens.
    first = generated_secret(manifests(render()))
    second = generated_secret(manifests(render({"auth": {"generate": {"namespace": "builds"}}})))
    assert first["operator-token"] != second["operator-token"]
    assert first["agent-token"] != second["agent-token"]
    check_tokens_file(second, namespace="builds")


def test_the_token_secret_looks_up_the_one_an_earlier_install_made():
    text = (CHART / "templates" / "tokens-secret.yaml").read_text()
    assert re.search(
        r'\$existing := lookup "v1" "Secret" \.Release\.Namespace \$name', text
    ), "the tokens Secret must be looked up"
    assert 'include "switchyard.generatedTokens" (dict "existing" $existing)' in text


def render_generated_tokens(tmp_path: pathlib.Path, existing: dict[str, Any]) -> dict[str, str]:
    """Renders the chart's own ``switchyard.generatedTokens`` and tokens-file
    helpers with ``existing`` standing in for what ``lookup`` returns on an
    upgrade (``helm template`` has no cluster to look up)."""
    chart = tmp_path / "switchyard"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-upgrade.yaml").write_text(
        "{{- $tokens := include \"switchyard.generatedTokens\" (dict \"existing\" (fromJson "
        + json.dumps(json.dumps(existing))
        + ")) | fromJson }}\n"
        "kind: Upgraded\n"
        "operator: {{ $tokens.operator | quote }}\n"
        "agent: {{ $tokens.agent | quote }}\n"
        "tokens: {{ include \"switchyard.generatedTokensFile\""
        " (dict \"tokens\" $tokens \"namespace\" \"default\") | quote }}\n"
    )
    out = yaml.safe_load(render(chart_dir=chart)["switchyard/templates/zz-upgrade.yaml"])
    return {"operator-token": out["operator"], "agent-token": out["agent"], "tokens": out["tokens"]}


def test_an_upgrade_keeps_the_tokens_already_in_the_secret(tmp_path):
    before = generated_secret(manifests(render()))
    existing = {
        "apiVersion": "v1",
        "kind": "Secret",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in before.items()},
    }
    after = render_generated_tokens(tmp_path / "full", existing)
    assert after["operator-token"] == before["operator-token"]
    assert after["agent-token"] == before["agent-token"]
    assert json.loads(after["tokens"]) == json.loads(before["tokens"])
    # A Secret missing a token (edited by hand) gets that one made afresh.
    del existing["data"]["agent-token"]
    partial = render_generated_tokens(tmp_path / "partial", existing)
    assert partial["operator-token"] == before["operator-token"]
    assert TOKEN.match(partial["agent-token"]) and partial["agent-token"] != before["agent-token"]
    check_tokens_file(partial)
    # Nothing found (first install, helm template): both are new.
    fresh = render_generated_tokens(tmp_path / "fresh", {})
    assert fresh["operator-token"] != before["operator-token"]
    check_tokens_file(fresh)


def test_existing_or_inline_tokens_generate_nothing():
    for auth in ({"existingSecret": "mine"}, {"tokens": "[]"}):
        docs = manifests(render({"auth": auth}))
        assert "demo-switchyard-tokens" not in [s["metadata"]["name"] for s in by_kind(docs, "Secret")]
        pod, container = container_of(docs)
        volume, _ = file_behind(pod, container, "/etc/switchyard/tokens/tokens")
        assert volume["secret"]["secretName"] == auth.get("existingSecret", "demo-switchyard")


def test_no_tokens_at_all_fails_at_render_instead_of_crash_looping():
    with pytest.raises(helm.HelmRenderError) as err:
        render({"auth": {"generate": {"enabled": False}}})
    message = str(err.value)
    assert "no API tokens" in message and "refuses to start" in message, message
    for way_out in ("auth.generate.enabled=true", "auth.existingSecret", "auth.tokens", "auth.insecure=true"):
        assert way_out in message, way_out


def test_notes_say_how_to_read_the_generated_tokens_without_showing_them():
    rendered = render()
    notes = rendered["switchyard/templates/NOTES.txt"]
    data = generated_secret(manifests(rendered))
    for key in ("operator-token", "agent-token"):
        assert (
            f"kubectl -n switchyard get secret demo-switchyard-tokens -o jsonpath='{{.data.{key}}}' | base64 -d"
            in notes
        )
        assert data[key] not in notes
    assert "--set token.secretName=demo-switchyard-tokens" in notes, "the agent chart's install line"
    assert "WARNING" not in notes


# --- TLS -------------------------------------------------------------------


def server_flags() -> set[str]:
    """The server's long flags: clap derives them from the config fields."""
    fields = re.findall(r"^\s*pub (\w+): ", SERVER_CONFIG_RS.read_text(), re.M)
    return {"--" + f.replace("_", "-") for f in fields}


def test_tls_values_pass_the_servers_tls_flags_and_mount_the_files():
    values, name = CASES["tls"]
    docs = manifests(render_exact(values, name))
    pod, container = container_of(docs)
    args = container["args"]
    assert args[0] == "serve"
    flags = dict(zip(args[1::2], args[2::2]))
    assert set(flags) == {"--tls-cert", "--tls-key", "--tls-client-ca"}
    assert set(flags) <= server_flags(), "flags the server does not have"
    expected = {
        "--tls-cert": ("switchyard-tls", "tls.crt"),
        "--tls-key": ("switchyard-tls", "tls.key"),
        "--tls-client-ca": ("switchyard-client-ca", "ca.crt"),
    }
    for flag, path in flags.items():
        volume, key = file_behind(pod, container, path)
        assert (volume["secret"]["secretName"], key) == expected[flag], flag
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True, flag
    # The TLS Secret is the standard kind: cert-manager's, or `kubectl create secret tls`.
    notes = render_exact(values, name)["switchyard/templates/NOTES.txt"]
    assert "https://demo-switchyard.switchyard.svc:50051" in notes
    assert "-cacert ca.pem -servername demo-switchyard.switchyard.svc -cert client.pem -key client.key" in notes
    assert "-plaintext" not in notes
    assert "--set tls.ca.secretName=" in notes and "--set tls.clientCert.secretName=" in notes


def test_tls_without_a_client_ca_is_not_mtls():
    docs = manifests(render({"tls": {"enabled": True, "secretName": "switchyard-tls"}}))
    pod, container = container_of(docs)
    assert container["args"] == [
        "serve",
        "--tls-cert",
        "/etc/switchyard/tls/tls.crt",
        "--tls-key",
        "/etc/switchyard/tls/tls.key",
    ]
    assert "client-ca" not in [v["name"] for v in pod["volumes"]]
    # TLS settings reach the server as flags, not SWITCHYARD_TLS_* variables
    # (which `switchyard`, run in the pod by kubectl exec, would read as its
    # own client certificate).
    assert not any(k.startswith("SWITCHYARD_TLS") for k in one(docs, "ConfigMap")["data"])


def test_probes_still_work_with_tls():
    values, name = CASES["tls"]
    docs = manifests(render_exact(values, name))
    _, container = container_of(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # The kubelet's gRPC probe speaks plaintext only: none may target the TLS port.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert "grpc" not in container[probe], probe
    assert container["startupProbe"]["tcpSocket"] == {"port": "grpc"}
    assert container["readinessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert set(ports) == {"grpc", "metrics"}
    # No cleartext HTTP/2 hint for meshes on a TLS port.
    grpc_port = next(p for p in one(docs, "Service")["spec"]["ports"] if p["name"] == "grpc")
    assert "appProtocol" not in grpc_port
    # Metrics off: liveness falls back to the gRPC port.
    docs = manifests(render({"tls": {"enabled": True, "secretName": "s"}, "metrics": {"enabled": False}}))
    _, container = container_of(docs)
    assert container["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert {p["name"] for p in container["ports"]} == {"grpc"}


BAD_TLS = {
    "enabled without a certificate": ({"tls": {"enabled": True}}, "tls.enabled needs tls.secretName"),
    "a certificate but not enabled": ({"tls": {"secretName": "s"}}, "tls.enabled is false"),
    "mTLS without TLS": ({"tls": {"clientCA": {"secretName": "ca"}}}, "needs tls.enabled=true"),
}


@pytest.mark.parametrize("label", BAD_TLS)
def test_inconsistent_tls_fails_at_render(label):
    values, message = BAD_TLS[label]
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values)


def test_server_variables_are_the_servers():
    known = set(re.findall(r'env = "(\w+)"', SERVER_CONFIG_RS.read_text())) | {"RUST_LOG"}
    for case, (values, name) in CASES.items():
        config = one(manifests(render_exact(values, name)), "ConfigMap")["data"]
        assert set(config) <= known, (case, set(config) - known)


# --- the agent chart -------------------------------------------------------


def agent_env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("case", AGENT_CASES)
def test_agent_chart_runs_the_agent_from_the_servers_image(case):
    values = AGENT_CASES[case]
    docs = manifests(render_exact(values, "agents", AGENT_CHART))
    kind = values.get("kind", "Deployment")
    assert sorted(d["kind"] for d in docs) == sorted(["ConfigMap", kind, "ServiceAccount"])
    workload = one(docs, kind)
    pod, container = container_of(docs, kind)
    assert container["image"] == "registry.example.com/switchyard:0.1.0"
    assert container["command"] == ["/usr/local/bin/switchyard-agent"]
    env = agent_env(container)
    assert env["SWITCHYARD_SERVER"] == values["server"]["url"]
    # Replicas never share a name: each registers as its pod.
    assert env["SWITCHYARD_AGENT_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    token = values["token"]
    assert env["SWITCHYARD_TOKEN"] == {
        "secretKeyRef": {"name": token["secretName"], "key": token.get("secretKey", "agent-token")}
    }
    # The agent directory is the ConfigMap, holding the capabilities asked for.
    config = one(docs, "ConfigMap")
    volume, _ = file_behind(pod, container, env["SWITCHYARD_AGENT_DIR"] + "/.capabilities.json")
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    assert json.loads(config["data"][".capabilities.json"]) == values["capabilities"]
    if "capabilitiesOverride" in values:
        assert json.loads(config["data"][".capabilities.override.json"]) == values["capabilitiesOverride"]
    else:
        assert ".capabilities.override.json" not in config["data"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    # Non-root, nothing to escalate, read-only root but a writable /tmp.
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert "/tmp" in [m["mountPath"] for m in container["volumeMounts"]]
    assert pod["automountServiceAccountToken"] is False
    assert pod["terminationGracePeriodSeconds"] > int(env["SWITCHYARD_GRACE_SECS"])
    if kind == "Deployment":
        assert workload["spec"]["replicas"] == values["replicaCount"]
        assert container["args"] == ["--label", "team=platform"]
        assert "SWITCHYARD_ALLOW_EXEC" not in env and "SWITCHYARD_CA_FILE" not in env
    else:
        assert "replicas" not in workload["spec"]
        assert pod["nodeSelector"] == values["nodeSelector"]
        assert pod["tolerations"] == values["tolerations"]
        assert env["SWITCHYARD_ALLOW_EXEC"] == "true"
        assert container["resources"] == values["resources"]
        for variable, (secret, key) in {
            "SWITCHYARD_CA_FILE": ("switchyard-ca", "ca.crt"),
            "SWITCHYARD_TLS_CERT": ("switchyard-agent-client-tls", "tls.crt"),
            "SWITCHYARD_TLS_KEY": ("switchyard-agent-client-tls", "tls.key"),
        }.items():
            volume, projected = file_behind(pod, container, env[variable])
            assert (volume["secret"]["secretName"], projected) == (secret, key), variable


@pytest.mark.parametrize("case", AGENT_CASES)
def test_agent_variables_are_the_agents(case):
    known = set(re.findall(r'env = "(\w+)"', AGENT_MAIN_RS.read_text())) | {"RUST_LOG"}
    values = AGENT_CASES[case]
    docs = manifests(render_exact(values, "agents", AGENT_CHART))
    _, container = container_of(docs, values.get("kind", "Deployment"))
    assert set(agent_env(container)) <= known, set(agent_env(container)) - known
    assert {"SWITCHYARD_SERVER", "SWITCHYARD_TOKEN", "SWITCHYARD_AGENT_DIR", "SWITCHYARD_AGENT_NAME"} <= known


def test_agent_token_defaults_to_the_server_charts_generated_secret():
    server = generated_secret(manifests(render(name="switchyard")), "switchyard-tokens")
    _, container = container_of(manifests(render_agent({"token": {"secretName": "switchyard-tokens"}})))
    ref = agent_env(container)["SWITCHYARD_TOKEN"]["secretKeyRef"]
    assert ref == {"name": "switchyard-tokens", "key": "agent-token"}
    assert ref["key"] in server
    # …bound to the namespace the agents serve by default.
    (agent_entry,) = [e for e in json.loads(server["tokens"]) if e["role"] == "agent"]
    assert agent_env(container)["SWITCHYARD_NAMESPACE"] == agent_entry["namespace"]
    assert agent_env(container)["SWITCHYARD_SERVER"] == "http://demo-switchyard.switchyard.svc:50051"


def test_agent_name_and_options_from_values():
    _, container = container_of(
        manifests(render_agent({"agentName": "build-1", "capacity": 4, "namespace": "builds", "replicaCount": 1}))
    )
    env = agent_env(container)
    assert env["SWITCHYARD_AGENT_NAME"] == "build-1"
    assert env["SWITCHYARD_CAPACITY"] == "4"
    assert env["SWITCHYARD_NAMESPACE"] == "builds"
    assert "args" not in container, "no labels, no arguments: the agent runs by default"
    _, container = container_of(manifests(render_agent({"token": {"secretName": "", "required": False}})))
    assert "SWITCHYARD_TOKEN" not in agent_env(container)


AGENT_FAILURES = {
    "no server URL": ({"server": {"url": ""}}, "server.url is required"),
    "no token Secret": ({"token": {"secretName": ""}}, "token.secretName is required"),
    "https without a CA": ({"server": {"url": "https://s.switchyard.svc:50051"}}, "needs tls.ca.secretName"),
    "a CA for an http URL": ({"tls": {"ca": {"secretName": "ca"}}}, "are for an https:// server.url"),
    "grace longer than the pod's": ({"graceSeconds": 60}, "must exceed graceSeconds"),
}


@pytest.mark.parametrize("label", AGENT_FAILURES)
def test_agent_chart_fails_clearly(label):
    values, message = AGENT_FAILURES[label]
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render_agent(values)


def test_agent_chart_without_a_server_url_fails_even_with_defaults():
    with pytest.raises(helm.HelmRenderError, match="server.url is required"):
        render_exact({**IMAGE, "token": {"secretName": "t"}}, chart_dir=AGENT_CHART)


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
    "tokens not a JSON list": {"auth": {"tokens": "admin:s3cret"}},
    "generate as a string": {"auth": {"generate": "yes"}},
    "unknown TLS key": {"tls": {"cert": "server.pem"}},
    "bad TLS Secret name": {"tls": {"enabled": True, "secretName": "Not_A_Name"}},
    "empty client CA key": {"tls": {"clientCA": {"key": ""}}},
}

AGENT_BAD_VALUES = {
    "a StatefulSet": {"kind": "StatefulSet"},
    "unknown top-level key (a typo)": {"allow_exec": True},
    "server URL without a scheme": {"server": {"url": "switchyard:50051"}},
    "negative capacity": {"capacity": -1},
    "label key with =": {"labels": {"a=b": "c"}},
    "bad token Secret name": {"token": {"secretName": "Not_A_Name"}},
    "unknown log format": {"logFormat": "xml"},
    "allowExec as a string": {"allowExec": "yes"},
    "unknown TLS key": {"tls": {"insecure": True}},
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


@pytest.mark.parametrize("label", AGENT_BAD_VALUES)
def test_agent_schema_rejects(label):
    chart = helm.Chart.load(AGENT_CHART)
    values = merge(AGENT_BASE, AGENT_BAD_VALUES[label])
    with pytest.raises(helm.HelmValuesError) as err:
        chart.validate_schema(chart.merge_values(values))
    print(f"{label}: {str(err.value).strip().splitlines()[-1]}")


def test_default_and_ci_values_pass_the_schema():
    chart = helm.Chart.load(CHART)
    chart.validate_schema(chart.merge_values(None))
    for values, _ in CASES.values():
        chart.validate_schema(chart.merge_values(values))
    agent = helm.Chart.load(AGENT_CHART)
    agent.validate_schema(agent.merge_values(None))
    for values in AGENT_CASES.values():
        agent.validate_schema(agent.merge_values(values))


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
    files = [
        path
        for chart in (CHART, AGENT_CHART)
        for path in (chart / "Chart.yaml", chart / "values.yaml", *sorted((chart / "ci").glob("*.yaml")))
    ]
    result = yamllint(*map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr


RENDERED = {
    **{case: (CHART, values, name) for case, (values, name) in CASES.items()},
    **{f"agent-{case}": (AGENT_CHART, values, "agents") for case, values in AGENT_CASES.items()},
}


@pytest.mark.parametrize("case", RENDERED)
def test_yamllint_on_the_rendered_manifests(case, tmp_path):
    chart_dir, values, name = RENDERED[case]
    for path, text in render_exact(values, name, chart_dir).items():
        if path.endswith(".yaml") and text.strip():
            out = tmp_path / pathlib.Path(path).name
            out.write_text(text.lstrip("\n"))
    result = yamllint(str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
