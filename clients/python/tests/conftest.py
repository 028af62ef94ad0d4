"""Test fixtures: a real switchyard-server on an ephemeral port, and a client of it.

The server binary is ``$SWITCHYARD_SERVER_BIN`` or the workspace's
``target/debug/switchyard-server`` (built by ``cargo build``); the Rust agent is
``$SWITCHYARD_AGENT_BIN`` or ``target/debug/switchyard-agent``. Server logs show when ``TEST_LOG``
is set. A test marked ``@pytest.mark.server_args("--flag", "value", ...)`` starts its server with
those flags too.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence

import pytest

from helpers import Client

REPO = pathlib.Path(__file__).resolve().parents[3]


def server_binary() -> pathlib.Path:
    explicit = os.environ.get("SWITCHYARD_SERVER_BIN")
    path = pathlib.Path(explicit) if explicit else REPO / "target" / "debug" / "switchyard-server"
    if not path.exists():
        pytest.fail(f"{path} not found: run `cargo build -p switchyard-server` first")
    return path


class ServerProcess:
    """A switchyard-server child process on SQLite; can be killed and restarted on the same port
    and database file."""

    def __init__(self, directory: str, extra_args: Sequence[str] = ()):
        self.database = f"sqlite://{directory}/switchyard.db"
        self.address = "127.0.0.1:0"
        self.extra_args = list(extra_args)
        """Flags added to every start, e.g. ``["--max-releases-per-task", "3"]``."""
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        """Starts the server; returns host:port (the same port on a restart)."""
        self.proc = subprocess.Popen(
            [
                str(server_binary()),
                "--listen", self.address,
                "--database-url", self.database,
                "--heartbeat-interval-ms", "200",
                "--sweep-interval-ms", "100",
                "--ack-window-ms", "2000",
                *self.extra_args,
            ],
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("TEST_LOG") else subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        assert match, f"unexpected first line from the server: {line!r}"
        self.address = match.group(1)
        return self.address

    def kill(self) -> None:
        """Kills the server at once (no graceful drain)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Terminates the server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A started server that a test may kill and restart, with the flags of its ``server_args`` mark."""
    marker = request.node.get_closest_marker("server_args")
    with tempfile.TemporaryDirectory() as tmp:
        process = ServerProcess(tmp, marker.args if marker else ())
        process.start()
        try:
            yield process
        finally:
            process.stop()


@pytest.fixture
def server_address(server: ServerProcess) -> str:
    """Starts switchyard-server on SQLite in a temporary directory; yields host:port."""
    return server.address


@pytest.fixture
async def client(server_address: str) -> AsyncIterator[Client]:
    """The task and admin services of the test's server."""
    c = Client(server_address)
    try:
        yield c
    finally:
        await c.close()
