import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from switchyard_runner.v1 import agent_pb2 as _agent_pb2
from switchyard_runner.v1 import capability_pb2 as _capability_pb2
from switchyard_runner.v1 import placement_pb2 as _placement_pb2
from switchyard_runner.v1 import task_pb2 as _task_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReleaseCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEASE_CAUSE_UNSPECIFIED: _ClassVar[ReleaseCause]
    RELEASE_CAUSE_DRAINING: _ClassVar[ReleaseCause]
    RELEASE_CAUSE_REVOCATION_ACKNOWLEDGED: _ClassVar[ReleaseCause]
    RELEASE_CAUSE_CANNOT_HANDLE: _ClassVar[ReleaseCause]
    RELEASE_CAUSE_CANNOT_DECODE: _ClassVar[ReleaseCause]
    RELEASE_CAUSE_BUSY: _ClassVar[ReleaseCause]
    RELEASE_CAUSE_OTHER: _ClassVar[ReleaseCause]

class RevocationReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REVOCATION_REASON_UNSPECIFIED: _ClassVar[RevocationReason]
    REVOCATION_REASON_CANCELED: _ClassVar[RevocationReason]
    REVOCATION_REASON_EXPIRED: _ClassVar[RevocationReason]
    REVOCATION_REASON_SUPERSEDED: _ClassVar[RevocationReason]
    REVOCATION_REASON_UNACKNOWLEDGED: _ClassVar[RevocationReason]
    REVOCATION_REASON_UNKNOWN_LEASE: _ClassVar[RevocationReason]
    REVOCATION_REASON_TIMEOUT: _ClassVar[RevocationReason]
    REVOCATION_REASON_DRAIN_DEADLINE: _ClassVar[RevocationReason]
RELEASE_CAUSE_UNSPECIFIED: ReleaseCause
RELEASE_CAUSE_DRAINING: ReleaseCause
RELEASE_CAUSE_REVOCATION_ACKNOWLEDGED: ReleaseCause
RELEASE_CAUSE_CANNOT_HANDLE: ReleaseCause
RELEASE_CAUSE_CANNOT_DECODE: ReleaseCause
RELEASE_CAUSE_BUSY: ReleaseCause
RELEASE_CAUSE_OTHER: ReleaseCause
REVOCATION_REASON_UNSPECIFIED: RevocationReason
REVOCATION_REASON_CANCELED: RevocationReason
REVOCATION_REASON_EXPIRED: RevocationReason
REVOCATION_REASON_SUPERSEDED: RevocationReason
REVOCATION_REASON_UNACKNOWLEDGED: RevocationReason
REVOCATION_REASON_UNKNOWN_LEASE: RevocationReason
REVOCATION_REASON_TIMEOUT: RevocationReason
REVOCATION_REASON_DRAIN_DEADLINE: RevocationReason

