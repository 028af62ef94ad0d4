import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from switchyard_runner.v1 import agent_pb2 as _agent_pb2
from switchyard_runner.v1 import placement_pb2 as _placement_pb2
from switchyard_runner.v1 import task_pb2 as _task_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListAgentsRequest(_message.Message):
    __slots__ = ("namespace", "statuses", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    statuses: _containers.RepeatedScalarFieldContainer[_agent_pb2.AgentStatus]
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_agent_pb2.AgentStatus, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAgentsResponse(_message.Message):
    __slots__ = ("agents", "next_page_token")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Agent]
    next_page_token: str
    def __init__(self, agents: _Optional[_Iterable[_Union[_agent_pb2.Agent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetAgentRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class GetAgentResponse(_message.Message):
    __slots__ = ("agent", "leases")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    agent: _agent_pb2.Agent
    leases: _containers.RepeatedCompositeFieldContainer[_task_pb2.Lease]
    def __init__(self, agent: _Optional[_Union[_agent_pb2.Agent, _Mapping]] = ..., leases: _Optional[_Iterable[_Union[_task_pb2.Lease, _Mapping]]] = ...) -> None: ...

class DrainAgentRequest(_message.Message):
    __slots__ = ("agent_id", "reason", "deadline")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    reason: str
    deadline: _duration_pb2.Duration
    def __init__(self, agent_id: _Optional[str] = ..., reason: _Optional[str] = ..., deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DrainAgentResponse(_message.Message):
    __slots__ = ("agent",)
    AGENT_FIELD_NUMBER: _ClassVar[int]
    agent: _agent_pb2.Agent
    def __init__(self, agent: _Optional[_Union[_agent_pb2.Agent, _Mapping]] = ...) -> None: ...

class UndrainAgentRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class UndrainAgentResponse(_message.Message):
    __slots__ = ("agent",)
    AGENT_FIELD_NUMBER: _ClassVar[int]
    agent: _agent_pb2.Agent
    def __init__(self, agent: _Optional[_Union[_agent_pb2.Agent, _Mapping]] = ...) -> None: ...

class SetAgentOverridesRequest(_message.Message):
    __slots__ = ("agent_id", "overrides")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    overrides: _struct_pb2.Struct
    def __init__(self, agent_id: _Optional[str] = ..., overrides: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class SetAgentOverridesResponse(_message.Message):
    __slots__ = ("agent",)
    AGENT_FIELD_NUMBER: _ClassVar[int]
    agent: _agent_pb2.Agent
    def __init__(self, agent: _Optional[_Union[_agent_pb2.Agent, _Mapping]] = ...) -> None: ...

class SimulatePlacementRequest(_message.Message):
    __slots__ = ("namespace", "placement", "hypothetical_capabilities", "kind", "hypothetical_kinds")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    HYPOTHETICAL_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HYPOTHETICAL_KINDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    placement: _placement_pb2.Placement
    hypothetical_capabilities: _struct_pb2.Struct
    kind: str
    hypothetical_kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., placement: _Optional[_Union[_placement_pb2.Placement, _Mapping]] = ..., hypothetical_capabilities: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., kind: _Optional[str] = ..., hypothetical_kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class SimulatePlacementResponse(_message.Message):
    __slots__ = ("summary", "verdicts", "placeable_tasks", "policy", "ranking")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    PLACEABLE_TASKS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    summary: str
    verdicts: _containers.RepeatedCompositeFieldContainer[_placement_pb2.AgentVerdict]
    placeable_tasks: _containers.RepeatedCompositeFieldContainer[_task_pb2.Task]
    policy: _placement_pb2.PlacementPolicy
    ranking: str
    def __init__(self, summary: _Optional[str] = ..., verdicts: _Optional[_Iterable[_Union[_placement_pb2.AgentVerdict, _Mapping]]] = ..., placeable_tasks: _Optional[_Iterable[_Union[_task_pb2.Task, _Mapping]]] = ..., policy: _Optional[_Union[_placement_pb2.PlacementPolicy, str]] = ..., ranking: _Optional[str] = ...) -> None: ...

class WatchAgentsRequest(_message.Message):
    __slots__ = ("namespace", "selector")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    selector: str
    def __init__(self, namespace: _Optional[str] = ..., selector: _Optional[str] = ...) -> None: ...

class WatchAgentsResponse(_message.Message):
    __slots__ = ("agents", "removed_agent_ids", "synced")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Agent]
    removed_agent_ids: _containers.RepeatedScalarFieldContainer[str]
    synced: bool
    def __init__(self, agents: _Optional[_Iterable[_Union[_agent_pb2.Agent, _Mapping]]] = ..., removed_agent_ids: _Optional[_Iterable[str]] = ..., synced: bool = ...) -> None: ...
