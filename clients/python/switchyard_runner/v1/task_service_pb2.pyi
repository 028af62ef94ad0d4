import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from switchyard_runner.v1 import placement_pb2 as _placement_pb2
from switchyard_runner.v1 import task_pb2 as _task_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitTaskRequest(_message.Message):
    __slots__ = ("namespace", "kind", "payload", "placement", "priority", "max_attempts", "lease_ttl", "idempotency_key", "not_before", "labels", "retry", "start_timeout", "execution_timeout", "cancel_grace", "fairness_key", "fairness_weight", "concurrency_key", "concurrency_limit")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    START_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_GRACE_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_KEY_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    kind: str
    payload: _struct_pb2.Struct
    placement: _placement_pb2.Placement
    priority: int
    max_attempts: int
    lease_ttl: _duration_pb2.Duration
    idempotency_key: str
    not_before: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    retry: _task_pb2.RetryPolicy
    start_timeout: _duration_pb2.Duration
    execution_timeout: _duration_pb2.Duration
    cancel_grace: _duration_pb2.Duration
    fairness_key: str
    fairness_weight: int
    concurrency_key: str
    concurrency_limit: int
    def __init__(self, namespace: _Optional[str] = ..., kind: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., placement: _Optional[_Union[_placement_pb2.Placement, _Mapping]] = ..., priority: _Optional[int] = ..., max_attempts: _Optional[int] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., not_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., retry: _Optional[_Union[_task_pb2.RetryPolicy, _Mapping]] = ..., start_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., execution_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., cancel_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., fairness_key: _Optional[str] = ..., fairness_weight: _Optional[int] = ..., concurrency_key: _Optional[str] = ..., concurrency_limit: _Optional[int] = ...) -> None: ...

class SubmitTaskResponse(_message.Message):
    __slots__ = ("task", "created")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task: _task_pb2.Task
    created: bool
    def __init__(self, task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., created: bool = ...) -> None: ...

