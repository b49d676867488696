from ddtree.v1 import common_pb2 as _common_pb2
from ddtree.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_ids", "max_tokens", "sampling", "spec", "stop_token_ids", "ignore_eos", "top_logprobs", "logprobs", "prompt_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    sampling: _common_pb2.SamplingParams
    spec: _common_pb2.SpecParams
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    top_logprobs: int
    logprobs: bool
    prompt_logprobs: bool
    def __init__(self, request_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., spec: _Optional[_Union[_common_pb2.SpecParams, _Mapping]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., logprobs: _Optional[bool] = ..., prompt_logprobs: _Optional[bool] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token_ids", "logprobs", "finish_reason", "stats", "acceptance_lengths", "drafted_nodes", "prompt_logprobs", "sent_unix_s", "received_unix_s")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_NODES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    finish_reason: str
    stats: _common_pb2.SpecStats
    acceptance_lengths: _containers.RepeatedScalarFieldContainer[int]
    drafted_nodes: _containers.RepeatedScalarFieldContainer[int]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    sent_unix_s: float
    received_unix_s: float
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[_common_pb2.SpecStats, _Mapping]] = ..., acceptance_lengths: _Optional[_Iterable[int]] = ..., drafted_nodes: _Optional[_Iterable[int]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., sent_unix_s: _Optional[float] = ..., received_unix_s: _Optional[float] = ...) -> None: ...

class GenerateManyRequest(_message.Message):
    __slots__ = ("start", "abort")
    START_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    start: GenerateRequest
    abort: str
    def __init__(self, start: _Optional[_Union[GenerateRequest, _Mapping]] = ..., abort: _Optional[str] = ...) -> None: ...

class GenerationUpdate(_message.Message):
    __slots__ = ("request_id", "response", "error_code", "error_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    response: GenerateResponse
    error_code: int
    error_message: str
    def __init__(self, request_id: _Optional[str] = ..., response: _Optional[_Union[GenerateResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class GenerateManyResponse(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[GenerationUpdate]
    def __init__(self, updates: _Optional[_Iterable[_Union[GenerationUpdate, _Mapping]]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_id", "vocab_size", "max_model_len", "eos_token_ids", "default_mode", "default_budget", "default_max_topk", "drafter_connected", "max_budget", "block_size", "local_socket", "instance_id")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_TOPK_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    MAX_BUDGET_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SOCKET_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    default_mode: str
    default_budget: int
    default_max_topk: int
    drafter_connected: bool
    max_budget: int
    block_size: int
    local_socket: str
    instance_id: str
    def __init__(self, model_id: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_model_len: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., default_mode: _Optional[str] = ..., default_budget: _Optional[int] = ..., default_max_topk: _Optional[int] = ..., drafter_connected: _Optional[bool] = ..., max_budget: _Optional[int] = ..., block_size: _Optional[int] = ..., local_socket: _Optional[str] = ..., instance_id: _Optional[str] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("prompt_ids", "sampling", "return_features")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RETURN_FEATURES_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    return_features: bool
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., return_features: _Optional[bool] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "bonus_token", "committed_len", "features")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    bonus_token: int
    committed_len: int
    features: _tensor_pb2.Tensor
    def __init__(self, session_id: _Optional[str] = ..., bonus_token: _Optional[int] = ..., committed_len: _Optional[int] = ..., features: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "tree", "return_features", "committed_len")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    RETURN_FEATURES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tree: _common_pb2.DraftTree
    return_features: bool
    committed_len: int
    def __init__(self, session_id: _Optional[str] = ..., tree: _Optional[_Union[_common_pb2.DraftTree, _Mapping]] = ..., return_features: _Optional[bool] = ..., committed_len: _Optional[int] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("accepted_path", "committed_tokens", "bonus_token", "committed_len", "features")
    ACCEPTED_PATH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    accepted_path: _containers.RepeatedScalarFieldContainer[int]
    committed_tokens: _containers.RepeatedScalarFieldContainer[int]
    bonus_token: int
    committed_len: int
    features: _tensor_pb2.Tensor
    def __init__(self, accepted_path: _Optional[_Iterable[int]] = ..., committed_tokens: _Optional[_Iterable[int]] = ..., bonus_token: _Optional[int] = ..., committed_len: _Optional[int] = ..., features: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineStats(_message.Message):
    __slots__ = ("num_running", "num_waiting", "num_open_sessions", "max_num_seqs", "kv_usage", "num_rounds", "num_target_forwards", "batch_size_histogram", "num_expired_sessions", "num_rejected", "max_queue")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_OPEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TARGET_FORWARDS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPIRED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_REJECTED_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    num_open_sessions: int
    max_num_seqs: int
    kv_usage: float
    num_rounds: int
    num_target_forwards: int
    batch_size_histogram: _containers.RepeatedScalarFieldContainer[int]
    num_expired_sessions: int
    num_rejected: int
    max_queue: int
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_open_sessions: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., kv_usage: _Optional[float] = ..., num_rounds: _Optional[int] = ..., num_target_forwards: _Optional[int] = ..., batch_size_histogram: _Optional[_Iterable[int]] = ..., num_expired_sessions: _Optional[int] = ..., num_rejected: _Optional[int] = ..., max_queue: _Optional[int] = ...) -> None: ...
