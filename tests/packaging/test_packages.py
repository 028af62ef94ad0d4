"""The client packages as a user gets them, and the README's install lines and runner examples as
written.

``scripts/package-clients`` builds the wheel, the sdist and the npm tarball. Each is installed
into a fresh environment outside the source tree (a new venv, a new project directory), and an
example runner started from there takes an ``echo`` task from a real switchyard-server (one for
the module, SQLite in a temporary directory) and registers under the default name. The README's
blocks (``tests/readme/block.sh``) are run from the README's text: its install lines into a fresh
venv or project, its examples as the runners that take the task, so neither can rot.

Run from the project venv (``scripts/bootstrap``) with ``SWITCHYARD_SERVER_BIN`` (default
``target/debug/switchyard-server``); installing the packages' dependencies needs PyPI and the npm
registry.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator

import grpc
import pytest

from switchyard_runner import convert
from switchyard_runner.v1 import (
    agent_admin_service_pb2,
    agent_admin_service_pb2_grpc,
    task_pb2,
    task_service_pb2,
    task_service_pb2_grpc,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
TERMINAL = (task_pb2.TASK_STATE_SUCCEEDED, task_pb2.TASK_STATE_FAILED, task_pb2.TASK_STATE_CANCELED)
TASK_TIMEOUT = 60.0
"""Seconds a runner gets to take and finish its task (it starts, probes the machine, registers)."""


# ----- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """The three artefacts, by kind: ``wheel``, ``sdist``, ``npm``."""
    out = tmp_path_factory.mktemp("dist")
    built = run([str(REPO / "scripts" / "package-clients"), str(out)], cwd=REPO, timeout=300)
    paths = [pathlib.Path(line) for line in built.stdout.splitlines()]
    kinds = {"wheel": ".whl", "sdist": ".tar.gz", "npm": ".tgz"}
    found = {kind: next(p for p in paths if p.name.endswith(suffix)) for kind, suffix in kinds.items()}
    for path in found.values():
        assert path.is_file() and path.parent == out, path
    return found


class Server:
    """A switchyard-server child process and clients of it."""

    def __init__(self, directory: pathlib.Path):
        explicit = os.environ.get("SWITCHYARD_SERVER_BIN")
        binary = pathlib.Path(explicit) if explicit else REPO / "target" / "debug" / "switchyard-server"
        if not binary.exists():
            pytest.fail(f"{binary} not found: run `cargo build -p switchyard-server` first")
        self.proc = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:0", "--database-url", f"sqlite://{directory}/db"],
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("TEST_LOG") else subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.fullmatch(r"switchyard-server listening on (\S+)\n", line)
        assert match, f"unexpected first line from the server: {line!r}"
        self.address = match.group(1)
        self.channel = grpc.insecure_channel(self.address)
        self.tasks = task_service_pb2_grpc.TaskServiceStub(self.channel)
        self.admin = agent_admin_service_pb2_grpc.AgentAdminServiceStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("server"))
    try:
        yield s
    finally:
        s.stop()


# ----- helpers ---------------------------------------------------------------------------------


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Runs a command to completion; fails the test with its output when it fails."""
    kwargs.setdefault("timeout", 600)
    out = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if out.returncode != 0:
        pytest.fail(f"{command} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def readme_block(name: str) -> str:
    """The README block after ``<!-- readme:NAME -->``, as ``tests/readme/block.sh`` prints it."""
    return run([str(REPO / "tests" / "readme" / "block.sh"), name]).stdout


def clean_env(path_first: pathlib.Path | None = None, **extra: str) -> dict[str, str]:
    """The environment without the project venv (or any venv), optionally with ``path_first``
    first on ``PATH``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "NODE_PATH")}
    project_bin = str(REPO / ".venv" / "bin")
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != project_bin]
    if path_first is not None:
        path.insert(0, str(path_first))
    env["PATH"] = os.pathsep.join(path)
    env.update(extra)
    return env


def fresh_venv(directory: pathlib.Path) -> tuple[pathlib.Path, dict[str, str]]:
    """A new venv at ``directory``: its Python, and an environment with it active."""
    run([sys.executable, "-m", "venv", str(directory)])
    return directory / "bin" / "python", clean_env(directory / "bin", VIRTUAL_ENV=str(directory))


def pip_install(python: pathlib.Path, env: dict[str, str], *args: str) -> None:
    run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args], env=env)


def assert_imported_from(python: pathlib.Path, env: dict[str, str], venv: pathlib.Path, cwd: pathlib.Path) -> None:
    """``switchyard_runner`` (and its stubs) import from the venv's site-packages, not the source."""
    out = run(
        [str(python), "-c", "import switchyard_runner, switchyard_runner.v1.task_service_pb2_grpc as s;"
         "print(switchyard_runner.__file__)"],
        env=env, cwd=cwd,
    )
    location = pathlib.Path(out.stdout.strip()).resolve()
    assert location.is_relative_to(venv.resolve()), location
    assert "site-packages" in location.parts, location


def npm_project(directory: pathlib.Path) -> pathlib.Path:
    """A new, empty npm project."""
    directory.mkdir()
    (directory / "package.json").write_text(json.dumps({"name": "runner-project", "private": True, "type": "module"}))
    return directory


def assert_installed_copy(project: pathlib.Path) -> None:
    """``@switchyard/runner`` is in the project as a copy (not a link into the checkout)."""
    installed = project / "node_modules" / "@switchyard" / "runner"
    assert installed.is_dir() and not installed.is_symlink(), installed
    assert not installed.resolve().is_relative_to(REPO), installed.resolve()
    assert json.loads((installed / "package.json").read_text())["version"] == project_version()


def project_version() -> str:
    return tomllib.loads((REPO / "clients" / "python" / "pyproject.toml").read_text())["project"]["version"]


def expected_name(runner: str, agent_dir: pathlib.Path) -> str:
    """The default agent name (tests/conformance/naming.json), computed independently."""
    digest = hashlib.sha256(os.path.realpath(agent_dir).encode("utf-8")).hexdigest()[:6]
    return f"{socket.gethostname()}-{runner}-{digest}"


def await_terminal(server: Server, task_id: str, runner: subprocess.Popen, log: pathlib.Path) -> task_pb2.Task:
    """Follows WatchTask until the task is terminal, within :data:`TASK_TIMEOUT`; fails at once
    when the runner exits first. The watch is taken in windows of two seconds so that a dead
    runner is noticed between them."""
    deadline = time.monotonic() + TASK_TIMEOUT
    while True:
        window = min(2.0, deadline - time.monotonic())
        if window <= 0:
            pytest.fail(f"task {task_id} not finished within {TASK_TIMEOUT}s; runner log:\n{log.read_text()}")
        try:
            for item in server.tasks.WatchTask(task_service_pb2.WatchTaskRequest(task_id=task_id), timeout=window):
                if item.task.state in TERMINAL:
                    break
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        task = server.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id), timeout=5).task
        if task.state in TERMINAL:
            return task
        if runner.poll() is not None:
            pytest.fail(f"the runner exited {runner.returncode} before the task ended; its log:\n{log.read_text()}")


