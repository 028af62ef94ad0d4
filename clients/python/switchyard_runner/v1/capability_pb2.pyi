from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_BASE: _ClassVar[Tier]
    TIER_STATIC: _ClassVar[Tier]
    TIER_DYNAMIC: _ClassVar[Tier]
    TIER_OVERRIDE: _ClassVar[Tier]
    TIER_OPERATOR: _ClassVar[Tier]

class PatchOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PATCH_OP_UNSPECIFIED: _ClassVar[PatchOp]
    PATCH_OP_ADD: _ClassVar[PatchOp]
    PATCH_OP_REMOVE: _ClassVar[PatchOp]
    PATCH_OP_REPLACE: _ClassVar[PatchOp]
    PATCH_OP_MOVE: _ClassVar[PatchOp]
    PATCH_OP_COPY: _ClassVar[PatchOp]
    PATCH_OP_TEST: _ClassVar[PatchOp]
TIER_UNSPECIFIED: Tier
TIER_BASE: Tier
TIER_STATIC: Tier
TIER_DYNAMIC: Tier
TIER_OVERRIDE: Tier
TIER_OPERATOR: Tier
PATCH_OP_UNSPECIFIED: PatchOp
PATCH_OP_ADD: PatchOp
PATCH_OP_REMOVE: PatchOp
PATCH_OP_REPLACE: PatchOp
PATCH_OP_MOVE: PatchOp
PATCH_OP_COPY: PatchOp
PATCH_OP_TEST: PatchOp

class ProvenanceEntry(_message.Message):
    __slots__ = ("path", "tier")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    path: str
    tier: Tier
    def __init__(self, path: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("tier", "path", "reason")
    TIER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    path: str
    reason: str
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., path: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CapabilityDiff(_message.Message):
    __slots__ = ("base_generation", "operations")
    BASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    base_generation: int
    operations: _containers.RepeatedCompositeFieldContainer[PatchOperation]
    def __init__(self, base_generation: _Optional[int] = ..., operations: _Optional[_Iterable[_Union[PatchOperation, _Mapping]]] = ...) -> None: ...

class PatchOperation(_message.Message):
    __slots__ = ("op", "path", "value")
    OP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    op: PatchOp
    path: str
    value: _struct_pb2.Value
    def __init__(self, op: _Optional[_Union[PatchOp, str]] = ..., path: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., **kwargs) -> None: ...

class CapabilityView(_message.Message):
    __slots__ = ("document", "generation", "provenance", "rejections", "operator_overrides")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    document: _struct_pb2.Struct
    generation: int
    provenance: _containers.RepeatedCompositeFieldContainer[ProvenanceEntry]
    rejections: _containers.RepeatedCompositeFieldContainer[Rejection]
    operator_overrides: _struct_pb2.Struct
    def __init__(self, document: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., generation: _Optional[int] = ..., provenance: _Optional[_Iterable[_Union[ProvenanceEntry, _Mapping]]] = ..., rejections: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., operator_overrides: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
