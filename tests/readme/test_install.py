"""The README's install lines, run from the README text itself (tests/readme/block.sh), so none can rot.

- `install-rust`: the `cargo install` lines, into a temporary root (CARGO_INSTALL_ROOT), then the
  installed binaries' `--version`. Each `cargo install` is given `--debug` and the suite's target
  directory, so it installs the debug build the suite already made instead of spending CI's two
  cores for five minutes on a release build; the paths, packages, `--locked` and the binaries
  installed are the README's (`scripts/release` builds the release profile).
- `install-agent-service`: `switchyard-agent … install` as written, with `sudo` and `systemctl`
  standing in (a shim that runs the command, one that records it), the unit and environment file
  redirected to a temporary directory (SWITCHYARD_UNIT_DIR, SWITCHYARD_ENV_FILE), the README's
  server and agent directory replaced by a real server and a temporary directory, as the grpcurl
  walkthrough replaces its address. Then the unit is started the way systemd would (its
  EnvironmentFile, WorkingDirectory and ExecStart) and the agent must register."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import signal
import stat
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
SERVER = os.environ.get("SWITCHYARD_SERVER_BIN", str(TARGET / "debug" / "switchyard-server"))
AGENT = os.environ.get("SWITCHYARD_AGENT_BIN", str(TARGET / "debug" / "switchyard-agent"))
CLI = os.environ.get("SWITCHYARD_CLI_BIN", str(pathlib.Path(SERVER).with_name("switchyard")))
DEADLINE = 30.0


def block(name: str) -> str:
    return subprocess.run(
        [str(ROOT / "tests" / "readme" / "block.sh"), name], check=True, capture_output=True, text=True
    ).stdout


def _until(what: str, check, deadline: float = DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {deadline}s")


def test_the_cargo_install_lines_install_the_three_binaries(tmp_path):
    script = block("install-rust")
    assert "cargo install --locked --path server" in script
    env = dict(os.environ)
    script = script.replace("cargo install ", "cargo install --debug ")
    env.update(
        CARGO_INSTALL_ROOT=str(tmp_path / "root"),
        CARGO_TARGET_DIR=str(TARGET),
        PATH=f"{tmp_path / 'root' / 'bin'}:{os.environ['PATH']}",
    )
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    version = re.search(r'^version = "(.*)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
    assert f"switchyard {version}" in done.stdout, done.stdout
    assert f"switchyard-agent {version}" in done.stdout, done.stdout
    installed = sorted(p.name for p in (tmp_path / "root" / "bin").iterdir())
    assert installed == ["switchyard", "switchyard-agent", "switchyard-server"], installed


@pytest.fixture
def server(tmp_path):
    out = open(tmp_path / "server.out", "w+")
    proc = subprocess.Popen(
        [SERVER, "--listen", "127.0.0.1:0", "--database-url", f"sqlite://{tmp_path}/db"],
        stdout=out, stderr=subprocess.DEVNULL,
    )

    def address():
        text = (tmp_path / "server.out").read_text()
        m = re.search(r"^switchyard-server listening on (\S+)$", text, re.M)
        assert proc.poll() is None, "the server exited"
        return m and m.group(1)

    yield _until("the server listens", address)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=DEADLINE)


def read_environment_file(path: pathlib.Path) -> dict[str, str]:
    """systemd's EnvironmentFile: KEY="value" lines, with \\ and \" escaped; # comments."""
    env = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        env[key] = shlex.split(value)[0] if value else ""
    return env


def test_the_agent_service_line_writes_a_unit_that_runs(tmp_path, server):
    script = block("install-agent-service")
    assert "switchyard-agent" in script and " install" in script
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (shims / "systemctl").write_text(f'#!/bin/sh\necho "$@" >>{tmp_path}/systemctl.log\n')
    os.symlink(AGENT, shims / "switchyard-agent")
    for shim in ("sudo", "systemctl"):
        (shims / shim).chmod(0o755)
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / ".capabilities.json").write_text(json.dumps({"tags": ["from-unit"]}))
    script = script.replace("https://switchyard.example:50051", f"http://{server}")
    script = script.replace("/srv/switchyard-agent", str(agent_dir))
    env = dict(os.environ)
    env.update(
        PATH=f"{shims}:{os.environ['PATH']}",
        SWITCHYARD_TOKEN="sy_readme_token_0123456789abcdef",
        SWITCHYARD_UNIT_DIR=str(tmp_path / "units"),
        SWITCHYARD_ENV_FILE=str(tmp_path / "etc" / "switchyard-agent.env"),
    )
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    unit = (tmp_path / "units" / "switchyard-agent.service").read_text()
    env_file = tmp_path / "etc" / "switchyard-agent.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert "sy_readme_token" not in unit, unit
    assert f"EnvironmentFile={env_file}" in unit, unit
    assert (tmp_path / "systemctl.log").read_text().split("\n")[:2] == [
        "daemon-reload", "enable --now switchyard-agent.service"]

    # Start it as systemd would.
    settings = read_environment_file(env_file)
    assert settings["SWITCHYARD_TOKEN"] == "sy_readme_token_0123456789abcdef"
    assert settings["SWITCHYARD_ALLOW_EXEC"] == "true"
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1).split()
    workdir = re.search(r"^WorkingDirectory=(.*)$", unit, re.M).group(1)
    assert pathlib.Path(workdir) == agent_dir.resolve()
    # The open server takes any token; the agent must not need more than the unit gives it.
    run_env = {"PATH": os.environ["PATH"], **settings}
    agent = subprocess.Popen(exec_start, cwd=workdir, env=run_env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        def registered():
            out = subprocess.run([CLI, "--server", f"http://{server}", "--output", "json", "agents", "list"],
                                 capture_output=True, text=True, timeout=DEADLINE)
            agents = json.loads(out.stdout or "{}").get("agents", [])
            return [a for a in agents if a["status"] == "AGENT_STATUS_READY"]
        (listed,) = _until("the unit's agent registers", registered)
        assert listed["handledKinds"] == ["exec"], listed
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=DEADLINE)
