from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlacementPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_POLICY_UNSPECIFIED: _ClassVar[PlacementPolicy]
    PLACEMENT_POLICY_SPREAD: _ClassVar[PlacementPolicy]
    PLACEMENT_POLICY_BINPACK: _ClassVar[PlacementPolicy]

class Operator(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATOR_UNSPECIFIED: _ClassVar[Operator]
    OPERATOR_EXISTS: _ClassVar[Operator]
    OPERATOR_NOT_EXISTS: _ClassVar[Operator]
    OPERATOR_EQ: _ClassVar[Operator]
    OPERATOR_NE: _ClassVar[Operator]
    OPERATOR_IN: _ClassVar[Operator]
    OPERATOR_NOT_IN: _ClassVar[Operator]
    OPERATOR_GT: _ClassVar[Operator]
    OPERATOR_GTE: _ClassVar[Operator]
    OPERATOR_LT: _ClassVar[Operator]
    OPERATOR_LTE: _ClassVar[Operator]
    OPERATOR_VERSION: _ClassVar[Operator]
    OPERATOR_REGEX: _ClassVar[Operator]
    OPERATOR_CONTAINS: _ClassVar[Operator]
    OPERATOR_CONTAINS_ANY: _ClassVar[Operator]
PLACEMENT_POLICY_UNSPECIFIED: PlacementPolicy
PLACEMENT_POLICY_SPREAD: PlacementPolicy
PLACEMENT_POLICY_BINPACK: PlacementPolicy
OPERATOR_UNSPECIFIED: Operator
OPERATOR_EXISTS: Operator
OPERATOR_NOT_EXISTS: Operator
OPERATOR_EQ: Operator
OPERATOR_NE: Operator
OPERATOR_IN: Operator
OPERATOR_NOT_IN: Operator
OPERATOR_GT: Operator
OPERATOR_GTE: Operator
OPERATOR_LT: Operator
OPERATOR_LTE: Operator
OPERATOR_VERSION: Operator
OPERATOR_REGEX: Operator
OPERATOR_CONTAINS: Operator
OPERATOR_CONTAINS_ANY: Operator

class Placement(_message.Message):
    __slots__ = ("required_tags", "requirements", "capabilities", "preferences", "selector", "json_schema", "tolerations", "policy", "resources", "spread_by")
    REQUIRED_TAGS_FIELD_NUMBER: _ClassVar[int]
    REQUIREMENTS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    PREFERENCES_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TOLERATIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    SPREAD_BY_FIELD_NUMBER: _ClassVar[int]
    required_tags: _containers.RepeatedScalarFieldContainer[str]
    requirements: _containers.RepeatedCompositeFieldContainer[Requirement]
    capabilities: _containers.RepeatedCompositeFieldContainer[CapabilityRef]
    preferences: _containers.RepeatedCompositeFieldContainer[Preference]
    selector: str
    json_schema: _struct_pb2.Struct
    tolerations: _containers.RepeatedScalarFieldContainer[str]
    policy: PlacementPolicy
    resources: ResourceRequest
    spread_by: str
    def __init__(self, required_tags: _Optional[_Iterable[str]] = ..., requirements: _Optional[_Iterable[_Union[Requirement, _Mapping]]] = ..., capabilities: _Optional[_Iterable[_Union[CapabilityRef, _Mapping]]] = ..., preferences: _Optional[_Iterable[_Union[Preference, _Mapping]]] = ..., selector: _Optional[str] = ..., json_schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., tolerations: _Optional[_Iterable[str]] = ..., policy: _Optional[_Union[PlacementPolicy, str]] = ..., resources: _Optional[_Union[ResourceRequest, _Mapping]] = ..., spread_by: _Optional[str] = ...) -> None: ...

class ResourceRequest(_message.Message):
    __slots__ = ("slots", "cpu_millicores", "memory_mb", "gpus", "gpu_requirements", "gpu_selector", "named")
    class NamedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_REQUIREMENTS_FIELD_NUMBER: _ClassVar[int]
    GPU_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    NAMED_FIELD_NUMBER: _ClassVar[int]
    slots: int
    cpu_millicores: int
    memory_mb: int
    gpus: int
    gpu_requirements: _containers.RepeatedCompositeFieldContainer[Requirement]
    gpu_selector: str
    named: _containers.ScalarMap[str, int]
    def __init__(self, slots: _Optional[int] = ..., cpu_millicores: _Optional[int] = ..., memory_mb: _Optional[int] = ..., gpus: _Optional[int] = ..., gpu_requirements: _Optional[_Iterable[_Union[Requirement, _Mapping]]] = ..., gpu_selector: _Optional[str] = ..., named: _Optional[_Mapping[str, int]] = ...) -> None: ...

class AssignedResources(_message.Message):
    __slots__ = ("slots", "cpu_millicores", "memory_mb", "gpu_ids", "named")
    class NamedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    NAMED_FIELD_NUMBER: _ClassVar[int]
    slots: int
    cpu_millicores: int
    memory_mb: int
    gpu_ids: _containers.RepeatedScalarFieldContainer[str]
    named: _containers.ScalarMap[str, int]
    def __init__(self, slots: _Optional[int] = ..., cpu_millicores: _Optional[int] = ..., memory_mb: _Optional[int] = ..., gpu_ids: _Optional[_Iterable[str]] = ..., named: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Requirement(_message.Message):
    __slots__ = ("key", "operator", "values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: Operator
    values: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Value]
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[_Union[Operator, str]] = ..., values: _Optional[_Iterable[_Union[_struct_pb2.Value, _Mapping]]] = ...) -> None: ...

class CapabilityRef(_message.Message):
    __slots__ = ("name", "major")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAJOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    major: int
    def __init__(self, name: _Optional[str] = ..., major: _Optional[int] = ...) -> None: ...

class Preference(_message.Message):
    __slots__ = ("weight", "tag", "requirement", "capability")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    REQUIREMENT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    weight: int
    tag: str
    requirement: Requirement
    capability: CapabilityRef
    def __init__(self, weight: _Optional[int] = ..., tag: _Optional[str] = ..., requirement: _Optional[_Union[Requirement, _Mapping]] = ..., capability: _Optional[_Union[CapabilityRef, _Mapping]] = ...) -> None: ...

class AgentVerdict(_message.Message):
    __slots__ = ("agent_id", "agent_name", "eligible", "capable", "reason", "preference_score", "rank")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    CAPABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_SCORE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    agent_name: str
    eligible: bool
    capable: bool
    reason: str
    preference_score: int
    rank: int
    def __init__(self, agent_id: _Optional[str] = ..., agent_name: _Optional[str] = ..., eligible: bool = ..., capable: bool = ..., reason: _Optional[str] = ..., preference_score: _Optional[int] = ..., rank: _Optional[int] = ...) -> None: ...
