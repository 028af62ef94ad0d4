"""The runner over TLS: an ``https://`` server verified against a CA file, with a client
certificate for a server that requires mTLS. Certificates are made with openssl."""

from __future__ import annotations

import pathlib
import re
import subprocess

import grpc

from conftest import server_binary
from helpers import running
from switchyard_runner import Runner, TaskContext
from switchyard_runner.v1 import placement_pb2, task_pb2, task_service_pb2, task_service_pb2_grpc


def make_pki(directory: pathlib.Path) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=test-ca")
    (directory / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "1", "-extfile", "san.ext")


async def test_runner_leases_and_completes_over_mtls(tmp_path: pathlib.Path) -> None:
    make_pki(tmp_path)
    pem = lambda name: str(tmp_path / name)  # noqa: E731
    proc = subprocess.Popen(
        [str(server_binary()), "--listen", "127.0.0.1:0", "--database-url", f"sqlite://{tmp_path}/sy.db",
         "--tls-cert", pem("server.pem"), "--tls-key", pem("server.key"), "--tls-client-ca", pem("ca.pem"),
         "--heartbeat-interval-ms", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        match = re.search(r"listening on \S+:(\d+)", proc.stdout.readline())
        assert match
        url = f"https://localhost:{match.group(1)}"
        runner = Runner(server=url, name="tls-runner", ca_file=pem("ca.pem"), cert_file=pem("client.pem"),
                        key_file=pem("client.key"), params=lambda name: None)

        @runner.handler("echo")
        async def echo(task: TaskContext) -> dict:
            return {"echo": task.payload}

        credentials = grpc.ssl_channel_credentials(
            root_certificates=(tmp_path / "ca.pem").read_bytes(),
            private_key=(tmp_path / "client.key").read_bytes(),
            certificate_chain=(tmp_path / "client.pem").read_bytes(),
        )
        async with running(runner), grpc.aio.secure_channel(f"localhost:{match.group(1)}", credentials) as channel:
            tasks = task_service_pb2_grpc.TaskServiceStub(channel)
            submitted = await tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(
                kind="echo", placement=placement_pb2.Placement()), timeout=10)
            request = task_service_pb2.WatchTaskRequest(task_id=submitted.task.task_id)
            final = None
            async for item in tasks.WatchTask(request, timeout=15):
                final = item.task
            assert final is not None and final.state == task_pb2.TASK_STATE_SUCCEEDED
    finally:
        proc.terminate()
        proc.wait(timeout=10)
