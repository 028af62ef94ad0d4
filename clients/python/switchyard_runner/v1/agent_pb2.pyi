import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from switchyard_runner.v1 import capability_pb2 as _capability_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGENT_STATUS_UNSPECIFIED: _ClassVar[AgentStatus]
    AGENT_STATUS_READY: _ClassVar[AgentStatus]
    AGENT_STATUS_DEGRADED: _ClassVar[AgentStatus]
    AGENT_STATUS_DRAINING: _ClassVar[AgentStatus]
    AGENT_STATUS_OFFLINE: _ClassVar[AgentStatus]
AGENT_STATUS_UNSPECIFIED: AgentStatus
AGENT_STATUS_READY: AgentStatus
AGENT_STATUS_DEGRADED: AgentStatus
AGENT_STATUS_DRAINING: AgentStatus
AGENT_STATUS_OFFLINE: AgentStatus

class Agent(_message.Message):
    __slots__ = ("agent_id", "name", "namespace", "status", "status_reasons", "capacity", "active_leases", "labels", "capabilities", "session_epoch", "last_seen_at", "registered_at", "drained", "runner", "handled_kinds", "drain_deadline")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASONS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SESSION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    HANDLED_KINDS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    name: str
    namespace: str
    status: AgentStatus
    status_reasons: _containers.RepeatedScalarFieldContainer[str]
    capacity: int
    active_leases: int
    labels: _containers.ScalarMap[str, str]
    capabilities: _capability_pb2.CapabilityView
    session_epoch: int
    last_seen_at: _timestamp_pb2.Timestamp
    registered_at: _timestamp_pb2.Timestamp
    drained: bool
    runner: str
    handled_kinds: _containers.RepeatedScalarFieldContainer[str]
    drain_deadline: _timestamp_pb2.Timestamp
    def __init__(self, agent_id: _Optional[str] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., status: _Optional[_Union[AgentStatus, str]] = ..., status_reasons: _Optional[_Iterable[str]] = ..., capacity: _Optional[int] = ..., active_leases: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., capabilities: _Optional[_Union[_capability_pb2.CapabilityView, _Mapping]] = ..., session_epoch: _Optional[int] = ..., last_seen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., drained: bool = ..., runner: _Optional[str] = ..., handled_kinds: _Optional[_Iterable[str]] = ..., drain_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
