from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    BFLOAT16: _ClassVar[DType]
    INT8: _ClassVar[DType]
    INT16: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    BOOL: _ClassVar[DType]
    COMPLEX64: _ClassVar[DType]
    COMPLEX128: _ClassVar[DType]
    FLOAT8_E4M3FN: _ClassVar[DType]
    FLOAT8_E5M2: _ClassVar[DType]
    UINT16: _ClassVar[DType]
    UINT32: _ClassVar[DType]
    UINT64: _ClassVar[DType]
    COMPLEX32: _ClassVar[DType]

class ValueKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_KIND_UNSPECIFIED: _ClassVar[ValueKind]
    USER_INPUT: _ClassVar[ValueKind]
    PARAMETER: _ClassVar[ValueKind]
    BUFFER: _ClassVar[ValueKind]
    ACTIVATION: _ClassVar[ValueKind]
    GRADIENT: _ClassVar[ValueKind]
    OUTPUT: _ClassVar[ValueKind]
    CONSTANT: _ClassVar[ValueKind]

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    FORWARD: _ClassVar[Phase]
    BACKWARD: _ClassVar[Phase]

class MemoryFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_FORMAT_UNSPECIFIED: _ClassVar[MemoryFormat]
    CONTIGUOUS_FORMAT: _ClassVar[MemoryFormat]
    CHANNELS_LAST: _ClassVar[MemoryFormat]
    CHANNELS_LAST_3D: _ClassVar[MemoryFormat]
    PRESERVE_FORMAT: _ClassVar[MemoryFormat]

class Layout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYOUT_UNSPECIFIED: _ClassVar[Layout]
    STRIDED: _ClassVar[Layout]
    SPARSE_COO: _ClassVar[Layout]
    SPARSE_CSR: _ClassVar[Layout]

class CostSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COST_SOURCE_UNSPECIFIED: _ClassVar[CostSource]
    PROFILED: _ClassVar[CostSource]
    ANALYTIC: _ClassVar[CostSource]
    USER: _ClassVar[CostSource]
    TIMED_IN_STEP: _ClassVar[CostSource]

class OutputRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_ROLE_UNSPECIFIED: _ClassVar[OutputRole]
    USER_OUTPUT: _ClassVar[OutputRole]
    PARAMETER_GRADIENT: _ClassVar[OutputRole]
    INPUT_GRADIENT: _ClassVar[OutputRole]
    BUFFER_UPDATE: _ClassVar[OutputRole]
    VALUE_CHECK: _ClassVar[OutputRole]

class SolveStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SOLVE_STATUS_UNSPECIFIED: _ClassVar[SolveStatus]
    OPTIMAL: _ClassVar[SolveStatus]
    FEASIBLE: _ClassVar[SolveStatus]
    HEURISTIC: _ClassVar[SolveStatus]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT64: DType
FLOAT16: DType
BFLOAT16: DType
INT8: DType
INT16: DType
INT32: DType
INT64: DType
UINT8: DType
BOOL: DType
COMPLEX64: DType
COMPLEX128: DType
FLOAT8_E4M3FN: DType
FLOAT8_E5M2: DType
UINT16: DType
UINT32: DType
UINT64: DType
COMPLEX32: DType
VALUE_KIND_UNSPECIFIED: ValueKind
USER_INPUT: ValueKind
PARAMETER: ValueKind
BUFFER: ValueKind
ACTIVATION: ValueKind
GRADIENT: ValueKind
OUTPUT: ValueKind
CONSTANT: ValueKind
PHASE_UNSPECIFIED: Phase
FORWARD: Phase
BACKWARD: Phase
MEMORY_FORMAT_UNSPECIFIED: MemoryFormat
CONTIGUOUS_FORMAT: MemoryFormat
CHANNELS_LAST: MemoryFormat
CHANNELS_LAST_3D: MemoryFormat
PRESERVE_FORMAT: MemoryFormat
LAYOUT_UNSPECIFIED: Layout
STRIDED: Layout
SPARSE_COO: Layout
SPARSE_CSR: Layout
COST_SOURCE_UNSPECIFIED: CostSource
PROFILED: CostSource
ANALYTIC: CostSource
USER: CostSource
TIMED_IN_STEP: CostSource
OUTPUT_ROLE_UNSPECIFIED: OutputRole
USER_OUTPUT: OutputRole
PARAMETER_GRADIENT: OutputRole
INPUT_GRADIENT: OutputRole
BUFFER_UPDATE: OutputRole
VALUE_CHECK: OutputRole
SOLVE_STATUS_UNSPECIFIED: SolveStatus
OPTIMAL: SolveStatus
FEASIBLE: SolveStatus
HEURISTIC: SolveStatus

