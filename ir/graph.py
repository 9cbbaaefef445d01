"""`Graph`: a Python view over the protobuf graph, with the indices solvers need.

The protobuf message stays the one copy of the data (`graph.proto`), so what a
tool builds here is exactly what is saved and what a solver in another language
reads. The wrapper adds construction helpers that keep ids and sizes
consistent, and lookups (producer, users, storage bytes, topological order)
built once per graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property

import networkx as nx

from . import remat_ir_pb2 as pb
from .arguments import TensorRef, encode, tensor_ids
from .dtypes import dtype_from_name, nbytes

#: The IR format version this library writes and reads (see schemas/README.md).
#: 1.1 added `GraphInput.user_input_position` and `argument_name`; 1.0 files are still
#: read (`ir.serialization` fills the positions). 1.2 added `Provenance.cost_model` and
#: the cost source TIMED_IN_STEP (nothing to fill: an older file has no step overhead).
FORMAT_VERSION = (1, 14)

#: Graph-input value kinds; they are always live and counted apart from activations.
RESIDENT_KINDS = frozenset({pb.USER_INPUT, pb.PARAMETER, pb.BUFFER, pb.CONSTANT, pb.GRADIENT})

#: Output roles produced by the forward segment (the rest come from backward).
FORWARD_OUTPUT_ROLES = frozenset({pb.USER_OUTPUT, pb.BUFFER_UPDATE, pb.VALUE_CHECK})


def _next_id(index: dict) -> int:
    """Smallest id above every id in use (ids start at 0)."""
    return max(index) + 1 if index else 0


def _enum(enum_type, value) -> int:
    """Accept an enum member as its number or its name in any case ("forward")."""
    return value if isinstance(value, int) else enum_type.Value(value.upper())


class Graph:
    """A remat IR graph: values, nodes, inputs/outputs, hierarchy and schedules.

    Build one with `add_value`/`add_node`/`add_input`/`add_output`, or wrap a
    parsed message with `Graph(proto)`. Lookups assume a structurally valid
    graph (`remat_ir.ir.validate`); `load` validates before wrapping.
    """

    def __init__(self, proto: pb.Graph | None = None, *, name: str = ""):
        if proto is None:
            proto = pb.Graph(name=name)
            proto.version.major, proto.version.minor = FORMAT_VERSION
        self.proto = proto
        self._values = {v.id: v for v in proto.values}
        self._nodes = {n.id: n for n in proto.nodes}
        self._storages = {s.id: s for s in proto.storages}

    # ---------------------------------------------------------------- building

    def _changed(self) -> None:
        """Drop derived indices after a structural change."""
        for attr in ("_producers", "_users", "topological_order", "resident_value_ids",
                     "resident_storage_ids", "output_value_ids", "derived"):
            self.__dict__.pop(attr, None)

    def add_storage(self, size_bytes: int) -> int:
        storage = self.proto.storages.add(id=_next_id(self._storages),
                                          size_bytes=size_bytes)
        self._storages[storage.id] = storage
        return storage.id

    def drop_unused_storages(self) -> None:
        """Remove the storages no value is in (after a pass moved values to other storages)."""
        used = {v.storage_id for v in self.proto.values}
        storages = self.proto.storages
        for i in reversed(range(len(storages))):
            if storages[i].id not in used:
                del storages[i]
        self._storages = {s.id: s for s in storages}
        self._changed()

    def add_value(self, name: str, dtype: str | int, shape: Sequence[int], *,
                  kind: str | int = "activation", alias_of: int | None = None,
                  storage_id: int | None = None, storage_bytes: int | None = None,
                  constant: bytes | None = None) -> int:
        """Add a tensor value and return its id.

        `alias_of` makes it a view sharing that value's storage (counted once),
        `storage_id` puts it in an existing storage; otherwise it gets a storage
        of its own, `storage_bytes` large (by default exactly its own size).
        """
        dtype = dtype_from_name(dtype)
        size = nbytes(dtype, shape)
        if alias_of is not None:
            storage_id = self._values[alias_of].storage_id
        elif storage_id is None:
            storage_id = self.add_storage(size if storage_bytes is None else storage_bytes)
        value = self.proto.values.add(
            id=_next_id(self._values), name=name, dtype=dtype,
            shape=list(shape), size_bytes=size, kind=_enum(pb.ValueKind, kind),
            storage_id=storage_id)
        if constant is not None:
            value.constant.raw = constant
        self._values[value.id] = value
        self._changed()
        return value.id

    def add_node(self, op: str, inputs: Sequence[int], outputs: Sequence[int], *,
                 phase: str | int, name: str = "", args: Sequence | None = None,
                 kwargs: dict | None = None, time_s: float = 0.0, flops: float = 0.0,
                 workspace_bytes: int = 0, cost_source: str | int = "user",
                 forward_node_id: int | None = None, random: bool = False,
                 mutating: bool = False, non_recomputable: bool = False,
                 rng_shape_only: bool = False, source: str = "") -> int:
        """Add an op and return its id.

        `args` are Python objects (see `remat_ir.ir.arguments`); when omitted the
        op is called with its inputs as positional tensors. `rng_shape_only`: a
        random op whose draws depend only on its inputs' shapes (dropout), which
        a schedule may skip to replay eager's random stream (docs/schedules.md).
        """
        if args is None:
            args = [TensorRef(v) for v in inputs]
        node = self.proto.nodes.add(
            id=_next_id(self._nodes), op=op, inputs=list(inputs),
            outputs=list(outputs), phase=_enum(pb.Phase, phase), random=random,
            mutating=mutating, non_recomputable=non_recomputable,
            rng_shape_only=rng_shape_only, source=source)
        node.name = name or f"{op.split('.')[1] if op.count('.') else op}_{node.id}"
        node.args.extend(encode(a) for a in args)
        for key, val in (kwargs or {}).items():
            node.kwargs.add(name=key).value.CopyFrom(encode(val))
        node.cost.time_s, node.cost.flops = time_s, flops
        node.cost.workspace_bytes = workspace_bytes
        node.cost.source = _enum(pb.CostSource, cost_source)
        if forward_node_id is not None:
            node.forward_node_id = forward_node_id
        self._nodes[node.id] = node
        self._changed()
        return node.id

    def add_input(self, value_id: int, name: str | None = None, *,
                  gradient_of: int | None = None, position: int | None = None,
                  argument_name: str = "") -> None:
        """Declare a graph input. A user input gets `position`, where the caller passes it
        among its flattened arguments (`GraphInput.user_input_position`); by default the
        next one after the user inputs declared so far, so that a graph built by hand
        takes its user inputs in the order they were added."""
        entry = self.proto.inputs.add(value_id=value_id,
                                      name=name if name is not None else self._values[value_id].name)
        if gradient_of is not None:
            entry.gradient_of = gradient_of
        if self._values[value_id].kind == pb.USER_INPUT:
            if position is None:
                taken = [i.user_input_position for i in self.proto.inputs
                         if i.HasField("user_input_position")]
                position = max(taken) + 1 if taken else 0
            entry.user_input_position = position
            entry.argument_name = argument_name
        elif position is not None or argument_name:
            raise ValueError(f"value {self._values[value_id].name!r} is not a user input: "
                             "only user inputs take a position and an argument name")
        self._changed()

    def user_inputs(self) -> list[pb.GraphInput]:
        """The user inputs' graph-input entries, by `user_input_position`."""
        kinds = {v: self._values[v].kind for v in (i.value_id for i in self.proto.inputs)}
        return sorted((i for i in self.proto.inputs if kinds.get(i.value_id) == pb.USER_INPUT),
                      key=lambda i: i.user_input_position)

    def add_output(self, value_id: int, role: str | int, name: str = "") -> None:
        self.proto.outputs.add(value_id=value_id, role=_enum(pb.OutputRole, role), name=name)
        self._changed()

    def add_schedule(self, schedule: pb.Schedule) -> pb.Schedule:
        """Append a copy of `schedule` to the graph and return the stored copy."""
        stored = self.proto.schedules.add()
        stored.CopyFrom(schedule)
        return stored

    # ---------------------------------------------------------------- lookups

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def values(self) -> dict[int, pb.Value]:
        return self._values

    @property
    def nodes(self) -> dict[int, pb.Node]:
        return self._nodes

    @property
    def schedules(self):
        return self.proto.schedules

    def value(self, value_id: int) -> pb.Value:
        return self._values[value_id]

    def node(self, node_id: int) -> pb.Node:
        return self._nodes[node_id]

    def storage_bytes(self, storage_id: int) -> int:
        """Device bytes allocating the storage takes: its data's bytes rounded up to the
        allocator's granularity (`Provenance.allocation_granularity_bytes`), what every
        memory figure counts."""
        return self.allocation_bytes(self._storages[storage_id].size_bytes)

    def storage_data_bytes(self, storage_id: int) -> int:
        """The bytes of the storage's data (`untyped_storage().nbytes()`), unrounded."""
        return self._storages[storage_id].size_bytes

    def allocation_bytes(self, nbytes: int) -> int:
        """What an allocation of `nbytes` takes on the graph's device."""
        granularity = self.proto.provenance.allocation_granularity_bytes
        return -(-nbytes // granularity) * granularity if granularity > 1 else nbytes

    def describe_node(self, node_id: int) -> str:
        """'name (op, id N)' for messages; tolerates unknown ids."""
        node = self._nodes.get(node_id)
        return f"node {node_id}" if node is None else f"node {node.name!r} ({node.op}, id {node_id})"

    def describe_value(self, value_id: int) -> str:
        value = self._values.get(value_id)
        return f"value {value_id}" if value is None else f"value {value.name!r} (id {value_id})"

    @cached_property
    def _producers(self) -> dict[int, int]:
        return {v: n.id for n in self.proto.nodes for v in n.outputs}

    @cached_property
    def _users(self) -> dict[int, list[int]]:
        users: dict[int, list[int]] = {v: [] for v in self._values}
        for n in self.proto.nodes:
            for v in n.inputs:
                users.setdefault(v, []).append(n.id)
        return users

    def producer(self, value_id: int) -> int | None:
        """Id of the node computing this value; None for graph inputs and constants."""
        return self._producers.get(value_id)

    def users(self, value_id: int) -> list[int]:
        """Ids of the nodes reading this value, in file order."""
        return self._users.get(value_id, [])

    @cached_property
    def derived(self) -> dict:
        """Facts other modules derive from the structure (the memory model's per-node
        storages), cached here so that they are dropped with it on a structural change."""
        return {}

    @cached_property
    def resident_value_ids(self) -> frozenset[int]:
        """Graph inputs and constants: always present, never computed or freed."""
        ids = {i.value_id for i in self.proto.inputs}
        ids.update(v.id for v in self.proto.values if v.kind == pb.CONSTANT)
        return frozenset(ids)

    @cached_property
    def resident_storage_ids(self) -> frozenset[int]:
        return frozenset(self._values[v].storage_id for v in self.resident_value_ids)

    @cached_property
    def output_value_ids(self) -> frozenset[int]:
        return frozenset(o.value_id for o in self.proto.outputs)

    def resident_bytes(self) -> int:
        """Bytes of parameters, buffers, inputs and constants (counted apart)."""
        return sum(self.storage_bytes(s) for s in self.resident_storage_ids)

    def output_bytes(self) -> dict[int, int]:
        """Bytes of the step's outputs per role (`pb.OutputRole`), each storage counted once
        under the first role holding it. Every schedule holds all of them at its end but
        buffer updates (freed as the backward starts), so the sum of the others is a floor
        under any peak: no rematerialization lowers it."""
        seen = set(self.resident_storage_ids)
        by_role: dict[int, int] = {}
        for output in self.proto.outputs:
            storage = self._values[output.value_id].storage_id
            if storage not in seen:
                seen.add(storage)
                by_role[output.role] = by_role.get(output.role, 0) + self.storage_bytes(storage)
        return by_role

    def dependency_graph(self) -> nx.DiGraph:
        """Node-level DAG: an edge producer -> user for every value passed."""
        dag = nx.DiGraph()
        dag.add_nodes_from(n.id for n in self.proto.nodes)
        for n in self.proto.nodes:
            for v in n.inputs:
                p = self._producers.get(v)
                if p is not None:
                    dag.add_edge(p, n.id)
        return dag

    @cached_property
    def topological_order(self) -> tuple[int, ...]:
        """Node ids in a dependency order, ties broken by position in the file."""
        position = {n.id: i for i, n in enumerate(self.proto.nodes)}
        return tuple(nx.lexicographical_topological_sort(self.dependency_graph(), key=position.get))

    def phase_order(self, phase: int) -> list[int]:
        """Topological order restricted to the nodes of one phase."""
        return [n for n in self.topological_order if self._nodes[n].phase == phase]

    def forward_then_backward(self) -> list[int]:
        """Every forward node, then every backward node, each in dependency order."""
        return self.phase_order(pb.FORWARD) + self.phase_order(pb.BACKWARD)

    def count_nodes(self, phase: int) -> int:
        return sum(1 for n in self.proto.nodes if n.phase == phase)

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}: {len(self._nodes)} nodes, {len(self._values)} values, "
                f"{len(self.proto.schedules)} schedules)")


def referenced_value_ids(node: pb.Node) -> Iterable[int]:
    """Every value id the node's positional and keyword arguments refer to."""
    for arg in node.args:
        yield from tensor_ids(arg)
    for kw in node.kwargs:
        yield from tensor_ids(kw.value)
