from ddtree.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_AR: _ClassVar[Mode]
    MODE_LINEAR: _ClassVar[Mode]
    MODE_TREE: _ClassVar[Mode]
    MODE_SHADOW: _ClassVar[Mode]
    MODE_AUTO: _ClassVar[Mode]
MODE_UNSPECIFIED: Mode
MODE_AR: Mode
MODE_LINEAR: Mode
MODE_TREE: Mode
MODE_SHADOW: Mode
MODE_AUTO: Mode

class SpecParams(_message.Message):
    __slots__ = ("mode", "budget", "max_topk")
    MODE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_TOPK_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    budget: int
    max_topk: int
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., budget: _Optional[int] = ..., max_topk: _Optional[int] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class DraftTree(_message.Message):
    __slots__ = ("tokens", "parents", "scores")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    scores: _tensor_pb2.Tensor
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ..., scores: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class SpecStats(_message.Message):
    __slots__ = ("mode", "budget", "num_rounds", "mean_acceptance_length", "acceptance_histogram", "num_drafted_nodes", "num_accepted_draft_tokens", "stage_seconds", "num_prompt_tokens", "num_completion_tokens")
    class StageSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    NUM_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFTED_NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STAGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    budget: int
    num_rounds: int
    mean_acceptance_length: float
    acceptance_histogram: _containers.RepeatedScalarFieldContainer[int]
    num_drafted_nodes: int
    num_accepted_draft_tokens: int
    stage_seconds: _containers.ScalarMap[str, float]
    num_prompt_tokens: int
    num_completion_tokens: int
    def __init__(self, mode: _Optional[str] = ..., budget: _Optional[int] = ..., num_rounds: _Optional[int] = ..., mean_acceptance_length: _Optional[float] = ..., acceptance_histogram: _Optional[_Iterable[int]] = ..., num_drafted_nodes: _Optional[int] = ..., num_accepted_draft_tokens: _Optional[int] = ..., stage_seconds: _Optional[_Mapping[str, float]] = ..., num_prompt_tokens: _Optional[int] = ..., num_completion_tokens: _Optional[int] = ...) -> None: ...
