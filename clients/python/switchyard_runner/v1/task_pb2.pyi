import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from switchyard_runner.v1 import placement_pb2 as _placement_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_QUEUED: _ClassVar[TaskState]
    TASK_STATE_LEASED: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_SUCCEEDED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELED: _ClassVar[TaskState]

class QueuedReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUEUED_REASON_UNSPECIFIED: _ClassVar[QueuedReason]
    QUEUED_REASON_PARKED: _ClassVar[QueuedReason]
    QUEUED_REASON_WAITING_FOR_CAPACITY: _ClassVar[QueuedReason]
    QUEUED_REASON_BACKOFF: _ClassVar[QueuedReason]
    QUEUED_REASON_CONCURRENCY_LIMIT: _ClassVar[QueuedReason]

class OutputStream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_STREAM_UNSPECIFIED: _ClassVar[OutputStream]
    OUTPUT_STREAM_STDOUT: _ClassVar[OutputStream]
    OUTPUT_STREAM_STDERR: _ClassVar[OutputStream]
    OUTPUT_STREAM_LOG: _ClassVar[OutputStream]

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    LEASE_STATE_GRANTED: _ClassVar[LeaseState]
    LEASE_STATE_ACTIVE: _ClassVar[LeaseState]
    LEASE_STATE_COMPLETED: _ClassVar[LeaseState]
    LEASE_STATE_RELEASED: _ClassVar[LeaseState]
    LEASE_STATE_EXPIRED: _ClassVar[LeaseState]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_QUEUED: TaskState
TASK_STATE_LEASED: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_SUCCEEDED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELED: TaskState
QUEUED_REASON_UNSPECIFIED: QueuedReason
QUEUED_REASON_PARKED: QueuedReason
QUEUED_REASON_WAITING_FOR_CAPACITY: QueuedReason
QUEUED_REASON_BACKOFF: QueuedReason
QUEUED_REASON_CONCURRENCY_LIMIT: QueuedReason
OUTPUT_STREAM_UNSPECIFIED: OutputStream
OUTPUT_STREAM_STDOUT: OutputStream
OUTPUT_STREAM_STDERR: OutputStream
OUTPUT_STREAM_LOG: OutputStream
LEASE_STATE_UNSPECIFIED: LeaseState
LEASE_STATE_GRANTED: LeaseState
LEASE_STATE_ACTIVE: LeaseState
LEASE_STATE_COMPLETED: LeaseState
LEASE_STATE_RELEASED: LeaseState
LEASE_STATE_EXPIRED: LeaseState

class Task(_message.Message):
    __slots__ = ("task_id", "namespace", "kind", "payload", "placement", "priority", "state", "queued_reason", "attempts", "max_attempts", "lease_ttl", "idempotency_key", "not_before", "result", "error", "lease", "progress", "cancel_requested", "created_at", "updated_at", "labels", "retry", "start_timeout", "execution_timeout", "cancel_grace", "cancel_deadline", "fairness_key", "fairness_weight", "concurrency_key")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    START_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_GRACE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_KEY_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    namespace: str
    kind: str
    payload: _struct_pb2.Struct
    placement: _placement_pb2.Placement
    priority: int
    state: TaskState
    queued_reason: QueuedReason
    attempts: int
    max_attempts: int
    lease_ttl: _duration_pb2.Duration
    idempotency_key: str
    not_before: _timestamp_pb2.Timestamp
    result: _struct_pb2.Struct
    error: TaskError
    lease: Lease
    progress: TaskProgress
    cancel_requested: bool
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    retry: RetryPolicy
    start_timeout: _duration_pb2.Duration
    execution_timeout: _duration_pb2.Duration
    cancel_grace: _duration_pb2.Duration
    cancel_deadline: _timestamp_pb2.Timestamp
    fairness_key: str
    fairness_weight: int
    concurrency_key: str
    def __init__(self, task_id: _Optional[str] = ..., namespace: _Optional[str] = ..., kind: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., placement: _Optional[_Union[_placement_pb2.Placement, _Mapping]] = ..., priority: _Optional[int] = ..., state: _Optional[_Union[TaskState, str]] = ..., queued_reason: _Optional[_Union[QueuedReason, str]] = ..., attempts: _Optional[int] = ..., max_attempts: _Optional[int] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., not_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., error: _Optional[_Union[TaskError, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., progress: _Optional[_Union[TaskProgress, _Mapping]] = ..., cancel_requested: bool = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., start_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., execution_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., cancel_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., cancel_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fairness_key: _Optional[str] = ..., fairness_weight: _Optional[int] = ..., concurrency_key: _Optional[str] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("initial_backoff", "max_backoff", "multiplier", "jitter")
    INITIAL_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    initial_backoff: _duration_pb2.Duration
    max_backoff: _duration_pb2.Duration
    multiplier: float
    jitter: float
    def __init__(self, initial_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., multiplier: _Optional[float] = ..., jitter: _Optional[float] = ...) -> None: ...

class TaskError(_message.Message):
    __slots__ = ("message", "code", "retryable", "details", "output_tail")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TAIL_FIELD_NUMBER: _ClassVar[int]
    message: str
    code: str
    retryable: bool
    details: _struct_pb2.Struct
    output_tail: str
    def __init__(self, message: _Optional[str] = ..., code: _Optional[str] = ..., retryable: bool = ..., details: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., output_tail: _Optional[str] = ...) -> None: ...

class TaskOutputChunk(_message.Message):
    __slots__ = ("stream", "text", "lease_id", "fencing_token", "sequence", "offset", "dropped_bytes", "written_at")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_AT_FIELD_NUMBER: _ClassVar[int]
    stream: OutputStream
    text: str
    lease_id: str
    fencing_token: int
    sequence: int
    offset: int
    dropped_bytes: int
    written_at: _timestamp_pb2.Timestamp
    def __init__(self, stream: _Optional[_Union[OutputStream, str]] = ..., text: _Optional[str] = ..., lease_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., sequence: _Optional[int] = ..., offset: _Optional[int] = ..., dropped_bytes: _Optional[int] = ..., written_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TaskProgress(_message.Message):
    __slots__ = ("percent", "message", "reported_at")
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    percent: float
    message: str
    reported_at: _timestamp_pb2.Timestamp
    def __init__(self, percent: _Optional[float] = ..., message: _Optional[str] = ..., reported_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "task_id", "agent_id", "fencing_token", "state", "granted_at", "expires_at")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    task_id: str
    agent_id: str
    fencing_token: int
    state: LeaseState
    granted_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, lease_id: _Optional[str] = ..., task_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., state: _Optional[_Union[LeaseState, str]] = ..., granted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TaskEvent(_message.Message):
    __slots__ = ("sequence", "task_id", "state", "kind", "message", "agent_id", "lease_id", "occurred_at")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    task_id: str
    state: TaskState
    kind: str
    message: str
    agent_id: str
    lease_id: str
    occurred_at: _timestamp_pb2.Timestamp
    def __init__(self, sequence: _Optional[int] = ..., task_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ..., agent_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