class RegisterAgentRequest(_message.Message):
    __slots__ = ("name", "namespace", "capabilities", "capacity", "labels", "provenance", "rejections", "runner", "handled_kinds")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    HANDLED_KINDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    capabilities: _struct_pb2.Struct
    capacity: int
    labels: _containers.ScalarMap[str, str]
    provenance: _containers.RepeatedCompositeFieldContainer[_capability_pb2.ProvenanceEntry]
    rejections: _containers.RepeatedCompositeFieldContainer[_capability_pb2.Rejection]
    runner: str
    handled_kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., capabilities: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., capacity: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., provenance: _Optional[_Iterable[_Union[_capability_pb2.ProvenanceEntry, _Mapping]]] = ..., rejections: _Optional[_Iterable[_Union[_capability_pb2.Rejection, _Mapping]]] = ..., runner: _Optional[str] = ..., handled_kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterAgentResponse(_message.Message):
    __slots__ = ("agent_id", "session_epoch", "heartbeat_interval", "lease_ttl", "capability_generation", "rejections")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_epoch: int
    heartbeat_interval: _duration_pb2.Duration
    lease_ttl: _duration_pb2.Duration
    capability_generation: int
    rejections: _containers.RepeatedCompositeFieldContainer[_capability_pb2.Rejection]
    def __init__(self, agent_id: _Optional[str] = ..., session_epoch: _Optional[int] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., capability_generation: _Optional[int] = ..., rejections: _Optional[_Iterable[_Union[_capability_pb2.Rejection, _Mapping]]] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("sequence", "hello", "heartbeat", "lease_update", "capability_snapshot")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LEASE_UPDATE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    hello: Hello
    heartbeat: Heartbeat
    lease_update: LeaseUpdate
    capability_snapshot: CapabilitySnapshot
    def __init__(self, sequence: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., lease_update: _Optional[_Union[LeaseUpdate, _Mapping]] = ..., capability_snapshot: _Optional[_Union[CapabilitySnapshot, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("agent_id", "session_epoch", "held_leases")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HELD_LEASES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_epoch: int
    held_leases: _containers.RepeatedCompositeFieldContainer[HeldLease]
    def __init__(self, agent_id: _Optional[str] = ..., session_epoch: _Optional[int] = ..., held_leases: _Optional[_Iterable[_Union[HeldLease, _Mapping]]] = ...) -> None: ...

class HeldLease(_message.Message):
    __slots__ = ("lease_id", "task_id", "fencing_token")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    task_id: str
    fencing_token: int
    def __init__(self, lease_id: _Optional[str] = ..., task_id: _Optional[str] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("status", "status_reasons", "load", "capability_diff", "handled_kinds")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASONS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_DIFF_FIELD_NUMBER: _ClassVar[int]
    HANDLED_KINDS_FIELD_NUMBER: _ClassVar[int]
    status: _agent_pb2.AgentStatus
    status_reasons: _containers.RepeatedScalarFieldContainer[str]
    load: AgentLoad
    capability_diff: _capability_pb2.CapabilityDiff
    handled_kinds: HandledKinds
    def __init__(self, status: _Optional[_Union[_agent_pb2.AgentStatus, str]] = ..., status_reasons: _Optional[_Iterable[str]] = ..., load: _Optional[_Union[AgentLoad, _Mapping]] = ..., capability_diff: _Optional[_Union[_capability_pb2.CapabilityDiff, _Mapping]] = ..., handled_kinds: _Optional[_Union[HandledKinds, _Mapping]] = ...) -> None: ...

class HandledKinds(_message.Message):
    __slots__ = ("kinds",)
    KINDS_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class AgentLoad(_message.Message):
    __slots__ = ("running_leases", "load_average")
    RUNNING_LEASES_FIELD_NUMBER: _ClassVar[int]
    LOAD_AVERAGE_FIELD_NUMBER: _ClassVar[int]
    running_leases: int
    load_average: float
    def __init__(self, running_leases: _Optional[int] = ..., load_average: _Optional[float] = ...) -> None: ...

class CapabilitySnapshot(_message.Message):
    __slots__ = ("capabilities", "provenance", "rejections")
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    capabilities: _struct_pb2.Struct
    provenance: _containers.RepeatedCompositeFieldContainer[_capability_pb2.ProvenanceEntry]
    rejections: _containers.RepeatedCompositeFieldContainer[_capability_pb2.Rejection]
    def __init__(self, capabilities: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., provenance: _Optional[_Iterable[_Union[_capability_pb2.ProvenanceEntry, _Mapping]]] = ..., rejections: _Optional[_Iterable[_Union[_capability_pb2.Rejection, _Mapping]]] = ...) -> None: ...

class LeaseUpdate(_message.Message):
    __slots__ = ("lease_id", "task_id", "fencing_token", "accepted", "started", "progress", "succeeded", "failed", "released", "output")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    task_id: str
    fencing_token: int
    accepted: LeaseAccepted
    started: LeaseStarted
    progress: _task_pb2.TaskProgress
    succeeded: LeaseSucceeded
    failed: LeaseFailed
    released: LeaseReleased
    output: TaskOutput
    def __init__(self, lease_id: _Optional[str] = ..., task_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., accepted: _Optional[_Union[LeaseAccepted, _Mapping]] = ..., started: _Optional[_Union[LeaseStarted, _Mapping]] = ..., progress: _Optional[_Union[_task_pb2.TaskProgress, _Mapping]] = ..., succeeded: _Optional[_Union[LeaseSucceeded, _Mapping]] = ..., failed: _Optional[_Union[LeaseFailed, _Mapping]] = ..., released: _Optional[_Union[LeaseReleased, _Mapping]] = ..., output: _Optional[_Union[TaskOutput, _Mapping]] = ...) -> None: ...

class TaskOutput(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[OutputChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[OutputChunk, _Mapping]]] = ...) -> None: ...

class OutputChunk(_message.Message):
    __slots__ = ("stream", "sequence", "text", "dropped_bytes")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    stream: _task_pb2.OutputStream
    sequence: int
    text: str
    dropped_bytes: int
    def __init__(self, stream: _Optional[_Union[_task_pb2.OutputStream, str]] = ..., sequence: _Optional[int] = ..., text: _Optional[str] = ..., dropped_bytes: _Optional[int] = ...) -> None: ...

class LeaseAccepted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LeaseStarted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LeaseSucceeded(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: _struct_pb2.Struct
    def __init__(self, result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class LeaseFailed(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: _task_pb2.TaskError
    def __init__(self, error: _Optional[_Union[_task_pb2.TaskError, _Mapping]] = ...) -> None: ...

class LeaseReleased(_message.Message):
    __slots__ = ("reason", "cause")
    REASON_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    cause: ReleaseCause
    def __init__(self, reason: _Optional[str] = ..., cause: _Optional[_Union[ReleaseCause, str]] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("welcome", "lease_grant", "lease_revocation", "ack", "resync_request", "drain")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    LEASE_GRANT_FIELD_NUMBER: _ClassVar[int]
    LEASE_REVOCATION_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RESYNC_REQUEST_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    lease_grant: LeaseGrant
    lease_revocation: LeaseRevocation
    ack: Ack
    resync_request: ResyncRequest
    drain: Drain
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., lease_grant: _Optional[_Union[LeaseGrant, _Mapping]] = ..., lease_revocation: _Optional[_Union[LeaseRevocation, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., resync_request: _Optional[_Union[ResyncRequest, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("capability_generation", "resumed_lease_ids", "revoked", "heartbeat_interval")
    CAPABILITY_GENERATION_FIELD_NUMBER: _ClassVar[int]
    RESUMED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    capability_generation: int
    resumed_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    revoked: _containers.RepeatedCompositeFieldContainer[LeaseRevocation]
    heartbeat_interval: _duration_pb2.Duration
    def __init__(self, capability_generation: _Optional[int] = ..., resumed_lease_ids: _Optional[_Iterable[str]] = ..., revoked: _Optional[_Iterable[_Union[LeaseRevocation, _Mapping]]] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class LeaseGrant(_message.Message):
    __slots__ = ("lease_id", "fencing_token", "task", "expires_at", "resources")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    fencing_token: int
    task: _task_pb2.Task
    expires_at: _timestamp_pb2.Timestamp
    resources: _placement_pb2.AssignedResources
    def __init__(self, lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resources: _Optional[_Union[_placement_pb2.AssignedResources, _Mapping]] = ...) -> None: ...

class LeaseRevocation(_message.Message):
    __slots__ = ("lease_id", "task_id", "reason", "message")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    task_id: str
    reason: RevocationReason
    message: str
    def __init__(self, lease_id: _Optional[str] = ..., task_id: _Optional[str] = ..., reason: _Optional[_Union[RevocationReason, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("sequence", "code", "message", "capability_generation", "leases_expire_at", "lease_expiries")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASES_EXPIRE_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRIES_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    code: int
    message: str
    capability_generation: int
    leases_expire_at: _timestamp_pb2.Timestamp
    lease_expiries: _containers.RepeatedCompositeFieldContainer[LeaseExpiry]
    def __init__(self, sequence: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., capability_generation: _Optional[int] = ..., leases_expire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expiries: _Optional[_Iterable[_Union[LeaseExpiry, _Mapping]]] = ...) -> None: ...

class LeaseExpiry(_message.Message):
    __slots__ = ("lease_id", "task_id", "expires_at")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    task_id: str
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, lease_id: _Optional[str] = ..., task_id: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ResyncRequest(_message.Message):
    __slots__ = ("server_generation", "reason")
    SERVER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    server_generation: int
    reason: str
    def __init__(self, server_generation: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason", "reconnect_after")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RECONNECT_AFTER_FIELD_NUMBER: _ClassVar[int]
    reason: str
    reconnect_after: _duration_pb2.Duration
    def __init__(self, reason: _Optional[str] = ..., reconnect_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
