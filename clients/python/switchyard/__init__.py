"""Switchyard for Python.

Layout:
- ``switchyard.v1``: the generated switchyard.v1 messages and gRPC stubs
  (``*_pb2``, ``*_pb2_grpc``), from ``scripts/gen-stubs``.
- ``switchyard.health.v1``: the generated gRPC health-check stubs.
"""
