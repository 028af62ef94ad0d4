"""The CLI speaks the ecosystem's JSON: `switchyard --output json` prints, for `get`, `list` and `agents
list`, exactly the document grpcurl prints for the same call (canonical proto3 JSON: lowerCamelCase
names, enum value names, 64-bit integers as strings, RFC 3339 times), compared as parsed JSON. And
grpcurl decodes the error details our errors carry (google.rpc.BadRequest), which it could not while
reflection left their descriptors out.

Real binaries throughout: the server on an ephemeral port over a fresh SQLite file, the Rust agent
running the README's demo agent directory, grpcurl from the project venv."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
SERVER = os.environ.get("SWITCHYARD_SERVER_BIN", str(TARGET / "debug" / "switchyard-server"))
AGENT = os.environ.get("SWITCHYARD_AGENT_BIN", str(TARGET / "debug" / "switchyard-agent"))
CLI = os.environ.get("SWITCHYARD_CLI_BIN", str(pathlib.Path(SERVER).with_name("switchyard")))
GRPCURL = str(ROOT / ".venv" / "bin" / "grpcurl")
DEADLINE = 30.0


def _until(what: str, check):
    """Polls `check` until it returns something truthy, up to DEADLINE."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {DEADLINE}s")


@pytest.fixture(scope="module")
def server():
    work = tempfile.mkdtemp()
    out = open(os.path.join(work, "stdout"), "w+")
    proc = subprocess.Popen(
        [SERVER, "--listen", "127.0.0.1:0", "--database-url", f"sqlite://{work}/db"],
        stdout=out,
        stderr=subprocess.DEVNULL,
    )

    def address():
        with open(out.name) as f:
            for line in f:
                if line.startswith("switchyard-server listening on "):
                    return line.split()[-1]
        assert proc.poll() is None, "the server exited"
        return None

    addr = _until("the server listens", address)
    yield addr
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=DEADLINE)


def cli(addr: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLI, "--server", f"http://{addr}", "--output", "json", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=check,
    )


def grpcurl(addr: str, method: str, request: dict, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GRPCURL, "-plaintext", "-d", json.dumps(request), addr, method],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=check,
    )


@pytest.fixture(scope="module")
def fleet(server):
    """A task run to success by the demo agent, one parked, and the agent stopped (offline), so
    nothing changes between the two calls compared."""
    agent = subprocess.Popen(
        [AGENT, "--server", f"http://{server}", "--dir", str(ROOT / "examples" / "demo-agent"),
         "--allow-exec", "--name", "json-agent"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        payload = os.path.join(tempfile.mkdtemp(), "job.json")
        with open(payload, "w") as f:
            json.dump({"argv": ["echo", "hello"]}, f)
        done = cli(server, "submit", "exec", "--require", "demo", "--payload", payload, "--wait")
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert lines[-1]["task"]["state"] == "TASK_STATE_SUCCEEDED", lines[-1]
        parked = json.loads(cli(server, "submit", "build", "--require", "gpu").stdout)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=DEADLINE)

    def offline():
        agents = json.loads(cli(server, "agents", "list").stdout).get("agents", [])
        return agents and all(a["status"] == "AGENT_STATUS_OFFLINE" for a in agents)

    _until("the agent is offline", offline)
    return {"done": lines[0]["task"]["taskId"], "parked": parked["task"]["taskId"]}


@pytest.mark.parametrize("which", ["done", "parked"])
def test_get_is_grpcurls_get_task(server, fleet, which):
    task_id = fleet[which]
    ours = json.loads(cli(server, "get", task_id).stdout)
    theirs = json.loads(grpcurl(server, "switchyard.v1.TaskService/GetTask", {"task_id": task_id}).stdout)
    assert ours == theirs


def test_list_is_grpcurls_list_tasks(server, fleet):
    ours = json.loads(cli(server, "list").stdout)
    theirs = json.loads(
        grpcurl(server, "switchyard.v1.TaskService/ListTasks", {"namespace": "default", "page_size": 50}).stdout
    )
    assert len(ours["tasks"]) == 2
    assert ours == theirs


def test_agents_list_is_grpcurls_list_agents(server, fleet):
    ours = json.loads(cli(server, "agents", "list").stdout)
    theirs = json.loads(
        grpcurl(
            server, "switchyard.v1.AgentAdminService/ListAgents", {"namespace": "default", "page_size": 1000}
        ).stdout
    )
    assert [a["name"] for a in ours["agents"]] == ["json-agent"]
    assert ours == theirs


def test_grpcurl_decodes_the_error_details(server):
    refused = grpcurl(
        server,
        "switchyard.v1.TaskService/SubmitTask",
        {"kind": "exec", "placement": {"selector": "memory.total>="}},
        check=False,
    )
    assert refused.returncode != 0
    assert "not recognized" not in refused.stderr, refused.stderr
    assert '"@type":"type.googleapis.com/google.rpc.BadRequest"' in refused.stderr.replace(" ", ""), refused.stderr
    assert '"field":"placement.selector"' in refused.stderr.replace(" ", ""), refused.stderr
