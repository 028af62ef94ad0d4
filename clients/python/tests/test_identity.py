"""Who a runner is: its agent directory, canonical from the moment the config is made (relative
paths, symlinks, missing directories), and its default name, ``{hostname}-python-{h}``, checked
against ``tests/conformance/naming.json`` and against a real server, where two runners on one host
are two agents."""

from __future__ import annotations

import json
import pathlib
import re
import socket
import subprocess
import sys

import pytest

from helpers import Client, make_runner, running
from switchyard_runner import Runner, RunnerConfig
from switchyard_runner.capabilities import Capabilities
from switchyard_runner.core.tier import Tier
from switchyard_runner.identity import AgentDirectoryError, agent_dir, default_agent_name
from switchyard_runner.v1 import agent_pb2

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "tests" / "conformance" / "naming.json"

SCRIPT = "def getCapabilities(static):\n    return {'from_script': static.get('tier', 'none')}\n"


def agent_tree(root: pathlib.Path) -> pathlib.Path:
    """``root/agents/a`` with a static tier and a dynamic script that reads it."""
    agent = root / "agents" / "a"
    agent.mkdir(parents=True)
    (agent / ".capabilities.json").write_text(json.dumps({"tier": "static"}))
    (agent / ".capabilities.dynamic.py").write_text(SCRIPT)
    return agent


@pytest.mark.parametrize("case", json.loads(VECTORS.read_text(encoding="utf-8")), ids=lambda c: c["name"])
def test_default_names_match_the_conformance_vectors(case: dict) -> None:
    assert default_agent_name(case["hostname"], case["runner"], case["dir"]) == case["name"]


def test_a_missing_directory_or_a_file_is_an_error_naming_it(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(AgentDirectoryError, match=re.escape(f"agent directory {missing}: No such file or directory")):
        RunnerConfig(directory=missing)
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(AgentDirectoryError, match=re.escape(f"agent directory {file}: not a directory")):
        Runner(directory=str(file))
    with pytest.raises(AgentDirectoryError):
        Capabilities(missing)


def test_the_directory_is_made_canonical_once_where_the_config_is_made(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = agent_tree(tmp_path)
    (tmp_path / "link").symlink_to(agent)
    monkeypatch.chdir(tmp_path)
    assert RunnerConfig(directory="agents/a").directory == agent.resolve()
    assert RunnerConfig(directory="link").directory == agent.resolve()
    monkeypatch.setenv("SWITCHYARD_AGENT_DIR", "link")
    config = RunnerConfig.from_env()
    assert config.directory == agent.resolve() and config.directory.is_absolute()
    assert Runner(config).capabilities.directory == agent.resolve()


async def test_a_relative_directory_runs_its_dynamic_script(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent_tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    for directory in (RunnerConfig(directory="agents/a").directory, "agents/a"):
        caps = await Capabilities(directory).load()
        assert caps.merged.rejections == []
        assert caps.document["from_script"] == "static"
        assert caps.merged.provenance["from_script"] == Tier.DYNAMIC


def test_the_cli_takes_a_relative_directory_and_refuses_a_missing_one(tmp_path: pathlib.Path) -> None:
    agent_tree(tmp_path)
    cli = [sys.executable, "-m", "switchyard_runner"]
    out = subprocess.run([*cli, "--dir", "agents/a", "capabilities"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["from_script"] == "static"
    for args in (["--dir", "agents/missing", "capabilities"], ["run", "--dir", "agents/missing", "--server", "127.0.0.1:9"]):
        out = subprocess.run([*cli, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2
        assert out.stdout == ""
        assert out.stderr.splitlines() == [
            "python -m switchyard_runner: agent directory agents/missing: No such file or directory"
        ]


async def test_the_default_name_is_the_host_the_runner_and_the_directory(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = agent_tree(tmp_path)
    runner = Runner(directory=agent)
    assert runner.name == default_agent_name(socket.gethostname(), "python", str(agent.resolve()))
    assert runner.name.startswith(f"{socket.gethostname()}-python-") and len(runner.name.rsplit("-", 1)[1]) == 6
    assert Runner(directory=agent, name="explicit").name == "explicit"
    # A tier that sets the hostname names the agent, as in the Rust agent and the Node runner.
    (agent / ".capabilities.override.json").write_text(json.dumps({"hostname": "tier-host"}))
    renamed = Runner(directory=agent)
    await renamed.capabilities.load()
    assert renamed.name == default_agent_name("tier-host", "python", str(agent.resolve()))
    (agent / ".capabilities.override.json").unlink()
    monkeypatch.setenv("SWITCHYARD_AGENT_NAME", "from-env")
    assert Runner(RunnerConfig.from_env(directory=agent)).name == "from-env"
    # Without a directory the name comes from the working directory.
    monkeypatch.chdir(agent)
    assert Runner().name == runner.name


async def test_two_runners_on_one_host_are_two_agents(server_address: str, client: Client, tmp_path: pathlib.Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    first, second = (make_runner(server_address, d, name=None) for d in dirs)
    async with running(first), running(second):
        names = [default_agent_name(socket.gethostname(), "python", agent_dir(d)) for d in dirs]
        for name in names:
            await client.agent_until(lambda a: a.status == agent_pb2.AGENT_STATUS_READY, name, timeout=5)
        assert sorted(a.name for a in await client.agents()) == sorted(names)
        assert first.agent_id != second.agent_id
