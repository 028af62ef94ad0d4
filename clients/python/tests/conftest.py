"""Test fixtures: a real switchyard-server on an ephemeral port.

The server binary is ``$SWITCHYARD_SERVER_BIN`` or the workspace's
``target/debug/switchyard-server`` (built by ``cargo build``).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


def server_binary() -> pathlib.Path:
    explicit = os.environ.get("SWITCHYARD_SERVER_BIN")
    path = pathlib.Path(explicit) if explicit else REPO / "target" / "debug" / "switchyard-server"
    if not path.exists():
        pytest.fail(f"{path} not found: run `cargo build -p switchyard-server` first")
    return path


@pytest.fixture
def server_address() -> Iterator[str]:
    """Starts switchyard-server on SQLite in a temporary directory; yields host:port."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [
                str(server_binary()),
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                f"sqlite://{tmp}/switchyard.db",
            ],
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("TEST_LOG") else subprocess.DEVNULL,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.search(r"listening on (\S+)", line)
            assert match, f"unexpected first line from the server: {line!r}"
            yield match.group(1)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