def serve_one_echo(
    server: Server, command: list[str], cwd: pathlib.Path, env: dict[str, str], runner: str, tmp_path: pathlib.Path
) -> None:
    """Starts ``command`` as a runner in its own agent directory, submits an ``echo`` task, and
    checks that the runner, registered under its default name, returns the payload; then SIGTERM
    drains it to exit 0."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    log = tmp_path / "runner.log"
    env = dict(env, SWITCHYARD_SERVER=f"http://{server.address}", SWITCHYARD_AGENT_DIR=str(agent_dir),
               SWITCHYARD_GRACE_SECS="5")
    env.pop("SWITCHYARD_AGENT_NAME", None)
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        payload = {"hello": runner, "id": uuid.uuid4().hex}
        submitted = server.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(kind="echo", payload=convert.to_struct(payload)), timeout=5
        ).task
        done = await_terminal(server, submitted.task_id, proc, log)
        assert done.state == task_pb2.TASK_STATE_SUCCEEDED, (task_pb2.TaskState.Name(done.state), done.error.message)
        assert payload in convert.from_struct(done.result).values(), convert.from_struct(done.result)
        events = server.tasks.ListTaskEvents(
            task_service_pb2.ListTaskEventsRequest(task_id=submitted.task_id), timeout=5
        ).events
        [agent_id] = {e.agent_id for e in events if e.kind == "leased"}
        agent = server.admin.GetAgent(agent_admin_service_pb2.GetAgentRequest(agent_id=agent_id), timeout=5).agent
        assert agent.name == expected_name(runner, agent_dir)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ----- the tests -------------------------------------------------------------------------------


def test_one_version_across_the_project(dist: dict[str, pathlib.Path]) -> None:
    version = project_version()
    # scripts/version checks every place that carries it (Cargo, both packages and the Node lock,
    # each runner's own version, the charts, the changelog).
    checked = subprocess.run([str(REPO / "scripts" / "version")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == version
    assert {p.name for p in dist.values()} == {
        f"switchyard_runner-{version}-py3-none-any.whl", f"switchyard_runner-{version}.tar.gz",
        f"switchyard-runner-{version}.tgz",
    }


def test_the_wheel_installs_into_a_fresh_venv_and_its_example_takes_a_task(
    dist: dict[str, pathlib.Path], server: Server, tmp_path: pathlib.Path
) -> None:
    venv = tmp_path / "venv"
    python, env = fresh_venv(venv)
    pip_install(python, env, str(dist["wheel"]))
    assert_imported_from(python, env, venv, tmp_path)
    refused = subprocess.run(
        [str(venv / "bin" / "switchyard-runner"), "--dir", "missing", "capabilities"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert (refused.returncode, refused.stderr) == (2, "switchyard-runner: agent directory missing: No such file or directory\n")
    example = tmp_path / "echo_runner.py"
    shutil.copy(REPO / "clients" / "python" / "examples" / "echo_runner.py", example)
    serve_one_echo(server, [str(python), str(example)], tmp_path, env, "python", tmp_path)


def test_the_sdist_builds_and_installs_into_a_fresh_venv(dist: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    venv = tmp_path / "venv"
    python, env = fresh_venv(venv)
    pip_install(python, env, str(dist["sdist"]))
    assert_imported_from(python, env, venv, tmp_path)
    out = run(
        [str(python), "-c", "from switchyard_runner.identity import default_agent_name as n; print(n('h', 'python', '/srv/agents/b'))"],
        env=env, cwd=tmp_path,
    )
    assert out.stdout.strip() == "h-python-40f17b"


def test_the_readme_python_install_line_and_example_take_a_task(server: Server, tmp_path: pathlib.Path) -> None:
    venv = tmp_path / "venv"
    python, env = fresh_venv(venv)
    run(["bash", "-euo", "pipefail", "-c", readme_block("python-install")], cwd=REPO, env=env)
    assert_imported_from(python, env, venv, tmp_path)
    example = tmp_path / "readme_runner.py"
    example.write_text(readme_block("python-example"))
    serve_one_echo(server, [str(python), str(example)], tmp_path, env, "python", tmp_path)


def test_the_npm_tarball_installs_into_a_fresh_project_and_its_example_takes_a_task(
    dist: dict[str, pathlib.Path], server: Server, tmp_path: pathlib.Path
) -> None:
    project = npm_project(tmp_path / "project")
    env = clean_env()
    run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", str(dist["npm"])], cwd=project, env=env)
    assert_installed_copy(project)
    refused = subprocess.run(
        [str(project / "node_modules" / ".bin" / "switchyard-node"), "capabilities", "--dir", "missing"],
        cwd=project, env=env, capture_output=True, text=True, timeout=60,
    )
    assert (refused.returncode, refused.stderr) == (2, "switchyard-node: agent directory missing: No such file or directory\n")
    example = project / "echo-runner.mjs"
    shutil.copy(project / "node_modules" / "@switchyard" / "runner" / "examples" / "echo-runner.mjs", example)
    serve_one_echo(server, ["node", str(example)], project, env, "node", tmp_path)


def test_the_readme_node_install_line_and_example_take_a_task(server: Server, tmp_path: pathlib.Path) -> None:
    project = npm_project(tmp_path / "project")
    env = clean_env(SWITCHYARD=str(REPO), npm_config_audit="false", npm_config_fund="false")
    run(["bash", "-euo", "pipefail", "-c", readme_block("node-install")], cwd=project, env=env)
    assert_installed_copy(project)
    example = project / "readme-runner.mjs"
    example.write_text(readme_block("node-example"))
    serve_one_echo(server, ["node", str(example)], project, env, "node", tmp_path)