class SubmitTasksRequest(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[SubmitTaskRequest]
    def __init__(self, tasks: _Optional[_Iterable[_Union[SubmitTaskRequest, _Mapping]]] = ...) -> None: ...

class SubmitTasksResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SubmitTaskResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[SubmitTaskResponse, _Mapping]]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _task_pb2.Task
    def __init__(self, task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("namespace", "states", "kind", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    states: _containers.RepeatedScalarFieldContainer[_task_pb2.TaskState]
    kind: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_task_pb2.TaskState, str]]] = ..., kind: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_task_pb2.Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[_task_pb2.Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "reason", "grace")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    reason: str
    grace: _duration_pb2.Duration
    def __init__(self, task_id: _Optional[str] = ..., reason: _Optional[str] = ..., grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _task_pb2.Task
    def __init__(self, task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ...) -> None: ...

class WatchTaskRequest(_message.Message):
    __slots__ = ("task_id", "output", "output_offset")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    output: bool
    output_offset: int
    def __init__(self, task_id: _Optional[str] = ..., output: bool = ..., output_offset: _Optional[int] = ...) -> None: ...

class WatchTaskResponse(_message.Message):
    __slots__ = ("event", "task", "output")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    event: _task_pb2.TaskEvent
    task: _task_pb2.Task
    output: _containers.RepeatedCompositeFieldContainer[_task_pb2.TaskOutputChunk]
    def __init__(self, event: _Optional[_Union[_task_pb2.TaskEvent, _Mapping]] = ..., task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., output: _Optional[_Iterable[_Union[_task_pb2.TaskOutputChunk, _Mapping]]] = ...) -> None: ...

class ExplainTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class ExplainTaskResponse(_message.Message):
    __slots__ = ("task", "summary", "verdicts")
    TASK_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    task: _task_pb2.Task
    summary: str
    verdicts: _containers.RepeatedCompositeFieldContainer[_placement_pb2.AgentVerdict]
    def __init__(self, task: _Optional[_Union[_task_pb2.Task, _Mapping]] = ..., summary: _Optional[str] = ..., verdicts: _Optional[_Iterable[_Union[_placement_pb2.AgentVerdict, _Mapping]]] = ...) -> None: ...

class ListTaskEventsRequest(_message.Message):
    __slots__ = ("task_id", "page_size", "page_token")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    page_size: int
    page_token: str
    def __init__(self, task_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTaskEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_task_pb2.TaskEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[_task_pb2.TaskEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListTaskOutputRequest(_message.Message):
    __slots__ = ("task_id", "page_size", "page_token", "fencing_token")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    page_size: int
    page_token: str
    fencing_token: int
    def __init__(self, task_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class ListTaskOutputResponse(_message.Message):
    __slots__ = ("chunks", "next_page_token")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[_task_pb2.TaskOutputChunk]
    next_page_token: str
    def __init__(self, chunks: _Optional[_Iterable[_Union[_task_pb2.TaskOutputChunk, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetQueueSummaryRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class GetQueueSummaryResponse(_message.Message):
    __slots__ = ("summary",)
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    summary: QueueSummary
    def __init__(self, summary: _Optional[_Union[QueueSummary, _Mapping]] = ...) -> None: ...

class WatchQueueRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class WatchQueueResponse(_message.Message):
    __slots__ = ("summary",)
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    summary: QueueSummary
    def __init__(self, summary: _Optional[_Union[QueueSummary, _Mapping]] = ...) -> None: ...

class QueueSummary(_message.Message):
    __slots__ = ("namespace", "states", "queued_reasons", "groups", "more_groups", "computed_at", "agents_taking_work", "agents_registered", "explained")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REASONS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    MORE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    AGENTS_TAKING_WORK_FIELD_NUMBER: _ClassVar[int]
    AGENTS_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    EXPLAINED_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    states: _containers.RepeatedCompositeFieldContainer[TaskStateCount]
    queued_reasons: _containers.RepeatedCompositeFieldContainer[QueuedReasonCount]
    groups: _containers.RepeatedCompositeFieldContainer[QueueGroup]
    more_groups: int
    computed_at: _timestamp_pb2.Timestamp
    agents_taking_work: int
    agents_registered: int
    explained: bool
    def __init__(self, namespace: _Optional[str] = ..., states: _Optional[_Iterable[_Union[TaskStateCount, _Mapping]]] = ..., queued_reasons: _Optional[_Iterable[_Union[QueuedReasonCount, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[QueueGroup, _Mapping]]] = ..., more_groups: _Optional[int] = ..., computed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., agents_taking_work: _Optional[int] = ..., agents_registered: _Optional[int] = ..., explained: bool = ...) -> None: ...

class TaskStateCount(_message.Message):
    __slots__ = ("state", "count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    state: _task_pb2.TaskState
    count: int
    def __init__(self, state: _Optional[_Union[_task_pb2.TaskState, str]] = ..., count: _Optional[int] = ...) -> None: ...

class QueuedReasonCount(_message.Message):
    __slots__ = ("reason", "count")
    REASON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    reason: _task_pb2.QueuedReason
    count: int
    def __init__(self, reason: _Optional[_Union[_task_pb2.QueuedReason, str]] = ..., count: _Optional[int] = ...) -> None: ...

class QueueGroup(_message.Message):
    __slots__ = ("kind", "placement", "tasks", "not_yet_due", "oldest_submitted_at", "reason", "explanation", "capable_agents", "eligible_agents")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NOT_YET_DUE_FIELD_NUMBER: _ClassVar[int]
    OLDEST_SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    CAPABLE_AGENTS_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_AGENTS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    placement: _placement_pb2.Placement
    tasks: int
    not_yet_due: int
    oldest_submitted_at: _timestamp_pb2.Timestamp
    reason: _task_pb2.QueuedReason
    explanation: str
    capable_agents: int
    eligible_agents: int
    def __init__(self, kind: _Optional[str] = ..., placement: _Optional[_Union[_placement_pb2.Placement, _Mapping]] = ..., tasks: _Optional[int] = ..., not_yet_due: _Optional[int] = ..., oldest_submitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[_Union[_task_pb2.QueuedReason, str]] = ..., explanation: _Optional[str] = ..., capable_agents: _Optional[int] = ..., eligible_agents: _Optional[int] = ...) -> None: ...
