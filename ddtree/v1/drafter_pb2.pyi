from ddtree.v1 import common_pb2 as _common_pb2
from ddtree.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftItem(_message.Message):
    __slots__ = ("session_id", "committed_len", "bonus_token", "features", "spec")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    committed_len: int
    bonus_token: int
    features: _tensor_pb2.Tensor
    spec: _common_pb2.SpecParams
    def __init__(self, session_id: _Optional[str] = ..., committed_len: _Optional[int] = ..., bonus_token: _Optional[int] = ..., features: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., spec: _Optional[_Union[_common_pb2.SpecParams, _Mapping]] = ...) -> None: ...

class DraftBatch(_message.Message):
    __slots__ = ("session_ids", "committed_len", "bonus_token", "num_features", "features", "specs", "num_nodes", "force_chain")
    class SpecsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: _common_pb2.SpecParams
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[_common_pb2.SpecParams, _Mapping]] = ...) -> None: ...
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    SPECS_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    FORCE_CHAIN_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    committed_len: _containers.RepeatedScalarFieldContainer[int]
    bonus_token: _containers.RepeatedScalarFieldContainer[int]
    num_features: _containers.RepeatedScalarFieldContainer[int]
    features: _tensor_pb2.Tensor
    specs: _containers.MessageMap[int, _common_pb2.SpecParams]
    num_nodes: _containers.RepeatedScalarFieldContainer[int]
    force_chain: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ..., committed_len: _Optional[_Iterable[int]] = ..., bonus_token: _Optional[_Iterable[int]] = ..., num_features: _Optional[_Iterable[int]] = ..., features: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., specs: _Optional[_Mapping[int, _common_pb2.SpecParams]] = ..., num_nodes: _Optional[_Iterable[int]] = ..., force_chain: _Optional[_Iterable[bool]] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("round_id", "items", "release_sessions", "batch")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    items: _containers.RepeatedCompositeFieldContainer[DraftItem]
    release_sessions: _containers.RepeatedScalarFieldContainer[str]
    batch: DraftBatch
    def __init__(self, round_id: _Optional[int] = ..., items: _Optional[_Iterable[_Union[DraftItem, _Mapping]]] = ..., release_sessions: _Optional[_Iterable[str]] = ..., batch: _Optional[_Union[DraftBatch, _Mapping]] = ...) -> None: ...

class DraftResult(_message.Message):
    __slots__ = ("session_id", "committed_len", "tree", "error", "error_code")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    committed_len: int
    tree: _common_pb2.DraftTree
    error: str
    error_code: str
    def __init__(self, session_id: _Optional[str] = ..., committed_len: _Optional[int] = ..., tree: _Optional[_Union[_common_pb2.DraftTree, _Mapping]] = ..., error: _Optional[str] = ..., error_code: _Optional[str] = ...) -> None: ...

class DraftError(_message.Message):
    __slots__ = ("row", "error", "error_code")
    ROW_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    row: int
    error: str
    error_code: str
    def __init__(self, row: _Optional[int] = ..., error: _Optional[str] = ..., error_code: _Optional[str] = ...) -> None: ...

class DraftTrees(_message.Message):
    __slots__ = ("tokens", "parents", "num_nodes", "committed_len", "errors")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    tokens: _tensor_pb2.Tensor
    parents: _tensor_pb2.Tensor
    num_nodes: _containers.RepeatedScalarFieldContainer[int]
    committed_len: _containers.RepeatedScalarFieldContainer[int]
    errors: _containers.RepeatedCompositeFieldContainer[DraftError]
    def __init__(self, tokens: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., parents: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., num_nodes: _Optional[_Iterable[int]] = ..., committed_len: _Optional[_Iterable[int]] = ..., errors: _Optional[_Iterable[_Union[DraftError, _Mapping]]] = ...) -> None: ...

class DraftResponse(_message.Message):
    __slots__ = ("round_id", "results", "trees")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TREES_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    results: _containers.RepeatedCompositeFieldContainer[DraftResult]
    trees: DraftTrees
    def __init__(self, round_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[DraftResult, _Mapping]]] = ..., trees: _Optional[_Union[DraftTrees, _Mapping]] = ...) -> None: ...

class DrafterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrafterInfo(_message.Message):
    __slots__ = ("drafter_id", "block_size", "target_layer_ids", "hidden_size", "vocab_size", "max_budget", "num_target_layers", "wire_version", "local_socket", "instance_id")
    DRAFTER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LAYER_IDS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BUDGET_FIELD_NUMBER: _ClassVar[int]
    NUM_TARGET_LAYERS_FIELD_NUMBER: _ClassVar[int]
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SOCKET_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    drafter_id: str
    block_size: int
    target_layer_ids: _containers.RepeatedScalarFieldContainer[int]
    hidden_size: int
    vocab_size: int
    max_budget: int
    num_target_layers: int
    wire_version: int
    local_socket: str
    instance_id: str
    def __init__(self, drafter_id: _Optional[str] = ..., block_size: _Optional[int] = ..., target_layer_ids: _Optional[_Iterable[int]] = ..., hidden_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., max_budget: _Optional[int] = ..., num_target_layers: _Optional[int] = ..., wire_version: _Optional[int] = ..., local_socket: _Optional[str] = ..., instance_id: _Optional[str] = ...) -> None: ...