class Version(_message.Message):
    __slots__ = ("major", "minor")
    MAJOR_FIELD_NUMBER: _ClassVar[int]
    MINOR_FIELD_NUMBER: _ClassVar[int]
    major: int
    minor: int
    def __init__(self, major: _Optional[int] = ..., minor: _Optional[int] = ...) -> None: ...

class Storage(_message.Message):
    __slots__ = ("id", "size_bytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    id: int
    size_bytes: int
    def __init__(self, id: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class TensorData(_message.Message):
    __slots__ = ("raw",)
    RAW_FIELD_NUMBER: _ClassVar[int]
    raw: bytes
    def __init__(self, raw: _Optional[bytes] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("id", "name", "dtype", "shape", "size_bytes", "kind", "storage_id", "stride", "storage_offset", "constant")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STORAGE_ID_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSTANT_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    size_bytes: int
    kind: ValueKind
    storage_id: int
    stride: _containers.RepeatedScalarFieldContainer[int]
    storage_offset: int
    constant: TensorData
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., size_bytes: _Optional[int] = ..., kind: _Optional[_Union[ValueKind, str]] = ..., storage_id: _Optional[int] = ..., stride: _Optional[_Iterable[int]] = ..., storage_offset: _Optional[int] = ..., constant: _Optional[_Union[TensorData, _Mapping]] = ...) -> None: ...

class ArgumentList(_message.Message):
    __slots__ = ("items", "is_tuple")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    IS_TUPLE_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Argument]
    is_tuple: bool
    def __init__(self, items: _Optional[_Iterable[_Union[Argument, _Mapping]]] = ..., is_tuple: _Optional[bool] = ...) -> None: ...

class ComplexValue(_message.Message):
    __slots__ = ("real", "imag")
    REAL_FIELD_NUMBER: _ClassVar[int]
    IMAG_FIELD_NUMBER: _ClassVar[int]
    real: float
    imag: float
    def __init__(self, real: _Optional[float] = ..., imag: _Optional[float] = ...) -> None: ...

class Argument(_message.Message):
    __slots__ = ("tensor", "list", "int_value", "float_value", "bool_value", "string_value", "none", "dtype", "device", "memory_format", "layout", "big_int", "complex_value")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FORMAT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    BIG_INT_FIELD_NUMBER: _ClassVar[int]
    COMPLEX_VALUE_FIELD_NUMBER: _ClassVar[int]
    tensor: int
    list: ArgumentList
    int_value: int
    float_value: float
    bool_value: bool
    string_value: str
    none: bool
    dtype: DType
    device: str
    memory_format: MemoryFormat
    layout: Layout
    big_int: str
    complex_value: ComplexValue
    def __init__(self, tensor: _Optional[int] = ..., list: _Optional[_Union[ArgumentList, _Mapping]] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., bool_value: _Optional[bool] = ..., string_value: _Optional[str] = ..., none: _Optional[bool] = ..., dtype: _Optional[_Union[DType, str]] = ..., device: _Optional[str] = ..., memory_format: _Optional[_Union[MemoryFormat, str]] = ..., layout: _Optional[_Union[Layout, str]] = ..., big_int: _Optional[str] = ..., complex_value: _Optional[_Union[ComplexValue, _Mapping]] = ...) -> None: ...

class NamedArgument(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: Argument
    def __init__(self, name: _Optional[str] = ..., value: _Optional[_Union[Argument, _Mapping]] = ...) -> None: ...

class Cost(_message.Message):
    __slots__ = ("time_s", "source", "flops", "workspace_bytes", "bytes_accessed", "host_s", "device_s")
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_ACCESSED_FIELD_NUMBER: _ClassVar[int]
    HOST_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_S_FIELD_NUMBER: _ClassVar[int]
    time_s: float
    source: CostSource
    flops: float
    workspace_bytes: int
    bytes_accessed: int
    host_s: float
    device_s: float
    def __init__(self, time_s: _Optional[float] = ..., source: _Optional[_Union[CostSource, str]] = ..., flops: _Optional[float] = ..., workspace_bytes: _Optional[int] = ..., bytes_accessed: _Optional[int] = ..., host_s: _Optional[float] = ..., device_s: _Optional[float] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "name", "op", "inputs", "outputs", "args", "kwargs", "phase", "forward_node_id", "cost", "random", "mutating", "non_recomputable", "source", "output_indices", "rng_shape_only", "body", "accumulates_gradient", "autocast_cast_back")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARGS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    RANDOM_FIELD_NUMBER: _ClassVar[int]
    MUTATING_FIELD_NUMBER: _ClassVar[int]
    NON_RECOMPUTABLE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_INDICES_FIELD_NUMBER: _ClassVar[int]
    RNG_SHAPE_ONLY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATES_GRADIENT_FIELD_NUMBER: _ClassVar[int]
    AUTOCAST_CAST_BACK_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    op: str
    inputs: _containers.RepeatedScalarFieldContainer[int]
    outputs: _containers.RepeatedScalarFieldContainer[int]
    args: _containers.RepeatedCompositeFieldContainer[Argument]
    kwargs: _containers.RepeatedCompositeFieldContainer[NamedArgument]
    phase: Phase
    forward_node_id: int
    cost: Cost
    random: bool
    mutating: bool
    non_recomputable: bool
    source: str
    output_indices: _containers.RepeatedScalarFieldContainer[int]
    rng_shape_only: bool
    body: _containers.RepeatedCompositeFieldContainer[Node]
    accumulates_gradient: bool
    autocast_cast_back: bool
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., op: _Optional[str] = ..., inputs: _Optional[_Iterable[int]] = ..., outputs: _Optional[_Iterable[int]] = ..., args: _Optional[_Iterable[_Union[Argument, _Mapping]]] = ..., kwargs: _Optional[_Iterable[_Union[NamedArgument, _Mapping]]] = ..., phase: _Optional[_Union[Phase, str]] = ..., forward_node_id: _Optional[int] = ..., cost: _Optional[_Union[Cost, _Mapping]] = ..., random: _Optional[bool] = ..., mutating: _Optional[bool] = ..., non_recomputable: _Optional[bool] = ..., source: _Optional[str] = ..., output_indices: _Optional[_Iterable[int]] = ..., rng_shape_only: _Optional[bool] = ..., body: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., accumulates_gradient: _Optional[bool] = ..., autocast_cast_back: _Optional[bool] = ...) -> None: ...

class GraphInput(_message.Message):
    __slots__ = ("value_id", "name", "gradient_of", "user_input_position", "argument_name")
    VALUE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_OF_FIELD_NUMBER: _ClassVar[int]
    USER_INPUT_POSITION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    value_id: int
    name: str
    gradient_of: int
    user_input_position: int
    argument_name: str
    def __init__(self, value_id: _Optional[int] = ..., name: _Optional[str] = ..., gradient_of: _Optional[int] = ..., user_input_position: _Optional[int] = ..., argument_name: _Optional[str] = ...) -> None: ...

class GraphOutput(_message.Message):
    __slots__ = ("value_id", "role", "name")
    VALUE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    value_id: int
    role: OutputRole
    name: str
    def __init__(self, value_id: _Optional[int] = ..., role: _Optional[_Union[OutputRole, str]] = ..., name: _Optional[str] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("frontend", "frontend_version", "source_model", "cost_device", "producer", "cost_model", "host_link", "rng_replay_bytes", "allocation_granularity_bytes", "runtime_makes_gradient_seeds")
    FRONTEND_FIELD_NUMBER: _ClassVar[int]
    FRONTEND_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_MODEL_FIELD_NUMBER: _ClassVar[int]
    COST_DEVICE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    COST_MODEL_FIELD_NUMBER: _ClassVar[int]
    HOST_LINK_FIELD_NUMBER: _ClassVar[int]
    RNG_REPLAY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_GRANULARITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_MAKES_GRADIENT_SEEDS_FIELD_NUMBER: _ClassVar[int]
    frontend: str
    frontend_version: str
    source_model: str
    cost_device: str
    producer: str
    cost_model: CostModel
    host_link: HostLink
    rng_replay_bytes: int
    allocation_granularity_bytes: int
    runtime_makes_gradient_seeds: bool
    def __init__(self, frontend: _Optional[str] = ..., frontend_version: _Optional[str] = ..., source_model: _Optional[str] = ..., cost_device: _Optional[str] = ..., producer: _Optional[str] = ..., cost_model: _Optional[_Union[CostModel, _Mapping]] = ..., host_link: _Optional[_Union[HostLink, _Mapping]] = ..., rng_replay_bytes: _Optional[int] = ..., allocation_granularity_bytes: _Optional[int] = ..., runtime_makes_gradient_seeds: _Optional[bool] = ...) -> None: ...

class HostLink(_message.Message):
    __slots__ = ("bandwidth_bytes_per_s", "latency_s", "overlapped", "source", "issue_s")
    BANDWIDTH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    OVERLAPPED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ISSUE_S_FIELD_NUMBER: _ClassVar[int]
    bandwidth_bytes_per_s: float
    latency_s: float
    overlapped: bool
    source: str
    issue_s: float
    def __init__(self, bandwidth_bytes_per_s: _Optional[float] = ..., latency_s: _Optional[float] = ..., overlapped: _Optional[bool] = ..., source: _Optional[str] = ..., issue_s: _Optional[float] = ...) -> None: ...

class CostModel(_message.Message):
    __slots__ = ("name", "timed_schedule", "timed_steps", "step_overhead_s", "note", "peak_byte_s", "calibration_schedule", "backend", "two_timelines", "call_overhead_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIMED_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    TIMED_STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_OVERHEAD_S_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTE_S_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TWO_TIMELINES_FIELD_NUMBER: _ClassVar[int]
    CALL_OVERHEAD_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    timed_schedule: str
    timed_steps: int
    step_overhead_s: float
    note: str
    peak_byte_s: float
    calibration_schedule: str
    backend: str
    two_timelines: bool
    call_overhead_s: float
    def __init__(self, name: _Optional[str] = ..., timed_schedule: _Optional[str] = ..., timed_steps: _Optional[int] = ..., step_overhead_s: _Optional[float] = ..., note: _Optional[str] = ..., peak_byte_s: _Optional[float] = ..., calibration_schedule: _Optional[str] = ..., backend: _Optional[str] = ..., two_timelines: _Optional[bool] = ..., call_overhead_s: _Optional[float] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("id", "name", "level", "node_ids", "children", "signature")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    level: int
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    children: _containers.RepeatedScalarFieldContainer[int]
    signature: str
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., level: _Optional[int] = ..., node_ids: _Optional[_Iterable[int]] = ..., children: _Optional[_Iterable[int]] = ..., signature: _Optional[str] = ...) -> None: ...

class Hierarchy(_message.Message):
    __slots__ = ("clusters", "root_id")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    ROOT_ID_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    root_id: int
    def __init__(self, clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ..., root_id: _Optional[int] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("compute", "free", "offload", "prefetch")
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    compute: int
    free: int
    offload: int
    prefetch: int
    def __init__(self, compute: _Optional[int] = ..., free: _Optional[int] = ..., offload: _Optional[int] = ..., prefetch: _Optional[int] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("name", "budget_bytes", "steps", "backward_start", "solver", "solver_params", "status", "predicted_peak_bytes", "predicted_time_s", "solve_time_s", "rng_replay", "host_budget_bytes", "predicted_host_peak_bytes")
    class SolverParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_START_FIELD_NUMBER: _ClassVar[int]
    SOLVER_FIELD_NUMBER: _ClassVar[int]
    SOLVER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TIME_S_FIELD_NUMBER: _ClassVar[int]
    SOLVE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    RNG_REPLAY_FIELD_NUMBER: _ClassVar[int]
    HOST_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_HOST_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    budget_bytes: int
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    backward_start: int
    solver: str
    solver_params: _containers.ScalarMap[str, str]
    status: SolveStatus
    predicted_peak_bytes: int
    predicted_time_s: float
    solve_time_s: float
    rng_replay: bool
    host_budget_bytes: int
    predicted_host_peak_bytes: int
    def __init__(self, name: _Optional[str] = ..., budget_bytes: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., backward_start: _Optional[int] = ..., solver: _Optional[str] = ..., solver_params: _Optional[_Mapping[str, str]] = ..., status: _Optional[_Union[SolveStatus, str]] = ..., predicted_peak_bytes: _Optional[int] = ..., predicted_time_s: _Optional[float] = ..., solve_time_s: _Optional[float] = ..., rng_replay: _Optional[bool] = ..., host_budget_bytes: _Optional[int] = ..., predicted_host_peak_bytes: _Optional[int] = ...) -> None: ...

class Graph(_message.Message):
    __slots__ = ("version", "name", "provenance", "storages", "values", "nodes", "inputs", "outputs", "hierarchy", "schedules", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    STORAGES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    HIERARCHY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    version: Version
    name: str
    provenance: Provenance
    storages: _containers.RepeatedCompositeFieldContainer[Storage]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    inputs: _containers.RepeatedCompositeFieldContainer[GraphInput]
    outputs: _containers.RepeatedCompositeFieldContainer[GraphOutput]
    hierarchy: Hierarchy
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, version: _Optional[_Union[Version, _Mapping]] = ..., name: _Optional[str] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ..., storages: _Optional[_Iterable[_Union[Storage, _Mapping]]] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., inputs: _Optional[_Iterable[_Union[GraphInput, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[GraphOutput, _Mapping]]] = ..., hierarchy: _Optional[_Union[Hierarchy, _Mapping]] = ..., schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...
