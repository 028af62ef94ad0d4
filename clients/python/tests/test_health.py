"""The checked-in Python stubs talk to a real server: health and reflection-free calls."""

from __future__ import annotations

import grpc
import pytest

from switchyard_runner.health.v1 import health_pb2, health_pb2_grpc
from switchyard_runner.v1 import task_service_pb2, task_service_pb2_grpc


def test_health_check_reports_serving(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        overall = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert overall.status == health_pb2.HealthCheckResponse.SERVING
        for service in (
            "switchyard.v1.AgentService",
            "switchyard.v1.TaskService",
            "switchyard.v1.AgentAdminService",
        ):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


def test_unknown_health_service_is_not_found(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_task_service_stub_reaches_the_server(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel:
        stub = task_service_pb2_grpc.TaskServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.GetTask(task_service_pb2.GetTaskRequest(task_id="00000000-0000-7000-8000-000000000000"), timeout=5)
        # Answered by the real service (not a transport failure).
        assert err.value.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND)
