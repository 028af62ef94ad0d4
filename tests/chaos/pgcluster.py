"""A private PostgreSQL for the fault suite, so that a database fault is the
real thing and the shared server is never touched: its own data directories
under /tmp and its own loopback ports, run as the ``postgres`` user (initdb
will not run as root), from the newest ``/usr/lib/postgresql/*/bin`` (or
``$SWITCHYARD_PG_BIN``).

- ``restart("fast" | "immediate")`` stops the primary with that shutdown
  mode (immediate: no checkpoint, crash recovery at start, as after a
  SIGKILL of the postmaster) and starts it again on the same port.
- With ``standby=True`` a streaming standby is made from the primary
  (``pg_basebackup -R``); with ``synchronous=True`` the primary waits for it
  on every commit (``synchronous_standby_names = '*'``,
  ``synchronous_commit = on``), so a commit the servers were told of is on
  both. ``failover()`` stops the primary with an immediate shutdown, promotes
  the standby (the new primary runs without a synchronous standby until
  ``failover`` has made a new one from it and seen it streaming, then waits
  for it again), and returns; the caller moves the address the servers use
  (the suite's TCP proxy, as a Kubernetes Service of a managed PostgreSQL
  would).
- ``link_delay_ms`` puts a link between the primary and each standby that
  delays what the primary sends by that much (the suite's ``PgProxy`` with a
  delay), as a standby in another zone sees it: what a failover loses without
  synchronous replication is then what was committed in the last moments
  before it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

from harness import PgProxy
from replicas import log

DATABASE = "switchyard"


def pg_bin() -> pathlib.Path:
    explicit = os.environ.get("SWITCHYARD_PG_BIN")
    if explicit:
        return pathlib.Path(explicit)
    versions = sorted(pathlib.Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if versions:
        return versions[-1]
    found = shutil.which("pg_ctl")
    if found is None:
        raise FileNotFoundError("no PostgreSQL server binaries: install postgresql or set SWITCHYARD_PG_BIN")
    return pathlib.Path(found).parent


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(_as_owner(argv), check=True, capture_output=True, text=True, **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One PostgreSQL instance: a data directory and a port."""

    def __init__(self, root: pathlib.Path, name: str) -> None:
        self.name = name
        self.dir = root / name
        self.port = _free_port()
        self.logfile = root / f"{name}.log"

    def pg_ctl(self, *args: str) -> None:
        _run([str(pg_bin() / "pg_ctl"), "-D", str(self.dir), "-w", "-t", "120", *args])

    def start(self) -> None:
        self.pg_ctl("-l", str(self.logfile), "-o", f"-p {self.port}", "start")

    def stop(self, mode: str) -> None:
        self.pg_ctl("-m", mode, "stop")

    def running(self) -> bool:
        return (self.dir / "postmaster.pid").exists()

    def sql(self, query: str, database: str = "postgres") -> str:
        return _run([
            str(pg_bin() / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database,
            "-v", "ON_ERROR_STOP=1", "-XAtc", query,
        ]).stdout.strip()


class PrivatePostgres:
    def __init__(
        self, standby: bool = False, synchronous: bool = True, link_delay_ms: int = 0, listen_all: bool = False
    ) -> None:
        """``listen_all``: reachable from the suite's network namespaces
        (10.0.0.0/8) as well as from loopback."""
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="switchyard-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.synchronous = synchronous
        self.link_delay_ms = link_delay_ms
        self._links: list[PgProxy] = []
        self.restarts = 0
        self.failovers = 0
        self._nodes = 0
        self.standby: Node | None = None
        self.primary = self._node()
        _run([str(pg_bin() / "initdb"), "-D", str(self.primary.dir), "-U", "postgres", "--auth=trust", "--no-sync",
              "-E", "UTF8", "--locale=C"])
        with open(self.primary.dir / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(
                f"listen_addresses = '{'*' if listen_all else '127.0.0.1'}'\n"
                f"unix_socket_directories = '{self.root}'\n"
                "max_connections = 300\n"
                "wal_level = replica\n"
                "max_wal_senders = 8\n"
                "hot_standby = on\n"
                "synchronous_commit = on\n"
                "wal_keep_size = '256MB'\n"
                "shared_buffers = '64MB'\n"
            )
        if listen_all:
            with open(self.primary.dir / "pg_hba.conf", "a", encoding="utf-8") as hba:
                hba.write("host all all 10.0.0.0/8 trust\n")
        self.primary.start()
        self.primary.sql(f"CREATE DATABASE {DATABASE}")
        log(f"private postgres: primary {self.primary.name} on 127.0.0.1:{self.primary.port}")
        if standby:
            self.add_standby()

    def _node(self) -> Node:
        node = Node(self.root, f"n{self._nodes}")
        self._nodes += 1
        return node

    def url(self, database: str = DATABASE) -> str:
        """The primary, directly (the checker's way in; the servers go through a proxy)."""
        return f"postgres://postgres@127.0.0.1:{self.primary.port}/{database}"

    def add_standby(self) -> None:
        """A streaming standby of the primary; with ``synchronous``, waits
        until the primary names it its synchronous standby."""
        node = self._node()
        _run([str(pg_bin() / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
              "-D", str(node.dir), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync"])
        with open(node.dir / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
            # It waits for nobody once promoted; it reconnects soon after a primary restart.
            conf.write("synchronous_standby_names = ''\nwal_retrieve_retry_interval = '200ms'\n")
            if self.link_delay_ms:
                link = PgProxy("127.0.0.1", self.primary.port, delay_s=self.link_delay_ms / 1000)
                self._links.append(link)
                conf.write(f"primary_conninfo = 'host=127.0.0.1 port={link.port} user=postgres "
                           f"application_name={node.name}'\n")
        node.start()
        self.standby = node
        state = "async"
        if self.synchronous:
            self.primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.primary.sql("SELECT pg_reload_conf()")
            state = "sync"
        deadline = time.monotonic() + 60
        while self.primary.sql(
            f"SELECT COUNT(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = '{state}'"
        ) != "1":
            if time.monotonic() > deadline:
                raise RuntimeError(f"standby {node.name} did not start streaming ({state}) within 60 s")
            time.sleep(0.1)
        log(f"private postgres: standby {node.name} on 127.0.0.1:{node.port} streaming ({state})")

    def restart(self, mode: str) -> None:
        """The primary stopped with ``mode`` (fast or immediate) and started again."""
        self.primary.stop(mode)
        self.primary.start()
        self.restarts += 1
        log(f"private postgres: primary restarted ({mode} shutdown)")

    def kill_primary_and_promote(self) -> None:
        """The primary stopped at once (immediate shutdown, its directory
        discarded: the machine is gone, and with it whatever its links to
        the standby had in flight) and the standby promoted; nothing streams
        from the new primary until ``add_standby``."""
        assert self.standby is not None, "failover needs a standby"
        old = self.primary
        for link in self._links:
            link.cut()  # the primary's zone goes dark with it, and what its links had in flight
        old.stop("immediate")
        self.standby.pg_ctl("promote")
        self.primary, self.standby = self.standby, None
        shutil.rmtree(old.dir, ignore_errors=True)
        self.failovers += 1
        log(f"private postgres: {old.name} killed, {self.primary.name} promoted")

    def close(self) -> None:
        for link in self._links:
            link.close()
        for node in (self.primary, self.standby):
            if node is not None and node.running():
                try:
                    node.stop("immediate")
                except subprocess.CalledProcessError:
                    pass
        shutil.rmtree(self.root, ignore_errors=True)
